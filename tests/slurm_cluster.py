"""A SLURM cluster of its own on this one host, for the tests: munged, slurmctld and three slurmd.

Debian's ``slurm-wlm`` and ``munge``, as a cluster admin would run them, but every file (key,
sockets, state, spool, logs, ``slurm.conf``) in one private folder and every port free: nothing
of the host's own set-up is read or changed.  The nodes are ``n1``, ``n2`` and ``n3``, each a
``slurmd -N`` of its own on 127.0.0.1; each ``slurmd`` runs in a mount namespace where
``/etc/hosts`` names them, so their jobs resolve node names as on a real cluster.  Everything
started is stopped by process id.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import free_ports

NODES = ("n1", "n2", "n3")
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "scancel", "sinfo", "squeue", "unshare")
UP_SECONDS = 30.0  # munged, slurmctld and every slurmd up and idle
STOP_SECONDS = 10.0  # a daemon's SIGTERM before SIGKILL; jobs cancelled before the daemons stop

# slurmd's jobs see this hosts file: node names resolve as they would on a cluster.
_IN_HOSTS_NAMESPACE = (
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'mount --bind "$0" /etc/hosts && exec "$@"',
)


class ClusterUnavailable(RuntimeError):
    """SLURM cannot be had here; the message says why (the test skips with it)."""


@dataclass
class SlurmCluster:
    folder: Path
    daemons: dict[str, subprocess.Popen[bytes]]

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (this process's environment) with the client commands pointed at this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, timeout: float = 120.0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=cwd, env=self.environ(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def jobs(self) -> list[str]:
        return self.command("squeue", "-h", "-o", "%i", timeout=10).stdout.split()

    def stop(self) -> None:
        """Cancel every job, wait for them to end, then stop each daemon by its process id."""
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].poll() is None:
            jobs = self.jobs()
            if jobs:
                self.command("scancel", "--full", *jobs, timeout=10)
            deadline = time.monotonic() + STOP_SECONDS
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in reversed(list(self.daemons)):  # slurmd, then slurmctld, then munged
            _stop(self.daemons[name])

    def log_tails(self, lines: int = 5) -> str:
        tails = []
        for log in sorted(self.folder.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"{log.name}:\n  " + "\n  ".join(text))
        return "\n".join(tails)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _private_file(path: Path, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(content)


def _slurm_conf(folder: Path, ports: Sequence[int]) -> str:
    control, *node_ports = ports
    nodes = "\n".join(
        f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=2 State=UNKNOWN"
        for name, port in zip(NODES, node_ports, strict=True)
    )
    # Job ids, and so the suite's default port (20000 + job id % 12000), differ from cluster to cluster.
    first_job = random.randint(1000, 900000)
    return f"""\
ClusterName=conformance
SlurmctldHost=localhost
SlurmctldPort={control}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
FirstJobId={first_job}
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def why_not_here() -> str | None:
    """Why no SLURM cluster can be started on this host, or None."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        return f"SLURM test cluster: {', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "SLURM test cluster: munged and slurmd of their own need root here"
    probe = subprocess.run(
        [*_IN_HOSTS_NAMESPACE, "/etc/hosts", "true"], capture_output=True, text=True, timeout=10, check=False
    )
    if probe.returncode != 0:
        return f"SLURM test cluster: no mount namespace for the nodes' /etc/hosts: {probe.stderr.strip()}"
    return None


def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A test module's cluster fixture: skips the tests with the reason where SLURM cannot be had; stops it after."""
    try:
        running = start_cluster(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    yield running
    running.stop()


def start_cluster(folder: Path) -> SlurmCluster:
    """Start munged, slurmctld and a slurmd per node in ``folder``; ClusterUnavailable says why not."""
    reason = why_not_here()
    if reason:
        raise ClusterUnavailable(reason)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    (folder / "state").mkdir(exist_ok=True)
    _private_file(folder / "munge.key", os.urandom(1024))
    (folder / "slurm.conf").write_text(_slurm_conf(folder, free_ports(1 + len(NODES))))
    hosts = Path("/etc/hosts").read_text() + f"\n127.0.0.1 {' '.join(NODES)}\n"
    (folder / "hosts").write_text(hosts)

    cluster = SlurmCluster(folder, {})
    conf = str(cluster.conf)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM_", "CONFORMANCE_"))}
    daemons: list[tuple[str, list[str]]] = [
        ("munged", ["munged", "--foreground", "--force", f"--socket={folder}/munge.sock",
                    f"--key-file={folder}/munge.key", f"--pid-file={folder}/munged.pid",
                    f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed"]),
        ("slurmctld", ["slurmctld", "-D", "-i", "-f", conf]),
        *((f"slurmd-{node}", [*_IN_HOSTS_NAMESPACE, str(folder / "hosts"), "slurmd", "-D", "-f", conf, "-N", node])
          for node in NODES),
    ]  # fmt: skip
    try:
        for name, command in daemons:
            with (folder / f"{name}.out").open("wb") as out:
                cluster.daemons[name] = subprocess.Popen(
                    command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            if name == "munged":
                _wait_for(lambda: (folder / "munge.sock").exists(), cluster, "munged's socket")
        _wait_for(lambda: _all_idle(cluster), cluster, "every node idle in sinfo")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _all_idle(cluster: SlurmCluster) -> bool:
    states = cluster.command("sinfo", "-h", "-N", "-o", "%N %T", timeout=10).stdout.split("\n")
    idle = {line.split()[0] for line in states if line.strip().endswith("idle")}
    return idle == set(NODES)


def _wait_for(ready: Callable[[], bool], cluster: SlurmCluster, what: str) -> None:
    deadline = time.monotonic() + UP_SECONDS
    while time.monotonic() < deadline:
        ended = [name for name, process in cluster.daemons.items() if process.poll() is not None]
        if ended:
            raise ClusterUnavailable(f"SLURM test cluster: {', '.join(ended)} ended at start\n{cluster.log_tails()}")
        if ready():
            return
        time.sleep(0.2)
    raise ClusterUnavailable(f"SLURM test cluster: no {what} within {UP_SECONDS:.0f}s\n{cluster.log_tails()}")
