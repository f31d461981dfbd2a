"""How every launcher reports a death, read into one event; what each signal means, reasoned; normal ends kept normal.

The report lines follow the format strings of the programs that print them (each named beside it; the
patterns and their sources are in conformance/diagnose/deaths.py).  Then whole jobs whose only evidence
is such a report: the class, the root-cause rank where the line ties the death to one, and the first
thing to run or check (conformance/diagnose/death_reading.py).  Last, every launcher's and tool's
normal end stays a normal end, behind any prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli.main import main
from conformance.diagnose.deaths import death_in, memory_kill_in, stop_in
from conformance.diagnose.writers import parse_line

# line -> (launcher, signal, exit status, rank, local rank, task, host)
Expected = tuple[str, int | None, int | None, int | None, int | None, int | None, str | None]
REPORTS: dict[str, tuple[str, Expected]] = {
    # torch/distributed/elastic/multiprocessing/errors/__init__.py ProcessFailure; multiprocessing/api.py
    "torchrun's table": (
        "  traceback : Signal 6 (SIGABRT) received by PID 123",
        ("torchrun", 6, None, None, None, None, None),
    ),
    "torchrun's agent, a signal": (
        "failed (exitcode: -9) local_rank: 3 (pid: 4242) of binary: /usr/bin/python3",
        ("torchrun", 9, None, None, 3, None, None),
    ),
    "torchrun's agent, an exit status": (
        "failed (exitcode: 1) local_rank: 0 (pid: 7) of fn: main (start_method: spawn)",
        ("torchrun", None, 1, None, 0, None, None),
    ),
    # torch/multiprocessing/spawn.py ProcessExitedException
    "torch.multiprocessing.spawn": (
        "torch.multiprocessing.spawn.ProcessExitedException: process 2 terminated with signal SIGSEGV",
        ("torch.multiprocessing", 11, None, None, 2, None, None),
    ),
    # Lib/subprocess.py CalledProcessError.__str__ (accelerate's launcher raises it)
    "Python's subprocess, a signal": (
        "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' died with <Signals.SIGKILL: 9>.",
        ("Python's subprocess", 9, None, None, None, None, None),
    ),
    "Python's subprocess, 128+N": (
        "subprocess.CalledProcessError: Command 'bash run.sh' returned non-zero exit status 137.",
        ("Python's subprocess", 9, None, None, None, None, None),
    ),
    # deepspeed/launcher/launch.py sigkill_handler
    "DeepSpeed's launcher": (
        "['/usr/bin/python', '-u', 'train.py', '--local_rank=2'] exits with return code = -11",
        ("DeepSpeed's launcher", 11, None, None, 2, None, None),
    ),
    # orte/tools/orterun/help-orterun.txt (Open MPI 4); PRRTE's two lines, joined by the reader
    "mpirun": (
        "mpirun noticed that process rank 3 with PID 0 on node n1 exited on signal 9 (Killed).",
        ("mpirun", 9, None, 3, None, None, "n1"),
    ),
    "prterun, joined": (
        "prterun noticed that process rank 2 with PID 4431 on node n1 exited on signal 11 (Segmentation fault).",
        ("mpirun", 11, None, 2, None, None, "n1"),
    ),
    "mpirun's non-zero exit, joined": (
        "  Process name: [[12345,1],3]   Exit code:    2",
        ("mpirun", None, 2, 3, None, None, None),
    ),
    # orte/mca/errmgr/base/help-errmgr-base.txt normal-termination-but
    "Open MPI 4's normal termination, but": (
        "a non-zero exit code. Per user-direction, the job has been aborted.",
        ("mpirun", None, None, None, None, None, None),
    ),
    # horovod/runner/gloo_run.py
    "Horovod": ("Process 3 exit with status code 139.", ("Horovod", 11, None, 3, None, None, None)),
    # slurm src/srun/launch.c _task_finish
    "srun, a signal": ("srun: error: node7: task 3: Killed", ("srun", 9, None, None, None, 3, "node7")),
    "srun, a core dump": (
        "srun: error: node7: task 1: Segmentation fault (core dumped)",
        ("srun", 11, None, None, None, 1, "node7"),
    ),
    "srun, an exit status of several tasks": (
        "srun: error: node[1-2]: tasks 0-7: Exited with exit code 2",
        ("srun", None, 2, None, None, None, None),
    ),
    "srun, out of memory": ("srun: error: n1: task 0: Out Of Memory", ("srun", 9, None, None, None, 0, "n1")),
    # pdsh src/pdsh/dsh.c
    "pdsh": ("pdsh@node0: node1: ssh exited with exit code 137", ("pdsh", 9, None, None, None, None, "node1")),
    # bash's job report (jobs.c), and a foreground command's
    "bash's job report": (
        "/var/spool/slurmd/job123/slurm_script: line 12: 1234 Killed                  python train.py",
        ("a shell", 9, None, None, None, None, None),
    ),
    "a shell's Aborted": ("Aborted (core dumped)", ("a shell", 6, None, None, None, None, None)),
    "a shell's Bus error": ("Bus error (core dumped)", ("a shell", 7, None, None, None, None, None)),
    # Modules/faulthandler.c; glog's and Abseil's failure signal handlers
    "faulthandler": ("Fatal Python error: Floating-point exception", ("faulthandler", 8, None, None, None, None, None)),
    "glog's handler": (
        "*** SIGSEGV (@0x0) received by PID 1234 (TID 0x7f12) from PID 0; stack trace: ***",
        ("glog", 11, None, None, None, None, None),
    ),
    "Abseil's handler": (
        "*** SIGABRT received at time=1700000000 on cpu 3 ***",
        ("absl", 6, None, None, None, None, None),
    ),
    # lightning/pytorch/trainer/connectors/signal_connector.py; torchrun's agent stopped
    "Lightning's SIGTERM": ("Received SIGTERM: 15", ("Lightning", 15, None, None, None, None, None)),
    "torchrun's agent got SIGTERM": (
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1234 got signal: 15",
        ("torchrun's agent", 15, None, None, None, None, None),
    ),
    # kubectl describe; kubectl exec; docker ps
    "Kubernetes' exit code": ("      Exit Code:    137", ("Kubernetes", 9, None, None, None, None, None)),
    "kubectl exec": ("command terminated with exit code 139", ("Kubernetes", 11, None, None, None, None, None)),
    "docker ps": ("Exited (134) 2 minutes ago", ("Docker", 6, None, None, None, None, None)),
    # ray/exceptions.py WorkerCrashedError: no signal named
    "Ray's crashed worker": (
        "ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this task.",
        ("Ray", None, None, None, None, None, None),
    ),
}


@pytest.mark.parametrize(("line", "expected"), REPORTS.values(), ids=REPORTS.keys())
def test_each_report_is_one_typed_death(line: str, expected: Expected) -> None:
    death = death_in(parse_line(line)[0].text)

    assert death is not None, line
    assert (
        death.launcher,
        death.signal,
        death.status,
        death.rank,
        death.local_rank,
        death.task,
        death.host,
    ) == expected


NOT_DEATHS = {
    # Ray's own list of what might have happened (src/ray/raylet/node_manager.cc): possibilities, no signal
    "Ray's list of possible causes": "(1) The process is killed by SIGKILL by OOM killer due to high memory usage. (3) "
    "The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.",
    # torchrun stopping the other workers after one failed (multiprocessing/api.py _close)
    "torchrun stopping the others": "Sending process 1234 closing signal SIGTERM",
    "a zero exit status": "srun: error: node1: task 0: Exited with exit code 0",
    "a word in a sentence": "the loss was killed by the learning-rate warm-up",
}


@pytest.mark.parametrize("line", NOT_DEATHS.values(), ids=NOT_DEATHS.keys())
def test_lines_that_name_a_signal_without_a_death_are_none(line: str) -> None:
    assert death_in(line) is None


def test_memory_killers_and_a_schedulers_stops() -> None:
    # linux mm/oom_kill.c; slurm src/plugins/task/cgroup/task_cgroup_memory.c; src/slurmd/slurmstepd/req.c
    kill = memory_kill_in("Out of memory: Killed process 4242 (python3) total-vm:9kB, anon-rss:8kB")
    assert kill is not None and kill.pid == 4242 and "host ran out of memory" in kill.by
    cgroup = memory_kill_in("Memory cgroup out of memory: Killed process 4242 (python3)")
    assert cgroup is not None and "cgroup" in cgroup.by
    slurm = memory_kill_in("slurmstepd: error: Detected 1 oom_kill event in StepId=123.0. Some of the step tasks")
    assert slurm is not None and "--mem" in slurm.by
    stop = stop_in("slurmstepd: error: *** JOB 123 ON n1 CANCELLED AT 2026-11-28T15:44:22 DUE TO TIME LIMIT ***")
    assert stop is not None and stop.key == "TIME LIMIT" and stop.host == "n1"
    cancel = stop_in("slurmstepd: error: *** STEP 123.0 ON n1 CANCELLED AT 2026-11-28T15:44:22 ***")
    assert cancel is not None and "cancel" in cancel.why


# --------------------------------------------------------------------------------------------
# A job whose evidence is a launcher's report: the class, the rank, the first thing to check
# --------------------------------------------------------------------------------------------

STEPS = "\n".join(f"[rank{r}]:step 5" for r in range(4))
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-28_15:44:22
  host      : gpu-node-1
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4240)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4240
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_15:44:20
  host      : gpu-node-1
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 4243)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4243
============================================================"""
# a job's log -> (class, root ranks, words the title or fix holds)
JOBS: dict[str, tuple[str, tuple[str, list[int], tuple[str, ...]]]] = {
    "SIGKILL alone: a kill from outside, the kernel log to read": (
        f"{STEPS}\nsrun: error: node7: task 3: Killed",
        ("killed", [3], ("dmesg -T", "memory.events", "no traceback")),
    ),
    "SIGKILL and the kernel's OOM line for its pid": (
        f"{STEPS}\nNov 28 15:44:21 gpu-node-1 kernel: Out of memory: Killed process 4243 (python3)\n{SUMMARY}",
        ("killed", [3], ("host ran out of memory", "DataLoader")),
    ),
    "SIGKILL for SLURM's memory limit": (
        f"{STEPS}\nslurmstepd: error: Detected 1 oom_kill event in StepId=1.0.\nsrun: error: n2: task 1: Out Of Memory",
        ("killed", [1], ("--mem", "sacct")),
    ),
    "SIGKILL for Kubernetes' memory limit": (
        f"{STEPS}\n      Reason:       OOMKilled\n      Exit Code:    137",
        ("killed", [], ("resources.limits.memory",)),
    ),
    "SIGKILL at SLURM's time limit": (
        f"{STEPS}\nslurmstepd: error: *** STEP 1.0 ON n1 CANCELLED AT 2026-11-28T15:44:22 DUE TO TIME LIMIT ***\n"
        "srun: error: n1: task 2: Killed",
        ("killed", [2], ("time limit", "--time")),
    ),
    "SIGSEGV reported by PRRTE over two lines": (
        f"{STEPS}\nprterun noticed that process rank 2 with PID 4431 on node n1 exited on\n"
        "signal 11 (Segmentation fault).",
        ("killed", [2], ("PYTHONFAULTHANDLER", "ulimit -c unlimited", "torch.cuda.nccl.version()")),
    ),
    "SIGABRT after glibc's heap check, quoted": (
        f"{STEPS}\n[rank1]:free(): invalid pointer\n"
        "failed (exitcode: -6) local_rank: 1 (pid: 4241) of binary: /usr/bin/python3",
        ("killed", [1], ("free(): invalid pointer", "heap")),
    ),
    "SIGABRT after an uncaught C++ exception": (
        f"{STEPS}\n[rank1]:terminate called after throwing an instance of 'std::bad_alloc'\n[rank1]:  what():  "
        "std::bad_alloc\nmpirun noticed that process rank 1 with PID 77 on node n1 exited on signal 6 (Aborted).",
        ("killed", [1], ("uncaught C++ exception", "std::bad_alloc")),
    ),
    "SIGBUS: /dev/shm": (
        f"{STEPS}\nHorovod: Process 2 exit with status code 135.",
        ("killed", [2], ("/dev/shm", "--shm-size")),
    ),
    "SIGTERM at the time limit, nothing failing before": (
        f"{STEPS}\nslurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-11-28T15:44:22 DUE TO TIME LIMIT ***\n"
        "srun: error: n1: task 0: Terminated",
        ("killed", [], ("time limit", "sacct")),
    ),
    "SIGTERM with no reason given": (
        f"{STEPS}\nsrun: error: n1: task 0: Terminated",
        ("killed", [], ("STOPPED FROM OUTSIDE", "preemption")),
    ),
    "SIGTERM to the others after one rank's SIGKILL: the SIGKILL is the story": (
        f"{STEPS}\n{SUMMARY}",
        ("killed", [3], ("SIGKILL",)),
    ),
    "a rank that printed a traceback and was then killed: its error": (
        f'{STEPS}\n[rank2]:Traceback (most recent call last):\n[rank2]:  File "t.py", line 1, in <module>\n'
        "[rank2]:KeyError: 'lr'\nsrun: error: n1: task 2: Killed",
        ("rank_error", [2], ()),
    ),
    # accelerate/commands/launch.py simple_launcher raises subprocess.CalledProcessError; torch/multiprocessing/spawn.py
    "a launcher's exception ending its traceback, a signal": (
        'Traceback (most recent call last):\n  File "/usr/bin/accelerate", line 8, in <module>\n    sys.exit(main())\n'
        "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' died with <Signals.SIGKILL: 9>.",
        ("killed", [], ("dmesg -T",)),
    ),
    "torch.multiprocessing.spawn's exception ending its traceback": (
        f'{STEPS}\nTraceback (most recent call last):\n  File "run.py", line 9, in <module>\n'
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGSEGV",
        ("killed", [1], ("PYTHONFAULTHANDLER",)),
    ),
    "a non-zero exit status only": (
        f"{STEPS}\nmpirun detected that one or more processes exited with non-zero status, thus causing\n"
        "the job to be terminated. The first process to do so was:\n\n  Process name: [[4242,1],3]\n  Exit code:    2",
        ("unrecognised", [3], ("exit status 2",)),
    ),
    "Ray's worker died, no signal named, whatever its message lists": (
        "ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this task. (1) The process is "
        "killed by SIGKILL by OOM killer due to high memory usage. (3) ... due to SIGSEGV",
        ("killed", [], ("WITHOUT A SIGNAL NAMED", "dmesg -T")),
    ),
}


