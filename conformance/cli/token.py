"""``python -m conformance token``: a run token for a run across nodes (256 random bits).

Printed, or written to a new file only this user can read (``--file``: mode 0600, as
``--run-token-file`` requires), which every node of the run then reads.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from conformance.cli.common import fail, say
from conformance.common.run_token import MIN_TOKEN_BITS, new_token


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "token",
        help="make a run token for a run across nodes",
        description=(
            f"Make a run token (secrets.token_urlsafe(32): 256 random bits; a run token needs {MIN_TOKEN_BITS}). "
            "Give every node of one run the same token: CONFORMANCE_RUN_TOKEN, or --run-token-file FILE. "
            "Under SLURM, MUNGE signs the run without one."
        ),
    )
    parser.add_argument(
        "--file",
        type=Path,
        metavar="FILE",
        help="write it to FILE, a new file of mode 0600, instead of printing it",
    )
    parser.set_defaults(run=token_command)


def token_command(args: argparse.Namespace) -> int:
    token = new_token()
    if args.file is None:
        say(token)
        return 0
    try:  # made with mode 0600 from the start: never readable by others, not even for a moment
        fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return fail("token", f"cannot make {str(args.file)!r}: {exc.strerror or exc}")
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token + "\n")
    say(f"a run token written to {args.file} (mode 0600): give every node --run-token-file {args.file}")
    return 0
