"""How much of its plan a run covered, for ``run.json``'s ``end`` (:class:`RunEnd`).

The process that owns the run folder (a plain run, xdist's controller, each node of a multi-node
run) counts the tests collected to run and the tests that got an outcome.  At the end of the
session it says whether the plan was covered and, if not, what stopped it.  A run killed before
its end never says: its ``run.json`` keeps the ``started`` it was written with.
"""

from __future__ import annotations

from conformance.record.records import RunEnd

INTERRUPTED = 2  # pytest.ExitCode.INTERRUPTED: Ctrl-C (KeyboardInterrupt) or pytest.exit()


class Coverage:
    def __init__(self) -> None:
        self.planned: int | None = None
        self._ran: set[str] = set()

    def collected(self, count: int) -> None:
        """The number of tests to run (xdist: the first worker's collection; they all collect the same)."""
        if self.planned is None:
            self.planned = count

    def reported(self, nodeid: str) -> None:
        """A test got an outcome (passed, failed, skipped, or crashed with its worker)."""
        self._ran.add(nodeid)

    def end(self, exit_status: int, stopped_early: str | bool) -> RunEnd:
        """``stopped_early``: pytest's ``session.shouldfail or session.shouldstop`` (-x, --maxfail, xdist)."""
        ran = len(self._ran)
        covered = ran >= self.planned if self.planned is not None else exit_status != INTERRUPTED
        if covered:
            return RunEnd("complete", self.planned, ran)
        return RunEnd("incomplete", self.planned, ran, _stopped_by(exit_status, stopped_early))


def _stopped_by(exit_status: int, stopped_early: str | bool) -> str:
    if exit_status == INTERRUPTED:
        return "interrupted"
    if isinstance(stopped_early, str) and stopped_early:
        return f"stopped early ({stopped_early})"
    return "stopped early" if stopped_early else "ended with tests not run"
