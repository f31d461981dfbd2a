"""The machine a run tested, as its run.json says: read once into one typed object (``Run.machine``).

run.json keeps the topology as ``Topology.to_json`` wrote it (a file may come from another version
of the suite, or be edited by hand), so it is read leniently: each fact that does not read is
unknown, never an error that loses the whole run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from conformance.discover.health import GpuHealth, HealthError, health_from_json
from conformance.discover.iommu import IOMMU_FIX, IommuError, IommuFacts, iommu_from_json
from conformance.discover.platform import PlatformError, PlatformFacts, platform_from_json
from conformance.discover.rdma import RdmaFacts, rdma_from_json
from conformance.discover.topology import Topology


@dataclass(frozen=True)
class MachineFacts:
    devices: tuple[Mapping[str, object], ...] = ()  # every device entry as written (name, uuid, pci_bus_id, ...)
    driver: str | None = None
    cuda_driver: str | None = None
    nvml_gpus: tuple[str, ...] | None = None  # bus ids of every GPU NVML listed (None: not recorded)
    iommu: IommuFacts = field(default_factory=IommuFacts)
    platform: PlatformFacts = field(default_factory=PlatformFacts)
    health: Mapping[str, GpuHealth] = field(default_factory=dict)  # by GPU name, as read when the run started
    rdma: RdmaFacts = field(default_factory=RdmaFacts)  # the node's InfiniBand and RoCE ports (discover/rdma.py)
    topology: Topology | None = None  # the whole topology, where it reads back as one

    @property
    def p2p_fix(self) -> str:
        """What fixes P2P through the root complex here: the IOMMU and ACS, or the host's in a virtual machine."""
        return self.platform.p2p_fix(IOMMU_FIX)

    @property
    def gpus(self) -> tuple[Mapping[str, object], ...]:
        return tuple(d for d in self.devices if d.get("kind") == "gpu")

    @classmethod
    def of(cls, data: object) -> MachineFacts:
        """The facts of run.json's ``topology`` (anything else: nothing known)."""
        if not isinstance(data, Mapping):
            return cls()
        devices = data.get("devices")
        inventory = data.get("inventory")
        listed = inventory.get("nvml_gpus") if isinstance(inventory, Mapping) else None
        return cls(
            devices=tuple(d for d in devices if isinstance(d, Mapping)) if isinstance(devices, list) else (),
            driver=str(data["driver"]) if data.get("driver") else None,
            cuda_driver=str(data["cuda_driver"]) if data.get("cuda_driver") else None,
            nvml_gpus=tuple(str(bus) for bus in listed) if isinstance(listed, list) else None,
            iommu=_iommu(data.get("iommu")),
            platform=_platform(data.get("platform")),
            health=_health(data.get("health")),
            rdma=rdma_from_json(data.get("rdma")),
            topology=_topology(data),
        )


def _iommu(data: object) -> IommuFacts:
    try:
        return iommu_from_json(data) if data is not None else IommuFacts()
    except IommuError:
        return IommuFacts()


def _platform(data: object) -> PlatformFacts:
    try:
        return platform_from_json(data) if data is not None else PlatformFacts()
    except PlatformError:
        return PlatformFacts()


def _health(data: object) -> dict[str, GpuHealth]:
    try:
        return health_from_json(data) if data else {}
    except HealthError:
        return {}


def _topology(data: Mapping[str, object]) -> Topology | None:
    try:
        return Topology.from_json(json.dumps(data))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
