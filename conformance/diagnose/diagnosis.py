"""From what each process said to one answer: the failure class, the root-cause rank, its victims, the fix.

Each process gets a finding (:func:`finding`): the most telling thing its lines say, in the verdict
stage's order (a machine fault, out of memory, a cause its NCCL warnings name, a transport or GPU
line, its own exception, a signal), or that it only waited (a victim), or nothing.  The findings go
to the verdict stage's :func:`conformance.verdict.decision.decide`, the one owner of "the earliest
real failure is the root cause; ranks that only timed out are its victims", exactly as the suite's
own cases are judged.  When no rank stands out, what the job as a whole shows decides
(:func:`_job_cause`): mixed NCCL versions, a rendezvous that timed out, an interface the nodes
cannot share, collectives out of step, a stuck watchdog, an unpinned barrier, a transport hang.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from conformance.common.casefiles import RankStatus
from conformance.common.verdicts import Verdict
from conformance.diagnose.evidence import NCCL_WARN, JobEvidence, ProcessStory, node_of
from conformance.diagnose.logs import LogLine
from conformance.verdict import job_causes
from conformance.verdict.decision import Decision, RankReport, decide
from conformance.verdict.job_causes import FailureClass
from conformance.verdict.machine_faults import MACHINE_FAULTS
from conformance.verdict.nccl_facts import NcclLog
from conformance.verdict.nccl_transport import NET_IB, NET_SOCKET, P2P_CUMEM, P2P_DIRECT, P2P_IPC, SHM
from conformance.verdict.stderr_causes import recognise

EVIDENCE_LINES = 6  # quoted in the answer
QUOTE_CHARS = 300  # of each evidence line
WAITED = "timed out waiting for another rank"  # a victim's message: the verdict stage's VICTIM_PATTERN matches it
# NCCL warnings that are never benign (a failed CUDA call); others ("Failed to open libibverbs.so") often are.
FAILED_WARNING = re.compile(r"Cuda failure|CUDA error|unhandled (?:cuda|system) error", re.IGNORECASE)
GPU_TRANSPORTS = (P2P_CUMEM, P2P_IPC, P2P_DIRECT, SHM, NET_IB, NET_SOCKET)


@dataclass(frozen=True)
class Finding:
    """The most telling thing one process said."""

    failure: FailureClass | None  # None: it only waited (a victim)
    title: str  # what it names: the class, or the cause its lines name
    fix: str
    lines: tuple[LogLine, ...]
    status: RankStatus
    ranks: tuple[int | str, ...] = ()  # a job-wide finding's ranks at fault, where it names them


@dataclass
class Diagnosis:
    """The answer: empty ``failure`` means no failure was found in the logs."""

    failure: FailureClass | None
    title: str = ""
    fix: str = ""
    root: str = ""  # "rank 3 (node gpu-7)", "" when no rank stands out
    root_ranks: list[int] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)
    evidence: list[LogLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: int = 0
    lines: int = 0

    @property
    def check(self) -> str:
        return self.failure.check if self.failure else ""

    def text_lines(self) -> list[str]:
        """The answer first, then the evidence (file:line, quoted), the victims, the fix and the suite's check."""
        read = f"{self.files} file{'s' * (self.files != 1)}, {self.lines} lines read"
        if self.failure is None:
            return [f"no failure found ({read})"]
        head = f"{self.title}" + (f" on {self.root}" if self.root else " (no single rank stands out)")
        lines = [head, f"  class: {self.failure.key}", "  evidence:"]
        lines += [f"    {line.where}: {line.text.strip()[:QUOTE_CHARS]}" for line in self.evidence]
        if self.victims:
            lines.append(f"  victims (only waited): ranks {_compact(self.victims)}")
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(f"  fix: {self.fix}")
        if self.check:
            lines.append(f"  test the machine: {self.check}")
        lines.append(f"  ({read})")
        return lines

    def to_json(self) -> dict[str, object]:
        return {
            "failure_found": self.failure is not None,
            "class": self.failure.key if self.failure else None,
            "title": self.title,
            "root": self.root,
            "root_ranks": self.root_ranks,
            "victims": self.victims,
            "evidence": [{"file": line.path, "line": line.number, "text": line.text} for line in self.evidence],
            "fix": self.fix,
            "check": self.check,
            "notes": self.notes,
            "files": self.files,
            "lines": self.lines,
        }


def _compact(ranks: list[str]) -> str:
    """``0-3,5`` for the numbers among ``ranks``, the rest as they are."""
    numbers = sorted(int(r) for r in ranks if r.isdigit())
    spans: list[str] = []
    for number in numbers:
        if spans and spans[-1].split("-")[-1] == str(number - 1):
            spans[-1] = f"{spans[-1].split('-')[0]}-{number}"
        else:
            spans.append(str(number))
    return ",".join(spans + [r for r in ranks if not r.isdigit()])


