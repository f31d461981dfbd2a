"""JSON Lines, the one way: append a line under a lock and fsync it; read back every whole line.

Writers are several processes (xdist workers, nodes); a lock keeps their lines whole and fsync
keeps a line written before a kill.  A reader skips what is not whole (a line cut off by a kill,
a line that is not an object, a line nested deeper than ``bounded_parse`` reads) and says which
lines it skipped; what to do with that is the caller's policy.  Every read is bounded in size
(``RUN_FILE_BYTES``) and every line in depth (``bounded_parse.json_value``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import NotParsed, TooDeep, json_value
from conformance.common.inputs import RUN_FILE_BYTES, NotReadable, read_bounded, read_part

# A JSON object as read, or about to be written (a file, a pipe, the run store): a boundary, not a contract.
JsonDict = dict[str, Any]


class JsonlError(OSError):
    """The file exists but cannot be read."""


@dataclass
class JsonLines:
    objects: list[JsonDict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "line 3 is not whole JSON (cut off?)", ...
    numbers: list[int] = field(default_factory=list)  # the line number of each object, for messages about it


def append_line(path: Path, record: JsonDict, durable: bool = True) -> None:
    """Append one line whole; ``durable``: fsync it (a line that may be lost in a crash passes False)."""
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            _write_all(fd, line)
            if durable:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):  # no torn line left for a reader: the file as it was
                os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)  # closing releases the lock


def _write_all(fd: int, data: bytes) -> None:
    """Every byte, or OSError: ``os.write`` may write less than asked (a full disk, a signal)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


class JsonlFollower:
    """Reads a file that others append to, each call only the whole lines added since the last.

    At most ``limit`` bytes a call, and a line longer than that is skipped whole (named in ``skipped``), so
    a writer that never ends its line cannot hold the reader's memory or stop it for good.
    """

    def __init__(self, path: Path, limit: int = RUN_FILE_BYTES) -> None:
        self.path = path
        self.offset = 0
        self.limit = limit
        self.skipped: list[str] = []  # what was skipped and not yet taken, "line 3 is ...", for the caller to name
        self._lines_read = 0
        self._in_long_line = False  # skipping the rest of a line longer than ``limit``

    def new_objects(self) -> list[JsonDict]:
        try:
            chunk = read_part(self.path, self.offset, self.limit)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise JsonlError(f"{self.path}: cannot be read: {exc.strerror or exc}") from None
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next call
        if not end:
            self._skip_long_line(len(chunk))
            return []
        whole, self.offset = chunk[:end], self.offset + end
        if self._in_long_line:  # the end of a line skipped already
            self._in_long_line, whole = False, whole[whole.find(b"\n") + 1 :]
            self._lines_read += 1
        read = parse_lines(whole.decode("utf-8", errors="replace").split("\n"), self._lines_read)
        self._lines_read += whole.count(b"\n")
        self.skipped += read.skipped
        return read.objects

    def take_skipped(self) -> list[str]:
        """What was skipped since the last call, each once."""
        taken, self.skipped = self.skipped, []
        return taken

    def _skip_long_line(self, size: int) -> None:
        if size < self.limit:
            return
        if not self._in_long_line:
            self.skipped.append(f"line {self._lines_read + 1} is longer than {self.limit} bytes")
        self._in_long_line, self.offset = True, self.offset + size


def read_lines(path: Path, missing_ok: bool = True) -> JsonLines:
    """Every whole JSON object of the file; a missing file is empty when ``missing_ok``."""
    try:
        text = read_bounded(path, RUN_FILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        if missing_ok:
            return JsonLines()
        raise JsonlError(f"{path}: cannot be read: no such file") from None
    except NotReadable as exc:
        raise JsonlError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JsonlError(f"{path}: cannot be read: {exc}") from None
    return parse_lines(text.split("\n"))


def parse_lines(lines: list[str], before: int = 0) -> JsonLines:
    """The objects of JSON lines (numbered from ``before`` + 1) and why each other line was skipped."""
    read = JsonLines()
    for number, line in enumerate(lines, start=before + 1):
        if not line.strip():
            continue
        try:
            value = json_value(line)
        except TooDeep as exc:
            read.skipped.append(f"line {number} is {exc}")
            continue
        except NotParsed:
            read.skipped.append(f"line {number} is not whole JSON (cut off?)")
            continue
        if isinstance(value, dict):
            read.objects.append(value)
            read.numbers.append(number)
        else:
            read.skipped.append(f"line {number} is not a record")
    return read
