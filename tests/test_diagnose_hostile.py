"""``conformance diagnose`` on hostile input: a job's folder and log are written by any user's code.

Escape sequences and bidi overrides are shown, never acted on; a forged answer line stays a quoted
line under the real answer; a FIFO, socket or device file is named and skipped, never opened; a link
loop is named and the other files still read; a line of any length is read in bounded memory.
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
