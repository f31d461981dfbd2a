"""Node layout (settings over SLURM over torchrun variables) and the cross-node fingerprint table."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from conformance.nodes import layout
from conformance.nodes.layout import (
    DEFAULT_MASTER_PORT,
    SLURM_PORT_BASE,
    Fingerprint,
    NodeError,
    NodeSetup,
    compare_fingerprints,
    extra_local_process,
    first_host,
    interface_addresses,
    is_loopback,
    network_interfaces,
    node_setup,
    shared_interfaces,
)
from conformance.nodes.munge import MungeError

NONE = {"nnodes": None, "node_rank": None, "master_addr": None, "master_port": None}


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("gpu01", "gpu01"), ("gpu[03-05,9]", "gpu03"), ("gpu[07],cpu1", "gpu07"), ("a1,a2", "a1"), ("n[1-2]x", "n1")],
)
def test_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_one_node_by_default() -> None:
    assert node_setup(NONE, {}) == NodeSetup(1, 0, None, None, "default")


def test_slurm_fills_the_layout() -> None:
    env = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[10-13]"}
    assert node_setup(NONE, env) == NodeSetup(4, 2, "gpu10", DEFAULT_MASTER_PORT, "SLURM")
    assert node_setup(NONE, {**env, "MASTER_PORT": "31000"}).master_port == 31000


def test_node_variables_fill_the_layout() -> None:
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    assert node_setup(NONE, env) == NodeSetup(2, 1, "10.0.0.1", 29400, "NNODES/NODE_RANK variables")


# What torch's elastic agent gives each worker (torch/distributed/elastic/agent/server/local_elastic_agent.py).
TORCHRUN = {
    "RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2", "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "job7",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}  # fmt: skip


def test_torchrun_gives_the_layout_and_its_store_under_a_prefix() -> None:
    setup = node_setup(NONE, TORCHRUN)
    assert (setup.nnodes, setup.node_rank, setup.master_addr, setup.master_port) == (2, 1, "10.0.0.1", 29400)
    prefix = "conformance/job7/attempt0-nodes2"
    assert (setup.source, setup.store_prefix, setup.launcher_hosts_store) == ("torchrun", prefix, True)
    assert setup.store_key("case/ranks") == f"{prefix}/case/ranks"
    # a restarted attempt (torchrun --max-restarts) never reads the keys of the one before
    restarted = node_setup(NONE, {**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert restarted.store_prefix == "conformance/job7/attempt1-nodes2"
    # torchrun's variables win over hand-set NNODES/NODE_RANK, which it does not set
    assert node_setup(NONE, {**TORCHRUN, "NNODES": "5", "NODE_RANK": "3"}).nnodes == 2
    # static rendezvous without the agent's store: node 0 hosts the store torchrun reserved the port for
    assert not node_setup(NONE, {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "False"}).launcher_hosts_store


def test_a_second_torchrun_process_on_a_node_leaves_it_to_the_first() -> None:
    assert extra_local_process(TORCHRUN) is None
    assert extra_local_process({"LOCAL_RANK": "1"}) is None  # not torchrun
    why = extra_local_process({**TORCHRUN, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert why is not None and why.startswith("torchrun started 2 processes on this node; the suite is one pytest")
    assert why.endswith("(LOCAL_RANK=1) leaves the node to LOCAL_RANK 0: use torchrun --nproc-per-node 1")


# What Open MPI's mpirun gives each process (docs.open-mpi.org, "Environment variables set for MPI applications").
def open_mpi(size: int, rank: int, local_size: int, local_rank: int) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_SIZE": str(size), "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size), "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
    }  # fmt: skip


def hydra(size: int, rank: int, local_size: int, local_rank: int) -> dict[str, str]:
    return {"PMI_SIZE": str(size), "PMI_RANK": str(rank), "MPI_LOCALNRANKS": str(local_size),
            "MPI_LOCALRANKID": str(local_rank)}  # fmt: skip


@pytest.mark.parametrize(("launcher", "name"), [(open_mpi, "Open MPI's mpirun"), (hydra, "MPICH's mpiexec (Hydra)")])
def test_an_mpi_launcher_gives_the_layout_one_process_per_node(launcher: Any, name: str) -> None:
    setup = node_setup(NONE, {**launcher(4, 2, 1, 0), "MASTER_ADDR": "gpu01", "MASTER_PORT": "29400"})
    assert (setup.nnodes, setup.node_rank, setup.master_addr, setup.master_port) == (4, 2, "gpu01", 29400)
    assert setup.source.startswith(name)
    # every process on this node: one node, and every process but local rank 0 steps aside
    assert node_setup(NONE, launcher(2, 0, 2, 0)).nnodes == 1
    assert extra_local_process(launcher(2, 0, 2, 0)) is None
    why = extra_local_process(launcher(2, 1, 2, 1))
    assert why is not None and why.startswith(f"{name} started 2 processes on this node; the suite is one pytest")
    # several nodes, without node 0's address: refused, saying how to give it
    with pytest.raises(NodeError, match=r"^4 nodes \(" + re.escape(name) + r".*mpirun -x MASTER_ADDR="):
        node_setup(NONE, launcher(4, 2, 1, 0))


@pytest.mark.parametrize("launcher", [open_mpi, hydra])
def test_several_mpi_processes_per_node_on_several_nodes_are_refused(launcher: Any) -> None:
    """The node count cannot be told from 8 processes, 2 per node, without the mapping: one per node is asked."""
    with pytest.raises(layout.LauncherError, match=r"started 2 processes on this node and 8 in all .*one pytest per"):
        node_setup(NONE, {**launcher(8, 0, 2, 0), "MASTER_ADDR": "h"})


def test_kubeflow_pods_give_the_layout() -> None:
    """A PyTorchJob's pod: WORLD_SIZE and RANK, or its torchrun variables PET_NNODES and PET_NODE_RANK first."""
    pod = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    assert node_setup(NONE, pod) == NodeSetup(
        3, 2, "job-master-0", 23456, "WORLD_SIZE/RANK (Kubeflow PyTorchJob: one pytest per pod)"
    )
    pet = {**pod, "WORLD_SIZE": "16", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "8"}
    assert node_setup(NONE, pet) == NodeSetup(
        2, 1, "job-master-0", 23456, "Kubeflow PyTorchJob (PET_NNODES, PET_NODE_RANK)"
    )
    assert node_setup(NONE, {**pet, "PET_NNODES": "2:2"}).nnodes == 2
    with pytest.raises(layout.LauncherError, match=r"PET_NNODES='1:4' is an elastic range"):
        node_setup(NONE, {**pet, "PET_NNODES": "1:4"})
    # torchrun inside the pod wins: it sets the same WORLD_SIZE/RANK per process
    assert node_setup(NONE, {**pod, **TORCHRUN}).source == "torchrun"


