"""What the cases run on: GPUs found through NVML, or N virtual CPU devices for gloo.

The pytest process never initialises CUDA: GPUs are listed through NVML only.  NVML numbers
devices by PCI bus and ignores CUDA_VISIBLE_DEVICES, so the list is filtered through that variable
here and every rank gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any

CPU_LINK = "CPU"


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


class TopologyError(ValueError):
    """A topology file is unusable; the message names the file and the problem."""


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

    def link(self, a: Device, b: Device) -> str:
        if self.kind == "cpu":
            return CPU_LINK
        return self.links.get(pair_key(a, b), "?")

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
        data: dict[str, Any] = json.loads(text)
        devices = tuple(Device(**d) for d in data.pop("devices"))
        return cls(devices=devices, **data)


def load_topology_file(path: Path, where: str) -> Topology:
    """A topology saved by ``python -m conformance topology --json`` (or written by hand)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"{where}: topology file {str(path)!r} cannot be read: {exc.strerror}") from None
    try:
        topology = Topology.from_json(text)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise TopologyError(f"{where}: topology file {str(path)!r} is not a topology: {exc}") from None
    if not topology.devices:
        raise TopologyError(f"{where}: topology file {str(path)!r} lists no devices")
    return replace(topology, source=str(path))


def cpu_topology(count: int, note: str = "") -> Topology:
    devices = tuple(Device(name=f"cpu{i}", index=i, kind="cpu") for i in range(count))
    return Topology(kind="cpu", devices=devices, source="virtual", note=note)


def _visible_filter(gpus: list[Device], visible: str | None) -> list[Device]:
    """Keep and renumber the GPUs CUDA_VISIBLE_DEVICES selects (indices or UUID prefixes)."""
    if visible is None:
        return gpus
    chosen: list[Device] = []
    for token in (t.strip() for t in visible.split(",")):
        if not token:
            break
        if token.isdigit():
            match = [g for g in gpus if g.index == int(token)]
        else:
            match = [g for g in gpus if g.uuid and g.uuid.startswith(token)]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen.append(match[0])
    return [
        Device(name=f"gpu{i}", index=i, kind="gpu", uuid=g.uuid, model=g.model, pci_bus_id=g.pci_bus_id)
        for i, g in enumerate(chosen)
    ]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_gpus(environ: Mapping[str, str]) -> tuple[list[Device], str]:
    """List the visible GPUs through NVML; an empty list comes with the reason."""
    try:
        import pynvml
    except ImportError as exc:
        return [], f"nvidia-ml-py (pynvml) is not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"NVML unavailable: {exc}"
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                Device(
                    name=f"gpu{i}",
                    index=i,
                    kind="gpu",
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                )
            )
    except Exception as exc:
        return [], f"NVML error while listing GPUs: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    visible = _visible_filter(gpus, environ.get("CUDA_VISIBLE_DEVICES"))
    if not visible:
        why = "NVML reports no GPU" if not gpus else "CUDA_VISIBLE_DEVICES selects no GPU"
        return [], why
    return visible, ""


def discover(backend: str, virtual_devices: int, environ: Mapping[str, str] | None = None) -> Topology:
    """Pick the topology for a run.  Raises ValueError when ``nccl`` is asked for without GPUs."""
    environ = os.environ if environ is None else environ
    if backend == "gloo":
        return cpu_topology(virtual_devices, note="backend gloo chosen")
    gpus, reason = nvml_gpus(environ)
    if gpus:
        return Topology(kind="gpu", devices=tuple(gpus), source="nvml")
    if backend == "nccl":
        raise ValueError(f"the nccl backend needs GPUs, and none was found ({reason})")
    return cpu_topology(virtual_devices, note=f"no GPU: {reason}")
