"""A run that did not finish its plan says so everywhere; every run gets a folder of its own."""

from __future__ import annotations

import json
import multiprocessing
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest.mock import ANY

import pytest

from conformance.harness.side_by_side import Pending, case_call
from conformance.record.coverage import Coverage
from conformance.record.records import RunEnd, RunFacts
from conformance.record.results import claim_run_folder
from conftest import scenario_text, wait_while_running

SUITE = """
from conformance.plan.matrix import DeviceSet

def _all(conformance):
    return DeviceSet(conformance.topology.devices, "all")

def test_1_all_reduce(conformance_case, conformance):
    conformance_case("all_reduce", _all(conformance), sizes=[4])

def test_2_barrier(conformance_case, conformance):
    conformance_case("barrier", _all(conformance))

def test_3_broadcast(conformance_case, conformance):
    conformance_case("broadcast", _all(conformance), sizes=[4])
"""
BARRIER_HANGS = scenario_text('effect = "hang"\nprobes = ["barrier"]')
NONE = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected"), 0)
OPTIONS = ("--virtual-devices=2", "--step-timeout=60", "--op-timeout=50", "--init-timeout=50", "--grace=1")


def run_json(reports_dir: Path, run: str = "latest") -> dict:
    return json.loads((reports_dir / run / "run.json").read_text())


def conformance_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True, text=True, timeout=60)


def interrupt_when_hanging(pytester: pytest.Pytester, reports_dir: Path, scenario: Path, earlier: str) -> str:
    """Run the suite; Ctrl-C (SIGINT) once the barrier hangs in both ranks. Returns pytest's output.

    ``earlier``: the run that ``latest`` points at before this one starts.
    """
    command = [
        sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
        f"--reports-dir={reports_dir}", f"--scenario={scenario}", *OPTIONS, "test_s.py",
    ]  # fmt: skip
    output = pytester.path / "interrupted.txt"
    with output.open("w") as out:
        proc = subprocess.Popen(command, cwd=pytester.path, stdout=out, stderr=subprocess.STDOUT)
    try:
        hang_dir = reports_dir / "latest" / "cases" / "test_s.py--test_2_barrier"

        def hanging() -> bool:
            phases = [hang_dir / f"rank{r}" / "phase.jsonl" for r in range(2)]
            this_run = (reports_dir / "latest").resolve().name != earlier
            return this_run and all(p.exists() and '"phase": "probe"' in p.read_text() for p in phases)

        wait_while_running(proc, output, hanging, "the hanging case never started")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == pytest.ExitCode.INTERRUPTED, output.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return output.read_text()


def cases_by_outcome(end: dict) -> dict[str, int]:
    """run.json's end.spent as cases by what ended them (its seconds are the machine's)."""
    return {outcome: spent["cases"] for outcome, spent in end["spent"].items()}


