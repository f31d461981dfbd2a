"""One owner for a case's rank processes: start, wait, the stop ladder, and the only ``killpg``.

A case's ranks are forked by the forkserver into one new process group.  ``CaseProcesses`` holds
their pids and group and is the only code that signals them:

    stop ladder:  SIGUSR1 (each rank dumps its Python stacks to its stderr.log), then SIGUSR2 (each
                  rank dumps torch's flight recorder) -> SIGTERM -> SIGKILL -> bounded wait; a rank
                  still there is named unkillable (often a process stuck in a driver)
    kill:         SIGKILL to the group (an interrupted case, the end-of-session sweep)

Every signal sent is logged, naming the case, the pids and why, and so is every rank's start and
exit (logger ``conformance.launch``; ``--log-cli-level=INFO`` shows it).
The waits are ``deadlines.StopLadder``'s, longer on GPUs, where a killed rank's CUDA context must
be torn down.  The policy of *when* to stop a case is the watchdog's.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from conformance.common import casefiles
from conformance.common.deadlines import StopLadder
from conformance.launch.forkserver import ForkServerClient
from conformance.launch.signals import signal_group
from conformance.rank import flight_recorder
from conformance.verdict.decision import exit_label

log = logging.getLogger("conformance.launch")  # the same logger signals.py writes to
HEALTHY_EXITS = (casefiles.EXIT_OK, casefiles.EXIT_SKIP)
POLL_SECONDS = 0.05
DUMP_SETTLE = 0.02  # let a dump that has begun finish writing


@dataclass(frozen=True)
class StopStep:
    """One signal of the stop ladder: seconds from sending it to the last reap, or to giving up."""

    signal: str  # "SIGTERM", "SIGKILL"
    seconds: float
    reaped: bool  # every rank it was sent to was reaped within its wait


class StopReason(str, Enum):
    """Why the watchdog stopped a case's ranks."""

    STALLED = "stalled"  # no rank reported progress for the step deadline
    DEADLINE = "deadline"  # the whole-case limit
    GRACE = "grace"  # the grace after another rank failed is over
    CONFIRM = "confirm"  # every live rank stuck where its class leader hung
    SMALL_STEP = "small_step"  # every live rank in the same small step for the small-step wait

    def __str__(self) -> str:
        return self.value


@dataclass
class RankProcess:
    rank: int
    pid: int
    path: Path
    exit_code: int | None = None
    exit_time: float | None = None  # the host's monotonic clock when the forkserver reaped it
    stopped_by: StopReason | None = None  # why the watchdog stopped it
    stack: str = ""
    unkillable: bool = False

    @property
    def failed(self) -> bool:
        return self.exit_code is not None and self.exit_code not in HEALTHY_EXITS


