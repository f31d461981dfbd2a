"""The files a case shares between the parent and its ranks, and the rank exit-code table.

    <case dir>/case.json          the case spec, written by the parent before the ranks start
    $TMPDIR/conformance-stores/<digest of the case dir>.store
                                  the case's own FileStore (rendezvous), local even when the case dir is
                                  on NFS (FileStore locks its file), removed after the case
    <case dir>/rank<k>/stdout.log, stderr.log   the rank's output (stacks are dumped to stderr.log)
    <case dir>/rank<k>/phase.jsonl              one line per phase the rank entered
    <case dir>/rank<k>/result.json              the rank's structured result (authoritative)
    <case dir>/rank<k>/nccl.log                 NCCL_DEBUG=INFO output (NCCL cases)
    <case dir>/rank<k>/flight_recorder.json     torch's flight recorder, dumped at the deadline or on failure
    <case dir>/turn               written by the parent when the ranks may time a transfer: "alone", or
                                  "beside" when no turn came within the wait (the figure says so)

``case.json``, ``result.json`` and the phase lines are the dataclasses below, written and read
only through this module on both sides of the fork.  Exit codes are only a fallback for a rank
that died before writing result.json (``STATUS_BY_EXIT``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import NotParsed, json_value
from conformance.common.clock import wall
from conformance.common.files import write_atomic
from conformance.common.inputs import read_bounded, wrong_field_type
from conformance.common.jsonl import JsonlError, read_lines

CASE_SPEC = "case.json"
CASE_FILE_BYTES = 64 << 20  # a case file: case.json, result.json, a flight-recorder dump of 2000 entries
STORE = "store"
# FileStore locks its file; on NFS (a reports dir on a shared file system) locks are slow or broken, so
# the store lives in a local temporary folder instead, named after the case folder.
LOCAL_STORES = "conformance-stores"


def local_store_path(case_dir: Path) -> Path:
    """Where the case's FileStore lives: a local temporary folder (``$TMPDIR``), one file per case folder."""
    digest = hashlib.sha256(str(case_dir.resolve()).encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / LOCAL_STORES / f"{digest}.store"


STDOUT = "stdout.log"
STDERR = "stderr.log"
PHASES = "phase.jsonl"
RESULT = "result.json"
NCCL_LOG = "nccl.log"
FLIGHT_RECORDER = "flight_recorder.json"
TURN = "turn"
# A GPU rank's metric: per GPU name, the highest PCIe generation read while its timed transfers moved data
TRANSFER_GENERATIONS = "pcie_gen_in_transfer"
TURN_STEP = "waiting for the measurement turn"  # the step ranks report while they wait for it
# A shared case (several tests' collectives over one process group): the probe's parameter that
# lists them in order, each {"probe": name, "params": {...}}, and the metric in which a rank notes
# each one it finished, {name: {"metrics": {...}, "seconds": s}}.
SEQUENCE = "sequence"
SHARED_DONE = "collectives_done"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_WRONG_DATA = 2
EXIT_SKIP = 3
EXIT_HARNESS = 4  # the rank could not even set itself up


# A rank that exited without result.json: what its exit code says it reached.
class RankStatus(str, Enum):
    """How a rank ended: as it wrote it (ok, fail, error, skip), or as its parent found it (crash, stopped, lost)."""

    OK = "ok"
    FAIL = "fail"  # wrong data
    ERROR = "error"
    SKIP = "skip"
    CRASH = "crash"  # killed by a signal it did not get from the watchdog
    STOPPED = "stopped"  # by the watchdog
    LOST = "lost"  # no exit status, no result

    def __str__(self) -> str:
        return self.value


STATUS_BY_EXIT = {
    EXIT_OK: RankStatus.OK, EXIT_ERROR: RankStatus.ERROR, EXIT_WRONG_DATA: RankStatus.FAIL, EXIT_SKIP: RankStatus.SKIP,
}  # fmt: skip


@dataclass(frozen=True)
class RankDevice:
    """A rank's device as the rank sees it: ``index`` is its CUDA ordinal there."""

    name: str
    index: int
    uuid: str | None = None


@dataclass(frozen=True)
class StoreAddress:
    """Node 0's store and the case's prefix in it (cross-node cases)."""

    host: str
    port: int
    prefix: str


@dataclass(frozen=True)
class CaseFile:
    """``case.json``: everything a rank needs, written by the parent before the ranks start."""

    nodeid: str
    probe: str
    backend: str
    world_size: int  # every rank of the case, on every node
    devices: tuple[RankDevice, ...]  # this node's ranks, in order
    peers: tuple[RankDevice, ...] = ()  # the other devices of a one-process case (peer copies)
    rank_offset: int = 0  # this node's first global rank
    store: StoreAddress | None = None
    single_process: bool = False
    set_kind: str = "all"
    links: tuple[str, ...] = ()
    store_file: str = ""  # the case's FileStore (local_store_path); "" in older case files: <case dir>/store
    p2p_links: tuple[str, ...] = ()  # the link classes NCCL would use P2P over here (plan/transport.py)
    net_links: tuple[str, ...] = ()  # the link classes NCCL would send over the network inside the node
    refused: bool = False  # NCCL's own rule refuses a pair of the case (P2P disabled between NVLink GPUs)
    visible: tuple[str, ...] = ()  # the GPUs the ranks see, in order (UUIDs)
    params: Mapping[str, Any] = field(default_factory=dict)  # the probe's own parameters (JSON)
    rank_env: tuple[Mapping[str, str], ...] = ()  # every variable each local rank sets (launch.environment)
    env_unset: tuple[str, ...] = ()  # the variables every rank unsets first
    init_timeout: float = 30.0
    process_group_timeout: float = 30.0
    rules: tuple[Mapping[str, Any], ...] = ()  # scenario rules, as rank.scenario.Rule.to_dict writes them

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CaseFile:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["devices"] = tuple(RankDevice(**d) for d in data.get("devices", ()))
        values["peers"] = tuple(RankDevice(**d) for d in data.get("peers", ()))
        values["store"] = StoreAddress(**data["store"]) if data.get("store") else None
        for name in ("links", "p2p_links", "net_links", "visible", "rank_env", "env_unset", "rules"):
            values[name] = tuple(data.get(name, ()))
        return cls(**values)


def place(phase: str, step: str) -> str:
    """Where a rank is, as people read it: ``probe (send/recv 4B)``."""
    return f"{phase} ({step})" if step else phase


@dataclass(frozen=True)
class PhaseLine:
    """One line of ``phase.jsonl``: the phase a rank entered, its step, when, and facts to keep if it dies.

    A long step also writes a line for each part it finishes (``part`` "3/16"): progress the
    watchdog sees, so a large collective that advances is not taken for a hang.  ``nbytes``: what
    the step moves per rank, where the rank knows it and its group is already set up (a step so
    small that it ends in milliseconds on any link: the watchdog may call it stuck sooner).
    ``t`` is the wall time, for people; ``clock`` the host's monotonic clock, which the parent's
    watchdog compares with its own (``common/clock.py``).
    """

    phase: str
    step: str = ""
    t: float | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)
    part: str = ""
    nbytes: int | None = None
    clock: float | None = None

    @classmethod
    def now(
        cls,
        phase: str,
        step: str = "",
        facts: Mapping[str, Any] | None = None,
        part: str = "",
        nbytes: int | None = None,
    ) -> PhaseLine:
        """A line stamped with both clocks as it is written."""
        return cls(phase, step, wall(), dict(facts or {}), part, nbytes, time.monotonic())

    @property
    def where(self) -> str:
        return place(self.phase, self.step)

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"phase": self.phase, "step": self.step, "t": self.t, "clock": self.clock}
        if self.part:
            line["part"] = self.part
        if self.nbytes is not None:
            line["nbytes"] = self.nbytes
        return {**line, "facts": dict(self.facts)} if self.facts else line


