"""The plan: device sets, the ladder of environment rungs, and the stable test ids built from them.

A rung is a named environment combination, applied on top of the caller's environment (``clean``
removes the caller's NCCL variables instead).  The ladder runs from least performance lost to
most; ``--env-rung`` and ``--env-rungs-file`` add rungs of the user's after the built-in ones.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import NotParsed, toml_table
from conformance.common.families import NCCL_FAMILIES, RUNG_FAMILIES
from conformance.common.inputs import read_user_file
from conformance.discover.topology import CPU_LINK, Device, Topology
from conformance.settings import ALL_NODE_PAIRS_UP_TO

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RungError(ValueError):
    """A user rung is unusable; the message names it and where it came from."""


@dataclass(frozen=True)
class Rung:
    """A named environment combination; ``unset_families`` are removed from the caller's variables."""

    name: str
    set: Mapping[str, str] = field(default_factory=dict)
    unset_families: tuple[str, ...] = ()
    description: str = ""
    across_nodes: bool = False  # matters only between nodes (network rungs): cross-node cases only

    def unset(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(sorted(k for k in environ if k.startswith(self.unset_families) and k not in self.set))

    @property
    def sets_beyond_nccl(self) -> bool:
        """Sets a variable that gloo or torch read too (GLOO_*, TORCH_*, CUDA_*), not only NCCL's."""
        return any(not name.startswith(NCCL_FAMILIES) for name in self.set)

    def effective(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The NCCL-relevant environment a rank sees under this rung."""
        removed = set(self.unset(environ))
        env = {k: v for k, v in environ.items() if k.startswith(RUNG_FAMILIES) and k not in removed}
        env.update(self.set)
        return env


INHERITED = Rung("inherited", description="the caller's environment as it is")
BUILTIN_LADDER: tuple[Rung, ...] = (
    INHERITED,
    Rung("clean", unset_families=NCCL_FAMILIES, description="every NCCL_/TORCH_NCCL_ variable removed"),
    # Narrowest first: NVLS alone before all of cuMem, which NCCL's NVLS failures name as the fix
    # ("Disable NVLS (NCCL_NVLS_ENABLE=0)", src/transport/nvls.cc, v2.30.7-1) and cuMem off also turns
    # off cuMem P2P and cuMem host memory for SHM (src/transport/shm.cc, v2.30.7-1).
    Rung("nvls_off", {"NCCL_NVLS_ENABLE": "0"}, description="NVLink SHARP off"),
    # cuMem host memory for SHM alone before all of cuMem: shm.cc uses it only when both NCCL_CUMEM_ENABLE
    # and NCCL_CUMEM_HOST_ENABLE allow it (src/transport/shm.cc, v2.24.3-1 .. v2.30.7-1); it fails with
    # "Cuda failure 217 'peer access is not supported'" on PCIe GPUs without P2P (NVIDIA/nccl#1838).
    Rung("cumem_host_off", {"NCCL_CUMEM_HOST_ENABLE": "0"}, description="cuMem host memory for SHM off"),
    Rung("cumem_off", {"NCCL_CUMEM_ENABLE": "0"}, description="cuMem allocations off"),
    Rung("p2p_level_nvl", {"NCCL_P2P_LEVEL": "NVL"}, description="P2P over NVLink only, not PCIe"),
    Rung("p2p_off", {"NCCL_P2P_DISABLE": "1"}, description="no P2P: SHM between GPUs"),
    Rung("shm_off", {"NCCL_SHM_DISABLE": "1"}, description="no SHM transport"),
    Rung(
        "p2p_shm_off",
        {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
        description="network transport (IB loopback where present)",
    ),
    Rung("ib_off", {"NCCL_IB_DISABLE": "1"}, description="no InfiniBand"),
    Rung(
        "net_socket",
        {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
        description="sockets only",
    ),
)


NET_LINK = "NET"  # the link class between two nodes
GDR_OFF = Rung(
    "gdr_off", {"NCCL_NET_GDR_LEVEL": "LOC"}, description="no GPUDirect RDMA: NIC traffic staged in host memory",
    across_nodes=True,
)  # fmt: skip


def interface_rung_name(interface: str) -> str:
    return "socket_ifname_" + re.sub(r"[^A-Za-z0-9_]", "_", interface)


def node_rungs(shared_interfaces: Sequence[str]) -> tuple[Rung, ...]:
    """Rungs for cross-node cases: GPUDirect RDMA off, then one per network interface every node has."""
    per_interface = tuple(
        Rung(
            interface_rung_name(name),
            {"NCCL_SOCKET_IFNAME": f"={name}", "GLOO_SOCKET_IFNAME": name},
            description=f"bootstrap and socket traffic on {name} only",
            across_nodes=True,
        )
        for name in sorted(shared_interfaces)
    )
    return (GDR_OFF, *per_interface)


def _check_variable(name: str, value: Any, where: str) -> None:
    if not name.startswith(RUNG_FAMILIES) or not IDENTIFIER.fullmatch(name):
        families = ", ".join(RUNG_FAMILIES)
        raise RungError(f"{where}: variable {name!r} is not in the {families} families")
    if not isinstance(value, str) or "\n" in value or "\r" in value or "\0" in value:
        raise RungError(f"{where}: value {value!r} of {name} must be a string without newlines")


def make_rung(name: str, env: Mapping[str, Any], where: str) -> Rung:
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
        raise RungError(f"{where}: rung name {name!r} is not a valid identifier")
    if not env:
        raise RungError(f"{where}: rung {name!r} sets no variable")
    for variable, value in env.items():
        _check_variable(variable, value, where)
    return Rung(name, dict(env), description="from the user")


def parse_rung_spec(spec: str, where: str) -> Rung:
    """``NAME:VAR=VALUE,VAR=VALUE`` (as given to ``--env-rung`` or in the ini list)."""
    name, sep, assignments = spec.strip().partition(":")
    if not sep:
        raise RungError(f"{where}: {spec!r} is not NAME:VAR=VALUE[,VAR=VALUE...]")
    env: dict[str, str] = {}
    for assignment in assignments.split(","):
        variable, eq, value = assignment.partition("=")
        if not eq:
            raise RungError(f"{where}: {assignment!r} in {spec!r} is not VAR=VALUE")
        if variable.strip() in env:
            raise RungError(f"{where}: {variable.strip()} is set twice in {spec!r}; a rung sets each variable once")
        env[variable.strip()] = value.strip()
    return make_rung(name.strip(), env, where)


def load_rungs_file(path: Path, where: str) -> list[Rung]:
    """``[[rung]]`` tables with ``name`` and an ``env`` table of strings."""
    text = read_user_file(path, "rungs file", where, RungError)
    try:
        data = toml_table(text)
    except NotParsed as exc:
        raise RungError(f"{where}: rungs file {str(path)!r} is {exc}") from None
    tables = data.get("rung")
    if set(data) != {"rung"} or not isinstance(tables, list):
        raise RungError(f"{where}: rungs file {str(path)!r} must hold only [[rung]] tables")
    rungs = []
    for i, table in enumerate(tables, start=1):
        place = f"{path} rung {i}"
        if not isinstance(table, dict) or set(table) - {"name", "env"} or not isinstance(table.get("env"), dict):
            raise RungError(f'{place}: a rung takes name = "..." and env = {{ VAR = "value" }}')
        rungs.append(make_rung(table.get("name", ""), table["env"], place))
    return rungs


def build_ladder(user_rungs: Sequence[tuple[Rung, str]], across_nodes: Sequence[Rung] = ()) -> tuple[Rung, ...]:
    """The built-in ladder, the cross-node rungs of a multi-node run, then the user's; names are unique."""
    ladder = [*BUILTIN_LADDER, *across_nodes]
    seen = {r.name for r in ladder}
    for rung, where in user_rungs:
        if rung.name in seen:
            raise RungError(f"{where}: rung name {rung.name!r} is already taken")
        seen.add(rung.name)
        ladder.append(rung)
    return tuple(ladder)


# Every kind of device set the plan makes (DeviceSet.kind): what a scenario rule's ``sets`` may name.
SET_KINDS = (
    "all", "single", "pair", "last_half", "every_other", "reversed", "last_half_all_visible", "across_nodes",
    "node_pair",
)  # fmt: skip


@dataclass(frozen=True)
class DeviceSet:
    """Devices for one case.

    ``kind``: all, single, pair or a subset name; ``isolate``: the ranks see only these devices
    (CUDA_VISIBLE_DEVICES), as a job launched on a subset of the machine does.  Across nodes
    (``nodes`` names them): ``across_nodes`` (every device of every node) or ``node_pair`` (the
    first device of each of two nodes); ``devices`` are then this node's part.
    """

    devices: tuple[Device, ...]
    link: str | None
    rung: Rung = INHERITED
    kind: str = "all"
    isolate: bool = False
    links: tuple[str, ...] = ()  # every link class between the set's devices
    nodes: tuple[int, ...] = ()  # node ranks taking part, for sets across nodes

    @property
    def base_id(self) -> str:
        """The id without the rung: what the ladder is climbed for."""
        if self.kind == "across_nodes":
            return f"nodes{len(self.nodes)}x{len(self.devices)}"
        if self.kind == "node_pair":
            return "-".join(f"node{n}" for n in self.nodes)
        if self.kind == "node_recheck":
            return f"recheck-node{self.nodes[0]}"
        if self.kind == "all":
            parts = [f"all{len(self.devices)}"]
        elif self.kind in ("single", "pair"):
            parts = [d.name for d in self.devices]
        else:
            parts = [self.kind, *(d.name for d in self.devices)]
        if self.link and self.link != CPU_LINK and self.kind == "pair":
            parts.append(self.link)
        return "-".join(parts)

    @property
    def id(self) -> str:
        return f"{self.base_id}-{self.rung.name}"

    def with_rung(self, rung: Rung) -> DeviceSet:
        return replace(self, rung=rung)


def _links_between(topology: Topology, devices: Sequence[Device]) -> tuple[str, ...]:
    return tuple(sorted({topology.link(a, b) for i, a in enumerate(devices) for b in devices[i + 1 :]}))


def all_devices(topology: Topology) -> list[DeviceSet]:
    return [DeviceSet(topology.devices, "all", links=_links_between(topology, topology.devices))]


def each_device(topology: Topology) -> list[DeviceSet]:
    return [DeviceSet((d,), None, kind="single") for d in topology.devices]


def in_rounds(pairs: Sequence[tuple[Device, Device]]) -> list[tuple[Device, Device]]:
    """The pairs in rounds of disjoint pairs (n devices: n-1 rounds of n/2), each round from the first pair left.

    Consecutive pairs then share no device, so a round's cases run side by side (``side_by_side.py``).
    """
    left, ordered = list(pairs), []
    while left:
        used: set[str] = set()
        for pair in list(left):
            if not used & {pair[0].name, pair[1].name}:
                used |= {pair[0].name, pair[1].name}
                ordered.append(pair)
                left.remove(pair)
    return ordered


def each_pair(topology: Topology) -> list[DeviceSet]:
    """Every pair, class by class (in the order classes first appear), each class in rounds of disjoint pairs.

    A class's pairs then run side by side: when a class hangs, its pairs wait out their deadline or
    their confirmation together, not round after round among other classes' pairs.
    """
    by_class: dict[str, list[tuple[Device, Device]]] = {}
    for a, b in topology.pairs():
        by_class.setdefault(topology.link(a, b), []).append((a, b))
    return [
        DeviceSet((a, b), link, kind="pair", links=(link,))
        for link, pairs in by_class.items()
        for a, b in in_rounds(pairs)
    ]


# Barrier device sets whose ranks see every GPU but use others than torch's guess for them.
MISMATCHED_BARRIER_SETS = ("reversed", "last_half_all_visible")


def barrier_sets(topology: Topology) -> list[DeviceSet]:
    """All devices; subsets a job may be given; and sets where torch's barrier guess is wrong.

    ``last_half`` and ``every_other`` are isolated (CUDA_VISIBLE_DEVICES lists only them, so rank k
    sees its GPU as cuda:k and torch's guess is right).  ``reversed`` (rank k on the k-th GPU from
    the end) and ``last_half_all_visible`` (a launcher hands the last half to the ranks, every GPU
    visible) are not: a barrier without a device runs on another rank's GPU (seed b).  Those two
    exist only on GPU machines (real or simulated).
    """
    devices = topology.devices
    sets = all_devices(topology)
    for name, subset in {"last_half": devices[len(devices) // 2 :], "every_other": devices[1::2]}.items():
        if len(subset) >= 2 and subset != devices:
            sets.append(DeviceSet(subset, "all", kind=name, isolate=True, links=_links_between(topology, subset)))
    shared = {"reversed": devices[::-1], "last_half_all_visible": devices[len(devices) // 2 :]}
    for name, subset in shared.items():
        if len(subset) >= 2 and topology.kind == "gpu":  # CPU ranks have no device to guess
            sets.append(DeviceSet(subset, "all", kind=name, links=_links_between(topology, subset)))
    return sets


@dataclass(frozen=True)
class NodePairing:
    """Which pairs of nodes a run tests; the same on every node (``seed``: the run id they agreed on).

    ``all``: every pair, in rounds of disjoint pairs.  ``quick``: one random round of disjoint
    pairs, then a re-check of every node not known good (its pair failed, or it sat out an odd
    round) with a node whose pair passed, so a bad node is named in two rounds, not N-1.
    """

    nnodes: int = 1
    mode: str = "all"
    seed: str = ""

    @classmethod
    def of(cls, nnodes: int, mode: str, seed: str) -> NodePairing:
        if mode == "auto":
            mode = "all" if nnodes <= ALL_NODE_PAIRS_UP_TO else "quick"
        return cls(nnodes, mode, seed)

    @property
    def rechecks(self) -> bool:
        return self.mode == "quick"

    def first_pass(self) -> list[tuple[int, int]]:
        """The pairs of the first pass, round after round."""
        rounds = node_rounds(self.nnodes) if self.mode == "all" else [random_pairing(self.nnodes, self.seed)]
        return [pair for pairs in rounds for pair in pairs]


def across_nodes(topology: Topology, pairing: NodePairing) -> list[DeviceSet]:
    nodes = tuple(range(pairing.nnodes))
    return [DeviceSet(topology.devices, "all", kind="across_nodes", links=(NET_LINK,), nodes=nodes)]


def node_pairs(topology: Topology, pairing: NodePairing) -> list[DeviceSet]:
    """Pairs of nodes, one rank on each (this node's first device): the first pass, then the re-checks.

    Every node runs the cases in this order and skips those it takes no part in, so the pairs of a
    round run at once, each on its own two nodes.  A re-check (``node_recheck``, one per node) is
    a place held: which node it pairs with is known only once the first pass has run.
    """
    device, net = topology.devices[:1], (NET_LINK,)
    first = [DeviceSet(device, NET_LINK, kind="node_pair", links=net, nodes=pair) for pair in pairing.first_pass()]
    if not pairing.rechecks:
        return first
    return first + [
        DeviceSet(device, NET_LINK, kind="node_recheck", links=net, nodes=(n,)) for n in range(pairing.nnodes)
    ]


def as_node_pair(placeholder: DeviceSet, pair: tuple[int, int]) -> DeviceSet:
    """A re-check's place filled: the node pair ``pair``, a node pair like any other."""
    return replace(placeholder, kind="node_pair", nodes=tuple(sorted(pair)))


def random_pairing(nnodes: int, seed: str) -> list[tuple[int, int]]:
    """One round of disjoint pairs in an order drawn from ``seed`` (an odd count leaves one node out)."""
    order = list(range(nnodes))
    random.Random(seed).shuffle(order)
    return sorted((min(a, b), max(a, b)) for a, b in zip(order[0::2], order[1::2], strict=False))


def recheck_partners(passed: Mapping[tuple[int, int], bool], nnodes: int) -> dict[int, int | None]:
    """Each node not known good, with the node known good it is re-checked with (None: there is none).

    A node is known good when a pair of it passed.  Partners are dealt in turn, so with as many good
    nodes as suspects the re-checks are disjoint pairs: one round.
    """
    good = sorted({node for pair, ok in passed.items() if ok for node in pair})
    suspects = [node for node in range(nnodes) if node not in good]
    return {node: good[i % len(good)] if good else None for i, node in enumerate(suspects)}


def node_rounds(nnodes: int) -> list[list[tuple[int, int]]]:
    """Every pair of nodes once, in rounds of disjoint pairs: the circle method (N-1 rounds; N rounds if N is odd).

    Node 0 stays put while the others turn one place each round; an odd count gets a resting seat.
    """
    seats: list[int | None] = [*range(nnodes), *([None] if nnodes % 2 else [])]
    rounds = []
    for _ in range(len(seats) - 1):
        half = len(seats) // 2
        facing = zip(seats[:half], reversed(seats[half:]), strict=True)
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in facing if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


DEVICE_SET_FIXTURES = {
    "device_set": all_devices,
    "single_device": each_device,
    "device_pair": each_pair,
    "barrier_device_set": barrier_sets,
}
NODE_SET_FIXTURES = {"node_device_set": across_nodes, "node_pair": node_pairs}
