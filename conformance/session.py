"""The suite's pytest hooks, each a line or two into the owner of its job (``conformance.harness``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from conformance.harness import across_nodes, run_life
from conformance.harness.across_nodes import AcrossNodes
from conformance.harness.cases import CasePipeline
from conformance.harness.context import RunContext
from conformance.harness.ending import RunEnding
from conformance.harness.failed_tests import RECORDED
from conformance.harness.host_checks import HostChecks
from conformance.harness.junit import JunitHooks, JunitWriterGuard
from conformance.harness.later_rungs import LaterRungs
from conformance.harness.local import LocalCases
from conformance.harness.planned import Planner
from conformance.harness.progress import CaseProgress
from conformance.harness.runner import RunnerLife
from conformance.harness.strategy import CaseRequest
from conformance.harness.terminal import TerminalOutput
from conformance.harness.workers import hand_back_not_needed
from conformance.harness.xdist_hooks import XdistHooks
from conformance.launch.case import CaseResult
from conformance.plan.matrix import DeviceSet

if TYPE_CHECKING:
    from _pytest.config import PytestPluginManager


class ConformanceSession:
    """Wires the run's owners together and hands each pytest hook to its owner."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.planner = Planner(run)
        self.runners = RunnerLife(run)
        self.local = LocalCases(
            run,
            self.planner,
            lambda: self.runners.runner,
            CaseProgress(run.config, run.role.worker, run.coverage.first_rung),
        )
        across = AcrossNodes(run, self.planner, lambda: self.runners.runner)
        self.cases = CasePipeline(run, self.planner, self.local, across)
        self.later_rungs = LaterRungs(run, self.planner)

    def register(self, plugins: PytestPluginManager) -> None:
        """Register this object and the run's other plugin objects."""
        plugins.register(self, "conformance_session")
        plugins.register(TerminalOutput(self.run), "conformance_terminal")
        plugins.register(HostChecks(self.run), "conformance_host_checks")
        not_written = self.run.outcome.unwritten.append
        plugins.register(JunitHooks(lambda: run_life.junit_summary(self.run), not_written), "conformance_junit")
        plugins.register(JunitWriterGuard(not_written), "conformance_junit_guard")
        plugins.register(RunEnding(self.run), "conformance_ending")
        if plugins.hasplugin("xdist"):
            plugins.register(XdistHooks(self.run), "conformance_xdist")

    def run_case(
        self, item: pytest.Item, probe: str, device_set: DeviceSet, expect: str | None, **params: Any
    ) -> CaseResult:
        return self.cases.run(CaseRequest(item, probe, device_set, expect, params))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        run_life.start_run(self.run)
        self.runners.launch()  # it imports torch while pytest collects

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        self.run.plan.parametrize(metafunc)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.planner.order(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        ids = [item.nodeid for item in session.items]
        self.run.coverage.collected(ids, [i for i in ids if self.run.plan.on_fallback_rung(i)])
        across_nodes.same_collection(self.run, ids)
        self._say_fallbacks(session)

    def _say_fallbacks(self, session: pytest.Session) -> None:
        """Once, in words: the tests of fallback rungs run only where needed; pytest counts the rest deselected."""
        later = sum(1 for item in session.items if self.run.plan.on_fallback_rung(item.nodeid))
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if later and reporter is not None and not self.run.role.worker and self.run.plan.mode == "adaptive":
            reporter.write_line(  # the suite's own words and counts: nothing from outside
                f"conformance: {len(session.items) - later} tests on the machine as it is; {later} on fallback rungs "
                "run only for a class that failed the rung before: pytest counts those not needed 'deselected' as "
                "the run goes, so its percentage can jump"
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        started = self.local.waits_to_run(item.nodeid)
        return self.later_rungs.deselect_if_not_needed(item, nextitem, started) or None

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.run.nodes is not None:
            self.run.nodes.now_at(nodeid)

    @pytest.hookimpl(tryfirst=True)  # before the JUnit writer: the harness's own report properties are taken out
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A test's last report: its teardown, or the one xdist makes up for a test its worker died in.
        # An interrupted test gets a setup report only, and did not run.
        if report.when not in ("setup", "call"):
            self.run.coverage.reported(report.nodeid)
        self.run.failed_tests.note(report)
        if not self.run.role.worker:  # a worker's reports carry it to the controller; no JUnit property
            report.user_properties = [p for p in report.user_properties if p[0] != RECORDED]

    @pytest.hookimpl(tryfirst=True)  # the run's end written before pytest's own JUnit writer, which may fail
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.runners.close()
        if self.run.nodes is not None:
            across_nodes.exchange_records(self.run, session)
            self.run.nodes.close()
        if self.run.role.worker:
            hand_back_not_needed(self.run.config, self.later_rungs.not_needed)
        run_life.write_end(self.run, session)
        run_life.conclude_run(self.run, session)
