"""The GPUs NVML finds, as a Topology: CUDA_VISIBLE_DEVICES selection, NVLink/PCIe link classes, P2P status.

The pytest process never initialises CUDA: GPUs are listed through NVML only (``nvidia-ml-py``,
imported as ``pynvml``).  NVML numbers devices by PCI bus and ignores CUDA_VISIBLE_DEVICES, so the
list is filtered through that variable here; ranks are then told their GPUs by UUID
(``launch/case.py``), so NVML's numbering and CUDA's never have to agree.

CUDA_VISIBLE_DEVICES: comma-separated entries, each a decimal index (NVML's, i.e. PCI bus order), a
``GPU-`` UUID or a unique prefix of one.  CUDA silently stops at the first entry it cannot resolve,
which would turn a typo into a green CPU run; here any such entry (unknown, ambiguous, listed twice,
a ``MIG-`` instance) is a :class:`DeviceSelectionError` naming the entry and what the machine has.
The empty string, or a list starting with ``-1``, hides every GPU: a CPU run that says so.

No nvidia-ml-py, no NVML library or driver, or no GPU: the CPU topology, with the reason.  NVML
loaded but failing to list the GPUs is a :class:`TopologyError`: the machine is broken, not GPU-less.

Per GPU pair the link class is named as ``nvidia-smi topo -m`` names it: ``NV<n>`` (n active
NVLinks, directly or through NVSwitches), else the closest common PCIe ancestor: ``PIX`` (one PCIe
switch), ``PXB`` (several switches), ``PHB`` (a host bridge), ``NODE`` (between host bridges of one
NUMA node), ``SYS`` (across the CPU interconnect); ``?`` where NVML could not tell.  When NVML will
not describe a GPU's NVLinks (no permission in a container, a function the driver lacks, an unknown
error), its pairs get the PCIe class and ``Topology.link_notes`` says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path
from typing import Any, TypeVar

from conformance.discover.cpu import host_cpu
from conformance.discover.health import ask, nvlink_states, read_health
from conformance.discover.topology import (
    UNKNOWN_LINK,
    Device,
    DeviceSelectionError,
    Topology,
    TopologyError,
    pair_key,
)

NVLINK_UNKNOWN_COUNT = "NV?"  # NVLink by NVML's P2P status, the number of links unknown
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
HIDE_EVERY_GPU = "CUDA_VISIBLE_DEVICES hides every GPU"
NVML_NO_GPU = "NVML reports no GPU"
WHOLE_GPUS_ONLY = "this suite tests whole GPUs (NCCL has no P2P between MIG instances): list GPUs by index or GPU- UUID"

T = TypeVar("T")


def _visible_filter(
    gpus: list[Device],
    visible: str | None,
    find_mig_parent: Callable[[str], Device | None] = lambda entry: None,
    device_order: str | None = None,
) -> list[Device]:
    """Keep and renumber the GPUs CUDA_VISIBLE_DEVICES selects; raise DeviceSelectionError for a bad entry.

    ``gpus`` are numbered as NVML numbers them; the chosen ones keep that number as ``nvml_index``.
    ``find_mig_parent`` names the GPU a ``MIG-`` entry belongs to, for the message.  ``device_order``:
    CUDA_DEVICE_ORDER, which decides what CUDA means by an index.
    """
    if visible is None:
        return gpus
    entries = [entry.strip() for entry in visible.split(",")]
    if entries == [""] or entries[0] == "-1":
        return []
    chosen: dict[int, str] = {}  # NVML index -> the entry that chose it
    for entry in entries:
        gpu = _resolve_entry(entry, gpus, visible, find_mig_parent)
        if gpu.index in chosen:
            raise _selection_error(visible, entry, f"is GPU {gpu.index}, already listed as {chosen[gpu.index]!r}", gpus)
        chosen[gpu.index] = entry
    _refuse_fastest_first_indices(visible, entries, gpus, device_order)  # every entry names a GPU: now the order
    by_index = {gpu.index: gpu for gpu in gpus}
    return [
        replace(gpu, name=f"gpu{i}", index=i, nvml_index=gpu.index if gpu.nvml_index is None else gpu.nvml_index)
        for i, gpu in enumerate(by_index[index] for index in chosen)
    ]


def _refuse_fastest_first_indices(
    visible: str, entries: Sequence[str], gpus: Sequence[Device], device_order: str | None
) -> None:
    """Refuse indices CUDA would read otherwise than NVML: its default order is FASTEST_FIRST.

    CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA Programming Guide,
    "CUDA Environment Variables"); NVML numbers them by PCI bus.  The orders agree on a box of one
    model (CUDA breaks ties by PCI bus id), not on a box of mixed models.
    """
    models = sorted({gpu.model or "?" for gpu in gpus})
    indices = [entry for entry in entries if entry.isascii() and entry.isdigit()]
    if not indices or len(models) < 2 or (device_order or "").strip() == "PCI_BUS_ID":
        return
    raise DeviceSelectionError(
        f"CUDA_VISIBLE_DEVICES={visible!r} selects GPUs by index on a machine of mixed models ({', '.join(models)}): "
        f"CUDA numbers them fastest first (CUDA_DEVICE_ORDER={device_order or 'unset'}, default FASTEST_FIRST), "
        "NVML and nvidia-smi by PCI bus, so index "
        f"{indices[0]} may be another GPU for the ranks than for this suite; set CUDA_DEVICE_ORDER=PCI_BUS_ID "
        f"or list GPU- UUIDs; this machine has {_machine_text(gpus)}"
    )


def _resolve_entry(
    entry: str, gpus: Sequence[Device], visible: str, find_mig_parent: Callable[[str], Device | None]
) -> Device:
    if entry.startswith("MIG-"):
        raise DeviceSelectionError(_mig_refusal(visible, entry, find_mig_parent(entry)))
    if entry.isascii() and entry.isdigit():
        matches = [gpu for gpu in gpus if gpu.index == int(entry)]
    elif entry.startswith("GPU-"):
        matches = [gpu for gpu in gpus if (gpu.uuid or "").startswith(entry)]
    else:
        problem = "is empty" if not entry else "is not a GPU index or a GPU- UUID"
        raise _selection_error(visible, entry, problem, gpus)
    if len(matches) == 1:
        return matches[0]
    if matches:
        indices = ", ".join(str(gpu.index) for gpu in matches)
        raise _selection_error(visible, entry, f"starts the UUIDs of GPUs {indices}; give more of the UUID", gpus)
    raise _selection_error(visible, entry, "matches no GPU", gpus)


def _selection_error(visible: str, entry: str, problem: str, gpus: Sequence[Device]) -> DeviceSelectionError:
    return DeviceSelectionError(
        f"CUDA_VISIBLE_DEVICES={visible!r}: entry {entry!r} {problem}; this machine has {_machine_text(gpus)}"
    )


def _mig_refusal(visible: str, entry: str, parent: Device | None) -> str:
    what = "a MIG instance NVML does not list"
    if parent is not None:
        what = f"a MIG instance of GPU {parent.index} ({parent.model}, {parent.uuid})"
    return f"CUDA_VISIBLE_DEVICES={visible!r}: entry {entry!r} is {what}; {WHOLE_GPUS_ONLY}"


def _machine_text(gpus: Sequence[Device]) -> str:
    """``8 GPUs (NVIDIA L40S): 0 GPU-00000000-..., 1 ...``, the model per GPU only where they differ."""
    uuids = [gpu.uuid or "" for gpu in gpus]
    models = {gpu.model for gpu in gpus}
    plural = "" if len(gpus) == 1 else "s"
    if len(models) == 1:
        listed = ", ".join(f"{gpu.index} {_short_uuid(gpu.uuid or '', uuids)}" for gpu in gpus)
        return f"{len(gpus)} GPU{plural} ({models.pop()}): {listed}"
    listed = ", ".join(f"{gpu.index} {_short_uuid(gpu.uuid or '', uuids)} ({gpu.model})" for gpu in gpus)
    return f"{len(gpus)} GPU{plural}: {listed}"


def _short_uuid(uuid: str, uuids: Sequence[str]) -> str:
    """The UUID cut after a dash group, as short as still tells it from the others."""
    for cut in (13, 18, 23, 28):
        prefix = uuid[:cut]
        if len(uuid) > cut and sum(other.startswith(prefix) for other in uuids) == 1:
            return prefix + "..."
    return uuid


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


@dataclass(frozen=True)
class _NvLinksUnknown:
    """NVML would not describe this GPU's NVLinks."""

    error: str  # NVML's words: "Insufficient Permissions", "Function Not Found", ...


