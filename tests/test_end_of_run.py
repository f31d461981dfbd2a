"""The end of a pytest run: recommendation, ``--baseline`` and ``--run-report``.

Real runs of the suite's plugin: the session reads its own run back when every case is recorded,
writes recommended.env (and report.html), compares against a baseline and fails the session on a
regression even when every test passed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.cli.main import main
from conftest import REPO, copy_suites, read_records, scenario_text

RunSuite = Callable[..., pytest.RunResult]
LOAD_MARGIN = 15.0  # seconds a busy machine adds to starting and ending a run
TOPOLOGIES = REPO / "scenarios" / "topologies"

PAIR_TEST = """
def test_pair(conformance_case, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=[4])
"""


def test_recommendation_and_report_written_at_the_end(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    pytester.makepyfile(test_p=PAIR_TEST)
    result = run_suite("--virtual-devices=2", "--run-report")
    result.assert_outcomes(passed=1)
    run_dir = (reports_dir / "latest").resolve()
    result.stdout.fnmatch_lines(
        [
            "recommended environment:",
            "nothing needs setting*",
            f"(written to {run_dir / 'recommended.env'})",
            f"HTML report: {run_dir / 'report.html'}",
        ]
    )
    assert (run_dir / "recommended.env").read_text().startswith("#")
    html = (run_dir / "report.html").read_text()
    assert "<html" in html and "cpu0" in html and "<script" not in html


NEGATIVE_CONTROL_TEST = """
from conformance.plan.matrix import DeviceSet

def test_negative_control(conformance_case, conformance):
    result = conformance_case("fail_one_rank", DeviceSet(conformance.topology.devices, "all"), expect="error")
    assert result.verdict == "error"
