"""``conformance-healthcheck``: a SLURM node health check that drains the node the quick suite fails on.

    conformance-healthcheck [--time-limit SECONDS] [--node NAME] [--reports-dir DIR] [--keep N]
                            [--tests SPEC]... [--no-drain] [--no-resume] [PYTEST OPTION]...
    python -m conformance.cli.slurm_health ...

Runs a quick part of the suite on this node (the host checks of ``test_environment.py`` and
``test_machine_health.py``, and one all-reduce over every GPU; ``--matrix inherited``: the node as
it is, no ladder; ``--nnodes 1``: this node alone, whatever job it runs in) under a hard time
limit, and on anything but a pass drains the node:

    scontrol update NodeName=<node> State=DRAIN Reason="gpu-conformance: <the answer's first failure>"

The suite itself stays read-only; ``scontrol`` is called here and only here.  The node's state and
reason are read first (``sinfo``): a node an administrator or anything else already drained, took
down or reserved is left as it is, saying so.  On a pass it does nothing to the node, except resume
one whose reason is still exactly the one this check set (kept in the reports folder,
``drain-reason``); ``--no-resume`` leaves that to a person.  The node's name (``--node``,
``SLURMD_NODENAME`` or the host name) must be one node's: a hostlist expression or ``ALL`` is
refused, never given to ``scontrol``.  Options it does not know go to
pytest (``--expect-gpus 8``, ``--backend nccl``, ``--scenario NAME``, ``--topology-file FILE``, ...).

Made for slurm.conf's ``HealthCheckProgram`` (root, no arguments, an environment of
``SLURMD_NODENAME`` alone, killed after 60 s: the default time limit leaves room for the stop and
``scontrol``) and for a job ``Prolog``.  Exit status: 0 healthy; 1 unhealthy (drained, or
``--no-drain``); 2 bad arguments; 3 unhealthy and the drain failed (the message says why).
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
from conformance.common import values
from conformance.common.outside_text import shown
from conformance.common.suite import SUITES_DIR
from conformance.record.results import LATEST
from conformance.record.run_folder import run_id_of
from conformance.record.runs import Run, RunError, load_run
from conformance.summarise.answer import answer
from conformance.summarise.recommend import recommend

PROG = "conformance-healthcheck"
REASON_PREFIX = "gpu-conformance:"  # every drain reason this program writes, and the only ones it resumes
# slurmdbd keeps a node event's reason in a MySQL TINYTEXT column (its event table): 255 bytes.
REASON_BYTES = 255
QUICK_TESTS = ("test_environment.py", "test_machine_health.py", "test_collectives.py::test_all_reduce")
QUICK_OPTIONS = ("--matrix=inherited", "--nnodes=1", "--node-rank=0", "-p", "no:cacheprovider", "-v")
# slurmd kills a HealthCheckProgram after 60 s: the suite gets 40, its stop 5, the output 1, scontrol 5 a call.
DEFAULT_TIME_LIMIT = 40.0
STOP_SECONDS = 5.0  # after SIGTERM, before SIGKILL; the suite stops its ranks on SIGTERM
OUTPUT_SECONDS = 1.0  # for the rest of pytest's output once it has ended
SCONTROL_SECONDS = 5.0
DEFAULT_KEEP = 20
HEALTHY, UNHEALTHY, USAGE, DRAIN_FAILED = 0, 1, 2, 3
OUTPUT_TAIL = 200  # lines of pytest's output kept for the reason when no answer names one
# slurmd gives a HealthCheckProgram no PATH at all; scontrol is looked for on PATH, then here.
SLURM_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin", "/usr/local/sbin")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TEST_LINE = re.compile(r"^(\S+::\S+)")  # pytest -v names each test as it starts
# One node's name: SLURM's hostlist syntax ("n[1-4]", "n1,n2"), ALL and spaces would reach other nodes.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# sinfo's state words of a node someone holds out of service (a "+drain" or "*" suffix included)
HELD_STATES = ("drain", "down", "fail", "maint", "reserved", "future", "inval", "reboot", "power_down")
OUR_REASON_FILE = "drain-reason"  # in the reports folder: the exact reason this check last set


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
    """What the quick suite said about the node: healthy, or the reason to drain it."""

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
        print(f"{PROG}: SLURM_LOCALID={env['SLURM_LOCALID']}: the node's first task runs the health check")
        return HEALTHY
    try:
        node = node_name(args.node, env)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return USAGE
    reports = args.reports_dir or default_reports_dir(env)
    outcome = run_quick_suite(args, pytest_args, reports, env)
    prune_runs(reports, args.keep)
    if outcome.healthy:
        untested = f" (CPU ONLY: no GPU tested: {shown(outcome.cpu_only)})" if outcome.cpu_only else ""
        print(f"{PROG}: node {node}: healthy{untested}")
        if not (args.no_resume or args.no_drain):
            resume_if_ours(node, reports, env)
        return HEALTHY
    print(f"{PROG}: node {node}: UNHEALTHY: {outcome.reason}")
    if args.no_drain:
        return UNHEALTHY
    return drain(node, outcome.reason, reports, env)


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


def run_quick_suite(
    args: argparse.Namespace, pytest_args: Sequence[str], reports: Path, env: Mapping[str, str]
) -> Outcome:
    """Run the quick suite within the time limit; its answer, or why there is none."""
    try:
        reports.mkdir(parents=True, exist_ok=True)
        before = {path.name for path in reports.iterdir()}
    except OSError as exc:
        return Outcome(False, f"cannot use the reports folder {reports}: {exc.strerror or exc}")
    command = quick_suite_command(args.tests, reports, pytest_args)
    print(f"{PROG}: {' '.join(command)}", flush=True)
    child_env = {**env, "PATH": env.get("PATH") or DEFAULT_PATH}
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
    if timed_out:
        started = [m.group(1) for line in tail if (m := TEST_LINE.match(line))]
        where = f": stopped in {started[-1]}" if started else ""
        return Outcome(False, f"no answer within {args.time_limit:g}s (the health check's time limit){where}")
    if process.returncode == 0:
        return Outcome(True, cpu_only=_cpu_only(reports, before))
    return Outcome(False, failure_reason(reports, before, list(tail), process.returncode))


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


def _new_run(reports: Path, before: set[str]) -> Run | None:
    """The run this health check just made (``latest``, new since it started); None where there is none."""
    latest = reports / LATEST
    if not latest.is_symlink() or latest.resolve().name in before:
        return None
    try:
        return load_run(latest.resolve())
    except RunError:
        return None


def _cpu_only(reports: Path, before: set[str]) -> str | None:
    run = _new_run(reports, before)
    return run.facts.cpu_only if run is not None else None


def failure_reason(reports: Path, before: set[str], output: Sequence[str], status: int) -> str:
    """The answer's first failing line; where the run left no answer, pytest's own last word."""
    run = _new_run(reports, before)
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


def drain_reason(text: str) -> str:
    """``gpu-conformance: <text>`` on one line, cut to what slurmdbd keeps (255 bytes)."""
    reason = f"{REASON_PREFIX} {shown(' '.join(text.split()))}".encode("ascii", "replace")
    if len(reason) <= REASON_BYTES:
        return reason.decode()
    return reason[: REASON_BYTES - 3].decode() + "..."


def scontrol(env: Mapping[str, str]) -> str | None:
    path = env.get("PATH") or ""
    return shutil.which("scontrol", path=os.pathsep.join([path, *SLURM_BIN_DIRS]))


def _scontrol(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str] | str:
    """The result of ``scontrol ARGS``, or why it could not be run."""
    program = scontrol(env)
    if program is None:
        return f"scontrol not found (PATH and {', '.join(SLURM_BIN_DIRS)})"
    try:
        return subprocess.run(
            [program, *args], env=dict(env), capture_output=True, text=True, timeout=SCONTROL_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{program} {args[0]}: {exc}"


def drain(node: str, text: str, reports: Path, env: Mapping[str, str]) -> int:
    """Drain the node with the answer's failure, unless someone else already holds it out of service."""
    reason = drain_reason(text)
    found = node_state(node, env)
    if found is not None and held_by_someone_else(*found):
        state, theirs = found
        print(f"{PROG}: node {node}: already {shown(state)} by someone else ({shown(theirs)}): left as it is")
        return UNHEALTHY
    done = _scontrol(env, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
    if isinstance(done, str) or done.returncode != 0:
        why = done if isinstance(done, str) else (done.stderr or done.stdout).strip()
        print(f"{PROG}: node {node}: the drain failed: {shown(why)}", file=sys.stderr)
        return DRAIN_FAILED
    if found is None:  # its state unread: a drain already there may be a person's, so this check never resumes it
        print(f"{PROG}: node {node}: its state could not be read first (sinfo): it will not be resumed by this check")
    else:
        with contextlib.suppress(OSError):  # without it the node is only never resumed by this check: safe
            (reports / OUR_REASON_FILE).write_text(reason + "\n")
    print(f"{PROG}: node {node}: drained: {reason}")
    return UNHEALTHY


def node_state(node: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    """(state, reason) as sinfo names them (``drained``, ``gpu-conformance: ...``); None when unknown."""
    program = scontrol(env)
    sinfo = Path(program).with_name("sinfo") if program else None
    if sinfo is None or not sinfo.exists():
        return None
    try:
        done = subprocess.run(
            [str(sinfo), "-h", "-N", "-n", node, "-o", "%T|%E"],
            env=dict(env), capture_output=True, text=True, timeout=SCONTROL_SECONDS, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    state, _, reason = line.partition("|")
    return (state.strip(), reason.strip()) if state else None


def held_by_someone_else(state: str, reason: str) -> bool:
    """A node drained, down or reserved for a reason this check did not write."""
    held = any(word in state.lower() for word in HELD_STATES)
    return held and not reason.startswith(REASON_PREFIX)


def drained_by_us(state: str, reason: str) -> bool:
    return "drain" in state.lower() and reason.startswith(REASON_PREFIX)


def resume_if_ours(node: str, reports: Path, env: Mapping[str, str]) -> None:
    """Resume the node only while its reason is exactly the one this check last set; any other drain stays."""
    found = node_state(node, env)
    if found is None or not drained_by_us(*found):
        return
    try:
        ours = (reports / OUR_REASON_FILE).read_text().strip()
    except OSError:
        ours = ""
    if found[1] != ours:
        print(f"{PROG}: node {node}: drained with a reason this check did not set last ({shown(found[1])}): left "
              "for a person")  # fmt: skip
        return
    done = _scontrol(env, "update", f"NodeName={node}", "State=RESUME")
    if isinstance(done, str) or done.returncode != 0:
        why = done if isinstance(done, str) else (done.stderr or done.stdout).strip()
        print(f"{PROG}: node {node}: healthy again, but the resume failed: {shown(why)}", file=sys.stderr)
        return
    with contextlib.suppress(OSError):
        (reports / OUR_REASON_FILE).unlink()
    print(f"{PROG}: node {node}: resumed (drained earlier by this health check: {shown(found[1])})")


def prune_runs(reports: Path, keep: int) -> None:
    """Keep the newest ``keep`` runs of the health check's reports folder; remove the older ones' folders."""
    try:
        runs = {p: run_id_of(p.name) for p in reports.iterdir() if p.is_dir() and not p.is_symlink()}
    except OSError:
        return
    latest = reports / LATEST
    current = latest.resolve().name if latest.is_symlink() else None
    kept = sorted({run_id for run_id in runs.values() if run_id}, reverse=True)[:keep]
    for path, run_id in runs.items():
        if run_id and run_id not in kept and path.name != current:
            shutil.rmtree(path, ignore_errors=True)


def console() -> NoReturn:
    """The ``conformance-healthcheck`` command (``[project.scripts]``)."""
    raise SystemExit(main())


if __name__ == "__main__":
    console()
