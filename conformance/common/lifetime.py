"""Processes of a run die with their parent: PR_SET_PDEATHSIG, and the race it leaves closed.

Every process of a run (xdist worker, forkserver, rank) asks the kernel for SIGKILL when the
process that started it dies, so killing any one of them, even with SIGKILL, leaves nothing behind.
The kernel's "parent" is the *thread* that forked: start these processes on a thread that lives
as long as the process (the main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int) -> bool:
    """SIGKILL this process when its parent dies; False if the parent is not ``expected_parent`` by now.

    Checked after the request, so a parent that died before it cannot slip through.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the session's own sweep still covers it
        pass
    return os.getppid() == expected_parent


def process_gone(pid: int) -> bool:
    """No process ``pid`` is running on this host (none at all, or only its zombie left to be reaped)."""
    try:
        status: str = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return True
    return status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
