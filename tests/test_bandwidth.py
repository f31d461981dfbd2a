"""Bandwidth judged in one run, without a baseline: physical link rates and SLOW pairs (issue 26, item 6)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from conformance.discover.health import GpuHealth
from conformance.discover.link_rate import pair_rate_gbps, pcie_gbps
from conformance.harness.junit import JunitSummary, complete
from conformance.rank.scenario import ScenarioError, parse_rule
from conformance.record.records import CaseRecord, JunitRun
from conformance.summarise.bandwidth import SlowCauses, slow_lines, slow_pairs
from conftest import copy_suites
from test_junit_schema import PYTEST_FILE, schema_errors
from test_scenario_answers import answer_lines

GEN4_X16 = GpuHealth(pcie_width=16, pcie_max_width=16, pcie_gen=1, pcie_max_gen=4)
H100 = GpuHealth(nvlinks=(True,) * 18, nvlink_version=6)


def test_physical_rates_from_nvmls_facts() -> None:
    assert pcie_gbps(GEN4_X16) == 31.5  # 16 lanes x 1.969 GB/s: the generation the slot allows, not the idle one
    assert pcie_gbps(GpuHealth(pcie_width=8, pcie_max_gen=4)) == 15.75
    assert pair_rate_gbps("SYS", GEN4_X16, GpuHealth(pcie_width=8, pcie_max_gen=4)) == 15.75  # the slower end
    assert pair_rate_gbps("NV18", H100, H100) == 450.0  # NVLink 4.0: 25 GB/s a link and direction
    assert pair_rate_gbps("NV4", GpuHealth(nvlink_version=4), None) == 100.0  # NVLink 3.0 (A100)
    assert pair_rate_gbps("PIX", GEN4_X16, None) is None and pair_rate_gbps("NV18", GpuHealth(), H100) is None


def pair(devices: str, gbps: float, link: str = "SYS", **fields: Any) -> CaseRecord:
    data = {
        "nodeid": f"suites/test_pairs.py::test_pair_exchange[{devices}-{link}-inherited]", "probe": "pair_exchange",
        "verdict": "pass", "set_kind": "pair", "link": link, "env_name": "inherited", "devices": devices.split("-"),
        "backend": "nccl", "bandwidth_gbps": gbps, **fields,
    }  # fmt: skip
    return CaseRecord.from_json(data)


def test_a_pair_far_below_its_class_is_slow_and_a_healthy_spread_is_not() -> None:
    records = [pair("gpu0-gpu4", 22.0), pair("gpu1-gpu5", 7.0), pair("gpu2-gpu6", 24.5), pair("gpu3-gpu7", 21.0),
               pair("gpu0-gpu1", 30.0, link="PIX")]  # fmt: skip
    (slow,) = slow_pairs(records, 0.6, {})
    assert (slow.pair, slow.median) == ("gpu1-gpu5", 21.5)
    assert slow_lines([slow]) == [
        "SLOW: SYS pairs' pair_exchange on inherited, below 0.6 of their class's median or its floor: gpu1-gpu5 7 GB/s "
        "(0.33 of the median 21.5) -> check the pair's path: both GPUs' PCIe links (`nvidia-smi -q -d PCIE`) and "
        "NVLinks (`nvidia-smi nvlink -s`)"
    ]
    assert slow_pairs(records[:1] + records[2:], 0.6, {}) == []  # 21 to 24.5 GB/s: the spread of healthy pairs


def test_a_floor_judges_a_pair_even_alone_in_its_class() -> None:
    (slow,) = slow_pairs([pair("gpu0-gpu1", 30.0, link="PIX")], 0.6, {"PIX": 40.0})
    assert slow.figure_text() == "gpu0-gpu1 30 GB/s (below the floor 40)"
    assert slow_pairs([pair("gpu0-gpu1", 30.0, link="PIX")], 0.6, {}) == []  # no peers, no floor: not judged


LINK_RATE = {"link_gbps": 31.5}


def test_a_whole_class_below_its_links_floor_is_slow_and_a_healthy_one_is_not() -> None:
    """An IOMMU that translates every P2P transaction slows every switch pair alike: no pair is slow to its peers."""
    slowed = [pair(f"gpu{i}-gpu{i + 1}", 1.26, link="PIX", metrics=LINK_RATE) for i in (0, 2, 4, 6)]
    found = slow_pairs(slowed, 0.6, {})
    assert [p.pair for p in found] == ["gpu0-gpu1", "gpu2-gpu3", "gpu4-gpu5", "gpu6-gpu7"]
    assert found[0].figure_text() == "gpu0-gpu1 1.26 GB/s (0.04 of its link's 31.5, below the floor 0.15)"
    causes = SlowCauses({"a PCIe switch": "the IOMMU translates the GPUs' DMA"})
    assert slow_lines(found[:1], causes)[0].startswith(
        "SLOW: PIX pairs' pair_exchange on inherited, below the floor for their link: gpu0-gpu1 1.26 GB/s (0.04 of "
        "its link's 31.5, below the floor 0.15) -> likely cause: the IOMMU translates the GPUs' DMA; check the pair"
    )
    healthy = [pair(f"gpu{i}-gpu{i + 1}", 24.0, link="PIX", metrics=LINK_RATE) for i in (0, 2)]  # 0.76 of the link
    assert slow_pairs(healthy, 0.6, {}) == []


@pytest.mark.parametrize(
    ("probe", "link", "rate", "floor"),
    [
        ("pair_exchange", "NV18", 450.0, 0.10),
        ("pair_exchange", "PXB", 31.5, 0.15),
        ("pair_exchange", "SYS", 31.5, 0.08),
        ("peer_copy", "NV18", 450.0, 0.30),
        ("peer_copy", "PIX", 31.5, 0.25),
        ("peer_copy", "NODE", 31.5, 0.15),
    ],
)
def test_each_probe_and_link_kind_has_its_floor(probe: str, link: str, rate: float, floor: float) -> None:
    def judged(share: float) -> list[str]:
        record = pair("gpu0-gpu1", round(rate * share, 3), link=link, probe=probe, metrics={"link_gbps": rate})
        return [p.pair for p in slow_pairs([record], 0.6, {})]

    assert judged(floor * 0.9) == ["gpu0-gpu1"]
    assert judged(floor * 1.1) == []


def test_a_sites_floor_replaces_the_default_for_its_class() -> None:
    record = pair("gpu0-gpu1", 1.26, link="PIX", metrics=LINK_RATE)  # 0.04 of the link: below the default floor
    assert slow_pairs([record], 0.6, {"PIX": 1.0}) == []  # the site says 1 GB/s is enough here
    assert [p.pair for p in slow_pairs([record], 0.6, {"PIX": 2.0})] == ["gpu0-gpu1"]


def test_only_figures_that_measure_a_gpu_link_are_judged() -> None:
    gloo = [pair("cpu0-cpu1", 9.0, link="CPU", backend="gloo"), pair("cpu0-cpu2", 1.0, link="CPU", backend="gloo")]
    assert slow_pairs(gloo, 0.6, {}) == []  # host memory copies on a shared CPU: noise
    simulated = [pair(f"gpu{i}-gpu{i + 4}", 0.5, simulated=True, metrics={"simulated_gbps": rate})
                 for i, rate in enumerate((25.2, 25.2, 7.56))]  # fmt: skip
    assert [p.pair for p in slow_pairs(simulated, 0.6, {})] == ["gpu2-gpu6"]  # the link's figure, not gloo's
    failed = [pair("gpu0-gpu4", 22.0), pair("gpu1-gpu5", 1.0, verdict="fail")]
    assert slow_pairs(failed, 0.6, {}) == []  # wrong data is a FAIL, never also SLOW


def test_a_slow_pair_is_a_failed_test_case_in_the_junit_file(tmp_path: Path) -> None:
    path = tmp_path / "run.xml"
    path.write_text(PYTEST_FILE.format(name="pytest"))
    finding = ("slow_pair[gpu1-gpu5-SYS-pair_exchange-inherited]", "gpu1-gpu5 7 GB/s (0.33 of the median 21.5)")
    summary = JunitSummary(JunitRun("r", "/r/results.jsonl", "0.1.0"), None, ("SLOW: ...",), (), None, (finding,))
    complete(path, summary)
    (suite,) = ElementTree.parse(path).getroot().findall("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    (case,) = [c for c in suite.iter("testcase") if c.get("classname") == "gpu-conformance"]
    assert case.get("name") == finding[0] and case.find("failure").get("message") == finding[1]  # type: ignore[union-attr]
    assert schema_errors(path) == []


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"effect": "slow_link"}, "r: slow_link needs fraction, a number above 0 and at most 1, got None"),
        ({"effect": "slow_link", "fraction": 0}, "r: slow_link needs fraction, a number above 0 and at most 1, got 0"),
        ({"effect": "slow_link", "fraction": 0.3, "ranks": [0]},
         "r: slow_link selects pairs by devices, links, probes and sets only, not 'ranks'"),
        ({"effect": "hang", "fraction": 0.3}, "r: field 'fraction' does not apply to effect 'hang'"),
    ],
)  # fmt: skip
def test_a_slow_link_rule_is_checked(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_rule(rule, "r")
    assert str(caught.value) == message
    assert parse_rule({"effect": "slow_link", "fraction": 0.3, "devices": ["gpu1"]}, "r").fraction == 0.3


@pytest.mark.usefixtures("isolated_env")
def test_a_slow_pair_fails_the_run_in_the_answer_run_json_junit_and_exit_status(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_pairs.py")
    junit = pytester.path / "slow.xml"
    result = run_suite("--scenario", "slow-pair", f"--junitxml={junit}", *files, timeout=240)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()  # every case passed
    assert answer_lines(result)[0].startswith(
        "SLOW: SYS pairs' pair_exchange on inherited, below 0.6 of their class's median or its floor: gpu1-gpu5 7.56"
    )
    facts = json.loads((reports_dir / "latest" / "run.json").read_text())
    assert (facts["slow_ratio"], facts["bandwidth_floors"]) == (0.6, {})  # what a re-render judges by
    (suite,) = ElementTree.parse(junit).getroot().findall("testsuite")
    slow = [c for c in suite.iter("testcase") if c.get("classname") == "gpu-conformance"]
    assert sorted(c.get("name") for c in slow) == [
        "slow_pair[gpu1-gpu5-SYS-pair_exchange-inherited]", "slow_pair[gpu1-gpu5-SYS-peer_copy-inherited]"
    ]  # fmt: skip
    assert suite.get("failures") == "2" and all(c.find("failure") is not None for c in slow)
    assert schema_errors(junit) == []
