"""The smoke run on a real GPU: versions, topology, the suite, and the claims one GPU can check.

    python -m conformance smoke [--out DIR] [--skip-suite]      (tools/gpu_smoke.sh runs this)

Uses the machine's own torch.  Prints the versions (driver, CUDA, torch, NCCL, nvidia-ml-py), the
suite's topology beside ``nvidia-smi topo -m``, runs ``pytest suites/`` with ``--junitxml``, then
checks, each through the suite's own harness:

* the forkserver holds no ``/dev/nvidia*`` descriptor (no CUDA context) after a GPU case ran;
* a world of one passes;
* a real CUDA out-of-memory in a rank is ``error`` with OutOfMemoryError and that rank the root cause;
* a rank spinning in a CUDA kernel is stopped at the deadline with its stack and reaped (timed:
  the figure for the GPU stop ladder in ``deadlines.py``), stopped in its kernel (fork -> init ->
  probe times printed), not while CUDA and NCCL were starting;
* the NCCL log's version, ``torch.cuda.nccl.version()`` and pip's (a difference shown); NCCL's
  ``Init COMPLETE`` logged with the rank past init; the rank's CUDA UUID equal to NVML's, compared;
* NVML's CUDA driver version at least torch's CUDA; the machine-health checks one GPU can run;
* an all-reduce stuck behind a kernel that never ends is named, not retired, by the flight
  recorder's dump at the deadline; on a group whose timeout is short, torch's own dump on that
  timeout lands in the rank's folder and names it;
* the stop ladder timed: an idle rank, one spinning in a kernel and one holding most of the GPU's
  memory and 16 GiB of pinned host memory, each reaped once by SIGTERM and once (ignoring SIGTERM)
  by SIGKILL; the longest reap is the figure for the GPU stop ladder's kill wait;
* a device-to-device copy timed by the probes' code is within 10% of CUDA events' timing;
* a ``MIG-`` or unknown ``GPU-`` entry in CUDA_VISIBLE_DEVICES stops ``pytest`` with exit status 4.

It ends with one table and exit status 0 only when every check passed.  Without a GPU the GPU
checks say NOT RUN and the exit status is 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from conformance.cli.common import fail, say
from conformance.cli.smoke_checks import (
    FAIL,
    NOT_RUN,
    PASS,
    Check,
    driver_covers_torch,
    flight_recorder_names_stuck,
    health_snapshot,
    init_complete_in_init,
    kill_wait_figure,
    nccl_versions_agree,
    spin_placement,
    stop_ladder_line,
    torch_dump_in_rank_folder,
    uuid_compared,
)
from conformance.common import casefiles
from conformance.common.bounded_parse import NotParsed, json_value
from conformance.common.casefiles import rank_dir, read_phases
from conformance.common.clock import wall
from conformance.common.deadlines import GPU_STOP_LADDER, Deadlines, StopLadder
from conformance.common.inputs import NotReadable, absolute
from conformance.common.outside_text import shown
from conformance.discover.topology import Topology, TopologyError
from conformance.discover.topology_source import discover
from conformance.discover.versions import SUITE_DISTRIBUTION, nccl_wheel_version, package_version
from conformance.launch.case import CaseResult, CaseRunner, CaseSpec
from conformance.rank import flight_recorder
from conformance.rank.probes import holding_step

COPY_TIMING_TOLERANCE = 0.10
# Room for CUDA and NCCL init before a kernel that never ends (seconds on a cold GPU); then 10 s without
# progress is a hang.
SPIN_DEADLINES = Deadlines(init_timeout=60, op_timeout=10, case_timeout=120, grace=3, backend="nccl", step_timeout=10)
SUITE_TIMEOUT = 3600
# The stop ladder timed: a rank that holds still (idle, spinning, holding memory) is stopped once it has
# made no progress for its hold's time; SIGTERM gets a minute to reap it, and a rank that ignores SIGTERM
# gets a minute after SIGKILL.  Pinning 16 GiB of host memory took over 6 s on an H200 VM
# (docs/gpu-runs/2026-11-27-h200): the memory hold waits 45 s, so it is stopped holding, not allocating.
HOLDS = ("idle", "spinning", "memory")
HOLD_STEP_TIMEOUTS = {"idle": 6.0, "spinning": 6.0, "memory": 45.0}
HOLD_DEADLINES = Deadlines(init_timeout=60, op_timeout=10, case_timeout=180, grace=3, backend="nccl", step_timeout=6)
TIMED_LADDERS = {
    "SIGTERM": StopLadder(dump_wait=GPU_STOP_LADDER.dump_wait, term_wait=60, kill_wait=GPU_STOP_LADDER.kill_wait),
    "SIGKILL": StopLadder(dump_wait=GPU_STOP_LADDER.dump_wait, term_wait=0.5, kill_wait=60),
}
# torch's watchdog times the group out after 5 s; the suite's own step deadline waits a minute.
TORCH_GROUP_TIMEOUT = 5
TORCH_FIRST_DEADLINES = replace(SPIN_DEADLINES, step_timeout=60)


def versions() -> dict[str, str | None]:
    found = {name: package_version(name) for name in ("torch", "nvidia-ml-py", "pytest", SUITE_DISTRIBUTION)}
    script = (
        "import json, torch; nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None; "
        "print(json.dumps({'cuda (torch)': torch.version.cuda, 'nccl': '.'.join(map(str, nccl)) if nccl else None}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    try:
        said = json_value(done.stdout) if done.returncode == 0 else None
    except NotParsed:  # a warning printed on stdout before it: not known, as when the child fails
        said = None
    found.update(said if isinstance(said, dict) else {"cuda (torch)": None, "nccl": None})
    return found


def show_topology(out: Path) -> str:
    """``python -m conformance topology`` and ``nvidia-smi topo -m``, one after the other."""
    command = [sys.executable, "-m", "conformance", "topology"]
    ours = subprocess.run(command, capture_output=True, text=True, check=False)
    text = ours.stdout + ours.stderr
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False)
        text += "\nnvidia-smi topo -m:\n" + smi.stdout + smi.stderr
    else:
        text += "\nnvidia-smi: not found\n"
    (out / "topology.txt").write_text(text)
    return text


SUITES = Path(__file__).resolve().parents[2] / "suites"  # the checkout's suites


def run_suite(out: Path) -> Check:
    junit = out / "junit.xml"
    if not SUITES.is_dir():
        return Check("pytest suites/", FAIL, f"no suites folder at {SUITES}: run from a checkout")
    command = [sys.executable, "-m", "pytest", str(SUITES), f"--junitxml={junit}", f"--reports-dir={out / 'reports'}",
               "-p", "no:cacheprovider", "-q"]  # fmt: skip
    with (out / "suite.log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=SUITE_TIMEOUT, check=False)
    code = done.returncode
    tail = casefiles.tail(out / "suite.log").strip().splitlines()[-1:]  # the log's end only, however long it grew
    return Check("pytest suites/", PASS if code == 0 else FAIL, f"exit {code}: {' '.join(tail)} ({junit})")


def case(runner: CaseRunner, topology: Topology, probe: str, **params: object) -> CaseResult:
    gpu = topology.devices[0]
    backend = runner.deadlines.backend
    spec = CaseSpec(f"smoke::{probe}", probe, (gpu,), backend, visible=topology.devices, params=params)
    return runner.run(spec)


def one_case(run_dir: Path, deadlines: Deadlines, topology: Topology, probe: str, **params: object) -> CaseResult:
    """One case on a runner (and forkserver) of its own, closed after it."""
    runner = CaseRunner(run_dir, deadlines)
    try:
        return case(runner, topology, probe, **params)
    finally:
        runner.close()


def nvidia_descriptors(pid: int) -> list[str]:
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.append(target)
    return sorted(set(found))


def world_of_one_and_forkserver(runner: CaseRunner, topology: Topology, found: dict[str, str | None]) -> list[Check]:
    result = case(runner, topology, "all_reduce", sizes=[4, 1 << 20])
    one = Check("world of one (NCCL all-reduce, checked)", PASS if result.verdict == "pass" else FAIL,
                f"{result.verdict} {result.decision.summary}".strip())  # fmt: skip
    server = runner.server.proc
    held = nvidia_descriptors(server.pid) if server is not None else ["no forkserver"]
    fork = Check("forkserver holds no /dev/nvidia* descriptor", FAIL if held else PASS, ", ".join(held) or "none")
    nccl = result.nccl or {}
    metrics = result.reports[0].metrics if result.reports else {}
    phases = read_phases(rank_dir(result.case_dir, 0))
    return [
        one,
        fork,
        nccl_versions_agree(found.get("nccl"), nccl.get("version"), nccl_wheel_version()),
        init_complete_in_init(phases, bool(nccl.get("completed_inits"))),
        uuid_compared(metrics.get("cuda_device"), topology.devices[0].uuid),
    ]


def out_of_memory(runner: CaseRunner, topology: Topology) -> Check:
    result = case(runner, topology, "oom_while_waiting", failing_rank=0, delay=0)
    root = result.decision.root
    ok = result.verdict == "error" and root is not None and root.rank == 0 and root.error_type == "OutOfMemoryError"
    return Check("real CUDA OOM -> error, root cause rank 0", PASS if ok else FAIL, result.decision.summary[:160])


def spinning_kernel(out: Path, topology: Topology) -> list[Check]:
    result = one_case(out / "spin", SPIN_DEADLINES, topology, "spin_kernel")
    stacks = all(r.stack for r in result.reports)
    ok = result.verdict == "hang" and stacks and not result.unkillable
    detail = (
        f"{result.verdict}; stacks {'taken' if stacks else 'missing'}; deadline -> reaped {result.stop_seconds:.2f}s "
        f"(stop ladder allows {GPU_STOP_LADDER.total:g}s; kill wait {GPU_STOP_LADDER.kill_wait:g}s)"
    )
    stopped = Check("spinning kernel stopped with its stack, reaped", PASS if ok else FAIL, detail)
    rank = result.reports[0] if result.reports else None
    phases = read_phases(rank_dir(result.case_dir, 0))
    return [stopped, spin_placement(phases, rank.phase if rank else "", rank.step if rank else "")]


def stuck_collective(out: Path, topology: Topology) -> Check:
    """A world of one whose all-reduce waits behind a kernel that never ends: the deadline's dump names it."""
    result = one_case(out / "stuck", SPIN_DEADLINES, topology, "stuck_all_reduce")
    return flight_recorder_names_stuck(result.reports[0].collectives if result.reports else None)


