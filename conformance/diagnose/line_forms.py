"""The forms of log lines the diagnosis reads: anchor words, tracebacks, launcher summaries, timestamps, rank prefixes.

Each pattern says where its text comes from.  :mod:`conformance.diagnose.evidence` reads a job's
lines with them; what the lines are taken to mean is the evidence's (and the verdict stage's tables).
"""

from __future__ import annotations

import re

# Every word any pattern of this module, of evidence.py, of the verdict stage's tables or of job_lines can match,
# lower-case: a line holding none of them is only counted (it is searched lower-cased, so one search per line finds
# every case).
ANCHOR_WORDS = (
    # failures, exceptions, exits and signals
    "error", "fail", "fatal", "exception", "traceback", "abort", "kill", "signal", "segmentation", "core dumped",
    "panic", "died", "exit", "interrupt", "file \"", "during handling", "direct cause", "root cause", "failures:",
    # waits and timeouts; victims
    "timed out", "time out", "timeout", "watchdog", "heartbeat", "broken pipe", "by peer", "socket closed",
    "remote process", "worker crash", "seqnum",
    # memory, devices and the machine
    "memory", "ecc", "xid", "cuda", "nvlink", "off the bus", "is lost", "busy", "unavailable", "not yet initialized",
    "device ordinal", "insufficient", "oom", "kernel image", "sharedmem", "cudaarch", "sm_",
    # NCCL: warnings, init, versions, interfaces, transports
    "nccl warn", "init complete", "init start", "abort complete", "destroy complete", "nccl version", "bootstrap",
    "using network", "set by environment", "ibv_", "p2p is disabled", "peer access", "nvls", "sharp",
    "unhandled", "invalid", "internal error", "last error",
    # host limits and sockets
    "open files", "emfile", "enfile", "shm", "shared memory", "no space", "in use", "eaddrinuse", "interface",
    "connect", "socket", "refused", "unreachable",
    # the job's size, its ranks and launchers
    "duplicate", "mismatch", "barrier", "rendezvous", "clients joined", "world_size", "world size", "global_rank",
    "member", "nnodes", "min_nodes", "nproc", "workers_joined", "worker_count", "srun:",
    # normal ends (job_lines.NORMAL_ENDS)
    "avg bus bandwidth", "successfully", "succeeded", "training completed", "trainer.fit", "is a success",
    "after training is done", "is ok (global rank", "done waiting for other agents", ": completed",
    # deaths, memory kills and native crashes (deaths.py): strsignal's texts, a signal handler's "*** SIGSEGV", the
    # second line of Open MPI's report, glibc's and libstdc++'s last words
    "terminated", "illegal instruction", "*** sig", "sigterm", "process name:", "corrupt", "stack smashing",
    "terminate called", "what():",
    # where the job was: launched, a stack dump, the exit, plugins, the GPU model, stopped from outside
    "omp_num_threads", "elastic_operator", "(active", "(idle", "most recent call first", "destroy_process_group",
    "plugin", "nvidia", "cancelled", "mem(gb)", "cudnn", "unable to find", "ancdata", "memlock", "nvrm",
)  # fmt: skip
ANCHORS = tuple(word.encode() for word in ANCHOR_WORDS)
# Writers named on any line, searched in each lower-cased block (a line need hold no anchor word to count): global
# ranks (torch's "[rank3]:", Lightning's "[rank: 3]", DeepSpeed's "[Rank 3]", mpirun's "[1,3]<stderr>:"), and
# torchrun's local ranks ("[default3]:") with srun's task before them where it labels lines ("1: [default3]:").
WRITTEN_RANK = re.compile(rb"\[rank:? ?(\d{1,7})\]|\[\d{1,7},(\d{1,7})\]<std")
MAY_NAME_GPU = re.compile(r"sm_|cudaArch|NVIDIA|GeForce|Tesla")  # before cuda_errors.generation_in's searches
# NCCL's transport of a connection ("Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read", conformance.verdict.nccl_log);
# another program's " via " gives a text nccl_transport.classify does not know, and counts for nothing.
VIA = re.compile(rb" via ([^\n]{1,120})")
WRITTEN_LOCAL = re.compile(rb"\n(?:\s{0,4}(\d{1,5}): )?\[(?!rank[\d:])[a-z_]{1,40}?(\d{1,5})\]:")

