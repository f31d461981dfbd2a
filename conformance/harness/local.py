"""Cases on this node's devices: the item's own, later items' beside it, collectives sharing one group."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest

from conformance.harness.context import RunContext
from conformance.harness.planned import PlannedCase, Planner
from conformance.harness.progress import CaseProgress
from conformance.harness.runner import Runner
from conformance.harness.shared_group import Part, ProbeParams, declared, part_of, shared_spec
from conformance.harness.side_by_side import CaseCall, CasesAhead, PartOf, Pending, case_call
from conformance.harness.strategy import CaseRequest, case_spec
from conformance.launch.case import CaseResult
from conformance.plan.matrix import DeviceSet
from conformance.plan.parametrize import device_set_of

Together = list[tuple[pytest.Item, str, ProbeParams]]  # later items, their probe and parameters


def collective(run: RunContext, item: pytest.Item) -> tuple[str, ProbeParams] | None:
    """The collective and parameters the item declares (``shared_group.MARKER``), at the run's sizes."""
    found = declared(item)
    return None if found is None else (found[0], {"sizes": run.sizes, **found[1]})


class LocalCases:
    """Runs an item's case on this node, starting later items' cases beside it where they may run now."""

    def __init__(self, run: RunContext, planner: Planner, runner: Callable[[], Runner], progress: CaseProgress) -> None:
        self.run_context = run
        self.planner = planner
        self.runner = runner
        self.progress = progress
        self.ahead = CasesAhead()
        self._started: set[str] = set()  # ladder keys whose case has started in this process

    def place(self, request: CaseRequest, planned: PlannedCase) -> CaseRequest:
        return request

    def ran(self, planned: PlannedCase, result: CaseResult) -> None:
        return None

    def waits_to_run(self, nodeid: str) -> bool:
        """The item's case already started beside an earlier one: its turn is taken by that case."""
        return nodeid in self.ahead.pending

    def run(self, request: CaseRequest, planned: PlannedCase) -> CaseResult:
        """The item's case (already running if it was started ahead), and later items' cases beside it."""
        item, call = request.item, request.call
        confirm_at = self.planner.decide(planned).confirm_at
        pending = self.ahead.take(item.nodeid, call)
        if pending is None:
            pending = self._start(request, confirm_at)
        if request.expect is None:  # negative controls run alone
            for later, later_set in self.ahead.candidates(item, pending.devices, self._runs_at_once):
                later_request = CaseRequest(later, request.probe, later_set, None, request.params)
                later_planned = self._planned(later, later_set)
                decision = self.planner.runs_now(later_planned)
                assert decision is not None  # a candidate: it runs now
                self.planner.started_on(later_planned, decision)
                self.ahead.pending[later.nodeid] = self._start(later_request, decision.confirm_at)
        try:
            result = pending.wait(self.progress.watch(item.nodeid))
            if result is None:  # the shared case stopped before this item's collective: it runs alone
                alone = self._start(request, confirm_at, share=False)
                result = alone.wait(self.progress.watch(item.nodeid))
            assert result is not None
            return result
        except BaseException:  # interrupted: no case of this process outlives the wait
            self.runner().sweep()
            raise
        finally:
            self.progress.done()

    def _planned(self, item: pytest.Item, device_set: DeviceSet) -> PlannedCase:
        planned = self.planner.of(item, device_set)
        assert planned is not None  # given a device set, an item always has a plan
        return planned

    def _start(self, request: CaseRequest, confirm_at: str, share: bool = True) -> Pending | PartOf:
        """Start the item's case; with ``share``, later declared collectives on its devices join it."""
        item, device_set, call = request.item, request.device_set, request.call
        spec = case_spec(self.run_context, item, request.probe, device_set, request.params)
        step = self._planned(item, device_set).step
        self._started.add(step.key)
        together = self._together(item, device_set, call) if share else []
        for claimed in [step, *(self._planned(later, device_set).step for later, _, _ in together)]:
            self.run_context.book.claim(claimed)
        parts = [Part(spec), *(Part(case_spec(self.run_context, it, p, device_set, pp)) for it, p, pp in together)]
        runner = self.runner()
        pending = Pending(item.nodeid, call, frozenset(d.name for d in device_set.devices))
        case = shared_spec(parts) if together else spec
        pending.run(lambda on_wait: runner.run(case, confirm_at=confirm_at, on_wait=on_wait))
        if not together:
            return pending
        for (later, later_probe, later_params), later_part in zip(together, parts[1:], strict=True):
            later_call = case_call(later_probe, None, later_params)
            self.ahead.pending[later.nodeid] = PartOf(
                later.nodeid, later_call, pending, partial(part_of, later_part, parts)
            )
        return PartOf(item.nodeid, call, pending, partial(part_of, parts[0], parts))

    def _together(self, item: pytest.Item, device_set: DeviceSet, call: CaseCall) -> Together:
        """Later items whose declared collectives can run in this item's case (``harness.shared_group``)."""
        mine = collective(self.run_context, item)
        if mine is None or case_call(mine[0], None, mine[1]) != call or not self._runs_at_once(item, device_set):
            return []
        probes, together = {call[0]}, []
        for later in self.ahead.upcoming(item):
            theirs = collective(self.run_context, later)
            if theirs is None or theirs[0] in probes or later.nodeid in self.ahead.pending:
                continue
            if device_set_of(later) != device_set or any(later.iter_markers("skip")):
                continue
            if self._runs_at_once(later, device_set):
                probes.add(theirs[0])
                together.append((later, *theirs))
        return together

    def _runs_at_once(self, item: pytest.Item, device_set: DeviceSet) -> bool:
        """An item whose rung is decided, to run, without waiting for another case (first rungs always are).

        A class follower on its first rung also waits until its class leader has started here (or is
        done): if the class hangs, it then hangs beside its leader, not in the way of it.
        """
        planned = self._planned(item, device_set)
        leader, book = planned.step.leader_key, self.run_context.book
        if leader and planned.step.rung_index == 0 and leader not in self._started and not book.known(leader, 0):
            return False
        return self.planner.runs_now(planned) is not None
