"""The report's device x device figures, and the run as every section of the report reads it.

The machine's link matrix (link classes as ``nvidia-smi topo -m`` shows them), a GPU x GPU verdict
grid per pair probe and rung, and the bandwidth heat map of each pair probe: the cells the Jinja2
templates draw (``conformance.summarise.report`` puts the page together and writes it).
``ReportFacts`` is the run with what every section needs worked out once: its topology, its devices
in order, its ladder and one record per case.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from conformance.common.verdicts import SEVERITY, Verdict, worst
from conformance.discover.topology import Topology
from conformance.plan.matrix import Rung
from conformance.record.records import CaseRecord
from conformance.record.runs import Run
from conformance.summarise.bandwidth import link_gbps
from conformance.summarise.summary import one_record_per_case, run_ladder

PAIR_PROBES = ("pair_exchange", "peer_copy")
VERDICT_LETTERS = {v.value: v.value[0].upper() for v in Verdict}  # P, F, H, C, E, I, S
HOST_COPIES = "CPU gloo: host memory copies, not a GPU link measurement"
DENSE_FROM = 10  # devices; more get the dense matrix cells
HEAT_LOW = (239, 246, 255)  # bandwidth colour at 0 ...
HEAT_HIGH = (8, 69, 148)  # ... and at the run's maximum
LINK_CSS = {"PIX": "l-pix", "PXB": "l-pxb", "PHB": "l-phb", "NODE": "l-node", "SYS": "l-sys"}


def as_text(value: object) -> str:
    """Any value as text (escaped by the template); None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def verdict_class(verdict: str) -> str:
    return f"v-{verdict}" if verdict in VERDICT_LETTERS else "v-unknown"


# --------------------------------------------------------------------------------------------
# what the templates draw
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    css: str = ""
    text: str = ""
    title: str = ""
    style: str = ""


@dataclass(frozen=True)
class MatrixRow:
    short: str
    name: str
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Matrix:
    """An n x n table of devices (short headers; the full name is the title)."""

    css: str
    heads: tuple[tuple[str, str], ...]  # (short, full name)
    rows: tuple[MatrixRow, ...]


@dataclass(frozen=True)
class Figure:
    """A verdict grid (one probe on one rung) or a bandwidth heat map (one probe)."""

    probe: str
    rung: str
    sub: str
    matrix: Matrix
    note: str = ""


@dataclass
class ReportFacts:
    """The run, with what every section needs worked out once."""

    run: Run
    topology: Topology | None
    devices: list[str]  # names, in device order (gpu0, gpu1, ...)
    ladder: tuple[Rung, ...]  # the run's ladder, then rungs seen in records only (``summary.run_ladder``)
    records: list[CaseRecord]

    @property
    def simulated(self) -> bool:
        return self.run.facts.simulated or any(r.simulated for r in self.records)

    @property
    def measured(self) -> list[CaseRecord]:
        """The records that say something about the machine: no negative control."""
        return [r for r in self.records if r.expected_verdict is None]

    def rungs_of(self, records: Iterable[CaseRecord]) -> list[str]:
        seen = {r.env_name for r in records}
        return [rung.name for rung in self.ladder if rung.name in seen]

    def pair_records(self, probe: str) -> list[CaseRecord]:
        return [r for r in self.measured if r.probe == probe and _pair(r)]


