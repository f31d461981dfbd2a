"""The ONE table that gives every torch message format of the catalogue its class, role and fix.

Read by ``tools/torch_catalogue_build.py``.  A rule fits a format by the file it is in (globs over the path in
pytorch/pytorch), the call that prints it (``kinds``, a regex over ``raise:ValueError``, ``log:info``,
``LOG(ERROR)``, ``c10::str``, ...) and the words of its text (``words``, a regex); the first rule that fits wins,
the last fits all.  ``refine`` is checked against the matched line itself, for what only the values tell (a
negative exit code is a signal; ``Local worker group finished (WorkerState.SUCCEEDED)`` is an ending): the first
of its (regex, class, role, fix) that is found in the line overrides.

A role says what the line says of the process that printed it: ``root`` (the cause is here), ``first`` (the
cause is here when this is the earliest such line of the job: the lowest SeqNum, the first timestamp),
``victim`` (it only waited for, or lost, another process), ``consequence`` (it follows a line that names the
cause), ``report`` (a summary naming another process, ChildFailedError's table) and ``state`` (no failure).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

# The classes: conformance/verdict/job_causes.py's keys (FailureClass.key) where one fits, and four the catalogue
# adds; the titles as an answer would show them.
CLASSES = {
    "hang": "HANG",
    "desync": "RANKS TOOK DIFFERENT CODE PATHS",
    "watchdog_stuck": "NCCL WATCHDOG STUCK",
    "rendezvous": "PROCESSES DISAGREE BEFORE NCCL",
    "network_interface": "WRONG NETWORK INTERFACE",
    "rank_error": "ERROR IN ONE RANK",
    "killed": "RANK KILLED OR CRASHED",
    "nccl_error": "NCCL ERROR",
    "oom": "OUT OF MEMORY",
    "machine_fault": "MACHINE FAULT",
    # the catalogue's own
    "invalid_usage": "PROGRAM ERROR (INVALID USAGE)",
    "ending": "NORMAL END",
    "state": "STATE OR NOTICE (NOT A FAILURE)",
    "torch_internal": "TORCH INTERNAL CHECK",
}
ROLES = ("root", "first", "victim", "consequence", "report", "state")

FIX_TIMEOUT = (
    "compare this line's SeqNum (and 'last enqueued/completed NCCL work') with every other rank's: the rank that "
    "timed out first, or whose last completed collective is lowest, is the root and the others only waited for "
    "it; read that rank's log for its own error (an exception, an OOM, a kill); if all ranks reached the same "
    "SeqNum, test every GPU pair and node pair (`pytest suites/ -k 'pair_exchange or all_reduce'`); set "
    "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 to get the flight recorder; raise "
    "init_process_group(timeout=...) only for a job known to pause that long"
)
FIX_TOLD_TO_DUMP = (
    "find the rank that timed out first (its 'Watchdog caught collective operation timeout' line, the lowest "
    "SeqNum) and read its log: this rank only received its signal to dump the flight recorder"
)
FIX_TAKEN_DOWN = (
    "read the lines before it on the same rank: the watchdog's timeout or the NCCL error there is the cause; this "
    "line only says the process is taken down for it"
)
FIX_DESYNC = (
    "find the rank whose collective differs and the branch or data that made it (the line names the ranks, the "
    "operations and shapes); rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL (shapes) or TORCH_NCCL_DESYNC_DEBUG=1 and "
    "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 (the flight recorder) to name the collective; not the machine's fault"
)
FIX_STUCK = (
    "check the GPU and driver the watchdog was waiting on: `dmesg | grep -i xid`, `nvidia-smi` (a GPU that stopped "
    "answering); look for a thread holding the GIL inside a CUDA call (py-spy dump --native); raise "
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only when neither is found"
)
FIX_NCCL = (
    "read the NCCL WARN lines before it (rerun with NCCL_DEBUG=WARN on every rank) and the 'Last error:' line: "
    "they name the cause; `conformance diagnose` names the WARN's class and fix from NCCL's own catalogue"
)
FIX_REMOTE = (
    "find the rank or node that failed first (its own log: an exception, an OOM, a signal, a node that went "
    "down) and fix that; this rank only lost its peer. If every rank was still running, check the network "
    "between the nodes (`ibstat`, `ip -br addr`, `pytest suites/ -k across_nodes`)"
)
FIX_CUDA = (
    "read the CUDA error in the lines before it: for out of memory free the GPU or allocate less; otherwise check "
    "the GPU's health (`nvidia-smi`, `dmesg | grep -i xid`) and rerun with CUDA_LAUNCH_BLOCKING=1"
)
FIX_STORE_CONNECT = (
    "check the rendezvous endpoint: MASTER_ADDR:MASTER_PORT (or --rdzv-endpoint) is the same on every node and "
    "reachable from it (`nc -zv <addr> <port>`; no firewall between the nodes), and the process that hosts the "
    "store (rank 0, or the agent of node 0) is running and started first"
)
FIX_STORE_GONE = (
    "find why the store's host went away (rank 0, or the agent of the --rdzv-endpoint node): read its log for its "
    "own error, an OOM or a kill; this rank only lost its connection to it"
)
FIX_STORE_WAIT = (
    "find the rank or node that never arrived: every node must start the same job with the same --nnodes and "
    "--nproc-per-node and one endpoint; read the missing one's log; raise the timeout only for a slow start"
)
FIX_PORT = (
    "give the job a free MASTER_PORT (`ss -ltnp | grep <port>`: another job or a leftover process holds it) or "
    "stop the process that holds it"
)
FIX_ROUTE = (
    "name an interface that reaches the other nodes: MASTER_ADDR must resolve to an address every node can route "
    "to (`ip route get <addr>` on each node); GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME = that interface"
)
FIX_UNIQUE_ID = (
    "read rank 0's log (it publishes the NCCL unique id through the store): an exception, an OOM or a kill there "
    "is the cause; if rank 0 was still running, check the store's network (`nc -zv <MASTER_ADDR> <MASTER_PORT>`)"
)
FIX_CHILD = (
    "read the 'Root Cause (first observed failure)' entry: its rank, host, exitcode and traceback name the worker "
    "that failed first; fix that error (the other entries are workers stopped after it)"
)
FIX_SIGNAL = (
    "find what sent the signal: SIGKILL (-9) is mostly the host's OOM killer (`dmesg | grep -i -e oom -e 'killed "
    "process'`; use less host memory or more --mem), SIGTERM (-15) the scheduler or torchrun stopping the workers "
    "after another failed (look for the first failure), SIGSEGV (-11) or SIGABRT (-6) a crash in the process "
    "(its core dump, faulthandler, or the C++ error just before)"
)
FIX_EXIT = (
    "read this worker's own traceback (the error_file or its stderr): it exited with an error; decorate the "
    "entrypoint with torch.distributed.elastic.multiprocessing.errors.record to get it in the table"
)
FIX_STOPPED = (
    "find who sent the signal: the scheduler (time limit, preemption, scancel) or a user; the job did not fail by "
    "itself (`sacct -j <job> -o state,exitcode`)"
)
FIX_SURVIVORS = (
    "find the worker that failed first (the 'failed (exitcode: ...)' line or ChildFailedError's root cause): the "
    "agent is stopping the others because of it"
)
FIX_ENDING = (
    "read the lines before it: this process ended normally here; look for the failure in another rank's or "
    "node's log (or none: the job succeeded)"
)
FIX_DESTROY = "call torch.distributed.destroy_process_group() at the end of the job, on every rank"
FIX_STATE = (
    "read where the job got to from it: the failure is in the lines after it, or their absence is the hang "
    "(compare the last such line of every rank)"
)
FIX_DUMP = (
    "read the flight recorder's dump it names (`python -m torch.distributed.flight_recorder.fr_trace <folder>`): "
    "it lists each rank's last collectives and names the one that differs or never finished"
)
FIX_NO_GPU = (
    "check the rank sees its GPUs: `nvidia-smi` in the same container (--gpus all / the NVIDIA container toolkit), "
    "CUDA_VISIBLE_DEVICES not empty, and torch built with CUDA (`python -c 'import torch; "
    "print(torch.cuda.is_available())'`)"
)
FIX_USAGE = (
    "fix the call in the job's code the message names (its arguments, tensor devices, sizes and dtypes, the "
    "backend); rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to see which call"
)
FIX_CONFIG = (
    "correct the launcher's arguments or variables the message names (--nnodes, --nproc-per-node, --rdzv-backend, "
    "--rdzv-endpoint, --rdzv-id, MASTER_ADDR/MASTER_PORT, WORLD_SIZE/RANK): the same on every node"
)
FIX_INTERNAL = (
    "rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL TORCH_CPP_LOG_LEVEL=INFO and report it at "
    "https://github.com/pytorch/pytorch/issues with every rank's log; upgrade torch if a later release notes it fixed"
)

Refinement = tuple[str, str, str, str]  # (regex searched in the line, class, role, fix)


@dataclass(frozen=True)
class Rule:
    """Files, calls and words to a class, a role and a fix; ``refine`` for what only the line's values tell."""

    name: str
    cls: str
    role: str
    fix: str
    paths: tuple[str, ...] = ()  # empty: any file
    kinds: str = ""  # empty: any call
    words: str = ""  # empty: any text
    refine: tuple[Refinement, ...] = ()

    def fits(self, path: str, kind: str, text: str) -> bool:
        in_path = not self.paths or any(fnmatch.fnmatchcase(path, glob) for glob in self.paths)
        return (
            in_path
            and (not self.kinds or re.search(self.kinds, kind) is not None)
            and (not self.words or re.search(self.words, text) is not None)
        )


