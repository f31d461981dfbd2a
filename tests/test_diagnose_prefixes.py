"""``conformance diagnose`` reads every prefix a launcher or a logger writes, stacked in any order, once.

Each line below is written in the shape its program prints (the source is named beside it, and in
conformance/diagnose/writers.py where the pattern lives); each becomes (host, rank, text), with the
local rank, srun's task, the time and the level where the prefixes say them.  Hostile lines: text
that looks like a prefix inside a message, after a process's own prefix, or contradicting one already
taken, never names a writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli.main import main
from conformance.diagnose.writers import Who, parse_line

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."

# line -> (host, global rank, text)
PREFIXED: dict[str, tuple[str, tuple[str | None, int | None, str]]] = {
    # torch >= 2.2, torch/_logging/_internal.py rankprefix "[rank{rank}]:"
    "torch's rank": ("[rank3]:Traceback (most recent call last):", (None, 3, "Traceback (most recent call last):")),
    # c10's C++ log line after torch's rank prefix (c10/util/logging_is_not_google_glog.h MessageLogger)
    "torch's rank, then c10's log prefix": (
        "[rank3]:[W1128 15:44:22.918140540 ProcessGroupNCCL.cpp:1234] Warning: destroy_process_group()",
        (None, 3, "Warning: destroy_process_group()"),
    ),
    # torch/_logging/_internal.py TorchLogsFormatter: rank, level letter, time, pid, path:line, trace id
    "torch's Python log line": (
        "[rank1]:W1128 15:44:22.918000 140 torch/distributed/distributed_c10d.py:9] [0/0] msg",
        (None, 1, "msg"),
    ),
    # Open MPI 4 --tag-output (orte/mca/iof/base/iof_base_output.c "[%s,%s]<%s>:")
    "mpirun's tag": ("[1,3]<stderr>:" + OOM, (None, 3, OOM)),
    # Open MPI 5 / PRRTE through PMIx (openpmix src/common/pmix_iof.c "[%s,%s]<%s>: ", tag-detailed, tag-fullname)
    "PMIx's tag": ("[1,3]<stdout>: step 5", (None, 3, "step 5")),
    "PMIx's detailed tag": ("[1,3][node7:4242]<stdout>: step 5", ("node7", 3, "step 5")),
    "PMIx's full-name tag": ("[prterun-node1-1234@1,3]<stdout>: step 5", (None, 3, "step 5")),
    # Horovod's gloo launcher (horovod/runner/common/util/safe_shell_exec.py "[{rank}]<{prefix}>:")
    "Horovod's tag": ("[3]<stdout>:step 5", (None, 3, "step 5")),
    # ctime before the tag: Open MPI 4 --timestamp-output, PMIx's "[%s]" form
    "mpirun's timestamp and tag": ("Sat Nov 28 15:44:22 2026[1,3]<stdout>:step 5", (None, 3, "step 5")),
    "PMIx's timestamp and tag": ("[Sat Nov 28 15:44:22 2026][1,3]<stdout>: step 5", (None, 3, "step 5")),
    # Open MPI's --xml (iof_base_output.c "<%s rank=\"%s\">")
    "mpirun's XML": ('<stdout rank="3">step 5</stdout>', (None, 3, "step 5")),
    # torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[${rank}]:" (local_elastic_agent.py's documented example)
    "torchrun's template with the global rank": ("[3]:step 5", (None, 3, "step 5")),
    # pdsh's "%s: " (DeepSpeed's PDSHRunner), then DeepSpeed's logger (deepspeed/utils/logging.py)
    "pdsh and DeepSpeed's logger": (
        "worker-1: [2024-01-01 12:00:00,123] [ERROR] [launch.py:325:sigkill_handler] exits with return code = -9",
        ("worker-1", None, "exits with return code = -9"),
    ),
    # Ray's log monitor (ray/_private/worker.py print_worker_logs), coloured, then torch's rank
    "Ray's worker, coloured, then torch's rank": (
        "\x1b[36m(RayWorkerWrapper pid=2789, ip=10.0.0.2)\x1b[0m [rank5]:" + OOM,
        ("10.0.0.2", 5, OOM),
    ),
    "Ray's raylet": ("(raylet, ip=10.0.0.2) A worker died", ("10.0.0.2", None, "A worker died")),
    # Lightning's rank_prefixed_message, DeepSpeed's log_dist, vLLM's format (vllm/logger.py)
    "Lightning's rank": ("[rank: 3] " + OOM, (None, 3, OOM)),
    "DeepSpeed's rank": ("[Rank 3] " + OOM, (None, 3, OOM)),
    "vLLM's format in a Ray worker, then torch's rank": (
        "(RayWorkerWrapper pid=11305) ERROR 08-27 05:12:18 worker_base.py:382] [rank5]:" + OOM,
        (None, 5, OOM),
    ),
    # timestamps: ISO 8601, bracketed, syslog (RFC 3164, journalctl -o short), journalctl -o short-iso, glog,
    # dmesg's seconds since boot, dmesg -T's ctime
    "ISO 8601, then torch's rank": ("2026-11-28T15:44:22.918Z [rank3]:step 5", (None, 3, "step 5")),
    "a bracketed timestamp": ("[2026-11-28 15:44:22] step 5", (None, None, "step 5")),
    "syslog": ("Nov 28 15:44:22 node7 kernel: Out of memory", ("node7", None, "Out of memory")),
    "journalctl short-iso": ("2026-11-28T15:44:22+0000 node7 python[42]: hi", ("node7", None, "hi")),
    "glog": ("I1128 15:44:22.918140  1234 socket.cc:123] hi", (None, None, "hi")),
    "dmesg": ("[12345.678901] Out of memory", (None, None, "Out of memory")),
    "dmesg -T": ("[Sat Nov 28 15:44:22 2026] Out of memory", (None, None, "Out of memory")),
    # Kubernetes' CRI log files (kubelet pkg/kubelet/kuberuntime/logs/logs.go), then torchrun's prefix
    "CRI": ("2026-11-28T15:44:22.918140123Z stderr F [default0]:step 5", (None, None, "step 5")),
    # Python's logging.basicConfig() and torch 2.0-2.1's logging format
    "Python's logging": ("ERROR:torch.distributed.elastic.multiprocessing.api:failed", (None, None, "failed")),
    "torch 2.1's logging": (
        "[2023-10-19 08:25:21,316] torch.distributed.elastic.multiprocessing.api: [ERROR] failed",
        (None, None, "failed"),
    ),
    # JSON records: Docker's json-file driver with fluent-bit's Kubernetes filter; Ray's JSONFormatter
    # (ray/_private/ray_logging/formatters.py); journalctl -o json (systemd.journal-fields(7))
    "a Kubernetes JSON record, then torch's rank": (
        json.dumps({"log": f"[rank5]:{OOM}\n", "stream": "stderr", "kubernetes": {"host": "gpu-3"}}),
        ("gpu-3", 5, OOM),
    ),
    "Ray's JSON log": (
        json.dumps({"asctime": "2026-11-28 15:44:22,1", "levelname": "ERROR", "message": "x"}),
        (None, None, "x"),
    ),
    "journald's JSON": (
        json.dumps({"MESSAGE": "Out of memory", "_HOSTNAME": "node7", "_PID": "1"}),
        ("node7", None, "Out of memory"),
    ),
    # stacked: leading spaces (a paste), srun's label, torchrun's, torch's
    "leading spaces before mpirun's tag": ("   [1,3]<stdout>:step 5", (None, 3, "step 5")),
    "srun, torchrun and torch": ("0: [default2]:[rank2]:step 5", (None, 2, "step 5")),
    # hostile: a prefix-like text inside a message, after the process's own prefix, or contradicting one taken
    "a rank prefix inside a message": ("RuntimeError: [rank3]: boom", (None, None, "RuntimeError: [rank3]: boom")),
    "a number after torch's rank is no srun label": ("[rank0]:12: loss 3.2", (None, 0, "12: loss 3.2")),
    "mpirun's tag after torch's rank is text": ("[rank0]:[1,5]<stderr>:x", (None, 0, "[1,5]<stderr>:x")),
    "a rank contradicting mpirun's is text": ("[1,3]<stderr>:[rank4]: x", (None, 3, "[rank4]: x")),
    "a host after a log prefix is text": ("[W1128 15:44:22.1 x.cpp:1] worker-9: hi", (None, None, "worker-9: hi")),
    "torchrun's summary header alone": ("[0]:", (None, None, "[0]:")),
    "a JSON record inside a JSON record's text is not unwrapped": (
        json.dumps({"log": json.dumps({"log": "[rank9]:x"})}),
        (None, None, json.dumps({"log": "[rank9]:x"})),
    ),
    "a JSON object that is no log record": ('{"rank": 3, "loss": 2.5}', (None, None, '{"rank": 3, "loss": 2.5}')),
    "JSON nested far too deep": ("[" * 2000 + "]" * 2000, (None, None, "[" * 2000 + "]" * 2000)),
}


@pytest.mark.parametrize(("line", "expected"), PREFIXED.values(), ids=PREFIXED.keys())
def test_each_prefix_gives_host_rank_and_text(line: str, expected: tuple[str | None, int | None, str]) -> None:
    parsed = parse_line(line)

    assert len(parsed) == 1
    assert (parsed[0].who.host, parsed[0].who.rank, parsed[0].text) == expected, parsed


def test_local_ranks_tasks_pids_times_and_levels() -> None:
    # srun --label, right-aligned (slurm src/common/write_labelled_message.c "%*d: "), and torchrun's "[default3]:"
    (srun,) = parse_line(" 1: [default3]:step 5")
    assert srun.who == Who(local_rank=3, task=1) and srun.via == ("srun", "torchrun")
    (het,) = parse_line("P1 3: x")  # a heterogeneous job's "P%u %*d: "
    assert het.who.task == 3
    (ray,) = parse_line("(pid=2789, ip=10.0.0.2) x")
    assert ray.who.pid == 2789
    (glog,) = parse_line("[rank0]:[E1128 15:44:22.5 ProcessGroupNCCL.cpp:1] x")
    assert glog.level == "error" and glog.time is not None
    later = parse_line("[rank0]:[E1128 15:44:23.5 ProcessGroupNCCL.cpp:1] x")[0].time
    assert later is not None and glog.time is not None and later - glog.time == pytest.approx(1.0)
    (warned,) = parse_line("WARNING 08-27 05:12:18 worker_base.py:382] x")
    assert warned.level == "warning"


def test_carriage_returns_and_a_json_records_lines_are_each_a_line() -> None:
    assert [p.text for p in parse_line("epoch 1: 10%\repoch 1: 20%\r[rank1]:boom")] == [
        "epoch 1: 10%",
        "epoch 1: 20%",
        "boom",
    ]
    record = json.dumps({"message": "failed", "exc_text": "Traceback (most recent call last):\nValueError: x"})
    assert [p.text for p in parse_line(record)] == ["failed", "Traceback (most recent call last):", "ValueError: x"]


def diagnose(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, object]:
    main(["diagnose", "--json", str(path)])
    answer: dict[str, object] = json.loads(capsys.readouterr().out)
    return answer


def test_a_kubernetes_json_log_names_the_rank_and_its_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [
        {
            "log": f"[rank{r}]:step 3\n",
            "stream": "stderr",
            "time": "2026-11-28T15:44:20Z",
            "kubernetes": {"host": "gpu-3"},
        }
        for r in range(4)
    ]
    lines.append(
        {"log": f"[rank2]:{OOM}\n", "stream": "stderr", "time": "2026-11-28T15:44:22Z", "kubernetes": {"host": "gpu-3"}}
    )
    path = tmp_path / "pod.json"  # JSON records one a line: read as the log it is, not as one JSON value
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")

    answer = diagnose(capsys, path)

    assert answer["class"] == "oom" and answer["root_ranks"] == [2], answer
    assert "gpu-3" in str(answer["root"]), answer


def test_a_level_that_reports_is_no_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A logger's warning or info line with a failure word in it reports; it is not the failure."""
    path = tmp_path / "job.log"
    path.write_text("[W socket.cpp:663] [c10d] The client socket connection failed, retrying\n")

    answer = diagnose(capsys, path)

    assert answer["verdict"] == "not judged", answer
