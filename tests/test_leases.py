"""Device leases shared by several users of one machine: real files, real processes, two users.

The second user is ``nobody`` (uid/gid 65534), so the tests that need it run only as root.  Its
processes must not depend on anything only root can read (this checkout or its virtual
environment may sit under a private home): they run a Python that user can execute, in isolated
mode, on a copy of ``conformance/launch/leases.py`` (standard library only) in a folder every user
can read.
"""

from __future__ import annotations

import os
import pwd
import queue
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.launch import leases
from conformance.launch.leases import LeaseError, leased

REPO = Path(__file__).resolve().parent.parent
LEASES_SOURCE = REPO / "conformance" / "launch" / "leases.py"

# Takes the leases of argv[3] (comma-separated devices) in folder argv[2], waiting up to argv[4]
# seconds; says WAITING, then HELD <seconds waited>; holds until a line (or EOF) on stdin; then
# RELEASED.  With argv[5] == "gate" it reads one line on stdin before it starts taking.
HOLDER = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import leases

lock_dir, devices, wait = Path(sys.argv[2]), sys.argv[3].split(","), float(sys.argv[4])
if sys.argv[5:] == ["gate"]:
    sys.stdin.readline()
print("WAITING", flush=True)
try:
    with leases.leased(lock_dir, devices, wait) as waited:
        print(f"HELD {waited:.3f}", flush=True)
        sys.stdin.readline()
except leases.LeaseError as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
print("RELEASED", flush=True)
"""


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    python: str

    def popen_args(self) -> dict[str, Any]:
        if self.uid == os.geteuid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}  # no root supplementary groups


class Holder:
    """One holder process, its output lines read as they come."""

    def __init__(self, process: subprocess.Popen[str], user: User) -> None:
        self.process = process
        self.user = user
        self.lines: queue.Queue[str | None] = queue.Queue()  # None: the output ended
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout: float) -> str | None:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            self.lines.put(None)  # ended for every later reader too
            return None
        self.seen.append(line)
        return line

    def expect(self, prefix: str, timeout: float = 10.0) -> str:
        line = self.next_line(timeout)
        assert line is not None and line.startswith(prefix), (
            f"{self.user.name}: expected {prefix!r}, got {line!r} after {self.seen}"
        )
        return line

    def say(self) -> None:
        """Send one line: opens the gate, or releases the leases."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def finish(self, timeout: float = 10.0) -> int:
        if self.process.stdin is not None:
            self.process.stdin.close()
        code = self.process.wait(timeout=timeout)
        while self.next_line(timeout) is not None:
            pass
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.seen)


