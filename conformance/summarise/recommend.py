"""The recommended environment per topology class: ``python -m conformance recommend [RUN]``.

For every topology class (the link class of a device pair, e.g. ``NV18``/``PIX``/``SYS``, or the
kind of any other device set: ``all``, ``single``, ``last_half``, ...) the first rung of the ladder
on which every case of the class passed, what that rung costs in bandwidth against the best
passing rung of the class, and the variables to set.  The classes' rungs are then joined into one
environment: the union of their variables, or, where two rungs set one variable to different
values, the value of the later rung in ladder order (the one that needs the most), naming the
classes that then run on a broader setting than they need.

Wrong data (verdict ``fail``) on any rung overrides everything: the machine is not fit for
training, because framework copies are affected too, whatever NCCL is told.  Negative controls
(``expected_verdict`` set) and skipped cases are ignored.

The run's own ladder (``run.json``: ``ladder``) names the rungs; without it the built-in ladder.
The environment is printed as ``export`` lines and written to ``recommended.env`` in the run
folder (``VAR=VALUE`` lines under a comment header).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeGuard

from conformance.common.files import write_atomic
from conformance.common.verdicts import Verdict
from conformance.discover.nccl_config import ConfigValue, NcclConfig
from conformance.plan.matrix import Rung
from conformance.record.records import CaseRecord, HarnessError, JsonObject
from conformance.record.runs import Run, RunError
from conformance.summarise.summary import (
    case_of,
    counted_cases,
    first_passing_rungs,
    ladder_cases,
    link_class_of,
    run_ladder,
    rung_env_text,
)

ENV_FILE = "recommended.env"
UNFIT_STATUS = 1  # the command's exit status when any case delivered wrong data
UNFIT_REASON = (
    "framework copies (tensor.to between GPUs, cudaMemcpyPeer) are affected too, whatever NCCL is told; "
    "no environment makes this machine safe: fix it (IOMMU/ACS, driver, hardware) and run the suite again"
)


# --------------------------------------------------------------------------------------------
# the pieces of a recommendation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FigureCost:
    """One bandwidth figure on the class's rung against the best passing rung that measured it."""

    figure: str  # "pair_exchange" (bandwidth_gbps) or "all_reduce busbw 1MiB" (metrics.busbw_gbps)
    gbps: float
    best_gbps: float
    best_rung: str

    @property
    def cost_percent(self) -> float:
        if self.best_gbps <= 0:
            return 0.0
        return round(max(0.0, (self.best_gbps - self.gbps) / self.best_gbps * 100), 1)

    def to_json(self) -> JsonObject:
        return {
            "figure": self.figure,
            "gbps": self.gbps,
            "best_gbps": self.best_gbps,
            "best_rung": self.best_rung,
            "cost_percent": self.cost_percent,
        }


@dataclass(frozen=True)
class BandwidthCost:
    """What a class's rung costs against its best passing rung; ``reason`` when not measured."""

    rung: str
    comparisons: tuple[FigureCost, ...] = ()
    reason: str = ""

    @property
    def worst(self) -> FigureCost | None:
        if not self.comparisons:
            return None
        return max(self.comparisons, key=lambda c: (c.cost_percent, c.figure))

    def text(self) -> str:
        worst = self.worst
        if worst is None:
            return f"not measured ({self.reason})"
        if worst.cost_percent == 0:
            return f"no cost: {self.rung} is the fastest passing rung ({worst.figure}: {worst.gbps:.2f} GB/s)"
        return (
            f"costs {worst.cost_percent:.1f}% against {worst.best_rung} "
            f"({worst.figure}: {worst.gbps:.2f} vs {worst.best_gbps:.2f} GB/s)"
        )

    def to_json(self) -> JsonObject:
        worst = self.worst
        return {
            "measured": worst is not None,
            "cost_percent": worst.cost_percent if worst else None,
            "reason": self.reason or None,
            "text": self.text(),
            "comparisons": [c.to_json() for c in self.comparisons],
        }


