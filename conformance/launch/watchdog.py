"""The parent's watchdog: the policy of when a case's ranks are stopped.

A case is a hang when no rank has reported progress (a line in its ``phase.jsonl``) for the step
deadline ("stalled"); the whole-case limit is the last net for one that progresses forever
("deadline").  Evidence stops a hang sooner: every live rank in the same small step (a few bytes
that take milliseconds on any link) for ``small_step_wait`` while the machine is not saturated, or
stuck where its class leader hung.  When one rank fails, the others get ``grace`` seconds (across
nodes, a failure on another node counts too).  Stopping is ``CaseProcesses.stop``: the stop ladder,
where ranks are killed.

Each decision is logged with its reason (logger ``conformance.launch``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from conformance.common import casefiles
from conformance.common.deadlines import SMALL_STEP_BYTES, StopLadder
from conformance.launch.measure_gate import GateHold
from conformance.launch.processes import CaseProcesses, RankProcess, StopReason, StopStep

log = logging.getLogger("conformance.launch")
EVENT_WAIT = 0.05  # longest sleep between looks at the ranks, the measurement turn and the other nodes
# While a case's measurement turn is in play (asked for, held, or the gate held shared) its looks
# come this often: every hand-over of the turn waits for the asker's look and the holder's release,
# and at 50 ms each the run's ~60 serial turns cost 1.5 s of an 11 s simulated 8-GPU run.
TURN_LOOK = 0.01


@dataclass
class Supervision:
    """How a case's ranks were watched; ``started``, ``ended`` and ``grace_started`` on the monotonic clock."""

    ranks: list[RankProcess]
    started: float
    ended: float
    stop_reason: StopReason | None = None  # why the watchdog stepped in, if it did
    stop_seconds: float = 0.0  # from the decision to stop to the last rank reaped
    stop_steps: list[StopStep] = field(default_factory=list)  # each signal's wait for the reap
    grace_started: float | None = None
    notes: list[str] = field(default_factory=list)


class Peers(Protocol):
    """The other nodes of a cross-node case: a failure there starts this node's grace period too."""

    def failed(self) -> bool: ...

    def report_failure(self) -> None: ...


OnWait = Callable[[list[RankProcess], float], None]


@dataclass(frozen=True)
class Confirm:
    """Stop the case once every rank still running has been at ``where`` for ``seconds``: its class hung there."""

    where: str
    seconds: float

    def stuck(self, alive: list[RankProcess]) -> bool:
        lasts = [casefiles.last_phase(rank.path) for rank in alive]
        arrived = [p.clock for p in lasts if p is not None and p.where == self.where and p.clock is not None]
        return bool(arrived) and len(arrived) == len(alive) and time.monotonic() - max(arrived) >= self.seconds


PRESSURE = Path("/proc/pressure/cpu")
# Saturated: runnable tasks waited for a CPU 90% of the last 10 s (Linux PSI, "some avg10"; kernel
# Documentation/accounting/psi.rst), or, where PSI is missing, a 1-minute load of 4 per CPU.  Only then
# can a step of milliseconds be starved for seconds; the step deadline decides instead.
SATURATED_PRESSURE, SATURATED_LOAD_PER_CPU = 90.0, 4.0


def machine_saturated() -> bool:
    try:
        some = PRESSURE.read_text().split("\n")[0].split()
        return float(dict(f.split("=") for f in some[1:])["avg10"]) >= SATURATED_PRESSURE
    except (OSError, ValueError, KeyError, IndexError):
        return os.getloadavg()[0] >= SATURATED_LOAD_PER_CPU * (os.cpu_count() or 1)


@dataclass(frozen=True)
class SmallStep:
    """Stop the case once every live rank has sat in the same small step for ``seconds``: stuck, not slow.

    Small: the rank said the step moves at most SMALL_STEP_BYTES on a group already set up
    (``PhaseLine.nbytes``).  Not while ``saturated()``: a starved machine can stretch milliseconds.
    """

    seconds: float
    saturated: Callable[[], bool] = machine_saturated

    def stuck(self, alive: list[RankProcess]) -> str:
        """The step every live rank is stuck in, or "" when the evidence does not hold."""
        lasts = [casefiles.last_phase(rank.path) for rank in alive]
        if not lasts or not all(p is not None and _small(p) for p in lasts):
            return ""
        steps = {p.step for p in lasts if p is not None}
        arrived = max(p.clock or 0.0 for p in lasts if p is not None)
        if len(steps) != 1 or time.monotonic() - arrived < self.seconds or self.saturated():
            return ""
        return steps.pop()


def _small(line: casefiles.PhaseLine) -> bool:
    return line.phase == "probe" and line.nbytes is not None and line.nbytes <= SMALL_STEP_BYTES and not line.part


@dataclass(frozen=True)
class Limits:
    """When the watchdog stops a case: no progress for ``step``, past ``case`` in all, ``grace`` after a failure."""

    step: float
    case: float
    grace: float


