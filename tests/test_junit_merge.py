"""``python -m conformance merge-junit OUT IN...``: one JUnit file, every case kept, the run's facts added.

Two real runs of a tiny pair test on a simulated 3-GPU box (one of them under xdist) give the
JUnit files to merge; hand-made files cover how the run folder is found and each kind of bad input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import torch

from conformance.cli.main import main
from conformance.record.records import CaseRecord, RunFacts, junit_properties
from conformance.record.runs import _json_or_text, load_run
from conformance.summarise.junit_merge import merge, property_text
from test_compare import CUDA, DRIVER, record, write_tiny_suite

RunSuite = Callable[..., pytest.RunResult]
PROG = "python -m conformance merge-junit"
pytestmark = pytest.mark.usefixtures("isolated_env")


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = main(["merge-junit", *(str(a) for a in args)])
    out, err = capsys.readouterr()
    return status, out, err


def case_list(path: Path) -> list[tuple[str | None, str | None, list[tuple[str | None, str | None]]]]:
    """(classname, name, properties) of every test case, in file order."""
    root = ElementTree.parse(path).getroot()
    return [
        (case.get("classname"), case.get("name"), [(p.get("name"), p.get("value")) for p in case.iter("property")])
        for case in root.iter("testcase")
    ]


def suite_properties(path: Path) -> list[list[tuple[str | None, str | None]]]:
    """Each suite's own properties (its first child), in file order."""
    root = ElementTree.parse(path).getroot()
    found = []
    for suite in root.iter("testsuite"):
        first = suite.find("properties")
        assert first is None or list(suite).index(first) == 0, "suite properties must come before the cases"
        found.append([(p.get("name"), p.get("value")) for p in first] if first is not None else [])
    return found


