"""Host checks as records: a line in ``results.jsonl`` like any case, so compare, report and summary see them.

A test marked ``@pytest.mark.host_check("name")`` runs no ranks: it looks at the host (/dev/shm,
limits, name resolution).

Its verdict is ``pass``, ``skip`` or ``error`` (a host that does not suit the run: ``fail`` is kept
for wrong data); the values it gives the ``host_metric`` fixture become the record's ``metrics``
(in results.jsonl; the JUnit file holds no per-test values: ``conformance/junit.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from conformance.common.clock import wall
from conformance.common.suite import record_nodeid
from conformance.common.verdicts import Verdict
from conformance.harness.context import RunContext
from conformance.harness.failed_tests import RECORDED
from conformance.record import results
from conformance.record.records import HOST_SET_KIND, CaseRecord

MARKER = "host_check"
MARKER_HELP = f'{MARKER}(name): a check of the host, not of ranks; recorded as probe "host:<name>"'
METRICS = pytest.StashKey[dict[str, object]]()
WARNING = "warning"  # a passing check's metric the answer shows as a yellow line (``host_metric(WARNING, text)``)
HostMetric = Callable[[str, object], None]  # the host_metric fixture: host_metric(name, value)


def keep_metric(item: pytest.Item, name: str, value: object) -> None:
    """One of the check's values, for its record's ``metrics`` (the last value of a name wins)."""
    item.stash.setdefault(METRICS, {})[name] = value


class HostChecks:
    """Records a host check's outcome in the run's results file."""

    def __init__(self, run: RunContext) -> None:
        self.run = run

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        marker = item.get_closest_marker(MARKER)
        # its call decides, or its setup when that did not pass (a fixture failed, or skipped the check)
        if marker is not None and (report.when == "call" or (report.when == "setup" and not report.passed)):
            record = self._record(item, str(marker.args[0]), report)
            results.append_case(self.run.results_file(), record)
            report.user_properties.append((RECORDED, record.nodeid))
        return report

    def _record(self, item: pytest.Item, name: str, report: pytest.TestReport) -> CaseRecord:
        metrics: dict[str, object] = item.stash.get(METRICS, {})
        return CaseRecord(
            run_id=self.run.run_id,
            nodeid=record_nodeid(item.path, item.nodeid),
            probe=f"host:{name}",
            verdict=_verdict(report),
            set_kind=HOST_SET_KIND,
            backend=self.run.backend,
            summary=_summary(report),
            metrics=dict(metrics),
            seconds=round(report.duration, 3),
            node_rank=self.run.node_rank,
            simulated=self.run.simulated,  # the check is real, but it belongs to a simulated run
            time=wall(),
        )


def _verdict(report: pytest.TestReport) -> Verdict:
    if report.passed:
        return Verdict.PASS
    return Verdict.SKIP if report.skipped else Verdict.ERROR


def _summary(report: pytest.TestReport) -> str:
    """The check's own words: the skip reason, or the failure's message without pytest's "assert ..." tail."""
    if report.passed:
        return "passed"
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr)
    return message.removeprefix("AssertionError: ").removeprefix("Failed: ").split("\nassert ")[0]
