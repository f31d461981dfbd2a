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
The result is a ``recommendation.Recommendation``: printed as ``export`` lines and written to
``recommended.env`` in the run folder (``env_file.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeGuard

from conformance.common.verdicts import Verdict
from conformance.discover.nccl_config import NcclConfig
from conformance.plan.matrix import Rung
from conformance.record.records import CaseRecord
from conformance.record.runs import Run
from conformance.summarise.recommendation import (
    BandwidthCost,
    ClassAdvice,
    Conflict,
    FigureCost,
    Recommendation,
    WrongData,
)
from conformance.summarise.summary import (
    case_of,
    counted_cases,
    first_passing_rungs,
    ladder_cases,
    link_class_of,
    run_ladder,
    rung_env_text,
)

UNFIT_STATUS = 1  # the command's exit status when any case delivered wrong data


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
