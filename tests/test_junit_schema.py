"""The JUnit files of the suite are valid xunit2, as CI tools read them (issue 15, item 2).

Validated against ``junit-10.xsd`` (Jenkins xunit's schema, as pytest's own tests use it): a plain
run of the whole suite, the same under xdist, and the two merged by ``merge-junit``; none of the
runs prints a warning.  A run whose SYS pairs hang shows each failure's headline as its ``message``,
in a plain run and through xdist, with the whole text in the failure's body.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

import pytest
import xmlschema

from conformance.cli.main import main
from conformance.harness.junit import JunitSummary, complete
from conformance.record.records import JunitRun
from conformance.record.runs import load_run
from conftest import WHOLE_SUITE, copy_suites
from test_compare import TIMEOUTS, write_tiny_suite

RunSuite = Callable[..., pytest.RunResult]
SCHEMA = Path(__file__).with_name("junit-10.xsd")
SUITE_FILES = WHOLE_SUITE
pytestmark = pytest.mark.usefixtures("isolated_env")


def schema_errors(path: Path) -> list[str]:
    schema = xmlschema.XMLSchema(SCHEMA)
    return [f"{error.path}: {error.reason}" for error in schema.iter_errors(str(path))]


def assert_no_warning(result: pytest.RunResult) -> None:
    output = result.stdout.str() + result.stderr.str()
    assert "warnings" not in result.parseoutcomes(), output
    assert "Warning" not in output and "warnings summary" not in output, output


@pytest.mark.slow
def test_plain_xdist_and_merged_files_are_valid_xunit2(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = copy_suites(pytester, *SUITE_FILES)
    plain, xdist, merged = (pytester.path / f"{name}.xml" for name in ("plain", "xdist", "merged"))
    for args in ((f"--junitxml={plain}",), ("-n", "2", f"--junitxml={xdist}")):
        result = run_suite(*TIMEOUTS, *args, *files, timeout=300)
        assert result.ret == 0, result.stdout.str()
        assert_no_warning(result)
    capsys.readouterr()
    assert main(["merge-junit", "-o", str(merged), str(plain), str(xdist)]) == 0
    assert capsys.readouterr().err == ""
    for path in (plain, xdist, merged):
        assert schema_errors(path) == [], path
        assert ElementTree.parse(path).getroot().find(".//testcase/properties") is None
    # the records stay readable from each file: the host checks' values are in their records' metrics
    for path in (plain, xdist, merged):
        run = load_run(path)
        host = {r.probe: r.metrics for r in run.records if r.probe.startswith("host:")}
        assert set(host["host:open_files"]) == {"nofile_soft", "nofile_hard", "nofile_needed"}, path
    assert len(load_run(merged).records) == len(load_run(plain).records) + len(load_run(xdist).records)


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_a_failure_message_is_its_headline(
    pytester: pytest.Pytester, run_suite: RunSuite, xdist: tuple[str, ...]
) -> None:
    topology, scenario = write_tiny_suite(pytester)
    junit = pytester.path / "hang.xml"
    result = run_suite(topology, scenario, *TIMEOUTS, *xdist, f"--junitxml={junit}", "test_tiny.py")
    outcomes = result.parseoutcomes()  # later rungs: deselected or skipped, as the ladder decides
    # the SYS leader hangs on inherited and on cumem_off, its follower on inherited
    assert (outcomes["passed"], outcomes["failed"]) == (3, 3), result.stdout.str()
    assert_no_warning(result)
    assert schema_errors(junit) == []
    failures = {case.get("name"): case.find("failure") for case in ElementTree.parse(junit).getroot().iter("testcase")}
    for pair in ("gpu0-gpu2", "gpu1-gpu2"):
        failure = failures[f"test_pair[{pair}-SYS-inherited]"]
        assert failure is not None
        assert failure.get("message") == (
            f"HANG {pair} (SYS) in send/recv 4B [simulated]: ranks 0,1 all stuck in probe (send/recv 4B)"
        )
        body = failure.text or ""
        assert body.startswith("[simulated] hang: ranks 0,1 all stuck in probe (send/recv 4B)\n"), body
        assert "stopped by the watchdog" in body and "rank logs: " in body
    result.stdout.fnmatch_lines(["HANG test_tiny.py::test_pair[[]gpu0-gpu2-SYS-inherited[]] - HANG gpu0-gpu2 *"])


PYTEST_FILE = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="{name}"
errors="0" failures="0" skipped="0" tests="1" time="1.0"><testcase classname="suites.test_pairs" name="t" time="1.0"/>
</testsuite></testsuites>"""


@pytest.mark.parametrize(
    ("suite_name", "node_rank", "named"),
    [("pytest", None, "gpu-conformance"), ("pytest", 1, "gpu-conformance.node1"), ("nightly", 1, "nightly")],
)
def test_the_testsuite_is_named_after_the_suite_and_node_and_carries_the_answer(
    tmp_path: Path, suite_name: str, node_rank: int | None, named: str
) -> None:
    path = tmp_path / "run.xml"
    path.write_text(PYTEST_FILE.format(name=suite_name))
    run = JunitRun("run-1", "/r/run-1/results.jsonl", "0.1.0")
    summary = JunitSummary(run, node_rank, ("HARNESS ERROR in 1 test(s): t",), (), "NVML unavailable")
    complete(path, summary, suite_name)
    (suite,) = ElementTree.parse(path).getroot().findall("testsuite")
    properties = [(p.get("name"), p.get("value")) for p in suite.iter("property")]
    assert suite.get("name") == named
    assert properties == [
        *run.properties(),
        ("conformance.cpu_only", "NVML unavailable"),
        ("conformance.answer.1", "HARNESS ERROR in 1 test(s): t"),
    ]
    assert suite.findtext("system-out") == summary.system_out()
    assert schema_errors(path) == []
