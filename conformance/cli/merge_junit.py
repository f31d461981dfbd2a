"""``python -m conformance merge-junit -o OUT IN...``: one JUnit file with the runs' facts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from conformance.cli.common import fail, say, warn
from conformance.summarise.junit_merge import MergeError, merge

COMMAND = "merge-junit"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="merge JUnit XML files into one, with each run's facts as suite properties",
        description=(
            "Merge JUnit XML files written with --junitxml (CI shards, the nodes of a run) into OUT, keeping every "
            "test suite whole, and add the facts of the run each suite names (host, GPUs, driver, CUDA, NCCL, "
            "torch, run id, simulated) as suite properties conformance.run.<key>."
        ),
    )
    parser.add_argument(
        "-o", "--output", dest="out", metavar="OUT", type=Path, required=True, help="the merged JUnit XML file to write"
    )
    parser.add_argument("inputs", metavar="IN", type=Path, nargs="*", help="JUnit XML files written with --junitxml")
    parser.set_defaults(run=merge_command)


def merge_command(args: argparse.Namespace) -> int:
    try:
        result = merge(args.out, args.inputs)
    except MergeError as exc:
        return fail(COMMAND, str(exc))
    for message in result.warnings:
        warn(COMMAND, message)
    say(result.line())
    return 0
