"""While a case waits, one line on the terminal: which case, where its ranks are, how long until its deadline.

On a terminal the line is rewritten in place every second once a case has run a few seconds, and
the line pytest was writing is put back when the case ends; in a log (no terminal) a line is
written every 30 s while a case runs, so a hang is never a minute of silence.  xdist workers have
no terminal: their controller shows only pytest's own progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from conformance.common import casefiles
from conformance.common.outside_text import shown
from conformance.harness.pytest_private import set_terminal_line, terminal_line
from conformance.launch.processes import RankProcess
from conformance.launch.watchdog import OnWait

SHOW_AFTER = 3.0  # a case shorter than this never shows a line
EVERY_ON_TERMINAL = 1.0
EVERY_IN_LOG = 30.0


def time_left_text(elapsed: float, counts: tuple[int, int] | None, case_left: float) -> str:
    """``; run ~3 min left, 40/115 tests``: the pace so far over the tests left, plus this case's deadline left.

    The tests on the machine as it is only: a fallback rung runs where a class failed, and adds its own.
    """
    if counts is None or counts[0] == 0:
        return ""
    done, total = counts
    seconds = max(0, total - done) * elapsed / done + max(0.0, case_left)
    left = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f}s"
    return f"; run ~{left} left, {done}/{total} tests"


def where_ranks_are(ranks: Sequence[RankProcess]) -> str:
    """``rank 0, 1 in probe (send/recv 4B)``: each place, with the ranks in it."""
    places: dict[str, list[str]] = {}
    for rank in ranks:
        last = casefiles.last_phase(rank.path)
        places.setdefault(last.where if last else "start", []).append(str(rank.rank))
    return "; ".join(f"rank {', '.join(r)} in {where}" for where, r in places.items())


def status_line(head: str, nodeid: str, where: str, width: int) -> str:
    """``head nodeid: where`` in ``width`` characters: the test id gives way first, the ranks' state last.

    The id keeps its end (the device set and rung) behind ``...``, or goes; only a state longer than the
    line itself is cut.
    """
    room = width - len(head) - len(where) - 3  # the spaces and the colon around the id
    if len(nodeid) <= room:
        return f"{head} {nodeid}: {where}"
    if room > 3:
        return f"{head} ...{nodeid[len(nodeid) - room + 3 :]}: {where}"
    line = f"{head} {where}"
    return line if len(line) <= width else where[:width]


class CaseProgress:
    """The status line of the case that is running (one at a time per pytest process)."""

    def __init__(
        self, config: pytest.Config, worker: bool, counts: Callable[[], tuple[int, int] | None] = lambda: None
    ) -> None:
        self.config = config
        self.worker = worker
        self.counts = counts  # (done, planned) of the tests on the machine as it is (Coverage.first_rung)
        self.started = time.monotonic()
        self.reporter: Any = None
        self.capture: Any = None
        self.on_terminal = False
        self._saved: str | None = None  # the line pytest was writing, while ours stands in for it

    def watch(self, nodeid: str) -> OnWait | None:
        """A callback for the watchdog's loop while ``nodeid`` runs; None where nothing can be shown."""
        plugins = self.config.pluginmanager
        self.reporter, self.capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
        if self.reporter is None or self.capture is None or self.worker:
            return None
        self.on_terminal = bool(self.reporter.isatty())
        begun, last_shown = time.monotonic(), [0.0]

        def on_wait(alive: Sequence[RankProcess], seconds_left: float) -> None:
            now = time.monotonic()
            every = EVERY_ON_TERMINAL if self.on_terminal else EVERY_IN_LOG
            if now - begun < (SHOW_AFTER if self.on_terminal else EVERY_IN_LOG) or now - last_shown[0] < every:
                return
            last_shown[0] = now
            run_left = time_left_text(now - self.started, self.counts(), seconds_left)
            head = f"conformance [{now - begun:.0f}s, stopped in {max(0.0, seconds_left):.0f}s{run_left}]"
            self._show(head, nodeid, where_ranks_are(alive))

        return on_wait

    def _show(self, head: str, nodeid: str, where: str) -> None:
        nodeid, where = shown(nodeid), shown(where)  # a test id and the ranks' phases: outside text, shown first
        with self.capture.global_and_fixture_disabled():
            if not self.on_terminal:
                self.reporter.write_line(f"{head} {nodeid}: {where}")
                return
            writer, line = terminal_line(self.reporter)
            if self._saved is None:
                self._saved = line  # put back when the case ends
            self.reporter.rewrite(status_line(head, nodeid, where, max(20, writer.fullwidth - 1)), erase=True)

    def done(self) -> None:
        """Put back the line pytest was writing, if ours replaced it."""
        if self._saved is None:
            return
        saved, self._saved = self._saved, None
        writer, _ = terminal_line(self.reporter)
        with self.capture.global_and_fixture_disabled():
            writer.write("\r" + " " * max(0, writer.fullwidth - 1) + "\r" + saved)
            set_terminal_line(writer, saved)
