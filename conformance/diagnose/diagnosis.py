"""From what a job's logs said to one answer: its verdict, the failure class, the root-cause rank, the fix.

Each process gets a finding (:func:`conformance.diagnose.findings.finding`).  The findings go to the
verdict stage's :func:`conformance.verdict.decision.decide`, the one owner of "the earliest real
failure is the root cause; ranks that only timed out are its victims", exactly as the suite's own
cases are judged.  When no rank stands out, what the job as a whole shows decides
(:func:`conformance.diagnose.job_wide.job_cause`).

A log that names no known cause is never "no failure": the answer has four verdicts.

* ``failure``: a class is named, with its evidence and fix (exit status 1);
* ``unrecognised failure``: the logs show a failure (an exception, an error line, a non-zero exit,
  a signal, a timeout) or end mid-job, and no rule names it: the first and the most specific of its
  lines are quoted with what to collect next (exit status 1);
* ``no failure``: the logs show the job ending normally, and which lines say so; nothing in them
  is a failure that a healthy job never prints (exit status 0);
* ``not judged``: the logs show neither a failure nor a normal end, nor that the job ever ran
  (exit status 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from conformance.common.casefiles import RankStatus
from conformance.common.outside_text import shown
from conformance.common.verdicts import Verdict
from conformance.diagnose.evidence import JobEvidence
from conformance.diagnose.findings import Finding, finding
from conformance.diagnose.inputs import Skipped
from conformance.diagnose.job_wide import (
    EVIDENCE_LINES,
    Stories,
    all_signs,
    compact,
    job_cause,
    label,
    launch,
    launch_notes,
    ranked_stories,
    ranks_text,
)
from conformance.diagnose.line_forms import EXCEPTION_LINE
from conformance.diagnose.logs import LogLine
from conformance.diagnose.sources import Gathered
from conformance.diagnose.stories import ProcessStory
from conformance.verdict import job_causes
from conformance.verdict.decision import Decision, RankReport, decide
from conformance.verdict.job_causes import FailureClass
from conformance.verdict.nccl_facts import NcclLog
from conformance.verdict.nccl_log import is_warning, process_of

QUOTE_CHARS = 300  # of each evidence line
FAILURE, UNRECOGNISED, NO_FAILURE, NOT_JUDGED = "failure", "unrecognised failure", "no failure", "not judged"
EXIT_STATUS = {FAILURE: 1, UNRECOGNISED: 1, NO_FAILURE: 0, NOT_JUDGED: 3}
SPECIFIC_PLACE = re.compile(r"\b[\w./-]+\.(?:cc|cpp|cu|c|h|py):\d+")  # a source file and line: a specific error
SILENT_HANG = (
    "SILENT HANG {where}: the log stops in NCCL's own lines with no error and no normal end (likeliest a P2P or "
    "SHM transport that hangs: the IOMMU/ACS, a driver's broken P2P; or the log was cut there)"
)
ENDS_MID_JOB = (
    "the log ends mid-job: the ranks ran, then nothing shows them failing or ending (a hang, a kill that left no "
    "word, or a log cut short)"
)
STOPPED_AT_LAUNCH = (
    "the launcher started the ranks and nothing followed: likeliest they never met (rendezvous: MASTER_ADDR and "
    "MASTER_PORT reachable from every node, the same --nnodes, every node started)"
)


@dataclass
class Diagnosis:
    """The answer; ``failure`` is None for ``no failure`` and ``not judged``."""

    verdict: str
    failure: FailureClass | None = None
    title: str = ""
    fix: str = ""
    source: str = ""  # where the fix's rule comes from, when a catalogue of NCCL's sources gave it
    root: str = ""  # "rank 3 (node gpu-7)", "" when no rank stands out
    root_ranks: list[int] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)
    evidence: list[LogLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ended: list[tuple[str, LogLine]] = field(default_factory=list)  # the lines showing a normal end
    skipped: list[Skipped] = field(default_factory=list)
    files: int = 0
    lines: int = 0

    @property
    def check(self) -> str:
        return self.failure.check if self.failure else ""

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]

    def _head(self) -> str:
        read = f"{self.files} file{'s' * (self.files != 1)}, {self.lines} lines read"
        if self.verdict == NO_FAILURE:
            return f"no failure found: the job ended normally ({read})"
        if self.verdict == NOT_JUDGED:
            return f"NOT JUDGED: these logs show no failure, no normal end, and no sign the job ran ({read})"
        return self.title + (f" on {self.root}" if self.root else " (no single rank stands out)")

    def text_lines(self) -> list[str]:
        """The answer first, then the evidence (file:line, quoted), the victims, the fix and the suite's check.

        Every line is escaped: the logs' text (and their file names) are someone else's.
        """
        lines = [self._head()]
        if self.failure is not None:
            lines.append(f"  class: {self.failure.key}")
        if self.evidence:
            lines.append("  evidence:")
            lines += [f"    {line.where}: {line.text.strip()[:QUOTE_CHARS]}" for line in self.evidence]
        if self.ended:
            lines.append("  ended normally, as these lines show:")
            lines += [f"    {line.where} ({what}): {line.text.strip()[:QUOTE_CHARS]}" for what, line in self.ended]
        if self.victims:
            ranks = [v for v in self.victims if v.isdigit()]
            others = [v for v in self.victims if not v.isdigit()]
            said = ([f"ranks {compact(ranks)}"] if ranks else []) + [f"the process writing {v}" for v in others]
            lines.append(f"  victims (only waited): {', '.join(said)}")
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  not read: {skipped.path}: {skipped.why}" for skipped in self.skipped]
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        if self.check:
            lines.append(f"  test the machine: {self.check}")
        if self.verdict != NO_FAILURE and self.verdict != NOT_JUDGED:
            lines.append(f"  ({self.files} file{'s' * (self.files != 1)}, {self.lines} lines read)")
        return [shown(line) for line in lines]

    def to_json(self) -> dict[str, object]:
        return {
            "verdict": self.verdict,
            "failure_found": self.verdict in (FAILURE, UNRECOGNISED),
            "class": self.failure.key if self.failure else None,
            "title": self.title,
            "root": self.root,
            "root_ranks": self.root_ranks,
            "victims": self.victims,
            "evidence": [_quoted(line) for line in self.evidence],
            "ended_normally": [{**_quoted(line), "what": what} for what, line in self.ended],
            "fix": self.fix,
            "fix_source": self.source or None,
            "check": self.check,
            "notes": self.notes,
            "not_read": [{"path": s.path, "why": s.why} for s in self.skipped],
            "files": self.files,
            "lines": self.lines,
        }


def _quoted(line: LogLine) -> dict[str, object]:
    return {"file": line.path, "line": line.number, "text": line.text}


# --------------------------------------------------------------------------------------------
# The ranks' findings, judged as the suite judges a case
# --------------------------------------------------------------------------------------------


def _report(number: int, story: ProcessStory, found: Finding, timed: bool = True) -> RankReport:
    """A rank as the verdict stage judges it: a victim is a rank stopped while it waited.

    ``timed``: its first failure's time may be compared with the others' (their logs share one clock).
    """
    status = RankStatus.STOPPED if story.stopped else found.status
    return RankReport(
        rank=number, device="", pid=0, phase="", step="", phase_time=None, progress=0, exit=None, seconds=0.0,
        status=status, message=found.title, time=story.first_time if timed else None,
        stopped_by="stalled" if story.stopped else None,
    )  # fmt: skip


def _key(decision: Decision, by_number: dict[int, int | str]) -> int | str | None:
    """The root's rank; a hang's root only when the suite's watchdog stopped it.

    In a log, the first rank to time out is no more a cause than the others.
    """
    root = decision.root
    if root is None or (decision.verdict == Verdict.HANG and root.status != RankStatus.STOPPED):
        return None
    return by_number[root.rank]


def _label(key: int | str, stories: Stories) -> str:
    return label(key, stories[key]) if key in stories else f"rank {key}"


TWO_RANKS_NAMED = re.compile(r"\brank \d+ and rank \d+", re.IGNORECASE)


def _who_all(keys: list[int | str], stories: Stories) -> str:
    """``ranks 0-3``, or the processes by name where the logs give no rank."""
    ranks = [str(key) for key in keys if isinstance(key, int)]
    named = [_label(key, stories) for key in keys if not isinstance(key, int)]
    return ", ".join(([f"ranks {compact(ranks)}"] if ranks else []) + named)


def _most_specific(root: int | str, findings: dict[int | str, Finding]) -> int | str:
    """The root, unless it names no cause of its own and another rank's finding does (NCCL's warning elsewhere)."""
    if findings[root].specific:
        return root
    specific = [key for key, found in findings.items() if found.failure is not None and found.specific]
    return specific[0] if specific else root


def _signature(found: Finding) -> tuple[str, str, str]:
    """What makes two ranks' findings the same failure: the class, the cause named, an exception's own text."""
    said = found.lines[0].text.strip() if found.lines and found.failure is job_causes.RANK_ERROR else ""
    return (found.failure.key if found.failure else "", found.title, said)


def _alike(key: int | str, findings: dict[int | str, Finding], stories: Stories) -> list[int | str]:
    """The ranks that failed as ``key`` did, when no clock tells which failed first (else ``key`` alone).

    Where the lines carry times, the verdict stage's earliest failure is the root; where none do, ranks that
    all failed alike (the same error everywhere) have no single root.
    """
    same = [k for k, f in findings.items() if _signature(f) == _signature(findings[key])]
    return same if all(stories[k].first_time is None for k in same) else [key]


def _names_one_rank(found: Finding) -> bool:
    """Not a line that names two ranks itself (torch's desync report, NCCL's Duplicate GPU): neither is blamed."""
    return found.failure is not job_causes.DESYNC and not any(TWO_RANKS_NAMED.search(x.text) for x in found.lines)


def _fill(answer: Diagnosis, found: Finding, victims: list[ProcessStory]) -> Diagnosis:
    answer.verdict = UNRECOGNISED if found.failure is job_causes.UNRECOGNISED else FAILURE
    answer.failure, answer.title, answer.fix, answer.source = found.failure, found.title, found.fix, found.source
    said = [*found.lines[:EVIDENCE_LINES], *(line for s in victims for line in s.victim_lines[:1])]
    answer.evidence = list(dict.fromkeys(said))
    return answer


def _hosts_apart(findings: dict[int | str, Finding], stories: Stories) -> list[str]:
    """The hosts the failed processes ran on, where their logs name more than one: their clocks are not one clock.

    Two hosts' clocks differ by whatever NTP left between them (seconds, after a step or a VM's pause), so
    which of their failures came first is not read from the logs' times (``common/clock.py``'s rule).
    """
    hosts = sorted({host for k, f in findings.items() if f.failure is not None and (host := stories[k].who.host)})
    return hosts if len(hosts) > 1 else []


def _named(answer: Diagnosis, evidence: JobEvidence, nccl: NcclLog, stories: Stories) -> None:
    """The class the ranks' findings and the job's lines name, if any (``answer.failure`` stays None if none)."""
    gpu = evidence.facts.gpu[1] if evidence.facts.gpu else None
    facts = evidence.facts
    findings = {key: found for key, story in stories.items() if (found := finding(story, gpu, facts)) is not None}
    numbers = {key: index for index, key in enumerate(stories)}
    apart = _hosts_apart(findings, stories)
    decision = decide([_report(numbers[key], stories[key], found, timed=not apart) for key, found in findings.items()])
    by_number = {numbers[key]: key for key in findings}
    root_key = _key(decision, by_number)
    victims = [key for key, found in findings.items() if found.failure is None and key != root_key]
    answer.victims = ranks_text(victims)
    job = job_cause(evidence, nccl, stories, victims)
    first_victim = [stories[k] for k in victims[:1]]
    if job is not None and job.decisive:
        answer.root = ", ".join(_label(key, stories) for key in job.ranks)
        answer.root_ranks = [key for key in job.ranks if isinstance(key, int)]
        _fill(answer, job, [])
    elif root_key is not None and findings[root_key].failure is not None:
        key = _most_specific(root_key, findings)
        found = findings[key]
        alike = _alike(key, findings, stories)
        failed = [k for k, f in findings.items() if f.failure is not None]
        named = len(alike) == 1 and _names_one_rank(found) and not (apart and len(failed) > 1)
        if apart and len(failed) > 1:
            answer.notes.append(
                f"{_who_all(failed, stories)} failed on different hosts ({', '.join(apart[:8])}): their logs' clocks "
                "are not one clock, so which failed first is not said"
            )
        answer.root = label(key, stories[key]) if named else ""
        answer.root_ranks = [key] if isinstance(key, int) and named else []
        _fill(answer, found, first_victim)
        if len(alike) > 1:
            answer.notes.append(f"{_who_all(alike, stories)} all failed alike: no single rank is the cause")
        others = [
            by_number[r.rank]
            for r in decision.victims
            if findings[by_number[r.rank]].failure is not None and by_number[r.rank] not in alike
        ]
        if others:
            order = "" if apart else ", after it"
            answer.notes.append(f"also failed{order}: {', '.join(label(k, stories[k]) for k in others[:8])}")
    elif root_key is not None and (job is None or (job.failure in (job_causes.HANG, job_causes.TRANSPORT))):
        key = root_key  # a hang: the verdict stage names the one rank the suite stopped
        answer.root, answer.root_ranks = label(key, stories[key]), [key] if isinstance(key, int) else []
        answer.notes.append(f"{answer.root} made no progress and was stopped; the others waited for it")
        found = job or Finding(job_causes.HANG, job_causes.HANG.title, job_causes.HANG.fix, (), RankStatus.STOPPED)
        _fill(answer, Finding(found.failure, found.title, found.fix, findings[key].lines, RankStatus.STOPPED), [])
    elif job is not None:
        answer.root = ", ".join(_label(key, stories) for key in job.ranks)
        answer.root_ranks = [key for key in job.ranks if isinstance(key, int)]
        _fill(answer, job, first_victim)


# --------------------------------------------------------------------------------------------
# No class named: unrecognised, a silent hang, a normal end, or nothing to judge
# --------------------------------------------------------------------------------------------


def _specificity(line: LogLine) -> tuple[int, int]:
    """How much a failure line says: an exception's type, a source file and line, NCCL's own warning."""
    text = line.text.strip()
    return (
        2 * bool(EXCEPTION_LINE.match(text)) + bool(SPECIFIC_PLACE.search(text)) + is_warning(text),
        -line.number,
    )


def _failure_lines(evidence: JobEvidence, stories: Stories) -> list[LogLine]:
    """The first failure line and the most specific one (an exception, a file:line), without repeats."""
    facts = evidence.facts
    candidates = [*facts.hard, *facts.soft, *(line for s in stories.values() for line in (*s.exceptions, *s.errors))]
    if not candidates:
        return []
    first = (facts.hard or facts.soft or candidates)[0]
    best = max(candidates, key=_specificity)
    return list(dict.fromkeys((first, best)))


def _seen_note(evidence: JobEvidence, stories: Stories) -> str:
    ranks = [str(key) for key in {*(key for key in stories if isinstance(key, int)), *evidence.facts.ranks_written}]
    hosts = sorted(evidence.facts.hosts)
    said = [f"ranks {compact(ranks)}" if ranks else "no rank named", f"nodes {', '.join(hosts[:8])}" if hosts else ""]
    return "seen in these logs: " + "; ".join(part for part in said if part)


SUCCESS_WORDS = re.compile(r"\b(?:success(?:ful(?:ly)?)?|succeeded|completed?|finished|passed)\b", re.I)
NCCL_TESTS_HEADER = re.compile(r"^#\s+(?:Rank\s+\d+|nThread|Using devices)")  # nccl-tests' own set-up lines


# What people write where they cut a log they post: "...", "[... cut ...]", "<snip>", "(truncated)".
CUT_MARK_WORDS = frozenset(("cut", "snip", "snipped", "truncated", "omitted", "more", "lines", "etc", "skipped"))


def _is_cut_mark(text: str) -> bool:
    words = re.sub(r"[\W\d_]+", " ", text).lower().split()
    return ("..." in text or "\u2026" in text or bool(words)) and set(words) <= CUT_MARK_WORDS


def _tail(evidence: JobEvidence) -> list[LogLine]:
    """The last lines of the last file read that hold output: where the log stops (cut marks left out)."""
    for read in reversed(evidence.files):
        lines = [line for line in read.last if line.text.strip() and not _is_cut_mark(line.text)]
        if lines:
            return lines
    return []


def _nccl_line(text: str) -> bool:
    return bool(process_of(text) or NCCL_TESTS_HEADER.match(text) or text.startswith("NCCL version"))


def _in_nccl_setup(tail: list[LogLine]) -> bool:
    """Whether the log stops in NCCL's set-up or its first collective: its last line of output is NCCL's."""
    return bool(tail) and _nccl_line(tail[-1].text)


def _hang_like(answer: Diagnosis, evidence: JobEvidence, nccl: NcclLog, stories: Stories) -> bool:
    """A log that stops with no error and no normal end: where it stopped tells what kind of hang it was."""
    facts, tail = evidence.facts, _tail(evidence)
    seen = _seen_note(evidence, stories)
    if facts.stuck_in is not None:
        hang = job_causes.HANG
        title = f"{hang.title}: a stack dump shows the job inside a collective"
        _fill(answer, Finding(hang, title, hang.fix, (facts.stuck_in,), RankStatus.STOPPED), [])
    elif (guessed := all_signs(stories, job_causes.BARRIER_DEVICE)) and (facts.started or facts.ranks_written):
        # torch's own warning (distributed_c10d.py barrier()): a barrier on a guessed GPU "can potentially cause a
        # hang if this rank to GPU mapping is incorrect" (failure-modes F03); the log then stops with no error.
        barrier = job_causes.BARRIER_DEVICE
        title = f"{barrier.title}: torch guessed each rank's barrier GPU, then the job stopped"
        _fill(
            answer, Finding(barrier, title, barrier.fix, tuple(line for _, line in guessed[:2]), RankStatus.STOPPED), []
        )
    elif _in_nccl_setup(tail) and (facts.started is not None or nccl.inits):
        transport = job_causes.TRANSPORT
        # failure-modes F07/F08 (NVIDIA/nccl#257, #606, #631; pytorch/pytorch#84803): a P2P path that the IOMMU or
        # ACS breaks, or a driver's broken P2P, hangs NCCL in its set-up or right after "Init COMPLETE", silently.
        done = sum(init.completed for init in nccl.inits.values())
        title = SILENT_HANG.format(where="AFTER NCCL's INIT COMPLETE" if done else "IN NCCL's SET-UP")
        _fill(answer, Finding(transport, title, transport.fix, tuple(tail[-3:]), RankStatus.STOPPED), [])
        answer.notes.append(f"{done} communicator init(s) completed before the log stops; {seen}")
    elif facts.started is not None or facts.ranks_written:
        hang = job_causes.HANG
        title = f"{hang.title}: {ENDS_MID_JOB}"
        _fill(answer, Finding(hang, title, hang.fix, tuple(tail[-3:]), RankStatus.STOPPED), [])
        answer.notes.append(seen)
    elif facts.launched is not None:
        rendezvous = job_causes.RENDEZVOUS
        title = f"{rendezvous.title}: {STOPPED_AT_LAUNCH}"
        _fill(answer, Finding(rendezvous, title, rendezvous.fix, (facts.launched, *tail[-1:]), RankStatus.STOPPED), [])
    else:
        return False
    return True


def _unclassed(answer: Diagnosis, evidence: JobEvidence, nccl: NcclLog, stories: Stories) -> None:
    facts = evidence.facts
    failed = _failure_lines(evidence, stories)
    tail = _tail(evidence)
    if failed and not (facts.normal_ends and not facts.hard):
        unrecognised = job_causes.UNRECOGNISED
        _fill(answer, Finding(unrecognised, unrecognised.title, unrecognised.fix, tuple(failed), RankStatus.ERROR), [])
        answer.notes.append(_seen_note(evidence, stories))
    elif facts.normal_ends:
        answer.verdict, answer.ended = NO_FAILURE, list(facts.normal_ends)
        if failed:
            quoted = "; ".join(f"{line.where}: {line.text.strip()[:120]}" for line in failed)
            answer.notes.append(f"errors were printed, yet the job ended normally: {quoted}")
    elif tail and not process_of(tail[-1].text) and SUCCESS_WORDS.search(tail[-1].text):
        answer.verdict = NOT_JUDGED
        answer.notes.append(
            f"the last line reads like an end ({tail[-1].where}: {tail[-1].text.strip()[:120]}), but it is the "
            "program's own, not a normal end this tool knows: the job may have finished or stopped there"
        )
    elif not _hang_like(answer, evidence, nccl, stories):
        answer.verdict = NOT_JUDGED


def _last_lines(evidence: JobEvidence) -> tuple[LogLine, ...]:
    """The last non-empty lines of each file: where the log stops."""
    last = [line for read in evidence.files for line in read.last if line.text.strip()][-3:]
    return tuple(last)


WAITING_CLASSES = (job_causes.WATCHDOG_STUCK, job_causes.HANG, job_causes.TRANSPORT)


def _at_exit(answer: Diagnosis, evidence: JobEvidence) -> None:
    """A hang after torch warned that the program exits without destroy_process_group(): NCCL's teardown hung."""
    warned = evidence.facts.no_destroy
    if warned is None or answer.failure not in WAITING_CLASSES:
        return
    answer.title += " AT EXIT, without destroy_process_group()"
    answer.fix = (
        "call torch.distributed.destroy_process_group() on every rank before the program exits (every rank, the same "
        f"groups in the same order: torch warned it was not called, {warned.where}); {answer.fix}"
    )
    answer.evidence = [warned, *answer.evidence][:EVIDENCE_LINES]


