"""A failure no environment rung can change does not climb the ladder.

CUDA refusing in the rank's own torch call ("CUDA error: operation not supported", "no
CUDA-capable device") is the same under every NCCL variable; NCCL's own "Cuda failure '...'" is
not, because an NCCL rung (cumem_off, ...) changes what NCCL asks of CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.verdict.machine_faults import MACHINE_FAULTS, machine_fault, unchangeable
from conftest import REPO, ladder_lines, read_records, scenario_text

pytestmark = pytest.mark.usefixtures("isolated_env")

WORLD_OF_ONE = """
from conformance.plan.matrix import DeviceSet

def test_world_of_one(conformance_case, single_device):
    conformance_case("all_reduce", single_device, sizes=[4])
"""
TORCH_CUDA_ERROR = "CUDA error: operation not supported\\nCUDA kernel errors might be asynchronously reported"
NCCL_CUDA_ERROR = "NCCL error: unhandled cuda error, Cuda failure 'operation not supported'"


@pytest.mark.parametrize(
    ("verdict", "message", "final"),
    [
        ("error", "RuntimeError: CUDA error: operation not supported", True),
        ("error", "CUDA error: no CUDA-capable device is detected", True),
        ("crash", "RuntimeError: No CUDA GPUs are available", True),
        ("error", NCCL_CUDA_ERROR, False),
        ("hang", "CUDA error: operation not supported", False),
        ("error", "NCCL Error 2: unhandled system error", False),
        (
            "error",
            "RuntimeError: Unexpected error from cudaGetDeviceCount() ... Error 802: system not yet initialized",
            True,
        ),
        ("crash", "RuntimeError: CUDA error: uncorrectable ECC error encountered", True),
        ("error", "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", True),
        ("error", "pynvml.NVMLError_GPUIsLost: GPU is lost", True),
        ("crash", "torch.AcceleratorError: CUDA error: unknown error\nSearch for `cudaErrorUnknown'", True),
        ("error", "NCCL error: unhandled cuda error, Cuda failure 'unknown error'", False),  # NCCL's: it climbs
        ("hang", "system not yet initialized", False),  # a hang names no fault: its ranks said nothing
    ],
)
def test_which_failures_no_rung_changes(verdict: str, message: str, final: bool) -> None:
    assert unchangeable(verdict, message) is final
    assert (machine_fault(verdict, message) is not None) is final


def test_each_machine_fault_names_itself_and_a_fix_that_is_no_variable() -> None:
    assert machine_fault("error", "Error 802: system not yet initialized").name.startswith("FABRIC MANAGER NOT RUNNING")
    assert machine_fault("error", "CUDA error: uncorrectable ECC error encountered").name == "UNCORRECTABLE ECC ERROR"
    for fault in MACHINE_FAULTS:
        assert fault.fix and "NCCL_" not in fault.fix, fault.name


@pytest.mark.parametrize(("message", "climbs"), [(TORCH_CUDA_ERROR, False), (NCCL_CUDA_ERROR, True)])
def test_an_unchangeable_failure_stops_the_climb(
    pytester: pytest.Pytester, run_suite, reports_dir: Path, message: str, climbs: bool
) -> None:
    pytester.makepyfile(test_x=WORLD_OF_ONE)
    rule = f'effect = "error"\nphase = "init"\nmessage = "{message}"'
    scenario = pytester.makefile(".toml", scen=scenario_text(rule))
    topology = REPO / "scenarios" / "topologies" / "single-gpu.json"
    result = run_suite(f"--scenario={scenario}", f"--topology-file={topology}", "--step-timeout=5", "--op-timeout=3",
                       "--init-timeout=3", "-rs")  # fmt: skip
    ran = [(r["env_name"], r["verdict"]) for r in read_records(reports_dir)]
    if climbs:
        # one GPU: cumem_off is the only rung that can change it (no transport between GPUs to change)
        assert ran == [("inherited", "error"), ("cumem_off", "error")], ran
        return
    assert ran == [("inherited", "error")]
    skipped = [d for d in ladder_lines(reports_dir) if d["outcome"] == "skipped"]
    assert len(skipped) >= 7
    assert all("no NCCL environment rung changes" in d["reason"] for d in skipped), skipped
    assert "no NCCL environment rung changes the failure on rung inherited (CUDA refused)" in skipped[0]["reason"]
    result.assert_outcomes(failed=1, deselected=len(skipped))  # rungs nothing can help: no tests that could not run
