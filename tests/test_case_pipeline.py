"""The case pipeline without a rank: items collected in this process, a fake runner returning canned results.

In the spirit of pytest-xdist's ``MockNode``: the pytest layer's decisions (a later rung not needed,
cases side by side, collectives in one group, node-pair re-checks) are checked here in milliseconds;
the tests that start real ranks show the same decisions end to end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from conformance.common.verdicts import Verdict
from conformance.harness.context import RunContext
from conformance.harness.local import collective
from conformance.harness.planned import PLANNED
from conformance.harness.strategy import CaseRequest
from conformance.launch.case import CaseResult, CaseSpec
from conformance.launch.watchdog import OnWait, Peers
from conformance.plan.matrix import DeviceSet, NodePairing
from conformance.plan.parametrize import device_set_of
from conformance.plugin import SESSION_KEY
from conformance.session import ConformanceSession
from conformance.verdict.decision import Decision

REPO = Path(__file__).resolve().parents[1]
PCIE_4GPU = REPO / "conformance" / "scenarios" / "topologies" / "pcie-l4-4gpu.json"

TESTS = """
import pytest

def test_copy(device_pair, conformance_case):
    conformance_case("peer_copy", device_pair)

@pytest.mark.collective("all_reduce")
def test_all_reduce(device_set, collective_case):
    collective_case(device_set)

@pytest.mark.collective("broadcast")
def test_broadcast(device_set, collective_case):
    collective_case(device_set)
"""


class FakeRunner:
    """Returns a canned verdict per probe and remembers every case it was asked to run, in order."""

    def __init__(self, verdicts: dict[str, Verdict]) -> None:
        self.verdicts = verdicts
        self.ran: list[CaseSpec] = []

    def run(
        self, spec: CaseSpec, peers: Peers | None = None, confirm_at: str = "", on_wait: OnWait | None = None
    ) -> CaseResult:
        self.ran.append(spec)
        return self._result(spec, Decision(self.verdicts.get(spec.probe, Verdict.PASS), None, [], "canned"))

    def not_started(self, spec: CaseSpec, decision: Decision) -> CaseResult:
        return self._result(spec, decision)

    def sweep(self) -> list[int]:
        return []

    @staticmethod
    def _result(spec: CaseSpec, decision: Decision) -> CaseResult:
        return CaseResult(spec, decision, [], 0.01, Path("/nonexistent"), True, None, 0.0)


Collected = tuple[ConformanceSession, list[pytest.Item], FakeRunner]


@pytest.fixture
def collect(pytester: pytest.Pytester, isolated_env: None) -> Callable[..., Collected]:
    """The suite's items over a simulated 4-GPU PCIe box, collected here, and a fake runner behind the session."""

    def collected(verdicts: dict[str, Verdict] | None = None, *args: str) -> Collected:
        pytester.makepyfile(test_cases=TESTS)
        items, _ = pytester.inline_genitems(
            "-p", "conformance.plugin", f"--topology-file={PCIE_4GPU}", f"--reports-dir={pytester.path}", *args
        )
        session = items[0].config.stash[SESSION_KEY]
        runner = FakeRunner(verdicts or {})
        session.local.runner = session.cases.across.runner = lambda: runner  # type: ignore[attr-defined]
        return session, items, runner

    return collected


def run_item(session: ConformanceSession, item: pytest.Item, probe: str, **params: Any) -> CaseResult:
    device_set = device_set_of(item)
    assert device_set is not None
    return session.cases.run(CaseRequest(item, probe, device_set, None, params))


def named(items: Sequence[pytest.Item], test: str, rung: str) -> list[pytest.Item]:
    return [i for i in items if i.name.startswith(f"{test}[") and f"-{rung}" in i.name]


def test_each_item_is_planned_once_and_keeps_its_plan(collect: Callable[..., Collected]) -> None:
    session, items, _ = collect()
    first = named(items, "test_copy", "inherited")[0]
    planned = first.stash[PLANNED]  # planned at collection (ordering), not again
    assert session.planner.of(first) is planned
    assert planned.step.rung_index == 0 and planned.step.key.startswith("test_copy[gpu")


def test_a_later_rung_is_not_needed_once_the_first_passed(collect: Callable[..., Collected]) -> None:
    session, items, runner = collect()
    first, later = named(items, "test_copy", "inherited")[0], None
    run_item(session, first, "peer_copy")
    key = first.stash[PLANNED].step.key
    later = next(i for i in items if i.stash[PLANNED].step.key == key and i.stash[PLANNED].step.rung_index > 0)
    with pytest.raises(pytest.skip.Exception, match="passed"):
        run_item(session, later, "peer_copy")
    assert {s.env_name for s in runner.ran} == {"inherited"}  # no later rung started a case


