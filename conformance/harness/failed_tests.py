"""Tests pytest reported failed that no case record explains: the run's harness errors.

A test of the suite fails for one of two reasons: its case ended with a failing verdict (the record
says what the machine did), or something else failed: the harness, a fixture, a plugin of the
user's, a worker that crashed, a negative control that did not end as its test expected.  The
second kind leaves no record, or one that does not explain the failure, and would vanish from every
summary.  The process that owns the run folder (a plain run, xdist's controller, each node) sees
every test's reports; at the end it names the failures no record explains (``HarnessError``), and
``run.json`` carries them, so the answer, the recommendation, ``compare`` and the report say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from conformance.common.suite import record_nodeid
from conformance.record.records import CaseRecord, HarnessError
from conformance.verdict.machine_faults import machine_fault

MESSAGE_CHARS = 200
CRASHED = "worker crashed"  # xdist's report for a test its worker died in has when="???"
RECORDED = "conformance_recorded"  # a report's user property: the name of the record its test appended
LOST = "record lost"
LOST_MESSAGE = "its record is not in results.jsonl: the file was deleted, replaced or cut during the run"


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(crash.message if crash is not None else report.longrepr or "failed")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "failed")
    return first if len(first) <= MESSAGE_CHARS else first[: MESSAGE_CHARS - 3] + "..."


def explains(record: CaseRecord) -> bool:
    """A record that explains its test's failure: a failing verdict of the machine, no negative control.

    A negative control whose case met a machine fault (``machine_faults.py``: error 802, a lost GPU, ...)
    is explained by the machine too: it could not show what it tests, and the answer names the fault.
    """
    if record.outcome is None or not record.outcome.failed:
        return False
    return record.expected_verdict is None or machine_fault(record.verdict_text, record.summary) is not None


class FailedTests:
    """Every test reported failed or errored in this process, and every record its tests wrote, by test name."""

    def __init__(self, rootpath: Path) -> None:
        self.rootpath = rootpath
        self._failed: dict[str, HarnessError] = {}
        self._recorded: set[str] = set()  # tests that wrote a record (RECORDED on their reports)

    def note(self, report: pytest.TestReport) -> None:
        self._recorded.update(str(value) for name, value in report.user_properties if name == RECORDED)
        if not report.failed:
            return
        nodeid = record_nodeid(self.rootpath / report.location[0], report.nodeid)
        when = report.when if report.when in ("setup", "call", "teardown") else CRASHED
        self._failed.setdefault(nodeid, HarnessError(nodeid, when, _message(report)))

    def unexplained(self, records: Iterable[CaseRecord]) -> tuple[HarnessError, ...]:
        """The failed tests no record explains, in the order they failed, then the tests whose record is gone.

        A test that wrote a record missing from results.jsonl lost it to the file being deleted,
        replaced or cut during the run: its verdict is not known, whatever pytest said.
        """
        records = list(records)
        explained = {r.nodeid for r in records if explains(r)}
        failed = tuple(error for nodeid, error in self._failed.items() if nodeid not in explained)
        kept = {r.nodeid for r in records}
        lost = sorted(self._recorded - kept - set(self._failed))
        return failed + tuple(HarnessError(nodeid, LOST, LOST_MESSAGE) for nodeid in lost)
