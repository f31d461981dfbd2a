"""Every reader of outside data refuses in its own words, whatever it is fed (issue 51, item 2).

One table holds every reader the suite has of data someone else can write: results.jsonl (read
whole, read back by a follower, gathered from another node), run.json, a run folder, JUnit files
read back, topology, scenario and rungs files, a case's files and its ranks' (case.json,
result.json, phase.jsonl, the turn, the flight recorder's dumps), a node's verdict, the
forkserver's pipe, NCCL logs, and diagnose's inputs.  Each row writes its input where the real
reader looks and calls it; the properties feed every row arbitrary bytes, arbitrary JSON (nested
by ``st.recursive``, mixed into a document of the row's own kind so that the reader's later checks
run too) and values nested 100,000 deep built directly: only the row's typed refusal may come out
(or a result that names what it skipped).  A RecursionError, a TypeError from a field of the wrong
type, a KeyError: each is a reader that lets outside data end a run or a command with a traceback.

A last test greps the package: JSON, TOML and pickle are parsed in ``common/bounded_parse.py`` only.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_compare import machine, record

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "conformance"
FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Feed = Callable[[Path, bytes], object]  # writes the input in a fresh folder where the reader looks, and reads it


@dataclass(frozen=True)
class Reader:
    """One reader: its input's form, how it is fed, its typed refusals, a good document of its kind."""

    form: str  # "json", "jsonl", "toml", "xml" or "text": how a JSON value is written for it
    feed: Feed
    refusals: tuple[str, ...] = ()  # "module:Name" of each exception type it may raise for bad input
    good: Mapping[str, Any] = field(default_factory=dict)  # a document the hostile values are mixed into


