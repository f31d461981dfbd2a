"""The one way a process group is signalled (``killpg``), logged: every signal the suite sends says so."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence

log = logging.getLogger("conformance.launch")


def signal_group(pgid: int, sig: signal.Signals, why: str, pids: Sequence[int] = ()) -> bool:
    """Send ``sig`` to a process group (``pids``: its members still running, for the log); False when it is gone."""
    members = f"pids {', '.join(map(str, pids))}" if pids else "every member"
    log.info("%s to process group %d (%s): %s", sig.name, pgid, members, why)
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        log.debug("process group %d was already gone", pgid)
        return False
    return True