def test_explicit_settings_win_over_slurm() -> None:
    env = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[10-13]"}
    setup = node_setup({**NONE, "master_addr": "10.1.1.1", "master_port": 30000}, env)
    assert setup == NodeSetup(4, 2, "10.1.1.1", 30000, "settings over SLURM")


@pytest.mark.parametrize(
    ("explicit", "env", "message"),
    [
        ({**NONE, "nnodes": 2, "node_rank": 2}, {}, "node rank 2 is not below the node count 2 (settings)"),
        ({**NONE, "nnodes": 2}, {}, "2 nodes (settings) need the first node's address: --master-addr, or MASTER_ADDR"),
        (NONE, {"SLURM_NNODES": "two", "SLURM_NODEID": "0"}, "SLURM_NNODES: 'two' is not a whole number"),
        (NONE, {"NNODES": "0"}, "NNODES: '0' must be a positive whole number"),
        ({**NONE, "nnodes": 2, "master_addr": "h", "master_port": 70000}, {}, "master port 70000 is not a TCP port"),
        (NONE, {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "[1-2]"}, "names no host"),
        (
            NONE,
            {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_LOCALID": "3", "SLURM_JOB_NODELIST": "a,b"},
            "more than one task on this node (SLURM_LOCALID=3); the suite is one pytest per node",
        ),
    ],
)
def test_inconsistent_layouts_are_refused(explicit: dict[str, object], env: dict[str, str], message: str) -> None:
    with pytest.raises(NodeError) as caught:
        node_setup(explicit, env)
    assert message in str(caught.value)


def fingerprint(rank: int, **changes: object) -> Fingerprint:
    base: dict[str, object] = dict(
        node_rank=rank, hostname=f"node{rank}", gpu_count=8, gpu_uuids=(), cuda_visible_devices=None,
        driver="570.124.06", cuda="12.8", nccl="2.26.2", torch="2.13.0", suite="0.1.0", nccl_env={},
        nccl_plugins={"net": "/usr/lib/libnccl-net.so sha256:0123456789ab", "tuner": "none"},
    )  # fmt: skip
    base.update(changes)
    return Fingerprint(**base)  # type: ignore[arg-type]


def test_matching_nodes_pass_and_hostnames_may_differ() -> None:
    check = compare_fingerprints([fingerprint(1), fingerprint(0)])
    assert check.ok and check.fatal == () and check.differing == ("hostname",)
    assert check.table[0].split() == ["field", "node", "0", "node", "1"]
    assert "differs (allowed)" in next(row for row in check.table if row.startswith("hostname"))


def test_fewer_gpus_on_one_node_is_fatal_and_shown() -> None:
    check = compare_fingerprints(
        [fingerprint(0), fingerprint(1, gpu_count=4, cuda_visible_devices="0,1,2,3", nccl_env={"NCCL_DEBUG": "WARN"})]
    )
    assert not check.ok and check.fatal == ("gpu_count",)
    assert check.differing == ("hostname", "cuda_visible_devices", "nccl_env")
    row = next(r for r in check.table if r.startswith("gpu_count"))
    assert row.split() == ["gpu_count", "8", "4", "MUST", "MATCH"]
    assert next(r for r in check.table if r.startswith("nccl_env")).split()[1:3] == ["-", "NCCL_DEBUG=WARN"]


def test_version_mismatches_are_fatal() -> None:
    check = compare_fingerprints([fingerprint(0), fingerprint(1, nccl="2.21.5", torch="2.12.0"), fingerprint(2)])
    assert check.fatal == ("nccl", "torch")


def test_a_node_loading_another_nccl_plugin_is_fatal_and_named() -> None:
    other = {"net": "/opt/aws-ofi-nccl/lib/libnccl-net.so sha256:fedcba987654", "tuner": "none"}
    check = compare_fingerprints([fingerprint(0), fingerprint(1, nccl_plugins=other)])
    assert check.fatal == ("nccl_plugins",)
    row = next(r for r in check.table if r.startswith("nccl_plugins"))
    assert "sha256:0123456789ab" in row and "sha256:fedcba987654" in row and row.endswith("MUST MATCH")


def test_fingerprints_travel_as_json_and_shared_interfaces_leave_loopback_out() -> None:
    a = fingerprint(
        0, interfaces={"lo": ("127.0.0.1", "::1"), "eth0": ("10.0.0.1",), "ib0": ("10.1.0.1",)}, gpu_uuids=("GPU-1",)
    )
    b = fingerprint(1, interfaces={"lo": ("127.0.0.1", "::1"), "eth0": ("10.0.0.2", "fd00::2")})
    assert Fingerprint.from_json(a.to_json()) == a
    assert shared_interfaces([a, b]) == ["eth0"]
    assert shared_interfaces([]) == []
    row = next(r for r in compare_fingerprints([a, b]).table if r.startswith("interfaces"))
    assert "eth0=10.0.0.2,fd00::2" in row.split()


def test_a_node_of_an_older_suite_sends_one_ipv4_address_per_interface() -> None:
    data = json.loads(fingerprint(1).to_json())
    data["interfaces"] = {"eth0": "10.0.0.2"}
    assert Fingerprint.from_json(json.dumps(data)).interfaces == {"eth0": ("10.0.0.2",)}


try:  # psutil's own record of one address (psutil._common before 7)
    from psutil._ntuples import snicaddr
except ImportError:
    from psutil._common import snicaddr

LONG_NAME = "storage-fabric-0-uplink"  # longer than the 15 characters an ioctl's ifreq holds


def address(family: int, text: str) -> object:
    return snicaddr(family, text, None, None, None)


# What psutil.net_if_addrs() gives on a host with IPv4, IPv6-only, link-local-only and long-named interfaces.
NET_IF_ADDRS = {
    "lo": [address(socket.AF_INET, "127.0.0.1"), address(socket.AF_INET6, "::1")],
    "eth0": [
        address(socket.AF_INET6, "fe80::fc:ff:fe00:1%eth0"),  # link-local: left out
        address(socket.AF_INET6, "fd00::2"),
        address(socket.AF_INET, "192.0.2.2"),
        address(psutil.AF_LINK, "02:fc:00:00:00:01"),
    ],
    "ib0": [address(socket.AF_INET6, "2001:db8::7"), address(psutil.AF_LINK, "80:00:02:08:fe:80")],  # IPv6 only
    LONG_NAME: [address(socket.AF_INET, "10.9.0.1")],
    "docker0": [address(socket.AF_INET6, "fe80::42:acff:fe11:2%docker0")],  # nothing another node can reach
    "ifb0": [address(psutil.AF_LINK, "a6:f5:d9:e1:85:e6")],
}


def test_interfaces_come_from_psutil_with_ipv6_and_long_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout.psutil, "net_if_addrs", lambda: NET_IF_ADDRS)
    found = network_interfaces()
    assert found == {
        "lo": ("127.0.0.1", "::1"),
        "eth0": ("192.0.2.2", "fd00::2"),  # IPv4 first
        "ib0": ("2001:db8::7",),
        LONG_NAME: ("10.9.0.1",),
    }
    assert is_loopback(found["lo"]) and is_loopback(("::1",)) and not is_loopback(found["ib0"])
    here = fingerprint(0, interfaces=found)
    there = fingerprint(1, interfaces={**found, "ib0": ("2001:db8::8",), LONG_NAME: ("10.9.0.2",)})
    assert shared_interfaces([here, there]) == sorted(["eth0", "ib0", LONG_NAME])
    assert Fingerprint.from_json(here.to_json()) == here