NvLinkScan = _NvLinks | _NvLinksUnknown


def _nvlink_count(a: Device, b: Device, scans: Mapping[str, NvLinkScan]) -> int | None:
    """Active NVLinks between a and b (directly, else through NVSwitches); None when a failed scan leaves it open."""
    scan_a, scan_b = scans[a.name], scans[b.name]
    known = [(scan, peer) for scan, peer in ((scan_a, b), (scan_b, a)) if isinstance(scan, _NvLinks)]
    direct = max((scan.to_gpu.get(sysfs_bus_id(peer.pci_bus_id or ""), 0) for scan, peer in known), default=0)
    if direct:
        return direct
    if isinstance(scan_a, _NvLinks) and isinstance(scan_b, _NvLinks):
        return min(scan_a.to_switch, scan_b.to_switch)
    if any(scan.to_switch == 0 for scan, _ in known):
        return 0  # the GPU that answered has no link to a switch and none to the other
    return None


def _unknown_nvlink_notes(scans: Mapping[str, NvLinkScan]) -> dict[str, str]:
    """GPU name -> the start of the note for its pairs; GPUs failing alike share one naming them all."""
    failing: dict[str, list[str]] = {}
    for name, scan in scans.items():
        if isinstance(scan, _NvLinksUnknown):
            failing.setdefault(scan.error, []).append(name)
    return {
        name: f"NVLink state of {', '.join(names)} unknown ({error})"
        for error, names in failing.items()
        for name in names
    }


