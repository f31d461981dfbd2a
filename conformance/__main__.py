"""``python -m conformance ...``: see conformance.cli.main."""

from conformance.cli.main import main

raise SystemExit(main())
