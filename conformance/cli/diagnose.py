"""``python -m conformance diagnose PATH...``: a failed job's logs read for its root cause, victims and fix."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conformance.cli.common import fail, say
from conformance.diagnose.diagnosis import diagnose
from conformance.diagnose.inputs import UnusableInput
from conformance.diagnose.sources import gather

COMMAND = "diagnose"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="name the root cause of a failed job from its logs",
        description=(
            "Read a failed job's logs (torchrun's per-rank output, SLURM's slurm-<job>.out, Ray, vLLM, Lightning, "
            "DeepSpeed and mpirun output, nccl-tests, NCCL_DEBUG output and NCCL_DEBUG_FILE files, elastic error "
            "files, this suite's run and case folders; files or folders, streamed) and name the failure class, the "
            "root-cause rank, the ranks that only waited, the fix and the suite run that tests the machine for it. "
            "Exit status 0 when the logs show the job ending normally, 1 when they show a failure (named, or "
            "UNRECOGNISED with its lines), 2 for unusable input, 3 when they show neither a failure nor a normal end."
        ),
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="log files or folders of one job")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.set_defaults(run=diagnose_command)


def diagnose_command(args: argparse.Namespace) -> int:
    try:
        gathered = gather(list(args.paths))
    except UnusableInput as exc:
        return fail(COMMAND, str(exc))
    if gathered.evidence.lines == 0:
        return fail(COMMAND, f"{args.paths[0]}: empty: no log line to read")
    answer = diagnose(gathered)
    if args.json:
        say(json.dumps(answer.to_json(), indent=2))  # ensure_ascii: every control or bidi character is \uXXXX
    else:
        say("\n".join(answer.text_lines()))
    return answer.exit_status
