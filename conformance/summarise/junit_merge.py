"""``python -m conformance merge-junit -o OUT IN...``: one JUnit file for CI, valid against the xunit2 schema.

Every ``<testsuite>`` of every input is kept whole (its properties, test cases, output and results)
under one ``<testsuites>``, whose counts are the suites' sums (tests, failures, errors and time:
the schema has no ``skipped`` there).  Each suite names its run, as the run's pytest wrote it
(``JunitRun``: ``conformance.run_id``, ``conformance.results``); it gets that run's facts from the
``run.json`` beside its results as suite properties ``conformance.run.<key>`` (host, gpus, driver,
cuda, nccl, torch, run_id, simulated), for people reading the file in CI.  compare, recommend and
report read the records from the results files the suites name (``runs.read_junit``), not from these.

A value is written as plain text when it reads back as that text, as JSON otherwise (``"12.0"``
for CUDA 12.0, ``true``, ``null``, the ``gpus`` object), so no fact reads as another.

Refused before OUT is touched (:class:`MergeError`, one line): no input; OUT that is one of the
inputs, a directory, or an existing file merge-junit did not write; an input named twice; a
testsuite that names no run (not this suite's, or written before testsuites did); a run.json that
is there but unusable.  Warnings (the merge is written): test cases of one run in two inputs (kept
as they are: CI counts them twice; the records are read once); a run folder without run.json (its
suites get no run facts).  OUT is written beside itself and renamed into place, so a failed write
leaves it as it was.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import NotParsed, json_value, xml_root
from conformance.common.inputs import (
    NO_JUNITPARSER,
    RUN_FILE_BYTES,
    NotReadable,
    absolute,
    junitparser_missing,
    read_bounded,
)
from conformance.common.xml_text import junit_text, write_junit
from conformance.record.records import JunitRun
from conformance.record.results import RESULTS_FILE
from conformance.record.runs import RUN_FACTS, Run, RunError, read_jsonl, read_run_facts, suite_run

RUN_PROPERTY_PREFIX = "conformance.run."
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


@dataclass(frozen=True)
class Input:
    """One input file: its suites, and the run each names."""

    path: Path
    suites: list[Any]
    runs: list[JunitRun]


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------


def read_suites(path: Path) -> list[Any]:
    """The ``<testsuite>`` elements of one JUnit file (a bare ``<testsuite>`` root counts as one)."""
    if junitparser_missing():
        raise MergeError(f"{path}: {NO_JUNITPARSER}; it is not installed here")
    from junitparser import JUnitXml
    from junitparser.junitparser import JUnitXmlError

    try:
        data = read_bounded(path, RUN_FILE_BYTES)
    except NotReadable as exc:
        raise MergeError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise MergeError(f"{path}: no such file") from None
    except OSError as exc:
        raise MergeError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        xml_root(data)  # bounded in depth before junitparser reads it (and the merge writes it back by recursion)
        xml = JUnitXml.fromfile(io.BytesIO(data))
    except (JUnitXmlError, SyntaxError, ValueError) as exc:
        raise MergeError(f"{path}: not a readable JUnit XML file: {exc}") from None
    return list(xml)


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
    run = Run(str(folder), facts, records)
    versions, gpus = run.versions, run.machine.gpus
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
    """``value`` as a property's text: plain when it reads as nothing else, JSON otherwise."""
    if isinstance(value, str):
        try:
            json_value(value)
        except NotParsed:
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
        if str(prop.name).startswith(RUN_PROPERTY_PREFIX):
            props.remove(prop)
    for key in RUN_PROPERTY_KEYS:
        # escaped here too: lxml, where junitparser finds it, refuses a character XML forbids as it is set
        value = junit_text(property_text(properties.get(key)))
        props.add_property(Property(f"{RUN_PROPERTY_PREFIX}{key}", value))


def _check_output(out: Path, inputs: Sequence[Path]) -> None:
    """OUT may only replace an earlier merge (or an empty file): never an input, nor a file someone else wrote."""
    try:
        absolute(out)
    except NotReadable as exc:
        raise MergeError(f"--output {out} {exc}") from None
    if out.exists() and not out.is_dir() and not out.is_file():
        raise MergeError(f"--output {out} is not a regular file (a named pipe or a device?); name the merged file")
    for path in inputs:
        if _same_file(out, path):
            raise MergeError(f"--output {out} is also an input ({path}); write the merged file elsewhere")
    if out.is_dir():
        raise MergeError(f"--output {out} is a directory; name the merged file")
    if out.exists() and out.stat().st_size and not _written_by_merge(out):
        raise MergeError(f"--output {out} exists and was not written by merge-junit; not overwritten")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return absolute(a) == absolute(b) or (a.exists() and b.exists() and a.samefile(b))
    except OSError:  # a loop among them (NotReadable): read, each is refused for what it is
        return False


