"""Say which torch `tox -e suites` will test, or stop with a clear message when there is none."""

from __future__ import annotations

import sys

try:
    import torch
except ImportError:
    sys.exit(
        "tox -e suites tests the torch already installed where tox runs (system site-packages); "
        "none was found. Install torch there, or run the README's command in a virtual environment."
    )
print(f"testing torch {torch.__version__} from {torch.__file__}")
