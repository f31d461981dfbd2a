"""A run's results in Prometheus' text exposition format, as node_exporter's textfile collector reads it.

    pytest suites/ --metrics-file /var/lib/node_exporter/textfile_collector/gpu_conformance.prom

Every metric is a gauge named ``gpu_conformance_*`` (docs/after-a-run.md lists them with their
labels).  By default the series are bounded by the machine, never by the tests: the run, the tests
by pytest's outcome, the cases by verdict, each class, each GPU pair, each link class, each
collective on the whole device set, each host check.  An 8-GPU node writes at most
:data:`SERIES_BOUND_8_GPUS` series (``series_bound``), a fleet of 1,000 such nodes about 140,000,
whatever the ladder or the sizes.  ``--metrics-per-case`` adds a series per case (about 500 on an
8-GPU node, the pytest node id a label) for a fleet that keeps them.  Each node's file holds its own
node's pairs and checks (node 0's run folder holds every node's records); the run, count and class
series are the answer's, the same on every node.

No false green: the file is written at the run's start saying ``running`` (a run killed before its
end leaves that, never the last run's green), and at its end from the run folder read back
(``record.runs.Run``) together with what only the run's own process knows (``RunStatus``): a run
whose exit status is not 0 never reads as passed.

The text is ``prometheus_client``'s (the reference client: its escaping, its number format); the
file is written by the suite's one atomic writer (``common/files.py``), not by the client's
``write_to_textfile``: that one opens its temporary file with the process's umask, so a run as root
under ``umask 077`` leaves a ``0600`` file node_exporter (its own user) cannot read, and it does not
fsync before the rename.  Ours is ``0644``, fsynced, hidden until renamed (not ``*.prom``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from conformance.common.files import write_atomic
from conformance.common.outside_text import shown_lines
from conformance.common.verdicts import Verdict
from conformance.discover.link_rate import pair_link_gbps
from conformance.plan.transport import PCIE_PATHS_NEAREST_FIRST
from conformance.record.records import HOST_SET_KIND, PYTEST_OUTCOMES, CaseRecord
from conformance.record.runs import Run
from conformance.summarise.answer import Answer
from conformance.summarise.bandwidth import judged_gbps, link_gbps
from conformance.summarise.collectives import CollectiveRow, collective_rows, size_bytes
from conformance.summarise.summary import link_class_of, node_records, one_record_per_case, run_ladder

PREFIX = "gpu_conformance_"
GIGA = 1e9  # the suite's GB/s are 10^9 bytes a second (rank/timing.py), as nccl-tests counts them
# pytest's exit statuses (pytest.ExitCode) the run's verdict reads
OK, TESTS_FAILED, INTERRUPTED, INTERNAL_ERROR = 0, 1, 2, 3
RUNNING, PASSED, FAILED, INCOMPLETE = "running", "passed", "failed", "incomplete"
RUN_VERDICTS = (PASSED, FAILED, INCOMPLETE, RUNNING)
WHOLE_SETS = ("all", "across_nodes")  # the device sets whose collectives the bounded series keep
SERIES_BOUND_8_GPUS = 150  # docs/after-a-run.md states it; tests/test_metrics.py holds a full 8-GPU run to it


@dataclass(frozen=True)
class RunStatus:
    """What only the run's own process knows; None in ``ended``: the run has just started."""

    started: float | None = None  # seconds since the epoch, for people
    ended: float | None = None
    exit_status: int | None = None  # pytest's, after the baseline comparison
    answer: Answer | None = None  # None: no answer (nothing recorded, or the run could not be read back)
    unreadable: bool = False  # the run could not be read back: it did not pass
    seconds: float | None = None  # how long it ran, on the monotonic clock (``started``/``ended`` are for people)


def run_verdict(run: Run, status: RunStatus) -> str:
    """passed, failed, incomplete or running: passed only with exit status 0 and an answer with no failure."""
    if status.ended is None:
        return RUNNING
    if status.exit_status in (TESTS_FAILED, INTERNAL_ERROR):
        return FAILED
    if run.facts.incomplete is not None or status.exit_status == INTERRUPTED:
        return INCOMPLETE
    if status.exit_status != OK or status.unreadable or (status.answer is not None and not status.answer.all_passed):
        return FAILED
    return PASSED


def answer_problems(answer: Answer) -> dict[str, int]:
    """What the answer found wrong, by kind: all 0 exactly when it says everything passed."""
    return {
        "failing_class": len(answer.classes),
        "host_check": len(answer.others),
        "slow_pair": len(answer.slow),
        "gpu_watch": len(answer.machine_watched),
        "harness_error": len(answer.harness_errors),
        "failed_node": len(answer.failed_nodes),
        "store_problem": len(answer.store_problems),
        "incomplete": int(answer.incomplete is not None),
    }


