"""The run's HTML report: one self-contained file, ``report.html`` in the run folder.

    python -m conformance report [RUN] [--reports-dir DIR]

Inline CSS only: no script, no font, image or style sheet fetched from anywhere, so the file can
be mailed, attached to a CI job or opened on an air-gapped box.  Sections, in order: the answer
(``conformance.summarise.answer``: what broke where and what to export), the machine (GPUs, link
matrix, versions, host, scenario), the host checks, a GPU x GPU verdict grid per pair probe and
rung, the bandwidth heat map of the pair probes, the hangs, wrong data, crashes and errors with
their root cause, stacks and NCCL warnings, the negative controls, the link class x rung table, the
recommendation and, when a baseline was compared, the regressions.

This module works out what each section shows (typed values; the device x device figures and the
run's facts they are drawn from are ``conformance.summarise.report_matrices``'s); the markup is in
the Jinja2 templates under ``templates/`` (autoescape on: every text from a record, the run facts
or the caller is escaped).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.common.casefiles import read_json
from conformance.common.files import write_atomic
from conformance.common.inputs import NO_JINJA2
from conformance.common.outside_text import shown_lines
from conformance.common.verdicts import FAILURES, SEVERITY, Verdict
from conformance.discover.topology import Topology
from conformance.record.records import HOST_SET_KIND, CaseRecord, RootCause
from conformance.record.runs import Run
from conformance.summarise.answer import Answer, Tone
from conformance.summarise.answer import answer as answer_of
from conformance.summarise.collectives import collective_rows
from conformance.summarise.compare import COMPARISON_FILE
from conformance.summarise.recommend import recommend
from conformance.summarise.report_matrices import (
    PAIR_PROBES,
    VERDICT_LETTERS,
    Cell,
    ReportFacts,
    as_text,
    heat_colour,
    heat_map,
    link_matrix,
    report_facts,
    verdict_class,
    verdict_grids,
)
from conformance.summarise.summary import (
    bad_nodes,
    deadlines_text,
    first_passing_rungs,
    link_class_of,
    record_counts,
    rung_env_text,
)

if TYPE_CHECKING:
    from jinja2 import Environment

REPORT_FILE = "report.html"
VERDICT_MEANING = {v.value: v.value for v in Verdict} | {
    "fail": "fail: wrong data", "crash": "crash (signal)", "error": "error (raised)"
}  # fmt: skip
OPEN_STACKS = 3  # failures whose stacks are shown unfolded; the rest fold (<details>)
DEVICE_COLUMNS = ("device", "NVML", "model", "UUID", "bus id", "NUMA", "memory", "MIG")


class ReportUnavailable(RuntimeError):
    """The HTML report cannot be made here: jinja2 is not installed (:data:`NO_JINJA2`)."""


@cache
def _templates() -> Environment:
    try:
        from jinja2 import Environment, PackageLoader, StrictUndefined
    except ImportError:
        raise ReportUnavailable(NO_JINJA2) from None
    templates = Environment(
        loader=PackageLoader("conformance.summarise", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_outside_text_shown,
    )
    templates.filters.update(text=as_text, vclass=verdict_class, meaning=lambda v: VERDICT_MEANING.get(v, v))
    return templates


def _outside_text_shown(value: object) -> object:
    """Every text a template prints, its control and bidi characters shown (autoescape handles HTML after)."""
    return shown_lines(value) if type(value) is str else value


# --------------------------------------------------------------------------------------------
# what the templates draw
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """A case that did not pass (with the others that failed alike), or a negative control as expected."""

    number: int
    record: CaseRecord  # the first case of its kind: its details are shown
    control: bool
    root_cause: str
    unfold: bool  # its stacks shown unfolded
    warnings: tuple[str, ...]
    alike: tuple[CaseRecord, ...] = ()  # the other cases that failed the same way (``_likeness``)

    @property
    def count(self) -> int:
        return 1 + len(self.alike)


@dataclass(frozen=True)
class LadderRow:
    name: str
    cells: tuple[Cell, ...]
    first: str


def _natural_key(text: str) -> tuple[str | int, ...]:
    """``gpu8`` before ``gpu10``: digit runs compare as numbers."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text)))


# --------------------------------------------------------------------------------------------
# header, answer and machine
# --------------------------------------------------------------------------------------------


def _counts(facts: ReportFacts) -> list[tuple[str, int]]:
    """(verdict, cases) in severity order; negative controls that ended as expected are not among them."""
    counts = Counter(r.verdict_text for r in facts.records if not r.ended_as_expected)
    known = [v.value for v in SEVERITY]
    return [(v, counts[v]) for v in [v for v in known if counts[v]] + sorted(set(counts) - set(known))]


