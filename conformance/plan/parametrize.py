"""The plan of a run: which device sets and rungs each test is parametrised over, in what order.

Parametrisation comes from sorted, deterministic data (the topology and the ladder), so every
xdist worker collects the same items.  Items are then ordered rung by rung, class leaders before
their followers, which is what lets the adaptive ladder (``ladder.py``) wait only on items that
come earlier.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest

from conformance.discover.topology import Topology
from conformance.plan.ladder import Step
from conformance.plan.matrix import (
    DEVICE_SET_FIXTURES,
    INHERITED,
    NODE_SET_FIXTURES,
    DeviceSet,
    NodePairing,
    Rung,
    each_pair,
)
from conformance.plan.transport import PairPath, pair_paths

# A test that uses no NCCL (a peer copy is CUDA's own): no NCCL variable can change it, so it runs once,
# on inherited, and the ladder of its class never waits on it.
NO_NCCL = "no_nccl"


class Plan:
    def __init__(
        self,
        topology: Topology,
        ladder: Sequence[Rung],
        mode: str,
        fallbacks_matter: bool = True,
        pairing: NodePairing | None = None,
    ) -> None:
        self.topology = topology
        self.pairing = pairing or NodePairing()
        self.ladder = tuple(ladder)
        self.mode = mode
        self.fallbacks_matter = fallbacks_matter  # False: gloo, not simulated (no NCCL variable is read)
        self.rung_index = {r.name: i for i, r in enumerate(self.ladder)}
        self.selected: set[tuple[str, int]] | None = None  # (ladder key, rung index) of the items that run
        self.leaders: dict[str, str] = {}  # link class -> base id of its first pair
        for pair in each_pair(topology):
            self.leaders.setdefault(pair.link or "?", pair.base_id)

    def on_fallback_rung(self, nodeid: str) -> bool:
        """The test runs a device set on a rung after the first: its id's parameters name that rung (``DeviceSet.id``).

        Read from the id alone, so xdist's controller, which collects nothing, counts as a plain run does.
        """
        params = nodeid[nodeid.rfind("[") + 1 : -1] if nodeid.endswith("]") else ""
        return any(self.rung_index.get(part, 0) > 0 for part in params.split("-"))

    @property
    def rungs(self) -> tuple[Rung, ...]:
        """Every rung a case may climb (those that matter only across nodes included)."""
        if self.mode == "inherited":
            return (INHERITED,)
        if self.mode == "adaptive" and not self.fallbacks_matter:
            return (INHERITED, *(r for r in self.ladder if r.sets_beyond_nccl))
        return self.ladder

    @property
    def local_rungs(self) -> tuple[Rung, ...]:
        return tuple(r for r in self.rungs if not r.across_nodes)

    def not_applicable(self, fixture: str) -> str | None:
        """Why multi-device sets cannot run on this machine (one GPU, MIG), if they cannot."""
        if fixture == "single_device":
            return None
        devices = self.topology.devices
        if len(devices) < 2:
            return f"needs at least 2 devices; this machine has {len(devices)}: {', '.join(d.name for d in devices)}"
        return self.untestable

    @property
    def untestable(self) -> str | None:
        """Why this machine's GPUs, though several, cannot be tested together (MIG); None when they can.

        MIG User Guide: "NCCL is currently not supported with MIG"; no P2P between MIG instances of
        different GPUs, and a CUDA process enumerates one MIG device only.
        """
        mig = [d.name for d in self.topology.devices if d.mig]
        if not mig:
            return None
        return (
            f"MIG is enabled on {', '.join(mig)}: NCCL does not run across MIG instances (NVIDIA's MIG User Guide); "
            "to test them, disable MIG (`nvidia-smi -i <gpu> -mig 0`, then reset the GPU)"
        )

    def not_across_nodes(self) -> str | None:
        if self.pairing.nnodes > 1:
            return None
        return (
            "a one-node run: cross-node cases need --nnodes 2 or more with --node-rank and --master-addr "
            "(or SLURM / torchrun variables), one pytest per node"
        )

    def parametrize(self, metafunc: pytest.Metafunc) -> None:
        rungs = (INHERITED,) if metafunc.definition.get_closest_marker(NO_NCCL) else self.local_rungs
        for fixture, plan in DEVICE_SET_FIXTURES.items():
            if fixture in metafunc.fixturenames:
                sets = [s.with_rung(r) for s in plan(self.topology) for r in rungs]
                self._parametrize(metafunc, fixture, self.not_applicable(fixture), sets)
        for fixture, node_plan in NODE_SET_FIXTURES.items():
            if fixture in metafunc.fixturenames:
                sets = [s.with_rung(r) for s in node_plan(self.topology, self.pairing) for r in self.rungs]
                self._parametrize(metafunc, fixture, self.not_across_nodes(), sets)

    @staticmethod
    def _parametrize(metafunc: pytest.Metafunc, fixture: str, skip_reason: str | None, sets: list[DeviceSet]) -> None:
        if skip_reason:
            skipped = pytest.param(None, marks=pytest.mark.skip(reason=skip_reason))
            metafunc.parametrize(fixture, [skipped], ids=["none"])
        else:
            metafunc.parametrize(fixture, sets, ids=[s.id for s in sets])

    def step(self, item: pytest.Item, device_set: DeviceSet) -> Step:
        """The item's place on the ladder: its id with the device set's rung taken out."""
        callspec = getattr(item, "callspec", None)
        ident = callspec.id if callspec is not None else device_set.id
        if device_set.id not in ident:
            ident = device_set.id  # a device set the test made itself
        name = getattr(item, "originalname", item.name)
        leader = self.leaders.get(device_set.link or "?") if device_set.kind == "pair" else None
        follows = leader is not None and leader != device_set.base_id
        return Step(
            key=f"{name}[{ident.replace(device_set.id, device_set.base_id)}]",
            rung_index=self.rung_index.get(device_set.rung.name, 0),
            leader_key=f"{name}[{ident.replace(device_set.id, leader or '')}]" if follows else None,
            link=device_set.link,
            devices=len(device_set.devices),
            paths=self.paths(device_set),
        )

    def paths(self, device_set: DeviceSet) -> tuple[PairPath, ...]:
        """Every pair of the set as NCCL reads it; across nodes, the link classes only (NET: no rule of NCCL's)."""
        if device_set.nodes:
            return tuple(PairPath(link) for link in device_set.links)
        return pair_paths(self.topology, device_set.devices)

    def worker_scope(self, nodeid: str) -> str:
        """What one xdist worker runs together: every rung of one device set (the test id less its rung).

        So a worker decides a device set's ladder from its own earlier items and never waits for
        another worker's; the collectives over one device set also land together and share a group.
        """
        _, bracket, ident = nodeid.partition("[")
        if not bracket:
            return nodeid
        ident = ident.removesuffix("]")
        names = "|".join(re.escape(r.name) for r in sorted(self.rungs, key=lambda r: -len(r.name)))
        return re.sub(rf"-(?:{names})(?=-|$)", "", ident, count=1)

    def item_step(self, item: pytest.Item) -> Step | None:
        device_set = device_set_of(item, (*DEVICE_SET_FIXTURES, *NODE_SET_FIXTURES))
        return self.step(item, device_set) if device_set is not None else None

    def order(self, items: list[pytest.Item], step_of: Callable[[pytest.Item], Step | None] | None = None) -> None:
        """Rung by rung; otherwise collection order (a stable sort).

        Pairs are collected class by class, each class's leader first (``matrix.each_pair``), so on
        every rung a leader comes before its followers, and a class's pairs come together.

        Also remembers which rungs will run at all (after -k and other deselection), so that a
        decision never waits for an item that is not in this run.
        """
        steps = {item.nodeid: (step_of or self.item_step)(item) for item in items}
        items.sort(key=lambda item: step.rung_index if (step := steps[item.nodeid]) else 0)
        self.selected = {(s.key, s.rung_index) for s in steps.values() if s is not None}


def device_set_of(item: pytest.Item, fixtures: Sequence[str] = tuple(DEVICE_SET_FIXTURES)) -> DeviceSet | None:
    """The device set an item is parametrised with, by one of ``fixtures`` (default: this node's sets)."""
    callspec = getattr(item, "callspec", None)
    for fixture in fixtures:
        device_set = callspec.params.get(fixture) if callspec is not None else None
        if isinstance(device_set, DeviceSet):
            return device_set
    return None
