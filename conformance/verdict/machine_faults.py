"""Faults of the machine that no environment rung can change: the ladder stops, the answer names them.

CUDA itself refusing in the rank's own torch call is the same under every NCCL variable: torch
raises ``CUDA error: <cudaGetErrorString>`` (or, from ``cudaGetDeviceCount``, ``Error <code>:
<string>``).  NCCL's own ``Cuda failure '...'`` is not here: an NCCL rung (cumem_off, ...) changes
what NCCL asks of CUDA.  Only rungs that set variables beyond NCCL's (CUDA_*, GLOO_*, TORCH_*: user
rungs) still run after one of these.  Each row names the fault as the answer's class line shows it
and the fix, which is the machine's, never an environment variable.

The texts are the CUDA runtime's error strings (CUDA Runtime API, "Data types: cudaError",
https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html):
cudaErrorSystemNotReady 802 "system not yet initialized" (on NVSwitch systems: Fabric Manager is
not running, pytorch/pytorch#35710), cudaErrorECCUncorrectable 214 "uncorrectable ECC error
encountered", cudaErrorDevicesUnavailable 46 "CUDA-capable device(s) is/are busy or unavailable"
(exclusive or prohibited compute mode, or a GPU another process holds), cudaErrorNoDevice 100
"no CUDA-capable device is detected", cudaErrorInsufficientDriver 35 "CUDA driver version is
insufficient for CUDA runtime version", cudaErrorInvalidDevice 101 "invalid device ordinal",
cudaErrorNotSupported 801 "operation not supported"; torch's own "No CUDA GPUs are available"
(torch/cuda/__init__.py, _lazy_init); NVML's "GPU is lost" (NVML_ERROR_GPU_IS_LOST, Xid 79: the
GPU fell off the bus); cudaErrorUnknown 999 "unknown error", what the CUDA runtime answers once the
GPU is gone (torch prints it as "CUDA error: unknown error"; NCCL's own "Cuda failure 'unknown
error'" is NCCL's and climbs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conformance.common.verdicts import Verdict


@dataclass(frozen=True)
class MachineFault:
    """A failure no NCCL variable changes: what it is, and what fixes the machine."""

    name: str
    pattern: re.Pattern[str]
    fix: str


def _said(*texts: str) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(text) for text in texts), re.IGNORECASE)


MACHINE_FAULTS: tuple[MachineFault, ...] = (
    MachineFault(
        "FABRIC MANAGER NOT RUNNING (CUDA error 802: system not yet initialized)",
        _said("system not yet initialized", "Error 802"),
        "start nvidia-fabricmanager, the driver's exact version (`systemctl status nvidia-fabricmanager`; "
        "`nvidia-smi -q -d FABRIC` shows each GPU's state)",
    ),
    MachineFault(
        "UNCORRECTABLE ECC ERROR",
        _said("uncorrectable ECC error encountered"),
        "reset the GPU (`nvidia-smi -r`) or reboot; a row remapping that fails means replacing it "
        "(`nvidia-smi -q -d ECC,ROW_REMAPPER`)",
    ),
    MachineFault(
        "GPU BUSY OR UNAVAILABLE",
        _said("busy or unavailable"),
        "the GPU's compute mode is exclusive or prohibited, or another process holds it: `nvidia-smi -q -d "
        "COMPUTE` and `nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv`; `nvidia-smi -c DEFAULT`",
    ),
    MachineFault(
        "GPU LOST",
        _said("GPU is lost", "fallen off the bus"),
        "the GPU fell off the bus (Xid 79: `dmesg | grep -i xid`): reset it or reboot; one that stays lost is a "
        "hardware case",
    ),
    # NCCL's own word (src/graph/paths.cc, v2.18.3-1 .. v2.30.7-1): NVML reports P2P read or write not OK between
    # GPUs joined by NVLink, and NCCL refuses the communicator: "P2P is disabled between NVLINK connected GPUs %d
    # and %d. This should not be the case given their connectivity, and is probably due to a hardware issue."
    # NCCL_P2P_DISABLE=1 only hides it, for every pair of the class: the GPUs' or the link's fault.
    MachineFault(
        "NVLINK P2P DISABLED BY THE HARDWARE (NCCL: 'probably due to a hardware issue')",
        _said("P2P is disabled between NVLINK connected GPUs"),
        "the GPUs it names have NVLink but NVML reports no P2P between them: reset them (`nvidia-smi -r -i <gpu>`) "
        "or reboot; check their links (`nvidia-smi nvlink -s -i <gpu>`, errors: `nvidia-smi nvlink -e -i <gpu>`); "
        "a pair that stays so needs the board serviced, or one GPU left out (CUDA_VISIBLE_DEVICES); never P2P "
        "turned off for the class, which slows every pair of it to hide one",
    ),
    # A library built without the GPU's architecture: the CUDA runtime's cudaErrorInvalidDeviceFunction 98 "invalid
    # device function" and cudaErrorNoKernelImageForDevice 209 "no kernel image is available for execution on the
    # device", which NCCL prints as "Cuda failure '<text>'" (NVIDIA/nccl#932; pytorch/pytorch#164402); NCCL 2.25's
    # "ncclMaxSharedMem ... exceeds device/fn maxSharedMem" on sm_120 (src/enqueue.cc). NCCL has no kernel for the
    # GPU under any variable, so no rung runs: the host check nccl_gpu names the release needed. (torch's warning
    # "... is not compatible with the current PyTorch installation" is only a warning: diagnose reads it as a sign.)
    MachineFault(
        "NCCL OR TORCH TOO OLD FOR THIS GPU (built without its architecture)",
        _said(
            "invalid device function",
            "no kernel image is available for execution on the device",
            "exceeds device/fn maxSharedMem",
        ),
        "upgrade NCCL or torch to a release built for this GPU's compute capability (the host check nccl_gpu names "
        "the first NCCL that has it; `python -c 'import torch; print(torch.cuda.get_arch_list(), "
        "torch.cuda.nccl.version())'`)",
    ),
    # The driver's own report in the kernel log, pasted with a job's log: "NVRM: Xid (PCI:0000:3b:00): 79, pid=...,
    # GPU has fallen off the bus." (NVIDIA's XID errors catalogue: every Xid is the driver's, none a setting's).
    MachineFault(
        "GPU XID ERROR IN THE KERNEL LOG",
        re.compile(r"NVRM: Xid \(", re.IGNORECASE),
        "look the Xid up in NVIDIA's Xid catalogue (https://docs.nvidia.com/deploy/xid-errors/); `nvidia-smi -q` "
        "for the GPU's state; reset the GPU or reboot, and replace it if the Xid recurs",
    ),
    MachineFault(
        "CUDA UNKNOWN ERROR (a GPU lost after Xid 79 answers so)",
        re.compile(r"CUDA error: unknown error", re.IGNORECASE),
        "look for Xid 79 (`dmesg | grep -i xid`: the GPU fell off the bus) and other Xids; reset the GPU or reboot",
    ),
    MachineFault(
        "NO CUDA DEVICE IN THE RANK",
        _said("no CUDA-capable device is detected", "No CUDA GPUs are available"),
        "the rank sees no GPU: check CUDA_VISIBLE_DEVICES and the container's GPUs (docker --gpus all)",
    ),
    MachineFault(
        "CUDA DRIVER TOO OLD",
        _said("CUDA driver version is insufficient for CUDA runtime version"),
        "upgrade the driver, or install a torch built for the CUDA this driver supports",
    ),
    MachineFault(
        "INVALID DEVICE ORDINAL",
        _said("invalid device ordinal"),
        "the rank sees fewer GPUs than it was given: check CUDA_VISIBLE_DEVICES",
    ),
    MachineFault(
        "CUDA OPERATION NOT SUPPORTED",
        re.compile(r"CUDA error: operation not supported", re.IGNORECASE),
        "this GPU or its virtualisation (vGPU, MIG) does not support what the rank asked of CUDA",
    ),
)


# Any of them, in one search: a line that names a machine fault shows a failure whatever else it says.
ANY_MACHINE_FAULT = re.compile("|".join(f"(?:{fault.pattern.pattern})" for fault in MACHINE_FAULTS), re.IGNORECASE)


def machine_fault(verdict: str, message: str) -> MachineFault | None:
    """The machine fault an error or crash names, if any (a hang names none: its ranks said nothing)."""
    if verdict not in (Verdict.ERROR, Verdict.CRASH):
        return None
    return next((fault for fault in MACHINE_FAULTS if fault.pattern.search(message)), None)


def unchangeable(verdict: str, message: str) -> bool:
    """Whether a case's failure is one that no NCCL environment rung can change."""
    return machine_fault(verdict, message) is not None