def run_suite_properties(run_id: str) -> list[tuple[str, str]]:
    return [
        ("conformance.run.host", os.uname().nodename),
        ("conformance.run.gpus", '{"count": 3, "models": {"NVIDIA L4": 3}}'),
        ("conformance.run.driver", DRIVER),
        ("conformance.run.cuda", f'"{CUDA}"'),  # JSON: plain 12.4 would read back as a number
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
    first_run = (reports_dir / "latest").resolve().name
    run_suite(topology, "-n", "2", "--junitxml=second.xml", "test_tiny.py")
    second_run = (reports_dir / "latest").resolve().name
    capsys.readouterr()
    first, second, out = pytester.path / "first.xml", pytester.path / "second.xml", pytester.path / "merged.xml"

    status, stdout, err = cli(capsys, out, first, second, "--reports-dir", reports_dir)
    assert (status, err) == (0, "")
    cases = len(case_list(first)) + len(case_list(second))
    assert stdout == (
        f"merged {cases} test case(s) in 2 suite(s) from 2 file(s) into {out}; "
        f"run properties from {reports_dir / first_run}, {reports_dir / second_run}\n"
    )
    # every case with every property, in order; the suites' facts from their own runs
    assert case_list(out) == case_list(first) + case_list(second)
    assert suite_properties(out) == [run_suite_properties(first_run), run_suite_properties(second_run)]
    root = ElementTree.parse(out).getroot()
    assert root.tag == "testsuites" and len(root.findall("testsuite")) == 2
    inputs = [ElementTree.parse(p).getroot().find("testsuite") for p in (first, second)]
    assert int(root.get("tests", "")) == sum(int(s.get("tests", "")) for s in inputs if s is not None) == cases

    # read back: the same records and the facts (the last suite's run)
    merged = load_run(out)
    assert merged.records == load_run(first).records + load_run(second).records
    assert [r.verdict for r in merged.records] == ["pass"] * 6
    assert merged.facts == RunFacts.from_json({
        "host": os.uname().nodename, "gpus": {"count": 3, "models": {"NVIDIA L4": 3}}, "driver": DRIVER,
        "cuda": CUDA, "nccl": None, "torch": torch.__version__, "run_id": second_run, "simulated": True,
    })  # fmt: skip
    assert merged.run_id == second_run and merged.warnings == []

    # one run's file merged alone compares against the other run's folder: same host, same GPUs
    alone = pytester.path / "alone.xml"
    assert cli(capsys, alone, first, "--run", first_run, "--reports-dir", reports_dir)[0] == 0
    status = main(["compare", "--json", str(alone), str(reports_dir / second_run)])
    report = json.loads(capsys.readouterr().out)
    assert status == 0
    assert report["baseline"]["host"] == os.uname().nodename
    assert report["baseline"]["versions"] == {"driver": DRIVER, "cuda": CUDA, "nccl": None, "torch": torch.__version__}
    assert report["counts"]["matched"] == 3


# --------------------------------------------------------------------------------------------
# hand-made files
# --------------------------------------------------------------------------------------------


def junit(path: Path, *records: dict[str, Any], name: str = "pytest") -> Path:
    """A JUnit file as pytest writes it, the records as each case's conformance.* properties."""
    cases = "".join(
        f'<testcase classname="test_pairs" name="{r["nodeid"].split("::")[1]}" time="0.1"><properties>'
        + "".join(
            f"<property name={json.dumps(k)} value={quote(v)} />" for k, v in junit_properties(CaseRecord.from_json(r))
        )
        + "</properties></testcase>"
        for r in records
    )
    path.write_text(
        f'<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="{name}" '
        f'errors="0" failures="0" skipped="0" tests="{len(records)}" time="1.5">{cases}</testsuite></testsuites>'
    )
    return path


def quote(value: str) -> str:
    escaped = value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return f'"{escaped}"'


def run_folder(reports: Path, run_id: str, host: str = "box-a", simulated: bool = False) -> Path:
    folder = reports / run_id
    folder.mkdir(parents=True)
    topology = {"driver": "535.1", "cuda_driver": "12.2", "devices": [{"kind": "gpu", "model": "H100", "uuid": "U0"}]}
    facts = {
        "run_id": run_id,
        "host": host,
        "topology": topology,
        "torch": "2.5.1",
        "nccl": "2.21.5",
        "simulated": simulated,
    }
    (folder / "run.json").write_text(json.dumps(facts))
    (folder / "results.jsonl").write_text(
        json.dumps({**record(), "run_id": run_id, "nccl": {"version": "2.23.4"}}) + "\n"
    )
    return folder


def facts_of(run_id: str, host: str = "box-a") -> RunFacts:
    return RunFacts.from_json({
        "host": host, "gpus": {"count": 1, "models": {"H100": 1}}, "driver": "535.1", "cuda": "12.2",
        "nccl": "2.23.4", "torch": "2.5.1", "run_id": run_id, "simulated": False,
    })  # fmt: skip


def test_run_folder_from_the_cases_run_id_else_latest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    run_folder(reports, "run-a")
    run_folder(reports, "run-b", host="box-b")
    os.symlink("run-b", reports / "latest")
    a = junit(tmp_path / "a.xml", {**record(), "run_id": "run-a"})
    plain = junit(tmp_path / "plain.xml", {**record("gpu0-gpu2"), "run_id": None}, name="other")
    out = tmp_path / "out.xml"

    # the cases say run-a: its folder, also for the suite whose cases carry no run id
    assert cli(capsys, out, a, plain, "--reports-dir", reports)[0] == 0
    assert [dict(p)["conformance.run.run_id"] for p in suite_properties(out)] == ["run-a", "run-a"]
    assert load_run(out).facts == facts_of("run-a")
    # no run id anywhere: reports/latest
    assert cli(capsys, out, plain, "--reports-dir", reports)[0] == 0
    assert load_run(out).facts == facts_of("run-b", host="box-b")
    # --run wins, as a path or a run id
    for given in (str(reports / "run-b"), "run-b", str(reports / "run-b" / "results.jsonl")):
        assert cli(capsys, out, a, "--run", given, "--reports-dir", reports)[0] == 0
        assert load_run(out).facts == facts_of("run-b", host="box-b")


def test_merging_a_merged_file_replaces_its_run_properties(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    run_folder(reports, "run-a")
    run_folder(reports, "run-b", host="box-b")
    a = junit(tmp_path / "a.xml", {**record(), "run_id": "run-a"})
    once, twice = tmp_path / "once.xml", tmp_path / "twice.xml"
    assert cli(capsys, once, a, "--reports-dir", reports)[0] == 0
    assert cli(capsys, twice, once, "--run", "run-b", "--reports-dir", reports)[0] == 0
    (properties,) = suite_properties(twice)
    assert [name for name, _ in properties] == [f"conformance.run.{k}" for k in (
        "host", "gpus", "driver", "cuda", "nccl", "torch", "run_id", "simulated")]  # fmt: skip
    assert dict(properties)["conformance.run.host"] == "box-b"
    assert case_list(twice) == case_list(a)


def test_no_run_folder_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = junit(tmp_path / "a.xml", {**record(), "run_id": "run-gone"})
    out = tmp_path / "out.xml"
    status, stdout, err = cli(capsys, out, a, "--reports-dir", tmp_path / "reports")
    assert status == 0
    assert err == (
        f"{PROG}: warning: {tmp_path}/reports/run-gone: no readable run.json ([Errno 2] No such file or directory: "
        f"'{tmp_path}/reports/run-gone/run.json'); no run properties added for it\n"
    )
    assert stdout.endswith("; no run properties\n")
    assert suite_properties(out) == [[]] and load_run(out).facts == RunFacts()
    assert load_run(out).records == load_run(a).records


@pytest.mark.parametrize(
    ("value"), ["box", "12.0", "12.10", "535.104.05", "true", "null", "", '"quoted"', "007", None, True, 3, {"a": [1]}]
)
def test_every_value_reads_back_as_written(value: Any) -> None:
    assert _json_or_text(property_text(value)) == value
    assert type(_json_or_text(property_text(value))) is type(value)


def test_merge_api(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    run_folder(reports, "run-a")
    a = junit(tmp_path / "a.xml", {**record(), "run_id": "run-a"}, {**record("gpu0-gpu2"), "run_id": "run-a"})
    # two shards of one run (each case once: the same file twice is refused, tests/test_bad_cli_input.py)
    b = junit(
        tmp_path / "b.xml",
        {**record(rung="p2p_disable"), "run_id": "run-a"},
        {**record("gpu0-gpu2", rung="p2p_disable"), "run_id": "run-a"},
    )
    result = merge(tmp_path / "out.xml", [a, b], reports_dir=reports)
    assert (result.files, result.suites, result.cases, result.runs, result.warnings) == (
        2,
        2,
        4,
        [str(reports / "run-a")],
        [],
    )
    root = ElementTree.parse(tmp_path / "out.xml").getroot()
    assert [s.get("tests") for s in root.iter("testsuite")] == ["2", "2"]
    assert (root.get("tests"), root.get("time")) == ("4", "3.0")


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], "no input JUnit files given"),
        (["missing.xml"], "{d}/missing.xml: no such file"),
        (["broken.xml"], "{d}/broken.xml: not a readable JUnit XML file: "),
        (["html.xml"], "{d}/html.xml: not a readable JUnit XML file: Invalid format."),
        (["good.xml", "--run", "{d}/nowhere"], "--run {d}/nowhere: {d}/nowhere is not a run folder (no run.json)"),
        (["good.xml", "--out-dir"], "unrecognized arguments: --out-dir"),
    ],
    ids=["no-inputs", "missing", "broken", "not-junit", "run-not-a-folder", "bad-option"],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], inputs: list[str], message: str
) -> None:
    (tmp_path / "broken.xml").write_text("<testsuites><testsuite name='x'>")
    (tmp_path / "html.xml").write_text("<html><body/></html>")
    junit(tmp_path / "good.xml", record())
    args = [
        a.format(d=tmp_path) if a.startswith("{d}") else (str(tmp_path / a) if a.endswith(".xml") else a)
        for a in inputs
    ]
    status, out, err = cli(capsys, tmp_path / "out.xml", *args)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    expected = message.format(d=tmp_path)
    assert err.startswith(f"{PROG}: {expected}") or err == f"python -m conformance: error: {expected}\n"
    assert not (tmp_path / "out.xml").exists()


def test_output_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = junit(tmp_path / "good.xml", record())
    status, out, err = cli(capsys, tmp_path / "no" / "such" / "out.xml", good, "--reports-dir", tmp_path)
    assert (status, out) == (2, "")
    assert err.startswith(f"{PROG}: {tmp_path}/no/such/out.xml: cannot be written: [Errno 2] No such file or directory")
