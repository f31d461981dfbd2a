"""The HTML report.

Its structure (parsed with html.parser), escaping, no script and no network, a 16-GPU machine, a
real small run, and a screenshot in headless Chromium.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from conformance.cli.main import main
from conformance.discover.topology import Device, Topology
from conformance.record.records import CaseRecord, RunFacts
from conformance.record.runs import Run, load_run
from conformance.summarise.answer import answer
from conformance.summarise.collectives import collective_lines
from conformance.summarise.compare import compare, write_comparison
from conformance.summarise.recommend import recommend
from conformance.summarise.report import REPORT_FILE, render_report, write_report
from conformance.summarise.report_matrices import HEAT_HIGH, HOST_COPIES, PAIR_PROBES
from conftest import read_records, scenario_text

RunSuite = Callable[..., pytest.RunResult]
REPO = Path(__file__).resolve().parent.parent
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}
VERDICT_CLASSES = {"v-pass", "v-fail", "v-hang", "v-crash", "v-error", "v-inconclusive", "v-skip", "v-untested", "diag"}


# --------------------------------------------------------------------------------------------
# a small DOM from html.parser; every end tag must close the element it opened
# --------------------------------------------------------------------------------------------


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def iter(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag: str, css: str | None = None, **attrs: str) -> list[Node]:
        return [
            n
            for n in self.iter()
            if n.tag == tag
            and (css is None or css in n.classes)
            and all(n.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def find(self, tag: str, css: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, css, **attrs)
        assert len(found) == 1, f"{len(found)} <{tag} class={css} {attrs}> found"
        return found[0]


class TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.current = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs), self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_endtag(self, tag: str) -> None:
        assert self.current.tag == tag, f"</{tag}> closes <{self.current.tag}>"
        assert self.current.parent is not None
        self.current = self.current.parent

    def handle_data(self, data: str) -> None:
        self.current.children.append(data)


def parse(html: str) -> Node:
    builder = TreeBuilder()
    builder.feed(html)
    builder.close()
    assert builder.current is builder.root, f"<{builder.current.tag}> never closed"
    return builder.root


def grid(root: Node, probe: str, rung: str) -> list[list[Node]]:
    """The n x n cells (without headers) of one verdict grid."""
    figure = root.find("figure", "grid", data_probe=probe, data_rung=rung)
    return [row.find_all("td") for row in figure.find("tbody").find_all("tr")]


def cell_classes(rows: list[list[Node]]) -> list[list[str]]:
    return [[" ".join(sorted(c.classes & VERDICT_CLASSES)) for c in row] for row in rows]


def assert_self_contained(html: str) -> None:
    """No script, no external reference: nothing a browser would fetch, no web address at all."""
    lowered = html.lower()
    for needle in ("<script", "http://", "https://"):
        assert needle not in lowered, f"{needle!r} in the report"
    fetching = {"script", "link", "img", "iframe", "object", "embed", "video", "audio", "source", "base"}
    for node in parse(html).iter():
        assert node.tag not in fetching, f"<{node.tag}> in the report"
        assert not {"src", "srcset", "action", "formaction"} & set(node.attrs), node.attrs
        assert (node.attrs.get("href") or "#").startswith("#"), node.attrs  # links within the page only
        styles = [node.attrs.get("style") or ""] + ([node.text] if node.tag == "style" else [])
        for style in styles:
            assert "url(" not in style and "@import" not in style, style


# --------------------------------------------------------------------------------------------
# hand-built runs
# --------------------------------------------------------------------------------------------


def pcie_topology(n: int, model: str = "NVIDIA RTX 6000 Ada Generation") -> Topology:
    """Two sockets of n/2 GPUs; consecutive even/odd GPUs share a PCIe switch (PIX)."""
    devices = tuple(
        Device(
            f"gpu{i}", i, "gpu", f"GPU-{i:08x}-0000-0000-0000-{i:012x}", model, f"00000000:{0x18 + 16 * i:02X}:00.0",
            numa_node=0 if i < (n + 1) // 2 else 1, memory_mib=49140, nvml_index=i,
        )
        for i in range(n)
    )  # fmt: skip
    links, p2p = {}, {}
    for a, b in combinations(devices, 2):
        same_socket = a.numa_node == b.numa_node
        links[f"{a.name}-{b.name}"] = ("PIX" if a.index // 2 == b.index // 2 else "NODE") if same_socket else "SYS"
        p2p[f"{a.name}-{b.name}"] = {"read": "OK", "write": "OK", "nvlink": "NOT_SUPPORTED", "atomics": "OK"}
    # AMD CPUs: NCCL uses P2P over every path of a pair (plan/transport.py), SYS included
    return Topology("gpu", devices, "box.json", "simulated box", links, p2p, "550.54.15", "12.4", cpu="amd")


STACK = '  File "/x/rank/probes.py", line 210 in pair_exchange\n  File "/x/rank/main.py", line 105 in run_case'


def record(
    topology: Topology, a: int, b: int, probe: str, rung: str, verdict: str, bandwidth: float | None = None, **more: Any
) -> dict[str, Any]:
    da, db = topology.devices[a], topology.devices[b]
    link = topology.link(da, db)
    failing = verdict != "pass"
    test = "test_pair_exchange" if probe == "pair_exchange" else "test_peer_copy"
    stuck = "ranks 0,1 all stuck in probe (send/recv 4B)"
    root = {"rank": None, "kind": verdict, "message": stuck, "phase": None, "step": None} if failing else None
    base: dict[str, Any] = {
        "schema": 1, "run_id": "20260101-000000-abcd",
        "nodeid": f"suites/test_pairs.py::{test}[{da.name}-{db.name}-{link}-{rung}]",
        "probe": probe, "devices": [da.name, db.name], "device_ids": [da.uuid, db.uuid], "link": link,
        "set_kind": "pair", "ladder_key": f"{test}[{da.name}-{db.name}-{link}]", "backend": "gloo",
        "env_name": rung, "env": {}, "verdict": verdict, "expected_verdict": None,
        "summary": stuck if verdict == "hang" else f"{verdict} summary",
        "root_cause": root,
        "victims": [0, 1] if failing else [],
        "ranks": [
            {"rank": k, "device": d.name, "phase": "probe", "step": "send/recv 4B", "exit": "SIGTERM" if failing else 0,
             "status": "stopped" if failing else "ok", "seconds": 4.0, "stopped_by": "deadline" if failing else None,
             "unkillable": False, "stack": STACK if failing else None}
            for k, d in enumerate((da, db))
        ],
        "bandwidth_gbps": bandwidth, "metrics": {}, "p2p_status": None, "transports": {},
        "nccl_warnings": ["NCCL WARN Cuda failure 'peer access is not supported'"] if failing else [],
        "nccl": None, "seconds": 4.0, "lease_wait": 0.0, "stop_reason": "deadline" if verdict == "hang" else None,
        "stop_seconds": None, "simulated": True, "case_dir": f"/reports/run/cases/{test}-{a}-{b}-{rung}",
    }  # fmt: skip
    base.update(more)
    return base


def sys_hang_records(topology: Topology) -> list[dict[str, Any]]:
    """Every SYS pair hangs on inherited and passes on p2p_level_nvl; peer copies pass everywhere."""
    records = []
    for da, db in topology.pairs():
        a, b = da.index, db.index
        sys = topology.link(da, db) == "SYS"
        bandwidth = 20.0 + a + b
        records.append(record(topology, a, b, "pair_exchange", "inherited", "hang" if sys else "pass",
                              None if sys else bandwidth))  # fmt: skip
        if sys:
            records.append(record(topology, a, b, "pair_exchange", "p2p_level_nvl", "pass", bandwidth / 4))
        records.append(record(topology, a, b, "peer_copy", "inherited", "pass", 2 * bandwidth))
    return records


def make_run(topology: Topology, records: list[dict[str, Any]], folder: Path | None = None, **facts: Any) -> Run:
    run_facts = {
        "run_id": "20260101-000000-abcd", "host": "box-17", "backend": "gloo", "simulated": True,
        "scenario": "scenarios/driver-p2p-hang.toml", "torch": "2.13.0", "matrix": "adaptive",
        "topology": json.loads(topology.to_json()), "inherited_env": {}, **facts,
    }  # fmt: skip
    return Run(str(folder or "/reports/run"), RunFacts.from_json(run_facts), typed(records), folder=folder)


def typed(records: list[dict[str, Any]]) -> list[CaseRecord]:
    return [CaseRecord.from_json(r) for r in records]


RECOMMENDATION = ["per topology class, the first rung on which every case of the class passed:", "  SYS: p2p_level_nvl"]


# --------------------------------------------------------------------------------------------
# unit tests on hand-built records
# --------------------------------------------------------------------------------------------


def test_sections_grids_heat_map_and_failures() -> None:
    topology = pcie_topology(4)  # gpu0,gpu1 | gpu2,gpu3: PIX within a switch, SYS across the sockets
    records = sys_hang_records(topology)
    records.append(record(topology, 0, 1, "pair_exchange", "cumem_off", "fail", summary="wrong data"))
    html = render_report(make_run(topology, records), RECOMMENDATION)
    root = parse(html)
    assert_self_contained(html)

    sections = [s.attrs["id"] for s in root.find_all("section")]
    assert sections == ["answer", "machine", "grids", "bandwidth", "collectives", "failures", "ladder",
                        "recommendation"]  # fmt: skip
    machine = root.find("section", id="machine").text
    for fact in ("GPU-00000003-0000-0000-0000-000000000003", "00000000:48:00.0", "550.54.15", "12.4", "2.13.0",
                 "box-17", "NVIDIA RTX 6000 Ada Generation", "scenarios/driver-p2p-hang.toml"):  # fmt: skip
        assert fact in machine
    assert "SIMULATED" in root.find("header").text
    links = root.find("table", "links")
    assert [[td.text for td in tr.find_all("td")] for tr in links.find("tbody").find_all("tr")][0] == [
        "X", "PIX", "SYS", "SYS", "0",
    ]  # fmt: skip

    d, p, h, u, f = "diag", "v-pass", "v-hang", "v-untested", "v-fail"
    assert cell_classes(grid(root, "pair_exchange", "inherited")) == [
        [d, p, h, h], [p, d, h, h], [h, h, d, p], [h, h, p, d],
    ]  # fmt: skip
    assert cell_classes(grid(root, "pair_exchange", "p2p_level_nvl")) == [
        [d, u, p, p], [u, d, p, p], [p, p, d, u], [p, p, u, d],
    ]  # fmt: skip
    assert cell_classes(grid(root, "pair_exchange", "cumem_off"))[0] == [d, f, u, u]
    assert [g.attrs["data-rung"] for g in root.find_all("figure", "grid", data_probe="pair_exchange")] == [
        "inherited", "cumem_off", "p2p_level_nvl",
    ]  # ladder order, not record order  # fmt: skip
    assert {c.text for row in grid(root, "pair_exchange", "inherited") for c in row} == {"P", "H", "·"}
    legend = root.find("section", id="grids").find("div", "legend").text
    assert "hang" in legend and "wrong data" in legend and "not run on this rung" in legend

    # bandwidth: each pair's best passing case; the largest value gets the darkest colour
    heat = root.find("figure", "heat", data_probe="peer_copy")
    cells = [row.find_all("td") for row in heat.find("tbody").find_all("tr")]
    assert [c.text for c in cells[2]] == ["44.0", "46.0", "·", "50.0"]
    assert "background:rgb({},{},{})".format(*HEAT_HIGH) in cells[2][3].attrs["style"]
    exchange = root.find("figure", "heat", data_probe="pair_exchange")
    rows = [row.find_all("td") for row in exchange.find("tbody").find_all("tr")]
    assert [c.text for c in rows[0]] == ["·", "21.0", "5.50", "5.75"]
    assert "alt" in rows[0][2].classes and "alt" not in rows[0][1].classes  # measured on p2p_level_nvl

    # failures: hangs first, then wrong data, each with root cause, stacks and NCCL warnings; the four SYS
    # pairs that hung alike share one card, with a count and every test named
    section = root.find("section", id="failures")
    articles = section.find_all("article")
    assert [a.attrs["data-verdict"] for a in articles] == ["hang", "fail"]
    first = articles[0]
    assert "gpu0-gpu2-SYS-inherited" in first.text
    assert first.find("span", "count").text == "x4"
    alike = [li.text.split(" (")[0] for li in first.find("details", "alike").find_all("li")]
    assert alike == [f"suites/test_pairs.py::test_pair_exchange[{p}-SYS-inherited]"
                     for p in ("gpu0-gpu3", "gpu1-gpu2", "gpu1-gpu3")]  # fmt: skip
    glance = section.find("table", "glance").find("tbody").find_all("tr")
    assert len(glance) == 2 and "and 3 more alike" in glance[0].text
    assert "root cause:" in first.text and "ranks 0,1 all stuck in probe (send/recv 4B)" in first.text
    assert [pre.text for pre in first.find_all("pre", "stack")] == [STACK, STACK]
    assert "NCCL WARN Cuda failure 'peer access is not supported'" in first.text

    ladder = root.find("section", id="ladder")
    rows_text = {tr.find_all("th")[0].text: [td.text for td in tr.find_all("td")] for tr in ladder.find_all("tr")[1:]}
    assert rows_text["SYS"] == ["4/8", "–", "4/4", "p2p_level_nvl: export NCCL_P2P_LEVEL=NVL"]  # peer copies pass
    assert rows_text["PIX"] == ["4/4", "0/1", "–", "inherited: nothing to set: the environment as it is"]
    assert root.find("section", id="recommendation").find("pre").text == "\n".join(RECOMMENDATION)


def collective_record(probe: str, rung: str, verdict: str, sizes: dict[str, tuple[float, float]]) -> dict[str, Any]:
    devices = [f"gpu{i}" for i in range(4)]
    return {
        "schema": 1, "nodeid": f"suites/test_collectives.py::test_{probe}[all4-{rung}]", "probe": probe,
        "devices": devices, "device_ids": devices, "link": None, "set_kind": "all",
        "ladder_key": f"test_{probe}[all4]", "backend": "nccl", "env_name": rung, "verdict": verdict,
        "metrics": {"algbw_gbps": {s: a for s, (a, _) in sizes.items()},
                    "busbw_gbps": {s: b for s, (_, b) in sizes.items()}},
    }  # fmt: skip


def test_the_collectives_table_shows_algbw_and_busbw_by_size() -> None:
    topology = pcie_topology(4)
    records = [
        {
            **collective_record("all_reduce", "inherited", "pass", {"64MiB": (100.0, 150.0)}),
            "metrics": {"algbw_gbps": {"64MiB": 100.0}, "busbw_gbps": {"64MiB": 150.0}, "link_gbps": 200.0},
        },
        collective_record("all_gather", "inherited", "pass", {"64MiB": (80.0, 60.0), "1MiB": (10.5, 7.875)}),
        collective_record("reduce_scatter", "inherited", "hang", {"64MiB": (1.0, 1.0)}),  # not passed: not shown
    ]
    root = parse(render_report(make_run(topology, records, backend="nccl")))
    section = root.find("section", id="collectives")
    body = [[td.text for td in tr.find_all("td")] for tr in section.find("tbody").find_all("tr")]
    assert body == [
        ["all_gather", "all4", "4", "1MiB", "10.50", "7.88", "-", "inherited"],
        ["all_gather", "all4", "4", "64MiB", "80.00", "60.00", "-", "inherited"],
        ["all_reduce", "all4", "4", "64MiB", "100.00", "150.00", "0.75", "inherited"],
    ]  # all_reduce's record knows its slowest link: 200 GB/s
    assert "host memory" not in section.text  # NCCL figures
    assert collective_lines(typed(records))[1:] == [
        "collective  devices  ranks  size   algbw   busbw   of link  rung",
        "all_gather  all4     4      1MiB   10.50   7.88    -        inherited",
        "all_gather  all4     4      64MiB  80.00   60.00   -        inherited",
        "all_reduce  all4     4      64MiB  100.00  150.00  0.75     inherited",
    ]


def test_a_kept_comparison_is_shown_by_every_render(tmp_path: Path) -> None:
    topology = pcie_topology(2)
    old = make_run(topology, [record(topology, 0, 1, "pair_exchange", "inherited", "pass", 20.0)])
    new = make_run(topology, [record(topology, 0, 1, "pair_exchange", "inherited", "hang")], folder=tmp_path)
    assert "regressions" not in [s.attrs["id"] for s in parse(render_report(new)).find_all("section")]
    assert write_comparison(compare(old, new)) == tmp_path / "comparison.json"
    section = parse(render_report(new)).find("section", id="regressions")
    assert "Regressions against the baseline (1)" in section.text
    assert "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-SYS-inherited]" in section.text
    assert "REGRESSED: 1 regression(s)" in section.find("details").text  # the whole comparison, folded


def test_regressions_section_only_when_given() -> None:
    topology = pcie_topology(2)
    run = make_run(topology, sys_hang_records(topology))
    assert "regressions" not in [s.attrs["id"] for s in parse(render_report(run)).find_all("section")]
    regressions = [
        {"nodeid": "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX]", "kind": "verdict", "baseline": "pass",
         "current": "hang"},
        {"nodeid": "suites/test_pairs.py::test_peer_copy[gpu0-gpu1-PIX]", "kind": "bandwidth", "baseline": 40.0,
         "current": 12.5, "ratio": 0.31},
    ]  # fmt: skip
    root = parse(render_report(run, RECOMMENDATION, regressions))
    section = root.find("section", id="regressions")
    table = section.find("table")
    assert [th.text for th in table.find_all("th")] == ["nodeid", "kind", "baseline", "current", "ratio"]
    body = [[td.text for td in tr.find_all("td")] for tr in table.find("tbody").find_all("tr")]
    assert body[1] == ["suites/test_pairs.py::test_peer_copy[gpu0-gpu1-PIX]", "bandwidth", "40.0", "12.5", "0.31"]
    assert body[0][4] == "–"


def test_every_record_text_is_escaped() -> None:
    topology = pcie_topology(2, model="<b>GPU</b>")
    hostile = record(
        topology, 0, 1, "pair_exchange", "inherited", "hang",
        summary="<b>bold</b> & done", nodeid="suites/x.py::test[<i>id</i>]",
        ranks=[{"rank": 0, "device": "gpu0", "phase": "probe", "step": "<u>step</u>", "exit": "SIGTERM",
                "status": "stopped", "seconds": 1.0, "stopped_by": "deadline", "unkillable": False,
                "stack": '  File "<script>alert(1)</script>", line 1 in <module>'}],
        nccl_warnings=['<img src="x" onerror="y">'],
        root_cause={"rank": 0, "kind": "<em>Kind</em>", "message": "<s>msg</s>", "phase": "probe", "step": "<q>"},
        env_name="<b>rung</b>", link="<b>SYS</b>",
    )  # fmt: skip
    run = make_run(topology, [hostile], host='"><b>host</b>', scenario="<b>s.toml</b>")
    html = render_report(run, ["<b>export</b> X=1"], [{"<b>key</b>": "<b>value</b>"}])
    root = parse(html)
    assert_self_contained(html)
    assert not [n.tag for n in root.iter() if n.tag in {"b", "i", "u", "em", "s", "q", "img", "script"}]
    for raw in ("<b>", "<i>", "<img", "<script", "<em>", "<s>", "<u>"):
        assert raw not in html
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; done" in html
    assert "<b>bold</b> & done" in root.find("section", id="failures").text
    assert "<b>export</b> X=1" in root.find("section", id="recommendation").text
    assert "<b>value</b>" in root.find("section", id="regressions").text
    assert '"><b>host</b>' in root.find("section", id="machine").text
    for node in root.iter():  # titles carry summaries: quotes escaped, so no attribute is injected
        assert "onerror" not in node.attrs


def test_sixteen_gpus_compact_cells() -> None:
    topology = pcie_topology(16)
    html = render_report(make_run(topology, sys_hang_records(topology)), RECOMMENDATION)
    root = parse(html)
    assert_self_contained(html)
    for rung in ("inherited", "p2p_level_nvl"):
        rows = grid(root, "pair_exchange", rung)
        assert len(rows) == 16 and all(len(row) == 16 for row in rows)
        assert all(len(c.text) <= 1 for row in rows for c in row)
    inherited = cell_classes(grid(root, "pair_exchange", "inherited"))
    assert sum(row.count("v-hang") for row in inherited) == 2 * 64  # 8 x 8 cross-socket pairs, both halves
    assert [r[i] for i, r in enumerate(inherited)] == ["diag"] * 16
    headers = [th.text for th in root.find("figure", "grid", data_probe="peer_copy").find("thead").find_all("th")]
    assert headers == ["", *(str(i) for i in range(16))]  # short headers; the full name is the title
    for heat in root.find_all("figure", "heat"):
        assert all(len(td.text) <= 5 for td in heat.find_all("td"))
    # every matrix cell has a fixed, bounded size
    style = root.find("style").text
    match = re.search(r"\.m th,\.m td\{([^}]*)\}", style)
    assert match, "no size rule for matrix cells"
    assert re.search(r"(^|;)width:2\dpx", match.group(1)) and re.search(r"max-width:2\dpx", match.group(1))
    assert re.search(r"(^|;)height:2\dpx", match.group(1)) and "overflow:hidden" in match.group(1)
    for selector in (r"\.m\.wide", r"\.m\.dense", r"\.m\.wide\.dense", r"\.m\.links\.dense"):
        rule = re.search(selector + r" th," + selector + r" td\{([^}]*)\}", style)
        assert rule and re.search(r"max-width:[1-3]\dpx", rule.group(1)), selector
    tables = [t for t in root.find_all("table") if "m" in t.classes]
    assert tables and all("dense" in t.classes for t in tables)


def test_run_without_topology_facts() -> None:
    """A JUnit XML run has no run.json: devices come from the records, the machine section says so."""
    topology = pcie_topology(3)
    records = [r for r in sys_hang_records(topology) if r["probe"] == "pair_exchange"]
    run = Run("results.xml", RunFacts(), typed(records))
    root = parse(render_report(run))
    assert "No topology in the run facts" in root.find("section", id="machine").text
    d, p, h, u = "diag", "v-pass", "v-hang", "v-untested"
    assert cell_classes(grid(root, "pair_exchange", "inherited")) == [[d, p, h], [p, d, h], [h, h, d]]
    assert cell_classes(grid(root, "pair_exchange", "p2p_level_nvl")) == [[d, u, p], [u, d, p], [p, p, d]]
    assert "no recommendation given" in root.find("section", id="recommendation").text.lower()


# --------------------------------------------------------------------------------------------
# the answer first; negative controls; gloo bandwidth
# --------------------------------------------------------------------------------------------

FAILURE_BADGES = {"v-fail", "v-hang", "v-crash", "v-error", "v-inconclusive"}


def answer_box(root: Node) -> tuple[list[tuple[str, str]], list[str]]:
    """The answer's rows as (tone, text), and its export lines."""
    box = root.find("section", id="answer").find("div", "answer")
    rows = [
        (next(c for c in p.classes if c.startswith("t-")), p.text) for p in box.find_all("p") if "sub" not in p.classes
    ]
    return rows, [line for pre in box.find_all("pre", "exports") for line in pre.text.split("\n")]


