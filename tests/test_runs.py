"""Reading finished runs back: what is whole is read, what is not is said, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli.main import main
from conformance.common.verdicts import Verdict
from conformance.discover.iommu import IommuFacts
from conformance.discover.topology import cpu_topology
from conformance.record.machine import MachineFacts
from conformance.record.records import SCHEMA, CaseRecord, JunitRun
from conformance.record.runs import RunError, load_run, read_jsonl, read_run_facts, resolve_run_path

RECORD = {
    "schema": SCHEMA, "run_id": "r1", "nodeid": "suites/test_pairs.py::test_pair_exchange[cpu0-cpu1-inherited]",
    "probe": "pair_exchange", "devices": ["cpu0", "cpu1"], "device_ids": ["cpu0", "cpu1"], "link": "CPU",
    "set_kind": "pair", "ladder_key": "test_pair_exchange[cpu0-cpu1]", "backend": "gloo", "env_name": "inherited",
    "env": {}, "verdict": "pass", "expected_verdict": None, "summary": "", "root_cause": None, "victims": [],
    "ranks": [{"rank": 0, "exit": 0}], "bandwidth_gbps": 0.25, "metrics": {"busbw_gbps": {"1MiB": 1.5}},
    "p2p_status": None, "transports": {}, "nccl_warnings": [], "seconds": 0.1, "stop_reason": None,
    "simulated": False, "node_rank": 1, "nodes": [0, 1], "root_node": 1, "node_verdicts": {"0": "hang", "1": "error"},
}  # fmt: skip


def test_newer_schema_and_cut_off_lines_are_skipped_and_said(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    newer = {**RECORD, "schema": SCHEMA + 1, "nodeid": "from-the-future"}
    path.write_text(json.dumps(RECORD) + "\n" + json.dumps(newer) + "\n" + json.dumps(RECORD)[:40])
    records, warnings = read_jsonl(path)
    assert records == [CaseRecord.from_json(RECORD)]
    assert warnings == [
        f"{path}: line 3 is not whole JSON (cut off?); skipped",
        f"{path}: 1 record(s) of a newer schema than {SCHEMA} skipped; upgrade the suite",
    ]


def test_commands_print_what_was_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.jsonl").write_text(json.dumps(RECORD) + "\n" + json.dumps(RECORD)[:40])
    assert main(["recommend", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "line 2 is not whole JSON (cut off?); skipped" in err


@pytest.mark.parametrize("name", ["missing", "empty-folder"])
def test_unknown_run_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    (tmp_path / "empty-folder").mkdir()
    with pytest.raises(RunError):
        load_run(tmp_path / name)
    for command in ("recommend", "report"):
        assert main([command, str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(tmp_path / name) in err


def test_junit_without_the_suites_properties(tmp_path: Path) -> None:
    xml = tmp_path / "other.xml"
    xml.write_text('<testsuites><testsuite name="x"><testcase classname="a" name="b"/></testsuite></testsuites>')
    with pytest.raises(RunError, match="no testsuite carries the suite's conformance"):
        load_run(xml)


def junit_naming(path: Path, *folders: Path) -> Path:
    """A JUnit file with one testsuite per run folder, each naming its run as the suite's pytest does."""
    suites = ""
    for folder in folders:
        named = JunitRun(folder.name, str(folder / "results.jsonl"), "0.1.0").properties()
        properties = "".join(f'<property name="{k}" value="{v}" />' for k, v in named)
        suites += f'<testsuite name="pytest" tests="1" failures="0" errors="0"><properties>{properties}</properties>'
        suites += '<testcase classname="suites.test_pairs" name="t" /></testsuite>'
    path.write_text(f"<testsuites>{suites}</testsuites>")
    return path


