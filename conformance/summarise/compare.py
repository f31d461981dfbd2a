"""Baseline comparison: ``python -m conformance compare BASELINE CURRENT``.

Each side is a run folder, a ``results.jsonl`` or a JUnit XML written with ``--junitxml``.  Cases
are matched by what they test, not by the names a run happened to give the devices:

* the probe;
* the devices by identity (``device_ids``: GPU UUIDs), so the same physical GPUs match whatever
  ``CUDA_VISIBLE_DEVICES`` order named them ``gpu0..``, and another machine's GPUs never do;
* the kind of set (pair, all, single, ...);
* the test id (module file, test, parameters) with each device name replaced by its id and a pair's
  link class left out: a pair whose link changed (``NV18`` -> ``NV17``, ``PIX`` -> ``PHB``) is the
  same case, and the change a regression (``link changed``), not a case gone and another new;
* the environment rung (``env_name``).

The machines are compared too: a GPU of the baseline's machine that the current machine's NVML no
longer lists (by bus id, whatever ``CUDA_VISIBLE_DEVICES`` shows; ``run.json``'s
``topology.inventory``) is a regression ``GPU lost``.

What a comparison reports, and how it reads, is ``conformance.summarise.comparison``.

Exit status: 0 without regressions, 1 with regressions, 2 for bad input (a run that cannot be
read, two empty runs, runs from different machines without ``--allow-different-machines``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from conformance.common.casefiles import write_json_atomic
from conformance.common.verdicts import Verdict
from conformance.discover.nvml_topology import sysfs_bus_id
from conformance.record.records import CaseRecord
from conformance.record.runs import Run, unusable
from conformance.summarise.comparison import (
    DEFAULT_TOLERANCE,
    CaseVerdict,
    Comparison,
    MachineChange,
    case_fields,
    run_host,
)
from conformance.summarise.summary import counted_cases
from conformance.summarise.watched import run_watch_findings

COMPARISON_FILE = "comparison.json"  # the last comparison of a run against a baseline, in its folder

CaseKey = tuple[str, tuple[str, ...], str, str, str]  # probe, device ids, kind of set, test id, rung


class CompareError(ValueError):
    """The two runs cannot be compared; the message is one line."""


# --------------------------------------------------------------------------------------------
# matching
# --------------------------------------------------------------------------------------------


def _device_map(record: CaseRecord) -> dict[str, str]:
    names, ids = record.devices, record.device_ids
    return {str(n): str(i) for n, i in zip(names, ids, strict=False) if n and i and n != i}


def with_device_ids(text: str, record: CaseRecord) -> str:
    """``text`` with each of the record's device names (whole words only) replaced by its id."""
    mapping = _device_map(record)
    if not mapping:
        return text
    names = "|".join(re.escape(name) for name in sorted(mapping, key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9_])({names})(?![A-Za-z0-9_])")
    return pattern.sub(lambda match: mapping[match.group(1)], text)


def without_link(text: str, record: CaseRecord) -> str:
    """A pair's test id less its link class (``[gpu0-gpu1-PIX-inherited]`` -> ``[gpu0-gpu1-inherited]``)."""
    if record.set_kind != "pair" or not record.link:
        return text
    return text.replace(f"-{record.link}-", "-").replace(f"-{record.link}]", "]")


def match_id(record: CaseRecord) -> str:
    """The node id without its folder (the module file, test and parameters), devices by id, no link class.

    Records without a node id fall back on the ladder key (the test id without the rung).
    """
    nodeid = record.nodeid
    if "::" not in nodeid:
        return with_device_ids(without_link(record.ladder_key or nodeid, record), record)
    module, rest = nodeid.split("::", 1)
    return f"{module.rsplit('/', 1)[-1]}::{with_device_ids(without_link(rest, record), record)}"


