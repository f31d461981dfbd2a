"""Which node of a multi-node run this pytest is, and whether the nodes agree before any NCCL call.

The node layout comes, from high to low priority, from the suite's own settings (``--nnodes``,
``--node-rank``, ``--master-addr``, ``--master-port`` and their ini / CONFORMANCE_* twins), from
SLURM (``SLURM_NNODES``, ``SLURM_NODEID``, the first host of ``SLURM_JOB_NODELIST``), from
torchrun (``GROUP_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: what torch's elastic
agent gives its workers), from an MPI launcher (Open MPI's ``OMPI_COMM_WORLD_*``, Hydra's ``PMI_*``:
one process per node, or all on this one), from Kubeflow's PyTorchJob (``PET_NNODES``/``PET_NODE_RANK``,
else ``WORLD_SIZE``/``RANK``), or from hand-set ``NNODES``/``NODE_RANK``.  One node is the default.
A launcher that started several processes on a node keeps one (local rank 0); the others step aside.

Under torchrun the run's store is torchrun's own (``TORCHELASTIC_USE_AGENT_STORE``: its agent
hosts it, every node is a client) or the one torchrun reserved for its workers, always under the
prefix ``conformance/<TORCHELASTIC_RUN_ID>/attempt<restart count>-nodes<node count>``, so the suite's
keys never meet torchrun's, nor a restarted attempt those of the attempt before.

Fingerprints: each node describes what must match across nodes (GPU count, NCCL, torch, the
suite's version) and what may differ (host, interfaces); :func:`compare_fingerprints` turns them
into the table a run shows instead of hanging in communicator setup.  A node's interfaces are read
with ``psutil.net_if_addrs()`` (``getifaddrs``): IPv4 and IPv6, names of any length.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import psutil

from conformance.common import values
from conformance.common.bounded_parse import json_value
from conformance.common.families import inherited_variables
from conformance.common.inputs import dataclass_from_json
from conformance.common.tables import align_columns
from conformance.discover.topology import Topology
from conformance.discover.versions import package_version, suite_version

DEFAULT_MASTER_PORT = 29500  # torchrun's default, for a run's one TCPStore on node 0
# Under SLURM without MASTER_PORT, the port comes from the job id, so two jobs on shared nodes do not
# meet on one port: 20000-31999, below Linux's ephemeral ports (32768 and up).
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 12000

# Fields that must be equal on every node, and fields that are shown but may differ.
MUST_MATCH = ("gpu_count", "nccl", "nccl_plugins", "torch", "suite")
MAY_DIFFER = ("hostname", "cuda_visible_devices", "driver", "cuda", "nccl_env", "interfaces")
Addresses = tuple[str, ...]  # an interface's IP addresses, IPv4 first


class NodeError(ValueError):
    """The node layout is inconsistent; the message names the values and where they came from."""


class LauncherError(NodeError):
    """What a launcher (SLURM, torchrun) put in the environment is unusable; the message names the variable."""


@dataclass(frozen=True)
class NodeSetup:
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    source: str = "default"  # where the layout came from
    store_prefix: str = ""  # every key of the run's store lives under it (a launcher's store is shared)
    identity: str = ""  # the launcher's name for this run, which every node must present ("": run by hand)
    launcher_hosts_store: bool = False  # the launcher serves the store at master_port: node 0 is a client too
    run_token: str | None = field(default=None, repr=False)  # --run-token: signs the run's values; never shown
    slurm_job: str | None = None  # SLURM's job id: without a token, MUNGE signs the run (nodes/munge.py)
    unsigned: bool = False  # --unsigned: a run that cannot sign may go on, saying UNSIGNED

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    def store_key(self, key: str) -> str:
        """``key`` as it is written in the store itself (``PrefixStore``'s spelling)."""
        return f"{self.store_prefix}/{key}" if self.store_prefix else key


def first_host(nodelist: str, variable: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a SLURM node list: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    head = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not head or not head.group(1):
        raise LauncherError(f"{variable}={nodelist!r} names no host")
    prefix, ranges = head.group(1), head.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


# Where SLURM lists the nodes, the step's own first.
NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
# Step ids of a job that are not srun's task steps: the batch script's and the interactive / extern ones.
SLURM_NOT_TASK_STEPS = frozenset({"batch", "extern", "interactive", "4294967294", "4294967295", "4294967293"})


def _int(value: str, name: str, minimum: int) -> int:
    try:
        return values.whole_number(value, minimum=minimum)
    except values.BadValue as exc:
        raise LauncherError(f"{name}: {exc}") from None


def not_a_step(environ: Mapping[str, str]) -> str | None:
    """Why a pytest inside a SLURM job of several nodes is not one of one-per-node (salloc, sbatch without srun)."""
    nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
    if "SLURM_JOB_ID" not in environ or nodes is None or _int(nodes, "SLURM_JOB_NUM_NODES", 1) < 2:
        return None
    step = _step_id(environ)
    if step is None or step in SLURM_NOT_TASK_STEPS:
        where = "outside any job step (salloc's shell, or an sbatch script without srun)"
    elif environ.get("SLURM_STEP_NUM_TASKS") == "1":
        where = "in a job step of one task (SLURM_STEP_NUM_TASKS=1)"
    else:
        return None
    return (
        f"this pytest runs in SLURM job {environ['SLURM_JOB_ID']} of {nodes} nodes, but {where}: start one pytest per "
        "node with `srun --ntasks-per-node=1 pytest suites/` (or say --nnodes 1 to test this node alone)"
    )


def _from_slurm(environ: Mapping[str, str]) -> NodeSetup | None:
    if "SLURM_NNODES" not in environ or "SLURM_NODEID" not in environ:
        return None
    if environ.get("SLURM_LOCALID", "0") != "0":
        raise LauncherError(
            f"SLURM started more than one task on this node (SLURM_LOCALID={environ['SLURM_LOCALID']}); "
            "the suite is one pytest per node: srun --ntasks-per-node=1"
        )
    # The step's own nodes: a step need not start on the job's first node (salloc -N3; srun -N2 -r1).
    listed = next((name for name in NODELISTS if environ.get(name)), None)
    job = environ.get("SLURM_JOB_ID")
    return NodeSetup(
        nnodes=_int(environ["SLURM_NNODES"], "SLURM_NNODES", 1),
        node_rank=_int(environ["SLURM_NODEID"], "SLURM_NODEID", 0),
        master_addr=first_host(environ[listed], listed) if listed else None,
        master_port=_master_port(environ) or (_job_port(job) if job else None),
        source="SLURM",
        identity=f"SLURM job {job} step {_step_id(environ) or '?'}" if job else "",
        slurm_job=job,
    )


def _step_id(environ: Mapping[str, str]) -> str | None:
    return environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))