def _runs_as(python: str, uid: int, gid: int) -> bool:
    try:
        done = subprocess.run(
            [python, "-I", "-c", "pass"], user=uid, group=gid, extra_groups=[], cwd="/",
            env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user can read: the holder program, a copy of the leases module, and tmp/ (01777)."""
    folder = Path(tempfile.mkdtemp(prefix="conformance-lease-test-", dir=tempfile.gettempdir()))
    try:
        folder.chmod(0o755)
        shutil.copy(LEASES_SOURCE, folder / "leases.py")
        (folder / "holder.py").write_text(HOLDER)
        for name in ("leases.py", "holder.py"):
            (folder / name).chmod(0o644)
        (folder / "tmp").mkdir()
        (folder / "tmp").chmod(0o1777)  # where the lease folder goes: like /tmp
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def root() -> User:
    if os.geteuid() != 0:
        pytest.skip("two-user lease tests switch to another user (nobody), which needs root; run them as root")
    return User("root", 0, 0, sys.executable)


@pytest.fixture
def nobody(root: User) -> User:
    try:
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 65534
    candidates = [sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin"), "/usr/bin/python3"]
    for python in dict.fromkeys(c for c in candidates if c):
        if _runs_as(python, uid, gid):
            return User("nobody", uid, gid, python)
    pytest.skip(f"no Python that uid {uid} can run (tried {candidates}); the second user cannot be simulated")


def start(
    shared: Path, user: User, lock_dir: Path, devices: str, wait: float, umask: int = 0o022, gate: bool = False
) -> Holder:
    command = [user.python, "-I", str(shared / "holder.py"), str(shared), str(lock_dir), devices, str(wait)]
    process = subprocess.Popen(
        [*command, *(["gate"] if gate else [])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=shared, env={"PATH": "/usr/bin:/bin", "HOME": str(shared)},
        umask=umask, **user.popen_args(),
    )  # fmt: skip
    return Holder(process, user)


def hold_and_release(shared: Path, user: User, lock_dir: Path, devices: str, umask: int = 0o022) -> None:
    holder = start(shared, user, lock_dir, devices, 10, umask=umask)
    holder.expect("WAITING")
    holder.expect("HELD")
    holder.say()
    holder.expect("RELEASED")
    assert holder.finish() == 0, holder.output


def owner_and_mode(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


def test_folder_made_by_root_under_umask_077_is_used_by_another_user(shared: Path, root: User, nobody: User) -> None:
    lock_dir = shared / "tmp" / "conformance-leases"
    hold_and_release(shared, root, lock_dir, "gpu0", umask=0o077)
    assert owner_and_mode(lock_dir) == (0, 0o1777)
    assert owner_and_mode(lock_dir / "gpu0.lock") == (0, 0o644)
    # nobody takes root's lock file and creates one of its own, under the same strict umask
    hold_and_release(shared, nobody, lock_dir, "gpu0,gpu1", umask=0o077)
    assert owner_and_mode(lock_dir / "gpu1.lock") == (nobody.uid, 0o644)
    # and root takes nobody's
    hold_and_release(shared, root, lock_dir, "gpu1", umask=0o077)


@pytest.mark.parametrize("first_is_root", [True, False], ids=["root_first", "nobody_first"])
def test_a_lease_is_exclusive_across_users(shared: Path, root: User, nobody: User, first_is_root: bool) -> None:
    """The lock file is created by the first user; the second waits for it and gets it once released."""
    first, second = (root, nobody) if first_is_root else (nobody, root)
    lock_dir = shared / "tmp" / "conformance-leases"
    holder = start(shared, first, lock_dir, "GPU-1234:0", 30, umask=0o077)
    holder.expect("WAITING")
    holder.expect("HELD")
    assert owner_and_mode(lock_dir / "GPU-1234_0.lock") == (first.uid, 0o644)
    waiter = start(shared, second, lock_dir, "GPU-1234:0", 30, umask=0o077)
    waiter.expect("WAITING")
    assert waiter.next_line(1.0) is None, f"{second.name} took a lease {first.name} holds: {waiter.output}"
    released = time.monotonic()
    holder.say()
    holder.expect("RELEASED")
    waited = float(waiter.expect("HELD", timeout=5).split()[1])
    assert time.monotonic() - released < 2.0, "the waiter took more than 2 s to notice the release"
    assert waited >= 0.8, f"{second.name} says it waited only {waited} s"
    waiter.say()
    waiter.expect("RELEASED")
    assert holder.finish() == 0 and waiter.finish() == 0, holder.output + "\n" + waiter.output


def test_the_wait_for_another_users_lease_is_bounded(shared: Path, root: User, nobody: User) -> None:
    lock_dir = shared / "tmp" / "conformance-leases"
    holder = start(shared, root, lock_dir, "gpu3", 30)
    holder.expect("WAITING")
    holder.expect("HELD")
    begun = time.monotonic()
    waiter = start(shared, nobody, lock_dir, "gpu3", 0.3)
    waiter.expect("WAITING")
    line = waiter.expect("LeaseTimeout:")
    assert time.monotonic() - begun < 5.0
    assert f"{lock_dir / 'gpu3.lock'} still held by another case" in line
    assert waiter.finish() == 3
    holder.say()
    assert holder.finish() == 0


def test_processes_of_two_users_racing_to_create_the_folder_all_get_their_leases(
    shared: Path, root: User, nobody: User
) -> None:
    lock_dir = shared / "tmp" / "conformance-leases"
    holders = [
        start(shared, user, lock_dir, f"gpu{i}", 10, umask=0o077, gate=True)
        for i, user in enumerate([root, nobody] * 4)
    ]  # fmt: skip
    time.sleep(0.3)  # every interpreter has started and waits at its gate
    for holder in holders:
        holder.say()
    for holder in holders:
        holder.expect("WAITING")
        holder.expect("HELD")  # disjoint devices: all at once
    for holder in holders:
        holder.say()
        holder.expect("RELEASED")
        assert holder.finish() == 0, holder.output
    assert owner_and_mode(lock_dir)[1] == 0o1777
    assert {owner_and_mode(lock_dir / f"gpu{i}.lock")[1] for i in range(8)} == {0o644}


@pytest.mark.parametrize("layout", ["folder_0755", "parent_0700"])
def test_a_folder_another_user_cannot_use_is_a_clear_error(shared: Path, root: User, nobody: User, layout: str) -> None:
    if layout == "folder_0755":  # as older versions left it under root's umask 022
        lock_dir = shared / "tmp" / "conformance-leases"
        lock_dir.mkdir()
        lock_dir.chmod(0o755)
        why = "it is owned by uid 0 with mode 0755, so this user cannot create lock files in it"
    else:
        (shared / "private").mkdir()
        (shared / "private").chmod(0o700)
        lock_dir = shared / "private" / "conformance-leases"
        why = "it cannot be created (Permission denied)"
    waiter = start(shared, nobody, lock_dir, "gpu0", 5)
    waiter.expect("WAITING")
    line = waiter.expect("LeaseError:")
    assert waiter.finish() == 3
    assert "Traceback" not in waiter.output
    assert f"device lease folder {lock_dir} cannot be used by uid {nobody.uid}: {why}" in line
    assert f"'chmod 1777 {lock_dir}'" in line


def test_an_existing_lock_file_is_taken_read_only_in_a_folder_the_user_cannot_write(
    shared: Path, root: User, nobody: User
) -> None:
    lock_dir = shared / "tmp" / "conformance-leases"
    lock_dir.mkdir()
    lock_dir.chmod(0o755)
    (lock_dir / "gpu0.lock").touch()
    (lock_dir / "gpu0.lock").chmod(0o644)
    hold_and_release(shared, nobody, lock_dir, "gpu0")
    waiter = start(shared, nobody, lock_dir, "gpu0,gpu1", 5)
    waiter.expect("WAITING")
    line = waiter.expect("LeaseError:")
    assert "and the lock file gpu1.lock is missing" in line
    assert waiter.finish() == 3


def test_a_lock_file_another_user_cannot_read_is_a_clear_error(shared: Path, root: User, nobody: User) -> None:
    lock_dir = shared / "tmp" / "conformance-leases"
    hold_and_release(shared, root, lock_dir, "gpu0")
    (lock_dir / "gpu0.lock").chmod(0o600)  # as older versions left it under umask 077
    waiter = start(shared, nobody, lock_dir, "gpu0", 5)
    waiter.expect("WAITING")
    line = waiter.expect("LeaseError:")
    assert f"device lock file {lock_dir / 'gpu0.lock'} cannot be opened by uid {nobody.uid}" in line
    assert f"'chmod 644 {lock_dir / 'gpu0.lock'}'" in line
    assert waiter.finish() == 3
    hold_and_release(shared, root, lock_dir, "gpu0")  # its owner takes it and shares it again
    assert owner_and_mode(lock_dir / "gpu0.lock") == (0, 0o644)
    hold_and_release(shared, nobody, lock_dir, "gpu0")


# In-process checks: need no second user.


def test_a_path_that_is_not_a_directory_is_a_clear_error(tmp_path: Path) -> None:
    lock_dir = tmp_path / "conformance-leases"
    lock_dir.write_text("")
    with pytest.raises(LeaseError, match="not a directory") as raised, leased(lock_dir, ["gpu0"], 1):
        pass
    assert str(lock_dir) in str(raised.value) and "chmod 1777" in str(raised.value)


def test_the_folder_and_lock_files_are_shared_whatever_the_umask(tmp_path: Path) -> None:
    lock_dir = tmp_path / "conformance-leases"
    old = os.umask(0o077)
    try:
        with leased(lock_dir, ["gpu0"], 1) as waited:
            assert waited < 1
    finally:
        os.umask(old)
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o1777
    assert stat.S_IMODE((lock_dir / "gpu0.lock").stat().st_mode) == 0o644


def test_a_folder_and_lock_file_of_ours_left_private_are_shared_again(tmp_path: Path) -> None:
    lock_dir = tmp_path / "conformance-leases"
    lock_dir.mkdir(mode=0o700)
    (lock_dir / "gpu0.lock").touch(mode=0o600)
    (lock_dir / "gpu0.lock").chmod(0o600)
    with leased(lock_dir, ["gpu0"], 1):
        pass
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o1777
    assert stat.S_IMODE((lock_dir / "gpu0.lock").stat().st_mode) == 0o644


def test_an_existing_lock_file_is_opened_without_o_creat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fs.protected_regular refuses O_CREAT opens of another user's file in a sticky folder.

    It cannot be switched on here (a system setting), so the flags are checked instead.
    """
    lock_dir = tmp_path / "conformance-leases"
    real_open = os.open
    opened: list[tuple[str, int]] = []

    def recording_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".lock"):  # os.open is patched for everyone: keep only the lock files
            opened.append((os.path.basename(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    with leased(lock_dir, ["gpu0"], 1):
        pass
    assert [name for name, flags in opened if flags & os.O_CREAT] == ["gpu0.lock"]
    assert all(flags & os.O_EXCL for _, flags in opened if flags & os.O_CREAT)
    opened.clear()
    with leased(lock_dir, ["gpu0"], 1):
        pass
    assert opened and not any(flags & os.O_CREAT for _, flags in opened)
    assert all(flags & os.O_ACCMODE == os.O_RDONLY for _, flags in opened)


def test_losing_the_race_to_create_a_lock_file_opens_the_winners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between our open without O_CREAT (missing) and our O_EXCL create, another process creates it."""
    lock_dir = tmp_path / "conformance-leases"
    real_open = os.open
    calls = 0

    def racing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        nonlocal calls
        if os.path.basename(path) == "gpu0.lock":
            calls += 1
            if calls == 2:  # our O_EXCL create: the other process got there first
                os.close(real_open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    with leased(lock_dir, ["gpu0"], 1):
        pass
    assert calls == 3  # missing, EEXIST, then opened the winner's file


def test_disjoint_devices_are_held_side_by_side_and_the_same_device_waits(tmp_path: Path) -> None:
    lock_dir = tmp_path / "conformance-leases"
    with leased(lock_dir, ["gpu0"], 1), leased(lock_dir, ["gpu1"], 1) as waited:
        assert waited < 0.5
        with pytest.raises(leases.LeaseTimeout), leased(lock_dir, ["gpu1", "gpu0"], 0.2):
            pass
