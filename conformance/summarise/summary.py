"""The terminal summary, and what every reader of a run shares: its ladder, a case, a link class.

The terminal summary: worst cases first, probe x verdict counts, and the ladder per link class.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from conformance.common.shell_text import export_line
from conformance.common.verdicts import READING_ORDER, Verdict
from conformance.plan.matrix import BUILTIN_LADDER, INHERITED, Rung
from conformance.record.records import HOST_SET_KIND, CaseRecord, RunEnd
from conformance.record.runs import Run


def case_of(record: CaseRecord) -> str:
    """The case a record is of, whatever rung it ran on: its ladder key, else its node id."""
    return record.ladder_key or record.nodeid


def one_record_per_case(records: Iterable[CaseRecord]) -> list[CaseRecord]:
    """A cross-node case leaves one record on each of its nodes; count it once (its lowest node's there).

    A node's own run folder holds only its records: each of its cross-node cases then counts once too.
    """
    kept: dict[tuple[str | None, str | int], CaseRecord] = {}
    for index, r in enumerate(records):
        key: tuple[str | None, str | int] = (r.run_id, r.nodeid) if r.nodes else (None, index)
        if key not in kept or (r.node_rank or 0) < (kept[key].node_rank or 0):
            kept[key] = r
    return list(kept.values())


def counted_cases(records: Iterable[CaseRecord]) -> list[CaseRecord]:
    """The cases the answer and the recommendation count: run on a rung, not skipped, no negative control."""
    return one_record_per_case(r for r in records if r.counts)


def ladder_cases(records: Iterable[CaseRecord]) -> list[CaseRecord]:
    """The counted cases whose class climbs the ladder: those of probes that use NCCL (not a peer copy)."""
    return [r for r in counted_cases(records) if not r.no_nccl]


def no_nccl_failures(records: Iterable[CaseRecord]) -> list[CaseRecord]:
    """Counted cases of probes that use no NCCL and did not pass: faults of the machine, no rung's."""
    return [r for r in counted_cases(records) if r.no_nccl and r.outcome is not None and r.outcome.failed]


@dataclass(frozen=True)
class RecordCounts:
    """A run's records, each counted once, in the words every summary uses.

    pytest counts tests (items), a later rung not needed among its deselected ones and a test that
    does not apply here (one GPU, one node) among its skips; a test that ran a case or a host check
    left a record.  ``cases`` is the number the answer gives; host checks, skipped records and
    negative controls are counted apart.
    """

    cases: int
    host_checks: int
    skipped: int
    controls: int

    def text(self) -> str:
        parts = [count_text(self.cases, "case"), count_text(self.host_checks, "host check"), f"{self.skipped} skipped"]
        return ", ".join(parts + ([count_text(self.controls, "negative control")] if self.controls else []))


def count_text(n: int, noun: str) -> str:
    """``1 case``, ``3 cases``, ``2 classes``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def record_counts(records: Sequence[CaseRecord]) -> RecordCounts:
    return RecordCounts(
        cases=len(counted_cases(records)),
        host_checks=sum(r.set_kind == HOST_SET_KIND and r.outcome is not Verdict.SKIP for r in records),
        skipped=sum(r.outcome is Verdict.SKIP for r in records),
        controls=sum(r.expected_verdict is not None for r in records),
    )


@dataclass(frozen=True)
class Tally:
    """pytest's tests in the suite's words (docs/after-a-run.md, "Tests, cases, host checks").

    A test is what pytest counts; a case is a test that ran a probe on a device set on a rung (what
    the answer counts); a host check is a test of the machine itself; a negative control proves the
    harness catches a failure.  Tests with no record were skipped before they ran anything (a
    multi-node test on one node).  Deselected tests are apart, as pytest counts them.
    """

    tests: int  # pytest's count on this node: its last line's outcomes, deselected apart
    cases: int
    skipped_cases: int
    host_checks: int
    controls: int
    deselected: int = 0
    not_needed: int = 0  # of the deselected: fallback-rung tests no class needed
    node: int | None = None  # on a run of several nodes: this node's tests only

    def text(self) -> str:
        """``tests: pytest's 52 = 27 cases + 19 host checks + 1 negative control + 5 skipped with no record``."""
        no_record = self.tests - self.cases - self.skipped_cases - self.host_checks - self.controls
        parts = [count_text(self.cases, "case")]
        parts += [f"{self.skipped_cases} skipped cases"] if self.skipped_cases else []
        parts += [count_text(self.host_checks, "host check")] if self.host_checks else []
        parts += [count_text(self.controls, "negative control")] if self.controls else []
        parts += [f"{no_record} skipped with no record (not for this run)"] if no_record > 0 else []
        where = f" on node {self.node}" if self.node is not None else ""
        line = f"tests: pytest's {self.tests}{where} = {' + '.join(parts)}"
        if self.deselected:
            by_user = self.deselected - self.not_needed
            why = [f"{self.not_needed} on fallback rungs no class needed"] if self.not_needed else []
            why += [f"{by_user} by -k/-m or another plugin"] if by_user > 0 else []
            line += f"; {self.deselected} deselected ({', '.join(why)})"
        return line


def tally(own: Sequence[CaseRecord], end: RunEnd | None, node: int | None = None) -> Tally | None:
    """The tests of the node in the suite's words: its own records and pytest's counts (None: not kept, older runs).

    ``node``: this node's rank on a run of several nodes (its pytest counts its own tests only).
    """
    if end is None or end.tests is None:
        return None
    controls = sum(r.expected_verdict is not None for r in own)
    cases = [r for r in own if r.set_kind != HOST_SET_KIND and r.expected_verdict is None]
    skipped = sum(r.outcome is Verdict.SKIP for r in cases)
    return Tally(
        tests=sum(n for outcome, n in end.tests.items() if outcome != "deselected"),
        cases=len(cases) - skipped, skipped_cases=skipped, controls=controls,
        host_checks=sum(r.set_kind == HOST_SET_KIND for r in own),
        deselected=end.tests.get("deselected", 0), not_needed=end.not_needed or 0, node=node,
    )  # fmt: skip


def node_records(records: Iterable[CaseRecord], node: int | None) -> list[CaseRecord]:
    """The records one node wrote (``None``: node 0, or a run of one node); node 0's folder holds every node's."""
    return [r for r in records if (r.node_rank or 0) == (node or 0)]


def link_class_of(record: CaseRecord) -> str:
    """Pairs (of devices, of nodes: NET) by link class; other sets by their kind (all, single, ...)."""
    kind = record.set_kind or "all"
    return str(record.link or "?") if kind in ("pair", "node_pair") else kind


def run_ladder(run: Run) -> tuple[Rung, ...]:
    """The run's rungs (``run.json``: ``ladder``), else the built-in ladder; then rungs only records name."""
    written = run.facts.ladder
    ladder = list(BUILTIN_LADDER) if written is None else [Rung(r.name, dict(r.set), r.unset_families) for r in written]
    known = {r.name for r in ladder}
    for record in run.records:
        name = record.env_name
        if isinstance(name, str) and name not in known:
            found = {k: v for k, v in record.env.items() if isinstance(v, str)}
            ladder.append(Rung(name, found, description="only named by the records"))
            known.add(name)
    return tuple(ladder)


@dataclass(frozen=True)
class BadNode:
    node: int
    failed_with: tuple[int, ...]  # nodes known good (each passed with another node) it failed with

    @property
    def text(self) -> str:
        partners = ", ".join(f"node {n}" for n in self.failed_with)
        return f"node {self.node}: failed with {partners}, each of which passed with another node, and passed with none"


def bad_nodes(records: Iterable[CaseRecord]) -> list[BadNode]:
    """Nodes that are bad, not only in a bad pair: each failed with a node known good and passed with none.

    From the node pairs of every pass on the first rung (the environment as it is).  A pair that
    failed between two nodes that each passed with others is their link, and names neither.
    """
    pairs = [
        (r.nodes, r.outcome)
        for r in records
        if r.set_kind == "node_pair" and r.env_name == INHERITED.name and r.nodes and len(r.nodes) == 2
    ]
    good = {node for nodes, outcome in pairs if outcome is Verdict.PASS for node in nodes}
    failed_with: dict[int, set[int]] = {}
    for (a, b), outcome in pairs:
        if outcome not in (Verdict.PASS, Verdict.SKIP):
            for node, other in ((a, b), (b, a)):
                if other in good:
                    failed_with.setdefault(node, set()).add(other)
    return [BadNode(node, tuple(sorted(others))) for node, others in sorted(failed_with.items()) if node not in good]


TOTAL_ROW = "total (cases + host checks)"  # records, not tests: the tally line above the answer gives pytest's


def summary_lines(records: list[CaseRecord]) -> list[tuple[str, bool]]:
    """Bad nodes, hangs and wrong data first (each marked bad), then probe x verdict counts.

    The counts show only the verdicts some case had: a healthy run shows no error column.
    """
    lines = [(f"BAD NODE {bad.text}", True) for bad in bad_nodes(records)]
    worst = [r for r in records if r.outcome in (Verdict.HANG, Verdict.FAIL) and not r.ended_as_expected]
    for r in sorted(worst, key=lambda r: (r.outcome is not Verdict.HANG, r.nodeid)):
        lines.append((f"{r.verdict_text.upper():5} {r.nodeid}: {r.summary}", True))
    # A negative control that ended as its test expected is the suite checking itself, not an error here.
    controls = [r for r in records if r.ended_as_expected]
    counted = [r for r in records if not r.ended_as_expected]
    by_probe: dict[str, Counter[Verdict | None]] = {}
    for r in counted:
        by_probe.setdefault(r.probe, Counter())[r.outcome] += 1
    total = Counter(r.outcome for r in counted)
    shown = [v for v in READING_ORDER if total[v]]
    width = max(len("probe"), len(TOTAL_ROW), *(len(p) for p in by_probe))
    table = ["probe".ljust(width) + "".join(f"{v.value:>{len(v.value) + 2}}" for v in shown)]
    for probe, counts in [*sorted(by_probe.items()), (TOTAL_ROW, total)]:
        table.append(probe.ljust(width) + "".join(f"{counts.get(v, 0):>{len(v.value) + 2}}" for v in shown))
    lines += [(line, False) for line in table]
    if controls:
        ended = ", ".join(sorted({r.verdict_text for r in controls}))
        lines.append(
            (f"negative controls: {len(controls)} ended as their tests expected ({ended}); not counted above", False)
        )
    return lines


def first_passing_rungs(records: list[CaseRecord], ladder: Sequence[Rung]) -> dict[str, Rung | None]:
    """Per class: the earliest rung at which every case of the class had passed (None: never).

    A case its test runs on one rung only (``CaseRecord.one_rung``) was never offered the others, so
    it decides nothing where the class has cases that climb the ladder: the whole suite and any part
    of it give a class the same rung.
    """
    order = {r.name: i for i, r in enumerate(ladder)}
    climbing = {link_class_of(r) for r in records if not r.one_rung}
    per_case: dict[tuple[str, str], int | None] = {}
    for r in records:
        if r.one_rung and link_class_of(r) in climbing:
            continue
        key = (link_class_of(r), case_of(r))
        best = per_case.setdefault(key, None)
        if r.outcome is Verdict.PASS:
            index = order.get(r.env_name or "", 0)
            per_case[key] = index if best is None else min(best, index)
    by_class: dict[str, list[int | None]] = {}
    for (cls, _), first in per_case.items():
        by_class.setdefault(cls, []).append(first)
    return {
        cls: None if None in indices else ladder[max(i for i in indices if i is not None)]
        for cls, indices in sorted(by_class.items())
    }


def rung_env_text(rung: Rung) -> str:
    if rung.unset_families:
        return f"unset every {'/'.join(f + '*' for f in rung.unset_families)} variable"
    if not rung.set:
        return "nothing to set: the environment as it is"
    lines = [export_line(k, v) for k, v in sorted(rung.set.items())]
    return " ".join(sorted(lines, key=lambda line: line.startswith("#")))  # a comment, last, ends the line


def ladder_summary_lines(records: list[CaseRecord], ladder: Sequence[Rung], step_deadline: float) -> list[str]:
    """Link class x rung pass/total, the first passing rung per class, and the deadlines paid."""
    ran = [r for r in records if r.counts]
    order = [r.name for r in ladder]
    rungs = [name for name in order if any(r.env_name == name for r in ran)]
    classes = sorted({link_class_of(r) for r in ran})
    if not ran:
        return []
    width = max(len("class"), *(len(c) for c in classes))
    lines = ["link class x rung (passed/run)", "class".ljust(width) + "".join(f"{n:>{len(n) + 2}}" for n in rungs)]
    for cls in classes:
        cells = []
        for name in rungs:
            here = [r for r in ran if link_class_of(r) == cls and r.env_name == name]
            passed = sum(r.outcome is Verdict.PASS for r in here)
            cells.append(f"{f'{passed}/{len(here)}' if here else '-':>{len(name) + 2}}")
        lines.append(cls.ljust(width) + "".join(cells))
    by_rung: dict[str, list[str]] = {}
    for cls, rung in first_passing_rungs(ran, ladder).items():
        by_rung.setdefault(rung.name if rung else "", []).append(cls)
    for name in [*order, ""]:
        if name in by_rung:
            classes_here = ", ".join(by_rung[name])
            if name:
                rung = ladder[order.index(name)]
                lines.append(f"{classes_here}: first passing rung {name}: {rung_env_text(rung)}")
            else:
                lines.append(f"{classes_here}: no rung passed")
    lines.append(deadlines_text(records, step_deadline))
    return lines


def deadlines_text(records: Iterable[CaseRecord], step_deadline: float | None = None) -> str:
    """Deadlines the run paid (a step that stalled, a case past its limit) and hangs confirmed sooner."""
    stops = Counter(r.stop_reason for r in records)
    notes = [f"step deadline {step_deadline:g}s"] if step_deadline is not None else []
    if stops["deadline"]:
        notes.append(f"{stops['deadline']} at the whole-case limit")
    detail = f" ({'; '.join(notes)})" if notes else ""
    sooner = [f"{stops['confirm']} stuck where their class hung"] if stops["confirm"] else []
    sooner += [f"{stops['small_step']} stuck in a small step"] if stops["small_step"] else []
    also = f"; {stops['confirm'] + stops['small_step']} hang(s) confirmed sooner: {', '.join(sooner)}" if sooner else ""
    return f"deadlines paid: {stops['stalled'] + stops['deadline']}{detail}{also}"
