"""The answer, first: per failing class, what broke where and what to set; one line when all passed.

``SYS pairs: HANG on inherited (16/16); passes with NCCL_P2P_LEVEL=NVL -> export NCCL_P2P_LEVEL=NVL``

The terminal summary and the HTML report open with it.  It reads the recommendation (the one
owner of which rung each class needs) and the run's records (what each class did on the first
rung it ran, the environment as the run found it unless the user's ladder says otherwise).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from conformance.common.verdicts import READING_ORDER, Verdict
from conformance.discover.watch import WatchFinding
from conformance.plan.matrix import Rung
from conformance.plan.transport import PCIE_PATHS, transport_surprise
from conformance.record.machine import MachineFacts
from conformance.record.records import HOST_SET_KIND, CaseRecord, HarnessError
from conformance.record.runs import Run
from conformance.summarise.bandwidth import (
    DEFAULT_SLOW_RATIO,
    SlowCauses,
    SlowPair,
    slow_causes,
    slow_lines,
    slow_pairs,
)
from conformance.summarise.causes import cause_lines, p2p_path_line
from conformance.summarise.network import network_warnings
from conformance.summarise.recommendation import ClassAdvice, Recommendation
from conformance.summarise.summary import (
    count_text,
    counted_cases,
    ladder_cases,
    link_class_of,
    no_nccl_failures,
    run_ladder,
    rung_env_text,
)
from conformance.summarise.watched import run_watch_findings
from conformance.verdict.machine_faults import MachineFault, machine_fault

Tone = Literal["bad", "good", "warn", "plain"]


@dataclass(frozen=True)
class ClassAnswer:
    """One class that did not pass as the run found the machine."""

    label: str  # "SYS pairs", "NET node pairs", "single sets"
    rung: str  # the first rung the class ran on
    verdicts: tuple[Verdict, ...]  # of the cases that did not pass there, in reading order
    probes: tuple[tuple[str, int, int], ...]  # (probe, cases that did not pass, cases) per probe that failed there
    fix: Rung | None  # the first rung on which every case of the class passed
    unfit: bool  # wrong data somewhere in the run: no setting is handed out
    tried: tuple[str, ...] = ()
    causes: tuple[str, ...] = ()  # what the verdict stage recognised, with its fix (``causes.py``)
    fault: MachineFault | None = None  # a fault of the machine no rung can change (``machine_faults.py``)

    @property
    def worst(self) -> Verdict:
        return self.verdicts[0] if self.verdicts else Verdict.PASS

    @property
    def machine_fault_only(self) -> bool:
        """It failed on a machine fault and no rung passed: the fault's one line names it."""
        return self.fault is not None and self.fix is None

    def text(self) -> str:
        verdicts = "/".join(v.value.upper() for v in self.verdicts)
        counts = ", ".join(f"{probe} {failed}/{ran}" for probe, failed, ran in self.probes)
        head = f"{self.label}: {verdicts} on {self.rung} ({counts})"
        if self.fix is None and self.fault is not None:
            return f"{head}; MACHINE FAULT, no setting changes it: {self.fault.name}"
        if self.fix is None:
            return f"{head}; no rung passed (tried {', '.join(self.tried)}): no setting fixes it"
        if self.unfit:
            return f"{head}; passes with {_setting_text(self.fix)}, but wrong data makes the machine NOT FIT: no export"
        return f"{head}; passes with {_setting_text(self.fix)} -> {rung_env_text(self.fix)}"


