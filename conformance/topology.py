"""What the cases run on: GPUs found through NVML, or N virtual CPU devices for gloo.

The pytest process never initialises CUDA: GPUs are listed through NVML only (``nvidia-ml-py``,
imported as ``pynvml``).  NVML numbers devices by PCI bus and ignores CUDA_VISIBLE_DEVICES, so the
list is filtered through that variable here and every rank gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

Per GPU pair the link class is named as ``nvidia-smi topo -m`` names it: ``NV<n>`` (n active
NVLinks, directly or through NVSwitches), else the closest common PCIe ancestor: ``PIX`` (one PCIe
switch), ``PXB`` (several switches), ``PHB`` (a host bridge), ``NODE`` (between host bridges of one
NUMA node), ``SYS`` (across the CPU interconnect); ``?`` where NVML could not tell.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any, TypeVar

from conformance.inputs import read_user_file

CPU_LINK = "CPU"
UNKNOWN_LINK = "?"
UNKNOWN_P2P = "UNKNOWN"
MIB = 1024 * 1024
SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")  # where the NUMA node is read when NVML cannot say

# NVML's closest common ancestor of two GPUs -> nvidia-smi's name.  NVML_TOPOLOGY_CPU is NODE's
# older name (same value); INTERNAL is two GPUs on one board behind its own PCIe switch.
ANCESTOR_LINKS = (
    ("NVML_TOPOLOGY_INTERNAL", "PIX"),
    ("NVML_TOPOLOGY_SINGLE", "PIX"),
    ("NVML_TOPOLOGY_MULTIPLE", "PXB"),
    ("NVML_TOPOLOGY_HOSTBRIDGE", "PHB"),
    ("NVML_TOPOLOGY_CPU", "NODE"),
    ("NVML_TOPOLOGY_NODE", "NODE"),
    ("NVML_TOPOLOGY_SYSTEM", "SYS"),
)
# The P2P capabilities NVML reports per pair: Topology.p2p field -> pynvml constant.
P2P_CAPS = (
    ("read", "NVML_P2P_CAPS_INDEX_READ"),
    ("write", "NVML_P2P_CAPS_INDEX_WRITE"),
    ("nvlink", "NVML_P2P_CAPS_INDEX_NVLINK"),
    ("atomics", "NVML_P2P_CAPS_INDEX_ATOMICS"),
)
P2P_STATUS_PREFIX = "NVML_P2P_STATUS_"
# nvidia-ml-py keeps the misspelt NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED beside the correct name.
P2P_STATUS_SPELLING = {"CHIPSET_NOT_SUPPORED": "CHIPSET_NOT_SUPPORTED"}

T = TypeVar("T")


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
        data: dict[str, Any] = json.loads(text)
        devices = tuple(Device(**d) for d in data.pop("devices"))
        return cls(devices=devices, **data)


def load_topology_file(path: Path, where: str) -> Topology:
    """A topology saved by ``python -m conformance topology --json`` (or written by hand)."""
    text = read_user_file(path, "topology file", where, TopologyError)
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


def align_columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _or_na(value: int | None) -> str:
    return "N/A" if value is None else str(value)


def _visible_filter(gpus: list[Device], visible: str | None) -> list[Device]:
    """Keep and renumber the GPUs CUDA_VISIBLE_DEVICES selects (indices or UUID prefixes).

    ``gpus`` are numbered as NVML numbers them; the chosen ones keep that number as ``nvml_index``.
    MIG instance UUIDs (``MIG-...``) are not resolved: like any unknown entry they end the list.
    """
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
        replace(g, name=f"gpu{i}", index=i, nvml_index=g.index if g.nvml_index is None else g.nvml_index)
        for i, g in enumerate(chosen)
    ]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:1A:00.0`` as sysfs spells it: ``0000:1a:00.0`` (domain as %04x)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        try:
            parts[0] = f"{int(parts[0], 16):04x}"
        except ValueError:
            pass
    return ":".join(parts)


def _sysfs_numa_node(bus_id: str) -> int | None:
    try:
        node = int((SYSFS_PCI_DEVICES / sysfs_bus_id(bus_id) / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version as CUDA numbers it (12080 -> "12.8")."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _caps_index(value: Any) -> Any:
    """nvidia-ml-py defines ``NVML_P2P_CAPS_INDEX_READ = 0,``: a tuple that ctypes would refuse."""
    return value[0] if isinstance(value, tuple) else value


def _error_classes(nvml: Any, *names: str) -> tuple[type[BaseException], ...]:
    return tuple(getattr(nvml, name) for name in names if hasattr(nvml, name))


def p2p_status_names(nvml: Any) -> dict[int, str]:
    """NVML_P2P_STATUS_* values -> their names without the prefix ("OK", "CHIPSET_NOT_SUPPORTED" ...)."""
    names: dict[int, str] = {}
    for attribute in dir(nvml):
        if attribute.startswith(P2P_STATUS_PREFIX):
            name = attribute.removeprefix(P2P_STATUS_PREFIX)
            names[getattr(nvml, attribute)] = P2P_STATUS_SPELLING.get(name, name)
    return names


@dataclass(frozen=True)
class _NvLinks:
    """One GPU's active NVLinks by their far end."""

    to_gpu: Mapping[str, int]  # the peer's bus id (sysfs spelling) -> active links
    to_switch: int  # active links to NVSwitches


