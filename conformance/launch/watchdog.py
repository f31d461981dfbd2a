"""The parent's watchdog: waits for a case's ranks against its deadline and stops them.

This is where ranks are killed.  The stop ladder, on the case's process group:
SIGUSR1 (each rank dumps its Python stacks to its stderr.log) and SIGUSR2 (each rank dumps torch's
flight recorder) -> SIGTERM -> SIGKILL -> bounded wait; a rank still there after that is named as
unkillable (often a process stuck in a driver).  The waits are ``deadlines.StopLadder``'s, longer
on GPUs, where a killed rank's CUDA context must be torn down.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from conformance.common import casefiles
from conformance.common.deadlines import StopLadder
from conformance.launch.forkserver import ForkServerClient
from conformance.rank import flight_recorder

HEALTHY_EXITS = (casefiles.EXIT_OK, casefiles.EXIT_SKIP)


@dataclass
class RankProcess:
    rank: int
    pid: int
    path: Path
    exit_code: int | None = None
    exit_time: float | None = None
    stopped_by: str | None = None  # "deadline" or "grace" when the watchdog had to stop it
    stack: str = ""
    unkillable: bool = False


@dataclass
class Supervision:
    ranks: list[RankProcess]
    started: float
    ended: float
    stop_reason: str | None = None  # why the watchdog stepped in, if it did
    stop_seconds: float = 0.0  # from the decision to stop to the last rank reaped
    grace_started: float | None = None
    notes: list[str] = field(default_factory=list)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        pass


def _collect_exits(server: ForkServerClient, ranks: Sequence[RankProcess]) -> list[RankProcess]:
    alive = []
    for rank in ranks:
        if rank.exit_code is None:
            known = server.exit_of(rank.pid)
            if known is None:
                alive.append(rank)
            else:
                rank.exit_code, rank.exit_time = known
    return alive


def _wait_for_exits(server: ForkServerClient, ranks: Sequence[RankProcess], seconds: float) -> list[RankProcess]:
    deadline = time.monotonic() + seconds
    alive = _collect_exits(server, ranks)
    while alive and time.monotonic() < deadline:
        server.wait_events(min(0.05, max(0.0, deadline - time.monotonic())))
        alive = _collect_exits(server, ranks)
    return alive


def _dump_stacks(alive: Sequence[RankProcess], wait: float) -> None:
    """Ask each live rank for its Python stacks and its flight recorder; keep the stacks it wrote."""
    stderr_paths = {r.rank: r.path / casefiles.STDERR for r in alive}
    offsets = {r.rank: _size(stderr_paths[r.rank]) for r in alive}
    dumps = {r.rank: r.path / casefiles.FLIGHT_RECORDER for r in alive}
    before = {r.rank: _mtime(dumps[r.rank]) for r in alive}
    for rank in alive:
        for sig in (flight_recorder.DUMP_SIGNAL, signal.SIGUSR1):
            try:
                os.kill(rank.pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait
    waiting = list(alive)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.02)
        waiting = [
            r
            for r in waiting
            if _size(stderr_paths[r.rank]) == offsets[r.rank] or _mtime(dumps[r.rank]) == before[r.rank]
        ]
    time.sleep(0.02)  # let a dump that has begun finish
    for rank in alive:
        rank.stack = _read_from(stderr_paths[rank.rank], offsets[rank.rank])


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(20000).decode("utf-8", errors="replace")
    except OSError:
        return ""


def stop_case(
    server: ForkServerClient, pgid: int, alive: Sequence[RankProcess], reason: str, ladder: StopLadder
) -> float:
    """Run the stop ladder; return seconds from the start of the ladder to the last reap."""
    begun = time.monotonic()
    for rank in alive:
        rank.stopped_by = reason
    _dump_stacks(alive, ladder.dump_wait)
    _signal_group(pgid, signal.SIGTERM)
    still = _wait_for_exits(server, alive, ladder.term_wait)
    if still:
        _signal_group(pgid, signal.SIGKILL)
        still = _wait_for_exits(server, still, ladder.kill_wait)
    for rank in still:
        rank.unkillable = True
    return time.monotonic() - begun


class Peers(Protocol):
    """The other nodes of a cross-node case: a failure there starts this node's grace period too."""

    def failed(self) -> bool: ...

    def report_failure(self) -> None: ...


def supervise(
    server: ForkServerClient,
    ranks: list[RankProcess],
    pgid: int,
    case_timeout: float,
    grace: float,
    ladder: StopLadder,
    peers: Peers | None = None,
) -> Supervision:
    """Wait for every rank; stop them at the deadline, or ``grace`` seconds after a failure.

    Across nodes, a failure on another node (or a node gone) counts as one here.
    """
    started = time.time()
    deadline = time.monotonic() + case_timeout
    grace_deadline: float | None = None
    supervision = Supervision(ranks=ranks, started=started, ended=started)
    while True:
        alive = _collect_exits(server, ranks)
        failed_here = any(r.exit_code is not None and r.exit_code not in HEALTHY_EXITS for r in ranks)
        if grace_deadline is None and (failed_here or (alive and peers is not None and peers.failed())):
            grace_deadline = time.monotonic() + grace
            supervision.grace_started = time.time()
            if failed_here and peers is not None:
                peers.report_failure()
        if not alive:
            break
        now = time.monotonic()
        limit = min(deadline, grace_deadline if grace_deadline is not None else deadline)
        if now >= limit:
            supervision.stop_reason = "deadline" if limit == deadline else "grace"
            supervision.stop_seconds = stop_case(server, pgid, alive, supervision.stop_reason, ladder)
            break
        server.wait_events(min(limit - now, 0.5))
    supervision.ended = time.time()
    return supervision
