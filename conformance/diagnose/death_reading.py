"""What a process's death means, and the first thing to run or check: reasoned from the signal, not matched.

* SIGKILL (-9, 137, "Killed") from a process that printed no traceback is a kill from outside: the
  memory killer the logs name (the kernel's, a cgroup's, SLURM's, Kubernetes', Ray's), else the
  scheduler's time limit where the logs say so, else the host's OOM killer is likeliest: its kernel log
  says (``dmesg -T``, ``journalctl -k``, the cgroup's ``memory.events``).
* SIGSEGV (-11, 139), SIGILL, SIGFPE: native code crashed (torch, NCCL, a driver, an extension): what to
  collect (faulthandler's stack, a core dump, the versions).
* SIGABRT (-6, 134): the process aborted: glibc's heap check, a failed assert or an uncaught C++
  exception says why, quoted where the logs hold it.
* SIGBUS (-7, 135): most often /dev/shm full in a container.
* SIGTERM (-15, 143), SIGINT, SIGHUP: stopped from outside, not a cause of its own where another rank
  failed; alone, the scheduler's reason where the logs give one (time limit, preemption, a cancel).
* A non-zero exit status (no signal): the process's own error, in its own log.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.diagnose.deaths import SIGNAL_NAMES, Death, MemoryKill, Stop
from conformance.diagnose.logs import LogLine
from conformance.diagnose.stories import JobFacts, ProcessStory
from conformance.verdict import job_causes
from conformance.verdict.job_causes import FailureClass

STOP_SIGNALS = (15, 2, 1)  # SIGTERM, SIGINT, SIGHUP: sent from outside to stop, not a crash
CRASH_SIGNALS = (11, 4, 8)  # SIGSEGV, SIGILL, SIGFPE: the process's own native code
VERSIONS = (
    "`python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'` and "
    "`nvidia-smi` (the driver)"
)
COLLECT_CRASH = (
    "collect the Python stack at the crash (PYTHONFAULTHANDLER=1, or `python -X faulthandler`), a core dump "
    "(`ulimit -c unlimited` before the run; then `coredumpctl debug` or `gdb -batch -ex bt $(which python) core`) "
    f"and the versions: {VERSIONS}; a crash inside NCCL or torch is often fixed in a later release (their release "
    "notes name it)"
)
KILL_FROM_OUTSIDE = (
    "read the node's kernel log for the kill: `dmesg -T | grep -i -e oom -e 'killed process'` (or `journalctl -k | "
    "grep -i -e oom -e 'killed process'`); in a container or a SLURM job, the cgroup's `memory.events` (its oom_kill "
    "count) and `sacct -j <jobid> -o JobID,State,MaxRSS,ReqMem`; the OOM killer there: use less host memory per node "
    "(fewer DataLoader workers, the checkpoint loaded once, not per rank) or a node with more; none there: something "
    "else sent SIGKILL (a scheduler's limit, a launcher's timeout, `kill -9`)"
)
# What to do about each memory killer (deaths.MEMORY_KILLS names them): its limit, and where it shows.
MEMORY_FIXES = {
    "the kernel's OOM killer (the host": "the host ran out of memory: use less host memory per node (fewer DataLoader "
    "workers, smaller pinned buffers, the checkpoint loaded once, not per rank) or a node with more; `dmesg -T | grep "
    "-i -e oom -e 'killed process'` shows what each process held",
    "the kernel's OOM killer for the memory cgroup": "the container's or the job's memory limit: raise it (SLURM "
    "--mem/--mem-per-gpu, Kubernetes resources.limits.memory, docker --memory) or use less; the cgroup's "
    "`memory.events` counts its oom_kill events, `memory.peak` what it reached",
    "SLURM's memory limit": "raise --mem (or --mem-per-gpu) or use less host memory: `sacct -j <jobid> -o "
    "JobID,State,MaxRSS,ReqMem` shows what each step used against what it asked for",
    "Kubernetes": "raise the container's resources.limits.memory (and requests) or use less host memory; `kubectl "
    "describe pod` shows its Last State: OOMKilled",
    "the kubelet's eviction": "the node ran low on memory and the kubelet evicted the pod: set requests equal to "
    "limits for memory (Guaranteed QoS), or use less; `kubectl describe node` shows the memory pressure",
    "Ray's memory monitor": "Ray's memory monitor killed it (RAY_memory_usage_threshold, 0.95 by default): use less "
    "host memory per node (fewer concurrent tasks or actors, smaller objects) or nodes with more",
}
# Signals other than the usual, and what each means.
OTHER_SIGNALS = {
    13: "its output pipe closed before it finished writing (a launcher, `| tee` or ssh that ended first)",
    24: "the CPU-time limit (`ulimit -t`, or a scheduler's) ran out",
    25: "a file grew past the file-size limit (`ulimit -f`)",
    5: "a breakpoint or a debugger's trap (a debug build, an assert in some libraries)",
}


@dataclass(frozen=True)
class Reading:
    """What a death means: the class, the title and fix, the lines that say so."""

    failure: FailureClass
    title: str
    fix: str
    lines: tuple[LogLine, ...]
    stopped: bool = False  # stopped from outside: not a cause of its own where another rank failed
    specific: bool = True  # False: it names no process of its own (a kernel's or scheduler's line), or no signal


def _rank(death: Death, line: LogLine) -> tuple[int, int]:
    """How telling a death is: a fatal signal over a stop over a status; one that names its process first."""
    if death.signal is None:
        kind = 1 if death.launcher == "Ray" else 0
    else:
        kind = 2 if death.signal in STOP_SIGNALS else 3
    return (kind, death.names_process)


def _most_telling(deaths: list[tuple[Death, LogLine]]) -> tuple[Death, LogLine]:
    return max(deaths, key=lambda pair: _rank(*pair))


def _said(death: Death, line: LogLine, story: ProcessStory) -> tuple[LogLine, ...]:
    """The lines reporting this death: the chosen one, and another reporting the same signal (its name, its number)."""
    same = [other for d, other in story.deaths if other is not line and d.signal == death.signal]
    return (line, *same[:1])


def _memory_killer(death: Death, facts: JobFacts) -> tuple[MemoryKill, LogLine] | None:
    """The memory kill the job's lines report for this death: the one naming its pid, else the first."""
    kills = facts.memory_kills
    same = [pair for pair in kills if death.pid is not None and pair[0].pid == death.pid]
    chosen = same or kills
    return chosen[0] if chosen else None


