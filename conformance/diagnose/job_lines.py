"""What a job's logs say about the job itself: how big it is, who announced which rank, how it ended.

These are not causes (those are :mod:`conformance.verdict.job_causes`, shared with the suite's own
verdicts): they tell whether a log shows a failure at all, whether it shows the job ending
normally, and which ranks or nodes never appeared.  Every pattern cites where its text comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def _any(*alternatives: str, flags: int = re.IGNORECASE) -> re.Pattern[str]:
    return re.compile("|".join(alternatives), flags)


# --------------------------------------------------------------------------------------------
# Does a line show a failure?
# --------------------------------------------------------------------------------------------

# A word that says something went wrong.  Only lines that are not INFO or warnings count (below).
FAILURE_WORDS = _any(
    r"\b(?:errors?|failures?|failed|fatal|exception|timed out|timeout|aborted|abort|killed|segmentation fault"
    r"|core dumped|panic|died)\b"
)
# A timeout's length stated before the word ("(30 second timeout)", "a 600 s timeout"): a setting or a prompt, never
# one that happened. What failed says so after it: gloo's "Timed out waiting 1800000ms", torch's "Socket Timeout",
# ProcessGroupNCCL's "Watchdog caught collective operation timeout: ... ran for N milliseconds before timing out",
# c10d's "wait timeout after 30000ms" (torch 2.13 sources). Taken out of a line before any failure word is sought.
TIMEOUT_LENGTH = _any(
    r"\b\d+(?:\.\d+)?\s?-?\s?(?:ms|milliseconds?|s|secs?|seconds?|mins?|minutes?|h|hours?)\s+time-?out\b"
)


def without_timeout_lengths(text: str) -> str:
    return TIMEOUT_LENGTH.sub("", text) if "ime" in text else text


# Lines that report, not fail: NCCL's INFO lines (debug.cc "NCCL INFO"), glog's I and W levels of torch's C++ logs
# ("[I1218 ...", "[W1218 ..."), Python warnings ("UserWarning: ...", "FutureWarning: ... will raise an error"),
# logging's WARNING level, and NCCL's own "<VAR> set by environment to <value>" (param.cc) echoing a setting.
NOT_A_FAILURE = _any(
    r"NCCL INFO",
    r"^\s*\[?[IW]\d{4} \d\d:\d\d",
    r"\w*Warning\b",
    r"\bWARNING\b",
    r"\[W(?:ARN(?:ING)?)?\]",
    r"set by environment to",
    flags=0,
)
# NCCL warnings printed on healthy runs: a network plugin or verbs library that is not installed
# (src/misc/ibvwrap.cc "Failed to open libibverbs.so[.1]", src/plugin/net.cc "NET/Plugin: Failed to find
# ncclNetPlugin_v8 symbol", "Failed to open libnccl-net.so").
BENIGN_NCCL_WARNING = _any(
    r"Failed to open lib(?:ibverbs|nccl-net|nccl-tuner|nccl-profiler)",
    r"NET/Plugin",
    r"ncclNetPlugin|ncclCollNetPlugin|ncclTunerPlugin|ncclProfiler",
    r"dlopen",
)

# Exit codes and signals a launcher or shell reports: torchrun's agent ("failed (exitcode: 1) local_rank: 0 (pid:
# 9) of binary", torch/distributed/elastic/multiprocessing/api.py), srun ("srun: error: node3: task 5: Exited with
# exit code 1"), mpirun ("Primary job terminated normally, but 1 process returned a non-zero exit code",
# "mpirun noticed that process rank 3 with PID 0 on node n exited on signal 9 (Killed)"), a shell ("exit status 1"),
# DeepSpeed's launcher ("exits with return code = 1", deepspeed/launcher/launch.py), Ray ("The actor died
# unexpectedly before finishing this task", ray/exceptions.py).
NONZERO_EXIT = _any(
    r"exit ?code(?: is|:|=)? ?(?P<code>-?[1-9]\d{0,3})\b",
    r"exit(?:ed)? (?:with )?(?:status|code)(?: of)? ?(?P<code2>-?[1-9]\d{0,3})\b",
    r"return code ?= ?(?P<code3>-?[1-9]\d{0,3})\b",
    r"returned a non-zero exit code",
    r"exited on signal \d{1,2}",
    r"actor died unexpectedly",
    r"worker group FAILED",
    # nccl-tests exits after its own check fails (src/common.h NCCLCHECK/CUDACHECK): "<host>: Test NCCL failure
    # common.cu:891 'unhandled system error'", "Test CUDA failure common.cu:941 'system not yet initialized'";
    # releases before 2.0: "NCCL failure common.cu:874 'unhandled system error'".
    r"(?:Test )?(?:NCCL|CUDA) failure \S+:\d+ '",
)

# --------------------------------------------------------------------------------------------
# Does a line show the job ending normally?
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormalEnd:
    """A line a program prints only when it finished what it was started for."""

    what: str  # in words, for the answer: "nccl-tests finished"
    pattern: re.Pattern[str]


NORMAL_ENDS: tuple[NormalEnd, ...] = (
    # nccl-tests src/common.cu: PRINT("# Out of bounds values : %d %s\n", ...) then "# Avg bus bandwidth    : %g"
    # (behind mpirun's "[1,0]<stdout>:" and the spaces a paste may add: the writer's prefixes are off already).
    NormalEnd("nccl-tests finished", _any(r"^\s*#\s*Avg bus bandwidth\s*:", flags=0)),
    # torchrun's agent, torch/distributed/elastic/agent/server/api.py _invoke_run, only when the group SUCCEEDED:
    # "[%s] worker group successfully finished. Waiting %s seconds for other agents to finish." (torch 1.9 to 2.13),
    # then _exit_barrier's "Local worker group finished (%s). Waiting %s seconds for other agents to finish" -- the
    # state formatted "SUCCEEDED" before Python 3.11 (a str-mixin Enum's format), "WorkerState.SUCCEEDED" from 3.11 --
    # and "Done waiting for other agents. Elapsed: %s seconds".
    NormalEnd(
        "torchrun's worker group finished",
        _any(
            r"worker group successfully finished",
            r"worker group finished \((?:WorkerState\.)?SUCCEEDED\)",
            r"Done waiting for other agents\. Elapsed",
            flags=0,
        ),
    ),
    # SLURM's srun -v (src/srun/launch.c _task_finish: verbose("%s: %s %s: Completed", hosts, task_str, tasks)).
    NormalEnd("srun's tasks completed", _any(r"\S: tasks? [\d,-]{1,200}: Completed$", flags=0)),
    # transformers/trainer.py: "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)".
    NormalEnd("the Hugging Face Trainer finished", _any(r"Training completed\. Do not forget to share", flags=0)),
    # lightning/pytorch/loops/fit_loop.py: "`Trainer.fit` stopped: `max_epochs=N` reached." (and max_steps).
    NormalEnd(
        "Lightning's Trainer.fit finished", _any(r"`Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached", flags=0)
    ),
    # deepspeed/launcher/launch.py: logger.info(f"Process {process.pid} exits successfully.").
    NormalEnd("DeepSpeed's launcher saw its ranks exit", _any(r"Process \d+ exits successfully", flags=0)),
    # accelerate/commands/test.py: "Test is a success! You are ready for your distributed training!".
    NormalEnd("accelerate test passed", _any(r"Test is a success! You are ready", flags=0)),
    # ray/dashboard/modules/job/cli.py: "Job 'raysubmit_...' succeeded".
    NormalEnd("the Ray job succeeded", _any(r"Job '[^']{1,200}' succeeded", flags=0)),
    # Megatron-LM megatron/training/training.py: print_datetime('after training is done').
    NormalEnd("Megatron's training finished", _any(r"\[after training is done\]", flags=0)),
    # stas00/ml-engineering torch-distributed-gpu-test.py: print(f"{gpu} is OK (global rank: {rank}/{world_size})").
    NormalEnd("torch-distributed-gpu-test passed", _any(r"is OK \(global rank: \d+/\d+\)", flags=0)),
)

# --------------------------------------------------------------------------------------------
# How big the job is, and which ranks said so
# --------------------------------------------------------------------------------------------

# A stated world size: "world_size=16", "WORLD_SIZE: 16", "'world_size': 16", torchrun's "global_world_sizes=[16, ..."
# (torch/distributed/elastic/agent/server/api.py), NCCL's "nranks 16" / "nRanks 16" (init.cc, read by
# conformance.verdict.nccl_log).
WORLD_SIZE = _any(r"\bworld[_ ]sizes?\W{0,4}(?P<size>\d{1,7})\b", r"\bglobal_world_sizes=\[(?P<size2>\d{1,7})")
# Lightning, lightning/fabric/utilities/distributed.py _init_dist_connection:
# "Initializing distributed: GLOBAL_RANK: {global_rank}, MEMBER: {global_rank + 1}/{world_size}".
MEMBER = re.compile(r"GLOBAL_RANK: (?P<rank>\d{1,7}), MEMBER: (?P<member>\d{1,7})/(?P<size>\d{1,7})")
# torch/csrc/distributed/c10d/TCPStore.cpp: "Timed out after {} seconds waiting for clients. {}/{} clients joined."
CLIENTS_JOINED = re.compile(r"(?P<joined>\d{1,7})/(?P<size>\d{1,7}) clients joined")
# torch/distributed/distributed_c10d.py _store_based_barrier: "... (world_size=%s, num_workers_joined=%s, timeout=%s"
# (older torch: "worker_count=%s").
STORE_BARRIER = re.compile(r"world_size=(?P<size>\d{1,7}), (?:num_workers_joined|worker_count)=(?P<joined>\d{1,7})")
# torchrun's "Starting elastic_operator with launch configs:" block (torch/distributed/launcher/api.py):
# "  min_nodes                : 2", "  nproc_per_node           : 8"; a command line: "--nnodes=2", "--nnodes 2:4",
# "--nproc_per_node=8", "--nproc-per-node 8".
NNODES = _any(r"--nnodes[= ](?P<nodes>\d{1,5})\b", r"^\s*min_nodes\s*:\s*(?P<nodes2>\d{1,5})\b")
NPROC = _any(r"--nproc[-_]per[-_]node[= ](?P<nproc>\d{1,5})\b", r"^\s*nproc_per_node\s*:\s*(?P<nproc2>\d{1,5})\b")


def first_number(m: re.Match[str]) -> int:
    """The first group of a match that took part (the patterns above have one per alternative)."""
    return int(next(value for value in m.groups() if value is not None))


# --------------------------------------------------------------------------------------------
# Where the job was when its log stopped
# --------------------------------------------------------------------------------------------

# A launcher starting the ranks: torchrun's "Setting OMP_NUM_THREADS environment variable for each process to be 1
# in default" (torch/distributed/run.py) and "Starting elastic_operator with launch configs" (launcher/api.py).
LAUNCHED = _any(r"Setting OMP_NUM_THREADS environment variable for each process", r"Starting elastic_operator", flags=0)
# A stack dump of a live process: py-spy's "Thread 1302975 (active): \"MainThread\"" (py-spy dump) and CPython's
# faulthandler "Thread 0x00007f... (most recent call first):" / "Current thread 0x... (most recent call first):"
# (torch's TORCH_NCCL_DUMP_ON_TIMEOUT and the suite's own watchdog ask for it).
STACK_DUMP = _any(r"^Thread (?:0x[0-9a-f]+|\d+) \((?:active|idle)", r"thread 0x[0-9a-f]+ \(most recent call first\)")
# A frame of such a dump inside a collective: NCCL's own calls (py-spy shows native frames: "ncclAllReduce
# (collectives.cc:49)"), torch's c10d (distributed_c10d.py, ProcessGroupNCCL).
COLLECTIVE_FRAME = _any(r"\bnccl[A-Z]\w*", r"distributed_c10d", r"ProcessGroupNCCL", flags=0)
# A frame of a Python traceback (with the comma; faulthandler's frames have none): a traceback was printed even
# where its first line ("Traceback (most recent call last):") and its exception were cut.
TRACEBACK_FRAME = _any(r'^\s*File "[^"]{1,1000}", line \d{1,7}, in ', flags=0)
# torch's ProcessGroupNCCL destructor (torch >= 2.4): "WARNING: destroy_process_group() was not called before program
# exit, which can leak resources."  A hang or a stuck watchdog after it is a hang at exit, in NCCL's teardown.
NO_DESTROY = _any(r"destroy_process_group\(\) was not called before program exit", flags=0)
# Which NCCL network plugin a process loaded: "NET/Plugin: Loaded net plugin %s (v%d)" (src/net.cc, later
# src/plugin/net/net_v*.cc), "Assigned NET plugin %s to comm" (2.28 and later, src/plugin/net.cc), a plugin's own
# "Plugin Path : <path>"; or none: "NET/Plugin : No plugin found" (<= 2.18), "NET/Plugin: Using internal network
# plugin." and "Could not find: libnccl-net.so. Using internal network plugin." (2.19 and later).
NET_PLUGIN = _any(
    r"Loaded net plugin (?P<name>\S+)",
    r"Assigned NET plugin (?P<name2>\S+)",
    r"Plugin Path : \S*?(?P<name3>[^/\s]+)$",
    r"NET/Plugin ?: (?P<none>No plugin found|Could not find|Using internal)",
    flags=0,
)


def net_plugin(m: re.Match[str]) -> str:
    """The plugin a :data:`NET_PLUGIN` line names: its name, or "internal"."""
    return "internal" if m["none"] else next(v for v in (m["name"], m["name2"], m["name3"]) if v)
