"""The JUnit file pytest writes (``--junitxml``), as CI tools read it: valid xunit2, the run and its answer in it.

* No test case carries a property (the xunit2 schema allows none there, and GitLab, GitHub and
  junitparser ignore them).  The testsuite names the run instead (``JunitRun``: its id, its
  results.jsonl as an absolute path, the suite's version) and carries its answer: the answer's
  lines and the export lines as ``conformance.answer.<n>`` / ``conformance.export.<n>``
  properties, ``conformance.cpu_only`` on a run that tested no GPU, and the same lines as the
  testsuite's ``<system-out>``, which JUnit viewers show beside the suite.  The testsuite is named
  after the suite (``gpu-conformance``, ``gpu-conformance.node<k>`` on node k of several) unless
  ``junit_suite_name`` names it otherwise.
* The process that writes the file (a plain run's pytest, or the xdist controller: workers have
  no JUnit writer) completes it once pytest's writer has written it, from the run's answer.
  compare, recommend and report read the run from there (``runs.read_junit``).
* A failed case's ``message`` is its headline (``launch.case.headline``: ``HANG gpu0-gpu4 (SYS) in
  send/recv 4B: ...``), not pytest's ``Failed: ...``; the failure's body keeps the whole text.  The
  terminal's short summary (``-rf``) shows the same line.
* What the run found beyond its tests (a SLOW pair, ``summarise/bandwidth.py``) is a failed test case
  of its own (``classname`` gpu-conformance, ``slow_pair[<pair>-<link>-<probe>-<rung>]``), so CI
  shows it as a failure, not a silent metric.
* A test case's ``time`` includes its case's wall time, also for a case that ran side by side
  before pytest reached its test (its call then took milliseconds).
* The file is read back and written by ``common/xml_text.py``: what pytest left raw (a host name
  with a control character) is read with it shown, and every text goes out through its one escape,
  so the file stays XML 1.0 whatever a rank, a host or a variable said.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from conformance.common.verdicts import Verdict
from conformance.common.xml_text import parse_pytest_junit, write_junit
from conformance.harness.pytest_private import junit_writer, raised_by_junit_writer
from conformance.record.records import JUNIT_PREFIX, JunitRun
from conformance.summarise.conclude import not_written

HEADLINE = pytest.StashKey[str]()  # a failed case's headline, set before its pytest.fail
CASE_SECONDS = pytest.StashKey[float]()  # the wall time of the item's case, set when its result is in
SUITE_NAME = "gpu-conformance"
PYTEST_DEFAULT_NAME = "pytest"  # pytest's junit_suite_name when nobody set it
CPU_ONLY = f"{JUNIT_PREFIX}cpu_only"
ANSWER = f"{JUNIT_PREFIX}answer"
EXPORT = f"{JUNIT_PREFIX}export"
UNSIGNED = f"{JUNIT_PREFIX}unsigned"
FAILED_VERDICT_WORDS = frozenset(v.value.upper() for v in Verdict if v not in (Verdict.PASS, Verdict.SKIP))


@dataclass(frozen=True)
class JunitSummary:
    """What the testsuite says of the run, beyond its test cases."""

    run: JunitRun
    node_rank: int | None  # in a run of several nodes
    answer: tuple[str, ...]  # the answer's lines, as the terminal shows them
    exports: tuple[str, ...]  # the export lines for a launch script (none when withheld)
    cpu_only: str | None  # why no GPU was tested, when none was
    # what the run found beyond its tests (a SLOW pair), each a failed test case of its own: (name, message)
    findings: tuple[tuple[str, str], ...] = ()
    unsigned: str | None = None  # why a run across nodes signed nothing

    @property
    def suite_name(self) -> str:
        return SUITE_NAME if self.node_rank is None else f"{SUITE_NAME}.node{self.node_rank}"

    def properties(self) -> list[tuple[str, str]]:
        found = self.run.properties()
        if self.cpu_only is not None:
            found.append((CPU_ONLY, self.cpu_only))
        if self.unsigned is not None:
            found.append((UNSIGNED, self.unsigned))
        found += [(f"{ANSWER}.{n}", line) for n, line in enumerate(self.answer, start=1)]
        found += [(f"{EXPORT}.{n}", line) for n, line in enumerate(self.exports, start=1)]
        return found

    def system_out(self) -> str:
        lines = ["conformance: the answer", *self.answer]
        if self.exports:
            lines += ["", "for the launch script:", *self.exports]
        lines += ["", f"run {self.run.run_id}: records in {self.run.results} (gpu-conformance {self.run.version})"]
        return "\n".join(lines) + "\n"


class JunitHooks:
    """Completes the JUnit file with the run and its answer; headlines failures; times cases."""

    def __init__(self, summary: Callable[[], JunitSummary], not_written: Callable[[str], None]) -> None:
        self.summary = summary  # the run and its answer, once the run has ended
        self.not_written = not_written  # told "<what> NOT written: <why>" when the file cannot be completed

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """After pytest's writer has written the file (a plain hook of its own) and the run has its answer."""
        writer = junit_writer(session.config)
        path = Path(writer.logfile) if writer is not None else None
        if path is None or not path.is_file():
            return
        try:
            complete(path, self.summary(), session.config.getini("junit_suite_name"))
        except (OSError, ValueError, ElementTree.ParseError) as exc:  # a full disk; a file pytest left cut short
            self.not_written(not_written(f"the run's answer in JUnit file {path}", exc))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        if report.when != "call":
            return report
        seconds = item.stash.get(CASE_SECONDS, None)
        if seconds is not None:  # what JUnit's time adds up (xdist sends it to the controller)
            report.duration = max(report.duration, seconds)
        headline = item.stash.get(HEADLINE, None)
        crash = getattr(report.longrepr, "reprcrash", None)
        if headline is not None and report.failed and crash is not None:
            crash.message = headline  # what JUnit's message and -rf show; xdist sends it to the controller
        return report

    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        """A failed case's verdict (HANG, ERROR, ...) as pytest's word for it: first in its short summary line.

        pytest cuts that line at the terminal's width after the test's id, which often took the verdict.
        """
        crash = getattr(report.longrepr, "reprcrash", None)
        word = str(getattr(crash, "message", "")).split(" ", 1)[0]
        if report.when == "call" and report.failed and word in FAILED_VERDICT_WORDS:
            return "failed", "F", word
        return None


