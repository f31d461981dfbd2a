"""How launchers, schedulers and shells report a process that died of a signal or exited non-zero: one typed event.

Each report (:data:`DEATH_FORMS`, each citing the program that prints it) becomes a :class:`Death`: the
signal, or the exit status, the rank, task, host or pid the line ties it to, and who reported it.  A
signal comes as a negative return code (Python's ``Popen``, torchrun's ``exitcode : -9``), as 128+N
(a shell's exit status, Kubernetes' ``Exit Code: 137``), by name (``SIGKILL``) or as ``strsignal(3)``'s
text (``Killed``, ``Segmentation fault``): :func:`signal_of` reads each the same way.

Beside deaths, the lines that say who killed a process for memory (:data:`MEMORY_KILLS`: the kernel's
OOM killer, a cgroup's, SLURM's, Kubernetes', Ray's monitor), why a scheduler stopped a job
(:data:`STOPS`: SLURM's time limit, preemption, a cancel), and what a native crash said before it died
(:data:`CRASH_SAYS`: glibc's heap checks, a failed assert, C++'s ``terminate``).  What they mean
together is :mod:`conformance.diagnose.death_reading`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conformance.diagnose.writers import Who

# Linux's signal numbers (signal(7), x86 and Arm) and glibc's strsignal(3) texts, which bash, srun and Open MPI print.
SIGNAL_NAMES = {
    1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
    9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
    24: "SIGXCPU", 25: "SIGXFSZ",
}  # fmt: skip
SIGNAL_TEXTS = {
    "hangup": 1, "interrupt": 2, "quit": 3, "illegal instruction": 4, "trace/breakpoint trap": 5, "aborted": 6,
    "bus error": 7, "floating point exception": 8, "floating-point exception": 8, "killed": 9,
    "user defined signal 1": 10, "segmentation fault": 11, "user defined signal 2": 12, "broken pipe": 13,
    "alarm clock": 14, "terminated": 15, "cpu time limit exceeded": 24, "file size limit exceeded": 25,
}  # fmt: skip
_NUMBERS = {name: number for number, name in SIGNAL_NAMES.items()}
SHELL_SIGNAL_BASE = 128  # a shell's exit status for a child killed by signal N is 128+N (POSIX sh, bash)
_FATAL_TEXTS = "Killed|Segmentation fault|Aborted|Bus error|Floating[- ]point exception|Illegal instruction|Terminated"


@dataclass(frozen=True)
class Death:
    """A process that died of a signal or exited non-zero, as one line reports it."""

    launcher: str  # who reported it: "torchrun", "srun", "mpirun", "a shell", ...
    signal: int | None = None  # the signal that ended it
    status: int | None = None  # its exit status, where it exited (non-zero) rather than died of a signal
    rank: int | None = None
    local_rank: int | None = None
    task: int | None = None
    host: str | None = None
    pid: int | None = None
    core: bool = False  # "(core dumped)"
    through_shell: bool = False  # read from an exit status of 128+N
    oom: bool = False  # the report itself says it was killed for memory (srun's "Out Of Memory", OOMKilled)

    @property
    def who(self) -> Who:
        return Who(self.rank, self.local_rank, self.task, self.host, self.pid)

    @property
    def names_process(self) -> bool:
        """Whether the line says which process died (else it is the process whose output it is)."""
        return any(v is not None for v in (self.rank, self.local_rank, self.task, self.pid))

    @property
    def signal_name(self) -> str:
        return SIGNAL_NAMES.get(self.signal or 0, f"signal {self.signal}")

    def said(self) -> str:
        """In words: "SIGKILL (signal 9, exit status 137)", "exit status 1"."""
        if self.signal is None:
            return f"exit status {self.status}" if self.status is not None else "a non-zero exit"
        shell = f", exit status {SHELL_SIGNAL_BASE + self.signal}" if self.through_shell else ""
        return f"{self.signal_name} (signal {self.signal}{shell}){' with a core dump' * self.core}"


def signal_of(groups: dict[str, str | None]) -> tuple[int | None, int | None, bool]:
    """(signal, exit status, through a shell) from a report's groups.

    ``code``: a return code, negative for a signal; ``status``: an exit status, 128+N for a signal; ``signum``;
    ``signame`` (SIGKILL, KILL); ``sigtext`` (strsignal's text).
    """
    if groups.get("signum"):
        return int(groups["signum"] or 0), None, False
    name = (groups.get("signame") or "").upper()
    if name:
        number = _NUMBERS.get(name if name.startswith("SIG") else f"SIG{name}")
        return (number, None, False) if number else (None, None, False)
    text = (groups.get("sigtext") or "").strip().lower()
    if text in SIGNAL_TEXTS:
        return SIGNAL_TEXTS[text], None, False
    for key in ("code", "status"):
        if groups.get(key):
            value = int(groups[key] or 0)
            if value < 0:
                return -value, None, False
            if SHELL_SIGNAL_BASE < value <= SHELL_SIGNAL_BASE + 64 and value - SHELL_SIGNAL_BASE in SIGNAL_NAMES:
                return value - SHELL_SIGNAL_BASE, None, True
            return None, value, False
    return None, None, False


@dataclass(frozen=True)
class DeathForm:
    """One way a program reports a death.

    Its pattern's named groups: those of :func:`signal_of`, ``rank``, ``local_rank``, ``task`` or ``tasks``,
    ``host``, ``pid``, ``core``, ``oom``; more found elsewhere in the same line: ``also``.
    """

    launcher: str
    pattern: re.Pattern[str]
    also: tuple[re.Pattern[str], ...] = ()


def _re(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


DEATH_FORMS: tuple[DeathForm, ...] = (
    # torchrun: its failure table's "traceback : Signal 9 (SIGKILL) received by PID 123" (torch/distributed/elastic/
    # multiprocessing/errors/__init__.py ProcessFailure: f"Signal {-exitcode} ({signal_name}) received by PID {pid}").
    DeathForm(
        "torchrun", _re(r"Signal (?P<signum>\d{1,2}) \((?P<signame>SIG[A-Z0-9]+)\) received by PID (?P<pid>\d+)")
    ),
    # torchrun's agent (torch/distributed/elastic/multiprocessing/api.py): "failed (exitcode: -9) local_rank: 3 (pid:
    # 1234) of binary: /usr/bin/python3" ("of fn: main (start_method: spawn)" when started as a function).
    DeathForm(
        "torchrun",
        _re(r"failed \(exitcode: (?P<code>-?\d{1,4})\) local_rank: (?P<local_rank>\d{1,5}) \(pid: (?P<pid>\d{1,10})\)"),
    ),
    # torch.multiprocessing.spawn (torch/multiprocessing/spawn.py ProcessExitedException): "process 3 terminated with
    # signal SIGKILL", "process 3 terminated with exit code 1" -- the index spawn gave the function (the local rank).
    DeathForm(
        "torch.multiprocessing",
        _re(
            r"process (?P<local_rank>\d{1,5}) terminated with (?:signal (?P<signame>SIG[A-Z0-9]+)|exit code "
            r"(?P<code>-?\d{1,4}))"
        ),
    ),
    # Python's subprocess.CalledProcessError (Lib/subprocess.py __str__), raised by accelerate's launcher
    # (accelerate/commands/launch.py) and DeepSpeed's runner: "Command '[...]' died with <Signals.SIGKILL: 9>.",
    # "... died with unknown signal 77.", "... returned non-zero exit status 1."
    DeathForm(
        "Python's subprocess",
        _re(
            r"died with <Signals\.(?P<signame>SIG[A-Z0-9]+): \d{1,2}>|died with unknown signal (?P<signum>\d{1,2})"
            r"|returned non-zero exit status (?P<code>-?\d{1,4})"
        ),
        (_re(r"--local[_-]rank[= ](?P<local_rank>\d{1,5})\b"),),
    ),
    # DeepSpeed's launcher (deepspeed/launcher/launch.py sigkill_handler): "[...'--local_rank=3'] exits with return
    # code = -9".
    DeathForm(
        "DeepSpeed's launcher",
        _re(r"exits with return code = (?P<code>-?\d{1,4})"),
        (_re(r"--local[_-]rank[= ](?P<local_rank>\d{1,5})\b"),),
    ),
    # Open MPI's mpirun (orte/tools/orterun/help-orterun.txt, v4) and PRRTE's prterun (src/mca/schizo/prte/
    # help-prun.txt, where "exited on" and "signal 9 (Killed)." are two lines, joined by the reader): "mpirun noticed
    # that process rank 3 with PID 1234 on node n1 exited on signal 9 (Killed)."
    DeathForm(
        "mpirun",
        _re(
            r"noticed that process rank (?P<rank>\d{1,7}) with PID (?P<pid>\d{1,10}) on node (?P<host>\S{1,64}) "
            r"exited on\s+signal (?P<signum>\d{1,2})"
        ),
    ),
    # ... "mpirun detected that one or more processes exited with non-zero status, ... The first process to do so
    # was:" / "  Process name: [[12345,1],3]" / "  Exit code:    1" (help-orterun.txt orterun:non-zero-exit;
    # help-prun.txt prun:non-zero-exit), the last two lines joined by the reader.
    DeathForm(
        "mpirun",
        _re(r"Process name:\s+\[\[\d{1,10},\d{1,10}\],(?P<rank>\d{1,7})\]\s+Exit code:\s+(?P<status>-?\d{1,4})"),
    ),
    # ... Open MPI 4's "Primary job  terminated normally, but 1 process returned" / "a non-zero exit code. Per
    # user-direction, the job has been aborted." (orte/mca/errmgr/base/help-errmgr-base.txt normal-termination-but).
    DeathForm("mpirun", _re(r"non-zero exit codes?\. Per user-direction, the job has been aborted")),
    # Horovod's gloo launcher (horovod/runner/gloo_run.py): "Process 3 exit with status code 137." -- the rank.
    DeathForm("Horovod", _re(r"Process (?P<rank>\d{1,7}) exit with status code (?P<status>-?\d{1,4})\.")),
    # SLURM's srun (src/srun/launch.c _task_finish): "srun: error: node1: task 3: Killed", "srun: error: node[1-2]:
    # tasks 0-7: Exited with exit code 1", "srun: error: n1: task 0: Out Of Memory", "... Segmentation fault (core
    # dumped)" (strsignal's text, and " (core dumped)").
    DeathForm(
        "srun",
        _re(
            r"srun: error: (?P<host>\S{1,200}): tasks? (?P<tasks>[\d,-]{1,200}): (?:Exited with exit code "
            r"(?P<status>\d{1,3})|(?P<oom>Out Of Memory)|(?P<sigtext>[A-Z][\w /-]{2,40}?)(?P<core> \(core dumped\))?)$"
        ),
    ),
    # pdsh (DeepSpeed's multi-node runner) for a remote command that failed: "pdsh@node0: node1: ssh exited with exit
    # code 137" (pdsh src/pdsh/dsh.c: "%s: %s exited with exit code %d").
    DeathForm("pdsh", _re(r"pdsh@\S{1,64}: (?P<host>\S{1,64}): \w+ exited with exit code (?P<status>\d{1,3})")),
    # bash's job report for a command killed by a signal (bash jobs.c): "/var/spool/slurmd/job123/slurm_script: line
    # 12: 1234 Killed   python train.py", "bash: line 1: 1234 Segmentation fault (core dumped) python ...".
    DeathForm(
        "a shell",
        _re(r"line \d{1,7}: +(?P<pid>\d{1,10}) (?P<sigtext>" + _FATAL_TEXTS + r")(?P<core> \(core dumped\))?"),
    ),
    # ... and for a foreground command alone on its line: "Killed", "Segmentation fault (core dumped)", "Aborted".
    DeathForm("a shell", _re(r"^\s*(?P<sigtext>" + _FATAL_TEXTS + r")(?P<core> \(core dumped\))?\s*$")),
    DeathForm("a shell", _re(r"(?P<sigtext>" + _FATAL_TEXTS + r")(?P<core> \(core dumped\))")),
    # CPython's faulthandler (Modules/faulthandler.c faulthandler_handlers): "Fatal Python error: Segmentation fault",
    # "... Bus error", "... Aborted", "... Floating point exception" ("Floating-point" in newer releases).
    DeathForm("faulthandler", _re(r"Fatal Python error: (?P<sigtext>" + _FATAL_TEXTS + r")")),
    # glog's failure signal handler (google/glog src/signalhandler.cc): "*** SIGSEGV (@0x0) received by PID 1234 (TID
    # 0x7f...) from PID 0; stack trace: ***"; Abseil's (absl/debugging/failure_signal_handler.cc, in Ray's core
    # worker): "*** SIGSEGV received at time=1700000000 on cpu 3 ***".
    DeathForm("glog", _re(r"\*\*\* (?P<signame>SIG[A-Z]{2,8}) \(@0x[0-9a-f]{1,16}\) received by PID (?P<pid>\d+)")),
    DeathForm("absl", _re(r"\*\*\* (?P<signame>SIG[A-Z]{2,8}) received at time=\d+")),
    # Lightning's SIGTERM handler (lightning/pytorch/trainer/connectors/signal_connector.py): "[rank: 0] Received
    # SIGTERM: 15".
    DeathForm("Lightning", _re(r"Received SIGTERM: (?P<signum>15)\b")),
    # torchrun's agent itself stopped by a signal (torch/distributed/elastic/multiprocessing/api.py
    # _terminate_process_handler: "Process 1234 got signal: 15" (Python >= 3.11; "Signals.SIGTERM" before), and
    # agent/server/api.py: "Received 15 death signal, shutting down workers").
    DeathForm(
        "torchrun's agent",
        _re(
            r"got signal: (?:Signals\.(?P<signame>SIG[A-Z]+)|(?P<signum>\d{1,2}))\b"
            r"|Received (?:Signals\.)?(?:(?P<signame2>SIG[A-Z]+)|(?P<signum2>\d{1,2})) death signal"
        ),
    ),
    # Kubernetes: kubectl describe's "Exit Code:    137" and a pod's status JSON ("exitCode": 137), kubectl exec's
    # "command terminated with exit code 137" (k8s.io/kubectl/pkg/cmd/exec); Docker's "Exited (137)" (docker ps) and
    # docker compose's "trainer-1 exited with code 137".
    DeathForm(
        "Kubernetes",
        _re(r"^\s*Exit Code:\s+(?P<status>\d{1,3})\s*$|\"exitCode\":\s*(?P<status2>\d{1,3})\b"),
    ),
    DeathForm("Kubernetes", _re(r"command terminated with exit code (?P<status>\d{1,3})")),
    DeathForm("Docker", _re(r"\bExited \((?P<status>\d{1,3})\)|\bexited with code (?P<status2>\d{1,3})\b")),
    # Ray (ray/exceptions.py WorkerCrashedError, RayActorError; the raylet's worker-exit detail, src/ray/raylet/
    # node_manager.cc): the worker process died and Ray does not know of which signal.  Its own text lists "(1) The
    # process is killed by SIGKILL by OOM killer ... (3) ... SIGSEGV": possibilities, never read as a signal here.
    DeathForm(
        "Ray",
        _re(
            r"The worker died unexpectedly while executing this task|Worker unexpectedly exits with a connection "
            r"error code|A worker died or was killed while executing a task by an unexpected system error"
            r"|The actor died unexpectedly before finishing this task"
        ),
        (_re(r"Worker IP address: (?P<host>[0-9A-Fa-f.:]{2,45})"), _re(r"Worker PID: (?P<pid>\d{1,10})")),
    ),
)


def _tied(groups: dict[str, str | None]) -> dict[str, object]:
    """The rank, task, host and pid a report ties the death to (a list of several tasks ties it to none)."""
    tied: dict[str, object] = {}
    for name in ("rank", "local_rank", "pid"):
        if groups.get(name) and (name != "pid" or int(groups[name] or 0) > 0):  # mpirun's "PID 0": not known
            tied[name] = int(groups[name] or 0)
    tasks = groups.get("tasks") or ""
    if tasks.isdigit():
        tied["task"] = int(tasks)
    host = groups.get("host")
    if host and "[" not in host and "," not in host:  # one host, not a SLURM host list
        tied["host"] = host
    return tied


def _groups(form: DeathForm, m: re.Match[str], text: str) -> dict[str, str | None]:
    groups = {name.rstrip("2"): value for name, value in m.groupdict().items() if value is not None}
    for extra in form.also:
        if (found := extra.search(text)) is not None:
            groups.update({k: v for k, v in found.groupdict().items() if v is not None and k not in groups})
    return dict(groups)


def death_in(text: str) -> Death | None:
    """The death a line reports, or None (a zero exit status is no death)."""
    for form in DEATH_FORMS:
        m = form.pattern.search(text)
        if m is None:
            continue
        groups = _groups(form, m, text)
        signal, status, shell = signal_of(groups)
        if status == 0 and signal is None:
            return None
        oom = bool(groups.get("oom"))
        signal = 9 if oom and signal is None else signal
        return Death(
            form.launcher, signal, status, core=bool(groups.get("core")), through_shell=shell, oom=oom,
            **_tied(groups),  # type: ignore[arg-type]
        )  # fmt: skip
    return None


# Lines a reader joins to the next before reading them (a report its program prints over two lines): PRRTE's
# "... exited on" / "signal 9 (Killed).", and Open MPI's "Process name: [[1,1],3]" / "Exit code: 1".
CONTINUED = _re(r"noticed that process rank \d+ with PID \d+ on node \S+ exited on\s*$|^\s*Process name:\s+\S+\s*$")


# --------------------------------------------------------------------------------------------
# Who killed it for memory; why a scheduler stopped the job; what a native crash said
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryKill:
    """A line saying something killed a process for memory: who reported it, who killed (in words), the pid if said."""

    reporter: str
    by: str
    pid: int | None = None


@dataclass(frozen=True)
class MemoryKillForm:
    reporter: str
    by: str
    pattern: re.Pattern[str]


HOST_OOM = "the kernel's OOM killer (the host ran out of memory)"
CGROUP_OOM = "the kernel's OOM killer for the memory cgroup's limit (the container's or job's)"
SLURM_OOM = "SLURM's memory limit (the job's cgroup: --mem, --mem-per-cpu, --mem-per-gpu)"
KUBERNETES_OOM = "Kubernetes (the container's memory limit: resources.limits.memory)"
MEMORY_KILLS: tuple[MemoryKillForm, ...] = (
    # The kernel (mm/oom_kill.c): "Out of memory: Killed process 1234 (python) total-vm:...", "Memory cgroup out of
    # memory: Killed process 1234 (python) ..." (before 5.x: "... Kill process 1234 (python) score 900 or sacrifice
    # child"), its summary "oom-kill:constraint=CONSTRAINT_MEMCG,..." and "oom_reaper: reaped process 1234 (python)".
    MemoryKillForm("the kernel", CGROUP_OOM, _re(r"Memory cgroup out of memory: Kill(?:ed)? process (?P<pid>\d+)")),
    MemoryKillForm("the kernel", HOST_OOM, _re(r"Out of memory: Kill(?:ed)? process (?P<pid>\d+)")),
    MemoryKillForm("the kernel", CGROUP_OOM, _re(r"oom-kill:constraint=CONSTRAINT_MEMCG")),
    MemoryKillForm(
        "the kernel", HOST_OOM, _re(r"oom-kill:constraint=CONSTRAINT_NONE|oom_reaper: reaped process (?P<pid>\d+)")
    ),
    # SLURM's task/cgroup plugin (src/plugins/task/cgroup/task_cgroup_memory.c): "Detected 1 oom_kill event in
    # StepId=123.0. Some of the step tasks have been OOM Killed." (older: "Detected 1 oom-kill event(s) in step 123.0
    # cgroup.").
    MemoryKillForm("slurmstepd", SLURM_OOM, _re(r"Detected \d+ oom[_-]kill events?")),
    # Kubernetes: a container's last state "Reason: OOMKilled" (kubectl describe; "reason": "OOMKilled" in its JSON),
    # and the kubelet's eviction (pkg/kubelet/eviction/helpers.go: "The node was low on resource: memory. ...").
    MemoryKillForm("Kubernetes", KUBERNETES_OOM, _re(r"\bOOMKilled\b")),
    MemoryKillForm(
        "the kubelet",
        "the kubelet's eviction (the node was low on memory)",
        _re(r"The node was low on resource: memory"),
    ),
    # Ray's memory monitor (docs.ray.io, Out-Of-Memory Prevention; ray/exceptions.py OutOfMemoryError): "Task was killed
    # due to the node running low on memory", "... exceeds the memory usage threshold", its "Top 10 memory users:"
    # table ("PID MEM(GB) COMMAND"), the raylet's "1 Workers (tasks / actors) killed due to memory pressure (OOM)".
    MemoryKillForm(
        "Ray",
        "Ray's memory monitor (the node ran low on memory)",
        _re(
            r"ray\.exceptions\.OutOfMemoryError|running low on memory|exceeds the memory usage threshold"
            r"|^PID\s+MEM\(GB\)\s+COMMAND|[1-9]\d* Workers \(tasks / actors\) killed due to memory pressure"
        ),
    ),
)


def memory_kill_in(text: str) -> MemoryKill | None:
    for form in MEMORY_KILLS:
        m = form.pattern.search(text)
        if m is not None:
            pid = m.groupdict().get("pid")
            return MemoryKill(form.reporter, form.by, int(pid) if pid else None)
    return None


# SLURM's slurmstepd (src/slurmd/slurmstepd/req.c): "*** JOB 123 ON n1 CANCELLED AT 2026-11-28T15:44:22 DUE TO TIME
# LIMIT ***", "... DUE TO PREEMPTION ***", "... DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", "... DUE TO
# JOB REQUEUE ***", "... DUE TO TASK FAILURE ***" (--kill-on-bad-exit: another task failed first), "... DUE to SIGNAL
# Terminated ***", and with no reason: a cancel (scancel, or an administrator).
SLURM_STOP = _re(
    r"\*\*\* (?:JOB|STEP) \S{1,40} ON (?P<host>\S{1,64}) CANCELLED AT \S{1,40}"
    r"(?: DUE (?:TO|to) (?P<why>[A-Z][A-Za-z ]{2,40}))?"
)
STOP_REASONS = {
    None: "a cancel (scancel, or an administrator)",
    "TIME LIMIT": "SLURM's time limit",
    "PREEMPTION": "preemption by another job",
    "NODE FAILURE": "the failure of a node (SLURM's controller log says which and why)",
    "JOB REQUEUE": "a requeue",
    "TASK FAILURE": "another task's failure (srun --kill-on-bad-exit)",
}


@dataclass(frozen=True)
class Stop:
    """A scheduler's word that it stopped the job, and why (in words)."""

    why: str
    host: str | None
    key: str  # the reason as SLURM says it ("TIME LIMIT"), "" for a cancel


def stop_in(text: str) -> Stop | None:
    m = SLURM_STOP.search(text)
    if m is None:
        return None
    why = (m["why"] or "").strip().upper()
    key = next((k for k in STOP_REASONS if k and why.startswith(k)), None)
    said = STOP_REASONS[key] if key or not why else f"SLURM ({why.lower()})"
    return Stop(said, m["host"], key or why)


# What a native crash prints before its signal: glibc's heap checks (malloc/malloc.c malloc_printerr: "free(): invalid
# pointer", "double free or corruption (out)", "malloc(): corrupted top size", "corrupted size vs. prev_size",
# "munmap_chunk(): invalid pointer"), its stack protector ("*** stack smashing detected ***: terminated"), a failed
# assert (assert/assert.c: "python: file.cpp:12: void f(): Assertion `x' failed."), libstdc++'s verbose terminate
# handler ("terminate called after throwing an instance of 'c10::Error'", then "  what():  ..."), and CPython's
# faulthandler ("Fatal Python error: Segmentation fault").
CRASH_SAYS = _re(
    r"\b(?:free|malloc|realloc|munmap_chunk|malloc_consolidate|_int_free|_int_malloc|tcache_thread_shutdown)\(\): "
    r"\w|double free or corruption|corrupted size vs\. prev_size|corrupted double-linked list"
    r"|\*\*\* stack smashing detected \*\*\*|Assertion [`'].{1,300}' failed\."
    r"|terminate called (?:after throwing|without|recursively)|^\s*what\(\):\s+\S|Fatal Python error: "
)
