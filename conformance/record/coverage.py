"""How much of its plan a run covered, for ``run.json``'s ``end`` (:class:`RunEnd`).

The process that owns the run folder (a plain run, xdist's controller, each node of a multi-node
run) counts the tests collected to run, those on fallback rungs (run only where a class needs
them), the tests that got an outcome and the fallback-rung tests found not needed.  At the end of
the session it says whether the plan was covered and, if not, what stopped it, in counts of tests
that would have run: a fallback rung no class needed is neither run nor missing.  A run killed
before its end never says: its ``run.json`` keeps the ``started`` it was written with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from conformance.record.records import RunEnd

INTERRUPTED = 2  # pytest.ExitCode.INTERRUPTED: Ctrl-C (KeyboardInterrupt) or pytest.exit()


class Coverage:
    def __init__(self) -> None:
        self.planned: int | None = None
        self._fallback: frozenset[str] = frozenset()
        self._ran: set[str] = set()
        self._not_needed: set[str] = set()

    def collected(self, nodeids: Iterable[str], fallback: Iterable[str]) -> None:
        """The tests to run and those on fallback rungs (xdist: the first worker's; they all collect the same)."""
        if self.planned is None:
            self.planned = len(list(nodeids))
            self._fallback = frozenset(fallback)

    def reported(self, nodeid: str) -> None:
        """A test got an outcome (passed, failed, skipped, or crashed with its worker)."""
        self._ran.add(nodeid)

    def not_needed(self, nodeid: str) -> None:
        """A fallback-rung test the ladder found not needed: deselected, covered without running."""
        self._not_needed.add(nodeid)

    def first_rung(self) -> tuple[int, int] | None:
        """(done, planned) of the tests on the machine as it is, the fallback rungs left out; None before collection."""
        if self.planned is None:
            return None
        done = len(self._ran - self._not_needed - self._fallback)
        return done, self.planned - len(self._fallback)

    def end(self, exit_status: int, stopped_early: str | bool, tests: Mapping[str, int] | None = None) -> RunEnd:
        """``stopped_early``: pytest's ``session.shouldfail or session.shouldstop`` (-x, --maxfail, xdist).

        ``tests``: pytest's own counts by outcome, kept so every later reader can give them.
        """
        ran = self._ran - self._not_needed
        covered = len(ran) + len(self._not_needed) >= self.planned if self.planned is not None else None
        if covered is None:
            covered = exit_status != INTERRUPTED
        end = RunEnd(
            "complete", self.planned, len(ran), fallback=len(self._fallback), fallback_ran=len(ran & self._fallback),
            not_needed=len(self._not_needed), tests=dict(tests) if tests is not None else None,
        )  # fmt: skip
        if covered:
            return end
        return replace(end, state="incomplete", stopped_by=_stopped_by(exit_status, stopped_early))


def _stopped_by(exit_status: int, stopped_early: str | bool) -> str:
    if exit_status == INTERRUPTED:
        return "interrupted"
    if isinstance(stopped_early, str) and stopped_early:
        return f"stopped early ({stopped_early})"
    return "stopped early" if stopped_early else "ended with tests not run"
