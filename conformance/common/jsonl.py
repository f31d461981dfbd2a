"""JSON Lines, the one way: append a line under a lock and fsync it; read back every whole line.

Writers are several processes (xdist workers, nodes); a lock keeps their lines whole and fsync
keeps a line written before a kill.  A reader skips what is not whole (a line cut off by a kill,
a line that is not an object) and says which lines it skipped; what to do with that is the
caller's policy.
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

from conformance.common.inputs import RUN_FILE_BYTES, NotReadable, read_bounded

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
    """Reads a file that others append to, each call only the whole lines added since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_objects(self) -> list[JsonDict]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.offset += len(whole)
        return _objects(whole.decode("utf-8", errors="replace").splitlines(), JsonLines()).objects


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
    return _objects(text.splitlines(), JsonLines())


def _objects(lines: list[str], read: JsonLines) -> JsonLines:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            read.skipped.append(f"line {number} is not whole JSON (cut off?)")
            continue
        if isinstance(value, dict):
            read.objects.append(value)
            read.numbers.append(number)
        else:
            read.skipped.append(f"line {number} is not a record")
    return read
