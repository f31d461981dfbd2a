"""Root cause against victims: the rank that really failed is named, the ranks it stranded are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.common.deadlines import CPU_STOP_LADDER
from conformance.launch import forkserver
from conformance.rank import context, probes
from conformance.verdict.decision import stack_excerpt, traceback_excerpt
from conftest import COLLECTIVE_TEST, read_records, scenario_text

TIMEOUTS = ("--step-timeout=4", "--op-timeout=3", "--init-timeout=3", "--grace=1", "-v")  # -v: the ranks' stacks
FOUR_RANKS = "--virtual-devices=4"
SLACK = 1.0  # seconds for scheduling noise on a loaded 2-core machine


def run_scenario(pytester: pytest.Pytester, run_suite, *rules: str, options=TIMEOUTS) -> pytest.RunResult:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    scenario = pytester.makefile(".toml", scen=scenario_text(*rules))
    result = run_suite(f"--scenario={scenario}", *options, FOUR_RANKS)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"conformance: SIMULATED run, scenario 'test scenario' ({scenario})"])
    return result


def only_record(reports_dir: Path) -> dict[str, Any]:
    records = read_records(reports_dir)
    assert len(records) == 1, records
    assert records[0]["simulated"] is True
    return records[0]


def failure_line(result: pytest.RunResult) -> str:
    lines = [line for line in result.outlines if line.startswith("[simulated] ")]
    assert len(lines) == 1, result.stdout.str()
    return lines[0]


def test_one_rank_errors_while_the_others_wait(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    """Rank 2 raises at its probe while ranks 0, 1, 3 sit in the all-reduce.

    The in-rank timeouts are long (15 s) and the case deadline longer (20 s): only the grace
    period (or the peers noticing rank 2 is gone) can end the case early, and it must.
    """
    case_timeout, grace = 20.0, 1.0
    result = run_scenario(
        pytester,
        run_suite,
        'effect = "slow"\nranks = [2]\nseconds = 0.5',  # the others are in the all-reduce by then
        'effect = "error"\nranks = [2]\nmessage = "simulated NIC failure on rank 2"',
        options=(f"--step-timeout={case_timeout:g}", "--op-timeout=15", "--init-timeout=15", f"--grace={grace:g}"),
    )
    assert failure_line(result) == (
        "[simulated] error: rank 2 (cpu2) in probe (all_reduce 4B): SimulatedError: simulated NIC failure on rank 2"
    )
    result.stdout.fnmatch_lines(
        [
            "root cause: rank 2 on cpu2, phase probe (all_reduce 4B), exit 1",
            "victims: rank 0 (* in probe (all_reduce 4B)), rank 1 (* in probe (all_reduce 4B)),"
            " rank 3 (* in probe (all_reduce 4B))",
        ]
    )
    record = only_record(reports_dir)
    assert record["verdict"] == "error"
    assert record["root_cause"] == {
        "rank": 2,
        "kind": "SimulatedError",
        "message": "simulated NIC failure on rank 2",
        "phase": "probe",
        "step": "all_reduce 4B",
    }
    assert record["victims"] == [0, 1, 3]
    ranks = record["ranks"]
    assert (ranks[2]["exit"], ranks[2]["status"], ranks[2]["stopped_by"]) == (1, "error", None)
    assert ranks[2]["seconds"] >= 0.5  # it slept before it raised
    for victim in (ranks[0], ranks[1], ranks[3]):
        assert (victim["phase"], victim["step"]) == ("probe", "all_reduce 4B"), victim
        assert (victim["exit"], victim["status"], victim["stopped_by"]) in (
            (1, "error", None),  # gloo told it the peer went away
            ("SIGTERM", "stopped", "grace"),  # or the watchdog ended it after the grace period
        ), victim
    # the others are released within the grace bound after rank 2 fails, not at any timeout
    bound = grace + CPU_STOP_LADDER.total + SLACK
    released = max(r["seconds"] for r in ranks) - ranks[2]["seconds"]
    assert 0 <= released <= bound, f"others ended {released:.2f}s after the failure; bound {bound:.2f}s"
    assert record["seconds"] < case_timeout / 2, record["seconds"]


def test_hang_on_one_rank_names_it(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    result = run_scenario(pytester, run_suite, 'effect = "hang"\nranks = [1]')
    summary = (  # rank 0's flight recorder holds the all-reduce it waits in; rank 1's does not
        "rank 1 (cpu1) in probe (all_reduce 4B): made no progress and was stopped (stalled); it issued 0 operation(s) "
        "where rank 0,2,3 issued 1: they wait in one it never joined (flight recorder)"
    )
    assert failure_line(result) == f"[simulated] hang: {summary}"
    result.stdout.fnmatch_lines(
        [
            "root cause: rank 1 on cpu1, phase probe (all_reduce 4B), exit SIGTERM",
            "victims: rank 0 (error in probe (all_reduce 4B)), rank 2 (error in probe (all_reduce 4B)),"
            " rank 3 (error in probe (all_reduce 4B))",
            "stack of rank 1 at the deadline:",
        ]
    )
    record = only_record(reports_dir)
    assert record["verdict"] == "hang"
    assert record["summary"] == summary
    assert record["root_cause"]["rank"] == 1
    assert record["root_cause"]["kind"] == "stopped"
    assert record["root_cause"]["phase"] == "probe"
    assert record["victims"] == [0, 2, 3]
    # the others time out in the all-reduce (op-timeout 3 s); rank 1 is stopped at the deadline (4 s)
    assert [(r["rank"], r["exit"], r["status"], r["phase"], r["stopped_by"]) for r in record["ranks"]] == [
        (0, 1, "error", "probe", None),
        (1, "SIGTERM", "stopped", "probe", "stalled"),
        (2, 1, "error", "probe", None),
        (3, 1, "error", "probe", None),
    ]


def test_hang_on_every_rank_has_no_single_root(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    result = run_scenario(pytester, run_suite, 'effect = "hang"')
    summary = "ranks 0,1,2,3 all stuck in probe (all_reduce 4B)"
    assert failure_line(result) == f"[simulated] hang: {summary}"
    assert not [line for line in result.outlines if line.startswith("root cause:")]
    result.stdout.fnmatch_lines([f"stack of rank {rank} at the deadline:" for rank in range(4)])
    record = only_record(reports_dir)
    assert record["verdict"] == "hang"
    assert record["summary"] == summary
    root = record["root_cause"]
    assert (root["rank"], root["kind"], root["message"], root["phase"]) == (None, "hang", summary, None)
    assert [(r["rank"], r["exit"], r["status"], r["phase"], r["stopped_by"]) for r in record["ranks"]] == [
        (rank, "SIGTERM", "stopped", "probe", "stalled") for rank in range(4)
    ]
    assert record["stop_seconds"] is not None and record["stop_seconds"] < 2.0


def test_the_failure_text_leaves_out_the_harnesss_own_frames() -> None:
    """The fork server, runpy and the rank's context (phases, injected faults) are the suite, not the machine."""
    dump = f"""Current thread 0x00007f (most recent call first):
  File "{context.__file__}", line 222 in apply_effect
  File "{context.__file__}", line 124 in phase
  File "{probes.__file__}", line 337 in pair_exchange
  File "{forkserver.__file__}", line 47 in _fork_rank
  File "<frozen runpy>", line 88 in _run_code
"""
    assert stack_excerpt(dump) == f'  File "{probes.__file__}", line 337 in pair_exchange'
    traceback = f"""Traceback (most recent call last):
  File "{probes.__file__}", line 75, in init_group
    ctx.phase("init", "init_process_group(nccl)")
  File "{context.__file__}", line 124, in phase
    self._apply_faults(name)
    ^^^^^^^^^^^^^^^^^^^^^^^^
SimulatedError: NCCL Error 2: unhandled system error
"""
    assert traceback_excerpt(traceback).splitlines() == [
        "Traceback (most recent call last):",
        f'  File "{probes.__file__}", line 75, in init_group',
        '    ctx.phase("init", "init_process_group(nccl)")',
        "SimulatedError: NCCL Error 2: unhandled system error",
    ]