def _memory_fix(by: str) -> str:
    return next((fix for start, fix in MEMORY_FIXES.items() if by.startswith(start)), KILL_FROM_OUTSIDE)


def _killed(death: Death, line: LogLine, story: ProcessStory, facts: JobFacts) -> Reading:
    killed = job_causes.KILLED
    said = f"{death.said()}, reported by {death.launcher}"
    killer = _memory_killer(death, facts)
    if killer is not None:
        kill, kill_line = killer
        title = f"KILLED FOR MEMORY by {kill.by} ({said})"
        lines = tuple(dict.fromkeys((*_said(death, line, story), kill_line)))
        return Reading(killed, title, _memory_fix(kill.by), lines, specific=death.names_process)
    stop = facts.stop
    if stop is not None and stop[0].key == "TIME LIMIT":
        lines = (*_said(death, line, story), stop[1])
        return Reading(killed, f"KILLED AT {stop[0].why} ({said})", _time_limit_fix(), lines)
    if death.signal is None:  # Ray: the worker died and Ray names no signal
        title = f"WORKER DIED WITHOUT A SIGNAL NAMED ({death.launcher}): SIGKILL by the OOM killer is likeliest"
        return Reading(killed, title, KILL_FROM_OUTSIDE, _said(death, line, story))
    title = f"KILLED FROM OUTSIDE ({said}; no traceback): the host's OOM killer is likeliest"
    return Reading(killed, title, KILL_FROM_OUTSIDE, _said(death, line, story))


def _crash_lines(story: ProcessStory, facts: JobFacts) -> tuple[LogLine, ...]:
    return tuple(story.crash_lines or facts.crash_lines)[:2]


def _crashed(death: Death, line: LogLine, story: ProcessStory, facts: JobFacts) -> Reading:
    said = _crash_lines(story, facts)
    what = {
        4: "; SIGILL: an instruction this CPU lacks (a build for newer CPUs: `grep -o -w 'avx512[a-z]*' /proc/cpuinfo "
        "| sort -u`) or a corrupt binary",
        8: "; SIGFPE: an integer division by zero in native code (a kernel or library given an empty or zero shape)",
    }.get(death.signal or 0, "")
    title = (
        f"NATIVE CRASH: {death.said()}, reported by {death.launcher}: in native code (torch, NCCL, "
        "a CUDA library, the driver or an extension)"
    )
    return Reading(job_causes.KILLED, title, COLLECT_CRASH + what, (*_said(death, line, story), *said))


def _aborted(death: Death, line: LogLine, story: ProcessStory, facts: JobFacts) -> Reading:
    said = _crash_lines(story, facts)
    first = said[0].text.strip() if said else ""
    if "what()" in first or "terminate called" in first:
        why = "an uncaught C++ exception (its what() is quoted)"
    elif "Assertion" in first:
        why = "a failed assert in native code (its file and line are quoted)"
    elif first and "Fatal Python error" not in first:
        why = "glibc found its heap corrupted (the code that corrupted it ran earlier)"
    else:
        why = "abort() called: a failed check, an uncaught C++ exception or glibc's heap checks"
    title = f"ABORTED: {death.said()}, reported by {death.launcher}: {why}" + (f": {first[:120]}" if first else "")
    fix = (
        "what the quoted line says; for heap corruption, rerun under `MALLOC_CHECK_=3` or valgrind; "
        if first
        else "the abort's own message is not in these logs (the rank's stderr: torchrun --log-dir, srun --output); "
    ) + COLLECT_CRASH
    return Reading(job_causes.KILLED, title, fix, (*_said(death, line, story), *said))


