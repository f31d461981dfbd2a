"""Topology discovery through the real nvidia-ml-py over a fake libnvidia-ml (tests/fake_nvml.py); the topology CLI.

The machines: an 8-GPU NVSwitch box, a 2-socket PCIe box, a single GPU, PCIe cards paired by NVLink
bridges with MIG instances on one; and the ways NVML fails: no library, no driver, a lost GPU,
functions an older driver lacks, NoPermission in a container, NotSupported, Unknown.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

import fake_nvml as nv
from conformance.cli.main import main
from conformance.discover import inventory
from conformance.discover.inventory import HostPaths, Inventory
from conformance.discover.iommu import IommuFacts
from conformance.discover.nvml_topology import cuda_version_text, nvml_gpus, nvml_view, p2p_status_names, sysfs_bus_id
from conformance.discover.topology import (
    Device,
    DeviceSelectionError,
    Topology,
    TopologyError,
    cpu_topology,
    link_matrix_lines,
    link_note_lines,
)
from conformance.discover.topology_source import discover, load_topology_file
from fake_nvml import Failure, FakeMachine, FakeNvmlLibrary

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_sysfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """NUMA fallbacks read an empty stand-in for /sys/bus/pci/devices unless a test fills it."""
    sysfs = tmp_path / "sys-bus-pci-devices"
    sysfs.mkdir()
    monkeypatch.setattr("conformance.discover.nvml_topology.SYSFS_PCI_DEVICES", sysfs)
    no = tmp_path / "none"
    nvidia = (no / "proc-driver-nvidia-version", no / "dev-nvidia0")
    host = HostPaths(
        sysfs, *nvidia, (), no / "cmdline", (no,), no / "kmsg", no / "cpuinfo", no / "dmi", no / "osrelease"
    )
    monkeypatch.setattr(inventory, "DEFAULT_HOST", host)  # a machine without NVIDIA's traces, unless a test adds them
    return sysfs


def nvml_topology(environ: dict[str, str]) -> tuple[Topology | None, str]:
    view = nvml_view(environ)
    return view.topology, view.reason


@pytest.fixture
def environ_without_visible(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield


def discovered(monkeypatch: pytest.MonkeyPatch, machine: FakeMachine, environ: dict[str, str] | None = None
               ) -> tuple[Topology, FakeNvmlLibrary]:  # fmt: skip
    library = nv.install(monkeypatch, machine)
    found, reason = nvml_topology(environ or {})
    assert reason == ""
    assert found is not None
    assert library.initialised == 0, "NVML shut down after discovery"
    return found, library


def with_failures(machine: FakeMachine, *failures: Failure) -> FakeMachine:
    return replace(machine, failures=[*machine.failures, *failures])


def without(machine: FakeMachine, *symbols: str) -> FakeMachine:
    return replace(machine, missing=[*machine.missing, *symbols])


def selection_error(monkeypatch: pytest.MonkeyPatch, machine: FakeMachine, visible: str) -> str:
    library = nv.install(monkeypatch, machine)
    with pytest.raises(DeviceSelectionError) as caught:
        nvml_topology({"CUDA_VISIBLE_DEVICES": visible})
    assert library.initialised == 0
    return str(caught.value)


ALL_OK = {"read": "OK", "write": "OK", "nvlink": "OK", "atomics": "OK"}
UNKNOWN_P2P = dict.fromkeys(ALL_OK, "UNKNOWN")

# --------------------------------------------------------------------------------------------
# the fake is what the real pynvml expects
# --------------------------------------------------------------------------------------------

# Each wrapper topology.py calls, with the symbol it calls in the driver's library.
WRAPPER_SYMBOLS = [
    ("nvmlInit", "nvmlInitWithFlags"),
    ("nvmlSystemGetDriverVersion", "nvmlSystemGetDriverVersion"),
    ("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion"),
    ("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"),
    ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2"),
    ("nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByUUID"),
    ("nvmlDeviceGetUUID", "nvmlDeviceGetUUID"),
    ("nvmlDeviceGetName", "nvmlDeviceGetName"),
    ("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3"),
    ("nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNumaNodeId"),
    ("nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetCudaComputeCapability"),
    ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo"),
    ("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode"),
    ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkState"),
    ("nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNvLinkRemoteDeviceType"),
    ("nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkRemotePciInfo_v2"),
    ("nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetTopologyCommonAncestor"),
    ("nvmlDeviceGetP2PStatus", "nvmlDeviceGetP2PStatus"),
    ("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMaxMigDeviceCount"),
    ("nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetMigDeviceHandleByIndex"),
    ("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle"),
    ("nvmlDeviceIsMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle"),
    *((name, name) for name in ("nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth",
                                "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
                                "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
                                "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetGpuFabricInfo",
                                "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetComputeMode",
                                "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetNvLinkVersion")),
    ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3"),
    ("nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetNvLinkErrorCounter"),
    ("nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPcieReplayCounter"),
    ("nvmlEventSetCreate", "nvmlEventSetCreate"),
    ("nvmlDeviceRegisterEvents", "nvmlDeviceRegisterEvents"),
    ("nvmlEventSetWait_v2", "nvmlEventSetWait_v2"),
    ("nvmlEventSetFree", "nvmlEventSetFree"),
    ("nvmlShutdown", "nvmlShutdown"),
]  # fmt: skip


EVENTS: dict[str, Any] = {}  # the event set the event wrappers are called with


def call_wrapper(name: str) -> Any:
    """Call a pynvml wrapper with arguments that make sense on the bridged box (MIG on GPU 3)."""
    gpu3 = pynvml.nvmlDeviceGetHandleByIndex(3)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 0)
    events = EVENTS.setdefault("set", pynvml.nvmlEventSetCreate())
    arguments: dict[str, tuple[Any, ...]] = {
        "nvmlDeviceGetHandleByIndex": (0,),
        "nvmlDeviceGetHandleByUUID": (nv.bridged_box().gpus[0].uuid,),
        "nvmlDeviceGetNvLinkState": (gpu3, 0),
        "nvmlDeviceGetNvLinkRemoteDeviceType": (gpu3, 0),
        "nvmlDeviceGetNvLinkRemotePciInfo": (gpu3, 0),
        "nvmlDeviceGetTopologyCommonAncestor": (gpu3, pynvml.nvmlDeviceGetHandleByIndex(0)),
        "nvmlDeviceGetP2PStatus": (gpu3, pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_P2P_CAPS_INDEX_WRITE),
        "nvmlDeviceGetMigDeviceHandleByIndex": (gpu3, 1),
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": (mig,),
        "nvmlDeviceIsMigDeviceHandle": (mig,),
        "nvmlDeviceGetTotalEccErrors": (gpu3, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
        "nvmlDeviceGetGpuFabricInfo": (gpu3, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_t())),
        "nvmlDeviceGetNvLinkVersion": (gpu3, 0),
        "nvmlDeviceGetNvLinkErrorCounter": (gpu3, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
        "nvmlEventSetCreate": (),
        "nvmlDeviceRegisterEvents": (gpu3, pynvml.nvmlEventTypeXidCriticalError, events),
        "nvmlEventSetWait_v2": (events, 10),
        "nvmlEventSetFree": (events,),
    }
    no_device = ("nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
                 "nvmlDeviceGetCount")  # fmt: skip
    args = () if name in no_device else arguments.get(name, (gpu3,))
    return getattr(pynvml, name)(*args)


def test_pynvml_internals_the_fake_relies_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A future nvidia-ml-py that loads, caches or calls its library otherwise fails here first."""
    for name in ("nvmlLib", "_nvmlGetFunctionPointer", "_nvmlLib_refcount", "CDLL", "c_nvmlDevice_t",
                 "nvmlPciInfo_t", "c_nvmlMemory_t", "NVMLError_FunctionNotFound"):  # fmt: skip
        assert hasattr(pynvml, name), name
    assert isinstance(pynvml._nvmlGetFunctionPointer_cache, dict)
    library = nv.install(monkeypatch, nv.bridged_box())
    pynvml.nvmlInit()
    for wrapper, symbol in WRAPPER_SYMBOLS:
        with contextlib.suppress(pynvml.NVMLError):  # NUMA is not supported there: called all the same
            call_wrapper(wrapper)
        assert library.calls[-1] == symbol, wrapper
    assert {symbol for _, symbol in WRAPPER_SYMBOLS} | {"nvmlErrorString"} == set(nv.SIGNATURES)
    assert pynvml._nvmlGetFunctionPointer_cache["nvmlDeviceGetCount_v2"] is library.nvmlDeviceGetCount_v2


