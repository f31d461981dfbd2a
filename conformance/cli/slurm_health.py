"""``conformance-healthcheck``: a SLURM node health check that drains the node the quick suite fails on.

    conformance-healthcheck [--time-limit SECONDS] [--node NAME] [--reports-dir DIR] [--keep N]
                            [--state-dir DIR] [--lock-wait SECONDS] [--tests SPEC]...
                            [--no-drain] [--no-resume] [PYTEST OPTION]...
    python -m conformance.cli.slurm_health ...

Runs a quick part of the suite on this node (the host checks of ``test_environment.py`` and
``test_machine_health.py``, and one all-reduce over every GPU; ``--matrix inherited``: the node as
it is, no ladder; ``--nnodes 1``: this node alone, whatever job it runs in) under a hard time
limit, and on anything but a pass drains the node:

    scontrol update NodeName=<node> State=DRAIN Reason="gpu-conformance: <the answer's first failure>"

The suite itself stays read-only; ``scontrol`` is called by this program only (``slurm_node``).  A
drain already there, an administrator's or anyone's, whatever its reason says, is never overwritten:
the node's state is read first (``sinfo``), and a node whose state cannot be read is not drained.  On
a pass it resumes only a node drained with, byte for byte, the reason it recorded setting
(``drain_record``); ``--no-resume`` leaves that to a person.  The checks of one machine run one at a
time (a lock held across the run, the drain and the resume), and each reads its own run's folder,
named by the run id it gives the suite.  The node's name (``--node``, ``SLURMD_NODENAME`` or the
host name) must be one node's: a hostlist expression or ``ALL`` is refused, never given to
``scontrol``.  Options it does not know go to pytest (``--expect-gpus 8``, ``--backend nccl``,
``--scenario NAME``, ``--topology-file FILE``, ...).

Made for slurm.conf's ``HealthCheckProgram`` (root, no arguments, an environment of
``SLURMD_NODENAME`` alone, killed after 60 s: the default time limits leave room for the lock, the
stop and ``sinfo``/``scontrol``) and for a job ``Prolog``.  Exit status: 0 healthy; 1 unhealthy
(drained, left as someone drained it, or ``--no-drain``); 2 bad arguments; 3 unhealthy and not drained
(the drain failed, or the node's state could not be read; the message says why); 4 not checked
(another check of this machine holds the lock, or the state folder cannot be used).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn

from conformance.cli.common import RaisingParser, UsageError, argument_type
from conformance.cli.drain_record import DrainRecord, StateError, Unreadable, default_state_dir
from conformance.cli.slurm_node import DrainReason, drain_node, read_node_state, resume_node
from conformance.common import values
from conformance.common.outside_text import shown
from conformance.common.suite import SUITES_DIR
from conformance.record.results import CLAIM_TRIES, new_run_id
from conformance.record.run_folder import GIVEN_RUN_ID, run_id_of
from conformance.record.runs import Run, RunError, load_run
from conformance.summarise.answer import answer
from conformance.summarise.recommend import recommend

PROG = "conformance-healthcheck"
QUICK_TESTS = ("test_environment.py", "test_machine_health.py", "test_collectives.py::test_all_reduce")
QUICK_OPTIONS = ("--matrix=inherited", "--nnodes=1", "--node-rank=0", "-p", "no:cacheprovider", "-v")
# slurmd kills a HealthCheckProgram after 60 s: the lock gets 3, the suite 40, its stop 5, the output 1,
# sinfo and scontrol 5 each.
DEFAULT_LOCK_WAIT = 3.0
DEFAULT_TIME_LIMIT = 40.0
STOP_SECONDS = 5.0  # after SIGTERM, before SIGKILL; the suite stops its ranks on SIGTERM
OUTPUT_SECONDS = 1.0  # for the rest of pytest's output once it has ended
DEFAULT_KEEP = 20
HEALTHY, UNHEALTHY, USAGE, DRAIN_FAILED, NOT_CHECKED = 0, 1, 2, 3, 4
OUTPUT_TAIL = 200  # lines of pytest's output kept for the reason when no answer names one
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TEST_LINE = re.compile(r"^(\S+::\S+)")  # pytest -v names each test as it starts
# One node's name: SLURM's hostlist syntax ("n[1-4]", "n1,n2"), ALL and spaces would reach other nodes.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def build_parser() -> argparse.ArgumentParser:
    parser = RaisingParser(
        prog=PROG,
        allow_abbrev=False,  # an abbreviation of ours must not swallow a pytest option
        description=(
            "Run a quick part of the GPU conformance suite on this node; drain the node in SLURM when it fails. "
            "Options not listed here go to pytest."
        ),
    )
    parser.add_argument(
        "--time-limit",
        type=argument_type(values.positive_seconds),
        default=DEFAULT_TIME_LIMIT,
        metavar="SECONDS",
        help=f"the suite's hard limit; past it the node drains (default {DEFAULT_TIME_LIMIT:.0f}: slurmd kills a "
        "HealthCheckProgram at 60 s)",
    )
    parser.add_argument("--node", metavar="NAME", help="SLURM node name (default: $SLURMD_NODENAME, else hostname -s)")
    parser.add_argument(
        "--reports-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the health check's own reports folder (default: $CONFORMANCE_REPORTS_DIR, else "
        "/var/lib/gpu-conformance/healthcheck as root)",
    )
    parser.add_argument(
        "--keep",
        type=argument_type(lambda raw: values.whole_number(raw, minimum=1)),
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"run folders kept in the reports folder, newest first (default {DEFAULT_KEEP})",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the record of this check's drain and its lock, one per machine, writable by this user alone (default: "
        "$CONFORMANCE_HEALTHCHECK_STATE_DIR, else /var/lib/gpu-conformance/healthcheck-state as root, else "
        "$XDG_STATE_HOME/gpu-conformance/healthcheck-state)",
    )
    parser.add_argument(
        "--lock-wait",
        type=argument_type(values.positive_seconds),
        default=DEFAULT_LOCK_WAIT,
        metavar="SECONDS",
        help=f"how long to wait for another check of this machine to end before giving up, exit status 4 (default "
        f"{DEFAULT_LOCK_WAIT:g}; a Prolog may wait longer than a HealthCheckProgram's 60 s)",
    )
    parser.add_argument(
        "--tests",
        action="append",
        metavar="SPEC",
        help="a test of the suite to run instead of the quick set (repeatable; relative to the suite's folder: "
        f"{', '.join(QUICK_TESTS)})",
    )
    parser.add_argument("--no-drain", action="store_true", help="say what is wrong, change nothing in SLURM")
    parser.add_argument("--no-resume", action="store_true", help="leave a node this program drained drained")
    return parser


@dataclass(frozen=True)
class Outcome:
    """What the quick suite said about the node: healthy, or the reason to drain it (outside text, not yet escaped)."""

    healthy: bool
    reason: str = ""
    cpu_only: str | None = None  # a healthy run of CPU ranks: no GPU was tested


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        args, pytest_args = parse(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return USAGE
    if env.get("SLURM_LOCALID", "0") != "0":  # srun -n2 on one node: its first task checks the node
        print(f"{PROG}: SLURM_LOCALID={shown(env['SLURM_LOCALID'])}: the node's first task runs the health check")
        return HEALTHY
    try:
        node = node_name(args.node, env)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return USAGE
    record = DrainRecord(args.state_dir or default_state_dir(env))
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(record.locked(args.lock_wait))
        except StateError as exc:
            print(f"{PROG}: node {node}: NOT CHECKED, nothing changed in SLURM: {shown(str(exc))}", file=sys.stderr)
            return NOT_CHECKED
        return check_node(args, pytest_args, node, record, env)


def check_node(
    args: argparse.Namespace, pytest_args: Sequence[str], node: str, record: DrainRecord, env: Mapping[str, str]
) -> int:
    """Run the quick suite, then drain or resume the node: all under the machine's health check lock."""
    outcome = run_quick_suite(args, pytest_args, args.reports_dir or default_reports_dir(env), env)
    if outcome.healthy:
        untested = f" (CPU ONLY: no GPU tested: {shown(outcome.cpu_only)})" if outcome.cpu_only else ""
        print(f"{PROG}: node {node}: healthy{untested}")
        if not (args.no_resume or args.no_drain):
            resume_if_ours(node, record, env)
        return HEALTHY
    print(f"{PROG}: node {node}: UNHEALTHY: {shown(outcome.reason)}")
    if args.no_drain:
        return UNHEALTHY
    return drain_unless_held(node, outcome.reason, record, env)


