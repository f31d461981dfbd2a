"""What the first run on a real GPU (docs/gpu-runs/2026-11-27-h200) taught, held on CPU.

The fake NVML answers every query the suite makes as that H200 answered it; the health checks find
nothing wrong with that healthy machine; the first-light script skips cleanly where there is no GPU;
the case-time split adds up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_nvml as nv
from conformance.cli.smoke_checks import PASS, health_snapshot
from conformance.common.casefiles import PhaseLine, rank_dir
from conformance.discover.health import read_health

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "docs" / "gpu-runs" / "2026-11-27-h200"
sys.path.insert(0, str(REPO / "tools"))
import gpu_case_times  # noqa: E402
import gpu_nvml_raw  # noqa: E402

from conformance.rank.main import EXIT_STEP  # noqa: E402


def test_the_fake_nvml_answers_as_the_h200_did(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = json.loads((RUN / "nvml-raw.json").read_text())["queries"]
    nv.install(monkeypatch, nv.h200_vm())
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        answered = {name: gpu_nvml_raw.answer(query) for name, query in gpu_nvml_raw.queries(pynvml, handle).items()}
    finally:
        pynvml.nvmlShutdown()
    differ = {name: (answered.get(name), want) for name, want in recorded.items() if answered.get(name) != want}
    assert differ == {}


def test_the_h200_is_healthy_to_the_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    nv.install(monkeypatch, nv.h200_vm())
    import pynvml

    pynvml.nvmlInit()
    try:
        health = read_health(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    assert (health.pcie_gen, health.nvlinks, health.fabric_state, health.retired_pages_pending) == (5, None, None, None)
    assert health_snapshot({"gpu0": health}).status == PASS


def test_first_light_skips_cleanly_without_a_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}  # no nvidia-smi on this PATH
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_first_light.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "first light: SKIPPED: no GPU here (nvidia-smi not found)\n"
    assert list((tmp_path / "out").iterdir()) == []


def test_a_case_time_splits_into_its_parts(tmp_path: Path) -> None:
    lines = [PhaseLine("start", "", clock=100.5), PhaseLine("control", "store check-in", clock=100.6),
             PhaseLine("init", "CUDA device (set_device)", clock=101.0),
             PhaseLine("init", "init_process_group(nccl)", clock=101.4),
             PhaseLine("probe", "all_reduce 4B", clock=102.0), PhaseLine("verify", "all_reduce 4B", clock=102.5),
             PhaseLine("teardown", "destroy_process_group", clock=103.0),
             PhaseLine("teardown", EXIT_STEP, clock=103.2)]  # fmt: skip
    rank = rank_dir(tmp_path, 0)
    rank.mkdir()
    (rank / "phase.jsonl").write_text("".join(json.dumps(vars(line)) + "\n" for line in lines))
    # rank 0 reaped 3.4 s after the case's start (100.0): 0.2 s after its last stamp, 0.1 s before the record
    record = {
        "clock": 103.5,
        "time": 9e9,
        "seconds": 3.5,
        "case_dir": str(tmp_path),
        "ranks": [{"rank": 0, "seconds": 3.4}],
    }
    parts = gpu_case_times.split(record)
    assert parts == {"fork": 0.5, "store": 0.5, "cuda init": 0.4, "nccl init": 0.6, "probe": 1.0, "destroy": 0.2,
                     "exit": 0.2, "collect": 0.1}  # fmt: skip
    assert sum(parts.values()) == pytest.approx(3.5)
    del record["ranks"]  # a record without its ranks' times: the exit runs to the record
    assert gpu_case_times.split(record)["exit"] == pytest.approx(0.3)


def test_an_images_nccl_version_label_is_not_an_inherited_setting() -> None:
    from conformance.common.families import inherited_variables

    image = {"NCCL_VERSION": "2.28.3-1", "NCCL_DEBUG": "WARN", "PATH": "/usr/bin"}
    assert inherited_variables(image) == {"NCCL_DEBUG": "WARN"}
