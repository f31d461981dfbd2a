"""The adaptive matrix: which environment rung a case still needs, decided while the run goes.

Each (test, device set) climbs the ladder: ``inherited`` always runs; a later rung runs only when
no earlier rung passed.  For device pairs the first pair of each link class (the class leader)
searches the ladder; every other pair of that class runs ``inherited`` and then jumps straight to
the rung that passed for its leader, so a broken class pays one deadline per pair, not one per
pair per rung.

Decisions are shared through ``ladder.jsonl`` in the run folder (one line per rung decided, under
the same lock as the results), so xdist workers agree.  Items are ordered rung by rung, leaders
first, so everything a decision waits for comes earlier in every worker's queue.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from conformance.common.families import RUNG_FAMILIES
from conformance.common.jsonl import JsonlFollower, append_line
from conformance.common.lifetime import process_gone
from conformance.common.verdicts import Verdict
from conformance.plan.matrix import Rung
from conformance.plan.relevance import Between, cannot_change
from conformance.plan.transport import NcclHost, PairPath

LADDER_FILE = "ladder.jsonl"
# After a worker died, xdist hands its items to the others in no rung order: an outcome not yet
# started may come after the case waiting for it, in any worker or still in the controller's queue.
OUT_OF_ORDER = "not started, and a worker of this run died: its items may now come in any order"
# Which process started each rung's case (its pid), so a wait for a dead process's outcome ends at once.
CLAIMS_FILE = "ladder-claims.jsonl"
# The outcome a waiting case records for a rung nobody decided within its wait.
UNDECIDED = "undecided"
# The outcome of a rung the ladder skipped (no case ran); ``Verdict.SKIP`` is a case that does not apply.
SKIPPED = "skipped"
Selected = AbstractSet[tuple[str, int]] | None
LOG = logging.getLogger("conformance.plan")
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Step:
    """One test item's place on the ladder."""

    key: str  # "<test>[<device set without rung>]"
    rung_index: int
    leader_key: str | None  # the class leader's key, for pairs that are not the leader
    link: str | None
    devices: int = 0  # how many GPUs the case runs on (0: not known)
    paths: tuple[PairPath, ...] = ()  # every pair of them, as NCCL reads it

    @property
    def between(self) -> Between:
        return Between(self.devices, self.paths)


@dataclass(frozen=True)
class RungDecision:
    run: bool
    reason: str = ""
    # The class leader hung on this rung stuck here: a case stuck at the same place is confirmed sooner.
    confirm_at: str = ""


