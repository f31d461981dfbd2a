"""``python -m conformance ...``: see conformance.cli."""

from conformance.cli import main

raise SystemExit(main())