@dataclass(frozen=True)
class ClassAdvice:
    """One topology class: its first passing rung, or the cases no rung fixed."""

    name: str
    rung: Rung | None
    bandwidth: BandwidthCost | None = None
    failing: tuple[tuple[str, str], ...] = ()  # (nodeid, verdict) of the cases that never passed
    tried: tuple[str, ...] = ()  # the rungs the class's failing cases ran on, in ladder order
    not_passing_on_rung: tuple[tuple[str, str], ...] = ()  # cases that passed earlier but not on the rung

    def line(self) -> str:
        if self.rung is None:
            tried = ", ".join(self.tried)
            return f"{self.name}: no rung passed (tried {tried}): no environment fixes it; failing cases:"
        bandwidth = self.bandwidth.text() if self.bandwidth else "not measured"
        return f"{self.name}: {self.rung.name}: {rung_env_text(self.rung)}; bandwidth cost: {bandwidth}"

    def to_json(self) -> JsonObject:
        rung = self.rung
        return {
            "rung": rung.name if rung else None,
            "set": dict(rung.set) if rung else {},
            "unset_families": list(rung.unset_families) if rung else [],
            "env_text": rung_env_text(rung) if rung else None,
            "bandwidth": self.bandwidth.to_json() if self.bandwidth else None,
            "failing": [{"nodeid": n, "verdict": v} for n, v in self.failing],
            "tried": list(self.tried),
            "not_passing_on_rung": [{"nodeid": n, "verdict": v} for n, v in self.not_passing_on_rung],
        }


@dataclass(frozen=True)
class Conflict:
    """One variable two classes' rungs set differently; the later rung in ladder order wins."""

    variable: str
    chosen: str
    chosen_rung: str
    wanted: tuple[tuple[str, str, str], ...]  # (value, rung, class) per class that sets it

    def text(self) -> str:
        wants = ", ".join(f"{value} for {cls} ({rung})" for value, rung, cls in self.wanted)
        return f"conflict: {self.variable} is {wants}; using {self.chosen} from {self.chosen_rung}, the later rung"

    def to_json(self) -> JsonObject:
        return {
            "variable": self.variable,
            "chosen": self.chosen,
            "chosen_rung": self.chosen_rung,
            "wanted": [{"value": v, "rung": r, "class": c} for v, r, c in self.wanted],
        }


@dataclass(frozen=True)
class WrongData:
    """A case that delivered wrong data (verdict ``fail``), on whichever rung."""

    nodeid: str
    link_class: str
    rung: str | None
    summary: str

    def to_json(self) -> JsonObject:
        return {"nodeid": self.nodeid, "class": self.link_class, "rung": self.rung, "summary": self.summary}