def node_name(given: str | None, env: Mapping[str, str]) -> str:
    """The node's SLURM name: ``--node``, else $SLURMD_NODENAME, else the short host name; one node's only."""
    for source, name in (("--node", given), ("SLURMD_NODENAME", env.get("SLURMD_NODENAME")),
                         ("the host name", socket.gethostname().split(".")[0])):  # fmt: skip
        if name:
            if NODE_NAME.fullmatch(name) and name.upper() != "ALL":
                return name
            raise UsageError(
                f"{source} is {shown(name)!r}, not one node's name (letters, digits, '.', '_' and '-'; no hostlist "
                "expression or ALL, which scontrol would apply to other nodes)"
            )
    raise UsageError("no node name: give --node NAME")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our own options, and the rest for pytest (everything after ``--`` goes to pytest as it is)."""
    own, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args, unknown = build_parser().parse_known_args(own)
    return args, [*unknown, *rest]


def default_reports_dir(env: Mapping[str, str]) -> Path:
    if env.get("CONFORMANCE_REPORTS_DIR"):
        return Path(env["CONFORMANCE_REPORTS_DIR"])
    if os.geteuid() == 0:
        return Path("/var/lib/gpu-conformance/healthcheck")
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "gpu-conformance" / "healthcheck"


def quick_suite_command(tests: Sequence[str] | None, reports: Path, pytest_args: Sequence[str]) -> list[str]:
    named = [spec if Path(spec.split("::")[0]).exists() else str(SUITES_DIR / spec) for spec in tests or QUICK_TESTS]
    return [sys.executable, "-m", "pytest", *named, f"--reports-dir={reports}", *QUICK_OPTIONS, *pytest_args]


def fresh_run_id(reports: Path) -> str:
    """A run id no folder of ``reports`` has: the suite's run takes it, and this check reads that folder alone."""
    for _ in range(CLAIM_TRIES):
        run_id = new_run_id()
        if not (reports / run_id).exists():
            return run_id
    raise FileExistsError(f"{CLAIM_TRIES} new run ids were all taken")