@dataclass
class Turn:
    """The case's measurement turn (``measure_gate``): asked for when every live rank waits for it.

    Waiting for the turn is not a stall; a turn that does not come within ``wait`` is granted anyway
    as "beside" (the figure says it was not measured alone).
    """

    hold: GateHold
    case_dir: Path
    wait: float
    asked_at: float | None = None
    granted_at: float | None = None

    def asked(self, alive: list[RankProcess]) -> bool:
        """Every live rank waits for the turn, and it has not been given yet (a look; nothing changes)."""
        return self.granted_at is None and every_rank(alive, lambda p: p.step == casefiles.TURN_STEP)

    @property
    def in_play(self) -> bool:
        """The case still holds the gate (shared or alone): another case's turn may wait on its next look."""
        return not self.hold.released

    def leave_when_done(self, alive: list[RankProcess]) -> None:
        """Give the gate back once every live rank is in teardown: nothing the case times is left."""
        if not self.hold.released and every_rank(alive, lambda p: p.phase == "teardown"):
            self.hold.release()

    def try_grant(self) -> bool:
        """One try for the turn; given to the ranks when had, or as "beside" once ``wait`` has passed."""
        now = time.monotonic()
        self.asked_at = self.asked_at or now
        alone = self.hold.try_turn()
        if alone or now - self.asked_at >= self.wait:
            casefiles.grant_turn(self.case_dir, alone)
            self.granted_at = now
        return self.granted_at is not None


def every_rank(alive: list[RankProcess], test: Callable[[casefiles.PhaseLine], bool]) -> bool:
    """There are live ranks, and where each one is now (its last phase line) passes ``test``."""
    lasts = [casefiles.last_phase(rank.path) for rank in alive]
    return bool(lasts) and all(p is not None and test(p) for p in lasts)


def stalled_for(ranks: list[RankProcess], since: float) -> float:
    """Seconds since any rank of the case last reported progress, or since ``since`` if that is later (monotonic)."""
    last = casefiles.last_progress(rank.path for rank in ranks)
    return time.monotonic() - max(since, last or 0.0)


_why: dict[StopReason, Callable[[Limits], str]] = {
    StopReason.GRACE: lambda limits: f"the grace of {limits.grace:g}s after a failure is over",
    StopReason.STALLED: lambda limits: f"no rank reported progress for {limits.step:g}s (step deadline)",
    StopReason.DEADLINE: lambda limits: f"past the whole-case limit of {limits.case:g}s",
}


def _stuck(
    alive: list[RankProcess], confirm: Confirm | None, small_step: SmallStep | None
) -> tuple[StopReason, str] | None:
    """Evidence that the case hangs before its step deadline: why to stop it, and how it reads; else None."""
    if confirm is not None and confirm.stuck(alive):
        return StopReason.CONFIRM, f"every live rank stuck at {confirm.where} for {confirm.seconds:g}s"
    if small_step is not None and (step := small_step.stuck(alive)):
        return (
            StopReason.SMALL_STEP,
            f"every live rank in {step} for {small_step.seconds:g}s, the machine not saturated",
        )
    return None


def _ranks(alive: list[RankProcess]) -> str:
    return ", ".join(f"{r.rank} (pid {r.pid})" for r in alive)


def _stop(processes: CaseProcesses, supervision: Supervision, reason: StopReason, ladder: StopLadder) -> None:
    begun = time.monotonic()
    supervision.stop_reason = reason
    supervision.stop_steps = processes.stop(reason, ladder)
    supervision.stop_seconds = time.monotonic() - begun


def supervise(
    processes: CaseProcesses,
    limits: Limits,
    ladder: StopLadder,
    peers: Peers | None = None,
    confirm: Confirm | None = None,
    on_wait: OnWait | None = None,
    turn: Turn | None = None,
    small_step: SmallStep | None = None,
) -> Supervision:
    """Wait for every rank; stop them when they stall, at the case limit, or ``grace`` seconds after a failure.

    With ``confirm``, also once every rank still running is stuck where its class hung; with
    ``small_step``, once every one is stuck in the same small step.  ``on_wait`` is told the ranks
    still running and the seconds left, at every look (progress for people).
    """
    started = time.monotonic()
    deadline = started + limits.case
    grace, grace_deadline = limits.grace, None
    supervision = Supervision(ranks=processes.ranks, started=started, ended=started)
    while True:
        alive = processes.alive()
        failed_here = processes.any_failed()
        if grace_deadline is None and (failed_here or (alive and peers is not None and peers.failed())):
            grace_deadline = time.monotonic() + grace
            supervision.grace_started = time.monotonic()
            where = "a rank failed" if failed_here else "a rank failed on another node"
            log.info("case %s: %s; the others get %gs (grace)", processes.case, where, grace)
            if failed_here and peers is not None:
                peers.report_failure()
        if not alive:
            break
        evidence = _stuck(alive, confirm, small_step) if grace_deadline is None else None
        if evidence is not None:
            log.info("case %s: %s (%s); stopping ranks %s", processes.case, evidence[1], evidence[0], _ranks(alive))
            _stop(processes, supervision, evidence[0], ladder)
            break
        now = time.monotonic()
        if turn is not None:
            turn.leave_when_done(alive)
        if turn is not None and turn.asked(alive) and not turn.try_grant():
            since = now  # waiting for the turn is the harness's wait, not the case's stall
        else:
            since = max(started, turn.granted_at or 0.0) if turn is not None else started
        stalled = now + limits.step - stalled_for(processes.ranks, since)
        limit = min(deadline, stalled, grace_deadline if grace_deadline is not None else deadline)
        if on_wait is not None:
            on_wait(alive, limit - now)
        if now >= limit:
            reasons = {grace_deadline: StopReason.GRACE, stalled: StopReason.STALLED, deadline: StopReason.DEADLINE}
            log.info("case %s: %s; stopping ranks %s", processes.case, _why[reasons[limit]](limits), _ranks(alive))
            _stop(processes, supervision, reasons[limit], ladder)
            break
        look = TURN_LOOK if turn is not None and turn.in_play and peers is None else EVENT_WAIT
        processes.wait(min(limit - now, look))
    supervision.ended = time.monotonic()
    return supervision
