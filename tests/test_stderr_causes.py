"""Known causes hidden in a rank's logs become the verdict's message (the verdict keeps its kind).

The recogniser is checked on log tails written the way the real tools write them (gloo's enforce
failures, torch's store and DataLoader errors, NCCL's WARN lines as quoted in NCCL issues), and end
to end on a real rank that runs out of file descriptors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.verdict.decision import RankReport, decide
from conformance.verdict.stderr_causes import (
    ADDRESS_IN_USE,
    CUMEM_HOST_FAILED,
    DESCRIPTORS_EXHAUSTED,
    FILE_TABLE_FULL,
    GPU_OUT_OF_MEMORY,
    LOCKED_MEMORY_TOO_LOW,
    NCCL_ERROR,
    NVLS_BROKEN,
    SHM_FULL,
    TAIL_BYTES,
    Cause,
    rank_cause,
    recognise,
)
from conftest import read_records

pytestmark = pytest.mark.usefixtures("isolated_env")

W = "node-a:4242:4317 [0] "  # NCCL's line prefix: host:pid:tid [cudaDev]
NCCL_SYSTEM_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5"
)
CONNECT_FAILED = "socketStartConnect: Connect to 10.0.0.2<43613> failed : Software caused connection abort"
FAULTHANDLER_DUMP = """Fatal Python error: Aborted

