"""What the ``python -m conformance`` commands share: the program name, exit codes, run arguments.

A command module exposes ``register(commands)``, adding its argparse subcommand with
``set_defaults(run=function)``; the function takes the parsed arguments and returns the exit
status.  Bad input is one line on stderr and exit status 2 (:data:`USAGE_ERROR`).  Everything a
command prints goes through :func:`say`, the terminal's escape for outside text.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from conformance.common import values
from conformance.common.outside_text import shown, shown_lines
from conformance.record.runs import Run, load_run, resolve_run_path
from conformance.settings import SETTING, reports_dir_outside_pytest

# The console script (``conformance``) or ``python -m conformance``, as the user typed it.
PROG = "conformance" if Path(sys.argv[0]).name == "conformance" else "python -m conformance"
USAGE_ERROR = 2


class UsageError(Exception):
    """A command line argparse rejects; the command turns it into one line on stderr and exit status 2."""


class RaisingParser(argparse.ArgumentParser):
    """An argparse parser that raises :class:`UsageError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def add_reports_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reports-dir",
        type=Path,
        default=reports_dir_outside_pytest(os.environ),
        metavar="DIR",
        help=f"where runs are (default: ${SETTING['reports_dir'].env_var} or {SETTING['reports_dir'].default}/)",
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


def say(text: str, error: bool = False) -> None:
    """The commands' one way to the terminal: ``text`` on stdout (stderr: ``error``), outside text shown as data.

    A path, a run id, a record's words or a log line is anyone's text; ``shown_lines`` leaves none of
    its characters to act on the terminal (``common/outside_text.py``), the text's own lines kept.
    """
    print(shown_lines(text), file=sys.stderr if error else sys.stdout)


def fail(command: str, message: str, status: int = USAGE_ERROR) -> int:
    """Bad input: one line on stderr (a newline in the message is shown, not kept), and ``status``."""
    say(f"{PROG} {command}: {shown(message)}", error=True)
    return status


def warn(command: str, message: str) -> None:
    say(f"{PROG} {command}: warning: {shown(message)}", error=True)


def argument_type(parse: Callable[[str], object]) -> Callable[[str], object]:
    """A ``values`` parser as an argparse type (its complaint becomes argparse's one line)."""

    def checked(text: str) -> object:
        try:
            return parse(text)
        except values.BadValue as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return checked