"""


def test_regression_fails_a_session_whose_tests_pass(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, tmp_path: Path
) -> None:
    """A test that expects its case's error passes, yet fails the session against a baseline.

    In the baseline that case passed, so this run is a regression (pass -> error).
    """
    pytester.makepyfile(test_n=NEGATIVE_CONTROL_TEST)
    first = run_suite("--virtual-devices=2")
    first.assert_outcomes(passed=1)
    (record,) = read_records(reports_dir)
    assert record["verdict"] == "error"
    baseline = tmp_path / "baseline.jsonl"
    baseline.write_text(json.dumps({**record, "run_id": "older-run", "verdict": "pass", "root_cause": None}) + "\n")

    result = run_suite("--virtual-devices=2", f"--baseline={baseline}")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"against baseline {baseline}:", "REGRESSIONS (1):", "*test_negative_control*"])
    # the comparison is kept with the run: a report rendered later, by the command, still shows it
    run_dir = (reports_dir / "latest").resolve()
    kept = json.loads((run_dir / "comparison.json").read_text())
    assert (
        kept["counts"]["regressions"] == 1
        and kept["lines"][0]
        == f"baseline: {baseline} (run older-run, " + (kept["lines"][0].split("(run older-run, ", 1)[1])
    )
    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    regressions = html[html.index('<section id="regressions">') :]
    assert "Regressions against the baseline (1)" in regressions and "test_negative_control" in regressions

    same = run_suite("--virtual-devices=2", f"--baseline={reports_dir / 'latest'}")
    assert same.ret == pytest.ExitCode.OK
    same.stdout.fnmatch_lines(["no regressions*"])


def baseline_folder(tmp_path: Path, facts: dict, records: list[dict]) -> Path:
    folder = tmp_path / "baseline-run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(facts))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


A_RECORD = {"nodeid": "test_p.py::test_pair[cpu0-cpu1-CPU-inherited]", "probe": "pair_exchange", "verdict": "pass"}
# Baselines a run could never be compared with: refused before any case, naming the file and why.
UNCOMPARABLE = {
    "missing": (None, None, "*/missing: no such run folder or file (nor is it a shipped baseline: pcie-2socket-8gpu)"),
    "another-host": ({"host": "elsewhere"}, [A_RECORD], "* comes from another machine (hosts differ: elsewhere / *"),
    "no-records": ({}, [], "*: no case of this suite recorded, nothing to compare with"),
    "no-record-of-this-suite": ({}, [{"name": "x"}], "*: no record of this suite*"),
    "no-readable-line": ({}, ["{cut off"], "*: no readable record*"),
}


@pytest.mark.parametrize("case", UNCOMPARABLE.values(), ids=UNCOMPARABLE.keys())
def test_bad_baseline_stops_the_run_before_any_case(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, tmp_path: Path, case: tuple
) -> None:
    facts, records, message = case
    pytester.makepyfile(test_p=PAIR_TEST)
    folder = tmp_path / "missing" if facts is None else baseline_folder(tmp_path, facts, records)
    if records and isinstance(records[0], str):
        (folder / "results.jsonl").write_text(records[0] + "\n")
    result = run_suite("--virtual-devices=2", f"--baseline={folder}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: conformance: command-line option --baseline: {message}"])
    assert len([line for line in result.stderr.lines if line]) == 1, result.stderr.lines
    assert not (reports_dir / "latest").exists()


@pytest.mark.parametrize("listing", ["--collect-only", "--fixtures", "--markers"])
def test_a_session_that_runs_no_test_leaves_no_run_folder(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, listing: str
) -> None:
    """The forkserver starts at session start only where cases will run (``run_tag`` checks nothing is left)."""
    pytester.makepyfile(test_p=PAIR_TEST)
    result = run_suite("--virtual-devices=2", listing)
    assert result.ret == 0
    assert not list(reports_dir.glob("2*")), list(reports_dir.iterdir())


def test_the_forkserver_starts_at_session_start(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path):
    """A run whose tests need no case still gets its forkserver early (and stops it at the end)."""
    pytester.makepyfile(test_p="def test_nothing():\n    pass\n")
    result = run_suite("--virtual-devices=2")
    result.assert_outcomes(passed=1)
    logs = list(reports_dir.glob("2*/forkserver/*.log"))
    assert len(logs) == 1


ANSWER_SEP = "*= conformance: the answer =*"


def test_a_healthy_run_answers_in_one_green_line_and_counts_no_error(
    pytester: pytest.Pytester, run_suite: RunSuite
) -> None:
    """Everything passed: one line says so, last; the negative control's expected error is counted nowhere.

    On a (simulated) GPU machine: a run of CPU ranks says CPU ONLY instead (``test_honest_answers.py``).
    """
    pytester.makepyfile(test_p=PAIR_TEST, test_n=NEGATIVE_CONTROL_TEST)
    result = run_suite(f"--topology-file={TOPOLOGIES / 'pcie-2gpu.json'}", "--color=yes")
    result.assert_outcomes(passed=2)
    green, reset = "\x1b[32m", "\x1b[0m"
    lines = result.outlines
    (sep,) = [i for i, line in enumerate(lines) if "conformance: the answer" in line]
    assert lines[sep + 1] == f"{green}\x1b[1meverything passed: 1 case in 1 class; nothing to set{reset}"
    assert sep + 2 == len(lines) and "passed" in lines[sep - 2]  # the answer last, after pytest's count line
    assert lines[sep - 1].startswith("tests: pytest's 2 = 1 case + 1 negative control")  # the counts tied
    counts = next(line for line in lines if line.startswith("probe"))
    assert counts.split() == ["probe", "pass"]  # no error column in a green run
    result.stdout.fnmatch_lines(["negative controls: 1 ended as their tests expected (error); not counted above"])


def test_a_failing_class_is_answered_first_in_red_and_plain_without_colour(
    pytester: pytest.Pytester, run_suite: RunSuite
) -> None:
    """A class that failed everywhere: its line names the verdict, the rung, the counts and that nothing fixed it."""
    pytester.makepyfile(test_p=PAIR_TEST)
    pytester.path.joinpath("broken.toml").write_text(
        scenario_text('effect = "error"\nphase = "probe"\nmessage = "simulated link error"')
    )
    plain = run_suite("--virtual-devices=2", "--scenario=broken.toml", "--matrix=inherited", "--color=no")
    plain.assert_outcomes(failed=1)
    answer = "CPU pairs: ERROR on inherited (pair_exchange 1/1); no rung passed (tried inherited): no setting fixes it"
    plain.stdout.fnmatch_lines(["*= conformance summary*", "*= conformance: the answer (SIMULATED) =*", answer])
    assert not any("\x1b[" in line for line in plain.outlines)
    coloured = run_suite("--virtual-devices=2", "--scenario=broken.toml", "--matrix=inherited", "--color=yes")
    assert f"\x1b[31m\x1b[1m{answer}\x1b[0m" in coloured.outlines


INTERRUPTING_TEST = """
def test_zz_a_user_presses_ctrl_c():
    raise KeyboardInterrupt
