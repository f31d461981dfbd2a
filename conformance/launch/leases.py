"""Per-device leases: file locks that keep two cases off the same GPU at the same time.

xdist workers (and separate pytest runs on one machine) take the locks of a case's devices in
sorted order, which cannot deadlock, and hold them while the case's ranks live.  Cases on
disjoint devices run side by side.  A lock dies with its holder, so a killed run leaves none.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

POLL_SECONDS = 0.05


class LeaseTimeout(RuntimeError):
    """A device stayed leased to another case for longer than the wait allowed."""


def _lock_name(device_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", device_id) + ".lock"


def _take(path: Path, deadline: float) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
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
            raise LeaseTimeout(f"device lease {path} still held by another case")
        time.sleep(POLL_SECONDS)


@contextmanager
def leased(lock_dir: Path | None, device_ids: Sequence[str], wait_seconds: float) -> Iterator[float]:
    """Hold every device's lock; yields how long the wait for them took."""
    if lock_dir is None:
        yield 0.0
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    begun = time.monotonic()
    deadline = begun + wait_seconds
    fds: list[int] = []
    try:
        for device_id in sorted(set(device_ids)):
            fds.append(_take(lock_dir / _lock_name(device_id), deadline))
        yield time.monotonic() - begun
    finally:
        for fd in fds:
            os.close(fd)  # closing releases the lock
