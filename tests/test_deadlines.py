"""Deadline order, where a device hang is placed, and each rank's last collectives in the record.

On NCCL the suite's watchdog must act before torch's (which would SIGABRT the ranks before any
stack is taken); on gloo the in-rank timeout comes first.  A simulated device hang returns from the
collective at once, as NCCL does, and blocks at the next device synchronize: the probes must
synchronize inside the step, so the hang is placed there and not in ``verify``.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.common import casefiles
from conformance.common.deadlines import (
    CPU_STOP_LADDER,
    GPU_STOP_LADDER,
    NCCL_WATCHDOG_MARGIN,
    OUTER_NET_MARGIN,
    TORCH_HEARTBEAT_DEFAULT,
    Deadlines,
)
from conformance.common.verdicts import Verdict
from conformance.discover.topology import Device
from conformance.harness.progress import status_line, time_left_text
from conformance.launch.case import CaseRunner, CaseSpec
from conformance.launch.watchdog import EVENT_WAIT
from conformance.rank import flight_recorder
from conformance.record.coverage import Coverage
from conformance.verdict.decision import Decision
from conftest import COLLECTIVE_TEST, read_records, scenario_text

pytestmark = pytest.mark.usefixtures("isolated_env")
TIMEOUTS = ("--step-timeout=4", "--op-timeout=3", "--init-timeout=3", "--grace=1")


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize(("init", "op", "case"), [(20, 20, 60), (2, 2, 3), (10, 25, 600), (0.5, 0.5, 1)])
def test_every_layer_acts_before_the_one_around_it(backend: str, init: float, op: float, case: float) -> None:
    deadlines = Deadlines(init, op, case, 3, backend)
    assert deadlines.step_deadline == min(30.0, case)
    assert deadlines.in_rank_too_late() == []
    ladder = deadlines.stop_ladder
    assert deadlines.case_bound == case + ladder.total
    start = deadlines.forkserver_ready_wait + deadlines.spawn_wait + deadlines.turn_wait
    assert deadlines.outer_net() == deadlines.case_bound + deadlines.lease_wait + start + OUTER_NET_MARGIN
    if backend == "nccl":
        assert ladder == GPU_STOP_LADDER
        assert deadlines.process_group_timeout == deadlines.case_bound + NCCL_WATCHDOG_MARGIN > deadlines.case_bound
    else:
        assert ladder == CPU_STOP_LADDER
        assert deadlines.process_group_timeout == op < deadlines.step_deadline <= case


def test_cpu_keeps_its_fast_stop_ladder_and_gpu_allows_cuda_teardown() -> None:
    assert (CPU_STOP_LADDER.dump_wait, CPU_STOP_LADDER.term_wait, CPU_STOP_LADDER.kill_wait) == (0.5, 0.5, 1.0)
    assert GPU_STOP_LADDER.kill_wait >= 10 > CPU_STOP_LADDER.kill_wait


@pytest.mark.parametrize(
    ("deadlines", "late"),
    [
        (Deadlines(10, 60, 60, 3, "gloo"), [("op_timeout", 60)]),
        (Deadlines(60, 30, 60, 3, "nccl", step_timeout=90), [("init_timeout", 60)]),
        (Deadlines(5, 5, 4, 3, "gloo"), [("init_timeout", 5), ("op_timeout", 5)]),  # the case limit is shorter
    ],
)
def test_in_rank_timeouts_at_or_after_the_step_deadline_are_named(
    deadlines: Deadlines, late: list[tuple[str, float]]
) -> None:
    """The one layer rule settings can break (settings.check_deadline_layers refuses it, test_units)."""
    assert deadlines.in_rank_too_late() == late


def gpus(count: int) -> tuple[Device, ...]:
    return tuple(
        Device(f"gpu{i}", i, "gpu", uuid=f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-0000-0000-000000000000", nvml_index=i)
        for i in range(count)
    )


@pytest.mark.parametrize("case_timeout", [60.0, 600.0])
def test_nccl_ranks_get_torch_watchdog_behind_the_suites(tmp_path: Path, case_timeout: float) -> None:
    """What an NCCL case tells its ranks: GPUs by UUID, torch's timeout after the stop ladder, the recorder."""
    deadlines = Deadlines(30, 30, case_timeout, 3, "nccl")
    devices = gpus(4)
    runner = CaseRunner(tmp_path / "run", deadlines)
    spec = CaseSpec("t::x", "pair_exchange", (devices[3], devices[1]), "nccl", visible=devices)
    result = runner.not_started(spec, Decision(Verdict.HANG, None, [], "not started"))
    written = casefiles.read_json(result.case_dir / casefiles.CASE_SPEC)
    assert written["process_group_timeout"] == case_timeout + GPU_STOP_LADDER.total + NCCL_WATCHDOG_MARGIN
    rank0, rank1 = written["rank_env"]
    assert rank0["CUDA_VISIBLE_DEVICES"] == rank1["CUDA_VISIBLE_DEVICES"] == ",".join(str(d.uuid) for d in devices)
    assert rank0["NCCL_DEBUG_FILE"] != rank1["NCCL_DEBUG_FILE"]  # each rank logs to its own folder
    assert [d["index"] for d in written["devices"]] == [3, 1]
    heartbeat = rank0.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
    if written["process_group_timeout"] < TORCH_HEARTBEAT_DEFAULT:
        assert heartbeat is None  # torch's default already acts after the suite
    else:
        assert float(heartbeat) > written["process_group_timeout"]
    runner.close()


