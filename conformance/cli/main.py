"""``conformance`` (or ``python -m conformance``): what happens outside a test run.

    python -m conformance --version
    python -m conformance topology [--json] [--topology-file FILE] [--virtual-devices N]
    python -m conformance recommend [RUN]
    python -m conformance compare BASELINE CURRENT [--bandwidth-tolerance R] [--json]
    python -m conformance report [RUN]
    python -m conformance merge-junit -o OUT IN...
    python -m conformance smoke [--out DIR] [--skip-suite]
    python -m conformance diagnose PATH... [--json]
    python -m conformance token [--file FILE]

Each command is a module of this package with ``register(commands)``, which adds its argparse
subcommand with a ``run`` function returning the exit status; bad input prints one line to stderr
and exits 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import NoReturn

from conformance.cli import compare, diagnose, merge_junit, recommend, report, smoke, token, topology
from conformance.cli.common import PROG, USAGE_ERROR, RaisingParser, UsageError, say
from conformance.common.outside_text import shown
from conformance.discover.versions import SUITE_DISTRIBUTION, suite_version

COMMANDS = (topology, recommend, compare, report, merge_junit, smoke, diagnose, token)


EXAMPLES = """examples:
  conformance diagnose slurm-1234.out           why a failed training job failed, and what fixes it
  conformance compare reports/good reports/latest   what got worse since a known-good run (exit 1 if anything)
  conformance report reports/latest             the last run as one self-contained HTML page

the suite itself runs under pytest: pytest suites/  (docs/tutorial.md: five minutes, first run to CI)"""


def build_parser() -> argparse.ArgumentParser:
    parser = RaisingParser(
        prog=PROG,
        description="GPU environment conformance: what happens outside a test run.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    version = suite_version() or "unknown (the package is not installed)"
    parser.add_argument("--version", action="version", version=f"{SUITE_DISTRIBUTION} {version}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        say(f"{PROG}: error: {shown(str(exc))}", error=True)
        return USAGE_ERROR
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


def console() -> NoReturn:
    """The ``conformance`` command (``[project.scripts]``)."""
    raise SystemExit(main())