def _written_by_merge(path: Path) -> bool:
    try:
        root = xml_root(read_bounded(path, RUN_FILE_BYTES))
    except (OSError, NotParsed):
        return False
    return root.tag == "testsuites" and root.get("name") == MERGED_NAME


def _check_inputs_named_once(inputs: Sequence[Path]) -> None:
    for number, path in enumerate(inputs):
        earlier = next((p for p in inputs[:number] if _same_file(p, path)), None)
        if earlier is not None:
            named = str(path) if str(earlier) == str(path) else f"{path} (as {earlier})"
            raise MergeError(f"IN {named} is named twice; each case must be merged once")


def _read_input(path: Path) -> Input:
    """The file's suites and their runs; MergeError for a suite that names none (not this suite's)."""
    suites = read_suites(path)
    runs = []
    for suite in suites:
        named = suite_run(suite)
        if named is None:
            raise MergeError(
                f"{path}: testsuite {suite.name!r} carries none of the suite's conformance.* properties "
                "(was it written by this suite?)"
            )
        runs.append(named)
    return Input(path, suites, runs)


def _twice(inputs: Sequence[Input]) -> list[str]:
    """A warning for each pair of inputs that hold test cases of one run (merged, CI counts them twice)."""
    first_seen: dict[tuple[str, str, str], Path] = {}
    twice: Counter[tuple[Path, Path, str]] = Counter()
    for found in inputs:
        for suite, run in zip(found.suites, found.runs, strict=True):
            for case in suite:
                seen = first_seen.setdefault((run.run_id, str(case.classname), str(case.name)), found.path)
                if seen != found.path:
                    twice[(seen, found.path, run.run_id)] += 1
    return [
        f"{count} test case(s) of run {run_id} are in both {a} and {b}; merged as they are (CI counts them twice)"
        for (a, b, run_id), count in twice.items()
    ]


def merge(out: Path, inputs: Sequence[Path]) -> Merge:
    """Merge ``inputs`` into ``out`` with each suite's run facts; MergeError for bad input, before OUT is touched."""
    if not inputs:
        raise MergeError("no input JUnit files given")
    if junitparser_missing():
        raise MergeError(f"merging JUnit files: {NO_JUNITPARSER}; it is not installed here")
    from junitparser import JUnitXml

    _check_output(out, inputs)
    _check_inputs_named_once(inputs)
    read = [_read_input(path) for path in inputs]
    result = Merge(out, files=len(inputs), warnings=_twice(read))
    merged = JUnitXml(MERGED_NAME)
    facts: dict[Path, dict[str, object] | None] = {}
    for found in read:
        for suite, run in zip(found.suites, found.runs, strict=True):
            merged.append(suite)  # type: ignore[no-untyped-call]  # as it is: add_testsuite folds equal-looking suites
            folder = Path(run.results).parent
            if folder not in facts:
                facts[folder] = _facts_or_warning(folder, result)
            if facts[folder] is not None:
                set_run_properties(suite, facts[folder] or {})
    suites = [suite for found in read for suite in found.suites]
    result.suites, result.cases = len(suites), sum(1 for suite in suites for _ in suite)
    _totals(merged, suites)
    _write_whole(merged, out)
    return result


def _write_whole(merged: Any, out: Path) -> None:
    """Written beside OUT and renamed over it, so a failed write leaves OUT as it was."""
    try:
        write_junit(out, merged._elem)  # the suite's one JUnit writer (its one escape)
    except OSError as exc:
        raise MergeError(f"{out}: cannot be written: [Errno {exc.errno}] {exc.strerror}") from None


def _facts_or_warning(folder: Path, result: Merge) -> dict[str, object] | None:
    try:
        properties = run_properties(folder)
    except RunError as exc:
        raise MergeError(f"{exc}; fix or remove it") from None
    except MergeError as exc:
        result.warnings.append(f"{exc}; no run properties added for it")
        return None
    result.runs.append(str(folder))
    return properties


def _totals(merged: Any, suites: list[Any]) -> None:
    """The root's counts from the suites' own (each suite is left exactly as its input had it).

    No ``skipped``: the xunit2 schema does not allow it on ``<testsuites>`` (each suite keeps its own).
    """
    for name in ("tests", "failures", "errors"):
        setattr(merged, name, sum(int(getattr(s, name) or 0) for s in suites))
    merged.time = round(sum(float(s.time or 0) for s in suites), 3)


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------
