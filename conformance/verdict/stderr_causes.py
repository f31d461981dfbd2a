"""Known causes that only a rank's last words name: what ran out on the host, and how to fix it.

A rank that dies of a host limit is reported by how it died (``killed by SIGABRT``, an exit code,
NCCL's ``unhandled system error``); what ran out (file descriptors, /dev/shm, a port) is written
only to its ``stderr.log``, and on NCCL to its ``nccl.log`` (``NCCL_DEBUG_FILE`` sends NCCL's WARN
lines there).  :func:`rank_cause` reads the tails of those two files and names the first cause of
:data:`KNOWN_CAUSES` found there; the verdict keeps its kind and its message gains the cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from conformance.common import casefiles
from conformance.verdict import nccl_log

# An abort writes the cause first, then faulthandler's stacks of every thread (a few KiB), and the
# stacks the watchdog asks for at the deadline come after anything a rank said before it hung.
TAIL_BYTES = 32 * 1024
TAIL_LINES = 400


@dataclass(frozen=True)
class Cause:
    """What a rank's logs say it died of (``name``) and what to do about it (``fix``)."""

    name: str
    fix: str

    @property
    def text(self) -> str:
        return f"{self.name} ({self.fix})"

    def explain(self, message: str) -> str:
        """``message`` followed by this cause; only the fix where the message already names it."""
        if not message:
            return self.text
        if self.name.lower() in message.lower():
            return f"{message} ({self.fix})"
        return f"{message}: {self.text}"


@dataclass(frozen=True)
class KnownCause:
    pattern: re.Pattern[str]  # searched within one line
    cause: Cause
    # NCCL's own error names no cause: the last NCCL WARN line before it does (``cause`` when there is none).
    named_by_nccl_warning: bool = False


FILE_TABLE_FULL = Cause("Too many open files in system", "the host's file table is full; raise `sysctl fs.file-max`")
DESCRIPTORS_EXHAUSTED = Cause("Too many open files", "file descriptors exhausted; raise `ulimit -n`")
SHM_FULL = Cause("/dev/shm is full", "free it or enlarge it: docker `--shm-size` or `--ipc=host`")
# NCCL's "Call to shm_open failed : Permission denied" (src/misc/shmutils.cc, include/shm.h in older releases):
# strerror(EACCES), not a full /dev/shm -- a different fix (NVIDIA/nccl#328: `chmod 1777 /dev/shm`).
SHM_DENIED = Cause(
    "/dev/shm is not writable (Permission denied)",
    "make /dev/shm writable by every user, as a tmpfs with mode 1777 (`mount -o remount,mode=1777 /dev/shm`), "
    "or give the container its own (docker `--ipc=host` or `--shm-size`)",
)
ADDRESS_IN_USE = Cause(
    "Address already in use",
    "a port the rank binds is taken, often by a process left from an earlier run or another job's MASTER_PORT "
    "(the rendezvous store's port on the first node)",
)
# ENOSPC (errno 28) where no /dev/shm is named: the disk a job writes to (checkpoints, the cache, /tmp) is full.
DISK_FULL = Cause(
    "No space left on device (a disk is full)",
    "free disk space where the job writes (checkpoints, /tmp, the dataset and model caches: `df -h`), or write "
    "checkpoints elsewhere",
)
LOCKED_MEMORY_TOO_LOW = Cause(
    "InfiniBand memory registration failed", "the locked-memory limit is too low; `ulimit -l unlimited`"
)
# NCCL's own words for a broken NVLS (src/transport/nvls.cc, v2.30.7-1): "Failed to bind NVLink SHARP (NVLS)
# Multicast memory ... usually caused by a system or configuration error in the Fabric Manager or NVSwitches.
# Disable NVLS (NCCL_NVLS_ENABLE=0) ..."
NVLS_BROKEN = Cause(
    "NVLink SHARP (NVLS) multicast failed",
    "Fabric Manager or the NVSwitches are misconfigured; `export NCCL_NVLS_ENABLE=0` avoids NVLS",
)
# Since NCCL 2.24 SHM puts its buffers in cuMem host memory (src/misc/cudawrap.cc ncclCuMemHostEnable,
# src/transport/shm.cc); on PCIe GPUs without P2P that fails with Cuda failure 217 "peer access is not
# supported between these two devices" (NVIDIA/nccl#1838), which NCCL_CUMEM_HOST_ENABLE=0 avoids.
CUMEM_HOST_FAILED = Cause(
    "cuMem host memory for SHM failed",
    "peer access is not supported between these GPUs; `export NCCL_CUMEM_HOST_ENABLE=0` keeps SHM in plain host memory",
)
NCCL_ERROR = Cause("NCCL error", "its cause is in NCCL's WARN lines; run with NCCL_DEBUG=WARN to see them")
# NCCL's CUDA allocations (include/alloc.h, v2.28.9-1: CUDACHECK) warn "Cuda failure 2 'out of memory'"
# (cudaErrorMemoryAllocation), then "Failed to CUDA calloc async 608 bytes", and torch says only "unhandled
# cuda error": the second real-GPU run, a leftover process holding all but 600 MiB (docs/gpu-runs/2026-11-28-h200).
GPU_OUT_OF_MEMORY = Cause(
    "the GPU ran out of memory",
    "free that GPU (a process left on it? `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`) or "
    "allocate less there",
)


def _any_of(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(alternatives), re.IGNORECASE)


