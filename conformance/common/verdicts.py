"""The verdicts of a case, and the orders they are read in, defined once.

Severity, worst first (the member order): ``fail`` (wrong data: framework copies are affected
too) > ``hang`` > ``crash`` > ``error`` > ``inconclusive`` (the control arm failed) > ``skip`` >
``pass``.

Across nodes, the node whose verdict explains the others comes first: wrong data, then a real
failure (crash, error), then hangs, which are usually victims of those.

People read failures hangs first (they cost the most time), then wrong data, then the rest by
severity: the terminal summary and the report use that reading order.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Verdict(str, Enum):
    FAIL = "fail"
    HANG = "hang"
    CRASH = "crash"
    ERROR = "error"
    INCONCLUSIVE = "inconclusive"
    SKIP = "skip"
    PASS = "pass"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, text: object) -> Verdict | None:
        """The verdict a record's text names; None for anything else."""
        try:
            return cls(text)
        except ValueError:
            return None

    @property
    def failed(self) -> bool:
        return self not in (Verdict.PASS, Verdict.SKIP)


SEVERITY: tuple[Verdict, ...] = tuple(Verdict)
ROOT_CAUSE_PRECEDENCE: tuple[Verdict, ...] = (
    Verdict.FAIL, Verdict.CRASH, Verdict.ERROR, Verdict.HANG, Verdict.INCONCLUSIVE, Verdict.SKIP, Verdict.PASS,
)  # fmt: skip
READING_ORDER: tuple[Verdict, ...] = (Verdict.HANG, *(v for v in SEVERITY if v is not Verdict.HANG))
FAILURES: tuple[Verdict, ...] = tuple(v for v in READING_ORDER if v.failed)


def worse(current: Verdict | None, baseline: Verdict | None) -> bool:
    """Whether ``current`` is a worse verdict than ``baseline`` (SEVERITY: wrong data worst, pass best)."""
    if current is None or baseline is None:
        return False
    return SEVERITY.index(current) < SEVERITY.index(baseline)


def worst(verdicts: Iterable[str]) -> Verdict:
    """The most severe of several verdict texts; one that names no verdict counts as an error."""
    return min((Verdict.of(v) or Verdict.ERROR for v in verdicts), key=SEVERITY.index)
