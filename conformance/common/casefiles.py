"""The files a case shares between the parent and its ranks, and the rank exit-code table.

    <case dir>/case.json          the case spec, written by the parent before the ranks start
    <case dir>/store              the case's own FileStore (rendezvous), removed after the case
    <case dir>/rank<k>/stdout.log, stderr.log   the rank's output (stacks are dumped to stderr.log)
    <case dir>/rank<k>/phase.jsonl              one line per phase the rank entered
    <case dir>/rank<k>/result.json              the rank's structured result (authoritative)
    <case dir>/rank<k>/nccl.log                 NCCL_DEBUG=INFO output (NCCL cases)
    <case dir>/rank<k>/flight_recorder.json     torch's flight recorder, dumped at the deadline or on failure

Exit codes are only a fallback for a rank that died before writing result.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CASE_SPEC = "case.json"
STORE = "store"
STDOUT = "stdout.log"
STDERR = "stderr.log"
PHASES = "phase.jsonl"
RESULT = "result.json"
NCCL_LOG = "nccl.log"
FLIGHT_RECORDER = "flight_recorder.json"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_WRONG_DATA = 2
EXIT_SKIP = 3
EXIT_HARNESS = 4  # the rank could not even set itself up

STATUS_BY_EXIT = {EXIT_OK: "ok", EXIT_ERROR: "error", EXIT_WRONG_DATA: "fail", EXIT_SKIP: "skip"}


def rank_dir(case_dir: Path, rank: int) -> Path:
    return case_dir / f"rank{rank}"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_phases(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a rank's phase log (a line cut by a kill is ignored)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    phases = []
    for line in lines:
        try:
            phases.append(json.loads(line))
        except ValueError:
            continue
    return phases


def tail(path: Path, max_lines: int = 30, max_chars: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_chars))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-max_lines:])
