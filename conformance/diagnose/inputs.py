"""Which files ``conformance diagnose`` reads: regular files only, everything else named and skipped.

A job folder is written by the job's own code, so it may hold anything: a FIFO (opening it blocks
until someone writes), a socket, a device file (``/dev/zero`` never ends), a link to one of those,
a link loop.  Each is skipped with the reason, the others are still read; a path given on the
command line that cannot be read at all is refused with the reason (exit status 2).  Folders are
walked without following links to folders (a loop cannot be entered); a link to a folder is named.
Files are opened without blocking and checked again after opening, so a file swapped for a FIFO
between the walk and the read is still never read from.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".json", ".stderr", ".stdout")
MAX_FILES = 10_000  # a folder with more is refused rather than read for hours


class UnusableInput(Exception):
    """Input that cannot be read as logs; the message names the path and why (exit status 2)."""


@dataclass(frozen=True)
class Skipped:
    """A path that was not read, and why (shown to the user: the path is outside text)."""

    path: str
    why: str


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


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is still a regular file once open (else :class:`UnusableInput`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UnusableInput(f"{path}: {_why_not(path) or f'cannot be read ({exc.strerror or exc})'}") from exc
    why = _kind(os.fstat(fd).st_mode)
    if why is not None:
        os.close(fd)
        raise UnusableInput(f"{path}: {why}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _is_log_name(name: str) -> bool:
    return name.endswith(LOG_SUFFIXES) or name.startswith("slurm-")


def _walk(folder: Path, found: list[Path], skipped: list[Skipped]) -> None:
    """The log files under ``folder``, in name order, links to folders named and not followed."""
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as exc:
        skipped.append(Skipped(str(folder), f"cannot be listed ({exc.strerror or exc})"))
        return
    for entry in entries:
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            _walk(path, found, skipped)
        elif entry.is_symlink() and path.is_dir():
            skipped.append(Skipped(str(path), "a link to a folder: not followed"))
        elif _is_log_name(entry.name) or entry.is_symlink() and _why_not(path) == "a symbolic link loop":
            why = _why_not(path)
            if why is None:
                found.append(path)
            else:
                skipped.append(Skipped(str(path), why))
        if len(found) > MAX_FILES:
            raise UnusableInput(f"{folder}: more than {MAX_FILES} log files; name the job's own folder")


def log_files(paths: list[Path]) -> tuple[list[Path], list[Skipped]]:
    """The files to read under ``paths`` and the ones skipped with why; a path that gives nothing raises."""
    found: list[Path] = []
    skipped: list[Skipped] = []
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise UnusableInput(f"{path}: no such file or folder")
        if path.is_dir():
            before = len(found)
            _walk(path, found, skipped)
            if len(found) == before and not skipped:
                raise UnusableInput(f"{path}: a folder with no log files (*.log, *.out, *.err, *.txt, slurm-*)")
            continue
        why = _why_not(path)
        if why is None:
            found.append(path)
        elif len(paths) == 1:
            raise UnusableInput(f"{path}: {why}")
        else:
            skipped.append(Skipped(str(path), why))
    return found, skipped
