"""No process outlives the run, whatever ends it; records survive a kill; xdist changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import psutil
import pytest

from conformance.common.lifetime import process_gone
from conftest import (
    COLLECTIVE_TEST,
    read_records,
    scenario_text,
    tagged_processes,
    wait_until_gone,
    wait_while_running,
)

TIMEOUTS = ("--step-timeout=4", "--op-timeout=3", "--init-timeout=3", "--grace=1")
TWO_RANKS = "--virtual-devices=2"
# No process of a run is alive this long after any kill of any of them (PR_SET_PDEATHSIG all the way down).
KILL_AFTERMATH_SECONDS = 3.0

KILL_SUITE = """
from conformance.plan.matrix import DeviceSet

def _all(conformance):
    return DeviceSet(conformance.topology.devices, "all")

def test_1_all_reduce(conformance_case, conformance):
    conformance_case("all_reduce", _all(conformance), sizes=[4])

def test_2_broadcast(conformance_case, conformance):
    conformance_case("broadcast", _all(conformance), sizes=[4])

def test_3_all_gather(conformance_case, conformance):
    conformance_case("all_gather", _all(conformance), sizes=[4])

def test_4_barrier_hangs(conformance_case, conformance):
    conformance_case("barrier", _all(conformance))
"""


@contextmanager
def reaped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Whatever happens in the block, the run is killed and reaped if it is still going at its end."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def children(pid: int) -> set[int]:
    """Live child processes of ``pid``."""
    return {child.pid for child in psutil.Process(pid).children() if not process_gone(child.pid)}


def raw_lines(reports_dir: Path) -> list[str]:
    path = reports_dir / "latest" / "results.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def start_barrier_hang_run(
    pytester: pytest.Pytester, reports_dir: Path, *options: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start pytest on ``test_k.py`` with its barrier hanging until killed; returns it and its output file."""
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "hang"\nprobes = ["barrier"]'))
    output = pytester.path / "pytest-output.txt"
    with output.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
                f"--reports-dir={reports_dir}", f"--scenario={scenario}", TWO_RANKS, *options,
                "--step-timeout=60", "--op-timeout=50", "--init-timeout=50", "--grace=1", "test_k.py",
            ],
            cwd=pytester.path, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    return proc, output