def put(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------------------------
# the readers (imports inside each: the table runs on a tree that lacks a newer one, and says so)
# --------------------------------------------------------------------------------------------


def results_lines(d: Path, data: bytes) -> object:
    from conformance.common.jsonl import read_lines

    return read_lines(put(d / "results.jsonl", data))


def results_followed(d: Path, data: bytes) -> object:
    from conformance.common.jsonl import JsonlFollower

    follower = JsonlFollower(put(d / "results.jsonl", data))
    return follower.new_objects() + follower.new_objects()


def results_records(d: Path, data: bytes) -> object:
    from conformance.record.runs import read_jsonl

    return read_jsonl(put(d / "results.jsonl", data))


def run_folder(d: Path, data: bytes) -> object:
    from conformance.record.runs import load_run

    put(d / "run" / "run.json", json.dumps({"run_id": "run-1", "host": "gpu-box-1", "topology": machine()}).encode())
    return load_run(put(d / "run" / "results.jsonl", data).parent)


def run_facts(d: Path, data: bytes) -> object:
    from conformance.record.runs import read_run_facts

    return read_run_facts(put(d / "run.json", data))


def junit_file(d: Path, data: bytes) -> Path:
    """The JUnit file, beside the run folder its suite names (``FOLDER`` in it stands for ``d``)."""
    put(d / "run" / "run.json", json.dumps({"run_id": "run-1", "host": "gpu-box-1", "topology": machine()}).encode())
    put(d / "run" / "results.jsonl", json.dumps(record()).encode() + b"\n")
    return put(d / "junit.xml", data.replace(FOLDER, str(d).encode()))


def junit_read_back(d: Path, data: bytes) -> object:
    from conformance.record.runs import read_junit

    return read_junit(junit_file(d, data))


def junit_merged(d: Path, data: bytes) -> object:
    from conformance.summarise.junit_merge import merge

    return merge(d / "merged.xml", [junit_file(d, data)])


def topology_file(d: Path, data: bytes) -> object:
    from conformance.discover.topology_source import load_topology_file

    return load_topology_file(put(d / "topology.json", data), "--topology-file")


def scenario_file(d: Path, data: bytes) -> object:
    from conformance.rank.scenario import load_scenario

    return load_scenario(put(d / "scenario.toml", data), "--scenario")


def rungs_file(d: Path, data: bytes) -> object:
    from conformance.plan.matrix import load_rungs_file

    return load_rungs_file(put(d / "rungs.toml", data), "--env-rungs-file")


def case_file(d: Path, data: bytes) -> object:
    from conformance.common.casefiles import CASE_SPEC, read_case

    return read_case(put(d / CASE_SPEC, data).parent)


def rank_result(d: Path, data: bytes) -> object:
    from conformance.common.casefiles import RESULT, read_result

    return read_result(put(d / RESULT, data).parent)


def rank_phases(d: Path, data: bytes) -> object:
    from conformance.common.casefiles import PHASES, last_phase, read_phases

    return read_phases(put(d / PHASES, data).parent), last_phase(d)


def measurement_turn(d: Path, data: bytes) -> object:
    from conformance.common.casefiles import TURN, read_turn

    return read_turn(put(d / TURN, data).parent)


def flight_recorder_json(d: Path, data: bytes) -> object:
    from conformance.common.casefiles import FLIGHT_RECORDER
    from conformance.rank.flight_recorder import describe, last_collectives

    return describe(last_collectives(put(d / FLIGHT_RECORDER, data).parent))


def torch_dump(d: Path, data: bytes) -> object:
    from conformance.rank.flight_recorder import TORCH_DUMP_PREFIX, describe, torch_dumps

    return [describe(found) for found in torch_dumps(put(d / f"{TORCH_DUMP_PREFIX}0", data).parent).values()]


def node_verdict(d: Path, data: bytes) -> object:
    from conformance.verdict.decision import NodeVerdict

    return NodeVerdict.from_text(data.decode("utf-8", "replace"))


def node_record(d: Path, data: bytes) -> object:
    from conformance.record.runs import record_from_text

    return [record_from_text(line) for line in data.decode("utf-8", "replace").split("\n")]


def forkserver_pipe(d: Path, data: bytes) -> object:
    from conformance.launch.forkserver import take_messages

    return take_messages(data)


def nccl_log(d: Path, data: bytes) -> object:
    from conformance.verdict.nccl_log import parse_files

    return parse_files([put(d / "nccl.log", data)])


def diagnose_log(d: Path, data: bytes) -> object:
    from conformance.diagnose.diagnosis import diagnose
    from conformance.diagnose.sources import gather

    return diagnose(gather([put(d / "job" / "slurm-1.out", data).parent])).to_json()


def diagnose_error_file(d: Path, data: bytes) -> object:
    from conformance.diagnose.diagnosis import diagnose
    from conformance.diagnose.sources import gather

    put(d / "job" / "train.log", b"[rank0]:step 1\n")
    return diagnose(gather([put(d / "job" / "rank0" / "result.json", data).parents[1]])).to_json()


def diagnose_phases(d: Path, data: bytes) -> object:
    from conformance.diagnose.diagnosis import diagnose
    from conformance.diagnose.sources import gather

    put(d / "case" / "rank0" / "stderr.log", b"[rank0]:RuntimeError: boom\n")
    return diagnose(gather([put(d / "case" / "rank0" / "phase.jsonl", data).parents[1]])).to_json()


RUN_ERROR = "conformance.record.runs:RunError"
UNUSABLE = "conformance.diagnose.inputs:UnusableInput"
A_CASE = {"nodeid": "t.py::t", "probe": "all_reduce", "backend": "gloo", "world_size": 2, "devices": []}
PHASE = {"phase": "probe", "step": "all_reduce 4B", "t": 1.0, "facts": {}}
DUMP = {"entries": [{"record_id": 1, "profiling_name": "nccl:all_reduce", "state": "completed"}], "pg_status": {}}
RESULT = {"status": "fail", "t": 1.5, "message": "wrong data"}

READERS: dict[str, Reader] = {
    "results.jsonl read whole": Reader("jsonl", results_lines, ("conformance.common.jsonl:JsonlError",), record()),
    "results.jsonl followed": Reader("jsonl", results_followed, ("conformance.common.jsonl:JsonlError",), record()),
    "results.jsonl as records": Reader("jsonl", results_records, (RUN_ERROR,), record()),
    "a run folder": Reader("jsonl", run_folder, (RUN_ERROR,), record()),
    "run.json": Reader("json", run_facts, (RUN_ERROR,), {"run_id": "run-1", "host": "h", "topology": machine()}),
    "JUnit read back": Reader("xml", junit_read_back, (RUN_ERROR,)),
    "JUnit merged": Reader("xml", junit_merged, ("conformance.summarise.junit_merge:MergeError",)),
    "topology file": Reader("json", topology_file, ("conformance.discover.topology:TopologyError",), machine()),
    "scenario file": Reader(
        "toml",
        scenario_file,
        ("conformance.rank.scenario:ScenarioError",),
        {"scenario": {"name": "s"}, "rule": [{"effect": "hang", "ranks": [1]}]},
    ),
    "rungs file": Reader(
        "toml",
        rungs_file,
        ("conformance.plan.matrix:RungError",),
        {"rung": [{"name": "mine", "env": {"NCCL_P2P_DISABLE": "1"}}]},
    ),
    "case.json": Reader("json", case_file, ("conformance.common.casefiles:CaseFileError",), A_CASE),
    "a rank's result.json": Reader("json", rank_result, (), RESULT),
    "a rank's phase.jsonl": Reader("jsonl", rank_phases, (), PHASE),
    "the measurement turn": Reader("json", measurement_turn),
    "flight_recorder.json": Reader("json", flight_recorder_json, (), DUMP),
    "torch's own dump": Reader("json", torch_dump, (), DUMP),
    "a node's verdict": Reader("json", node_verdict, (), {"verdict": "pass", "summary": ""}),
    "a node's records": Reader("jsonl", node_record, (), record()),
    "the forkserver's pipe": Reader("jsonl", forkserver_pipe, (), {"event": "exit", "pid": 1, "code": 0, "t": 1.0}),
    "an NCCL log": Reader("text", nccl_log),
    "diagnose: a log": Reader("text", diagnose_log, (UNUSABLE,)),
    "diagnose: an error file": Reader("json", diagnose_error_file, (UNUSABLE,), RESULT),
    "diagnose: a rank's phases": Reader("jsonl", diagnose_phases, (UNUSABLE,), PHASE),
}


def refusal_types(reader: Reader) -> tuple[type[BaseException], ...]:
    import importlib

    found = []
    for name in reader.refusals:
        module, _, attribute = name.partition(":")
        found.append(getattr(importlib.import_module(module), attribute))
    return tuple(found)


@contextmanager
def fresh_folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="reader-") as folder:
        yield Path(folder)