def _master_port(environ: Mapping[str, str]) -> int | None:
    return _int(environ["MASTER_PORT"], "MASTER_PORT", 1) if "MASTER_PORT" in environ else None


def _job_port(job: str) -> int:
    return SLURM_PORT_BASE + _int(job.split("_")[0], "SLURM_JOB_ID", 0) % SLURM_PORT_SPAN


def _from_torchrun(environ: Mapping[str, str]) -> NodeSetup | None:
    """The layout torch's elastic agent gives its workers (torchrun); None when not started by it."""
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    nnodes = _int(environ.get("GROUP_WORLD_SIZE", "1"), "GROUP_WORLD_SIZE", 1)
    # Each attempt its own keys: torchrun restarts every worker after a failure with the next
    # TORCHELASTIC_RESTART_COUNT (torch 2.13, torch/distributed/elastic/agent/server/api.py and
    # local_elastic_agent.py), and a store that outlives an attempt still holds the last one's keys.
    # A restart for a change of membership keeps the count: the node count tells those rounds apart.
    attempt = _int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"), "TORCHELASTIC_RESTART_COUNT", 0)
    return NodeSetup(
        nnodes=nnodes,
        node_rank=_int(environ.get("GROUP_RANK", "0"), "GROUP_RANK", 0),
        master_addr=environ.get("MASTER_ADDR"),
        master_port=_master_port(environ),
        source="torchrun",
        store_prefix=f"conformance/{run_id}/attempt{attempt}-nodes{nnodes}",
        identity=f"torchrun run {run_id}",
        launcher_hosts_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
    )


@dataclass(frozen=True)
class ProcessLauncher:
    """A launcher that starts processes, several per node if asked, and says so in each one's environment."""

    name: str
    present: str  # the variable that says this launcher started the process
    size: str  # processes in all
    rank: str  # this process among them
    local_size: str  # processes on this node
    local_rank: str  # this process among them
    one_per_node: str  # how to start one process per node