def red_badges(root: Node) -> list[str]:
    return [n.text for n in root.iter() if n.tag == "span" and "badge" in n.classes and n.classes & FAILURE_BADGES]


def test_the_answer_comes_first() -> None:
    topology = pcie_topology(4)
    run = make_run(topology, sys_hang_records(topology))
    recommendation = recommend(run)
    found = answer(run, recommendation)
    html = render_report(run, recommendation.lines(), answer=found)
    assert html == render_report(run, recommendation.lines())  # the same answer when left to the report
    assert_self_contained(html)
    root = parse(html)
    assert [s.attrs["id"] for s in root.find_all("section")][:2] == ["answer", "machine"]
    assert html.index('<section id="answer"') < html.index('<section id="machine"')
    rows, exports = answer_box(root)
    assert rows[0] == (
        "t-bad",
        "SYS pairs: HANG on inherited (pair_exchange 4/4); passes with NCCL_P2P_LEVEL=NVL -> export NCCL_P2P_LEVEL=NVL",
    )
    assert [tone for tone, _ in rows] == [f"t-{tone}" for _, tone in found.rows() if tone != "plain"]
    assert exports == ["export NCCL_P2P_LEVEL=NVL"] == list(found.exports)
    assert "tone-bad" in root.find("section", id="answer").find("div", "answer").classes


