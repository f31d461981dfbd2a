"""CUDA's errors by number, name and text, and which GPUs each NCCL release first supports.

The errors are a catalogue generated from NVIDIA's own sources (``catalogues/cuda_errors.json``, written by
``tools/cuda_catalogue_extract.py`` and ``tools/cuda_catalogue_build.py``): every ``cudaError_t`` of the runtime
(``enum cudaError``, ``driver_types.h``) and every ``CUresult`` of the driver (``enum cudaError_enum``, ``cuda.h``)
of CUDA 11.8 to 13.5, each with the first sentence of its header's doc comment and, for the runtime's, the text
``cudaGetErrorString`` of that release's ``libcudart.so`` returns.  That text is what torch prints (``CUDA error:
<text>``, c10/cuda/CUDAException.h), what NCCL prints (``Cuda failure <n> '<text>'``, or ``Cuda failure '<text>'``
before 2.19, src/include/checks.h) and what nccl-tests prints (``Test CUDA failure common.cu:<line> '<text>'``,
nccl-tests src/common.h ``CUDACHECK``).  A log may show any one of number, name or text, so an entry is found by
each (:func:`cuda_error_in`).

What each error means for a distributed job, and so its class, is the entry's ``kind``, given by the build's one
table of rules: one that only a machine fix cures (``machine``), one that says the software is too old for the GPU
or the driver (``version``), a GPU out of memory (``oom``), a transport NCCL cannot use (``transport``) or a fault
in the rank's own kernels or calls (``rank``); with its ``fix``, an action.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import json_value
from conformance.common.inputs import read_bounded
from conformance.common.versions import release

MACHINE, VERSION, OOM, TRANSPORT, RANK = "machine", "version", "oom", "transport", "rank"
RUNTIME, DRIVER = "runtime", "driver"
CATALOGUE = Path(__file__).resolve().parent / "catalogues" / "cuda_errors.json"
MAX_CATALOGUE = 2 << 20  # bytes: the shipped file is well under it


@dataclass(frozen=True)
class CudaError:
    """One code of the runtime's ``cudaError_t`` or the driver's ``CUresult``, and what it means for a job."""

    code: int
    name: str  # cudaErrorSystemNotReady, CUDA_ERROR_SYSTEM_NOT_READY
    text: str  # cudaGetErrorString's (runtime); the header's first sentence for a driver code
    kind: str
    meaning: str  # for a distributed job, in words
    fix: str = ""  # an action: what to run, set or check
    api: str = RUNTIME
    description: str = ""  # the header doc comment's first sentence
    source: str = ""  # the header, line and CUDA releases it is in
    texts: tuple[tuple[str, bool], ...] = ()  # every text it printed, and whether found anywhere in a line


def _error(raw: dict[str, Any]) -> CudaError:
    p = raw["provenance"]
    source = f"{p['file']}:{p['line']}, CUDA {p['first_version']} to {p['last_version']}"
    texts = tuple((str(t["text"]), bool(t["alone"])) for t in raw["texts"])
    text = str(raw["string"] or raw["description"])
    return CudaError(
        raw["code"], raw["name"], text, raw["kind"], raw["meaning"], raw["fix"], raw["api"], raw["description"],
        source, texts,
    )  # fmt: skip


@cache
def catalogue_errors() -> tuple[CudaError, ...]:
    """Every code of the catalogue: the runtime's, then the driver's, each by number."""
    value = json_value(read_bounded(CATALOGUE, MAX_CATALOGUE))
    if not isinstance(value, dict) or not isinstance(value.get("entries"), list):
        raise ValueError(f"{CATALOGUE.name}: not a catalogue (no entries)")
    return tuple(_error(raw) for raw in value["entries"])


@cache
def _by_code() -> dict[tuple[str, int], CudaError]:
    return {(e.api, e.code): e for e in catalogue_errors()}


@cache
def _by_name() -> dict[str, CudaError]:
    return {e.name: e for e in catalogue_errors()}


def cuda_error(code: int, api: str = RUNTIME) -> CudaError | None:
    """The code of that number in ``api`` (``runtime`` or ``driver``), else in the other; None when neither has it."""
    other = DRIVER if api == RUNTIME else RUNTIME
    return _by_code().get((api, code)) or _by_code().get((other, code))


# "CUDA error 802", "Cuda failure 802 'system ...'", NCCL's "CUDA driver error 802" (cudawrap.cc); a bare number
# after any other word is too often an exit code to be read as CUDA's.
_CODE = re.compile(r"\bcuda (?:error|failure|(?P<driver>driver error))\s?:?\s?(?P<code>\d{1,5})\b", re.IGNORECASE)
_NAME = re.compile(r"\b(?:cudaError[A-Z]\w*|CUDA_ERROR_[A-Z0-9_]+)\b")
# Where CUDA's printers put a text: torch "CUDA error: %s", NCCL "Cuda failure [%d ]'%s'" (checks.h, cudawrap.h) and
# "CUDA error %d '%s'" (transport/nvls.cc), nccl-tests "Test CUDA failure %s:%d '%s'".  A short text, or one glibc's
# strerror prints too ("invalid argument", "operation not permitted"), is read only there.
_PRINTED = re.compile(r"cuda error:\s*|cuda error \d+ '|cuda failure(?: \d+)? '|cuda failure \S+ '")


@dataclass(frozen=True)
class _Texts:
    """The runtime's texts, lowercased and longest first.

    The longest of two texts at one place wins; of two codes with one text (200 and 300's "device kernel image is
    invalid"), the lower number.
    """

    every: tuple[tuple[str, CudaError], ...]
    alone: tuple[tuple[str, CudaError], ...]  # those found anywhere in a line


@cache
def _texts() -> _Texts:
    every = [(text.lower(), e) for e in catalogue_errors() if e.api == RUNTIME for text, _ in e.texts]
    every.sort(key=lambda item: -len(item[0]))
    alone = [(lowered, e) for lowered, e in every if any(t.lower() == lowered and a for t, a in e.texts)]
    return _Texts(tuple(every), tuple(alone))


def _named(text: str) -> tuple[int, CudaError] | None:
    if "cudaError" not in text and "CUDA_ERROR_" not in text:
        return None
    known = _by_name()
    return next(((m.start(), known[m.group()]) for m in _NAME.finditer(text) if m.group() in known), None)


def _in_text(lowered: str) -> tuple[int, CudaError] | None:
    """The leftmost text found anywhere (``str.find``, far faster here than one regex of 140 alternatives)."""
    best: tuple[int, CudaError] | None = None
    for text, error in _texts().alone:
        at = lowered.find(text)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, error)
    return best


def _where_printed(lowered: str) -> tuple[int, CudaError] | None:
    """A text, short ones included, where torch, NCCL or nccl-tests prints it."""
    if "cuda" not in lowered:
        return None
    for m in _PRINTED.finditer(lowered):
        found = next((e for text, e in _texts().every if lowered.startswith(text, m.end())), None)
        if found is not None:
            return m.end(), found
    return None


def _first_named(text: str) -> CudaError | None:
    """The error a line names first (leftmost) by its name or its text; None when it names none."""
    lowered = text.lower()
    found = [hit for hit in (_named(text), _in_text(lowered), _where_printed(lowered)) if hit is not None]
    return min(found, key=lambda item: item[0])[1] if found else None


def cuda_error_in(text: str) -> CudaError | None:
    """The CUDA error a line names by its name, its text or its number; None when it names none."""
    named = _first_named(text)
    if named is not None:
        return named
    m = _CODE.search(text)
    return cuda_error(int(m["code"]), DRIVER if m["driver"] else RUNTIME) if m is not None else None


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
