"""What one process's lines say went wrong: its finding, the most telling thing it said.

In the verdict stage's order: a machine fault, a CUDA error by its number, name or text (what it
means for a distributed job: :mod:`conformance.verdict.cuda_errors`), software too old for the GPU,
out of memory, a cause its NCCL warnings or errors name (``stderr_causes``), a line naming a failure
class (``job_causes.LINE_SIGNS``), its own exception, an NCCL warning that something failed; or
that it only waited (a victim), or how it died (a signal, an exit status: ``death_reading``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conformance.common.casefiles import RankStatus
from conformance.diagnose import catalogue
from conformance.diagnose.death_reading import read_deaths
from conformance.diagnose.logs import LogLine
from conformance.diagnose.stories import JobFacts, ProcessStory
from conformance.verdict import cuda_errors, job_causes
from conformance.verdict.job_causes import FailureClass
from conformance.verdict.machine_faults import MACHINE_FAULTS
from conformance.verdict.nccl_log import is_warning, warning_text
from conformance.verdict.stderr_causes import NCCL_ERROR as GENERIC_NCCL_ERROR
from conformance.verdict.stderr_causes import recognise

WAITED = "timed out waiting for another rank"  # a victim's message: the verdict stage's VICTIM_PATTERN matches it
# NCCL warnings that are never benign (a failed CUDA call); others ("Failed to open libibverbs.so") often are.
FAILED_WARNING = re.compile(r"Cuda failure|CUDA error|unhandled (?:cuda|system) error", re.IGNORECASE)
# Lines that say the library or torch was built without the GPU's architecture: torch's _check_capability
# ("... with CUDA capability sm_120 is not compatible with the current PyTorch installation", torch/cuda/__init__.py)
# and NCCL's kernels not fitting ("ncclMaxSharedMem ... exceeds device/fn maxSharedMem", enqueue.cc 2.25;
# "cudaArch 1200 dynamic smem ... exceeds device/fn maxSharedMem", 2.26 and later).
TOO_OLD_FOR_GPU = re.compile(
    r"is not compatible with the current PyTorch installation|exceeds device/fn maxSharedMem", re.IGNORECASE
)
_CUDA_KIND_CLASS = {
    cuda_errors.MACHINE: job_causes.MACHINE_FAULT,
    cuda_errors.VERSION: job_causes.VERSION_MISMATCH,
    cuda_errors.OOM: job_causes.OOM,
    cuda_errors.TRANSPORT: job_causes.TRANSPORT,
    cuda_errors.RANK: job_causes.RANK_ERROR,
}


@dataclass(frozen=True)
class Finding:
    """The most telling thing one process said (or, job-wide, the logs together)."""

    failure: FailureClass | None  # None: it only waited (a victim)
    title: str  # what it names: the class, or the cause its lines name
    fix: str
    lines: tuple[LogLine, ...]
    status: RankStatus
    ranks: tuple[int | str, ...] = ()  # a job-wide finding's ranks at fault, where it names them
    specific: bool = True  # False: it names no cause of its own (an NCCL error without NCCL's warning)
    decisive: bool = False  # a job-wide finding that is the cause whatever the ranks said (versions, the launch)
    source: str = ""  # where the fix's rule comes from, when a catalogue entry gave it (NCCL's file and releases)


def _from_catalogue(text: str, lines: tuple[LogLine, ...], specific: bool) -> Finding | None:
    """NCCL's warning as its sources class it (``catalogue.py``): the class, an action for a fix, the entry's source."""
    entry = catalogue.nccl_warning(text)
    if entry is None:
        return None
    failure = job_causes.BY_KEY.get(entry.failure_class, job_causes.NCCL_ERROR)
    where = entry.provenance
    source = f"NCCL {where.file}:{where.line} ({where.first_version} to {where.last_version}): {entry.format!r}"
    title = " ".join(text.split())[:160]
    return Finding(failure, title, entry.fix, lines, RankStatus.ERROR, specific=specific, source=source)


def _said(story: ProcessStory) -> list[LogLine]:
    """Everything a process said that may name a cause: exceptions, lines of a class, warnings, failure lines."""
    signed = [line for kept in story.signs.values() for _, line in kept]
    return [*story.exceptions, *signed, *story.warnings, *story.errors]


def _machine_fault(story: ProcessStory) -> Finding | None:
    said = _said(story)
    for fault in MACHINE_FAULTS:
        lines = tuple(dict.fromkeys(line for line in said if fault.pattern.search(line.text)))
        if lines:
            failure = job_causes.VERSION_MISMATCH if "TOO OLD" in fault.name else job_causes.MACHINE_FAULT
            return Finding(failure, fault.name, fault.fix, lines, RankStatus.ERROR)
    return None


def too_old_for_gpu(lines: list[LogLine], gpu: LogLine | None = None) -> Finding | None:
    """NCCL or torch built without the GPU's architecture: the first release that has it, from NCCL's history.

    ``gpu``: a line of the job's naming its GPU (a model, ``sm_90``), where the rank's own lines name none.
    """
    named = [*lines, *([gpu] if gpu else [])]
    for line in lines:
        error = cuda_errors.cuda_error_in(line.text)
        no_kernel = error is not None and error.code in (98, 209)
        if not (no_kernel or TOO_OLD_FOR_GPU.search(line.text)):
            continue
        generation = next((g for other in named if (g := cuda_errors.generation_in(other.text))), None)
        failure = job_causes.VERSION_MISMATCH
        if generation is None:
            title = "NCCL OR TORCH TOO OLD FOR THIS GPU (built without its architecture)"
            fix = (
                "upgrade NCCL and torch to releases built for this GPU's architecture (`nvidia-smi -q | grep -i arch`)"
            )
        else:
            title = f"NCCL OR TORCH TOO OLD FOR {generation.name.upper()} (sm_{generation.sm})"
            fix = (
                f"upgrade to NCCL >= {generation.nccl} ({generation.source}) and a torch built for sm_{generation.sm} "
                "(`python -c 'import torch; print(torch.cuda.get_arch_list(), torch.cuda.nccl.version())'`)"
            )
        return Finding(failure, title, fix, (line,), RankStatus.ERROR)
    return None


def _cuda_error(story: ProcessStory) -> Finding | None:
    """A CUDA error a process's lines name by number, name or text: what it means for the job, and its fix."""
    for line in _said(story):
        error = cuda_errors.cuda_error_in(line.text)
        if error is None:
            continue
        failure = _CUDA_KIND_CLASS[error.kind]
        title = f"CUDA ERROR {error.code} ({error.name}: {error.text})"
        source = f"CUDA {error.api} {error.name} = {error.code}, {error.source}"
        return Finding(failure, title, f"{error.meaning}; {error.fix}", (line,), RankStatus.ERROR, source=source)
    return None


