"""The plan: device sets and environment rungs, and the stable test ids built from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from conformance.topology import CPU_LINK, Device, Topology

ENV_FAMILIES = ("NCCL_", "TORCH_NCCL_")


@dataclass(frozen=True)
class Rung:
    """A named environment combination; ``unset`` variables are removed in the ranks."""

    name: str
    set: Mapping[str, str] = field(default_factory=dict)
    unset_families: tuple[str, ...] = ()

    def unset(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(sorted(k for k in environ if k.startswith(self.unset_families) and k not in self.set))


INHERITED = Rung("inherited")


@dataclass(frozen=True)
class DeviceSet:
    devices: tuple[Device, ...]
    link: str | None
    rung: Rung = INHERITED

    @property
    def id(self) -> str:
        parts = [f"all{len(self.devices)}"] if self.link == "all" else [d.name for d in self.devices]
        if self.link and self.link not in (CPU_LINK, "all"):
            parts.append(self.link)
        return "-".join([*parts, self.rung.name])


def whole_and_single(topology: Topology) -> list[DeviceSet]:
    """Every device together, and a world of one."""
    sets = [DeviceSet(topology.devices, "all")]
    if len(topology.devices) > 1:
        sets.append(DeviceSet(topology.devices[:1], None))
    return sets


def each_device(topology: Topology) -> list[DeviceSet]:
    return [DeviceSet((d,), None) for d in topology.devices]


def each_pair(topology: Topology) -> list[DeviceSet]:
    return [DeviceSet((a, b), topology.link(a, b)) for a, b in topology.pairs()]


DEVICE_SET_FIXTURES = {
    "device_set": whole_and_single,
    "single_device": each_device,
    "device_pair": each_pair,
}
