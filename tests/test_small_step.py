"""A hang called from evidence: every rank in the same small step for a few seconds, the machine not saturated.

The watchdog reads each rank's last phase line; a step that moves at most SMALL_STEP_BYTES on a group
already set up ends in milliseconds, so all ranks sitting in it for ``small_step_wait`` are stuck.
A saturated machine (Linux PSI, else the load) leaves the call to the step deadline.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.common.casefiles import PhaseLine
from conformance.common.deadlines import SMALL_STEP_BYTES, Deadlines
from conformance.common.verdicts import Verdict
from conformance.discover.topology import Device
from conformance.launch import watchdog
from conformance.launch.case import CaseRunner, CaseSpec
from conformance.launch.processes import StopReason
from conformance.launch.watchdog import SmallStep, machine_saturated
from conformance.record.records import CaseRecord, time_spent

pytestmark = pytest.mark.usefixtures("isolated_env")


def ranks_at(tmp_path: Path, *lines: PhaseLine) -> list[Any]:
    """One rank folder per line, its phase log ending there; the watchdog needs only each rank's path."""
    found = []
    for i, line in enumerate(lines):
        path = tmp_path / f"rank{i}"
        path.mkdir()
        (path / "phase.jsonl").write_text(json.dumps(line.to_json()) + "\n")
        found.append(SimpleNamespace(path=path))
    return found


def at(step: str, nbytes: int | None, ago: float, part: str = "", phase: str = "probe") -> tuple[Any, ...]:
    """A rank's last line, its time set when the test runs (``ago`` seconds before): (phase, step, ...)."""
    return (phase, step, ago, nbytes, part)


def line(spec: tuple[Any, ...]) -> PhaseLine:
    phase, step, ago, nbytes, part = spec
    return PhaseLine(phase, step, nbytes=nbytes, part=part, clock=time.monotonic() - ago)


def quiet() -> bool:
    return False


@pytest.mark.parametrize(
    ("lines", "stuck"),
    [
        ((at("send/recv 4B", 4, 6), at("send/recv 4B", 4, 9)), "send/recv 4B"),
        ((at("all_reduce 1MiB", SMALL_STEP_BYTES, 6),), "all_reduce 1MiB"),
        ((at("send/recv 4B", 4, 6), at("send/recv 4B", 4, 1)), ""),  # the last rank arrived 1 s ago
        ((at("send/recv 4B", 4, 6), at("all_reduce 4B", 4, 6)), ""),  # not the same step
        ((at("all_reduce 4MiB", 4 << 20, 60),), ""),  # not small
        ((at("all_reduce 4B", None, 60),), ""),  # a lazy NCCL communicator: the step holds an init
        ((at("all_reduce 4B", 4, 60, part="1/2"),), ""),  # a part of a long step
        ((at("init_process_group(gloo)", None, 60, phase="init"),), ""),
    ],
)
def test_stuck_only_when_every_rank_sits_in_the_same_small_step(
    tmp_path: Path, lines: tuple[tuple[Any, ...], ...], stuck: str
) -> None:
    assert SmallStep(5.0, quiet).stuck(ranks_at(tmp_path, *(line(spec) for spec in lines))) == stuck


def test_a_saturated_machine_leaves_it_to_the_step_deadline(tmp_path: Path) -> None:
    ranks = ranks_at(tmp_path, line(at("send/recv 4B", 4, 60)), line(at("send/recv 4B", 4, 60)))
    assert SmallStep(5.0, lambda: True).stuck(ranks) == ""