class _NvmlReader:
    """The queries of one NVML session.

    Identity queries (handle, UUID, name, bus id) raise NVMLError: without them there is no GPU to
    name.  Everything else is best effort: an NVMLError, or a function this nvidia-ml-py lacks
    (AttributeError), leaves that fact unknown (None, "?", "UNKNOWN") instead of failing discovery.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.soft_errors: tuple[type[BaseException], ...] = (nvml.NVMLError, AttributeError)
        self.handles: dict[int, Any] = {}

    def optional(self, query: Callable[[], T]) -> T | None:
        try:
            return query()
        except self.soft_errors:
            return None

    def handle(self, gpu: Device) -> Any:
        assert gpu.nvml_index is not None, "listed GPUs carry their NVML index"
        return self.handles[gpu.nvml_index]

    def list_gpus(self) -> list[Device]:
        nvml = self.nvml
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = self.handles[i] = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            model = _text(nvml.nvmlDeviceGetName(handle))
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            gpus.append(Device(f"gpu{i}", i, "gpu", uuid, model, bus_id, nvml_index=i))
        return gpus

    def describe(self, gpu: Device) -> Device:
        """The GPU with its NUMA node, memory and MIG mode filled in."""
        handle = self.handle(gpu)
        memory = self.optional(lambda: int(self.nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB)
        modes = self.optional(lambda: self.nvml.nvmlDeviceGetMigMode(handle))  # [current, pending]
        mig = modes is not None and modes[0] == self.nvml.NVML_DEVICE_MIG_ENABLE
        return replace(gpu, numa_node=self.numa_node(handle, gpu.pci_bus_id or ""), memory_mib=memory, mig=mig)

    def numa_node(self, handle: Any, bus_id: str) -> int | None:
        node = self.optional(lambda: int(self.nvml.nvmlDeviceGetNumaNodeId(handle)))
        if node is not None and node >= 0:
            return node
        return _sysfs_numa_node(bus_id)

    def driver_versions(self) -> tuple[str | None, str | None]:
        driver = self.optional(lambda: _text(self.nvml.nvmlSystemGetDriverVersion()))
        cuda = self.optional(lambda: cuda_version_text(int(self.nvml.nvmlSystemGetCudaDriverVersion())))
        return driver, cuda

    def pairs(self, devices: Sequence[Device]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        """Link class and NVML P2P status of every pair, keyed by ``pair_key``."""
        nvlinks = {gpu.name: self.nvlinks(gpu) for gpu in devices}
        ancestors = {getattr(self.nvml, name): link for name, link in ANCESTOR_LINKS if hasattr(self.nvml, name)}
        names = p2p_status_names(self.nvml)
        links, p2p = {}, {}
        for a, b in combinations(devices, 2):
            links[pair_key(a, b)] = self.link_class(a, b, nvlinks, ancestors)
            p2p[pair_key(a, b)] = {cap: self.p2p_status(a, b, constant, names) for cap, constant in P2P_CAPS}
        return links, p2p

    def nvlinks(self, gpu: Device) -> _NvLinks | None:
        handle = self.handle(gpu)
        return self.optional(lambda: self.scan_nvlinks(handle))

    def scan_nvlinks(self, handle: Any) -> _NvLinks:
        """Count active links by far end; NotSupported or InvalidArgument means no more links."""
        nvml = self.nvml
        no_more_links = _error_classes(nvml, "NVMLError_NotSupported", "NVMLError_InvalidArgument")
        to_gpu: Counter[str] = Counter()
        to_switch = 0
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED
            except no_more_links:
                break
            if not active:
                continue
            if self.remote_is_switch(handle, link):
                to_switch += 1
            else:
                to_gpu[sysfs_bus_id(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))] += 1
        return _NvLinks(dict(to_gpu), to_switch)

    def remote_is_switch(self, handle: Any, link: int) -> bool:
        kind = self.optional(lambda: self.nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        return kind is not None and kind == self.nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def link_class(
        self, a: Device, b: Device, nvlinks: Mapping[str, _NvLinks | None], ancestors: Mapping[int, str]
    ) -> str:
        """``NV<n>`` for n NVLinks between the two (through NVSwitches: the fewer switch links), else PCIe."""
        links_a, links_b = nvlinks[a.name], nvlinks[b.name]
        if links_a is None or links_b is None:
            return UNKNOWN_LINK
        count = links_a.to_gpu.get(sysfs_bus_id(b.pci_bus_id or ""), 0)
        if not count and links_a.to_switch and links_b.to_switch:
            count = min(links_a.to_switch, links_b.to_switch)
        if count:
            return f"NV{count}"
        level = self.optional(lambda: self.nvml.nvmlDeviceGetTopologyCommonAncestor(self.handle(a), self.handle(b)))
        return UNKNOWN_LINK if level is None else ancestors.get(level, UNKNOWN_LINK)

    def p2p_status(self, a: Device, b: Device, constant: str, names: Mapping[int, str]) -> str:
        status = self.optional(
            lambda: self.nvml.nvmlDeviceGetP2PStatus(
                self.handle(a), self.handle(b), _caps_index(getattr(self.nvml, constant))
            )
        )
        return UNKNOWN_P2P if status is None else names.get(status, UNKNOWN_P2P)


def _start_nvml() -> tuple[Any, str]:
    """The initialised ``pynvml`` module, or None and why not."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py (pynvml) is not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML unavailable: {exc}"
    return pynvml, ""


