"""The Topology and Device data types, their JSON, and the link-matrix and note lines that show them.

A :class:`Topology` is what the cases run on: its devices (GPUs, or virtual CPU devices for gloo), the
link class of every GPU pair as ``nvidia-smi topo -m`` names it (``nvml_topology.py`` reads them),
NVML's P2P status, and the machine facts read with them (inventory, health, IOMMU, a simulated
machine's watch).  ``to_json``/``from_json`` keep it in ``run.json`` and in topology files
(``topology_source.py`` loads and checks those).  The errors a run raises when it cannot get its
devices are defined here too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

from conformance.common.bounded_parse import json_value
from conformance.common.tables import align_columns
from conformance.discover.health import GpuHealth, health_from_json
from conformance.discover.inventory import Inventory, inventory_from_json
from conformance.discover.iommu import IommuFacts, iommu_from_json
from conformance.discover.platform import PlatformFacts, platform_from_json
from conformance.discover.rdma import Nic, RdmaFacts, nics_from_json, rdma_from_json
from conformance.discover.watch import RunWatch, watch_from_json

CPU_LINK = "CPU"
UNKNOWN_LINK = "?"
MAX_PAIRS_NAMED = 3  # a link note naming more pairs counts them instead


@dataclass(frozen=True)
class Device:
    """One device a rank can be bound to; ``index`` is the rank-side ordinal (cuda:<index>)."""

    name: str
    index: int
    kind: str  # "cpu" or "gpu"
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    memory_mib: int | None = None
    mig: bool = False
    nvml_index: int | None = None  # NVML's own number (by PCI bus), before CUDA_VISIBLE_DEVICES
    compute_capability: str | None = None  # "9.0" (nvmlDeviceGetCudaComputeCapability); None: not known


class TopologyError(ValueError):
    """The run cannot get its devices: an unusable topology file, a bad CUDA_VISIBLE_DEVICES, NVML failing.

    The message is one line naming the input and the problem.
    """


class DeviceSelectionError(TopologyError):
    """CUDA_VISIBLE_DEVICES has an entry that names no whole GPU of this machine exactly once."""


class BrokenGpuMachine(TopologyError):
    """NVML failed on a machine with NVIDIA GPUs: it is not tested as a CPU box."""


def pair_key(a: Device, b: Device) -> str:
    first, second = sorted((a, b), key=lambda d: d.index)
    return f"{first.name}-{second.name}"


@dataclass(frozen=True)
class Topology:
    kind: str  # "cpu" or "gpu"
    devices: tuple[Device, ...]
    source: str  # "virtual", "nvml" or a file name
    note: str = ""  # why this topology was chosen (e.g. why there is no GPU)
    links: Mapping[str, str] = field(default_factory=dict)  # pair_key -> "NV4", "PIX", ... "SYS"
    p2p: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # pair_key -> {"read": "OK", ...}
    driver: str | None = None
    cuda_driver: str | None = None
    link_notes: Mapping[str, str] = field(default_factory=dict)  # pair_key -> why its link class is PCIe-only
    inventory: Inventory = field(default_factory=Inventory)  # the GPUs counted on the PCI bus and by NVML
    health: Mapping[str, GpuHealth] = field(default_factory=dict)  # GPU name -> NVML's health facts (health.py)
    iommu: IommuFacts = field(default_factory=IommuFacts)  # IOMMU mode and ACS above the GPUs (iommu.py)
    kernel_log: str = ""  # why the kernel log's Xids were not read ("" when they were, or not asked for)
    watch: RunWatch | None = None  # a simulated machine's facts during the run (watch.py); None on a real one
    cpu: str = ""  # the host CPU as NCCL classifies it (discover/cpu.py: intel, amd, ...); "" unknown
    nccl: str | None = None  # a simulated machine's NCCL ("2.21.5"); a real run reads the one torch loads
    platform: PlatformFacts = field(default_factory=PlatformFacts)  # a VM, WSL, the stack limit, libcuda (GPU runs)
    rdma: RdmaFacts = field(default_factory=RdmaFacts)  # the node's InfiniBand and RoCE ports (rdma.py)
    nics: tuple[Nic, ...] = ()  # the RDMA devices NCCL may use, their PCIe links and paths to the GPUs (rdma.py)

    def link(self, a: Device, b: Device) -> str:
        if self.kind == "cpu":
            return CPU_LINK
        return self.links.get(pair_key(a, b), UNKNOWN_LINK)

    def p2p_status(self, a: Device, b: Device) -> Mapping[str, str] | None:
        return self.p2p.get(pair_key(a, b))

    def pairs(self) -> list[tuple[Device, Device]]:
        return list(combinations(self.devices, 2))

    def by_name(self, names: Sequence[str]) -> tuple[Device, ...]:
        known = {d.name: d for d in self.devices}
        return tuple(known[n] for n in names)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Topology:
        data: dict[str, Any] = json_value(text)
        devices = tuple(Device(**d) for d in data.pop("devices"))
        for name, read in FACT_READERS.items():
            if name in data:
                data[name] = read(data[name])
        return cls(devices=devices, **data)


# A topology file's facts beyond its devices, each read by its own module (a null watch: not watched)
FACT_READERS: Mapping[str, Callable[[Any], Any]] = {
    "inventory": inventory_from_json,
    "health": health_from_json,
    "iommu": iommu_from_json,
    "platform": platform_from_json,
    "rdma": rdma_from_json,
    "nics": nics_from_json,
    "watch": lambda data: None if data is None else watch_from_json(data),
}


def cpu_topology(count: int, note: str = "", inventory: Inventory | None = None) -> Topology:
    devices = tuple(Device(name=f"cpu{i}", index=i, kind="cpu") for i in range(count))
    return Topology(kind="cpu", devices=devices, source="virtual", note=note, inventory=inventory or Inventory())


def link_matrix_lines(topology: Topology) -> list[str]:
    """The pairwise link classes as ``nvidia-smi topo -m`` prints them, with each GPU's NUMA node."""
    if topology.kind == "cpu":
        return []
    devices = topology.devices
    header = ["", *(d.name for d in devices), "NUMA"]
    rows = [
        [a.name, *("X" if a.name == b.name else topology.link(a, b) for b in devices), _or_na(a.numa_node)]
        for a in devices
    ]
    return align_columns([header, *rows])


def link_note_lines(topology: Topology) -> list[str]:
    """One line per distinct link note, naming its pairs (or counting them when there are many)."""
    pairs_by_note: dict[str, list[str]] = {}
    for pair, note in topology.link_notes.items():
        pairs_by_note.setdefault(note, []).append(pair)
    return [f"{note} ({_pair_list(pairs)})" for note, pairs in pairs_by_note.items()]


def _pair_list(pairs: Sequence[str]) -> str:
    if len(pairs) > MAX_PAIRS_NAMED:
        return f"{len(pairs)} pairs"
    return ("pair " if len(pairs) == 1 else "pairs ") + " ".join(pairs)


def _or_na(value: int | None) -> str:
    return "N/A" if value is None else str(value)