def _bus_error(death: Death, line: LogLine, story: ProcessStory) -> Reading:
    title = f"BUS ERROR: {death.said()}, reported by {death.launcher}: /dev/shm full is likeliest"
    fix = (
        "in a container, /dev/shm is 64 MB unless set (Docker's default): `df -h /dev/shm` inside it; run with "
        "--shm-size=16g or --ipc=host (Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm); NCCL and "
        "DataLoader workers use it; else a memory-mapped file truncated under the process, or a failing disk"
    )
    return Reading(job_causes.KILLED, title, fix, _said(death, line, story))


def _time_limit_fix() -> str:
    return (
        "the job ran past its time limit (SLURM: `sacct -j <jobid> -o JobID,State,Elapsed,Timelimit`): if its last "
        "lines show it still making progress, raise --time or checkpoint and resume; if they stop well before, it "
        "hung first (rerun with NCCL_DEBUG=INFO TORCH_NCCL_DUMP_ON_TIMEOUT=1 and a shorter collective timeout)"
    )


def stopped(stop: tuple[Stop, LogLine] | None, deaths: list[tuple[Death, LogLine]]) -> Reading | None:
    """The job stopped from outside, with the scheduler's reason where its lines give one."""
    killed = job_causes.KILLED
    lines = tuple(line for _, line in deaths[:2])
    if stop is not None:
        why, stop_line = stop
        lines = (stop_line, *lines)
        if why.key == "TIME LIMIT":
            return Reading(killed, f"STOPPED AT {why.why} (SIGTERM, then SIGKILL)", _time_limit_fix(), lines)
        if why.key == "NODE FAILURE":
            fault = job_causes.MACHINE_FAULT
            fix = (
                f"SLURM lost node {why.host}: `scontrol show node {why.host}` and slurmctld's log say why; {fault.fix}"
            )
            return Reading(fault, f"STOPPED BY {why.why}", fix, lines)
        fix = (
            "the scheduler stopped the job from outside: nothing in the job failed first (`sacct -j <jobid> -o "
            "JobID,State,Reason`); rerun it, resuming from a checkpoint"
        )
        return Reading(killed, f"STOPPED BY {why.why}", fix, lines)
    if not deaths:
        return None
    death = deaths[0][0]
    title = f"STOPPED FROM OUTSIDE: {death.said()}, reported by {death.launcher}"
    fix = (
        "something outside sent it: the scheduler (a time limit: `sacct -j <jobid> -o JobID,State,Elapsed,Timelimit`; "
        "preemption; a cancel), Kubernetes (a pod deleted or evicted: `kubectl describe pod`), a launcher after "
        "another rank failed (that rank is the story), or a user; nothing in these logs failed before it"
    )
    return Reading(killed, title, fix, lines)


def _other(death: Death, line: LogLine, story: ProcessStory) -> Reading:
    meaning = OTHER_SIGNALS.get(death.signal or 0, "a signal sent to it or raised by its own code")
    name = SIGNAL_NAMES.get(death.signal or 0, f"signal {death.signal}")
    title = f"DIED OF {name} ({death.said()}, reported by {death.launcher}): {meaning}"
    return Reading(job_causes.KILLED, title, COLLECT_CRASH, _said(death, line, story))


def _exited(death: Death, line: LogLine, story: ProcessStory) -> Reading:
    failure = job_causes.UNRECOGNISED
    title = f"{failure.title}: {death.said()}, reported by {death.launcher}"
    lines = tuple(story.errors) or (line,)
    return Reading(failure, title, failure.fix, lines, specific=False)


def read_deaths(story: ProcessStory, facts: JobFacts) -> Reading | None:
    """What the deaths a process's lines report mean (the most telling of them); None when they report none."""
    if not story.deaths:
        return None
    death, line = _most_telling(story.deaths)
    signal = death.signal
    if signal is None and death.launcher != "Ray":
        return _exited(death, line, story)
    if signal in STOP_SIGNALS:
        reading = stopped(facts.stop, [pair for pair in story.deaths if pair[0].signal in STOP_SIGNALS])
        return Reading(reading.failure, reading.title, reading.fix, reading.lines, stopped=True) if reading else None
    if death.oom or signal in (9, None):
        return _killed(death, line, story, facts)
    if signal in CRASH_SIGNALS:
        return _crashed(death, line, story, facts)
    if signal == 6:
        return _aborted(death, line, story, facts)
    if signal == 7:
        return _bus_error(death, line, story)
    return _other(death, line, story)
