"""The xdist controller's hooks: what each worker is given, what it hands back, how items are spread.

The controller decides the run id and the topology and which worker runs what; every worker gets
the same.  A worker hands back the later rungs it found not needed (never run as tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from conformance.harness.context import RunContext
from conformance.harness.pytest_private import scope_scheduler
from conformance.harness.workers import CONTROLLER, NOT_NEEDED, RUN_ID, TOPOLOGY


@dataclass(frozen=True)
class NotNeeded:
    """A later rung a worker did not run, as pytest's terminal counts it among the deselected.

    An object, as pytest's own entries there are (items): other plugins read each entry's ``__dict__``
    (hypothesis's terminal summary does), which a bare node id has not.
    """

    nodeid: str


class XdistHooks:
    """The controller's hooks: what each worker is given, what it hands back, how items are spread."""

    def __init__(self, run: RunContext) -> None:
        self.run = run

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[RUN_ID] = self.run.run_id
        node.workerinput[CONTROLLER] = os.getpid()
        node.workerinput[TOPOLOGY] = self.run.topology.to_json()

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker's later rungs not run (never reported): covered, and counted deselected as pytest counts them."""
        ids = list(getattr(node, "workeroutput", {}).get(NOT_NEEDED, ()))
        for nodeid in ids:
            self.run.coverage.not_needed(nodeid)
        terminal = self.run.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.stats.setdefault("deselected", []).extend(NotNeeded(nodeid) for nodeid in ids)

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The controller collects nothing itself: the run's plan is what its workers collected."""
        self.run.coverage.collected(ids, [i for i in ids if self.run.plan.on_fallback_rung(i)])

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Plain ``-n N`` (xdist's ``load``): every rung of a device set goes to one worker (``Plan.worker_scope``)."""
        if config.getoption("dist", "load") != "load":
            return None  # the user chose a distribution: theirs
        return scope_scheduler(config, log, self.run.plan.worker_scope)
