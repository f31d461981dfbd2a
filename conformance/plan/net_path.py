"""Whether NCCL sends two GPUs' traffic over the network inside one node (``ncclTopoCheckNet``).

NCCL's ``p2p.cc`` ("Check if NET would work better") and ``shm.cc`` both ask ``ncclTopoCheckNet``
(src/graph/paths.cc, v2.18.3-1 to v2.30.7-1): unless ``NCCL_NET_DISABLE_INTRA=1``, two GPUs use the
network when each reaches a NIC at PXB or better with more bandwidth than their own path.  Path
bandwidths are the lowest link on the path, NCCL's figures (src/graph/topo.h and topo.cc,
v2.23.4-1):

* a PCIe link: lanes x the generation's rate / 80 GB/s (``kvDictPciGen``: 60 for Gen3 .. 240 for
  Gen5; unknown: Gen3 x16, 12 GB/s), the maximum the device and its port allow;
* NVLink: links x the GPU generation's figure (``SM90_NVLINK_BW`` 20.6, 86: 12, 80 and 70: 20, 60: 18);
* between CPU sockets (``ncclTopoGetInterCpuBw``): AMD 16, Intel 10 from Skylake on (6 before; the
  model is not read here, so 10), ARM 6, POWER9 32, Zhaoxin 6;
* a NIC: its port rate (Mb/s / 8000, GB/s), and its own PCIe link.

So on 8-GPU PCIe servers with a GPUDirect NIC under each group of GPUs, the pairs across sockets
(16 GB/s on AMD, 10 on Intel) use the NIC (24 GB/s at Gen4) and not SHM.  Under ``NCCL_IB_DISABLE=1``
(or ``NCCL_NET`` naming another network) the IB NICs are gone; the suite takes the socket NICs
left as never within PXB of a GPU (they seldom are), so the pair falls back to P2P or SHM.
"""

from __future__ import annotations

from collections.abc import Mapping

from conformance.discover.cpu import AMD, ARM, INTEL, ZHAOXIN
from conformance.discover.rdma import Nic
from conformance.discover.topology import Device, Topology

PCI_LANE = {1: 15, 2: 30, 3: 60, 4: 120, 5: 240, 6: 480}  # topo.cc kvDictPciGen: x100 Mb/s per lane
PCI_UNKNOWN = 60  # kvDictPciGen's fallback: Gen3
NVLINK_BW = ((9.0, 20.6), (8.6, 12.0), (8.0, 20.0), (7.0, 20.0), (6.0, 18.0))  # topo.h, by compute capability
NVLINK_UNKNOWN = 20.0  # topo.h's default (SM80_NVLINK_BW)
INTER_CPU_BW = {AMD: 16.0, INTEL: 10.0, ARM: 6.0, ZHAOXIN: 6.0, "power": 32.0}
LOC_BW = 5000.0  # topo.h: no inter-CPU figure (an unknown CPU)
NEAR = ("PIX", "PXB")  # ncclTopoCheckNet: a NIC at PATH_PXB or better


def pci_bw(gen: int | None, width: int | None) -> float:
    return (width or 16) * PCI_LANE.get(gen or 0, PCI_UNKNOWN) / 80.0


def _gpu_pci(topology: Topology, gpu: Device) -> float:
    health = topology.health.get(gpu.name)
    return pci_bw(health.pcie_max_gen if health else None, health.pcie_max_width if health else None)


def _nvlink_bw(gpu: Device) -> float:
    try:
        value = float(gpu.compute_capability) if gpu.compute_capability else None
    except ValueError:
        value = None
    if value is None:
        return NVLINK_UNKNOWN
    return next((bw for floor, bw in NVLINK_BW if value >= floor), NVLINK_UNKNOWN)


def gpu_pair_bw(topology: Topology, a: Device, b: Device) -> float:
    """The bandwidth NCCL gives the path between two GPUs of the node."""
    link = topology.link(a, b)
    if link.startswith("NV") and link[2:].isdigit():
        return int(link[2:]) * min(_nvlink_bw(a), _nvlink_bw(b))
    bw = min(_gpu_pci(topology, a), _gpu_pci(topology, b))
    return min(bw, INTER_CPU_BW.get(topology.cpu, LOC_BW)) if link == "SYS" else bw


def nic_bw(topology: Topology, gpu: Device, nic: Nic) -> float | None:
    """What a GPU reaches the network with through this NIC (None: the NIC is farther than PXB)."""
    if nic.paths.get(gpu.name) not in NEAR:
        return None
    return min(_gpu_pci(topology, gpu), pci_bw(nic.pcie_gen, nic.pcie_width), nic.rate_gbps / 8.0)


def net_better(topology: Topology, a: Device, b: Device) -> bool:
    """Each GPU reaches a NIC faster than the other GPU: NCCL would send their traffic over the network."""
    if not topology.nics:
        return False
    own = gpu_pair_bw(topology, a, b)
    return all(best_nic_bw(topology, gpu) > own for gpu in (a, b))


def best_nic_bw(topology: Topology, gpu: Device) -> float:
    return max((bw for nic in topology.nics if (bw := nic_bw(topology, gpu, nic)) is not None), default=0.0)


def network_off(environ: Mapping[str, str]) -> str | None:
    """Why NCCL would not use the network inside the node under ``environ`` (None: it may)."""
    if environ.get("NCCL_NET_DISABLE_INTRA", "").strip() == "1":
        return "NCCL_NET_DISABLE_INTRA=1"
    if environ.get("NCCL_IB_DISABLE", "").strip() == "1":
        return "NCCL_IB_DISABLE=1"
    net = environ.get("NCCL_NET", "").strip()
    if net and net.upper() != "IB":
        return f"NCCL_NET={net}"
    return None
