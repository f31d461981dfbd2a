"""``conformance diagnose`` on logs written in the documented formats, and on bad input.

The log lines follow torch's and NCCL's own format strings (cited in conformance/verdict/job_causes.py
and conformance/diagnose/logs.py); each test is one failure class as a job's logs show it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli.main import main
from conftest import diagnose_peak

WATCHDOG = (
    "[rank{r}]:[E1218 20:27:{s}.426415540 ProcessGroupNCCL.cpp:629] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran "
    "for 600081 milliseconds before timing out."
)
CHILD_FAILED = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-12-18_20:27:25
  host      : gpu-node-1
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 1201)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 1201
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-12-18_20:17:02
  host      : gpu-node-1
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 1204)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1204
============================================================
"""


def diagnose(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, dict[str, object]]:
    status = main(["diagnose", "--json", *map(str, paths)])
    out = capsys.readouterr().out
    return status, json.loads(out) if out.strip() else {}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_killed_rank_behind_watchdog_timeouts_is_the_root_and_the_others_victims(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [WATCHDOG.format(r=r, s=21, seq=1, op="BROADCAST") for r in (0, 1, 2)]
    log = write(tmp_path / "torchrun.log", "\n".join(lines) + "\n" + CHILD_FAILED)

    status, answer = diagnose(capsys, log)

    assert status == 1
    assert answer["class"] == "killed" and answer["root_ranks"] == [3], answer
    assert answer["victims"] == ["0", "1", "2"]
    assert "OOM killer" in str(answer["fix"])
    assert any("SIGKILL" in e["text"] for e in answer["evidence"])  # type: ignore[attr-defined]


def test_out_of_memory_on_one_node_of_an_interleaved_slurm_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Srun --label tasks (one torchrun per node) and torchrun's [defaultN] prefixes: node 1, local rank 2 is rank 6."""
    lines = []
    for task in (0, 1):
        lines += [f"{task}: [default{local}]:Epoch 3 step 120" for local in range(4)]
    lines += [
        "1: [default2]:Traceback (most recent call last):",
        '1: [default2]:  File "train.py", line 88, in <module>',
        "1: [default2]:    loss.backward()",
        "1: [default2]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total "
        "capacity of 79.10 GiB of which 1.2 GiB is free.",
    ]
    for task in (0, 1):
        lines += [
            f"{task}: [default{local}]:" + WATCHDOG.format(r=task * 4 + local, s=30, seq=88, op="ALLREDUCE")
            for local in (0, 1)
        ]
    log = write(tmp_path / "slurm-4242.out", "\n".join(lines) + "\n")

    status, answer = diagnose(capsys, log)

    assert status == 1
    assert answer["class"] == "oom" and answer["root_ranks"] == [6], answer
    assert set(answer["victims"]) == {"0", "1", "4", "5"}  # type: ignore[arg-type]
    assert answer["evidence"][0]["line"] == 12  # type: ignore[index]


def test_nccl_debug_files_name_the_rank_and_the_shm_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NCCL_DEBUG_FILE=nccl.%h.%p.log: the rank of each pid comes from its init line (src/init.cc)."""
    for rank, pid in enumerate((501, 502)):
        text = [
            f"node7:{pid}:{pid} [{rank}] NCCL INFO NCCL version 2.21.5+cuda12.4",
            f"node7:{pid}:{pid} [{rank}] NCCL INFO ncclCommInitRank comm 0x55d0{rank} rank {rank} nranks 2 cudaDev "
            f"{rank} nvmlDev {rank} busId 1{rank}000 commId 0x1234 - Init START",
        ]
        if rank == 1:
            text += [
                f"node7:{pid}:{pid} [1] misc/shmutils.cc:87 NCCL WARN Error: failed to extend /dev/shm/nccl-Xv1e0G to "
                "9637892 bytes",
                f"node7:{pid}:{pid} [1] NCCL WARN Error while creating shared memory segment /dev/shm/nccl-Xv1e0G "
                "(size 9637888)",
            ]
        write(tmp_path / "nccl" / f"nccl.node7.{pid}.log", "\n".join(text) + "\n")
    write(
        tmp_path / "rank1.log",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error (run "
        "with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n",
    )

    status, answer = diagnose(capsys, tmp_path)

    assert status == 1
    assert answer["class"] == "nccl_error" and answer["root_ranks"] == [1], answer
    assert answer["title"] == "/dev/shm is full"
    assert "--shm-size" in str(answer["fix"])


def test_ranks_timed_out_on_different_collectives_took_another_code_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [WATCHDOG.format(r=r, s=21, seq=412, op="ALLREDUCE") for r in (0, 1, 3)]
    lines.append(WATCHDOG.format(r=2, s=21, seq=413, op="BROADCAST"))

    status, answer = diagnose(capsys, write(tmp_path / "job.log", "\n".join(lines) + "\n"))

    assert status == 1
    assert answer["class"] == "desync" and answer["root_ranks"] == [2], answer


def test_an_nccl_warning_behind_its_error_gets_the_fix_its_source_entry_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NCCL 2.28.9's own words (src/plugin/net.cc, as the second real-GPU run printed them): an action, cited.

    Before the catalogue the fix read "NCCL's last error, behind its invalid usage", which names no action.
    """
    log = write(
        tmp_path / "job.log",
        "node1:2086:2086 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
        "node1:2086:2086 [0] plugin/net.cc:370 NCCL WARN Failed to initialize any NET plugin\n"
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\n"
        "[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
        "[rank0]: Last error:\n[rank0]: Failed to initialize any NET plugin\n",
    )
    _, answer = diagnose(capsys, log)
    assert (answer["class"], answer["title"], answer["root"]) == (
        "nccl_error",
        "Failed to initialize any NET plugin",
        "rank 0",
    )
    assert str(answer["fix"]).startswith("check NCCL_NET and NCCL_NET_PLUGIN name a plugin installed on every node")
    assert str(answer["fix_source"]).startswith("NCCL src/plugin/net.cc:")


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            [
                "node1:11:11 [0] NCCL INFO NCCL version 2.18.1+cuda12.1",
                "node2:22:22 [0] NCCL INFO NCCL version 2.19.3+cuda12.2",
                WATCHDOG.format(r=0, s=1, seq=1, op="ALLREDUCE"),
            ],
            "version_mismatch",
        ),
        (
            [
                "node1:11:11 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>",
                "node2:22:22 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>",
                WATCHDOG.format(r=0, s=1, seq=1, op="ALLREDUCE"),
            ],
            "network_interface",
        ),
        (
            [
                "[rank0]:UserWarning: Rank 0 using GPU 0 to perform barrier as devices used by this process are "
                "currently unknown. This can potentially cause a hang if this rank to GPU mapping is incorrect.",
                WATCHDOG.format(r=0, s=1, seq=1, op="ALLREDUCE"),
                WATCHDOG.format(r=1, s=1, seq=1, op="ALLREDUCE"),
            ],
            "barrier_device",
        ),
        (
            [
                "[rank3]:[E1111 17:10:53.1 ProcessGroupNCCL.cpp:1500] [PG 0 Rank 3] ProcessGroupNCCL's watchdog got "
                "stuck for 480 seconds without making progress in monitoring enqueued collectives.",
                WATCHDOG.format(r=1, s=1, seq=7, op="ALLREDUCE"),
            ],
            "watchdog_stuck",
        ),
        (
            ["torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 7/8 clients joined."],
            "rendezvous",
        ),
        (
            [
                "[rank5]:RuntimeError: CUDA error: uncorrectable ECC error encountered",
                WATCHDOG.format(r=1, s=1, seq=7, op="X"),
            ],
            "machine_fault",
        ),
        (
            [
                "node1:11:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read",
                WATCHDOG.format(r=0, s=1, seq=5, op="ALLREDUCE"),
                WATCHDOG.format(r=1, s=1, seq=5, op="ALLREDUCE"),
            ],
            "transport",
        ),
        ([WATCHDOG.format(r=0, s=1, seq=5, op="ALLREDUCE"), WATCHDOG.format(r=1, s=1, seq=5, op="ALLREDUCE")], "hang"),
    ],
    ids=["versions", "docker0", "barrier", "watchdog-stuck", "rendezvous", "ecc", "p2p-hang", "hang"],
)
def test_each_job_wide_class(
    lines: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = diagnose(capsys, write(tmp_path / "job.log", "\n".join(lines) + "\n"))

    assert status == 1
    assert answer["class"] == expected, answer
    assert answer["fix"]


def test_torchelastic_error_file_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TORCHELASTIC_ERROR_FILE (torch/distributed/elastic/multiprocessing/errors/error_handler.py)."""
    callstack = "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nKeyError: 'labels'\n"
    error = {"message": {"message": "KeyError: 'labels'", "extraInfo": {"py_callstack": callstack, "timestamp": "1"}}}
    write(tmp_path / "attempt_0" / "2" / "error.json", json.dumps(error))

    status, answer = diagnose(capsys, tmp_path)

    assert status == 1
    assert answer["class"] == "rank_error", answer
    assert "KeyError: 'labels'" in answer["evidence"][0]["text"]  # type: ignore[index]


def test_a_job_that_ended_normally_exits_0_naming_its_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Torchrun's agent says its worker group finished (torch/distributed/elastic/agent/server/api.py)."""
    log = write(
        tmp_path / "ok.log",
        "node1:11:11 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "node1:11:11 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
        "Epoch 1: loss 0.31\n"
        "INFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully finished. Waiting 300 "
        "seconds for other agents to finish.\n",
    )

    status = main(["diagnose", str(log)])

    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("no failure found: the job ended normally (1 file, 4 lines read)")
    assert f"{log}:4 (torchrun's worker group finished)" in out


def test_a_log_without_a_normal_end_is_never_no_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same job's log cut before its end: the ranks ran, nothing says they finished."""
    log = write(
        tmp_path / "cut.log",
        "node1:11:11 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "[rank0]:Epoch 1: loss 0.31\n"
        "[rank1]:Epoch 1: loss 0.30\n",
    )

    status, answer = diagnose(capsys, log)

    assert status == 1
    assert answer["verdict"] == "failure" and answer["class"] == "hang", answer
    assert "ends mid-job" in str(answer["title"])


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: p / "missing.log", "no such file or folder"),
        (lambda p: write(p / "empty.log", ""), "empty: no log line to read"),
        (lambda p: (p / "core").write_bytes(b"\x7fELF\x00\x01" * 100) and p / "core", "a binary file, not a log"),
        (lambda p: (p / "nothing").mkdir() or p / "nothing", "a folder with no log files"),
    ],
    ids=["missing", "empty", "binary", "no-logs"],
)
def test_unusable_input_is_one_line_and_exit_2(
    make: object, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    before = sorted(tmp_path.rglob("*"))

    status = main(["diagnose", str(path)])

    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and str(path) in captured.err and said in captured.err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


LARGE_LOG_MB = 40  # benchmarks/diagnose_big_log.py reads 2 GB the same way
MEMORY_LIMIT_MB = 200  # the interpreter and the package's imports (~100 MB here) plus the bounded evidence


@pytest.mark.slow
def test_a_large_log_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    line = b"[rank1]:Epoch 3 step 120 loss 0.3125 lr 0.0001 tokens/s 18234 " + b"x" * 60 + b"\n"
    log = tmp_path / "big.log"
    with log.open("wb") as out:
        block = line * 8192
        for _ in range(LARGE_LOG_MB * 1024 * 1024 // len(block)):
            out.write(block)
        out.write(b"[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    done, peak_mb = diagnose_peak(log)

    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("OUT OF MEMORY on rank 1")
    assert peak_mb < MEMORY_LIMIT_MB, peak_mb


def test_files_read_in_parallel_give_the_answer_read_in_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several processes read shares of the files; their evidence, merged in file order, answers as one reader."""
    from conformance.diagnose import sources

    for rank in range(6):
        said = [f"[rank{rank}]:step {step} loss 0.{step}" for step in range(200)]
        if rank == 4:
            said.append("[rank4]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
        else:
            said.append(WATCHDOG.format(r=rank, s=30 + rank, seq=88, op="ALLREDUCE"))
        write(tmp_path / f"rank{rank}.log", "\n".join(said) + "\n")

    monkeypatch.setattr(sources, "PARALLEL_BYTES", 1 << 40)
    in_turn = diagnose(capsys, tmp_path)
    monkeypatch.setattr(sources, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(sources.os, "sched_getaffinity", lambda _pid: {0, 1, 2}, raising=False)
    in_parallel = diagnose(capsys, tmp_path)

    assert sources._workers(sources.files_to_read([tmp_path])[0]) == 3  # the second run did read in three processes
    assert in_parallel == in_turn
    assert in_turn[1]["class"] == "oom" and in_turn[1]["root_ranks"] == [4], in_turn
