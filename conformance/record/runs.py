"""Reading a finished run back: a run folder, its results.jsonl, or a JUnit XML from --junitxml (the run it names).

What is whole is read; what is not (a line cut off by a kill, a record of a newer schema, a
record with a field of the wrong type) is skipped and said in ``Run.warnings``.  What cannot be
read at all raises :class:`RunError` with a one-line message naming the file: a run.json that is
there but unusable (a missing one is no facts), and a run with nothing of this suite's in it
(only skipped lines, or only records without a verdict and a test id).  Every command reads runs
here, so each refuses the same inputs with the same words.
"""

from __future__ import annotations

import errno
import io
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import NotParsed, json_value, xml_root
from conformance.common.inputs import (
    NO_JUNITPARSER,
    RUN_FILE_BYTES,
    NotReadable,
    json_type_name,
    junitparser_missing,
    read_bounded,
    wrong_field_type,
)
from conformance.common.jsonl import JsonlError, read_lines
from conformance.record.machine import MachineFacts
from conformance.record.records import SCHEMA, CaseRecord, FactsError, JunitRun, RunFacts
from conformance.record.results import LATEST, RESULTS_FILE

RUN_FACTS = "run.json"


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

    @cached_property
    def machine(self) -> MachineFacts:
        """The machine the run tested (run.json's topology), read once."""
        return MachineFacts.of(self.facts.topology)

    @property
    def versions(self) -> dict[str, str | None]:
        """Driver, CUDA driver, NCCL and torch, from the run facts and the NCCL logs."""
        nccl = next(((r.nccl or {})["version"] for r in self.records if (r.nccl or {}).get("version")), None)
        return {
            "driver": self.machine.driver,
            "cuda": self.machine.cuda_driver,
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
        unusable = os.path.lexists(reports_dir) and not reports_dir.is_dir()  # a loop, a file: said as its own
        if not path.exists() and ((reports_dir / argument).exists() or unusable):
            path = reports_dir / argument  # a bare run id
        return path
    return reports_dir / LATEST


def read_jsonl(path: Path, missing_ok: bool = False) -> tuple[list[CaseRecord], list[str]]:
    """Every whole record of this schema or older; what was skipped, as warnings (each naming its line)."""
    try:
        read = read_lines(path, missing_ok=missing_ok)
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


def record_from_text(text: str) -> CaseRecord | str:
    """One record sent as a line of JSON (another node's), or why it is no record of this suite's, in words."""
    try:
        data = json_value(text)
    except NotParsed as exc:
        return str(exc)
    if not isinstance(data, dict):
        return f"a JSON {json_type_name(data)}, not a record"
    record = _record(data)
    return f"a record of a newer schema than {SCHEMA}" if record is None else record


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
        text = read_bounded(path, RUN_FILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        return RunFacts()
    except NotReadable as exc:
        raise RunError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise RunError(f"{path}: cannot be read: {reason}") from None
    try:
        data = json_value(text)
    except NotParsed as exc:
        raise RunError(f"{path}: {exc}") from None
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
    """The runs a JUnit file names, read where they were written: a JUnit file holds no record.

    Each ``<testsuite>`` names its run (``JunitRun``: ``conformance.run_id``, ``conformance.results``);
    the records are all of each named run's results.jsonl, read whole, not matched to the file's
    test cases (a test case carries nothing to match by but its name; a run's JUnit file holds
    every test the run ran).  A record found in two named runs (node 0 gathers every node's)
    counts once.  The facts are the first named run's run.json.  So a JUnit file copied away from
    its run folder is not enough: RunError naming the results file it looked for, saying to pass
    the run folder; RunError too for a file in which no testsuite names a run (not this suite's).
    """
    if junitparser_missing():
        raise RunError(f"{path}: {NO_JUNITPARSER}; it is not installed here (or pass the run folder)")
    from junitparser import JUnitXml, TestSuite
    from junitparser.junitparser import JUnitXmlError

    try:
        data = read_bounded(path, RUN_FILE_BYTES)
        xml_root(data)  # bounded in depth before junitparser (and whatever walks its tree) reads it
        xml = JUnitXml.fromfile(io.BytesIO(data))
    except NotReadable as exc:
        raise RunError(f"{path}: {exc}") from None
    except (OSError, JUnitXmlError, SyntaxError, ValueError) as exc:
        raise RunError(f"{path}: not a readable JUnit XML file: {exc}") from None
    suites: list[TestSuite] = [xml] if isinstance(xml, TestSuite) else list(xml)
    named = junit_results(suites)
    if not named:
        raise RunError(
            f"{path}: no testsuite carries the suite's conformance.* properties (was it written by this suite?)"
        )
    for results in named:
        if not results.is_file():
            raise RunError(
                f"{path}: the run's records are not at {results}, where it names them (a JUnit file holds "
                "none of its own); pass the run folder instead"
            )
    run = Run(source=str(path), facts=read_run_facts(named[0].with_name(RUN_FACTS)), records=[], folder=path.parent)
    for results in named:
        _add_records(run, results)
    return run


def suite_run(suite: Any) -> JunitRun | None:
    """The run a JUnit ``<testsuite>`` names; None when it names none."""
    return JunitRun.from_properties({str(p.name): p.value for p in suite.properties()})


def junit_results(suites: list[Any]) -> list[Path]:
    """The results file each testsuite names, each once, in order."""
    found: list[Path] = []
    for suite in suites:
        named = suite_run(suite)
        if named is not None and Path(named.results) not in found:
            found.append(Path(named.results))
    return found


def _add_records(run: Run, results: Path) -> None:
    """A named run's records, less those an earlier named run already gave (node 0 holds every node's)."""
    records, warnings = read_jsonl(results)
    seen = {_identity(r) for r in run.records}
    run.records += [r for r in records if _identity(r) not in seen]
    run.warnings += warnings


def _identity(record: CaseRecord) -> str:
    return json.dumps(record.to_json(), sort_keys=True)


def load_run(path: Path) -> Run:
    """A run folder, a results.jsonl or a JUnit XML file; RunError for one that holds nothing of this suite's."""
    run = _read_run(path)
    problem = unusable(run)
    if problem:
        raise RunError(problem)
    return run


def _read_run(path: Path) -> Run:
    problem = _unreachable(path)
    if problem:
        raise RunError(f"{path}: {problem}")
    if path.is_dir():
        results = path / RESULTS_FILE
        if not results.exists():
            raise RunError(f"{path}: not a run folder (no {RESULTS_FILE})")
        records, warnings = read_jsonl(results)
        return Run(str(path), _facts_beside(path), records, warnings, folder=path.resolve())
    if path.suffix == ".xml":
        return read_junit(path)
    records, warnings = read_jsonl(path)
    return Run(str(path), _facts_beside(path), records, warnings, folder=path.parent.resolve())


def _unreachable(path: Path) -> str:
    """Why a run's path cannot be read at all, in words ("" when it can be looked at)."""
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if exc.errno == errno.ENOENT:
            return "is a broken symbolic link" if path.is_symlink() else "no such run folder or file"
        return f"cannot be read: {exc.strerror or exc}"
    return ""
