"""``python -m conformance merge-junit OUT IN...``: one JUnit file with the run's facts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from conformance.cli.common import add_reports_dir_argument, fail, warn
from conformance.summarise.junit_merge import MergeError, merge

COMMAND = "merge-junit"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="merge JUnit XML files into one, with the run's facts as suite properties",
        description=(
            "Merge JUnit XML files (e.g. from CI shards) into OUT, keeping every test case and its properties, "
            "and add the run's facts (host, GPUs, driver, CUDA, NCCL, torch, run id, simulated) as suite "
            "properties conformance.run.<key>."
        ),
    )
    parser.add_argument("out", metavar="OUT", type=Path, help="the merged JUnit XML file to write")
    parser.add_argument("inputs", metavar="IN", type=Path, nargs="*", help="JUnit XML files written with --junitxml")
    parser.add_argument(
        "--run",
        dest="run_folder",  # "run" is the command function (cli.main calls args.run)
        metavar="RUN",
        help="the run folder (or run id) whose run.json gives the suite properties "
        "(default: <reports dir>/<run id of the inputs>, else <reports dir>/latest)",
    )
    add_reports_dir_argument(parser)
    parser.set_defaults(run=merge_command)


def merge_command(args: argparse.Namespace) -> int:
    try:
        result = merge(args.out, args.inputs, args.run_folder, args.reports_dir)
    except MergeError as exc:
        return fail(COMMAND, str(exc))
    for message in result.warnings:
        warn(COMMAND, message)
    print(result.line())
    return 0