_ELASTIC = ("torch/distributed/elastic/*", "torch/distributed/launcher/*", "torch/distributed/run.py")
_RDZV = ("torch/distributed/elastic/rendezvous/*", "torch/distributed/rendezvous.py")
_SIGNALLED = r"(?:exitcode\s*:\s*|exitcode: |Signal |signal: )-?\d+ ?\(?(?:SIG|Signals\.SIG)"
_NEGATIVE_EXIT = r"exitcode(?:\s*:\s*| )-\d+|\(exitcode: -\d+\)"
_WHAT_FAILED: tuple[Refinement, ...] = (
    (r"Watchdog caught collective operation timeout", "hang", "first", FIX_TIMEOUT),
    (r"ncclRemoteError|remote process exit|Connection closed by remote peer", "rank_error", "victim", FIX_REMOTE),
    (r"CUDA error|ncclUnhandledCudaError|unhandled cuda error", "nccl_error", "root", FIX_CUDA),
)

# ONE table: the first rule that fits a format gives its class, role and fix.
RULES: tuple[Rule, ...] = (
    # The exception classes a traceback's last line names (torch/distributed/__init__.py binds torch._C's
    # DistBackendError, DistStoreError, DistNetworkError; elastic/rendezvous/api.py, multiprocessing/errors and
    # api.py define the rest); a line with a message after the name finds the message's own entry first.
    Rule("store error", "rendezvous", "victim", FIX_STORE_WAIT, kinds=r"^class$", words=r"\.DistStoreError$"),
    Rule("network error", "rendezvous", "root", FIX_STORE_CONNECT, kinds=r"^class$",
         words=r"\.DistNetworkError$|\.RendezvousConnectionError$"),
    Rule("backend error", "nccl_error", "root", FIX_NCCL, kinds=r"^class$", words=r"\.DistBackendError$"),
    Rule("graceful exit", "ending", "state", FIX_ENDING, kinds=r"^class$", words=r"\.RendezvousGracefulExitError$"),
    Rule("rendezvous error", "rendezvous", "root", FIX_STORE_WAIT, kinds=r"^class$", words=r"\.Rendezvous\w*Error$"),
    Rule("child failed error", "rank_error", "report", FIX_CHILD, kinds=r"^class$", words=r"\.ChildFailedError$"),
    Rule("signal exception", "killed", "root", FIX_STOPPED, kinds=r"^class$", words=r"\.SignalException$"),
    Rule("other exceptions", "torch_internal", "root", FIX_INTERNAL, kinds=r"^class$"),
    # ProcessGroupNCCL.cpp WorkNCCL::checkTimeout ("[Rank N] Watchdog caught collective operation timeout:
    # WorkNCCL(SeqNum=..) ran for .. milliseconds before timing out."), watchdogHandler ("Timeout at NCCL work: ..,
    # last enqueued NCCL work: .., last completed NCCL work: ..", 2.2-2.4), WorkNCCL::wait (blocking wait).
    Rule("collective timed out", "hang", "first", FIX_TIMEOUT,
         words=r"Watchdog caught collective operation timeout|Timeout at NCCL work: |timed out in blocking wait|"
               r"failure detected by watchdog at work sequence id"),
    # ProcessGroupNCCL.cpp broadcastDumpSignal: this rank's watchdog found a failure and tells the others to dump.
    Rule("first to signal", "hang", "first", FIX_TIMEOUT, words=r"First PG on this rank to signal dumping"),
    # ProcessGroupNCCL.cpp HeartbeatMonitor: this rank was told by another (through the TCPStore) to dump.
    Rule("told to dump", "hang", "victim", FIX_TOLD_TO_DUMP,
         words=r"dump signal due to a collective timeout from|Received a global timeout from another rank|detected "
               r"a collective timeout and notified current rank|dump signal from another rank",
         refine=((r"from this local rank", "hang", "first", FIX_TIMEOUT),)),
    # ProcessGroupNCCL.cpp WorkNCCL::handleException: the process is taken down for an earlier error or timeout.
    Rule("taken down", "nccl_error", "consequence", FIX_TAKEN_DOWN,
         words=r"Some NCCL operations have failed or timed out|To avoid data inconsistency, we are taking the entire"),
    # ProcessGroupWrapper.cpp (TORCH_DISTRIBUTED_DEBUG=DETAIL) and TraceUtils.h retrieveDesyncReport.
    Rule("desync report failed", "state", "state", FIX_INTERNAL, words=r"Failed to re\w*ieve \w*DESYNC_DEBUG report"),
    Rule("desync report", "desync", "report", FIX_DESYNC, paths=("torch/csrc/distributed/c10d/TraceUtils.h",),
         kinds=r"^c10::str$"),
    Rule("desync", "desync", "root", FIX_DESYNC,
         words=r"Detected mismatch between collectives|lagging ranks|lagging/dead/mismatched|joined but didn't finish "
               r"collective|but didn't join collective|Timeout at collective: |Snapshot of ranks' latest states"),
    # ProcessGroupNCCL.cpp heartbeatMonitor / HeartbeatMonitor::runLoop and the GIL check after it.
    Rule("watchdog stuck", "watchdog_stuck", "root", FIX_STUCK,
         words=r"watchdog got stuck|Heartbeat monitor timed out|monitor thread timeout|detects no heartbeat|No "
               r"PGNCCL's watchdog heartbeat|detected no heartbeat|Could not acquire GIL"),
    Rule("terminating after dump", "hang", "consequence", FIX_TAKEN_DOWN,
         words=r"Terminating the process after attempting to dump debug info|would have terminated the process",
         refine=((r"watchdog hang", "watchdog_stuck", "root", FIX_STUCK),)),
    # ProcessGroupNCCL.cpp Watchdog::run / ncclCommWatchdog: the exception that ended the watchdog, quoted.
    Rule("watchdog ended", "nccl_error", "consequence", FIX_NCCL,
         words=r"watchdog thread terminated with exception|Watchdog caught exception|raised the following async "
               r"exception|found async exception when checking for NCCL errors", refine=_WHAT_FAILED),
    # NCCLUtils.cpp NCCLComm::getNcclComm: a communicator used after it was aborted; the reason is quoted.
    Rule("aborted", "nccl_error", "consequence", FIX_TAKEN_DOWN,
         words=r"NCCL communicator was aborted|Original reason for failure", refine=_WHAT_FAILED),
    # NCCLUtils.cpp / NCCLUtils.hpp getNcclErrorDetailStr, C10D_NCCL_CHECK: torch's words for ncclResult_t.
    Rule("peer gone (NCCL)", "rank_error", "victim", FIX_REMOTE,
         words=r"ncclRemoteError|unexpected exit of a remote peer|remote error detected from rank"),
    Rule("NCCL invalid usage", "invalid_usage", "root", FIX_USAGE, words=r"^ncclInvalid(?:Argument|Usage)"),
    Rule("NCCL CUDA error", "nccl_error", "root", FIX_CUDA, words=r"^ncclUnhandledCudaError"),
    Rule("NCCL error", "nccl_error", "root", FIX_NCCL,
         words=r"NCCL error|^ncclSystemError|^ncclInternalError|Unknown NCCL error|NCCL communicator encountered "
               r"error|NCCL communicator was aborted|NCCL timeout in|Original reason for failure|NCCL version",
         refine=_WHAT_FAILED[1:]),
    Rule("unique id", "rendezvous", "victim", FIX_UNIQUE_ID, words=r"retrieving ncclUniqueId"),
    Rule("no GPU", "machine_fault", "root", FIX_NO_GPU, words=r"no GPUs found|only supported with GPUs"),
    # socket.cpp (the TCPStore's sockets) and Utils.hpp (its send/recv): the store is unreachable, or went away.
    Rule("store port taken", "rendezvous", "root", FIX_PORT,
         words=r"server socket has failed to (?:bind|listen)|[Aa]ddress already in use"),
    Rule("peer gone (store)", "rank_error", "victim", FIX_STORE_GONE,
         words=r"Failed to recv, got 0 bytes|Failed to send, sent 0 bytes|Connection was likely closed|Connection "
               r"reset by peer|Broken pipe"),
    Rule("store unreachable", "rendezvous", "root", FIX_STORE_CONNECT,
         words=r"client socket has (?:failed to connect|timed out after)|client socket cannot be initialized|network "
               r"addresses of .* cannot be retrieved|No socket on .* is listening yet|connection to the C10d store",
         refine=((r"No route to host|Network is unreachable|Cannot assign requested address", "network_interface",
                  "root", FIX_ROUTE),)),
    # TCPStore.cpp: waiting for the other ranks, or for a key only another rank sets.
    Rule("store wait", "rendezvous", "victim", FIX_STORE_WAIT,
         words=r"waiting for clients|wait timeout after|^Socket Timeout|Timed out waiting for|[Tt]imed out .*store"),
    # elastic/multiprocessing/errors/__init__.py ChildFailedError (its table) and ProcessFailure.
    Rule("child failed (signal)", "killed", "root", FIX_SIGNAL, paths=_ELASTIC,
         words=r"^Signal \S+ \(.*\) received by PID"),
    Rule("child failed table", "rank_error", "report", FIX_CHILD, paths=_ELASTIC,
         words=r"Root Cause \(first observed failure\)|^\s*(?:time|host|rank|exitcode|error_file|traceback)\s*: |"
               r"^Failures:|NO_OTHER_FAILURES",
         refine=((_NEGATIVE_EXIT, "killed", "root", FIX_SIGNAL),)),
    Rule("worker failed", "rank_error", "root", FIX_EXIT, paths=_ELASTIC, words=r"failed \(exitcode: ",
         refine=((_NEGATIVE_EXIT, "killed", "root", FIX_SIGNAL), (_SIGNALLED, "killed", "root", FIX_SIGNAL))),
    Rule("no traceback", "rank_error", "report", FIX_EXIT, paths=_ELASTIC, words=r"To enable traceback see"),
    Rule("stopped from outside", "killed", "root", FIX_STOPPED, paths=_ELASTIC,
         words=r"death signal, shutting down workers|got signal: |Got termination signal"),
    Rule("survivors stopped", "state", "consequence", FIX_SURVIVORS, paths=_ELASTIC,
         words=r"closing signal|Sending process .* signal|Unable to shutdown process|will restart worker group",
         refine=((r"Worker group (?:FAILED|UNHEALTHY)", "rank_error", "consequence", FIX_SURVIVORS),)),
    Rule("group ended", "ending", "state", FIX_ENDING, paths=_ELASTIC,
         words=r"worker group successfully finished|Local worker group finished|Done waiting for other agents",
         refine=((r"\((?:WorkerState\.)?(?:FAILED|UNHEALTHY)\)", "rank_error", "consequence", FIX_SURVIVORS),)),
    Rule("group in bad state", "rank_error", "consequence", FIX_SURVIVORS, paths=_ELASTIC, words=r"Worker group in "),
    # elastic/rendezvous: the nodes did not gather (timeouts, closed rendezvous, a node that failed to join).
    Rule("rendezvous", "rendezvous", "root", FIX_STORE_WAIT, paths=_RDZV + _ELASTIC,
         kinds=r"raise:Rendezvous(?:Timeout|Closed|Error|StateError|GracefulExit)?Error|raise:DistStoreError",
         refine=((r"connect|C10d store", "rendezvous", "root", FIX_STORE_CONNECT),)),
    Rule("rendezvous config", "rendezvous", "root", FIX_CONFIG, paths=_RDZV + _ELASTIC,
         kinds=r"raise:(?:ValueError|TypeError|RendezvousParameterError|KeyError|RuntimeError|_error|AssertionError)"),
    Rule("rendezvous failed", "rendezvous", "root", FIX_STORE_WAIT, paths=_RDZV,
         words=r"failed to join|can't complete rendezvous|deadline|timed out|has failed to|is closed|closed",
         refine=((r"keep-alive|heartbeat", "rendezvous", "victim", FIX_STORE_WAIT),)),
    # Flight recorder and debug dumps: where to read them.
    Rule("dump", "state", "state", FIX_DUMP,
         words=r"dump debug info|Flight Recorder trace|flight recorder|trace successfully dumped|c\+\+ stacktraces|"
               r"Debug dump timed out"),
    Rule("destroy not called", "ending", "state", FIX_DESTROY,
         words=r"destroy_process_group\(\) was not called|hasn't been destroyed"),
    Rule("destroyed", "ending", "state", FIX_ENDING,
         words=r"destructor entered|Destroy complete|Process Group destroyed on rank|Starting to destroy process group|"
               r"Process Group shutdown on rank|abort finished|aborts successfully|Operations flushed"),
    Rule("usage", "invalid_usage", "root", FIX_USAGE,
         kinds=r"raise:(?:ValueError|TypeError|NotImplementedError|KeyError|IndexError|AttributeError)|"
               r"TORCH_CHECK|C10_THROW_ERROR|^fn$|std::invalid_argument"),
    # Backend.hpp ("Backend {} does not support allgather"), distributed_c10d.py's RuntimeError/AssertionError
    # checks of the arguments and the order of calls.
    Rule("usage words", "invalid_usage", "root", FIX_USAGE,
         kinds=r"raise:(?:RuntimeError|AssertionError)|^c10::str$|TORCH_INTERNAL_ASSERT",
         words=r"does not (?:support|implement)|not supported|[Mm]ust |[Ee]xpected|[Ii]nvalid|should |[Cc]annot |"
               r"[Un]nknown |not (?:found|initialized|registered|built)|[Dd]efault process group"),
    Rule("notices", "state", "state", FIX_STATE,
         kinds=r"^log:(?:debug|info|warning|warn)|^warn$|^(?:V?LOG|C10_LOG_EVERY_MS)\((?:INFO|WARNING|[0-9]|2)\)|"
               r"^C10D_(?:INFO|DEBUG|TRACE|WARNING)|TORCH_WARN|^text$"),
    Rule("torch's own check", "torch_internal", "root", FIX_INTERNAL),
)  # fmt: skip


def rule_for(path: str, kind: str, text: str) -> Rule:
    return next(rule for rule in RULES if rule.fits(path, kind, text))
