"""Every duration from the monotonic clock: a wall clock that steps changes no verdict.

chrony's ``makestep``, an NTP step or a VM resuming moves the wall clock by seconds or hours in one
go.  The suite decides hangs by "no progress for N seconds", so a duration read from the wall clock
turns a +40 s step into a hang that never happened, and a -3600 s step into an hour of patience.
Two proofs: a walk of every place the package reads the wall clock or a file's time (each one a
stamp for people, never subtracted), and whole runs whose processes see ``time.time()`` step +40 s
and -3600 s in turn, every half second, which must judge every case as a run without the steps does.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from conformance.common.deadlines import SMALL_STEP_WAIT
from conftest import REPO, read_records, scenario_text

PACKAGE = REPO / "conformance"
CLOCK_OWNER = PACKAGE / "common" / "clock.py"

# Reading the wall clock, or a file's times (which come from it): the places to walk.
WALL_READINGS = re.compile(
    r"time\.time\(|time\.time_ns\(|datetime\.(now|utcnow|today)\(|\.st_[mca]time|getmtime\(|getctime\(|getatime\("
)
# Each a reading that is no duration, with why; every other place reads the wall clock through ``clock.wall()``.
NOT_DURATIONS = {
    ("launch/processes.py", "return path.stat().st_mtime_ns"): "whether torch rewrote its dump: compared for equality",
}


def wall_readings() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CLOCK_OWNER:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if WALL_READINGS.search(line) and not line.lstrip().startswith("#"):
                found.append((str(path.relative_to(PACKAGE)), number, line.strip()))
    return found


def test_the_wall_clock_is_read_in_one_place_and_files_times_only_where_no_duration_comes_of_them() -> None:
    places = wall_readings()
    unexplained = [f"conformance/{path}:{number}: {line}" for path, number, line in places
                   if (path, line) not in NOT_DURATIONS]  # fmt: skip
    assert not unexplained, "read the wall clock through conformance.common.clock.wall(), durations with " + (
        "time.monotonic():\n" + "\n".join(unexplained)
    )
    assert {(path, line) for path, _, line in places} == set(NOT_DURATIONS)  # the list holds no stale place


def _calls_wall(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        isinstance(node.func, ast.Name)
        and node.func.id == "wall"
        or isinstance(node.func, ast.Attribute)
        and node.func.attr == "wall"
    )


def test_no_wall_reading_is_subtracted_or_compared() -> None:
    """``clock.wall()`` stamps records: an arithmetic or a comparison on it would be a duration from the wall."""
    misuse = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            operands = (
                [node.left, node.right] if isinstance(node, ast.BinOp)
                else [node.left, *node.comparators] if isinstance(node, ast.Compare)
                else []
            )  # fmt: skip
            if any(_calls_wall(operand) for operand in operands):
                misuse.append(f"conformance/{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not misuse


# The wall clock as chrony's makestep or a resumed VM moves it, in the run's pytest, its forkserver and every rank
# (inherited by fork): every half second of the host's monotonic clock it steps, by +3640 s, then by -3560 s, and
# so on: an hour back, 40 s further on each time.  So within a second of any reading the wall clock stands 40 s or
# more past it: a duration read from the wall clock anywhere a case waits would call a hang that never happened.
STEPPING_WALL_CLOCK = """
import time

_wall = time.time


def _stepping():
    steps = int(time.monotonic() * 2)
    return _wall() + 40.0 * steps - (3600.0 if steps % 2 else 0.0)


time.time = _stepping
"""

CASES = """
from conformance.plan.matrix import DeviceSet


def test_slow_but_well(conformance_case, conformance):
    conformance_case("all_reduce", DeviceSet(conformance.topology.devices, "all"), sizes=[4])


def test_stuck_in_a_small_step(conformance_case, conformance):
    conformance_case("broadcast", DeviceSet(conformance.topology.devices, "all"), sizes=[4])


def test_one_rank_fails(conformance_case, conformance):
    conformance_case("all_gather", DeviceSet(conformance.topology.devices, "all"), sizes=[4])
