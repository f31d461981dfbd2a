"""The CUDA error catalogue ``conformance diagnose`` ships, built from the pinned raw input: pure Python, no wheels.

    python tools/cuda_catalogue_build.py            writes conformance/verdict/catalogues/cuda_errors.json
    python tools/cuda_catalogue_build.py --check    exits 1 when what it would write differs

Reads ``tools/catalogue_inputs/cuda_errors_raw.json`` (every ``cudaError_t`` and ``CUresult`` of CUDA 11.8 to 13.5
with its header's first sentence and, for the runtime, ``cudaGetErrorString``'s text, written by
``tools/cuda_catalogue_extract.py``) and gives every code, ``cudaSuccess`` and ``CUDA_SUCCESS`` left out:

* a kind, as :mod:`conformance.verdict.cuda_errors` has them (machine, version, oom, transport, rank), what it means
  for a distributed job and a fix that is an action, from ONE table of rules (:data:`RULES`) keyed on the code's
  names (runtime and driver alike).  The first rule that names the code wins; the last names all;
* whether each of its texts is found anywhere in a line or only where CUDA's printers put it (:func:`alone`).

The catalogue is in ``conformance/verdict`` because its reader, ``cuda_errors.py``, is.  The output is sorted and
written with ``\\n`` line ends: a rerun is byte-identical, and ``tests/test_cuda_catalogue.py`` checks the committed
catalogue is this script's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from catalogue_files import write_or_check  # tools/ is the script's folder, and the tests put it on the path

REPO = Path(__file__).resolve().parent.parent
RAW = REPO / "tools" / "catalogue_inputs" / "cuda_errors_raw.json"
OUT = REPO / "conformance" / "verdict" / "catalogues" / "cuda_errors.json"
MACHINE, VERSION, OOM, TRANSPORT, RANK = "machine", "version", "oom", "transport", "rank"
# Each kind's failure class (conformance/verdict/job_causes.py FailureClass.key), as diagnose answers it.
CLASSES = {
    MACHINE: "machine_fault", VERSION: "version_mismatch", OOM: "oom", TRANSPORT: "transport", RANK: "rank_error",
}  # fmt: skip
NOT_FAILURES = ("cudaSuccess", "CUDA_SUCCESS")

# --------------------------------------------------------------------------------------------
# The fixes: each an action (what to run, set or check).
# --------------------------------------------------------------------------------------------

FIX_OOM = (
    "free GPU memory: find what holds it (`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`: a process "
    "left on the GPU?), then allocate less (batch size, activation checkpointing) or set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation"
)
FIX_ECC = (
    "check the GPU's memory errors: `nvidia-smi -q -d ECC` (uncorrectable counts, remapped or retired rows pending) "
    "and `dmesg | grep -i xid` (Xid 48, 63, 64, 94, 95); drain the node and reset the GPU (`nvidia-smi -r`, which a "
    "pending row remap needs) or have it serviced"
)
FIX_NVLINK = (
    "check the NVLinks: `nvidia-smi nvlink --status` and `nvidia-smi nvlink -e` (error counters), "
    "`dmesg | grep -i xid` (Xid 74); drain the node and have the link serviced; NCCL_P2P_DISABLE=1 runs around it"
)
FIX_GPU_FAULT = (
    "check the GPU is still there and healthy: `nvidia-smi` (a GPU missing or shown as ERR!) and "
    "`dmesg | grep -i xid` (Xid 79: fallen off the bus; 94/95: a contained or uncontained error; 119/120: GSP); "
    "drain the node and reset or reboot it; on a healthy GPU, rerun with CUDA_LAUNCH_BLOCKING=1 to name the call"
)
FIX_FABRIC = (
    "check Fabric Manager on this NVSwitch system: `systemctl status nvidia-fabricmanager` (running, the driver's "
    "version), `nvidia-smi -q | grep -i -A2 fabric` (State: Completed), `journalctl -u nvidia-fabricmanager`; "
    "start it, wait for the fabric, and rerun"
)
FIX_COMPUTE_MODE = (
    "check the GPU's compute mode and who holds it: `nvidia-smi -q | grep -i 'compute mode'` (Exclusive_Process or "
    "Prohibited refuse another process; `nvidia-smi -c DEFAULT` as root resets it) and "
    "`nvidia-smi --query-compute-apps=pid,process_name --format=csv`; give each rank its own GPU"
)
FIX_NO_DEVICE = (
    "check the process sees the GPUs: `nvidia-smi -L` on the node and in the container (`docker run --gpus all`, "
    "a pod's nvidia.com/gpu limit), `echo $CUDA_VISIBLE_DEVICES` (empty or wrong ids hide every GPU), "
    "`ls /dev/nvidia*`"
)
FIX_ORDINAL = (
    "compare the GPU index the rank asks for with the GPUs it sees: `nvidia-smi -L`, `echo $CUDA_VISIBLE_DEVICES`, "
    "LOCAL_RANK; start no more ranks per node than visible GPUs (torchrun --nproc_per_node, srun --gpus-per-task)"
)
FIX_DRIVER_HEALTH = (
    "check the driver works where the rank runs: `nvidia-smi` on the node and in the container, and that its "
    "version matches the kernel module (`cat /proc/driver/nvidia/version`); in Python start workers with the spawn "
    "method: a process forked after CUDA started cannot initialise it"
)
FIX_LICENSE = (
    "check the vGPU license: `nvidia-smi -q | grep -i -A2 license` and the licensing service "
    "(`systemctl status nvidia-gridd`)"
)
FIX_NOT_SUPPORTED = (
    "check what this GPU and its virtualisation support: `nvidia-smi -q | grep -i -E 'virtualization|mig mode'` "
    "(vGPU and MIG instances lack peer access, IPC and multicast); rerun with NCCL_DEBUG=WARN to name the CUDA call "
    "that was refused"
)
FIX_MPS = (
    "check the MPS daemon: `echo get_server_list | nvidia-cuda-mps-control`, that CUDA_MPS_PIPE_DIRECTORY and "
    "CUDA_MPS_LOG_DIRECTORY match the daemon's, and its log (control.log in that directory); restart it, or unset "
    "the MPS variables to run without it"
)
FIX_WATCHDOG = (
    "check whether the GPU drives a display: `nvidia-smi -q | grep -i display` (Display Active: Enabled puts a "
    "run-time limit on kernels); run on a GPU without a display"
)
FIX_MULTICAST = (
    "check Fabric Manager and the multicast objects NCCL asks for: `nvidia-smi -q | grep -i -A2 fabric`; set "
    "NCCL_NVLS_ENABLE=0 to run without NVLink SHARP (fewer multicast objects)"
)
FIX_CONFIDENTIAL = (
    "check the GPU's confidential-computing state (`nvidia-smi conf-compute --help` lists its queries) and the "
    "driver's log (`dmesg | grep -i nvrm`); drain the node if it persists"
)
FIX_DRIVER_OLD = (
    "upgrade the driver to one that supports the CUDA the program was built with (`nvidia-smi` prints the highest "
    "CUDA the driver supports, `python -c 'import torch; print(torch.version.cuda)'` the program's; CUDA 12.x needs "
    "driver >= 525.60.13, CUDA 13.x >= 580.65.06), or install a torch built for the CUDA this driver supports"
)
FIX_PTX = (
    "upgrade the driver to one at least as new as the CUDA the library's PTX was built with (`nvidia-smi`; PTX "
    "from CUDA 12.x needs a 12.x driver, >= 525.60.13, from 13.x >= 580.65.06: minor-version compatibility does "
    "not cover PTX), or install a torch/NCCL build with this GPU's own code (sm_XX)"
)
FIX_NO_KERNEL = (
    "install a torch/NCCL (or rebuild the extension) with this GPU's architecture: compare "
    "`nvidia-smi --query-gpu=compute_cap --format=csv` with "
    "`python -c 'import torch; print(torch.cuda.get_arch_list())'`"
)
FIX_JIT_MISSING = (
    "check the driver's PTX JIT compiler is in the container: `ldconfig -p | grep nvidia-ptxjitcompiler` (the NVIDIA "
    "container toolkit mounts it with NVIDIA_DRIVER_CAPABILITIES=compute,utility), or install a build with this "
    "GPU's own code"
)
FIX_JIT_DISABLED = (
    "unset CUDA_DISABLE_PTX_JIT (`env | grep CUDA_`), or install a torch/NCCL build with this GPU's own code (sm_XX)"
)
FIX_DRIVER_MISMATCH = (
    "install one driver version for the kernel module and user space: compare `cat /proc/driver/nvidia/version` "
    "with the libcuda.so the process loads (`ldconfig -p | grep libcuda`; a container's own libcuda, or a "
    "cuda-compat directory in LD_LIBRARY_PATH, overrides the host's)"
)
FIX_COMPAT = (
    "remove the CUDA forward-compatibility package from the library path (`echo $LD_LIBRARY_PATH` naming "
    "/usr/local/cuda/compat, the cuda-compat package): only data-centre GPUs support it; upgrade the driver instead"
)
FIX_STUB = (
    "remove the CUDA toolkit's stubs directory (.../lib64/stubs) from LD_LIBRARY_PATH so the driver's libcuda.so "
    "loads (`ldconfig -p | grep libcuda`; in a container, check the NVIDIA container toolkit mounted it)"
)
FIX_P2P = (
    "test every GPU pair (P2P): `nvidia-smi topo -p2p r` and `pytest suites/ -k pair_exchange`; on PCIe with the "
    "IOMMU or ACS on, turn them off (iommu=pt, the BIOS) or set NCCL_P2P_DISABLE=1"
)
FIX_KERNEL_FAULT = (
    "rerun with CUDA_LAUNCH_BLOCKING=1 to name the kernel that faulted and under `compute-sanitizer --tool memcheck` "
    "to find the access (a bug in the job's code or a library); on a program that ran before, check "
    "`dmesg | grep -i xid` (Xid 13, 31, 43) for a GPU fault"
)
FIX_ASSERT = (
    "rerun with CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA=1 on a torch built with it) to see the assert that "
    "failed: mostly an index out of range (an embedding, a loss's labels); fix the data or the code"
)
FIX_RESOURCES = (
    "rerun with CUDA_LAUNCH_BLOCKING=1 to name the kernel: it asks for more threads, registers or shared memory "
    "than this GPU has (a library built for another GPU, or a custom kernel's launch configuration); fix its launch"
)
FIX_CAPTURE = (
    "rerun without CUDA graphs (torch.compile without mode='reduce-overhead', no torch.cuda.graph) to find the call "
    "that is not allowed while a stream is captured; fix or move it out of the captured region"
)
FIX_SHUTDOWN = (
    "find the error before this one and fix that; otherwise destroy the process group and free CUDA work before "
    "the process exits (`dist.destroy_process_group()`): CUDA was called while the process was shutting down"
)
FIX_PROGRAM = (
    "rerun with CUDA_LAUNCH_BLOCKING=1 to name the CUDA call that failed (and `compute-sanitizer` for a kernel), "
    "then fix it in the job's code or the library that makes it: the error's description says what was wrong"
)


@dataclass(frozen=True)
class Rule:
    """Codes by their names (runtime and driver) to a kind, a meaning for a distributed job and a fix."""

    name: str
    kind: str
    meaning: str
    fix: str
    names: tuple[str, ...] = ()  # empty: every code

    def fits(self, name: str) -> bool:
        return not self.names or name in self.names


# ONE table: the first rule that names a code gives its kind, meaning and fix.  Each cites why: the header's own
# words for the code (driver_types.h / cuda.h, quoted in the catalogue's descriptions) and, where they say more,
# NVIDIA's documents.
RULES: tuple[Rule, ...] = (
    # driver_types.h: "unable to allocate enough memory or other resources to perform the requested operation".
    Rule("out of memory", OOM, "the GPU ran out of memory", FIX_OOM,
         ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")),
    # "an uncorrectable ECC error was detected during execution": GPU memory (NVIDIA GPU Memory Error Management:
    # Xid 48 double-bit error, 63/64 row remapping).
    Rule("ECC", MACHINE, "an uncorrectable GPU memory (ECC) error", FIX_ECC,
         ("cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE")),
    # "an uncorrectable NVLink error was detected during the execution" (Xid 74, NVIDIA Xid catalogue).
    Rule("NVLink", MACHINE, "an uncorrectable NVLink error", FIX_NVLINK,
         ("cudaErrorNvlinkUncorrectable", "CUDA_ERROR_NVLINK_UNCORRECTABLE")),
    # 999 "an unknown internal error": what CUDA answers once a GPU is gone (Xid 79, fallen off the bus); 714
    # "an error in the call stack ... possibly due to stack corruption"; 226 "an exception ... contained by the
    # GPU's error containment capability" (Xid 94/95); 911 "an async error has occurred in a device outside of
    # CUDA"; 127 "an internal startup failure in the CUDA runtime"; 103 the self-tests of the runtime and driver
    # failed.  None is the program's to fix.
    Rule("GPU fault", MACHINE, "a GPU or driver fault (after an Xid, a GPU fallen off the bus)", FIX_GPU_FAULT,
         ("cudaErrorUnknown", "CUDA_ERROR_UNKNOWN", "cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR",
          "cudaErrorContained", "CUDA_ERROR_CONTAINED", "cudaErrorExternalDevice", "CUDA_ERROR_EXTERNAL_DEVICE",
          "cudaErrorStartupFailure", "cudaErrorSoftwareValidityNotEstablished")),
    # 802 "the system is not yet ready to start any CUDA work ... all required driver daemons are actively running":
    # on NVSwitch systems Fabric Manager (pytorch/pytorch#35710); 919 (13.4) "GPU fabric is not ready ... while the
    # fabric manager probe is still in progress".
    Rule("Fabric Manager", MACHINE, "the GPU fabric is not ready: Fabric Manager not running or not done",
         FIX_FABRIC, ("cudaErrorSystemNotReady", "CUDA_ERROR_SYSTEM_NOT_READY", "cudaErrorFabricNotReady",
                      "CUDA_ERROR_FABRIC_NOT_READY")),
    # 46 "all CUDA devices are busy or unavailable" (compute mode Exclusive_Process or Prohibited, nvidia-smi -c);
    # 216 "an exclusive-thread device that is already in use by a different thread".
    Rule("compute mode", MACHINE, "the GPU is in an exclusive or prohibited compute mode, or another process "
         "holds it", FIX_COMPUTE_MODE, ("cudaErrorDevicesUnavailable", "CUDA_ERROR_DEVICE_UNAVAILABLE",
                                         "cudaErrorDeviceAlreadyInUse", "CUDA_ERROR_CONTEXT_ALREADY_IN_USE")),
    # 100 "no CUDA-capable devices were detected by the installed CUDA driver".
    Rule("no device", MACHINE, "the process sees no GPU", FIX_NO_DEVICE, ("cudaErrorNoDevice", "CUDA_ERROR_NO_DEVICE")),
    # 101 "the device ordinal supplied by the user does not correspond to a valid CUDA device".
    Rule("device ordinal", MACHINE, "a GPU index past those the process sees", FIX_ORDINAL,
         ("cudaErrorInvalidDevice", "CUDA_ERROR_INVALID_DEVICE")),
    # 3 "the CUDA driver and runtime could not be initialized" / "cuInit() ... initialization has failed".
    Rule("driver not initialised", MACHINE, "CUDA could not be initialised: a driver that does not match its kernel "
         "module, or CUDA used in a process forked after CUDA started", FIX_DRIVER_HEALTH,
         ("cudaErrorInitializationError", "CUDA_ERROR_NOT_INITIALIZED")),
    # 102 "the device doesn't have a valid Grid License" (vGPU).
    Rule("vGPU license", MACHINE, "the virtual GPU has no valid license", FIX_LICENSE,
         ("cudaErrorDeviceNotLicensed", "CUDA_ERROR_DEVICE_NOT_LICENSED")),
    # 801 "the attempted operation is not supported on the current system or device" (vGPU, MIG).
    Rule("not supported", MACHINE, "this GPU or its virtualisation (vGPU, MIG) does not support what was asked",
         FIX_NOT_SUPPORTED, ("cudaErrorNotSupported", "CUDA_ERROR_NOT_SUPPORTED")),
    # 805-810: "the MPS client failed to connect to the MPS control daemon", its RPC failed, the server not ready,
    # its client or connection resources exhausted, the client terminated by the server.
    Rule("MPS", MACHINE, "the CUDA MPS daemon refused or lost the process", FIX_MPS,
         ("cudaErrorMpsConnectionFailed", "CUDA_ERROR_MPS_CONNECTION_FAILED", "cudaErrorMpsRpcFailure",
          "CUDA_ERROR_MPS_RPC_FAILURE", "cudaErrorMpsServerNotReady", "CUDA_ERROR_MPS_SERVER_NOT_READY",
          "cudaErrorMpsMaxClientsReached", "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "cudaErrorMpsMaxConnectionsReached",
          "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "cudaErrorMpsClientTerminated",
          "CUDA_ERROR_MPS_CLIENT_TERMINATED")),
    # 702 "the device kernel took too long to execute. This can only occur if timeouts are enabled".
    Rule("kernel run-time limit", MACHINE, "the GPU's run-time limit (a display GPU) stopped a kernel", FIX_WATCHDOG,
         ("cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT")),
    # cuda.h 47 (driver only): "a hardware resource required to bind memory to a multicast object is unavailable".
    Rule("multicast", MACHINE, "the NVSwitch multicast resources (NVLink SHARP) are exhausted", FIX_MULTICAST,
         ("CUDA_ERROR_MULTICAST_RESOURCE_FULL",)),
    # cuda.h 916 (driver only): "an error happened during the key rotation sequence" (confidential computing).
    Rule("key rotation", MACHINE, "the GPU's confidential-computing key rotation failed", FIX_CONFIDENTIAL,
         ("CUDA_ERROR_KEY_ROTATION",)),
    # 35 "the installed NVIDIA CUDA driver is older than the CUDA runtime library"; 36 "the API call requires a newer
    # CUDA driver"; 10 "the driver is newer than the runtime ... unable to translate" (driver and runtime apart).
    # Minimum drivers: CUDA Toolkit Release Notes, table 3 (12.x >= 525.60.13, 13.x >= 580.65.06 on Linux).
    Rule("driver too old", VERSION, "the driver is older than the CUDA the program was built for", FIX_DRIVER_OLD,
         ("cudaErrorInsufficientDriver", "cudaErrorCallRequiresNewerDriver", "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
          "cudaErrorVersionTranslation")),
    # 222 "the provided PTX was compiled with an unsupported toolchain"; 218 "A PTX compilation failed"; 227 (13.4)
    # "loader version is insufficient for Fatbin": code newer than the driver that loads it.
    Rule("PTX too new", VERSION, "the driver is older than the CUDA the library's PTX was built with", FIX_PTX,
         ("cudaErrorUnsupportedPtxVersion", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "cudaErrorInvalidPtx",
          "CUDA_ERROR_INVALID_PTX", "cudaErrorInsufficientLoaderVersion", "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION")),
    # 209 "no kernel image available that is suitable for the device"; 98 "not compiled for the proper device
    # architecture"; 200 "the device kernel image is invalid".
    Rule("no kernel for GPU", VERSION, "the library was built without this GPU's architecture", FIX_NO_KERNEL,
         ("cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU", "cudaErrorInvalidDeviceFunction",
          "cudaErrorInvalidKernelImage", "CUDA_ERROR_INVALID_IMAGE")),
    # 221 "the PTX JIT compiler library was not found" (libnvidia-ptxjitcompiler.so, part of the driver).
    Rule("JIT compiler missing", VERSION, "the driver's PTX JIT compiler is missing", FIX_JIT_MISSING,
         ("cudaErrorJitCompilerNotFound", "CUDA_ERROR_JIT_COMPILER_NOT_FOUND")),
    # 223 "the JIT compilation was disabled" (CUDA_DISABLE_PTX_JIT, CUDA C Programming Guide, environment variables).
    Rule("JIT disabled", VERSION, "PTX JIT is disabled and the library has no code for this GPU", FIX_JIT_DISABLED,
         ("cudaErrorJitCompilationDisabled", "CUDA_ERROR_JIT_COMPILATION_DISABLED")),
    # 803 "a mismatch between the versions of the display driver and the CUDA driver".
    Rule("driver mismatch", VERSION, "the user-space CUDA driver does not match the kernel driver",
         FIX_DRIVER_MISMATCH, ("cudaErrorSystemDriverMismatch", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH")),
    # 804 "the system was upgraded to run with forward compatibility but the visible hardware ... does not support
    # this configuration" (CUDA Compatibility guide: forward compatibility is for data-centre GPUs).
    Rule("forward compatibility", VERSION, "the CUDA forward-compatibility package is in use on a GPU that does not "
         "support it", FIX_COMPAT,
         ("cudaErrorCompatNotSupportedOnDevice", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE")),
    # 34 "the CUDA driver that the application has loaded is a stub library".
    Rule("stub driver", VERSION, "the toolkit's stub libcuda.so was loaded instead of the driver's", FIX_STUB,
         ("cudaErrorStubLibrary", "CUDA_ERROR_STUB_LIBRARY")),
    # 217 "P2P access is not supported across the given devices".
    Rule("peer access", TRANSPORT, "GPU peer-to-peer access is not possible between these GPUs (PCIe topology, "
         "IOMMU, virtualisation)", FIX_P2P, ("cudaErrorPeerAccessUnsupported", "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED")),
    # 700 "a load or store instruction on an invalid memory address", 715 illegal instruction, 716 misaligned
    # address, 717 invalid address space, 718 invalid program counter, 719 "An exception occurred on the device
    # while executing a kernel", 721 tensor memory not freed: a kernel's fault, and every later call fails too.
    Rule("kernel fault", RANK, "a kernel faulted: a bug in the rank's code or a library, or a GPU fault",
         FIX_KERNEL_FAULT, ("cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS", "cudaErrorIllegalInstruction",
                            "CUDA_ERROR_ILLEGAL_INSTRUCTION", "cudaErrorMisalignedAddress",
                            "CUDA_ERROR_MISALIGNED_ADDRESS", "cudaErrorInvalidAddressSpace",
                            "CUDA_ERROR_INVALID_ADDRESS_SPACE", "cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC",
                            "cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED", "cudaErrorTensorMemoryLeak",
                            "CUDA_ERROR_TENSOR_MEMORY_LEAK")),
    # 710 "An assert triggered in device code during kernel execution".
    Rule("device assert", RANK, "an assert in a kernel failed", FIX_ASSERT, ("cudaErrorAssert", "CUDA_ERROR_ASSERT")),
    # 701 "a launch did not occur because it did not have appropriate resources"; 9 "a kernel launch is requesting
    # resources that can never be satisfied by the current device"; 720 too many blocks in a cooperative launch.
    Rule("launch resources", RANK, "a kernel launch asked for more than this GPU has", FIX_RESOURCES,
         ("cudaErrorLaunchOutOfResources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cudaErrorInvalidConfiguration",
          "cudaErrorCooperativeLaunchTooLarge", "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE")),
    # 900-908 "The operation is not permitted when the stream is capturing" and the other stream-capture errors,
    # 910 a graph update refused, 918 (13.3) a graph recapture failed: CUDA graphs.
    Rule("stream capture", RANK, "a CUDA call not allowed while a stream is captured into a CUDA graph", FIX_CAPTURE,
         ("cudaErrorStreamCaptureUnsupported", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
          "cudaErrorStreamCaptureInvalidated", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "cudaErrorStreamCaptureMerge",
          "CUDA_ERROR_STREAM_CAPTURE_MERGE", "cudaErrorStreamCaptureUnmatched", "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
          "cudaErrorStreamCaptureUnjoined", "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "cudaErrorStreamCaptureIsolation",
          "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "cudaErrorStreamCaptureImplicit", "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
          "cudaErrorCapturedEvent", "CUDA_ERROR_CAPTURED_EVENT", "cudaErrorStreamCaptureWrongThread",
          "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "cudaErrorGraphExecUpdateFailure",
          "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "cudaErrorGraphRecaptureFailure",
          "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE")),
    # 4 "called during process shut down, at a point in time after CUDA driver has been unloaded" / "the CUDA driver
    # is in the process of shutting down"; 709 "the context current to the calling thread has been destroyed".
    Rule("shutting down", RANK, "CUDA was called while the process was shutting down", FIX_SHUTDOWN,
         ("cudaErrorCudartUnloading", "CUDA_ERROR_DEINITIALIZED", "cudaErrorContextIsDestroyed",
          "CUDA_ERROR_CONTEXT_IS_DESTROYED")),
    # Everything else is a call the program made wrongly ("one or more of the parameters passed to the API call is
    # not within an acceptable range", 401 "a resource required by the API call is not in a valid state", ...).
    Rule("program error", RANK, "a CUDA call the rank's code or a library made was refused", FIX_PROGRAM),
)  # fmt: skip


def rule_for(name: str) -> Rule:
    return next(rule for rule in RULES if rule.fits(name))


# --------------------------------------------------------------------------------------------
# Texts: found anywhere, or only where CUDA's printers put them
# --------------------------------------------------------------------------------------------

# The texts of glibc's strerror that are also a cudaGetErrorString text (EPERM "Operation not permitted", EINVAL
# "Invalid argument", EOPNOTSUPP "Operation not supported", and "Unknown error %d" for an unknown errno): a log's
# OSError prints them too.  tests/test_cuda_catalogue.py checks this list against os.strerror.
ERRNO_TEXTS = ("invalid argument", "operation not permitted", "operation not supported", "unknown error")
MIN_WORDS = 3


def alone(text: str) -> bool:
    """Whether a text is CUDA's wherever a line has it: three words or more, and no C library error's text."""
    return len(text.split()) >= MIN_WORDS and text.lower() not in ERRNO_TEXTS


# --------------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------------


def _grouped(records: list[dict[str, object]]) -> dict[tuple[str, int], list[dict[str, object]]]:
    """The records of each (name, number), oldest first (a text that changed between releases is two records)."""
    groups: dict[tuple[str, int], list[dict[str, object]]] = {}
    for record in records:
        groups.setdefault((str(record["name"]), int(str(record["value"]))), []).append(record)
    return groups


def _provenance(group: list[dict[str, object]], versions: list[str]) -> dict[str, object]:
    last = max(group, key=lambda r: versions.index(str(r["last_version"])))
    first = min(group, key=lambda r: versions.index(str(r["first_version"])))
    order = versions[versions.index(str(first["first_version"])) : versions.index(str(last["last_version"])) + 1]
    present = {v for r in group for v in _span(r, versions)}
    file, _, line = str(last["at"]).rpartition(":")
    missing = [v for v in order if v not in present]
    return {"file": file, "line": int(line), "first_version": first["first_version"],
            "last_version": last["last_version"], "missing_between": missing}  # fmt: skip


def _span(record: dict[str, object], versions: list[str]) -> list[str]:
    span = versions[versions.index(str(record["first_version"])) : versions.index(str(record["last_version"])) + 1]
    return [v for v in span if v not in list(record["missing_between"])]  # type: ignore[call-overload]


def entry(api: str, group: list[dict[str, object]], versions: list[str]) -> dict[str, object]:
    """One code's catalogue entry: its newest texts, every text it printed, its rule's kind, meaning and fix."""
    newest = group[-1]
    name = str(newest["name"])
    rule = rule_for(name)
    strings = sorted({str(r["string"]) for r in group if r.get("string")})
    return {
        "api": api, "name": name, "code": newest["value"], "description": newest["description"],
        "deprecated": newest["deprecated"], "string": newest.get("string", ""),
        "texts": [{"text": s, "alone": alone(s)} for s in strings],
        "kind": rule.kind, "class": CLASSES[rule.kind], "meaning": rule.meaning, "fix": rule.fix, "rule": rule.name,
        "provenance": _provenance(group, versions),
    }  # fmt: skip


def entries(raw: dict[str, object]) -> list[dict[str, object]]:
    versions = list(raw["source"]["versions"])  # type: ignore[index]
    out = []
    for api in ("runtime", "driver"):
        for (name, _), group in _grouped(list(raw[api])).items():  # type: ignore[call-overload]
            if name not in NOT_FAILURES:
                group.sort(key=lambda r: versions.index(str(r["first_version"])))
                out.append(entry(api, group, versions))
    return sorted(out, key=lambda e: (e["api"] != "runtime", e["code"], e["name"]))


def _source(raw: dict[str, object]) -> dict[str, object]:
    source = dict(raw["source"])  # type: ignore[call-overload]
    releases = [{k: r[k] for k in ("cuda", "package", "version", "sha256")} for r in source.pop("releases")]
    return {**source, "releases": releases, "builder": "tools/cuda_catalogue_build.py"}


def built() -> dict[Path, str]:
    """What the build writes: each file's text."""
    raw = json.loads(RAW.read_text())
    catalogue = {"source": _source(raw), "classes": CLASSES, "errno_texts": list(ERRNO_TEXTS),
                 "entries": entries(raw)}  # fmt: skip
    return {OUT: json.dumps(catalogue, indent=1, sort_keys=True, ensure_ascii=True) + "\n"}


def counts(texts: dict[Path, str]) -> str:
    """Entries per API and kind, as the build prints them."""
    catalogue = json.loads(texts[OUT])
    got = catalogue["entries"]
    lines = [f"{len(got)} CUDA error codes, CUDA {catalogue['source']['versions'][0]} to "
             f"{catalogue['source']['versions'][-1]}:"]  # fmt: skip
    for api in ("runtime", "driver"):
        kinds = Counter(e["kind"] for e in got if e["api"] == api)
        lines.append(f"  {api:8} {sum(kinds.values()):4}  " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    texts = built()
    print(counts(texts))
    return write_or_check(texts, args.check)


if __name__ == "__main__":
    sys.exit(main())