def torch_timeout_dump(out: Path, topology: Topology) -> Check:
    """The same all-reduce on a group whose timeout is short: torch's watchdog acts first and dumps."""
    result = one_case(out / "torch-dump", TORCH_FIRST_DEADLINES, topology, "stuck_all_reduce",
                      group_timeout=TORCH_GROUP_TIMEOUT)  # fmt: skip
    ended = f"exit {result.reports[0].exit}" if result.reports else "no rank report"
    return torch_dump_in_rank_folder(flight_recorder.torch_dumps(rank_dir(result.case_dir, 0)), ended)


def stop_ladder_timings(
    out: Path,
    topology: Topology,
    holds: Sequence[str] = HOLDS,
    deadlines: Deadlines = HOLD_DEADLINES,
    waits: Mapping[str, float] = HOLD_STEP_TIMEOUTS,
    **params: object,
) -> list[Check]:
    """Each kind of rank stopped by SIGTERM, then another of its kind (ignoring SIGTERM) by SIGKILL; reaps timed.

    ``deadlines``' backend runs the ranks (gloo: CPU ranks, as the project's own tests run this);
    ``waits``: each hold's step timeout (what it may take to get hold of what it holds).
    """
    checks, reaps = [], []
    for what in holds:
        timed = []
        for sig, ladder in TIMED_LADDERS.items():
            run_dir = out / f"stop-{what}-{sig}"
            timing = replace(deadlines, ladder=ladder, step_timeout=waits[what])
            result = one_case(run_dir, timing, topology, "hold", what=what, ignore_sigterm=sig == "SIGKILL", **params)
            timed.append(result)
            reaps += [step.seconds for step in result.stop_steps if step.reaped]
        placed = all(r.reports and r.reports[0].step == holding_step(what) for r in timed)
        checks.append(stop_ladder_line(what, placed, timed[0].stop_steps, timed[1].stop_steps))
    return [*checks, kill_wait_figure(reaps, GPU_STOP_LADDER.kill_wait)]


