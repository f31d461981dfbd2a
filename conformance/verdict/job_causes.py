"""Why a training job failed, as its logs say it: the failure classes, their fixes, and the lines that name them.

The verdict stage owns what is known about failures; this table adds what only a real job's logs show
(a launcher's exit summary, a watchdog's timeout lines, NCCL's init warnings) to the tables the suite's
own verdicts use: :data:`conformance.verdict.stderr_causes.KNOWN_CAUSES` (host limits, NCCL's WARN
behind its error), :data:`conformance.verdict.machine_faults.MACHINE_FAULTS` (what no setting changes)
and :data:`conformance.verdict.decision.VICTIM_PATTERN` (the ranks that only waited).  ``conformance
diagnose`` reads a job's logs with all of them; the suite's answer lines use :data:`OOM` and
:data:`BARRIER_DEVICE` from here.

Every line pattern cites where its text comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conformance.verdict.stderr_causes import (
    ADDRESS_IN_USE,
    DESCRIPTORS_EXHAUSTED,
    DISK_FULL,
    FILE_TABLE_FULL,
    LOCKED_MEMORY_TOO_LOW,
)


@dataclass(frozen=True)
class FailureClass:
    """A kind of failure: its name as the answer shows it, the fix, and the suite run that tests the machine for it."""

    key: str
    title: str
    fix: str
    check: str


def _suite(selection: str, then: str = "") -> str:
    command = f"pytest suites/ -k {selection!r}" if selection else "pytest suites/"
    return command + (f" ({then})" if then else "")


OOM = FailureClass(
    "oom",
    "OUT OF MEMORY",
    "free that GPU (a process left on it? `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`) or "
    "allocate less there (batch size, activation checkpointing, offload); no NCCL variable changes it",
    _suite("gpu_memory or other_users", "GPU memory errors and other users' processes on the GPUs"),
)
KILLED = FailureClass(
    "killed",
    "RANK KILLED OR CRASHED",
    "the rank died of a signal and the others only waited for it: SIGKILL (-9) is mostly the host's OOM killer "
    "(`dmesg | grep -i -e oom -e 'killed process'`; use less host memory or more `--mem`), SIGSEGV (-11) or "
    "SIGABRT (-6) a crash in the rank's own process (its core dump or `faulthandler` shows where)",
    _suite("gpu_fault or failure_handling", "the kernel log's GPU faults; a failing rank is named"),
)
NCCL_ERROR = FailureClass(
    "nccl_error",
    "NCCL ERROR",
    "NCCL's WARN lines before its error name the cause; run the job with NCCL_DEBUG=WARN to see them",
    _suite("all_reduce", "the ladder climbs the NCCL settings and names the one that passes"),
)
HOST_LIMIT = FailureClass(
    "host_limit",
    "HOST LIMIT",
    "raise the limit the rank's logs name",
    _suite("dev_shm or open_file or locked_memory", "the host limits NCCL needs"),
)
BARRIER_DEVICE = FailureClass(
    "barrier_device",
    "BARRIER ON ANOTHER RANK'S GPU",
    "in the job's code, each rank on its own GPU: torch.cuda.set_device(local_rank) before any CUDA or NCCL call, "
    "and init_process_group(..., device_id=torch.device('cuda', local_rank)) or dist.barrier(device_ids=[local_rank]) "
    "(with a GPU list: LOCAL_RANK indexes it in order); no environment variable changes torch's guess",
    _suite("barrier_first", "each rank's first barrier on its own GPU, for every GPU selection"),
)
RENDEZVOUS = FailureClass(
    "rendezvous",
    "PROCESSES DISAGREE BEFORE NCCL",
    "every node must start the same job with the same --nnodes, --nproc-per-node (one per GPU it has), its own "
    "node rank and the same rendezvous endpoint (MASTER_ADDR:MASTER_PORT, reachable from every node); a node that "
    "is missing or late makes the others time out waiting for it",
    _suite("across_nodes or gpu_inventory", "every node's GPU count and the nodes' rendezvous"),
)
TRANSPORT = FailureClass(
    "transport",
    "TRANSPORT FAILURE BETWEEN GPUS",
    "a P2P, SHM or IB transport failed or hung (often after a driver change, or with the IOMMU/ACS on): "
    "the suite finds the narrowest NCCL setting that works (NCCL_P2P_LEVEL=NVL, NCCL_P2P_DISABLE=1, "
    "NCCL_SHM_DISABLE=1, NCCL_IB_DISABLE=1) and whether the machine needs fixing",
    _suite("pair_exchange or peer_copy", "every GPU pair; the ladder tries p2p_level_nvl, p2p_off, shm_off"),
)
IB_NETWORK = FailureClass(
    "ib_network",
    "INFINIBAND/ROCE NETWORK ERROR",
    "a verbs call or an RDMA completion between NICs failed: check every NIC port is ACTIVE at its rate on every "
    "node (`ibv_devinfo`, the suite's rdma_ports check); on RoCE, that the GID index NCCL uses holds each node's "
    "RoCE v2 address (`show_gids`; set NCCL_IB_GID_INDEX, per node where they differ) and that the MTU matches "
    "along the path; NCCL_IB_HCA names only NICs that reach the other nodes (NCCL_IB_HCA=^mlx5_N leaves a broken "
    "one out); on a rail-optimised fabric NCCL_CROSS_NIC=0; NICs of one node that cannot reach each other: "
    "NCCL_NET_DISABLE_INTRA=1 keeps traffic within a node off them",
    _suite("rdma_ports or across_nodes", "every node's RDMA ports (state, rate, RoCE v2 GID) and every node pair"),
)
NETWORK_INTERFACE = FailureClass(
    "network_interface",
    "WRONG NETWORK INTERFACE",
    "NCCL (or gloo) picked an interface the other nodes cannot reach (docker0, lo, a virtual bridge): "
    "export NCCL_SOCKET_IFNAME=<the interface the nodes share> and GLOO_SOCKET_IFNAME=<the same>",
    _suite("socket_interface or across_nodes", "the interface variables; cross-node rungs per shared interface"),
)
DESYNC = FailureClass(
    "desync",
    "RANKS TOOK DIFFERENT CODE PATHS",
    "a collective that only some ranks called, or called with another operation or tensor shape: the ranks' "
    "collectives differ (sequence number, operation, size); find the rank that differs and the branch or the "
    "data it took (TORCH_DISTRIBUTED_DEBUG=DETAIL names the shapes, TORCH_NCCL_DESYNC_DEBUG=1 and the flight "
    "recorder, TORCH_NCCL_TRACE_BUFFER_SIZE=2000, name the collective); not the machine's fault",
    "",
)
VERSION_MISMATCH = FailureClass(
    "version_mismatch",
    "NCCL OR CUDA VERSION MISMATCH",
    "every node and rank must load the same NCCL (and a driver new enough for the CUDA of torch's build): "
    "one container image or environment for all nodes; `python -c 'import torch; print(torch.cuda.nccl.version())'`",
    _suite("torch_distributed_and_backend or nvml_driver", "the versions each node loads"),
)
WATCHDOG_STUCK = FailureClass(
    "watchdog_stuck",
    "NCCL WATCHDOG STUCK",
    "a CUDA or NCCL call blocked torch's watchdog thread (a GPU hang, a driver fault, or the GIL held in a "
    "callback): look for Xid errors (`dmesg | grep -i xid`); TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only moves the "
    "deadline",
    _suite("gpu_fault or peer_copy", "the kernel log's Xid errors and every GPU pair's copy engines"),
)
MACHINE_FAULT = FailureClass(
    "machine_fault",
    "MACHINE FAULT",
    "the machine's, never an environment variable (see the fault's own fix)",
    _suite("machine_health or environment", "the machine's health checks"),
)
WRONG_DATA = FailureClass(
    "wrong_data",
    "WRONG DATA",
    "data arrived changed between GPUs: the machine is not fit for training until the suite finds a setting "
    "under which every pair passes (NCCL_P2P_LEVEL=NVL, NCCL_P2P_DISABLE=1) or the machine is fixed (driver, IOMMU)",
    _suite("pair_exchange", "every GPU pair's data checked element by element; the ladder tries p2p_level_nvl"),
)
RANK_ERROR = FailureClass(
    "rank_error",
    "ERROR IN ONE RANK",
    "the first rank to fail raised its own error and the others only waited for it: fix what its traceback says",
    "",
)
HANG = FailureClass(
    "hang",
    "HANG",
    "every rank waited in the same collective and none named a cause: a transport hang is likeliest; "
    "test every GPU pair with the suite, and rerun the job with NCCL_DEBUG=INFO; a hang in NCCL or torch itself "
    "is fixed in a later release (their release notes name it): upgrade",
    _suite("pair_exchange or all_reduce", "the ladder names the setting under which the pairs pass"),
)
# A failure the logs show that no rule here names: the answer quotes its lines and says what to collect next.
UNRECOGNISED = FailureClass(
    "unrecognised",
    "UNRECOGNISED FAILURE",
    "the logs show a failure no rule here knows (its lines are quoted above): rerun with NCCL_DEBUG=INFO "
    "TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and give every node's and rank's log "
    "(torchrun --log-dir, srun --output=%N-%t.out)",
    _suite("", "the whole suite: the machine's health, every GPU pair and collective"),
)
CLASSES: tuple[FailureClass, ...] = (
    OOM,
    KILLED,
    NCCL_ERROR,
    HOST_LIMIT,
    BARRIER_DEVICE,
    RENDEZVOUS,
    IB_NETWORK,
    TRANSPORT,
    NETWORK_INTERFACE,
    DESYNC,
    VERSION_MISMATCH,
    WATCHDOG_STUCK,
    MACHINE_FAULT,
    WRONG_DATA,
    RANK_ERROR,
    HANG,
    UNRECOGNISED,
)
BY_KEY = {failure.key: failure for failure in CLASSES}


@dataclass(frozen=True)
class LineSign:
    """A line that names a failure class; ``root``: the process that printed it is the root cause."""

    failure: FailureClass
    pattern: re.Pattern[str]
    root: bool = True


def _any(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(alternatives), re.IGNORECASE)


LINE_SIGNS: tuple[LineSign, ...] = (
    # (A rank killed for memory, or by any signal, is no line sign: conformance/diagnose/deaths.py reads each
    # launcher's report of a death into one event, and death_reading.py reasons from its signal.)
    # c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate ..." raised as
    # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError before 2.1); CUDA's own cudaErrorMemoryAllocation
    # string is "out of memory" ("CUDA error: out of memory").
    # cuBLAS and cuDNN failing to allocate their workspace is the same (CUBLAS_STATUS_ALLOC_FAILED,
    # CUDNN_STATUS_ALLOC_FAILED, cublas_api.h / cudnn.h), as is ROCm's "HIP out of memory" (c10/hip).
    LineSign(
        OOM,
        _any(
            r"CUDA out of memory",
            r"\bOutOfMemoryError\b",
            r"CUDA error: out of memory",
            r"CUBLAS_STATUS_ALLOC_FAILED",
            r"CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_WORKSPACE)",
            r"HIP out of memory",
        ),
    ),
    # NCCL src/init.cc (initTransportsRank):
    # WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx").
    LineSign(BARRIER_DEVICE, _any(r"Duplicate GPU detected")),
    # torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp (TORCH_DISTRIBUTED_DEBUG=DETAIL): "Detected mismatch between
    # collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=485, OpType=ALLREDUCE,
    # ...), but Rank 0 is running collective: ...".
    LineSign(DESYNC, _any(r"Detected mismatch between collectives on ranks")),
    # NCCL src/init.cc: WARN("Mismatched NCCL version detected : rank %d version %d rank %d version %d").  NCCL
    # src/misc/socket.cc: "ncclSocketInit: connecting to address %s with family %d is neither AF_INET(%d) nor
    # AF_INET6(%d)": an address of family 0 comes only from a peer whose bootstrap message has another layout,
    # another NCCL (or net plugin) than this rank's.
    LineSign(VERSION_MISMATCH, _any(r"Mismatched NCCL version detected", r"with family 0 is neither AF_INET")),
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (HeartbeatMonitor): "ProcessGroupNCCL's watchdog got stuck
    # for %d seconds without making progress in monitoring enqueued collectives", "Heartbeat monitor timed out!".
    LineSign(WATCHDOG_STUCK, _any(r"watchdog got stuck for", r"Heartbeat monitor timed out")),
    # torch/csrc/distributed/c10d/TCPStore.cpp: "Timed out after {} seconds waiting for clients. {}/{} clients
    # joined."; torch/distributed/elastic/rendezvous/api.py: RendezvousTimeoutError, RendezvousClosedError;
    # torchrun's static rendezvous and init_process_group's store: DistStoreError (torch/csrc/distributed/c10d/
    # exception.h) "Socket Timeout" / "wait timeout after".
    LineSign(
        RENDEZVOUS,
        _any(
            r"waiting for clients\. \d+/\d+ clients joined",
            r"RendezvousTimeoutError",
            r"RendezvousClosedError",
            r"Rendezvous .{0,80}(?:timed out|closed)",
            r"DistStoreError",
            # torch/csrc/distributed/c10d/socket.cpp, the TCPStore client: "The client socket has failed to connect
            # to any network address of (<MASTER_ADDR>, <MASTER_PORT>)", raised as DistNetworkError.
            r"client socket has failed to connect to",
            r"client socket has timed out after",
            r"DistNetworkError",
            r"Rendezvous\w*Error",
        ),
    ),
    # NCCL src/misc/socket.cc and src/bootstrap.cc: "Bootstrap : no socket interface found",
    # "NET/Socket : no interface found", "socketStartConnect: Connect to <addr> failed : Connection refused";
    # gloo (third_party/gloo/gloo/transport/tcp/pair.cc): "Connection refused" at connectFullMesh.
    LineSign(
        NETWORK_INTERFACE,
        _any(
            r"no socket interface found",
            r"NET/Socket ?: no interface found",
            r"no usable listening interface",
            r"socketStartConnect: Connect to \S+ failed",
            r"connectFullMesh failed",
            # A socket that cannot even be made or routed, by errno (strerror's texts, as NCCL's socket.cc and gloo
            # print them after "Call to socket failed :", "socket creation failed", "Connect to ... failed :"):
            # EAFNOSUPPORT (IPv6 off, or no network in a container), ENETUNREACH, EHOSTUNREACH, EADDRNOTAVAIL.
            r"(?:socket|connect|bootstrap|net/)[^\n]{0,200}(?:Address family not supported by protocol|Network is "
            r"unreachable|No route to host|Cannot assign requested address)",
            # gloo naming an interface it cannot find (gloo/transport/tcp/device.cc: "Unable to find address for:
            # <GLOO_SOCKET_IFNAME>"), or connecting to a loopback address across nodes: a host name that resolves to
            # 127.0.1.1 (Debian's /etc/hosts) sends the peers to themselves.
            r"Unable to find address for",
            r"connect\w*\W[^\n]{0,80}\b127\.\d{1,3}\.\d{1,3}\.\d{1,3}\b[^\n]{0,80}(?:refused|failed|timed out)",
        ),
    ),
    # The RDMA network between NICs: NCCL src/transport/net_ib.cc (and the IB plugins' ib_plugin.c) "NET/IB : Got
    # completion from peer <addr> with status=<n> opcode=... vendor err <n>" (ibv_wc_status: 12 transport retry
    # counter exceeded), src/misc/ibvwrap.cc "Call to ibv_modify_qp failed with 110 Connection timed out" / "with
    # error No such device" (a GID index or NIC that cannot route); ibv_reg_mr failing for memory is the locked-memory
    # limit, not the network (stderr_causes.py).
    LineSign(
        IB_NETWORK,
        _any(
            r"NET/IB ?: Got completion from peer .{0,200}(?:error|status)",
            r"Call to ibv_(?!reg_mr)\w+ failed",
            r"transport/net_ib\.cc:\d+ NCCL WARN",
        ),
    ),
    # src/transport/p2p.cc and src/graph/paths.cc: "Cuda failure 'peer access is not supported between these two
    # devices'", "P2P is disabled between NVLINK connected GPUs"; a WARN from transport/{p2p,shm,net_ib}.cc in general.
    LineSign(
        TRANSPORT,
        _any(
            r"peer access is not supported between these two devices",
            r"P2P is disabled between NVLINK connected GPUs",
            r"transport/(?:p2p|shm|net_socket)\.cc:\d+ NCCL WARN",
        ),
    ),
    # This suite's own rank result (conformance/common/casefiles.py RankStatus.FAIL), as diagnose.sources quotes it;
    # nccl-tests' own check of every element (src/common.cu: PRINT("# Out of bounds values : %d %s\n", errors,
    # errors ? "FAILED" : "OK")).
    LineSign(WRONG_DATA, _any(r"^wrong data received: ", r"Out of bounds values : [1-9]\d* FAILED")),
    # torch/distributed/distributed_c10d.py barrier(): "Rank {rank} using GPU {gpu} to perform barrier as devices
    # used by this process are currently unknown. This can potentially cause a hang ..." (torch 1.8 .. 2.3);
    # "barrier(): using the device under current context. You can specify `device_id` in `init_process_group`"
    # (torch 2.4 and later, 2.13 read).  A warning: the job is at fault only if it then hangs.
    LineSign(
        BARRIER_DEVICE,
        _any(
            r"to perform barrier as devices used by this process are currently unknown",
            r"barrier\(\): using the device",
            # this suite's rank facts (conformance/rank/barrier_device.py), as diagnose.sources quotes them
            r"^first barrier ran on GPU \d+, not the rank's own GPU",
        ),
        root=False,
    ),
)

# NCCL src/include/nccl.h ncclRemoteError "remote process exited or there was a network error", and torch's
# DistBackendError for it: the rank that prints it lost a peer, it is not the peer.
PEER_GONE = re.compile(r"remote process exited or there was a network error|ncclRemoteError", re.IGNORECASE)

# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (Watchdog): "[Rank 1] Watchdog caught collective operation
# timeout: WorkNCCL(SeqNum=14863, OpType=ALLREDUCE, NumelIn=..., Timeout(ms)=1800000) ran for 1800048
# milliseconds before timing out."; with the flight recorder (torch >= 2.3): "[Rank 1] Timeout at NCCL work:
# 14863, last enqueued NCCL work: 14863, last completed NCCL work: 14862."
WATCHDOG_SEQUENCE = re.compile(
    r"WorkNCCL\(SeqNum=(?P<seq>\d{1,12}), OpType=(?P<op>\w{1,40})(?:, NumelIn=(?P<numel>\d{1,15}))?", re.ASCII
)
TIMEOUT_AT_WORK = re.compile(r"Timeout at NCCL work: (?P<seq>\d{1,12})", re.ASCII)

# Interfaces no other node can reach through: NCCL picks the first it finds unless NCCL_SOCKET_IFNAME says
# otherwise (src/misc/socket.cc, ncclFindInterfaces prefers "ib" then anything but "docker" and "lo";
# a container without --network host, or a bridge named otherwise, still gets chosen).
# The causes of stderr_causes.KNOWN_CAUSES that are not NCCL's own: the class diagnose files them under.
HOST_LIMIT_CAUSES = (FILE_TABLE_FULL, DESCRIPTORS_EXHAUSTED, LOCKED_MEMORY_TOO_LOW, DISK_FULL)

RENDEZVOUS_CAUSES = (ADDRESS_IN_USE,)  # the store's port, MASTER_PORT, is the port a job binds first

UNREACHABLE_INTERFACES = re.compile(r"^(?:lo|docker\d*|virbr\d*|veth\w*|br-\w+|cni\d*|flannel\S*|tailscale\d*)$")

# The job stopped from outside, not by a fault of its own: a user's Ctrl-C (Python's KeyboardInterrupt), torchrun's
# agent receiving SIGTERM/SIGINT (torch/distributed/elastic/multiprocessing/api.py SignalException: "Process %d got
# signal: %d", "Signals.SIGTERM" before Python 3.11; agent/server/api.py "Received %s death signal"), SLURM cancelling
# the job ("slurmstepd: error: *** JOB 42 ON node1 CANCELLED AT ... DUE TO TIME LIMIT ***", src/slurmd/slurmstepd/
# req.c), Lightning's SIGTERM handler ("Received SIGTERM: 15").  Often after a hang: what the job was doing before it
# is the story.
STOPPED_FROM_OUTSIDE = re.compile(
    r"\bKeyboardInterrupt\b|SignalException|got signal: (?:2|15|Signals\.SIG(?:INT|TERM))\b"
    r"|Received (?:Signals\.)?(?:2|15|SIGINT|SIGTERM) death signal|Received SIGTERM: 15\b"
    r"|\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT"
)
