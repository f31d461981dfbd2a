"""Topology discovery through NVML, against a fake ``pynvml`` shaped like nvidia-ml-py; the topology CLI.

The fake has nvidia-ml-py's function names and signatures, opaque handles, its error classes and
its constants with their real values (checked against the installed nvidia-ml-py below), and
describes whole machines: an 8-GPU NVSwitch box, a 2-socket PCIe box, a single GPU, PCIe cards
paired by NVLink bridges with MIG on one, and the ways NVML fails.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from conformance import topology
from conformance.cli import main
from conformance.topology import (
    Device,
    Topology,
    cpu_topology,
    discover,
    link_matrix_lines,
    load_topology_file,
    nvml_gpus,
    nvml_topology,
)

REPO = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------------------------
# the fake pynvml
# --------------------------------------------------------------------------------------------

# Real names, real values, as nvidia-ml-py defines them (the stray comma in CAPS_INDEX_READ included).
CONSTANTS: dict[str, Any] = {
    "NVML_FEATURE_DISABLED": 0,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_NVLINK_MAX_LINKS": 36,
    "NVML_NVLINK_DEVICE_TYPE_GPU": 0x00,
    "NVML_NVLINK_DEVICE_TYPE_IBMNPU": 0x01,
    "NVML_NVLINK_DEVICE_TYPE_SWITCH": 0x02,
    "NVML_NVLINK_DEVICE_TYPE_UNKNOWN": 0xFF,
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_UNKNOWN": 999,
    "NVML_TOPOLOGY_INTERNAL": 0,
    "NVML_TOPOLOGY_SINGLE": 10,
    "NVML_TOPOLOGY_MULTIPLE": 20,
    "NVML_TOPOLOGY_HOSTBRIDGE": 30,
    "NVML_TOPOLOGY_NODE": 40,
    "NVML_TOPOLOGY_CPU": 40,
    "NVML_TOPOLOGY_SYSTEM": 50,
    "NVML_P2P_CAPS_INDEX_READ": (0,),
    "NVML_P2P_CAPS_INDEX_WRITE": 1,
    "NVML_P2P_CAPS_INDEX_NVLINK": 2,
    "NVML_P2P_CAPS_INDEX_ATOMICS": 3,
    "NVML_P2P_CAPS_INDEX_PROP": 4,
    "NVML_P2P_CAPS_INDEX_PCI": 4,
    "NVML_P2P_CAPS_INDEX_UNKNOWN": 5,
    "NVML_P2P_STATUS_OK": 0,
    "NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED": 1,
    "NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED": 1,
    "NVML_P2P_STATUS_GPU_NOT_SUPPORTED": 2,
    "NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED": 3,
    "NVML_P2P_STATUS_DISABLED_BY_REGKEY": 4,
    "NVML_P2P_STATUS_NOT_SUPPORTED": 5,
    "NVML_P2P_STATUS_UNKNOWN": 6,
    "NVML_DEVICE_MIG_DISABLE": 0x0,
    "NVML_DEVICE_MIG_ENABLE": 0x1,
}
C = types.SimpleNamespace(**CONSTANTS)
ERROR_TEXT = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 9: "Driver Not Loaded",
              12: "NVML Shared Library Not Found", 15: "GPU is lost", 999: "Unknown Error"}  # fmt: skip


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(C.NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(C.NVML_ERROR_NOT_SUPPORTED)


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(C.NVML_ERROR_DRIVER_NOT_LOADED)


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(C.NVML_ERROR_LIBRARY_NOT_FOUND)


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(C.NVML_ERROR_GPU_IS_LOST)


ERRORS = [NVMLError, NVMLError_InvalidArgument, NVMLError_NotSupported, NVMLError_DriverNotLoaded,
          NVMLError_LibraryNotFound, NVMLError_GpuIsLost]  # fmt: skip

NvLink = tuple[str, int] | None  # (far end's bus id, far end's device type), or None: link down


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str  # as NVML spells it: 00000000:1B:00.0
    memory_mib: int
    numa: int | None  # None: nvmlDeviceGetNumaNodeId is not supported (older drivers)
    nvlinks: list[NvLink] | None = None  # None: no NVLink at all (NotSupported on link 0)
    mig: tuple[int, int] | None = (0, 0)  # (current, pending); None: MIG not supported


@dataclass
class FakeMachine:
    gpus: list[FakeGpu]
    ancestor: Callable[[int, int], int]  # NVML indices -> NVML_TOPOLOGY_*
    p2p: Callable[[int, int, int], int]  # NVML indices, caps index -> NVML_P2P_STATUS_*
    driver: str = "550.54.15"
    cuda: int = 12040
    init_error: Callable[[], NVMLError] | None = None  # an NVMLError subclass nvmlInit raises
    lost_while_listing: int | None = None  # this GPU's UUID query fails: GPU is lost
    lost: set[int] = field(default_factory=set)  # these fail every query after their identity


class FakeNVML(types.ModuleType):
    """A stand-in for nvidia-ml-py's ``pynvml`` module, with its names, signatures and constants."""

    def __init__(self, machine: FakeMachine, missing: frozenset[str] = frozenset()) -> None:
        super().__init__("pynvml")
        self.missing = missing  # functions this (older) nvidia-ml-py lacks
        self.machine = machine
        self.calls: list[str] = []
        self.handles = [object() for _ in machine.gpus]  # opaque, like c_nvmlDevice_t
        for name, value in CONSTANTS.items():
            setattr(self, name, value)
        for error in ERRORS:
            setattr(self, error.__name__, error)

    def __getattribute__(self, name: str) -> Any:
        if name in super().__getattribute__("missing"):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return super().__getattribute__(name)

    def _gpu(self, handle: object, *, identity: bool = False) -> tuple[int, FakeGpu]:
        for i, known in enumerate(self.handles):
            if handle is known:
                if i in self.machine.lost and not identity:
                    raise NVMLError_GpuIsLost()
                return i, self.machine.gpus[i]
        raise NVMLError_InvalidArgument()

    def nvmlInit(self) -> None:  # noqa: N802
        self.calls.append("nvmlInit")
        if self.machine.init_error is not None:
            raise self.machine.init_error()

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.machine.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return self.machine.cuda

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.machine.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        if not 0 <= index < len(self.handles):
            raise NVMLError_InvalidArgument()
        return self.handles[index]

    def nvmlDeviceGetUUID(self, handle: object) -> str:  # noqa: N802
        i, gpu = self._gpu(handle, identity=True)
        if i == self.machine.lost_while_listing:
            raise NVMLError_GpuIsLost()
        return gpu.uuid

    def nvmlDeviceGetName(self, handle: object) -> str:  # noqa: N802
        return self._gpu(handle, identity=True)[1].name

    def nvmlDeviceGetPciInfo(self, handle: object) -> Any:  # noqa: N802
        bus_id = self._gpu(handle, identity=True)[1].bus_id
        return types.SimpleNamespace(busId=bus_id.encode(), busIdLegacy=bus_id[4:].encode())  # c_char fields

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:  # noqa: N802
        numa = self._gpu(handle)[1].numa
        if numa is None:
            raise NVMLError_NotSupported()
        return numa

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> Any:  # noqa: N802
        total = self._gpu(handle)[1].memory_mib * 1024 * 1024
        return types.SimpleNamespace(total=total, free=total - 512 * 1024 * 1024, used=512 * 1024 * 1024)

    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:  # noqa: N802
        mig = self._gpu(device)[1].mig
        if mig is None:
            raise NVMLError_NotSupported()
        return list(mig)

    def _nvlink(self, device: object, link: int) -> NvLink:
        links = self._gpu(device)[1].nvlinks
        if links is None:
            raise NVMLError_NotSupported()
        if not 0 <= link < len(links):
            raise NVMLError_InvalidArgument()
        return links[link]

    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> int:  # noqa: N802
        return int(C.NVML_FEATURE_DISABLED if self._nvlink(device, link) is None else C.NVML_FEATURE_ENABLED)

    def _active_nvlink(self, device: object, link: int) -> tuple[str, int]:
        far_end = self._nvlink(device, link)
        if far_end is None:
            raise NVMLError_NotSupported()  # what NVML answers for a link that is down
        return far_end

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: object, link: int) -> Any:  # noqa: N802
        return types.SimpleNamespace(busId=self._active_nvlink(device, link)[0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:  # noqa: N802
        return self._active_nvlink(handle, link)[1]

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: object, device2: object) -> int:  # noqa: N802
        return self.machine.ancestor(self._gpu(device1)[0], self._gpu(device2)[0])

    def nvmlDeviceGetP2PStatus(self, device1: object, device2: object, p2pIndex: int) -> int:  # noqa: N802, N803
        if not isinstance(p2pIndex, int):  # the real one hands it to ctypes as it is
            raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter 3")
        return self.machine.p2p(self._gpu(device1)[0], self._gpu(device2)[0], p2pIndex)


def install(monkeypatch: pytest.MonkeyPatch, fake: types.ModuleType | None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake)


@pytest.fixture(autouse=True)
def no_sysfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """NUMA fallbacks read an empty stand-in for /sys/bus/pci/devices unless a test fills it."""
    sysfs = tmp_path / "sys-bus-pci-devices"
    sysfs.mkdir()
    monkeypatch.setattr(topology, "SYSFS_PCI_DEVICES", sysfs)
    return sysfs


# --------------------------------------------------------------------------------------------
# the machines
# --------------------------------------------------------------------------------------------

H100_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
NVSWITCH_BUSES = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"]


def nvswitch_box() -> FakeMachine:
    """An H100 SXM box: 8 GPUs, each with 18 active NVLinks to the NVSwitches."""
    gpus = [
        FakeGpu(uuid=f"GPU-a1b2c3d{i}-5e6f-7a8b-9c0d-1e2f3a4b5c6{i}", name="NVIDIA H100 80GB HBM3",
                bus_id=f"00000000:{bus}:00.0", memory_mib=81559, numa=i // 4,
                nvlinks=[(NVSWITCH_BUSES[link % 4], C.NVML_NVLINK_DEVICE_TYPE_SWITCH) for link in range(18)])
        for i, bus in enumerate(H100_BUSES)
    ]  # fmt: skip
    return FakeMachine(
        gpus,
        ancestor=lambda i, j: C.NVML_TOPOLOGY_NODE if i // 4 == j // 4 else C.NVML_TOPOLOGY_SYSTEM,
        p2p=lambda i, j, cap: C.NVML_P2P_STATUS_OK,
    )


PCIE_BUSES = ["1B", "1C", "3D", "3E", "9B", "9C", "B1", "DA"]
# Socket 0: gpu0+gpu1 on one PCIe switch, gpu2+gpu3 on another, both switches under a third.
# Socket 1: gpu4+gpu5 on one switch, gpu6 on another root port of that host bridge, gpu7 on a
# second host bridge.  Across the sockets: SYS.
PCIE_SWITCH = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c", 6: "d", 7: "e"}
PCIE_HOST_BRIDGE = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 2}


