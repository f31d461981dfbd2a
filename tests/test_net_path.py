"""NET inside a node: NCCL's ncclTopoCheckNet (src/graph/paths.cc) with its bandwidth figures (topo.h, topo.cc)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.discover.health import GpuHealth
from conformance.discover.rdma import Nic, RdmaFacts, RdmaPort, nics_from_json, pci_path_class, read_nics
from conformance.discover.topology import Topology
from conformance.plan.matrix import BUILTIN_LADDER
from conformance.plan.net_path import gpu_pair_bw, net_better, pci_bw
from conformance.plan.relevance import Between, cannot_change
from conformance.plan.transport import NcclHost, pair_paths

BOX = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies" / "amd-pcie-2nic-8gpu.json"


@pytest.fixture
def box() -> Topology:
    return Topology.from_json(BOX.read_text())


def test_nccl_s_pcie_figures() -> None:
    assert pci_bw(3, 16) == 12.0 and pci_bw(4, 16) == 24.0 and pci_bw(5, 16) == 48.0  # topo.h PCI_BW: Gen3 x16
    assert pci_bw(None, None) == 12.0  # kvDictPciGen's fallback, width 16 where sysfs says none


def test_cross_socket_pairs_of_the_amd_box_use_the_nic(box: Topology) -> None:
    gpu = {d.name: d for d in box.devices}
    assert gpu_pair_bw(box, gpu["gpu0"], gpu["gpu4"]) == 16.0  # AMD_BW between the sockets
    assert net_better(box, gpu["gpu0"], gpu["gpu4"]) and net_better(box, gpu["gpu3"], gpu["gpu6"])
    assert not net_better(box, gpu["gpu0"], gpu["gpu1"]) and not net_better(box, gpu["gpu0"], gpu["gpu2"])
    host = NcclHost(box.cpu, box.nccl, box.cuda_driver)
    paths = pair_paths(box, box.devices)
    assert host.summary(paths, 8, {}) == {"PIX": "P2P", "PXB": "P2P", "SYS": "NET"}
    for off in ({"NCCL_NET_DISABLE_INTRA": "1"}, {"NCCL_IB_DISABLE": "1"}, {"NCCL_NET": "Socket"}):
        assert host.summary(paths, 8, off)["SYS"] == "SHM", off
    two = pair_paths(box, (gpu["gpu0"], gpu["gpu4"]))
    assert host.summary(two, 2, {}) == {"SYS": "NET"}  # AMD with 2 GPUs allows P2P over SYS: NET still wins


def test_what_keeps_a_pair_off_the_nic(box: Topology) -> None:
    gpu = {d.name: d for d in box.devices}
    slow_nics = replace(box, nics=tuple(replace(n, rate_gbps=100.0) for n in box.nics))  # 12.5 GB/s < AMD's 16
    assert not net_better(slow_nics, gpu["gpu0"], gpu["gpu4"])
    far = replace(box, nics=tuple(replace(n, paths={g: "PHB" for g in n.paths}) for n in box.nics))
    assert not net_better(far, gpu["gpu0"], gpu["gpu4"])  # a NIC beyond PXB is not looked at
    intel_gen3 = replace(
        box, cpu="intel", health={n: replace(h, pcie_max_gen=3) for n, h in box.health.items()}
    )  # 12 GB/s GPUs, 10 between the sockets: a 24 GB/s NIC path limited to the GPU's 12 still wins
    assert net_better(intel_gen3, gpu["gpu0"], gpu["gpu4"])
    nvlink = replace(box, links={**box.links, "gpu0-gpu4": "NV4"})
    assert not net_better(nvlink, gpu["gpu0"], gpu["gpu4"])  # 4 x 20 GB/s


def test_ib_off_is_tried_where_nccl_uses_the_network(box: Topology) -> None:
    host = NcclHost(box.cpu, box.nccl, box.cuda_driver)
    ladder = list(BUILTIN_LADDER)
    ib_off = next(i for i, r in enumerate(ladder) if r.name == "ib_off")
    gpu = {d.name: d for d in box.devices}
    across = Between(2, pair_paths(box, (gpu["gpu0"], gpu["gpu4"])))
    within = Between(2, pair_paths(box, (gpu["gpu0"], gpu["gpu1"])))
    assert cannot_change(ladder, ib_off, across, host, {}) is None
    assert "NCCL uses no network there" in (cannot_change(ladder, ib_off, within, host, {}) or "")


def test_a_topology_file_s_nics_of_the_wrong_shape_are_left_out() -> None:
    good = {"device": "mlx5_0", "pci": "0000:1a:00.0", "rate_gbps": 200, "paths": {"gpu0": "PIX"}}
    assert nics_from_json([good, {"device": "x"}, "junk", {**good, "paths": "PIX"}]) == (
        Nic("mlx5_0", "0000:1a:00.0", 200, paths={"gpu0": "PIX"}),
    )


def sysfs_function(root: Path, *chain: str, numa: int = 0, speed: str = "16.0 GT/s PCIe", width: int = 16) -> Path:
    """A PCI function under /sys/devices/<chain>, and its /sys/bus/pci/devices link, as the kernel lays them out."""
    folder = root / "devices" / Path(*chain)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("numa_node", str(numa)), ("max_link_speed", speed), ("max_link_width", str(width))):
        (folder / name).write_text(text + "\n")
    link = root / "bus" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(folder)
    return link


def test_the_path_between_a_gpu_and_a_nic_read_from_sysfs(tmp_path: Path) -> None:
    switch = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")  # root port, switch upstream port
    gpu = sysfs_function(tmp_path, *switch, "0000:02:08.0", "0000:18:00.0")
    nic = sysfs_function(tmp_path, *switch, "0000:02:10.0", "0000:1a:00.0")
    deeper = sysfs_function(tmp_path, *switch, "0000:02:14.0", "0000:20:00.0", "0000:21:08.0", "0000:22:00.0")
    other_root = sysfs_function(tmp_path, "pci0000:40", "0000:40:01.0", "0000:41:00.0", numa=0)
    other_cpu = sysfs_function(tmp_path, "pci0000:80", "0000:80:01.0", "0000:81:00.0", numa=1)
    assert pci_path_class(gpu, nic) == "PIX"  # one switch between them
    assert pci_path_class(deeper, nic) == "PXB"  # two switches
    assert pci_path_class(gpu, other_root) == "PHB"  # another host bridge of the same NUMA node
    assert pci_path_class(gpu, other_cpu) == "SYS"
    port = RdmaPort("mlx5_0", 1, "ACTIVE", "LinkUp", 200.0, "InfiniBand", pci="0000:1a:00.0")
    down = RdmaPort("mlx5_1", 1, "DOWN", "Polling", 200.0, "InfiniBand", pci="0000:81:00.0")
    (found,) = read_nics(RdmaFacts((port, down)), {"gpu0": "0000:18:00.0", "gpu1": "0000:22:00.0"}, tmp_path / "bus")
    assert found == Nic("mlx5_0", "0000:1a:00.0", 200.0, 4, 16, {"gpu0": "PIX", "gpu1": "PXB"})
    assert json.loads(json.dumps(found.to_json())) == {**found.to_json(), "paths": {"gpu0": "PIX", "gpu1": "PXB"}}


def test_a_gpu_without_known_health_is_gen3_x16(box: Topology) -> None:
    bare = replace(box, health={n: GpuHealth() for n in box.health})
    gpu = {d.name: d for d in box.devices}
    assert gpu_pair_bw(bare, gpu["gpu0"], gpu["gpu1"]) == 12.0