def test_the_answer_of_a_healthy_run_is_one_green_line() -> None:
    topology = pcie_topology(4)
    records = [
        record(topology, a.index, b.index, "pair_exchange", "inherited", "pass", 10.0) for a, b in topology.pairs()
    ]
    root = parse(render_report(make_run(topology, records), RECOMMENDATION))
    rows, exports = answer_box(root)
    ((tone, text),) = rows
    assert tone == "t-good" and text.startswith("everything passed: 6 cases") and "nothing to set" in text
    assert exports == [] and red_badges(root) == []


def test_negative_controls_are_not_red() -> None:
    """A negative control that ended as expected is counted apart, in grey; one that did not stays a failure."""
    topology = pcie_topology(2)
    records = [record(topology, 0, 1, probe, "inherited", "pass", 5.0) for probe in PAIR_PROBES]
    control = {
        "set_kind": "all",
        "link": None,
        "expected_verdict": "error",
        "nodeid": "suites/test_failure_handling.py::test_one_rank_raises[inherited]",
        "summary": "deliberate",
    }
    records.append(record(topology, 0, 1, "fail_one_rank", "inherited", "error", **control))
    html = render_report(make_run(topology, records), RECOMMENDATION)
    assert_self_contained(html)
    root = parse(html)
    assert red_badges(root) == []
    assert "error" not in root.find("div", "counts").text
    assert "1 negative control: ended as expected" in root.find("div", "counts").text
    assert root.find("section", id="failures").find_all("article") == []
    (card,) = root.find("section", id="controls").find_all("article")
    assert card.find("span", "badge").text == "negative control: ended as expected (error)"
    assert "v-control" in card.find("span", "badge").classes and "e-control" in card.classes
    ((tone, text),) = answer_box(root)[0]  # the control is not among the cases
    assert tone == "t-good" and text.startswith("everything passed: 2 cases")

    missed = {**control, "nodeid": control["nodeid"].replace("raises", "hangs")}
    records.append(record(topology, 0, 1, "fail_one_rank", "inherited", "hang", **missed))
    root = parse(render_report(make_run(topology, records), RECOMMENDATION))
    (failure,) = root.find("section", id="failures").find_all("article")
    assert failure.attrs["data-verdict"] == "hang" and "expected error" in failure.text
    assert red_badges(root) == ["1 hang", "hang", "hang"]  # the count, the glance row and the card


