"""NVML's raw answers on this machine: what the fake NVML (tests/fake_nvml.py) must mirror.

    python tools/gpu_nvml_raw.py OUT.json

For GPU 0, each query the suite makes: its value, or the name of the exception NVML raised
(NVMLError_NotSupported, NVMLError_NoPermission, ...). The PCIe generation and width are read at
rest and sampled during a host-to-device transfer (a link trained down to save power reads low at
rest). The ACS control of every bridge above the GPUs, as this user can read it (root reads the
extended config space). Without a GPU it writes why and exits 0: it gathers facts, it judges nothing.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

TRANSFER_SECONDS = 3.0
SAMPLE_EVERY = 0.1


def answer(query: Callable[[], Any]) -> Any:
    try:
        value = query()
    except Exception as exc:  # the class name is the fact: NotSupported, NoPermission, ...
        return {"raised": type(exc).__name__, "text": str(exc)}
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


def queries(nvml: Any, handle: Any) -> dict[str, Callable[[], Any]]:
    def counters(counter: int) -> Callable[[], Any]:
        return lambda: nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, counter)

    return {
        "name": lambda: nvml.nvmlDeviceGetName(handle),
        "uuid": lambda: nvml.nvmlDeviceGetUUID(handle),
        "pci bus id": lambda: nvml.nvmlDeviceGetPciInfo(handle).busId,
        "cuda compute capability": lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle),
        "memory total": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total,
        "pcie width now": lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
        "pcie width max": lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
        "pcie gen now": lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
        "pcie gen max": lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
        "pcie replay counter": lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle),
        "nvlink version (link 0)": lambda: nvml.nvmlDeviceGetNvLinkVersion(handle, 0),
        "nvlink state (link 0)": lambda: nvml.nvmlDeviceGetNvLinkState(handle, 0),
        "nvlink replay errors (link 0)": counters(nvml.NVML_NVLINK_ERROR_DL_REPLAY),
        "nvlink recovery errors (link 0)": counters(nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
        "nvlink crc flit errors (link 0)": counters(nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
        "ecc uncorrected volatile": lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        "remapped rows": lambda: nvml.nvmlDeviceGetRemappedRows(handle),
        "retired pages pending": lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle),
        "persistence mode": lambda: nvml.nvmlDeviceGetPersistenceMode(handle),
        "compute mode": lambda: nvml.nvmlDeviceGetComputeMode(handle),
        "clocks event reasons": lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "mig mode": lambda: nvml.nvmlDeviceGetMigMode(handle),
        "numa node": lambda: nvml.nvmlDeviceGetNumaNodeId(handle),
        "compute processes": lambda: [
            (p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ],  # noqa: E501
        "fabric info": lambda: _fabric(nvml, handle),
        "xid event wait (100 ms)": lambda: _xid_wait(nvml, handle),
        "driver version": nvml.nvmlSystemGetDriverVersion,
        "cuda driver version": nvml.nvmlSystemGetCudaDriverVersion,
    }


def _fabric(nvml: Any, handle: Any) -> str:
    import ctypes

    info = nvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    return f"state {info.state} status {info.status}"


def _xid_wait(nvml: Any, handle: Any) -> str:
    """The watch thread's path: register for Xid events, wait 100 ms (a quiet GPU answers Timeout)."""
    events = nvml.nvmlEventSetCreate()
    try:
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        data = nvml.nvmlEventSetWait_v2(events, 100)
        return f"event {data.eventType} data {data.eventData}"
    finally:
        nvml.nvmlEventSetFree(events)


def pcie_during_transfer(nvml: Any, handle: Any) -> dict[str, Any]:
    """The link's generation and width sampled while torch copies pinned host memory to the GPU."""
    import torch

    seen: list[tuple[Any, Any]] = []
    done = threading.Event()

    def copy() -> None:
        host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
        device = torch.empty_like(host, device="cuda:0")
        end = time.monotonic() + TRANSFER_SECONDS
        while time.monotonic() < end:
            device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        done.set()

    worker = threading.Thread(target=copy)
    worker.start()
    while not done.is_set():
        seen.append((answer(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                     answer(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))))  # fmt: skip
        time.sleep(SAMPLE_EVERY)
    worker.join()
    generations = sorted({g for g, _ in seen if isinstance(g, int)})
    widths = sorted({w for _, w in seen if isinstance(w, int)})
    return {"samples": len(seen), "generations seen": generations, "widths seen": widths}


def acs_bits(nvml: Any, count: int) -> dict[str, Any]:
    from conformance.discover.iommu import read_iommu
    from conformance.discover.nvml_topology import sysfs_bus_id

    buses = []
    for index in range(count):
        bus = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(index)).busId
        buses.append(sysfs_bus_id(bus.decode() if isinstance(bus, bytes) else str(bus)))
    facts = read_iommu(tuple(buses), Path("/sys/bus/pci/devices"), Path("/proc/cmdline"))
    return {"gpu bus ids": buses, **asdict(facts)}


def gather() -> dict[str, Any]:
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception as exc:
        return {"no gpu": f"{type(exc).__name__}: {exc}"}
    try:
        count = nvml.nvmlDeviceGetCount()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        found: dict[str, Any] = {"gpus": count, "queries": {k: answer(q) for k, q in queries(nvml, handle).items()}}
        found["pcie during transfer"] = answer(lambda: pcie_during_transfer(nvml, handle))
        found["pcie gen after transfer"] = answer(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
        found["acs"] = answer(lambda: acs_bits(nvml, count))
        return found
    finally:
        nvml.nvmlShutdown()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    found = gather()
    Path(argv[0]).write_text(json.dumps(found, indent=2, default=str))
    print(json.dumps(found, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
