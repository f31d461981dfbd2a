"""``python -m conformance compare BASELINE CURRENT``: regressions against a baseline run."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from conformance.cli.common import (
    add_reports_dir_argument,
    add_run_argument,
    argument_type,
    fail,
    load_run_argument,
    say,
    warn,
)
from conformance.common import values
from conformance.record.runs import RunError
from conformance.summarise.compare import CompareError, compare, write_comparison
from conformance.summarise.comparison import DEFAULT_TOLERANCE

COMMAND = "compare"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="compare a run against a baseline run",
        description=(
            "Compare CURRENT against BASELINE (each a run folder, a results.jsonl or a JUnit XML): verdict "
            "regressions, bandwidth drops, fixes, transport changes, new and missing cases. Exit status 0 "
            "without regressions, 1 with regressions, 2 for bad input."
        ),
    )
    add_run_argument(parser, "baseline", "BASELINE", optional=False)
    add_run_argument(parser, "current", "CURRENT", optional=False)
    parser.add_argument(
        "--bandwidth-tolerance",
        type=argument_type(values.ratio),
        default=DEFAULT_TOLERANCE,
        metavar="R",
        help=f"current/baseline bandwidth below this ratio is a regression (default {DEFAULT_TOLERANCE})",
    )
    parser.add_argument(
        "--allow-different-machines",
        action="store_true",
        help="compare runs from different hosts or devices (cases still match only on the same device ids)",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    add_reports_dir_argument(parser)
    parser.set_defaults(run=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    try:
        baseline = load_run_argument(args.baseline, args.reports_dir)
        current = load_run_argument(args.current, args.reports_dir)
        comparison = compare(baseline, current, args.bandwidth_tolerance, args.allow_different_machines)
    except (RunError, CompareError) as exc:
        return fail(COMMAND, str(exc))
    for message in comparison.warnings:
        warn(COMMAND, message)
    try:
        write_comparison(comparison)  # kept with the current run: its report shows it
    except OSError as exc:
        warn(COMMAND, f"the comparison cannot be kept with {comparison.current.source}: {exc.strerror or exc}")
    if args.json:
        say(json.dumps(comparison.to_json(), indent=2, sort_keys=True))
    else:
        say("\n".join(_without_warnings(comparison.lines(), comparison.warnings)))
    return comparison.exit_status


def _without_warnings(lines: Sequence[str], warnings: Sequence[str]) -> list[str]:
    """The report without the warning lines (the command prints those on stderr)."""
    printed = {f"warning: {w}" for w in warnings}
    return [line for line in lines if line not in printed]
