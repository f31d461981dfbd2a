"""A run's results in Prometheus' text exposition format, as node_exporter's textfile collector reads it.

    pytest suites/ --metrics-file /var/lib/node_exporter/textfile_collector/gpu_conformance.prom

Every metric is a gauge named ``gpu_conformance_*`` with a HELP and a TYPE line (docs/after-a-run.md
lists them): the run (its id, verdict, exit status, start and duration), the cases counted by
verdict (every verdict, 0 where none, so a dashboard never loses a series), each case and host
check passed or not, and the bandwidth of each pair and collective, with its share of the link's
physical rate where the suite knows it (``discover/link_rate.py``).  Samples carry no timestamp
(the textfile collector refuses them).

No false green: the file is written at the run's start saying ``running`` (a run killed before its
end leaves that, never the last run's green), and at its end from the run folder read back
(``record.runs.Run``) together with what only the run's own process knows (``RunStatus``): a run
whose exit status is not 0 never reads as passed.

The file is replaced atomically (a temporary file in the same folder, then ``os.replace``), so the
collector never reads half a file; the temporary file's name does not end in ``.prom``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from conformance.common.files import write_atomic
from conformance.common.outside_text import shown_lines
from conformance.common.verdicts import Verdict
from conformance.discover.link_rate import pair_link_gbps
from conformance.plan.transport import PCIE_PATHS_NEAREST_FIRST
from conformance.record.records import HOST_SET_KIND, CaseRecord
from conformance.record.runs import Run
from conformance.summarise.answer import Answer
from conformance.summarise.bandwidth import judged_gbps, link_gbps
from conformance.summarise.collectives import collective_rows
from conformance.summarise.summary import link_class_of, one_record_per_case

PREFIX = "gpu_conformance_"
GIGA = 1e9  # the suite's GB/s are 10^9 bytes a second (rank/timing.py), as nccl-tests counts them
# pytest's exit statuses (pytest.ExitCode) the run's verdict reads
OK, TESTS_FAILED, INTERRUPTED, INTERNAL_ERROR = 0, 1, 2, 3
RUNNING, PASSED, FAILED, INCOMPLETE = "running", "passed", "failed", "incomplete"
RUN_VERDICTS = (PASSED, FAILED, INCOMPLETE, RUNNING)


@dataclass(frozen=True)
class RunStatus:
    """What only the run's own process knows; None in ``ended``: the run has just started."""

    started: float | None = None  # seconds since the epoch
    ended: float | None = None
    exit_status: int | None = None  # pytest's, after the baseline comparison
    answer: Answer | None = None  # None: no answer (nothing recorded, or the run could not be read back)
    unreadable: bool = False  # the run could not be read back: it did not pass


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
        "incomplete": int(answer.incomplete is not None),
    }