# The first row found anywhere in the tail wins, so the more specific rows come first.
KNOWN_CAUSES: tuple[KnownCause, ...] = (
    KnownCause(_any_of(r"too many open files in system", r"\bENFILE\b"), FILE_TABLE_FULL),
    # torch.multiprocessing's file_descriptor sharing strategy out of descriptors: "received 0 items of ancdata"
    # (torch/multiprocessing/reductions.py; the torch.multiprocessing docs name ulimit -n as its fix).
    KnownCause(_any_of(r"too many open files", r"\bEMFILE\b", r"received 0 items of ancdata"), DESCRIPTORS_EXHAUSTED),
    KnownCause(_any_of(r"shm[^\n]*permission denied", r"permission denied[^\n]*/dev/shm"), SHM_DENIED),
    KnownCause(
        _any_of(
            r"no space left on device[^\n]*shm",
            r"shm[^\n]*no space left on device",
            r"error while creating shared memory segment",
            r"failed to extend /dev/shm",  # NCCL src/misc/shmutils.cc (2.12 and later): ftruncate of its segment
            r"unable to allocate shared memory",
            r"insufficient shared memory",
        ),
        SHM_FULL,
    ),
    KnownCause(_any_of(r"no space left on device", r"\bENOSPC\b", r"\[Errno 28\]"), DISK_FULL),  # after the shm rows
    KnownCause(_any_of(r"address already in use", r"\bEADDRINUSE\b"), ADDRESS_IN_USE),
    # Every WARN of NCCL's src/transport/nvls.cc is a failure to set NVLS up (v2.30.7-1: "Cuda failure" of the
    # multicast calls, which Fabric Manager serves; NVIDIA/nccl#1488: "transport/nvls.cc:244 NCCL WARN Cuda failure").
    KnownCause(
        _any_of(r"failed to bind nvlink sharp \(nvls\) multicast memory", r"transport/nvls\.cc:\d+ NCCL WARN"),
        NVLS_BROKEN,
    ),
    KnownCause(
        _any_of(r"shm\.cc[^\n]*cuda failure 217", r"shm\.cc[^\n]*peer access is not supported"), CUMEM_HOST_FAILED
    ),
    # Registering memory for RDMA under a low locked-memory limit: verbs' ibv_reg_mr, libfabric's fi_mr_reg (EFA),
    # and the limit named as such (RLIMIT_MEMLOCK, "memlock").
    KnownCause(
        _any_of(r"(?:ibv_reg_mr|fi_mr_reg)\w*[^\n]*cannot allocate memory", r"RLIMIT_MEMLOCK", r"\bmemlock\b"),
        LOCKED_MEMORY_TOO_LOW,
    ),
    KnownCause(_any_of(r"cuda failure 2 'out of memory'"), GPU_OUT_OF_MEMORY),  # before the error it becomes
    KnownCause(
        _any_of(
            r"unhandled system error",
            r"unhandled cuda error",
            r"invalid usage(?= \(run with NCCL_DEBUG)",
            r"internal error - please report",
            r"remote process exited or there was a network error",
        ),
        NCCL_ERROR,
        named_by_nccl_warning=True,
    ),
)

# torch's NCCL errors end with NCCL's last WARN text: "...unhandled system error ...\nLast error:\n<text>".
_TORCH_LAST_ERROR = re.compile(r"Last error:\s*(?P<text>[^\n]+)")


def _named_by_nccl_warning(before: str, after: str, error: str) -> Cause | None:
    """NCCL's last WARN before its ``error``, else torch's "Last error:" after it."""
    for line in reversed(before.splitlines()):
        warning = nccl_log.warning_text(line)
        if warning:
            return Cause(warning, f"NCCL's warning before its {error}")
    last_error = _TORCH_LAST_ERROR.search(after)
    if last_error:
        return Cause(last_error["text"].strip(), f"NCCL's last error, behind its {error}")
    return None


def recognise(tail: str) -> Cause | None:
    """The first known cause in the last lines of a rank's logs (oldest line first)."""
    text = "\n".join(line[: nccl_log.MAX_LINE] for line in tail.splitlines())
    for known in KNOWN_CAUSES:
        found = known.pattern.search(text)
        if found is None:
            continue
        if known.named_by_nccl_warning:
            error = found.group(0).lower()
            return _named_by_nccl_warning(text[: found.start()], text[found.end() :], error) or known.cause
        return known.cause
    return None


def rank_cause(rank_path: Path) -> Cause | None:
    """What the tails of a rank's ``nccl.log`` and ``stderr.log`` say it died of, if it is a known cause.

    NCCL's log comes first: NCCL warns before the error it returns reaches torch's traceback.
    Only its WARN lines are read; its INFO lines narrate retries that succeeded.
    """
    nccl = casefiles.tail(rank_path / casefiles.NCCL_LOG, TAIL_LINES, TAIL_BYTES)
    warnings = [line for line in nccl.splitlines() if nccl_log.is_warning(line)]
    stderr = casefiles.tail(rank_path / casefiles.STDERR, TAIL_LINES, TAIL_BYTES)
    return recognise("\n".join([*warnings, stderr]))


def cause_parts(text: str) -> tuple[str, str]:
    """A recorded cause's text (``Cause.text``) as (name, fix); a cause NCCL's warning names has no fix."""
    for known in KNOWN_CAUSES:
        if text == known.cause.text:
            return known.cause.name, known.cause.fix
    name, _, rest = text.rpartition(" (")
    if name and rest.endswith(")") and not rest.startswith("NCCL's "):
        return name, rest[:-1]
    return (name, "") if name else (text, "")
