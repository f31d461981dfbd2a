"""Reading a finished run back: a run folder, its results.jsonl, or a JUnit XML from --junitxml.

What is whole is read; what is not (a line cut off by a kill, a record of a newer schema, a
record with a field of the wrong type) is skipped and said in ``Run.warnings``.  What cannot be
read at all raises :class:`RunError` with a one-line message naming the file: a run.json that is
there but unusable (a missing one is no facts), and a run with nothing of this suite's in it
(only skipped lines, or only records without a verdict and a test id).  Every command reads runs
here, so each refuses the same inputs with the same words.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.common.inputs import json_type_name, wrong_field_type
from conformance.common.jsonl import JsonlError, read_lines
from conformance.record.records import SCHEMA, CaseRecord, FactsError, RunFacts, record_from_junit_properties
from conformance.record.results import LATEST, RESULTS_FILE

RUN_FACTS = "run.json"
SUITE_PROPERTY_PREFIX = "conformance.run."


class RunError(ValueError):
    """A run cannot be read; the message says which file and why."""


@dataclass
class Run:
    source: str
    facts: RunFacts
    records: list[CaseRecord]
    warnings: list[str] = field(default_factory=list)
    folder: Path | None = None  # where reports about this run are written

    @property
    def run_id(self) -> str | None:
        return self.facts.run_id or next((r.run_id for r in self.records if r.run_id), None)

    @property
    def usable_records(self) -> list[CaseRecord]:
        """The records of cases this suite ran (``CaseRecord.usable``)."""
        return [r for r in self.records if r.usable]

    @property
    def simulated(self) -> bool:
        return self.facts.simulated or any(r.simulated for r in self.records)

    @property
    def versions(self) -> dict[str, str | None]:
        """Driver, CUDA driver, NCCL and torch, from the run facts and the NCCL logs."""
        topology = self.facts.topology or {}
        nccl = next(((r.nccl or {})["version"] for r in self.records if (r.nccl or {}).get("version")), None)
        return {
            "driver": topology.get("driver") or self.facts.driver,  # merged JUnit suite properties
            "cuda": topology.get("cuda_driver") or self.facts.cuda,
            "nccl": nccl or self.facts.nccl,
            "torch": self.facts.torch,
        }


def run_facts(data: object) -> RunFacts:
    """run.json's facts (none when it is missing or not an object); RunError for an unusable ladder."""
    try:
        return RunFacts.from_json(data if isinstance(data, dict) else {})
    except FactsError as exc:
        raise RunError(str(exc)) from None


def resolve_run_path(argument: str | None, reports_dir: Path) -> Path:
    """A run named on the command line, or the newest run (``reports/latest``)."""
    if argument:
        path = Path(argument)
        if not path.exists() and (reports_dir / argument).exists():
            path = reports_dir / argument  # a bare run id
        return path
    return reports_dir / LATEST


def read_jsonl(path: Path) -> tuple[list[CaseRecord], list[str]]:
    """Every whole record of this schema or older; what was skipped, as warnings."""
    try:
        read = read_lines(path, missing_ok=False)
    except JsonlError as exc:
        raise RunError(str(exc)) from None
    warnings = [f"{path}: {problem}; skipped" for problem in read.skipped]
    records: list[CaseRecord] = []
    newer = 0
    for number, data in zip(read.numbers, read.objects, strict=True):
        record = _record(data)
        if record is None:
            newer += 1
        elif isinstance(record, str):
            warnings.append(f"{path}: line {number} is not a record of this suite ({record}); skipped")
        else:
            records.append(record)
    if newer:
        warnings.append(f"{path}: {newer} record(s) of a newer schema than {SCHEMA} skipped; upgrade the suite")
    return records, warnings


def _record(data: dict[str, object]) -> CaseRecord | str | None:
    """The record a line holds; None for a newer schema; what is wrong with it, as text."""
    schema = data.get("schema", 0) or 0
    if type(schema) is not int:
        return f"schema is {schema!r}, not a whole number"
    if schema > SCHEMA:
        return None
    problem = wrong_field_type(data, CaseRecord, lenient=True)
    if problem:
        return problem
    try:
        return CaseRecord.from_json(data)
    except (TypeError, ValueError, AttributeError) as exc:
        return str(exc)