def _answer_rows(found: Answer) -> list[tuple[str, Tone]]:
    """The answer's rows; the line of exports is shown as a block of its own (``Answer.exports``)."""
    return [(text, tone) for text, tone in found.rows() if not (found.exports and tone == "plain")]


def _version_rows(facts: ReportFacts) -> list[tuple[str, object]]:
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


def _device_rows(topology: Topology | None) -> list[tuple[object, ...]]:
    return [
        (d.name, d.nvml_index, d.model, d.uuid, d.pci_bus_id, d.numa_node,
         None if d.memory_mib is None else f"{d.memory_mib} MiB", "on" if d.mig else "off")
        for d in (topology.devices if topology else ())
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------
# failures and negative controls
# --------------------------------------------------------------------------------------------


def _root_cause_text(record: CaseRecord) -> str:
    root = record.root_cause
    if not isinstance(root, RootCause):
        return "not named"
    where = " ".join(str(p) for p in (root.phase, f"({root.step})" if root.step else None) if p)
    who = "no single rank" if root.rank is None else f"rank {root.rank}"
    device = next((str(e.device) for e in record.ranks if root.rank is not None and e.rank == root.rank), None)
    who += f" ({device})" if device else ""
    kind_text = f"{root.kind}: " if root.kind and root.kind != record.verdict_text else ""
    return f"{who}{' in ' + where if where else ''}: {kind_text}{root.message or ''}"


def _card(group: Sequence[CaseRecord], number: int) -> Card:
    record = group[0]
    nccl = record.nccl if isinstance(record.nccl, dict) else {}
    warnings = [*(record.nccl_warnings or ()), *(nccl.get("p2p_warnings") or [])]
    return Card(
        number=number,
        record=record,
        control=record.ended_as_expected,
        root_cause=_root_cause_text(record),
        unfold=number <= OPEN_STACKS,
        warnings=tuple(dict.fromkeys(str(w) for w in warnings)),
        alike=tuple(group[1:]),
    )


def _likeness(record: CaseRecord) -> tuple[str, ...]:
    """What makes two failures the same story: verdict, probe, rung, link class and what was said, devices aside."""
    said = f"{record.summary}|{_root_cause_text(record)}"
    for device in record.devices:
        said = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(str(device))}(?![A-Za-z0-9_])", "<device>", said)
    return (record.verdict_text, record.probe, str(record.env_name), link_class_of(record), str(record.node_rank), said)


def _grouped(records: Iterable[CaseRecord]) -> list[list[CaseRecord]]:
    """Records that failed alike, together, in the order the first of each came."""
    groups: dict[tuple[str, ...], list[CaseRecord]] = {}
    for record in records:
        groups.setdefault(_likeness(record), []).append(record)
    return list(groups.values())


def _cards(facts: ReportFacts) -> tuple[list[Card], list[Card]]:
    """The failures, hangs first (``READING_ORDER``), alike ones in one card; then the negative controls."""
    rungs = {rung.name: i for i, rung in enumerate(facts.ladder)}
    failing = [r for r in facts.records if r.outcome in FAILURES and not r.ended_as_expected]
    failing.sort(
        key=lambda r: (
            FAILURES.index(r.outcome or Verdict.ERROR),  # hangs first, then wrong data, ...
            rungs.get(str(r.env_name), len(rungs)),
            _natural_key(r.nodeid),
        )
    )
    controls = sorted((r for r in facts.records if r.ended_as_expected), key=lambda r: _natural_key(r.nodeid))
    groups = [*_grouped(failing), *([r] for r in controls)]
    cards = [_card(group, number) for number, group in enumerate(groups, start=1)]
    failures = len(groups) - len(controls)
    return cards[:failures], cards[failures:]


# --------------------------------------------------------------------------------------------
# ladder, regressions and the page
# --------------------------------------------------------------------------------------------


def _ladder(facts: ReportFacts) -> tuple[list[str], list[LadderRow]]:
    ran = [r for r in facts.records if r.counts]
    rungs = facts.rungs_of(ran)
    first = first_passing_rungs(ran, facts.ladder)
    rows = []
    for cls in sorted({link_class_of(r) for r in ran}):
        cells = []
        for name in rungs:
            here = [r for r in ran if link_class_of(r) == cls and r.env_name == name]
            passed = sum(1 for r in here if r.outcome is Verdict.PASS)
            css = "sub" if not here else "ok" if passed == len(here) else "bad" if passed == 0 else "partial"
            cells.append(Cell(css, f"{passed}/{len(here)}" if here else "–"))
        rung = first.get(cls)
        rows.append(LadderRow(cls, tuple(cells), f"{rung.name}: {rung_env_text(rung)}" if rung else "no rung passed"))
    return rungs, rows


