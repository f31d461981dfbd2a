"""The suite's two clocks: the monotonic one for every duration and deadline, the wall for people.

Every "how long since", every deadline (a rank's step, the small-step and confirm rules, a node's
heartbeat, a store's silence, the progress line) subtracts readings of ``time.monotonic()``.  On
Linux that is ``clock_gettime(CLOCK_MONOTONIC)`` (PEP 418; CPython's ``Python/pytime.c``): one clock
for every process of a host, so a rank's stamp in its phase log and its parent's reading compare,
and one that ``settimeofday``, chrony's ``makestep`` or NTP never step (clock_gettime(2)).  The wall
clock steps: a +40 s step in a healthy case read as 40 s without progress would call it a hang.

Wall time (``wall()``) is only a record for people: when a case ended, when a run started.  It is
never subtracted from another reading to decide anything, and no verdict compares two hosts'
clocks (each node judges with its own monotonic clock; what crosses nodes is counts and verdicts).
"""

from __future__ import annotations

import time


def wall() -> float:
    """Seconds since the epoch, for records people read; never subtracted to decide anything."""
    return time.time()


def wall_ago(seconds: float) -> float:
    """The wall time ``seconds`` (a monotonic duration) before now: when something began, for people."""
    return time.time() - seconds
