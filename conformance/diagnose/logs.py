"""A failed job's logs, line by line, each line with the process that wrote it as far as the logs tell.

Input is what people have after a job failed: files or folders of torchrun's output, SLURM's
``slurm-<job>.out``, ``NCCL_DEBUG_FILE`` files, elastic error files, this suite's run folders.
Nothing is loaded whole: files are read a line at a time, and a line is cut at :data:`MAX_LINE`.

Who wrote a line comes from, in order:

* its own prefixes, stacked in any order: torch's ``[rank3]:`` (the global rank, torch >= 2.2,
  torch/csrc/distributed/c10d/logging.h), torchrun's ``[default3]:`` (``--tee``/``--log-dir``:
  role and local rank, torch/distributed/elastic/multiprocessing/api.py), srun ``--label``'s ``3:``
  (the task id), Open MPI ``--tag-output``'s ``[1,3]<stderr>:`` (job, rank);
* the file's path: ``rank3``/``rank_3``/``rank-3`` in any part, torchrun ``--log-dir``'s
  ``attempt_0/3/stderr.log`` (local rank 3);
* NCCL's ``host:pid:tid [dev]`` prefix: the pid's rank is resolved later from its init line
  (:mod:`conformance.diagnose.evidence`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from conformance.verdict.nccl_log import MAX_LINE

SNIFF_BYTES = 8192  # read to decide whether a file is text
LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".json", ".stderr", ".stdout")
MAX_FILES = 10_000  # a folder with more is refused rather than read for hours


class UnusableInput(Exception):
    """Input that cannot be read as logs; the message names the path and why (exit status 2)."""


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


_PREFIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\[rank(\d{1,7})\]:\s?"), "rank"),
    (re.compile(r"\[[A-Za-z_]{1,40}?(\d{1,5})\]:\s?"), "local_rank"),  # torchrun: [default3]: or [trainer3]:
    (re.compile(r"\[\d{1,7},(\d{1,7})\]<std(?:out|err)>:\s?"), "rank"),
    (re.compile(r"\s{0,4}(\d{1,5}): "), "task"),
)
_PATH_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,7})(?:$|[^0-9])", re.IGNORECASE)
_TORCHRUN_LOCAL = re.compile(r"attempt_\d+$")


def strip_prefixes(line: str, who: Who) -> tuple[str, Who]:
    """The line without its leading writer prefixes, and ``who`` with what they said."""
    found: dict[str, int] = {}
    progress = True
    while progress:
        progress = False
        for pattern, field_name in _PREFIXES:
            m = pattern.match(line)
            if m and field_name not in found:
                found[field_name] = int(m.group(1))
                line = line[m.end() :]
                progress = True
    return line, replace(who, **found) if found else who  # type: ignore[arg-type]


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


def _is_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 4  # a character cut at the end of the sniffed bytes
    return True


def read_lines(path: Path, who: Who | None = None) -> Iterator[LogLine]:
    """Every line of one text file with its writer; a binary file raises :class:`UnusableInput`."""
    base = who_from_path(path).merged(who or Who())
    with path.open("rb") as stream:
        if not _is_text(stream.read(SNIFF_BYTES)):
            raise UnusableInput(f"{path}: a binary file, not a log")
        stream.seek(0)
        for number, raw in enumerate(stream, start=1):
            text = raw[:MAX_LINE].decode("utf-8", errors="replace").rstrip("\r\n")
            stripped, line_who = strip_prefixes(text, base)
            yield LogLine(str(path), number, stripped, line_who)


def log_files(paths: list[Path]) -> list[Path]:
    """The files to read under ``paths`` (a folder: its text logs, recursively); bad paths raise."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UnusableInput(f"{path}: no such file or folder")
        if path.is_file():
            found.append(path)
            continue
        inside = sorted(
            Path(root) / name
            for root, _, names in os.walk(path)
            for name in names
            if name.endswith(LOG_SUFFIXES) or name.startswith("slurm-")
        )
        if not inside:
            raise UnusableInput(f"{path}: a folder with no log files (*.log, *.out, *.err, *.txt, slurm-*)")
        found.extend(inside)
        if len(found) > MAX_FILES:
            raise UnusableInput(f"{path}: more than {MAX_FILES} log files; name the job's own folder")
    return found
