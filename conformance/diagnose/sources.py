"""The inputs of ``conformance diagnose`` read into :class:`~conformance.diagnose.evidence.JobEvidence`.

Text logs are streamed (:meth:`JobEvidence.read_file`); several large files are read in parallel,
one share of the files per process where the machine has the cores (:data:`PARALLEL_BYTES`), and
the shares' evidence merged in file order.  Two JSON files are read as what they hold:
torchelastic's error file (``TORCHELASTIC_ERROR_FILE``, written by ``@record``: ``{"message":
{"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``,
torch/distributed/elastic/multiprocessing/errors/error_handler.py) and this suite's ``result.json``
of a rank; other JSON files (the flight recorder's dumps, ``case.json``) are skipped.  A rank folder of
the suite's own cases (``rank<k>/`` with ``phase.jsonl``) that holds no ``result.json`` is a rank
the suite stopped: its last phase says where; its phase facts say where its first barrier ran.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from conformance.common import casefiles
from conformance.common.casefiles import RankStatus
from conformance.diagnose.evidence import STOPPED_LINE, JobEvidence
from conformance.diagnose.inputs import Skipped, UnusableInput, log_files, open_regular
from conformance.diagnose.logs import LogLine, who_from_path

JSON_LIMIT = 16 * 1024 * 1024  # a JSON file larger than this is no error file: skipped
BARRIER_LINE = "first barrier ran on GPU {barrier_device}, not the rank's own GPU {rank_device} ({chosen_by})"
WRONG_DATA_LINE = "wrong data received: {message}"
PARALLEL_BYTES = 64 * 1024 * 1024  # below this, starting processes costs more than it saves
MAX_WORKERS = 8


def _json_lines(path: Path) -> list[str]:
    """The lines an error file or a suite rank's result.json holds (none for any other JSON)."""
    with open_regular(path) as stream:
        raw = stream.read(JSON_LIMIT + 1)
    if len(raw) > JSON_LIMIT:
        return []
    try:
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError:
        return []
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
    when = datetime.fromtimestamp(data["t"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    said = [f"the rank's result, written {when}"]  # orders its failure against the other ranks' (errors: stderr.log)
    if data.get("status") == RankStatus.FAIL.value:
        said.append(WRONG_DATA_LINE.format(message=data.get("message", "")))
    return said


def _phase_lines(folder: Path) -> list[str]:
    """A suite rank's phases: its first barrier on another GPU; without a result, where the suite stopped it."""
    phases = casefiles.read_phases(folder)
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
    if not (folder / casefiles.RESULT).is_file():
        said.append(STOPPED_LINE.format(where=phases[-1].where if phases else "its start"))
    return said


def _read_one(evidence: JobEvidence, path: Path) -> None:
    if path.suffix == ".json":
        texts = _json_lines(path)
    elif path.name == casefiles.PHASES:
        texts = _phase_lines(path.parent)
    else:
        evidence.read_file(path)
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


def _read_share(paths: list[Path]) -> Gathered:
    """One share of the files, in order, read into one evidence: a file that cannot be read is named."""
    gathered = Gathered(JobEvidence())
    for path in paths:
        try:
            _read_one(gathered.evidence, path)
        except UnusableInput as exc:
            gathered.skipped.append(Skipped(str(path), str(exc).removeprefix(f"{path}: ")))
        except OSError as exc:
            gathered.skipped.append(Skipped(str(path), f"cannot be read ({exc.strerror or exc})"))
    return gathered


def files_to_read(paths: list[Path]) -> tuple[list[Path], list[Skipped]]:
    """The inputs' files, with each suite rank folder's ``phase.jsonl`` (it tells a stopped rank)."""
    files, skipped = log_files(paths)
    phases = {path.parent / casefiles.PHASES for path in files if path.name == casefiles.STDERR}
    return files + sorted(p for p in phases if p.is_file() and p not in files), skipped


def _shares(files: list[Path], workers: int) -> list[list[Path]]:
    """The files in order, cut into ``workers`` runs of about the same size in bytes."""
    sizes = [_size(path) for path in files]
    target = sum(sizes) / workers
    shares: list[list[Path]] = [[]]
    held = 0.0
    for path, size in zip(files, sizes, strict=True):
        if shares[-1] and held + size / 2 > target and len(shares) < workers:
            shares.append([])
            held = 0.0
        shares[-1].append(path)
        held += size
    return shares


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _workers(files: list[Path]) -> int:
    """How many processes read the files: one, unless they are big and the machine has the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if len(files) < 2 or cores < 2 or sum(_size(path) for path in files) < PARALLEL_BYTES:
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