@dataclass(frozen=True)
class RankResult:
    """``result.json``: how a rank ended, written by the rank itself (authoritative)."""

    status: RankStatus  # ok | fail | error | skip
    t: float  # wall time, for people
    phase: str | None = None
    step: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    clock: float | None = None  # the host's monotonic clock when the rank ended (which rank failed first)


def write_case(case_dir: Path, case: CaseFile) -> None:
    write_json_atomic(case_dir / CASE_SPEC, asdict(case))


class CaseFileError(ValueError):
    """A case file that is not whole (cut off, too big, nested too deep, not an object); the message says which."""


def read_case(case_dir: Path) -> CaseFile:
    """The case the parent wrote for its ranks; CaseFileError when it is not one (the rank fails with it)."""
    path = case_dir / CASE_SPEC
    try:
        data = json_value(read_bounded(path, CASE_FILE_BYTES))
    except (OSError, NotParsed) as exc:
        raise CaseFileError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise CaseFileError(f"{path}: not a case (a JSON {type(data).__name__})")
    try:
        return CaseFile.from_json(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CaseFileError(f"{path}: not a case: {exc}") from None


def write_result(rank_path: Path, result: RankResult) -> None:
    write_json_atomic(rank_path / RESULT, asdict(result))


_STATUSES = frozenset(status.value for status in RankStatus)


def read_result(rank_path: Path) -> RankResult | None:
    """The rank's result; None when it wrote none (or not a whole one)."""
    data = read_json(rank_path / RESULT)
    if not isinstance(data, dict) or not isinstance(data.get("status"), str) or data["status"] not in _STATUSES:
        return None
    values = {f.name: data[f.name] for f in fields(RankResult) if f.name in data}
    if "t" not in values or wrong_field_type(values, RankResult):  # not one the rank wrote whole
        return None
    return RankResult(**{**values, "status": RankStatus(data["status"])})


def grant_turn(case_dir: Path, alone: bool) -> None:
    write_json_atomic(case_dir / TURN, "alone" if alone else "beside")


def read_turn(case_dir: Path) -> str | None:
    """The parent's grant of the measurement turn, once it has written one."""
    turn = read_json(case_dir / TURN)
    return turn if isinstance(turn, str) else None


def rank_dir(case_dir: Path, rank: int) -> Path:
    return case_dir / f"rank{rank}"


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, sort_keys=True, default=str))