Thread 0x00007fd709a806c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007fd724692b80 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 2169 in _new_process_group_helper
  File "/conformance/rank/main.py", line 90 in init_group"""

TAILS: dict[str, tuple[str, Cause | None]] = {
    "gloo-abort-emfile": (
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/listener.cc:63] false. "
        f"accept: Too many open files\n{FAULTHANDLER_DUMP}",
        DESCRIPTORS_EXHAUSTED,
    ),
    "python-emfile": ("OSError: [Errno 24] Too many open files: '/tmp/case/rank0/phase.jsonl'", DESCRIPTORS_EXHAUSTED),
    "torch-store-emfile": ("torch.distributed.DistStoreError: Too many open files", DESCRIPTORS_EXHAUSTED),
    "enfile": ("OSError: [Errno 23] Too many open files in system: '/dev/shm/x'", FILE_TABLE_FULL),
    "nccl-shm-no-space": (
        f"{W}misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes, "
        f"error: No space left on device (28)\n{W}NCCL INFO transport/shm.cc:551 -> 2\n{NCCL_SYSTEM_ERROR}",
        SHM_FULL,
    ),
    "nccl-old-posix-fallocate": (
        "[3] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device",
        SHM_FULL,
    ),
    "nccl-shm-segment": (
        f"{W}misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-KWfVyt "
        "(size 5967872)",
        SHM_FULL,
    ),
    "dataloader-bus-error": (
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        SHM_FULL,
    ),
    "tcpstore-eaddrinuse": (
        "RuntimeError: The server socket has failed to listen on any local network address. The server socket has "
        "failed to bind to [::]:29500 (errno: 98 - Address already in use).",
        ADDRESS_IN_USE,
    ),
    "memlock": (
        f"{W}transport/net_ib.cc:555 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
        LOCKED_MEMORY_TOO_LOW,
    ),
    "nccl-warn-before-system-error": (
        f"{W}misc/socket.cc:484 NCCL WARN {CONNECT_FAILED}\n{W}NCCL INFO misc/socket.cc:565 -> 2\n"
        f"{W}NCCL INFO bootstrap.cc:97 -> 2\nTraceback (most recent call last):\n"
        f'  File "/conformance/rank/main.py", line 90, in init_group\n{NCCL_SYSTEM_ERROR}',
        Cause(CONNECT_FAILED, "NCCL's warning before its unhandled system error"),
    ),
    "torch-last-error-only": (
        f"{NCCL_SYSTEM_ERROR}\nncclSystemError: System call (e.g. socket, malloc) or external library call failed "
        f"or device error.\nLast error:\n{CONNECT_FAILED}",
        Cause(CONNECT_FAILED, "NCCL's last error, behind its unhandled system error"),
    ),
    "nccl-invalid-usage": (
        f"{W}init.cc:1224 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n"
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage (run with "
        "NCCL_DEBUG=WARN for details), NCCL version 2.21.5",
        Cause(
            "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",
            "NCCL's warning before its invalid usage",
        ),
    ),
    "nccl-nvls-bind": (  # NCCL's own text (src/transport/nvls.cc, v2.30.7-1), before torch's unhandled cuda error
        f"{W}transport/nvls.cc:380 NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory of size 1073741824 : "
        "CUDA error 801 'operation not supported'.\nThis is usually caused by a system or configuration error in the "
        "Fabric Manager or NVSwitches.\nDisable NVLS (NCCL_NVLS_ENABLE=0) if you wish to avoid this error in the "
        "future.\ntorch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error",
        NVLS_BROKEN,
    ),
    "nccl-cumem-host-shm": (  # NVIDIA/nccl#1838: SHM in cuMem host memory on PCIe GPUs without P2P
        f"{W}transport/shm.cc:590 NCCL WARN Cuda failure 217 'peer access is not supported between these two "
        "devices'\ntorch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error",
        CUMEM_HOST_FAILED,
    ),
    "nccl-alloc-out-of-memory": (  # the second real-GPU run (docs/gpu-runs/2026-11-28-h200), a leftover holding the GPU
        "[2026-11-28 15:44:22] vm:2086:2086 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'\n"
        "[2026-11-28 15:44:22] vm:2086:2086 [0] include/alloc.h:346 NCCL WARN Failed to CUDA calloc async 608 bytes\n"
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9\nncclUnhandledCudaError: "
        "Call to CUDA function failed.\nLast error:\nFailed to CUDA calloc async 608 bytes",
        GPU_OUT_OF_MEMORY,
    ),
    "nccl-error-alone": (NCCL_SYSTEM_ERROR, NCCL_ERROR),
    "control-victim-and-shm-transport": (
        f"{W}NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n"
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        f"[127.0.0.1]:51234\n{FAULTHANDLER_DUMP}",
        None,
    ),
    "control-empty": ("", None),
}


@pytest.mark.parametrize(("tail", "expected"), TAILS.values(), ids=TAILS.keys())
def test_recognise(tail: str, expected: Cause | None) -> None:
    assert recognise(tail) == expected


def test_a_message_that_names_the_cause_gets_only_the_fix() -> None:
    assert DESCRIPTORS_EXHAUSTED.explain("killed by SIGABRT") == (
        "killed by SIGABRT: Too many open files (file descriptors exhausted; raise `ulimit -n`)"
    )
    assert DESCRIPTORS_EXHAUSTED.explain("OSError: [Errno 24] Too many open files") == (
        "OSError: [Errno 24] Too many open files (file descriptors exhausted; raise `ulimit -n`)"
    )


def test_rank_cause_reads_nccl_warnings_then_stderr(tmp_path: Path) -> None:
    """NCCL's INFO lines (a retried bind) are not causes; its WARN before torch's error is."""
    (tmp_path / "nccl.log").write_text(
        f"{W}NCCL INFO Call to bind failed : Address already in use, retrying\n{W}misc/socket.cc:484 NCCL WARN "
        f"{CONNECT_FAILED}\n{W}NCCL INFO misc/socket.cc:565 -> 2\n"
    )
    (tmp_path / "stderr.log").write_text(f"Traceback (most recent call last):\n{NCCL_SYSTEM_ERROR}\n")
    assert rank_cause(tmp_path) == Cause(CONNECT_FAILED, "NCCL's warning before its unhandled system error")


def test_rank_cause_reads_only_the_tail(tmp_path: Path) -> None:
    filler = "x" * 99 + "\n"
    stderr = tmp_path / "stderr.log"
    stderr.write_text("OSError: [Errno 24] Too many open files\n" + filler * (TAIL_BYTES // len(filler) + 10))
    assert rank_cause(tmp_path) is None
    with stderr.open("a") as f:
        f.write("OSError: [Errno 98] Address already in use\n")
    assert rank_cause(tmp_path) == ADDRESS_IN_USE
    assert rank_cause(tmp_path / "no such rank") is None


def report(rank: int, status: str, cause: Cause | None, **values: Any) -> RankReport:
    base: dict[str, Any] = {
        "device": f"cpu{rank}", "pid": 100 + rank, "phase": "init", "step": "", "phase_time": None, "progress": 3,
        "exit": 0, "seconds": 1.0, "time": 10.0 + rank,
    }  # fmt: skip
    return RankReport(rank=rank, status=status, cause=cause, **{**base, **values})


def test_the_roots_cause_comes_first_then_the_other_ranks() -> None:
    decision = decide(
        [
            report(0, "crash", DESCRIPTORS_EXHAUSTED, message="killed by SIGABRT", exit="SIGABRT"),
            report(1, "error", ADDRESS_IN_USE, message="exited with code 4 (error) without a result"),
            report(2, "error", ADDRESS_IN_USE, message="exited with code 4 (error) without a result"),
            report(3, "error", DESCRIPTORS_EXHAUSTED, message="exited with code 4 (error) without a result"),
        ]
    )
    assert decision.verdict == "crash"  # the kind stays
    assert decision.summary == (
        f"rank 0 (cpu0) in init: killed by SIGABRT: {DESCRIPTORS_EXHAUSTED.text}; ranks 1,2: {ADDRESS_IN_USE.text}"
    )


def test_ranks_stuck_alike_name_their_causes() -> None:
    stopped: dict[str, Any] = {"stopped_by": "SIGTERM", "message": "stopped", "exit": "SIGTERM"}
    decision = decide([report(0, "stopped", ADDRESS_IN_USE, **stopped), report(1, "stopped", None, **stopped)])
    assert (decision.verdict, decision.root) == ("hang", None)
    assert decision.summary == f"ranks 0,1 all stuck in init; rank 0: {ADDRESS_IN_USE.text}"


def test_a_cause_does_not_make_a_victim_a_root() -> None:
    timed_out = report(1, "error", DESCRIPTORS_EXHAUSTED, message="Timed out waiting for peers", time=1.0)
    assert timed_out.victim
    root = decide([report(0, "crash", None, message="killed by SIGSEGV"), timed_out]).root
    assert root is not None and root.rank == 0


# A rank's descriptors: 0-2, its logs and store, then gloo's epoll, listener and sockets.  Nine runs
# out inside gloo's connect: its listener thread's accept aborts the rank (SIGABRT), and the peer's
# next open fails (an exit without result, or gloo's enforce error).  pytest itself needs more than
# this, so only the forkserver the ranks are forked from gets the lower limit.
RANK_FILE_LIMIT = 9
SHORT_OF_DESCRIPTORS = f"""
import resource