def pcie_ancestor(i: int, j: int) -> int:
    if i // 4 != j // 4:
        return int(C.NVML_TOPOLOGY_SYSTEM)
    if PCIE_SWITCH[i] == PCIE_SWITCH[j]:
        return int(C.NVML_TOPOLOGY_SINGLE)
    if PCIE_HOST_BRIDGE[i] != PCIE_HOST_BRIDGE[j]:
        return int(C.NVML_TOPOLOGY_NODE)
    return int(C.NVML_TOPOLOGY_MULTIPLE if i < 4 else C.NVML_TOPOLOGY_HOSTBRIDGE)


def pcie_p2p(i: int, j: int, cap: int) -> int:
    if cap == C.NVML_P2P_CAPS_INDEX_NVLINK:
        return int(C.NVML_P2P_STATUS_NOT_SUPPORTED)
    if i // 4 == j // 4:
        return int(C.NVML_P2P_STATUS_OK)
    if cap == C.NVML_P2P_CAPS_INDEX_ATOMICS:
        return int(C.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED)
    return int(C.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED)  # nvidia-ml-py's own spelling of the value


def pcie_box() -> FakeMachine:
    """Two sockets, 4 PCIe GPUs on each, no NVLink; P2P read/write only within a socket."""
    gpus = [
        FakeGpu(uuid=f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-4000-8000-00000000000{i}", name="NVIDIA L40S",
                bus_id=f"00000000:{bus}:00.0", memory_mib=46068, numa=i // 4, mig=None)
        for i, bus in enumerate(PCIE_BUSES)
    ]  # fmt: skip
    return FakeMachine(gpus, ancestor=pcie_ancestor, p2p=pcie_p2p, driver="535.183.01", cuda=12020)


def single_gpu() -> FakeMachine:
    """A workstation card; NVML reports NUMA node -1 (none)."""
    gpu = FakeGpu(uuid="GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70", name="NVIDIA RTX 6000 Ada Generation",
                  bus_id="00000000:01:00.0", memory_mib=49140, numa=-1, mig=None)  # fmt: skip
    return FakeMachine([gpu], ancestor=lambda i, j: 0, p2p=lambda i, j, cap: 0, driver="570.124.06", cuda=12080)


BRIDGED_BUSES = ["00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0", "00000000:CA:00.0"]


def bridged_box() -> FakeMachine:
    """Four A100 PCIe cards paired by NVLink bridges (0-1 and 2-3; one link of 2-3 down), MIG on gpu3.

    The driver predates nvmlDeviceGetNumaNodeId support, so NUMA nodes come from sysfs.
    """

    def bridge(peer: int, down: frozenset[int] = frozenset()) -> list[NvLink]:
        far_end = (BRIDGED_BUSES[peer], C.NVML_NVLINK_DEVICE_TYPE_GPU)
        return [None if link in down else far_end for link in range(12)]

    links = [bridge(1), bridge(0), bridge(3, frozenset({3})), bridge(2, frozenset({3}))]
    migs = [(0, 0), (0, 0), (0, 1), (1, 1)]  # gpu2: enabled only after a reset, so not yet
    gpus = [
        FakeGpu(uuid=f"GPU-b00{i}e5a1-2c3d-4e5f-8a9b-0c1d2e3f4a5b", name="NVIDIA A100 80GB PCIe",
                bus_id=bus, memory_mib=81920, numa=None, nvlinks=links[i], mig=migs[i])
        for i, bus in enumerate(BRIDGED_BUSES)
    ]  # fmt: skip
    return FakeMachine(
        gpus,
        ancestor=lambda i, j: C.NVML_TOPOLOGY_SYSTEM if i // 2 != j // 2 else C.NVML_TOPOLOGY_HOSTBRIDGE,
        p2p=lambda i, j, cap: C.NVML_P2P_STATUS_OK,
        driver="470.256.02",
        cuda=11040,
    )


@pytest.fixture
def environ_without_visible(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield


def discovered(monkeypatch: pytest.MonkeyPatch, machine: FakeMachine, environ: dict[str, str] | None = None,
               missing: frozenset[str] = frozenset()) -> tuple[Topology, FakeNVML]:  # fmt: skip
    fake = FakeNVML(machine, missing)
    install(monkeypatch, fake)
    found, reason = nvml_topology(environ or {})
    assert reason == ""
    assert found is not None
    return found, fake


ALL_OK = {"read": "OK", "write": "OK", "nvlink": "OK", "atomics": "OK"}


# --------------------------------------------------------------------------------------------
# the fake is shaped like the real module
# --------------------------------------------------------------------------------------------


def test_fake_matches_nvidia_ml_py() -> None:
    real = pytest.importorskip("pynvml")
    for name, value in CONSTANTS.items():
        assert getattr(real, name) == value, name
    assert str(real.NVMLError(15)) == str(NVMLError(15)) == "GPU is lost"
    for error in ERRORS[1:]:
        assert issubclass(getattr(real, error.__name__), real.NVMLError)
        assert str(getattr(real, error.__name__)()) == str(error())
    for name in dir(FakeNVML):
        if name.startswith("nvml"):
            assert hasattr(real, name), name


def test_p2p_status_names_from_nvidia_ml_py() -> None:
    real = pytest.importorskip("pynvml")
    assert topology.p2p_status_names(real) == {
        0: "OK", 1: "CHIPSET_NOT_SUPPORTED", 2: "GPU_NOT_SUPPORTED", 3: "IOH_TOPOLOGY_NOT_SUPPORTED",
        4: "DISABLED_BY_REGKEY", 5: "NOT_SUPPORTED", 6: "UNKNOWN",
    }  # fmt: skip


def test_p2p_status_names_from_older_nvidia_ml_py() -> None:
    """Older releases had only the misspelt name; the status is stored correctly spelt all the same."""
    old = types.SimpleNamespace(NVML_P2P_STATUS_OK=0, NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED=1)
    assert topology.p2p_status_names(old) == {0: "OK", 1: "CHIPSET_NOT_SUPPORTED"}


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [("00000000:1A:00.0", "0000:1a:00.0"), ("0000:1a:00.0", "0000:1a:00.0"), ("00010000:03:00.0", "10000:03:00.0"),
     (" 00000000:DB:00.0 ", "0000:db:00.0"), ("bogus", "bogus")],
)  # fmt: skip
def test_sysfs_bus_id(nvml: str, sysfs: str) -> None:
    assert topology.sysfs_bus_id(nvml) == sysfs


def test_cuda_version_text() -> None:
    assert [topology.cuda_version_text(v) for v in (12080, 12040, 11040, 13000)] == ["12.8", "12.4", "11.4", "13.0"]


# --------------------------------------------------------------------------------------------
# the machines, discovered
# --------------------------------------------------------------------------------------------


def test_nvswitch_box(monkeypatch: pytest.MonkeyPatch) -> None:
    found, fake = discovered(monkeypatch, nvswitch_box())
    assert (found.kind, found.source, found.note) == ("gpu", "nvml", "")
    assert [(d.name, d.index, d.nvml_index, d.numa_node) for d in found.devices] == [
        (f"gpu{i}", i, i, i // 4) for i in range(8)
    ]
    first = found.devices[0]
    assert first == Device("gpu0", 0, "gpu", "GPU-a1b2c3d0-5e6f-7a8b-9c0d-1e2f3a4b5c60", "NVIDIA H100 80GB HBM3",
                           "00000000:18:00.0", numa_node=0, memory_mib=81559, mig=False, nvml_index=0)  # fmt: skip
    assert len(found.links) == 28 and set(found.links.values()) == {"NV18"}
    assert found.links["gpu3-gpu4"] == "NV18"  # across the sockets too: NVLink beats SYS
    assert len(found.p2p) == 28 and all(status == ALL_OK for status in found.p2p.values())
    assert (found.driver, found.cuda_driver) == ("550.54.15", "12.4")
    assert fake.calls == ["nvmlInit", "nvmlShutdown"]


PCIE_MATRIX = [
    "      gpu0  gpu1  gpu2  gpu3  gpu4  gpu5  gpu6  gpu7  NUMA",
    "gpu0  X     PIX   PXB   PXB   SYS   SYS   SYS   SYS   0",
    "gpu1  PIX   X     PXB   PXB   SYS   SYS   SYS   SYS   0",
    "gpu2  PXB   PXB   X     PIX   SYS   SYS   SYS   SYS   0",
    "gpu3  PXB   PXB   PIX   X     SYS   SYS   SYS   SYS   0",
    "gpu4  SYS   SYS   SYS   SYS   X     PIX   PHB   NODE  1",
    "gpu5  SYS   SYS   SYS   SYS   PIX   X     PHB   NODE  1",
    "gpu6  SYS   SYS   SYS   SYS   PHB   PHB   X     NODE  1",
    "gpu7  SYS   SYS   SYS   SYS   NODE  NODE  NODE  X     1",
]
SAME_SOCKET = {"read": "OK", "write": "OK", "nvlink": "NOT_SUPPORTED", "atomics": "OK"}
ACROSS_SOCKETS = {"read": "CHIPSET_NOT_SUPPORTED", "write": "CHIPSET_NOT_SUPPORTED", "nvlink": "NOT_SUPPORTED",
                  "atomics": "IOH_TOPOLOGY_NOT_SUPPORTED"}  # fmt: skip


def test_two_socket_pcie_box(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, pcie_box())
    assert link_matrix_lines(found) == PCIE_MATRIX
    assert found.links["gpu0-gpu1"] == "PIX" and found.links["gpu4-gpu6"] == "PHB"
    assert found.p2p["gpu0-gpu3"] == SAME_SOCKET
    assert found.p2p["gpu3-gpu4"] == ACROSS_SOCKETS
    assert sum(status == ACROSS_SOCKETS for status in found.p2p.values()) == 16
    assert [(d.numa_node, d.memory_mib, d.mig) for d in found.devices] == [(i // 4, 46068, False) for i in range(8)]
    assert (found.driver, found.cuda_driver) == ("535.183.01", "12.2")


def test_single_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, single_gpu())
    assert [(d.name, d.model, d.memory_mib, d.numa_node, d.mig) for d in found.devices] == [
        ("gpu0", "NVIDIA RTX 6000 Ada Generation", 49140, None, False)
    ]
    assert (found.links, found.p2p, found.pairs()) == ({}, {}, [])
    assert (found.driver, found.cuda_driver) == ("570.124.06", "12.8")
    assert link_matrix_lines(found) == ["      gpu0  NUMA", "gpu0  X     N/A"]


def test_nvlink_bridges_mig_and_numa_from_sysfs(monkeypatch: pytest.MonkeyPatch, no_sysfs: Path) -> None:
    for bus, node in (("0000:17:00.0", "0\n"), ("0000:31:00.0", "0\n"), ("0000:b1:00.0", "-1\n")):
        (no_sysfs / bus).mkdir()
        (no_sysfs / bus / "numa_node").write_text(node)
    found, _ = discovered(monkeypatch, bridged_box())
    assert link_matrix_lines(found) == [
        "      gpu0  gpu1  gpu2  gpu3  NUMA",
        "gpu0  X     NV12  SYS   SYS   0",
        "gpu1  NV12  X     SYS   SYS   0",
        "gpu2  SYS   SYS   X     NV11  N/A",
        "gpu3  SYS   SYS   NV11  X     N/A",
    ]  # gpu2: sysfs says -1; gpu3: no sysfs entry
    assert [d.mig for d in found.devices] == [False, False, False, True]
    assert [d.numa_node for d in found.devices] == [0, 0, None, None]
    assert (found.driver, found.cuda_driver) == ("470.256.02", "11.4")


# --------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES
# --------------------------------------------------------------------------------------------


def test_visible_indices_rename_devices_and_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, pcie_box(), {"CUDA_VISIBLE_DEVICES": "5,7"})
    assert [(d.name, d.index, d.nvml_index, d.pci_bus_id, d.numa_node) for d in found.devices] == [
        ("gpu0", 0, 5, "00000000:9C:00.0", 1),
        ("gpu1", 1, 7, "00000000:DA:00.0", 1),
    ]
    assert found.links == {"gpu0-gpu1": "NODE"}
    assert found.p2p == {"gpu0-gpu1": SAME_SOCKET}
    assert link_matrix_lines(found) == ["      gpu0  gpu1  NUMA", "gpu0  X     NODE  1", "gpu1  NODE  X     1"]

    found, _ = discovered(monkeypatch, pcie_box(), {"CUDA_VISIBLE_DEVICES": "7,5"})
    assert [(d.name, d.nvml_index) for d in found.devices] == [("gpu0", 7), ("gpu1", 5)]
    assert found.links == {"gpu0-gpu1": "NODE"}


def test_visible_uuid_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    visible = "GPU-66666666,GPU-11111111-0000-4000-8000-000000000001"
    found, _ = discovered(monkeypatch, pcie_box(), {"CUDA_VISIBLE_DEVICES": visible})
    assert [(d.name, d.nvml_index, d.numa_node) for d in found.devices] == [("gpu0", 6, 1), ("gpu1", 1, 0)]
    assert found.links == {"gpu0-gpu1": "SYS"}
    assert found.p2p == {"gpu0-gpu1": ACROSS_SOCKETS}


@pytest.mark.parametrize(
    ("visible", "nvml_indices"),
    [("3,9,1", [3]), ("2,MIG-4f1e2d3c-aaaa-bbbb-cccc-ddddeeeeffff,0", [2]), (" 4 , 0 ", [4, 0])],
)
def test_visible_list_stops_at_first_unknown_entry(
    monkeypatch: pytest.MonkeyPatch, visible: str, nvml_indices: list[int]
) -> None:
    found, _ = discovered(monkeypatch, pcie_box(), {"CUDA_VISIBLE_DEVICES": visible})
    assert [d.nvml_index for d in found.devices] == nvml_indices


@pytest.mark.parametrize("visible", ["", "9", "GPU-ffff", "-1"])
def test_visible_selects_nothing(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    fake = FakeNVML(pcie_box())
    install(monkeypatch, fake)
    assert nvml_topology({"CUDA_VISIBLE_DEVICES": visible}) == (None, "CUDA_VISIBLE_DEVICES selects no GPU")
    assert fake.calls == ["nvmlInit", "nvmlShutdown"]


# --------------------------------------------------------------------------------------------
# failures
# --------------------------------------------------------------------------------------------


def test_pynvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None)  # import pynvml -> ImportError
    found, reason = nvml_topology({})
    assert found is None
    assert reason.startswith("nvidia-ml-py (pynvml) is not importable: ")


@pytest.mark.parametrize(
    ("error", "reason"),
    [(NVMLError_DriverNotLoaded, "NVML unavailable: Driver Not Loaded"),
     (NVMLError_LibraryNotFound, "NVML unavailable: NVML Shared Library Not Found")],
)  # fmt: skip
def test_nvml_init_fails(monkeypatch: pytest.MonkeyPatch, error: type[NVMLError], reason: str) -> None:
    fake = FakeNVML(replace(pcie_box(), init_error=error))
    install(monkeypatch, fake)
    assert nvml_topology({}) == (None, reason)
    assert fake.calls == ["nvmlInit"]  # nothing to shut down
    assert discover("auto", 3, environ={}) == cpu_topology(3, note=f"no GPU: {reason}")
    with pytest.raises(ValueError, match=f"the nccl backend needs GPUs, and none was found \\({reason}\\)"):
        discover("nccl", 3, environ={})


def test_error_while_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNVML(replace(pcie_box(), lost_while_listing=3))
    install(monkeypatch, fake)
    assert nvml_topology({}) == (None, "NVML error while listing GPUs: GPU is lost")
    assert fake.calls == ["nvmlInit", "nvmlShutdown"]
    assert discover("auto", 2, environ={}).note == "no GPU: NVML error while listing GPUs: GPU is lost"


def test_gpu_lost_after_listing_leaves_its_facts_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    found, fake = discovered(monkeypatch, replace(pcie_box(), lost={2}))
    assert [d.name for d in found.devices] == [f"gpu{i}" for i in range(8)]
    lost = found.devices[2]
    assert (lost.uuid, lost.numa_node, lost.memory_mib, lost.mig) == (
        "GPU-22222222-0000-4000-8000-000000000002", None, None, False
    )  # fmt: skip
    assert link_matrix_lines(found)[1:4] == [
        "gpu0  X     PIX   ?     PXB   SYS   SYS   SYS   SYS   0",
        "gpu1  PIX   X     ?     PXB   SYS   SYS   SYS   SYS   0",
        "gpu2  ?     ?     X     ?     ?     ?     ?     ?     N/A",
    ]
    unknown = dict.fromkeys(ALL_OK, "UNKNOWN")
    assert [key for key, status in found.p2p.items() if status == unknown] == [
        "gpu0-gpu2", "gpu1-gpu2", "gpu2-gpu3", "gpu2-gpu4", "gpu2-gpu5", "gpu2-gpu6", "gpu2-gpu7"
    ]  # fmt: skip
    assert found.p2p["gpu0-gpu1"] == SAME_SOCKET
    assert fake.calls == ["nvmlInit", "nvmlShutdown"]


def test_older_nvidia_ml_py_without_some_functions(monkeypatch: pytest.MonkeyPatch, no_sysfs: Path) -> None:
    (no_sysfs / "0000:18:00.0").mkdir()
    (no_sysfs / "0000:18:00.0" / "numa_node").write_text("1\n")
    missing = frozenset({"nvmlDeviceGetNumaNodeId", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetMigMode"})
    found, _ = discovered(monkeypatch, nvswitch_box(), missing=missing)
    assert [d.numa_node for d in found.devices] == [1, None, None, None, None, None, None, None]
    assert set(found.links.values()) == {"NV18"}
    assert (found.driver, found.cuda_driver) == ("550.54.15", None)


def test_nvswitch_links_unknown_without_remote_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the far end's type, a link to an NVSwitch leads to no GPU: the PCIe class remains."""
    found, _ = discovered(monkeypatch, nvswitch_box(), missing=frozenset({"nvmlDeviceGetNvLinkRemoteDeviceType"}))
    assert (found.links["gpu0-gpu1"], found.links["gpu0-gpu7"]) == ("NODE", "SYS")


# --------------------------------------------------------------------------------------------
# nvml_gpus and discover
# --------------------------------------------------------------------------------------------


def test_nvml_gpus_is_the_identity_view(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeNVML(pcie_box()))
    gpus, reason = nvml_gpus({"CUDA_VISIBLE_DEVICES": "6"})
    assert (gpus, reason) == ([Device("gpu0", 0, "gpu", "GPU-66666666-0000-4000-8000-000000000006", "NVIDIA L40S",
                                      "00000000:B1:00.0")], "")  # fmt: skip


def test_discover_uses_nvml_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeNVML(pcie_box()))
    environ = {"CUDA_VISIBLE_DEVICES": "5,7"}
    assert discover("auto", 4, environ=environ) == nvml_topology(environ)[0]
    assert discover("nccl", 4, environ=environ).links == {"gpu0-gpu1": "NODE"}


def test_link_matrix_of_cpu_and_file_topologies() -> None:
    assert link_matrix_lines(cpu_topology(4)) == []
    gpus = tuple(Device(f"gpu{i}", i, "gpu") for i in range(3))
    partial = Topology("gpu", gpus, "t.json", links={"gpu0-gpu1": "NV4"})
    assert link_matrix_lines(partial) == [
        "      gpu0  gpu1  gpu2  NUMA",
        "gpu0  X     NV4   ?     N/A",
        "gpu1  NV4   X     ?     N/A",
        "gpu2  ?     ?     X     N/A",
    ]


# --------------------------------------------------------------------------------------------
# python -m conformance topology
# --------------------------------------------------------------------------------------------

PCIE_TABLE = """\
8 GPUs from NVML

device  NVML  model        UUID                                      bus id            NUMA  memory     MIG
gpu0    0     NVIDIA L40S  GPU-00000000-0000-4000-8000-000000000000  00000000:1B:00.0  0     46068 MiB  off
gpu1    1     NVIDIA L40S  GPU-11111111-0000-4000-8000-000000000001  00000000:1C:00.0  0     46068 MiB  off
gpu2    2     NVIDIA L40S  GPU-22222222-0000-4000-8000-000000000002  00000000:3D:00.0  0     46068 MiB  off
gpu3    3     NVIDIA L40S  GPU-33333333-0000-4000-8000-000000000003  00000000:3E:00.0  0     46068 MiB  off
gpu4    4     NVIDIA L40S  GPU-44444444-0000-4000-8000-000000000004  00000000:9B:00.0  1     46068 MiB  off
gpu5    5     NVIDIA L40S  GPU-55555555-0000-4000-8000-000000000005  00000000:9C:00.0  1     46068 MiB  off
gpu6    6     NVIDIA L40S  GPU-66666666-0000-4000-8000-000000000006  00000000:B1:00.0  1     46068 MiB  off
gpu7    7     NVIDIA L40S  GPU-77777777-0000-4000-8000-000000000007  00000000:DA:00.0  1     46068 MiB  off

Links (as nvidia-smi topo -m):
{matrix}

NVML P2P status where not OK throughout:
  read OK, write OK, nvlink NOT_SUPPORTED, atomics OK: gpu0-gpu1 gpu0-gpu2 gpu0-gpu3 gpu1-gpu2 gpu1-gpu3 \
gpu2-gpu3 gpu4-gpu5 gpu4-gpu6 gpu4-gpu7 gpu5-gpu6 gpu5-gpu7 gpu6-gpu7
  read CHIPSET_NOT_SUPPORTED, write CHIPSET_NOT_SUPPORTED, nvlink NOT_SUPPORTED, atomics IOH_TOPOLOGY_NOT_SUPPORTED: \
gpu0-gpu4 gpu0-gpu5 gpu0-gpu6 gpu0-gpu7 gpu1-gpu4 gpu1-gpu5 gpu1-gpu6 gpu1-gpu7 gpu2-gpu4 gpu2-gpu5 gpu2-gpu6 \
gpu2-gpu7 gpu3-gpu4 gpu3-gpu5 gpu3-gpu6 gpu3-gpu7

Driver 535.183.01, CUDA driver 12.2
""".format(matrix="\n".join(PCIE_MATRIX))


def test_cli_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                   environ_without_visible: None) -> None:  # fmt: skip
    install(monkeypatch, FakeNVML(pcie_box()))
    assert main(["topology"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (PCIE_TABLE, "")


def test_cli_table_nvswitch_and_mig(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                   environ_without_visible: None) -> None:  # fmt: skip
    install(monkeypatch, FakeNVML(nvswitch_box()))
    assert main(["topology"]) == 0
    out = capsys.readouterr().out
    assert "\nNVML P2P status: OK for every pair\n" in out
    assert "gpu7  NV18  NV18  NV18  NV18  NV18  NV18  NV18  X     1\n" in out
    install(monkeypatch, FakeNVML(bridged_box()))
    assert main(["topology"]) == 0
    out = capsys.readouterr().out
    uuid = "GPU-b003e5a1-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    assert f"gpu3    3     NVIDIA A100 80GB PCIe  {uuid}  00000000:CA:00.0  -     81920 MiB  on\n" in out
    assert "  read OK, write OK, nvlink OK, atomics OK" not in out


def test_cli_json_round_trip(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             environ_without_visible: None) -> None:  # fmt: skip
    install(monkeypatch, FakeNVML(pcie_box()))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,1")
    assert main(["topology", "--json"]) == 0
    out = capsys.readouterr().out
    found = nvml_topology({"CUDA_VISIBLE_DEVICES": "5,7,1"})[0]
    assert found is not None
    assert out == found.to_json(indent=2) + "\n"
    saved = tmp_path / "t.json"
    saved.write_text(out)
    assert load_topology_file(saved, "test") == replace(found, source=str(saved))

    install(monkeypatch, None)  # the file stands in for NVML
    assert main(["topology", "--topology-file", str(saved), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again == {**json.loads(out), "source": str(saved)}
    assert main(["topology", "--topology-file", str(saved)]) == 0
    table = capsys.readouterr().out
    assert table.startswith(f"3 GPUs from file {saved}\n")
    assert "gpu0  X     NODE  SYS   1\n" in table


def test_cli_without_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    install(monkeypatch, FakeNVML(replace(pcie_box(), init_error=NVMLError_DriverNotLoaded)))
    assert main(["topology", "--virtual-devices", "2"]) == 0
    assert capsys.readouterr().out == (
        "2 CPU devices (virtual, gloo): cpu0 cpu1\n\nNote: no GPU: NVML unavailable: Driver Not Loaded\n"
    )
    assert main(["topology", "--json", "--virtual-devices", "2"]) == 0
    assert Topology.from_json(capsys.readouterr().out) == cpu_topology(
        2, note="no GPU: NVML unavailable: Driver Not Loaded"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topology", "--topology-file", "{missing}"],
         "python -m conformance topology: --topology-file: topology file '{missing}' cannot be read: "
         "No such file or directory"),
        (["topology", "--topology-file", "{garbage}"],
         "python -m conformance topology: --topology-file: topology file '{garbage}' is not a topology: "
         "Expecting value: line 1 column 1 (char 0)"),
        (["topology", "--virtual-devices", "0"],
         "python -m conformance: error: argument --virtual-devices: expected a whole number of at least 1, got '0'"),
        ([], "python -m conformance: error: the following arguments are required: COMMAND"),
        (["topolgy"], "python -m conformance: error: argument COMMAND: invalid choice: 'topolgy' (choose from "
                      "'topology', 'recommend', 'compare', 'report', 'merge-junit')"),
    ],
)  # fmt: skip
def test_cli_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str) -> None:
    paths = {"missing": str(tmp_path / "missing.json"), "garbage": str(tmp_path / "garbage.json")}
    (tmp_path / "garbage.json").write_text("not json\n")
    assert main([arg.format(**paths) for arg in argv]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message.format(**paths) + "\n")


def run_module(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run([sys.executable, "-m", "conformance", *args], cwd=REPO, env={**environ, **env},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


NO_GPU_REASONS = ("no GPU: NVML unavailable: ", "no GPU: nvidia-ml-py (pynvml) is not importable: ")


def test_module_entry_point_end_to_end() -> None:
    """The real discovery in a fresh interpreter: on a machine without NVML, a CPU topology saying why."""
    done = run_module("topology", "--json")
    assert (done.returncode, done.stderr) == (0, "")
    data = json.loads(done.stdout)
    if data["kind"] == "gpu":  # a machine with GPUs and a driver: NVML found them
        assert data["source"] == "nvml" and data["devices"]
    else:
        assert [d["name"] for d in data["devices"]] == ["cpu0", "cpu1", "cpu2", "cpu3"]
        assert data["note"].startswith(NO_GPU_REASONS), data["note"]
    hidden = run_module("topology", "--json", "--virtual-devices", "2", CUDA_VISIBLE_DEVICES="")
    data = json.loads(hidden.stdout)
    assert (hidden.returncode, data["kind"], len(data["devices"])) == (0, "cpu", 2)
    assert data["note"].startswith(NO_GPU_REASONS) or data["note"] == "no GPU: CUDA_VISIBLE_DEVICES selects no GPU"
