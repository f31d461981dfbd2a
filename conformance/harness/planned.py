"""Each item's planned case: its ladder step and device set, computed once and kept in ``item.stash``.

The ladder's decision on the item's rung joins it once taken (it may wait for earlier rungs), so
the side-by-side look-ahead, the skip of a later rung not needed and the case's own run all read
the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import pytest

from conformance.harness.context import RunContext, user_timeout
from conformance.plan.ladder import SKIPPED, RungDecision, Step
from conformance.plan.matrix import DEVICE_SET_FIXTURES, NODE_SET_FIXTURES, DeviceSet
from conformance.plan.parametrize import device_set_of

ANY_SET_FIXTURES = (*DEVICE_SET_FIXTURES, *NODE_SET_FIXTURES)


@dataclass
class PlannedCase:
    step: Step
    device_set: DeviceSet
    decision: RungDecision | None = None  # the ladder's, once taken

    @property
    def later_local_rung(self) -> bool:
        """A case on this node's devices on a rung after the first: one the ladder may find not needed."""
        return self.step.rung_index > 0 and not self.device_set.nodes


PLANNED = pytest.StashKey[PlannedCase]()


class Planner:
    """The owner of every item's ``PlannedCase`` and of the ladder's decisions on them."""

    def __init__(self, run: RunContext) -> None:
        self.run = run

    def of(self, item: pytest.Item, device_set: DeviceSet | None = None) -> PlannedCase | None:
        """The item's planned case; None for an item not parametrised with a device set (and given none)."""
        planned = item.stash.get(PLANNED, None)
        if planned is not None and device_set in (None, planned.device_set):
            return planned
        device_set = device_set or device_set_of(item, ANY_SET_FIXTURES)
        if device_set is None:
            return None
        planned = item.stash[PLANNED] = PlannedCase(self.run.plan.step(item, device_set), device_set)
        return planned

    @staticmethod
    def climbs(item: pytest.Item) -> bool:
        """Whether the test is parametrised with the run's device sets, one per rung (else its set is its own)."""
        return device_set_of(item, ANY_SET_FIXTURES) is not None

    def step(self, item: pytest.Item) -> Step | None:
        planned = self.of(item)
        return planned.step if planned else None

    def decide(self, planned: PlannedCase) -> RungDecision:
        """The ladder's decision on the planned case's rung, taken at the item's turn (it may wait for earlier rungs).

        Taken once: a case started ahead of its turn keeps the decision it started on.
        """
        if planned.decision is None:
            planned.decision = self.run.book.decide(planned.step, self.run.nccl_environ, self.run.plan.selected)
        return planned.decision

    def runs_now(self, planned: PlannedCase) -> RungDecision | None:
        """A look ahead: the decision, where it is to run and needs no wait for another case (first rungs never do).

        Not kept: the item's own turn decides again, when more is known (a rung passed since, a class
        leader hung), unless a case is started on this one (``started_on``).
        """
        if planned.decision is not None:
            return planned.decision if planned.decision.run else None
        if not self.run.book.ready(planned.step, self.run.plan.selected, self.run.nccl_environ):
            return None
        decision = self.run.book.decide(planned.step, self.run.nccl_environ, self.run.plan.selected)
        return decision if decision.run else None

    @staticmethod
    def started_on(planned: PlannedCase, decision: RungDecision) -> None:
        """The item's case started ahead of its turn, on this decision: the item keeps it."""
        planned.decision = decision

    def skip(self, planned: PlannedCase, reason: str) -> NoReturn:
        """The item is skipped, and its rung recorded as skipped, saying why."""
        self.run.book.record(planned.step, SKIPPED, reason)
        pytest.skip(reason)

    def order(self, items: list[pytest.Item]) -> None:
        """Rung by rung (``Plan.order``); pytest-timeout as the outer net, above the case watchdog."""
        self.run.plan.order(items, self.step)
        if not self.run.config.pluginmanager.hasplugin("timeout"):
            return
        for item in items:
            fixtures = getattr(item, "fixturenames", ())
            if "conformance_case" in fixtures and not item.get_closest_marker("timeout"):
                planned = self.of(item)
                rung = planned.step.rung_index if planned else 0
                crosses = any(name in fixtures for name in NODE_SET_FIXTURES)
                net = self.run.deadlines.outer_net(rung, crosses)
                limit = user_timeout(self.run.config)  # the user's --timeout stays every case's outer bound
                item.add_marker(pytest.mark.timeout(min(net, limit) if limit else net, method="thread"))
