"""``python -m conformance merge-junit OUT IN... [--run RUN] [--reports-dir DIR]``: one JUnit file for CI.

Every ``<testsuite>`` of every input is kept whole (its test cases with their ``conformance.*``
properties, output and results) under one ``<testsuites>``.  Each suite gets the facts of the run
its cases belong to as suite properties ``conformance.run.<key>`` (host, gpus, driver, cuda, nccl,
torch, run_id, simulated), from ``run.json`` in the run folder: the one ``--run`` names, else
``<reports dir>/<run id>`` for the run id the suite's cases carry, else (no input carries a run id)
``<reports dir>/latest``.  :func:`conformance.record.runs.read_junit` reads these back into ``Run.facts``.

A value is written as plain text when it reads back as that text, as JSON otherwise (``"12.0"``
for CUDA 12.0, ``true``, ``null``, the ``gpus`` object), so every fact round-trips exactly.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.record.records import JUNIT_PREFIX
from conformance.record.results import LATEST, RESULTS_FILE
from conformance.record.runs import (
    RUN_FACTS,
    SUITE_PROPERTY_PREFIX,
    Run,
    RunError,
    read_jsonl,
    resolve_run_path,
    run_facts,
)

RUN_ID_PROPERTY = f"{JUNIT_PREFIX}run_id"
RUN_PROPERTY_KEYS = ("host", "gpus", "driver", "cuda", "nccl", "torch", "run_id", "simulated")
MERGED_NAME = "conformance"


class MergeError(ValueError):
    """An input (or the output) cannot be used; the message is one line."""


@dataclass
class Merge:
    """What :func:`merge` wrote: the case count and which run folders gave suite properties."""

    out: Path
    files: int = 0
    suites: int = 0
    cases: int = 0
    runs: list[str] = field(default_factory=list)  # run folders whose facts were added
    warnings: list[str] = field(default_factory=list)

    def line(self) -> str:
        source = f"run properties from {', '.join(self.runs)}" if self.runs else "no run properties"
        merged = f"{self.cases} test case(s) in {self.suites} suite(s) from {self.files} file(s)"
        return f"merged {merged} into {self.out}; {source}"


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------


def read_suites(path: Path) -> list[Any]:
    """The ``<testsuite>`` elements of one JUnit file (a bare ``<testsuite>`` root counts as one)."""
    from junitparser import JUnitXml
    from junitparser.junitparser import JUnitXmlError

    if not path.is_file():
        raise MergeError(f"{path}: no such file")
    try:
        xml = JUnitXml.fromfile(str(path))
    except (OSError, JUnitXmlError, SyntaxError, ValueError) as exc:
        raise MergeError(f"{path}: not a readable JUnit XML file: {exc}") from None
    return list(xml)


def suite_run_id(suite: Any) -> str | None:
    """The run id the suite's first conformance case carries (``conformance.run_id``)."""
    from junitparser import Properties

    for case in suite:
        found = case.child(Properties)
        for prop in found if found is not None else ():
            if prop.name == RUN_ID_PROPERTY and prop.value and prop.value != "null":  # null: JSON for None
                return str(prop.value)
    return None


