"""A scenario's rules against the run they are for (``conformance/plan/scenario_fit.py``), without pytest runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.discover.topology import Device, Topology, cpu_topology
from conformance.discover.topology_source import load_topology_file
from conformance.plan.matrix import DEVICE_SET_FIXTURES, NODE_SET_FIXTURES, SET_KINDS, NodePairing
from conformance.plan.scenario_fit import RunBounds, check_scenario_fits, rule_problem
from conformance.rank.scenario import Scenario, ScenarioError, load_scenario, parse_rule
from conftest import REPO

CPU4 = RunBounds.of(cpu_topology(4), nnodes=1, case_timeout=120.0, case_timeout_source="default")


def gpu_box() -> Topology:
    """Four GPUs: two NVLink pairs joined across the sockets, and a class only a topology file names."""
    devices = tuple(Device(name=f"gpu{i}", index=i, kind="gpu") for i in range(4))
    links = {"gpu0-gpu1": "NV12", "gpu2-gpu3": "NV12", "gpu0-gpu2": "SYS", "gpu0-gpu3": "SYS", "gpu1-gpu2": "SYS",
             "gpu1-gpu3": "C2C"}  # fmt: skip
    return Topology(kind="gpu", devices=devices, source="file", links=links)


def problem(bounds: RunBounds = CPU4, **raw: Any) -> str | None:
    return rule_problem(parse_rule(raw, "W"), bounds)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"effect": "hang", "ranks": [1, 4]},
         "ranks: rank 4 is outside every case of this run: the largest has 4 ranks (0 to 3, one per device)"),
        ({"effect": "hang", "ranks": [2**63 - 1]}, f"ranks: rank {2**63 - 1} is outside every case of this run: *"),
        ({"effect": "hang", "devices": ["cpu0", "gpu0"]},
         "devices: no device 'gpu0'; this run's topology has cpu0, cpu1, cpu2, cpu3"),
        ({"effect": "hang", "probes": ["all_reduse"]},
         "probes: unknown probe 'all_reduse'; the ranks know all_gather, *"),
        ({"effect": "hang", "links": ["NVLINK"]},
         "links: unknown link class 'NVLINK'; link classes are NV<n>, PIX, PXB, PHB, NODE, SYS, CPU, NET, ?"),
        ({"effect": "hang", "links": ["NV0"]}, "links: unknown link class 'NV0'; *"),
        ({"effect": "hang", "sets": ["evens"]},
         "sets: unknown device-set kind 'evens'; the plan makes all, single, pair, last_half, every_other, *"),
        ({"effect": "slow", "seconds": 1e308},
         "seconds: 1e+308 s is not shorter than the whole case may last (case-timeout 120 s, default), so the sleep "
         'could never end; use effect = "hang" for a rank that never returns'),
        ({"effect": "slow", "seconds": 120}, "seconds: 120 s is not shorter than the whole case may last *"),
    ],
)  # fmt: skip
def test_a_value_the_run_cannot_have_is_named(raw: dict[str, Any], message: str) -> None:
    found = problem(**raw)
    assert found is not None
    assert found == message or (message.endswith("*") and found.startswith(message[:-1])), found


def test_values_the_run_has_pass() -> None:
    assert problem(effect="hang", ranks=[0, 3], devices=["cpu3"], probes=["collectives"], links=["CPU"]) is None
    assert problem(effect="slow", seconds=119.5, sets=list(SET_KINDS)) is None
    assert problem(effect="hang", links=["NV4", "NV18", "SYS", "?", "NET"]) is None


def test_the_largest_case_spans_every_node() -> None:
    two_nodes = RunBounds.of(cpu_topology(2), nnodes=2, case_timeout=120.0, case_timeout_source="default")
    assert problem(two_nodes, effect="hang", ranks=[3], sets=["across_nodes"]) is None
    assert problem(two_nodes, effect="hang", ranks=[4]) == (
        "ranks: rank 4 is outside every case of this run: the largest has 4 ranks (0 to 3, one per device on 2 nodes)"
    )


def test_a_topology_file_may_name_its_own_link_classes() -> None:
    box = RunBounds.of(gpu_box(), nnodes=1, case_timeout=120.0, case_timeout_source="default")
    assert problem(box, effect="hang", links=["C2C"], devices=["gpu3"]) is None
    assert problem(box, effect="hang", links=["XGMI"]) == (
        "links: unknown link class 'XGMI'; link classes are NV<n>, PIX, PXB, PHB, NODE, SYS, CPU, NET, ?, C2C"
    )
    assert problem(effect="hang", links=["C2C"]) is not None  # not a class of the CPU run


def test_the_case_limit_is_named_with_its_source() -> None:
    short = RunBounds.of(cpu_topology(2), 1, 30.0, "command-line option --case-timeout")
    assert problem(short, effect="slow", seconds=45) == (
        "seconds: 45 s is not shorter than the whole case may last (case-timeout 30 s, command-line option "
        '--case-timeout), so the sleep could never end; use effect = "hang" for a rank that never returns'
    )


def test_the_first_bad_rule_is_refused_with_its_file_and_index() -> None:
    rules = (parse_rule({"effect": "hang", "ranks": [1]}, "r1"), parse_rule({"effect": "hang", "ranks": [7]}, "r2"))
    scenario = Scenario(name="x", description="", path="/s/scenario.toml", rules=rules)
    with pytest.raises(ScenarioError, match=r"^/s/scenario\.toml rule 2 ranks: rank 7 is outside every case"):
        check_scenario_fits(scenario, CPU4)


def test_set_kinds_are_the_kinds_the_plan_makes() -> None:
    made = {s.kind for make in DEVICE_SET_FIXTURES.values() for s in make(gpu_box())}
    made |= {s.kind for make in NODE_SET_FIXTURES.values() for s in make(gpu_box(), NodePairing(2))}
    assert made == set(SET_KINDS)


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.toml")), ids=lambda p: p.stem)
def test_every_seed_scenario_fits_the_machine_it_names(path: Path) -> None:
    scenario = load_scenario(path, "test")
    topology = load_topology_file(scenario.topology, "test") if scenario.topology else cpu_topology(4)
    check_scenario_fits(scenario, RunBounds.of(topology, 1, 120.0, "default"))