@dataclass(frozen=True)
class Answer:
    classes: tuple[ClassAnswer, ...]  # failing classes, worst first
    passed: tuple[str, ...]  # labels of the classes that passed as they are
    others: tuple[str, ...]  # failed checks outside any class (host checks), one line each
    exports: tuple[str, ...]  # the recommendation's shell lines, empty when withheld or nothing to set
    cases: int
    simulated: bool
    incomplete: str | None
    harness_errors: tuple[HarnessError, ...] = ()  # failed tests no record explains
    cpu_only: str | None = None  # why no GPU was tested, on a run of CPU ranks that is not a simulation
    not_tested: str | None = None  # why no GPU pair or multi-GPU set ran on a machine of several GPUs (MIG)
    slow: tuple[SlowPair, ...] = ()  # pairs far below the pairs like them or their link (``bandwidth.py``)
    slow_causes: SlowCauses = field(default_factory=SlowCauses)  # what the machine's facts say slows its links
    warnings: tuple[str, ...] = ()  # passing host checks' warnings (another user's processes on a GPU)
    watched: tuple[WatchFinding, ...] = ()  # what NVML saw during the run (``discover/watch.py``)
    failed_nodes: tuple[str, ...] = ()  # other nodes of the run that failed: the run failed here too
    store_problems: tuple[str, ...] = ()  # node 0: its store flooded by a client not of the run, or ended
    unwritten: tuple[str, ...] = ()  # what the run's end could not write ("run.json NOT written: <why>"): it fails
    unsigned: str | None = None  # why a run across nodes signed nothing (--unsigned): the answer opens with it

    @property
    def machine_watched(self) -> tuple[WatchFinding, ...]:
        """The watch's findings that fail the run (an application's Xid is a warning only)."""
        return tuple(f for f in self.watched if f.machine)

    def findings(self) -> tuple[tuple[str, str], ...]:
        """Failures no case's verdict holds, as (JUnit test name, message): SLOW pairs, the watch's faults."""
        slow = tuple((p.test_name, p.figure_text()) for p in self.slow)
        nodes = ((OTHER_NODES_TEST, self.failed_nodes_text),) if self.failed_nodes else ()
        store = tuple((STORE_TEST, f"{STORE_FAILED} {line}") for line in self.store_problems)
        unwritten = tuple((UNWRITTEN_TEST, line) for line in self.unwritten)
        return slow + tuple((f.test_name, f.text) for f in self.machine_watched) + nodes + store + unwritten

    @property
    def failed_nodes_text(self) -> str:
        return f"{FAILED_ELSEWHERE} {'; '.join(self.failed_nodes)}: a failed node fails the run on every node"

    @property
    def all_passed(self) -> bool:
        return (
            not self.classes
            and not self.others
            and not self.slow
            and not self.machine_watched
            and self.incomplete is None
            and not self.harness_errors
            and not self.failed_nodes
            and not self.store_problems
            and not self.unwritten
        )

    @property
    def tone(self) -> Tone:
        """The whole answer's: bad when anything failed, warn when the run is incomplete or tested no GPU."""
        if self.harness_errors or self.failed_nodes or self.store_problems or self.unwritten:
            return "bad"
        if self.incomplete is not None:
            return "warn"
        if self.all_passed:
            unsure = self.cpu_only is not None or self.not_tested is not None or self.unsigned is not None
            return "warn" if unsure else "good"
        return "bad"

    def rows(self) -> list[tuple[str, Tone]]:
        """The answer's lines with how each reads: bad (red), good (green), warn (yellow), plain."""
        first: list[tuple[str, Tone]] = [(unsigned_line(self.unsigned), "warn")] if self.unsigned else []
        first += [(line, "bad") for line in self.unwritten]
        if self.harness_errors:
            first.append((harness_error_line(self.harness_errors), "bad"))
        if self.failed_nodes:
            first.append((self.failed_nodes_text, "bad"))
        first += [(f"{STORE_FAILED} {line}", "bad") for line in self.store_problems]
        if self.cpu_only is not None and not (self.all_passed and not first):
            first.append((f"{CPU_ONLY} ({self.cpu_only})", "warn"))
        if self.not_tested is not None:
            first.append((f"{NOT_TESTED}: every GPU pair and multi-GPU set ({self.not_tested})", "warn"))
        first += [(line, "warn") for line in self.warnings]
        first += [(f"WARNING during the run: {f.text}", "warn") for f in self.watched if not f.machine]
        return first + self._verdict_rows()

    def _verdict_rows(self) -> list[tuple[str, Tone]]:
        if self.incomplete is not None:
            return [(f"INCOMPLETE RUN ({self.incomplete}): no answer from part of a run", "warn")]
        if self.unwritten and replace(self, unwritten=()).all_passed:
            cases = count_text(self.cases, "case")
            return [(f"every case passed ({cases}), but the run fails: what is NOT written above is lost", "bad")]
        if self.all_passed:
            cases, classes = count_text(self.cases, "case"), count_text(len(self.passed), "class")
            if self.cpu_only is not None:
                return [(f"{CPU_ONLY} ({self.cpu_only}): {cases} in {classes} passed on CPU ranks", "warn")]
            if self.not_tested is not None:
                return [(f"what could run passed: {cases} in {classes}; {NOT_TESTED.lower()} above", "warn")]
            return [(f"everything passed: {cases} in {classes}; nothing to set", "good")]
        # the machine's own faults first: a class that failed on a broken machine may be its victim
        rows: list[tuple[str, Tone]] = [(line, "bad") for line in self.others]
        rows += [(f"DURING THE RUN: {f.text}", "bad") for f in self.machine_watched]
        rows += [(line, "bad") for line in self._fault_lines()]
        rows += [(line, "bad") for line in slow_lines(self.slow, self.slow_causes)]
        # a class that failed only on a machine fault is named in that fault's one line: no line of its own
        rows += [(line, "bad") for c in self.classes if not c.machine_fault_only for line in (c.text(), *c.causes)]
        if self.passed and self.harness_errors:  # a test without a verdict may belong to any of them
            rows.append(
                (f"passed as their records say (see the HARNESS ERROR above): {', '.join(self.passed)}", "plain")
            )
        elif self.passed:
            rows.append((f"passed as they are: {', '.join(self.passed)}", "good"))
        if self.exports:
            rows.append((f"for every class together: {'; '.join(self.exports)}", "plain"))
        return rows

    def _fault_lines(self) -> list[str]:
        """One line per machine fault: the classes it failed and its fix (their lines name it only)."""
        classes: dict[MachineFault, list[str]] = {}
        for found in self.classes:
            if found.fault is not None and found.machine_fault_only:
                classes.setdefault(found.fault, []).append(found.label)
        return [
            f"MACHINE FAULT: {fault.name} in {count_text(len(labels), 'class')} ({', '.join(labels)}) "
            f"-> fix: {fault.fix}"
            for fault, labels in classes.items()
        ]

    def lines(self) -> list[str]:
        return [text for text, _ in self.rows()]