def series_bound(pairs: int, classes: int, link_classes: int, collectives: int, host_checks: int) -> int:
    """The most series the bounded file holds (``metrics_text`` without per-case series).

    Fixed: the run's 18, pytest's outcomes, the verdicts; then two per class and per pair, one per
    link class, three per collective on a whole device set, one per host check that ran.
    """
    fixed = 18 + len(PYTEST_OUTCOMES) + len(Verdict)
    return fixed + 2 * classes + 2 * pairs + link_classes + 3 * collectives + host_checks


# -- the families -----------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric: its HELP, its samples by label set (one sample per set: the last given wins)."""

    name: str
    help: str
    samples: dict[Labels, float] = field(default_factory=dict)

    def add(self, value: float | None, **labels: object) -> None:
        if value is None or not math.isfinite(value):
            return
        self.samples[tuple((k, shown_lines("" if v is None else str(v))) for k, v in labels.items())] = float(value)


class _Families:
    """The families as a ``prometheus_client`` collector: it writes HELP, TYPE, escapes and numbers."""

    def __init__(self, families: Iterable[Family]) -> None:
        self.families = [f for f in families if f.samples]

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import GaugeMetricFamily  # the metrics extra: imported where used

        for family in self.families:
            names = [name for name, _ in next(iter(family.samples))]
            gauge = GaugeMetricFamily(family.name, family.help, labels=names)
            for labels, value in family.samples.items():
                gauge.add_metric([v for _, v in labels], value)
            yield gauge


def render(families: Iterable[Family]) -> str:
    """The text exposition format, as ``prometheus_client`` writes it."""
    from prometheus_client import CollectorRegistry, generate_latest  # the metrics extra: imported where used

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


# -- what a run holds -------------------------------------------------------------------------


def metrics_text(run: Run, status: RunStatus, per_case: bool = False) -> str:
    """The whole file: bounded series; with ``per_case``, a series per case and per size too."""
    own = node_records(run.usable_records, run.facts.node_rank)  # each node writes its own file
    first = run_ladder(run)[0].name
    as_it_is = [r for r in own if (r.env_name or first) == first]  # the environment as it is: the first rung
    families = (
        _run_families(run, status)
        + _count_families(run)
        + _class_families(status.answer, first)
        + _pair_families(as_it_is, own, status.answer)
        + _collective_families(run, as_it_is)
        + _host_check_families(own)
    )
    if per_case:
        families += _case_families(own)
    return render(families)


def _run_families(run: Run, status: RunStatus) -> list[Family]:
    verdict = run_verdict(run, status)
    info = Family(
        f"{PREFIX}run_info",
        f"The run, always 1; verdict is the run's: {', '.join(RUN_VERDICTS)}.",
    )
    info.add(
        1, run_id=run.run_id or "", host=run.facts.host or "", backend=run.facts.backend or "",
        simulated=str(run.simulated).lower(), scenario=Path(run.facts.scenario).stem if run.facts.scenario else "",
        verdict=verdict, signed="false" if run.facts.unsigned else "true",
    )  # fmt: skip
    passed = Family(f"{PREFIX}run_passed", "1 when the run passed (exit status 0, nothing failed), else 0.")
    passed.add(verdict == PASSED)
    verdicts = Family(f"{PREFIX}run_verdict", "1 for the run's verdict, 0 for each other one.")
    for name in RUN_VERDICTS:
        verdicts.add(name == verdict, verdict=name)
    exit_status = Family(f"{PREFIX}run_exit_status", "pytest's exit status (0 passed); absent while running.")
    exit_status.add(status.exit_status if status.ended is not None else None)
    started = Family(f"{PREFIX}run_start_timestamp_seconds", "When the run started (Unix time).")
    started.add(status.started)
    ended = Family(f"{PREFIX}run_end_timestamp_seconds", "When the run ended (Unix time); absent while running.")
    ended.add(status.ended)
    duration = Family(f"{PREFIX}run_duration_seconds", "How long the run took; absent while running.")
    if status.seconds is not None and status.ended is not None:
        duration.add(round(status.seconds, 3))
    problems = Family(
        f"{PREFIX}answer_problems",
        "What the run's answer found wrong, by kind (every kind listed; all 0: nothing failed); absent without one.",
    )
    for kind, count in answer_problems(status.answer).items() if status.answer is not None else ():
        problems.add(count, kind=kind)
    return [info, passed, verdicts, exit_status, started, ended, duration, problems]


