"""IOMMU and PCIe ACS around the GPUs: the documented cause of P2P hangs and slow P2P on PCIe boxes.

NCCL's troubleshooting guide, "PCI Access Control Services (ACS)"
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html): IO virtualization
(VT-d, the IOMMU) "can interfere with GPU Direct by redirecting all PCI point-to-point traffic to
the CPU root complex, causing a significant performance reduction or even a hang"; ACS enabled on
the PCI bridges does that redirecting, and the guide's fix is to disable it on every bridge.

Read without NVML and without root where the kernel allows:

* the IOMMU's mode from each GPU's IOMMU group (``/sys/bus/pci/devices/<gpu>/iommu_group/type``:
  ``identity`` is passthrough, ``DMA`` / ``DMA-FQ`` translation; no group: no IOMMU), and the
  kernel command line's IOMMU parameters (``/proc/cmdline``);
* ACS control of every bridge above each GPU (the sysfs path's parents), from the extended
  capability ``PCI_EXT_CAP_ID_ACS`` (0x0d) in the bridge's config space: control register at +6,
  ``PCI_ACS_RR`` 0x04 (P2P request redirect), ``PCI_ACS_CR`` 0x08 (P2P completion redirect),
  ``PCI_ACS_EC`` 0x20 (P2P egress control) (Linux ``include/uapi/linux/pci_regs.h``).  Only root
  reads past the first 64 bytes of config space; a bridge read short is listed as unreadable;
* each bridge's kind: the PCI Express capability's Device/Port Type (``PCI_EXP_FLAGS_TYPE``, bits 7:4
  of the capability's flags: 4 root port, 5 switch upstream port, 6 switch downstream port, 7
  PCIe-to-PCI bridge; ``pci_regs.h``), or, where the config space is not readable, the bridge's place
  on the sysfs path (the first bridge below ``pciDDDD:BB`` is a root port; below it switches alternate
  upstream and downstream ports), and which GPUs lie below it.

Which of these bits can change a path NCCL uses is judged by ``conformance.plan.acs``: Linux sets
redirect on every ACS-capable port, root ports included, whenever an IOMMU driver asked for ACS
(``drivers/pci/pci.c``, ``pci_std_enable_acs``), so the bits alone are no fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from conformance.common.inputs import dataclass_from_json

EXTENDED_CONFIG_START = 0x100
PCI_EXT_CAP_ID_ACS = 0x0D
PCI_ACS_CTRL = 0x06
ACS_REDIRECTS = 0x04 | 0x08 | 0x20  # PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC
_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_IOMMU_PARAMETER = re.compile(r"^(?:intel_iommu|amd_iommu|iommu|iommu\.passthrough|iommu\.strict)=")
PASSTHROUGH, TRANSLATED, OFF = "passthrough", "translated", "off"


ROOT_PORT, SWITCH_UPSTREAM, SWITCH_DOWNSTREAM = "root_port", "switch_upstream", "switch_downstream"
PCIE_TO_PCI, UNKNOWN_KIND = "pcie_to_pci_bridge", "unknown"
BRIDGE_KINDS = (ROOT_PORT, SWITCH_UPSTREAM, SWITCH_DOWNSTREAM, PCIE_TO_PCI, UNKNOWN_KIND)
# PCI_EXP_FLAGS_TYPE values (include/uapi/linux/pci_regs.h: PCI_EXP_TYPE_ROOT_PORT 0x4, _UPSTREAM 0x5,
# _DOWNSTREAM 0x6, _PCI_BRIDGE 0x7)
PORT_TYPES = {0x4: ROOT_PORT, 0x5: SWITCH_UPSTREAM, 0x6: SWITCH_DOWNSTREAM, 0x7: PCIE_TO_PCI}
PCI_CAPABILITY_LIST, PCI_CAP_ID_EXP, PCI_EXP_FLAGS = 0x34, 0x10, 0x02
_PCI_ROOT_BUS = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


@dataclass(frozen=True)
class Bridge:
    """A bridge above the GPUs: its kind, the GPUs below it, its ACS control (None: not readable here)."""

    bus_id: str  # sysfs spelling, 0000:02:08.0
    kind: str = UNKNOWN_KIND
    gpus: tuple[str, ...] = ()  # the GPUs below it, by bus id (sysfs spelling)
    acs: int | None = None

    @property
    def redirects(self) -> bool:
        return self.acs is not None and bool(self.acs & ACS_REDIRECTS)


@dataclass(frozen=True)
class IommuFacts:
    """The IOMMU's mode for the GPUs and the bridges above them, each with its ACS control."""

    mode: str | None = None  # passthrough, translated, off; None: not read
    cmdline: tuple[str, ...] = ()  # the kernel's IOMMU parameters (intel_iommu=on, iommu=pt, ...)
    bridges: tuple[Bridge, ...] = ()

    @property
    def acs_redirect(self) -> tuple[str, ...]:
        """The bridges above a GPU with ACS P2P redirect or egress control on (any kind)."""
        return tuple(b.bus_id for b in self.bridges if b.redirects)

    @property
    def acs_unreadable(self) -> tuple[str, ...]:
        """The bridges whose ACS control could not be read (not root)."""
        return tuple(b.bus_id for b in self.bridges if b.acs is None)

    @property
    def p2p_redirected(self) -> tuple[str, ...]:
        """The redirecting bridges that can sit between two GPUs of a switch: not root ports, not upstream ports."""
        return tuple(b.bus_id for b in self.bridges if b.redirects and b.kind not in (ROOT_PORT, SWITCH_UPSTREAM))

    @property
    def redirects_p2p(self) -> bool:
        return self.mode == TRANSLATED or bool(self.p2p_redirected)

    def to_json(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "cmdline": list(self.cmdline),
            "bridges": [{"bus_id": b.bus_id, "kind": b.kind, "gpus": list(b.gpus), "acs": b.acs} for b in self.bridges],
        }

    def cause_text(self) -> str:
        """Why P2P between these GPUs may go through the root complex, in words ("" when nothing says so)."""
        found = []
        if self.mode == TRANSLATED:
            found.append(f"the IOMMU translates the GPUs' DMA ({' '.join(self.cmdline) or 'kernel default'})")
        if self.p2p_redirected:
            found.append(f"ACS redirects P2P on bridge(s) {', '.join(self.p2p_redirected)}")
        return "; ".join(found)