def test_pytest_killed_mid_case_leaves_nothing(pytester: pytest.Pytester, reports_dir: Path, run_tag: str) -> None:
    pytester.makepyfile(test_k=KILL_SUITE)
    proc, output = start_barrier_hang_run(pytester, reports_dir)
    try:
        hang_dir = reports_dir / "latest" / "cases" / "test_k.py--test_4_barrier_hangs"

        def hanging() -> bool:
            phases = [(hang_dir / f"rank{r}" / "phase.jsonl") for r in range(2)]
            in_probe = all(p.exists() and '"phase": "probe"' in p.read_text() for p in phases)
            return len(raw_lines(reports_dir)) == 3 and in_probe

        wait_while_running(proc, output, hanging, "the hanging case never started")

        # the pytest process, its forkserver and the two ranks of the hanging case
        servers = children(proc.pid)
        ranks = set().union(*(children(s) for s in servers))
        assert len(servers) == 1 and len(ranks) == 2, (servers, ranks)
        assert set(tagged_processes(run_tag)) == {proc.pid, *servers, *ranks}

        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_until_gone(run_tag, KILL_AFTERMATH_SECONDS) == []

    lines = raw_lines(reports_dir)
    assert len(lines) == 3, lines
    assert (reports_dir / "latest" / "results.jsonl").read_text().endswith("\n")
    records = [json.loads(line) for line in lines]
    assert [(r["nodeid"], r["verdict"]) for r in records] == [
        ("test_k.py::test_1_all_reduce", "pass"),
        ("test_k.py::test_2_broadcast", "pass"),
        ("test_k.py::test_3_all_gather", "pass"),
    ]
    assert len({r["run_id"] for r in records}) == 1
    # a killed run never wrote its end: it is incomplete, and no environment is recommended from it
    assert json.loads((reports_dir / "latest" / "run.json").read_text())["end"]["state"] == "started"
    recommended = subprocess.run(
        [sys.executable, "-m", "conformance", "recommend", "--reports-dir", str(reports_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "no recommendation: the run is incomplete (it never reached its end: killed" in recommended.stdout


def test_killed_xdist_controller_leaves_nothing(pytester: pytest.Pytester, reports_dir: Path, run_tag: str) -> None:
    """SIGKILL the controller while a worker's case hangs: every process of the run is gone within the bound.

    The workers, their forkservers and the ranks.
    """
    pytester.makepyfile(test_k=KILL_SUITE.replace("test_4_barrier_hangs", "test_0_barrier_hangs"))
    proc, output = start_barrier_hang_run(pytester, reports_dir, "-n", "2", "--dist", "load")
    try:
        hang_dir = reports_dir / "latest" / "cases" / "test_k.py--test_0_barrier_hangs"

        def hanging() -> bool:
            return hang_dir.exists() and len(case_rank_pids(hang_dir.resolve())) == 2

        wait_while_running(proc, output, hanging, "the hanging case never started", 120)
        workers = children(proc.pid)
        assert len(workers) == 2, workers
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_until_gone(run_tag, KILL_AFTERMATH_SECONDS) == [], output.read_text()


def test_forkserver_killed_mid_case_is_the_suites_own_verdict(
    pytester: pytest.Pytester, reports_dir: Path, run_tag: str
) -> None:
    """-n 2: a worker's forkserver is SIGKILLed while its case hangs.

    That case ends INCONCLUSIVE saying the forkserver went, within its bounds (never pytest-timeout,
    never "worker crashed"); the worker's later cases run on a new forkserver; the answer, run.json,
    JUnit and the exit status all say the run failed.
    """
    pytester.makepyfile(test_k=KILL_SUITE.replace("test_4_barrier_hangs", "test_0_barrier_hangs"))
    junit = pytester.path / "junit.xml"
    proc, output = start_barrier_hang_run(pytester, reports_dir, "-n", "2", "--dist", "load", f"--junitxml={junit}")
    with reaped(proc):
        hang_dir = reports_dir / "latest" / "cases" / "test_k.py--test_0_barrier_hangs"

        def hanging() -> bool:
            return hang_dir.exists() and len(case_rank_pids(hang_dir.resolve())) == 2

        wait_while_running(proc, output, hanging, "the hanging case never started", 120)
        (server,) = {parent_of(pid) for pid in case_rank_pids(hang_dir.resolve())}
        os.kill(server, signal.SIGKILL)
        code = proc.wait(timeout=300)  # a hang guard only: the case ends as soon as its server is gone
    text = output.read_text()
    assert code == 1, text
    assert "crashed" not in text and "node down" not in text and "Timeout" not in text, text
    verdicts = {r["nodeid"].split("::")[1]: (r["verdict"], r["summary"]) for r in read_records(reports_dir)}
    verdict, summary = verdicts.pop("test_0_barrier_hangs")
    assert verdict == "inconclusive" and summary.startswith("not judged: the forkserver exited"), summary
    assert set(verdicts.values()) == {("pass", "")}, verdicts
    assert "INCONCLUSIVE" in text.split("conformance: the answer")[1], text
    run = json.loads((reports_dir / "latest" / "run.json").read_text())
    assert run["end"]["state"] == "complete", run["end"]
    failures = [f.get("message", "") for f in ElementTree.parse(junit).iter("failure")]
    assert any("INCONCLUSIVE" in message and "forkserver" in message for message in failures), failures
    assert wait_until_gone(run_tag, KILL_AFTERMATH_SECONDS) == [], text


@pytest.mark.parametrize(
    ("rule", "verdict", "exit_label"),
    [
        ('effect = "crash"\nranks = [1]\nsignal = "SIGSEGV"', "crash", "SIGSEGV"),
        ('effect = "hang"\nranks = [1]\nignore_sigterm = true', "hang", "SIGKILL"),
    ],
    ids=["crash", "hang"],
)
def test_nothing_left_after_crash_or_hang(
    pytester: pytest.Pytester, run_suite, reports_dir: Path, run_tag: str, rule: str, verdict: str, exit_label: str
) -> None:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    scenario = pytester.makefile(".toml", scen=scenario_text(rule))
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, TWO_RANKS)
    result.assert_outcomes(failed=1)
    (record,) = read_records(reports_dir)
    assert record["verdict"] == verdict
    assert record["root_cause"]["rank"] == 1
    assert record["ranks"][1]["exit"] == exit_label
    assert wait_until_gone(run_tag) == []


MIXED_SUITE = """
import pytest
from conformance.plan.matrix import DeviceSet

PROBES = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "environment"]

@pytest.mark.parametrize("probe", PROBES)
def test_probe(conformance_case, conformance, probe):
    conformance_case(probe, DeviceSet(conformance.topology.devices, "all"), sizes=[4])
"""
MIXED_RULES = (
    'effect = "wrong_data"\nranks = [0]\nprobes = ["broadcast"]',
    'effect = "error"\nranks = [1]\nprobes = ["all_gather"]\nmessage = "simulated all_gather failure"',
    'effect = "hang"\nranks = [1]\nprobes = ["barrier"]',
)
MIXED_VERDICTS = {
    "test_mix.py::test_probe[all_reduce]": "pass",
    "test_mix.py::test_probe[broadcast]": "fail",
    "test_mix.py::test_probe[all_gather]": "error",
    "test_mix.py::test_probe[reduce_scatter]": "pass",
    "test_mix.py::test_probe[barrier]": "hang",
    "test_mix.py::test_probe[environment]": "pass",
}


def whole_records(reports_dir: Path) -> list[dict[str, Any]]:
    """Every line of the latest run's results.jsonl, each of which must be one JSON object."""
    lines = raw_lines(reports_dir)
    records = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) and r["schema"] == 1 for r in records)
    return records


