"""``python -m conformance merge-junit -o OUT IN...``: one JUnit file, every suite kept, each run's facts added.

Two real runs of a tiny pair test on a simulated 3-GPU box (one of them under xdist) give the
JUnit files to merge; hand-made files (each testsuite naming a hand-made run folder, as the
suite's pytest writes them) cover the run facts, warnings and each kind of bad input.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import torch

from conformance.cli.main import main
from conformance.discover.versions import suite_version
from conformance.record.records import JUNIT_RESULTS, JUNIT_RUN_ID, JUNIT_VERSION, RunFacts
from conformance.record.runs import RunError, load_run, read_run_facts
from conformance.summarise.junit_merge import merge, property_text
from test_compare import CUDA, DRIVER, record, write_tiny_suite

RunSuite = Callable[..., pytest.RunResult]
PROG = "python -m conformance merge-junit"
VERSION = suite_version() or "unknown"
RUN_KEYS = ("host", "gpus", "driver", "cuda", "nccl", "torch", "run_id", "simulated")
pytestmark = pytest.mark.usefixtures("isolated_env")


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = main(["merge-junit", *(str(a) for a in args)])
    out, err = capsys.readouterr()
    return status, out, err


def case_list(path: Path) -> list[tuple[str | None, str | None]]:
    """(classname, name) of every test case, in file order."""
    root = ElementTree.parse(path).getroot()
    return [(case.get("classname"), case.get("name")) for case in root.iter("testcase")]


def suite_properties(path: Path) -> list[list[tuple[str | None, str | None]]]:
    """Each suite's own properties (its first child), in file order."""
    root = ElementTree.parse(path).getroot()
    found = []
    for suite in root.iter("testsuite"):
        first = suite.find("properties")
        assert first is None or list(suite).index(first) == 0, "suite properties must come before the cases"
        found.append([(p.get("name"), p.get("value")) for p in first] if first is not None else [])
    return found


def named_run(run_id: str, folder: Path) -> list[tuple[str, str]]:
    """The properties the suite's pytest gives its testsuite: its run, then its answer (all passed here)."""
    run = [(JUNIT_RUN_ID, run_id), (JUNIT_RESULTS, str(folder / "results.jsonl")), (JUNIT_VERSION, VERSION)]
    return [*run, ("conformance.answer.1", "everything passed: 3 cases in 2 classes; nothing to set")]


def real_run_facts(run_id: str) -> list[tuple[str, str]]:
    return [
        ("conformance.run.host", os.uname().nodename),
        ("conformance.run.gpus", '{"count": 3, "models": {"NVIDIA L4": 3}}'),
        ("conformance.run.driver", DRIVER),
        ("conformance.run.cuda", f'"{CUDA}"'),  # JSON: plain 12.4 would read as a number
        ("conformance.run.nccl", "null"),
        ("conformance.run.torch", torch.__version__),
        ("conformance.run.run_id", run_id),
        ("conformance.run.simulated", "true"),
    ]