"""

RULES = (
    'effect = "slow"\nprobes = ["all_reduce"]\nseconds = 3',  # no progress for 3 s, well inside the step deadline
    'effect = "hang"\nprobes = ["broadcast"]',  # every rank stuck in a 4-byte step: called after the small-step wait
    'effect = "error"\nprobes = ["all_gather"]\nranks = [1]\nmessage = "simulated failure of rank 1"',
)
TIMEOUTS = ("--step-timeout=6", "--op-timeout=5", "--init-timeout=5", "--grace=1", "--virtual-devices=2")
# How the watchdog may stop the stuck case: after the small-step wait, or at the step deadline where the
# machine is saturated (a loaded CI machine); a step of the wall clock must bring neither sooner.
HANG_CALLS = {"small_step", "stalled"}


def judged(reports_dir: Path) -> dict[str, tuple[object, ...]]:
    """What decides each case: its verdict, its root-cause rank, and whether the watchdog called a hang."""
    return {
        r["nodeid"]: (r["verdict"], (r["root_cause"] or {}).get("rank"), r["stop_reason"] in HANG_CALLS)
        for r in read_records(reports_dir)
    }


@pytest.mark.slow
def test_a_wall_clock_stepping_by_plus_40s_and_minus_an_hour_changes_no_verdict(
    pytester: pytest.Pytester, run_suite, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_x=CASES)
    scenario = pytester.makefile(".toml", scen=scenario_text(*RULES))
    steady = run_suite(f"--scenario={scenario}", *TIMEOUTS, "--reports-dir=steady")
    (pytester.path / "stepping").mkdir()
    (pytester.path / "stepping" / "sitecustomize.py").write_text(STEPPING_WALL_CLOCK)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(pytester.path / "stepping"), os.environ.get("PYTHONPATH")]))
    )
    stepping = run_suite(f"--scenario={scenario}", *TIMEOUTS, "--reports-dir=stepping")
    expected = {
        "test_x.py::test_slow_but_well": ("pass", None, False),
        "test_x.py::test_stuck_in_a_small_step": ("hang", None, True),
        "test_x.py::test_one_rank_fails": ("error", 1, False),
    }
    assert judged(pytester.path / "steady") == expected, steady.stdout.str()
    assert judged(pytester.path / "stepping") == expected, stepping.stdout.str()
    stuck = next(r for r in read_records(pytester.path / "stepping") if r["verdict"] == "hang")
    assert stuck["seconds"] >= SMALL_STEP_WAIT  # called once its evidence had stood for the whole wait, no sooner
    assert stepping.ret == steady.ret == pytest.ExitCode.TESTS_FAILED
    answer = [line for line in stepping.outlines if "conformance: the answer" in line]
    assert (
        answer
        and stepping.outlines[stepping.outlines.index(answer[0]) :]
        == steady.outlines[
            steady.outlines.index([line for line in steady.outlines if "conformance: the answer" in line][0]) :
        ]
    )


def _node_log(rank: int, host: str, pid: int, second: float, error: str) -> str:
    stamp = f"[E1128 12:00:{second:09.6f} {pid} train.py:10]"
    return "".join(
        f"[rank{rank}]:{line}\n"
        for line in (
            f"{host}:{pid}:{pid} [{rank}] NCCL INFO comm 0x1 rank {rank} nranks 2 cudaDev {rank} busId 1000 - "
            "Init COMPLETE",
            "Traceback (most recent call last):",
            '  File "train.py", line 10, in <module>',
            f"{stamp} failure",
            error,
        )
    )


def _diagnosed(folder: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    from conformance.cli.main import main

    capsys.readouterr()
    assert main(["diagnose", "--json", str(folder)]) == 1  # a failure found
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("skew", [-10.0, 10.0])
def test_diagnose_never_orders_failures_on_two_hosts_by_their_clocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], skew: float
) -> None:
    """Two hosts' logs: whichever host's clock runs behind, no rank is named first; on one host, times order."""
    (tmp_path / "node-a.log").write_text(_node_log(0, "gpu-a", 4242, 20.0, "ValueError: bad batch shape"))
    (tmp_path / "node-b.log").write_text(_node_log(1, "gpu-b", 5151, 20.0 + skew, "KeyError: 'missing_layer'"))
    apart = _diagnosed(tmp_path, capsys)
    assert (apart["class"], apart["root_ranks"]) == ("rank_error", [])
    assert any("failed on different hosts (gpu-a, gpu-b)" in note for note in apart["notes"])
    (tmp_path / "node-b.log").write_text(_node_log(1, "gpu-a", 5151, 20.0 + skew, "KeyError: 'missing_layer'"))
    one_host = _diagnosed(tmp_path, capsys)  # one host, one clock: the earlier failure is the root
    assert one_host["root_ranks"] == ([1] if skew < 0 else [0])
