"""The smoke run's judgements: what each line of its table claims, decided from what a case left.

Each function takes plain facts (a rank's phase lines, its metrics, versions, NVML's health) and
returns one line of the table, so every claim is unit-tested here without a GPU and the smoke run
on a GPU only gathers the facts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conformance.common.casefiles import PhaseLine
from conformance.discover.health import (
    GpuHealth,
    clock_problems,
    fabric_problems,
    memory_problems,
    mode_problems,
    pcie_problems,
)
from conformance.launch.processes import StopStep
from conformance.plan.transport import cuda_version
from conformance.rank.context import uuid_digits

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"
SPIN_STEP = "kernel spinning"  # rank/probes.py spin_kernel's step


@dataclass
class Check:
    name: str
    status: str
    detail: str


def _since(phases: Sequence[PhaseLine], name: str, start: float) -> str:
    found = next((p.clock for p in phases if p.phase == name and p.clock is not None), None)
    return f"{found - start:.1f}s" if found is not None else "-"


def spin_placement(phases: Sequence[PhaseLine], stopped_phase: str, stopped_step: str) -> Check:
    """The spinning rank was stopped in its kernel, not earlier (CUDA and NCCL init may take seconds)."""
    name = "spin: the hung rank was in probe (kernel spinning)"
    if not phases or phases[0].clock is None:
        return Check(name, FAIL, "the rank wrote no phase line")
    start = phases[0].clock
    times = " -> ".join(f"{p} {_since(phases, p, start)}" for p in ("init", "probe"))
    where = f"stopped in {stopped_phase} ({stopped_step})"
    ok = stopped_phase == "probe" and stopped_step == SPIN_STEP
    return Check(name, PASS if ok else FAIL, f"fork 0.0s -> {times}; {where}")


def uuid_compared(cuda_device: Mapping[str, Any] | None, nvml_uuid: str | None) -> Check:
    """The rank's CUDA device UUID equals NVML's, 32 hex digits, and the rank's own check compared them."""
    name = "rank's CUDA UUID equals NVML's (32 hex digits)"
    found = str((cuda_device or {}).get("uuid") or "")
    digits, expected = uuid_digits(found), uuid_digits(nvml_uuid or "")
    if not (cuda_device or {}).get("compared"):
        return Check(name, FAIL, f"the rank did not compare (cuda_device {dict(cuda_device or {})})")
    ok = len(digits) == 32 and digits == expected
    return Check(name, PASS if ok else FAIL, f"torch {found or '-'}; NVML {nvml_uuid or '-'}")


def driver_covers_torch(cuda_driver: str | None, torch_cuda: str | None) -> Check:
    """NVML's CUDA driver version is at least the CUDA torch was built for."""
    name = "CUDA driver >= torch's CUDA"
    driver, built = cuda_version(cuda_driver), cuda_version(torch_cuda)
    detail = f"driver supports CUDA {cuda_driver or '-'}, torch built for {torch_cuda or '-'}"
    if driver is None or built is None:
        return Check(name, FAIL, f"{detail}: a version is missing")
    return Check(name, PASS if driver >= built else FAIL, detail)


def nccl_versions_agree(torch_nccl: str | None, log_nccl: str | None, pip_nccl: str | None) -> Check:
    """The NCCL log's version is what torch reports loaded; pip's is shown, a difference named."""
    name = "NCCL: log, torch.cuda.nccl.version() and pip"
    log = (log_nccl or "").split("+")[0] or None
    detail = f"log {log_nccl or '-'}, torch {torch_nccl or '-'}, pip {pip_nccl or '-'}"
    pip = (pip_nccl or "").split(" ")[0] or None
    if pip and torch_nccl and pip != torch_nccl:
        detail += f" (pip's differs: the loaded library is {torch_nccl})"
    ok = log is not None and log == torch_nccl
    return Check(name, PASS if ok else FAIL, detail)


def init_complete_in_init(phases: Sequence[PhaseLine], completed: bool) -> Check:
    """NCCL's communicator was made eagerly, in the rank's init phase (``device_id``): Init COMPLETE logged."""
    name = "NCCL Init COMPLETE logged (eager init with device_id)"
    entered = [p.phase for p in phases]
    ok = completed and "init" in entered and entered.index("init") < len(entered) - 1
    return Check(name, PASS if ok else FAIL, f"Init COMPLETE {'seen' if completed else 'not seen'}; phases {entered}")