@pytest.mark.slow
def test_merge_two_real_runs(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology, _ = write_tiny_suite(pytester)
    run_suite(topology, "--junitxml=first.xml", "test_tiny.py")
    first_run = (reports_dir / "latest").resolve()
    run_suite(topology, "-n", "2", "--junitxml=second.xml", "test_tiny.py")
    second_run = (reports_dir / "latest").resolve()
    capsys.readouterr()
    first, second, out = pytester.path / "first.xml", pytester.path / "second.xml", pytester.path / "merged.xml"
    # each run's pytest names its run, the xdist controller too
    assert suite_properties(first) == [named_run(first_run.name, first_run)]
    assert suite_properties(second) == [named_run(second_run.name, second_run)]

    status, stdout, err = cli(capsys, "-o", out, first, second)
    assert (status, err) == (0, "")
    cases = len(case_list(first)) + len(case_list(second))
    assert stdout == (
        f"merged {cases} test case(s) in 2 suite(s) from 2 file(s) into {out}; "
        f"run properties from {first_run}, {second_run}\n"
    )
    # every case, in order; each suite keeps its run's name and gets its run's facts
    assert case_list(out) == case_list(first) + case_list(second)
    assert suite_properties(out) == [
        named_run(first_run.name, first_run) + real_run_facts(first_run.name),
        named_run(second_run.name, second_run) + real_run_facts(second_run.name),
    ]
    root = ElementTree.parse(out).getroot()
    assert root.tag == "testsuites" and len(root.findall("testsuite")) == 2
    assert "skipped" not in root.attrib  # not in the xunit2 schema
    inputs = [ElementTree.parse(p).getroot().find("testsuite") for p in (first, second)]
    assert int(root.get("tests", "")) == sum(int(s.get("tests", "")) for s in inputs if s is not None) == cases

    # read back: both runs' records, the first run's facts
    merged = load_run(out)
    assert merged.records == load_run(first_run).records + load_run(second_run).records
    assert [r.verdict for r in merged.records] == ["pass"] * 6
    assert merged.facts == read_run_facts(first_run / "run.json")
    assert merged.run_id == first_run.name and merged.warnings == []

    # a run's own JUnit file compares against the other run's folder: same host, same GPUs
    status = main(["compare", "--json", str(first), str(second_run)])
    report = json.loads(capsys.readouterr().out)
    assert status == 0
    assert report["baseline"]["host"] == os.uname().nodename
    assert report["baseline"]["versions"] == {"driver": DRIVER, "cuda": CUDA, "nccl": None, "torch": torch.__version__}
    assert report["counts"]["matched"] == 3


# --------------------------------------------------------------------------------------------
# hand-made files
# --------------------------------------------------------------------------------------------


def junit(path: Path, folder: Path, *records: dict[str, Any], name: str = "pytest") -> Path:
    """A JUnit file as the suite's pytest writes it: the testsuite names the run in ``folder``, the cases are bare."""
    properties = "".join(
        f"<property name={json.dumps(k)} value={json.dumps(v)} />" for k, v in named_run(folder.name, folder)
    )
    cases = "".join(
        f'<testcase classname="test_pairs" name="{r["nodeid"].split("::")[1]}" time="0.1" />' for r in records
    )
    path.write_text(
        f'<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="{name}" '
        f'errors="0" failures="0" skipped="0" tests="{len(records)}" time="1.5"><properties>{properties}'
        f"</properties>{cases}</testsuite></testsuites>"
    )
    return path


def run_folder(reports: Path, run_id: str, host: str = "box-a", *records: dict[str, Any]) -> Path:
    folder = reports / run_id
    folder.mkdir(parents=True)
    topology = {"driver": "535.1", "cuda_driver": "12.2", "devices": [{"kind": "gpu", "model": "H100", "uuid": "U0"}]}
    facts = {"run_id": run_id, "host": host, "topology": topology, "torch": "2.5.1", "nccl": "2.21.5"}
    (folder / "run.json").write_text(json.dumps(facts))
    lines = records or ({**record(), "nccl": {"version": "2.23.4"}},)
    (folder / "results.jsonl").write_text("".join(json.dumps({**r, "run_id": run_id}) + "\n" for r in lines))
    return folder


def facts_of(run_id: str, host: str = "box-a") -> dict[str, str]:
    values: dict[str, Any] = {
        "host": host, "gpus": {"count": 1, "models": {"H100": 1}}, "driver": "535.1", "cuda": "12.2",
        "nccl": "2.23.4", "torch": "2.5.1", "run_id": run_id, "simulated": False,
    }  # fmt: skip
    return {f"conformance.run.{key}": property_text(values[key]) for key in RUN_KEYS}


def test_each_suite_gets_the_facts_of_the_run_it_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_run, b_run = run_folder(tmp_path / "reports", "run-a"), run_folder(tmp_path / "reports", "run-b", "box-b")
    a = junit(tmp_path / "a.xml", a_run, record())
    b = junit(tmp_path / "b.xml", b_run, record(), name="other")
    out = tmp_path / "out.xml"
    assert cli(capsys, "-o", out, a, b)[0] == 0
    assert [dict(p) for p in suite_properties(out)] == [
        dict(named_run("run-a", a_run)) | facts_of("run-a"),
        dict(named_run("run-b", b_run)) | facts_of("run-b", host="box-b"),
    ]
    merged = load_run(out)
    assert [r.run_id for r in merged.records] == ["run-a", "run-b"]
    assert merged.facts == read_run_facts(a_run / "run.json")


def test_merging_a_merged_file_replaces_its_run_properties(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = run_folder(tmp_path / "reports", "run-a")
    a = junit(tmp_path / "a.xml", folder, record())
    once, twice = tmp_path / "once.xml", tmp_path / "twice.xml"
    assert cli(capsys, "-o", once, a)[0] == 0
    (folder / "run.json").write_text(json.dumps({**json.loads((folder / "run.json").read_text()), "host": "box-b"}))
    assert cli(capsys, "-o", twice, once)[0] == 0
    (properties,) = suite_properties(twice)
    assert [name for name, _ in properties] == [name for name, _ in named_run("run-a", folder)] + [
        f"conformance.run.{k}" for k in RUN_KEYS
    ]
    assert dict(properties)["conformance.run.host"] == "box-b"
    assert case_list(twice) == case_list(a)


def test_a_run_folder_that_is_gone_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = tmp_path / "reports" / "run-gone"
    a = junit(tmp_path / "a.xml", gone, record())
    out = tmp_path / "out.xml"
    status, stdout, err = cli(capsys, "-o", out, a)
    assert status == 0
    assert err == (
        f"{PROG}: warning: {gone}: no readable run.json ([Errno 2] No such file or directory: "
        f"'{gone}/run.json'); no run properties added for it\n"
    )
    assert stdout.endswith("; no run properties\n")
    assert suite_properties(out) == [named_run("run-gone", gone)] and case_list(out) == case_list(a)
    # the merged file is written; reading it needs the run it names
    with pytest.raises(RunError, match=f"the run's records are not at {gone}/results.jsonl, .*pass the run folder"):
        load_run(out)


def test_cases_of_one_run_in_two_inputs_are_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = run_folder(tmp_path / "reports", "run-a")
    a = junit(tmp_path / "a.xml", folder, record(), record("gpu0-gpu2"))
    b = junit(tmp_path / "b.xml", folder, record("gpu0-gpu2"), record(rung="p2p_disable"))
    out = tmp_path / "out.xml"
    status, stdout, err = cli(capsys, "-o", out, a, b)
    assert status == 0 and stdout.startswith("merged 4 test case(s) in 2 suite(s)")
    assert err == (
        f"{PROG}: warning: 1 test case(s) of run run-a are in both {a} and {b}; merged as they are "
        "(CI counts them twice)\n"
    )
    assert case_list(out) == case_list(a) + case_list(b)
    assert load_run(out).records == load_run(folder).records  # the run's records, read once


@pytest.mark.parametrize(
    "value", ["box", "12.0", "12.10", "535.104.05", "true", "null", "", '"quoted"', "007", None, True, 3, {"a": [1]}]
)
def test_every_value_reads_as_written(value: Any) -> None:
    text = property_text(value)
    try:
        read = json.loads(text)
    except ValueError:
        read = text  # plain text: it reads as nothing else
    assert read == value and type(read) is type(value)


def test_merge_api(tmp_path: Path) -> None:
    folder = run_folder(tmp_path / "reports", "run-a")
    # two shards of one run
    a = junit(tmp_path / "a.xml", folder, record(), record("gpu0-gpu2"))
    b = junit(tmp_path / "b.xml", folder, record(rung="p2p_disable"), record("gpu0-gpu2", rung="p2p_disable"))
    result = merge(tmp_path / "out.xml", [a, b])
    assert (result.files, result.suites, result.cases, result.runs, result.warnings) == (2, 2, 4, [str(folder)], [])
    root = ElementTree.parse(tmp_path / "out.xml").getroot()
    assert [s.get("tests") for s in root.iter("testsuite")] == ["2", "2"]
    assert root.attrib == {"name": "conformance", "tests": "4", "failures": "0", "errors": "0", "time": "3.0"}


FOREIGN = '<testsuites><testsuite name="other" tests="1"><testcase classname="a" name="b"/></testsuite></testsuites>'


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "out.xml"], "no input JUnit files given"),
        (["-o", "out.xml", "missing.xml"], "{d}/missing.xml: no such file"),
        (["-o", "out.xml", "broken.xml"], "{d}/broken.xml: not a readable JUnit XML file: "),
        (["-o", "out.xml", "html.xml"], "{d}/html.xml: not a readable JUnit XML file: Invalid format."),
        (
            ["-o", "out.xml", "good.xml", "foreign.xml"],
            "{d}/foreign.xml: testsuite 'other' carries none of the suite's conformance.* properties "
            "(was it written by this suite?)",
        ),
        (["-o", "good.xml", "good.xml"], "--output {d}/good.xml is also an input ({d}/good.xml); write the merged"),
        (["-o", "foreign.xml", "good.xml"], "--output {d}/foreign.xml exists and was not written by merge-junit"),
        (["-o", "out.xml", "good.xml", "good.xml"], "IN {d}/good.xml is named twice; each case must be merged once"),
        (["out.xml", "good.xml"], "the following arguments are required: -o/--output"),
        (["-o", "out.xml", "good.xml", "--run", "x"], "unrecognized arguments: --run x"),
    ],
    ids=[
        "no-inputs",
        "missing",
        "broken",
        "not-junit",
        "not-this-suites",
        "output-is-an-input",
        "output-of-someone-else",
        "input-twice",
        "no-output",
        "bad-option",
    ],
)
def test_bad_input_is_one_line_exit_2_and_the_output_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.xml").write_text("<testsuites><testsuite name='x'>")
    (tmp_path / "html.xml").write_text("<html><body/></html>")
    (tmp_path / "foreign.xml").write_text(FOREIGN)
    good = junit(tmp_path / "good.xml", run_folder(tmp_path / "reports", "run-a"), record())
    assert merge(tmp_path / "out.xml", [good]).cases == 1  # an earlier merge: OUT may be replaced
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.xml")}
    status, out, err = cli(capsys, *(str(tmp_path / a) if a.endswith(".xml") else a for a in args))
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    expected = message.format(d=tmp_path)
    assert err.startswith(f"{PROG}: {expected}") or err == f"python -m conformance: error: {expected}\n", err
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.xml")} == before


