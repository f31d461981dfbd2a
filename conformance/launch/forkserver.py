"""A warm process that has imported torch (never CUDA) and forks rank processes on request.

Started once per pytest process.  Protocol: JSON lines.  The parent writes requests to the
server's stdin; the server answers on its stdout:

    -> {"op": "spawn", "case_dir": "...", "world_size": 2}
    <- {"event": "spawned", "pids": [..], "pgid": N}
    <- {"event": "exit", "pid": P, "code": C, "clock": T}  (C < 0: killed by signal -C; T: CLOCK_MONOTONIC)

Each case's ranks share one new process group (the first rank's pid), so the parent can signal
the whole case with killpg.  The server reaps its children through pidfds and reports every exit.
It dies with its parent (PR_SET_PDEATHSIG), its ranks die with it, and when the parent closes the
pipe it SIGKILLs every case group it started that still runs.

Reaping stays here, on pidfds, rather than with psutil: only a parent can reap its children, and a
pidfd names one process for good (no pid reuse), where polling a pid from outside cannot tell a
zombie's reaping from a new process.  The client logs the server's start and end (logger
``conformance.launch``); each rank's start and exit is logged by ``CaseProcesses``.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import IO

from conformance.common.bounded_parse import NotParsed, json_value
from conformance.common.deadlines import FORKSERVER_READY_WAIT, SPAWN_WAIT
from conformance.common.jsonl import JsonDict
from conformance.common.outside_text import shown
from conformance.launch.signals import signal_group

log = logging.getLogger("conformance.launch")
REPLY_POLL = 0.05  # how long one look for a reply waits before looking again


MESSAGE_BYTES = 1 << 20  # a request or a reply is some hundred bytes; a longer line is no message


def _send(message: JsonDict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def take_messages(buffer: bytes) -> tuple[list[JsonDict], list[str], bytes]:
    """The whole lines of ``buffer`` as messages, what was not a message (in words), and what is left.

    Something else may write on the pipe (a library printing to stdout in the server): such a line is
    skipped and said, never taken for a message, and a line that never ends is dropped once it is
    longer than :data:`MESSAGE_BYTES`.
    """
    messages: list[JsonDict] = []
    skipped: list[str] = []
    *lines, rest = buffer.split(b"\n")
    for line in lines:
        try:
            message = json_value(line)
        except NotParsed as exc:
            skipped.append(f"{line[:80]!r}...: {exc}" if len(line) > 80 else f"{line!r}: {exc}")
            continue
        if isinstance(message, dict):
            messages.append(message)
        else:
            skipped.append(f"{line[:80]!r}: not a message (a JSON object)")
    if len(rest) > MESSAGE_BYTES:
        skipped.append(f"a line of more than {MESSAGE_BYTES} bytes without its end: dropped")
        rest = b""
    return messages, skipped, rest


def _fork_rank(case_dir: Path, rank: int, pgid: int, server_pid: int) -> int:
    pid = os.fork()
    if pid == 0:  # the rank
        try:
            os.closerange(3, 65536)
            from conformance.rank.main import rank_main

            rank_main(case_dir, rank, pgid, server_pid)
        finally:
            os._exit(4)
    try:
        os.setpgid(pid, pgid or pid)  # also done by the child: whichever runs first wins the race
    except OSError:
        pass
    return pid


class Server:
    def __init__(self) -> None:
        self.pidfds: dict[int, int] = {}  # pidfd -> pid
        self.groups: set[int] = set()
        self.pending = b""

    def spawn(self, request: JsonDict) -> None:
        case_dir = Path(request["case_dir"])
        pids: list[int] = []
        pgid = 0
        for rank in range(int(request["world_size"])):
            pid = _fork_rank(case_dir, rank, pgid, os.getpid())
            pgid = pgid or pid
            pids.append(pid)
            self.pidfds[os.pidfd_open(pid)] = pid
        self.groups.add(pgid)
        _send({"event": "spawned", "pids": pids, "pgid": pgid})

    def reap(self, pidfd: int) -> None:
        pid = self.pidfds.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        _send({"event": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status), "clock": time.monotonic()})

    def kill_all(self) -> None:
        for pgid in self.groups:
            signal_group(pgid, signal.SIGKILL, "the forkserver's parent is gone")

    def handle_input(self) -> bool:
        """Read requests; False when the parent closed the pipe."""
        chunk = os.read(0, 65536)
        if not chunk:
            return False
        requests, skipped, self.pending = take_messages(self.pending + chunk)
        for line in skipped:  # the server's log (its stderr) says what it could not take for a request
            print(f"forkserver: not a request, skipped: {shown(line)}", file=sys.stderr, flush=True)
        for request in requests:
            if request.get("op") == "spawn":
                self.spawn(request)
            elif request.get("op") == "stop":
                return False
        return True

    def serve(self) -> None:
        while True:
            readable, _, _ = select.select([0, *self.pidfds], [], [])
            for fd in readable:
                if fd == 0:
                    if not self.handle_input():
                        self.kill_all()
                        # Nothing is left to flush or clean up; tearing down torch's modules takes ~0.5 s.
                        os._exit(0)
                else:
                    self.reap(fd)


def _preload() -> JsonDict:
    """Import here, once, what every rank needs: torch (never CUDA) and the rank's own modules.

    Imported in each forked rank instead, the rank's modules cost about 40 ms of CPU per rank.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import torch.distributed as dist

        import conformance.rank.main
        import conformance.rank.probes  # noqa: F401
    return {"torch": torch.__version__, "distributed": dist.is_available()}


