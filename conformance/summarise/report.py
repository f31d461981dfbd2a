"""The run's HTML report: one self-contained file, ``report.html`` in the run folder.

    python -m conformance report [RUN] [--reports-dir DIR]

Inline CSS only: no script, no font, image or style sheet fetched from anywhere, so the file can
be mailed, attached to a CI job or opened on an air-gapped box.  Sections, in order: the machine
(GPUs, link matrix, versions, host, scenario), a GPU x GPU verdict grid per pair probe and rung,
the bandwidth heat map of the pair probes, the hangs, wrong data, crashes and errors with their
root cause, stacks and NCCL warnings, the link class x rung table, the recommendation and, when a
baseline was compared, the regressions.

Every text that comes from a record, the run facts or the caller is escaped (``html.escape``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from conformance.common.verdicts import FAILURES, SEVERITY, Verdict, worst
from conformance.discover.topology import Device, Topology
from conformance.plan.matrix import Rung
from conformance.record.records import HOST_SET_KIND, CaseRecord, RootCause, RunFacts
from conformance.record.runs import Run
from conformance.summarise.summary import (
    bad_nodes,
    deadlines_text,
    first_passing_rungs,
    link_class_of,
    one_record_per_case,
    run_ladder,
    rung_env_text,
)

REPORT_FILE = "report.html"
PAIR_PROBES = ("pair_exchange", "peer_copy")
VERDICT_LETTERS: dict[str, str] = {
    Verdict.PASS: "P",
    Verdict.FAIL: "F",
    Verdict.HANG: "H",
    Verdict.CRASH: "C",
    Verdict.ERROR: "E",
    Verdict.INCONCLUSIVE: "I",
    Verdict.SKIP: "S",
}
VERDICT_MEANING: dict[str, str] = {
    Verdict.PASS: "pass",
    Verdict.FAIL: "fail: wrong data",
    Verdict.HANG: "hang",
    Verdict.CRASH: "crash (signal)",
    Verdict.ERROR: "error (raised)",
    Verdict.INCONCLUSIVE: "inconclusive",
    Verdict.SKIP: "skip",
}
BORDERS: dict[str, str] = {  # a failure card's edge; any other verdict's is yellow
    Verdict.HANG: "#f08c00",
    Verdict.FAIL: "#b3261e",
    Verdict.CRASH: "#6f2dbd",
    Verdict.ERROR: "#d6336c",
}
DENSE_FROM = 10  # devices; more get the dense matrix cells
OPEN_STACKS = 3  # failures whose stacks are shown unfolded; the rest fold (<details>)
HEAT_LOW = (239, 246, 255)  # bandwidth colour at 0 ...
HEAT_HIGH = (8, 69, 148)  # ... and at the run's maximum
DEVICE_COLUMNS = ("device", "NVML", "model", "UUID", "bus id", "NUMA", "memory", "MIG")
RANK_COLUMNS = ("rank", "device", "phase", "step", "exit", "status", "stopped by", "seconds")

CSS = """
*{box-sizing:border-box}
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1f24;background:#f6f7f9;margin:0}
main{max-width:1240px;margin:0 auto;padding:12px 20px 40px}
h1{font-size:20px;margin:4px 0 2px}
h2{font-size:16px;margin:22px 0 8px;padding-bottom:3px;border-bottom:2px solid #d0d7de}
h3{font-size:13px;margin:10px 0 4px}
section{overflow-wrap:break-word}
.badge{white-space:nowrap;overflow-wrap:normal}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:11.5px}
pre{white-space:pre-wrap;word-break:break-all;background:#fff;border:1px solid #d0d7de;border-radius:4px;
 padding:6px 8px;margin:4px 0;max-height:18em;overflow-y:auto}