# -- the text format --------------------------------------------------------------------------

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
        self.samples[tuple((k, "" if v is None else str(v)) for k, v in labels.items())] = float(value)

    def lines(self) -> list[str]:
        if not self.samples:
            return []
        head = [f"# HELP {self.name} {escape_help(self.help)}", f"# TYPE {self.name} gauge"]
        return head + [f"{self.name}{label_text(labels)} {number_text(v)}" for labels, v in self.samples.items()]


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label(value: str) -> str:
    return shown_lines(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_text(labels: Labels) -> str:
    return "{" + ",".join(f'{name}="{escape_label(value)}"' for name, value in labels) + "}" if labels else ""


def number_text(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


# -- what a run holds -------------------------------------------------------------------------


def metrics_text(run: Run, status: RunStatus) -> str:
    """The whole file: the run, its cases, host checks and bandwidths."""
    families = _run_families(run, status) + _case_families(run) + _bandwidth_families(run, status.answer)
    return "".join(line + "\n" for family in families for line in family.lines())


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
    if status.started is not None and status.ended is not None:
        duration.add(round(status.ended - status.started, 3))
    problems = Family(
        f"{PREFIX}answer_problems",
        "What the run's answer found wrong, by kind (every kind listed; all 0: nothing failed); absent without one.",
    )
    for kind, count in answer_problems(status.answer).items() if status.answer is not None else ():
        problems.add(count, kind=kind)
    cases = Family(
        f"{PREFIX}cases",
        "Cases by verdict, every verdict listed (host checks and negative controls not counted).",
    )
    counted = [r.outcome for r in one_record_per_case(_cases(run)) if r.expected_verdict is None]
    for known in Verdict:
        cases.add(counted.count(known), verdict=known.value)
    return [info, passed, verdicts, exit_status, started, ended, duration, problems, cases]


def _cases(run: Run) -> list[CaseRecord]:
    return [r for r in run.usable_records if r.set_kind != HOST_SET_KIND]


def _latest(records: list[CaseRecord]) -> list[CaseRecord]:
    """A test's last record on each node: one series per test, whatever a results file holds twice."""
    return list({(r.nodeid, _node(r)): r for r in records}.values())


def _node(record: CaseRecord) -> str:
    return str(record.node_rank or 0)


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
        "node": _node(record),
    }


def passed(record: CaseRecord) -> bool:
    """The case passed, or is a negative control that ended as its test expected."""
    return record.outcome is Verdict.PASS or record.ended_as_expected


def _case_families(run: Run) -> list[Family]:
    case_passed = Family(
        f"{PREFIX}case_passed", "1 when the case passed (a negative control: ended as expected), else 0."
    )
    case_verdict = Family(f"{PREFIX}case_verdict", "The case's verdict (a label), always 1.")
    case_seconds = Family(f"{PREFIX}case_duration_seconds", "The case's wall time.")
    for record in _latest(_cases(run)):
        labels = case_labels(record)
        case_passed.add(passed(record), **labels)
        case_verdict.add(1, **labels, verdict=record.verdict_text)
        case_seconds.add(record.seconds, **labels)
    check_passed = Family(f"{PREFIX}host_check_passed", "1 when the host or health check passed, else 0.")
    check_verdict = Family(f"{PREFIX}host_check_verdict", "The check's verdict (pass, skip, error; a label), always 1.")
    for record in _latest(run.usable_records):
        if record.set_kind == HOST_SET_KIND:
            labels = {"check": record.probe.removeprefix("host:"), "test": record.nodeid, "node": _node(record)}
            check_passed.add(record.outcome is Verdict.PASS, **labels)
            check_verdict.add(1, **labels, verdict=record.verdict_text)
    return [case_passed, case_verdict, case_seconds, check_passed, check_verdict]


def _bandwidth_families(run: Run, answer: Answer | None) -> list[Family]:
    pair = Family(
        f"{PREFIX}pair_bandwidth_bytes_per_second",
        "A passing pair's bandwidth: measured by NCCL, its simulated link's on a simulation, host copies on gloo.",
    )
    pair_share = Family(
        f"{PREFIX}pair_bandwidth_link_ratio",
        "A pair's bandwidth over its link's physical rate, where the run measured a GPU link and knew the rate.",
    )
    pair_slow = Family(
        f"{PREFIX}pair_slow",
        "1 when the answer found the pair SLOW (below its class's median times --slow-ratio, or its floor), else 0; "
        "only pairs whose bandwidth measures a GPU link are judged.",
    )
    slow = {(p.case, p.probe) for p in answer.slow} if answer is not None else set()
    algbw = Family(f"{PREFIX}collective_algbw_bytes_per_second", "A collective's algbw (bytes / time) per size.")
    busbw = Family(f"{PREFIX}collective_busbw_bytes_per_second", "A collective's busbw (nccl-tests' factor) per size.")
    bus_share = Family(
        f"{PREFIX}collective_busbw_link_ratio",
        "A collective's busbw over the slowest physical link of its device set, where the run knew the rate.",
    )
    for record in run.usable_records:
        if record.outcome is not Verdict.PASS:
            continue
        node, rung, link = _node(record), record.env_name or "", record.link or link_class_of(record)
        if record.set_kind in ("pair", "node_pair"):
            judged = judged_gbps(record)
            figure = judged if judged is not None else record.bandwidth_gbps
            name = "-".join(record.devices) if record.set_kind == "pair" else device_set(record)
            labels = {"probe": record.probe, "pair": name, "link": link, "rung": rung, "node": node}
            pair.add(_bytes(figure), **labels)
            rate = link_gbps(record)
            pair_share.add(round(judged / rate, 4) if judged is not None and rate else None, **labels)
            pair_slow.add(None if judged is None else (record.nodeid, record.probe) in slow, **labels)
        rows = collective_rows([record])
        link = set_link(run, record) if rows else link
        for row in rows:
            labels = {
                "collective": row.collective, "device_set": row.devices, "ranks": str(row.ranks), "size": row.size,
                "link": link, "rung": rung, "node": node,
            }  # fmt: skip
            algbw.add(_bytes(row.algbw), **labels)
            busbw.add(_bytes(row.busbw), **labels)
            share = row.busbw / row.link_gbps if row.busbw is not None and row.link_gbps else None
            bus_share.add(None if share is None else round(share, 4), **labels)
    return [pair, pair_share, pair_slow, algbw, busbw, bus_share]


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
