"""Which files ``conformance diagnose`` reads: regular files inside what it was given; the rest named, skipped.

A job folder is written by the job's own code, so it may hold anything: a FIFO (opening it blocks
until someone writes), a socket, a device file (``/dev/zero`` never ends), a link to one of those,
a link loop, a link out of the folder to a file its reader may read and its writer may not (an
administrator diagnosing a user's job), folders nested thousands deep.  Each is skipped with the
reason, the others are still read; a path given on the command line that cannot be read at all is
refused with the reason (exit status 2).

Inside a folder given, no symbolic link is followed: a link to a file is named and its target is
read only where the walk finds it inside the folder; folders are walked without recursion, at most
:data:`MAX_FOLDER_DEPTH` below the one given.  A file is opened without blocking and checked once
open to be the very file the walk found (its device and inode), so a file swapped for a link, a
FIFO or a folder of links between the walk and the read is never read from.  A path named on the
command line is the user's own choice and is followed wherever it points.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from conformance.common import casefiles

LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".json", ".stderr", ".stdout")
SIDE_FILES = (casefiles.PHASES,)  # a rank folder of this suite's cases: read beside the rank's stderr.log
MAX_FILES = 10_000  # a folder with more is refused rather than read for hours
MAX_FOLDER_DEPTH = 64  # a job's logs sit a few folders deep (torchelastic: <run>/attempt_0/<rank>/)


class UnusableInput(Exception):
    """Input that cannot be read as logs; the message names the path and why (exit status 2)."""


@dataclass(frozen=True)
class Skipped:
    """A path that was not read, and why (shown to the user: the path is outside text)."""

    path: str
    why: str


@dataclass(frozen=True)
class LogFile:
    """A file to read: where it is, and for one found in a folder, the file it was there (device, inode)."""

    path: Path
    found: tuple[int, int] | None = None  # None: named on the command line, read wherever it points


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe): not opened"
    if stat.S_ISSOCK(mode):
        return "a socket: not opened"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file: not opened"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file: not opened"


def _why_not(path: Path) -> str | None:
    """Why ``path`` (followed through links) cannot be read as a log; None when it is a regular file."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop"
        if exc.errno == errno.ENOENT and path.is_symlink():
            return "a broken symbolic link"
        return f"cannot be read ({exc.strerror or exc})"
    return _kind(mode)


def open_regular(log: LogFile) -> BinaryIO:
    """The file opened for reading if, once open, it is a regular file and the one the walk found.

    Else :class:`UnusableInput`, and nothing read from it.
    """
    path = log.path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if log.found else 0))
    except OSError as exc:
        why = "replaced by a symbolic link: not followed" if exc.errno == errno.ELOOP and log.found else None
        raise UnusableInput(f"{path}: {why or _why_not(path) or f'cannot be read ({exc.strerror or exc})'}") from exc
    opened = os.fstat(fd)
    why = _kind(opened.st_mode)
    if why is None and log.found is not None and (opened.st_dev, opened.st_ino) != log.found:
        why = "replaced while the folder was read (by a link, or a folder of links?): not read"
    if why is not None:
        os.close(fd)
        raise UnusableInput(f"{path}: {why}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _is_log_name(name: str) -> bool:
    return name.endswith(LOG_SUFFIXES) or name.startswith("slurm-") or name in SIDE_FILES


def _link_why(path: Path, top: str) -> str:
    """Why a symbolic link found in a folder given is not followed, in words."""
    why = _why_not(path)
    if why == "a folder":
        return "a link to a folder: not followed"
    if why is not None:  # a loop, a broken link, a link to a FIFO, a socket or a device
        return why
    target = os.path.realpath(path)
    if os.path.commonpath([target, top]) != top:
        return f"a symbolic link out of the folder given (to {target}): not followed"
    return "a symbolic link: not followed (its target is read where it is, if it is a log)"


class _Walk:
    """The log files under one folder given, in name order, without recursion and without following links."""

    def __init__(self, top: Path, found: list[LogFile], skipped: list[Skipped]) -> None:
        self.top = top
        self.real_top = os.path.realpath(top)
        self.found = found
        self.skipped = skipped

    def run(self) -> None:
        stack = [(self.top, 0)]
        while stack:
            folder, depth = stack.pop()
            if depth > MAX_FOLDER_DEPTH:
                self.skipped.append(Skipped(str(folder), f"more than {MAX_FOLDER_DEPTH} folders deep: not read"))
                continue
            stack += reversed([(sub, depth + 1) for sub in self._entries(folder)])

    def _entries(self, folder: Path) -> list[Path]:
        """Note the files of one folder; return its folders."""
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            self.skipped.append(Skipped(str(folder), f"cannot be listed ({exc.strerror or exc})"))
            return []
        folders = []
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                folders.append(path)
            elif entry.is_symlink():
                if _is_log_name(entry.name) or _why_not(path) in ("a folder", "a symbolic link loop"):
                    self.skipped.append(Skipped(str(path), _link_why(path, self.real_top)))
            elif _is_log_name(entry.name):
                self._file(entry, path)
            if len(self.found) > MAX_FILES:
                raise UnusableInput(f"{self.top}: more than {MAX_FILES} log files; name the job's own folder")
        return folders

    def _file(self, entry: os.DirEntry[str], path: Path) -> None:
        try:
            seen = entry.stat(follow_symlinks=False)
        except OSError as exc:
            self.skipped.append(Skipped(str(path), f"cannot be read ({exc.strerror or exc})"))
            return
        why = _kind(seen.st_mode)
        if why is None:
            self.found.append(LogFile(path, (seen.st_dev, seen.st_ino)))
        else:
            self.skipped.append(Skipped(str(path), why))


def log_files(paths: list[Path]) -> tuple[list[LogFile], list[Skipped]]:
    """The files to read under ``paths`` and the ones skipped with why; a path that gives nothing raises."""
    found: list[LogFile] = []
    skipped: list[Skipped] = []
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise UnusableInput(f"{path}: no such file or folder")
        if path.is_dir():
            before = len(found)
            _Walk(path, found, skipped).run()
            if len(found) == before and not skipped:
                raise UnusableInput(f"{path}: a folder with no log files (*.log, *.out, *.err, *.txt, slurm-*)")
            continue
        why = _why_not(path)
        if why is None:
            found.append(LogFile(path))
        elif len(paths) == 1:
            raise UnusableInput(f"{path}: {why}")
        else:
            skipped.append(Skipped(str(path), why))
    return found, skipped
