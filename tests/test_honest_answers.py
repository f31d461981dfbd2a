"""The answer, run.json, JUnit, the report and pytest never disagree (issue 25).

Real runs of the suite through ``pytester``: a plugin of the user's (a conftest) that raises inside
one suite test, a machine with no GPU, and the simulated 3-GPU box whose SYS pairs hang.  Each
failure must reach every place a user reads: the answer (first, in red), ``run.json``, the JUnit
file (properties and ``<system-out>``, valid xunit2), the HTML report and the exit statuses of
``recommend`` and ``compare``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from conftest import copy_suites
from test_compare import TIMEOUTS, write_tiny_suite
from test_junit_schema import schema_errors

RunSuite = Callable[..., pytest.RunResult]
pytestmark = pytest.mark.usefixtures("isolated_env")
RED, YELLOW, BOLD, RESET = "\x1b[31m", "\x1b[33m", "\x1b[1m", "\x1b[0m"

RAISING_PLUGIN = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_{when}(item):
    if "test_all_reduce" in item.nodeid:
        raise RuntimeError("raised by a plugin of the user's")
"""


def conformance(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "conformance", *(str(a) for a in args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def run_json(reports_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((reports_dir / "latest" / "run.json").read_text())
    return data


def answer_rows(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    (start,) = [i for i, line in enumerate(lines) if "conformance: the answer" in line]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), len(lines))  # last: to the end
    return lines[start + 1 : end]


def junit_suite(path: Path) -> ElementTree.Element:
    suite = ElementTree.parse(path).getroot().find("testsuite")
    assert suite is not None
    return suite


def suite_properties(path: Path) -> dict[str, str]:
    return {str(p.get("name")): str(p.get("value")) for p in junit_suite(path).iter("property")}


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
@pytest.mark.parametrize("when", ["call", "setup"])
def test_a_test_failed_without_a_record_is_a_harness_error_everywhere(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, when: str, xdist: tuple[str, ...]
) -> None:
    files = copy_suites(pytester, "test_collectives.py")
    healthy = run_suite("--virtual-devices=2", *files)
    assert healthy.ret == pytest.ExitCode.OK, healthy.stdout.str()
    baseline = (reports_dir / "latest").resolve()
    pytester.makeconftest(RAISING_PLUGIN.format(when=when))
    junit = pytester.path / "junit.xml"
    result = run_suite("--virtual-devices=2", "--color=yes", "--run-report", f"--junitxml={junit}", *xdist, *files)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    test = "suites/test_collectives.py::test_all_reduce[all2-inherited]"
    said = f"{when}: RuntimeError: raised by a plugin of the user's"
    line = f"HARNESS ERROR in 1 test(s): {test} ({said}): no verdict on the machine can be read from them, so no "
    rows = answer_rows(result)
    assert rows[0].startswith(f"{RED}{BOLD}{line}"), rows  # first, in red
    assert not any("everything passed" in row for row in rows), rows
    assert run_json(reports_dir)["end"]["harness_errors"] == [
        {"nodeid": test, "when": when, "message": "RuntimeError: raised by a plugin of the user's"}
    ]
    env = (reports_dir / "latest" / "recommended.env").read_text()
    assert "no recommendation: 1 test(s) failed without a verdict" in env
    assert not [row for row in env.splitlines() if row and not row.startswith("#")], env  # nothing to set

    recommended = conformance("recommend", reports_dir / "latest")
    assert recommended.returncode == 1 and "no recommendation: 1 test(s) failed" in recommended.stdout, recommended
    compared = conformance("compare", baseline, reports_dir / "latest")
    assert compared.returncode == 1, compared
    assert compared.stdout.splitlines()[-1].startswith("HARNESS ERROR: 1 test(s) of the current run failed"), compared
    assert json.loads(conformance("compare", "--json", baseline, reports_dir / "latest").stdout)["harness_errors"]

    html = (reports_dir / "latest" / "report.html").read_text()
    assert "<strong>HARNESS ERROR in 1 test(s)</strong>" in html and test in html
    assert suite_properties(junit)["conformance.answer.1"].startswith(line)
    assert line in (junit_suite(junit).findtext("system-out") or "")
    # valid xunit2 but for pytest's own <error> of a test that errors in setup, which that schema does not know
    assert [e for e in schema_errors(junit) if "Unexpected child with tag 'error'" not in e] == []


@pytest.mark.slow
def test_a_negative_control_that_ends_otherwise_is_a_harness_error(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    """The suite checking itself failed: its record says what happened, but explains no failure of the machine."""
    pytester.makepyfile(
        test_control="""
from conformance.plan.matrix import DeviceSet

def test_control(conformance_case, conformance):
    result = conformance_case("all_reduce", DeviceSet(conformance.topology.devices, "all"), expect="error", sizes=[4])
    assert result.verdict == "error"
"""
    )
    result = run_suite("--virtual-devices=2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (error,) = run_json(reports_dir)["end"]["harness_errors"]
    assert (error["nodeid"], error["when"]) == ("test_control.py::test_control", "call")
    assert answer_rows(result)[0].startswith("HARNESS ERROR in 1 test(s): test_control.py::test_control (call: ")


def test_a_run_with_no_gpu_says_cpu_only_everywhere(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_collectives.py")
    junit = pytester.path / "junit.xml"
    result = run_suite("--virtual-devices=2", "--color=yes", f"--junitxml={junit}", "-k", "world_of_one", *files)
    assert result.ret == pytest.ExitCode.OK
    facts = run_json(reports_dir)
    assert facts["cpu_only"] and facts["cpu_only"].startswith("no GPU: "), facts
    line = f"CPU ONLY: no GPU was tested ({facts['cpu_only']}): 2 cases in 1 class passed on CPU ranks"
    assert answer_rows(result) == [f"{YELLOW}{BOLD}{line}{RESET}"]
    result.stdout.fnmatch_lines([f"{YELLOW}{BOLD}*= conformance: the answer =*"])  # not green
    assert suite_properties(junit)["conformance.cpu_only"] == facts["cpu_only"]
    assert line in (junit_suite(junit).findtext("system-out") or "")
    # --backend nccl makes "no GPU" an error before anything runs (the README's CI section)
    refused = run_suite("--virtual-devices=2", "--backend=nccl", *files)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: conformance: *the nccl backend needs GPUs, and none was found*"])


@pytest.mark.slow
def test_the_answer_and_export_reach_junit_with_the_same_cases_plain_and_xdist(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    """A SYS hang that p2p_level_nvl fixes: the JUnit file says so; its testcases and times match the records."""
    topology, scenario = write_tiny_suite(pytester)
    files = {}
    for name, xdist in (("plain", ()), ("xdist", ("-n", "2"))):
        files[name] = pytester.path / f"{name}.xml"
        run_suite(topology, scenario, *TIMEOUTS, *xdist, f"--junitxml={files[name]}", "test_tiny.py")
        records = [json.loads(line) for line in (reports_dir / "latest" / "results.jsonl").read_text().splitlines()]
        assert schema_errors(files[name]) == [], name
        suite = junit_suite(files[name])
        assert suite.get("name") == "gpu-conformance"
        properties = suite_properties(files[name])
        assert properties["conformance.answer.1"] == (
            "SYS pairs: HANG on inherited (pair_exchange 2/2); passes with NCCL_P2P_LEVEL=NVL -> "
            "export NCCL_P2P_LEVEL=NVL"
        )
        assert properties["conformance.export.1"] == "export NCCL_P2P_LEVEL=NVL"
        out = suite.findtext("system-out") or ""
        assert "SYS pairs: HANG on inherited" in out and "\nexport NCCL_P2P_LEVEL=NVL\n" in out
        times = {case.get("name"): float(case.get("time") or 0) for case in suite.iter("testcase")}
        for record in records:  # a testcase's time holds its case's wall time, ahead or not
            name_ = record["nodeid"].split("::")[1]
            assert times[name_] >= record["seconds"], (name_, times[name_], record["seconds"])
    plain, xdist = (junit_suite(files[n]) for n in ("plain", "xdist"))
    for attribute in ("tests", "failures", "errors", "skipped"):
        assert plain.get(attribute) == xdist.get(attribute), attribute
    names = {n: sorted(str(c.get("name")) for c in junit_suite(files[n]).iter("testcase")) for n in files}
    assert names["plain"] == names["xdist"]


BROKEN_INIT = """[scenario]
name = "every communicator fails to start"

[[rule]]
effect = "error"
phase = "init"
message = "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
"""


def test_a_control_the_machine_failed_first_is_no_harness_error(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    """The machine's failure reached the control's ranks before its injected raise: it skips saying so."""
    files = copy_suites(pytester, "test_failure_handling.py", "test_collectives.py")
    (pytester.path / "broken.toml").write_text(BROKEN_INIT)
    result = run_suite("--virtual-devices=2", "--scenario=broken.toml", "--matrix=inherited", "-rs", *files)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert "HARNESS ERROR" not in result.stdout.str()
    assert run_json(reports_dir)["end"]["harness_errors"] == []
    result.stdout.fnmatch_lines(["SKIPPED * the machine failed this control before its injected failure (ERROR *"])
    assert answer_rows(result)[0].startswith("all sets: ERROR on inherited")