def run_case(pytester: pytest.Pytester, run_suite, probe: str, *rules: str) -> dict:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe=probe))
    scenario = pytester.makefile(".toml", scen=scenario_text(*rules))
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, "--virtual-devices=2")
    result.assert_outcomes(failed=1)
    records = read_records(pytester.path / "reports")
    assert len(records) == 1, records
    return {"result": result, **records[0]}


@pytest.mark.parametrize("probe", ["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
def test_device_hang_is_placed_at_the_step_that_hung(pytester: pytest.Pytester, run_suite, probe: str) -> None:
    """The collective returns at once on rank 1; its kernel never ends: the hang is in that probe step."""
    record = run_case(pytester, run_suite, probe, 'effect = "device_hang"\nranks = [1]')
    step = f"{probe} 4B" if probe != "broadcast" else "broadcast from rank 0 4B"
    assert record["verdict"] == "hang", record["summary"]
    assert record["root_cause"]["rank"] == 1
    assert (record["root_cause"]["phase"], record["root_cause"]["step"]) == ("probe", step)
    rank1 = record["ranks"][1]
    # Rank 0 goes on to the next step and waits there: its op timeout (3 s) plus the grace (1 s) ends
    # when the step deadline (4 s) does, so either may stop rank 1 (seen both ways on a loaded machine).
    assert rank1["phase"] == "probe" and rank1["stopped_by"] in ("stalled", "grace"), rank1
    # its stack stops in the probe's step (the simulated kernel's wait is the harness's, left out)
    assert f" in {probe}\n" in (rank1["stack"] or ""), rank1["stack"]


def test_each_ranks_last_collectives_are_in_the_record(pytester: pytest.Pytester, run_suite) -> None:
    """Rank 1 hangs before the all-reduce: the watchdog's SIGUSR2 makes it dump; rank 0 shows the all-reduce."""
    record = run_case(pytester, run_suite, "all_reduce", 'effect = "hang"\nranks = [1]')
    rank0, rank1 = record["ranks"]
    assert record["root_cause"]["rank"] == 1
    last0 = rank0["collectives"]["last"][-1]
    # Ended by gloo's in-rank timeout, or still in flight when the watchdog's deadline came first on a busy machine.
    assert (last0["op"], last0["sizes"]) == ("gloo:all_reduce", [[1]])
    assert rank1["stopped_by"] is not None and rank1["collectives"] is not None, "the dump request went unanswered"
    assert "gloo:all_reduce" not in [e["op"] for e in rank1["collectives"]["last"]]
    record["result"].stdout.fnmatch_lines(["rank 0: last collective gloo:all_reduce #* [[][[]1[]][]] *"])


# A rank stopped while waiting in a collective, as torch's gloo recorder dumps it (seen in torch 2.13).
IN_FLIGHT_DUMP = {
    "entries": [
        {"record_id": 1, "profiling_name": "gloo:all_reduce", "collective_seq_id": 2, "state": "scheduled",
         "retired": False, "input_sizes": [[4]], "is_p2p": False},
        {"record_id": 0, "profiling_name": "gloo:all_reduce", "collective_seq_id": 1, "state": "scheduled",
         "retired": True, "input_sizes": [[4]], "is_p2p": False},
    ],
    "pg_status": {"0": {"last_completed_collective": "1", "last_enqueued_collective": "2"}},
}  # fmt: skip


def test_recorder_dump_read_back(tmp_path: Path) -> None:
    (tmp_path / casefiles.FLIGHT_RECORDER).write_text(json.dumps(IN_FLIGHT_DUMP))
    read = flight_recorder.last_collectives(tmp_path)
    assert read is not None and [e["seq"] for e in read["last"]] == [1, 2]
    assert (
        flight_recorder.describe(read) == "last collective gloo:all_reduce #2 [[4]] still in flight (state scheduled)"
    )
    assert read["groups"]["0"]["last_enqueued_collective"] == "2"
    assert flight_recorder.issued(read) == 2  # torch's record ids count the operations handed to the backend
    assert flight_recorder.issued({**read, "issued": -1}) is None and flight_recorder.issued(None) is None
    (tmp_path / casefiles.FLIGHT_RECORDER).write_text(json.dumps({"entries": []}))
    assert flight_recorder.issued(flight_recorder.last_collectives(tmp_path)) == 0
    (tmp_path / casefiles.FLIGHT_RECORDER).write_text(json.dumps({"error": "RuntimeError: no recorder"}))
    assert flight_recorder.issued(flight_recorder.last_collectives(tmp_path)) is None
    assert flight_recorder.describe(flight_recorder.last_collectives(tmp_path)).startswith(
        "flight-recorder dump failed"
    )
    assert flight_recorder.describe(flight_recorder.last_collectives(tmp_path / "none")) == "no flight-recorder dump"


def test_a_rank_that_fails_dumps_its_recorder_itself(pytester: pytest.Pytester, run_suite) -> None:
    record = run_case(pytester, run_suite, "all_reduce", 'effect = "error"\nranks = [0]\nphase = "verify"')
    rank0 = record["ranks"][0]
    assert rank0["status"] == "error" and rank0["stopped_by"] is None
    assert [e["op"] for e in rank0["collectives"]["last"]] == ["gloo:all_reduce"]
    dumped = json.loads(next(pytester.path.glob("reports/*/cases/*/rank0/flight_recorder.json")).read_text())
    assert dumped["entries"], "torch's own dump, kept beside the rank's logs"


def test_the_status_line_cuts_the_test_id_before_the_ranks_state() -> None:
    head, where = "conformance [12s, stopped in 48s]", "rank 0, 1 in probe (send/recv 4B)"
    nodeid = "suites/test_pairs.py::test_pair_exchange[gpu0-gpu3-SYS-inherited]"
    assert status_line(head, nodeid, where, 200) == f"{head} {nodeid}: {where}"
    line = status_line(head, nodeid, where, 79)  # an 80-column terminal
    assert line == f"{head} ...erited]: {where}" and len(line) == 79, line
    assert status_line(head, nodeid, where, 70) == f"{head} {where}"  # no room for the id
    assert status_line(head, nodeid, where, 40) == where  # nor for more than the state


@pytest.mark.parametrize("columns", [200, 80])
def test_a_waiting_case_shows_where_it_is_on_the_terminal(
    pytester: pytest.Pytester, tmp_path: Path, columns: int
) -> None:
    """On a terminal, one line rewritten in place while a case waits; pytest's own line put back after.

    On a narrow terminal the test id gives way: the ranks' state is what the line is for.
    """
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce").replace("test_case", LONG_NAME))
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "hang"\nranks = [1]'))
    command = [
        sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", f"--scenario={scenario}",
        "--step-timeout=6", "--op-timeout=5", "--init-timeout=5", "--grace=1", "--virtual-devices=2",
        f"--reports-dir={tmp_path / 'reports'}", "test_x.py",
    ]  # fmt: skip
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns)}  # the line is cut at the terminal's width
    with subprocess.Popen(
        command, cwd=pytester.path, stdin=follower, stdout=follower, stderr=follower, env=env
    ) as proc:
        os.close(follower)
        output = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed with the run
                break
            if not chunk:
                break
            output += chunk
        proc.wait(timeout=60)
    os.close(leader)
    text = output.decode(errors="replace")
    shown = re.findall(r"\rconformance \[(\d+)s, stopped in (\d+)s(?:; run [^\]]*)?\] (\S*): ([^\r]*)", text)
    assert shown, text
    for _, _, test_id, _ in shown:
        if columns == 200:
            assert test_id == f"test_x.py::{LONG_NAME}"
        else:  # the id's end, behind "...", in what the state leaves of 79 columns
            assert test_id.startswith("...") and f"test_x.py::{LONG_NAME}".endswith(test_id[3:]), test_id
    shown = [(elapsed, left, where) for elapsed, left, _, where in shown]
    assert all(int(elapsed) >= 3 for elapsed, _, _ in shown)  # a case shorter than 3 s never shows a line
    assert any(where.strip().endswith("in probe (all_reduce 4B)") for _, _, where in shown), shown
    assert re.search(r"\r +\rtest_x.py F", text), text  # pytest's line is back, then its verdict letter