def _count_families(run: Run) -> list[Family]:
    tests = Family(
        f"{PREFIX}tests",
        "pytest's count of tests by outcome, as its last line gives them (every outcome listed); absent while running.",
    )
    counted = run.facts.end.tests if run.facts.end is not None else None
    for outcome in PYTEST_OUTCOMES:
        tests.add(counted.get(outcome, 0) if counted is not None else None, outcome=outcome)
    cases = Family(
        f"{PREFIX}cases",
        "Cases (the tests that ran a probe on a device set) by verdict, every verdict listed; host checks and "
        "negative controls are counted apart.",
    )
    verdicts = [r.outcome for r in one_record_per_case(_cases(run.usable_records)) if r.expected_verdict is None]
    for known in Verdict:
        cases.add(verdicts.count(known), verdict=known.value)
    return [tests, cases]


def _class_families(answer: Answer | None, first_rung: str) -> list[Family]:
    passed = Family(f"{PREFIX}class_passed", "1 when the class passed with the environment as it is, else 0.")
    rung = Family(
        f"{PREFIX}class_rung",
        "Always 1: the first rung on which every case of the class passed (none: no rung did).",
    )
    for label in answer.passed if answer is not None else ():
        passed.add(1, **{"class": label})
        rung.add(1, **{"class": label, "rung": first_rung})
    for failed in answer.classes if answer is not None else ():
        passed.add(0, **{"class": failed.label})
        rung.add(1, **{"class": failed.label, "rung": failed.fix.name if failed.fix is not None else "none"})
    return [passed, rung]


def _cases(records: Iterable[CaseRecord]) -> list[CaseRecord]:
    return [r for r in records if r.set_kind != HOST_SET_KIND]


def pair_name(record: CaseRecord) -> str:
    return "-".join(record.devices) if record.set_kind == "pair" else device_set(record)


def _pair_families(as_it_is: list[CaseRecord], own: list[CaseRecord], answer: Answer | None) -> list[Family]:
    passed = Family(
        f"{PREFIX}pair_passed",
        "1 when every case of the pair passed with the environment as it is and the answer found it not SLOW, else 0.",
    )
    bandwidth = Family(
        f"{PREFIX}pair_bandwidth_bytes_per_second",
        "The pair's lowest bandwidth among its passing cases with the environment as it is: NCCL's on GPUs, its "
        "simulated link's on a simulation, host copies on gloo.",
    )
    slow = {p.pair for p in answer.slow} if answer is not None else set()
    by_pair: dict[tuple[str, str], list[CaseRecord]] = {}
    for record in as_it_is:
        if record.set_kind in ("pair", "node_pair") and record.outcome is not Verdict.SKIP:
            by_pair.setdefault((pair_name(record), record.link or link_class_of(record)), []).append(record)
    for (name, link), records in by_pair.items():
        all_passed = all(r.outcome is Verdict.PASS for r in records)
        passed.add(all_passed and name not in slow, pair=name, link=link)
        figures = [_pair_figure(r) for r in records if r.outcome is Verdict.PASS]
        bandwidth.add(_bytes(min((f for f in figures if f is not None), default=None)), pair=name, link=link)
    rate = Family(
        f"{PREFIX}link_rate_bytes_per_second",
        "A link class's physical rate per direction, where the run knew it: a pair's bandwidth over it is its share.",
    )
    for record in own:
        if record.set_kind == "pair":
            rate.add(_bytes(link_gbps(record)), link=record.link or link_class_of(record))
    return [passed, bandwidth, rate]


def _pair_figure(record: CaseRecord) -> float | None:
    judged = judged_gbps(record)
    return judged if judged is not None else record.bandwidth_gbps


def _collective_families(run: Run, as_it_is: list[CaseRecord]) -> list[Family]:
    algbw = Family(
        f"{PREFIX}collective_algbw_bytes_per_second",
        "A collective's algbw (bytes / time) at its largest size, on the whole device set, the environment as it is.",
    )
    busbw = Family(f"{PREFIX}collective_busbw_bytes_per_second", "Its busbw (algbw times nccl-tests' factor).")
    share = Family(
        f"{PREFIX}collective_busbw_link_ratio",
        "Its busbw over the slowest physical link of its device set, where the run knew the rate.",
    )
    whole = [r for r in as_it_is if r.set_kind in WHOLE_SETS]
    for record in whole:
        rows = collective_rows([record])
        if not rows:
            continue
        row = max(rows, key=lambda r: size_bytes(r.size))  # the probes time their largest size only
        labels = {"collective": row.collective, "device_set": row.devices, "size": row.size,
                  "link": set_link(run, record)}  # fmt: skip
        _add_collective(row, labels, algbw, busbw, share)
    return [algbw, busbw, share]