class LadderBook:
    """The shared record of rung outcomes for one run."""

    def __init__(
        self,
        path: Path,
        ladder: Sequence[Rung],
        mode: str,
        decision_wait: Callable[[int], float],
        host: NcclHost | None = None,
    ) -> None:
        """``decision_wait(k)``: the most the decision on rung ``k`` waits (``Deadlines.rung_wait``).

        ``host``: the CPU and NCCL version that NCCL's choice of transport depends on (``relevance.py``).
        """
        self.path = path
        self.host = host or NcclHost()
        self.ladder = tuple(ladder)
        self.mode = mode
        self.decision_wait = decision_wait
        self._lines = JsonlFollower(path)
        self._known: dict[tuple[str, str], str] = {}
        self._stuck: dict[tuple[str, str], str] = {}  # where a hung case's ranks were stopped
        self._claim_lines = JsonlFollower(path.with_name(CLAIMS_FILE))
        self._claims: dict[tuple[str, str], int] = {}  # the pid of the process running that rung's case
        self._worker_lost = False
        self._futile_memo: dict[tuple[object, ...], str | None] = {}
        self._variables_of: Mapping[str, str] | None = None
        self._variables: tuple[tuple[str, str], ...] = ()

    def claim(self, step: Step) -> None:
        """Say that this process starts the case of ``step``: a wait for its outcome ends at once if it dies."""
        line = {"key": step.key, "rung": self.ladder[step.rung_index].name, "pid": os.getpid()}
        append_line(self.path.with_name(CLAIMS_FILE), line, durable=False)

    def record(self, step: Step, outcome: str, reason: str = "", final: bool = False, stuck: str = "") -> None:
        """Record a rung's outcome.

        ``final``: no NCCL rung can change it (``unchangeable``); ``stuck``: where a hung case's ranks were.
        """
        self._append(step.key, self.ladder[step.rung_index].name, outcome, reason, final, stuck)

    def _append(
        self, key: str, rung: str, outcome: str, reason: str = "", final: bool = False, stuck: str = ""
    ) -> None:
        # A rung skipped is decided again the same way after a crash: only outcomes of cases are fsynced.
        line = {"key": key, "rung": rung, "outcome": outcome, "reason": reason, "final": final}
        append_line(self.path, {**line, "stuck": stuck} if stuck else line, durable=outcome != SKIPPED)

    def _outcomes(self) -> dict[tuple[str, str], str]:
        """Every outcome recorded so far; each call reads only the lines added since the last."""
        for line in self._lines.new_objects():
            if not _texts(line, "key", "rung", "outcome"):  # not a line of ours: nothing decided by it
                continue
            where, outcome = (line["key"], line["rung"]), "final" if line.get("final") else line["outcome"]
            if outcome != UNDECIDED or where not in self._known:  # a give-up never overwrites a real outcome
                self._known[where] = outcome
            if line.get("stuck"):
                self._stuck[where] = line["stuck"]
        for problem in self._lines.take_skipped():  # a line of someone else's, or cut off by a kill
            LOG.warning("%s: %s; skipped", self.path, problem)
        return dict(self._known)

    def wait_for(self, wanted: Sequence[tuple[str, str]], deadline: float) -> dict[tuple[str, str], str]:
        """Outcomes of ``wanted`` (key, rung) pairs, waiting until ``deadline`` while other items decide them.

        What is still missing at the deadline is recorded ``UNDECIDED``, so no other case waits for it again
        (a replacement worker included); the real outcome, if it ever comes, takes its place.  Nor is a
        rung waited for whose case died with its process, or, once a process of the run has died that
        way, one that nobody has started (``OUT_OF_ORDER``).
        """
        begun = time.monotonic()
        while True:
            known = self._outcomes()
            missing = [w for w in wanted if w not in known]
            if not missing:
                return known
            if not self.path.parent.is_dir():  # the run's folder removed under it: no outcome can come any more
                LOG.warning("%s: its folder is gone; %d rung(s) not decided", self.path, len(missing))
                return {**known, **{w: UNDECIDED for w in missing}}
            self._read_claims()
            orphans = {w: f"its worker (pid {self._claims[w]}) died running it" for w in missing if self._orphaned(w)}
            if self._lost_a_worker(known):
                orphans.update({w: OUT_OF_ORDER for w in missing if w not in self._claims and w not in orphans})
            if time.monotonic() > deadline:
                waited = f"not decided within {time.monotonic() - begun:.0f}s of waiting (its worker died?)"
                orphans.update({w: waited for w in missing if w not in orphans})
            for (key, rung), why in orphans.items():
                self._append(key, rung, UNDECIDED, why)
                known[(key, rung)] = UNDECIDED
            if len(orphans) == len(missing):
                return known
            time.sleep(POLL_SECONDS)

    def _lost_a_worker(self, known: Mapping[tuple[str, str], str]) -> bool:
        """A process of this run died with a case unfinished (found once, it stays so)."""
        if not self._worker_lost:
            self._worker_lost = any(w not in known and self._orphaned(w) for w in self._claims)
        return self._worker_lost

    def _read_claims(self) -> None:
        for line in self._claim_lines.new_objects():
            if not _texts(line, "key", "rung") or type(line.get("pid")) is not int:
                continue
            self._claims[(line["key"], line["rung"])] = int(line["pid"])

    def _orphaned(self, where: tuple[str, str]) -> bool:
        """The process that started this rung's case is gone without recording its outcome."""
        claimer = self._claims.get(where)
        return claimer is not None and claimer != os.getpid() and process_gone(claimer)

    def decide(self, step: Step, environ: Mapping[str, str], selected: Selected = None) -> RungDecision:
        """Run this rung, or skip it with the reason.

        ``selected`` holds the (key, rung index) of every item in this run; rungs outside it (a
        ``-k`` selection) are not waited for.  An earlier rung not decided within the wait (the
        worker deciding it died) counts as not passed: the case decides for itself and says so.
        """
        k = step.rung_index
        if self.mode == "full":
            return RungDecision(True)
        if k == 0:
            return self._first_rung(step)
        names = [r.name for r in self.ladder]
        known = self._outcomes()  # what is decided already settles it without a wait (one passed, ...)
        in_run = [i for i in range(k) if selected is None or (step.key, i) in selected]
        decided = {names[i]: known[(step.key, names[i])] for i in in_run if (step.key, names[i]) in known}
        futile = self._futile(step, k, environ, selected)
        early = self._by_own_outcomes(step, decided, environ) or (RungDecision(False, futile) if futile else None)
        if early is not None:
            return early
        tried, earlier, follows = self._reads(step, selected, environ)
        deadline = time.monotonic() + self.decision_wait(len(tried) - 1)
        own = self.wait_for([(step.key, n) for n in earlier], deadline)
        outcomes = {n: own[(step.key, n)] for n in earlier}
        decision = self._by_own_outcomes(step, outcomes, environ)
        if decision is None:
            if follows:
                decision = self._follow_leader(step, tried, deadline)
            else:
                decision = RungDecision(True, _alone(step.key, [n for n, o in outcomes.items() if o == UNDECIDED]))
        if decision.run and decision.reason:
            LOG.warning("%s, rung %s: %s", step.key, names[k], decision.reason)
        return decision

    def _futile(self, step: Step, k: int, environ: Mapping[str, str], selected: Selected) -> str | None:
        """Why rung ``k`` cannot change this step's case (relevance.py), else None.

        Remembered: the planner asks again for every item it looks ahead at, and the answer follows from
        the step, the rungs in the run and the variables a rung reads, none of which change.
        """
        in_run = tuple(i for i in range(k) if selected is None or (step.key, i) in selected)
        key = (step.key, k, in_run, self._rung_variables(environ))
        if key not in self._futile_memo:
            self._futile_memo[key] = cannot_change(self.ladder, k, step.between, self.host, environ, list(in_run))
        return self._futile_memo[key]

    def _rung_variables(self, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The variables of ``environ`` a rung reads or sets; worked out again only for another mapping."""
        if environ is not self._variables_of:
            self._variables_of = environ
            self._variables = tuple(sorted((k, v) for k, v in environ.items() if k.startswith(RUNG_FAMILIES)))
        return self._variables

    def _reads(self, step: Step, selected: Selected, environ: Mapping[str, str]) -> tuple[list[str], list[str], bool]:
        """What deciding a later rung may read.

        The rungs tried up to it, its own earlier ones in this run, and whether it follows its class
        leader on them.
        """
        names = [r.name for r in self.ladder]
        # Rungs the table rules out here are skipped without a case, so nothing waits for them.
        indices = [i for i in range(step.rung_index + 1) if self._futile(step, i, environ, selected) is None]
        earlier = [names[i] for i in indices[:-1] if selected is None or (step.key, i) in selected]
        leader = step.leader_key
        follows = leader is not None and (selected is None or all((leader, i) in selected for i in indices))
        return [names[i] for i in indices], earlier, follows

    def known(self, key: str, rung_index: int) -> bool:
        """Whether the outcome of ``key`` on that rung is recorded."""
        return (key, self.ladder[rung_index].name) in self._outcomes()

    def ready(self, step: Step, selected: Selected = None, environ: Mapping[str, str] = os.environ) -> bool:
        """Whether the decision on this step's rung can be had now, without waiting for another case."""
        if self.mode == "full" or step.rung_index == 0:
            return True
        tried, earlier, follows = self._reads(step, selected, environ)
        wanted = [(step.key, n) for n in earlier] + ([(step.leader_key or "", n) for n in tried] if follows else [])
        known = self._outcomes()
        return all(w in known for w in wanted)

    def _first_rung(self, step: Step) -> RungDecision:
        """The first rung always runs; once the class leader is known to have hung on it, say where."""
        if step.leader_key is None:
            return RungDecision(True)
        where = (step.leader_key, self.ladder[0].name)
        known = self._outcomes()
        if known.get(where) != Verdict.HANG or not self._stuck.get(where):
            return RungDecision(True)
        return RungDecision(True, confirm_at=self._stuck[where])

    def _by_own_outcomes(
        self, step: Step, outcomes: Mapping[str, str], environ: Mapping[str, str]
    ) -> RungDecision | None:
        """Skip on the case's own earlier rungs (one passed, it does not apply, nothing changes it); else None."""
        passed = [n for n, o in outcomes.items() if o == Verdict.PASS]
        if passed:
            return RungDecision(False, f"adaptive matrix: rung {passed[0]} already passed")
        skipped = [n for n, o in outcomes.items() if o == Verdict.SKIP]
        if skipped:
            return RungDecision(False, f"adaptive matrix: the case does not apply here (skipped on rung {skipped[0]})")
        rung = self.ladder[step.rung_index]
        final = [n for n, o in outcomes.items() if o == "final"]
        if final and not rung.sets_beyond_nccl:
            return RungDecision(
                False, f"no NCCL environment rung changes the failure on rung {final[0]} (CUDA refused)"
            )
        for other in self.ladder[: step.rung_index]:
            if other.effective(environ) == rung.effective(environ):
                return RungDecision(False, f"same environment as rung {other.name} here")
        return None

    def _follow_leader(self, step: Step, names: Sequence[str], deadline: float) -> RungDecision:
        """A follower runs a rung only once its class leader has passed on it or an earlier one."""
        leader_key = step.leader_key or ""
        leader = self.wait_for([(leader_key, n) for n in names], deadline)
        if any(leader[(leader_key, n)] == Verdict.PASS for n in names):
            return RungDecision(True)
        undecided = [n for n in names if leader[(leader_key, n)] == UNDECIDED]
        if undecided:
            return RungDecision(True, _alone(leader_key, undecided))
        return RungDecision(False, f"no rung up to {names[-1]} passed for link class {step.link} ({leader_key})")


def _alone(key: str, undecided: Sequence[str]) -> str:
    """Why a case runs a rung without the decision it waited for ("" when nothing was missing)."""
    if not undecided:
        return ""
    return f"rung {', '.join(undecided)} of {key} was never decided (its worker died?): deciding alone, this rung runs"


def _texts(line: Mapping[str, object], *names: str) -> bool:
    """Whether each of ``names`` in a line read back is a text (a line of the ladder's own)."""
    return all(isinstance(line.get(name), str) for name in names)