def _first_lines(story: ProcessStory, key: str) -> tuple[LogLine, ...]:
    return tuple(line for _, line in story.signs.get(key, []))


def _machine_fault(story: ProcessStory) -> Finding | None:
    said = [*story.exceptions, *(line for kept in story.signs.values() for _, line in kept), *story.warnings]
    for fault in MACHINE_FAULTS:
        lines = tuple(line for line in said if fault.pattern.search(line.text))
        if lines:
            failure = job_causes.VERSION_MISMATCH if "DRIVER TOO OLD" in fault.name else job_causes.MACHINE_FAULT
            return Finding(failure, fault.name, fault.fix, lines, RankStatus.ERROR)
    return None


def _named_cause(story: ProcessStory) -> Finding | None:
    """A cause the verdict stage's stderr table finds in the process's warnings and errors (not a lost peer's)."""
    tail = [line for line in story.warnings if not job_causes.PEER_GONE.search(line.text)]
    errors = [line for line in story.exceptions if not job_causes.PEER_GONE.search(line.text)]
    if not errors and not any(NCCL_WARN in line.text for line in tail):
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
    if cause in job_causes.HOST_LIMIT_CAUSES:
        failure = job_causes.HOST_LIMIT
    elif cause in job_causes.RENDEZVOUS_CAUSES:
        failure = job_causes.RENDEZVOUS
    return Finding(failure, cause.name, cause.fix, quoted, RankStatus.ERROR)


def _failed_warning(story: ProcessStory) -> Finding | None:
    """An NCCL warning that something failed, when nothing else names a cause (NCCL's error may be cut off)."""
    failed = [line for line in story.warnings if NCCL_WARN in line.text and FAILED_WARNING.search(line.text)]
    if not failed:
        return None
    text = failed[0].text.split(NCCL_WARN, 1)[1].strip()
    failure = job_causes.NCCL_ERROR
    return Finding(failure, f"NCCL warned: {text[:120]}", failure.fix, tuple(failed[:2]), RankStatus.ERROR)


def finding(story: ProcessStory) -> Finding | None:
    """The most telling thing one process said; None when it said nothing wrong."""
    found = _machine_fault(story)
    if found is None and job_causes.OOM.key in story.signs:
        oom = job_causes.OOM
        found = Finding(oom, oom.title, oom.fix, _first_lines(story, oom.key), RankStatus.ERROR)
    found = found or _named_cause(story)
    if found is None:
        for key, kept in story.signs.items():
            sign = kept[0][0]
            if sign.root and sign.failure is not job_causes.KILLED:
                failure = sign.failure
                found = Finding(failure, failure.title, failure.fix, _first_lines(story, key), RankStatus.ERROR)
                break
    if found is None and story.exceptions:
        failure = job_causes.RANK_ERROR
        found = Finding(failure, failure.title, failure.fix, tuple(story.exceptions), RankStatus.ERROR)
    found = found or _failed_warning(story)
    if found is None and story.victim_lines:
        return Finding(None, WAITED, "", tuple(story.victim_lines), RankStatus.ERROR)
    if found is None and (job_causes.KILLED.key in story.signs or any(code < 0 for code, _ in story.exits)):
        killed = _first_lines(story, job_causes.KILLED.key) or tuple(line for _, line in story.exits)
        failure = job_causes.KILLED
        return Finding(failure, failure.title, failure.fix, killed, RankStatus.CRASH)
    return found


# --------------------------------------------------------------------------------------------
# Processes to ranks
# --------------------------------------------------------------------------------------------


def _merge(into: ProcessStory, other: ProcessStory) -> None:
    into.who = into.who.merged(other.who)
    for key, kept in other.signs.items():
        into.signs.setdefault(key, []).extend(kept)
    into.exceptions.extend(other.exceptions)
    into.victim_lines.extend(other.victim_lines)
    into.exits.extend(other.exits)
    into.warnings.extend(other.warnings)
    into.last_sequence = into.last_sequence or other.last_sequence
    times = [t for t in (into.first_time, other.first_time) if t is not None]
    into.first_time = min(times) if times else None


def _rank_of(story: ProcessStory, pid_ranks: dict[tuple[str, int], int], nproc: int, nodes: list[str]) -> int | None:
    who = story.who
    if who.rank is not None:
        return who.rank
    if who.host is not None and who.pid is not None and (who.host, who.pid) in pid_ranks:
        return pid_ranks[(who.host, who.pid)]
    if who.local_rank is not None:
        node = node_of(who)
        return nodes.index(node) * nproc + who.local_rank if node in nodes else who.local_rank
    return who.task


