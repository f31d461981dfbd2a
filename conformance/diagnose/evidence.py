"""What each process of a failed job said, gathered from its log lines in one pass, memory bounded.

:class:`JobEvidence` reads a job's files (:meth:`JobEvidence.read_file`, through
:func:`conformance.diagnose.logs.scan`: only lines with one of ``line_forms.ANCHOR_WORDS`` reach it) and
keeps, per process, the lines that name a failure (a few of each kind, never the whole log), its
exceptions (a traceback's last line, whatever the exception's name), its last NCCL warnings, the
collective its watchdog timed out in and how it ended; for the job, what NCCL's own lines say
(versions, each process's rank, interfaces, the transports used), how big the job says it is and
which ranks announced themselves, the lines that show a failure at all and those that show a
normal end, and how each file ends.  The patterns are the verdict stage's tables
(:mod:`conformance.verdict.job_causes`, ``stderr_causes``, ``machine_faults``, ``cuda_errors``,
``decision.VICTIM_PATTERN``) and :mod:`conformance.diagnose.job_lines`.

What is kept, and its bounds, is :mod:`conformance.diagnose.stories`; the forms of the lines read,
:mod:`conformance.diagnose.line_forms`; lines are bounded by the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from conformance.diagnose import job_lines
from conformance.diagnose.death_lines import DeathLines
from conformance.diagnose.inputs import LogFile, UnusableInput, open_regular
from conformance.diagnose.line_forms import (
    ANCHORS,
    EXCEPTION_LINE,
    LAUNCHER_EXCEPTIONS,
    MAY_NAME_GPU,
    STOPPED_START,
    SUMMARY_END,
    SUMMARY_EXIT,
    SUMMARY_HOST,
    SUMMARY_LINES,
    SUMMARY_RANK,
    SUMMARY_TIME,
    TORCH_RANK,
    TRACEBACK_CONTINUES,
    TRACEBACK_END,
    VIA,
    WRITTEN_LOCAL,
    WRITTEN_RANK,
    line_time,
)
from conformance.diagnose.logs import SNIFF_BYTES, LogLine, Who, is_text, parse_line, scan, text_of, who_from_path
from conformance.diagnose.stories import (
    FACTS_KEPT,
    KEPT_PER_KIND,
    SET_LIMIT,
    VIAS_KEPT,
    Collective,
    FileRead,
    JobFacts,
    ProcessKey,
    ProcessStory,
    node_of,
    process_key,
)
from conformance.verdict import cuda_errors, job_causes
from conformance.verdict.decision import VICTIM_PATTERN
from conformance.verdict.machine_faults import ANY_MACHINE_FAULT
from conformance.verdict.nccl_log import NcclLogBuilder, is_warning, process_of
from conformance.verdict.stderr_causes import KNOWN_CAUSES

TRACEBACK_LINES = 400  # a traceback longer than this is closed without its last line
REPORTING_LEVELS = ("debug", "info", "warning")  # a logger's levels for lines that report, not fail


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
    lines: int = 0


class JobEvidence:
    """Feed it a job's files (:meth:`read_file`) or lines (:meth:`add`, :meth:`end_file`); then read its facts."""

    def __init__(self) -> None:
        self.stories: dict[ProcessKey, ProcessStory] = {}
        self.nccl = NcclLogBuilder()
        self.facts = JobFacts()
        self.files: list[FileRead] = []
        self.lines = 0
        self.local_ranks: set[tuple[str, int]] = set()  # (node, local rank) of every line named so: nproc per node
        self._summary: _Summary | None = None
        self._tracebacks: dict[ProcessKey, int] = {}  # open tracebacks and stack dumps: lines read of each
        self._dumps: set[ProcessKey] = set()  # which of them are stack dumps of a live process
        self._frame_indent: int | None = None  # the indentation of the last line if it was a ``File "..."`` frame
        self._after_last_error = False  # the last line was torch's "Last error:", NCCL's text follows
        self._rank_hosts: dict[int, str] = {}  # a rank's host, from NCCL's "host:pid:tid" prefix on its lines
        self._deaths = DeathLines(self.facts, self._story)  # deaths, memory kills, stops, what crashes said

    # ---------------------------------------------------------------------------------------- reading

    def read_file(self, log: LogFile) -> None:
        """Every line of one text file (a binary file raises :class:`UnusableInput`)."""
        path = log.path
        base = who_from_path(path)
        name = str(path)
        with open_regular(log) as stream:
            if not is_text(stream.read(SNIFF_BYTES)):
                raise UnusableInput(f"{path}: a binary file, not a log")
            stream.seek(0)

            def read(number: int, raw: bytes) -> None:
                info = b"NCCL INFO" in raw and not self.waiting()
                if info and b" via " in raw:  # a connection's transport: each block's are counted in _block
                    return
                for parsed in parse_line(text_of(raw), base):  # each with its writer, time and level
                    line = LogLine(name, number, parsed.text, parsed.who, parsed.level)
                    if info:
                        self._nccl_info(line)
                    else:
                        self.add(line, parsed.time)

            scanned = scan(stream, ANCHORS, read, self.waiting, self._block)
        last = [
            LogLine(name, n, parsed.text, parsed.who, parsed.level)
            for n, text in scanned.last_lines()
            for parsed in parse_line(text, base)[-1:]
        ]
        self.end_file(name, scanned.lines, last)

    def waiting(self) -> bool:
        """Whether the next line must be read whatever it holds (a traceback, a summary block, NCCL's last error)."""
        return bool(self._tracebacks) or self._summary is not None or self._after_last_error

    def _block(self, block: bytes, lowered: bytes) -> None:
        vias = self.facts.vias
        if len(vias) < VIAS_KEPT and b" via " in block:
            vias.update(via.decode("ascii", "replace").strip() for via in set(VIA.findall(block)))
        written = self.facts.ranks_written
        if len(written) < SET_LIMIT:
            written.update(int(a or b) for a, b in WRITTEN_RANK.findall(lowered))
        if len(self.local_ranks) < SET_LIMIT:
            self.local_ranks.update((task.decode(), int(local)) for task, local in WRITTEN_LOCAL.findall(lowered))

    def _nccl_info(self, line: LogLine) -> None:
        """An NCCL INFO line: what NCCL says of itself (versions, init, interfaces, plugins), never a failure.

        Except that an NCCL built without the GPU's architecture says so at INFO level (2.25).
        """
        text = line.text
        self.nccl.feed_line(text)
        process = process_of(text)
        if process is not None:
            if len(self.facts.hosts) < SET_LIMIT:
                self.facts.hosts.add(process[0])
            line = replace(line, who=line.who.merged(Who(host=process[0], pid=process[1])))
            if line.who.rank is not None and len(self._rank_hosts) < SET_LIMIT:
                self._rank_hosts.setdefault(line.who.rank, process[0])
        self._started_by(line)
        self._where(line)
        if "maxSharedMem" in text:
            self._read(self._story(line.who, line.path), line)

    def end_file(self, path: str, lines: int, last: list[LogLine] | None = None) -> None:
        self.lines += lines
        self.files.append(FileRead(path, lines, last or []))
        self.nccl.end_source()
        self._summary = None
        self._tracebacks.clear()
        self._dumps.clear()
        self._frame_indent = None
        self._after_last_error = False
        self._deaths.end_file()

    def add(self, line: LogLine, stamp: float | None = None) -> None:
        """One line of the current file (its writer's prefixes already taken off; ``stamp``: its time, if known)."""
        text = line.text
        if line.who.local_rank is not None and line.who.rank is None:
            self.local_ranks.add((node_of(line.who), line.who.local_rank))
        who = self._who(line)
        process = process_of(text)
        if process is not None:
            who = who.merged(Who(host=process[0], pid=process[1]))
        if who.rank is None and (m := TORCH_RANK.match(text)) is not None:
            who = who.merged(Who(rank=int(m["rank"])))
        if "NCCL" in text or " WARN" in text:
            self.nccl.feed_line(text)
        story = self._story(who, line.path)
        stamp = (stamp if stamp is not None else line_time(text)) if self._summary is None else self._summary.time
        if stamp is not None:
            story.clock = stamp
        line = replace(line, who=who)
        self._job_facts(line)
        self._read(story, line)

    # ---------------------------------------------------------------------------------------- writers

    def _who(self, line: LogLine) -> Who:
        """The writer of a line; inside a launcher summary, the failed process it describes."""
        text = line.text
        if "Root Cause (first observed failure)" in text or text.startswith("Failures:"):
            self._summary = _Summary()
            return line.who
        summary = self._summary
        if summary is None:
            return line.who
        summary.lines += 1
        if (m := SUMMARY_HOST.match(text)) is not None:
            summary.host = m["host"]
        elif (m := SUMMARY_RANK.match(text)) is not None:
            summary.rank, summary.local = int(m["rank"]), int(m["local"])
        elif (m := SUMMARY_TIME.match(text)) is not None:
            summary.time = line_time(m["time"])
        elif (SUMMARY_END.match(text) and text.startswith("=")) or summary.lines > SUMMARY_LINES:
            self._summary = None
            return line.who
        elif SUMMARY_END.match(text):
            self._summary = _Summary()
            return line.who
        if summary.rank is None:
            return line.who
        return Who(rank=summary.rank, local_rank=summary.local, host=summary.host)

    def _story(self, who: Who, path: str) -> ProcessStory:
        if who.host is None and who.rank in self._rank_hosts:
            who = who.merged(Who(host=self._rank_hosts[who.rank]))
        key = process_key(who, path)
        story = self.stories.get(key)
        if story is None:
            story = self.stories[key] = ProcessStory(key, who)
        else:
            story.who = story.who.merged(who)
        if who.host is not None and len(self.facts.hosts) < SET_LIMIT:
            self.facts.hosts.add(who.host)
        return story

    # ---------------------------------------------------------------------------------------- the job

    def _started_by(self, line: LogLine) -> None:
        if self.facts.started is None:
            self.facts.started = line

    def _job_facts(self, line: LogLine) -> None:
        text, facts = line.text, self.facts
        if "Init COMPLETE" in text or "Init START" in text or line.who.rank is not None or process_of(text):
            self._started_by(line)
        self._where(line)
        for end in job_lines.NORMAL_ENDS:
            if end.pattern.search(text) and len(facts.normal_ends) < FACTS_KEPT:
                facts.normal_ends.append((end.what, line))
        if (m := job_lines.MEMBER.search(text)) is not None:
            self._stated_size(int(m["size"]), line)
            rank = int(m["rank"])
            if rank in facts.members or len(facts.members) < SET_LIMIT:
                facts.members[rank] = facts.members.get(rank, 0) + 1
        elif (m := job_lines.WORLD_SIZE.search(text)) is not None:
            self._stated_size(job_lines.first_number(m), line)
        if (m := job_lines.CLIENTS_JOINED.search(text) or job_lines.STORE_BARRIER.search(text)) is not None:
            facts.joined = (int(m["joined"]), int(m["size"]), line)
            self._stated_size(int(m["size"]), line)
        if (m := job_lines.NNODES.search(text)) is not None:
            facts.nnodes = facts.nnodes or (job_lines.first_number(m), line)
        if (m := job_lines.NPROC.search(text)) is not None:
            facts.nproc = facts.nproc or (job_lines.first_number(m), line)

    def _where(self, line: LogLine) -> None:
        """Where the job was: launched, dumped in a collective, exiting, stopped from outside; its plugins, its GPU."""
        text, facts = line.text, self.facts
        if facts.launched is None and job_lines.LAUNCHED.search(text):
            facts.launched = line
        if facts.no_destroy is None and "destroy_process_group" in text and job_lines.NO_DESTROY.search(text):
            facts.no_destroy = line
        if facts.stopped_outside is None and job_causes.STOPPED_FROM_OUTSIDE.search(text):
            facts.stopped_outside = line
        host = line.who.host
        if "lugin" in text and host is not None and (m := job_lines.NET_PLUGIN.search(text)) is not None:
            if host in facts.net_plugins or len(facts.net_plugins) < SET_LIMIT:
                facts.net_plugins.setdefault(host, (job_lines.net_plugin(m), line))
        if facts.gpu is None and MAY_NAME_GPU.search(text) and (generation := cuda_errors.generation_in(text)):
            facts.gpu = (generation, line)

    def _stated_size(self, size: int, line: LogLine) -> None:
        if size > 0 and (size in self.facts.sizes or len(self.facts.sizes) < SET_LIMIT):
            self.facts.sizes.setdefault(size, line)

    # ---------------------------------------------------------------------------------------- a process

    def _read(self, story: ProcessStory, line: LogLine) -> None:
        text = line.text
        indent = len(text) - len(text.lstrip())
        source_line = self._frame_indent is not None and indent > self._frame_indent
        self._frame_indent = indent if text.lstrip().startswith('File "') else None
        if source_line or self._in_traceback(story, line):  # a frame or its source line: code, not what happened
            return
        ended = self._traceback_end(story, line)
        if ended:  # the traceback's last line may be a launcher's report of a death (read there)
            death = self._deaths.reported is line
        else:
            death = self._exit(story, line) or self._deaths.read(story, line)
        found = ended or death or self._sign(story, line) or self._exception(story, line)
        if not found and _only_waited(text):
            found = _keep(story.victim_lines, line)
        last_error_text = self._after_last_error
        self._after_last_error = text.rstrip().endswith("Last error:")
        names_cause = is_warning(text) or "Last error:" in text or any(k.pattern.search(text) for k in KNOWN_CAUSES)
        if last_error_text or names_cause:
            story.warnings.append(line)
        self._collective(story, line)
        story.stopped = story.stopped or text.startswith(STOPPED_START)
        hard = found and not is_warning(text)  # a WARN, however telling, is soft
        failed = self._failure(story, line, hard=hard, own=not death)
        if (found or failed) and story.first_time is None:
            story.first_time = story.clock

    def _in_traceback(self, story: ProcessStory, line: LogLine) -> bool:
        """Whether the line starts a Python traceback or a stack dump, or is inside one (frames, chained parts)."""
        text = line.text.strip()
        if text.startswith("Traceback (most recent call last)"):
            self._tracebacks[story.key] = 0
            self._failure(story, line, hard=True)
            return True
        if job_lines.STACK_DUMP.search(text):
            self._tracebacks[story.key] = 0
            self._dumps.add(story.key)
            return True
        read = self._tracebacks.get(story.key)
        if read is None:
            if job_lines.TRACEBACK_FRAME.match(line.text):  # a traceback whose first line is not in the log
                self._failure(story, line, hard=True)
            return False
        if read < TRACEBACK_LINES and (line.text[:1].isspace() or not text or text.startswith(TRACEBACK_CONTINUES)):
            self._tracebacks[story.key] = read + 1
            if story.key in self._dumps and self.facts.stuck_in is None and job_lines.COLLECTIVE_FRAME.search(text):
                self.facts.stuck_in = line
            return True
        return False

    def _traceback_end(self, story: ProcessStory, line: LogLine) -> bool:
        """The first line of a traceback back at the margin: its exception, whatever the exception's name."""
        if self._tracebacks.pop(story.key, None) is None:
            return False
        if story.key in self._dumps:  # a stack dump ends in no exception
            self._dumps.discard(story.key)
            return False
        text = line.text.strip()
        m = TRACEBACK_END.match(text)
        if m is None or not (EXCEPTION_LINE.match(text) or m["message"] is not None or "." in m["type"]):
            return False  # not an exception line: read it as any other line
        if self._deaths.read(story, line):  # a launcher's exception for a death ("died with <Signals.SIGKILL: 9>")
            return True
        if not LAUNCHER_EXCEPTIONS.search(m["type"]):
            self._sign(story, line) or self._exception(story, line, any_name=True)
        return True

    def _collective(self, story: ProcessStory, line: LogLine) -> None:
        m = job_causes.WATCHDOG_SEQUENCE.search(line.text) or job_causes.TIMEOUT_AT_WORK.search(line.text)
        if m is not None:
            groups = m.groupdict()
            numel = int(groups["numel"]) if groups.get("numel") else None
            story.collective = Collective(int(groups["seq"]), groups.get("op") or "", numel, line)

    def _failure(self, story: ProcessStory, line: LogLine, hard: bool, own: bool = True) -> bool:
        """Whether the line shows a failure (kept as the job's evidence that it failed).

        ``own``: the line is the process's own word, not a launcher's report of its death (srun's "Out Of Memory"
        is no error of the launcher's own, nor a GPU's).
        """
        text = line.text
        if not hard:
            hard = (
                job_lines.NONZERO_EXIT.search(text) is not None
                or "Watchdog caught collective operation timeout" in text
                or ANY_MACHINE_FAULT.search(text) is not None
            )
        soft = hard or _says_failure(text, line.level)
        if hard:
            self.facts.add_kept(self.facts.hard, line)
        if soft:
            self.facts.add_kept(self.facts.soft, line)
            if own and not story.exceptions and line not in story.errors:
                _keep(story.errors, line)
        return soft

    def _exit(self, story: ProcessStory, line: LogLine) -> bool:
        m = SUMMARY_EXIT.match(line.text) if self._summary is not None else None
        if m is None:
            return False
        code = int(m["code"])
        if code != 0:
            self._deaths.exit_code(story, code, int(m["pid"]), line)
        return code != 0

    def _sign(self, story: ProcessStory, line: LogLine) -> bool:
        for index, sign in enumerate(job_causes.LINE_SIGNS):
            if sign.pattern.search(line.text):
                kept = story.signs.setdefault(sign.failure.key, [])
                if len(kept) < KEPT_PER_KIND:
                    kept.append((index, line))
                return sign.root
        return False

    def _exception(self, story: ProcessStory, line: LogLine, any_name: bool = False) -> bool:
        m = (TRACEBACK_END if any_name else EXCEPTION_LINE).match(line.text.strip())
        if m is None or LAUNCHER_EXCEPTIONS.search(m["type"]):
            return False
        if _only_waited(line.text):
            return _keep(story.victim_lines, line)
        return _keep(story.exceptions, line)

    # ---------------------------------------------------------------------------------------- merging

    def absorb(self, other: JobEvidence) -> None:
        """Take in the evidence of other files of the same job (read in another process)."""
        for key, story in other.stories.items():
            if key in self.stories:
                self.stories[key].absorb(story)
            else:
                self.stories[key] = story
        self.nccl.absorb(other.nccl)
        self.files += other.files
        self.lines += other.lines
        self.local_ranks |= other.local_ranks
        mine, theirs = self.facts, other.facts
        for name in ("hard", "soft", "normal_ends", "memory_kills", "crash_lines"):
            getattr(mine, name).extend(getattr(theirs, name)[: FACTS_KEPT - len(getattr(mine, name))])
        mine.started = mine.started or theirs.started
        for size, line in theirs.sizes.items():
            mine.sizes.setdefault(size, line)
        mine.nnodes, mine.nproc = mine.nnodes or theirs.nnodes, mine.nproc or theirs.nproc
        mine.joined = theirs.joined or mine.joined
        for rank, count in theirs.members.items():
            mine.members[rank] = mine.members.get(rank, 0) + count
        for name in ("ranks_written", "hosts", "vias"):
            getattr(mine, name).update(list(getattr(theirs, name))[: SET_LIMIT - len(getattr(mine, name))])
        for name in ("launched", "stuck_in", "no_destroy", "stopped_outside", "gpu", "stop"):
            setattr(mine, name, getattr(mine, name) or getattr(theirs, name))
        for host, plugin in theirs.net_plugins.items():
            mine.net_plugins.setdefault(host, plugin)


def _only_waited(text: str) -> bool:
    """A line of a rank that lost its peer, timed out waiting, or was stopped from outside: not a cause of its own."""
    text = job_lines.without_timeout_lengths(text)
    return any(p.search(text) for p in (VICTIM_PATTERN, job_causes.PEER_GONE, job_causes.STOPPED_FROM_OUTSIDE))


def _says_failure(text: str, level: str | None = None) -> bool:
    """Whether a line (not INFO, not a warning) says something failed; a benign NCCL warning never does.

    ``level``: the level its logger's prefix gave (writers.py): a line logged as debug, info or a warning reports.
    """
    if is_warning(text):
        return job_lines.BENIGN_NCCL_WARNING.search(text) is None
    if level in REPORTING_LEVELS:
        return False
    text = job_lines.without_timeout_lengths(text)
    return job_lines.FAILURE_WORDS.search(text) is not None and job_lines.NOT_A_FAILURE.search(text) is None