def assert_refused_in_its_own_words(reader: Reader, data: bytes) -> None:
    with fresh_folder() as folder:
        try:
            reader.feed(folder, data)
        except refusal_types(reader) as refused:
            assert str(refused).strip() and "\n" not in str(refused).strip(), repr(refused)  # one line, said


# --------------------------------------------------------------------------------------------
# what they are fed
# --------------------------------------------------------------------------------------------

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)


@st.composite
def documents(draw: st.DrawFn, reader: Reader) -> bytes:
    """A JSON value written in the reader's form; half the time mixed into a good document of its kind."""
    value = draw(JSON_VALUES)
    if reader.good and draw(st.booleans()):
        keys = st.sampled_from(sorted(reader.good)) | st.text(max_size=8)
        value = {**reader.good, **draw(st.dictionaries(keys, JSON_VALUES, min_size=1, max_size=3))}
    return written(reader.form, value, draw(st.integers(1, 3)))


def written(form: str, value: Any, lines: int = 1) -> bytes:
    if form == "toml":
        return (toml(value) if isinstance(value, dict) else f"value = {toml_value(value)}\n").encode()
    if form == "xml":
        return junit_document(xml(value).encode(), in_a_suite=lines > 1)
    text = json.dumps(value, allow_nan=True)
    return ("\n".join([text] * lines) + "\n").encode() if form == "jsonl" else text.encode()


def toml(table: Mapping[str, Any]) -> str:
    return "".join(f"{json.dumps(str(key))} = {toml_value(value)}\n" for key, value in table.items())


def toml_value(value: Any) -> str:
    """TOML 1.0 (toml.io/en/v1.0.0): JSON's strings are TOML's basic strings; no null, so null is "" here."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if value == value else "nan"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps("" if value is None else str(value))


def xml(value: Any) -> str:
    """A JSON value as nested XML elements (names from its keys, where they are names)."""
    if isinstance(value, dict):
        return "".join(f"<{tag(k)}>{xml(v)}</{tag(k)}>" for k, v in value.items())
    if isinstance(value, list):
        return "".join(f"<item>{xml(v)}</item>" for v in value)
    return re.sub(r"[^\w .:-]", "", str(value))


def tag(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z_][\w.-]{0,20}", key) else "k"


FOLDER = b"@FOLDER@"
SUITE_OF_A_RUN = (
    b'<testsuite name="pytest" tests="1"><properties><property name="conformance.run_id" value="run-1"/>'
    b'<property name="conformance.results" value="@FOLDER@/run/results.jsonl"/></properties>'
)


def junit_document(inside: bytes, in_a_suite: bool = True) -> bytes:
    """A JUnit file of the suite's (its testsuite names a run) with ``inside`` in it; or ``inside`` alone."""
    body = SUITE_OF_A_RUN + inside + b"</testsuite>" if in_a_suite else inside
    return b'<?xml version="1.0"?><testsuites>' + body + b"</testsuites>"


