"""Which ACS redirect bits above the GPUs can change a path NCCL uses: judged there, recorded elsewhere.

Linux turns ACS P2P Request and Completion Redirect on in every ACS-capable port, root ports
included, whenever an IOMMU driver asked for ACS (``drivers/pci/pci.c``: ``pci_request_acs()``,
called by the Intel and AMD IOMMU drivers, makes ``pci_enable_acs()`` run
``pci_std_enable_acs()`` on each device), with ``intel_iommu=on``, AMD's default IOMMU, or
``iommu=pt``.  So the bits say little by themselves; what they change is this (PCI Express Base
Specification, 6.12 "Access Control Services", and ``drivers/pci/p2pdma.c``, which treats a
redirecting bridge on the path between two devices as routing their traffic through the root):

* a **switch downstream port** with redirect on sends the peer requests of the GPU below it up to
  the root complex instead of across the switch: a PIX or PXB pair, which NCCL joins with P2P
  (``plan/transport.py``), then runs its P2P through the root complex, slow or hung (NCCL's
  troubleshooting guide, "PCI Access Control Services");
* a **root port** redirects traffic between root ports, which PIX and PXB pairs never cross; pairs
  across root ports (PHB, NODE, SYS) go through the root complex anyway, and NCCL's default P2P
  level (PXB) does not use P2P for them;
* a **switch upstream port** has no peer traffic of its own to redirect;
* an **NVLink** pair moves its data over NVLink, never over PCIe.

Only the first fails the check; the others are recorded, each with why it is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from conformance.discover.iommu import ROOT_PORT, SWITCH_DOWNSTREAM, SWITCH_UPSTREAM, Bridge
from conformance.discover.nvml_topology import sysfs_bus_id
from conformance.discover.topology import Device, Topology
from conformance.plan.transport import P2P, NcclHost, PairPath

P2P_CLASSES = ("PIX", "PXB")  # the PCIe paths that stay below the root complex (nvidia-smi topo -m)


@dataclass(frozen=True)
class AcsJudgement:
    """The redirecting bridges that change a path NCCL uses (each with the pairs it changes), and the rest."""

    problems: tuple[str, ...] = ()
    recorded: tuple[str, ...] = ()


def _p2p_partners(gpu: Device, topology: Topology, host: NcclHost, environ: Mapping[str, str]) -> list[str]:
    """The GPUs this one shares a PIX or PXB path with that NCCL would join with P2P (a pair's communicator)."""
    partners = []
    for other in topology.devices:
        if other is gpu:
            continue
        link = topology.link(gpu, other)
        if link not in P2P_CLASSES:
            continue
        status = topology.p2p_status(gpu, other)
        ok = None if not status else status.get("read") == "OK" and status.get("write") == "OK"
        predicted = host.pair_transport(PairPath(link, ok), 2, environ)
        if predicted is not None and predicted.transport == P2P:
            partners.append(f"{gpu.name}-{other.name} ({link})")
    return partners


def _why_not_judged(bridge: Bridge) -> str:
    if bridge.kind == ROOT_PORT:
        return "a root port: PIX and PXB pairs never cross it"
    if bridge.kind == SWITCH_UPSTREAM:
        return "a switch upstream port: no peer traffic of its own to redirect"
    if bridge.kind == SWITCH_DOWNSTREAM:
        return "no GPU below it has a PIX or PXB partner NCCL joins with P2P (NVLink or no P2P there)"
    return f"a bridge of kind {bridge.kind}: judged only as a switch downstream port"


def judge_acs(topology: Topology, host: NcclHost, environ: Mapping[str, str]) -> AcsJudgement:
    """The redirecting bridges that send a P2P pair's traffic through the root complex; the others recorded."""
    by_bus = {sysfs_bus_id(device.pci_bus_id or ""): device for device in topology.devices}
    problems, recorded = [], []
    for bridge in topology.iommu.bridges:
        if not bridge.redirects:
            continue
        pairs = []
        if bridge.kind == SWITCH_DOWNSTREAM:
            below = [by_bus[bus] for bus in bridge.gpus if bus in by_bus]
            pairs = [pair for gpu in below for pair in _p2p_partners(gpu, topology, host, environ)]
        if pairs:
            problems.append(
                f"switch downstream port {bridge.bus_id} redirects P2P (ACS control 0x{bridge.acs:04x}) for "
                f"{', '.join(pairs)}: their P2P goes through the root complex (slow, or a hang)"
            )
        else:
            recorded.append(
                f"{bridge.bus_id} redirects (ACS 0x{bridge.acs:04x}), not judged: {_why_not_judged(bridge)}"
            )
    return AcsJudgement(tuple(problems), tuple(recorded))