def test_output_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = junit(tmp_path / "good.xml", run_folder(tmp_path / "reports", "run-a"), record())
    status, out, err = cli(capsys, "-o", tmp_path / "no" / "such" / "out.xml", good)
    assert (status, out) == (2, "")
    assert err.startswith(f"{PROG}: {tmp_path}/no/such/out.xml: cannot be written: [Errno 2] No such file or directory")


def test_a_junit_file_copied_away_from_its_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = run_folder(tmp_path / "reports", "run-a")
    junit(tmp_path / "a.xml", folder, record())
    shutil.move(folder, tmp_path / "elsewhere")
    for command in ("recommend", "report", "compare"):
        args = [str(tmp_path / "a.xml")] * (2 if command == "compare" else 1)
        assert main([command, *args]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"python -m conformance {command}: {tmp_path}/a.xml: the run's records are not at "
            f"{folder}/results.jsonl, where it names them (a JUnit file holds none of its own); "
            "pass the run folder instead\n"
        )
    assert [r.run_id for r in load_run(tmp_path / "elsewhere").records] == ["run-a"]
    assert load_run(tmp_path / "elsewhere").facts == RunFacts.from_json(
        json.loads((tmp_path / "elsewhere" / "run.json").read_text())
    )


@pytest.mark.parametrize(
    "args",
    [("compare", "{j}", "{j}"), ("report", "{j}"), ("recommend", "{j}"), ("merge-junit", "-o", "{o}", "{j}")],
)
def test_without_junitparser_a_junit_file_ends_in_one_line_naming_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """Some GPU images lack junitparser: one line naming it, exit status 2, no traceback."""
    from conformance.cli.main import main

    junit = tmp_path / "run.xml"
    junit.write_text('<testsuites name="pytest tests"></testsuites>')
    monkeypatch.setitem(sys.modules, "junitparser", None)  # import junitparser raises ImportError
    status = main([a.format(j=junit, o=tmp_path / "out.xml") for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert "needs junitparser: pip install 'gpu-conformance[junit]'; it is not installed here" in err[0]
    assert "Traceback" not in err[0]
