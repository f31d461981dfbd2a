"""What each process of a failed job said, gathered from its log lines in one pass, memory bounded.

:class:`JobEvidence` takes :class:`~conformance.diagnose.logs.LogLine` after line and keeps, per
process, the lines that name a failure (a few of each kind, never the whole log), the last NCCL
warnings before an error, its watchdog's last collective and how it ended; for the job, what NCCL's
own lines say (versions, each process's rank, bootstrap interfaces, transports).  The patterns are
the verdict stage's tables (:mod:`conformance.verdict.job_causes`, ``stderr_causes``,
``machine_faults``, ``decision.VICTIM_PATTERN``).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from conformance.diagnose.logs import LogLine, Who
from conformance.verdict import job_causes
from conformance.verdict.decision import VICTIM_PATTERN
from conformance.verdict.nccl_log import NcclLogBuilder, process_of
from conformance.verdict.stderr_causes import KNOWN_CAUSES

KEPT_PER_KIND = 3  # lines kept per process and kind: the first ones (the last ones for the warnings)
WARNINGS_KEPT = 64  # per process: NCCL warnings and cause lines, the last ones, for stderr_causes.recognise

# The last line of a Python traceback: "torch.OutOfMemoryError: CUDA out of memory. ...", "KeyError: 'x'".
EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_][\w]*\.){0,8}[A-Z]\w*(?:Error|Exception|Exit))(?::\s?(?P<message>.*))?$"
)
# The launcher's own exceptions: not what a rank died of (torch/distributed/elastic/multiprocessing/errors,
# .../api.py SignalException: the agent itself got SIGTERM from SLURM or a user).
LAUNCHER_EXCEPTIONS = re.compile(r"ChildFailedError|SignalException|CalledProcessError")
# torch/distributed/elastic/multiprocessing/errors/__init__.py _FAILURE_FORMAT_TEMPLATE: one failed process
# of the "Root Cause (first observed failure):" and "Failures:" sections.
SUMMARY_HOST = re.compile(r"^\s*host\s*:\s*(?P<host>\S+)")
SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d{1,7}) \(local_rank: (?P<local>\d{1,5})\)")
SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d{1,4}) \(pid: (?P<pid>\d{1,10})\)")
SUMMARY_TIME = re.compile(r"^\s*time\s*:\s*(?P<time>\S+)")
SUMMARY_END = re.compile(r"^(?:=+|-+|\[\d+\]:)\s*$")
# Timestamps that order lines across files: glog's "[E1218 20:27:21.426" (torch's C++ logs), ISO dates
# ("2024-01-01 12:00:00", "2024-01-01_12:00:00" in torchrun's summary, "[2024-01-01 12:00:00]" NCCL).
GLOG_TIME = re.compile(r"\b[IWEF](?P<month>\d\d)(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d(?:\.\d{1,9})?)\b")
ISO_TIME = re.compile(
    r"\b\d{4}-(?P<month>\d\d)-(?P<day>\d\d)[ _T](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d(?:[.,]\d{1,9})?)", re.ASCII
)
NCCL_WARN = "NCCL WARN"
# Words one of which is in every line any pattern here or in the verdict stage's tables can match (errors,
# exceptions, NCCL, signals, waits, the launcher summary's first line, traceback frames): a line with none of
# them is only counted, so a long log of training steps costs one search per line.
MAY_MATTER = re.compile(
    "|".join(
        re.escape(word)
        for word in (
            "error",
            "exception",
            "exit",
            "warn",
            "fail",
            "nccl",
            "timed out",
            "time out",
            "timeout",
            "connection",
            "broken pipe",
            "watchdog",
            "abort",
            "socket",
            "crash",
            "memory",
            "ecc",
            "busy",
            "lost",
            "bus",
            "cuda",
            "device",
            "too many open files",
            "emfile",
            "enfile",
            "no space",
            "shm",
            "in use",
            "eaddrinuse",
            "nvls",
            "ibv",
            "unhandled",
            "invalid",
            "remote process",
            "duplicate gpu",
            "heartbeat",
            "clients joined",
            "rendezvous",
            "interface",
            "net/",
            "peer access",
            "p2p",
            "transport/",
            "signal",
            "srun:",
            "oom",
            "segmentation",
            "fatal python",
            "wrong data",
            "barrier",
            "root cause",
            "failures:",
            "last error",
            "stopped by",
            "result, written",
            'file "',
            "killed",
            "mismatch",
        )
    ),
    re.IGNORECASE,
)
# How diagnose.sources quotes a rank of this suite's own cases that the suite's watchdog stopped.
STOPPED_LINE = "stopped by the suite's watchdog while waiting (no result): wait timeout in {where}"
_STOPPED_START = STOPPED_LINE.split("{", 1)[0]


def line_time(text: str) -> float | None:
    """Seconds since the start of the year (no year: glog prints none), for ordering lines of one job."""
    m = GLOG_TIME.search(text) or ISO_TIME.search(text)
    if m is None:
        return None
    days = (int(m["month"]) - 1) * 31 + int(m["day"])
    return ((days * 24 + int(m["h"])) * 60 + int(m["m"])) * 60 + float(m["s"].replace(",", "."))


ProcessKey = tuple[str, str]  # ("rank", "3"), ("local", "<task or host>/3"), ("pid", "host:123"), ("file", path)


def node_of(who: Who) -> str:
    """The node of a local rank: srun's task id where it says, else the host."""
    return str(who.task) if who.task is not None else (who.host or "")