def _pid_ranks(nccl: NcclLog) -> dict[tuple[str, int], int]:
    """Each NCCL process's rank in its largest communicator (the world), from its init lines."""
    best: dict[tuple[str, int], tuple[int, int]] = {}
    for init in nccl.inits.values():
        if init.host is None or init.pid is None or init.rank is None:
            continue
        size = init.nranks or 0
        if size >= best.get((init.host, init.pid), (-1, 0))[0]:
            best[(init.host, init.pid)] = (size, init.rank)
    return {process: rank for process, (_, rank) in best.items()}


def ranked_stories(evidence: JobEvidence, nccl: NcclLog) -> dict[int | str, ProcessStory]:
    """The processes by rank (a process whose rank the logs never say: by its file), stories of one rank merged."""
    pid_ranks = _pid_ranks(nccl)
    nproc = max((local for _, local in evidence.local_ranks), default=0) + 1
    nodes = sorted({node for node, _ in evidence.local_ranks}, key=_node_order)
    nodes = nodes if len(nodes) > 1 else []
    ranked: dict[int | str, ProcessStory] = {}
    for story in evidence.stories.values():
        rank = _rank_of(story, pid_ranks, nproc, nodes)
        key: int | str = rank if rank is not None else story.key[1]
        if key in ranked:
            _merge(ranked[key], story)
        else:
            ranked[key] = story
    return ranked


def _node_order(node: str) -> tuple[int, str]:
    return (int(node), "") if node.isdigit() else (1 << 30, node)


def label(key: int | str, story: ProcessStory) -> str:
    host = f" (node {story.who.host})" if story.who.host else ""
    return f"rank {key}{host}" if isinstance(key, int) else f"the process writing {key}{host}"


# --------------------------------------------------------------------------------------------
# The answer
# --------------------------------------------------------------------------------------------


def _report(number: int, story: ProcessStory, found: Finding) -> RankReport:
    """A rank as the verdict stage judges it: a victim is a rank stopped while it waited."""
    status = RankStatus.STOPPED if story.stopped else found.status
    return RankReport(
        rank=number, device="", pid=0, phase="", step="", phase_time=None, progress=0, exit=None, seconds=0.0,
        status=status, message=found.title, time=story.first_time, stopped_by="stalled" if story.stopped else None,
    )  # fmt: skip


def _key(decision: Decision, by_number: dict[int, int | str]) -> int | str | None:
    """The root's rank; a hang's root only when the suite's watchdog stopped it.

    In a log, the first rank to time out is no more a cause than the others.
    """
    root = decision.root
    if root is None or (decision.verdict == Verdict.HANG and root.status != RankStatus.STOPPED):
        return None
    return by_number[root.rank]


def _ranks_text(keys: list[int | str]) -> list[str]:
    return [str(key) for key in sorted(keys, key=lambda k: (isinstance(k, str), str(k).zfill(8)))]


def diagnose(evidence: JobEvidence) -> Diagnosis:
    """The failure class, root cause and victims of the job whose every line ``evidence`` has read."""
    nccl = evidence.nccl.build([], [])
    stories = ranked_stories(evidence, nccl)
    findings = {key: found for key, story in stories.items() if (found := finding(story)) is not None}
    numbers = {key: index for index, key in enumerate(stories)}
    reports = [_report(numbers[key], stories[key], found) for key, found in findings.items()]
    decision = decide(reports)
    by_number = {numbers[key]: key for key in findings}
    root_key = _key(decision, by_number)
    victims = [key for key, found in findings.items() if found.failure is None and key != root_key]
    answer = Diagnosis(None, files=len(evidence.files), lines=evidence.lines)
    answer.victims = _ranks_text(victims)
    job = _job_cause(nccl, stories, victims)
    if job is not None and job.failure is job_causes.VERSION_MISMATCH:
        return _fill(answer, job, [])
    if root_key is not None and findings[root_key].failure is not None:
        key, found = root_key, findings[root_key]
        # torch's desync report names two ranks running different collectives: which branched is the code's question
        named = found.failure is not job_causes.DESYNC
        answer.root = label(key, stories[key]) if named else ""
        answer.root_ranks = [key] if isinstance(key, int) and named else []
        _fill(answer, found, [stories[k] for k in victims[:1]])
        others = [by_number[r.rank] for r in decision.victims if findings[by_number[r.rank]].failure is not None]
        if others:
            answer.notes.append(f"also failed, after it: {', '.join(label(k, stories[k]) for k in others[:8])}")
        return answer
    hang_only = job is None or (job.failure in (job_causes.HANG, job_causes.TRANSPORT) and not job.lines)
    if root_key is not None and hang_only:  # a hang: the verdict stage names the one rank the suite stopped
        key = root_key
        answer.root, answer.root_ranks = label(key, stories[key]), [key] if isinstance(key, int) else []
        answer.notes.append(f"{answer.root} made no progress and was stopped; the others waited for it")
        found = job or Finding(job_causes.HANG, job_causes.HANG.title, job_causes.HANG.fix, (), RankStatus.STOPPED)
        found = Finding(found.failure, found.title, found.fix, findings[key].lines, RankStatus.STOPPED)
        return _fill(answer, found, [stories[k] for k in victims[:1]])
    if job is not None:
        answer.root = ", ".join(label(key, stories[key]) for key in job.ranks)
        answer.root_ranks = [key for key in job.ranks if isinstance(key, int)]
        return _fill(answer, job, [stories[k] for k in victims[:1]])
    return answer


