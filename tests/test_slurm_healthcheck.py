"""``conformance-healthcheck``: the quick suite on one node; a node it fails on is drained in SLURM.

The first tests give it stand-ins for ``scontrol`` and ``sinfo`` (first on PATH) that write down
what they were asked; the last ones run it on the tests' own SLURM cluster (``slurm_cluster``):
through ``srun -w n1`` as a job step, and as slurmd runs a ``HealthCheckProgram`` (no argument,
``SLURMD_NODENAME`` its only variable, no PATH), and read the node's state back with ``sinfo``.
Where SLURM cannot be had, those skip with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.cli import slurm_health
from conformance.cli.slurm_health import (
    DRAIN_FAILED,
    HEALTHY,
    REASON_BYTES,
    UNHEALTHY,
    USAGE,
    drain_reason,
    drained_by_us,
    main,
    parse,
    prune_runs,
)
from conftest import REPO
from slurm_cluster import SlurmCluster, module_cluster

pytestmark = pytest.mark.usefixtures("isolated_env")
HEALTHY_8GPU = ("--topology-file", str(REPO / "conformance" / "scenarios" / "topologies" / "nvswitch-8gpu.json"))
HEALTHY_ARGS = (*HEALTHY_8GPU, "--virtual-devices", "8")
GPU_LOST = (
    "gpu-conformance: SIMULATED: host check host:gpu_inventory: ERROR: 1 GPU(s) on the PCI bus that NVML does "
    "not list: 0000:48:00.0 (8 on the PCI bus, 7 in NVML)"
)
# In its init, not its 4-byte step: a hang there is called by the 30 s step deadline, after the time limit
# (one in a small step would be called after 5 s, inside it).
HANG_IN_ALL_REDUCE = '[scenario]\nname = "all_reduce hangs"\n[[rule]]\neffect = "hang"\nphase = "init"\n'
HANG_IN_ALL_REDUCE += 'probes = ["all_reduce"]\nignore_sigterm = true\n'
DRAINED_SECONDS = 15.0  # a node draining under the health check's own job is drained once the job ends


# --- scontrol and sinfo stood in for: what the health check asks of SLURM ---


FAKE_SCONTROL = """#!/bin/sh
printf '%s\\n' "$@" >> "$0.calls"
echo "--" >> "$0.calls"
exit ${FAKE_SCONTROL_STATUS:-0}
"""
FAKE_SINFO = """#!/bin/sh
printf '%s\\n' "${FAKE_NODE_STATE:-idle|none}"
"""


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Path:
    """A folder holding stand-ins for scontrol (its calls written to scontrol.calls) and sinfo."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("sinfo", FAKE_SINFO)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def calls(fake_slurm: Path) -> list[list[str]]:
    path = fake_slurm / "scontrol.calls"
    text = path.read_text() if path.exists() else ""
    return [call.strip("\n").split("\n") for call in text.split("--\n") if call.strip()]