def header_run_id(result: pytest.RunResult) -> str:
    lines = [line for line in result.outlines if line.startswith("conformance: run ")]
    assert len(lines) == 1, result.stdout.str()
    return lines[0].split()[2].rstrip(",")


@pytest.mark.slow
def test_xdist_gives_the_same_verdicts(pytester: pytest.Pytester, run_suite, reports_dir: Path, run_tag: str) -> None:
    pytester.makepyfile(test_mix=MIXED_SUITE)
    scenario = pytester.makefile(".toml", scen=scenario_text(*MIXED_RULES))
    options = (f"--scenario={scenario}", *TIMEOUTS, TWO_RANKS)

    serial = run_suite(*options)
    serial.assert_outcomes(passed=3, failed=3)
    serial_records = whole_records(reports_dir)
    serial_id = header_run_id(serial)
    assert wait_until_gone(run_tag) == []

    parallel = run_suite(*options, "-n", "2")
    parallel.assert_outcomes(passed=3, failed=3)
    parallel_records = whole_records(reports_dir)
    parallel_id = header_run_id(parallel)
    assert wait_until_gone(run_tag) == []

    for records in (serial_records, parallel_records):
        assert len(records) == len(MIXED_VERDICTS)
        assert {r["nodeid"]: r["verdict"] for r in records} == MIXED_VERDICTS
        assert all(r["simulated"] is True for r in records)
    assert serial_id != parallel_id
    assert {r["run_id"] for r in serial_records} == {serial_id}
    # the workers share the controller's run id, its run folder and its results file
    assert {r["run_id"] for r in parallel_records} == {parallel_id}
    assert {Path(r["case_dir"]).parent.parent.name for r in parallel_records} == {parallel_id}
    assert (reports_dir / "latest").resolve().name == parallel_id
    # both workers really ran cases: one forkserver each
    assert len(list((reports_dir / parallel_id / "forkserver").glob("*.log"))) == 2
    assert len(list((reports_dir / serial_id / "forkserver").glob("*.log"))) == 1
    # the controller's summary covers every case the workers ran
    # columns: the verdicts some case had (hang fail error pass)
    parallel.stdout.re_match_lines([r"probe +hang +fail +error +pass$", r"total \(cases \+ host checks\) +1 +1 +1 +3$"])


# Three GPUs, every pair across the sockets: gpu0-gpu1 leads the class, the other two follow it.
SYS_BOX = {
    "kind": "gpu", "source": "file", "driver": "550.54.15", "cuda_driver": "12.4", "cpu": "amd",
    "devices": [{"name": f"gpu{i}", "index": i, "kind": "gpu", "uuid": f"GPU-{i:08d}-0000-0000-0000-00000000000{i}",
                 "nvml_index": i} for i in range(3)],
    "links": {"gpu0-gpu1": "SYS", "gpu0-gpu2": "SYS", "gpu1-gpu2": "SYS"},
}  # fmt: skip
PAIR_SUITE = """
def test_pair(conformance_case, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=[4])
"""
# The leader's cases on one worker, the followers' on the other (xdist --dist loadgroup).
GROUPS_CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        group = "leader" if "gpu0-gpu1" in item.name else "followers"
        item.add_marker(pytest.mark.xdist_group(group))