def _named_cause(story: ProcessStory) -> Finding | None:
    """A cause the verdict stage's stderr table finds in the process's warnings and errors (not a lost peer's)."""
    tail = [line for line in story.warnings if not job_causes.PEER_GONE.search(line.text)]
    errors = [line for line in (*story.exceptions, *story.errors) if not job_causes.PEER_GONE.search(line.text)]
    if not errors and not any(is_warning(line.text) for line in tail):
        return None
    lines = sorted({*tail, *errors}, key=lambda line: (line.path, line.number))
    cause = recognise("\n".join(line.text for line in lines))
    if cause is None:
        return None
    quoted = tuple(line for line in lines if cause.name[:40] in line.text) or tuple(lines[-2:])
    for sign in job_causes.LINE_SIGNS:  # NCCL's warning may itself name a transport or an interface
        if sign.root and sign.pattern.search(cause.name):
            return Finding(sign.failure, cause.name, sign.failure.fix, quoted, RankStatus.ERROR)
    failure = job_causes.NCCL_ERROR
    if cause.fix.startswith("NCCL's "):  # named by NCCL's own warning (stderr_causes): what its sources say of it
        catalogued = _from_catalogue(cause.name, quoted, specific=True)
        if catalogued is not None:
            return catalogued
    if cause is GENERIC_NCCL_ERROR:
        return Finding(failure, cause.name, cause.fix, quoted, RankStatus.ERROR, specific=False)
    if cause in job_causes.HOST_LIMIT_CAUSES:
        failure = job_causes.HOST_LIMIT
    elif cause in job_causes.RENDEZVOUS_CAUSES:
        failure = job_causes.RENDEZVOUS
    return Finding(failure, cause.name, cause.fix, quoted, RankStatus.ERROR)


def _failed_warning(story: ProcessStory) -> Finding | None:
    """An NCCL warning that something failed, when nothing else names a cause (NCCL's error may be cut off)."""
    failed = [line for line in story.warnings if is_warning(line.text) and FAILED_WARNING.search(line.text)]
    if not failed:
        return None
    text = warning_text(failed[0].text) or ""
    catalogued = _from_catalogue(text, tuple(failed[:2]), specific=False)
    if catalogued is not None:
        return catalogued
    failure = job_causes.NCCL_ERROR
    return Finding(
        failure, f"NCCL warned: {text[:120]}", failure.fix, tuple(failed[:2]), RankStatus.ERROR, specific=False
    )


def _sign(story: ProcessStory) -> Finding | None:
    for key, kept in story.signs.items():
        sign = job_causes.LINE_SIGNS[kept[0][0]]
        if sign.root:
            failure = sign.failure
            return Finding(failure, failure.title, failure.fix, story.sign_lines(key), RankStatus.ERROR)
    return None


def _oom(story: ProcessStory) -> Finding | None:
    if job_causes.OOM.key not in story.signs:
        return None
    oom = job_causes.OOM
    return Finding(oom, oom.title, oom.fix, story.sign_lines(oom.key), RankStatus.ERROR)


def _exception(story: ProcessStory) -> Finding | None:
    if not story.exceptions:
        return None
    failure = job_causes.RANK_ERROR
    return Finding(failure, failure.title, failure.fix, tuple(story.exceptions), RankStatus.ERROR)


def _death(story: ProcessStory, facts: JobFacts) -> Finding | None:
    """How it died (a signal, an exit status), reasoned (``death_reading``); stopped from outside: it only waited."""
    reading = read_deaths(story, facts)
    if reading is None:
        return None
    if reading.stopped:
        return Finding(None, WAITED, "", reading.lines, RankStatus.ERROR)
    status = RankStatus.CRASH if reading.failure is job_causes.KILLED else RankStatus.ERROR
    return Finding(reading.failure, reading.title, reading.fix, reading.lines, status, specific=reading.specific)


def finding(story: ProcessStory, gpu: LogLine | None = None, facts: JobFacts | None = None) -> Finding | None:
    """The most telling thing one process said; None when it said nothing wrong.

    ``gpu``: the job's line naming its GPU; ``facts``: what the job's lines say of deaths (memory kills, stops).
    """
    said = _said(story)
    found = (
        too_old_for_gpu(said, gpu)  # before the machine faults, whose row for it cannot name the generation
        or _machine_fault(story)
        or _oom(story)
        or _named_cause(story)
        or _sign(story)
        or _cuda_error(story)
        or _exception(story)
        or _failed_warning(story)
    )
    if found is not None:
        return found
    if story.victim_lines:
        return Finding(None, WAITED, "", tuple(story.victim_lines), RankStatus.ERROR)
    return _death(story, facts or JobFacts())