class _NvmlReader:
    """The queries of one NVML session.

    Identity queries (count, handle, UUID, name, bus id) must answer: without them there is no GPU
    to name, and their NVMLError is a TopologyError.  Everything else is best effort: an NVMLError
    (NotSupported, NoPermission, FunctionNotFound where the driver's library lacks the function
    nvidia-ml-py calls, ...) leaves that fact unknown (None, "?", "UNKNOWN") instead.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles: dict[int, Any] = {}

    def optional(self, query: Callable[[], T]) -> T | None:
        return ask(self.nvml, query)

    def handle(self, gpu: Device) -> Any:
        assert gpu.nvml_index is not None, "listed GPUs carry their NVML index"
        return self.handles[gpu.nvml_index]

    def identity(self, query: str, gpu: int | None, *args: Any) -> Any:
        try:
            return getattr(self.nvml, query)(*args)
        except self.nvml.NVMLError as exc:
            raise TopologyError(self.listing_failed(exc, query, gpu)) from None

    def listing_failed(self, error: Exception, query: str, gpu: int | None) -> str:
        where = query if gpu is None else f"{query} of GPU {gpu}"
        if isinstance(error, self.nvml.NVMLError_FunctionNotFound):
            where += ": the driver's NVML library lacks the function nvidia-ml-py calls"
        return (
            f"NVML is loaded but listing the GPUs failed: {error} ({where}); "
            "fix the driver, or run on CPU with --backend gloo"
        )

    def list_gpus(self) -> list[Device]:
        return [self.list_gpu(i) for i in range(self.identity("nvmlDeviceGetCount", None))]

    def list_gpu(self, i: int) -> Device:
        handle = self.handles[i] = self.identity("nvmlDeviceGetHandleByIndex", i, i)
        uuid = self.identity("nvmlDeviceGetUUID", i, handle)
        model = self.identity("nvmlDeviceGetName", i, handle)
        bus_id = self.identity("nvmlDeviceGetPciInfo", i, handle).busId
        capability = ask(self.nvml, lambda: self.nvml.nvmlDeviceGetCudaComputeCapability(handle))
        return Device(
            f"gpu{i}", i, "gpu", uuid, model, bus_id, nvml_index=i,
            compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        )  # fmt: skip

    def mig_parent(self, gpus: Sequence[Device], mig_uuid: str) -> Device | None:
        """The listed GPU whose MIG instances include ``mig_uuid`` (or its legacy ``MIG-GPU-<uuid>/..`` form)."""
        for gpu in gpus:
            if any(uuid.startswith(mig_uuid) for uuid in self.mig_uuids(gpu)):
                return gpu
        legacy_parent = mig_uuid.removeprefix("MIG-").split("/")[0]
        return next((gpu for gpu in gpus if legacy_parent.startswith("GPU-") and gpu.uuid == legacy_parent), None)

    def mig_uuids(self, gpu: Device) -> list[str]:
        """The UUIDs of the GPU's MIG instances; none where NVML cannot list them."""
        nvml, handle = self.nvml, self.handle(gpu)
        uuids = []
        try:
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    uuids.append(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
                except nvml.NVMLError_NotFound:
                    continue  # an empty slot
        except nvml.NVMLError:
            pass
        return uuids

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
        driver = self.optional(self.nvml.nvmlSystemGetDriverVersion)
        cuda = self.optional(lambda: cuda_version_text(int(self.nvml.nvmlSystemGetCudaDriverVersion())))
        return driver, cuda

    def pairs(self, devices: Sequence[Device]) -> tuple[dict[str, str], dict[str, dict[str, str]], dict[str, str]]:
        """Link class, NVML P2P status and link note (where NVLink is unknown) of every pair, by ``pair_key``."""
        scans = {gpu.name: self.nvlinks(gpu) for gpu in devices}
        unknown_notes = _unknown_nvlink_notes(scans)
        names = p2p_status_names(self.nvml)
        links, p2p, notes = {}, {}, {}
        for a, b in combinations(devices, 2):
            key = pair_key(a, b)
            count = _nvlink_count(a, b, scans)
            p2p[key] = {cap: self.p2p_status(a, b, constant, names) for cap, constant in P2P_CAPS}
            by_p2p_status = count is None and p2p[key]["nvlink"] == "OK"  # NVML still says NVLink: keep it so
            if count:
                links[key] = f"NV{count}"
            else:
                links[key] = NVLINK_UNKNOWN_COUNT if by_p2p_status else self.pcie_class(a, b)
            if count is None:
                shown = (
                    f"NVML's P2P status says NVLink ({NVLINK_UNKNOWN_COUNT})" if by_p2p_status else "PCIe class shown"
                )
                notes[key] = f"{unknown_notes.get(a.name) or unknown_notes[b.name]}: {shown}"
        return links, p2p, notes

    def nvlinks(self, gpu: Device) -> NvLinkScan:
        try:
            return self.scan_nvlinks(self.handle(gpu))
        except self.nvml.NVMLError as exc:
            return _NvLinksUnknown(str(exc))

    def scan_nvlinks(self, handle: Any) -> _NvLinks:
        """Count active links by far end; NotSupported or InvalidArgument on a link's state means no more links."""
        nvml = self.nvml
        to_gpu: Counter[str] = Counter()
        to_switch = 0
        for link, up in enumerate(nvlink_states(nvml, handle) or ()):
            if not up:
                continue
            far_end = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
            if far_end == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                to_switch += 1
            elif far_end == nvml.NVML_NVLINK_DEVICE_TYPE_GPU:
                to_gpu[sysfs_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)] += 1
        return _NvLinks(dict(to_gpu), to_switch)

    def pcie_class(self, a: Device, b: Device) -> str:
        """The closest common PCIe ancestor's class, or "?"."""
        nvml = self.nvml
        level = self.optional(lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(self.handle(a), self.handle(b)))
        ancestors = {getattr(nvml, name): link for name, link in ANCESTOR_LINKS if hasattr(nvml, name)}
        return UNKNOWN_LINK if level is None else ancestors.get(level, UNKNOWN_LINK)

    def p2p_status(self, a: Device, b: Device, constant: str, names: Mapping[int, str]) -> str:
        caps = _caps_index(getattr(self.nvml, constant))
        status = self.optional(lambda: self.nvml.nvmlDeviceGetP2PStatus(self.handle(a), self.handle(b), caps))
        return UNKNOWN_P2P if status is None else names.get(status, UNKNOWN_P2P)


