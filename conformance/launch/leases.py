"""Per-device leases: file locks that keep two cases off the same GPU at the same time.

xdist workers (and separate pytest runs on one machine) take the locks of a case's devices in
sorted order, which cannot deadlock, and hold them while the case's ranks live.  Cases on
disjoint devices run side by side.  A lock dies with its holder, so a killed run leaves none.

Several users share one machine's leases (``<tempdir>/conformance-leases``):

* the folder is made world-writable and sticky (01777, like ``/tmp``) with an explicit chmod,
  whatever the creator's umask;
* a lock is an ``flock`` on a descriptor opened read-only (``flock`` needs no write access), so
  anyone can take a lock file that another user created;
* an existing lock file is opened without ``O_CREAT``: Linux ``fs.protected_regular`` refuses
  ``O_CREAT`` opens of another user's file in a world-writable sticky folder.  A missing one is
  created with ``O_CREAT | O_EXCL`` and made readable by all (0644) with an explicit fchmod.

Leases taken, waited for, given up on and released are logged (logger ``conformance.launch``).
This module uses the standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("conformance.launch")
POLL_SECONDS = 0.05
DIR_MODE = 0o1777  # anyone may create lock files; only a file's owner may delete it (sticky)
LOCK_MODE = 0o644  # anyone may open it read-only, which is all flock needs
# Another process may be between its mkdir and its chmod of the folder: how long to let it finish.
SETTLE_SECONDS = 1.0
_NOT_PERMITTED = (errno.EACCES, errno.EPERM, errno.EROFS)


class LeaseError(RuntimeError):
    """The lease folder or a lock file cannot be used by this user; the message says what to do."""


class LeaseTimeout(LeaseError):
    """A device stayed leased to another case for longer than the wait allowed."""


def _lock_name(device_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", device_id) + ".lock"


def _user() -> str:
    return f"uid {os.geteuid()}"


def _folder_advice(lock_dir: Path) -> str:
    return (
        f"the owner of {lock_dir} (or root) can let every user take leases with 'chmod 1777 {lock_dir}', "
        "or remove it so that the next run creates it shared"
    )


def _unusable_folder(lock_dir: Path, why: str) -> LeaseError:
    return LeaseError(f"device lease folder {lock_dir} cannot be used by {_user()}: {why}; {_folder_advice(lock_dir)}")


def _make_folder(lock_dir: Path) -> None:
    """Create ``lock_dir`` with mode 01777, whatever the umask; losing the race to another process is fine."""
    try:
        lock_dir.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(lock_dir, 0o700)  # private until the chmod below opens it to everyone
    except FileExistsError:
        return  # made by another process (which chmods it) or there before: checked by the caller
    except OSError as exc:
        raise _unusable_folder(lock_dir, f"it cannot be created ({exc.strerror})") from exc
    os.chmod(lock_dir, DIR_MODE)


def _usable(lock_dir: Path) -> tuple[str | None, bool]:
    """Why this user cannot create lock files in ``lock_dir`` (None: it can), and whether that may pass.

    It may pass while the folder is private to another user, as another process's mkdir leaves it
    until that process's chmod.
    """
    try:
        info = os.stat(lock_dir)
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})", False
    if not stat.S_ISDIR(info.st_mode):
        raise _unusable_folder(lock_dir, "it is not a directory")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == os.geteuid() and mode != DIR_MODE and not os.path.islink(lock_dir):
        try:  # ours (made by an older version, or under a umask): share it
            os.chmod(lock_dir, DIR_MODE)
            mode = DIR_MODE
        except OSError:
            pass
    if os.access(lock_dir, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return None, False
    problem = f"it is owned by uid {info.st_uid} with mode {mode:04o}, so this user cannot create lock files in it"
    return problem, mode & 0o077 == 0


def prepare_folder(lock_dir: Path) -> str | None:
    """Make sure ``lock_dir`` exists, shared by every user; return why it is not usable (None: it is).

    Not usable is not yet fatal: lock files already in the folder can still be taken read-only.
    A path that is not a directory raises LeaseError.
    """
    if not os.path.lexists(lock_dir):
        _make_folder(lock_dir)
    deadline = time.monotonic() + SETTLE_SECONDS
    problem, settling = _usable(lock_dir)
    while problem is not None and settling and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)  # another process made it a moment ago and is about to chmod it
        problem, settling = _usable(lock_dir)
    return problem


def _share(fd: int) -> None:
    """Let every user open a lock file this user owns (it may predate the shared mode)."""
    info = os.fstat(fd)
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & LOCK_MODE != LOCK_MODE:
        os.fchmod(fd, LOCK_MODE)


def _open_existing(path: Path) -> int | None:
    """A read-only descriptor of the lock file at ``path``; None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # no O_CREAT: fs.protected_regular
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise _unusable_folder(path.parent, "it is not a directory") from exc
        if exc.errno in _NOT_PERMITTED:
            raise LeaseError(
                f"device lock file {path} cannot be opened by {_user()} ({exc.strerror}); its owner (or root) "
                f"can let every user take it with 'chmod 644 {path}', or remove it"
            ) from exc
        raise
    _share(fd)
    return fd


def _create(path: Path) -> int | None:
    """Create the lock file at ``path`` (0644 whatever the umask); None when another process did first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, LOCK_MODE)
    except FileExistsError:
        return None
    except OSError as exc:
        if exc.errno in _NOT_PERMITTED:
            raise _unusable_folder(path.parent, f"creating {path.name} failed ({exc.strerror})") from exc
        raise
    os.fchmod(fd, LOCK_MODE)  # the umask may have taken bits away
    return fd


def _open_lock(path: Path, folder_problem: str | None) -> int:
    """A read-only descriptor of the lock file at ``path``, created if missing."""
    while True:
        fd = _open_existing(path)
        if fd is not None:
            return fd
        if folder_problem is not None:
            raise _unusable_folder(path.parent, f"{folder_problem}, and the lock file {path.name} is missing")
        fd = _create(path)
        if fd is not None:
            return fd
        # another process created it between our two opens: open theirs


def _take(path: Path, deadline: float, folder_problem: str | None = None) -> int:
    fd = _open_lock(path, folder_problem)
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        if time.monotonic() > deadline:
            os.close(fd)
            log.info("device lease %s: still held by another case; giving up (pid %d)", path, os.getpid())
            raise LeaseTimeout(f"device lease {path} still held by another case")
        if not waiting:
            waiting = True
            left = max(0.0, deadline - time.monotonic())
            log.info("device lease %s: held by another case; waiting up to %.1fs (pid %d)", path, left, os.getpid())
        time.sleep(POLL_SECONDS)


@contextmanager
def leased(lock_dir: Path | None, device_ids: Sequence[str], wait_seconds: float) -> Iterator[float]:
    """Hold every device's lock; yields how long the wait for them took."""
    if lock_dir is None:
        yield 0.0
        return
    folder_problem = prepare_folder(lock_dir)
    begun = time.monotonic()
    deadline = begun + wait_seconds
    fds: list[int] = []
    devices = ", ".join(sorted(set(device_ids)))
    try:
        for device_id in sorted(set(device_ids)):
            fds.append(_take(lock_dir / _lock_name(device_id), deadline, folder_problem))
        waited = time.monotonic() - begun
        log.info("device leases taken: %s in %s after %.2fs (pid %d)", devices, lock_dir, waited, os.getpid())
        yield waited
    finally:
        for fd in fds:
            os.close(fd)  # closing releases the lock
        if fds:
            log.info("device leases released: %s (pid %d)", devices, os.getpid())
