"""The forkserver and case runner of this pytest process: launched at session start, closed at its end."""

from __future__ import annotations

import os
from typing import Protocol

from conformance.harness.context import RunContext
from conformance.launch.case import CaseResult, CaseRunner, CaseSpec
from conformance.launch.forkserver import ForkServerClient
from conformance.launch.watchdog import OnWait, Peers
from conformance.verdict.decision import Decision


class Runner(Protocol):
    """What the case strategies ask of a case runner (``launch.case.CaseRunner``; a fake in unit tests)."""

    def run(
        self, spec: CaseSpec, peers: Peers | None = None, confirm_at: str = "", on_wait: OnWait | None = None
    ) -> CaseResult: ...

    def not_started(self, spec: CaseSpec, decision: Decision) -> CaseResult: ...

    def sweep(self) -> list[int]: ...


class RunnerLife:
    """Owns the forkserver (it imports torch while pytest collects) and the runner that uses it."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self._runner: CaseRunner | None = None
        self._forkserver: ForkServerClient | None = None

    def launch(self) -> None:
        """Start the forkserver now if this process will run cases.

        On the main thread: its parent-death signal follows the thread that starts it.
        """
        if self.run.role.runs_cases:
            self.forkserver.launch()

    @property
    def forkserver(self) -> ForkServerClient:
        if self._forkserver is None:
            log, deadlines = self.run.run_dir / "forkserver" / f"{os.getpid()}.log", self.run.deadlines
            self._forkserver = ForkServerClient(log, deadlines.forkserver_ready_wait, deadlines.spawn_wait)
        return self._forkserver

    @property
    def runner(self) -> CaseRunner:
        if self._runner is None:
            run = self.run
            self._runner = CaseRunner(
                run.ensure_run_dir(),
                run.deadlines,
                rules=[r.to_dict() for r in run.scenario.rules] if run.scenario else [],
                simulated=run.simulated,
                lease_dir=run.lease_dir,
                server=self.forkserver,
            )
            self._runner.server.ensure_started()  # here, on the main thread: cases run in threads of their own
        return self._runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        elif self._forkserver is not None:  # launched, but no case ran
            self._forkserver.close()
