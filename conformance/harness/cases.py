"""One object takes an item to its record: plan, place, decide, run (by its strategy), record, report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.common import casefiles
from conformance.common.outside_text import shown_lines
from conformance.common.verdicts import Verdict
from conformance.discover.link_rate import simulated_gbps, simulated_transfer_generations, slowest_link_gbps
from conformance.harness import junit
from conformance.harness.context import RunContext
from conformance.harness.failed_tests import RECORDED
from conformance.harness.planned import PlannedCase, Planner
from conformance.harness.strategy import CaseRequest, CaseStrategy
from conformance.launch.case import CaseResult
from conformance.plan.parametrize import NO_NCCL
from conformance.record import results
from conformance.record.records import LINK_GBPS, SIMULATED_GBPS, CaseRecord
from conformance.verdict.decision import stuck_place
from conformance.verdict.machine_faults import unchangeable


class CasePipeline:
    """Runs a test's case (unless the ladder skips its rung) and records it when it ends."""

    def __init__(self, run: RunContext, planner: Planner, local: CaseStrategy, across: CaseStrategy) -> None:
        self.run_context = run
        self.planner = planner
        self.local = local
        self.across = across

    def run(self, request: CaseRequest) -> CaseResult:
        item = request.item
        planned = self.planner.of(item, request.device_set)
        assert planned is not None  # given a device set, an item always has a plan
        self.run_context.ensure_run_dir()
        strategy = self.across if request.device_set.nodes else self.local
        request = strategy.place(request, planned)
        decision = self.planner.decide(planned)
        if not decision.run:
            self.planner.skip(planned, decision.reason)
        result = self._run(strategy, request, planned)
        strategy.ran(planned, result)
        self._record(request, planned, result)
        item.stash[junit.CASE_SECONDS] = result.seconds
        if result.verdict not in (Verdict.PASS, Verdict.SKIP) and detailed(item.config):
            attach_logs(item, result)
        return result

    def _run(self, strategy: CaseStrategy, request: CaseRequest, planned: PlannedCase) -> CaseResult:
        """The case's result; its rung's outcome in the ladder book, whatever happens (an error if it raised)."""
        outcome, final_reason, stuck = Verdict.ERROR.value, "", ""
        try:
            result = strategy.run(request, planned)
            result.node_rank = self.run_context.node_rank
            outcome, stuck = result.verdict, stuck_place(result.decision)
            if unchangeable(result.verdict, result.decision.summary):
                final_reason = result.decision.summary
        finally:
            self.run_context.book.record(planned.step, outcome, final_reason, final=bool(final_reason), stuck=stuck)
        return result

    def _record(self, request: CaseRequest, planned: PlannedCase, result: CaseResult) -> None:
        item = request.item
        no_nccl = item.get_closest_marker(NO_NCCL) is not None
        one_rung = no_nccl or not self.planner.climbs(item)  # a device set of the test's own: inherited only
        run = self.run_context
        record = results.case_record(result, run.run_id, request.expect, planned.step.key, one_rung, no_nccl)
        run.folder.append(self._with_link_figures(record))
        item.user_properties.append((RECORDED, record.nodeid))  # the run's owner checks it is still there at the end

    def _with_link_figures(self, record: CaseRecord) -> CaseRecord:
        """A GPU set's slowest physical link; a simulated pair's bandwidth is its link's, not gloo's host copies."""
        if len(record.devices) < 2 or record.outcome is not Verdict.PASS:
            return record
        run = self.run_context
        figures = {LINK_GBPS: slowest_link_gbps(run.topology, record.devices)}
        if run.simulated and record.set_kind == "pair" and record.bandwidth_gbps is not None:
            rules = run.scenario.rules if run.scenario else ()
            figures[SIMULATED_GBPS] = simulated_gbps(run.topology, record.devices, record.probe, rules)
        known: dict[str, object] = {name: figure for name, figure in figures.items() if figure is not None}
        if run.simulated and (record.bandwidth_gbps is not None or "busbw_gbps" in record.metrics):
            known |= simulated_transfer_generations(run.topology, record.devices)
        return replace(record, metrics={**record.metrics, **known}) if known else record


def detailed(config: pytest.Config) -> bool:
    """Whether a failed case shows its ranks' stacks and logs in pytest's report (``-v``, ``--tb=long``).

    By default its verdict, GPUs, phase, cause and the folder of its logs say what a user needs; the
    suite's own frames (forkserver, runpy, the rank's context) tell nothing more.
    """
    return int(config.getoption("verbose")) > 0 or config.getoption("tbstyle") == "long"


def attach_logs(item: pytest.Item, result: CaseResult) -> None:
    """A failed case's ranks' stderr and stdout tails, as sections of the test's report."""
    for report in result.reports:
        path = casefiles.rank_dir(result.case_dir, report.rank)
        for name in (casefiles.STDERR, casefiles.STDOUT):
            text = casefiles.tail(path / name)
            if text.strip():
                item.add_report_section("call", f"rank {report.rank} {name}", shown_lines(text))