@pytest.mark.slow
def test_an_interrupted_run_says_incomplete_everywhere(
    pytester: pytest.Pytester, run_suite, reports_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_s=SUITE)
    complete = run_suite(*OPTIONS)
    assert complete.ret == pytest.ExitCode.OK, complete.stdout.str()
    baseline = (reports_dir / "latest").resolve().name
    assert cases_by_outcome(run_json(reports_dir)["end"]) == {"pass": 3}
    assert run_json(reports_dir)["end"] == {
        "spent": ANY,
        "state": "complete",
        "planned": 3,
        "ran": 3,
        "stopped_by": None,
        "harness_errors": [],
        "failed_nodes": [],
        "store_problems": [],
        "fallback": 0,
        "fallback_ran": 0,
        "not_needed": 0,
        "tests": {**NONE, "passed": 3},
    }
    complete.stdout.fnmatch_lines(["=* 3 passed in *", "tests: pytest's 3 = 3 cases", "=* conformance: the answer *"])

    scenario = pytester.makefile(".toml", scen=BARRIER_HANGS)
    text = interrupt_when_hanging(pytester, reports_dir, scenario, baseline)
    end = run_json(reports_dir)["end"]
    assert end["state"] == "incomplete" and end["stopped_by"] == "interrupted", end
    assert end["planned"] == 3 and end["ran"] == 1, end  # the interrupted test is not counted as run
    assert "conformance: INCOMPLETE RUN (interrupted: " in text, text
    assert "no recommendation: the run is incomplete (interrupted: " in text, text
    env = (reports_dir / "latest" / "recommended.env").read_text()
    assert "# no recommendation: the run is incomplete (interrupted: " in env, env
    assert not [line for line in env.splitlines() if line and not line.startswith("#")], env  # no VAR=VALUE

    monkeypatch.chdir(pytester.path)
    recommended = conformance_command("recommend", "--reports-dir", str(reports_dir))
    assert "no recommendation: the run is incomplete" in recommended.stdout, recommended
    assert recommended.returncode == 1, recommended
    compared = conformance_command("compare", "--reports-dir", str(reports_dir), baseline, "latest")
    assert compared.returncode == 1, compared
    assert compared.stdout.splitlines()[-1].startswith("INCOMPLETE: the current run is incomplete (interrupted: ")
    as_json = conformance_command("compare", "--json", "--reports-dir", str(reports_dir), baseline, "latest")
    assert json.loads(as_json.stdout)["incomplete"].startswith("interrupted: "), as_json
    # the other way round, the complete run is judged, with a warning about the incomplete baseline
    reverse = conformance_command("compare", "--reports-dir", str(reports_dir), "latest", baseline)
    assert reverse.stdout.splitlines()[-1].startswith("no regressions"), reverse
    assert "compare: warning: the baseline run is incomplete (interrupted: " in reverse.stderr, reverse
    reported = conformance_command("report", "--reports-dir", str(reports_dir))
    html = Path(reported.stdout.strip()).read_text()
    assert "<strong>INCOMPLETE RUN</strong>: interrupted: " in html and "(INCOMPLETE)</title>" in html


