"""What the evidence keeps of a job's lines: each process's story, the job's facts, the files read; all bounded.

Memory: every list is bounded (:data:`KEPT_PER_KIND`, :data:`WARNINGS_KEPT`, :data:`FACTS_KEPT`),
as are the sets of ranks, hosts and transports (:data:`SET_LIMIT`, :data:`VIAS_KEPT`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from conformance.diagnose.deaths import Death, MemoryKill, Stop
from conformance.diagnose.logs import LogLine, Who
from conformance.verdict import cuda_errors

KEPT_PER_KIND = 3  # lines kept per process and kind: the first ones (the last ones for the warnings)
WARNINGS_KEPT = 64  # per process: NCCL warnings and cause lines, the last ones, for stderr_causes.recognise
FACTS_KEPT = 4  # job-wide lines kept per kind (failures, normal ends, sizes)
SET_LIMIT = 1 << 16  # ranks, hosts, announcements remembered at most (a 64k-rank job)
VIAS_KEPT = 512  # distinct NCCL transport texts


ProcessKey = tuple[str, str]  # ("rank", "3"), ("local", "<task or host>/3"), ("pid", "host:123"), ("file", path)


def node_of(who: Who) -> str:
    """The node of a local rank: srun's task id where it says, else the host."""
    return str(who.task) if who.task is not None else (who.host or "")


def process_key(who: Who, path: str) -> ProcessKey:
    if who.rank is not None:
        return ("rank", str(who.rank))
    if who.local_rank is not None:
        return ("local", f"{node_of(who)}/{who.local_rank}")
    if who.pid is not None:
        return ("pid", f"{who.host}:{who.pid}" if who.host else f"pid {who.pid}")
    if who.task is not None:
        return ("task", str(who.task))
    return ("file", path)


@dataclass(frozen=True)
class Collective:
    """The collective a rank's watchdog timed out in: torch's ``WorkNCCL(SeqNum=, OpType=, NumelIn=, ...)``."""

    seq: int
    op: str
    numel: int | None
    line: LogLine

    @property
    def shape(self) -> tuple[int, str, int | None]:
        return (self.seq, self.op, self.numel)


@dataclass
class ProcessStory:
    """What one process's lines said; every list holds at most :data:`KEPT_PER_KIND` lines."""

    key: ProcessKey
    who: Who = field(default_factory=Who)
    signs: dict[str, list[tuple[int, LogLine]]] = field(default_factory=dict)  # index into LINE_SIGNS
    exceptions: list[LogLine] = field(default_factory=list)
    victim_lines: list[LogLine] = field(default_factory=list)
    deaths: list[tuple[Death, LogLine]] = field(default_factory=list)  # its death (a signal or exit status), reported
    crash_lines: list[LogLine] = field(default_factory=list)  # what it said as it crashed (glibc, assert, terminate)
    errors: list[LogLine] = field(default_factory=list)  # lines that show a failure and name nothing known
    warnings: deque[LogLine] = field(default_factory=lambda: deque(maxlen=WARNINGS_KEPT))
    collective: Collective | None = None  # the watchdog's last timed-out collective
    stopped: bool = False  # a rank of this suite's own case, stopped by its watchdog
    first_time: float | None = None  # of the first failure line
    clock: float | None = None  # the last timestamp seen in this process's lines

    def sign_lines(self, key: str) -> tuple[LogLine, ...]:
        return tuple(line for _, line in self.signs.get(key, []))

    def absorb(self, other: ProcessStory) -> None:
        """Take in another story of the same process (read from another file, or by another key)."""
        self.who = self.who.merged(other.who)
        for key, kept in other.signs.items():
            self.signs.setdefault(key, []).extend(kept)
        self.exceptions.extend(other.exceptions)
        self.victim_lines.extend(other.victim_lines)
        self.deaths.extend(other.deaths)
        self.crash_lines.extend(other.crash_lines)
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)
        self.collective = self.collective or other.collective
        self.stopped = self.stopped or other.stopped
        times = [t for t in (self.first_time, other.first_time) if t is not None]
        self.first_time = min(times) if times else None


@dataclass
class FileRead:
    """One file read: how many lines, and how it ends (the last lines, their writers' prefixes taken off)."""

    path: str
    lines: int
    last: list[LogLine]


@dataclass
class JobFacts:
    """What the logs say about the job as a whole; every list bounded by :data:`FACTS_KEPT`."""

    hard: list[LogLine] = field(default_factory=list)  # a failure no healthy job prints (exception, exit, signal)
    soft: list[LogLine] = field(default_factory=list)  # a line that says something failed
    normal_ends: list[tuple[str, LogLine]] = field(default_factory=list)
    started: LogLine | None = None  # the first line showing the job got past its start (NCCL init, a rank's own line)
    sizes: dict[int, LogLine] = field(default_factory=dict)  # stated world sizes
    nnodes: tuple[int, LogLine] | None = None
    nproc: tuple[int, LogLine] | None = None
    joined: tuple[int, int, LogLine] | None = None  # (joined, expected, line): a store's count of arrivals
    members: dict[int, int] = field(default_factory=dict)  # rank -> times it announced itself
    ranks_written: set[int] = field(default_factory=set)  # ranks whose prefix some line carries
    hosts: set[str] = field(default_factory=set)
    vias: set[str] = field(default_factory=set)  # NCCL transport texts ("P2P/IPC/read", "NET/IB/0/GDRDMA")
    launched: LogLine | None = None  # a launcher starting the ranks
    stuck_in: LogLine | None = None  # a stack dump's frame inside a collective
    no_destroy: LogLine | None = None  # torch's warning that the program exits without destroy_process_group()
    stopped_outside: LogLine | None = None  # Ctrl-C, SIGTERM to the launcher, SLURM cancelling the job
    net_plugins: dict[str, tuple[str, LogLine]] = field(default_factory=dict)  # host -> NCCL net plugin
    gpu: tuple[cuda_errors.GpuGeneration, LogLine] | None = None  # the GPU generation the logs name
    memory_kills: list[tuple[MemoryKill, LogLine]] = field(default_factory=list)  # who killed what for memory
    stop: tuple[Stop, LogLine] | None = None  # a scheduler's word that it stopped the job, and why
    crash_lines: list[LogLine] = field(default_factory=list)  # what native crashes said (any process's)

    def add_kept(self, items: list[LogLine], line: LogLine) -> None:
        if len(items) < FACTS_KEPT:
            items.append(line)