"""
# Cross-socket P2P hangs (a pair on AMD CPUs uses P2P over SYS); cuMem off, the first rung such a pair
# tries, fixes it here.
P2P_HANG = 'effect = "hang"\nprobes = ["pair_exchange"]\np2p = true\nunless_env = { NCCL_CUMEM_ENABLE = "0" }'


def case_rank_pids(case_dir: Path) -> set[int]:
    """Live processes holding a file of ``case_dir`` open: that case's ranks."""
    found = set()
    for process in psutil.process_iter():
        try:
            if any(f.path.startswith(str(case_dir)) for f in process.open_files()):
                found.add(process.pid)
        except psutil.Error:  # gone meanwhile, or another user's
            continue
    return found


def parent_of(pid: int) -> int:
    return int(psutil.Process(pid).ppid())


@pytest.mark.slow
def test_killed_worker_harms_no_other(pytester: pytest.Pytester, reports_dir: Path, run_tag: str) -> None:
    """-n 2: the leader's worker is killed mid-case; no other worker is harmed.

    The cases waiting for the dead worker's ladder decisions give up at once, once per missing rung
    for the whole run, and decide for themselves; pytest-timeout fires nowhere.
    """
    pytester.makepyfile(test_p=PAIR_SUITE)
    pytester.makeconftest(GROUPS_CONFTEST)
    topology = pytester.path / "sys3.json"
    topology.write_text(json.dumps(SYS_BOX))
    scenario = pytester.makefile(".toml", scen=scenario_text(P2P_HANG))
    output = pytester.path / "pytest-output.txt"
    command = [
        sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", "-rA",
        f"--reports-dir={reports_dir}", f"--scenario={scenario}", f"--topology-file={topology}",
        "--step-timeout=3", "--case-timeout=10", "--op-timeout=2", "--init-timeout=2", "--grace=1",
        "-n", "2", "--dist", "loadgroup", "test_p.py",
    ]  # fmt: skip
    begun = time.monotonic()
    with output.open("w") as out:
        proc = subprocess.Popen(command, cwd=pytester.path, stdout=out, stderr=subprocess.STDOUT)
    try:
        leader_case = None
        while leader_case is None and time.monotonic() - begun < 120:
            found = sorted((reports_dir / "latest" / "cases").glob("*gpu0-gpu1-SYS-inherited*")) if (
                reports_dir / "latest").exists() else []  # fmt: skip
            ranks = case_rank_pids(found[0].resolve()) if found else set()
            leader_case = found[0] if ranks else None
            time.sleep(0.2)
        assert leader_case is not None, output.read_text()
        worker = parent_of(parent_of(min(ranks)))  # rank -> forkserver -> xdist worker
        os.kill(worker, signal.SIGKILL)
        code = proc.wait(timeout=600)  # a hang guard only: the run's own bounds end it well before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = output.read_text()
    assert code == 1, text
    assert text.count("node down") == 1, text  # no other worker went down
    crashed = [line for line in text.splitlines() if "crashed while running" in line]
    assert crashed and all("gpu0-gpu1-SYS-inherited" in line for line in crashed), crashed  # only the killed case
    assert "Timeout" not in text, text  # pytest-timeout fired nowhere
    records = [r for r in read_records(reports_dir) if "gpu0-gpu1" not in r["nodeid"]]
    ran = sorted((r["nodeid"].split("[")[1].split("-SYS")[0], r["env_name"], r["verdict"]) for r in records)
    assert ran == [
        ("gpu0-gpu2", "cumem_off", "pass"), ("gpu0-gpu2", "inherited", "hang"),
        ("gpu1-gpu2", "cumem_off", "pass"), ("gpu1-gpu2", "inherited", "hang"),
    ], text  # fmt: skip
    decisions = [json.loads(line) for line in (reports_dir / "latest" / "ladder.jsonl").read_text().splitlines()]
    assert all(d["outcome"] in ("pass", "hang", "skipped") for d in decisions if d["key"] == "test_pair[gpu0-gpu2-SYS]")
    # the leader's inherited rung, killed with its worker, was given up on once by one waiting case
    given_up = [d for d in decisions if d["outcome"] == "undecided" and d["key"] == "test_pair[gpu0-gpu1-SYS]"]
    assert [d["rung"] for d in given_up].count("inherited") == 1, decisions
    # at once, not at the end of a decision wait: its claim names the dead worker, and once a worker of
    # the run has died, a rung nobody has started is not waited for (xdist moves its items out of order)
    assert given_up[0]["reason"].startswith("its worker (pid ") and given_up[0]["reason"].endswith(") died running it")
    assert not [d for d in decisions if d["reason"].startswith("not decided within")], decisions
