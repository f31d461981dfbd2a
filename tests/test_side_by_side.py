"""Disjoint device sets side by side: pairs in rounds, timed transfers alone, records as one by one.

Real pytest runs through ``pytester`` on simulated boxes with real gloo ranks; what ran when is read
back from the records (start = time - seconds) and from each case's phase and result files.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.common import casefiles
from conftest import REPO, in_rounds_named, ladder_lines, read_records

PAIRS_SUITE = """
def test_pair_exchange(conformance_case, conformance, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=conformance.sizes)

def test_peer_copy(conformance_case, conformance, device_pair):
    conformance_case("peer_copy", device_pair, sizes=[8, max(conformance.sizes)], single_process=True)
"""
TOPOLOGY = f"--topology-file={REPO / 'scenarios' / 'topologies' / 'nvswitch-8gpu.json'}"


@dataclass(frozen=True)
class Span:
    nodeid: str
    devices: frozenset[str]
    start: float
    end: float
    waited: tuple[float, float] | None  # while its ranks sat idle, waiting for the measurement turn
    torn_down: float  # when its last rank entered teardown: nothing after it is timed or gated

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and start < self.end

    @property
    def measured_from(self) -> float | None:
        return self.waited[1] if self.waited else None

    def busy_during(self, start: float, end: float) -> bool:
        """Its ranks did work before teardown between ``start`` and ``end`` (waiting for a turn is not work)."""
        if self.waited is None:
            return self.start < end and start < self.torn_down
        before, after = (self.start, self.waited[0]), (self.waited[1], self.torn_down)
        return any(a < end and start < b for a, b in (before, after))


def spans(records: list[dict[str, Any]]) -> list[Span]:
    """When each case's ranks ran, from their own files: first phase line to last result."""
    found = []
    for record in records:
        case_dir = Path(record["case_dir"])
        starts, ends, waits, teardowns = [], [], [], []
        for rank in range(len(record["ranks"])):
            path = casefiles.rank_dir(case_dir, rank)
            lines = [line for line in casefiles.read_phases(path) if line.t]
            starts.append(lines[0].t)
            waits += [(a.t, b.t) for a, b in itertools.pairwise(lines) if a.step == casefiles.TURN_STEP]
            result = casefiles.read_result(path)
            ends.append(result.t if result else record["time"])
            teardowns.append(next((line.t for line in lines if line.phase == "teardown"), ends[-1]))
        waited = (min(a for a, _ in waits), max(b for _, b in waits)) if waits else None
        devices = frozenset(record["devices"])
        found.append(Span(record["nodeid"], devices, min(starts), max(ends), waited, max(teardowns)))
    return found


def test_pairs_are_planned_in_rounds_of_disjoint_pairs() -> None:
    devices = [f"gpu{i}" for i in range(8)]
    pairs = list(itertools.combinations(devices, 2))
    rounds = [in_rounds_named(pairs)[i : i + 4] for i in range(0, 28, 4)]
    assert len(rounds) == 7  # n - 1 rounds of n / 2 pairs
    for round_ in rounds:
        assert len({d for pair in round_ for d in pair}) == 8, round_
    assert sorted(p for r in rounds for p in r) == sorted(pairs)
    assert rounds[0] == [("gpu0", "gpu1"), ("gpu2", "gpu3"), ("gpu4", "gpu5"), ("gpu6", "gpu7")]


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_disjoint_sets_overlap_and_timed_transfers_run_alone(
    pytester: pytest.Pytester, run_suite, reports_dir: Path, xdist: list[str]
) -> None:
    pytester.makepyfile(test_p=PAIRS_SUITE)
    result = run_suite(TOPOLOGY, "--matrix=inherited", *xdist, timeout=300)
    result.assert_outcomes(passed=56)
    records = read_records(reports_dir)
    assert len(records) == 56 and {r["verdict"] for r in records} == {"pass"}
    found = spans(records)

    # disjoint sets really ran side by side; cases that overlapped never shared a device
    overlapping = [(a, b) for a, b in itertools.combinations(found, 2) if a.overlaps(b.start, b.end)]
    assert len(overlapping) >= 7, "pairs of a round should run together"
    for a, b in overlapping:
        assert not a.devices & b.devices, (a.nodeid, b.nodeid)

    # every figure was timed alone: no other case ran while a case measured
    for span in found:
        assert span.measured_from is not None, span.nodeid
        others = [o.nodeid for o in found if o is not span and o.busy_during(span.measured_from, span.torn_down)]
        assert others == [], (span.nodeid, others)
    assert all((r["metrics"] or {}).get("measured_alone") is True for r in records)
    if xdist:
        forkservers = list((reports_dir / records[0]["run_id"] / "forkserver").glob("*.log"))
        assert len(forkservers) == 2


def test_records_and_outcomes_are_the_same_as_one_by_one(
    pytester: pytest.Pytester, run_suite, reports_dir: Path
) -> None:
    """The same items, verdicts and record order with cases side by side as the plan orders them."""
    pytester.makepyfile(test_p=PAIRS_SUITE)
    result = run_suite("--virtual-devices=4", "-v")
    result.assert_outcomes(passed=12)
    records = read_records(reports_dir)
    passed = [line.split(" ")[0] for line in result.outlines if line.endswith("PASSED") or " PASSED " in line]
    assert [r["nodeid"] for r in records] == [p for p in passed if p.startswith("test_p.py::")]
    assert len({r["case_dir"] for r in records}) == 12  # one case each, none run twice


def test_under_xdist_every_rung_of_a_device_set_runs_on_one_worker(pytester: pytest.Pytester, run_suite) -> None:
    """A worker decides a device set's ladder from its own items; two device sets use both workers."""
    pytester.makepyfile(test_p=PAIRS_SUITE)
    result = run_suite(TOPOLOGY, "-n", "2", "-v", "-k", "gpu0-gpu1 or gpu2-gpu3", timeout=300)
    outcomes = result.parseoutcomes()  # later rungs not needed: deselected, or skipped where decided after a wait
    assert outcomes["passed"] == 4 and outcomes.get("skipped", 0) <= 40, outcomes
    assert sum(d["outcome"] == "skipped" for d in ladder_lines(pytester.path / "reports")) == 40
    workers: dict[str, set[str]] = {}
    for line in result.outlines:
        match = re.match(r"\[(gw\d+)\].* (?:PASSED|SKIPPED) test_p\.py::test_\w+\[(gpu\d-gpu\d)", line)
        if match:
            workers.setdefault(match.group(2), set()).add(match.group(1))
    assert sorted(workers) == ["gpu0-gpu1", "gpu2-gpu3"]
    assert all(len(found) == 1 for found in workers.values()), workers
    assert workers["gpu0-gpu1"] != workers["gpu2-gpu3"]