.sub{color:#57606a}
.banner{display:inline-block;background:#8250df;color:#fff;font-weight:600;border-radius:3px;padding:1px 8px;
 margin-left:6px;font-size:12px;vertical-align:2px}
.incomplete{background:#fff8c5;border:1px solid #d4a72c;border-radius:4px;padding:4px 8px;margin:6px 0}
.flex{display:flex;flex-wrap:wrap;gap:10px 14px;align-items:flex-start}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px}
table{border-collapse:collapse}
table.facts td,table.facts th,table.list td,table.list th{border:1px solid #d8dee4;padding:2px 6px;text-align:left;
 vertical-align:top}
table.facts th,table.list th{background:#eef1f4;font-weight:600}
table.facts{background:#fff}
table.list{background:#fff;margin:4px 0}
.counts span{display:inline-block;margin:2px 4px 2px 0}
.badge{display:inline-block;border-radius:3px;padding:0 6px;font-weight:600;font-size:12px}
.m{table-layout:fixed;background:#fff}
.m th,.m td{width:22px;min-width:22px;max-width:22px;height:22px;padding:0;text-align:center;
 font-size:10px;line-height:22px;overflow:hidden;white-space:nowrap;border:1px solid #fff}
.m th{color:#57606a;font-weight:600;background:#f6f7f9}
.m.wide th,.m.wide td{width:36px;min-width:36px;max-width:36px}
.m.dense th,.m.dense td{width:19px;min-width:19px;max-width:19px;height:19px;line-height:19px;font-size:9px}
.m.wide.dense th,.m.wide.dense td{width:31px;min-width:31px;max-width:31px}
.m.links th,.m.links td{width:40px;min-width:40px;max-width:40px}
.m.links.dense th,.m.links.dense td{width:33px;min-width:33px;max-width:33px}
.m th.corner{background:transparent}
figure{margin:0}
.group h3{margin:0 0 4px}
table.glance{width:100%;table-layout:fixed}
table.glance td{overflow-wrap:anywhere}
a{color:#0969da;text-decoration:none}
figcaption{font-weight:600;margin-bottom:3px;font-size:12px}
figcaption .sub{font-weight:400}
.diag{background:#fff;color:#b0b8c1}
.v-pass{background:#2da44e;color:#fff}
.v-fail{background:#b3261e;color:#fff}
.v-hang{background:#f08c00;color:#1b1f24}
.v-crash{background:#6f2dbd;color:#fff}
.v-error{background:#d6336c;color:#fff}
.v-inconclusive{background:#f5d90a;color:#1b1f24}
.v-skip{background:#8c959f;color:#fff}
.v-unknown{background:#1b1f24;color:#fff}
.v-untested{background:#e4e7eb;color:#e4e7eb}
.bw-none{background:#e4e7eb;color:#8c959f}
.alt{box-shadow:inset 0 0 0 2px #f08c00}
.legend{display:flex;flex-wrap:wrap;gap:4px 12px;margin:4px 0 8px;font-size:12px}
.legend .sw{display:inline-block;width:14px;height:14px;vertical-align:-3px;margin-right:4px;border-radius:2px;
 font-style:normal;text-align:center;font-size:9px;line-height:14px}
.l-nv{background:#d2f4dc}.l-pix{background:#dbeafe}.l-pxb{background:#e0e7ff}.l-phb{background:#fdf2c4}
.l-node{background:#fde4c8}.l-sys{background:#fbd0d0}.l-other{background:#eef1f4}
.ok{background:#d2f4dc}.partial{background:#fdf2c4}.bad{background:#fbd0d0}
article.case{background:#fff;border:1px solid #d0d7de;border-left-width:6px;border-radius:4px;padding:6px 10px;
 margin:8px 0}
article.case h3{margin:0 0 4px}
article.case p{margin:3px 0}
details summary{cursor:pointer;color:#0969da}
ul.warn{margin:2px 0;padding-left:18px;color:#9a6700}
.rec pre{font-size:12px;max-height:none}
"""


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def _e(value: object) -> str:
    """Any value as escaped text; None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, (dict, list, tuple)):
        return escape(json.dumps(value, sort_keys=True))
    return escape(str(value))


def _verdict_class(verdict: str) -> str:
    return f"v-{verdict}" if verdict in VERDICT_LETTERS else "v-unknown"


def _worst_record(records: Iterable[CaseRecord]) -> CaseRecord:
    """The record of the worst verdict (``SEVERITY``); one that names no verdict counts as an error."""
    return min(records, key=lambda r: SEVERITY.index(r.outcome or Verdict.ERROR))


def _natural(name: str) -> tuple[str, int]:
    match = re.fullmatch(r"(.*?)(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else (name, -1)


def _natural_key(text: str) -> tuple[str | int, ...]:
    """``gpu8`` before ``gpu10``: digit runs compare as numbers."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text)))


def _rows(header: Sequence[str], rows: Iterable[Sequence[object]], css: str = "list") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _key_values(rows: Iterable[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{_e(key)}</th><td>{_e(value)}</td></tr>" for key, value in rows)
    return f'<table class="facts"><tbody>{body}</tbody></table>'


def _badge(verdict: str, text: str | None = None) -> str:
    return f'<span class="badge {_verdict_class(verdict)}">{_e(text or verdict)}</span>'


# --------------------------------------------------------------------------------------------
# what the report is drawn from
# --------------------------------------------------------------------------------------------


@dataclass
class _Facts:
    """The run, with what every section needs worked out once."""

    run: Run
    topology: Topology | None
    devices: list[str]  # names, in device order (gpu0, gpu1, ...)
    ladder: tuple[Rung, ...]  # the run's ladder, then rungs seen in records only (``summary.run_ladder``)

    @property
    def records(self) -> list[CaseRecord]:
        return one_record_per_case(self.run.records)

    @property
    def simulated(self) -> bool:
        return self.run.facts.simulated or any(r.simulated for r in self.records)

    def rungs_of(self, records: Iterable[CaseRecord]) -> list[str]:
        seen = {r.env_name for r in records}
        return [rung.name for rung in self.ladder if rung.name in seen]


def _topology(facts: RunFacts) -> Topology | None:
    data = facts.topology
    if not isinstance(data, dict):
        return None
    try:
        return Topology.from_json(json.dumps(data))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _device_names(topology: Topology | None, records: Sequence[CaseRecord]) -> list[str]:
    names = [d.name for d in topology.devices] if topology else []
    seen = {str(name) for r in records for name in r.devices}
    return names + sorted(seen - set(names), key=_natural)


def _facts(run: Run) -> _Facts:
    topology = _topology(run.facts)
    return _Facts(run, topology, _device_names(topology, run.records), run_ladder(run))


# --------------------------------------------------------------------------------------------
# header and machine
# --------------------------------------------------------------------------------------------


def _header(facts: _Facts) -> str:
    run = facts.run
    simulated = '<span class="banner">SIMULATED</span>' if facts.simulated else ""
    incomplete = run.facts.incomplete
    unfinished = (
        f'<div class="incomplete"><b>INCOMPLETE RUN</b>: {_e(incomplete)}. '
        "The grids show only what ran; no environment is recommended.</div>"
        if incomplete
        else ""
    )
    counts = Counter(r.verdict for r in facts.records)
    known = [v.value for v in SEVERITY]
    shown = [v for v in known if counts.get(v)] + sorted(set(counts) - set(known))
    expected = Counter(r.verdict for r in facts.records if r.expected_verdict == r.verdict)
    badges = "".join(
        f"<span>{_badge(v, f'{counts[v]} {v}' + (f' ({expected[v]} expected)' if expected[v] else ''))}</span>"
        for v in shown
    )
    warnings = "".join(f"<li>{_e(w)}</li>" for w in run.warnings)
    warning_list = f'<ul class="warn">{warnings}</ul>' if warnings else ""
    return (
        f"<header><h1>GPU conformance report{simulated}</h1>"
        f'<div class="sub">run <span class="mono">{_e(run.run_id)}</span> · {len(facts.records)} cases · '
        f"{_e(deadlines_text(facts.records, run.facts.step_deadline))} · "
        f'from <span class="mono">{_e(run.source)}</span></div>'
        f'{unfinished}<div class="counts">{badges}</div>{warning_list}</header>'
    )


def _device_row(device: Device) -> tuple[object, ...]:
    memory = None if device.memory_mib is None else f"{device.memory_mib} MiB"
    return (
        device.name,
        device.nvml_index,
        device.model,
        device.uuid,
        device.pci_bus_id,
        device.numa_node,
        memory,
        "on" if device.mig else "off",
    )


def _link_css(link: str) -> str:
    if link.startswith("NV"):
        return "l-nv"
    return {"PIX": "l-pix", "PXB": "l-pxb", "PHB": "l-phb", "NODE": "l-node", "SYS": "l-sys"}.get(link, "l-other")


def _link_matrix(topology: Topology) -> str:
    """The link classes as ``nvidia-smi topo -m`` shows them, each class tinted, with the NUMA node."""
    devices = topology.devices
    head = "".join(f'<th title="{_e(d.name)}">{_e(_short(d.name))}</th>' for d in devices)
    rows = []
    for a in devices:
        cells = []
        for b in devices:
            if a.name == b.name:
                cells.append('<td class="diag">X</td>')
                continue
            link = topology.link(a, b)
            title = f"{a.name}-{b.name}: {link}"
            cells.append(f'<td class="{_link_css(link)}" title="{_e(title)}">{_e(link)}</td>')
        numa = _e("N/A" if a.numa_node is None else a.numa_node)
        rows.append(f'<tr><th title="{_e(a.name)}">{_e(_short(a.name))}</th>{"".join(cells)}<td>{numa}</td></tr>')
    return (
        '<figure><figcaption>Links <span class="sub">(as nvidia-smi topo -m; last column: NUMA node)</span>'
        f'</figcaption><table class="m links{_dense(len(devices))}">'
        f'<thead><tr><th class="corner"></th>{head}<th>NUMA</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></figure>"
    )


def _version_rows(facts: _Facts) -> list[tuple[str, object]]:
    run, topology = facts.run, facts.topology
    versions = run.versions
    scenario = run.facts.scenario
    inherited = run.facts.inherited_env or {}
    rows: list[tuple[str, object]] = [
        ("host", run.facts.host),
        ("backend", run.facts.backend or next((r.backend for r in facts.records), None)),
        ("simulated", "yes, " + ("scenario " + str(scenario) if scenario else "no scenario named")
         if facts.simulated else "no"),
        ("driver", versions.get("driver")),
        ("CUDA driver", versions.get("cuda")),
        ("NCCL", versions.get("nccl") or ("not used (gloo)" if run.facts.backend == "gloo" else None)),
        ("torch", versions.get("torch")),
        ("matrix", run.facts.matrix),
        ("step deadline", run.facts.step_deadline),
        ("case timeout", run.facts.case_timeout),
        ("nodes", _nodes_text(facts.records)),
        ("inherited", " ".join(f"{k}={v}" for k, v in inherited.items()) or "no NCCL/GLOO/TORCH variable"),
    ]  # fmt: skip
    if topology is not None:
        rows.insert(0, ("topology", f"{topology.kind}, from {topology.source}"))
        if topology.note:
            rows.append(("note", topology.note))
    return rows


def _nodes_text(records: list[CaseRecord]) -> str:
    nodes = sorted({r.node_rank for r in records if isinstance(r.node_rank, int)})
    if not nodes:
        return "1"
    text = f"{len(nodes)} with records (node {', '.join(map(str, nodes))}); the device tables are node 0's"
    return "; ".join([text, *(f"BAD NODE {bad.text}" for bad in bad_nodes(records))])


def _machine(facts: _Facts) -> str:
    topology = facts.topology
    parts = ['<section id="machine"><h2>Machine</h2><div class="flex">']
    parts.append('<div class="card">' + _key_values(_version_rows(facts)) + "</div>")
    if topology is not None and topology.kind == "gpu":
        parts.append('<div class="card">' + _link_matrix(topology) + "</div>")
    parts.append("</div>")
    if topology is not None:
        parts.append(_rows(DEVICE_COLUMNS, (_device_row(d) for d in topology.devices)))
    else:
        parts.append('<p class="sub">No topology in the run facts (run.json); devices named by the records: '
                     f'{_e(", ".join(facts.devices))}</p>')  # fmt: skip
    parts.append("</section>")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# verdict grids and bandwidth heat map
# --------------------------------------------------------------------------------------------


def _host_checks(facts: _Facts) -> str:
    """The checks of the host itself (``conformance.host_checks``): what each found, in its own words."""
    checks = [r for r in facts.records if r.set_kind == HOST_SET_KIND]
    if not checks:
        return ""
    rows = "".join(
        f"<tr><td>{_badge(r.verdict)}</td><td>{_e(r.probe.removeprefix('host:'))}</td><td>{_e(r.summary)}</td>"
        f'<td class="mono">{_e(dict(r.metrics) or None)}</td></tr>'
        for r in sorted(checks, key=lambda r: (r.node_rank or 0, r.nodeid))
    )
    return (
        '<section id="host"><h2>Host checks</h2><table class="list"><thead><tr><th>verdict</th><th>check</th>'
        f"<th>found</th><th>values</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _short(name: str) -> str:
    """``gpu12`` -> ``12`` for compact headers (the full name is in the title)."""
    prefix, number = _natural(name)
    return str(number) if number >= 0 and prefix in ("gpu", "cpu") else name[:4]


def _pair(record: CaseRecord) -> frozenset[str] | None:
    devices = record.devices
    return frozenset(str(d) for d in devices) if len(devices) == 2 and devices[0] != devices[1] else None


def _by_pair(records: Iterable[CaseRecord]) -> dict[frozenset[str], list[CaseRecord]]:
    found: dict[frozenset[str], list[CaseRecord]] = {}
    for record in records:
        pair = _pair(record)
        if pair is not None:
            found.setdefault(pair, []).append(record)
    return found


def _dense(count: int) -> str:
    """Smaller cells from this many devices on, so that three 16-GPU grids fit side by side."""
    return " dense" if count > DENSE_FROM else ""


def _matrix_table(devices: Sequence[str], cell: Callable[[str, str], str], wide: bool = False) -> str:
    """An n x n table; ``cell(a, b)`` gives each off-diagonal ``<td>``."""
    head = "".join(f'<th title="{_e(d)}">{_e(_short(d))}</th>' for d in devices)
    rows = []
    for a in devices:
        cells = "".join('<td class="diag">·</td>' if a == b else cell(a, b) for b in devices)
        rows.append(f'<tr><th title="{_e(a)}">{_e(_short(a))}</th>{cells}</tr>')
    css = ("m wide" if wide else "m") + _dense(len(devices))
    return (
        f'<table class="{css}"><thead><tr><th class="corner"></th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _verdict_cell(records: dict[frozenset[str], list[CaseRecord]], a: str, b: str) -> str:
    here = records.get(frozenset((a, b)))
    if not here:
        return f'<td class="v-untested" title="{_e(f"{a}-{b}: not run on this rung")}"></td>'
    record = _worst_record(here)
    verdict = record.verdict
    title = f"{a}-{b} {record.link or ''}: {verdict}: {record.summary or ''}"
    letter = VERDICT_LETTERS.get(verdict, "?")
    return f'<td class="{_verdict_class(verdict)}" title="{_e(title)}">{letter}</td>'


def _verdict_grid(facts: _Facts, probe: str, rung: str, records: list[CaseRecord]) -> str:
    pairs = _by_pair(records)
    passed = sum(1 for group in pairs.values() if worst(r.verdict for r in group) is Verdict.PASS)
    table = _matrix_table(facts.devices, lambda a, b: _verdict_cell(pairs, a, b))
    return (
        f'<figure class="card grid" data-probe="{_e(probe)}" data-rung="{_e(rung)}">'
        f'<figcaption>{_e(rung)} <span class="sub">{passed}/{len(pairs)} pairs pass</span></figcaption>'
        f"{table}</figure>"
    )


def _legend(items: Iterable[tuple[str, str, str]]) -> str:
    spans = "".join(f'<span><span class="sw {css}">{_e(mark)}</span>{_e(text)}</span>' for css, mark, text in items)
    return f'<div class="legend">{spans}</div>'


def _verdict_legend() -> str:
    items = [(f"v-{v.value}", VERDICT_LETTERS[v], VERDICT_MEANING[v]) for v in SEVERITY]
    return _legend([*items, ("v-untested", "", "not run on this rung"), ("diag", "·", "same device")])


def _grids(facts: _Facts) -> str:
    parts = ['<section id="grids"><h2>Pair verdicts per rung</h2>', _verdict_legend()]
    groups: list[str] = []
    for probe in PAIR_PROBES:
        records = [r for r in facts.records if r.probe == probe and _pair(r)]
        if not records:
            continue
        grids = (
            _verdict_grid(facts, probe, rung, [r for r in records if r.env_name == rung])
            for rung in facts.rungs_of(records)
        )
        groups.append(
            f'<div class="group"><h3 class="mono">{_e(probe)}</h3><div class="flex">{"".join(grids)}</div></div>'
        )
    if groups:
        parts.append(f'<div class="flex">{"".join(groups)}</div>')
    else:
        parts.append('<p class="sub">No pair probe ran (pair_exchange, peer_copy).</p>')
    parts.append("</section>")
    return "".join(parts)


def _bandwidth(record: CaseRecord) -> float | None:
    value = record.bandwidth_gbps
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _best_bandwidth(records: Iterable[CaseRecord]) -> dict[frozenset[str], CaseRecord]:
    """Per pair, its passing record of the highest bandwidth."""
    best: dict[frozenset[str], CaseRecord] = {}
    passing = (r for r in records if r.outcome is Verdict.PASS and _bandwidth(r) is not None)
    for pair, group in _by_pair(passing).items():
        best[pair] = max(group, key=lambda r: _bandwidth(r) or 0.0)
    return best


def _bw_text(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _heat_colour(ratio: float) -> tuple[str, str]:
    """Background and text colour for a value at ``ratio`` of the maximum."""
    ratio = min(max(ratio, 0.0), 1.0)
    rgb = tuple(round(lo + (hi - lo) * ratio) for lo, hi in zip(HEAT_LOW, HEAT_HIGH, strict=True))
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})", "#fff" if ratio > 0.5 else "#1b1f24"


def _heat_cell(best: dict[frozenset[str], CaseRecord], top: float, a: str, b: str) -> str:
    record = best.get(frozenset((a, b)))
    if record is None:
        return f'<td class="bw-none" title="{_e(f"{a}-{b}: no passing measurement")}">–</td>'
    value = _bandwidth(record) or 0.0
    background, colour = _heat_colour(value / top if top > 0 else 0.0)
    rung = record.env_name
    alt = "" if rung == "inherited" else " alt"
    title = f"{a}-{b} {record.link or ''}: {value:g} GB/s on rung {rung}"
    style = f"background:{background};color:{colour}"
    return f'<td class="bw{alt}" style="{style}" title="{_e(title)}">{_e(_bw_text(value))}</td>'


def _heat_map(facts: _Facts, probe: str, records: list[CaseRecord]) -> str:
    best = _best_bandwidth(records)
    top = max((_bandwidth(r) or 0.0 for r in best.values()), default=0.0)
    table = _matrix_table(facts.devices, lambda a, b: _heat_cell(best, top, a, b), wide=True)
    return (
        f'<figure class="card heat" data-probe="{_e(probe)}"><figcaption><span class="mono">{_e(probe)}</span> '
        f'<span class="sub">GB/s, max {_e(_bw_text(top))}</span></figcaption>{table}</figure>'
    )


def _heat_maps(facts: _Facts) -> str:
    parts = ['<section id="bandwidth"><h2>Pair bandwidth (GB/s)</h2>']
    low, _ = _heat_colour(0.0)
    high, _ = _heat_colour(1.0)
    scale = (
        f'<span class="sw" style="background:{low}"></span>0 … '
        f'<span class="sw" style="background:{high}"></span>the largest value of each map'
    )
    parts.append(f'<div class="legend"><span>each pair\'s best passing case; colour from {scale}</span>')
    parts.append(
        '<span><span class="sw alt"></span>measured on a later rung (inherited did not pass)</span>'
        '<span><span class="sw bw-none">–</span>no passing measurement</span></div>'
    )
    maps = []
    for probe in PAIR_PROBES:
        records = [r for r in facts.records if r.probe == probe and _pair(r)]
        if records:
            maps.append(_heat_map(facts, probe, records))
    parts.append(f'<div class="flex">{"".join(maps)}</div>' if maps else '<p class="sub">No pair probe ran.</p>')
    parts.append("</section>")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# failures
# --------------------------------------------------------------------------------------------


def _root_cause_text(record: CaseRecord) -> str:
    root = record.root_cause
    if not isinstance(root, RootCause):
        return "not named"
    where = " ".join(str(p) for p in (root.phase, f"({root.step})" if root.step else None) if p)
    who = "no single rank" if root.rank is None else f"rank {root.rank}"
    device = _rank_device(record, root.rank)
    who += f" ({device})" if device else ""
    kind = root.kind
    kind_text = f"{kind}: " if kind and kind != record.verdict else ""
    return f"{who}{' in ' + where if where else ''}: {kind_text}{root.message or ''}"


def _rank_device(record: CaseRecord, rank: int | None) -> str | None:
    for entry in record.ranks:
        if entry.rank == rank and rank is not None:
            return str(entry.device)
    return None


def _rank_rows(record: CaseRecord) -> list[tuple[object, ...]]:
    return [(r.rank, r.device, r.phase, r.step, r.exit, r.status, r.stopped_by, r.seconds) for r in record.ranks]


def _stacks(record: CaseRecord, unfold: bool) -> str:
    blocks = []
    for entry in record.ranks:
        if entry.stack:
            label = f"rank {entry.rank} ({entry.device}), {entry.phase}: {entry.step}"
            blocks.append(f'<div class="sub">{_e(label)}</div><pre class="stack">{_e(entry.stack)}</pre>')
    if not blocks:
        return ""
    state = " open" if unfold else ""
    return f"<details{state}><summary>stack excerpt ({len(blocks)} rank(s))</summary>{''.join(blocks)}</details>"


def _warnings(record: CaseRecord) -> str:
    nccl = record.nccl if isinstance(record.nccl, dict) else {}
    warnings = [*(record.nccl_warnings or ()), *(nccl.get("p2p_warnings") or [])]
    if not warnings:
        return ""
    items = "".join(f"<li>{_e(w)}</li>" for w in dict.fromkeys(str(w) for w in warnings))
    return f'<div>NCCL warnings:</div><ul class="warn">{items}</ul>'


def _failure(record: CaseRecord, number: int) -> str:
    verdict = record.verdict
    border = BORDERS.get(verdict, "#f5d90a")
    victims = ", ".join(str(v) for v in record.victims) or "none"
    node = record.node_rank
    facts = (
        (f"node <strong>{_e(node)}</strong> · " if node is not None else "")
        + f"rung <strong>{_e(record.env_name)}</strong> · link {_e(record.link)} · "
        f"{_e(record.seconds)} s · stopped: {_e(record.stop_reason)} · victims: {_e(victims)}"
    )
    expected = record.expected_verdict
    note = f" {_badge(Verdict.SKIP, f'expected {expected}')}" if expected else ""
    return (
        f'<article class="case" id="case-{number}" data-verdict="{_e(verdict)}" style="border-left-color:{border}">'
        f'<h3>{_badge(verdict, VERDICT_MEANING.get(verdict, verdict))}{note} <span class="mono">'
        f"{_e(record.nodeid)}</span></h3>"
        f"<p>{_e(record.summary)}</p>"
        f"<p><strong>root cause:</strong> {_e(_root_cause_text(record))}</p>"
        f'<p class="sub">{facts}</p>'
        f"{_rows(RANK_COLUMNS, _rank_rows(record))}{_stacks(record, number <= OPEN_STACKS)}{_warnings(record)}"
        f'<p class="sub mono">{_e(record.case_dir)}</p></article>'
    )


def _glance(failing: Sequence[CaseRecord]) -> str:
    """One line per failing case, each linking to its card below."""
    rows = []
    for number, r in enumerate(failing, start=1):
        rows.append(
            f'<tr><td>{_badge(r.verdict)}</td><td class="mono"><a href="#case-{number}">{_e(r.nodeid)}</a></td>'
            f"<td>{_e(r.env_name)}</td><td>{_e(_root_cause_text(r))}</td></tr>"
        )
    return (
        '<table class="list glance"><colgroup><col style="width:96px"><col style="width:42%">'
        '<col style="width:110px"><col></colgroup>'
        "<thead><tr><th>verdict</th><th>case</th><th>rung</th><th>root cause</th></tr>"
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _failures(facts: _Facts) -> str:
    rungs = {rung.name: i for i, rung in enumerate(facts.ladder)}
    failing = [r for r in facts.records if r.outcome in FAILURES]
    failing.sort(
        key=lambda r: (
            r.expected_verdict == r.verdict,  # negative controls that went as expected last
            FAILURES.index(r.outcome),  # hangs first, then wrong data, ... (``READING_ORDER``)
            rungs.get(str(r.env_name), len(rungs)),
            _natural_key(r.nodeid),
        )
    )
    parts = ['<section id="failures"><h2>Hangs, wrong data, crashes and errors</h2>']
    if not failing:
        parts.append('<p class="sub">None: every case passed or was skipped.</p>')
    else:
        parts.append(_glance(failing))
    parts.extend(_failure(r, number) for number, r in enumerate(failing, start=1))
    parts.append("</section>")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# ladder, recommendation, regressions
# --------------------------------------------------------------------------------------------


def _ladder_cell(here: list[CaseRecord]) -> str:
    if not here:
        return '<td class="sub">–</td>'
    passed = sum(1 for r in here if r.outcome is Verdict.PASS)
    css = "ok" if passed == len(here) else "bad" if passed == 0 else "partial"
    return f'<td class="{css}">{passed}/{len(here)}</td>'


def _ladder_table(facts: _Facts) -> str:
    ran = [r for r in facts.records if r.counts]
    parts = ['<section id="ladder"><h2>Link class x rung <span class="sub">(passed/run)</span></h2>']
    if not ran:
        parts.append('<p class="sub">No case ran.</p></section>')
        return "".join(parts)
    rungs = facts.rungs_of(ran)
    classes = sorted({link_class_of(r) for r in ran})
    first = first_passing_rungs(ran, facts.ladder)
    head = "".join(f"<th>{_e(name)}</th>" for name in rungs)
    rows = []
    for cls in classes:
        cells = "".join(
            _ladder_cell([r for r in ran if link_class_of(r) == cls and r.env_name == name]) for name in rungs
        )
        rung = first.get(cls)
        verdict = f"{_e(rung.name)}: {_e(rung_env_text(rung))}" if rung else "no rung passed"
        rows.append(f"<tr><th>{_e(cls)}</th>{cells}<td>{verdict}</td></tr>")
    parts.append(
        f'<table class="list"><thead><tr><th>class</th>{head}<th>first passing rung</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )
    return "".join(parts)


def _recommendation(lines: Sequence[str]) -> str:
    body = f"<pre>{_e(chr(10).join(lines))}</pre>" if lines else '<p class="sub">No recommendation given.</p>'
    return f'<section id="recommendation" class="rec"><h2>Recommendation</h2>{body}</section>'


def _regressions(regressions: Sequence[Mapping[str, object]]) -> str:
    if not regressions:
        return ""
    columns: list[str] = []
    for entry in regressions:
        columns.extend(str(k) for k in entry if str(k) not in columns)
    rows = [tuple(entry.get(c) for c in columns) for entry in regressions]
    return (
        f'<section id="regressions"><h2>Regressions against the baseline ({len(regressions)})</h2>'
        f"{_rows(columns, rows)}</section>"
    )


# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------


def render_report(
    run: Run, recommendation_lines: Sequence[str] = (), regressions: Sequence[Mapping[str, object]] = ()
) -> str:
    """The whole report as one HTML document (no script, no external reference)."""
    facts = _facts(run)
    title = f"conformance {run.run_id or run.source}" + (" (SIMULATED)" if facts.simulated else "")
    title += " (INCOMPLETE)" if run.facts.incomplete else ""
    body = "".join(
        (
            _header(facts),
            _machine(facts),
            _host_checks(facts),
            _grids(facts),
            _heat_maps(facts),
            _failures(facts),
            _ladder_table(facts),
            _recommendation(recommendation_lines),
            _regressions(regressions),
        )
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body><main>{body}</main></body></html>\n"
    )


def report_path(run: Run) -> Path:
    if run.folder is not None:
        return run.folder / REPORT_FILE
    source = Path(run.source)
    return (source if source.is_dir() else source.parent) / REPORT_FILE


def write_report(
    run: Run, recommendation_lines: Sequence[str] = (), regressions: Sequence[Mapping[str, object]] = ()
) -> Path:
    """Write ``report.html`` into the run folder; returns its path."""
    path = report_path(run)
    path.write_text(render_report(run, recommendation_lines, regressions), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# python -m conformance report
# --------------------------------------------------------------------------------------------
