"""A job's log files, line by line, fast and in bounded memory, each line with the process that wrote it.

**Reading.**  A file is read in blocks of :data:`BLOCK_BYTES`; a line longer than :data:`MAX_LINE`
keeps its first and last :data:`HALF_LINE` bytes (so a line of any length, with or without a
newline, costs at most a block and a line of memory).  Most lines of a big log say nothing a rule
can use (training steps, NCCL's per-channel set-up): :func:`scan` hands on only the lines that
contain one of the reader's anchor words (one compiled search per line) or that the reader waits
for (the lines after a traceback's start), counts the rest, and keeps the file's last lines.

**Writers.**  Who wrote a line comes from its prefixes (:data:`WRITER_PREFIXES`, one table of the
shapes launchers write, stacked in any order) and the file's path (:func:`who_from_path`); NCCL's
``host:pid:tid [dev]`` prefix names a process whose rank its init line gives
(:mod:`conformance.diagnose.evidence`).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from conformance.verdict.nccl_log import MAX_LINE

BLOCK_BYTES = 1 << 20
HALF_LINE = MAX_LINE // 2
CUT_MARK = b" [...] "  # where the middle of an over-long line was left out
TAIL_LINES = 8  # the last lines of each file, kept to tell how the log ends
SNIFF_BYTES = 8192  # read to decide whether a file is text


@dataclass(frozen=True)
class Who:
    """The process a line came from, as far as the logs say: any of these may be unknown."""

    rank: int | None = None
    local_rank: int | None = None
    task: int | None = None  # srun's task id (a node's torchrun when one runs per node)
    host: str | None = None
    pid: int | None = None

    def merged(self, other: Who) -> Who:
        """Who this is, completed with what ``other`` knows and this one does not."""
        return Who(
            self.rank if self.rank is not None else other.rank,
            self.local_rank if self.local_rank is not None else other.local_rank,
            self.task if self.task is not None else other.task,
            self.host if self.host is not None else other.host,
            self.pid if self.pid is not None else other.pid,
        )


@dataclass(frozen=True)
class LogLine:
    path: str
    number: int  # 1-based
    text: str  # without the prefixes that named its writer
    who: Who

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"


@dataclass(frozen=True)
class WriterPrefix:
    """One shape of line prefix a launcher writes, and what its groups say of the writer."""

    launcher: str
    pattern: re.Pattern[str]  # matched at the start of the line (after the prefixes already taken off)
    fields: tuple[str, ...]  # Who's field for each group: rank, local_rank, task, host, pid


# Every prefix shape, in one table.  Each is matched at the start of what is left of the line, so they stack
# in any order (``0: [rank3]: ...``, ``(RayWorkerWrapper pid=7, ip=10.0.0.2) [rank1]: ...``).
WRITER_PREFIXES: tuple[WriterPrefix, ...] = (
    # torch's own distributed logging, torch >= 2.2: "[rank3]:" before every line a rank writes to stderr
    # (torch/csrc/distributed/c10d/logging.h and torch/distributed/c10d_logger.py).
    WriterPrefix("torch", re.compile(r"\[rank(\d{1,7})\]:\s?"), ("rank",)),
    # torchrun --tee / --log-dir: "[default3]:" -- the role and the local rank
    # (torch/distributed/elastic/multiprocessing/api.py, tail_logger's "[{role}{local_rank}]:").
    WriterPrefix("torchrun", re.compile(r"\[[A-Za-z_]{1,40}?(\d{1,5})\]:\s?"), ("local_rank",)),
    # Open MPI's mpirun --tag-output: "[1,3]<stderr>:" -- the job and the rank (orte/mca/iof/base).
    WriterPrefix("mpirun", re.compile(r"\[\d{1,7},(\d{1,7})\]<std(?:out|err)>:\s?"), ("rank",)),
    # SLURM's srun --label: "3: " -- the task id, right-aligned (src/srun/libsrun/... "%*d: ").
    WriterPrefix("srun", re.compile(r"\s{0,4}(\d{1,5}): "), ("task",)),
    # Ray's log monitor before every line of a worker: "(RayWorkerWrapper pid=2789, ip=10.0.0.2) ", "(pid=2789) "
    # (ray/_private/worker.py print_worker_logs); vLLM's own workers: "(VllmWorkerProcess pid=8732) ",
    # "(EngineCore_DP0 pid=511) " (vllm/executor/multiproc_worker_utils.py, v1/engine/core.py).
    WriterPrefix(
        "ray",
        re.compile(r"\((?:[A-Za-z_][\w.:-]{0,80} )?pid=(\d{1,10})(?:, ip=([0-9A-Fa-f.:]{2,45}))?\)\s?"),
        ("pid", "host"),
    ),
    # Lightning's rank_prefixed_message: "[rank: 1] " (lightning/fabric/utilities/rank_zero.py).
    WriterPrefix("lightning", re.compile(r"\[rank: (\d{1,7})\]\s?"), ("rank",)),
    # DeepSpeed's log_dist: "[Rank 0] " (deepspeed/utils/logging.py).
    WriterPrefix("deepspeed", re.compile(r"\[Rank (\d{1,7})\]\s?"), ("rank",)),
    # vLLM's log format before each line it logs, a traceback's lines included:
    # "ERROR 08-27 05:12:18 worker_base.py:382] " (vllm/logger.py:
    # "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s", datefmt "%m-%d %H:%M:%S").
    WriterPrefix(
        "vllm",
        re.compile(
            r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? [\w.-]{1,80}:\d{1,6}\] "
        ),
        (),
    ),
    # A logging library's timestamp before the line ("2024-04-29 06:01:12.977 ", "[2024-04-29 06:01:12,977] ",
    # "2024-04-29T06:01:12.977Z "): formatting, like a workflow tool's "[177/train/578 (pid 28936)] " (Metaflow's
    # "[<task> (pid <pid>)]") and a run's UUID ("[09c561ee-a44c-4795-967c-7183a83b3160] ").
    WriterPrefix(
        "timestamp",
        re.compile(r"\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?\]? "),
        (),
    ),
    WriterPrefix("task", re.compile(r"\[[\w/.-]{1,80} \(pid (\d{1,10})\)\] "), ("pid",)),
    WriterPrefix("uuid", re.compile(r"\[[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\] "), ()),
    # pdsh, DeepSpeed's multi-node runner, prefixes every line with the host: "worker-1: " (pdsh's "%s: ").  Only a
    # lower-case name with a digit in it is taken for a host, so "RuntimeError: " or "INFO: " never is.
    WriterPrefix("pdsh", re.compile(r"([a-z][a-z0-9_.-]{0,62}[0-9][a-z0-9_.-]{0,62}): (?=\S)"), ("host",)),
)


# Terminal colours a launcher puts around its prefixes (Ray: "\x1b[36m(RayWorkerWrapper pid=7)\x1b[0m"), with their
# ESC or without it (lost when a log is pasted into an issue): formatting, not text.
_COLOURS = re.compile(r"\x1b?\[[0-9;]{1,12}m")
# Ray's de-duplication suffix (ray/_private/ray_logging.py): " [repeated 6x across cluster]".
_REPEATED = re.compile(r" \[repeated \d+x across cluster\]$")


def strip_prefixes(line: str, who: Who) -> tuple[str, Who]:
    """The line without its leading writer prefixes (nor colours, nor Ray's repeat count), and ``who`` with them."""
    if "m" in line and "[" in line:
        line = _COLOURS.sub("", line)
    if line.endswith("cluster]"):
        line = _REPEATED.sub("", line)
    found: dict[str, int | str] = {}
    progress = True
    while progress:
        progress = False
        for prefix in WRITER_PREFIXES:
            m = prefix.pattern.match(line)
            if m is None or any(name in found for name in prefix.fields):
                continue
            for name, value in zip(prefix.fields, m.groups(), strict=True):
                if value is not None:
                    found[name] = value if name == "host" else int(value)
            line = line[m.end() :]
            progress = True
    return line, replace(who, **found) if found else who  # type: ignore[arg-type]


_PATH_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,7})(?:$|[^0-9])", re.IGNORECASE)
_TORCHRUN_LOCAL = re.compile(r"attempt_\d+$")