class CaseProcesses:
    """The ranks of one case, from their start to their reaping."""

    def __init__(self, server: ForkServerClient, case_dir: Path, world_size: int) -> None:
        self.server = server
        self.case = case_dir.name
        pids, self.pgid = server.spawn(case_dir, world_size)
        self.ranks = [RankProcess(i, pid, casefiles.rank_dir(case_dir, i)) for i, pid in enumerate(pids)]
        shown = ", ".join(map(str, pids))
        log.info("case %s: %d rank(s) forked (pids %s) in process group %d", self.case, len(pids), shown, self.pgid)

    def alive(self) -> list[RankProcess]:
        """The ranks not yet reaped (exits the forkserver reported are filled in)."""
        still = []
        for rank in self.ranks:
            if rank.exit_code is None:
                known = self.server.exit_of(rank.pid)
                if known is None:
                    still.append(rank)
                else:
                    rank.exit_code, rank.exit_time = known
                    log.info("case %s: rank %d (pid %d) reaped: %s", self.case, rank.rank, rank.pid, _ended(known[0]))
        return still

    @property
    def ended(self) -> bool:
        return not self.alive()

    def any_failed(self) -> bool:
        self.alive()
        return any(r.failed for r in self.ranks)

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for news (rank exits) from the forkserver."""
        self.server.wait_events(seconds)

    def wait_for_exits(self, seconds: float) -> list[RankProcess]:
        deadline = time.monotonic() + seconds
        alive = self.alive()
        while alive and time.monotonic() < deadline:
            self.wait(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            alive = self.alive()
        return alive

    def stop(self, reason: StopReason, ladder: StopLadder) -> list[StopStep]:
        """Run the stop ladder on the live ranks: the dump, then SIGTERM, then SIGKILL if any rank outlived it."""
        alive = self.alive()
        for rank in alive:
            rank.stopped_by = reason
        self._dump_stacks(alive, ladder.dump_wait)
        steps = [self.signal_and_reap(signal.SIGTERM, f"stop ladder ({reason})", ladder.term_wait)]
        if not steps[-1].reaped:
            why = f"stop ladder ({reason}): {len(self.alive())} rank(s) ignored SIGTERM"
            steps.append(self.signal_and_reap(signal.SIGKILL, why, ladder.kill_wait))
        for rank in self.alive():
            rank.unkillable = True
            log.warning(
                "case %s: rank %d (pid %d) survived SIGKILL for %.1fs", self.case, rank.rank, rank.pid, ladder.kill_wait
            )
        return steps

    def signal_and_reap(self, sig: signal.Signals, why: str, wait: float) -> StopStep:
        """Signal the live ranks' group and wait up to ``wait`` seconds for every one to be reaped."""
        sent = time.monotonic()
        self._signal(sig, why, self.alive())
        still = self.wait_for_exits(wait)
        return StopStep(sig.name, time.monotonic() - sent, reaped=not still)

    def kill(self, why: str) -> bool:
        """SIGKILL the whole case at once; False when nothing was left to kill."""
        alive = self.alive()
        if not alive:
            return False
        return self._signal(signal.SIGKILL, why, alive)

    def _signal(self, sig: signal.Signals, why: str, alive: Sequence[RankProcess]) -> bool:
        return signal_group(self.pgid, sig, f"case {self.case}, {why}", [r.pid for r in alive])

    def _dump_stacks(self, alive: Sequence[RankProcess], wait: float) -> None:
        """Ask each live rank for its Python stacks, then for its flight recorder; keep the stacks it wrote.

        One after the other: faulthandler walks every thread's frames from a signal handler, which is
        not safe while the rank's dump thread runs Python (a rank was seen to crash in that walk).
        """
        stderr = {r.rank: r.path / casefiles.STDERR for r in alive}
        offsets = {r.rank: _size(stderr[r.rank]) for r in alive}
        dumps = {r.rank: r.path / casefiles.FLIGHT_RECORDER for r in alive}
        before = {r.rank: _mtime(dumps[r.rank]) for r in alive}
        deadline = time.monotonic() + wait
        self._signal_each(alive, signal.SIGUSR1, "its stacks")
        _settle(alive, lambda r: _size(stderr[r.rank]) == offsets[r.rank], deadline - wait / 2)
        self._signal_each(alive, flight_recorder.DUMP_SIGNAL, "its flight recorder")
        _settle(alive, lambda r: _mtime(dumps[r.rank]) == before[r.rank], deadline)
        for rank in alive:
            rank.stack = _read_from(stderr[rank.rank], offsets[rank.rank])

    def _signal_each(self, alive: Sequence[RankProcess], sig: signal.Signals, what: str) -> None:
        for rank in alive:
            log.info("case %s: %s to rank %d (pid %d): dump %s", self.case, sig.name, rank.rank, rank.pid, what)
            try:
                os.kill(rank.pid, sig)
            except ProcessLookupError:
                pass


def _ended(code: int) -> str:
    """A rank's exit as the forkserver reported it: ``exit 1``, ``killed by SIGKILL``."""
    label = exit_label(code)
    return f"killed by {label}" if isinstance(label, str) else f"exit {label}"


def _settle(alive: Sequence[RankProcess], waiting: Callable[[RankProcess], bool], deadline: float) -> None:
    """Wait until no rank is ``waiting`` any more (its dump is written), or the deadline; then a moment more."""
    left = list(alive)
    while left and time.monotonic() < deadline:
        time.sleep(DUMP_SETTLE)
        left = [r for r in left if waiting(r)]
    time.sleep(DUMP_SETTLE)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(20000).decode("utf-8", errors="replace")
    except OSError:
        return ""
