"""A later rung its ladder does not need is not a test that could not run: it never runs as one.

No setup, no report, no JUnit test case; pytest counts it ``deselected`` (most items of a healthy
adaptive run are such rungs).  The decision is the one the case would take, kept in its planned
case.  One that must wait for other cases waits here, within the same bound its case would give
it, so a plain run and one over xdist workers (where a class leader may be another worker's)
report the same tests.  What it waits for always comes earlier: the item's own earlier rungs, and
its class leader's (first in every rung of a plain run; an earlier scope of xdist's,
``Plan.worker_scope``).
"""

from __future__ import annotations

import pytest

from conformance.harness.context import RunContext
from conformance.harness.planned import Planner
from conformance.harness.pytest_private import deselect_during_run
from conformance.plan.ladder import SKIPPED
from conformance.plan.matrix import NODE_SET_FIXTURES


class LaterRungs:
    def __init__(self, run: RunContext, planner: Planner) -> None:
        self.run = run
        self.planner = planner
        self.not_needed: list[str] = []  # a worker's, handed to its controller at the end

    def deselect_if_not_needed(self, item: pytest.Item, nextitem: pytest.Item | None, started: bool) -> bool:
        """True where the item was deselected; ``started``: its case already runs beside an earlier one."""
        fixtures = getattr(item, "fixturenames", ())
        if "conformance_case" not in fixtures or started or any(name in fixtures for name in NODE_SET_FIXTURES):
            return False
        planned = self.planner.of(item)
        if planned is None or not planned.later_local_rung:
            return False
        decision = self.planner.decide(planned)
        if decision.run:
            return False
        self.run.ensure_run_dir()
        self.run.book.record(planned.step, SKIPPED, decision.reason)
        self.not_needed.append(item.nodeid)
        deselect_during_run(item, nextitem)
        self.run.coverage.not_needed(item.nodeid)
        return True