LONG_NAME = "test_a_case_whose_name_alone_fills_half_of_an_eighty_column_terminal"


def test_the_status_line_estimates_the_run_s_time_left_from_its_pace_and_the_case_s_deadline() -> None:
    assert time_left_text(60.0, (20, 100), 12.0) == "; run ~4 min left, 20/100 tests"  # 80 x 3 s + 12 s
    assert time_left_text(30.0, (10, 12), 18.0) == "; run ~24s left, 10/12 tests"
    assert time_left_text(5.0, (0, 100), 30.0) == ""  # no pace yet: no guess
    assert time_left_text(5.0, None, 30.0) == ""
    coverage = Coverage()
    coverage.collected(["t[a-inherited]", "t[a-p2p_off]", "t[b-inherited]"], ["t[a-p2p_off]"])
    coverage.reported("t[a-inherited]")
    coverage.not_needed("t[a-p2p_off]")
    assert coverage.first_rung() == (1, 2)  # the fallback rung counts neither way


# -- hangs decided from progress ---------------------------------------------------------------

PROGRESS_TIMEOUTS = ("--step-timeout=6", "--op-timeout=5", "--init-timeout=5", "--grace=1")
LOOK_SLACK = 2.0  # the margin for load: the watchdog's next look at the ranks on a busy machine
BIG_CASE = """
from conformance.plan.matrix import DeviceSet

def test_case(conformance_case, conformance):
    conformance_case("{probe}", DeviceSet(conformance.topology.devices, "all"), sizes=[4, 64 << 20])
"""


