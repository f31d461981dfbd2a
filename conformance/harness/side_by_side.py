"""Cases side by side: while pytest runs one item, later items of the same test on other devices run too.

pytest runs items one after another; a case is mostly waiting (for ranks to start, meet, move data).
When an item starts its case, the session also starts the cases of the items that come after it in
this process's queue, if they are of the same test function (so the same probe and parameters),
their rung is decided, to run, without waiting for another case, and no running case uses their
devices.  When pytest reaches such an item, its test calls the case as usual and gets the result of
the case that is already running or done; only if it asks for something else (another probe or
parameters) is that case thrown away and its own run.  Test ids, records (written when pytest
reaches the item, in order) and outcomes are the same as one by one.  Pairs are planned class by
class in rounds of disjoint pairs (``plan.matrix.each_pair``), so a round runs at once.  Bandwidth
is timed only with no other case running (``launch.measure_gate``).

A plain run looks ahead in ``session.items``; an xdist worker in the queue xdist has given it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from conformance.harness.pytest_private import xdist_queue
from conformance.launch.case import CaseResult
from conformance.launch.watchdog import OnWait
from conformance.plan.matrix import DeviceSet
from conformance.plan.parametrize import device_set_of

CaseCall = tuple[str, str | None, str]  # probe, expected verdict, parameters (JSON): what a test asked for


def case_call(probe: str, expect: str | None, params: Mapping[str, object]) -> CaseCall:
    return probe, expect, json.dumps(params, sort_keys=True, default=str)


SIGNAL_CHECK_SECONDS = 0.2  # how soon an interrupt delivered to another thread stops the wait for a case


@dataclass
class Pending:
    """A case running in a thread of its own; the item that waits for it shows its progress."""

    nodeid: str
    call: CaseCall
    devices: frozenset[str]
    result: CaseResult | None = None
    error: BaseException | None = None
    on_wait: OnWait | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def run(self, case: Callable[[OnWait], CaseResult]) -> None:
        def body() -> None:
            try:
                self.result = case(self._progress)
            except BaseException as exc:  # handed to the item that waits for it
                self.error = exc
            finally:
                self.done.set()

        threading.Thread(target=body, name=f"case {self.nodeid}", daemon=True).start()

    def _progress(self, ranks: Any, seconds_left: float) -> None:
        if self.on_wait is not None:
            self.on_wait(ranks, seconds_left)

    def wait(self, on_wait: OnWait | None) -> CaseResult:
        self.on_wait = on_wait
        # In slices: a Ctrl-C the kernel hands to another thread only marks it for the main thread,
        # which sees it when it next wakes; an untimed wait would sleep through it until the case ends.
        while not self.done.wait(SIGNAL_CHECK_SECONDS):
            pass
        self.on_wait = None
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@dataclass
class PartOf:
    """An item whose result comes out of another item's case (``conformance.harness.shared_group``).

    ``wait`` gives None when the case never reached this item's part: the item then runs alone.
    """

    nodeid: str
    call: CaseCall
    case: Pending
    part: Callable[[CaseResult], CaseResult | None]

    @property
    def devices(self) -> frozenset[str]:
        return self.case.devices

    @property
    def done(self) -> threading.Event:
        return self.case.done

    def wait(self, on_wait: OnWait | None) -> CaseResult | None:
        return self.part(self.case.wait(on_wait))


def same_test(a: pytest.Item, b: pytest.Item) -> bool:
    return getattr(a, "function", None) is getattr(b, "function", object()) and a.parent is b.parent


class CasesAhead:
    """The cases running for items pytest has not reached yet, and the devices they use."""

    def __init__(self) -> None:
        self.pending: dict[str, Pending | PartOf] = {}
        self._positions: dict[str, int] = {}

    def take(self, nodeid: str, call: CaseCall) -> Pending | PartOf | None:
        """The case started for this item, if it was started with the same call (else it is dropped)."""
        pending = self.pending.pop(nodeid, None)
        return pending if pending is not None and pending.call == call else None

    def busy(self) -> set[str]:
        return {d for p in self.pending.values() if not p.done.is_set() for d in p.devices}

    def upcoming(self, item: pytest.Item) -> Sequence[pytest.Item]:
        """The items this process will run after ``item``, in order."""
        items = item.session.items
        queue = xdist_queue(item.config)
        if queue is not None:
            return [items[i] for i in queue if i < len(items)]
        if not self._positions:
            self._positions = {it.nodeid: i for i, it in enumerate(items)}
        position = self._positions.get(item.nodeid)
        return items[position + 1 :] if position is not None else ()

    def candidates(
        self, item: pytest.Item, running: Iterable[str], eligible: Callable[[pytest.Item, DeviceSet], bool]
    ) -> list[tuple[pytest.Item, DeviceSet]]:
        """Later ``eligible`` items of the same test, in order, while each fits on devices nothing uses.

        The first one that does not fit ends the look: items keep their order, so a round of
        disjoint pairs starts together instead of being broken up by pairs of later rounds.
        """
        taken = set(running) | self.busy()
        chosen = []
        for later in self.upcoming(item):
            if not same_test(item, later):
                continue
            device_set = device_set_of(later)
            if device_set is None or later.nodeid in self.pending or any(later.iter_markers("skip")):
                continue
            if device_set.nodes or not eligible(later, device_set):
                continue
            names = {d.name for d in device_set.devices}
            if names & taken:
                break
            taken |= names
            chosen.append((later, device_set))
        return chosen