def main() -> None:
    parent = int(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from conformance.rank.flight_recorder import block_dump_signal
    from conformance.rank.main import die_with_parent

    block_dump_signal()  # ranks inherit the mask, so a dump request can never kill one

    die_with_parent(parent)
    versions = _preload()
    # The ranks' garbage collector leaves everything imported here alone: a full collection in a
    # rank would write to the page of every inherited object (copy-on-write), about 10,000 page
    # faults and 100 ms of CPU per rank on this torch, against 400 and 5 ms frozen.
    gc.freeze()
    _send({"event": "ready", "pid": os.getpid(), **versions})
    Server().serve()


class ForkServerError(RuntimeError):
    """The forkserver died or answered something unexpected."""


class ForkServerClient:
    """The parent's handle on its forkserver, shared by the threads of cases that run side by side.

    Whichever thread reads the server's output files every message: exits into ``exits``, replies
    into ``_replies`` for the thread that asked (one spawn request is outstanding at a time).
    Start it from a thread that lives as long as the run (the main one): the server's parent-death
    signal follows the thread that started it, not the process.
    """

    def __init__(
        self, log_path: Path, ready_wait: float = FORKSERVER_READY_WAIT, spawn_wait: float = SPAWN_WAIT
    ) -> None:
        """``ready_wait`` and ``spawn_wait``: the run's ``Deadlines``, which count them in every item's waits."""
        self.log_path = log_path
        self.ready_wait = ready_wait
        self.spawn_wait = spawn_wait
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: dict[int, tuple[int, float]] = {}
        self.info: JsonDict = {}
        self._buffer = b""
        self._replies: dict[str, list[JsonDict]] = {}
        self._read_lock = threading.Lock()
        self._request_lock = threading.Lock()

    def launch(self) -> None:
        """Start the server without waiting for it to be ready (it imports torch meanwhile)."""
        with self._request_lock:
            if self.proc is None:
                self._launch()

    def _launch(self) -> None:
        self.info, self._buffer, self._replies = {}, b"", {}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        package_root = str(Path(__file__).resolve().parents[2])  # so -m finds us from any cwd
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        with self.log_path.open("ab") as server_log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "conformance.launch.forkserver", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=server_log,
                env=env,
                start_new_session=True,
            )
        log.info("forkserver started (pid %d); its log: %s", self.proc.pid, self.log_path)
        os.set_blocking(self._stdout().fileno(), False)  # threads that find nothing to read go on

    def _stdout(self) -> IO[bytes]:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout

    def _read_messages(self, timeout: float) -> None:
        """Wait up to ``timeout`` for output and file every whole message read."""
        fd = self._stdout().fileno()
        readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not readable:
            return
        with self._read_lock:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:  # another thread read it first
                return
            if not chunk:
                raise ForkServerError(f"the forkserver exited; its log: {self.log_path}")
            messages, skipped, self._buffer = take_messages(self._buffer + chunk)
            for line in skipped:
                log.warning("forkserver (%s) wrote what is no message, skipped: %s", self.log_path, line)
            for message in messages:
                if message.get("event") == "exit" and {"pid", "code", "clock"} <= message.keys():
                    self.exits[message["pid"]] = (message["code"], message["clock"])
                    log.debug("forkserver reaped pid %d: code %d", message["pid"], message["code"])
                else:
                    self._replies.setdefault(str(message.get("event")), []).append(message)

    def _expect(self, event: str, timeout: float) -> JsonDict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            waiting = self._replies.get(event)
            if waiting:
                return waiting.pop(0)
            self._read_messages(min(REPLY_POLL, deadline - time.monotonic()))
        raise ForkServerError(f"no {event!r} from the forkserver within {timeout:g}s; its log: {self.log_path}")

    def ensure_started(self) -> None:
        """A running server that has said it is ready (started again if it died)."""
        with self._request_lock:
            if self.proc is not None and self.proc.poll() is not None:
                log.info("forkserver (pid %d) exited with %s: starting another", self.proc.pid, self.proc.returncode)
                self.close()
            if self.proc is None:
                self._launch()
            if not self.info:
                self.info = self._expect("ready", self.ready_wait)
                log.info("forkserver (pid %s) ready: torch %s imported", self.info.get("pid"), self.info.get("torch"))

    def spawn(self, case_dir: Path, world_size: int) -> tuple[list[int], int]:
        self.ensure_started()
        with self._request_lock:
            assert self.proc is not None and self.proc.stdin is not None
            request = {"op": "spawn", "case_dir": str(case_dir), "world_size": world_size}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            reply = self._expect("spawned", self.spawn_wait)
        log.debug("forkserver forked pids %s in process group %d for %s", reply["pids"], reply["pgid"], case_dir)
        return reply["pids"], reply["pgid"]

    def wait_events(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for news (rank exits) from the server."""
        self._read_messages(timeout)

    def exit_of(self, pid: int) -> tuple[int, float] | None:
        return self.exits.get(pid)

    def close(self, timeout: float = 5.0) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the server SIGKILLs the case groups it started and exits
            self.proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            log.info("forkserver (pid %d) did not exit within %gs: SIGKILL", self.proc.pid, timeout)
            self.proc.kill()
            self.proc.wait(timeout=timeout)
        log.info("forkserver (pid %d) stopped", self.proc.pid)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


if __name__ == "__main__":
    main()