def health_snapshot(health: Mapping[str, GpuHealth]) -> Check:
    """The machine-health checks one GPU can run: PCIe width, memory (ECC, remapping), fabric, modes, clocks."""
    name = "one-GPU health snapshot"
    if not health:
        return Check(name, FAIL, "NVML gave no health facts")
    judged = {
        "pcie": pcie_problems(health), "memory": memory_problems(health), "fabric": fabric_problems(health),
        "modes": mode_problems(health), "clocks": clock_problems(health),
    }  # fmt: skip
    problems = [f"{check}: {gpu}: {text}" for check, found in judged.items() for gpu, text in found.items()]
    return Check(name, FAIL if problems else PASS, "; ".join(problems) or f"{', '.join(judged)}: no problem")


def flight_recorder_names_stuck(collectives: Mapping[str, Any] | None) -> Check:
    """The dump at the deadline parses and names the stuck all-reduce, not retired."""
    name = "flight recorder: the stuck nccl:all_reduce, not retired"
    if not collectives or collectives.get("error"):
        return Check(name, FAIL, (collectives or {}).get("error") or "no dump")
    last = collectives.get("last") or []
    stuck = [e for e in last if _is_all_reduce(e) and not e.get("retired") and e.get("state") != "completed"]
    return Check(name, PASS if stuck else FAIL, _entries(last))


def _is_all_reduce(entry: Mapping[str, Any]) -> bool:
    return "all_reduce" in str(entry.get("op"))


def _entries(last: Sequence[Mapping[str, Any]]) -> str:
    shown = (f"{e.get('op')} #{e.get('seq')} state {e.get('state')} retired {e.get('retired')}" for e in last)
    return "; ".join(shown) or "no collective recorded"


def torch_dump_in_rank_folder(dumps: Mapping[str, Mapping[str, Any] | None], exit_label: str) -> Check:
    """Torch's own watchdog timed the all-reduce out first: its dump is in the rank folder, parses, names it."""
    name = "torch's own dump on its timeout, in the rank folder"
    if not dumps:
        return Check(name, FAIL, f"no torch_flight_recorder_* file; the rank ended: {exit_label}")
    file, summary = next(iter(dumps.items()))
    if not summary or summary.get("error"):
        return Check(name, FAIL, f"{file}: {(summary or {}).get('error') or 'not a flight-recorder dump'}")
    last = summary.get("last") or []
    named = any(_is_all_reduce(e) for e in last)
    return Check(name, PASS if named else FAIL, f"{file} ({exit_label}): {_entries(last)}")


def _reaped_after(steps: Sequence[StopStep], signal: str) -> float | None:
    """Seconds from ``signal`` to the last reap; None when it was not sent or did not reap."""
    return next((s.seconds for s in steps if s.signal == signal and s.reaped), None)


def stop_ladder_line(what: str, placed: bool, by_term: Sequence[StopStep], by_kill: Sequence[StopStep]) -> Check:
    """One kind of rank stopped twice: once by SIGTERM, once (ignoring SIGTERM) by SIGKILL; each reap timed.

    ``placed``: both ranks were holding what they were asked to when the watchdog stopped them.
    """
    name = f"stop ladder, {what} rank: TERM -> reap, KILL -> reap"
    term, kill = _reaped_after(by_term, "SIGTERM"), _reaped_after(by_kill, "SIGKILL")
    shown = [f"TERM -> reap {_seconds(term)}", f"KILL -> reap {_seconds(kill)}"]
    if not placed:
        shown.append(f"the rank was not {what} when stopped")
    return Check(name, PASS if placed and term is not None and kill is not None else FAIL, ", ".join(shown))


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}s"


def kill_wait_figure(reaps: Sequence[float], kill_wait: float) -> Check:
    """The longest reap timed is the figure for the GPU stop ladder's kill wait: within it, or the wait is too short."""
    name = "stop ladder: longest reap within the GPU kill wait"
    if not reaps:
        return Check(name, FAIL, "no reap was timed")
    longest = max(reaps)
    detail = f"longest reap {longest:.2f}s; deadlines.GPU_STOP_LADDER.kill_wait {kill_wait:g}s"
    return Check(name, PASS if longest <= kill_wait else FAIL, detail)