# The last line of a Python traceback: "torch.OutOfMemoryError: CUDA out of memory. ...", "KeyError: 'x'".
EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_][\w]*\.){0,8}[A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s?(?P<message>.*))?$"
)
# What may end a traceback: "Name" or "pkg.Name: message" (an exception whose name ends in no known word).
TRACEBACK_END = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.){0,8}[A-Za-z_]\w*)(?::\s?(?P<message>.*))?$")
TRACEBACK_CONTINUES = ('File "', "During handling of", "The above exception", "Traceback (most recent", "^", "~")
# The launcher's own exceptions: not what a rank died of (torch/distributed/elastic/multiprocessing/errors,
# .../api.py SignalException: the agent itself got SIGTERM from SLURM or a user).
LAUNCHER_EXCEPTIONS = re.compile(r"ChildFailedError|SignalException|CalledProcessError")
# torch/distributed/elastic/multiprocessing/errors/__init__.py _FAILURE_FORMAT_TEMPLATE: one failed process
# of the "Root Cause (first observed failure):" and "Failures:" sections.
SUMMARY_HOST = re.compile(r"^\s*host\s*:\s*(?P<host>\S+)")
SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d{1,7}) \(local_rank: (?P<local>\d{1,5})\)")
SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d{1,4}) \(pid: (?P<pid>\d{1,10})\)")
SUMMARY_TIME = re.compile(r"^\s*time\s*:\s*(?P<time>\S+)")
SUMMARY_END = re.compile(r"^(?:=+|-+|\[\d+\]:)\s*$")
SUMMARY_LINES = 200  # a summary block longer than this is closed
# Timestamps that order lines across files: glog's "[E1218 20:27:21.426" (torch's C++ logs), ISO dates
# ("2024-01-01 12:00:00", "2024-01-01_12:00:00" in torchrun's summary, "[2024-01-01 12:00:00]" NCCL).
GLOG_TIME = re.compile(r"\b[IWEF](?P<month>\d\d)(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d(?:\.\d{1,9})?)\b")
ISO_TIME = re.compile(
    r"\b\d{4}-(?P<month>\d\d)-(?P<day>\d\d)[ _T](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d(?:[.,]\d{1,9})?)", re.ASCII
)
# torch's ProcessGroupNCCL names the rank in its own messages, prefix or not: "[Rank 3] Watchdog caught ...",
# "[PG ID 0 PG GUID 0(default_pg) Rank 3] ..." (ProcessGroupNCCL.cpp logPrefix(), torch >= 2.3).
TORCH_RANK = re.compile(r"^\s*(?:\[[IWEF]\d{4} [^\]]{0,80}\]\s*)?\[(?:PG [^\]]{0,120}?)?Rank (?P<rank>\d{1,7})\]")
# How diagnose.sources quotes a rank of this suite's own cases that the suite's watchdog stopped.
STOPPED_LINE = "stopped by the suite's watchdog while waiting (no result): wait timeout in {where}"
STOPPED_START = STOPPED_LINE.split("{", 1)[0]


def clock_seconds(month: int, day: int, hour: int, minute: int, second: float) -> float:
    """Seconds since the start of the year (no year: glog prints none), for ordering lines of one job."""
    days = (month - 1) * 31 + day
    return ((days * 24 + hour) * 60 + minute) * 60 + second


def line_time(text: str) -> float | None:
    """The first timestamp in a text, as :func:`clock_seconds`."""
    m = GLOG_TIME.search(text) or ISO_TIME.search(text)
    if m is None:
        return None
    return clock_seconds(int(m["month"]), int(m["day"]), int(m["h"]), int(m["m"]), float(m["s"].replace(",", ".")))