def run_quick_suite(
    args: argparse.Namespace, pytest_args: Sequence[str], reports: Path, env: Mapping[str, str]
) -> Outcome:
    """Run the quick suite within the time limit; its answer, or why there is none."""
    try:
        reports.mkdir(parents=True, exist_ok=True)
        run_id = fresh_run_id(reports)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Outcome(False, f"cannot use the reports folder {reports}: {why}")
    command = quick_suite_command(args.tests, reports, pytest_args)
    print(f"{PROG}: {shown(' '.join(command))}", flush=True)
    child_env = {**env, "PATH": env.get("PATH") or DEFAULT_PATH, GIVEN_RUN_ID: run_id}
    process = subprocess.Popen(
        command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL)
    reader = threading.Thread(target=_echo, args=(process.stdout, tail), daemon=True)
    reader.start()
    timed_out = not _wait(process, args.time_limit)
    reader.join(timeout=OUTPUT_SECONDS)  # a process pytest left would hold the pipe open
    if tail and not tail[-1].endswith("\n"):
        print()
    with contextlib.suppress(OSError):  # the run's own folder has the rest; this is the last output, for the admin
        (reports / "healthcheck.log").write_text("".join(tail), errors="replace")
    prune_runs(reports, args.keep, run_id)
    if timed_out:
        return Outcome(False, timed_out_reason(args.time_limit, list(tail)))
    run = own_run(reports, run_id)
    if process.returncode == 0:
        return Outcome(True, cpu_only=run.facts.cpu_only if run is not None else None)
    return Outcome(False, failure_reason(run, list(tail), process.returncode))


def _echo(stream: IO[str] | None, tail: deque[str]) -> None:
    for line in stream or ():
        tail.append(line)
        sys.stdout.write(line)
        sys.stdout.flush()


def _wait(process: subprocess.Popen[str], limit: float) -> bool:
    """Whether pytest ended within ``limit``; if not, it is stopped (SIGTERM, then SIGKILL) and reaped."""
    try:
        process.wait(timeout=limit)
        return True
    except subprocess.TimeoutExpired:
        pass
    process.send_signal(signal.SIGTERM)  # the suite stops its ranks and forkserver on SIGTERM
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return False


def own_run(reports: Path, run_id: str) -> Run | None:
    """The run this check started (the folder of the run id it gave the suite); None where the suite made none."""
    folder = reports / run_id
    if not folder.is_dir():
        return None
    try:
        return load_run(folder)
    except (RunError, OSError, ValueError):
        return None


def timed_out_reason(limit: float, output: Sequence[str]) -> str:
    """The reason of a run stopped at the time limit: the test pytest had started last."""
    started = [m.group(1) for line in output if (m := TEST_LINE.match(line))]
    where = f": stopped in {started[-1]}" if started else ""
    return f"no answer within {limit:g}s (the health check's time limit){where}"


