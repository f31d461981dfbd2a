"""The one way a process group is signalled (``killpg``), logged: every signal the suite sends says so."""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("conformance.launch")


def signal_group(pgid: int, sig: signal.Signals, why: str) -> bool:
    """Send ``sig`` to a process group; False when the group is gone.  Logged."""
    log.info("%s to process group %d (%s)", sig.name, pgid, why)
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
