"""The GPU smoke run: its CPU part end to end here, and how each GPU check judges a result."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.cli import smoke, smoke_checks
from conformance.discover.topology import cpu_topology
from conformance.rank import flight_recorder
from conftest import REPO

pytestmark = pytest.mark.usefixtures("isolated_env")


@pytest.mark.slow
def test_smoke_on_a_machine_without_gpu(tmp_path: Path) -> None:
    """The suite runs and passes; every GPU check says NOT RUN with the reason; the exit status is 1."""
    out = tmp_path / "smoke"
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "smoke", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "versions: torch " in done.stdout
    assert "nvidia-smi" in (out / "topology.txt").read_text()
    checks = {c["name"]: c for c in json.loads((out / "smoke.json").read_text())["checks"]}
    assert checks["pytest suites/"]["status"] == "PASS", checks["pytest suites/"]
    assert (out / "junit.xml").is_file()
    for name in smoke.GPU_CHECKS:
        assert checks[name]["status"] == "NOT RUN" and checks[name]["detail"].startswith("no GPU: "), checks[name]
        assert any(line.startswith(name) and "  NOT RUN  no GPU: " in line for line in done.stdout.splitlines())


def test_gpu_smoke_script_runs_the_smoke_command(tmp_path: Path) -> None:
    script = REPO / "tools" / "gpu_smoke.sh"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    command = [str(script), "--skip-suite", "--out", str(tmp_path / "s")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 1 and "NOT RUN" in done.stdout, done.stdout + done.stderr


def result(verdict: str, summary: str = "", metrics: dict[str, Any] | None = None, **more: Any) -> Any:
    root = more.pop("root", None)
    return SimpleNamespace(
        verdict=verdict, decision=SimpleNamespace(summary=summary, root=root), metrics=metrics or {}, **more
    )


@pytest.mark.parametrize(("probe_gbps", "events_gbps", "status"), [(100.0, 104.0, "PASS"), (80.0, 100.0, "FAIL")])
def test_copy_timing_within_ten_percent(
    monkeypatch: pytest.MonkeyPatch, probe_gbps: float, events_gbps: float, status: str
) -> None:
    figures = {"probe_timing_gbps": probe_gbps, "cuda_events_gbps": events_gbps}
    monkeypatch.setattr(smoke, "case", lambda *a, **k: result("pass", metrics=figures))
    check = smoke.copy_timing(None, None)  # type: ignore[arg-type]
    assert check.status == status and f"ratio {probe_gbps / events_gbps:.3f}" in check.detail


@pytest.mark.parametrize(
    ("error_type", "rank", "status"),
    [("OutOfMemoryError", 0, "PASS"), ("RuntimeError", 0, "FAIL"), ("OutOfMemoryError", 1, "FAIL")],
)
def test_out_of_memory_needs_the_right_root_cause(
    monkeypatch: pytest.MonkeyPatch, error_type: str, rank: int, status: str
) -> None:
    root = SimpleNamespace(rank=rank, error_type=error_type)
    monkeypatch.setattr(smoke, "case", lambda *a, **k: result("error", "rank 0 ...", root=root))
    assert smoke.out_of_memory(None, None).status == status  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_stop_ladder_is_timed_per_signal_on_real_ranks(tmp_path: Path) -> None:
    """Idle and memory-holding CPU ranks: SIGTERM reaps one, SIGKILL the other that ignores SIGTERM, each timed.

    A spinning kernel needs a GPU: that rank skips before it holds anything, and its line must fail.
    """
    deadlines = replace(smoke.HOLD_DEADLINES, backend="gloo")
    holds = ("idle", "memory", "spinning")
    checks = smoke.stop_ladder_timings(
        tmp_path, cpu_topology(1), holds, deadlines, waits=dict.fromkeys(holds, 2.0), host_bytes=32 << 20
    )
    idle, memory, spinning, figure = checks
    for line in (idle, memory):  # a KILL figure exists only where SIGTERM left the rank alive
        assert line.status == "PASS", line
        found = re.fullmatch(r"TERM -> reap (\S+)s, KILL -> reap (\S+)s", line.detail)
        assert found is not None, line
        assert 0 <= float(found[1]) < smoke.TIMED_LADDERS["SIGTERM"].term_wait
        assert 0 <= float(found[2]) < smoke.TIMED_LADDERS["SIGKILL"].kill_wait
    assert spinning.status == "FAIL" and "the rank was not spinning when stopped" in spinning.detail, spinning
    assert figure.status == "PASS" and figure.detail.startswith("longest reap "), figure


def test_a_torch_dump_must_be_there_parse_and_name_the_all_reduce(tmp_path: Path) -> None:
    entry = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 1, "state": "scheduled", "retired": True}
    (tmp_path / "torch_flight_recorder_0").write_bytes(pickle.dumps({"entries": [entry], "pg_status": {}}))
    found = flight_recorder.torch_dumps(tmp_path)
    check = smoke_checks.torch_dump_in_rank_folder(found, "killed by SIGABRT")
    assert check.status == "PASS" and "nccl:all_reduce #1" in check.detail and "SIGABRT" in check.detail, check
    assert smoke_checks.torch_dump_in_rank_folder({}, "exit 0").status == "FAIL"
    (tmp_path / "torch_flight_recorder_0").write_bytes(b"\x80garbage")
    broken = smoke_checks.torch_dump_in_rank_folder(flight_recorder.torch_dumps(tmp_path), "exit 1")
    assert broken.status == "FAIL" and broken.detail.startswith("torch_flight_recorder_0: "), broken
    other = {"entries": [{**entry, "profiling_name": "nccl:broadcast"}]}
    (tmp_path / "torch_flight_recorder_0").write_bytes(pickle.dumps(other))
    assert smoke_checks.torch_dump_in_rank_folder(flight_recorder.torch_dumps(tmp_path), "exit 1").status == "FAIL"