@dataclass
class Recommendation:
    """What to set, per class and overall; ``unfit`` when any case delivered wrong data."""

    run_id: str | None
    source: str
    simulated: bool
    unfit: bool
    classes: list[ClassAdvice] = field(default_factory=list)
    wrong_data: list[WrongData] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    unset_families: tuple[str, ...] = ()
    conflicts: list[Conflict] = field(default_factory=list)
    needed_by: dict[str, list[str]] = field(default_factory=dict)  # "VAR=VALUE" or the unset text -> classes
    inherited_env: dict[str, str] = field(default_factory=dict)
    incomplete: str | None = None  # the run did not cover its plan: no recommendation (RunFacts.incomplete)
    harness_errors: tuple[HarnessError, ...] = ()  # failed tests no record explains: no recommendation
    cpu_only: str | None = None  # why no GPU was tested (a run of CPU ranks that is no simulation)
    config: NcclConfig = field(default_factory=NcclConfig)  # NCCL's configuration files, as the run read them

    # -- derived ---------------------------------------------------------------------------
    @property
    def withheld(self) -> bool:
        """No environment is handed out: wrong data (unfit), a run that did not cover its plan, harness errors."""
        return self.unfit or self.incomplete is not None or bool(self.harness_errors)

    @property
    def from_config(self) -> dict[str, ConfigValue]:
        """What the unset removes that NCCL's configuration files set: ``unset`` cannot reach a file."""
        unset = self.unset_families
        return {k: v for k, v in sorted(self.config.values.items()) if unset and k.startswith(unset)}

    @property
    def fixed(self) -> list[ClassAdvice]:
        return [c for c in self.classes if c.rung is not None]

    @property
    def unfixed(self) -> list[str]:
        return [c.name for c in self.classes if c.rung is None]

    @property
    def serves_every_class(self) -> bool:
        """One rung's setting is what every class that some rung fixed needs."""
        return len({_setting(c.rung) for c in self.fixed if c.rung is not None}) == 1

    @property
    def broader(self) -> list[tuple[str, str]]:
        """(class, its own rung) of the classes the overall environment gives more than they need."""
        overall = (tuple(sorted(self.env.items())), self.unset_families)
        return [(c.name, c.rung.name) for c in self.fixed if c.rung is not None and _setting(c.rung) != overall]

    def exports(self) -> list[str]:
        """The environment as shell lines; empty when nothing needs setting (or unfit, or incomplete)."""
        if self.withheld:
            return []
        lines = [rung_env_text(Rung("overall", unset_families=self.unset_families))] if self.unset_families else []
        lines += [f"export {k}=" for k in self.from_config]  # empty: NCCL reads it as unset (nccl_config.py)
        return lines + [f"export {k}={v}" for k, v in sorted(self.env.items())]

    # -- text --------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        lines = ["SIMULATED run: this is for the simulated machine, not this host"] if self.simulated else []
        if self.harness_errors:
            lines.append(self._harness_line())
        if self.unfit:
            return lines + self._unfit_lines()
        if self.incomplete:
            return lines + [self._incomplete_line()]
        if self.harness_errors:
            return lines
        if not self.classes:
            return lines + ["nothing to recommend: no case ran that can be used (all skipped or negative controls)"]
        lines.append("per topology class, the first rung on which every case of the class passed:")
        for advice in self.classes:
            lines.append(f"  {advice.line()}")
            lines += [f"    {verdict.upper()} {nodeid}" for nodeid, verdict in advice.failing]
            if advice.not_passing_on_rung:
                lines.append(f"    caution: on {advice.rung.name if advice.rung else '?'} these did not pass:")
                lines += [f"      {verdict.upper()} {nodeid}" for nodeid, verdict in advice.not_passing_on_rung]
        lines += self._overall_lines()
        return lines

    def _harness_line(self) -> str:
        # A test that failed without a verdict may be the case that would have changed a class's rung.
        tests = "; ".join(e.text for e in self.harness_errors)
        return (
            f"no recommendation: {len(self.harness_errors)} test(s) failed without a verdict on the machine "
            f"(harness errors): {tests}; fix what failed them and run the suite again"
        )

    def _incomplete_line(self) -> str:
        # A class whose leader passed may still hang on a pair that never ran: advice would be a guess.
        return (
            f"no recommendation: the run is incomplete ({self.incomplete}); "
            "a rung can only be chosen from every case of its class: run the whole suite"
        )

    def _unfit_lines(self) -> list[str]:
        count = len(self.wrong_data)
        lines = [
            f"NOT FIT FOR TRAINING: wrong data (verdict fail) in {count} case{'' if count == 1 else 's'}; "
            f"{UNFIT_REASON}:"
        ]
        for case in self.wrong_data:
            lines.append(f"  FAIL {case.nodeid} ({case.link_class}, rung {case.rung}): {case.summary}")
        return lines

    def _overall_lines(self) -> list[str]:
        fixed = self.fixed
        unfixed = ", ".join(self.unfixed)
        if not fixed:
            return [f"no environment fixes any class ({unfixed}); see the failing cases above"]
        scope = f"every class an environment fixes (not {unfixed})" if unfixed else "every class"
        if not self.env and not self.unset_families:
            return [f"nothing needs setting: {scope} passed with the environment as it is", *self._inherited_note()]
        if self.serves_every_class:
            lines = [f"one setting serves {scope}:"]
        elif self.conflicts:
            lines = ["classes need conflicting settings:", *(f"  {c.text()}" for c in self.conflicts)]
        else:
            lines = [f"classes need different settings; they do not conflict, so their union serves {scope}:"]
        if not self.serves_every_class:
            lines += [f"  {what}: needed by {', '.join(classes)}" for what, classes in self.needed_by.items()]
            broader = ", ".join(f"{cls} (needs {rung})" for cls, rung in self.broader)
            lines.append(f"  would then run on a broader setting than they need: {broader}")
        lines += [f"  {line}" for line in self.exports()]
        return lines + self._config_note() + self._inherited_note()

    def _config_note(self) -> list[str]:
        return [
            f"note: {k}={v.value} is set in {v.file}: unset cannot remove it (NCCL reads the file again); remove it "
            f"there, or give it an empty value, which NCCL reads as unset"
            for k, v in self.from_config.items()
        ]

    def _inherited_note(self) -> list[str]:
        unset = self.unset_families
        kept = {k: v for k, v in self.inherited_env.items() if not (unset and k.startswith(unset))}
        if not kept:
            return []
        return [
            f"note: every rung ran on top of what the run inherited: {' '.join(f'{k}={v}' for k, v in kept.items())}"
        ]

    # -- the .env file -------------------------------------------------------------------------
    def env_text(self) -> str:
        lines = [f"# recommended environment from conformance run {self.run_id or '(unknown run id)'}"]
        if self.cpu_only is not None:  # first: nothing below is about a GPU
            lines.insert(0, f"# CPU ONLY: no GPU was tested ({self.cpu_only})")
        if self.simulated:
            lines.append("# SIMULATED run: this is for the simulated machine, not this host")
        lines.append(
            f"# VAR=VALUE lines: docker --env-file, systemd EnvironmentFile=, or set -a; . ./{ENV_FILE}; set +a"
        )
        if self.unfit:
            lines.append(f"# NOT FIT FOR TRAINING: wrong data (verdict fail); {UNFIT_REASON}")
            lines += [f"#   FAIL {case.nodeid}" for case in self.wrong_data]
            return "\n".join(lines) + "\n"
        if self.incomplete:
            lines.append(f"# {self._incomplete_line()}")
            return "\n".join(lines) + "\n"
        if self.harness_errors:
            lines.append(f"# {self._harness_line()}")
            return "\n".join(lines) + "\n"
        if not self.classes:
            lines.append("# nothing to recommend: no case ran that can be used")
            return "\n".join(lines) + "\n"
        lines += [f"# {line}" for line in [*self._class_comments(), *self._config_note(), *self._inherited_note()]]
        if self.unset_families:
            text = rung_env_text(Rung("overall", unset_families=self.unset_families))
            lines.append(f"# {text} before these: a .env file cannot unset")
        if not self.env and not self.unset_families:
            lines.append("# nothing needs setting: the environment as it is")
        lines += [f"{k}=" for k in self.from_config]
        lines += [f"{k}={v}" for k, v in sorted(self.env.items())]
        return "\n".join(lines) + "\n"

    def _class_comments(self) -> list[str]:
        comments = []
        for advice in self.classes:
            if advice.rung is None:
                comments.append(
                    f"{advice.name}: no environment fixes it (no rung passed; tried {', '.join(advice.tried)})"
                )
            else:
                comments.append(f"{advice.name}: {advice.rung.name}: {_assignments(advice.rung)}")
        comments += [c.text() for c in self.conflicts]
        if self.broader and not self.serves_every_class:
            broader = ", ".join(f"{cls} (needs {rung})" for cls, rung in self.broader)
            comments.append(f"broader setting than needed for: {broader}")
        return comments

    # -- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> JsonObject:
        return {
            "run_id": self.run_id,
            "source": self.source,
            "simulated": self.simulated,
            "unfit": self.unfit,
            "incomplete": self.incomplete,
            "harness_errors": [asdict(e) for e in self.harness_errors],
            "wrong_data": [case.to_json() for case in self.wrong_data],
            "classes": {c.name: c.to_json() for c in self.classes},
            "unfixed": self.unfixed,
            "env": {} if self.withheld else dict(sorted(self.env.items())),
            "unset_families": [] if self.withheld else list(self.unset_families),
            "serves_every_class": bool(self.fixed) and self.serves_every_class,
            "conflicts": [c.to_json() for c in self.conflicts],
            "needed_by": self.needed_by,
            "broader": [{"class": cls, "needs": rung} for cls, rung in self.broader],
            "exports": self.exports(),
            "inherited_env": self.inherited_env,
            "lines": self.lines(),
        }


