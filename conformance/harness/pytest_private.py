"""Every reach into pytest's and xdist's private internals, in one place.

Each has no public call that does the same; each says what is lost if a new pytest or xdist moves it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def deselect_during_run(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Count ``item`` deselected though the run has begun, as pytest counts deselection at collection.

    What the item before kept up for this one (its module, a fixture) goes now if the next needs it
    not, as pytest's own teardown of an item does (``pytest_runtest_teardown`` needs a setup to have
    run); the progress count drops by one so it ends at 100%.
    """
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_deselected(items=[item])
    item.session.testscollected -= 1


def xdist_queue(config: pytest.Config) -> list[int] | None:
    """The indices of the items this xdist worker has been given and not yet started (None: not a worker).

    xdist keeps them in ``WorkerInteractor.torun`` (xdist 3.x), read here under the queue's own lock;
    anything else found there means no looking ahead (cases then run one by one).
    """
    if not hasattr(config, "workerinput"):
        return None
    for plugin in config.pluginmanager.get_plugins():
        queue, upcoming = getattr(plugin, "torun", None), getattr(plugin, "nextitem_index", None)
        if queue is None or not hasattr(queue, "lock"):
            continue
        with queue.lock() as items:
            indices = [upcoming, *items]
        return [i for i in indices if isinstance(i, int)]
    return []


def junit_writer(config: pytest.Config) -> Any | None:
    """The JUnit writer of this pytest process: none without --junitxml, none on an xdist worker.

    A pytest that moved ``xml_key`` writes the file without the run's properties and answer.
    """
    try:
        from _pytest.junitxml import xml_key
    except ImportError:
        return None
    writer = config.stash.get(xml_key, None)
    return writer if hasattr(writer, "logfile") else None


def raised_by_junit_writer(exc: BaseException) -> bool:
    """Whether pytest's own JUnit writer (``_pytest/junitxml.py``) raised ``exc`` (the frame it was raised in).

    A pytest that moved the writer: its failures are the run's end's own (exit status 3, the answer last).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).name == "junitxml.py" and "_pytest" in frames[-1].filename


def terminal_line(reporter: Any) -> tuple[Any, str]:
    """Pytest's TerminalWriter and the line it is writing (put back after a status line replaced it)."""
    writer = reporter._tw
    return writer, getattr(writer, "_current_line", "")


def set_terminal_line(writer: Any, line: str) -> None:
    """What pytest measures to place its ``[NN%]`` at the end of the line."""
    writer._current_line = line


def scope_scheduler(config: pytest.Config, log: Any, scope: Callable[[str], str]) -> Any:
    """Xdist's ``loadscope`` scheduling with our scope of a test id (its ``_split_scope``, xdist 3.x)."""
    from xdist.scheduler import LoadScopeScheduling

    class ScopeScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return ScopeScheduling(config, log)