def read_json(path: Path) -> Any:
    """A case file's JSON value; None when it is missing or not whole (cut off, too big, nested too deep)."""
    try:
        return json_value(read_bounded(path, CASE_FILE_BYTES))
    except (OSError, NotParsed):
        return None


def read_phases(rank_path: Path) -> list[PhaseLine]:
    """Every whole line of a rank's phase log (a line cut by a kill is ignored; an unreadable log is empty)."""
    try:
        return phases_from(read_lines(rank_path / PHASES).objects)
    except JsonlError:
        return []


def phases_from(lines: Iterable[Mapping[str, Any]]) -> list[PhaseLine]:
    """The phase lines among JSON objects read back: each with a phase, and every known field of its type."""
    keys = {f.name for f in fields(PhaseLine)}
    known = ({k: v for k, v in line.items() if k in keys} for line in lines if "phase" in line)
    return [PhaseLine(**line) for line in known if not wrong_field_type(line, PhaseLine)]


def last_phase(rank_path: Path) -> PhaseLine | None:
    """Where a rank is now: the last whole line of its phase log, if it has written one.

    The watchdog asks at every look; the log is read again only when it has grown (it is only appended to).
    """
    try:
        stat = (rank_path / PHASES).stat()
    except OSError:
        return None
    return _last_line(rank_path, stat.st_ino, stat.st_size)


@functools.lru_cache(maxsize=4096)
def _last_line(rank_path: Path, inode: int, size: int) -> PhaseLine | None:
    phases = read_phases(rank_path)
    return phases[-1] if phases else None


def last_progress(rank_paths: Iterable[Path]) -> float | None:
    """When any of these ranks last reported progress, on the host's monotonic clock; None before any has.

    From the lines' own stamps, not the log's mtime: the wall clock a file's mtime comes from steps.
    """
    stamps = [line.clock for path in rank_paths if (line := last_phase(path)) is not None and line.clock is not None]
    return max(stamps) if stamps else None


def tail(path: Path, max_lines: int = 30, max_chars: int = 4000) -> str:
    """The last lines of a log, at most ``max_chars`` of it read however it grows meanwhile."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_chars))
            text = f.read(max_chars).decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-max_lines:])
