"""What the ``python -m conformance`` commands share: the program name, exit codes, run arguments.

A command module exposes ``register(commands)``, adding its argparse subcommand with
``set_defaults(run=function)``; the function takes the parsed arguments and returns the exit
status.  Bad input is one line on stderr and exit status 2 (:data:`USAGE_ERROR`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from conformance.record.runs import Run, load_run, resolve_run_path

PROG = "python -m conformance"
USAGE_ERROR = 2
REPORTS_DIR_VARIABLE = "CONFORMANCE_REPORTS_DIR"


def add_reports_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reports-dir",
        type=Path,
        default=Path(os.environ.get(REPORTS_DIR_VARIABLE, "reports")),
        metavar="DIR",
        help=f"where runs are (default: ${REPORTS_DIR_VARIABLE} or reports/)",
    )


def add_run_argument(
    parser: argparse.ArgumentParser, dest: str = "run_path", metavar: str = "RUN", optional: bool = True
) -> None:
    """A run folder, a results.jsonl or a JUnit XML; optional ones default to reports/latest.

    Never ``dest="run"``: that name holds the command's function (``set_defaults(run=...)``).
    """
    if dest == "run":
        raise ValueError('dest "run" is the command function; name the argument otherwise')
    kwargs = {"nargs": "?", "default": None} if optional else {}
    parser.add_argument(
        dest,
        metavar=metavar,
        help="run folder, results.jsonl or JUnit XML" + (" (default: reports/latest)" if optional else ""),
        **kwargs,  # type: ignore[arg-type]
    )


def load_run_argument(value: str | None, reports_dir: Path) -> Run:
    """Raises RunError (one line) when the run cannot be read."""
    return load_run(resolve_run_path(value, reports_dir))


def fail(command: str, message: str, status: int = USAGE_ERROR) -> int:
    print(f"{PROG} {command}: {message}", file=sys.stderr)
    return status


def warn(command: str, message: str) -> None:
    print(f"{PROG} {command}: warning: {message}", file=sys.stderr)