def copy_timing(runner: CaseRunner, topology: Topology) -> Check:
    sizes = {"bandwidth_bytes": 256 << 20, "bandwidth_iterations": 20, "bandwidth_warmup": 5}
    result = case(runner, topology, "copy_timing", **sizes)
    probe_gbps, events_gbps = result.metrics.get("probe_timing_gbps"), result.metrics.get("cuda_events_gbps")
    if result.verdict != "pass" or not probe_gbps or not events_gbps:
        return Check("copy timing: probe code vs CUDA events", FAIL, result.decision.summary or "no figures")
    ratio = probe_gbps / events_gbps
    ok = abs(ratio - 1) <= COPY_TIMING_TOLERANCE
    return Check("copy timing: probe code vs CUDA events", PASS if ok else FAIL,
                 f"{probe_gbps:.1f} vs {events_gbps:.1f} GB/s, ratio {ratio:.3f}")  # fmt: skip


def refused_entries(out: Path) -> Check:
    codes = {}
    for entry in ("MIG-00000000-0000-0000-0000-000000000000", "GPU-ffffffff-dead-beef-0000-000000000000"):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": entry}
        command = [sys.executable, "-m", "pytest", str(SUITES), "--collect-only", "-q", "-p", "no:cacheprovider",
                   f"--reports-dir={out / 'reports-refused'}"]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
        codes[entry.split("-")[0]] = (done.returncode, (done.stderr.strip().splitlines() or [""])[-1][:120])
    ok = all(code == 4 for code, _ in codes.values())
    detail = "; ".join(f"{k}: exit {code} {line}" for k, (code, line) in codes.items())
    return Check("MIG-/unknown CUDA_VISIBLE_DEVICES entry -> exit 4", PASS if ok else FAIL, detail)


