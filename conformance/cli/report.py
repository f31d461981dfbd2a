"""``python -m conformance report [RUN]``: the run's self-contained HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from conformance.cli.common import add_reports_dir_argument, add_run_argument, fail, load_run_argument, say, warn
from conformance.common.outside_text import shown
from conformance.record.results import RESULTS_FILE
from conformance.record.runs import Run, RunError
from conformance.summarise.answer import answer
from conformance.summarise.recommend import recommend
from conformance.summarise.report import REPORT_FILE, ReportUnavailable, report_path, write_report


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "report",
        help="write the run's self-contained HTML report",
        description=f"Write {REPORT_FILE} (self-contained HTML) into the run folder and print its path.",
    )
    add_run_argument(parser)
    add_reports_dir_argument(parser)
    parser.set_defaults(run=report_command)


def report_command(args: argparse.Namespace) -> int:
    try:
        run = load_run_argument(args.run_path, args.reports_dir)
    except RunError as exc:
        return fail("report", str(exc))
    if not run.records:
        return fail("report", f"no records in {_results_file(run)}: nothing to report")
    recommendation = recommend(run)
    try:
        path = write_report(run, recommendation.lines(), answer=answer(run, recommendation))
    except OSError as exc:
        return fail("report", f"cannot write {report_path(run)}: {exc.strerror or exc}")
    except ReportUnavailable as exc:
        return fail("report", str(exc))
    for message in run.warnings:
        warn("report", message)
    say(shown(str(path)))  # one line: a newline in the reports folder's name is shown
    return 0


def _results_file(run: Run) -> Path:
    source = Path(run.source)
    return source / RESULTS_FILE if source.is_dir() else source