@pytest.mark.parametrize(("avg10", "saturated"), [("0.00", False), ("89.99", False), ("90.00", True), ("99.5", True)])
def test_saturation_is_read_from_cpu_pressure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, avg10: str, saturated: bool
) -> None:
    pressure = tmp_path / "cpu"
    pressure.write_text(
        f"some avg10={avg10} avg60=1.00 avg300=1.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    monkeypatch.setattr(watchdog, "PRESSURE", pressure)
    assert machine_saturated() is saturated


def test_without_pressure_the_load_per_cpu_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "PRESSURE", tmp_path / "no such file")
    monkeypatch.setattr(watchdog.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(watchdog.os, "getloadavg", lambda: (8.0, 1.0, 1.0))
    assert machine_saturated()
    monkeypatch.setattr(watchdog.os, "getloadavg", lambda: (7.9, 1.0, 1.0))
    assert not machine_saturated()


@pytest.mark.parametrize(("step_timeout", "wait"), [(30, 5.0), (4, 4.0)])
def test_small_step_wait_is_never_beyond_the_step_deadline(step_timeout: float, wait: float) -> None:
    assert Deadlines(1.0, 1.0, 600.0, 1.0, step_timeout=step_timeout).small_step_wait == wait


HANG = {"effect": "hang", "phase": "probe", "ranks": [1], "probes": ["pair_exchange"]}


@pytest.mark.parametrize(("avg10", "reason"), [("0.00", StopReason.SMALL_STEP), ("97.00", StopReason.STALLED)])
def test_a_pair_stuck_in_its_first_send_is_stopped_from_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, avg10: str, reason: StopReason
) -> None:
    """Real gloo ranks: rank 1 never enters the send/recv, rank 0 waits in it.

    On a quiet machine that is a hang after the small-step wait, well before a 20 s step deadline; on a
    saturated one, the step deadline calls it.
    """
    pressure = tmp_path / "cpu"
    pressure.write_text(f"some avg10={avg10} avg60=0.00 avg300=0.00 total=0\n")
    monkeypatch.setattr(watchdog, "PRESSURE", pressure)
    step = 20 if reason == StopReason.SMALL_STEP else 6
    deadlines = Deadlines(10, 10, 60, 1, "gloo", step_timeout=step)
    runner = CaseRunner(tmp_path / "run", deadlines, rules=[HANG], simulated=True)
    devices = (Device("cpu0", 0, "cpu"), Device("cpu1", 1, "cpu"))
    try:
        result = runner.run(CaseSpec("t::pair", "pair_exchange", devices, "gloo"))
    finally:
        runner.close()
    assert (result.verdict, result.stop_reason) == (Verdict.HANG, reason), result.decision.summary
    assert {r.step for r in result.reports} == {"send/recv 4B"}


def test_time_spent_counts_each_case_once_by_what_ended_it() -> None:
    records = [
        CaseRecord(nodeid="a", verdict=Verdict.PASS, seconds=1.0, case_dir="c1"),
        CaseRecord(nodeid="b", verdict=Verdict.PASS, seconds=1.0, case_dir="c1"),  # the same shared case
        CaseRecord(nodeid="c", verdict=Verdict.HANG, seconds=5.2, case_dir="c2", stop_reason="small_step"),
        CaseRecord(nodeid="d", verdict=Verdict.HANG, seconds=30.1, case_dir="c3", stop_reason="stalled"),
        CaseRecord(nodeid="e", verdict=Verdict.HANG, seconds=7.6, case_dir="c4", stop_reason="confirm"),
        CaseRecord(nodeid="host:x", verdict=Verdict.PASS, seconds=None),  # a host check: no case
    ]
    assert time_spent(records) == {
        "hang: deadline paid": {"cases": 1, "seconds": 30.1},
        "hang: stuck in a small step": {"cases": 1, "seconds": 5.2},
        "hang: stuck where its class hung": {"cases": 1, "seconds": 7.6},
        "pass": {"cases": 1, "seconds": 1.0},
    }


QUIET_MACHINE = """
from pathlib import Path
from conformance.launch import watchdog

def pytest_configure(config):
    quiet = Path(__file__).parent / "cpu-pressure"
    quiet.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\\n")
    watchdog.PRESSURE = quiet  # the watchdog runs in this process: a machine known not to be saturated
"""


@pytest.mark.slow
def test_a_hang_called_from_a_small_step_is_said_everywhere(
    pytester: pytest.Pytester, run_suite: Any, reports_dir: Path
) -> None:
    """The record, the summary, run.json, JUnit and the exit status all say hang, called from the small step."""
    from conftest import COLLECTIVE_TEST, read_records, scenario_text

    pytester.makeconftest(QUIET_MACHINE)
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "hang"\nphase = "probe"\nranks = [1]'))
    junit = pytester.path / "junit.xml"
    result = run_suite(f"--scenario={scenario}", "--virtual-devices=2", f"--junitxml={junit}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (record,) = read_records(reports_dir)
    assert (record["verdict"], record["stop_reason"]) == ("hang", "small_step"), record["summary"]
    assert {r["step"] for r in record["ranks"]} == {"all_reduce 4B"}
    facts = json.loads((reports_dir / "latest" / "run.json").read_text())
    assert (facts["step_deadline"], facts["small_step_wait"]) == (30.0, 5.0)
    assert facts["end"]["spent"]["hang: stuck in a small step"]["cases"] == 1
    assert '<failure message="HANG cpu0-cpu1' in junit.read_text()
    result.stdout.fnmatch_lines(
        [
            "*= conformance: the answer (SIMULATED) =*",
            "all sets: HANG on inherited (all_reduce 1/1)*",
        ],
        consecutive=True,  # the answer's first line
    )
    result.stdout.fnmatch_lines(
        [
            "*stopped by the watchdog (small_step, every rank stuck in the same small step)*",
            "deadlines paid: 0 (step deadline 30s); 1 hang(s) confirmed sooner: 1 stuck in a small step",
        ]
    )