IOMMU_FIX = (
    "boot with the IOMMU in passthrough (iommu=pt) or off, and disable ACS redirect on the bridges "
    "(kernel pci=disable_acs_redir=<bridges>, or `setpci -s <bridge> ECAP_ACS+0x6.w=0000` as root at each boot)"
)


class IommuError(ValueError):
    """A topology file's iommu of the wrong shape."""


def iommu_from_json(data: object) -> IommuFacts:
    """A topology file's (or run.json's) ``"iommu"``.

    The lists ``acs_redirect`` and ``acs_unreadable`` of files written before bridges had kinds read
    as bridges of unknown kind.
    """
    if not isinstance(data, dict):
        raise IommuError(f"iommu is {data!r}, not an object")
    data = dict(data)
    old = {name: data.pop(name) for name in ("acs_redirect", "acs_unreadable") if name in data}
    for name, value in old.items():
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise IommuError(f"iommu: {name} is {value!r}, which is not a list of bridges' bus ids")
    raw_bridges = data.pop("bridges", [])
    if not isinstance(raw_bridges, list):
        raise IommuError(f"iommu: bridges is {raw_bridges!r}, which is not a list")
    facts = dataclass_from_json(IommuFacts, data, "iommu", IommuError)
    if facts.mode not in (None, PASSTHROUGH, TRANSLATED, OFF):
        raise IommuError(f"iommu: mode is {facts.mode!r}, not {PASSTHROUGH}, {TRANSLATED} or {OFF}")
    bridges = [_bridge_from_json(b, f"iommu: bridge {i}") for i, b in enumerate(raw_bridges)]
    bridges += [Bridge(bus, acs=ACS_REDIRECTS) for bus in old.get("acs_redirect", [])]
    bridges += [Bridge(bus) for bus in old.get("acs_unreadable", [])]
    return replace(facts, bridges=tuple(bridges))