def who_from_path(path: Path) -> Who:
    """What a file's path says of its writer: ``rank3``, or torchrun's ``attempt_0/3/stderr.log``."""
    rank = None
    for part in path.parts:
        m = _PATH_RANK.search(part)
        if m:
            rank = int(m.group(1))
    local = None
    if rank is None and len(path.parts) >= 3 and _TORCHRUN_LOCAL.match(path.parts[-3]) and path.parts[-2].isdigit():
        local = int(path.parts[-2])
    return Who(rank=rank, local_rank=local)


def is_text(head: bytes) -> bool:
    """Whether a file's first bytes are text (no NUL, UTF-8 up to a character cut at the end)."""
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 4  # a character cut at the end of the sniffed bytes
    return True


def bounded(raw: bytes) -> bytes:
    """A line of at most :data:`MAX_LINE` bytes (and the cut mark): its head and its tail."""
    if len(raw) <= MAX_LINE:
        return raw
    return raw[:HALF_LINE] + CUT_MARK + raw[-HALF_LINE:]


def text_of(raw: bytes) -> str:
    return bounded(raw).decode("utf-8", errors="replace").rstrip("\r")


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    """The stream's lines a block's worth at a time, joined (no trailing newline).

    A line that runs on past a block keeps its head and tail (:func:`bounded`), so no chunk is longer
    than two blocks, whatever the file holds.
    """
    carry = b""
    while block := stream.read(BLOCK_BYTES):
        last = block.rfind(b"\n")
        if last == -1:
            carry = bounded(carry + block)
            continue
        yield carry + block[:last]
        carry = block[last + 1 :]
    if carry:
        yield carry


