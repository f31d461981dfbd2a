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
  reads past the first 64 bytes of config space; a bridge read short is listed as unreadable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from conformance.common.inputs import dataclass_from_json

EXTENDED_CONFIG_START = 0x100
PCI_EXT_CAP_ID_ACS = 0x0D
PCI_ACS_CTRL = 0x06
ACS_REDIRECTS = 0x04 | 0x08 | 0x20  # PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC
_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_IOMMU_PARAMETER = re.compile(r"^(?:intel_iommu|amd_iommu|iommu|iommu\.passthrough|iommu\.strict)=")
PASSTHROUGH, TRANSLATED, OFF = "passthrough", "translated", "off"


@dataclass(frozen=True)
class IommuFacts:
    """The IOMMU's mode for the GPUs and the bridges above them that redirect P2P traffic."""

    mode: str | None = None  # passthrough, translated, off; None: not read
    cmdline: tuple[str, ...] = ()  # the kernel's IOMMU parameters (intel_iommu=on, iommu=pt, ...)
    acs_redirect: tuple[str, ...] = ()  # bridges above a GPU with ACS P2P redirect or egress control on
    acs_unreadable: tuple[str, ...] = ()  # bridges whose ACS control could not be read (not root)

    @property
    def redirects_p2p(self) -> bool:
        return self.mode == TRANSLATED or bool(self.acs_redirect)

    def cause_text(self) -> str:
        """Why P2P between these GPUs may go through the root complex, in words ("" when nothing says so)."""
        found = []
        if self.mode == TRANSLATED:
            found.append(f"the IOMMU translates the GPUs' DMA ({' '.join(self.cmdline) or 'kernel default'})")
        if self.acs_redirect:
            found.append(f"ACS redirects P2P on bridge(s) {', '.join(self.acs_redirect)}")
        return "; ".join(found)


IOMMU_FIX = (
    "boot with the IOMMU in passthrough (iommu=pt) or off, and disable ACS redirect on the bridges "
    "(kernel pci=disable_acs_redir=<bridges>, or `setpci -s <bridge> ECAP_ACS+0x6.w=0000` as root at each boot)"
)


class IommuError(ValueError):
    """A topology file's iommu of the wrong shape."""


def iommu_from_json(data: object) -> IommuFacts:
    facts = dataclass_from_json(IommuFacts, data, "iommu", IommuError)
    if facts.mode not in (None, PASSTHROUGH, TRANSLATED, OFF):
        raise IommuError(f"iommu: mode is {facts.mode!r}, not {PASSTHROUGH}, {TRANSLATED} or {OFF}")
    return facts


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
    redirect, unreadable = [], []
    for bridge in _bridges_above(gpu_bus_ids, pci_devices):
        control = acs_control(pci_devices / bridge / "config")
        if control is None:
            unreadable.append(bridge)
        elif control & ACS_REDIRECTS:
            redirect.append(bridge)
    return IommuFacts(mode, _iommu_parameters(cmdline), tuple(redirect), tuple(unreadable))


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


def _bridges_above(gpu_bus_ids: tuple[str, ...], pci_devices: Path) -> list[str]:
    """Every bridge on the path from the root complex to each GPU (the GPUs' sysfs parents), once each."""
    bridges: list[str] = []
    for bus in gpu_bus_ids:
        try:
            path = (pci_devices / bus).resolve(strict=True)
        except OSError:
            continue
        for parent in path.parents:
            if _BUS_ID.match(parent.name) and parent.name not in bridges:
                bridges.append(parent.name)
    return sorted(bridges)


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
