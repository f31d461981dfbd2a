"""The harness itself: one rank fails while the others wait in a collective.

The case must end within the grace bound (not the whole deadline) with the failing rank named
as the root cause and the waiting ranks as its victims: the "NCCL watchdog timeout that was
really one rank's error" failure mode.  On GPUs the failure is a real CUDA out-of-memory.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conformance.harness.context import RunContext
from conformance.launch.case import CaseResult, failure_text, headline
from conformance.plan.matrix import DeviceSet
from conformance.plugin import RunCase
from conformance.verdict.decision import RankReport

SLACK = 1.0  # seconds for scheduling noise on a loaded machine
# The grace these controls give the waiting ranks (or --grace, if shorter): short, so that checking
# the grace mechanism costs half a second a run, not a whole default grace.
CONTROL_GRACE = 0.5


def skip_where_the_machine_came_first(result: CaseResult, reached: Callable[[RankReport], bool]) -> None:
    """Skip a control whose injected failure no rank reached: the machine failed the case first.

    A broken link or a machine fault is the answer's to name; the control cannot show what it checks
    there, and says so in its one skip line instead of a HARNESS ERROR.
    """
    if not any(reached(report) for report in result.reports):
        pytest.skip(f"the machine failed this control before its injected failure ({headline(result)}): see the answer")


def check_released_within_grace(result: CaseResult, conformance: RunContext, failing: int) -> None:
    root = result.decision.root
    assert result.verdict == "error", failure_text(result)
    assert root is not None and root.rank == failing, failure_text(result)
    assert {v.rank for v in result.decision.victims} <= set(range(failing)), failure_text(result)
    grace = min(CONTROL_GRACE, conformance.settings.grace)
    bound = grace + conformance.deadlines.stop_ladder.total + SLACK
    released = max(r.seconds for r in result.reports) - root.seconds
    assert released <= bound, f"others ended {released:.2f}s after the failure; bound {bound:.2f}s"


def test_one_rank_raises_while_others_wait(conformance_case: RunCase, conformance: RunContext) -> None:
    devices = conformance.topology.devices
    if len(devices) < 2:
        pytest.skip(f"needs at least 2 devices, this run has {len(devices)}")
    failing = len(devices) - 1
    result = conformance_case(
        "fail_one_rank", DeviceSet(devices, "all"), expect="error", failing_rank=failing, grace=CONTROL_GRACE
    )
    skip_where_the_machine_came_first(result, lambda report: "deliberate failure" in report.message)
    assert result.decision.root is not None and "deliberate failure" in result.decision.root.message
    check_released_within_grace(result, conformance, failing)


@pytest.mark.conformance_gpu
def test_real_out_of_memory_while_others_wait(conformance_case: RunCase, conformance: RunContext) -> None:
    """The "watchdog timeout that was really an OOM" case, with a real CUDA out-of-memory."""
    devices = conformance.topology.devices
    if conformance.backend != "nccl":
        pytest.skip(f"GPU-only check (backend {conformance.backend}): {conformance.topology.note or 'no GPU'}")
    if len(devices) < 2:
        pytest.skip(f"needs at least 2 GPUs, this machine has {len(devices)}")
    failing = len(devices) - 1
    result = conformance_case(
        "oom_while_waiting", DeviceSet(devices, "all"), expect="error", failing_rank=failing, grace=CONTROL_GRACE
    )
    skip_where_the_machine_came_first(result, lambda report: report.error_type == "OutOfMemoryError")
    assert result.decision.root is not None and result.decision.root.error_type == "OutOfMemoryError"
    check_released_within_grace(result, conformance, failing)
