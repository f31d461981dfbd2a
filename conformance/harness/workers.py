"""xdist's two sides: which one this process is, and the keys of what passes between them."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from conformance.common.jsonl import JsonDict
from conformance.common.lifetime import die_with_parent

RUN_ID = "conformance_run_id"
CONTROLLER = "conformance_controller_pid"
TOPOLOGY = "conformance_topology"
NOT_NEEDED = "conformance_not_needed"  # a worker's later rungs not run, for the controller
# pytest options under which a session runs no test (their dests): no forkserver, no run folder.
NO_CASES_OPTIONS = ("collectonly", "showfixtures", "show_fixtures_per_test")


def worker_input(config: pytest.Config) -> JsonDict | None:
    """What the controller handed this xdist worker (execnet-serialised); None in any other process."""
    return getattr(config, "workerinput", None)


@dataclass(frozen=True)
class Role:
    """What this pytest process does in the run: the one answer to "is this an xdist worker?"."""

    worker: bool  # an xdist worker: it runs cases, its controller ends the run
    spread: bool  # the run is spread over xdist workers (this process is their controller or one of them)
    runs_nothing: bool  # --collect-only, --fixtures: no case, no forkserver, no run folder

    @classmethod
    def of(cls, config: pytest.Config) -> Role:
        spread = bool(config.getoption("numprocesses", None)) or config.getoption("dist", "no") != "no"
        runs_nothing = any(config.getoption(name, False) for name in NO_CASES_OPTIONS)
        return cls(worker_input(config) is not None, spread, runs_nothing)

    @property
    def runs_cases(self) -> bool:
        """Cases run here (xdist's controller leaves them to its workers)."""
        return not self.runs_nothing and (self.worker or not self.spread)

    @property
    def ends_run(self) -> bool:
        """Owns the run's folder and end: a plain run's pytest, or xdist's controller."""
        return not self.worker and not self.runs_nothing


def die_with_controller(config: pytest.Config) -> None:
    """An xdist worker dies the moment its controller does, and its forkserver and ranks with it.

    Otherwise a killed controller leaves the worker running its case until execnet notices.  Only a
    worker the controller started itself (popen): a remote one (``--tx ssh=...``) has another parent.
    """
    controller = (worker_input(config) or {}).get(CONTROLLER)
    if controller is not None and os.getppid() == controller and not die_with_parent(controller):
        os._exit(1)  # the controller died before the request took hold


def hand_back_not_needed(config: pytest.Config, nodeids: list[str]) -> None:
    config.workeroutput[NOT_NEEDED] = nodeids  # type: ignore[attr-defined]
