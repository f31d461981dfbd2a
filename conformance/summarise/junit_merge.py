"""``python -m conformance merge-junit OUT IN... [--run RUN] [--reports-dir DIR]``: one JUnit file for CI.

Every ``<testsuite>`` of every input is kept whole (its test cases with their ``conformance.*``
properties, output and results) under one ``<testsuites>``.  Each suite gets the facts of the run
its cases belong to as suite properties ``conformance.run.<key>`` (host, gpus, driver, cuda, nccl,
torch, run_id, simulated), from ``run.json`` in the run folder: the one ``--run`` names, else
``<reports dir>/<run id>`` for the run id the suite's cases carry, else (no input carries a run id)
``<reports dir>/latest``.  :func:`conformance.record.runs.read_junit` reads these back into ``Run.facts``.

A value is written as plain text when it reads back as that text, as JSON otherwise (``"12.0"``
for CUDA 12.0, ``true``, ``null``, the ``gpus`` object), so every fact round-trips exactly.

Refused before OUT is touched (:class:`MergeError`, one line): OUT that is also an input, or an
existing file merge-junit did not write (a forgotten OUT would overwrite the first shard); an input
named twice; an input whose test cases carry no ``conformance.*`` property (not this suite's); one
case of one run in two inputs (it would count twice; the same test from two runs is two cases); a
run.json that is there but unusable.  A run folder without run.json is a warning.  OUT is written
beside itself and renamed into place, so a failed write leaves it as it was.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from conformance.record.records import JUNIT_PREFIX
from conformance.record.results import LATEST, RESULTS_FILE
from conformance.record.runs import (
    RUN_FACTS,
    SUITE_PROPERTY_PREFIX,
    Run,
    RunError,
    read_jsonl,
    read_run_facts,
    resolve_run_path,
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

    if path.is_dir():
        raise MergeError(f"{path}: a directory, not a JUnit XML file")
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
    """The suite properties of one run, from its ``run.json`` (and the NCCL version its records saw).

    MergeError when the folder has no run.json (a warning: the suite is merged without them);
    RunError when it has one that cannot be used (bad input, as for every command that reads runs).
    """
    try:
        (folder / RUN_FACTS).open("rb").close()
    except FileNotFoundError as exc:
        raise MergeError(f"{folder}: no readable {RUN_FACTS} ({exc})") from None
    facts = read_run_facts(folder / RUN_FACTS)
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


def _check_output(out: Path, inputs: Sequence[Path]) -> None:
    """OUT may only replace an earlier merge (or an empty file): never an input, nor a file someone else wrote."""
    for path in inputs:
        if _same_file(out, path):
            raise MergeError(f"OUT {out} is also an input ({path}); write the merged file elsewhere")
    if out.is_dir():
        raise MergeError(f"OUT {out} is a directory; name the merged file")
    if out.exists() and out.stat().st_size and not _written_by_merge(out):
        raise MergeError(f"OUT {out} exists and was not written by merge-junit; not overwritten (is OUT missing?)")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def _written_by_merge(path: Path) -> bool:
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return False
    return root.tag == "testsuites" and root.get("name") == MERGED_NAME


def _check_inputs_named_once(inputs: Sequence[Path]) -> None:
    for number, path in enumerate(inputs):
        earlier = next((p for p in inputs[:number] if _same_file(p, path)), None)
        if earlier is not None:
            named = str(path) if str(earlier) == str(path) else f"{path} (as {earlier})"
            raise MergeError(f"IN {named} is named twice; each case must be merged once")


def _check_written_by_suite(path: Path, suites: list[Any]) -> None:
    """A file with test cases of which none carries a ``conformance.*`` property is not this suite's."""
    cases = [case for suite in suites for case in suite]
    if cases and not any(_conformance_properties(case) for case in cases):
        raise MergeError(
            f"{path}: no test case carries the suite's conformance.* properties (was it written by this suite?)"
        )


def _conformance_properties(case: Any) -> list[Any]:
    from junitparser import Properties

    found = case.child(Properties)
    return [p for p in found if str(p.name).startswith(JUNIT_PREFIX)] if found is not None else []


def _check_no_case_twice(files: Sequence[tuple[Path, list[Any]]]) -> None:
    """MergeError for a case of one run that two inputs hold: merged, it would count twice.

    The same test in two different runs is two cases, each suite with its own run's facts.
    """
    first_seen: dict[tuple[str | None, str, str], Path] = {}
    for path, suites in files:
        for suite in suites:
            run_id = suite_run_id(suite)
            for case in suite:
                key = (run_id, str(case.classname), str(case.name))
                seen = first_seen.setdefault(key, path)
                if seen != path:
                    run = f"run {run_id}" if run_id else "no run id"
                    raise MergeError(
                        f"test case {key[1]}::{key[2]} ({run}) is in both {seen} and {path}; merge each case once"
                    )


def _read_inputs(inputs: Sequence[Path]) -> list[tuple[Path, list[Any]]]:
    _check_inputs_named_once(inputs)
    files = [(path, read_suites(path)) for path in inputs]
    for path, suites in files:
        _check_written_by_suite(path, suites)
    _check_no_case_twice(files)
    return files


def merge(out: Path, inputs: Sequence[Path], run: str | None = None, reports_dir: Path = Path("reports")) -> Merge:
    """Merge ``inputs`` into ``out`` with each suite's run facts; MergeError for bad input, before OUT is touched."""
    from junitparser import JUnitXml

    if not inputs:
        raise MergeError("no input JUnit files given")
    _check_output(out, inputs)
    explicit = _explicit_run(run, reports_dir)
    suites = [suite for _, found in _read_inputs(inputs) for suite in found]
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
    _write_whole(merged, out)
    return result


def _write_whole(merged: Any, out: Path) -> None:
    """Written beside OUT and renamed over it, so a failed write leaves OUT as it was."""
    part = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        merged.write(str(part))
        os.replace(part, out)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise MergeError(f"{out}: cannot be written: [Errno {exc.errno}] {exc.strerror}") from None


def _facts_or_warning(folder: Path, result: Merge) -> dict[str, object] | None:
    try:
        properties = run_properties(folder)
    except RunError as exc:
        raise MergeError(f"{exc}; fix or remove it, or name another run folder with --run") from None
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