def test_this_hosts_loopback_through_the_real_call() -> None:
    found = network_interfaces()  # this host's own, read through the kernel (getifaddrs)
    assert "127.0.0.1" in found["lo"] and is_loopback(found["lo"])
    assert found == interface_addresses(psutil.net_if_addrs())
    assert all(not a.startswith("fe80") for addresses in found.values() for a in addresses)


# What SLURM puts in the environment of a job of two nodes (sbatch(1), salloc(1), srun(1) "OUTPUT ENVIRONMENT").
JOB = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
SRUN_STEP = {**JOB, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        (JOB, "outside any job step (salloc's shell, or an sbatch script without srun)"),
        ({**JOB, "SLURM_NODEID": "0", "SLURM_STEP_ID": "4294967294"}, "outside any job step"),  # the batch step
        (
            {**SRUN_STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0"},
            "in a job step of one task",
        ),
        (SRUN_STEP, None),
        ({**JOB, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1"}, None),  # a one-node job: a one-node run
    ],
    ids=["salloc-shell", "sbatch-without-srun", "srun-one-task", "srun-a-task-per-node", "one-node-job"],
)
def test_a_job_of_several_nodes_runs_under_srun(env: dict[str, str], refused: str | None) -> None:
    if refused is None:
        node_setup(NONE, env)
        return
    with pytest.raises(NodeError) as caught:
        node_setup(NONE, env)
    assert refused in str(caught.value)
    assert str(caught.value).startswith("this pytest runs in SLURM job 77 of 2 nodes, but ")
    assert "srun --ntasks-per-node=1 pytest suites/" in str(caught.value)
    assert node_setup({**NONE, "nnodes": 1}, env).nnodes == 1  # testing this node alone, said so


def test_a_step_that_skips_the_jobs_first_node_meets_on_its_own_first_node() -> None:
    """After salloc -N3, srun -N2 -r1 runs on n2 and n3: n2 hosts the run's store, not the job's first node."""
    env = {**SRUN_STEP, "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_NODELIST": "n[2-3]"}
    assert node_setup(NONE, env).master_addr == "n2"


def test_a_slurm_job_names_the_run_and_its_port() -> None:
    """Two jobs on shared nodes get different ports unless MASTER_PORT says otherwise, and different identities."""
    setup = node_setup(NONE, SRUN_STEP)
    assert (setup.identity, setup.master_port) == ("SLURM job 77 step 0", SLURM_PORT_BASE + 77)
    assert node_setup(NONE, {**SRUN_STEP, "SLURM_JOB_ID": "12077"}).master_port == SLURM_PORT_BASE + 77
    assert node_setup(NONE, {**SRUN_STEP, "MASTER_PORT": "29500"}).master_port == 29500
    assert node_setup(NONE, {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "a"}).identity == ""  # by hand


def test_node_0s_store_listens_on_the_runs_address_alone() -> None:
    """A store server torch starts with a port alone listens everywhere; node 0's listens where the run meets."""
    from conformance.nodes.store import host_store, open_store
    from conftest import free_port

    port = free_port()
    setup = NodeSetup(2, 0, "127.0.0.1", port)
    server = host_store(setup)
    try:
        listening = [
            c.laddr
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", port)], listening
        store = open_store(setup, 5)
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert server.process.pid != os.getpid() and server.problem() is None  # a process of its own
    finally:
        server.close()
    assert server.process.returncode == 0  # it ends when node 0 closes it
    with pytest.raises(RuntimeError, match=r"cannot listen on 192\.0\.2\.1:\d+ .*is '192\.0\.2\.1' this node's own"):
        host_store(NodeSetup(2, 0, "192.0.2.1", free_port()))  # TEST-NET-1: no interface here has it


@pytest.fixture
def munged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A munged of its own (Debian's munge), its socket named in a slurm.conf as SLURM's AuthInfo names it."""
    import shutil
    import subprocess
    import time

    if shutil.which("munged") is None or shutil.which("munge") is None:
        pytest.skip("MUNGE is not installed here (apt-get install munge)")
    key = tmp_path / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    socket_path = tmp_path / "munge.sock"
    daemon = subprocess.Popen(
        ["munged", "--foreground", "--force", f"--socket={socket_path}", f"--key-file={key}",
         f"--pid-file={tmp_path / 'munged.pid'}", f"--log-file={tmp_path / 'munged.log'}",
         f"--seed-file={tmp_path / 'munged.seed'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not socket_path.exists() and daemon.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not socket_path.exists():
        daemon.kill()
        pytest.skip(f"munged did not start here: {(tmp_path / 'munged.log').read_text(errors='replace')[-300:]}")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=t\nAuthType=auth/munge\nAuthInfo=socket={socket_path}\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    try:
        yield socket_path
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


def test_under_slurm_without_a_token_munge_signs_the_run(munged: Path) -> None:
    """Node 0 hands the run's key out in MUNGE credentials: a plain client's values are dropped all the same."""
    import datetime

    import torch.distributed as dist

    from conformance.nodes.group import NodeGroup
    from conformance.nodes.liveness import GroupLimits
    from conftest import free_port

    port, limits = free_port(), GroupLimits(progress=5, store=5)
    setups = [NodeSetup(2, rank, "127.0.0.1", port, "SLURM", identity="SLURM job 4242 step 0", slurm_job="4242")
              for rank in (0, 1)]  # fmt: skip
    node0 = NodeGroup.connect(setups[0], 10, limits)
    node1 = NodeGroup.connect(setups[1], 10, limits)
    forger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))
    try:
        assert node0.signed.signs and node1.signed.signs and node0.unsigned is None
        credential = forger.get("munge/1")
        assert credential.startswith(b"MUNGE:") and b'"key"' not in credential  # encrypted: no key in the store
        record = json.dumps({"verdict": "fail"})
        forger.set("results/1", json.dumps({"verdict": "pass", "forged": True}))  # before node 1's own
        forger.set("status/1", "0")
        sent = threading.Timer(0.8, lambda: node1.publish_results([record], 1))
        sent.start()
        gathered = node0.gather_results(lambda node: None)
        sent.join()
        assert gathered.records == {1: [record]} and gathered.statuses == {1: 1}  # node 1's own, the forged dropped
        assert any(line.startswith("results/1: its value does not verify") for line in node0.forged), node0.forged
    finally:
        node1.close()
        node0.close()


def test_a_munge_credential_of_another_job_or_node_is_not_taken(munged: Path) -> None:
    from conformance.nodes.munge import Munge

    munge = Munge.find(os.environ)
    assert munge is not None and munge.socket == str(munged)
    uid, payload = munge.decoded(munge.credential({"job": "4242", "node": 1}, os.getuid(), 60))
    assert (uid, payload) == (os.getuid(), {"job": "4242", "node": 1})
    replayed = munge.credential({"job": "4242"}, os.getuid(), 60)
    munge.decoded(replayed)
    with pytest.raises(MungeError, match="(?i)replayed"):
        munge.decoded(replayed)  # each credential is decoded once: one per node
    with pytest.raises(MungeError):
        munge.decoded("MUNGE:not-a-credential:")


def test_a_run_across_nodes_that_cannot_sign_is_refused_unless_asked_and_then_says_unsigned() -> None:
    """No token and no MUNGE: refused in one line saying how to make a token; --unsigned: UNSIGNED, loopback too."""
    from conformance.nodes.group import NodeGroup, NodeGroupError
    from conformance.nodes.liveness import GroupLimits

    limits = GroupLimits(progress=5, store=5)
    for address in ("192.0.2.7", "127.0.0.1"):  # loopback is no exception: any local user reaches the port
        with pytest.raises(NodeGroupError) as refused:
            NodeGroup.connect(NodeSetup(2, 0, address, 29500, "settings"), 10, limits)
        assert str(refused.value).startswith(
            "a run across 2 nodes cannot sign what its nodes exchange: no run token (CONFORMANCE_RUN_TOKEN, "
            "--run-token-file or --run-token), not under SLURM (no MUNGE); make a token with `python -m conformance "
            "token --file FILE`"
        )
        assert "\n" not in str(refused.value) and "or say --unsigned to run unsigned" in str(refused.value)
        asked = NodeGroup(NodeSetup(2, 1, address, 29500, "settings", unsigned=True), 10, limits, None, "not reached")
        assert asked.unsigned == "--unsigned: no run token (CONFORMANCE_RUN_TOKEN, --run-token-file or --run-token), " \
                                 "not under SLURM (no MUNGE)"  # fmt: skip
    signed = NodeGroup(NodeSetup(2, 1, "192.0.2.7", 29500, "settings", run_token="t"), 10, limits, None, "x")
    assert signed.unsigned is None


@contextmanager
def two_nodes_and_a_stranger(rendezvous: float) -> Iterator[tuple[Any, Any, Any, Any]]:
    """Two signed nodes of one run on loopback, and a client not of the run on node 0's store (and the limits)."""
    import datetime

    import torch.distributed as dist

    from conformance.nodes.group import NodeGroup
    from conformance.nodes.liveness import GroupLimits
    from conftest import free_port

    port, limits = free_port(), GroupLimits(progress=5, store=5)
    setups = [NodeSetup(2, rank, "127.0.0.1", port, "settings", identity="run token x", run_token="t")
              for rank in (0, 1)]  # fmt: skip
    node0 = NodeGroup.connect(setups[0], rendezvous, limits)
    node1 = NodeGroup.connect(setups[1], rendezvous, limits)
    stranger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))
    try:
        yield node0, node1, stranger, limits
    finally:
        node1.close()
        node0.close()


def test_a_raised_stranger_counter_costs_no_wait_and_a_removed_key_is_named_as_tampering() -> None:
    """Three unauthenticated calls once crashed node 0's end; deleting node 1's key made it 'never arrived'."""
    import time

    with two_nodes_and_a_stranger(3) as (node0, _, forger, limits):
        forger.add("stranger", 1_000_000)
        begun = time.monotonic()
        assert node0.strangers() == ([], 1_000_000)
        assert time.monotonic() - begun < limits.store  # reading a key that is not there would wait the store out
        start = node0.start(fingerprint(0), "run-1")  # node 1 beats, but its fingerprint never comes
        assert start.missing[1] == (
            "node 1 arrived (it beats) but its fingerprint/1 is not in the run's store after 3s: removed by a client "
            "not of this run (tampering), or node 1 is stuck before writing it"
        )


def test_keys_written_by_a_client_not_of_the_run_are_counted_and_named() -> None:
    """Keys cannot be listed: node 0's monitor counts what the store holds against what the run writes."""
    import time

    from conformance.nodes.group import KEYS_BASE, KEYS_PER_TEST

    with two_nodes_and_a_stranger(5) as (node0, node1, forger, _):
        tests = ["suites/test_collectives.py::test_all_reduce[all2-inherited]"]
        with concurrent.futures.ThreadPoolExecutor(1) as other:  # node 1 waits for node 0's comparison
            node1_sent = other.submit(node1.same_collection, tests)
            assert node0.same_collection(tests) == [] and node1_sent.result() == [] and not node1.lost
        bound = KEYS_BASE + KEYS_PER_TEST * len(tests) * 2
        deadline = time.monotonic() + 10  # the monitor's rounds, however busy the machine
        while node0.key_bound != bound and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node0.store_problems == () and node0.key_bound == bound
        for n in range(bound + 10):
            forger.set(f"junk/{n}", "x")
        deadline = time.monotonic() + 10
        while not node0.store_problems and time.monotonic() < deadline:
            time.sleep(0.1)
        [problem] = node0.store_problems
        assert problem.startswith("a client not of this run wrote keys to node 0's store: it held ")
        assert problem.endswith(f"keys, where this run writes at most {bound}")


def test_a_stranger_writing_megabytes_is_refused_at_the_bound_and_named_while_node_0_stays_as_it_is() -> None:
    """1,000 values of 1 MB once grew node 0's pytest from 210 MB to 1.17 GB: the store is now a process bounded."""
    import time

    from conformance.nodes.store_server import HEADROOM, data_bytes, run_bytes

    with two_nodes_and_a_stranger(5) as (node0, node1, forger, _):
        tests = [f"suites/test_collectives.py::test_all_reduce[{n}]" for n in range(100)]
        with concurrent.futures.ThreadPoolExecutor(1) as other:  # node 1 waits for node 0's comparison
            node1_sent = other.submit(node1.same_collection, tests)
            assert node0.same_collection(tests) == [] and node1_sent.result() == [] and not node1.lost
        server = node0.server
        assert server is not None and server.problem() is None
        ours, bound = run_bytes(100, 2), HEADROOM * run_bytes(100, 2)
        before = psutil.Process().memory_info().rss
        megabyte, written = b"x" * 2**20, 0
        with pytest.raises(RuntimeError):  # the server refuses the write past its bound, closing the connection
            for n in range(1000):
                forger.set(f"junk/{n}", megabyte)
                written += 2**20
        heap_free = 16 * 2**20  # room the server's heap held already when it started: not counted in its growth
        assert ours < written <= bound + heap_free  # refused past what the run writes, at the bound
        grown = (data_bytes(server.process.pid) or 0) - server.start_data
        assert grown <= bound and server.process.poll() is None  # still serving, within its bound
        assert psutil.Process().memory_info().rss - before < 64 * 2**20  # this process holds no value of it
        deadline = time.monotonic() + 10  # the monitor's rounds, however busy the machine
        while not node0.store_problems and time.monotonic() < deadline:
            time.sleep(0.1)
        [problem] = node0.store_problems
        assert re.fullmatch(
            rf"a client not of this run wrote to node 0's store: it grew by \d+ MiB, where this run writes at most "
            rf"{ours // 2**20} MiB \(it may grow by {bound // 2**20} MiB: writes past that are refused\)",
            problem,
        ), problem
        node1.store.set("after", "the flood")  # the run's own small writes still go through
        assert node0.store.get("after") == b"the flood"


def test_node_0s_store_server_ending_is_named_and_it_never_outlives_node_0() -> None:
    """The server is a child of node 0's pytest: its end during the run is a problem; node 0's death ends it."""
    import signal
    import subprocess
    import sys
    import time

    from conformance.nodes.store import host_store
    from conftest import free_port

    server = host_store(NodeSetup(2, 0, "127.0.0.1", free_port()))
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    assert server.problem() == "node 0's store server ended during the run (signal SIGKILL)"
    server.close()
    hosting = (
        "import sys; from conformance.nodes.layout import NodeSetup; from conformance.nodes.store import host_store\n"
        f"server = host_store(NodeSetup(2, 0, '127.0.0.1', {free_port()}))\n"
        "print(server.process.pid, flush=True); sys.stdin.read()"
    )
    node0 = subprocess.Popen([sys.executable, "-c", hosting], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert node0.stdout is not None
    pid = int(node0.stdout.readline())
    node0.kill()  # SIGKILL: no close, no atexit
    node0.wait()
    deadline = time.monotonic() + 30  # its stdin closed with node 0: it ends at once, however busy the machine
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"node 0's store server {pid} outlived node 0"
        time.sleep(0.1)