# Built directly: far past the interpreter's recursion limit, and just past the readers' (64 levels).
DEEP = 100_000
DEEP_INPUTS: dict[str, dict[str, bytes]] = {
    "json": {
        "list": b"[" * DEEP + b"]" * DEEP,
        "object": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        "a field 65 deep": json.dumps({"nodeid": "t.py::t", "verdict": "pass", "metrics": [[[]]]})
        .replace("[[[]]]", "[" * 65 + "]" * 65)
        .encode(),
    },
    "toml": {
        "array": b"a = " + b"[" * DEEP + b"]" * DEEP + b"\n",
        "inline table": b"a = " + b"{b = " * DEEP + b"1" + b"}" * DEEP + b"\n",
        "array 65 deep": b"rung = " + b"[" * 65 + b"]" * 65 + b"\n",
    },
    "xml": {
        "elements": junit_document(b"<system-out>" + b"<a>" * DEEP + b"</a>" * DEEP + b"</system-out>"),
        "entities": b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
        + junit_document(b"<system-out>&b;</system-out>")[len(b'<?xml version="1.0"?>') :],
        "entities in UTF-16": (  # no "<!ENTITY" among its bytes: expat reads the declaration all the same
            '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE t [<!ENTITY a "aaaaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
            + junit_document(b"<system-out>&b;</system-out>")[len(b'<?xml version="1.0"?>') :].decode()
        ).encode("utf-16"),
    },
}
DEEP_INPUTS["jsonl"] = {
    name: json.dumps(record()).encode() + b"\n" + data + b"\n" for name, data in DEEP_INPUTS["json"].items()
}
DEEP_INPUTS["text"] = DEEP_INPUTS["json"]


def deep_cases() -> list[Any]:
    return [
        pytest.param(reader, data, id=f"{name}: {kind}")
        for name, reader in READERS.items()
        for kind, data in DEEP_INPUTS[reader.form].items()
    ]


# --------------------------------------------------------------------------------------------
# the properties
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
@FEW
@given(data=st.binary(max_size=600))
def test_any_bytes_are_read_or_refused_in_the_readers_own_words(reader: Reader, data: bytes) -> None:
    assert_refused_in_its_own_words(reader, data)


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
@FEW
@given(data=st.data())
def test_any_json_is_read_or_refused_in_the_readers_own_words(reader: Reader, data: st.DataObject) -> None:
    assert_refused_in_its_own_words(reader, data.draw(documents(reader)))


@pytest.mark.parametrize(("reader", "data"), deep_cases())
def test_values_nested_deep_are_refused_in_the_readers_own_words(reader: Reader, data: bytes) -> None:
    assert_refused_in_its_own_words(reader, data)


def test_a_deep_line_among_records_is_skipped_and_named_and_the_others_read(tmp_path: Path) -> None:
    from conformance.record.runs import read_jsonl

    good = json.dumps(record()).encode()
    records, warnings = read_jsonl(put(tmp_path / "results.jsonl", good + b"\n" + b"[" * DEEP + b"]" * DEEP + b"\n"))

    assert len(records) == 1 and records[0].verdict_text == "pass"
    assert warnings == [f"{tmp_path / 'results.jsonl'}: line 2 is nested deeper than 64 levels; skipped"]


def test_the_follower_skips_a_line_longer_than_its_limit_and_reads_on(tmp_path: Path) -> None:
    from conformance.common.jsonl import JsonlFollower

    path = put(tmp_path / "ladder.jsonl", b'{"n": 1}\n' + b"x" * 5000)
    follower = JsonlFollower(path, limit=1024)
    assert follower.new_objects() == [{"n": 1}]
    assert [follower.new_objects() for _ in range(5)] == [[]] * 5  # the long line, a limit at a time
    with path.open("ab") as more:
        more.write(b'\n{"n": 2}\n')
    assert follower.new_objects() == [{"n": 2}]
    assert follower.take_skipped() == ["line 2 is longer than 1024 bytes"] and follower.take_skipped() == []


def test_a_dump_that_names_any_callable_is_refused_unread(tmp_path: Path) -> None:
    """A torch dump is a pickle: one naming a function to call (os.system here) loads nothing and calls nothing."""
    from conformance.rank.flight_recorder import TORCH_DUMP_PREFIX, torch_dumps

    marker = tmp_path / "called"
    evil = b"cos\nsystem\n(V touch " + str(marker).encode() + b"\ntR."  # pickle protocol 0: os.system("touch ...")
    found = torch_dumps(put(tmp_path / f"{TORCH_DUMP_PREFIX}0", evil).parent)

    assert not marker.exists()
    assert found[f"{TORCH_DUMP_PREFIX}0"]["error"].startswith("UnpicklingError: names os.system")  # type: ignore[index]


# --------------------------------------------------------------------------------------------
# one parser per format
# --------------------------------------------------------------------------------------------

RAW_PARSE = re.compile(
    r"\b(?:json|tomllib|tomli|pickle)\.loads?\(|from (?:json|tomllib|tomli|pickle) import [^\n]*load"
)
THE_PARSER = PACKAGE / "common" / "bounded_parse.py"


def test_json_toml_and_pickle_are_parsed_in_bounded_parse_only() -> None:
    """Every parse of outside text goes through bounded_parse: a raw json.loads anywhere else is named here."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == THE_PARSER:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if RAW_PARSE.search(line):
                found.append(f"conformance/{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, "parse with conformance.common.bounded_parse instead:\n" + "\n".join(found)