GPU_CHECKS = (
    "world of one (NCCL all-reduce, checked)",
    "forkserver holds no /dev/nvidia* descriptor",
    "NCCL: log, torch.cuda.nccl.version() and pip",
    "NCCL Init COMPLETE logged (eager init with device_id)",
    "rank's CUDA UUID equals NVML's (32 hex digits)",
    "CUDA driver >= torch's CUDA",
    "one-GPU health snapshot",
    "real CUDA OOM -> error, root cause rank 0",
    "spinning kernel stopped with its stack, reaped",
    "spin: the hung rank was in probe (kernel spinning)",
    "flight recorder: the stuck nccl:all_reduce, not retired",
    "torch's own dump on its timeout, in the rank folder",
    *(f"stop ladder, {what} rank: TERM -> reap, KILL -> reap" for what in HOLDS),
    "stop ladder: longest reap within the GPU kill wait",
    "copy timing: probe code vs CUDA events",
    "MIG-/unknown CUDA_VISIBLE_DEVICES entry -> exit 4",
)


def gpu_checks(out: Path, topology: Topology, found: dict[str, str | None]) -> list[Check]:
    runner = CaseRunner(out / "checks", Deadlines(30, 30, 60, 3, backend="nccl"))
    gpu = topology.devices[0]
    checks: list[Check] = [
        driver_covers_torch(topology.cuda_driver, found.get("cuda (torch)")),
        health_snapshot({gpu.name: topology.health[gpu.name]} if gpu.name in topology.health else {}),
    ]
    steps: list[Callable[[], list[Check]]] = [
        lambda: world_of_one_and_forkserver(runner, topology, found),
        lambda: [out_of_memory(runner, topology)],
        lambda: [copy_timing(runner, topology)],
    ]
    try:
        for step in steps:
            checks += step()
    finally:
        runner.close()
    return [
        *checks,
        *spinning_kernel(out, topology),
        stuck_collective(out, topology),
        torch_timeout_dump(out, topology),
        *stop_ladder_timings(out, topology),
        refused_entries(out),
    ]


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'check'.ljust(width)}  result   detail", f"{'-' * width}  -------  ------"]
    lines += [f"{c.name.ljust(width)}  {c.status.ljust(7)}  {c.detail}" for c in checks]
    return "\n".join(lines)


def gpu_topology() -> tuple[Topology | None, str]:
    """The GPUs NVML finds, or None and why not."""
    try:
        topology = discover("auto", 1)
    except (TopologyError, ValueError) as exc:
        return None, str(exc)
    if topology.source != "nvml":
        return None, topology.note.removeprefix("no GPU: ")
    return topology, ""


def run(out: Path, skip_suite: bool) -> int:
    try:
        absolute(out)
        out.mkdir(parents=True, exist_ok=True)
    except NotReadable as exc:
        return fail("smoke", f"--out {out} {exc}")
    except FileExistsError:
        return fail("smoke", f"--out {out}: is there already, and not a folder")
    except OSError as exc:
        return fail("smoke", f"--out {out}: cannot make the folder: {exc.strerror or exc}")
    found = versions()
    say("versions: " + ", ".join(f"{k} {v or 'n/a'}" for k, v in found.items()))
    say(show_topology(out))
    topology, why_not = gpu_topology()
    if topology is not None:
        say(f"driver {topology.driver}, CUDA driver {topology.cuda_driver}")
    checks = [] if skip_suite else [run_suite(out)]
    if topology is not None:
        checks += gpu_checks(out, topology, found)
    else:
        checks += [Check(name, NOT_RUN, f"no GPU: {why_not}") for name in GPU_CHECKS]
    say(table(checks))
    summary = {"time": wall(), "versions": found, "checks": [asdict(c) for c in checks]}
    (out / "smoke.json").write_text(json.dumps(summary, indent=2))
    say(f"\nwritten to {shown(str(out))}")
    return 0 if all(c.status == PASS for c in checks) else 1


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "smoke",
        help="the smoke run on a GPU machine: versions, topology, the suite, one-GPU checks",
        description=__doc__.split("\n\n")[0],
    )
    default = Path("reports") / time.strftime("smoke-%Y%m%d-%H%M%S")
    parser.add_argument("--out", type=Path, default=default, help=f"where to write (default {default})")
    parser.add_argument("--skip-suite", action="store_true", help="only the checks, not pytest suites/")
    parser.set_defaults(run=lambda args: run(args.out, args.skip_suite))