def _line_starts(lowered: bytes, words: tuple[bytes, ...]) -> list[int]:
    """Where each line holding one of ``words`` starts in ``lowered``, in order (one C search per word)."""
    starts: set[int] = set()
    for word in words:
        found = lowered.find(word)
        while found != -1:
            starts.add(lowered.rfind(b"\n", 0, found) + 1)
            end = lowered.find(b"\n", found)
            found = -1 if end == -1 else lowered.find(word, end)
    return sorted(starts)


@dataclass
class FileScan:
    """What one file held beyond the lines handed on: how many lines, and the last of them."""

    lines: int = 0
    tail: deque[bytes] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    def last_lines(self) -> list[tuple[int, str]]:
        """The file's last lines as (number, text), oldest first."""
        first = self.lines - len(self.tail) + 1
        return [(first + i, text_of(raw)) for i, raw in enumerate(self.tail)]


def scan(
    stream: BinaryIO,
    words: tuple[bytes, ...],
    reader: Callable[[int, bytes], None],
    waiting: Callable[[], bool],
    on_block: Callable[[bytes, bytes], None],
) -> FileScan:
    """Hand ``reader`` (line number, raw line) for each line worth reading; count the rest, keep the last.

    Worth reading: a line whose lower-cased text holds one of ``words``, and every line after one
    while ``waiting()`` says so.  ``on_block`` sees each block as it is and lower-cased (for what any line may say).
    """
    scanned = FileScan()
    number = 0  # lines before this chunk
    for chunk in _chunks(stream):
        lowered = chunk.lower()
        on_block(chunk, lowered)
        counted, at = 0, 0  # newlines in chunk[:at]
        handed_to = 0  # lines before this offset were handed on already
        for start in _line_starts(lowered, words):
            if start < handed_to:
                continue
            counted += chunk.count(b"\n", at, start)
            at = start
            while True:  # this line, then the next ones while the reader waits for them
                end = chunk.find(b"\n", at)
                reader(number + counted + 1, chunk[at : len(chunk) if end == -1 else end])
                if end == -1 or not waiting():
                    handed_to = len(chunk) if end == -1 else end + 1
                    break
                at, counted = end + 1, counted + 1
        lines = chunk.count(b"\n") + 1
        scanned.tail.extend(chunk.rsplit(b"\n", TAIL_LINES)[-TAIL_LINES:])
        number += lines
    scanned.lines = number
    return scanned