TORCHRUN = ProcessLauncher(
    "torchrun", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK",
    "torchrun --nproc-per-node 1",
)  # fmt: skip
# docs.open-mpi.org, "Environment variables set for MPI applications" (v5.0.x; the same names in 4.1).
OPEN_MPI = ProcessLauncher(
    "Open MPI's mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun --map-by ppr:1:node",
)  # fmt: skip
# MPICH's and Intel MPI's Hydra (mpiexec.hydra): PMI_SIZE and PMI_RANK, and per node MPI_LOCALNRANKS and
# MPI_LOCALRANKID (MPICH src/pm/hydra, the proxy's environment for each process).
HYDRA = ProcessLauncher(
    "MPICH's mpiexec (Hydra)", "PMI_SIZE", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID",
    "mpiexec -ppn 1",
)  # fmt: skip
PROCESS_LAUNCHERS = (TORCHRUN, OPEN_MPI, HYDRA)


def extra_local_process(environ: Mapping[str, str]) -> str | None:
    """Why this process leaves its node to another (a launcher started several per node), or None."""
    for launcher in PROCESS_LAUNCHERS:
        local = environ.get(launcher.local_rank, "0")
        if launcher.present in environ and local != "0":
            return (
                f"{launcher.name} started {environ.get(launcher.local_size, '?')} processes on this node; the suite "
                f"is one pytest per node, so this one ({launcher.local_rank}={local}) leaves the node to "
                f"{launcher.local_rank} 0: use {launcher.one_per_node}"
            )
    return None


def _from_mpi(environ: Mapping[str, str]) -> NodeSetup | None:
    """The layout an MPI launcher gives: one node when every process is on this one, else one process per node."""
    launcher = next((m for m in (OPEN_MPI, HYDRA) if m.present in environ and m.rank in environ), None)
    if launcher is None:
        return None
    size = _int(environ[launcher.size], launcher.size, 1)
    rank = _int(environ[launcher.rank], launcher.rank, 0)
    if launcher.local_size not in environ:
        raise LauncherError(f"{launcher.name} set {launcher.size}={size} but not {launcher.local_size}: "
                            "cannot tell how many of its processes share this node")  # fmt: skip
    local = _int(environ[launcher.local_size], launcher.local_size, 1)
    seen = f"{launcher.size}={size}, {launcher.local_size}={local}"
    if local == size:  # every process on this node: one node (the others step aside)
        return NodeSetup(source=f"{launcher.name} ({seen}: one node)")
    if local > 1:
        raise LauncherError(
            f"{launcher.name} started {local} processes on this node and {size} in all ({seen}); the suite is one "
            f"pytest per node: {launcher.one_per_node}"
        )
    return NodeSetup(
        nnodes=size,
        node_rank=rank,
        master_addr=environ.get("MASTER_ADDR"),
        master_port=_master_port(environ),
        source=f"{launcher.name} ({seen})",
    )


def _from_kubeflow(environ: Mapping[str, str]) -> NodeSetup | None:
    """Kubeflow's PyTorchJob, one pod per node: its torchrun variables (PET_*) first, else WORLD_SIZE and RANK.

    The training operator gives each pod MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK, and with
    ``nprocPerNode`` the PET_NNODES / PET_NODE_RANK that torchrun reads as its defaults.
    """
    if "PET_NNODES" in environ:
        return NodeSetup(
            nnodes=_fixed_nnodes(environ["PET_NNODES"]),
            node_rank=_int(environ.get("PET_NODE_RANK", "0"), "PET_NODE_RANK", 0),
            master_addr=environ.get("PET_MASTER_ADDR") or environ.get("MASTER_ADDR"),
            master_port=_int(environ["PET_MASTER_PORT"], "PET_MASTER_PORT", 1)
            if "PET_MASTER_PORT" in environ
            else _master_port(environ),
            source="Kubeflow PyTorchJob (PET_NNODES, PET_NODE_RANK)",
        )
    if "WORLD_SIZE" in environ and "RANK" in environ:
        return NodeSetup(
            nnodes=_int(environ["WORLD_SIZE"], "WORLD_SIZE", 1),
            node_rank=_int(environ["RANK"], "RANK", 0),
            master_addr=environ.get("MASTER_ADDR"),
            master_port=_master_port(environ),
            source="WORLD_SIZE/RANK (Kubeflow PyTorchJob: one pytest per pod)",
        )
    return None


def _fixed_nnodes(value: str) -> int:
    """PET_NNODES: ``N`` or ``N:N``; an elastic range cannot say how many nodes this run has."""
    low, _, high = value.partition(":")
    if high and high != low:
        raise LauncherError(f"PET_NNODES={value!r} is an elastic range; the suite needs a fixed node count")
    return _int(low, "PET_NNODES", 1)


