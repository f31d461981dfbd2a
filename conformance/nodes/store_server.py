"""Node 0's store server: torch's TCPStore in a process of its own, its memory bounded.

Any client that reaches node 0's port may write to the run's store, token or not (a TCPStore has
no authentication): the run's values are signed, so a stranger cannot fool the run, but it can
fill the store.  The server therefore runs in a child of node 0's pytest whose data may grow by a
bound (``RLIMIT_DATA``, counted from the moment it serves): past the bound the write that would
take more is refused (torch's libuv server answers ``std::bad_alloc`` by closing that client,
``TCPStoreLibUvBackend.cpp`` of torch 2.13) and node 0's pytest, which holds no value of the
store, does not grow.  Node 0 watches the server's growth against what the run itself writes
(:meth:`StoreServer.problem`), so a flood is named and fails the run.

What the run writes: a few MB for the meetings, and each node's records at its end (about 2 KB a
test).  The bound is twice that, raised once the tests are known (:meth:`StoreServer.expect`).
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO

from conformance.common.outside_text import shown

RUN_BYTES_BASE = 32 * 2**20  # what a run writes besides its records: meetings, each case's process group
RUN_BYTES_PER_TEST = 16 * 2**10  # one test on one node: its record (about 2 KB) and its keys, with room
HEADROOM = 2  # the server may grow by twice what the run writes: growth past the run's own is a flood
LOG_BYTES = 2**20  # the server's stderr kept (a stranger can make it warn without end)
STOP_SECONDS = 5.0  # the server's own exit once node 0 closes its stdin, before it is killed
# The server's start (a fresh interpreter importing torch: seconds, more on a loaded machine) has an allowance of
# its own, spent before the rendezvous deadline starts to count: the nodes' deadline is for the nodes, not for this.
START_SECONDS = 120.0
SERVING = b"serving "
CPP_STACK_LINES = ("frame #", "Exception raised from", "<omitting python frames>")  # torch's C++ stack under an error
FULL_LOOK = 1.0  # seconds between looks at the starting server's descriptors
DESCRIPTORS_FULL = 0.9  # the share of its descriptors that the server holding means they are used up


def run_bytes(tests: int, nodes: int) -> int:
    """The most a run of ``tests`` tests on each of ``nodes`` nodes writes to its store."""
    return RUN_BYTES_BASE + RUN_BYTES_PER_TEST * tests * nodes


def mib(count: int) -> str:
    return f"{count / 2**20:.0f} MiB"


class StoreServer:
    """The TCPStore server of node 0, a child process serving on the run's listening socket."""

    def __init__(self, process: subprocess.Popen[bytes], log: IO[bytes], start_data: int) -> None:
        self.process = process
        self.log = log
        self.start_data = start_data  # its data segment in bytes once it served: growth is counted from here
        self.run_bytes = run_bytes(0, 1)  # what the run writes, as far as known (the tests raise it)
        self.most_growth = 0
        self.stopped = False

    @classmethod
    def start(cls, listening: socket.socket, address: str, port: int, allowance: float = START_SECONDS) -> StoreServer:
        """Serve the run's store on ``listening`` (handed over), or RuntimeError in one line saying why not."""
        log = tempfile.TemporaryFile(prefix="conformance-store-")
        command = [sys.executable, "-m", __name__, address, str(port), str(listening.fileno())]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            pass_fds=(listening.fileno(),),
            start_new_session=True,  # a Ctrl-C reaches node 0's pytest, which ends the run and then the server
        )
        listening.close()
        server = cls(process, log, 0)
        line = server._first_line(allowance)
        if line is None or not line.startswith(SERVING):
            full = server.descriptors_full()
            said = full or server.last_words()  # before close(), which closes its log
            server.process.kill()  # not serving: nothing to end gracefully
            server.close()
            late = f"did not start within {allowance:g}s" if line is None else "ended as it started"
            what = "cannot serve" if full else late
            raise RuntimeError(f"its store server {what}: {said}")
        server.start_data = int(line[len(SERVING) :])
        return server

    def _first_line(self, timeout: float) -> bytes | None:
        """The server's first line (b"": it ended first), or None: nothing within ``timeout``, or it cannot serve.

        Looked for each second: a server whose descriptors are used up before it served cannot check in
        with itself, and would only retry until the allowance is spent.
        """
        out = self.process.stdout
        assert out is not None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([out], [], [], min(left, FULL_LOOK))
            if ready:
                return out.readline().strip()
            if self.descriptors_full() is not None:
                return None
        return None

    def expect(self, tests: int, nodes: int) -> None:
        """The run has ``tests`` tests on each of ``nodes`` nodes: the server may grow by twice what they write."""
        self.run_bytes = run_bytes(tests, nodes)
        if self.process.poll() is None:
            limit = self.start_data + HEADROOM * self.run_bytes
            resource.prlimit(self.process.pid, resource.RLIMIT_DATA, (limit, resource.RLIM_INFINITY))

    @property
    def bound_text(self) -> str:
        return (
            f"where this run writes at most {mib(self.run_bytes)} (it may grow by {mib(HEADROOM * self.run_bytes)}: "
            "writes past that are refused)"
        )

    def sample(self) -> None:
        """Note how far the server has grown (node 0's monitor, each round)."""
        data = data_bytes(self.process.pid)
        if data is not None:
            self.most_growth = max(self.most_growth, data - self.start_data)

    def problem(self) -> str | None:
        """A flood of the store, or the server's end during the run; None while it serves only the run."""
        self.sample()
        if self.most_growth > self.run_bytes:
            grown = mib(self.most_growth)
            return f"a client not of this run wrote to node 0's store: it grew by {grown}, {self.bound_text}"
        code = self.process.poll()
        if code is not None and not self.stopped:
            if code < 0:  # killed: what it last wrote is no word of its end
                return f"node 0's store server ended during the run (signal {signal.Signals(-code).name})"
            return f"node 0's store server ended during the run (exit {code}): {self.last_words()}"
        return None

    def last_words(self) -> str:
        """The server's last words on stderr, shown as data (once closed: that it said nothing more).

        The last line that says something: torch follows an error with its C++ stack (``Exception raised
        from ...``, ``frame #N: ...``), which names no cause.
        """
        if self.log.closed:
            return "its log is closed"
        said = os.pread(self.log.fileno(), LOG_BYTES, 0)  # the server writes at the file's offset: left as it is
        lines = [line.strip() for line in said.decode(errors="replace").splitlines() if line.strip()]
        words = [line for line in lines if not line.startswith(CPP_STACK_LINES)]
        return shown(words[-1]) if words else "it said nothing"

    def descriptors_full(self) -> str | None:
        """Why the server cannot take another connection, if its file descriptors are all but used up.

        Each client of the store holds one of the server's descriptors; a client not of this run that
        opens connections and keeps them (idle, or a port scanner's) fills them, and the server's own
        check-in then fails (``EMFILE``) and retries without end.
        """
        try:
            held = len(os.listdir(f"/proc/{self.process.pid}/fd"))
            limit = resource.prlimit(self.process.pid, resource.RLIMIT_NOFILE)[0]
        except (OSError, ValueError):
            return None
        if limit == resource.RLIM_INFINITY or held < limit * DESCRIPTORS_FULL:
            return None
        return (
            f"it holds {held} of the {limit} connections and files its limit allows (RLIMIT_NOFILE): clients not of "
            "this run keep connections to the run's port open"
        )

    def close(self) -> None:
        """Stop serving: the server ends when its stdin closes, or is killed."""
        self.stopped = True
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


def data_bytes(pid: int) -> int | None:
    """A process's data segment (``VmData``: what ``RLIMIT_DATA`` bounds) in bytes; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def serve(address: str, port: int, fd: int) -> None:
    """The child: serve the store on ``fd`` until stdin closes (node 0's pytest ended it, or died)."""
    import torch.distributed as dist

    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)  # a client a descriptor: take all the system allows
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # its stderr past LOG_BYTES: writes fail, it goes on
    resource.setrlimit(resource.RLIMIT_FSIZE, (LOG_BYTES, LOG_BYTES))
    store = dist.TCPStore(address, port, is_master=True, wait_for_workers=False, master_listen_fd=fd)  # type: ignore[attr-defined]
    data = data_bytes(os.getpid()) or 0
    resource.setrlimit(resource.RLIMIT_DATA, (data + HEADROOM * run_bytes(0, 1), resource.RLIM_INFINITY))
    sys.stdout.buffer.write(SERVING + str(data).encode() + b"\n")
    sys.stdout.flush()
    while sys.stdin.buffer.read(4096):
        pass
    del store


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
