"""CUDA's errors by number, name and text, and which GPUs each NCCL release first supports.

The numbers and names are the CUDA runtime's ``enum cudaError`` (``driver_types.h``; CUDA Runtime
API, "Data types: cudaError", https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html);
the texts are ``cudaGetErrorString``'s, as torch prints them (``CUDA error: <text>``,
c10/cuda/CUDAException.h), as NCCL prints them (``Cuda failure <n> '<text>'``, or ``Cuda failure
'<text>'`` before 2.19, src/include/checks.h), and as nccl-tests prints them (``Test CUDA failure
common.cu:<line> '<text>'``, nccl-tests src/common.h ``CUDACHECK``).  A log may show any one of
number, name or text, so a row is found by each (:func:`cuda_error_in`).

What each error means for a distributed job, and so its class, is the row's ``kind``: one that only
a machine fix cures (``machine``), one that says the software is too old for the GPU or the driver
(``version``), a GPU out of memory (``oom``), a transport NCCL cannot use (``transport``) or a fault
in the rank's own kernels (``rank``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conformance.common.versions import release

MACHINE, VERSION, OOM, TRANSPORT, RANK = "machine", "version", "oom", "transport", "rank"


@dataclass(frozen=True)
class CudaError:
    code: int
    name: str  # cudaErrorSystemNotReady
    text: str  # cudaGetErrorString's
    kind: str
    meaning: str  # for a distributed job, in words, with the fix


CUDA_ERRORS: tuple[CudaError, ...] = (
    CudaError(2, "cudaErrorMemoryAllocation", "out of memory", OOM, "the GPU ran out of memory"),
    CudaError(
        3,
        "cudaErrorInitializationError",
        "initialization error",
        MACHINE,
        "CUDA could not be initialised: a driver that does not match its kernel module (`nvidia-smi` fails too), "
        "or CUDA used in a process forked after CUDA started",
    ),
    CudaError(
        35,
        "cudaErrorInsufficientDriver",
        "CUDA driver version is insufficient for CUDA runtime version",
        VERSION,
        "the driver is older than the CUDA torch was built for: upgrade the driver, or use a torch built for the "
        "CUDA this driver supports",
    ),
    CudaError(
        46,
        "cudaErrorDevicesUnavailable",
        "CUDA-capable device(s) is/are busy or unavailable",
        MACHINE,
        "the GPU is in an exclusive or prohibited compute mode, or another process holds it",
    ),
    CudaError(
        98,
        "cudaErrorInvalidDeviceFunction",
        "invalid device function",
        VERSION,
        "the library has no kernel for this GPU's architecture (built for older GPUs): upgrade NCCL/torch",
    ),
    CudaError(100, "cudaErrorNoDevice", "no CUDA-capable device is detected", MACHINE, "the process sees no GPU"),
    CudaError(101, "cudaErrorInvalidDevice", "invalid device ordinal", MACHINE, "a GPU index past those visible"),
    CudaError(
        209,
        "cudaErrorNoKernelImageForDevice",
        "no kernel image is available for execution on the device",
        VERSION,
        "the library was built without this GPU's architecture: upgrade NCCL/torch to a build that has it",
    ),
    CudaError(214, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered", MACHINE, "GPU memory fault"),
    CudaError(
        217,
        "cudaErrorPeerAccessUnsupported",
        "peer access is not supported between these two devices",
        TRANSPORT,
        "GPU peer-to-peer access is not possible between these GPUs (PCIe topology, IOMMU, virtualisation)",
    ),
    CudaError(220, "cudaErrorNvlinkUncorrectable", "uncorrectable NVLink error detected", MACHINE, "an NVLink fault"),
    CudaError(
        222,
        "cudaErrorUnsupportedPtxVersion",
        "the provided PTX was compiled with an unsupported toolchain",
        VERSION,
        "the driver is older than the CUDA the library's PTX was built with: upgrade the driver",
    ),
    CudaError(
        401,
        "cudaErrorIllegalState",
        "the operation cannot be performed in the present state",
        RANK,
        "a CUDA call made in a state that forbids it (a stream being captured, a context torn down)",
    ),
    CudaError(
        700,
        "cudaErrorIllegalAddress",
        "an illegal memory access was encountered",
        RANK,
        "a kernel read or wrote outside its memory: a bug in the rank's code or a library (`CUDA_LAUNCH_BLOCKING=1` "
        "names the kernel); on a healthy program, look for Xid 13/31 in `dmesg`",
    ),
    CudaError(
        719,
        "cudaErrorLaunchFailure",
        "unspecified launch failure",
        RANK,
        "a kernel faulted: a bug in the rank's code or a library, or a GPU fault (Xid 13/43/79 in `dmesg`)",
    ),
    CudaError(
        801,
        "cudaErrorNotSupported",
        "operation not supported",
        MACHINE,
        "this GPU or its virtualisation (vGPU, MIG) does not support what was asked of CUDA",
    ),
    CudaError(
        802,
        "cudaErrorSystemNotReady",
        "system not yet initialized",
        MACHINE,
        "on NVSwitch systems Fabric Manager is not running (pytorch/pytorch#35710)",
    ),
    CudaError(
        803,
        "cudaErrorSystemDriverMismatch",
        "system has unsupported display driver / cuda driver combination",
        VERSION,
        "the user-space CUDA driver does not match the kernel driver: one driver version for both",
    ),
    CudaError(
        804,
        "cudaErrorCompatNotSupportedOnDevice",
        "forward compatibility was attempted on non supported HW",
        VERSION,
        "the CUDA forward-compatibility package is in use on a GPU that does not support it: upgrade the driver",
    ),
    CudaError(999, "cudaErrorUnknown", "unknown error", MACHINE, "what CUDA answers once a GPU is gone (Xid 79)"),
)

_BY_CODE = {error.code: error for error in CUDA_ERRORS}
# "CUDA error 802", "Cuda failure 802 'system ...'", NCCL's "CUDA driver error 802" (cudawrap.cc); a bare number
# after any other word is too often an exit code to be read as CUDA's.  cudaError's names; the texts.
_CODE = re.compile(r"\bcuda (?:error|failure|driver error)\s?:?\s?(?P<code>\d{1,4})\b", re.IGNORECASE)
_NAME_OR_TEXT = re.compile(
    "|".join(f"(?P<e{e.code}>{re.escape(e.name)}\\b|{re.escape(e.text)})" for e in CUDA_ERRORS), re.IGNORECASE
)


def cuda_error_in(text: str) -> CudaError | None:
    """The CUDA error a line names by its name, its text or its number; None when it names none."""
    m = _NAME_OR_TEXT.search(text)
    if m is not None and m.lastgroup is not None:
        return _BY_CODE[int(m.lastgroup[1:])]
    m = _CODE.search(text)
    return _BY_CODE.get(int(m["code"])) if m is not None else None


@dataclass(frozen=True)
class GpuGeneration:
    """A GPU architecture and the first NCCL release that runs on it."""

    sm: int  # compute capability as torch and NCCL print it: 90 for sm_90, "cudaArch 900"
    name: str
    nccl: str  # the first NCCL release that supports it
    source: str  # where that comes from


# NCCL's own history (NVIDIA/nccl, makefiles/common.mk gaining the architecture's -gencode, and the release's
# commit message): 2.7.3-1 "Add support for A100 GPU"; 2.15.1-1 "Add support for H100 (sm90)"; 2.25.1-1
# "Add Blackwell/SM100 support" (compute_100 and compute_120 in common.mk); 2.26.2-1 "Fix shared memory usage on
# recent Blackwell GPUs" (sm_120: before it, "ncclMaxSharedMem ... exceeds device/fn maxSharedMem", enqueue.cc).
GPU_GENERATIONS: tuple[GpuGeneration, ...] = (
    GpuGeneration(80, "Ampere (A100)", "2.7.3", "NCCL 2.7.3-1 release: Add support for A100 GPU"),
    GpuGeneration(90, "Hopper (H100/H200)", "2.15.1", "NCCL 2.15.1-1 release: Add support for H100 (sm90)"),
    GpuGeneration(100, "Blackwell (B200/GB200)", "2.25.1", "NCCL 2.25.1-1 release: Add Blackwell/SM100 support"),
    GpuGeneration(
        120,
        "Blackwell (RTX 50xx, RTX PRO 6000)",
        "2.26.2",
        "NCCL 2.26.2-1 release: Fix shared memory usage on recent Blackwell GPUs",
    ),
)
# torch/cuda/__init__.py _check_capability: "{} with CUDA capability sm_{} is not compatible with the current PyTorch
# installation."; NCCL's enqueue.cc: "cudaArch 1200 dynamic smem ... exceeds device/fn maxSharedMem" (>= 2.26) or
# INFO "ncclMaxSharedMem %d exceeds device/fn maxSharedMem %zu" (2.25).
_SM = re.compile(r"\bsm_(?P<sm>\d{2,3})\b|\bcudaArch (?P<arch>\d{3,4})\b")


# GPU models by compute capability, as NVIDIA lists them (https://developer.nvidia.com/cuda-gpus): H100, H200, H800,
# H20, GH200 9.0; B100, B200, GB200 10.0 (B300, GB300 10.3); GeForce RTX 5050-5090 and RTX PRO 6000 Blackwell 12.0.
# Only the generations NCCL needed a new release for (GPU_GENERATIONS) are named; the names as nvidia-smi, torch
# (torch.cuda.get_device_name) and nccl-tests ("device 0 [0x21] NVIDIA GeForce RTX 5090") print them.
_GPU_MODELS = (
    (re.compile(r"\bG?H(?:100|200|800|20)\b"), 90),
    (re.compile(r"\bG?B(?:100|200|300)\b"), 100),
    (re.compile(r"\bRTX 50[5-9]0\b|RTX PRO \d{4} Blackwell"), 120),
)


def _generation(sm: int) -> GpuGeneration | None:
    known = [g for g in GPU_GENERATIONS if g.sm <= sm]
    return known[-1] if known else None


def generation_in(text: str) -> GpuGeneration | None:
    """The GPU generation a line names by ``sm_NN``, NCCL's ``cudaArch NNNN`` or the GPU's model name."""
    m = _SM.search(text)
    if m is not None:
        return _generation(int(m["sm"]) if m["sm"] else int(m["arch"]) // 10)
    for model, sm in _GPU_MODELS:
        if model.search(text):
            return _generation(sm)
    return None


def generation_of(compute_capability: str) -> GpuGeneration | None:
    """The generation of a GPU of compute capability ``"10.0"`` (NVML's major.minor); None: older or unreadable."""
    major, _, minor = compute_capability.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return None
    return _generation(int(major) * 10 + int(minor))


def nccl_too_old(nccl: str, compute_capability: str) -> GpuGeneration | None:
    """The generation whose first NCCL release is newer than ``nccl`` ("2.21.5", pip's "2.21.5 (nvidia-...)")."""
    generation = generation_of(compute_capability)
    loaded = release(nccl)
    if generation is None or loaded is None or loaded >= (release(generation.nccl) or ()):
        return None
    return generation