def environ(fake_slurm: Path, **variables: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{fake_slurm}{os.pathsep}{os.environ.get('PATH', '')}", **variables}


def test_a_node_that_fails_the_quick_suite_is_drained_with_the_answers_first_failure(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--reports-dir", str(tmp_path / "reports"), "--scenario", "gpu-lost"]
    status = main(argv, environ(fake_slurm, SLURMD_NODENAME="gpu17"))
    out = capsys.readouterr().out
    assert status == UNHEALTHY, out
    [call] = calls(fake_slurm)
    assert call[:3] == ["update", "NodeName=gpu17", "State=DRAIN"], call
    reason = call[3].removeprefix("Reason=")
    assert reason.startswith(GPU_LOST) and reason.endswith("..."), reason
    assert len(reason.encode()) == REASON_BYTES and "\n" not in reason
    assert f"conformance-healthcheck: node gpu17: drained: {reason}" in out.splitlines()
    assert (tmp_path / "reports" / "healthcheck.log").read_text().strip()  # what pytest said, kept for the admin


def test_a_healthy_node_is_left_alone_and_one_it_drained_itself_is_resumed(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu3"]
    argv = [*reports, *HEALTHY_ARGS]
    assert main(argv, environ(fake_slurm)) == HEALTHY, capsys.readouterr().out
    assert calls(fake_slurm) == []  # idle: nothing asked of scontrol
    someone_elses = environ(fake_slurm, FAKE_NODE_STATE="drained|admin: fan 3 failed")
    assert main(argv, someone_elses) == HEALTHY
    assert calls(fake_slurm) == []  # a drain with another reason is a person's: it stays
    assert main([*reports, "--scenario", "nvlink-down"], environ(fake_slurm)) == UNHEALTHY  # idle: this check drains
    [drained] = calls(fake_slurm)
    ours = drained[3].removeprefix("Reason=")
    assert main(argv, environ(fake_slurm, FAKE_NODE_STATE=f"drained|{ours}")) == HEALTHY
    assert calls(fake_slurm)[1:] == [["update", "NodeName=gpu3", "State=RESUME"]]
    assert "node gpu3: resumed (drained earlier by this health check" in capsys.readouterr().out
    again = environ(fake_slurm, FAKE_NODE_STATE=f"drained|{ours}")  # resumed once: the reason is no longer its own
    assert main(argv, again) == HEALTHY and len(calls(fake_slurm)) == 2
    edited = environ(fake_slurm, FAKE_NODE_STATE="drained|gpu-conformance: kept drained by hand")
    assert main(argv, edited) == HEALTHY and len(calls(fake_slurm)) == 2  # our prefix, not our reason: it stays
    assert "drained with a reason this check did not set last (gpu-conformance: kept drained by hand)" in (
        capsys.readouterr().out
    )


def test_an_administrators_drain_down_or_reservation_is_never_overwritten(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu4", "--scenario", "nvlink-down"]
    for state in ("drained|fan 3 failing, do not use", "down*|Not responding", "reserved|maintenance window",
                  "mixed+drain|\x1b]0;pwned\x07 by someone"):  # fmt: skip
        assert main(argv, environ(fake_slurm, FAKE_NODE_STATE=state)) == UNHEALTHY
        out = capsys.readouterr().out
        assert f"node gpu4: already {state.split('|')[0]} by someone else (" in out and "left as it is" in out
        assert "\x1b" not in out  # the reason read back is data: escaped
    assert calls(fake_slurm) == []


@pytest.mark.parametrize(
    ("given", "variables", "source"),
    [
        (["--node", "n[1-100]"], {}, "--node"),
        (["--node", "n1,n2"], {}, "--node"),
        (["--node", "ALL"], {}, "--node"),
        ([], {"SLURMD_NODENAME": "all"}, "SLURMD_NODENAME"),
        ([], {"SLURMD_NODENAME": "gpu1 State=DOWN"}, "SLURMD_NODENAME"),
    ],
)
def test_a_node_name_that_is_not_one_nodes_is_refused_before_anything_runs(
    fake_slurm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], given: list[str],
    variables: dict[str, str], source: str,
) -> None:  # fmt: skip
    argv = ["--reports-dir", str(tmp_path / "reports"), *given, "--scenario", "nvlink-down"]
    assert main(argv, environ(fake_slurm, **variables)) == USAGE
    assert f"conformance-healthcheck: error: {source} is " in capsys.readouterr().err
    assert calls(fake_slurm) == [] and not (tmp_path / "reports").exists()


def test_past_its_time_limit_the_suite_is_stopped_and_the_node_drained_naming_the_test(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rank that hangs and ignores SIGTERM: the time limit ends it all, and nothing is left running."""
    scenario = tmp_path / "hang.toml"
    scenario.write_text(HANG_IN_ALL_REDUCE)
    argv = ["--reports-dir", str(tmp_path / "reports"), "--time-limit", "8", "--scenario", str(scenario)]
    begun = time.monotonic()
    status = main(argv, environ(fake_slurm, SLURMD_NODENAME="gpu5"))
    took = time.monotonic() - begun
    assert status == UNHEALTHY, capsys.readouterr().out
    [call] = calls(fake_slurm)
    assert call[3].startswith(
        "Reason=gpu-conformance: no answer within 8s (the health check's time limit): stopped in "
    ) and call[3].endswith("test_collectives.py::test_all_reduce[all4-inherited]"), call
    assert took < 8 + slurm_health.STOP_SECONDS + slurm_health.OUTPUT_SECONDS + 2, took


def test_a_drain_scontrol_refuses_is_exit_status_3_and_says_why(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (fake_slurm / "scontrol").write_text(
        "#!/bin/sh\necho 'slurm_update error: Invalid node name specified' >&2\nexit 1\n"
    )
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "nosuch", "--scenario", "nvlink-down"]
    assert main(argv, environ(fake_slurm)) == DRAIN_FAILED
    err = capsys.readouterr().err
    assert "node nosuch: the drain failed: slurm_update error: Invalid node name specified" in err


def test_no_drain_reports_without_asking_slurm_and_bad_arguments_are_exit_status_2(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--reports-dir", str(tmp_path / "reports"), "--no-drain", "--scenario", "nvlink-down"]
    assert main(argv, environ(fake_slurm, SLURMD_NODENAME="gpu2")) == UNHEALTHY
    out = capsys.readouterr().out
    assert "node gpu2: UNHEALTHY: SIMULATED: host check host:nvlink: ERROR: gpu2: 17 of 18 NVLinks up" in out
    assert calls(fake_slurm) == []
    assert main(["--time-limit", "soon"], environ(fake_slurm)) == USAGE
    assert "conformance-healthcheck: error: argument --time-limit: " in capsys.readouterr().err


def test_pytest_options_pass_through_and_the_reason_fits_slurmdbd() -> None:
    args, rest = parse(["--time-limit", "30", "--expect-gpus", "8", "--no-resume", "--", "--time-limit", "x"])
    assert (args.time_limit, args.no_resume, rest) == (30.0, True, ["--expect-gpus", "8", "--time-limit", "x"])
    assert drain_reason("a\nb\t c é") == "gpu-conformance: a b c ?"
    assert drain_reason("\x1b]0;title\x07 ok") == "gpu-conformance: \\x1b]0;title\\x07 ok"  # no control character
    assert len(drain_reason("x" * 1000).encode()) == REASON_BYTES
    assert drained_by_us("drained", "gpu-conformance: x") and drained_by_us("mixed+drain", "gpu-conformance: x")
    assert not drained_by_us("drained", "admin: gpu-conformance: x") and not drained_by_us("idle", "gpu-conformance:")


def test_the_reports_folder_keeps_the_newest_runs(tmp_path: Path) -> None:
    names = [f"20260101-00000{k}-abcd" for k in range(5)] + ["20260101-000001-abcd-node1", "mine"]
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / "latest").symlink_to("20260101-000000-abcd")  # the run just made is never removed
    prune_runs(tmp_path, 2)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["20260101-000000-abcd", "20260101-000003-abcd", "20260101-000004-abcd", "latest", "mine"]


# --- the tests' own SLURM cluster ---


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from module_cluster(tmp_path_factory)


def healthcheck_program() -> str:
    program = Path(sys.executable).with_name("conformance-healthcheck")
    assert program.exists(), f"{program} is missing: install the package again (pip install -e .)"
    return str(program)


def node_state(cluster: SlurmCluster, node: str) -> tuple[str, str]:
    line = cluster.command("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E", timeout=10).stdout.strip()
    state, _, reason = line.partition("|")
    return state, reason


def wait_for_state(cluster: SlurmCluster, node: str, state: str) -> tuple[str, str]:
    deadline = time.monotonic() + DRAINED_SECONDS
    found = node_state(cluster, node)
    while found[0] != state and time.monotonic() < deadline:
        time.sleep(0.2)
        found = node_state(cluster, node)
    return found


@pytest.mark.slow
def test_srun_a_broken_node_ends_drained_with_the_answer_and_a_healthy_one_stays_idle(
    cluster: SlurmCluster, tmp_path: Path, run_tag: str
) -> None:
    program = healthcheck_program()
    broken = cluster.command(
        "srun", "-w", "n1", "-N1", "-n1", program, f"--reports-dir={tmp_path / 'n1'}", "--scenario", "gpu-lost",
        cwd=tmp_path,
    )  # fmt: skip
    assert broken.returncode == UNHEALTHY, broken.stdout + broken.stderr
    state, reason = wait_for_state(cluster, "n1", "drained")
    assert state == "drained" and reason.startswith(GPU_LOST), (state, reason, broken.stdout)
    assert f"conformance-healthcheck: node n1: drained: {reason}" in broken.stdout
    healthy = cluster.command(
        "srun", "-w", "n2", "-N1", "-n1", program, f"--reports-dir={tmp_path / 'n2'}", *HEALTHY_ARGS, cwd=tmp_path
    )
    assert healthy.returncode == HEALTHY, healthy.stdout + healthy.stderr
    assert "conformance-healthcheck: node n2: healthy" in healthy.stdout
    assert wait_for_state(cluster, "n2", "idle") == ("idle", "none")


@pytest.mark.slow
def test_as_slurmd_runs_a_health_check_program_it_resumes_only_its_own_drain(
    cluster: SlurmCluster, tmp_path: Path, run_tag: str
) -> None:
    """No argument but the wrapper's, no PATH: scontrol found where SLURM installs it."""
    program = healthcheck_program()
    # slurmd's environment for it is SLURMD_NODENAME alone; SLURM_CONF names the tests' cluster, as a wrapper would
    slurmd_env = {"SLURMD_NODENAME": "n3", "SLURM_CONF": str(cluster.conf), "CONFORMANCE_TEST_TAG": run_tag}
    check = [program, f"--reports-dir={tmp_path / 'n3'}", *HEALTHY_ARGS]
    broken = [program, f"--reports-dir={tmp_path / 'n3'}", "--scenario", "nvlink-down"]

    def run_check() -> None:
        done = subprocess.run(check, env=slurmd_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == HEALTHY, done.stdout + done.stderr

    admin = "Reason=fan 3 failing, do not use"
    assert cluster.command("scontrol", "update", "NodeName=n3", "State=DRAIN", admin).returncode == 0
    failing = subprocess.run(broken, env=slurmd_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert failing.returncode == UNHEALTHY, failing.stdout + failing.stderr
    assert "node n3: already drained by someone else (fan 3 failing, do not use): left as it is" in failing.stdout
    run_check()
    assert node_state(cluster, "n3") == ("drained", "fan 3 failing, do not use")  # a person's drain stays, unchanged
    assert cluster.command("scontrol", "update", "NodeName=n3", "State=RESUME").returncode == 0
    assert wait_for_state(cluster, "n3", "idle") == ("idle", "none")
    failing = subprocess.run(broken, env=slurmd_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert failing.returncode == UNHEALTHY, failing.stdout + failing.stderr
    assert wait_for_state(cluster, "n3", "drained")[1].startswith("gpu-conformance: SIMULATED: host check host:nvlink")
    run_check()
    assert wait_for_state(cluster, "n3", "idle") == ("idle", "none")  # its own drain, resumed


def test_a_node_that_tested_no_gpu_says_so_in_its_last_line(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "vm1", "--virtual-devices", "2"]
    assert main(argv, environ(fake_slurm)) == HEALTHY
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("conformance-healthcheck: node vm1: healthy (CPU ONLY: no GPU tested: "), last
    env_file = next((tmp_path / "reports").glob("2*/recommended.env")).read_text()
    assert env_file.startswith("# CPU ONLY: no GPU was tested ("), env_file