def test_a_failed_first_rung_climbs_to_the_next(collect: Callable[..., Collected]) -> None:
    session, items, runner = collect({"peer_copy": Verdict.HANG})
    first = named(items, "test_copy", "inherited")[0]
    assert run_item(session, first, "peer_copy").verdict is Verdict.HANG
    key = first.stash[PLANNED].step.key
    later = [i for i in items if i.stash[PLANNED].step.key == key and i.stash[PLANNED].step.rung_index > 0]
    for item in later:  # a rung that changes nothing here is skipped saying so; the first that may, runs
        try:
            run_item(session, item, "peer_copy")
            break
        except pytest.skip.Exception as skipped:
            assert "same environment as rung" in str(skipped) or "cannot change" in str(skipped)
    mine = [spec for spec in runner.ran if spec.devices == first.stash[PLANNED].device_set.devices]
    assert len(mine) == 2 and mine[1].env_name == item.stash[PLANNED].device_set.rung.name != "inherited"


def test_later_pairs_start_side_by_side_and_are_not_run_again(collect: Callable[..., Collected]) -> None:
    session, items, runner = collect()
    first_round = named(items, "test_copy", "inherited")
    run_item(session, first_round[0], "peer_copy")
    started = len(runner.ran)
    assert started > 1  # disjoint pairs of the same test started beside the first
    devices = [frozenset(d.name for d in s.devices) for s in runner.ran]
    assert all(not (a & b) for i, a in enumerate(devices) for b in devices[i + 1 :])
    second = first_round[1]
    assert second.nodeid in session.local.ahead.pending
    run_item(session, second, "peer_copy")
    assert len(runner.ran) == started  # its case had already run: its result is taken, none started


def test_declared_collectives_on_one_device_set_share_one_case(collect: Callable[..., Collected]) -> None:
    session, items, runner = collect()
    all_reduce = named(items, "test_all_reduce", "inherited")[0]
    broadcast = named(items, "test_broadcast", "inherited")[0]
    probe, params = collective(session.run, all_reduce) or ("", {})
    run_item(session, all_reduce, probe, **params)
    assert [s.probe for s in runner.ran] == ["collectives"]  # one group for both tests
    probe, params = collective(session.run, broadcast) or ("", {})
    result = run_item(session, broadcast, probe, **params)
    assert len(runner.ran) == 1 and result.shared_by is not None


class FakeGroup:
    """Node ``me`` of a run of four whose first pass of node pairs went as ``passed`` says."""

    def __init__(self, passed: dict[tuple[int, int], bool], me: int = 0) -> None:
        self.passed = passed
        self.me = me

    def absent(self, nodes: Any) -> None:
        return None

    def first_pass_passed(self, key: str, pair: tuple[int, int], limit: float) -> bool:
        return self.passed[pair]


def recheck(run: RunContext, session: ConformanceSession, item: pytest.Item, node: int) -> DeviceSet:
    """The node pair node ``node``'s re-check runs, as node ``node`` sees it."""
    run.nodes.me = node  # type: ignore[union-attr]
    placeholder = DeviceSet(devices=run.topology.devices[:1], link=None, kind="node_recheck", nodes=(node,))
    request = CaseRequest(item, "peer_copy", placeholder)
    planned = session.planner.of(item, placeholder)
    assert planned is not None
    return session.cases.across.place(request, planned).device_set


def test_node_pair_rechecks_pair_a_suspect_with_a_node_known_good(collect: Callable[..., Collected]) -> None:
    session, items, _ = collect()
    run = session.run
    run.ensure_run_dir()  # as the pipeline does before it places a case
    run.plan.pairing = NodePairing.of(4, "quick", seed="x")
    run.plan.selected = None  # every node pair's first pass counts (none was collected on this one node)
    first_pass = run.plan.pairing.first_pass()
    good, bad = first_pass[0], first_pass[1]
    run.nodes = FakeGroup({good: True, bad: False})  # type: ignore[assignment]
    item = items[0]
    partners = set()
    for suspect in bad:
        (partner,) = set(recheck(run, session, item, suspect).nodes) - {suspect}
        assert partner in good  # re-checked with a node known good
        partners.add(partner)
    assert len(partners) == 2  # as many good nodes as suspects: disjoint pairs, one round
    with pytest.raises(pytest.skip.Exception, match="passed in the first pass: nothing to re-check"):
        recheck(run, session, item, good[1])


def test_node_pair_rechecks_skip_when_no_node_is_known_good(collect: Callable[..., Collected]) -> None:
    session, items, _ = collect()
    run = session.run
    run.ensure_run_dir()
    run.plan.pairing = NodePairing.of(4, "quick", seed="x")
    run.plan.selected = None  # every node pair's first pass counts (none was collected on this one node)
    run.nodes = FakeGroup(dict.fromkeys(run.plan.pairing.first_pass(), False))  # type: ignore[assignment]
    with pytest.raises(pytest.skip.Exception, match="no node known good to re-check with"):
        recheck(run, session, items[0], 3)