def process_key(who: Who, path: str) -> ProcessKey:
    if who.rank is not None:
        return ("rank", str(who.rank))
    if who.local_rank is not None:
        return ("local", f"{node_of(who)}/{who.local_rank}")
    if who.pid is not None:
        return ("pid", f"{who.host}:{who.pid}")
    if who.task is not None:
        return ("task", str(who.task))
    return ("file", path)


@dataclass
class ProcessStory:
    """What one process's lines said; every list holds at most :data:`KEPT_PER_KIND` lines."""

    key: ProcessKey
    who: Who = field(default_factory=Who)
    signs: dict[str, list[tuple[job_causes.LineSign, LogLine]]] = field(default_factory=dict)
    exceptions: list[LogLine] = field(default_factory=list)
    victim_lines: list[LogLine] = field(default_factory=list)
    exits: list[tuple[int, LogLine]] = field(default_factory=list)  # (exit code, the line saying so)
    warnings: deque[LogLine] = field(default_factory=lambda: deque(maxlen=WARNINGS_KEPT))
    last_sequence: tuple[int, str, LogLine] | None = None  # the watchdog's (SeqNum, OpType)
    stopped: bool = False  # a rank of this suite's own case, stopped by its watchdog
    first_time: float | None = None  # of the first failure line
    clock: float | None = None  # the last timestamp seen in this process's lines


def _keep(items: list[LogLine], line: LogLine) -> bool:
    if len(items) < KEPT_PER_KIND:
        items.append(line)
    return True


@dataclass
class _Summary:
    """The launcher summary block being read in one file (who its next lines are about)."""

    host: str | None = None
    rank: int | None = None
    local: int | None = None
    time: float | None = None


