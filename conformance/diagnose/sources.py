"""The inputs of ``conformance diagnose`` read into :class:`~conformance.diagnose.evidence.JobEvidence`.

Text logs are streamed (:meth:`JobEvidence.read_file`); several large files are read in parallel,
one share of the files per process where the machine has the cores (:data:`PARALLEL_BYTES`), and
the shares' evidence merged in file order.  Two JSON files are read as what they hold:
torchelastic's error file (``TORCHELASTIC_ERROR_FILE``, written by ``@record``: ``{"message":
{"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``,
torch/distributed/elastic/multiprocessing/errors/error_handler.py) and this suite's ``result.json``
of a rank; a ``.json`` file of JSON log records, one a line (Docker's json-file driver, fluent-bit, Ray's
JSON logs), is read as the log it is; other JSON files (the flight recorder's dumps, ``case.json``) are
skipped.  A rank folder of the suite's own cases (``rank<k>/`` with ``phase.jsonl``) that holds no
``result.json`` is a rank the suite stopped: its last phase says where; its phase facts say where its first
barrier ran.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from conformance.common import casefiles
from conformance.common.bounded_parse import NotParsed, json_value
from conformance.common.casefiles import RankStatus
from conformance.common.jsonl import parse_lines
from conformance.diagnose.evidence import JobEvidence
from conformance.diagnose.inputs import LogFile, Skipped, UnusableInput, log_files, open_regular
from conformance.diagnose.line_forms import STOPPED_LINE
from conformance.diagnose.logs import LogLine, who_from_path
from conformance.diagnose.writers import json_record

JSON_LIMIT = 16 * 1024 * 1024  # a JSON file larger than this is no error file: skipped
BARRIER_LINE = "first barrier ran on GPU {barrier_device}, not the rank's own GPU {rank_device} ({chosen_by})"
WRONG_DATA_LINE = "wrong data received: {message}"
PARALLEL_BYTES = 64 * 1024 * 1024  # below this, starting processes costs more than it saves
MAX_WORKERS = 8


def _json_lines(log: LogFile) -> list[str]:
    """The lines an error file or a suite rank's result.json holds (none for any other JSON)."""
    path = log.path
    with open_regular(log) as stream:
        raw = stream.read(JSON_LIMIT + 1)
    if len(raw) > JSON_LIMIT:
        return []
    try:
        data = json_value(raw.decode("utf-8", errors="replace"))
    except NotParsed as exc:
        raise UnusableInput(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        return []
    message = data.get("message")
    if isinstance(message, dict):  # torchelastic's error file
        extra = message.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        text = str(extra.get("py_callstack") or message.get("message") or "")
        stamp = str(extra.get("timestamp") or "")
        return ([f"error file timestamp {stamp}"] if stamp else []) + text.splitlines()
    if path.name != casefiles.RESULT or not isinstance(data.get("t"), (int, float)):
        return []
    try:
        when = datetime.fromtimestamp(data["t"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    except (OverflowError, OSError, ValueError) as exc:  # a time no clock can show (1e300, nan)
        raise UnusableInput(f"{path}: its time {data['t']!r} is no time ({exc})") from None
    said = [f"the rank's result, written {when}"]  # orders its failure against the other ranks' (errors: stderr.log)
    if data.get("status") == RankStatus.FAIL.value:
        said.append(WRONG_DATA_LINE.format(message=data.get("message", "")))
    return said


def _phase_lines(log: LogFile) -> list[str]:
    """A suite rank's phases: its first barrier on another GPU; without a result, where the suite stopped it."""
    with open_regular(log) as stream:
        raw = stream.read(JSON_LIMIT + 1)
    if len(raw) > JSON_LIMIT:
        raise UnusableInput(f"{log.path}: over {JSON_LIMIT >> 20} MiB: no phase log of a rank")
    phases = casefiles.phases_from(parse_lines(raw.decode("utf-8", errors="replace").split("\n")).objects)
    barriers = [line.facts["barrier"] for line in phases if isinstance(line.facts.get("barrier"), dict)]
    said = [
        BARRIER_LINE.format(
            barrier_device=barrier.get("barrier_device"),
            rank_device=barrier.get("rank_device"),
            chosen_by=barrier.get("chosen_by", "?"),
        )
        for barrier in barriers
        if {"barrier_device", "rank_device"} <= set(barrier) and barrier["barrier_device"] != barrier["rank_device"]
    ]
    if not (log.path.parent / casefiles.RESULT).is_file():
        said.append(STOPPED_LINE.format(where=phases[-1].where if phases else "its start"))
    return said


def _is_log_records(log: LogFile) -> bool:
    """Whether a ``.json`` file holds JSON log records, one a line (its first line is one), not one JSON value."""
    with open_regular(log) as stream:
        head = stream.read(64 * 1024)
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    return b"\n" in head.strip() and json_record(first) is not None


def _read_one(evidence: JobEvidence, log: LogFile) -> None:
    path = log.path
    if path.suffix == ".json" and not _is_log_records(log):
        texts = _json_lines(log)
    elif path.name == casefiles.PHASES:
        texts = _phase_lines(log)
    else:
        evidence.read_file(log)
        return
    who = who_from_path(path)
    for number, text in enumerate(texts, start=1):
        evidence.add(LogLine(str(path), number, text, who))
    evidence.end_file(str(path), len(texts))


@dataclass
class Gathered:
    """A job's evidence, and what was not read of its inputs (each with why)."""

    evidence: JobEvidence
    skipped: list[Skipped] = field(default_factory=list)


def _read_share(logs: list[LogFile]) -> Gathered:
    """One share of the files, in order, read into one evidence: a file that cannot be read is named."""
    gathered = Gathered(JobEvidence())
    for log in logs:
        try:
            _read_one(gathered.evidence, log)
        except UnusableInput as exc:
            gathered.skipped.append(Skipped(str(log.path), str(exc).removeprefix(f"{log.path}: ")))
        except OSError as exc:
            gathered.skipped.append(Skipped(str(log.path), f"cannot be read ({exc.strerror or exc})"))
    return gathered


def files_to_read(paths: list[Path]) -> tuple[list[LogFile], list[Skipped]]:
    """The inputs' files, with each suite rank folder's ``phase.jsonl`` last (it tells a stopped rank).

    A phase log is read only beside a rank's ``stderr.log``: found in a folder given, or beside a
    ``stderr.log`` named on the command line (and then only if it is a regular file, not a link).
    """
    files, skipped = log_files(paths)
    ranks = {log.path.parent for log in files if log.path.name == casefiles.STDERR}
    phases = {log.path: log for log in files if log.path.name == casefiles.PHASES and log.found is not None}
    for log in files:
        beside = log.path.parent / casefiles.PHASES
        if log.found is None and log.path.name == casefiles.STDERR and beside not in phases:
            found = _regular_beside(beside)
            if found is not None:
                phases[beside] = found
    kept = [log for log in files if log.path not in phases]
    return kept + [phases[path] for path in sorted(phases) if path.parent in ranks], skipped


def _regular_beside(path: Path) -> LogFile | None:
    try:
        seen = path.lstat()
    except OSError:
        return None
    return LogFile(path, (seen.st_dev, seen.st_ino)) if stat.S_ISREG(seen.st_mode) else None


def _shares(files: list[LogFile], workers: int) -> list[list[LogFile]]:
    """The files in order, cut into ``workers`` runs of about the same size in bytes."""
    sizes = [_size(log.path) for log in files]
    target = sum(sizes) / workers
    shares: list[list[LogFile]] = [[]]
    held = 0.0
    for log, size in zip(files, sizes, strict=True):
        if shares[-1] and held + size / 2 > target and len(shares) < workers:
            shares.append([])
            held = 0.0
        shares[-1].append(log)
        held += size
    return shares


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _workers(files: list[LogFile]) -> int:
    """How many processes read the files: one, unless they are big and the machine has the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if len(files) < 2 or cores < 2 or sum(_size(log.path) for log in files) < PARALLEL_BYTES:
        return 1
    return min(cores, len(files), MAX_WORKERS)


def gather(paths: list[Path]) -> Gathered:
    """Every input's lines read into one job's evidence; input that gives no line raises :class:`UnusableInput`."""
    files, skipped = files_to_read(paths)
    workers = _workers(files)
    if workers == 1:
        shares = [_read_share(files)]
    else:
        # fork costs nothing and copies the imports, but only a process with one thread may fork safely
        alone = os.name == "posix" and threading.active_count() == 1
        context = multiprocessing.get_context("fork" if alone else "spawn")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            shares = list(pool.map(_read_share, _shares(files, workers)))
    gathered = Gathered(shares[0].evidence, skipped + shares[0].skipped)
    for share in shares[1:]:
        gathered.evidence.absorb(share.evidence)
        gathered.skipped += share.skipped
    if not gathered.evidence.files:
        only = gathered.skipped[0] if len(gathered.skipped) == 1 else None
        why = f"{only.path}: {only.why}" if only else f"{paths[0]}: nothing readable as a log"
        raise UnusableInput(why)
    return gathered
