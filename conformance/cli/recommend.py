"""``python -m conformance recommend [RUN]``: the environment to use, per topology class."""

from __future__ import annotations

import argparse
import json

from conformance.cli.common import add_reports_dir_argument, add_run_argument, fail, load_run_argument, say, warn
from conformance.common.outside_text import shown
from conformance.record.runs import RunError
from conformance.summarise.env_file import ENV_FILE, write_env_file
from conformance.summarise.recommend import UNFIT_STATUS, recommend

COMMAND = "recommend"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="the environment to use, per topology class, from a finished run",
        description=(
            "Per topology class, the first environment rung on which every case passed and what it costs in "
            f"bandwidth; the environment to use as export lines, also written to {ENV_FILE} in the run folder."
        ),
    )
    add_run_argument(parser)
    add_reports_dir_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    parser.set_defaults(run=recommend_command)


def recommend_command(args: argparse.Namespace) -> int:
    try:
        run = load_run_argument(args.run_path, args.reports_dir)
    except RunError as exc:
        return fail(COMMAND, str(exc))
    recommendation = recommend(run)
    for message in run.warnings:
        warn(COMMAND, message)
    if not recommendation.classes and not recommendation.harness_errors:
        what = (
            "recorded no case" if not run.records else "has no case to go by (every case skipped or a negative control)"
        )
        return fail(COMMAND, f"{run.source}: nothing to recommend: the run {what}")
    try:
        path = write_env_file(run, recommendation)
    except (OSError, RunError) as exc:
        return fail(COMMAND, f"{ENV_FILE} cannot be written: {exc}")
    if args.json:
        say(json.dumps({**recommendation.to_json(), "env_file": str(path)}, indent=2, sort_keys=True))
    else:
        say(f"recommended environment for run {recommendation.run_id or '(unknown run id)'} ({run.source}):")
        for line in recommendation.lines():
            say(line)
        say(f"(written to {shown(str(path))})")  # one line: a newline in the reports folder's name is shown
    # A run with nothing a launch script could use (incomplete, harness errors) is not a success either.
    return UNFIT_STATUS if recommendation.withheld else 0
