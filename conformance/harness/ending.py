"""The end of the run always answers, whatever fails around it."""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from collections.abc import Generator
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from conformance.common.outside_text import shown_lines
from conformance.harness.context import RunContext
from conformance.harness.run_life import fail_session, final_answer, metrics_at_end
from conformance.harness.terminal import write_answer
from conformance.summarise.conclude import not_written

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter


class RunEnding:
    """The end of the run always answers, whatever fails around it.

    The outermost of pytest's ``pytest_sessionfinish`` hooks: when the suite's end, pytest's JUnit
    writer (``harness.junit`` catches a failure of its own) or another plugin raises, the run still
    writes its metrics, last and with the final exit status, and its answer, the last block on the
    screen, naming what was not written; the exit status is then non-zero.
    """

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self._before: dict[signal.Signals, Any] = {}  # the handlers the stopping signals had before the run

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """A signal that asks the run to stop ends it as Ctrl-C does, with its end (``STOPPING_SIGNALS``).

        Python's default for them is to die at once: no answer, run.json left "started", the metrics
        file left "running".  Raised as KeyboardInterrupt, pytest ends the session (exit status 2) and
        the run's end answers ``INCOMPLETE RUN (interrupted)``; a second one is ignored while it does.
        """
        if self.run.role.ends_run and threading.current_thread() is threading.main_thread():
            self._before = {sig: signal.signal(sig, _interrupted) for sig in STOPPING_SIGNALS}

    def pytest_unconfigure(self) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)
        self._before = {}

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        try:
            yield
        except pytest.exit.Exception:
            raise
        except Exception as exc:  # noqa: BLE001 - said in the answer, which must come after it, not raised past it
            self._failed(session, exc, reporter)
        finally:
            self._metrics(session)
            if self.run.outcome.unwritten:
                fail_session(session)
            if reporter is not None and not self.run.role.worker:
                with contextlib.suppress(OSError):  # a terminal gone (its ssh session dropped): files hold the end
                    write_answer(self.run, reporter, final_answer(self.run))

    def _metrics(self, session: pytest.Session) -> None:
        """The metrics file says how the run ended (never left saying 'running'), with the final exit status."""
        if not self.run.role.ends_run:
            return
        try:
            metrics_at_end(self.run, int(session.exitstatus))
        except Exception as exc:  # noqa: BLE001 - the answer must still come
            self.run.outcome.unwritten.append(not_written("metrics", exc))

    def _failed(self, session: pytest.Session, exc: Exception, reporter: TerminalReporter | None) -> None:
        """The traceback above the answer, a line of it in the answer, and exit status 3 (pytest's internal error)."""
        if reporter is not None:
            with contextlib.suppress(OSError):
                for line in traceback.format_exception(exc):
                    reporter.write(shown_lines(line))
        self.run.outcome.unwritten.append(f"the run's end NOT completed: {type(exc).__name__}: {exc}")
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


# SIGTERM: SLURM's scancel and time limit, systemd, docker stop, Kubernetes; SIGHUP: the terminal's session
# ended (an ssh connection dropped).  SIGINT is Ctrl-C, pytest's own.
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    for sig in STOPPING_SIGNALS:  # the end that follows must finish; SIGKILL still stops it
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: the run was told to stop")
