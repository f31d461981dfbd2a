"""The suite under a real SLURM (Debian's slurm-wlm) as people run it: srun, sbatch, salloc, scancel.

The cluster (munged, slurmctld, slurmd n1, n2, n3) is this host's own, started once per module in
a private folder and stopped by process id (``slurm_cluster``); where SLURM cannot be installed or
started, every test here skips with the reason.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import copy_suite_files, wait_until_gone
from slurm_cluster import SlurmCluster, module_cluster, why_not_here

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.slow]
FAST = ("--init-timeout=5", "--op-timeout=5", "--step-timeout=10", "--rendezvous-timeout=30")
RUN_SECONDS = 240.0  # the whole of one srun/sbatch run of the two suite files, the machine busy
# scancel: SLURM's SIGTERM, KillWait (5 s in slurm_cluster) to SIGKILL, then reaping; the rest is load.
SCANCEL_SECONDS, LOAD_MARGIN_SECONDS = 5.0 + 3.0, 7.0
REFUSAL = (
    "start one pytest per node with `srun --ntasks-per-node=1 pytest suites/` "
    "(or say --nnodes 1 to test this node alone)"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from module_cluster(tmp_path_factory)


def suite(folder: Path) -> list[str]:
    """The pytest command every node runs (the same on each, as srun gives it)."""
    files = copy_suite_files(folder, "test_multinode.py", "test_pairs.py")
    return [
        sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", "-p", "no:warnings",
        "-rfs", f"--reports-dir={folder / 'reports'}", *files, *FAST, "--virtual-devices=1",
    ]  # fmt: skip


def records(reports: Path) -> list[dict[str, Any]]:
    """Node 0's records: the run's 'latest' (node 1 writes <run id>-node1 beside it in the same folder)."""
    path = reports / "latest" / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_both_nodes_passed(output: str, reports: Path, store_host: str) -> None:
    assert "conformance: node 1 of 2 (layout from SLURM)" in output, output
    assert f"run store on {store_host}:" in output, output
    crossing = [r for r in records(reports) if r.get("nodes")]
    assert {r["node_rank"] for r in crossing} == {0, 1}, crossing
    assert all(r["verdict"] == "pass" for r in crossing), crossing


def test_srun_one_pytest_per_node_passes_and_node_0_gathers_both(
    cluster: SlurmCluster, pytester: pytest.Pytester, run_tag: str
) -> None:
    done = cluster.command(
        "srun", "-N2", "--ntasks-per-node=1", *suite(pytester.path), cwd=pytester.path, timeout=RUN_SECONDS
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert_both_nodes_passed(done.stdout, pytester.path / "reports", "n1")


def test_an_sbatch_script_with_srun_inside_passes(
    cluster: SlurmCluster, pytester: pytest.Pytester, run_tag: str
) -> None:
    script = pytester.path / "conformance.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --output=job.out\n"
        f"srun {' '.join(suite(pytester.path))}\n"
    )
    done = cluster.command("sbatch", "--wait", str(script), cwd=pytester.path, timeout=RUN_SECONDS)
    output = (pytester.path / "job.out").read_text()
    assert done.returncode == 0, done.stderr + output
    assert_both_nodes_passed(output, pytester.path / "reports", "n1")


def test_a_step_without_the_jobs_first_node_takes_its_own_first_node(
    cluster: SlurmCluster, pytester: pytest.Pytester, run_tag: str
) -> None:
    """Under salloc -N3, srun -N2 -r1: the step runs on n2 and n3, so the store is on n2, not the job's n1."""
    step = ("srun", "-N2", "-r1", "--ntasks-per-node=1", *suite(pytester.path))
    done = cluster.command("salloc", "-N3", *step, cwd=pytester.path, timeout=RUN_SECONDS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_both_nodes_passed(done.stdout, pytester.path / "reports", "n2")


@pytest.mark.parametrize(
    ("how", "where"),
    [
        ("salloc", "outside any job step (salloc's shell, or an sbatch script without srun)"),
        ("sbatch", "outside any job step (salloc's shell, or an sbatch script without srun)"),
        ("one-task step", "in a job step of one task (SLURM_STEP_NUM_TASKS=1)"),
    ],
    ids=["salloc", "sbatch-without-srun", "one-task-step"],
)
def test_a_pytest_that_is_not_one_per_node_is_refused_in_one_line(
    cluster: SlurmCluster, pytester: pytest.Pytester, run_tag: str, how: str, where: str
) -> None:
    command = suite(pytester.path)
    if how == "salloc":
        done = cluster.command("salloc", "-N2", *command, cwd=pytester.path)
        job, output = done.stderr.split("Granted job allocation ")[1].split()[0], done.stderr
    elif how == "sbatch":
        done = cluster.command(
            "sbatch", "--wait", "--parsable", "-N2", "-o", "job.out", "--wrap", " ".join(command), cwd=pytester.path
        )
        job, output = done.stdout.split(";")[0].strip(), (pytester.path / "job.out").read_text()
    else:
        done = cluster.command("salloc", "-N2", "srun", "-N1", "-n1", *command, cwd=pytester.path)
        job, output = done.stderr.split("Granted job allocation ")[1].split()[0], done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    refusals = [line for line in output.splitlines() if line.startswith("ERROR: conformance:")]
    assert refusals == [
        f"ERROR: conformance: this pytest runs in SLURM job {job} of 2 nodes, but {where}: {REFUSAL}"
    ], output
    assert not list((pytester.path / "reports").glob("*"))  # refused before any run folder


def test_scancel_mid_run_leaves_no_process(cluster: SlurmCluster, pytester: pytest.Pytester, run_tag: str) -> None:
    script = pytester.path / "conformance.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N2\n#SBATCH -o job.out\nsrun --ntasks-per-node=1 {' '.join(suite(pytester.path))}\n"
    )
    job = cluster.command("sbatch", "--parsable", str(script), cwd=pytester.path).stdout.split(";")[0].strip()
    begun = time.monotonic()
    results = pytester.path / "reports" / "latest" / "results.jsonl"
    while not (results.exists() and results.read_text().strip()):  # a case has ended: the run is under way
        assert time.monotonic() - begun < RUN_SECONDS, (pytester.path / "job.out").read_text()
        time.sleep(0.2)
    cluster.command("scancel", job)
    left = wait_until_gone(run_tag, SCANCEL_SECONDS + LOAD_MARGIN_SECONDS)
    assert not left, f"left after scancel: {left}\n{(pytester.path / 'job.out').read_text()}"


def test_without_slurm_installed_the_tests_skip_naming_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    reason = why_not_here()
    assert reason is not None and reason.startswith("SLURM test cluster: munged, slurmctld, slurmd, srun"), reason
    assert reason.endswith("not installed (apt-get install slurm-wlm munge)")