def _read_nvml(nvml: Any, visible: str | None) -> tuple[Topology | None, str]:
    reader = _NvmlReader(nvml)
    try:
        listed = reader.list_gpus()
    except nvml.NVMLError as exc:
        return None, f"NVML error while listing GPUs: {exc}"
    chosen = _visible_filter(listed, visible)
    if not chosen:
        return None, "NVML reports no GPU" if not listed else "CUDA_VISIBLE_DEVICES selects no GPU"
    devices = tuple(reader.describe(gpu) for gpu in chosen)
    links, p2p = reader.pairs(devices)
    driver, cuda_driver = reader.driver_versions()
    topology = Topology("gpu", devices, "nvml", links=links, p2p=p2p, driver=driver, cuda_driver=cuda_driver)
    return topology, ""


def nvml_topology(environ: Mapping[str, str]) -> tuple[Topology | None, str]:
    """The GPUs CUDA_VISIBLE_DEVICES selects, their links and NVML's P2P status; else None and why."""
    nvml, reason = _start_nvml()
    if nvml is None:
        return None, reason
    try:
        return _read_nvml(nvml, environ.get("CUDA_VISIBLE_DEVICES"))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def nvml_gpus(environ: Mapping[str, str]) -> tuple[list[Device], str]:
    """The visible GPUs' identities (name, ordinal, UUID, model, bus id); an empty list comes with the reason.

    ``nvml_topology`` has the rest (NUMA, memory, MIG, NVML index, links, P2P status).
    """
    topology, reason = nvml_topology(environ)
    if topology is None:
        return [], reason
    return [Device(d.name, d.index, d.kind, d.uuid, d.model, d.pci_bus_id) for d in topology.devices], ""


def discover(backend: str, virtual_devices: int, environ: Mapping[str, str] | None = None) -> Topology:
    """Pick the topology for a run.  Raises ValueError when ``nccl`` is asked for without GPUs."""
    environ = os.environ if environ is None else environ
    if backend == "gloo":
        return cpu_topology(virtual_devices, note="backend gloo chosen")
    topology, reason = nvml_topology(environ)
    if topology is not None:
        return topology
    if backend == "nccl":
        raise ValueError(f"the nccl backend needs GPUs, and none was found ({reason})")
    return cpu_topology(virtual_devices, note=f"no GPU: {reason}")
