"""The JUnit file pytest writes (``--junitxml``), as CI tools read it: valid xunit2, the run named, failures headlined.

* No test case carries a property (the xunit2 schema allows none there, and GitLab, GitHub and
  junitparser ignore them).  The testsuite names the run instead (``JunitRun``: its id, its
  results.jsonl as an absolute path, the suite's version), added by the process that writes the
  file: a plain run's pytest, or the xdist controller (its workers have no JUnit writer).  compare,
  recommend and report read the run from there (``runs.read_junit``).
* A failed case's ``message`` is its headline (``launch.case.headline``: ``HANG gpu0-gpu4 (SYS) in
  send/recv 4B: ...``), not pytest's ``Failed: ...``; the failure's body keeps the whole text.  The
  terminal's short summary (``-rf``) shows the same line.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any, Protocol

import pytest

from conformance.discover.versions import suite_version
from conformance.record.records import JunitRun

HEADLINE = pytest.StashKey[str]()  # a failed case's headline, set before its pytest.fail


class RunSide(Protocol):
    """What the JUnit file names of the run (``ConformanceSession``)."""

    run_id: str
    results_path: Path


class JunitHooks:
    """Names the run in the JUnit file; puts each failed case's headline in its ``message``."""

    def __init__(self, run: RunSide) -> None:
        self.run = run

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Before pytest's writer writes the file (a plain hook of its own), once the run id is final."""
        writer = junit_writer(session.config)
        if writer is None:
            return
        version = suite_version() or "unknown"
        for name, value in JunitRun(self.run.run_id, str(self.run.results_path.resolve()), version).properties():
            writer.add_global_property(name, value)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        headline = item.stash.get(HEADLINE, None)
        crash = getattr(report.longrepr, "reprcrash", None)
        if headline is not None and report.when == "call" and report.failed and crash is not None:
            crash.message = headline  # what JUnit's message and -rf show; xdist sends it to the controller
        return report


def junit_writer(config: pytest.Config) -> Any | None:
    """The JUnit writer of this pytest process: none without --junitxml, none on an xdist worker."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # a pytest that moved it: the file is written without the run's properties
        return None
    writer = config.stash.get(xml_key, None)
    return writer if hasattr(writer, "add_global_property") else None
