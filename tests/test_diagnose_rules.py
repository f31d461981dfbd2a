"""``conformance diagnose``'s rules, each on logs in the shapes the field writes them.

The lines follow the format strings of the programs that print them (cited where the rule lives:
conformance/diagnose/job_lines.py, logs.py, evidence.py; conformance/verdict/job_causes.py,
cuda_errors.py, stderr_causes.py).  Section by section as issue 39 lists the rules: never "no
failure" where a failure shows; who wrote each line and how big the job is; collectives out of step;
errors by code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli.main import main

WATCHDOG = (
    "[E1218 20:27:{s:02d}.426415540 ProcessGroupNCCL.cpp:629] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={n}, NumelOut={n}, Timeout(ms)=600000) ran for 600081 "
    "milliseconds before timing out."
)
NORMAL_END = (
    "INFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully finished. Waiting 300 "
    "seconds for other agents to finish."
)


def diagnose(capsys: pytest.CaptureFixture[str], tmp_path: Path, *logs: str) -> tuple[int, dict[str, object]]:
    """Each text a log file of its own (job.log, job1.log, ...); the exit status and the JSON answer."""
    paths = []
    for index, text in enumerate(logs):
        path = tmp_path / f"job{index or ''}.log"
        path.write_text(text + "\n")
        paths.append(str(path))
    status = main(["diagnose", "--json", *paths])
    return status, json.loads(capsys.readouterr().out)


def lines(*texts: str) -> str:
    return "\n".join(texts)


# --------------------------------------------------------------------------------------------
# 1. Never "no failure" where the log shows a failure
# --------------------------------------------------------------------------------------------

SHOWS_A_FAILURE = {
    "a traceback of an exception no rule knows": (
        lines(
            "Traceback (most recent call last):",
            '  File "train.py", line 9, in <module>',
            "    main()",
            "TokenizerMismatch: vocabulary of 32000 does not match the checkpoint's 32001",
        ),
        "rank_error",
    ),
    "an error line that names nothing known": (
        "rocblaslt error: Could not load /opt/lib/TensileLibrary_lazy_gfx942.dat",
        "unrecognised",
    ),
    "a non-zero exit only": ("srun: error: node7: task 3: Exited with exit code 1", "unrecognised"),
    "a fatal signal as the shell reports it": ("Floating point exception (core dumped)", "killed"),
    "a timeout only": (WATCHDOG.format(s=1, r=0, seq=5, op="ALLREDUCE", n=1), "hang"),
    "torchrun's worker group FAILED": (
        "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
        "unrecognised",
    ),
    "frames of a traceback whose first and last lines were cut": (
        lines('  File "trainer.py", line 1534, in _save_checkpoint', "    torch.save(rng_states, path)"),
        "unrecognised",
    ),
}


@pytest.mark.parametrize(("log", "expected"), SHOWS_A_FAILURE.values(), ids=SHOWS_A_FAILURE.keys())
def test_a_log_that_shows_a_failure_is_never_no_failure(
    log: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1
    assert answer["failure_found"] is True and answer["class"] == expected, answer
    assert answer["evidence"], "the failure's lines are quoted"


def test_an_unrecognised_failure_quotes_the_first_and_the_most_specific_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = lines(
        "[rank0]:step 10 loss 2.1",
        "[rank1]:ERROR: the data loader failed to start",
        "[rank1]:custom_op.cc:88 internal failure in the fused kernel",
        "[rank0]:step 11 loss 2.0",
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["verdict"] == "unrecognised failure", answer
    quoted = [(e["line"], e["text"]) for e in answer["evidence"]]  # type: ignore[union-attr]
    assert quoted == [
        (2, "ERROR: the data loader failed to start"),
        (3, "custom_op.cc:88 internal failure in the fused kernel"),
    ]
    assert any("ranks 0-1" in note for note in answer["notes"]), answer["notes"]  # type: ignore[union-attr]
    assert "NCCL_DEBUG=INFO" in str(answer["fix"]) and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in str(answer["fix"])


def test_no_failure_only_with_a_normal_end_and_it_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = lines(
        "#  Rank  0 Group  0 Pid   4766 on   host-1 device  0 [0x21] NVIDIA H100 80GB HBM3",
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 142.652",
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 0 and answer["verdict"] == "no failure", answer
    assert answer["ended_normally"] == [
        {
            "file": str(tmp_path / "job.log"),
            "line": 3,
            "text": "# Avg bus bandwidth    : 142.652",
            "what": "nccl-tests finished",
        }
    ]


def test_a_normal_end_does_not_hide_an_exception(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines("[rank1]:KeyError: 'labels'", NORMAL_END)

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "rank_error" and answer["root_ranks"] == [1], answer


def test_a_warning_printed_before_a_normal_end_is_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines("host:1:1 [0] transport/net_socket.cc:12 NCCL WARN NET/Socket : retrying a connect", NORMAL_END)

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 0 and answer["verdict"] == "no failure", answer
    assert any("yet the job ended normally" in note for note in answer["notes"]), answer  # type: ignore[union-attr]


WHERE_THE_LOG_STOPS = {
    "right after NCCL's Init COMPLETE": (
        lines(
            "node1:4000:4000 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
            "node1:4000:4010 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1a000 - Init START",
            "node1:4000:4010 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1a000 - Init COMPLETE",
            "...",
        ),
        "transport",
        "AFTER NCCL's INIT COMPLETE",
    ),
    "in NCCL's set-up": (
        lines(
            "#  Rank  0 Group  0 Pid    225 on nccl-tests device  0 [0xc1] NVIDIA RTX A6000",
            "nccl-tests:225:225 [0] NCCL INFO Bootstrap : Using eno1np0:172.31.45.2<0>",
            "nccl-tests:225:240 [1] NCCL INFO Channel 00 : 1[c2000] -> 0[c1000] via P2P/direct pointer",
        ),
        "transport",
        "IN NCCL's SET-UP",
    ),
    "mid-job, the ranks having run": (
        lines("[1,0]<stdout>:step 1", "[1,1]<stdout>:step 1", "[1,0]<stdout>:Enqueued alltoall"),
        "hang",
        "ends mid-job",
    ),
    "in a stack dump inside a collective": (
        lines(
            'Thread 1302975 (active): "MainThread"',
            "    sched_yield (libc.so.6)",
            "    ncclAllReduce (collectives.cc:49)",
            "    all_reduce (torch/distributed/distributed_c10d.py:2501)",
        ),
        "hang",
        "inside a collective",
    ),
    "after torch guessed the barrier's GPU": (
        lines(
            "[rank1]:UserWarning: barrier(): using the device under current context. You can specify `device_id` "
            "in `init_process_group` to mute this warning.",
            "[rank1]:step 0",
        ),
        "barrier_device",
        "guessed",
    ),
    "after the launcher's start only": (
        lines(
            "WARNING:torch.distributed.run:",
            "*****************************************",
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system "
            "being overloaded, please further tune the variable for optimal performance in your application as needed.",
            "*****************************************",
        ),
        "rendezvous",
        "nothing followed",
    ),
}


@pytest.mark.parametrize(("log", "expected", "said"), WHERE_THE_LOG_STOPS.values(), ids=WHERE_THE_LOG_STOPS.keys())
def test_a_log_that_stops_mid_job_says_where(
    log: str, expected: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == expected, answer
    assert said in str(answer["title"])


def test_a_log_that_shows_nothing_either_way_is_not_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, answer = diagnose(capsys, tmp_path, "hello from the job's wrapper script")

    assert status == 3 and answer["verdict"] == "not judged" and answer["failure_found"] is False, answer


def test_a_last_line_that_reads_like_an_end_is_not_taken_for_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = lines(
        "pg00:17:17 [0] NCCL INFO comm 0x55e4 rank 0 nranks 2 cudaDev 0 busId b1000 commId 0x13 - Init COMPLETE",
        "communicators established successfully",
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 3 and answer["verdict"] == "not judged", answer  # never "no failure" from the job's own words
    assert any("reads like an end" in note for note in answer["notes"]), answer  # type: ignore[union-attr]


def test_ctrl_c_after_a_hang_is_not_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines(
        "node1:40:40 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1a000 commId 0x9 - Init COMPLETE",
        "[rank0]:step 1",
        "^CTraceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "KeyboardInterrupt",
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] != "rank_error", answer
    assert any("stopped from outside" in note for note in answer["notes"]), answer  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# 2. Who wrote each line, from any prefix; the job's size against the ranks seen
# --------------------------------------------------------------------------------------------

SOCKET_FAILED = (  # NCCL 2.3 and older print no "NCCL" before WARN
    "e66a:3171:3171 [0] include/socket.h:311 WARN Socket creation failed : Address family not supported by protocol"
)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
PREFIXES = {
    "torch": (f"[rank5]:{OOM}", [5]),
    "mpirun": (f"[1,5]<stderr>:{OOM}", [5]),
    "lightning": (f"[rank: 5] {OOM}", [5]),
    "deepspeed": (f"[Rank 5] {OOM}", [5]),
    "ray and torch, coloured": (f"\x1b[36m(RayWorkerWrapper pid=2789, ip=10.0.0.2)\x1b[0m [rank5]:{OOM}", [5]),
    "vllm's log format inside a ray worker": (
        f"(RayWorkerWrapper pid=11305) ERROR 08-27 05:12:18 worker_base.py:382] [rank5]:{OOM}",
        [5],
    ),
    "srun and torchrun": (f"1: [default1]:{OOM}", [5]),
}


@pytest.mark.parametrize(("line", "root"), PREFIXES.values(), ids=PREFIXES.keys())
def test_the_writer_comes_from_any_prefix(
    line: str, root: list[int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    waiting = [f"0: [default{local}]:step 3" for local in range(4)] + [
        f"1: [default{local}]:step 3" for local in range(4)
    ]

    status, answer = diagnose(capsys, tmp_path, lines(*waiting, line))

    assert status == 1 and answer["class"] == "oom" and answer["root_ranks"] == root, answer


def test_a_worker_named_only_by_its_pid_and_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, answer = diagnose(capsys, tmp_path, f"(RayWorkerWrapper pid=2789, ip=10.0.0.2) {OOM}")

    assert status == 1 and answer["class"] == "oom", answer
    assert "10.0.0.2:2789" in str(answer["root"]), answer


def test_a_rank_announced_twice_and_ranks_never_seen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two nodes given the same node rank: Lightning's GLOBAL_RANK line twice for ranks 0-1, never for 2-3."""
    log = lines(
        *(f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/4" for r in (0, 1, 0, 1)),
        "torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 2/4 clients joined.",
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "rendezvous", answer
    assert "rank 0-1 given to more than one process" in str(answer["title"])
    notes = " ".join(answer["notes"])  # type: ignore[arg-type]
    assert "ranks 2-3 of the 4 the job states" in notes and "more than one process" in notes


def test_fewer_workers_than_the_world_size_at_the_store_barrier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = (
        "RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for key: "
        "store_based_barrier_key:1 (world_size=8, num_workers_joined=4, timeout=0:30:00)"
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "rendezvous", answer
    assert "only 4 of 8 processes" in str(answer["title"])


def test_two_processes_claiming_one_rank_in_nccls_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    init = "{host}:{pid}:{pid} [0] NCCL INFO comm 0x{pid:x} rank {r} nranks 4 cudaDev 0 commId 0xab - Init START"
    log = lines(
        *(init.format(host=h, pid=p, r=r) for h, p, r in (("a", 10, 0), ("a", 11, 1), ("b", 20, 0), ("b", 21, 1))),
        WATCHDOG.format(s=1, r=0, seq=1, op="ALLREDUCE", n=1),
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "rendezvous" and answer["root_ranks"] == [0, 1], answer


def test_one_nodes_ranks_never_appear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 16-rank job's log from its first node: read the other node's log."""
    init = "node0:{p}:{p} [{r}] NCCL INFO comm 0x{p:x} rank {r} nranks 16 cudaDev {r} commId 0xab - Init COMPLETE"
    log = lines(
        *(init.format(p=100 + r, r=r) for r in range(8)),
        *(f"[rank{r}]:" + WATCHDOG.format(s=1, r=r, seq=7, op="ALLREDUCE", n=1) for r in range(8)),
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1, answer
    assert any("ranks 8-15 of the 16" in note and "their node's log" in note for note in answer["notes"]), answer  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# 3. Collectives out of step
# --------------------------------------------------------------------------------------------


def test_the_rank_alone_in_another_collective_is_the_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every rank at SeqNum 12, rank 2 in a barrier (no prefix: the rank is in torch's own message)."""
    log = lines(*(WATCHDOG.format(s=r, r=r, seq=12, op="BARRIER" if r == 2 else "ALLREDUCE", n=1) for r in range(4)))

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "desync" and answer["root_ranks"] == [2], answer
    assert "SeqNum 12 BARRIER" in str(answer["title"]) and "SeqNum 12 ALLREDUCE" in str(answer["title"])


def test_the_rank_alone_with_another_size_is_the_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines(
        *(f"[rank{r}]:" + WATCHDOG.format(s=r, r=r, seq=40, op="ALLGATHER", n=41 if r == 3 else 40) for r in range(4))
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "desync" and answer["root_ranks"] == [3], answer
    assert "41 elements" in str(answer["title"])


def test_two_ranks_in_two_collectives_blame_neither(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines(*(WATCHDOG.format(s=r, r=r, seq=9, op=op, n=1) for r, op in ((0, "BARRIER"), (1, "ALLREDUCE"))))

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "desync" and answer["root_ranks"] == [], answer
    assert "rank 0: SeqNum 9 BARRIER" in str(answer["title"]) and "rank 1: SeqNum 9 ALLREDUCE" in str(answer["title"])


# --------------------------------------------------------------------------------------------
# 4. Errors by code
# --------------------------------------------------------------------------------------------

BY_CODE = {
    "nccl-tests, CUDA 802 by its text": (
        "gpu-3: Test CUDA failure common.cu:941 'system not yet initialized'",
        "machine_fault",
        "nvidia-fabricmanager",
    ),
    "torch, CUDA 802 by its name": ("RuntimeError: CUDA error: cudaErrorSystemNotReady", "machine_fault", "802"),
    "NCCL, CUDA 999 by its number": (
        "gpu47:4962:5097 [1] misc/cudawrap.cc:88 NCCL WARN CUDA driver error 999",
        "machine_fault",
        "Xid",
    ),
    "CUDA 217": (
        "h:1:1 [0] misc/utils.cc:9 NCCL WARN Cuda failure 217 'peer access is not supported between these two devices'",
        "transport",
        "P2P",
    ),
    "CUDA 401": (
        "RuntimeError: CUDA error: the operation cannot be performed in the present state",
        "rank_error",
        "401",
    ),
    "CUDA 35: the driver too old": (
        "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
        "version_mismatch",
        "driver",
    ),
    "nccl-tests, NCCL error with its WARN": (
        lines(
            "node08:27106:27302 [0] misc/shmutils.cc:27 NCCL WARN Call to shm_open failed : Permission denied",
            "node08: Test NCCL failure common.cu:891 'unhandled system error (run with NCCL_DEBUG=INFO for details)'",
        ),
        "nccl_error",
        "mode=1777",
    ),
    "/dev/shm full, not denied": (
        "node1:1:1 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device",
        "nccl_error",
        "--shm-size",
    ),
    "NCCL error with no WARN: what to collect": (
        "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "nccl_error",
        "NCCL_DEBUG=WARN",
    ),
    "a socket that cannot be made in a container": (
        SOCKET_FAILED,
        "network_interface",
        "NCCL_SOCKET_IFNAME",
    ),
    "the store unreachable": (
        "torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of "
        "(192.168.121.122, 1040).",
        "rendezvous",
        "MASTER_ADDR",
    ),
    "a launcher's child killed": (
        "subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGKILL: 9>.",
        "killed",
        "OOM killer",
    ),
    "Ray's memory monitor": (
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "killed",
        "host memory",
    ),
    "nccl-tests' wrong data": ("# Out of bounds values : 12 FAILED", "wrong_data", "NCCL_P2P_LEVEL"),
    "cuBLAS's workspace": (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "oom",
        "allocate less",
    ),
    "gloo's interface missing": (
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != nullptr. "
        "Unable to find address for: eth1",
        "network_interface",
        "GLOO_SOCKET_IFNAME",
    ),
    "a host name resolving to loopback": (
        "RuntimeError: Gloo connectFullMesh failed with [pair.cc:144] Connect to 127.0.1.1:41823 failed: "
        "Connection refused",
        "network_interface",
        "NCCL_SOCKET_IFNAME",
    ),
    "shared tensors out of descriptors": (
        "RuntimeError: received 0 items of ancdata",
        "host_limit",
        "ulimit -n",
    ),
    "EFA memory registration": (
        "h:1:1 [0] ofi_util.c:88 NCCL WARN fi_mr_reg failed: Cannot allocate memory",
        "host_limit",
        "ulimit -l",
    ),
    "an Xid in the kernel log": (
        "[Tue Nov 12 10:01:02 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, An uncorrectable double bit "
        "error (DBE) has been detected on GPU in the framebuffer at partition 1, subpartition 0.",
        "machine_fault",
        "Xid catalogue",
    ),
    "the store never answered": (
        "torch.distributed.DistNetworkError: The client socket has timed out after 1800s while trying to connect "
        "to (10.0.0.1, 29500).",
        "rendezvous",
        "MASTER_PORT",
    ),
}


@pytest.mark.parametrize(("log", "expected", "fix"), BY_CODE.values(), ids=BY_CODE.keys())
def test_errors_by_code(log: str, expected: str, fix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == expected, answer
    assert fix in f"{answer['title']} {answer['fix']}", answer


TOO_OLD = {
    "NCCL 2.25 on an RTX 5090 (sm_120)": (
        lines(
            "#  Rank  0 Group  0 Pid   4766 on   GENOA-06 device  0 [0x21] NVIDIA GeForce RTX 5090",
            "GENOA-06:4766:4766 [0] NCCL INFO NCCL version 2.25.1+cuda12.8",
            "GENOA-06:4766:4780 [0] NCCL INFO ncclMaxSharedMem 82240 exceeds device/fn maxSharedMem 79856",
        ),
        "2.26.2",
    ),
    "no kernel image for sm_90": (
        lines(
            "UserWarning: NVIDIA H100 80GB HBM3 with CUDA capability sm_90 is not compatible with the current PyTorch "
            "installation.",
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        ),
        "2.15.1",
    ),
    "NCCL 2.14 on an H100, hanging": (
        lines(
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)",
            "h:1:1 [0] NCCL INFO NCCL version 2.14.3+cuda11.7",
            WATCHDOG.format(s=1, r=0, seq=1, op="ALLREDUCE", n=1),
        ),
        "2.15.1",
    ),
}


@pytest.mark.parametrize(("log", "minimum"), TOO_OLD.values(), ids=TOO_OLD.keys())
def test_nccl_too_old_for_the_gpu_names_the_first_release_for_it(
    log: str, minimum: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "version_mismatch", answer
    assert minimum in f"{answer['title']} {answer['fix']}"


def test_nodes_loading_different_nccl_network_plugins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines(
        "h11:18226:18274 [5] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
        "h04:589474:589541 [0] NCCL INFO NET/Plugin: Loaded net plugin FastSocket (v4)",
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "version_mismatch", answer
    assert "h04: FastSocket" in str(answer["title"]) and "h11: internal" in str(answer["title"])


def test_a_hang_at_exit_without_destroy_process_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines(
        "[rank0]:[W205 18:00:34.953 ProcessGroupNCCL.cpp:1538] Warning: WARNING: destroy_process_group() was not "
        "called before program exit, which can leak resources.",
        "[rank4]:[E205 18:11:06.375 ProcessGroupNCCL.cpp:1870] [PG ID 12 Rank 4] ProcessGroupNCCL's watchdog got "
        "stuck for 480 seconds without making progress in monitoring enqueued collectives.",
    )

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "watchdog_stuck", answer
    assert "AT EXIT" in str(answer["title"]) and "destroy_process_group()" in str(answer["fix"])


def test_an_error_every_rank_raised_alike_blames_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = lines(*(f"[rank{r}]: IndexError: tuple index out of range" for r in range(4)))

    status, answer = diagnose(capsys, tmp_path, log)

    assert status == 1 and answer["class"] == "rank_error" and answer["root_ranks"] == [], answer
    assert any("ranks 0-3 all failed alike" in note for note in answer["notes"]), answer  # type: ignore[union-attr]


def test_a_generic_nccl_error_gives_way_to_the_warning_that_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two files of one job: the first says only 'unhandled system error', the second's NCCL WARN says why."""
    status, answer = diagnose(
        capsys,
        tmp_path,
        "NCCL failure common.cu:874 'unhandled system error'",
        SOCKET_FAILED,
    )

    assert status == 1 and answer["class"] == "network_interface", answer


@pytest.mark.parametrize(
    ("line", "failed"),
    [
        ("wandb: Enter your choice: (30 second timeout) 3", False),  # a length stated: a prompt
        ("Using a 600 s timeout for the rendezvous", False),
        (
            "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation",
            True,
        ),
        (
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, Timeout(ms)=1800000) ran for "
            "1800429 milliseconds before timing out.",
            True,
        ),  # fmt: skip
        ("torch.distributed.DistStoreError: Socket Timeout", True),
    ],
)
def test_a_timeout_s_length_is_no_timeout_that_happened(line: str, failed: bool) -> None:
    """torch's, gloo's and NCCL's timeouts say they happened; a length before the word is a setting or a prompt."""
    from conformance.diagnose.evidence import _only_waited, _says_failure

    assert (_says_failure(line), _only_waited(line)) == (failed, failed)