def failure_reason(run: Run | None, output: Sequence[str], status: int) -> str:
    """The answer's first failing line; where the run left no answer, pytest's own last word."""
    if run is not None and (run.records or run.facts.harness_errors):
        rows = answer(run, recommend(run)).rows()
        bad = next((text for text, tone in rows if tone == "bad"), None)
        if bad is not None:
            return f"SIMULATED: {bad}" if run.simulated else bad
    errors = [line.strip().removeprefix("ERROR: ") for line in output if line.startswith("ERROR: ")]
    if errors:
        return errors[0]
    last = next((line.strip(" =\n") for line in reversed(output) if line.strip(" =\n")), "")
    return f"pytest exit status {status}" + (f": {last}" if last else "")


def drain_unless_held(node: str, text: str, record: DrainRecord, env: Mapping[str, str]) -> int:
    """Drain the node with ``text`` (escaped there) and record it, unless a drain or anything else holds it already."""
    found = read_node_state(node, env)
    if isinstance(found, str):
        print(f"{PROG}: node {node}: not drained: its state could not be read first ({shown(found)}), and a drain "
              "already there is never overwritten", file=sys.stderr)  # fmt: skip
        return DRAIN_FAILED
    if found.held:
        ours = record.read(node)
        if isinstance(ours, bytes) and found.drained_with(ours):
            print(f"{PROG}: node {node}: already drained by this health check earlier ({found.shown_reason}): left "
                  "as it is")  # fmt: skip
            return UNHEALTHY
        print(f"{PROG}: node {node}: already {shown(found.state)} by someone else ({found.shown_reason}): left as it "
              "is, its reason unchanged")  # fmt: skip
        if isinstance(ours, bytes) and found.reason != ours:
            record.forget()  # its own drain is gone: a record of it could only ever resume someone else's
        return UNHEALTHY
    reason = DrainReason.of(text)
    failed = drain_node(node, reason, env)
    if failed is not None:
        print(f"{PROG}: node {node}: the drain failed: {shown(failed)}", file=sys.stderr)
        return DRAIN_FAILED
    try:
        record.write(node, reason.raw)
    except OSError as exc:  # without it the node is only never resumed by this check: safe
        print(f"{PROG}: node {node}: its record ({shown(str(record.record_path))}) could not be written "
              f"({exc.strerror or exc}): this check will not resume it")  # fmt: skip
    print(f"{PROG}: node {node}: drained: {reason.text}")
    return UNHEALTHY


def resume_if_ours(node: str, record: DrainRecord, env: Mapping[str, str]) -> None:
    """Resume the node only while its reason is, byte for byte, the one this check recorded setting."""
    ours = record.read(node)
    found = read_node_state(node, env)
    if isinstance(found, str):
        if ours is not None:
            print(f"{PROG}: node {node}: its state could not be read ({shown(found)}): not resumed")
        return
    if isinstance(ours, bytes) and found.reason != ours:
        record.forget()  # resumed or drained again by someone else since: nothing of this check's is left
    if not found.held:
        return
    if isinstance(ours, Unreadable):
        print(f"{PROG}: node {node}: {shown(found.state)} ({found.shown_reason}); this check's record of its drain "
              f"is unreadable ({shown(ours.why)}): left for a person")  # fmt: skip
    elif ours is None or not found.drained_with(ours):
        whose = "not by this check" if ours != found.reason else "not only drained by this check"
        print(f"{PROG}: node {node}: {shown(found.state)}, {whose} ({found.shown_reason}): left for a person")
    else:
        failed = resume_node(node, env)
        if failed is not None:
            print(f"{PROG}: node {node}: healthy again, but the resume failed: {shown(failed)}", file=sys.stderr)
            return
        record.forget()
        print(f"{PROG}: node {node}: resumed (drained earlier by this health check: {found.shown_reason})")


def prune_runs(reports: Path, keep: int, current: str | None = None) -> None:
    """Keep the newest ``keep`` runs of the health check's reports folder (and ``current``); remove the others."""
    try:
        runs = {p: run_id_of(p.name) for p in reports.iterdir() if p.is_dir() and not p.is_symlink()}
    except OSError:
        return
    kept = sorted({run_id for run_id in runs.values() if run_id}, reverse=True)[:keep]
    for path, run_id in runs.items():
        if run_id and run_id not in kept and run_id != current:
            shutil.rmtree(path, ignore_errors=True)


def console() -> NoReturn:
    """The ``conformance-healthcheck`` command (``[project.scripts]``)."""
    raise SystemExit(main())


if __name__ == "__main__":
    console()
