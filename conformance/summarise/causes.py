"""Causes the verdict stage recognised, as answer lines: what failed, on which rank, and the fix.

Some failures are not the transport's, and no environment rung fixes them; the class's line then
says "no setting fixes it", and this line says what does:

* ``OUT OF MEMORY``: the root cause raised torch's ``OutOfMemoryError`` (the other ranks' watchdog
  timeouts were its victims): free the GPU or use less of it;
* ``FIRST BARRIER ON ANOTHER RANK'S GPU``: a rank's first barrier ran on the GPU torch guessed
  (global rank % visible GPUs, ``conformance/rank/barrier_device.py``), not its own: a code change,
  ``device_id=`` or ``device_ids=``;
* a cause the rank's own logs name (``verdict/stderr_causes.py``): a host limit (open files,
  /dev/shm, a port, locked memory) or NCCL's WARN behind its ``unhandled system error``, each with
  its fix.

One line per cause, rank and class, naming the probes it failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from conformance.common.verdicts import Verdict
from conformance.plan.transport import PCIE_PATHS
from conformance.record.machine import MachineFacts
from conformance.record.records import CaseRecord, RankRecord
from conformance.verdict import job_causes
from conformance.verdict.stderr_causes import GPU_OUT_OF_MEMORY, cause_parts

DETAIL_CHARS = 160  # a logged cause's line quotes the root cause's message up to this
OOM = job_causes.OOM.title
OOM_FIX = job_causes.OOM.fix
WRONG_BARRIER_GPU = "FIRST BARRIER ON ANOTHER RANK'S GPU"
BARRIER_FIX = job_causes.BARRIER_DEVICE.fix


@dataclass(frozen=True)
class KnownCause:
    """What a failing case's ranks died of, where, and what fixes it."""

    label: str
    ranks: str  # "rank 0 (gpu0)", "rank 0, 1, 2, 3"
    phase: str  # where they were ("" when it says nothing more than the probe)
    detail: str
    fix: str

    def text(self, probes: Iterable[str]) -> str:
        where = f"{self.phase} of {', '.join(probes)}" if self.phase else ", ".join(probes)
        fix = f" -> fix: {self.fix}" if self.fix else ""
        return f"  {self.label}: {self.ranks} in {where}: {self.detail}{fix}"


def _rank(record: CaseRecord, number: int | None) -> RankRecord | None:
    return next((r for r in record.ranks if r.rank == number), None)


def _who(record: CaseRecord, number: int | None) -> str:
    rank = _rank(record, number)
    return f"rank {number}" + (f" ({rank.device})" if rank is not None and rank.device else "")


def _wrong_barrier_gpu(record: CaseRecord) -> KnownCause | None:
    wrong = [
        r
        for r in record.ranks
        if isinstance(r.barrier, dict) and r.barrier.get("barrier_device") != r.barrier.get("rank_device")
    ]
    if not wrong:
        return None
    first = wrong[0].barrier or {}
    ranks = ", ".join(str(r.rank) for r in wrong)
    detail = (
        f"rank {wrong[0].rank} uses GPU {first.get('rank_device')} but ran its first barrier on GPU "
        f"{first.get('barrier_device')} ({first.get('chosen_by')})"
    )
    return KnownCause(WRONG_BARRIER_GPU, f"rank {ranks}", "", detail, BARRIER_FIX)


def _out_of_memory(record: CaseRecord) -> KnownCause | None:
    root = record.root_cause
    if root is None:
        return None
    logged = any(r.cause == GPU_OUT_OF_MEMORY.text for r in record.ranks if r.rank == root.rank)
    if not (logged or "OutOfMemoryError" in root.kind or "out of memory" in root.message.lower()):
        return None
    victims = ", ".join(str(v) for v in record.victims)
    said = " ".join(root.message.replace(GPU_OUT_OF_MEMORY.text, GPU_OUT_OF_MEMORY.name).split())  # the fix: once
    detail = said + (f"; rank {victims} only waited for it (victims)" if victims else "")
    return KnownCause(OOM, _who(record, root.rank), root.phase or "", detail, OOM_FIX)


def _logged(record: CaseRecord) -> KnownCause | None:
    """The cause the root rank's logs name, else the first failed rank's that names one."""
    root = record.root_cause
    named = [r for r in record.ranks if r.cause]
    rank = next((r for r in named if root is not None and r.rank == root.rank), named[0] if named else None)
    if rank is None or not rank.cause:
        return None
    name, fix = cause_parts(rank.cause)
    said = f"{root.kind}: {root.message}" if root is not None and root.kind else (root.message if root else "")
    detail = said if len(said) <= DETAIL_CHARS else said[: DETAIL_CHARS - 3] + "..."
    return KnownCause(name, _who(record, rank.rank), rank.phase, detail, fix)


def known_cause(record: CaseRecord) -> KnownCause | None:
    """The recognised cause of one failing case, if any (the barrier first: its hang names no rank)."""
    if record.outcome is None or not record.outcome.failed:
        return None
    return _wrong_barrier_gpu(record) or _out_of_memory(record) or _logged(record)


P2P_THROUGH_ROOT = "LIKELY CAUSE: P2P THROUGH THE ROOT COMPLEX"


def p2p_path_line(records: Iterable[CaseRecord], machine: MachineFacts) -> str | None:
    """Pairs over PCIe that hung or got wrong data on a machine whose IOMMU or ACS redirects P2P.

    NCCL's troubleshooting guide (ACS): the redirect makes P2P slow or hang; the NCCL variable the
    ladder found only avoids P2P, the machine's fix is the IOMMU's mode and ACS.
    """
    failed = [
        r for r in records
        if r.set_kind == "pair" and r.link in PCIE_PATHS and r.outcome in (Verdict.HANG, Verdict.FAIL)
    ]  # fmt: skip
    iommu = machine.iommu
    if not failed or not iommu.redirects_p2p:
        return None
    return f"  {P2P_THROUGH_ROOT}: {iommu.cause_text()} -> fix: {machine.p2p_fix} (the NCCL setting only avoids P2P)"


NAMED_RANKS = 3  # a cause many ranks share names this many of them, then how many more


def cause_lines(records: Iterable[CaseRecord]) -> list[str]:
    """One line per recognised cause among ``records`` (one class's failing cases), naming its ranks and probes.

    The same cause, phase and message on several ranks is one line: which rank of a pair fails first is a
    race, so a line per rank would only repeat the cause (and vary from run to run).
    """
    ranks: dict[KnownCause, list[str]] = {}
    probes: dict[KnownCause, list[str]] = {}
    for record in records:
        cause = known_cause(record)
        if cause is None:
            continue
        key = replace(cause, ranks="")
        if cause.ranks not in ranks.setdefault(key, []):
            ranks[key].append(cause.ranks)
        if record.probe not in probes.setdefault(key, []):
            probes[key].append(record.probe)
    return [replace(key, ranks=_ranks_text(ranks[key])).text(sorted(probes[key])) for key in ranks]


def _ranks_text(ranks: list[str]) -> str:
    named = sorted(ranks)
    more = len(named) - NAMED_RANKS
    return ", ".join(named[:NAMED_RANKS]) + (f" and {more} more" if more > 0 else "")