@dataclass(frozen=True)
class Baseline:
    """The comparison kept with the run (``comparison.json``), as the report shows it."""

    lines: tuple[str, ...]
    regressions: tuple[Mapping[str, object], ...]


def kept_comparison(run: Run) -> Baseline | None:
    """The run's last comparison against a baseline, if one was kept in its folder (and is readable)."""
    data = read_json(run.folder / COMPARISON_FILE) if run.folder is not None else None
    if not isinstance(data, dict):
        return None
    lines, regressions = data.get("lines"), data.get("regressions")
    if not isinstance(lines, list) or not isinstance(regressions, list):
        return None
    return Baseline(tuple(str(line) for line in lines), tuple(r for r in regressions if isinstance(r, dict)))


def _slow(found: Answer, probe: str) -> set[frozenset[str]]:
    """The pairs the answer calls SLOW on ``probe`` (on any rung)."""
    return {frozenset(p.pair.split("-")) for p in found.slow if p.probe == probe}


def _regressions(regressions: Sequence[Mapping[str, object]]) -> tuple[list[str], list[tuple[object, ...]]]:
    columns: list[str] = []
    for entry in regressions:
        columns.extend(str(k) for k in entry if str(k) not in columns)
    return columns, [tuple(entry.get(c) for c in columns) for entry in regressions]


def _page(
    run: Run, found: Answer, recommendation_lines: Sequence[str], regressions: Sequence[Mapping[str, object]] | None
) -> dict[str, Any]:
    """Everything the templates show, by name; regressions None: the kept comparison's, if any."""
    facts = report_facts(run)
    baseline = kept_comparison(run) if regressions is None else Baseline((), tuple(regressions))
    failures, controls = _cards(facts)
    rungs, ladder = _ladder(facts)
    title = f"conformance {run.run_id or run.source}" + (" (SIMULATED)" if facts.simulated else "")
    heat = [(p, facts.pair_records(p)) for p in PAIR_PROBES]
    return {
        "title": title + (" (INCOMPLETE)" if run.facts.incomplete else ""),
        "run": run,
        "simulated": facts.simulated,
        "cases": record_counts(facts.records).text(),
        "deadlines": deadlines_text(facts.records, run.facts.step_deadline),
        "answer": found,
        "answer_rows": _answer_rows(found),
        "counts": _counts(facts),
        "controls": controls,
        "versions": _version_rows(facts),
        "links": link_matrix(facts.topology) if facts.topology and facts.topology.kind == "gpu" else None,
        "topology": facts.topology,
        "device_columns": DEVICE_COLUMNS,
        "device_rows": _device_rows(facts.topology),
        "device_names": facts.devices,
        "host_checks": sorted(
            (r for r in facts.records if r.set_kind == HOST_SET_KIND), key=lambda r: (r.node_rank or 0, r.nodeid)
        ),
        "grids": verdict_grids(facts),
        "verdict_legend": [(f"v-{v.value}", VERDICT_LETTERS[v], VERDICT_MEANING[v]) for v in SEVERITY],
        "heat_maps": [heat_map(facts, probe, records, _slow(found, probe)) for probe, records in heat if records],
        "heat_scale": (heat_colour(0.0)[0], heat_colour(1.0)[0]),
        "failures": failures,
        "rungs": rungs,
        "ladder": ladder,
        "recommendation": list(recommendation_lines),
        "regressions": _regressions(baseline.regressions) if baseline and baseline.regressions else None,
        "baseline_lines": baseline.lines if baseline else (),
        "collectives": collective_rows(facts.records),
    }


def render_report(
    run: Run,
    recommendation_lines: Sequence[str] = (),
    regressions: Sequence[Mapping[str, object]] | None = None,
    answer: Answer | None = None,
) -> str:
    """The whole report as one HTML document (no script, no external reference); ReportUnavailable without jinja2.

    ``answer``: the run's answer (``conformance.summarise.answer``); worked out here when not given.
    ``regressions``: None for those of the comparison kept with the run (``comparison.json``).
    """
    templates = _templates()  # ReportUnavailable, before any work, where jinja2 is missing
    answer = answer if answer is not None else answer_of(run, recommend(run))
    return templates.get_template("report.html.j2").render(_page(run, answer, recommendation_lines, regressions))


def report_path(run: Run) -> Path:
    if run.folder is not None:
        return run.folder / REPORT_FILE
    source = Path(run.source)
    return (source if source.is_dir() else source.parent) / REPORT_FILE


def write_report(
    run: Run,
    recommendation_lines: Sequence[str] = (),
    regressions: Sequence[Mapping[str, object]] | None = None,
    answer: Answer | None = None,
) -> Path:
    """Write ``report.html`` into the run folder; returns its path."""
    path = report_path(run)
    write_atomic(path, render_report(run, recommendation_lines, regressions, answer))
    return path