def _setting(rung: Rung) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    return tuple(sorted(rung.set.items())), tuple(rung.unset_families)


def _assignments(rung: Rung) -> str:
    """``VAR=VALUE ...`` as the .env file writes them (the unset text for ``clean``)."""
    parts = [rung_env_text(Rung(rung.name, unset_families=rung.unset_families))] if rung.unset_families else []
    parts += [f"{k}={v}" for k, v in sorted(rung.set.items())]
    return " ".join(parts) or "nothing to set"


# --------------------------------------------------------------------------------------------
# from a run to a recommendation
# --------------------------------------------------------------------------------------------


def _rung_of(record: CaseRecord) -> str:
    return record.env_name or ""  # every record a recommendation reads names its rung (``CaseRecord.counts``)


def _failing_cases(records: list[CaseRecord]) -> tuple[tuple[str, str], ...]:
    """(nodeid, verdict) of every record of the cases that never passed."""
    passed = {case_of(r) for r in records if r.outcome is Verdict.PASS}
    return tuple((r.nodeid, r.verdict_text) for r in records if case_of(r) not in passed)


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _figures(record: CaseRecord) -> dict[str, float]:
    """Bandwidth figures of one record: ``bandwidth_gbps`` and ``metrics.busbw_gbps`` per size."""
    probe = record.probe or "?"
    found: dict[str, float] = {}
    if _number(record.bandwidth_gbps):
        found[probe] = float(record.bandwidth_gbps)
    metrics = record.metrics
    busbw = metrics.get("busbw_gbps") if isinstance(metrics, Mapping) else None
    for size, number in busbw.items() if isinstance(busbw, Mapping) else ():
        if _number(number):
            found[f"{probe} busbw {size}"] = float(number)
    return found