def diagnose(gathered: Gathered) -> Diagnosis:
    """The verdict, failure class, root cause and victims of the job whose every line ``gathered`` has read."""
    evidence = gathered.evidence
    nccl = evidence.nccl.build([], [])
    stories = ranked_stories(evidence, nccl)
    answer = Diagnosis(NOT_JUDGED, files=len(evidence.files), lines=evidence.lines, skipped=list(gathered.skipped))
    _named(answer, evidence, nccl, stories)
    facts = evidence.facts
    if answer.failure is not None and facts.normal_ends and not facts.hard:
        cause = f"{answer.title}: {', '.join(f'{line.where}' for line in answer.evidence[:2])}"
        answer = Diagnosis(NOT_JUDGED, files=answer.files, lines=answer.lines, skipped=answer.skipped)
        answer.notes.append(f"the logs name a cause ({cause}), yet the job ended normally")
    if answer.failure is None:
        _unclassed(answer, evidence, nccl, stories)
    _at_exit(answer, evidence)
    if facts.stopped_outside is not None and answer.verdict != NO_FAILURE:
        line = facts.stopped_outside
        answer.notes.append(
            f"the job was stopped from outside ({line.where}: {line.text.strip()[:120]}): what it was doing before "
            "is the story"
        )
    facts_launch = launch(evidence, nccl, stories)
    answer.notes += launch_notes(facts_launch, facts.hosts, facts.nnodes[0] if facts.nnodes else None)
    return answer
