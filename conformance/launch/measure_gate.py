"""The measurement turn: a bandwidth figure is timed with no other case of the run running.

Cases on disjoint devices run side by side, but they share the host, the PCIe and socket links and
(in a simulation) the CPU, so a figure timed beside another case would not measure what it names.
Every case holds the run's gate *shared* while its ranks work; a case whose ranks are ready to time
a transfer asks for its *turn*: it gives up its shared hold and takes the gate exclusively, which it
gets once every other case has ended, is waiting for its own turn, or is past anything timed.  A
case gives the gate back when its ranks reach teardown (nothing is timed after that), so its turn
lasts from its first timed transfer to its teardown.  A turnstile lock taken before the exclusive
one keeps new cases from starving a case that waits for its turn.  Both are ``flock`` locks on
files in the run folder, so threads of one pytest process and xdist workers of one run take turns
alike, and a lock dies with its holder.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

GATE = "measure.lock"
TURNSTILE = "measure-turnstile.lock"
POLL_SECONDS = 0.02


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)


def _try(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class GateHold:
    """One case's hold on the gate: shared from entry, exclusive once it has its turn."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._gate = _open(folder / GATE)
        self._turnstile = _open(folder / TURNSTILE)
        self.has_turn = False
        self.released = False
        self._queued = False

    def enter(self, wait: float) -> bool:
        """Hold the gate shared (behind any case waiting for its turn); False if that took longer than ``wait``."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _try(self._turnstile, fcntl.LOCK_EX):
                entered = _try(self._gate, fcntl.LOCK_SH)
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)
                if entered:
                    return True
            time.sleep(POLL_SECONDS)
        return False

    def try_turn(self) -> bool:
        """One non-blocking try at the turn: True once this case holds the gate alone."""
        if self.has_turn:
            return True
        if self.released:
            return False
        # A case that waits for its turn holds nothing shared: two waiting cases must not block each other.
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        if not self._queued:
            if not _try(self._turnstile, fcntl.LOCK_EX):
                return False
            self._queued = True  # holding the turnstile keeps newcomers out until this case has had its turn
        if _try(self._gate, fcntl.LOCK_EX):
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            self.has_turn = True
        return self.has_turn

    def release(self) -> None:
        """Give the gate back early (the case's ranks are past anything timed): others may take their turn."""
        if self.released:
            return
        self.released, self.has_turn = True, False
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        if self._queued:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            self._queued = False

    def close(self) -> None:
        os.close(self._gate)  # closing the descriptors drops whatever they held
        os.close(self._turnstile)