def _start_nvml() -> tuple[Any, str]:
    """The initialised ``pynvml`` module, or None and why not."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py (pynvml) is not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML unavailable: {exc}"
    return pynvml, ""


@dataclass(frozen=True)
class NvmlView:
    """What NVML said: the visible GPUs' topology, or why there is none; the bus ids of every GPU it lists."""

    topology: Topology | None
    reason: str  # why there is no topology ("" when there is one)
    listed: tuple[str, ...] | None  # every GPU NVML lists, CUDA_VISIBLE_DEVICES or not; None: NVML failed


def _read_nvml(nvml: Any, visible: str | None, device_order: str | None = None) -> NvmlView:
    reader = _NvmlReader(nvml)
    listed = reader.list_gpus()
    bus_ids = tuple(sysfs_bus_id(gpu.pci_bus_id or "") for gpu in listed)
    if not listed:
        return NvmlView(None, NVML_NO_GPU, bus_ids)
    chosen = _visible_filter(listed, visible, lambda entry: reader.mig_parent(listed, entry), device_order)
    if not chosen:
        return NvmlView(None, HIDE_EVERY_GPU, bus_ids)
    devices = tuple(reader.describe(gpu) for gpu in chosen)
    links, p2p, notes = reader.pairs(devices)
    driver, cuda_driver = reader.driver_versions()
    health = {gpu.name: read_health(nvml, reader.handle(gpu)) for gpu in devices}
    topology = Topology(
        "gpu", devices, "nvml", links=links, p2p=p2p, driver=driver, cuda_driver=cuda_driver, link_notes=notes,
        health=health, cpu=host_cpu(),
    )  # fmt: skip
    return NvmlView(topology, "", bus_ids)


def nvml_view(environ: Mapping[str, str]) -> NvmlView:
    """The GPUs CUDA_VISIBLE_DEVICES selects, their links and NVML's P2P status; else why not.

    Raises TopologyError (DeviceSelectionError for CUDA_VISIBLE_DEVICES) where NVML is loaded but the
    GPUs cannot be listed or selected.
    """
    nvml, reason = _start_nvml()
    if nvml is None:
        return NvmlView(None, reason, None)
    try:
        return _read_nvml(nvml, environ.get("CUDA_VISIBLE_DEVICES"), environ.get("CUDA_DEVICE_ORDER"))
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def nvml_gpus(environ: Mapping[str, str]) -> tuple[list[Device], str]:
    """The visible GPUs' identities (name, ordinal, UUID, model, bus id); an empty list comes with the reason.

    ``nvml_view`` has the rest (NUMA, memory, MIG, NVML index, links, P2P status) and raises as it does.
    """
    view = nvml_view(environ)
    if view.topology is None:
        return [], view.reason
    return [Device(d.name, d.index, d.kind, d.uuid, d.model, d.pci_bus_id) for d in view.topology.devices], ""
