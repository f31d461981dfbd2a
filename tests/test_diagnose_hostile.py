"""``conformance diagnose`` on hostile input: a job's folder and log are written by any user's code.

Escape sequences and bidi overrides are shown, never acted on; a forged answer line stays a quoted
line under the real answer; a FIFO, socket or device file is named and skipped, never opened; a link
loop is named and the other files still read; a link out of the folder given is named, never read,
and a file swapped for one after the walk is not read either; folders 1,500 deep are named below
the 64th, never a traceback; a line of any length is read in bounded memory.
Each test runs diagnose as a user does, in a process of its own, with a bound on its time.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import diagnose_peak

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
OOM = "[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
RUN_LIMIT = 120  # seconds: diagnose of a few lines takes one; a FIFO opened for reading would block forever
LONG_LINE_MB = 300
# The interpreter and the package's imports (about 40 MB here), two blocks of the file and the bounded evidence: a
# 300 MB line without a newline must not show in the peak (it took 600 MB before reads were bounded).
MEMORY_LIMIT_MB = 100


def run_diagnose(*args: str, timeout: float = RUN_LIMIT) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "conformance", "diagnose", *args], capture_output=True, timeout=timeout, check=False
    )


def test_escape_sequences_and_bidi_overrides_are_shown_not_acted_on(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(
        b"[rank0]:step 1 \x1b]0;pwned\x07 title \x1b]52;c;ZXZpbA==\x07 clipboard\n"
        b"[rank0]:ERROR \x1b[2J\x1b[H cleared \x08\x08 \xe2\x80\xaetxt.exe\xe2\x80\xac\n" + OOM.encode() + b"\n"
    )

    done = run_diagnose(str(log))

    out = done.stdout.decode()
    assert done.returncode == 1 and out.startswith("OUT OF MEMORY on rank 1"), out
    assert RAW.search(out.replace("\n", "")) is None
    assert "\\x1b]52;c;ZXZpbA==\\x07" not in out or "\\x1b" in out  # shown escaped wherever it is quoted


def test_a_forged_answer_line_stays_a_quoted_line(tmp_path: Path) -> None:
    """A line that erases the line above and prints 'no failure found' after a carriage return.

    The real answer comes first, the exception is quoted escaped, and no line of the output reads 'no failure'.
    """
    forged = "\x1b[1A\x1b[2K\rno failure found: the job ended normally (1 file, 1 lines read)"
    log = tmp_path / "job.log"
    log.write_text(f'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: {forged}\n')

    done = run_diagnose(str(log))

    lines = done.stdout.decode().splitlines()
    assert done.returncode == 1
    assert lines[0] == "ERROR IN ONE RANK on the process writing " + str(log)
    assert not any(line.startswith("no failure") for line in lines)
    assert any("ValueError: \\x1b[1A\\x1b[2K" in line for line in lines), lines  # the exception, quoted escaped


def test_a_file_name_is_outside_text_too(tmp_path: Path) -> None:
    (tmp_path / "job\x1b]0;pwned\x07.log").write_text(OOM + "\n")

    done = run_diagnose(str(tmp_path))

    out = done.stdout.decode()
    assert done.returncode == 1 and "job\\x1b]0;pwned\\x07.log" in out and RAW.search(out.replace("\n", "")) is None


def test_a_fifo_a_socket_and_a_device_in_a_job_folder_are_named_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "job.log").write_text(OOM + "\n")
    os.mkfifo(tmp_path / "pipe.log")  # opened for reading, it would block until someone writes
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "agent.sock.log"))
    (tmp_path / "zero.log").symlink_to("/dev/zero")  # read, it would never end
    try:
        done = run_diagnose(str(tmp_path))
    finally:
        server.close()

    out = done.stdout.decode()
    assert done.returncode == 1 and out.startswith("OUT OF MEMORY on rank 1"), out
    assert f"not read: {tmp_path / 'pipe.log'}: a FIFO (named pipe): not opened" in out
    assert f"not read: {tmp_path / 'agent.sock.log'}: a socket: not opened" in out
    assert f"not read: {tmp_path / 'zero.log'}: a device file: not opened" in out


def test_a_fifo_named_alone_is_refused_in_one_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.log")

    done = run_diagnose(str(tmp_path / "pipe.log"))

    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().strip().endswith(f"{tmp_path / 'pipe.log'}: a FIFO (named pipe): not opened")


def test_link_loops_are_named_and_the_other_files_read(tmp_path: Path) -> None:
    (tmp_path / "job.log").write_text(OOM + "\n")
    (tmp_path / "loop.log").symlink_to("loop.log")
    (tmp_path / "again").symlink_to(".")  # a folder link back to its own folder: walked, it never ends

    done = run_diagnose(str(tmp_path))

    out = done.stdout.decode()
    assert done.returncode == 1 and out.startswith("OUT OF MEMORY on rank 1"), out
    assert f"not read: {tmp_path / 'loop.log'}: a symbolic link loop" in out
    assert f"not read: {tmp_path / 'again'}: a link to a folder: not followed" in out


@pytest.mark.slow
def test_a_line_of_any_length_is_read_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    block = b"x" * (1 << 20)
    with log.open("wb") as out:
        out.write(b"[rank0]:progress ")
        for _ in range(LONG_LINE_MB):  # one line of 300 MB, no newline in it
            out.write(block)
        out.write(b"\n" + OOM.encode() + b"\n")
    done, peak_mb = diagnose_peak(log)

    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("OUT OF MEMORY on rank 1")
    assert peak_mb < MEMORY_LIMIT_MB, peak_mb


SECRET = "[rank0]:RuntimeError: the secret line of a file only root may read"


def test_a_link_out_of_the_folder_given_is_named_and_never_read(tmp_path: Path) -> None:
    """An administrator diagnosing a user's job folder reads nothing the user linked in from outside it."""
    secret = tmp_path / "root-only.log"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.log").write_text(OOM + "\n")
    (job / "slurm-1.out").symlink_to(secret)
    (job / "again.log").symlink_to("train.log")  # inside: its target is read where it is, once

    done = run_diagnose(str(job))

    out = done.stdout.decode()
    assert done.returncode == 1 and out.startswith("OUT OF MEMORY on rank 1"), out
    assert "secret line" not in out and "(1 file, 1 lines read)" in out, out
    assert (
        f"not read: {job / 'slurm-1.out'}: a symbolic link out of the folder given (to {secret}): not followed" in out
    )
    assert f"not read: {job / 'again.log'}: a symbolic link: not followed" in out