# nvml.h's values, under the names nvidia-ml-py gives them.
NVML_VALUES = {
    "NVML_SUCCESS": nv.SUCCESS, "NVML_ERROR_UNINITIALIZED": nv.ERROR_UNINITIALIZED,
    "NVML_ERROR_INVALID_ARGUMENT": nv.ERROR_INVALID_ARGUMENT, "NVML_ERROR_NOT_SUPPORTED": nv.ERROR_NOT_SUPPORTED,
    "NVML_ERROR_NO_PERMISSION": nv.ERROR_NO_PERMISSION, "NVML_ERROR_NOT_FOUND": nv.ERROR_NOT_FOUND,
    "NVML_ERROR_INSUFFICIENT_SIZE": nv.ERROR_INSUFFICIENT_SIZE,
    "NVML_ERROR_DRIVER_NOT_LOADED": nv.ERROR_DRIVER_NOT_LOADED, "NVML_ERROR_GPU_IS_LOST": nv.ERROR_GPU_IS_LOST,
    "NVML_ERROR_UNKNOWN": nv.ERROR_UNKNOWN,
    "NVML_TOPOLOGY_INTERNAL": nv.TOPOLOGY_INTERNAL, "NVML_TOPOLOGY_SINGLE": nv.TOPOLOGY_SINGLE,
    "NVML_TOPOLOGY_MULTIPLE": nv.TOPOLOGY_MULTIPLE, "NVML_TOPOLOGY_HOSTBRIDGE": nv.TOPOLOGY_HOSTBRIDGE,
    "NVML_TOPOLOGY_NODE": nv.TOPOLOGY_NODE, "NVML_TOPOLOGY_CPU": nv.TOPOLOGY_NODE,
    "NVML_TOPOLOGY_SYSTEM": nv.TOPOLOGY_SYSTEM,
    "NVML_P2P_CAPS_INDEX_WRITE": nv.CAPS_WRITE, "NVML_P2P_CAPS_INDEX_NVLINK": nv.CAPS_NVLINK,
    "NVML_P2P_CAPS_INDEX_ATOMICS": nv.CAPS_ATOMICS, "NVML_P2P_CAPS_INDEX_PCI": nv.CAPS_PCI,
    "NVML_P2P_STATUS_OK": nv.P2P_OK, "NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED": nv.P2P_CHIPSET_NOT_SUPPORTED,
    "NVML_P2P_STATUS_GPU_NOT_SUPPORTED": nv.P2P_GPU_NOT_SUPPORTED,
    "NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED": nv.P2P_IOH_TOPOLOGY_NOT_SUPPORTED,
    "NVML_P2P_STATUS_DISABLED_BY_REGKEY": nv.P2P_DISABLED_BY_REGKEY,
    "NVML_P2P_STATUS_NOT_SUPPORTED": nv.P2P_NOT_SUPPORTED, "NVML_P2P_STATUS_UNKNOWN": nv.P2P_UNKNOWN,
    "NVML_NVLINK_DEVICE_TYPE_GPU": nv.LINK_TO_GPU, "NVML_NVLINK_DEVICE_TYPE_IBMNPU": nv.LINK_TO_IBMNPU,
    "NVML_NVLINK_DEVICE_TYPE_SWITCH": nv.LINK_TO_SWITCH,
    "NVML_FEATURE_DISABLED": nv.FEATURE_DISABLED, "NVML_FEATURE_ENABLED": nv.FEATURE_ENABLED,
    "NVML_DEVICE_MIG_DISABLE": nv.MIG_DISABLE, "NVML_DEVICE_MIG_ENABLE": nv.MIG_ENABLE,
    "NVML_COMPUTEMODE_DEFAULT": nv.COMPUTE_DEFAULT, "NVML_COMPUTEMODE_PROHIBITED": nv.COMPUTE_PROHIBITED,
    "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS": nv.COMPUTE_EXCLUSIVE_PROCESS,
    "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED": nv.FABRIC_NOT_SUPPORTED,
    "NVML_GPU_FABRIC_STATE_NOT_STARTED": nv.FABRIC_NOT_STARTED,
    "NVML_GPU_FABRIC_STATE_IN_PROGRESS": nv.FABRIC_IN_PROGRESS, "NVML_GPU_FABRIC_STATE_COMPLETED": nv.FABRIC_COMPLETED,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": nv.MEMORY_ERROR_UNCORRECTED, "NVML_VOLATILE_ECC": nv.VOLATILE_ECC,
    "NVML_NVLINK_VERSION_3_0": nv.NVLINK_VERSION_3_0, "NVML_NVLINK_VERSION_4_0": nv.NVLINK_VERSION_4_0,
    "nvmlClocksEventReasonGpuIdle": nv.CLOCKS_GPU_IDLE, "nvmlClocksEventReasonHwSlowdown": nv.CLOCKS_HW_SLOWDOWN,
    "nvmlClocksEventReasonHwThermalSlowdown": nv.CLOCKS_HW_THERMAL,
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": nv.CLOCKS_HW_POWER_BRAKE,
    "NVML_ERROR_TIMEOUT": nv.ERROR_TIMEOUT, "nvmlEventTypeXidCriticalError": nv.EVENT_XID_CRITICAL_ERROR,
    "NVML_NVLINK_ERROR_DL_REPLAY": 0, "NVML_NVLINK_ERROR_DL_CRC_DATA": 3,
}  # fmt: skip


def test_fake_values_are_nvidia_ml_pys() -> None:
    for name, value in NVML_VALUES.items():
        assert getattr(pynvml, name) == value, name
    assert pynvml.NVML_P2P_CAPS_INDEX_READ == (nv.CAPS_READ,)  # the stray comma topology.py works around
    for code, text in nv.ERROR_TEXT.items():
        assert str(pynvml.NVMLError(code)) == text