def phase_lines(record: dict) -> dict[int, list[casefiles.PhaseLine]]:
    case_dir = Path(record["case_dir"])
    return {r["rank"]: casefiles.read_phases(casefiles.rank_dir(case_dir, r["rank"])) for r in record["ranks"]}


@pytest.mark.slow
@pytest.mark.parametrize("probe", ["all_reduce", "broadcast"])
def test_slow_but_progressing_eight_rank_case_is_not_a_hang(pytester: pytest.Pytester, run_suite, probe: str) -> None:
    """8 ranks, 64 MiB, each check slowed by 4 s (a loaded CPU): longer than the step deadline in all, never stalled."""
    pytester.makepyfile(test_x=BIG_CASE.format(probe=probe))
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "slow"\nphase = "verify"\nseconds = 4'))
    result = run_suite(f"--scenario={scenario}", *PROGRESS_TIMEOUTS, "--virtual-devices=8")
    (record,) = read_records(pytester.path / "reports")
    assert record["verdict"] == "pass", record["summary"]
    result.assert_outcomes(passed=1)
    assert record["stop_reason"] is None
    assert record["seconds"] > 6, record["seconds"]  # a whole-case deadline of 6 s would have called it a hang
    parts = [line.part for line in phase_lines(record)[0] if line.part]
    assert parts[:16] == [f"{i}/16" for i in range(1, 17)], parts  # 64 MiB in 4 MiB parts, each reported


@pytest.mark.slow
def test_stalled_step_is_a_hang_within_the_step_deadline(pytester: pytest.Pytester, run_suite) -> None:
    """Steps progress for longer than the step deadline, then rank 1 stops in teardown: a hang a step deadline later."""
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce").replace("sizes=[4]", "sizes=[4, 64, 1024]"))
    slow, hang = 'effect = "slow"\nphase = "verify"\nseconds = 3', 'effect = "hang"\nphase = "teardown"\nranks = [1]'
    scenario = pytester.makefile(".toml", scen=scenario_text(slow, hang))
    result = run_suite(f"--scenario={scenario}", *PROGRESS_TIMEOUTS, "--virtual-devices=2")
    result.assert_outcomes(failed=1)
    (record,) = read_records(pytester.path / "reports")
    assert (record["verdict"], record["stop_reason"]) == ("hang", "stalled"), record["summary"]
    assert (record["root_cause"]["rank"], record["root_cause"]["phase"]) == (1, "teardown")
    lines = phase_lines(record)
    started = min(line.t for ranks in lines.values() for line in ranks if line.t)
    last_progress = max(line.t for ranks in lines.values() for line in ranks if line.t)
    stopped = started + record["seconds"] - record["stop_seconds"]
    assert last_progress - started > 6, "the case progressed for longer than the step deadline before it stalled"
    assert 6 <= stopped - last_progress <= 6 + EVENT_WAIT + LOOK_SLACK, (started, last_progress, stopped)
    result.stdout.fnmatch_lines(["*stopped by the watchdog (stalled: no rank reported progress for the step*"])