def case_key(record: CaseRecord) -> CaseKey:
    """One case on one rung, matched between two runs by what it tests (devices by identity)."""
    ids = tuple(str(i) for i in record.device_ids)
    node = record.node_rank  # a multi-node run holds every node's records
    where = match_id(record) if node is None else f"node{node}:{match_id(record)}"
    return (record.probe, ids, record.set_kind or "all", where, str(record.env_name))


def _usable_records(run: Run, warnings: list[str]) -> list[CaseRecord]:
    """The records of this suite (``CaseRecord.usable``); a run with only unreadable lines is refused."""
    problem = unusable(run)
    if problem:
        raise CompareError(problem)
    usable = run.usable_records
    left_out = len(run.records) - len(usable)
    if left_out:
        warnings.append(f"{run.source}: {left_out} record(s) without a verdict or a test id skipped")
    return usable


def _index(source: str, records: list[CaseRecord], warnings: list[str]) -> dict[CaseKey, CaseRecord]:
    cases: dict[CaseKey, CaseRecord] = {}
    repeated = 0
    for record in records:
        key = case_key(record)
        repeated += key in cases
        cases[key] = record
    if repeated:
        warnings.append(f"{source}: {repeated} case(s) recorded more than once; the last record of each is compared")
    return cases


# --------------------------------------------------------------------------------------------
# machines and versions
# --------------------------------------------------------------------------------------------


def run_device_ids(run: Run) -> frozenset[str]:
    """Every device id of the run's machine (run.json's topology), else those its records name."""
    devices = run.machine.devices
    if devices:
        return frozenset(str(d.get("uuid") or d.get("name")) for d in devices)
    return frozenset(str(i) for r in run.records for i in r.device_ids)


def machine_difference(baseline: Run, current: Run) -> str | None:
    """How the two runs' machines differ (host, device ids), or None when they may be the same.

    A run may see part of its machine (CUDA_VISIBLE_DEVICES, -k), so device ids differ only when
    neither side's set contains the other's.
    """
    old_host, new_host = run_host(baseline), run_host(current)
    # a simulated machine is its topology file, whichever host played it: its device ids decide
    played = baseline.simulated and current.simulated
    if old_host and new_host and old_host != new_host and not played:
        return f"hosts differ: {old_host} / {new_host}"
    old, new = run_device_ids(baseline), run_device_ids(current)
    if old and new and not (old <= new or new <= old):
        only_old, only_new = sorted(old - new), sorted(new - old)
        return (
            f"device ids differ: {len(only_old)} only in the baseline ({only_old[0]}, ...), "
            f"{len(only_new)} only in the current run ({only_new[0]}, ...)"
        )
    return None


def lost_gpus(baseline: Run, current: Run) -> list[MachineChange]:
    """The baseline machine's GPUs the current machine's NVML no longer lists (by bus id, visible or not)."""
    now = current.machine.nvml_gpus
    if now is None:
        return []  # a run from before inventories: what its machine had beyond the tested GPUs is unknown
    named = {sysfs_bus_id(str(d.get("pci_bus_id"))): d for d in baseline.machine.devices if d.get("pci_bus_id")}
    before = baseline.machine.nvml_gpus or tuple(named)
    lost = []
    for bus in before:
        if bus in now:
            continue
        device = named.get(bus, {})
        what = f"{device.get('name', '?')} ({device.get('uuid') or 'uuid unknown'}, {bus})"
        summary = f"NVML lists {len(now)} GPU(s) now, {len(before)} in the baseline"
        lost.append(MachineChange(case=what, kind="machine", metric="GPU lost", baseline="present",
                                  current="missing", summary=summary))  # fmt: skip
    return lost


WATCH_METRICS = {"xid": "Xid during the run", "link_errors": "link errors grew", "pcie_gen": "PCIe gen under load",
                 "slowdown": "clocks held down", "gpu_lost": "GPU lost during the run"}  # fmt: skip


