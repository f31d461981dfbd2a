"""Every verdict, produced by real gloo ranks on the CPU (most of them by a simulated fault).

Each test checks three things that must agree: the pytest outcome, the failure text (the verdict
word comes first, after the ``[simulated]`` marker) and the case's line in results.jsonl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.common.deadlines import CPU_STOP_LADDER
from conftest import COLLECTIVE_TEST, read_records, scenario_text

LOAD_SLACK = 2.0  # seconds for scheduling on a loaded machine

TIMEOUTS = ("--step-timeout=4", "--op-timeout=3", "--init-timeout=3", "--grace=1")
TWO_RANKS = "--virtual-devices=2"
NODEID = "test_x.py::test_case"
# Where rank 0 is when rank 1 fails at its probe: every rank has left init (the store barrier
# after init_process_group), so it waits in the all-reduce.
VICTIM_PHASES = ("probe",)


def make_case(pytester: pytest.Pytester, probe: str = "all_reduce", *rules: str) -> Path | None:
    """One test running ``probe`` on every device; a scenario file when rules are given."""
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe=probe))
    if not rules:
        return None
    return pytester.makefile(".toml", scen=scenario_text(*rules))


def only_record(reports_dir: Path) -> dict[str, Any]:
    records = read_records(reports_dir)
    assert len(records) == 1, records
    (record,) = records
    assert record["nodeid"] == NODEID
    assert record["schema"] == 1
    return record


def failure_line(result: pytest.RunResult) -> str:
    """The first line of the failure text of the one failed test."""
    lines = [line for line in result.outlines if line.startswith("[simulated] ")]
    assert len(lines) == 1, result.stdout.str()
    return lines[0]


def assert_simulated_header(result: pytest.RunResult, scenario: Path) -> None:
    result.stdout.fnmatch_lines([f"conformance: SIMULATED run, scenario 'test scenario' ({scenario})"])
    result.stdout.fnmatch_lines(["*= conformance summary (SIMULATED) =*"])


def rank_facts(record: dict[str, Any], *keys: str) -> list[tuple[Any, ...]]:
    return [tuple(r[k] for k in keys) for r in record["ranks"]]


def test_pass_without_scenario(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    make_case(pytester)
    result = run_suite(*TIMEOUTS, TWO_RANKS)
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if "SIMULATED" in line or "[simulated]" in line]
    result.stdout.fnmatch_lines(["conformance: run *, backend gloo, 2 devices: cpu0, cpu1"])
    record = only_record(reports_dir)
    assert record["verdict"] == "pass"
    assert record["root_cause"] is None
    assert record["victims"] == []
    assert record["summary"] == ""
    assert record["simulated"] is False
    assert record["stop_seconds"] is None
    assert record["probe"] == "all_reduce"
    assert record["devices"] == ["cpu0", "cpu1"]
    assert record["backend"] == "gloo"
    assert rank_facts(record, "rank", "exit", "status", "phase", "step", "stopped_by") == [
        (0, 0, "ok", "teardown", "every rank checked (store)", None),
        (1, 0, "ok", "teardown", "every rank checked (store)", None),
    ]


def test_fail_wrong_data(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    scenario = make_case(pytester, "all_reduce", 'effect = "wrong_data"\nranks = [0]')
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, TWO_RANKS)
    result.assert_outcomes(failed=1)
    assert_simulated_header(result, scenario)
    message = "all_reduce 4B: 1 of 1 elements wrong; first at index 0: got 4.0, expected 3.0"
    assert failure_line(result) == f"[simulated] fail: rank 0 (cpu0) in verify (all_reduce 4B): WrongData: {message}"
    # the short summary shows the headline JUnit's message starts with (conformance/junit.py)
    result.stdout.fnmatch_lines(["FAIL test_x.py::test_case - FAIL cpu0-cpu1 (all) in verify (all_reduce 4B) *"])
    record = only_record(reports_dir)
    assert record["verdict"] == "fail"
    assert record["root_cause"] == {
        "rank": 0, "kind": "WrongData", "message": message, "phase": "verify", "step": "all_reduce 4B",
    }  # fmt: skip
    assert record["victims"] == []
    assert record["simulated"] is True
    assert record["stop_seconds"] is None
    assert rank_facts(record, "rank", "exit", "status", "phase") == [
        (0, 2, "fail", "verify"),
        (1, 0, "ok", "teardown"),
    ]


@pytest.mark.parametrize(
    ("effect", "message", "kind"),
    [
        ("error", "simulated NIC failure", "SimulatedError"),
        ("oom", "CUDA out of memory. Tried to allocate 2.00 GiB", "OutOfMemoryError"),
    ],
)
def test_error(pytester: pytest.Pytester, run_suite, reports_dir: Path, effect: str, message: str, kind: str) -> None:
    scenario = make_case(pytester, "all_reduce", f'effect = "{effect}"\nranks = [1]\nmessage = "{message}"')
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, TWO_RANKS)
    result.assert_outcomes(failed=1)
    assert_simulated_header(result, scenario)
    assert failure_line(result) == f"[simulated] error: rank 1 (cpu1) in probe (all_reduce 4B): {kind}: {message}"
    result.stdout.fnmatch_lines(["root cause: rank 1 on cpu1, phase probe (all_reduce 4B), exit 1"])
    record = only_record(reports_dir)
    assert record["verdict"] == "error"
    assert record["root_cause"] == {
        "rank": 1, "kind": kind, "message": message, "phase": "probe", "step": "all_reduce 4B",
    }  # fmt: skip
    assert record["victims"] == [0]
    assert record["simulated"] is True
    rank0, rank1 = record["ranks"]
    assert (rank1["exit"], rank1["status"], rank1["phase"], rank1["step"]) == (1, "error", "probe", "all_reduce 4B")
    # rank 0 waited in the all-reduce: gloo tells it the peer went away, or the grace period ends it
    assert (rank0["exit"], rank0["status"]) in ((1, "error"), ("SIGTERM", "stopped"))
    assert rank0["phase"] in VICTIM_PHASES


@pytest.mark.parametrize("signal_name", ["SIGSEGV", "SIGKILL"])
def test_crash(pytester: pytest.Pytester, run_suite, reports_dir: Path, signal_name: str) -> None:
    scenario = make_case(pytester, "all_reduce", f'effect = "crash"\nranks = [1]\nsignal = "{signal_name}"')
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, TWO_RANKS)
    result.assert_outcomes(failed=1)
    assert_simulated_header(result, scenario)
    assert failure_line(result) == f"[simulated] crash: rank 1 (cpu1) in probe (all_reduce 4B): killed by {signal_name}"
    result.stdout.fnmatch_lines([f"root cause: rank 1 on cpu1, phase probe (all_reduce 4B), exit {signal_name}"])
    record = only_record(reports_dir)
    assert record["verdict"] == "crash"
    assert record["root_cause"] == {
        "rank": 1, "kind": "crash", "message": f"killed by {signal_name}", "phase": "probe", "step": "all_reduce 4B",
    }  # fmt: skip
    assert record["victims"] == [0]
    assert record["simulated"] is True
    rank0, rank1 = record["ranks"]
    assert (rank1["exit"], rank1["status"], rank1["phase"]) == (signal_name, "crash", "probe")
    assert (rank0["exit"], rank0["status"]) in ((1, "error"), ("SIGTERM", "stopped"))
    assert rank0["phase"] in VICTIM_PHASES


@pytest.mark.parametrize(
    ("ignore_sigterm", "exit_label"), [(False, "SIGTERM"), (True, "SIGKILL")], ids=["sigterm", "sigterm-ignored"]
)
def test_hang(pytester: pytest.Pytester, run_suite, reports_dir: Path, ignore_sigterm: bool, exit_label: str) -> None:
    rule = f'effect = "hang"\nranks = [1]\nignore_sigterm = {str(ignore_sigterm).lower()}'
    scenario = make_case(pytester, "all_reduce", rule)
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, TWO_RANKS)
    result.assert_outcomes(failed=1)
    assert_simulated_header(result, scenario)
    summary = (  # rank 0's flight recorder holds the all-reduce it waits in; rank 1's does not
        "rank 1 (cpu1) in probe (all_reduce 4B): made no progress and was stopped (stalled); it issued 0 operation(s) "
        "where rank 0 issued 1: they wait in one it never joined (flight recorder)"
    )
    assert failure_line(result) == f"[simulated] hang: {summary}"
    result.stdout.fnmatch_lines(
        [
            f"root cause: rank 1 on cpu1, phase probe (all_reduce 4B), exit {exit_label}",
            "victims: rank 0 (error in probe (all_reduce 4B))",
            "stopped by the watchdog (stalled: no rank reported progress for the step*); last rank reaped *s later",
        ]
    )
    result.stdout.fnmatch_lines(["HANG  test_x.py::test_case: " + summary])
    record = only_record(reports_dir)
    assert record["verdict"] == "hang"
    assert record["summary"] == summary
    assert record["root_cause"] == {
        "rank": 1,
        "kind": "stopped",
        "message": "stopped by the watchdog (stalled) in its current phase",
        "phase": "probe",
        "step": "all_reduce 4B",
    }
    assert record["victims"] == [0]
    assert record["simulated"] is True
    # rank 0 gives up in the all-reduce at op-timeout (3 s), before the case deadline (4 s)
    assert rank_facts(record, "rank", "exit", "status", "phase", "stopped_by") == [
        (0, 1, "error", "probe", None),
        (1, exit_label, "stopped", "probe", "stalled"),
    ]
    assert record["stop_seconds"] is not None and 0 < record["stop_seconds"] < 2.0
    assert 4.0 <= record["ranks"][1]["seconds"] < 4.0 + 2.5


SKIP_REPEATS = 8
SKIP_TEST = """
import pytest
from conformance.plan.matrix import DeviceSet