def _fill(answer: Diagnosis, found: Finding, victims: list[ProcessStory]) -> Diagnosis:
    answer.failure, answer.title, answer.fix = found.failure, found.title, found.fix
    answer.evidence = [*found.lines[:EVIDENCE_LINES], *(line for s in victims for line in s.victim_lines[:1])]
    return answer


def _all_signs(stories: dict[int | str, ProcessStory], failure: FailureClass) -> list[tuple[int | str, LogLine]]:
    return [(key, line) for key, s in stories.items() for _, line in s.signs.get(failure.key, [])]


def _job_finding(
    failure: FailureClass, lines: list[LogLine], title: str = "", ranks: tuple[int | str, ...] = ()
) -> Finding:
    return Finding(failure, title or failure.title, failure.fix, tuple(lines[:EVIDENCE_LINES]), RankStatus.ERROR, ranks)


def _job_cause(nccl: NcclLog, stories: dict[int | str, ProcessStory], victims: list[int | str]) -> Finding | None:
    """What the job as a whole shows, for when no single rank stands out (or versions disagree)."""
    mismatch = _all_signs(stories, job_causes.VERSION_MISMATCH)
    if mismatch or len(nccl.versions) > 1:
        title = f"NCCL VERSIONS DIFFER: {', '.join(nccl.versions)}" if len(nccl.versions) > 1 else ""
        return _job_finding(job_causes.VERSION_MISMATCH, [line for _, line in mismatch], title)
    for failure in (job_causes.RENDEZVOUS, job_causes.NETWORK_INTERFACE):
        signs = _all_signs(stories, failure)
        if signs:
            return _job_finding(failure, [line for _, line in signs])
    unreachable = [i for i in nccl.bootstrap_interfaces if job_causes.UNREACHABLE_INTERFACES.match(i)]
    hosts = {s.who.host for s in stories.values() if s.who.host}
    if unreachable and len(hosts) > 1 and victims:
        title = f"{job_causes.NETWORK_INTERFACE.title}: NCCL bootstraps over {', '.join(unreachable)}"
        return _job_finding(job_causes.NETWORK_INTERFACE, [], title)
    out_of_step = _desync(stories)
    if out_of_step is not None:
        return out_of_step
    for failure in (job_causes.WATCHDOG_STUCK, job_causes.BARRIER_DEVICE):
        signs = _all_signs(stories, failure)
        if signs and victims:
            return _job_finding(failure, [line for _, line in signs])
    if not victims:
        return None
    transports = Counter(c.transport for c in nccl.connections if c.transport in GPU_TRANSPORTS)
    if transports or nccl.incomplete_inits:
        used = ", ".join(sorted(transports)) or "none connected"
        title = f"HANG IN NCCL's TRANSPORT ({used}; {len(nccl.incomplete_inits)} communicator inits never completed)"
        return _job_finding(job_causes.TRANSPORT, [], title)
    return _job_finding(job_causes.HANG, [])


def _desync(stories: dict[int | str, ProcessStory]) -> Finding | None:
    """Ranks whose watchdog timed out on different collectives: the odd ones out took another code path."""
    last = {key: s.last_sequence for key, s in stories.items() if s.last_sequence is not None}
    counts = Counter((seq, op) for seq, op, _ in last.values())
    if len(counts) < 2:
        return None
    common = counts.most_common(1)[0][0]
    odd = [key for key, (seq, op, _) in last.items() if (seq, op) != common]
    title = (
        f"{job_causes.DESYNC.title}: ranks {', '.join(_ranks_text(odd))} timed out on another collective than "
        f"the rest (SeqNum {common[0]} {common[1]})"
    )
    lines = [last[key][2] for key in odd] + [next(line for k, (s, o, line) in last.items() if (s, o) == common)]
    return _job_finding(job_causes.DESYNC, lines, title, tuple(odd))