CPU_ONLY = "CPU ONLY: no GPU was tested"
NOT_TESTED = "NOT TESTED"
UNSIGNED = "UNSIGNED"
FAILED_ELSEWHERE = "RUN FAILED on another node:"
OTHER_NODES_TEST = "other nodes of the run"  # the JUnit test case a failed node fails on every node
STORE_FAILED = "RUN FAILED:"  # node 0's store problems, each saying what happened to the store
STORE_TEST = "the run's store"  # the JUnit test case node 0's store problems fail on node 0
UNWRITTEN_TEST = "the run's files"  # the JUnit test case a file the run's end could not write fails
NO_NCCL_FIX = (
    "CUDA's own P2P between these GPUs: check the IOMMU (`iommu=pt` or off) and ACS on the PCIe switches above "
    "them (`lspci -vvv | grep ACSCtl`), the driver version, and run `p2pBandwidthLatencyTest` from cuda-samples"
)
HARNESS_ERRORS_NAMED = 3  # the answer's line names this many failed tests, then counts the rest


def unsigned_line(why: str) -> str:
    """The warning of a run across nodes that signed nothing: what any client of node 0's port could do."""
    return (
        f"{UNSIGNED}: the nodes' values were not signed ({why}): any client that reached node 0's port could have "
        "changed a node's results or exit status; give every node the same run token (python -m conformance token)"
    )


def harness_error_line(errors: Sequence[HarnessError]) -> str:
    """``HARNESS ERROR in 2 test(s): <test> (<when>: <message>); ...``: no answer can be read from them."""
    named = "; ".join(e.text for e in errors[:HARNESS_ERRORS_NAMED])
    more = f"; and {len(errors) - HARNESS_ERRORS_NAMED} more" if len(errors) > HARNESS_ERRORS_NAMED else ""
    return (
        f"HARNESS ERROR in {len(errors)} test(s): {named}{more}: no verdict on the machine can be read from them, "
        "so no recommendation is handed out"
    )


def _setting_text(rung: Rung) -> str:
    if rung.unset_families:
        return rung_env_text(rung)
    return " ".join(f"{k}={v}" for k, v in sorted(rung.set.items())) or rung.name


def class_label(record: CaseRecord) -> str:
    kind = record.set_kind or "all"
    suffix = {"pair": "pairs", "node_pair": "node pairs"}.get(kind, "sets")
    return f"{link_class_of(record)} {suffix}"


def _class_answer(
    advice: ClassAdvice, records: list[CaseRecord], order: dict[str, int], unfit: bool, machine: MachineFacts
) -> ClassAnswer:
    first = min((r.env_name or "" for r in records), key=lambda name: order.get(name, len(order)))
    there = [r for r in records if r.env_name == first]
    failed = [r for r in there if r.outcome is not None and r.outcome.failed]
    ran = Counter(r.probe for r in there)
    failed_by_probe = Counter(r.probe for r in failed)
    return ClassAnswer(
        label=class_label(records[0]),
        rung=first,
        verdicts=tuple(v for v in READING_ORDER if any(r.outcome is v for r in failed)),
        probes=tuple((probe, n, ran[probe]) for probe, n in sorted(failed_by_probe.items())),
        fix=advice.rung,
        unfit=unfit,
        tried=advice.tried,
        causes=(*cause_lines(failed), *filter(None, [p2p_path_line(failed, machine)])),
        fault=next((f for r in failed if (f := machine_fault(r.verdict_text, r.summary)) is not None), None),
    )