def _add_collective(row: CollectiveRow, labels: dict[str, str], *families: Family) -> None:
    algbw, busbw, share = families
    algbw.add(_bytes(row.algbw), **labels)
    busbw.add(_bytes(row.busbw), **labels)
    ratio = row.busbw / row.link_gbps if row.busbw is not None and row.link_gbps else None
    share.add(None if ratio is None else round(ratio, 4), **labels)


def _host_check_families(own: list[CaseRecord]) -> list[Family]:
    check_passed = Family(
        f"{PREFIX}host_check_passed", "1 when the host or health check passed, 0 when it failed; absent when skipped."
    )
    for record in own:
        if record.set_kind == HOST_SET_KIND and record.outcome is not Verdict.SKIP:
            check_passed.add(record.outcome is Verdict.PASS, check=record.probe.removeprefix("host:"))
    return [check_passed]


# -- per case, behind --metrics-per-case --------------------------------------------------------


def _latest(records: list[CaseRecord]) -> list[CaseRecord]:
    """A test's last record: one series per test, whatever a results file holds twice."""
    return list({r.nodeid: r for r in records}.values())


def device_set(record: CaseRecord) -> str:
    """The device set as the test id names it (``all4``, ``gpu0-gpu1``): its ladder key's parameters."""
    key = record.ladder_key or ""
    if key.endswith("]") and "[" in key:
        return key[key.index("[") + 1 : -1]
    return "-".join(record.devices) or str(record.set_kind or "")


def case_labels(record: CaseRecord) -> dict[str, str]:
    return {
        "test": record.nodeid,
        "family": record.nodeid.split("[", 1)[0],
        "device_set": device_set(record),
        "rung": record.env_name or "",
        "link": link_class_of(record),
    }


def passed(record: CaseRecord) -> bool:
    """The case passed, or is a negative control that ended as its test expected."""
    return record.outcome is Verdict.PASS or record.ended_as_expected


def _case_families(own: list[CaseRecord]) -> list[Family]:
    case_passed = Family(
        f"{PREFIX}case_passed", "1 when the case passed (a negative control: ended as expected), else 0."
    )
    case_verdict = Family(f"{PREFIX}case_verdict", "The case's verdict (a label), always 1.")
    case_seconds = Family(f"{PREFIX}case_duration_seconds", "The case's wall time.")
    case_bandwidth = Family(
        f"{PREFIX}case_bandwidth_bytes_per_second", "A passing pair case's bandwidth, per probe and rung."
    )
    case_busbw = Family(f"{PREFIX}case_busbw_bytes_per_second", "A passing collective case's busbw per size.")
    for record in _latest(_cases(own)):
        labels = case_labels(record)
        case_passed.add(passed(record), **labels)
        case_verdict.add(1, **labels, verdict=record.verdict_text)
        case_seconds.add(record.seconds, **labels)
        if record.set_kind in ("pair", "node_pair") and record.outcome is Verdict.PASS:
            case_bandwidth.add(_bytes(_pair_figure(record)), **labels, probe=record.probe)
        for row in collective_rows([record]):
            case_busbw.add(_bytes(row.busbw), **labels, size=row.size)
    return [case_passed, case_verdict, case_seconds, case_bandwidth, case_busbw]


def set_link(run: Run, record: CaseRecord) -> str:
    """A device set's link class: its slowest physical link's (among equals, or rates unknown: the farthest path).

    A set across nodes, or one the run's topology does not name, keeps its record's (``all``, ``NET``).
    """
    topology, names = run.machine.topology, sorted(set(record.devices))
    if topology is None or record.nodes or len(names) < 2:
        return record.link or link_class_of(record)
    pairs = list(combinations(names, 2))
    try:
        classes = [topology.link(*topology.by_name(pair)) for pair in pairs]
    except KeyError:  # a device the topology does not name
        return record.link or link_class_of(record)
    rates = [pair_link_gbps(topology, pair) for pair in pairs]
    if None in rates:
        return max(classes, key=path_distance)
    known = [rate or 0.0 for rate in rates]
    return min(zip(known, classes, strict=True), key=lambda link: (link[0], -path_distance(link[1])))[1]


def path_distance(link: str) -> int:
    """How far a PCIe path goes (nvidia-smi's classes, nearest first); NVLink and the rest: 0."""
    return PCIE_PATHS_NEAREST_FIRST.index(link) + 1 if link in PCIE_PATHS_NEAREST_FIRST else 0


def _bytes(gbps: float | None) -> float | None:
    return None if gbps is None else round(gbps * GIGA)


# -- the file ---------------------------------------------------------------------------------


def write_metrics(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically: a hidden temporary file beside it, then ``os.replace``.

    Readable by all (node_exporter runs as its own user); OSError when it cannot be written, with
    no temporary file left behind.
    """
    write_atomic(path, text, 0o644)