@pytest.mark.parametrize(
    ("code", "error", "text"),
    [(nv.ERROR_NO_PERMISSION, "NVMLError_NoPermission", "Insufficient Permissions"),
     (nv.ERROR_UNKNOWN, "NVMLError_Unknown", "Unknown Error"),
     (nv.ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost", "GPU is lost"),
     (nv.ERROR_NOT_SUPPORTED, "NVMLError_NotSupported", "Not Supported")],
)  # fmt: skip
def test_return_codes_become_nvidia_ml_py_errors(monkeypatch: pytest.MonkeyPatch, code: int, error: str,
                                                 text: str) -> None:  # fmt: skip
    nv.install(monkeypatch, with_failures(nv.pcie_box(), Failure("nvmlDeviceGetNumaNodeId", code, gpu=1)))
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetNumaNodeId(pynvml.nvmlDeviceGetHandleByIndex(0)) == 0
    with pytest.raises(pynvml.NVMLError) as caught:
        pynvml.nvmlDeviceGetNumaNodeId(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert type(caught.value) is getattr(pynvml, error)
    assert str(caught.value) == text


def test_unknown_return_code_is_named_by_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """For codes it has no text for, pynvml asks nvmlErrorString (setting its restype first)."""
    monkeypatch.setattr(pynvml.NVMLError, "_errcode_to_string", dict(pynvml.NVMLError._errcode_to_string))
    library = nv.install(monkeypatch, with_failures(nv.single_gpu(), Failure("nvmlDeviceGetMigMode", 1234)))
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError) as caught:
        pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert (type(caught.value), str(caught.value)) == (pynvml.NVMLError, "Unknown Error")
    assert library.calls[-1] == "nvmlErrorString"
    assert library.nvmlErrorString.restype is ctypes.c_char_p


def test_missing_symbol_is_function_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    library = nv.install(monkeypatch, without(nv.bridged_box(), "nvmlDeviceGetNvLinkRemotePciInfo_v2"))
    with pytest.raises(
        AttributeError, match="libnvidia-ml.so.1: undefined symbol: nvmlDeviceGetNvLinkRemotePciInfo_v2"
    ):
        library.nvmlDeviceGetNvLinkRemotePciInfo_v2  # noqa: B018
    with pytest.raises(AttributeError, match="undefined symbol: nvmlDeviceGetNvLinkRemotePciInfo$"):
        library.nvmlDeviceGetNvLinkRemotePciInfo  # noqa: B018  (pynvml never calls the unversioned one)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetNvLinkState(handle, 0) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_FunctionNotFound, match="^Function Not Found$"):
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, 0)


def test_fake_refuses_what_ctypes_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    library = nv.install(monkeypatch, nv.pcie_box())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    first, second = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(ctypes.ArgumentError, match=r"^argument 3: TypeError: Don't know how to convert parameter 3$"):
        pynvml.nvmlDeviceGetP2PStatus(first, second, pynvml.NVML_P2P_CAPS_INDEX_READ)
    with pytest.raises(ctypes.ArgumentError, match="argument 2: OverflowError: int too long to convert"):
        pynvml.nvmlDeviceGetNvLinkState(first, 2**70)
    with pytest.raises(nv.FakeNvmlMisuse, match="expected an nvmlDevice_t"):
        pynvml.nvmlDeviceGetUUID(0)  # an index where a handle belongs
    with pytest.raises(nv.FakeNvmlMisuse, match="takes 2 arguments, got 1"):
        library.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(pynvml.c_nvmlDevice_t())  # NULL
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)


def test_strings_and_handles_as_the_real_library_gives_them(monkeypatch: pytest.MonkeyPatch) -> None:
    nv.install(monkeypatch, nv.pcie_box())
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert ctypes.cast(handle, ctypes.c_void_p).value == nv.handle_address(5)
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    assert (pci.busId, pci.busIdLegacy, pci.domain, pci.bus, pci.device) == (
        "00000000:9C:00.0", "0000:9C:00.0", 0, 0x9C, 0
    )  # fmt: skip
    assert pynvml.nvmlDeviceGetUUID(handle) == "GPU-55555555-0000-4000-8000-000000000005"
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA L40S"
    assert pynvml.nvmlSystemGetDriverVersion() == "535.183.01"
    assert pynvml.nvmlDeviceGetMemoryInfo(handle).total == 46068 * 1024 * 1024
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_mig_handles(monkeypatch: pytest.MonkeyPatch) -> None:
    nv.install(monkeypatch, nv.bridged_box())
    pynvml.nvmlInit()
    gpu3 = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetMigMode(gpu3) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu3) == nv.MAX_MIG_DEVICES
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(pynvml.nvmlDeviceGetHandleByIndex(2)) == 0  # pending only
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 1)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(gpu3).value == 0
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert ctypes.cast(parent, ctypes.c_void_p).value == ctypes.cast(gpu3, ctypes.c_void_p).value
    assert pynvml.nvmlDeviceGetUUID(mig) == nv.BRIDGED_MIGS[1].uuid
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100 80GB PCIe MIG 3g.40gb"
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 40192 * 1024 * 1024
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 2)  # an empty slot
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu3)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPciInfo(mig)  # whole-GPU queries refuse a MIG handle here
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 0)  # MIG is off there


@pytest.mark.parametrize("machine", [nv.nvswitch_box, nv.pcie_box, nv.single_gpu, nv.bridged_box])
def test_machine_json_round_trip(machine: Any) -> None:
    described = with_failures(without(machine(), "nvmlDeviceGetNumaNodeId"), Failure("nvmlDeviceGetName", 15, gpu=0))
    assert FakeMachine.from_json(described.to_json()) == described


def test_p2p_status_names_from_nvidia_ml_py() -> None:
    assert p2p_status_names(pynvml) == {
        0: "OK", 1: "CHIPSET_NOT_SUPPORTED", 2: "GPU_NOT_SUPPORTED", 3: "IOH_TOPOLOGY_NOT_SUPPORTED",
        4: "DISABLED_BY_REGKEY", 5: "NOT_SUPPORTED", 6: "UNKNOWN",
    }  # fmt: skip


def test_p2p_status_names_from_older_nvidia_ml_py() -> None:
    """Older releases had only the misspelt name; the status is stored correctly spelt all the same."""
    old = types.SimpleNamespace(NVML_P2P_STATUS_OK=0, NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED=1)
    assert p2p_status_names(old) == {0: "OK", 1: "CHIPSET_NOT_SUPPORTED"}


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [("00000000:1A:00.0", "0000:1a:00.0"), ("0000:1a:00.0", "0000:1a:00.0"), ("00010000:03:00.0", "10000:03:00.0"),
     (" 00000000:DB:00.0 ", "0000:db:00.0"), ("bogus", "bogus")],
)  # fmt: skip
def test_sysfs_bus_id(nvml: str, sysfs: str) -> None:
    assert sysfs_bus_id(nvml) == sysfs


def test_cuda_version_text() -> None:
    assert [cuda_version_text(v) for v in (12080, 12040, 11040, 13000)] == ["12.8", "12.4", "11.4", "13.0"]


# --------------------------------------------------------------------------------------------
# the machines, discovered
# --------------------------------------------------------------------------------------------