def run_properties(folder: Path) -> dict[str, object]:
    """The suite properties of one run, from its ``run.json`` (and the NCCL version its records saw)."""
    try:
        data = json.loads((folder / RUN_FACTS).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MergeError(f"{folder}: no readable {RUN_FACTS} ({exc})") from None
    if not isinstance(data, dict):
        raise MergeError(f"{folder / RUN_FACTS}: not a JSON object")
    try:
        facts = run_facts(data)
    except RunError as exc:
        raise MergeError(f"{folder}: no readable {RUN_FACTS} ({exc})") from None
    try:
        records = read_jsonl(folder / RESULTS_FILE)[0] if (folder / RESULTS_FILE).exists() else []
    except RunError:
        records = []
    versions = Run(str(folder), facts, records).versions
    topology = facts.topology if isinstance(facts.topology, Mapping) else {}
    gpus = [d for d in topology.get("devices") or [] if isinstance(d, Mapping) and d.get("kind") == "gpu"]
    return {
        "host": facts.host,
        "gpus": {"count": len(gpus), "models": dict(sorted(Counter(str(d.get("model")) for d in gpus).items()))},
        "driver": versions["driver"],
        "cuda": versions["cuda"],
        "nccl": versions["nccl"],
        "torch": versions["torch"],
        "run_id": facts.run_id,
        "simulated": facts.simulated,
    }


def property_text(value: object) -> str:
    """Text that runs.read_junit reads back as ``value``: plain when unambiguous, JSON otherwise."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True)


# --------------------------------------------------------------------------------------------
# merging
# --------------------------------------------------------------------------------------------


def set_run_properties(suite: Any, properties: Mapping[str, object]) -> None:
    """Replace the suite's ``conformance.run.*`` properties; its ``<properties>`` comes first, as in the schema."""
    from junitparser import Properties, Property

    props = suite.child(Properties)
    if props is None:
        props = Properties()  # type: ignore[no-untyped-call]
        suite._elem.insert(0, props._elem)
    for prop in list(props):
        if str(prop.name).startswith(SUITE_PROPERTY_PREFIX):
            props.remove(prop)
    for key in RUN_PROPERTY_KEYS:
        props.add_property(Property(f"{SUITE_PROPERTY_PREFIX}{key}", property_text(properties.get(key))))


def _run_folders(suites: list[Any], run: Path | None, reports_dir: Path) -> list[Path | None]:
    """The run folder of each suite: --run, its cases' run id, the inputs' only run id, or latest."""
    if run is not None:
        return [run] * len(suites)
    own = [suite_run_id(s) for s in suites]
    known = {r for r in own if r}
    if not known:
        return [reports_dir / LATEST] * len(suites)
    only = next(iter(known)) if len(known) == 1 else None
    folders: list[Path | None] = []
    for run_id in own:
        name = run_id or only
        folders.append(reports_dir / name if name else None)
    return folders


def _explicit_run(argument: str | None, reports_dir: Path) -> Path | None:
    if argument is None:
        return None
    path = resolve_run_path(argument, reports_dir)
    folder = path.parent if path.is_file() else path  # a run's results.jsonl or JUnit file names its folder
    if not (folder / RUN_FACTS).is_file():
        raise MergeError(f"--run {argument}: {folder} is not a run folder (no {RUN_FACTS})")
    return folder


def merge(out: Path, inputs: Sequence[Path], run: str | None = None, reports_dir: Path = Path("reports")) -> Merge:
    """Merge ``inputs`` into ``out`` with each suite's run facts; MergeError for bad input."""
    from junitparser import JUnitXml

    if not inputs:
        raise MergeError("no input JUnit files given")
    explicit = _explicit_run(run, reports_dir)
    suites = [suite for path in inputs for suite in read_suites(path)]
    result = Merge(out, files=len(inputs), suites=len(suites))
    merged = JUnitXml(MERGED_NAME)
    facts: dict[Path, dict[str, object] | None] = {}
    for suite, folder in zip(suites, _run_folders(suites, explicit, reports_dir), strict=True):
        merged.append(suite)  # type: ignore[no-untyped-call]  # as it is: add_testsuite folds equal-looking suites
        result.cases += sum(1 for _ in suite)
        if folder is None:
            result.warnings.append(f"suite {suite.name!r}: its cases carry no run id; no run properties added")
            continue
        if folder not in facts:
            facts[folder] = _facts_or_warning(folder, result)
        if facts[folder] is not None:
            set_run_properties(suite, facts[folder] or {})
    _totals(merged, suites)
    try:
        merged.write(str(out))
    except OSError as exc:
        raise MergeError(f"{out}: cannot be written: {exc}") from None
    return result


def _facts_or_warning(folder: Path, result: Merge) -> dict[str, object] | None:
    try:
        properties = run_properties(folder)
    except MergeError as exc:
        result.warnings.append(f"{exc}; no run properties added for it")
        return None
    result.runs.append(str(folder))
    return properties


def _totals(merged: Any, suites: list[Any]) -> None:
    """The root's counts from the suites' own (each suite is left exactly as its input had it)."""
    for name in ("tests", "failures", "errors", "skipped"):
        setattr(merged, name, sum(int(getattr(s, name) or 0) for s in suites))
    merged.time = round(sum(float(s.time or 0) for s in suites), 3)


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------