def _from_node_variables(environ: Mapping[str, str]) -> NodeSetup | None:
    if "NNODES" not in environ and "NODE_RANK" not in environ:
        return None
    return NodeSetup(
        nnodes=_int(environ.get("NNODES", "1"), "NNODES", 1),
        node_rank=_int(environ.get("NODE_RANK", "0"), "NODE_RANK", 0),
        master_addr=environ.get("MASTER_ADDR"),
        master_port=_master_port(environ),
        source="NNODES/NODE_RANK variables",
    )


def node_setup(
    explicit: Mapping[str, Any], environ: Mapping[str, str], run_token: str | None = None, unsigned: bool = False
) -> NodeSetup:
    """The layout: explicit settings (only those given) over SLURM over torchrun over NNODES/NODE_RANK.

    ``run_token`` (``--run-token``) signs the run and tells it from another on the same port (it is never
    shown, nor anything derived from it); ``unsigned`` (``--unsigned``) lets a run that cannot sign go on.
    """
    outside = not_a_step(environ) if explicit.get("nnodes") is None else None
    if outside:
        raise LauncherError(outside)
    found = (
        _from_slurm(environ)
        or _from_torchrun(environ)
        or _from_mpi(environ)
        or _from_kubeflow(environ)
        or _from_node_variables(environ)
        or NodeSetup()
    )
    values = {**asdict(found), **{k: v for k, v in explicit.items() if v is not None}}
    if any(v is not None for v in explicit.values()):
        values["source"] = "settings" if found.source == "default" else f"settings over {found.source}"
    if run_token:
        values["run_token"] = run_token
    values["unsigned"] = unsigned
    setup = NodeSetup(**values)
    if setup.node_rank >= setup.nnodes:
        raise NodeError(f"node rank {setup.node_rank} is not below the node count {setup.nnodes} ({setup.source})")
    if setup.multi_node:
        unspecified = _ip(setup.master_addr or "")
        if unspecified is not None and unspecified.is_unspecified:
            raise NodeError(
                f"master address {setup.master_addr!r} ({setup.source}) means every interface, not node 0's address: "
                "the other nodes cannot reach it, and node 0's store would listen on every network; give node 0's "
                "own host name or address"
            )
        if not setup.master_addr:
            raise NodeError(
                f"{setup.nnodes} nodes ({setup.source}) need the first node's address: --master-addr, or MASTER_ADDR "
                "in every node's environment (mpirun -x MASTER_ADDR=<node 0's host>)"
            )
        if setup.master_port is None:
            setup = NodeSetup(**{**asdict(setup), "master_port": DEFAULT_MASTER_PORT})
        if not 0 < (setup.master_port or 0) < 65536:
            raise NodeError(f"master port {setup.master_port} is not a TCP port ({setup.source})")
    return setup


@dataclass(frozen=True)
class Fingerprint:
    node_rank: int
    hostname: str
    gpu_count: int
    gpu_uuids: tuple[str, ...]
    cuda_visible_devices: str | None
    driver: str | None
    cuda: str | None
    nccl: str | None
    torch: str | None
    suite: str | None
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    interfaces: Mapping[str, Addresses] = field(default_factory=dict)  # name -> addresses (network_interfaces)
    nccl_plugins: Mapping[str, str] = field(default_factory=dict)  # net, tuner -> what NCCL loads (nccl_plugins.py)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Fingerprint:
        """A node's fingerprint from the run's store; ValueError naming what is wrong with it."""
        data = json_value(text)
        if isinstance(data, dict) and isinstance(data.get("interfaces"), dict):
            # JSON has lists, not tuples; a node of an older suite sends one IPv4 address as a string
            data["interfaces"] = {n: [a] if isinstance(a, str) else a for n, a in data["interfaces"].items()}
        try:
            found = dataclass_from_json(cls, data, "the fingerprint", ValueError)
        except TypeError as exc:  # a field missing
            raise ValueError(f"the fingerprint: {exc}") from None
        interfaces = {n: tuple(a) for n, a in found.interfaces.items()}
        return replace(found, gpu_uuids=tuple(found.gpu_uuids or ()), interfaces=interfaces)

    def value(self, name: str) -> str:
        value = getattr(self, name)
        if isinstance(value, Mapping):
            return " ".join(f"{k}={_shown(v)}" for k, v in sorted(value.items())) or "-"
        return "-" if value is None else (str(value) or "(empty)")