def _mean_figures(records: Iterable[CaseRecord]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for record in records:
        for figure, number in _figures(record).items():
            values.setdefault(figure, []).append(number)
    return {figure: sum(v) / len(v) for figure, v in values.items()}


def bandwidth_cost(records: list[CaseRecord], rung: str) -> BandwidthCost:
    """The rung's figures against the best passing rung of the class, figure by figure (means)."""
    passing: dict[str, list[CaseRecord]] = {}
    for r in records:
        if r.outcome is Verdict.PASS:
            passing.setdefault(_rung_of(r), []).append(r)
    if not set(passing) - {rung}:
        return BandwidthCost(rung, reason=f"only {rung} passed")
    means = {name: _mean_figures(found) for name, found in passing.items()}
    if not means.get(rung):
        return BandwidthCost(rung, reason=f"no bandwidth figure on {rung}")
    comparisons = []
    for figure, gbps in sorted(means[rung].items()):
        others = {name: m[figure] for name, m in means.items() if name != rung and figure in m}
        if others:
            best_rung, best = max([(rung, gbps), *others.items()], key=lambda item: item[1])
            comparisons.append(FigureCost(figure, round(gbps, 4), round(best, 4), best_rung))
    if not comparisons:
        return BandwidthCost(rung, reason=f"no figure measured both on {rung} and on another passing rung")
    return BandwidthCost(rung, tuple(comparisons))


def _class_advice(name: str, rung: Rung | None, records: list[CaseRecord], ladder: Sequence[Rung]) -> ClassAdvice:
    if rung is None:
        failing = _failing_cases(records)
        ran = {_rung_of(r) for r in records if (r.nodeid, r.verdict_text) in failing}
        return ClassAdvice(name, None, failing=failing, tried=tuple(r.name for r in ladder if r.name in ran))
    on_rung = tuple(
        (r.nodeid, r.verdict_text) for r in records if r.env_name == rung.name and r.outcome is not Verdict.PASS
    )
    return ClassAdvice(name, rung, bandwidth_cost(records, rung.name), not_passing_on_rung=on_rung)


def _join(classes: Sequence[ClassAdvice], ladder: Sequence[Rung]) -> tuple[dict[str, str], list[Conflict]]:
    """The union of the classes' variables; a variable set differently takes the later rung's value."""
    order = {r.name: i for i, r in enumerate(ladder)}
    wanted: dict[str, list[tuple[str, str, str]]] = {}
    for advice in classes:
        if advice.rung is not None:
            for variable, value in advice.rung.set.items():
                wanted.setdefault(variable, []).append((value, advice.rung.name, advice.name))
    env: dict[str, str] = {}
    conflicts = []
    for variable, wants in sorted(wanted.items()):
        value, rung, _ = max(wants, key=lambda w: order.get(w[1], len(order)))
        env[variable] = value
        if len({w[0] for w in wants}) > 1:
            conflicts.append(Conflict(variable, value, rung, tuple(wants)))
    return env, conflicts


def _needed_by(classes: Sequence[ClassAdvice], env: dict[str, str], unset: tuple[str, ...]) -> dict[str, list[str]]:
    needed: dict[str, list[str]] = {}
    if unset:
        text = rung_env_text(Rung("overall", unset_families=unset))
        needed[text] = [c.name for c in classes if c.rung is not None and c.rung.unset_families]
    for variable, value in sorted(env.items()):
        needed[f"{variable}={value}"] = [
            c.name for c in classes if c.rung is not None and c.rung.set.get(variable) == value
        ]
    return needed


def _wrong_data(records: list[CaseRecord]) -> list[WrongData]:
    return [WrongData(r.nodeid, link_class_of(r), r.env_name, r.summary) for r in records if r.outcome is Verdict.FAIL]


def recommend(run: Run) -> Recommendation:
    """The recommendation for a finished run (its ladder: :func:`conformance.summarise.summary.run_ladder`)."""
    ladder = run_ladder(run)
    records = ladder_cases(run.records)  # a cross-node case once; no probe that uses no NCCL
    by_class: dict[str, list[CaseRecord]] = {}
    for r in records:
        by_class.setdefault(link_class_of(r), []).append(r)
    first = first_passing_rungs(records, ladder)
    classes = [_class_advice(name, rung, by_class[name], ladder) for name, rung in first.items()]
    env, conflicts = _join(classes, ladder)
    unset: list[str] = []
    for advice in classes:
        for family in advice.rung.unset_families if advice.rung else ():
            if family not in unset:
                unset.append(family)
    inherited = run.facts.inherited_env
    wrong = _wrong_data(counted_cases(run.records))  # wrong data anywhere, a peer copy's too
    return Recommendation(
        run_id=run.run_id,
        source=run.source,
        simulated=run.simulated,
        unfit=bool(wrong),
        classes=classes,
        wrong_data=wrong,
        env=env,
        unset_families=tuple(unset),
        conflicts=conflicts,
        needed_by=_needed_by(classes, env, tuple(unset)),
        inherited_env={str(k): str(v) for k, v in inherited.items()} if isinstance(inherited, Mapping) else {},
        incomplete=run.facts.incomplete,
        harness_errors=run.facts.harness_errors,
        cpu_only=run.facts.cpu_only,
        config=NcclConfig.from_json(run.facts.nccl_config),
    )


def write_env_file(run: Run, recommendation: Recommendation) -> Path:
    """``recommended.env`` in the run folder; returns its path (OSError when it cannot be written)."""
    if run.folder is None:
        raise RunError(f"{run.source}: no run folder to write {ENV_FILE} into")
    path = run.folder / ENV_FILE
    write_atomic(path, recommendation.env_text())
    return path


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------