def test_record_text_is_autoescaped() -> None:
    topology = pcie_topology(2)
    hostile = record(topology, 0, 1, "pair_exchange", "inherited", "hang", summary="<script>alert(1)</script>")
    html = render_report(make_run(topology, [hostile]), ["<script>x</script>"])
    assert_self_contained(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script" not in html
    assert "<script>alert(1)</script>" in parse(html).find("section", id="failures").text


def test_an_incomplete_run_says_so_at_the_top() -> None:
    topology = pcie_topology(4)
    end = {"state": "incomplete", "planned": 10, "ran": 4, "stopped_by": "KeyboardInterrupt"}
    root = parse(render_report(make_run(topology, sys_hang_records(topology), end=end), RECOMMENDATION))
    assert "INCOMPLETE RUN" in root.find("header").find("div", "incomplete").text
    ((tone, text),) = answer_box(root)[0]
    assert tone == "t-warn" and text.startswith("INCOMPLETE RUN")
    assert "INCOMPLETE" in root.find("title").text


def test_gloo_bandwidth_is_not_a_link_measurement() -> None:
    cpus = tuple(Device(f"cpu{i}", i, "cpu") for i in range(3))
    topology = Topology("cpu", cpus, "virtual", "no GPU: CPU devices")
    records = [record(topology, a.index, b.index, "peer_copy", "inherited", "pass", 3.0) for a, b in topology.pairs()]
    root = parse(render_report(make_run(topology, records)))
    heat = root.find("figure", "heat", data_probe="peer_copy")
    assert HOST_COPIES == "CPU gloo: host memory copies, not a GPU link measurement"
    assert HOST_COPIES in heat.find("figcaption").text

    gpus = pcie_topology(2)  # the same on a machine with GPUs under NCCL: a link measurement, no label
    nccl = [record(gpus, 0, 1, "peer_copy", "inherited", "pass", 40.0, backend="nccl")]
    root = parse(render_report(make_run(gpus, nccl, backend="nccl")))
    assert HOST_COPIES not in root.find("figure", "heat", data_probe="peer_copy").text


def test_write_report_and_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = pcie_topology(4)
    folder = tmp_path / "20260101-000000-abcd"
    folder.mkdir()
    run = make_run(topology, sys_hang_records(topology), folder=folder)
    path = write_report(run, RECOMMENDATION)
    assert path == folder / REPORT_FILE
    assert path.read_text(encoding="utf-8") == render_report(run, RECOMMENDATION)

    # the command, on a run folder written as a run writes it
    (folder / "results.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in run.records))
    (folder / "run.json").write_text(json.dumps(run.facts.to_json()))
    path.unlink()
    assert main(["report", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(folder / REPORT_FILE)
    assert (folder / REPORT_FILE).exists()
    root = parse((folder / REPORT_FILE).read_text(encoding="utf-8"))
    assert root.find("section", id="recommendation").find("pre").text.strip()


def test_command_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "no-such-run")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("python -m conformance report: ") and "no-such-run" in err
    (tmp_path / "empty").mkdir()
    assert main(["report", "--reports-dir", str(tmp_path), "empty"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "not a run folder" in err


# --------------------------------------------------------------------------------------------
# a real run: 3 GPUs, the cross-socket (SYS) pairs hang until NCCL_P2P_LEVEL=NVL
# --------------------------------------------------------------------------------------------


def test_report_of_a_real_run(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    topology = pcie_topology(3)  # gpu0, gpu1 (socket 0, PIX), gpu2 (socket 1): gpu0-gpu2, gpu1-gpu2 SYS
    assert [topology.link(a, b) for a, b in topology.pairs()] == ["PIX", "SYS", "SYS"]
    (pytester.path / "box.json").write_text(topology.to_json(indent=2))
    rule = 'effect = "hang"\nphase = "probe"\nprobes = ["pair_exchange"]\nlinks = ["SYS"]\np2p = true'
    text = scenario_text(rule, name="3-GPU box whose <SYS> P2P hangs")
    (pytester.path / "sys-hang.toml").write_text(text.replace("[scenario]\n", '[scenario]\ntopology = "box.json"\n'))
    (pytester.path / "suites").mkdir()
    shutil.copy(REPO / "suites" / "test_pairs.py", pytester.path / "suites" / "test_pairs.py")
    result = run_suite(
        "--scenario=sys-hang.toml", "--step-timeout=2", "--op-timeout=1", "--init-timeout=1", "--grace=1",
        "-k", "test_pair_exchange or test_peer_copy", "suites/test_pairs.py",
    )  # fmt: skip
    records = read_records(reports_dir)
    assert sorted((r["probe"], r["env_name"], r["verdict"]) for r in records if r["verdict"] != "pass") == [
        ("pair_exchange", "cumem_off", "hang"),  # the class leader only
        ("pair_exchange", "inherited", "hang"),
        ("pair_exchange", "inherited", "hang"),
    ], result.stdout.str()  # fmt: skip (nvls_off, cumem_host_off cannot change a case over SYS: not tried)

    run = load_run(reports_dir / "latest")
    html = render_report(run, RECOMMENDATION)
    root = parse(html)
    assert_self_contained(html)
    d, p, h, u = "diag", "v-pass", "v-hang", "v-untested"
    assert cell_classes(grid(root, "pair_exchange", "inherited")) == [[d, p, h], [p, d, h], [h, h, d]]
    assert cell_classes(grid(root, "pair_exchange", "cumem_off")) == [[d, u, h], [u, d, u], [h, u, d]]
    assert cell_classes(grid(root, "pair_exchange", "p2p_level_nvl")) == [[d, u, p], [u, d, p], [p, p, d]]
    assert cell_classes(grid(root, "peer_copy", "inherited")) == [[d, p, p], [p, d, p], [p, p, d]]
    heat = root.find("figure", "heat", data_probe="peer_copy")
    values = [td.text for td in heat.find("tbody").find_all("td")]
    assert all(re.fullmatch(r"[\d.]+|·", v) for v in values), values
    failures = root.find("section", id="failures").find_all("article")
    # the two SYS pairs hung alike on inherited: one card; the leader's hang on cumem_off: another
    assert [a.attrs["data-verdict"] for a in failures] == ["hang", "hang"]
    assert failures[0].find("span", "count").text == "x2"
    stacks = [pre.text for pre in failures[0].find_all("pre", "stack")]
    assert stacks and all("File " in s for s in stacks)
    assert "3-GPU box whose <SYS> P2P hangs" not in html  # the name is not in the run facts; the path is
    assert "sys-hang.toml" in root.find("section", id="machine").text

    # the command: the recommendation from conformance.summarise.recommend, the file in the run folder
    assert main(["report", "--reports-dir", str(reports_dir)]) == 0
    path = (reports_dir / "latest").resolve() / REPORT_FILE
    page = parse(path.read_text(encoding="utf-8"))
    assert "p2p_level_nvl" in page.find("section", id="recommendation").text


# --------------------------------------------------------------------------------------------
# the page as a browser draws it
# --------------------------------------------------------------------------------------------


def chromium_binary() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


def screenshot(html_path: Path, png: Path, profile: Path, size: str = "1280,2000") -> None:
    """Headless Chromium, offline: no network service, no updates, a throwaway profile."""
    binary = chromium_binary()
    assert binary is not None
    command = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={size}", html_path.resolve().as_uri(),
    ]  # fmt: skip
    subprocess.run(command, capture_output=True, timeout=120, check=False)


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the (still filtered) decompressed scanlines of a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, offset = {}, 8
    idat = b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        if kind == b"IDAT":
            idat += body
        chunks[kind] = body
        offset += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    return width, height, zlib.decompress(idat)


@pytest.mark.skipif(chromium_binary() is None, reason="no chromium binary on PATH (apt-get install chromium)")
def test_chromium_screenshot(tmp_path: Path) -> None:
    topology = pcie_topology(8)
    records = sys_hang_records(topology)
    html_path = write_report(make_run(topology, records, folder=tmp_path), RECOMMENDATION)
    png = tmp_path / "report.png"
    screenshot(html_path, png, tmp_path / "profile")
    assert png.exists(), "chromium wrote no screenshot"
    width, height, pixels = png_pixels(png)
    assert (width, height) == (1280, 2000)
    assert png.stat().st_size > 30_000  # a blank page compresses to a few KB
    assert len(set(pixels)) > 64, "the screenshot is nearly uniform"


def test_a_slow_pair_is_outlined_in_the_heat_map_with_its_links_physical_rate() -> None:
    topology = pcie_topology(4)
    sys_pairs = [(0, 2, 25.0), (0, 3, 24.0), (1, 2, 26.0), (1, 3, 7.5)]
    records = [record(topology, a, b, "pair_exchange", "inherited", "pass", gbps, backend="nccl", simulated=False,
                      metrics={"link_gbps": 31.5}) for a, b, gbps in sys_pairs]  # fmt: skip
    run = make_run(topology, records, backend="nccl", simulated=False, scenario=None)
    root = parse(render_report(run, RECOMMENDATION))
    exchange = root.find("figure", "heat", data_probe="pair_exchange")
    rows = [row.find_all("td") for row in exchange.find("tbody").find_all("tr")]
    slow = [(r, c) for r, row in enumerate(rows) for c, cell in enumerate(row) if "slow" in cell.classes]
    assert slow == [(1, 3), (3, 1)]  # gpu1-gpu3 only, both halves of the matrix
    assert rows[1][3].attrs["title"] == (
        "SLOW: gpu1-gpu3 SYS: 7.5 GB/s on rung inherited; its link's physical rate 31.5 GB/s"
    )
    assert rows[0][2].attrs["title"].endswith("; its link's physical rate 31.5 GB/s")
    assert "SLOW" in root.find("section", id="bandwidth").find("div", "legend").text