def turned_unfit(baseline: Run, current: Run) -> list[MachineChange]:
    """The machine NOT FIT now (wrong data: ``recommend``'s rule) where the baseline's run was fit."""

    def wrong(run: Run) -> list[CaseRecord]:
        return [r for r in counted_cases(run.records) if r.outcome is Verdict.FAIL]

    now = wrong(current)
    if not now or wrong(baseline):
        return []
    named = ", ".join(r.nodeid for r in now[:3]) + (f" and {len(now) - 3} more" if len(now) > 3 else "")
    return [MachineChange(case="the machine", kind="machine", metric="NOT FIT", baseline="fit", current="NOT FIT",
                          summary=f"wrong data: {named}")]  # fmt: skip


def watch_regressions(baseline: Run, current: Run) -> list[MachineChange]:
    """What the current run's watch saw fail that the baseline's did not (``summarise/watched.py``)."""
    before = {f.test_name for f in run_watch_findings(baseline) if f.machine}
    return [
        MachineChange(
            case=f.test_name,
            kind="machine",
            metric=WATCH_METRICS.get(f.kind, "watch"),
            baseline="not seen",
            current="seen",
            summary=f.text,
        )  # fmt: skip
        for f in run_watch_findings(current)
        if f.machine and f.test_name not in before
    ]


# --------------------------------------------------------------------------------------------
# the comparison
# --------------------------------------------------------------------------------------------


def write_comparison(comparison: Comparison) -> Path | None:
    """Keep the comparison with the current run (``comparison.json``), so every report of it shows it.

    None when the current run has no folder to keep it in.
    """
    folder = comparison.current.folder
    if folder is None:
        return None
    path = folder / COMPARISON_FILE
    write_json_atomic(path, comparison.to_json())
    return path


def _ordered(keys: Iterable[CaseKey], wanted: set[CaseKey]) -> list[CaseKey]:
    return [k for k in keys if k in wanted]


def _with_verdict(record: CaseRecord) -> CaseVerdict:
    return {**case_fields(record), "verdict": record.verdict_text}


def compare(
    baseline: Run, current: Run, tolerance: float = DEFAULT_TOLERANCE, allow_different_machines: bool = False
) -> Comparison:
    """Match the cases of two runs and say what changed; CompareError when they cannot be compared."""
    if not 0 < tolerance <= 1:
        raise CompareError(f"bandwidth tolerance {tolerance!r} must be a ratio above 0 and at most 1")
    warnings = [*baseline.warnings, *current.warnings]
    if baseline.facts.incomplete:
        why = f"the baseline run is incomplete ({baseline.facts.incomplete})"
        warnings.append(f"{why}: cases it never ran count as new")
    old = _index(baseline.source, _usable_records(baseline, warnings), warnings)
    new = _index(current.source, _usable_records(current, warnings), warnings)
    if not old and not new:
        raise CompareError(f"both runs are empty ({baseline.source}, {current.source}): no case to compare")
    difference = machine_difference(baseline, current)
    if difference and not allow_different_machines:
        raise CompareError(
            f"the runs come from different machines ({difference}); compare them anyway with --allow-different-machines"
        )
    comparison = Comparison(baseline, current, tolerance, machines=difference, warnings=warnings)
    comparison.baseline_cases, comparison.current_cases = len(old), len(new)
    for key in _ordered(new, set(old)):
        comparison.add_match(old[key], new[key])
    comparison.new = [_with_verdict(new[k]) for k in _ordered(new, set(new) - set(old))]
    comparison.missing = [_with_verdict(old[k]) for k in _ordered(old, set(old) - set(new))]
    comparison.regressions[:0] = lost_gpus(baseline, current) + watch_regressions(baseline, current)
    comparison.regressions[:0] = turned_unfit(baseline, current)
    order = ("machine", "link", "verdict", "bandwidth")  # the machine's own changes explain the cases'
    comparison.regressions.sort(key=lambda r: order.index(r["kind"]))
    return comparison
