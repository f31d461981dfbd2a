"""Each line of the smoke run's table, judged from the facts a case leaves (cli/smoke_checks.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.cli.smoke_checks import (
    FAIL,
    PASS,
    driver_covers_torch,
    flight_recorder_names_stuck,
    health_snapshot,
    init_complete_in_init,
    kill_wait_figure,
    nccl_versions_agree,
    spin_placement,
    stop_ladder_line,
    uuid_compared,
)
from conformance.common.casefiles import PhaseLine
from conformance.discover.health import GpuHealth
from conformance.launch.processes import StopStep

FORK = 1000.0
SPUN = [
    PhaseLine("start", clock=FORK), PhaseLine("control", "store check-in", clock=FORK + 0.4),
    PhaseLine("init", "init_process_group(nccl)", clock=FORK + 0.5),
    PhaseLine("probe", "kernel spinning", clock=FORK + 6.2),
]  # fmt: skip
UUID = "GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70"


def test_spin_placement_needs_the_rank_stopped_in_its_kernel_and_prints_the_times() -> None:
    found = spin_placement(SPUN, "probe", "kernel spinning")
    assert (found.status, found.detail) == (
        PASS, "fork 0.0s -> init 0.5s -> probe 6.2s; stopped in probe (kernel spinning)"
    )  # fmt: skip
    # stopped while CUDA and NCCL were still starting: the deadline came too soon, the claim is not shown
    early = spin_placement(SPUN[:3], "init", "init_process_group(nccl)")
    assert (early.status, early.detail) == (
        FAIL, "fork 0.0s -> init 0.5s -> probe -; stopped in init (init_process_group(nccl))"
    )  # fmt: skip
    assert spin_placement([], "", "").status == FAIL


@pytest.mark.parametrize(
    ("cuda_device", "status"),
    [
        ({"ordinal": 0, "uuid": UUID.removeprefix("GPU-"), "compared": True}, PASS),
        ({"ordinal": 0, "uuid": "00000000-0b7d-4c3e-9a1f-2b3c4d5e6f70", "compared": True}, FAIL),
        ({"ordinal": 0, "uuid": UUID.removeprefix("GPU-")}, FAIL),  # the rank never compared: no claim
        (None, FAIL),
    ],
)
def test_the_uuid_line_needs_a_comparison_that_happened(cuda_device: dict | None, status: str) -> None:
    assert uuid_compared(cuda_device, UUID).status == status


@pytest.mark.parametrize(
    ("driver", "torch_cuda", "status"),
    [("12.8", "12.8", PASS), ("12.9", "12.6", PASS), ("12.4", "12.8", FAIL), ("13.0", "12.9", PASS),
     (None, "12.8", FAIL), ("12.8", None, FAIL)],
)  # fmt: skip
def test_the_driver_must_cover_torchs_cuda(driver: str | None, torch_cuda: str | None, status: str) -> None:
    assert driver_covers_torch(driver, torch_cuda).status == status


def test_nccl_versions_agree_or_the_difference_is_shown() -> None:
    same = nccl_versions_agree("2.27.5", "2.27.5+cuda12.9", "2.27.5 (nvidia-nccl-cu12)")
    assert (same.status, same.detail) == (PASS, "log 2.27.5+cuda12.9, torch 2.27.5, pip 2.27.5 (nvidia-nccl-cu12)")
    over = nccl_versions_agree("2.28.9", "2.28.9+cuda12.9", "2.27.5 (nvidia-nccl-cu12)")
    assert over.status == PASS and over.detail.endswith("(pip's differs: the loaded library is 2.28.9)")
    assert nccl_versions_agree("2.27.5", "2.26.2", None).status == FAIL  # the log names another library
    assert nccl_versions_agree("2.27.5", None, None).status == FAIL  # no NCCL log: nothing was shown


def test_init_complete_must_be_logged_with_the_rank_past_init() -> None:
    assert init_complete_in_init(SPUN, completed=True).status == PASS
    assert init_complete_in_init(SPUN, completed=False).status == FAIL
    assert init_complete_in_init(SPUN[:3], completed=True).status == FAIL  # the rank never got past init


def test_health_snapshot_runs_the_one_gpu_rules() -> None:
    healthy = GpuHealth(pcie_width=16, pcie_max_width=16, ecc_uncorrected=0, persistence=True, compute_mode="default")
    assert health_snapshot({"gpu0": healthy}).status == PASS
    narrow = health_snapshot({"gpu0": replace(healthy, pcie_width=8)})
    assert narrow.status == FAIL and narrow.detail.startswith("pcie: gpu0: PCIe link x8, the GPU and slot allow x16")
    assert health_snapshot({}).status == FAIL


def test_the_flight_recorder_line_needs_the_stuck_all_reduce_not_retired() -> None:
    stuck = {"op": "nccl:all_reduce", "seq": 2, "state": "scheduled", "retired": False, "sizes": [[1]]}
    done = {**stuck, "seq": 1, "state": "completed", "retired": True}
    found = flight_recorder_names_stuck({"last": [done, stuck], "groups": {}})
    assert found.status == PASS
    assert found.detail == (
        "nccl:all_reduce #1 state completed retired True; nccl:all_reduce #2 state scheduled retired False"
    )
    assert flight_recorder_names_stuck({"last": [done], "groups": {}}).status == FAIL  # nothing stuck: no claim
    failed = flight_recorder_names_stuck({"error": "RuntimeError: no recorder", "last": [], "groups": {}})
    assert (failed.status, failed.detail) == (FAIL, "RuntimeError: no recorder")
    assert flight_recorder_names_stuck(None).status == FAIL


def test_a_stop_ladder_line_needs_both_reaps_timed_and_the_rank_holding() -> None:
    term = [StopStep("SIGTERM", 0.4, reaped=True)]
    kill = [StopStep("SIGTERM", 0.5, reaped=False), StopStep("SIGKILL", 0.3, reaped=True)]
    ok = stop_ladder_line("idle", True, term, kill)
    assert (ok.status, ok.detail) == ("PASS", "TERM -> reap 0.40s, KILL -> reap 0.30s")
    assert stop_ladder_line("idle", False, term, kill).status == "FAIL"
    reaped_by_term = stop_ladder_line("idle", True, term, term)  # SIGKILL never sent: nothing timed for it
    assert reaped_by_term.status == "FAIL" and "KILL -> reap never" in reaped_by_term.detail
    unkillable = [StopStep("SIGTERM", 0.5, reaped=False), StopStep("SIGKILL", 60.0, reaped=False)]
    assert stop_ladder_line("memory", True, term, unkillable).status == "FAIL"


def test_the_longest_reap_is_the_kill_wait_figure() -> None:
    assert kill_wait_figure([0.4, 2.5, 0.3], 10.0).status == "PASS"
    too_long = kill_wait_figure([0.4, 12.25], 10.0)
    assert too_long.status == "FAIL" and too_long.detail.startswith("longest reap 12.25s"), too_long
    assert kill_wait_figure([], 10.0).status == "FAIL"
