"""The inputs of ``conformance diagnose`` read into :class:`~conformance.diagnose.evidence.JobEvidence`.

Text logs are streamed (:func:`conformance.diagnose.logs.read_lines`).  Two JSON files are read as
what they hold: torchelastic's error file (``TORCHELASTIC_ERROR_FILE``, written by ``@record``:
``{"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``,
torch/distributed/elastic/multiprocessing/errors/error_handler.py) and this suite's ``result.json``
of a rank; other JSON files (the flight recorder's dumps, ``case.json``) are skipped.  A rank folder of
the suite's own cases (``rank<k>/`` with ``phase.jsonl``) that holds no ``result.json`` is a rank
the suite stopped: its last phase says where; its phase facts say where its first barrier ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from conformance.common import casefiles
from conformance.common.casefiles import RankStatus
from conformance.diagnose.evidence import STOPPED_LINE, JobEvidence
from conformance.diagnose.logs import LogLine, UnusableInput, log_files, read_lines, who_from_path

JSON_LIMIT = 16 * 1024 * 1024  # a JSON file larger than this is no error file: skipped
BARRIER_LINE = "first barrier ran on GPU {barrier_device}, not the rank's own GPU {rank_device} ({chosen_by})"
WRONG_DATA_LINE = "wrong data received: {message}"


def _json_lines(path: Path) -> list[str]:
    """The lines an error file or a suite rank's result.json holds (none for any other JSON)."""
    if path.stat().st_size > JSON_LIMIT:
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
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


def _synthetic(path: Path, texts: list[str]) -> Iterator[LogLine]:
    who = who_from_path(path)
    for number, text in enumerate(texts, start=1):
        yield LogLine(str(path), number, text, who)


def _lines_of(path: Path) -> Iterator[LogLine]:
    if path.suffix == ".json":
        yield from _synthetic(path, _json_lines(path))
    elif path.name == casefiles.PHASES:
        yield from _synthetic(path, _phase_lines(path.parent))
    else:
        yield from read_lines(path)


def files_to_read(paths: list[Path]) -> list[Path]:
    """The inputs' files, with each suite rank folder's ``phase.jsonl`` (it tells a stopped rank)."""
    files = log_files(paths)
    phases = {path.parent / casefiles.PHASES for path in files if path.name == casefiles.STDERR}
    return files + sorted(p for p in phases if p.is_file() and p not in files)


def gather(paths: list[Path]) -> JobEvidence:
    """Every input's lines read into one job's evidence; unusable input raises :class:`UnusableInput`."""
    files = files_to_read(paths)
    evidence = JobEvidence()
    usable = 0
    for path in files:
        try:
            for line in _lines_of(path):
                evidence.add(line)
        except UnusableInput:
            if len(files) == 1:
                raise
            continue  # a binary file among logs: skipped
        except OSError as exc:
            raise UnusableInput(f"{path}: cannot be read ({exc.strerror or exc})") from exc
        usable += 1
        evidence.end_file(str(path))
    if usable == 0:
        raise UnusableInput(f"{files[0] if len(files) == 1 else paths[0]}: nothing readable as a log")
    return evidence