def diagnose(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> tuple[int, dict[str, object]]:
    path = tmp_path / "job.log"
    path.write_text(text + "\n")
    status = main(["diagnose", "--json", str(path)])
    return status, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("log", "expected"), JOBS.values(), ids=JOBS.keys())
def test_a_death_is_reasoned_from_its_signal(
    log: str, expected: tuple[str, list[int], tuple[str, ...]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failure, root, words = expected

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == failure and answer["root_ranks"] == root, answer
    said = f"{answer['title']} {answer['fix']} " + " ".join(e["text"] for e in answer["evidence"])  # type: ignore[attr-defined]
    assert all(word in said for word in words), (words, answer)


def test_the_host_of_a_killed_rank_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, answer = diagnose(
        capsys, tmp_path, "mpirun noticed that process rank 3 with PID 0 on node n1 exited on signal 9 (Killed)."
    )

    assert answer["root"] == "rank 3 (node n1)", answer


# --------------------------------------------------------------------------------------------
# A normal end stays a normal end
# --------------------------------------------------------------------------------------------

NORMAL_ENDS = {
    # torch/distributed/elastic/agent/server/api.py _invoke_run and _exit_barrier, behind each log format torch used:
    # Python's logging (torch <= 1.13), torch 2.1's "[time] name: [LEVEL]", torch >= 2.2's glog-like line
    "torchrun, torch <= 1.13": "INFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully "
    "finished. Waiting 300 seconds for other agents to finish.",
    "torchrun, Python < 3.11's state": "[2023-10-19 08:25:21,316] torch.distributed.elastic.agent.server.api: [INFO] "
    "Local worker group finished (SUCCEEDED). Waiting 300 seconds for other agents to finish",
    "torchrun, Python >= 3.11's state": "I1128 15:44:22.918000 140 torch/distributed/elastic/agent/server/api.py:932] "
    "Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish",
    "torchrun's exit barrier": "I1128 15:44:23.018000 140 torch/distributed/elastic/agent/server/api.py:946] Done "
    "waiting for other agents. Elapsed: 0.0011 seconds",
    # nccl-tests src/common.cu behind Open MPI 4's and PMIx's tags and a paste's leading spaces
    "nccl-tests behind mpirun": "[1,0]<stdout>:# Out of bounds values : 0 OK\n[1,0]<stdout>:# Avg bus bandwidth    : "
    "190.6\n[1,0]<stdout>:#",
    "nccl-tests behind PMIx and spaces": "  [Sat Nov 28 15:44:22 2026][1,0]<stdout>:   # Avg bus bandwidth    : 190.6",
    # slurm src/srun/launch.c, srun -v
    "srun -v": "srun: launch/slurm: _task_finish: node1: tasks 0-7: Completed",
    # deepspeed/launcher/launch.py
    "DeepSpeed's launcher": "[2024-01-01 12:00:00,123] [INFO] [launch.py:351:main] Process 4242 exits successfully.",
}


@pytest.mark.parametrize("log", NORMAL_ENDS.values(), ids=NORMAL_ENDS.keys())
def test_a_normal_end_stays_a_normal_end(log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, answer = diagnose(capsys, tmp_path, f"{STEPS}\n{log}")

    assert status == 0 and answer["verdict"] == "no failure", answer
