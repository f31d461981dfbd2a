"""``python -m conformance diagnose PATH...``: a failed job's logs read for its root cause, victims and fix."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conformance.cli.common import fail
from conformance.diagnose.diagnosis import diagnose
from conformance.diagnose.logs import UnusableInput
from conformance.diagnose.sources import gather

COMMAND = "diagnose"
NO_FAILURE = 0
CAUSE_NAMED = 1


def register(commands: Any) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="name the root cause of a failed job from its logs",
        description=(
            "Read a failed job's logs (torchrun's per-rank output, SLURM's slurm-<job>.out, NCCL_DEBUG output and "
            "NCCL_DEBUG_FILE files, elastic error files, this suite's run and case folders; files or folders, "
            "streamed) and name the failure class, the root-cause rank, the ranks that only waited, the fix and "
            "the suite run that tests the machine for it. Exit status 0 when no failure is found, 1 when a cause "
            "is named, 2 for unusable input."
        ),
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="log files or folders of one job")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.set_defaults(run=diagnose_command)


def diagnose_command(args: argparse.Namespace) -> int:
    try:
        evidence = gather(list(args.paths))
    except UnusableInput as exc:
        return fail(COMMAND, str(exc))
    if evidence.lines == 0:
        return fail(COMMAND, f"{args.paths[0]}: empty: no log line to read")
    answer = diagnose(evidence)
    if args.json:
        print(json.dumps(answer.to_json(), indent=2))
    else:
        print("\n".join(answer.text_lines()))
    return NO_FAILURE if answer.failure is None else CAUSE_NAMED