def _outside_classes(records: Sequence[CaseRecord]) -> tuple[str, ...]:
    """Failed checks of the machine that no class holds: the host checks."""
    return tuple(
        f"host check {r.probe}: {r.verdict_text.upper()}: {r.summary}"
        for r in records
        if r.set_kind == HOST_SET_KIND and r.outcome is not None and r.outcome.failed and r.expected_verdict is None
    )


def _no_nccl_lines(failed: Sequence[CaseRecord], machine: MachineFacts) -> tuple[str, ...]:
    """One line per class and probe that uses no NCCL and failed: the machine's fault, whatever NCCL does.

    A peer copy is CUDA's own (``tensor.to(peer)``): no NCCL variable changes it, so it ran once and
    its class's NCCL answer stands apart; a hang or wrong data over PCIe is CUDA's P2P data path.
    """
    by_place: dict[tuple[str, str], list[CaseRecord]] = {}
    for r in failed:
        by_place.setdefault((class_label(r), r.probe), []).append(r)
    lines = []
    for (label, probe), records in by_place.items():
        verdicts = "/".join(v.value.upper() for v in READING_ORDER if any(r.outcome is v for r in records))
        redirected = machine.iommu.redirects_p2p and any(r.link in PCIE_PATHS for r in records)
        fault = next((f for r in records if (f := machine_fault(r.verdict_text, r.summary))), None)
        fix = fault.fix if fault else machine.p2p_fix if redirected else NO_NCCL_FIX  # a named fault's fix is its own
        facts = f" ({machine.iommu.cause_text()})" if redirected and not fault else ""
        lines.append(
            f"MACHINE FAULT: {probe} uses no NCCL and did not pass on {label}: {verdicts} in {len(records)} "
            f"({records[0].summary}){facts}; no NCCL setting changes it -> fix: {fix}"
        )
    return tuple(lines)


def _host_warnings(records: Sequence[CaseRecord]) -> tuple[str, ...]:
    """``WARNING host check host:<name>: <text>`` for each passing host check that left a warning."""
    return tuple(
        f"WARNING host check {r.probe}: {r.metrics['warning']}"
        for r in records
        if r.set_kind == HOST_SET_KIND and r.outcome is Verdict.PASS and isinstance(r.metrics.get("warning"), str)
    )


def _transport_warnings(records: Sequence[CaseRecord]) -> tuple[str, ...]:
    """One warning per distinct disagreement between the transport predicted and the one NCCL logged."""
    found: dict[str, str] = {}
    for r in records:
        surprise = transport_surprise(r.predicted, r.transports)
        if surprise:
            found.setdefault(surprise, f"{r.probe}[{'-'.join(r.devices)}] on {r.env_name}")
    return tuple(
        f"WARNING transport: {surprise} ({case}): the ladder chose its rungs by the prediction"
        for surprise, case in found.items()
    )


def answer(run: Run, recommendation: Recommendation) -> Answer:
    ladder = run_ladder(run)
    order = {r.name: i for i, r in enumerate(ladder)}
    counted = counted_cases(run.records)
    by_class: dict[str, list[CaseRecord]] = {}
    for r in ladder_cases(run.records):
        by_class.setdefault(link_class_of(r), []).append(r)
    failing, passed = [], []
    for advice in recommendation.classes:
        records = by_class[advice.name]
        found = _class_answer(advice, records, order, recommendation.unfit, run.machine)
        if found.verdicts:
            failing.append(found)
        else:
            passed.append(found.label)
    failing.sort(key=lambda c: (c.fault is None, READING_ORDER.index(c.worst), c.label))  # machine faults first
    return Answer(
        classes=tuple(failing),
        passed=tuple(passed),
        others=_outside_classes(run.usable_records) + _no_nccl_lines(no_nccl_failures(run.records), run.machine),
        exports=tuple(recommendation.exports()),
        cases=len(counted),
        simulated=run.simulated,
        incomplete=recommendation.incomplete,
        harness_errors=recommendation.harness_errors,
        cpu_only=run.facts.cpu_only,
        not_tested=run.facts.not_tested,
        slow=tuple(slow_pairs(counted, run.facts.slow_ratio or DEFAULT_SLOW_RATIO, run.facts.bandwidth_floors)),
        slow_causes=slow_causes(run.machine),
        warnings=(
            *([f"WARNING {run.facts.nccl_warning}"] if run.facts.nccl_warning else []),
            *(f"WARNING {skipped}" for skipped in run.warnings),  # lines of results.jsonl not read, each named
            *_host_warnings(run.usable_records),
            *_transport_warnings(counted),
            *network_warnings(run.usable_records, run.machine.rdma),
        ),
        watched=tuple(run_watch_findings(run)),
        failed_nodes=run.facts.failed_nodes,
        store_problems=run.facts.store_problems,
        unsigned=run.facts.unsigned,
    )