def test_a_file_swapped_after_the_walk_is_never_read(tmp_path: Path) -> None:
    """Between the walk and the read a file becomes a link, or its folder a link to another: neither is read."""
    from conformance.diagnose.inputs import UnusableInput, log_files, open_regular

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rank0.log").write_text(SECRET + "\n")
    job = tmp_path / "job"
    (job / "ranks").mkdir(parents=True)
    (job / "train.log").write_text(OOM + "\n")
    (job / "ranks" / "rank0.log").write_text("[rank0]:step 1\n")
    found, _ = log_files([job])
    train, rank0 = sorted(found, key=lambda log: str(log.path))[::-1]

    (job / "train.log").unlink()
    (job / "train.log").symlink_to(outside / "rank0.log")
    (job / "ranks").rename(job / "was-ranks")
    (job / "ranks").symlink_to(outside)

    with pytest.raises(UnusableInput, match="replaced by a symbolic link: not followed"):
        open_regular(train)
    with pytest.raises(UnusableInput, match="replaced while the folder was read"):
        open_regular(rank0)


def make_deep_folders(top: Path, levels: int, log: str) -> None:
    """``levels`` folders one in another under ``top`` (made through folder handles: the path outgrows PATH_MAX)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("deepest.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as out:
            out.write(log + "\n")
    finally:
        os.close(fd)


def remove_deep_folders(top: Path) -> None:
    """Bottom up, without recursion (shutil.rmtree recurses once per level)."""
    fds = [os.open(top, os.O_RDONLY)]
    while True:
        try:
            fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
        except FileNotFoundError:
            break
    os.unlink("deepest.log", dir_fd=fds[-1])
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir("d", dir_fd=fds[-1])
    os.close(fds.pop())


DEEP_FOLDERS = 1500


@pytest.mark.parametrize("with_a_log_on_top", [True, False])
def test_a_folder_1500_deep_is_named_never_a_traceback(tmp_path: Path, with_a_log_on_top: bool) -> None:
    """Folders below the 64th are named, not read: the answer comes from the rest, or one line and exit 2."""
    job = tmp_path / "job"
    make_deep_folders(job, DEEP_FOLDERS, OOM)
    try:
        if with_a_log_on_top:
            (job / "train.log").write_text(OOM + "\n")
        done = run_diagnose(str(job))
    finally:
        remove_deep_folders(job)

    out, err = done.stdout.decode(), done.stderr.decode()
    assert "Traceback" not in out + err and "RecursionError" not in out + err
    cut = "/d" * 65 + ": more than 64 folders deep: not read"
    if with_a_log_on_top:
        assert done.returncode == 1 and out.startswith("OUT OF MEMORY on rank 1"), out
        assert f"not read: {job}{cut}" in out, out
    else:
        assert (done.returncode, out) == (2, "") and err.count("\n") == 1, err
        assert err.rstrip("\n").endswith(f"{job}{cut}"), err
