"""The end always answers: whatever fails around the run's end, its answer is the last block on the screen.

Each way the end was seen to fail, in a real run of the suite's plugin: pytest's own JUnit writer
failing (``--junitxml /dev/full``), another plugin's end raising, the metrics file's folder gone,
the disk full at the end, SIGTERM (SLURM's scancel, docker stop) and SIGHUP (an ssh session
dropped).  In every one the answer comes last and says what was not written, the exit status is
not 0, the metrics file never says ``running``, and run.json's end is written, or the answer says
it was not.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import pytest

from conftest import COLLECTIVE_TEST, copy_suites, scenario_text, wait_while_running

RunSuite = Callable[..., pytest.RunResult]
pytestmark = pytest.mark.usefixtures("isolated_env")
OPTIONS = ("--virtual-devices=2", "--step-timeout=60", "--op-timeout=50", "--init-timeout=50", "--grace=1")
ANSWER_SEPARATOR = "= conformance: the answer"

A_PLUGIN_WHOSE_END_RAISES = """
def pytest_sessionfinish(session):
    raise RuntimeError("another plugin's end failed")
"""

THE_METRICS_FOLDER_GOES = """
import shutil


def test_zz_the_metrics_folder_goes():
    shutil.rmtree("metrics")
"""

THE_DISK_FILLS = """
import errno


def test_zz_the_disk_fills():
    with open("reports/filler", "wb") as f:
        try:
            while True:
                f.write(b"x" * (1 << 20))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
"""


@dataclass
class Ended:
    """What a run that met a failure at its end left: its output, exit status, metrics and run.json."""

    output: str
    status: int
    metrics: str
    run_json: dict = field(default_factory=dict)

    def answer(self) -> list[str]:
        """The answer's lines; the answer must be the last block of the output (nothing but blanks after it)."""
        lines = self.output.rstrip("\n").splitlines()
        starts = [i for i, line in enumerate(lines) if ANSWER_SEPARATOR in line]
        assert starts, self.output
        block = lines[starts[-1] + 1 :]
        assert block and all(line and not line.startswith(("=", "Traceback", "INTERNALERROR")) for line in block), (
            self.output
        )
        return block


def _run(pytester: pytest.Pytester, *args: str) -> Ended:
    metrics = pytester.path / "metrics" / "gpu_conformance.prom"
    metrics.parent.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", "--reports-dir=reports",
         f"--metrics-file={metrics}", *OPTIONS, *args],
        cwd=pytester.path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return _ended(pytester, done.stdout + done.stderr, done.returncode)


def _ended(pytester: pytest.Pytester, output: str, status: int) -> Ended:
    metrics = pytester.path / "metrics" / "gpu_conformance.prom"
    run_json = pytester.path / "reports" / "latest" / "run.json"
    return Ended(
        output,
        status,
        metrics.read_text() if metrics.exists() else "",
        json.loads(run_json.read_text()) if run_json.exists() else {},
    )


def junit_to_dev_full(pytester: pytest.Pytester) -> Ended:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    return _run(pytester, "--junitxml=/dev/full", "test_x.py")


def another_plugins_end_raises(pytester: pytest.Pytester) -> Ended:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    pytester.makeconftest(A_PLUGIN_WHOSE_END_RAISES)
    return _run(pytester, "test_x.py")


def the_metrics_folder_goes(pytester: pytest.Pytester) -> Ended:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"), test_zz=THE_METRICS_FOLDER_GOES)
    return _run(pytester, "test_x.py", "test_zz.py")


def the_disk_fills(pytester: pytest.Pytester) -> Ended:
    small = pytester.path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(small)], capture_output=True,
                             text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"a small file system of its own needs mount (root): {mounted.stderr.strip()}")
    try:
        (pytester.path / "reports").symlink_to(small)
        files = copy_suites(pytester, "test_collectives.py")
        pytester.makepyfile(test_zz=THE_DISK_FILLS)
        ended = _run(pytester, *files, "test_zz.py")
        assert not [p.name for p in small.rglob(".*.tmp")]  # no temporary file left behind
        return ended
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def stopped_while_a_case_hangs(pytester: pytest.Pytester, sig: signal.Signals) -> Ended:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    scenario = pytester.makefile(".toml", hang=scenario_text('effect = "hang"\nphase = "probe"'))
    (pytester.path / "metrics").mkdir()
    metrics = pytester.path / "metrics" / "gpu_conformance.prom"
    command = [sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
               "--reports-dir=reports", f"--metrics-file={metrics}", f"--scenario={scenario}", *OPTIONS,
               "test_x.py"]  # fmt: skip
    output = pytester.path / "output.txt"
    with output.open("w") as out:
        proc = subprocess.Popen(command, cwd=pytester.path, stdout=out, stderr=subprocess.STDOUT)
    try:
        phases = [pytester.path / "reports" / "latest" / "cases" / "test_x.py--test_case" / f"rank{r}" / "phase.jsonl"
                  for r in range(2)]  # fmt: skip
        wait_while_running(
            proc, output, lambda: all(p.exists() and '"probe"' in p.read_text() for p in phases), "no case hung"
        )
        proc.send_signal(sig)
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return _ended(pytester, output.read_text(), status)


@dataclass(frozen=True)
class EndFailure:
    make: Callable[[pytest.Pytester], Ended]
    status: int  # pytest's exit status
    first: str  # how the answer's first line begins
    end_state: str | None  # run.json's end.state; None: run.json could not be written, and the answer says so


FAILURES = {
    "pytest's JUnit writer fails": EndFailure(
        junit_to_dev_full, 1, "JUnit file /dev/full NOT written: No space left on device", "complete"
    ),
    "another plugin's end raises": EndFailure(
        another_plugins_end_raises, 3, "the run's end NOT completed: RuntimeError: another plugin's end failed",
        "complete",
    ),
    "the metrics file's folder is gone": EndFailure(
        the_metrics_folder_goes, 1, "metrics NOT written to ", "complete"
    ),
    "the disk is full at the end": EndFailure(the_disk_fills, 1, "run.json NOT written: No space left on device", None),
    "SIGTERM while a case hangs": EndFailure(
        partial(stopped_while_a_case_hangs, sig=signal.SIGTERM), 2, "INCOMPLETE RUN (interrupted", "incomplete"
    ),
    "SIGHUP (the ssh session dropped) while a case hangs": EndFailure(
        partial(stopped_while_a_case_hangs, sig=signal.SIGHUP), 2, "INCOMPLETE RUN (interrupted", "incomplete"
    ),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_the_end_answers_last_whatever_fails_around_it(pytester: pytest.Pytester, failure: EndFailure) -> None:
    ended = failure.make(pytester)
    answer = ended.answer()
    assert answer[0].startswith(failure.first), ended.output
    assert ended.status == failure.status, ended.output
    assert 'verdict="running"} 1' not in ended.metrics  # never left saying the run still runs
    if ended.metrics:
        assert "gpu_conformance_run_passed 0" in ended.metrics
    if failure.end_state is None:
        assert ended.run_json.get("end", {}).get("state") == "started"
    else:
        assert ended.run_json["end"]["state"] == failure.end_state