class JobEvidence:
    """Feed it every line of a job's logs (:meth:`add`); then read :attr:`stories` and :attr:`nccl`."""

    def __init__(self) -> None:
        self.stories: dict[ProcessKey, ProcessStory] = {}
        self.nccl = NcclLogBuilder()
        self.files: list[str] = []
        self.lines = 0
        self.local_ranks: set[tuple[str, int]] = set()  # (node, local rank) of every line named so: nproc per node
        self._summary: _Summary | None = None
        self._frame_indent: int | None = None  # the indentation of the last line if it was a ``File "..."`` frame
        self._after_last_error = False  # the last line was torch's "Last error:", NCCL's text follows

    def end_file(self, path: str) -> None:
        self.files.append(path)
        self.nccl.end_source()
        self._summary = None
        self._frame_indent = None
        self._after_last_error = False

    def add(self, line: LogLine) -> None:
        self.lines += 1
        text = line.text
        if line.who.local_rank is not None and line.who.rank is None:
            self.local_ranks.add((node_of(line.who), line.who.local_rank))
        if self._quiet(text):
            return
        who = self._who(line)
        process = process_of(text)
        if process is not None:
            who = who.merged(Who(host=process[0], pid=process[1]))
        if "NCCL" in text:
            self.nccl.feed_line(text)
        story = self._story(who, line.path)
        stamp = line_time(text) if self._summary is None else self._summary.time
        if stamp is not None:
            story.clock = stamp
        self._read(story, LogLine(line.path, line.number, text, who))

    def _quiet(self, text: str) -> bool:
        """Whether a line can say nothing here (no state waits on it and it names nothing)."""
        waiting = self._summary is not None or self._frame_indent is not None or self._after_last_error
        return not waiting and MAY_MATTER.search(text) is None

    def _who(self, line: LogLine) -> Who:
        """The writer of a line; inside a launcher summary, the failed process it describes."""
        text = line.text
        if "Root Cause (first observed failure)" in text or text.startswith("Failures:"):
            self._summary = _Summary()
            return line.who
        summary = self._summary
        if summary is None:
            return line.who
        if (m := SUMMARY_HOST.match(text)) is not None:
            summary.host = m["host"]
        elif (m := SUMMARY_RANK.match(text)) is not None:
            summary.rank, summary.local = int(m["rank"]), int(m["local"])
        elif (m := SUMMARY_TIME.match(text)) is not None:
            summary.time = line_time(m["time"])
        elif SUMMARY_END.match(text) and text.startswith("="):
            self._summary = None
            return line.who
        elif SUMMARY_END.match(text):
            self._summary = _Summary()
            return line.who
        if summary.rank is None:
            return line.who
        return Who(rank=summary.rank, local_rank=summary.local, host=summary.host)

    def _story(self, who: Who, path: str) -> ProcessStory:
        key = process_key(who, path)
        story = self.stories.get(key)
        if story is None:
            story = self.stories[key] = ProcessStory(key, who)
        else:
            story.who = story.who.merged(who)
        return story

    def _read(self, story: ProcessStory, line: LogLine) -> None:
        text = line.text
        indent = len(text) - len(text.lstrip())
        source_line = self._frame_indent is not None and indent > self._frame_indent
        self._frame_indent = indent if text.lstrip().startswith('File "') else None
        if source_line:  # a traceback's source line (deeper than its frame) quotes code, not what happened
            return
        found = self._exit(story, line) or self._sign(story, line) or self._exception(story, line)
        if not found and (VICTIM_PATTERN.search(text) or job_causes.PEER_GONE.search(text)):
            found = _keep(story.victim_lines, line)
        last_error_text = self._after_last_error
        self._after_last_error = text.rstrip().endswith("Last error:")
        names_cause = NCCL_WARN in text or "Last error:" in text or any(k.pattern.search(text) for k in KNOWN_CAUSES)
        if last_error_text or names_cause:
            story.warnings.append(line)
        sequence = job_causes.WATCHDOG_SEQUENCE.search(text) or job_causes.TIMEOUT_AT_WORK.search(text)
        if sequence is not None:
            groups = sequence.groupdict()
            story.last_sequence = (int(groups["seq"]), groups.get("op") or "", line)
        story.stopped = story.stopped or text.startswith(_STOPPED_START)
        if found and story.first_time is None:
            story.first_time = story.clock

    def _exit(self, story: ProcessStory, line: LogLine) -> bool:
        m = SUMMARY_EXIT.match(line.text) if self._summary is not None else None
        if m is None:
            return False
        code = int(m["code"])
        if code != 0 and len(story.exits) < KEPT_PER_KIND:
            story.exits.append((code, line))
        return code != 0

    def _sign(self, story: ProcessStory, line: LogLine) -> bool:
        for sign in job_causes.LINE_SIGNS:
            if sign.pattern.search(line.text):
                kept = story.signs.setdefault(sign.failure.key, [])
                if len(kept) < KEPT_PER_KIND:
                    kept.append((sign, line))
                return sign.root
        return False

    def _exception(self, story: ProcessStory, line: LogLine) -> bool:
        m = EXCEPTION_LINE.match(line.text.strip())
        if m is None or LAUNCHER_EXCEPTIONS.search(m["type"]):
            return False
        if VICTIM_PATTERN.search(line.text) or job_causes.PEER_GONE.search(line.text):
            return _keep(story.victim_lines, line)
        return _keep(story.exceptions, line)