def read_run_facts(path: Path) -> RunFacts:
    """``run.json``'s facts; none when it is missing, RunError naming the file when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return RunFacts()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise RunError(f"{path}: cannot be read: {reason}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RunError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: holds a JSON {json_type_name(data)}, not an object of run facts")
    try:
        facts = RunFacts.from_json(data)
    except FactsError as exc:  # its message starts "run.json: "
        raise RunError(f"{path.parent}/{exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise RunError(f"{path}: not the run facts this suite writes: {exc}") from None
    problem = wrong_field_type(data, RunFacts, lenient=True)
    if problem:
        raise RunError(f"{path}: {problem}")
    return facts


def _facts_beside(path: Path) -> RunFacts:
    return read_run_facts(path / RUN_FACTS if path.is_dir() else path.with_name(RUN_FACTS))


def unusable(run: Run) -> str | None:
    """Why a run holds nothing of this suite's (only unreadable lines, or only others' records); None if it does.

    A run with no lines at all is not refused here: what an empty run means is each command's to say.
    """
    if not run.records and run.warnings:
        return f"{run.source}: no readable record ({run.warnings[0]})"
    left_out = len(run.records) - len(run.usable_records)
    if run.records and left_out == len(run.records):
        return f"{run.source}: no record of this suite (none of {left_out} has a verdict and a test id)"
    return None


def read_junit(path: Path) -> Run:
    """Records from the ``conformance.*`` properties of each test case; suite facts from merge-junit."""
    from junitparser import JUnitXml, TestSuite
    from junitparser.junitparser import JUnitXmlError

    try:
        xml = JUnitXml.fromfile(str(path))
    except (OSError, JUnitXmlError, SyntaxError, ValueError) as exc:
        raise RunError(f"{path}: not a readable JUnit XML file: {exc}") from None
    suites: list[TestSuite] = [xml] if isinstance(xml, TestSuite) else list(xml)
    run = Run(source=str(path), facts=RunFacts(), records=[], folder=path.parent)
    facts: dict[str, object] = {}  # the suite properties, as JSON values
    for suite in suites:
        facts |= _suite_facts(suite)
        for case in suite:
            _add_junit_record(run, case)
    if not run.records and not run.warnings:
        raise RunError(
            f"{path}: no test case carries the suite's conformance.* properties (was it written by this suite?)"
        )
    problem = wrong_field_type(facts, RunFacts, lenient=True)
    if problem:
        raise RunError(f"{path}: suite property {SUITE_PROPERTY_PREFIX}{problem}")
    run.facts = run_facts(facts)
    return run


def _suite_facts(suite: Any) -> dict[str, object]:
    properties = suite.properties()
    prefix = SUITE_PROPERTY_PREFIX
    return {p.name[len(prefix) :]: _json_or_text(p.value) for p in properties if p.name.startswith(prefix)}


def _add_junit_record(run: Run, case: Any) -> None:
    """The case's record, or a warning naming the case when its properties cannot be read back."""
    from junitparser import Properties

    found = case.child(Properties)
    try:
        record = record_from_junit_properties({p.name: p.value for p in found} if found is not None else {})
        problem = wrong_field_type(asdict(record), CaseRecord, lenient=True) if record is not None else ""
    except (TypeError, ValueError, AttributeError) as exc:
        problem = str(exc)
    if problem:
        run.warnings.append(f"{run.source}: test case {case.name!r} is not a record of this suite ({problem}); skipped")
    elif record is not None:
        run.records.append(record)


def _json_or_text(text: str | None) -> object:
    try:
        return json.loads(text or "")
    except ValueError:
        return text


def load_run(path: Path) -> Run:
    """A run folder, a results.jsonl or a JUnit XML file; RunError for one that holds nothing of this suite's."""
    run = _read_run(path)
    problem = unusable(run)
    if problem:
        raise RunError(problem)
    return run


def _read_run(path: Path) -> Run:
    if path.is_dir():
        results = path / RESULTS_FILE
        if not results.exists():
            raise RunError(f"{path}: not a run folder (no {RESULTS_FILE})")
        records, warnings = read_jsonl(results)
        return Run(str(path), _facts_beside(path), records, warnings, folder=path.resolve())
    if not path.exists():
        raise RunError(f"{path}: no such run folder or file")
    if path.suffix == ".xml":
        return read_junit(path)
    records, warnings = read_jsonl(path)
    return Run(str(path), _facts_beside(path), records, warnings, folder=path.parent.resolve())
