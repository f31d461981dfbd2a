"""The harness itself: one rank fails while the others wait in a collective.

The case must end within the grace bound (not the whole deadline) with the failing rank named
as the root cause and the waiting ranks as its victims: the "NCCL watchdog timeout that was
really one rank's error" failure mode.
"""

from __future__ import annotations

import pytest

from conformance.launch.watchdog import KILL_WAIT, STACK_DUMP_WAIT, TERM_WAIT
from conformance.matrix import DeviceSet
from conformance.plugin import RunCase
from conformance.session import ConformanceSession, failure_text

SLACK = 1.0  # seconds for scheduling noise on a loaded machine


def test_one_rank_raises_while_others_wait(conformance_case: RunCase, conformance: ConformanceSession) -> None:
    devices = conformance.topology.devices
    if len(devices) < 2:
        pytest.skip(f"needs at least 2 devices, this run has {len(devices)}")
    failing = len(devices) - 1
    result = conformance_case("fail_one_rank", DeviceSet(devices, "all"), expect="error", failing_rank=failing)
    root = result.decision.root
    assert result.verdict == "error", failure_text(result)
    assert root is not None and root.rank == failing, failure_text(result)
    assert "deliberate failure" in root.message
    assert {v.rank for v in result.decision.victims} <= set(range(failing)), failure_text(result)
    bound = conformance.settings.grace + STACK_DUMP_WAIT + TERM_WAIT + KILL_WAIT + SLACK
    released = max(r.seconds for r in result.reports) - root.seconds
    assert released <= bound, f"others ended {released:.2f}s after the failure; bound {bound:.2f}s"