@pytest.mark.parametrize("attempt", range({repeats}))
def test_case(conformance_case, conformance, attempt):
    conformance_case("pair_exchange", DeviceSet(conformance.topology.devices, "all"), sizes=[4])
"""


def test_skip(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    """Every rank skips, so the case is skipped: never a hang or a failure.

    The same case runs several times: a rank that skips leaves at once, and if a peer is still
    connecting to it the peer fails with "connection closed by peer".  That must not turn a skip
    into another verdict, however the ranks happen to be scheduled.
    """
    pytester.makepyfile(test_x=SKIP_TEST.format(repeats=SKIP_REPEATS))
    # the scenario's only rule targets another probe: the run is simulated, these cases untouched
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "error"\nprobes = ["all_reduce"]'))
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, "--virtual-devices=3", "-rs")
    reason = "pair_exchange needs exactly 2 ranks, got 3"
    records = read_records(reports_dir)
    verdicts = {r["nodeid"]: (r["verdict"], r["summary"]) for r in records}
    expected = {f"test_x.py::test_case[{i}]": ("skip", reason) for i in range(SKIP_REPEATS)}
    assert verdicts == expected
    result.assert_outcomes(skipped=SKIP_REPEATS)
    assert_simulated_header(result, scenario)
    result.stdout.fnmatch_lines([f"SKIPPED [[]{SKIP_REPEATS}[]] *: {reason}"])
    for record in records:
        assert record["root_cause"] is None
        assert record["victims"] == []
        assert record["simulated"] is True
        assert record["stop_seconds"] is None
        assert record["devices"] == ["cpu0", "cpu1", "cpu2"]
        # the probe skips before it reports a probe phase: the ranks' last phase is init
        assert rank_facts(record, "rank", "exit", "status", "phase") == [
            (0, 3, "skip", "init"),
            (1, 3, "skip", "init"),
            (2, 3, "skip", "init"),
        ]


def test_inconclusive_when_control_fails(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    rule = 'effect = "error"\nphase = "control"\nranks = [1]\nmessage = "no store"'
    scenario = make_case(pytester, "all_reduce", rule)
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, TWO_RANKS)
    result.assert_outcomes(failed=1)
    assert_simulated_header(result, scenario)
    summary = "rank 1 (cpu1) in control (store check-in): SimulatedError: no store"
    assert failure_line(result) == f"[simulated] inconclusive: {summary}"
    result.stdout.fnmatch_lines(["victims: rank 0 (stopped in control (store check-in))"])
    record = only_record(reports_dir)
    assert record["verdict"] == "inconclusive"
    assert record["summary"] == summary
    assert record["root_cause"] == {
        "rank": 1, "kind": "SimulatedError", "message": "no store", "phase": "control", "step": "store check-in",
    }  # fmt: skip
    assert record["victims"] == [0]
    assert record["simulated"] is True
    # rank 0 waits at the store check-in (init-timeout 3 s) and is stopped after the 1 s grace
    assert rank_facts(record, "rank", "exit", "status", "phase", "stopped_by") == [
        (0, "SIGTERM", "stopped", "control", "grace"),
        (1, 1, "error", "control", None),
    ]
    assert record["stop_seconds"] is not None and record["stop_seconds"] < 2.0


SHORT_GRACE_TEST = """
from conformance.plan.matrix import DeviceSet

def test_case(conformance_case, conformance):
    conformance_case("all_reduce", DeviceSet(conformance.topology.devices, "all"), sizes=[4], grace=0.3)
"""


def test_a_case_may_ask_for_a_shorter_grace(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    """The negative controls' way to check the grace mechanism without waiting out --grace on every run."""
    pytester.makepyfile(test_x=SHORT_GRACE_TEST)
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "error"\nphase = "control"\nranks = [1]'))
    options = ("--step-timeout=20", "--op-timeout=15", "--init-timeout=15", "--grace=10")
    run_suite(f"--scenario={scenario}", *options, TWO_RANKS).assert_outcomes(failed=1)
    record = only_record(reports_dir)
    waiting, failing = record["ranks"]
    assert (waiting["status"], waiting["stopped_by"]) == ("stopped", "grace")
    released = waiting["seconds"] - failing["seconds"]
    assert released <= 0.3 + CPU_STOP_LADDER.total + LOAD_SLACK, released  # not the 10 s of --grace