def test_a_run_stopped_by_maxfail_is_incomplete(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    pytester.makepyfile(test_s=SUITE)
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "error"\nprobes = ["all_reduce"]'))
    result = run_suite(*OPTIONS, f"--scenario={scenario}", "-x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    end = run_json(reports_dir)["end"]
    assert cases_by_outcome(end) == {"error": 1}
    assert end == {
        "spent": ANY,
        "state": "incomplete",
        "planned": 3,
        "ran": 1,
        "stopped_by": end["stopped_by"],
        "harness_errors": [],
        "failed_nodes": [],
        "store_problems": [],
        "fallback": 0,
        "fallback_ran": 0,
        "not_needed": 0,
        "tests": {**NONE, "failed": 1},  # pytest's own counts, as its last line gives them
    }, end
    assert end["stopped_by"].startswith("stopped early ("), end
    result.stdout.fnmatch_lines(["conformance: INCOMPLETE RUN (stopped early (*): 1 of 3 tests ran)*"])


def test_a_deselected_test_is_not_missing(pytester: pytest.Pytester, run_suite, reports_dir: Path) -> None:
    """The plan is what was collected to run: -k narrows it, and the run is still complete."""
    pytester.makepyfile(test_s=SUITE)
    result = run_suite(*OPTIONS, "-k", "not barrier", "-n", "2")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert cases_by_outcome(run_json(reports_dir)["end"]) == {"pass": 2}
    assert run_json(reports_dir)["end"] == {
        "spent": ANY,
        "state": "complete",
        "planned": 2,
        "ran": 2,
        "stopped_by": None,
        "harness_errors": [],
        "failed_nodes": [],
        "store_problems": [],
        "fallback": 0,
        "fallback_ran": 0,
        "not_needed": 0,
        "tests": {**NONE, "passed": 2},  # as pytest's last line: xdist's workers deselect, its controller counts none
    }
    assert "INCOMPLETE" not in result.stdout.str()


@pytest.mark.parametrize(
    ("end", "says"),
    [
        (RunEnd(), "it never reached its end: killed, or still running"),
        (RunEnd("incomplete", 753, 22, "interrupted"), "interrupted: 22 of 753 tests ran"),
        (RunEnd("complete", 3, 3), None),
        (None, None),  # an older run.json: not known, counted as finished
    ],
)
def test_what_an_end_says(end: RunEnd | None, says: str | None) -> None:
    facts = RunFacts.from_json(RunFacts(run_id="r", end=end).to_json())
    assert facts.end == end
    assert facts.incomplete == says


def test_coverage_counts_what_got_an_outcome() -> None:
    coverage = Coverage()
    coverage.collected(["a", "b", "c"], [])
    coverage.collected(["a", "b", "c", "d", "e"], [])  # a second xdist worker's collection: the first one counts
    for nodeid in ("a", "a", "b"):
        coverage.reported(nodeid)
    counted = {"fallback": 0, "fallback_ran": 0, "not_needed": 0}
    assert coverage.end(1, False) == RunEnd("incomplete", 3, 2, "ended with tests not run", **counted)
    assert coverage.end(2, False).stopped_by == "interrupted"
    assert coverage.end(1, "stopping after 1 failures").stopped_by == "stopped early (stopping after 1 failures)"
    coverage.reported("c")
    assert coverage.end(2, False) == RunEnd("complete", 3, 3, **counted)  # Ctrl-C after the last test: all ran


def test_an_interrupted_adaptive_run_counts_the_tests_that_would_run() -> None:
    """Fallback rungs run only for a class that failed: "49 of 601 tests ran" said 601 where 115 would."""
    coverage = Coverage()
    first = [f"t[gpu{i}-inherited]" for i in range(115)]
    fallback = [f"t[gpu{i}-{rung}]" for i in range(115) for rung in ("p2p_off", "shm_off", "ib_off", "nvls_off")]
    coverage.collected(first + fallback, fallback)
    for nodeid in first[:40] + fallback[:3]:
        coverage.reported(nodeid)
    for nodeid in fallback[3:9]:
        coverage.not_needed(nodeid)  # deselected as the run goes: covered, never run
    end = coverage.end(2, False, {"passed": 43, "deselected": 6})
    assert (end.planned, end.ran, end.fallback, end.fallback_ran, end.not_needed) == (575, 43, 460, 3, 6)
    assert end.incomplete == (
        "interrupted: 40 of the 115 tests on the machine as it is ran, and 3 of the 460 on fallback rungs "
        "(those run only for a class that failed the rung before)"
    )
    assert RunFacts.from_json(RunFacts(run_id="r", end=end).to_json()).end == end


def test_a_taken_run_id_gets_another_folder(tmp_path: Path) -> None:
    taken = tmp_path / "20261124-101010-abcd"
    taken.mkdir(parents=True)
    (taken / "ladder.jsonl").write_text("theirs\n")
    claimed = claim_run_folder(tmp_path, taken.name)
    assert claimed != taken.name and (tmp_path / claimed).is_dir()
    assert (taken / "ladder.jsonl").read_text() == "theirs\n"


def _claim(reports_dir: Path, run_id: str, queue: multiprocessing.Queue) -> None:
    queue.put(claim_run_folder(reports_dir, run_id))


def test_runs_started_together_with_one_id_get_a_folder_each(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue = context.Queue()
    claims = [context.Process(target=_claim, args=(tmp_path, "20261124-101010-abcd", queue)) for _ in range(6)]
    for process in claims:
        process.start()
    for process in claims:
        process.join(30)
    ids = [queue.get(timeout=5) for _ in claims]
    assert len(set(ids)) == 6 and "20261124-101010-abcd" in ids
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(ids)


class Interrupted(Exception):
    pass


def test_an_interrupt_delivered_to_another_thread_ends_the_wait_for_a_case() -> None:
    """The kernel may hand Ctrl-C to any thread; the main thread, waiting for a case, must still see it soon.

    Python runs the handler in the main thread, but only once that thread wakes: an untimed wait for the case
    would sleep through it until the case ended (under load, an interrupted run went on to its deadline).
    """
    case_seconds = 20.0
    pending = Pending("test_x", case_call("all_reduce", None, {}), frozenset())
    release = threading.Event()
    pending.run(lambda on_wait: release.wait(case_seconds) and None)  # type: ignore[func-returns-value]

    def interrupt_from_another_thread() -> None:
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    def raise_interrupted(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGINT, raise_interrupted)
    started = time.monotonic()
    try:
        threading.Thread(target=interrupt_from_another_thread).start()
        with pytest.raises(Interrupted):
            pending.wait(None)
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()
    assert time.monotonic() - started < case_seconds / 2  # seen within a slice of the wait, not at the case's end