"""


def answer_first_line(result: pytest.RunResult) -> str:
    lines = result.outlines
    (sep,) = [i for i, line in enumerate(lines) if "= conformance: the answer" in line]
    return lines[sep + 1]


@pytest.mark.parametrize("run", ["failing", "passing", "cpu-only", "interrupted"])
def test_the_answer_is_the_last_thing_on_the_screen(pytester: pytest.Pytester, run_suite: RunSuite, run: str) -> None:
    """Its first line is among the last 15 of any run, after pytest's own summary and count line."""
    pytester.makepyfile(test_p=PAIR_TEST)
    args = [f"--topology-file={TOPOLOGIES / 'pcie-2gpu.json'}", "--matrix=inherited"]
    if run == "failing":
        pytester.path.joinpath("broken.toml").write_text(
            scenario_text('effect = "error"\nphase = "probe"\nmessage = "simulated link error"')
        )
        args.append("--scenario=broken.toml")
    if run == "cpu-only":
        args = ["--virtual-devices=2", "--matrix=inherited"]
    if run == "interrupted":
        pytester.makepyfile(test_zz=INTERRUPTING_TEST)
    result = run_suite(*args)
    first = answer_first_line(result)
    assert first in result.outlines[-15:], "\n".join(result.outlines[-30:])
    counts = next(i for i, line in enumerate(result.outlines) if line.startswith("=") and " in " in line)
    assert counts < result.outlines.index(first)  # pytest's "1 passed in 2.1s" comes before it
    expected = {"failing": "PHB pairs: ERROR", "passing": "everything passed", "cpu-only": "CPU ONLY",
                "interrupted": "INCOMPLETE RUN"}[run]  # fmt: skip
    assert first.startswith(expected), first
    if run == "failing":  # its failure reads as its verdict, not the suite's own frames
        assert "forkserver" not in result.stdout.str() and "runpy" not in result.stdout.str()
        result.stdout.fnmatch_lines(["ERROR *test_p.py::test_pair*"])  # the verdict word first in pytest's summary


HANG = 'effect = "hang"\nphase = "probe"'


def test_pytest_timeouts_limit_is_every_cases_outer_bound_or_refused(
    pytester: pytest.Pytester, run_suite: RunSuite
) -> None:
    """--timeout 5 was silently overridden: a hanging pair ran to the suite's own 30 s deadline."""
    pytester.makepyfile(test_p=PAIR_TEST)
    pytester.path.joinpath("hang.toml").write_text(scenario_text(HANG))
    too_short = run_suite("--virtual-devices=2", "--timeout=1")
    assert too_short.ret == pytest.ExitCode.USAGE_ERROR
    too_short.stderr.fnmatch_lines(["ERROR: conformance: pytest-timeout --timeout 1: below what one case needs *"])
    begun = time.monotonic()
    bounded = run_suite("--virtual-devices=2", "--scenario=hang.toml", "--matrix=inherited", "--timeout=15",
                        "--init-timeout=5", "--op-timeout=5", "--step-timeout=60", "--case-timeout=120")  # fmt: skip
    took = time.monotonic() - begun
    bounded.stdout.fnmatch_lines(["conformance: pytest-timeout --timeout 15: every case ends within it (its limit *"])
    bounded.assert_outcomes(failed=1)
    assert took < 15 + LOAD_MARGIN, took  # not the 60 s step deadline the settings gave


def test_max_bytes_is_the_largest_message_and_where_busbw_is_measured(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_collectives.py")
    result = run_suite("--virtual-devices=2", "--max-bytes=2M", "-k", "test_all_reduce and all2", *files)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    (record,) = [r for r in read_records(reports_dir) if r["probe"] == "all_reduce" and len(r["devices"]) == 2]
    assert list(record["metrics"]["busbw_gbps"]) == ["2MiB"]


def test_the_fallback_rungs_left_out_are_said_once_at_the_start(pytester: pytest.Pytester, run_suite: RunSuite) -> None:
    """'486 deselected' with no -k, and a percentage that jumped: the start says why, in words, once."""
    pytester.makepyfile(test_p=PAIR_TEST)
    result = run_suite(f"--topology-file={TOPOLOGIES / 'pcie-2gpu.json'}")
    (said,) = [line for line in result.outlines if "on fallback rungs run only for a class" in line]
    later = int(said.split("; ")[1].split()[0])
    assert said.index("conformance: ") == 0 and result.parseoutcomes()["deselected"] == later