class JunitWriterGuard:
    """pytest's own JUnit writer failing is said in the run's answer, not raised past the run's end."""

    def __init__(self, not_written: Callable[[str], None]) -> None:
        self.not_written = not_written  # told "JUnit file <path> NOT written: <why>" when pytest's writer fails

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        """Innermost: pytest's writer failing (a full disk, ``--junitxml /dev/full``) is said, not raised past the end.

        Its ``open(..., "w")`` has then truncated the file, or left part of one: a CI reading it meets an
        empty or invalid file, and the run's answer and exit status say why.
        """
        try:
            yield
        except (OSError, ValueError) as exc:  # ValueError: a text UTF-8 cannot encode (a host name's stray bytes)
            writer = junit_writer(session.config)
            if writer is None or not raised_by_junit_writer(exc):
                raise
            self.not_written(not_written(f"JUnit file {writer.logfile}", exc))


def complete(path: Path, summary: JunitSummary, suite_name: str = PYTEST_DEFAULT_NAME) -> None:
    """Name each testsuite of ``path`` and add the run's properties and answer to it (rewritten in place).

    Every text, pytest's and the run's, reaches the file through ``write_junit``'s one escape.
    """
    root = parse_pytest_junit(path)
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for suite in suites:
        if suite_name == PYTEST_DEFAULT_NAME:
            suite.set("name", summary.suite_name)
        _add_properties(suite, summary.properties())
        _add_findings(suite, summary.findings)
        _set_system_out(suite, summary.system_out())
    write_junit(path, root)


def _add_properties(suite: ElementTree.Element, properties: Sequence[tuple[str, str]]) -> None:
    holder = suite.find("properties")
    if holder is None:
        holder = ElementTree.Element("properties")
        suite.insert(0, holder)
    for name, value in properties:
        ElementTree.SubElement(holder, "property", {"name": name, "value": value})


def _add_findings(suite: ElementTree.Element, findings: Sequence[tuple[str, str]]) -> None:
    """Each finding as a failed test case (before system-out, as xunit2 orders a testsuite's children)."""
    out = suite.find("system-out")
    place = list(suite).index(out) if out is not None else len(suite)
    for offset, (name, message) in enumerate(findings):
        case = ElementTree.Element("testcase", {"classname": SUITE_NAME, "name": name, "time": "0"})
        ElementTree.SubElement(case, "failure", {"message": message}).text = message
        suite.insert(place + offset, case)
    for count in ("tests", "failures"):
        suite.set(count, str(int(suite.get(count, "0")) + len(findings)))


def _set_system_out(suite: ElementTree.Element, text: str) -> None:
    out = suite.find("system-out")
    if out is None:
        out = ElementTree.SubElement(suite, "system-out")
    out.text = (out.text or "") + text
