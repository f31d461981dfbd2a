"""The collectives over one device set share one process group; each test keeps its own verdict.

Real pytest runs of the repository's collective suite through ``pytester``, real gloo ranks, faults
injected by scenario rules that name one collective; and the splitting rule on made-up reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.common.casefiles import SHARED_DONE
from conformance.common.verdicts import Verdict
from conformance.harness.shared_group import Part, shared_spec, split
from conformance.launch.case import CaseResult, CaseSpec
from conformance.verdict.decision import Decision, RankReport
from conftest import copy_suites, read_records, scenario_text

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
SELECT = ["-k", " or ".join(f"test_{name}" for name in COLLECTIVES), "--virtual-devices=4", "--matrix=inherited"]


def by_test(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["nodeid"].split("::")[1].split("[")[0].removeprefix("test_"): r for r in records}


def test_collectives_over_one_device_set_run_in_one_case(pytester: pytest.Pytester, run_suite, reports_dir: Path):
    files = copy_suites(pytester, "test_collectives.py")
    result = run_suite(*files, *SELECT)
    result.assert_outcomes(passed=4)
    records = by_test(read_records(reports_dir))
    assert sorted(records) == sorted(COLLECTIVES)
    assert len({r["case_dir"] for r in records.values()}) == 1  # one communicator, not four
    first = records["all_reduce"]["nodeid"]
    for name, record in records.items():
        assert record["verdict"] == "pass" and record["probe"] == name
        assert record["shared_by"] == first
        assert SHARED_DONE not in record["metrics"]
    # each keeps its own figures: all-gather's bandwidth is its own, broadcast measures none
    assert "busbw_gbps" in records["all_gather"]["metrics"]
    assert "busbw_gbps" not in records["broadcast"]["metrics"]
    assert records["all_gather"]["metrics"]["busbw_gbps"] != records["all_reduce"]["metrics"]["busbw_gbps"]
    assert all(r["seconds"] > 0 for r in records.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("failing", "effect", "verdict"),
    [("broadcast", "error", "error"), ("all_gather", "hang", "hang")],
)
def test_a_failure_in_a_shared_case_gives_each_test_its_own_verdict(
    pytester: pytest.Pytester, run_suite, reports_dir: Path, failing: str, effect: str, verdict: str
):
    """Before the failure: passed in the shared case; the failing one: its verdict; after it: run alone."""
    files = copy_suites(pytester, "test_collectives.py")
    rule = f'effect = "{effect}"\nprobes = ["{failing}"]\nranks = [2]'
    scenario = pytester.makefile(".toml", scenario=scenario_text(rule))
    # Short enough that the hang costs seconds, long enough that a healthy 4-rank step on a machine with
    # a load of 10 is never taken for one (init and op stay below the step deadline, as the settings require).
    result = run_suite(*files, *SELECT, f"--scenario={scenario}", "--step-timeout=8", "--init-timeout=6",
                       "--op-timeout=6")  # fmt: skip
    result.assert_outcomes(passed=3, failed=1)
    records = by_test(read_records(reports_dir))
    order = list(COLLECTIVES)
    at = order.index(failing)
    first = records["all_reduce"]["nodeid"]
    shared_dir = records["all_reduce"]["case_dir"]
    for name in order[:at]:
        assert records[name]["verdict"] == "pass" and records[name]["shared_by"] == first
        assert records[name]["case_dir"] == shared_dir
    assert records[failing]["verdict"] == verdict
    assert records[failing]["case_dir"] == shared_dir
    assert records[failing]["root_cause"]["rank"] == 2
    for name in order[at + 1 :]:  # never reached in the shared case: each ran a case of its own
        assert records[name]["verdict"] == "pass" and records[name]["shared_by"] is None
        assert records[name]["case_dir"] != shared_dir


def _report(rank: int, done: list[str], status: str = "ok") -> RankReport:
    finished = {name: {"metrics": {"busbw_gbps": {"4B": float(i)}}, "seconds": 0.5} for i, name in enumerate(done)}
    return RankReport(rank, f"cpu{rank}", 100 + rank, "teardown", "", None, 5, 0, 3.0, status,
                      metrics={SHARED_DONE: finished, "group_fact": 1})  # fmt: skip


def _parts() -> list[Part]:
    return [Part(CaseSpec(nodeid=f"t::test_{name}", probe=name, devices=(), backend="gloo")) for name in COLLECTIVES]


def _result(reports: list[RankReport], decision: Decision, parts: list[Part]) -> CaseResult:
    return CaseResult(shared_spec(parts), decision, reports, 5.0, Path("/nowhere"), True, "stalled", 4.0)


def test_split_after_a_teardown_failure_the_last_collective_carries_the_verdict():
    parts = _parts()
    reports = [_report(0, list(COLLECTIVES)), _report(1, list(COLLECTIVES), status="error")]
    failed = Decision(Verdict.ERROR, reports[1], [], "rank 1 in teardown: error")
    out = split(_result(reports, failed, parts), parts)
    verdicts = {nodeid: r.verdict if r else None for nodeid, r in out.items()}
    assert verdicts == {"t::test_all_reduce": "pass", "t::test_broadcast": "pass", "t::test_all_gather": "pass",
                        "t::test_reduce_scatter": "error"}  # fmt: skip
    passed = out["t::test_broadcast"]
    assert passed is not None and passed.stop_reason is None and passed.seconds == 0.5
    assert passed.metrics == {"busbw_gbps": {"4B": 1.0}, "group_fact": 1}
    carrier = out["t::test_reduce_scatter"]
    assert carrier is not None and carrier.seconds == 5.0 - 3 * 0.5 and carrier.stop_reason == "stalled"


def test_split_a_collective_one_rank_did_not_finish_fails_and_the_rest_run_alone():
    parts = _parts()
    reports = [_report(0, ["all_reduce", "broadcast"]), _report(1, ["all_reduce"], status="stopped")]
    hung = Decision(Verdict.HANG, reports[1], [], "rank 1 in probe broadcast: made no progress")
    out = split(_result(reports, hung, parts), parts)
    assert out["t::test_all_reduce"] is not None and out["t::test_all_reduce"].verdict == "pass"
    assert out["t::test_broadcast"] is not None and out["t::test_broadcast"].verdict == "hang"
    assert out["t::test_all_gather"] is None and out["t::test_reduce_scatter"] is None