def _bridge_from_json(data: object, where: str) -> Bridge:
    bridge = dataclass_from_json(Bridge, data, where, IommuError)
    if bridge.kind not in BRIDGE_KINDS:
        raise IommuError(f"{where}: kind is {bridge.kind!r}, not one of {', '.join(BRIDGE_KINDS)}")
    if bridge.acs is not None and (type(bridge.acs) is not int or not 0 <= bridge.acs <= 0xFFFF):
        raise IommuError(f"{where}: acs is {bridge.acs!r}, not a 16-bit register value or null")
    return bridge


def read_iommu(gpu_bus_ids: tuple[str, ...], pci_devices: Path, cmdline: Path) -> IommuFacts:
    """The IOMMU's mode for these GPUs (sysfs spelling) and ACS on the bridges above them."""
    if not gpu_bus_ids:
        return IommuFacts()
    types = [_group_type(pci_devices / bus) for bus in gpu_bus_ids]
    if any(t is not None and t.startswith("DMA") for t in types):
        mode = TRANSLATED
    elif any(t is not None for t in types):
        mode = PASSTHROUGH
    else:
        mode = OFF
    bridges = tuple(
        Bridge(bus, _kind(pci_devices / bus / "config", place), tuple(gpus), acs_control(pci_devices / bus / "config"))
        for bus, (place, gpus) in _bridges_above(gpu_bus_ids, pci_devices).items()
    )
    return IommuFacts(mode, _iommu_parameters(cmdline), bridges)


def _group_type(device: Path) -> str | None:
    try:
        return (device / "iommu_group" / "type").read_text().strip()
    except OSError:
        return None


def _iommu_parameters(cmdline: Path) -> tuple[str, ...]:
    try:
        words = cmdline.read_text().split()
    except OSError:
        return ()
    return tuple(word for word in words if _IOMMU_PARAMETER.match(word))


def _bridges_above(gpu_bus_ids: tuple[str, ...], pci_devices: Path) -> dict[str, tuple[str, list[str]]]:
    """Every bridge on the path from the root complex to each GPU, in bus order: (its kind by place, GPUs below)."""
    bridges: dict[str, tuple[str, list[str]]] = {}
    for bus in gpu_bus_ids:
        try:
            path = (pci_devices / bus).resolve(strict=True)
        except OSError:
            continue
        above = [parent for parent in reversed(path.parents) if _BUS_ID.match(parent.name)]
        rooted = bool(above) and _PCI_ROOT_BUS.match(above[0].parent.name) is not None
        for depth, parent in enumerate(above):
            place = _kind_by_place(depth) if rooted else UNKNOWN_KIND
            bridges.setdefault(parent.name, (place, []))[1].append(bus)
    return dict(sorted(bridges.items()))


def _kind_by_place(depth: int) -> str:
    """A bridge's kind from its depth below the root bus: root port, then switch ports up and down in turn."""
    if depth == 0:
        return ROOT_PORT
    return SWITCH_UPSTREAM if depth % 2 else SWITCH_DOWNSTREAM


def _kind(config: Path, place: str) -> str:
    """The bridge's PCIe port type from its config space; its place on the path where that is not readable."""
    try:
        data = config.read_bytes()[:256]
    except OSError:
        return place
    offset, seen = data[PCI_CAPABILITY_LIST] if len(data) > PCI_CAPABILITY_LIST else 0, set()
    while offset and offset + 4 <= len(data) and offset not in seen:
        seen.add(offset)
        if data[offset] == PCI_CAP_ID_EXP:
            flags = int.from_bytes(data[offset + PCI_EXP_FLAGS : offset + PCI_EXP_FLAGS + 2], "little")
            return PORT_TYPES.get((flags >> 4) & 0xF, place)
        offset = data[offset + 1] & 0xFC
    return place


def acs_control(config: Path) -> int | None:
    """The ACS control register of a device's config space; 0 without the capability; None unreadable."""
    try:
        data = config.read_bytes()
    except OSError:
        return None
    if len(data) <= EXTENDED_CONFIG_START:
        return None  # only root reads the extended config space
    offset, seen = EXTENDED_CONFIG_START, set()
    while offset and offset + 8 <= len(data) and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(data[offset : offset + 4], "little")
        if header & 0xFFFF == PCI_EXT_CAP_ID_ACS:
            return int.from_bytes(data[offset + PCI_ACS_CTRL : offset + PCI_ACS_CTRL + 2], "little")
        offset = (header >> 20) & 0xFFC
    return 0