def test_nvswitch_box(monkeypatch: pytest.MonkeyPatch) -> None:
    found, library = discovered(monkeypatch, nv.nvswitch_box())
    assert (found.kind, found.source, found.note, found.link_notes) == ("gpu", "nvml", "", {})
    assert [(d.name, d.index, d.nvml_index, d.numa_node) for d in found.devices] == [
        (f"gpu{i}", i, i, i // 4) for i in range(8)
    ]
    first = found.devices[0]
    assert first == Device("gpu0", 0, "gpu", "GPU-a1b2c3d0-5e6f-7a8b-9c0d-1e2f3a4b5c60", "NVIDIA H100 80GB HBM3",
                           "00000000:18:00.0", numa_node=0, memory_mib=81559, mig=False, nvml_index=0,
                           compute_capability="9.0")  # fmt: skip
    assert len(found.links) == 28 and set(found.links.values()) == {"NV18"}
    assert found.links["gpu3-gpu4"] == "NV18"  # across the sockets too: NVLink beats SYS
    assert len(found.p2p) == 28 and all(status == ALL_OK for status in found.p2p.values())
    assert (found.driver, found.cuda_driver) == ("550.54.15", "12.4")
    assert (library.calls[0], library.calls[-1], library.calls.count("nvmlInitWithFlags")) == (
        "nvmlInitWithFlags", "nvmlShutdown", 1
    )  # fmt: skip


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
    found, _ = discovered(monkeypatch, nv.pcie_box())
    assert link_matrix_lines(found) == PCIE_MATRIX
    assert found.links["gpu0-gpu1"] == "PIX" and found.links["gpu4-gpu6"] == "PHB"
    assert found.p2p["gpu0-gpu3"] == SAME_SOCKET
    assert found.p2p["gpu3-gpu4"] == ACROSS_SOCKETS
    assert sum(status == ACROSS_SOCKETS for status in found.p2p.values()) == 16
    assert [(d.numa_node, d.memory_mib, d.mig) for d in found.devices] == [(i // 4, 46068, False) for i in range(8)]
    assert (found.driver, found.cuda_driver, found.link_notes) == ("535.183.01", "12.2", {})


def test_single_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, nv.single_gpu())
    assert [(d.name, d.model, d.memory_mib, d.numa_node, d.mig) for d in found.devices] == [
        ("gpu0", "NVIDIA RTX 6000 Ada Generation", 49140, None, False)
    ]
    assert (found.links, found.p2p, found.pairs(), found.link_notes) == ({}, {}, [], {})
    assert (found.driver, found.cuda_driver) == ("570.124.06", "12.8")
    assert link_matrix_lines(found) == ["      gpu0  NUMA", "gpu0  X     N/A"]


BRIDGED_MATRIX = [
    "      gpu0  gpu1  gpu2  gpu3  NUMA",
    "gpu0  X     NV12  SYS   SYS   0",
    "gpu1  NV12  X     SYS   SYS   0",
    "gpu2  SYS   SYS   X     NV11  N/A",
    "gpu3  SYS   SYS   NV11  X     N/A",
]


def test_nvlink_bridges_mig_and_numa_from_sysfs(monkeypatch: pytest.MonkeyPatch, no_sysfs: Path) -> None:
    for bus, node in (("0000:17:00.0", "0\n"), ("0000:31:00.0", "0\n"), ("0000:b1:00.0", "-1\n")):
        (no_sysfs / bus).mkdir()
        (no_sysfs / bus / "numa_node").write_text(node)
    found, _ = discovered(monkeypatch, nv.bridged_box())
    assert link_matrix_lines(found) == BRIDGED_MATRIX  # gpu2: sysfs says -1; gpu3: no sysfs entry
    assert [d.mig for d in found.devices] == [False, False, False, True]
    assert [d.numa_node for d in found.devices] == [0, 0, None, None]
    assert (found.driver, found.cuda_driver) == ("470.256.02", "11.4")


# --------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES
# --------------------------------------------------------------------------------------------


def test_visible_indices_rename_devices_and_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, nv.pcie_box(), {"CUDA_VISIBLE_DEVICES": "5,7"})
    assert [(d.name, d.index, d.nvml_index, d.pci_bus_id, d.numa_node) for d in found.devices] == [
        ("gpu0", 0, 5, "00000000:9C:00.0", 1),
        ("gpu1", 1, 7, "00000000:DA:00.0", 1),
    ]
    assert found.links == {"gpu0-gpu1": "NODE"}
    assert found.p2p == {"gpu0-gpu1": SAME_SOCKET}
    assert link_matrix_lines(found) == ["      gpu0  gpu1  NUMA", "gpu0  X     NODE  1", "gpu1  NODE  X     1"]

    found, _ = discovered(monkeypatch, nv.pcie_box(), {"CUDA_VISIBLE_DEVICES": "7,5"})
    assert [(d.name, d.nvml_index) for d in found.devices] == [("gpu0", 7), ("gpu1", 5)]
    assert found.links == {"gpu0-gpu1": "NODE"}


@pytest.mark.parametrize(
    ("visible", "nvml_indices"),
    [("GPU-66666666,GPU-11111111-0000-4000-8000-000000000001", [6, 1]), (" 4 , 0 ", [4, 0]), ("3", [3]),
     ("GPU-7", [7]), ("007", [7])],
)  # fmt: skip
def test_visible_entries_that_resolve(monkeypatch: pytest.MonkeyPatch, visible: str, nvml_indices: list[int]) -> None:
    found, _ = discovered(monkeypatch, nv.pcie_box(), {"CUDA_VISIBLE_DEVICES": visible})
    assert [d.nvml_index for d in found.devices] == nvml_indices
    assert [d.name for d in found.devices] == [f"gpu{i}" for i in range(len(nvml_indices))]


def test_visible_uuid_prefixes_keep_links_and_p2p(monkeypatch: pytest.MonkeyPatch) -> None:
    visible = "GPU-66666666,GPU-11111111-0000-4000-8000-000000000001"
    found, _ = discovered(monkeypatch, nv.pcie_box(), {"CUDA_VISIBLE_DEVICES": visible})
    assert [(d.name, d.nvml_index, d.numa_node) for d in found.devices] == [("gpu0", 6, 1), ("gpu1", 1, 0)]
    assert found.links == {"gpu0-gpu1": "SYS"}
    assert found.p2p == {"gpu0-gpu1": ACROSS_SOCKETS}


@pytest.mark.parametrize("visible", ["", "   ", "-1", "-1,0", " -1 , 3"])
def test_visible_hides_every_gpu(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    library = nv.install(monkeypatch, nv.pcie_box())
    assert nvml_topology({"CUDA_VISIBLE_DEVICES": visible}) == (None, "CUDA_VISIBLE_DEVICES hides every GPU")
    assert library.initialised == 0
    listed = tuple(sysfs_bus_id(gpu.bus_id) for gpu in nv.pcie_box().gpus)
    assert discover("auto", 2, {"CUDA_VISIBLE_DEVICES": visible}) == cpu_topology(
        2, note="no GPU: CUDA_VISIBLE_DEVICES hides every GPU", inventory=Inventory(nvml_gpus=listed)
    )  # hidden on purpose: no NVML error, the machine's GPUs still counted
    with pytest.raises(
        ValueError, match=r"^the nccl backend needs GPUs, and none was found \(CUDA_VISIBLE_DEVICES hides"
    ):
        discover("nccl", 2, {"CUDA_VISIBLE_DEVICES": visible})


PCIE_GPUS = "8 GPUs (NVIDIA L40S): " + ", ".join(f"{i} GPU-{str(i) * 8}-..." for i in range(8))


@pytest.mark.parametrize(
    ("visible", "problem"),
    [("0,9", "entry '9' matches no GPU"),
     ("3,9,1", "entry '9' matches no GPU"),
     ("GPU-ffff", "entry 'GPU-ffff' matches no GPU"),
     ("0,-1", "entry '-1' is not a GPU index or a GPU- UUID"),
     ("cuda:0", "entry 'cuda:0' is not a GPU index or a GPU- UUID"),
     ("0,,1", "entry '' is empty"),
     ("0,1,", "entry '' is empty"),
     ("GPU-", "entry 'GPU-' starts the UUIDs of GPUs 0, 1, 2, 3, 4, 5, 6, 7; give more of the UUID"),
     ("2,GPU-22", "entry 'GPU-22' is GPU 2, already listed as '2'"),
     ("1, 1", "entry '1' is GPU 1, already listed as '1'")],
)  # fmt: skip
def test_visible_entry_that_names_no_single_gpu(monkeypatch: pytest.MonkeyPatch, visible: str, problem: str) -> None:
    message = selection_error(monkeypatch, nv.pcie_box(), visible)
    assert message == f"CUDA_VISIBLE_DEVICES={visible!r}: {problem}; this machine has {PCIE_GPUS}"


def test_visible_machine_list_tells_models_and_similar_uuids_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = nv.bridged_box()
    machine.gpus[1] = replace(machine.gpus[1], uuid="GPU-b000e5a1-9999-4e5f-8a9b-0c1d2e3f4a5b", name="NVIDIA H100")
    message = selection_error(monkeypatch, machine, "4")
    assert message == (
        "CUDA_VISIBLE_DEVICES='4': entry '4' matches no GPU; this machine has 4 GPUs: "
        "0 GPU-b000e5a1-2c3d-... (NVIDIA A100 80GB PCIe), 1 GPU-b000e5a1-9999-... (NVIDIA H100), "
        "2 GPU-b002e5a1-... (NVIDIA A100 80GB PCIe), 3 GPU-b003e5a1-... (NVIDIA A100 80GB PCIe)"
    )


MIG_REFUSAL = "this suite tests whole GPUs (NCCL has no P2P between MIG instances): list GPUs by index or GPU- UUID"
GPU3 = "GPU 3 (NVIDIA A100 80GB PCIe, GPU-b003e5a1-2c3d-4e5f-8a9b-0c1d2e3f4a5b)"


@pytest.mark.parametrize(
    ("visible", "entry", "what"),
    [(f"0,{nv.BRIDGED_MIGS[1].uuid}", nv.BRIDGED_MIGS[1].uuid, f"a MIG instance of {GPU3}"),
     (nv.BRIDGED_MIGS[0].uuid, nv.BRIDGED_MIGS[0].uuid, f"a MIG instance of {GPU3}"),
     ("MIG-GPU-b003e5a1-2c3d-4e5f-8a9b-0c1d2e3f4a5b/1/0", "MIG-GPU-b003e5a1-2c3d-4e5f-8a9b-0c1d2e3f4a5b/1/0",
      f"a MIG instance of {GPU3}"),  # the format of drivers before R470
     ("MIG-0badc0de-0000-4000-8000-000000000000", "MIG-0badc0de-0000-4000-8000-000000000000",
      "a MIG instance NVML does not list")],
)  # fmt: skip
def test_visible_mig_instances_are_refused(monkeypatch: pytest.MonkeyPatch, visible: str, entry: str,
                                          what: str) -> None:  # fmt: skip
    message = selection_error(monkeypatch, nv.bridged_box(), visible)
    assert message == f"CUDA_VISIBLE_DEVICES={visible!r}: entry {entry!r} is {what}; {MIG_REFUSAL}"


def test_visible_mig_parent_found_past_empty_slots_and_failing_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    mig = nv.FakeMig("MIG-77777777-0000-4000-8000-00000000cafe", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856)
    machine = nv.with_mig(nv.with_mig(nv.nvswitch_box(), 2, []), 7, [None, None, mig])
    machine = with_failures(machine, Failure("nvmlDeviceGetMaxMigDeviceCount", nv.ERROR_UNKNOWN, gpu=2))
    message = selection_error(monkeypatch, machine, f"0,{mig.uuid}")
    assert "is a MIG instance of GPU 7 (NVIDIA H100 80GB HBM3, GPU-a1b2c3d7-5e6f-7a8b-9c0d-1e2f3a4b5c67);" in message


def test_whole_gpu_with_mig_on_is_listed_with_its_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, nv.bridged_box(), {"CUDA_VISIBLE_DEVICES": "GPU-b003,2"})
    assert [(d.name, d.nvml_index, d.mig) for d in found.devices] == [("gpu0", 3, True), ("gpu1", 2, False)]
    assert found.links == {"gpu0-gpu1": "NV11"}


# --------------------------------------------------------------------------------------------
# NVLink state NVML will not give: NV? where NVML's P2P status says NVLink, else the PCIe class; a note
# --------------------------------------------------------------------------------------------

NO_PERMISSION_NOTE = (
    "NVLink state of gpu0, gpu1, gpu2, gpu3, gpu4, gpu5, gpu6, gpu7 unknown (Insufficient Permissions): "
    "NVML's P2P status says NVLink (NV?)"
)


def test_container_without_permission_for_nvlink(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVSwitch pairs keep their NVLink class (and NVLink rungs): NVML's P2P status NVLINK capability says so."""
    machine = with_failures(nv.nvswitch_box(), Failure("nvmlDeviceGetNvLinkState", nv.ERROR_NO_PERMISSION))
    found, _ = discovered(monkeypatch, machine)
    assert set(found.links.values()) == {"NV?"}
    assert found.link_notes == dict.fromkeys(found.links, NO_PERMISSION_NOTE)
    assert link_note_lines(found) == [f"{NO_PERMISSION_NOTE} (28 pairs)"]
    assert all(status == ALL_OK for status in found.p2p.values())
    assert [d.memory_mib for d in found.devices] == [81559] * 8


def test_one_gpu_without_nvlink_state(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = with_failures(nv.nvswitch_box(), Failure("nvmlDeviceGetNvLinkState", nv.ERROR_NO_PERMISSION, gpu=2))
    found, _ = discovered(monkeypatch, machine)
    assert link_matrix_lines(found)[1:4] == [
        "gpu0  X     NV18  NV?   NV18  NV18  NV18  NV18  NV18  0",
        "gpu1  NV18  X     NV?   NV18  NV18  NV18  NV18  NV18  0",
        "gpu2  NV?   NV?   X     NV?   NV?   NV?   NV?   NV?   0",
    ]
    note = "NVLink state of gpu2 unknown (Insufficient Permissions): NVML's P2P status says NVLink (NV?)"
    assert found.link_notes == {key: note for key in found.links if "gpu2" in key.split("-")}
    assert link_note_lines(found) == [f"{note} (7 pairs)"]


def test_unknown_error_in_the_middle_of_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links counted before the error are not trusted: the GPU's pairs fall back as a whole."""
    failure = Failure("nvmlDeviceGetNvLinkRemoteDeviceType", nv.ERROR_UNKNOWN, gpu=5)
    found, _ = discovered(monkeypatch, with_failures(nv.nvswitch_box(), failure))
    assert (found.links["gpu4-gpu5"], found.links["gpu1-gpu5"], found.links["gpu4-gpu6"]) == ("NV?", "NV?", "NV18")
    assert set(found.link_notes.values()) == {
        "NVLink state of gpu5 unknown (Unknown Error): NVML's P2P status says NVLink (NV?)"
    }


def test_driver_without_remote_pci_info_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, without(nv.bridged_box(), "nvmlDeviceGetNvLinkRemotePciInfo_v2"))
    # the bridged pairs keep NVLink by NVML's P2P status; the others are PCIe, as their status says
    assert link_matrix_lines(found)[1:3] == ["gpu0  X     NV?   SYS   SYS   N/A", "gpu1  NV?   X     SYS   SYS   N/A"]
    note = "NVLink state of gpu0, gpu1, gpu2, gpu3 unknown (Function Not Found): "
    assert link_note_lines(found) == [
        f"{note}NVML's P2P status says NVLink (NV?) (pairs gpu0-gpu1 gpu2-gpu3)",
        f"{note}PCIe class shown (4 pairs)",
    ]
    assert [d.mig for d in found.devices] == [False, False, False, True]


def test_driver_without_remote_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, without(nv.nvswitch_box(), "nvmlDeviceGetNvLinkRemoteDeviceType"))
    assert (found.links["gpu0-gpu1"], found.links["gpu0-gpu7"]) == ("NV?", "NV?")
    assert len(found.link_notes) == 28


def test_direct_nvlink_is_known_from_the_gpu_that_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    failure = Failure("nvmlDeviceGetNvLinkState", nv.ERROR_UNKNOWN, gpu=1)
    found, _ = discovered(monkeypatch, with_failures(nv.bridged_box(), failure))
    assert found.links == {"gpu0-gpu1": "NV12", "gpu0-gpu2": "SYS", "gpu0-gpu3": "SYS", "gpu1-gpu2": "SYS",
                           "gpu1-gpu3": "SYS", "gpu2-gpu3": "NV11"}  # fmt: skip
    assert found.link_notes == {}  # gpu0 and gpu2/gpu3 answered: no switch, no link to gpu1 but their own


def test_pcie_box_with_no_nvlink_answers_needs_no_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU that answered "no NVLink at all" settles its pairs even where the peer did not answer."""
    failure = Failure("nvmlDeviceGetNvLinkState", nv.ERROR_NO_PERMISSION, gpu=3)
    found, _ = discovered(monkeypatch, with_failures(nv.pcie_box(), failure))
    assert link_matrix_lines(found) == PCIE_MATRIX
    assert found.link_notes == {}


def test_pair_whose_p2p_query_is_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    failure = Failure("nvmlDeviceGetP2PStatus", nv.ERROR_NOT_SUPPORTED, gpu=0, peer=1)
    found, _ = discovered(monkeypatch, with_failures(nv.pcie_box(), failure))
    assert found.p2p["gpu0-gpu1"] == UNKNOWN_P2P
    assert found.p2p["gpu0-gpu2"] == SAME_SOCKET and found.p2p["gpu0-gpu4"] == ACROSS_SOCKETS
    assert link_matrix_lines(found) == PCIE_MATRIX


def test_unknown_errors_leave_facts_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = with_failures(
        nv.pcie_box(),
        Failure("nvmlDeviceGetNumaNodeId", nv.ERROR_UNKNOWN, gpu=4),
        Failure("nvmlDeviceGetMemoryInfo", nv.ERROR_UNKNOWN, gpu=4),
        Failure("nvmlDeviceGetTopologyCommonAncestor", nv.ERROR_UNKNOWN, gpu=4, peer=5),
        Failure("nvmlSystemGetCudaDriverVersion", nv.ERROR_UNKNOWN),
    )
    found, _ = discovered(monkeypatch, machine)
    assert (found.devices[4].numa_node, found.devices[4].memory_mib) == (None, None)
    assert (found.links["gpu4-gpu5"], found.links["gpu4-gpu6"]) == ("?", "PHB")
    assert (found.driver, found.cuda_driver, found.link_notes) == ("535.183.01", None, {})


def test_gpu_lost_after_listing_leaves_its_facts_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = discovered(monkeypatch, replace(nv.pcie_box(), lost=[2]))
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
    assert [key for key, status in found.p2p.items() if status == UNKNOWN_P2P] == [
        "gpu0-gpu2", "gpu1-gpu2", "gpu2-gpu3", "gpu2-gpu4", "gpu2-gpu5", "gpu2-gpu6", "gpu2-gpu7"
    ]  # fmt: skip
    assert found.p2p["gpu0-gpu1"] == SAME_SOCKET


def test_older_driver_without_some_functions(monkeypatch: pytest.MonkeyPatch, no_sysfs: Path) -> None:
    (no_sysfs / "0000:18:00.0").mkdir()
    (no_sysfs / "0000:18:00.0" / "numa_node").write_text("1\n")
    machine = without(nv.nvswitch_box(), "nvmlDeviceGetNumaNodeId", "nvmlSystemGetCudaDriverVersion",
                      "nvmlDeviceGetMigMode", "nvmlDeviceGetCudaComputeCapability")  # fmt: skip
    found, _ = discovered(monkeypatch, machine)
    assert [d.numa_node for d in found.devices] == [1, None, None, None, None, None, None, None]
    assert {d.compute_capability for d in found.devices} == {None}  # not known: the check nccl_gpu skips
    assert set(found.links.values()) == {"NV18"}
    assert (found.driver, found.cuda_driver) == ("550.54.15", None)


# --------------------------------------------------------------------------------------------
# no GPU, and NVML that cannot list its GPUs
# --------------------------------------------------------------------------------------------


def test_pynvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    found, reason = nvml_topology({})
    assert found is None
    assert reason.startswith("nvidia-ml-py (pynvml) is not importable: ")


def test_no_nvml_library(monkeypatch: pytest.MonkeyPatch) -> None:
    nv.install_no_library(monkeypatch)
    reason = "NVML unavailable: NVML Shared Library Not Found"
    assert nvml_topology({"CUDA_VISIBLE_DEVICES": "0,9"}) == (None, reason)  # nothing to check the list against
    failed = Inventory(nvml_error=reason)
    assert discover("auto", 3, environ={}) == cpu_topology(3, note=f"no GPU: {reason}", inventory=failed)


def test_driver_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    library = nv.install(monkeypatch, replace(nv.pcie_box(), init_error=nv.ERROR_DRIVER_NOT_LOADED))
    reason = "NVML unavailable: Driver Not Loaded"
    assert nvml_topology({}) == (None, reason)
    assert library.calls == ["nvmlInitWithFlags"]  # nothing to shut down
    failed = Inventory(nvml_error=reason)
    assert discover("auto", 3, environ={}) == cpu_topology(3, note=f"no GPU: {reason}", inventory=failed)
    with pytest.raises(ValueError, match=f"^the nccl backend needs GPUs, and none was found \\({reason}\\)$"):
        discover("nccl", 3, environ={})


def test_nvml_reports_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    library = nv.install(monkeypatch, FakeMachine(gpus=[], ancestors=[], p2p=[]))
    assert nvml_topology({"CUDA_VISIBLE_DEVICES": "0"}) == (None, "NVML reports no GPU")
    found = discover("auto", 2, environ={})
    assert (found.note, found.inventory) == ("no GPU: NVML reports no GPU", Inventory(nvml_gpus=()))
    assert library.initialised == 0


LISTING_FAILED = "NVML is loaded but listing the GPUs failed: {}; fix the driver, or run on CPU with --backend gloo"


@pytest.mark.parametrize(
    ("machine", "problem"),
    [(with_failures(nv.pcie_box(), Failure("nvmlDeviceGetUUID", nv.ERROR_GPU_IS_LOST, gpu=3)),
      "GPU is lost (nvmlDeviceGetUUID of GPU 3)"),
     (without(nv.pcie_box(), "nvmlDeviceGetHandleByIndex_v2"),
      "Function Not Found (nvmlDeviceGetHandleByIndex of GPU 0: the driver's NVML library lacks the function "
      "nvidia-ml-py calls)"),
     (with_failures(nv.pcie_box(), Failure("nvmlDeviceGetCount_v2", nv.ERROR_UNKNOWN)),
      "Unknown Error (nvmlDeviceGetCount)"),
     (with_failures(nv.bridged_box(), Failure("nvmlDeviceGetPciInfo_v3", nv.ERROR_NO_PERMISSION, gpu=1)),
      "Insufficient Permissions (nvmlDeviceGetPciInfo of GPU 1)"),
     (with_failures(nv.bridged_box(), Failure("nvmlDeviceGetName", nv.ERROR_UNKNOWN, gpu=2)),
      "Unknown Error (nvmlDeviceGetName of GPU 2)")],
)  # fmt: skip
def test_error_while_listing(monkeypatch: pytest.MonkeyPatch, machine: FakeMachine, problem: str) -> None:
    library = nv.install(monkeypatch, machine)
    for backend in ("auto", "nccl"):
        with pytest.raises(TopologyError) as caught:
            discover(backend, 2, environ={"CUDA_VISIBLE_DEVICES": "0"})
        assert str(caught.value) == LISTING_FAILED.format(problem)
        assert library.initialised == 0
    assert discover("gloo", 2, environ={}) == cpu_topology(2, note="backend gloo chosen", inventory=Inventory())


# --------------------------------------------------------------------------------------------
# nvml_gpus, discover, topology files, link notes
# --------------------------------------------------------------------------------------------


def test_nvml_gpus_is_the_identity_view(monkeypatch: pytest.MonkeyPatch) -> None:
    nv.install(monkeypatch, nv.pcie_box())
    gpus, reason = nvml_gpus({"CUDA_VISIBLE_DEVICES": "6"})
    assert (gpus, reason) == ([Device("gpu0", 0, "gpu", "GPU-66666666-0000-4000-8000-000000000006", "NVIDIA L40S",
                                      "00000000:B1:00.0")], "")  # fmt: skip


def test_discover_uses_nvml_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    library = nv.install(monkeypatch, nv.pcie_box())
    environ = {"CUDA_VISIBLE_DEVICES": "5,7"}
    found = discover("auto", 4, environ=environ)
    listed = tuple(sysfs_bus_id(gpu.bus_id) for gpu in nv.pcie_box().gpus)
    iommu = IommuFacts(mode="off")  # the stand-in sysfs has no IOMMU group for the GPUs
    assert found.kernel_log.startswith("the kernel log (") and "No such file or directory" in found.kernel_log
    from_nvml = replace(nvml_topology(environ)[0], inventory=Inventory(nvml_gpus=listed), iommu=iommu)
    assert found.platform.virtual_machine == "" and found.platform.wsl == ""  # the stand-in host's files: none
    assert found.platform.stack_kb is not None and found.platform.libcuda is not None  # this process's own
    assert found == replace(from_nvml, kernel_log=found.kernel_log, platform=found.platform)
    assert discover("nccl", 4, environ=environ).links == {"gpu0-gpu1": "NODE"}
    calls = len(library.calls)
    assert discover("gloo", 4, environ=environ) == cpu_topology(4, note="backend gloo chosen", inventory=Inventory())
    assert len(library.calls) == calls


def test_topology_files_from_before_link_notes_still_load(tmp_path: Path) -> None:
    for path in sorted((REPO / "scenarios" / "topologies").glob("*.json")):
        assert "link_notes" not in json.loads(path.read_text())
        assert load_topology_file(path, "test").link_notes == {}
    note = "NVLink state of gpu0 unknown (Unknown Error): PCIe class shown"
    gpus = (Device("gpu0", 0, "gpu"), Device("gpu1", 1, "gpu"))
    noted = Topology("gpu", gpus, "nvml", links={"gpu0-gpu1": "SYS"}, link_notes={"gpu0-gpu1": note})
    assert Topology.from_json(noted.to_json()) == noted


def test_link_note_lines_group_pairs_by_note() -> None:
    gpus = tuple(Device(f"gpu{i}", i, "gpu") for i in range(6))
    a, b = "NVLink state of gpu0 unknown (Unknown Error): PCIe class shown", "something else"
    notes = {"gpu0-gpu1": a, "gpu0-gpu2": a, "gpu0-gpu3": a, "gpu0-gpu4": a, "gpu2-gpu3": b}
    assert link_note_lines(Topology("gpu", gpus, "f.json", link_notes=notes)) == [f"{a} (4 pairs)",
                                                                                 f"{b} (pair gpu2-gpu3)"]  # fmt: skip
    notes = {"gpu0-gpu1": a, "gpu0-gpu2": a}
    assert link_note_lines(Topology("gpu", gpus, "f.json", link_notes=notes)) == [f"{a} (pairs gpu0-gpu1 gpu0-gpu2)"]
    assert link_note_lines(cpu_topology(2)) == []


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
    nv.install(monkeypatch, nv.pcie_box())
    assert main(["topology"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (PCIE_TABLE, "")


def test_cli_table_nvswitch_and_mig(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                   environ_without_visible: None) -> None:  # fmt: skip
    nv.install(monkeypatch, nv.nvswitch_box())
    assert main(["topology"]) == 0
    out = capsys.readouterr().out
    assert "\nNVML P2P status: OK for every pair\n" in out
    assert "gpu7  NV18  NV18  NV18  NV18  NV18  NV18  NV18  X     1\n" in out
    assert "Note:" not in out
    nv.install(monkeypatch, nv.bridged_box())
    assert main(["topology"]) == 0
    out = capsys.readouterr().out
    uuid = "GPU-b003e5a1-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    assert f"gpu3    3     NVIDIA A100 80GB PCIe  {uuid}  00000000:CA:00.0  -     81920 MiB  on\n" in out
    assert "  read OK, write OK, nvlink OK, atomics OK" not in out


def test_cli_table_shows_link_notes_under_the_matrix(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    nv.install(
        monkeypatch, with_failures(nv.nvswitch_box(), Failure("nvmlDeviceGetNvLinkState", nv.ERROR_NO_PERMISSION))
    )
    assert main(["topology"]) == 0
    out = capsys.readouterr().out
    assert (
        "gpu2  NV?   NV?   X     0\n"
        "Note: NVLink state of gpu0, gpu1, gpu2 unknown (Insufficient Permissions): NVML's P2P status says NVLink "
        "(NV?) (pairs gpu0-gpu1 gpu0-gpu2 gpu1-gpu2)\n"
        "\nNVML P2P status: OK for every pair\n"
    ) in out


def test_cli_json_round_trip(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             environ_without_visible: None) -> None:  # fmt: skip
    nv.install(monkeypatch, nv.pcie_box())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,1")
    assert main(["topology", "--json"]) == 0
    out = capsys.readouterr().out
    found = discover("auto", 1, {"CUDA_VISIBLE_DEVICES": "5,7,1"})
    assert found.inventory.nvml_gpus is not None and len(found.inventory.nvml_gpus) == 8
    assert out == found.to_json(indent=2) + "\n"
    saved = tmp_path / "t.json"
    saved.write_text(out)
    assert load_topology_file(saved, "test") == replace(found, source=str(saved))

    monkeypatch.setitem(sys.modules, "pynvml", None)  # the file stands in for NVML
    assert main(["topology", "--topology-file", str(saved), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again == {**json.loads(out), "source": str(saved)}
    assert main(["topology", "--topology-file", str(saved)]) == 0
    table = capsys.readouterr().out
    assert table.startswith(f"3 GPUs from file {saved}\n")
    assert "gpu0  X     NODE  SYS   1\n" in table


def test_cli_without_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                         environ_without_visible: None) -> None:  # fmt: skip
    nv.install(monkeypatch, replace(nv.pcie_box(), init_error=nv.ERROR_DRIVER_NOT_LOADED))
    assert main(["topology", "--virtual-devices", "2"]) == 0
    assert capsys.readouterr().out == (
        "2 CPU devices (virtual, gloo): cpu0 cpu1\n\nNote: no GPU: NVML unavailable: Driver Not Loaded\n"
    )
    assert main(["topology", "--json", "--virtual-devices", "2"]) == 0
    assert Topology.from_json(capsys.readouterr().out) == cpu_topology(
        2,
        note="no GPU: NVML unavailable: Driver Not Loaded",
        inventory=Inventory(nvml_error="NVML unavailable: Driver Not Loaded"),
    )


@pytest.mark.parametrize(
    ("machine", "visible", "message"),
    [(nv.pcie_box(), "0,9", f"CUDA_VISIBLE_DEVICES='0,9': entry '9' matches no GPU; this machine has {PCIE_GPUS}"),
     (nv.bridged_box(), nv.BRIDGED_MIGS[0].uuid,
      f"CUDA_VISIBLE_DEVICES={nv.BRIDGED_MIGS[0].uuid!r}: entry {nv.BRIDGED_MIGS[0].uuid!r} is a MIG instance of "
      f"{GPU3}; {MIG_REFUSAL}"),
     (without(nv.pcie_box(), "nvmlDeviceGetHandleByIndex_v2"), "0",
      LISTING_FAILED.format("Function Not Found (nvmlDeviceGetHandleByIndex of GPU 0: the driver's NVML library "
                            "lacks the function nvidia-ml-py calls)"))],
)  # fmt: skip
def test_cli_refuses_what_a_run_refuses(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                        machine: FakeMachine, visible: str, message: str) -> None:  # fmt: skip
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nv.install(monkeypatch, machine)
    assert main(["topology"]) == 2
    assert capsys.readouterr() == ("", f"python -m conformance topology: {message}\n")
    assert main(["topology", "--json"]) == 2
    assert capsys.readouterr() == ("", f"python -m conformance topology: {message}\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topology", "--topology-file", "{missing}"],
         "python -m conformance topology: --topology-file: topology file '{missing}' cannot be read: "
         "No such file or directory"),
        (["topology", "--topology-file", "{garbage}"],
         "python -m conformance topology: --topology-file: topology file '{garbage}' is not a topology: "
         "not JSON: Expecting value: line 1 column 1 (char 0)"),
        (["topology", "--topology-file", "{array}"],
         "python -m conformance topology: --topology-file: topology file '{array}' is not a topology: it holds a "
         "JSON list, not an object"),
        (["topology", "--topology-file", "{twice}"],
         "python -m conformance topology: --topology-file: topology file '{twice}' lists device name 'gpu0' more "
         "than once"),
        (["topology", "--topology-file", "{text_index}"],
         "python -m conformance topology: --topology-file: topology file '{text_index}' is not a topology: device "
         "'gpu0': index is 'zero', which is not a whole number"),
        (["topology", "--topology-file", "{bool_index}"],
         "python -m conformance topology: --topology-file: topology file '{bool_index}' is not a topology: device "
         "'gpu0': index is True, which is not a whole number"),
        (["topology", "--topology-file", "{text_mig}"],
         "python -m conformance topology: --topology-file: topology file '{text_mig}' is not a topology: device "
         "'gpu0': mig is 'yes', which is not true or false"),
        (["topology", "--topology-file", "{numa_text}"],
         "python -m conformance topology: --topology-file: topology file '{numa_text}' is not a topology: device "
         "'gpu0': numa_node is '0', which is not a whole number or null"),
        (["topology", "--topology-file", "{tpu}"],
         "python -m conformance topology: --topology-file: topology file '{tpu}' is not a topology: kind is 'tpu', "
         "not 'cpu' or 'gpu'"),
        (["topology", "--topology-file", "{link_number}"],
         "python -m conformance topology: --topology-file: topology file '{link_number}' is not a topology: the "
         "link class of gpu0-gpu1 is 4, not a text such as 'NV4' or 'SYS'"),
        (["topology", "--topology-file", "{many}"],
         "python -m conformance topology: --topology-file: topology file '{many}' lists 33 devices, more than the 32 "
         "one node's plan takes"),
        (["topology", "--virtual-devices", "100000"],
         "python -m conformance: error: argument --virtual-devices: '100000' devices is more than the 32 one node's "
         "plan takes"),
        (["topology", "--virtual-devices", "0"],
         "python -m conformance: error: argument --virtual-devices: '0' must be a positive whole number"),
        ([], "python -m conformance: error: the following arguments are required: COMMAND"),
        (["topolgy"], "python -m conformance: error: argument COMMAND: invalid choice: 'topolgy' (choose from "
                      "'topology', 'recommend', 'compare', 'report', 'merge-junit', 'smoke', 'diagnose', 'token')"),
    ],
)  # fmt: skip
def test_cli_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str) -> None:
    paths = {name: str(tmp_path / f"{name}.json") for name in ("missing", "garbage", "array", "twice")}
    (tmp_path / "garbage.json").write_text("not json\n")
    (tmp_path / "array.json").write_text('[{"kind": "gpu"}]\n')
    gpu = {"name": "gpu0", "index": 0, "kind": "gpu"}
    (tmp_path / "twice.json").write_text(json.dumps({"kind": "gpu", "source": "file", "devices": [gpu, gpu]}))
    second = {"name": "gpu1", "index": 1, "kind": "gpu"}
    wrong = {
        "text_index": {"devices": [{**gpu, "index": "zero"}]},
        "bool_index": {"devices": [{**gpu, "index": True}]},
        "text_mig": {"devices": [{**gpu, "mig": "yes"}]},
        "numa_text": {"devices": [{**gpu, "numa_node": "0"}]},
        "tpu": {"kind": "tpu", "devices": [gpu]},
        "link_number": {"devices": [gpu, second], "links": {"gpu0-gpu1": 4}},
    }
    wrong["many"] = {"devices": [{"name": f"gpu{i}", "index": i, "kind": "gpu"} for i in range(33)]}
    for name, body in wrong.items():
        paths[name] = str(tmp_path / f"{name}.json")
        (tmp_path / f"{name}.json").write_text(json.dumps({"kind": "gpu", "source": "file", **body}))
    assert main([arg.format(**paths) for arg in argv]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message.format(**paths) + "\n")


TESTS = Path(__file__).resolve().parent


def run_module(*args: str, machine: FakeMachine | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m conformance`` in a fresh interpreter; with ``machine``, over the fake library."""
    environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    command = [sys.executable, "-m", "conformance", *args]
    if machine is not None:
        environ |= {nv.MACHINE_VARIABLE: machine.to_json(), "PYTHONPATH": str(TESTS)}
        command = [sys.executable, "-c", FAKE_MAIN, *args]
    return subprocess.run(command, cwd=REPO, env={**environ, **env}, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


# What ``-p fake_nvml`` does in a pytest process, for ``python -m conformance``.
FAKE_MAIN = """
import sys
import fake_nvml
from conformance.cli.main import main
fake_nvml.pytest_configure(None)
sys.exit(main(sys.argv[1:]))
"""

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
    assert data["note"].startswith(NO_GPU_REASONS) or data["note"] == "no GPU: CUDA_VISIBLE_DEVICES hides every GPU"


def test_module_entry_point_refuses_a_bad_selection_in_one_line() -> None:
    done = run_module("topology", machine=nv.pcie_box(), CUDA_VISIBLE_DEVICES="0,9")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"python -m conformance topology: CUDA_VISIBLE_DEVICES='0,9': entry '9' matches no GPU; "
        f"this machine has {PCIE_GPUS}\n"
    )
    fine = run_module("topology", "--json", machine=nv.pcie_box(), CUDA_VISIBLE_DEVICES="0,1")
    assert (fine.returncode, fine.stderr, json.loads(fine.stdout)["links"]) == (0, "", {"gpu0-gpu1": "PIX"})


def mixed_models() -> FakeMachine:
    """The bridged box with gpu3 another model: CUDA's fastest-first order and the PCI order may differ."""
    machine = nv.bridged_box()
    machine.gpus[3].name = "NVIDIA A40"
    machine.gpus[3].migs = []
    return machine


def test_indices_on_a_box_of_mixed_models_are_refused_unless_cuda_orders_by_pci_bus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = selection_error(monkeypatch, mixed_models(), "0,3")
    assert message.startswith(
        "CUDA_VISIBLE_DEVICES='0,3' selects GPUs by index on a machine of mixed models (NVIDIA A100 80GB PCIe, "
        "NVIDIA A40): CUDA numbers them fastest first (CUDA_DEVICE_ORDER=unset, default FASTEST_FIRST), NVML and "
        "nvidia-smi by PCI bus, so index 0 may be another GPU for the ranks than for this suite; set "
        "CUDA_DEVICE_ORDER=PCI_BUS_ID or list GPU- UUIDs; this machine has "
    )
    found, _ = discovered(
        monkeypatch, mixed_models(), {"CUDA_VISIBLE_DEVICES": "0,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    )
    assert [(d.name, d.nvml_index, d.model) for d in found.devices] == [
        ("gpu0", 0, "NVIDIA A100 80GB PCIe"), ("gpu1", 3, "NVIDIA A40")
    ]  # fmt: skip
    uuid = mixed_models().gpus[3].uuid
    found, _ = discovered(monkeypatch, mixed_models(), {"CUDA_VISIBLE_DEVICES": uuid})
    assert [d.model for d in found.devices] == ["NVIDIA A40"]
    # one model: the orders agree (CUDA breaks ties by PCI bus id), so indices are read as they are
    found, _ = discovered(monkeypatch, nv.nvswitch_box(), {"CUDA_VISIBLE_DEVICES": "1,0"})
    assert [d.nvml_index for d in found.devices] == [1, 0]