def _natural(name: str) -> tuple[str, int]:
    match = re.fullmatch(r"(.*?)(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else (name, -1)


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


def _matrix(names: Sequence[str], cell: Callable[[str, str], Cell], css: str) -> Matrix:
    """``cell(a, b)`` gives every cell; from ``DENSE_FROM`` devices on the cells are smaller."""
    rows = tuple(MatrixRow(_short(a), a, tuple(cell(a, b) for b in names)) for a in names)
    dense = " dense" if len(names) > DENSE_FROM else ""
    return Matrix(css + dense, tuple((_short(n), n) for n in names), rows)


def report_facts(run: Run) -> ReportFacts:
    topology = run.machine.topology
    names = [d.name for d in topology.devices] if topology else []
    seen = {str(name) for r in run.records for name in r.devices}
    devices = names + sorted(seen - set(names), key=_natural)
    return ReportFacts(run, topology, devices, run_ladder(run), one_record_per_case(run.records))


# --------------------------------------------------------------------------------------------
# the link matrix
# --------------------------------------------------------------------------------------------


def link_matrix(topology: Topology) -> Matrix:
    """The link classes as ``nvidia-smi topo -m`` shows them, each class tinted, then the NUMA node."""
    by_name = {d.name: d for d in topology.devices}

    def cell(a: str, b: str) -> Cell:
        if a == b:
            return Cell("diag", "X")
        link = topology.link(by_name[a], by_name[b])
        css = "l-nv" if link.startswith("NV") else LINK_CSS.get(link, "l-other")
        return Cell(css, link, f"{a}-{b}: {link}")

    matrix = _matrix(list(by_name), cell, "m links")
    rows = tuple(
        MatrixRow(row.short, row.name, (*row.cells, Cell("", as_text(_numa(by_name[row.name].numa_node)))))
        for row in matrix.rows
    )
    return Matrix(matrix.css, (*matrix.heads, ("NUMA", "NUMA node")), rows)


def _numa(node: int | None) -> object:
    return "N/A" if node is None else node


# --------------------------------------------------------------------------------------------
# verdict grids and bandwidth heat maps
# --------------------------------------------------------------------------------------------


def _verdict_grid(facts: ReportFacts, probe: str, rung: str, records: list[CaseRecord]) -> Figure:
    pairs = _by_pair(records)

    def cell(a: str, b: str) -> Cell:
        here = pairs.get(frozenset((a, b)))
        if a == b:
            return Cell("diag", "·")
        if not here:
            return Cell("v-untested", "", f"{a}-{b}: not run on this rung")
        record = min(here, key=lambda r: SEVERITY.index(r.outcome or Verdict.ERROR))  # the worst
        title = f"{a}-{b} {record.link or ''}: {record.verdict_text}: {record.summary or ''}"
        return Cell(verdict_class(record.verdict_text), VERDICT_LETTERS.get(record.verdict_text, "?"), title)

    passed = sum(1 for group in pairs.values() if worst(r.verdict_text for r in group) is Verdict.PASS)
    return Figure(probe, rung, f"{passed}/{len(pairs)} pairs pass", _matrix(facts.devices, cell, "m"))


def verdict_grids(facts: ReportFacts) -> list[tuple[str, list[Figure]]]:
    groups = []
    for probe in PAIR_PROBES:
        records = facts.pair_records(probe)
        rungs = facts.rungs_of(records)
        if rungs:
            grids = [_verdict_grid(facts, probe, r, [x for x in records if x.env_name == r]) for r in rungs]
            groups.append((probe, grids))
    return groups


def _bandwidth(record: CaseRecord) -> float | None:
    value = record.bandwidth_gbps
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bw_text(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def heat_colour(ratio: float) -> tuple[str, str]:
    """Background and text colour for a value at ``ratio`` of the maximum."""
    ratio = min(max(ratio, 0.0), 1.0)
    rgb = tuple(round(lo + (hi - lo) * ratio) for lo, hi in zip(HEAT_LOW, HEAT_HIGH, strict=True))
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})", "#fff" if ratio > 0.5 else "#1b1f24"


def _host_copies(facts: ReportFacts, records: Iterable[CaseRecord]) -> bool:
    """Bandwidth measured by gloo on CPU: host memory copies, whatever links the (simulated) GPUs have."""
    cpu = facts.topology is not None and facts.topology.kind == "cpu"
    return cpu or facts.run.facts.backend == "gloo" or any(r.backend == "gloo" for r in records)


def heat_map(facts: ReportFacts, probe: str, records: list[CaseRecord], slow: Collection[frozenset[str]]) -> Figure:
    """One probe's best passing figure per pair; a SLOW pair (``bandwidth.py``) outlined in red."""
    passing = (r for r in records if r.outcome is Verdict.PASS and _bandwidth(r) is not None)
    best = {pair: max(group, key=lambda r: _bandwidth(r) or 0.0) for pair, group in _by_pair(passing).items()}
    top = max((_bandwidth(r) or 0.0 for r in best.values()), default=0.0)

    def cell(a: str, b: str) -> Cell:
        record = best.get(frozenset((a, b)))
        if a == b:
            return Cell("diag", "·")
        if record is None:
            return Cell("bw-none", "–", f"{a}-{b}: no passing measurement")
        value = _bandwidth(record) or 0.0
        background, colour = heat_colour(value / top if top > 0 else 0.0)
        css = "bw" if record.env_name == "inherited" else "bw alt"
        title = f"{a}-{b} {record.link or ''}: {value:g} GB/s on rung {record.env_name}"
        rate = link_gbps(record)
        title += f"; its link's physical rate {rate:g} GB/s" if rate else ""
        if frozenset((a, b)) in slow:
            css, title = f"{css} slow", f"SLOW: {title}"
        return Cell(css, _bw_text(value), title, f"background:{background};color:{colour}")

    note = HOST_COPIES if _host_copies(facts, records) else ""
    return Figure(probe, "", f"GB/s, max {_bw_text(top)}", _matrix(facts.devices, cell, "m wide"), note)