def _shown(value: str | Addresses) -> str:
    return value if isinstance(value, str) else ",".join(value)


@dataclass(frozen=True)
class FingerprintCheck:
    fatal: tuple[str, ...]  # fields that differ and must not
    differing: tuple[str, ...]  # fields that differ and may
    table: tuple[str, ...]  # a row per field, a column per node

    @property
    def ok(self) -> bool:
        return not self.fatal


def compare_fingerprints(prints: Sequence[Fingerprint]) -> FingerprintCheck:
    """Which fields differ across nodes; fatal where they must match."""
    ordered = sorted(prints, key=lambda p: p.node_rank)

    def differs(name: str) -> bool:
        return len({p.value(name) for p in ordered}) > 1

    fatal = tuple(name for name in MUST_MATCH if differs(name))
    differing = tuple(name for name in MAY_DIFFER if differs(name))
    header = ("field", *(f"node {p.node_rank}" for p in ordered), "")
    rows = [header]
    for name in (*MUST_MATCH, *MAY_DIFFER):
        mark = "MUST MATCH" if name in fatal else ("differs (allowed)" if name in differing else "")
        rows.append((name, *(p.value(name) for p in ordered), mark))
    return FingerprintCheck(fatal, differing, tuple(align_columns(rows)))


class InterfaceAddress(Protocol):
    """One address of ``psutil.net_if_addrs()`` (its ``snicaddr``), as far as it is read here."""

    @property
    def family(self) -> int: ...

    @property
    def address(self) -> str: ...


def interface_addresses(table: Mapping[str, Sequence[InterfaceAddress]]) -> dict[str, Addresses]:
    """Name -> IPv4 addresses, then IPv6 ones, from a ``psutil.net_if_addrs()`` table.

    Link-local IPv6 addresses (fe80::/10) are left out: the kernel gives one to every interface
    with IPv6 up, and it reaches no other node without a scope.  An interface with no address
    left (only a MAC, or only a link-local IPv6 one) is left out, as a link no socket can use.
    """
    found = {}
    for name, entries in table.items():
        ipv4 = [e.address for e in entries if e.family == socket.AF_INET]
        ipv6 = [e.address for e in entries if e.family == socket.AF_INET6 and not _link_local(e.address)]
        if ipv4 or ipv6:
            found[name] = (*ipv4, *ipv6)
    return found


def network_interfaces() -> dict[str, Addresses]:
    """The interfaces of this host with an IPv4 or a non-link-local IPv6 address: name -> its addresses."""
    return interface_addresses(psutil.net_if_addrs())


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0])  # psutil writes a scope as fe80::1%eth0
    except ValueError:
        return None


def _link_local(address: str) -> bool:
    ip = _ip(address)
    return ip is not None and ip.version == 6 and ip.is_link_local


def is_loopback(addresses: Addresses) -> bool:
    """The interface with these addresses is the loopback one (127.0.0.0/8, ::1)."""
    return any(ip is not None and ip.is_loopback for ip in map(_ip, addresses))


def shared_interfaces(prints: Sequence[Fingerprint]) -> list[str]:
    """Interfaces every node has by name, loopback left out (it never reaches another node)."""
    if not prints:
        return []
    names = set.intersection(*(set(p.interfaces) for p in prints))
    return sorted(n for n in names if not any(is_loopback(p.interfaces[n]) for p in prints))


def local_fingerprint(
    node_rank: int, topology: Topology, nccl: str | None, plugins: Mapping[str, str] | None = None
) -> Fingerprint:
    """What this node tells the others before any collective (``MUST_MATCH`` must agree).

    ``nccl``: the NCCL the run tests (the library torch loads, its suffix kept; a simulated machine's
    own), not pip's metadata, which a source build or LD_PRELOAD makes wrong; ``plugins``: the net and
    tuner plugins NCCL would load (``discover/nccl_plugins.py``).
    """
    return Fingerprint(
        node_rank=node_rank,
        hostname=socket.gethostname(),
        gpu_count=len(topology.devices),
        gpu_uuids=tuple(d.uuid or d.name for d in topology.devices),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        driver=topology.driver,
        cuda=topology.cuda_driver,
        nccl=nccl,
        torch=package_version("torch"),
        suite=suite_version(),
        nccl_env={k: v for k, v in inherited_variables().items() if k.startswith("NCCL_")},
        interfaces=network_interfaces(),
        nccl_plugins=dict(plugins or {}),
    )
