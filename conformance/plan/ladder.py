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

import re
import time
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from conformance.common.jsonl import append_line, read_lines
from conformance.plan.matrix import Rung

LADDER_FILE = "ladder.jsonl"
Selected = AbstractSet[tuple[str, int]] | None
POLL_SECONDS = 0.1
# Failures no NCCL or torch NCCL variable changes: CUDA itself refused, in the rank's own torch call
# (torch spells these "CUDA error: ..."; NCCL's own "Cuda failure '...'" is not here, because an NCCL
# rung such as cumem_off can change what NCCL asks of CUDA).  Only rungs that set variables beyond
# NCCL's (CUDA_*, GLOO_*, TORCH_*: user rungs) still run after one of these.
UNCHANGEABLE_FAILURES = re.compile(
    r"CUDA error: (?:operation not supported|no CUDA-capable device is detected"
    r"|CUDA driver version is insufficient for CUDA runtime version|invalid device ordinal)"
    r"|No CUDA GPUs are available",
    re.IGNORECASE,
)


def unchangeable(verdict: str, message: str) -> bool:
    """Whether a case's failure is one that no NCCL environment rung can change."""
    return verdict in ("error", "crash") and bool(UNCHANGEABLE_FAILURES.search(message))


class LadderWaitError(RuntimeError):
    """A rung this decision depends on was never decided (its worker died?)."""


@dataclass(frozen=True)
class Step:
    """One test item's place on the ladder."""

    key: str  # "<test>[<device set without rung>]"
    rung_index: int
    leader_key: str | None  # the class leader's key, for pairs that are not the leader
    link: str | None


@dataclass(frozen=True)
class Decision:
    run: bool
    reason: str = ""


class LadderBook:
    """The shared record of rung outcomes for one run."""

    def __init__(self, path: Path, ladder: Sequence[Rung], mode: str, wait_seconds: float) -> None:
        self.path = path
        self.ladder = tuple(ladder)
        self.mode = mode
        self.wait_seconds = wait_seconds

    def record(self, step: Step, outcome: str, reason: str = "", final: bool = False) -> None:
        """Record a rung's outcome; ``final``: no NCCL rung can change it (``unchangeable``)."""
        rung = self.ladder[step.rung_index].name
        record = {"key": step.key, "rung": rung, "outcome": outcome, "reason": reason, "final": final}
        append_line(self.path, record)

    def _outcomes(self) -> dict[tuple[str, str], str]:
        decided = read_lines(self.path).objects
        return {(r["key"], r["rung"]): "final" if r.get("final") else r["outcome"] for r in decided}

    def wait_for(self, wanted: Sequence[tuple[str, str]], budget_rungs: int) -> dict[tuple[str, str], str]:
        """Outcomes of ``wanted`` (key, rung) pairs, waiting while other items decide them."""
        deadline = time.monotonic() + self.wait_seconds * max(1, budget_rungs)
        while True:
            known = self._outcomes()
            missing = [w for w in wanted if w not in known]
            if not missing:
                return known
            if time.monotonic() > deadline:
                raise LadderWaitError(f"rungs never decided: {missing} (see {self.path})")
            time.sleep(POLL_SECONDS)

    def decide(self, step: Step, environ: Mapping[str, str], selected: Selected = None) -> Decision:
        """Run this rung, or skip it with the reason.

        ``selected`` holds the (key, rung index) of every item in this run; rungs outside it (a
        ``-k`` selection) are not waited for.
        """
        k = step.rung_index
        if k == 0 or self.mode == "full":
            return Decision(True)
        names = [r.name for r in self.ladder]
        earlier = [i for i in range(k) if selected is None or (step.key, i) in selected]
        own = self.wait_for([(step.key, names[i]) for i in earlier], k)
        passed = [names[i] for i in earlier if own[(step.key, names[i])] == "pass"]
        if passed:
            return Decision(False, f"adaptive matrix: rung {passed[0]} already passed")
        skipped = [names[i] for i in earlier if own[(step.key, names[i])] == "skip"]
        if skipped:
            return Decision(False, f"adaptive matrix: the case does not apply here (skipped on rung {skipped[0]})")
        rung = self.ladder[k]
        final = [names[i] for i in earlier if own[(step.key, names[i])] == "final"]
        if final and not rung.sets_beyond_nccl:
            return Decision(False, f"no NCCL environment rung changes the failure on rung {final[0]} (CUDA refused)")
        for other in self.ladder[:k]:
            if other.effective(environ) == rung.effective(environ):
                return Decision(False, f"same environment as rung {other.name} here")
        leader = step.leader_key
        if leader is not None and (selected is None or all((leader, i) in selected for i in range(k + 1))):
            return self._follow_leader(step, names, k)
        return Decision(True)

    def _follow_leader(self, step: Step, names: list[str], k: int) -> Decision:
        """A follower runs a rung only once its class leader has passed on it or an earlier one."""
        leader_key = step.leader_key or ""
        leader = self.wait_for([(leader_key, n) for n in names[: k + 1]], k + 1)
        if not any(leader[(leader_key, n)] == "pass" for n in names[: k + 1]):
            return Decision(False, f"no rung up to {names[k]} passed for link class {step.link} ({leader_key})")
        return Decision(True)
