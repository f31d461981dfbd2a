"""Reading a finished run back: a run folder, its results.jsonl, or a JUnit XML from --junitxml.

What is whole is read; what is not (a line cut off by a kill, a record of a newer schema) is
skipped and said in ``Run.warnings``.  What cannot be read at all raises :class:`RunError` with a
one-line message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from conformance.common.casefiles import read_json
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
    records = [CaseRecord.from_json(r) for r in read.objects if int(r.get("schema", 0) or 0) <= SCHEMA]
    newer = len(read.objects) - len(records)
    if newer:
        warnings.append(f"{path}: {newer} record(s) of a newer schema than {SCHEMA} skipped; upgrade the suite")
    return records, warnings


def _facts_beside(path: Path) -> RunFacts:
    return run_facts(read_json(path / RUN_FACTS if path.is_dir() else path.with_name(RUN_FACTS)))


def read_junit(path: Path) -> Run:
    """Records from the ``conformance.*`` properties of each test case; suite facts from merge-junit."""
    from junitparser import JUnitXml, Properties, TestSuite
    from junitparser.junitparser import JUnitXmlError

    try:
        xml = JUnitXml.fromfile(str(path))
    except (OSError, JUnitXmlError, SyntaxError, ValueError) as exc:
        raise RunError(f"{path}: not a readable JUnit XML file: {exc}") from None
    suites: list[TestSuite] = [xml] if isinstance(xml, TestSuite) else list(xml)
    records: list[CaseRecord] = []
    facts: dict[str, object] = {}  # the suite properties, as JSON values
    for suite in suites:
        for prop in suite.properties():  # type: ignore[no-untyped-call]
            if prop.name.startswith(SUITE_PROPERTY_PREFIX):
                facts[prop.name[len(SUITE_PROPERTY_PREFIX) :]] = _json_or_text(prop.value)
        for case in suite:
            found = case.child(Properties)  # type: ignore[no-untyped-call]
            record = record_from_junit_properties({p.name: p.value for p in found} if found is not None else {})
            if record is not None:
                records.append(record)
    if not records:
        raise RunError(
            f"{path}: no test case carries the suite's conformance.* properties (was it written by this suite?)"
        )
    return Run(source=str(path), facts=run_facts(facts), records=records, folder=path.parent)


def _json_or_text(text: str | None) -> object:
    try:
        return json.loads(text or "")
    except ValueError:
        return text


def load_run(path: Path) -> Run:
    """A run folder, a results.jsonl or a JUnit XML file."""
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