def write_run(folder: Path, *records: dict[str, object]) -> Path:
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"run_id": folder.name, "host": folder.name}))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_a_junit_file_reads_the_runs_its_testsuites_name(tmp_path: Path) -> None:
    node0 = {**RECORD, "node_rank": 0, "run_id": "run"}
    node1 = {**RECORD, "node_rank": 1, "run_id": "run"}
    # node 0's folder holds every node's records (gathered at the end), node 1's its own
    first = write_run(tmp_path / "run", node0, node1)
    second = write_run(tmp_path / "run-node1", node1)
    run = load_run(junit_naming(tmp_path / "merged.xml", first, second))
    assert run.records == [CaseRecord.from_json(node0), CaseRecord.from_json(node1)]  # node 1's counted once
    assert run.facts == read_run_facts(first / "run.json") and run.warnings == []
    assert run.folder == tmp_path  # reports about it go beside the JUnit file, as before
    # a run's own JUnit file: all of that run
    assert load_run(junit_naming(tmp_path / "node1.xml", second)).records == [CaseRecord.from_json(node1)]


def test_a_junit_file_without_its_run_is_refused_naming_where_it_looked(tmp_path: Path) -> None:
    xml = junit_naming(tmp_path / "a.xml", tmp_path / "gone")
    with pytest.raises(RunError) as refused:
        load_run(xml)
    assert str(refused.value) == (
        f"{xml}: the run's records are not at {tmp_path}/gone/results.jsonl, where it names them "
        "(a JUnit file holds none of its own); pass the run folder instead"
    )


def test_junit_run_properties_read_back() -> None:
    named = JunitRun("20261121-000000-abcd", "/r/20261121-000000-abcd/results.jsonl", "0.1.0")
    assert JunitRun.from_properties(dict(named.properties())) == named
    assert JunitRun.from_properties({"conformance.run_id": "r"}) is None  # no results file named


def test_latest_is_the_default_run_and_a_bare_run_id_works(tmp_path: Path) -> None:
    (tmp_path / "20261121-000000-abcd").mkdir()
    assert resolve_run_path(None, tmp_path) == tmp_path / "latest"
    assert resolve_run_path("20261121-000000-abcd", tmp_path) == tmp_path / "20261121-000000-abcd"


def test_machine_facts_read_what_reads_and_leave_the_rest_unknown() -> None:
    """run.json's topology is read once; a part of the wrong shape is unknown, never the whole run lost."""
    written = json.loads(cpu_topology(2).to_json())
    facts = MachineFacts.of(written)
    assert facts.topology == cpu_topology(2) and [d["name"] for d in facts.devices] == ["cpu0", "cpu1"]
    assert facts.gpus == () and facts.nvml_gpus is None
    broken = {
        **written,
        "driver": "550.54",
        "devices": [{"name": "gpu0", "kind": "gpu", "pci_bus_id": "0000:17:00.0"}, "not a device"],
        "inventory": {"nvml_gpus": ["00000000:17:00.0"]},
        "iommu": {"mode": "sideways"},
        "health": "not health",
    }
    facts = MachineFacts.of(broken)
    assert facts.topology is None  # the devices do not read back as a Topology
    assert [d["name"] for d in facts.gpus] == ["gpu0"] and facts.nvml_gpus == ("00000000:17:00.0",)
    assert (facts.driver, facts.iommu, facts.health) == ("550.54", IommuFacts(), {})
    assert MachineFacts.of(None) == MachineFacts.of([1, 2]) == MachineFacts()


def test_a_record_keeps_its_verdict_typed_and_one_it_does_not_know_is_not_used() -> None:
    known = CaseRecord.from_json({"nodeid": "t::a", "probe": "barrier", "verdict": "hang"})
    assert (
        known.verdict is Verdict.HANG and known.usable and json.loads(json.dumps(known.to_json()))["verdict"] == "hang"
    )
    unknown = CaseRecord.from_json({"nodeid": "t::a", "probe": "barrier", "verdict": "teapot"})
    assert (unknown.verdict, unknown.usable, unknown.verdict_text) == (None, False, "?")