from conformance.plan.matrix import DeviceSet
from conformance.plugin import SESSION_KEY

def test_case(conformance_case, conformance, request):
    server = request.config.stash[SESSION_KEY].runners.forkserver
    server.ensure_started()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, ({RANK_FILE_LIMIT}, hard))
    conformance_case("all_reduce", DeviceSet(conformance.topology.devices, "all"), sizes=[4])
"""


def test_a_rank_out_of_descriptors_is_reported_with_the_cause(
    pytester: pytest.Pytester, run_suite, reports_dir: Path
) -> None:
    pytester.makepyfile(test_x=SHORT_OF_DESCRIPTORS)
    result = run_suite("--virtual-devices=2", "--step-timeout=4", "--op-timeout=3", "--init-timeout=3", "--grace=1")
    result.assert_outcomes(failed=1)
    (record,) = read_records(reports_dir)
    ranks = {r["rank"]: r for r in record["ranks"]}
    crashed = [r for r in ranks.values() if r["status"] == "crash"]
    assert [r["exit"] for r in crashed] == ["SIGABRT"], record["ranks"]
    assert all(r["cause"] == DESCRIPTORS_EXHAUSTED.text for r in ranks.values()), record["ranks"]
    root = record["root_cause"]
    assert record["verdict"] in ("crash", "error")  # the kind stays: whichever rank failed first
    if record["verdict"] == "crash":
        assert root["message"] == f"killed by SIGABRT: {DESCRIPTORS_EXHAUSTED.text}"
    assert root["message"].endswith(DESCRIPTORS_EXHAUSTED.text)
    assert record["summary"].endswith(DESCRIPTORS_EXHAUSTED.text)
    result.stdout.fnmatch_lines(
        [f"{record['verdict']}: rank {root['rank']} (cpu{root['rank']}) in init *{DESCRIPTORS_EXHAUSTED.text}"]
    )
