"""The health check's own state: the drain it set (``drain-record.json``), and the lock for one check at a time.

Where: ``/var/lib/gpu-conformance/healthcheck-state/`` as root (the FHS's /var/lib: state kept across
reboots, as slurmctld keeps a drain across the node's reboot); else ``$XDG_STATE_HOME/gpu-conformance/
healthcheck-state`` (``~/.local/state`` when unset: the XDG Base Directory spec);
``$CONFORMANCE_HEALTHCHECK_STATE_DIR`` or ``--state-dir`` moves it.  One folder per machine, whatever
``--reports-dir`` says: the node has one drain, so its record and its lock are one too.  Not the
reports folder: people read that one and runs are pruned from it.

The record holds the node's name and the exact reason this check drained it with, and nothing else
resumes a node.  It is trusted only as this user wrote it: the folder and the file owned by this user
and writable by nobody else, the file a regular one (a symlink is not followed), at most
:data:`RECORD_BYTES`, JSON of that shape.  Anything else is unreadable, and a missing or unreadable
record resumes nothing.  It is written whole (a temporary file beside it, fsynced, renamed over it).

The lock is ``fcntl.flock`` on ``healthcheck.lock`` beside the record, held from before the suite
starts until after the drain or the resume; a second check waits a bounded time, then gives up.  The
kernel drops a flock when its holder dies, SIGKILL included: no stale lock is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from conformance.common.bounded_parse import NotParsed, json_value
from conformance.common.files import write_atomic

RECORD_FILE = "drain-record.json"
LOCK_FILE = "healthcheck.lock"
RECORD_BYTES = 4096  # a node's name and a reason of 255 bytes, escaped as JSON, fit many times over
LOCK_POLL_SECONDS = 0.05
STATE_DIR_VARIABLE = "CONFORMANCE_HEALTHCHECK_STATE_DIR"  # --state-dir's default, before the two below
ROOT_STATE_DIR = Path("/var/lib/gpu-conformance/healthcheck-state")


class StateError(Exception):
    """The state folder cannot be used (made, trusted or locked); the message says why."""


class LockBusy(StateError):
    """Another health check of this machine holds the lock."""


@dataclass(frozen=True)
class Unreadable:
    """A record that is there but not to be trusted; nothing is resumed on it."""

    why: str


def default_state_dir(env: Mapping[str, str]) -> Path:
    if env.get(STATE_DIR_VARIABLE):
        return Path(env[STATE_DIR_VARIABLE])
    if os.geteuid() == 0:
        return ROOT_STATE_DIR
    state_home = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "gpu-conformance" / "healthcheck-state"


@dataclass(frozen=True)
class DrainRecord:
    """The state folder: the record of this check's drain, and its lock."""

    folder: Path

    @property
    def record_path(self) -> Path:
        return self.folder / RECORD_FILE

    @contextlib.contextmanager
    def locked(self, wait: float) -> Iterator[None]:
        """Hold the machine's health check lock; LockBusy after ``wait`` seconds, StateError for a folder unfit."""
        self._ensure_folder()
        try:
            fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateError(f"cannot open the lock {self.folder / LOCK_FILE}: {exc.strerror or exc}") from None
        try:
            _flock_within(fd, wait, self.folder / LOCK_FILE)
            with contextlib.suppress(OSError):  # who holds it, for the message of a check that waits
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # closing the only descriptor of the open file releases the flock

    def read(self, node: str) -> bytes | Unreadable | None:
        """The reason this check drained ``node`` with; None where it has no record for it."""
        try:
            fd = os.open(self.record_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return Unreadable(f"{self.record_path}: {exc.strerror or exc}")
        with os.fdopen(fd, "rb") as f:
            problem = _untrusted(os.fstat(fd), "file") or _untrusted(self.folder.stat(), "folder")
            data = f.read(RECORD_BYTES + 1) if problem is None else b""
        if problem is not None:
            return Unreadable(f"{self.record_path}: {problem}")
        if len(data) > RECORD_BYTES:
            return Unreadable(f"{self.record_path}: over {RECORD_BYTES} bytes")
        try:
            value = json_value(data)
        except NotParsed as exc:
            return Unreadable(f"{self.record_path}: {exc}")
        fields = value if isinstance(value, dict) else {}
        if not (isinstance(fields.get("node"), str) and isinstance(fields.get("reason"), str)):
            return Unreadable(f"{self.record_path}: not a record of a drain (node and reason)")
        if fields["node"] != node:
            return None
        reason: str = fields["reason"]
        return reason.encode("ascii") if reason.isascii() else Unreadable(f"{self.record_path}: a reason not ASCII")

    def write(self, node: str, reason: bytes) -> None:
        """Record the drain this check just set, whole; OSError says why it could not."""
        text = json.dumps({"node": node, "reason": reason.decode("ascii")}) + "\n"
        write_atomic(self.record_path, text, 0o600)

    def forget(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.record_path.unlink()

    def _ensure_folder(self) -> None:
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.stat(self.folder, follow_symlinks=False)
        except OSError as exc:
            raise StateError(f"cannot use the state folder {self.folder}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(info.st_mode):
            raise StateError(f"the state folder {self.folder} is a symlink: give --state-dir a folder of its own")
        problem = _untrusted(info, "folder")
        if problem is not None:
            raise StateError(f"the state folder {self.folder}: {problem}: give --state-dir a folder only you can write")


def _untrusted(info: os.stat_result, kind: str) -> str | None:
    """Why a file or folder is not this user's alone (as ssh refuses a key others can write), or None."""
    regular = stat.S_ISREG(info.st_mode) if kind == "file" else stat.S_ISDIR(info.st_mode)
    if not regular:
        return f"not a {'regular file' if kind == 'file' else 'folder'}"
    if info.st_uid != os.geteuid():
        return f"its {kind} is owned by uid {info.st_uid}, not this user's ({os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its {kind} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _flock_within(fd: int, wait: float, path: Path) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockBusy(f"another health check holds {path}{_holder(fd)} (waited {wait:g}s)") from None
            time.sleep(LOCK_POLL_SECONDS)
        except OSError as exc:
            raise StateError(f"cannot lock {path}: {exc.strerror or exc}") from None


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        return f" (pid {int(os.pread(fd, 32, 0).decode('ascii'))})"
    return ""
