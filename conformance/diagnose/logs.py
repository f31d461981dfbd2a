"""A job's log files, line by line, fast and in bounded memory, each line with the process that wrote it.

**Reading.**  A file is read in blocks of :data:`BLOCK_BYTES`; a line longer than :data:`MAX_LINE`
keeps its first and last :data:`HALF_LINE` bytes (so a line of any length, with or without a
newline, costs at most a block and a line of memory).  Most lines of a big log say nothing a rule
can use (training steps, NCCL's per-channel set-up): :func:`scan` hands on only the lines that
contain one of the reader's anchor words (one compiled search per line) or that the reader waits
for (the lines after a traceback's start), counts the rest, and keeps the file's last lines.

**Writers.**  Who wrote a line, when and at what level comes from its prefixes (:mod:`conformance.diagnose.writers`:
one table of the shapes launchers and loggers write, stacked in any order, and JSON log records) and the file's
path (:func:`who_from_path`); NCCL's ``host:pid:tid [dev]`` prefix names a process whose rank its init line gives
(:mod:`conformance.diagnose.evidence`).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from conformance.diagnose.writers import WRITER_PREFIXES as WRITER_PREFIXES  # the writers' parser, as before
from conformance.diagnose.writers import ParsedLine as ParsedLine
from conformance.diagnose.writers import Who as Who
from conformance.diagnose.writers import parse_line as parse_line
from conformance.diagnose.writers import strip_prefixes as strip_prefixes
from conformance.verdict.nccl_log import MAX_LINE

BLOCK_BYTES = 1 << 20
HALF_LINE = MAX_LINE // 2
CUT_MARK = b" [...] "  # where the middle of an over-long line was left out
TAIL_LINES = 8  # the last lines of each file, kept to tell how the log ends
SNIFF_BYTES = 8192  # read to decide whether a file is text


@dataclass(frozen=True)
class LogLine:
    path: str
    number: int  # 1-based
    text: str  # without the prefixes that named its writer
    who: Who
    level: str | None = None  # the level its logger's prefix gave (debug, info, warning, error, fatal), if any

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"


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
