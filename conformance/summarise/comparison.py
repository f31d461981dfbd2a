"""What a baseline comparison found, and how it reads (``--json`` and the text report).

``conformance.summarise.compare`` matches the two runs' cases and compares their machines; a ``Comparison``
holds what changed and judges each matched case (verdict, link class, bandwidth, transports).

Reported, regressions first: verdict regressions (``pass`` -> anything else, a host check that
passed and fails now among them, and any change to a worse verdict in ``verdicts.SEVERITY``: wrong
data worst, so ``hang`` -> ``fail``), the machine turned NOT FIT (wrong data where the baseline had
none), bandwidth drops below
the tolerance (current/baseline, for ``bandwidth_gbps`` and every size of ``metrics.busbw_gbps``) on
cases that pass on both sides and ran on GPUs (NCCL): gloo ranks on a shared CPU measure noise,
fixes (anything else -> ``pass``), other verdict changes, changed NCCL transports (reported, not a
regression), new and missing cases.  Missing cases are not regressions: the adaptive matrix runs
fallback rungs only where they are needed, so a fixed machine leaves the baseline's fallback cases
behind, and a run limited with ``-k`` leaves out the rest.  Negative controls (records with an
``expected_verdict``) are compared like every other case.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, TypedDict, TypeGuard, TypeVar

from conformance.common.tables import align_columns
from conformance.common.verdicts import Verdict, worse
from conformance.record.records import CaseRecord, HarnessError, JsonObject
from conformance.record.runs import Run
from conformance.settings import default_of
from conformance.summarise.summary import link_class_of

DEFAULT_TOLERANCE: float = default_of("bandwidth_tolerance")
SUMMARY_WIDTH = 100


# --------------------------------------------------------------------------------------------
# what a comparison reports, entry by entry (JSON objects: ``--json`` prints them as they are)
# --------------------------------------------------------------------------------------------


class CaseFields(TypedDict):
    """What names a case in a report."""

    case: str
    probe: str
    devices: list[str]
    device_ids: list[str]
    link: str
    env_name: str | None


class VerdictRegression(CaseFields):
    baseline: str
    current: str
    kind: Literal["verdict"]
    metric: str
    summary: str


class BandwidthDrop(CaseFields):
    kind: Literal["bandwidth"]
    metric: str
    baseline: float
    current: float
    ratio: float


class LinkChange(CaseFields):  # a pair whose link class changed (a degraded NVLink, a retrained PCIe path)
    kind: Literal["link"]
    metric: str
    baseline: str
    current: str
    summary: str


class MachineChange(TypedDict):  # the machine itself changed: a GPU lost, a fault seen during the run
    case: str  # what changed: "gpu3 (GPU-..., 0000:48:00.0)"
    kind: Literal["machine"]
    metric: str  # "GPU lost", or what the watch saw ("Xid during the run", "link errors grew", ...)
    baseline: str
    current: str
    summary: str


Regression = VerdictRegression | BandwidthDrop | LinkChange | MachineChange


class VerdictChange(CaseFields):  # a fix: anything else -> pass
    baseline: str
    current: str


class OtherVerdictChange(VerdictChange):  # neither side passes
    summary: str


class TransportChange(CaseFields):
    baseline: list[str]
    current: list[str]


class CaseVerdict(CaseFields):  # a new or a missing case
    verdict: str


# --------------------------------------------------------------------------------------------
# each side: its host and versions
# --------------------------------------------------------------------------------------------


def run_host(run: Run) -> str | None:
    host = run.facts.host
    return str(host) if host else None


@dataclass(frozen=True)
class RunSide:
    """One side of a comparison, as its header line and ``--json`` show it."""

    source: str
    run_id: str | None
    host: str | None
    simulated: bool
    versions: dict[str, str | None]
    cases: int

    @classmethod
    def of(cls, run: Run, cases: int) -> RunSide:
        return cls(run.source, run.run_id, run_host(run), run.simulated, run.versions, cases)

    def to_json(self) -> JsonObject:
        return {
            "source": self.source,
            "run_id": self.run_id,
            "host": self.host,
            "simulated": self.simulated,
            "versions": self.versions,
            "cases": self.cases,
        }

    def line(self) -> str:
        facts = [f"run {self.run_id or '-'}", f"host {self.host or '-'}", f"{self.cases} cases"]
        if self.simulated:
            facts.append("SIMULATED")
        versions = self.versions
        text = ", ".join(f"{name} {versions.get(name) or '-'}" for name in ("driver", "cuda", "nccl", "torch"))
        return f"{self.source} ({', '.join(facts)}): {text}"


# --------------------------------------------------------------------------------------------
# what changed
# --------------------------------------------------------------------------------------------


def measured_on_gpu(record: CaseRecord) -> bool:
    """Bandwidth means something only for real NCCL cases; older records without a backend count."""
    return (record.backend or "nccl") == "nccl" and not record.simulated


def _positive(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def bandwidths(record: CaseRecord) -> dict[str, float]:
    """``bandwidth_gbps`` and ``busbw_gbps <size>`` for each size of ``metrics.busbw_gbps``."""
    found: dict[str, float] = {}
    if _positive(record.bandwidth_gbps):
        found["bandwidth_gbps"] = float(record.bandwidth_gbps)
    metrics = record.metrics
    busbw = metrics.get("busbw_gbps") if isinstance(metrics, Mapping) else None
    for size, value in busbw.items() if isinstance(busbw, Mapping) else ():
        if _positive(value):
            found[f"busbw_gbps {size}"] = float(value)
    return found


def transport_labels(record: CaseRecord) -> list[str]:
    transports: object = record.transports
    return sorted(str(t) for t in transports) if isinstance(transports, (Mapping, list)) else []


def case_fields(record: CaseRecord) -> CaseFields:
    """What names a case in a report: its node id, probe, devices (names and ids), link class, rung."""
    return {
        "case": record.nodeid or str(record.ladder_key),
        "probe": record.probe,
        "devices": list(record.devices),
        "device_ids": list(record.device_ids),
        "link": link_class_of(record),
        "env_name": record.env_name,
    }


def _summary_text(record: CaseRecord) -> str:
    text = " ".join(str(record.summary or "").split())
    return text if len(text) <= SUMMARY_WIDTH else text[: SUMMARY_WIDTH - 3] + "..."


@dataclass
class Comparison:
    """What changed from ``baseline`` to ``current``; ``regressions`` decide the exit status."""

    baseline: Run
    current: Run
    tolerance: float = DEFAULT_TOLERANCE
    regressions: list[Regression] = field(default_factory=list)  # kind "verdict" or "bandwidth"
    fixes: list[VerdictChange] = field(default_factory=list)
    verdict_changes: list[OtherVerdictChange] = field(default_factory=list)  # neither side passes
    transport_changes: list[TransportChange] = field(default_factory=list)
    new: list[CaseVerdict] = field(default_factory=list)
    missing: list[CaseVerdict] = field(default_factory=list)
    matched: int = 0
    baseline_cases: int = 0
    current_cases: int = 0
    bandwidth_not_compared: int = 0  # passing cases off the GPU: gloo on a shared CPU measures noise
    machines: str | None = None  # how the machines differ, when that was allowed
    warnings: list[str] = field(default_factory=list)

    @property
    def incomplete(self) -> str | None:
        """Why the current run cannot show that nothing regressed: it did not cover its plan."""
        return self.current.facts.incomplete

    @property
    def harness_errors(self) -> tuple[HarnessError, ...]:
        """Tests of the current run that failed without a record: what they would have shown is unknown."""
        return self.current.facts.harness_errors

    @property
    def exit_status(self) -> int:
        return 1 if self.regressions or self.incomplete or self.harness_errors else 0

    def add_match(self, old: CaseRecord, new: CaseRecord) -> None:
        self.matched += 1
        self._link_change(old, new)
        before, after = old.verdict_text, new.verdict_text
        passed, passes = old.outcome is Verdict.PASS, new.outcome is Verdict.PASS
        verdicts: VerdictChange = {**case_fields(new), "baseline": before, "current": after}
        if (passed and not passes) or worse(new.outcome, old.outcome):  # hang -> fail (wrong data) is worse too
            self.regressions.append({**verdicts, "kind": "verdict", "metric": "verdict", "summary": _summary_text(new)})
        elif not passed and passes:
            self.fixes.append(verdicts)
        elif before != after:
            self.verdict_changes.append({**verdicts, "summary": _summary_text(new)})
        elif passed and not (measured_on_gpu(old) and measured_on_gpu(new)):
            self.bandwidth_not_compared += 1
        elif passed:
            self._bandwidth_drops(old, new)
        old_transports, new_transports = transport_labels(old), transport_labels(new)
        if old_transports and new_transports and old_transports != new_transports:
            self.transport_changes.append({**case_fields(new), "baseline": old_transports, "current": new_transports})

    def _link_change(self, old: CaseRecord, new: CaseRecord) -> None:
        """One regression per pair whose link class changed (its every test and rung share the pair)."""
        if new.set_kind != "pair" or not old.link or not new.link or old.link == new.link:
            return
        if any(r["kind"] == "link" and r["device_ids"] == list(new.device_ids) for r in self.regressions):
            return
        pair = "-".join(new.devices)
        summary = f"{pair} was {old.link}, now {new.link}: a link lost or retrained (nvidia-smi topo -m, nvlink -s)"
        self.regressions.append(
            {**case_fields(new), "kind": "link", "metric": "link", "baseline": old.link, "current": new.link,
             "summary": summary}
        )  # fmt: skip

    def _bandwidth_drops(self, old: CaseRecord, new: CaseRecord) -> None:
        now = bandwidths(new)
        for metric, before in bandwidths(old).items():
            after = now.get(metric)
            if after is None or after / before >= self.tolerance:
                continue
            self.regressions.append(
                {
                    **case_fields(new),
                    "kind": "bandwidth",
                    "metric": metric,
                    "baseline": before,
                    "current": after,
                    "ratio": round(after / before, 3),
                }
            )

    # -- output -------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        return {
            "matched": self.matched,
            "regressions": len(self.regressions),
            "verdict_regressions": sum(r["kind"] == "verdict" for r in self.regressions),
            "bandwidth_drops": sum(r["kind"] == "bandwidth" for r in self.regressions),
            "links_changed": sum(r["kind"] == "link" for r in self.regressions),
            "gpus_lost": sum(r["kind"] == "machine" and r["metric"] == "GPU lost" for r in self.regressions),
            "machine_faults": sum(r["kind"] == "machine" and r["metric"] != "GPU lost" for r in self.regressions),
            "fixes": len(self.fixes),
            "verdict_changes": len(self.verdict_changes),
            "transport_changes": len(self.transport_changes),
            "new": len(self.new),
            "missing": len(self.missing),
            "bandwidth_not_compared": self.bandwidth_not_compared,
        }

    def to_json(self) -> JsonObject:
        return {
            "baseline": RunSide.of(self.baseline, self.baseline_cases).to_json(),
            "current": RunSide.of(self.current, self.current_cases).to_json(),
            "bandwidth_tolerance": self.tolerance,
            "different_machines": self.machines,
            "counts": self.counts(),
            "regressions": self.regressions,
            "fixes": self.fixes,
            "verdict_changes": self.verdict_changes,
            "transport_changes": self.transport_changes,
            "new": self.new,
            "missing": self.missing,
            "warnings": self.warnings,
            "incomplete": self.incomplete,
            "harness_errors": [asdict(e) for e in self.harness_errors],
            "exit_status": self.exit_status,
            "lines": self.lines(),
        }

    def lines(self) -> list[str]:
        """The readable report: both runs and their versions, then regressions first."""
        lines = self._header()
        lines += _section(
            "REGRESSIONS", self.regressions, ("", "case", "baseline", "current", "detail"), _regression_row
        )
        lines += _section("FIXES", self.fixes, ("case", "baseline", "current"), _fix_row)
        lines += _section(
            "OTHER VERDICT CHANGES", self.verdict_changes, ("case", "baseline", "current", "summary"), _change_row
        )
        lines += _section(
            "TRANSPORT CHANGES (reported, not regressions)",
            self.transport_changes,
            ("case", "baseline", "current"),
            _transport_row,
        )
        lines += _section("NEW CASES (only in the current run)", self.new, ("case", "verdict"), _case_row)
        lines += _section("MISSING CASES (only in the baseline)", self.missing, ("case", "verdict"), _case_row)
        lines += [f"warning: {w}" for w in self.warnings]
        return [*lines, "", self._verdict_line()]

    def _header(self) -> list[str]:
        old, new = RunSide.of(self.baseline, self.baseline_cases), RunSide.of(self.current, self.current_cases)
        lines = [f"baseline: {old.line()}", f"current:  {new.line()}"]
        changed = [
            f"{name} {old.versions[name]} -> {value}"
            for name, value in new.versions.items()
            if value and old.versions.get(name) and value != old.versions[name]
        ]
        if changed:
            lines.append(f"versions changed: {', '.join(changed)}")
        if self.machines:
            lines.append(f"different machines (allowed): {self.machines}")
        if self.bandwidth_not_compared:
            lines.append(
                f"bandwidth not compared on {self.bandwidth_not_compared} case(s) off the GPU "
                "(gloo ranks on a shared CPU measure noise, not a GPU link)"
            )
        return lines

    @staticmethod
    def _machine_counts(c: Mapping[str, int]) -> str:
        """``1 GPU lost, 2 link changed, `` where the machine changed; nothing where it did not."""
        named = [
            (c["gpus_lost"], "GPU lost"),
            (c["machine_faults"], "machine fault"),
            (c["links_changed"], "link changed"),
        ]
        return "".join(f"{n} {what}, " for n, what in named if n)

    def _verdict_line(self) -> str:
        c = self.counts()
        text = (
            f"{c['regressions']} regression(s) ({self._machine_counts(c)}{c['verdict_regressions']} verdict, "
            f"{c['bandwidth_drops']} bandwidth below {self.tolerance:g}x), {c['fixes']} fix(es), "
            f"{c['verdict_changes']} other verdict change(s), "
            f"{c['transport_changes']} transport change(s), {c['new']} new, {c['missing']} missing; "
            f"{c['matched']} case(s) matched"
        )
        if self.regressions:
            return f"REGRESSED: {text}"
        if self.harness_errors:
            errors = "; ".join(e.text for e in self.harness_errors)
            why = f"{len(self.harness_errors)} test(s) of the current run failed without a verdict ({errors})"
            return f"HARNESS ERROR: {why}; it cannot show that nothing regressed: {text}"
        if self.incomplete:
            why = f"the current run is incomplete ({self.incomplete}); it cannot show that nothing regressed"
            return f"INCOMPLETE: {why}: {text}"
        return f"no regressions: {text}"


Entry = TypeVar("Entry")


def _section(
    title: str, entries: Sequence[Entry], columns: tuple[str, ...], row: Callable[[Entry], tuple[str, ...]]
) -> list[str]:
    if not entries:
        return []
    table = align_columns([columns, *(row(e) for e in entries)])
    return ["", f"{title} ({len(entries)}):", *(f"  {line}" for line in table)]


def _regression_row(entry: Regression) -> tuple[str, ...]:
    if entry["kind"] == "verdict":
        return ("verdict", entry["case"], entry["baseline"], entry["current"], entry["summary"])
    if entry["kind"] == "link":
        return ("link changed", entry["case"], entry["baseline"], entry["current"], entry["summary"])
    if entry["kind"] == "machine":
        return (entry["metric"], entry["case"], entry["baseline"], entry["current"], entry["summary"])
    detail = f"{entry['metric']}: {entry['ratio']:g}x"
    return ("bandwidth", entry["case"], f"{entry['baseline']:g} GB/s", f"{entry['current']:g} GB/s", detail)


def _fix_row(entry: VerdictChange) -> tuple[str, ...]:
    return (entry["case"], entry["baseline"], entry["current"])


def _change_row(entry: OtherVerdictChange) -> tuple[str, ...]:
    return (entry["case"], entry["baseline"], entry["current"], entry["summary"])


def _transport_row(entry: TransportChange) -> tuple[str, ...]:
    return (entry["case"], " ".join(entry["baseline"]), " ".join(entry["current"]))


def _case_row(entry: CaseVerdict) -> tuple[str, ...]:
    return (entry["case"], entry["verdict"])
