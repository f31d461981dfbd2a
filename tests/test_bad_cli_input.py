"""Bad input to ``python -m conformance report / merge-junit / recommend / compare / topology``.

Issue 13, item 4: a refusal is exit status 2 and one line on stderr, ``python -m conformance
<command>: <message>``, naming the bad value and the file or argument it came from; no traceback;
and nothing written or overwritten (every file under the case's folder, the reports dir and the
output path with it, is the same before and after).  Each case is a row of a table: the files to
prepare, the command line, the message.  The good-input controls run the same commands on files
that differ in one thing, and must write what the command writes, so a check that can never fail
would show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conformance.cli.main import main
from conformance.common.inputs import USER_FILE_BYTES
from conformance.record.records import JUNIT_RESULTS, JUNIT_RUN_ID, JUNIT_VERSION, SCHEMA
from test_compare import machine, record

pytestmark = pytest.mark.usefixtures("isolated_env")

Files = Mapping[str, "str | bytes | None"]  # path in the case's folder -> content ({d}: the folder); None: a folder
FIFO = "<a named pipe no one writes to>"  # as a file's content: the path is made a FIFO


@dataclass(frozen=True)
class Refusal:
    argv: tuple[str, ...]  # "{d}" stands for the case's folder
    message: str  # how the line goes on after "python -m conformance <command>: "; "{d}" as above
    files: Files = field(default_factory=dict)


@dataclass(frozen=True)
class Control:
    argv: tuple[str, ...]
    status: int
    written: tuple[str, ...]  # files the command must create or change
    files: Files = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# the files
# --------------------------------------------------------------------------------------------


def results(*records: Mapping[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def facts(run_id: str = "run-a", **fields: Any) -> str:
    return json.dumps({"run_id": run_id, "host": "gpu-box-1", "topology": machine(), **fields})


def run_folder(folder: str = "run", run_id: str = "run-a", **fields: Any) -> dict[str, str | bytes | None]:
    """A run folder as a run writes it: one passing case."""
    return {f"{folder}/results.jsonl": results(record(run_id=run_id)), f"{folder}/run.json": facts(run_id, **fields)}


def junit_xml(*records: Mapping[str, Any], run: str = "reports/run-a", root: str = "pytest tests") -> str:
    """A JUnit file as the suite's pytest writes it: the testsuite names the run folder ``run``, the cases are bare."""
    named = {JUNIT_RUN_ID: run.split("/")[-1], JUNIT_RESULTS: f"{{d}}/{run}/results.jsonl", JUNIT_VERSION: "0.1.0"}
    properties = "".join(f'<property name="{name}" value="{value}" />' for name, value in named.items())
    cases = "".join(_junit_case(r) for r in records)
    return (
        f'<?xml version="1.0" encoding="utf-8"?><testsuites name="{root}"><testsuite name="pytest" errors="0" '
        f'failures="0" skipped="0" tests="{len(records)}" time="1.0"><properties>{properties}</properties>{cases}'
        "</testsuite></testsuites>"
    )


def _junit_case(data: Mapping[str, Any]) -> str:
    name = str(data["nodeid"]).split("::")[1]
    return f'<testcase classname="test_pairs" name="{name}" time="0.5" />'


DEEP = 100_000  # levels of nesting, far past the interpreter's recursion limit
DEEP_LINE = "[" * DEEP + "]" * DEEP + "\n"
DEEP_LINE_SKIPPED = "line {line} is nested deeper than 64 levels; skipped"
DEEP_XML = "<system-out>" + "<a>" * DEEP + "</a>" * DEEP + "</system-out>"
FOREIGN_JUNIT = (
    '<testsuites><testsuite name="other" tests="1"><testcase classname="a" name="b"/></testsuite></testsuites>'
)
GPU = {"kind": "gpu", "name": "gpu0", "index": 0}
TWO_GPUS = [GPU, {**GPU, "name": "gpu1", "index": 1}]
A_RUN = record(run_id="run-a")
WITHOUT_NODEID = {k: v for k, v in A_RUN.items() if k != "nodeid"}
REPORTS = ("--reports-dir", "{d}/reports")
MERGE_RUN_A = {**run_folder("reports/run-a"), "a.xml": junit_xml(A_RUN)}
NOT_OF_THIS_SUITE = "no record of this suite (none of 1 has a verdict and a test id)"


# --------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------

REFUSALS: dict[str, Refusal] = {
    # report: the records
    "report-records-without-test-id": Refusal(
        ("report", "{d}/run"),
        "{d}/run: " + NOT_OF_THIS_SUITE,
        {"run/results.jsonl": results(WITHOUT_NODEID), "run/run.json": facts()},
    ),
    "report-no-records": Refusal(
        ("report", "{d}/run"),
        "no records in {d}/run/results.jsonl: nothing to report",
        {"run/results.jsonl": "", "run/run.json": facts()},
    ),
    "report-only-cut-off-lines": Refusal(
        ("report", "{d}/run"),
        "{d}/run: no readable record ({d}/run/results.jsonl: line 1 is not whole JSON (cut off?); skipped)",
        {"run/results.jsonl": '{"nodeid": "suites/test_pairs.py::t", "verd\n'},
    ),
    "report-record-of-the-wrong-type": Refusal(
        ("report", "{d}/run"),
        "{d}/run: no readable record ({d}/run/results.jsonl: line 1 is not a record of this suite "
        "(devices is 5, which is not a list); skipped)",
        {"run/results.jsonl": results({**A_RUN, "devices": 5})},
    ),
    "report-only-newer-schema": Refusal(
        ("report", "{d}/run"),
        "{d}/run: no readable record ({d}/run/results.jsonl: 1 record(s) of a newer schema than "
        + f"{SCHEMA} skipped; upgrade the suite)",
        {"run/results.jsonl": results({**A_RUN, "schema": SCHEMA + 1})},
    ),
    "report-run-json-not-json": Refusal(
        ("report", "{d}/run"),
        "{d}/run/run.json: not JSON: Expecting value: line 1 column 1 (char 0)",
        {**run_folder(), "run/run.json": "not json"},
    ),
    "report-run-json-a-list": Refusal(
        ("report", "{d}/run"),
        "{d}/run/run.json: holds a JSON list, not an object of run facts",
        {**run_folder(), "run/run.json": "[]"},
    ),
    "report-run-json-a-directory": Refusal(
        ("report", "{d}/run"),
        "{d}/run/run.json: is a directory, not a regular file",
        {"run/results.jsonl": results(A_RUN), "run/run.json": None},
    ),
    "report-run-json-field-of-the-wrong-type": Refusal(
        ("report", "{d}/run"),
        "{d}/run/run.json: topology is 'box', which is not an object or null",
        run_folder(topology="box"),
    ),
    "report-run-json-bad-ladder": Refusal(
        ("report", "{d}/run"),
        "{d}/run/run.json: ladder is not a list of rungs",
        run_folder(ladder={"inherited": {}}),
    ),
    "report-missing-run": Refusal(("report", "{d}/nowhere"), "{d}/nowhere: no such run folder or file"),
    "report-folder-without-results": Refusal(
        ("report", "{d}/run"), "{d}/run: not a run folder (no results.jsonl)", {"run": None}
    ),
    "report-binary-results": Refusal(
        ("report", "{d}/run"),
        "{d}/run/results.jsonl: cannot be read: 'utf-8' codec can't decode byte 0xff",
        {"run/results.jsonl": b"\xff\xfe{}\n"},
    ),
    "report-junit-of-another-suite": Refusal(
        ("report", "{d}/other.xml"),
        "{d}/other.xml: no testsuite carries the suite's conformance.* properties",
        {"other.xml": FOREIGN_JUNIT},
    ),
    "report-junit-away-from-its-run": Refusal(
        ("report", "{d}/a.xml"),
        "{d}/a.xml: the run's records are not at {d}/reports/run-a/results.jsonl, where it names them (a JUnit "
        "file holds none of its own); pass the run folder instead",
        {"a.xml": junit_xml(A_RUN)},
    ),
    "compare-junit-away-from-its-run": Refusal(
        ("compare", "{d}/run", "{d}/a.xml"),
        "{d}/a.xml: the run's records are not at {d}/reports/run-a/results.jsonl, where it names them",
        {**run_folder(), "a.xml": junit_xml(A_RUN)},
    ),
    "report-latest-missing": Refusal(("report", *REPORTS), "{d}/reports/latest: no such run folder or file"),
    # recommend and compare read runs through the same loader
    "recommend-run-json-not-json": Refusal(
        ("recommend", "{d}/run"),
        "{d}/run/run.json: not JSON: ",
        {**run_folder(), "run/run.json": "{"},
    ),
    "recommend-results-file-beside-a-broken-run-json": Refusal(
        ("recommend", "{d}/run/results.jsonl"),
        "{d}/run/run.json: holds a JSON null, not an object of run facts",
        {**run_folder(), "run/run.json": "null"},
    ),
    "recommend-records-without-test-id": Refusal(
        ("recommend", "{d}/run"),
        "{d}/run: " + NOT_OF_THIS_SUITE,
        {"run/results.jsonl": results(WITHOUT_NODEID)},
    ),
    "compare-baseline-run-json-not-json": Refusal(
        ("compare", "{d}/old", "{d}/new"),
        "{d}/old/run.json: not JSON: ",
        {**run_folder("old"), **run_folder("new", "run-b"), "old/run.json": "{"},
    ),
    "compare-current-record-of-the-wrong-type": Refusal(
        ("compare", "{d}/old", "{d}/new"),
        "{d}/new: no readable record ({d}/new/results.jsonl: line 1 is not a record of this suite (nodeid",
        {**run_folder("old"), "new/results.jsonl": results({**A_RUN, "nodeid": 7})},
    ),
    # nested deeper than any reader follows (issue 51): one line, never a RecursionError
    "report-only-a-deep-line": Refusal(
        ("report", "{d}/run"),
        "{d}/run: no readable record ({d}/run/results.jsonl: " + DEEP_LINE_SKIPPED.format(line=1) + ")",
        {**run_folder(), "run/results.jsonl": DEEP_LINE},
    ),
    "recommend-only-a-deep-line": Refusal(
        ("recommend", "{d}/run"),
        "{d}/run: no readable record ({d}/run/results.jsonl: " + DEEP_LINE_SKIPPED.format(line=1) + ")",
        {**run_folder(), "run/results.jsonl": DEEP_LINE},
    ),
    "compare-current-only-a-deep-line": Refusal(
        ("compare", "{d}/old", "{d}/new"),
        "{d}/new: no readable record ({d}/new/results.jsonl: " + DEEP_LINE_SKIPPED.format(line=1) + ")",
        {**run_folder("old"), "new/results.jsonl": DEEP_LINE},
    ),
    "report-run-json-nested-deep": Refusal(
        ("report", "{d}/run"),
        "{d}/run/run.json: nested deeper than 64 levels",
        {**run_folder(), "run/run.json": "[" * DEEP + "]" * DEEP},
    ),
    "merge-junit-nested-deep": Refusal(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml"),
        "{d}/a.xml: not a readable JUnit XML file: nested deeper than 64 elements",
        {**MERGE_RUN_A, "a.xml": junit_xml(A_RUN).replace("</testsuite>", DEEP_XML + "</testsuite>")},
    ),
    "compare-junit-nested-deep": Refusal(
        ("compare", "{d}/run", "{d}/a.xml"),
        "{d}/a.xml: not a readable JUnit XML file: nested deeper than 64 elements",
        {**MERGE_RUN_A, **run_folder(), "a.xml": junit_xml(A_RUN).replace("</testsuite>", DEEP_XML + "</testsuite>")},
    ),
    # merge-junit
    "merge-output-is-an-input": Refusal(
        ("merge-junit", "-o", "{d}/a.xml", "{d}/a.xml"),
        "--output {d}/a.xml is also an input ({d}/a.xml); write the merged file elsewhere",
        MERGE_RUN_A,
    ),
    "merge-output-is-an-input-by-another-name": Refusal(
        ("merge-junit", "-o", "{d}/sub/../a.xml", "{d}/b.xml", "{d}/a.xml"),
        "--output {d}/sub/../a.xml is also an input ({d}/a.xml); write the merged file elsewhere",
        {**MERGE_RUN_A, "sub": None, "b.xml": junit_xml(record("gpu0-gpu2", run_id="run-a"))},
    ),
    "merge-input-named-twice": Refusal(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml", "{d}/a.xml"),
        "IN {d}/a.xml is named twice; each case must be merged once",
        MERGE_RUN_A,
    ),
    "merge-junit-of-another-suite": Refusal(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml", "{d}/other.xml"),
        "{d}/other.xml: testsuite 'other' carries none of the suite's conformance.* properties",
        {**MERGE_RUN_A, "other.xml": FOREIGN_JUNIT},
    ),
    "merge-output-written-by-someone-else": Refusal(
        ("merge-junit", "-o", "{d}/b.xml", "{d}/a.xml"),
        "--output {d}/b.xml exists and was not written by merge-junit; not overwritten",
        {**MERGE_RUN_A, "b.xml": junit_xml(record("gpu0-gpu2", run_id="run-a"))},
    ),
    "merge-output-is-a-run-json": Refusal(
        ("merge-junit", "-o", "{d}/reports/run-a/run.json", "{d}/a.xml"),
        "--output {d}/reports/run-a/run.json exists and was not written by merge-junit; not overwritten",
        MERGE_RUN_A,
    ),
    "merge-output-is-a-directory": Refusal(
        ("merge-junit", "-o", "{d}/reports", "{d}/a.xml"),
        "--output {d}/reports is a directory; name the merged file",
        MERGE_RUN_A,
    ),
    "merge-input-is-a-directory": Refusal(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/reports"),
        "{d}/reports: is a directory, not a regular file",
        MERGE_RUN_A,
    ),
    "merge-run-json-not-json": Refusal(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml"),
        "{d}/reports/run-a/run.json: not JSON: Expecting value: line 1 column 1 (char 0); fix or remove it",
        {**MERGE_RUN_A, "reports/run-a/run.json": "garbage"},
    ),
    # topology
    # smoke: where it writes
    "smoke-out-under-a-file": Refusal(
        ("smoke", "--skip-suite", "--out", "{d}/afile/x"),
        "--out {d}/afile/x: cannot make the folder: Not a directory",
        {"afile": "x"},
    ),
    "smoke-out-is-a-file": Refusal(
        ("smoke", "--skip-suite", "--out", "{d}/afile"),
        "--out {d}/afile: is there already, and not a folder",
        {"afile": "x"},
    ),
    "topology-missing-file": Refusal(
        ("topology", "--topology-file", "{d}/missing.json"),
        "--topology-file: topology file '{d}/missing.json' cannot be read: No such file or directory",
    ),
    "topology-directory": Refusal(
        ("topology", "--topology-file", "{d}/box"),
        "--topology-file: topology file '{d}/box' is a directory, not a regular file",
        {"box": None},
    ),
    "topology-a-fifo": Refusal(  # a FIFO no one writes to would block the read for ever
        ("topology", "--topology-file", "{d}/pipe.json"),
        "--topology-file: topology file '{d}/pipe.json' is a named pipe (FIFO), not a regular file",
        {"pipe.json": FIFO},
    ),
    "topology-dev-zero": Refusal(  # endless: read until memory ran out
        ("topology", "--topology-file", "/dev/zero"),
        "--topology-file: topology file '/dev/zero' is a character device, not a regular file",
    ),
    "topology-too-large": Refusal(
        ("topology", "--topology-file", "{d}/huge.json"),
        f"--topology-file: topology file '{{d}}/huge.json' is over {USER_FILE_BYTES >> 20} MiB, the most the suite "
        "reads of such a file",
        {"huge.json": b" " * (USER_FILE_BYTES + 1)},
    ),
    "report-results-a-fifo": Refusal(
        ("report", "{d}/run"),
        "{d}/run/results.jsonl: is a named pipe (FIFO), not a regular file",
        {"run/results.jsonl": FIFO, "run/run.json": facts()},
    ),
    "merge-input-a-fifo": Refusal(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml"),
        "{d}/a.xml: is a named pipe (FIFO), not a regular file",
        {"a.xml": FIFO},
    ),
    "topology-not-json": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: not JSON: Expecting value: ",
        {"box.json": "kind: gpu\n"},
    ),
    "topology-nested-deep": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: nested deeper than 64 levels",
        {"box.json": '{"kind": ' * DEEP + "1" + "}" * DEEP},
    ),
    "topology-null": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: it holds a JSON null, not an object",
        {"box.json": "null"},
    ),
    "topology-empty-object": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: no \"devices\" list",
        {"box.json": "{}"},
    ),
    "topology-no-devices": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: no \"devices\" list",
        {"box.json": json.dumps({"kind": "gpu", "links": {}})},
    ),
    "topology-no-kind": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        '--topology-file: topology file \'{d}/box.json\' is not a topology: no "kind" ("cpu" or "gpu")',
        {"box.json": json.dumps({"devices": [GPU]})},
    ),
    "topology-no-links": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: no \"links\" for its 2 GPUs",
        {"box.json": json.dumps({"kind": "gpu", "devices": TWO_GPUS})},
    ),
    "topology-link-to-no-device": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' has link 'gpu0-gpu9', which is not a pair of its devices",
        {"box.json": json.dumps({"kind": "gpu", "devices": TWO_GPUS, "links": {"gpu0-gpu9": "NV4"}})},
    ),
    "topology-link-written-backwards": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' has link 'gpu1-gpu0', which is not a pair of its devices",
        {
            "box.json": json.dumps(
                {"kind": "gpu", "devices": TWO_GPUS, "links": {"gpu0-gpu1": "NV4", "gpu1-gpu0": "SYS"}}
            )
        },
    ),
    "topology-links-a-list": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: \"links\" is [], not an object",
        {"box.json": json.dumps({"kind": "gpu", "devices": TWO_GPUS, "links": []})},
    ),
    "topology-inventory-pci-gpus-a-number": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: inventory: pci_gpus is 8, which is not a "
        "list",
        {"box.json": json.dumps({"kind": "gpu", "devices": [GPU], "inventory": {"pci_gpus": 8}})},
    ),
    "topology-inventory-unknown-field": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: inventory: unknown field 'ecc'",
        {"box.json": json.dumps({"kind": "gpu", "devices": [GPU], "inventory": {"ecc": 0}})},
    ),
    "topology-health-width-a-text": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: health of gpu0: pcie_width is 'x16', which "
        "is not",
        {"box.json": json.dumps({"kind": "gpu", "devices": [GPU], "health": {"gpu0": {"pcie_width": "x16"}}})},
    ),
    "topology-iommu-mode-unknown": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: iommu: mode is 'strict', not passthrough, "
        "translated or off",
        {"box.json": json.dumps({"kind": "gpu", "devices": [GPU], "iommu": {"mode": "strict"}})},
    ),
    "topology-devices-not-a-list": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: \"devices\" is 5, not a list",
        {"box.json": json.dumps({"kind": "gpu", "devices": 5})},
    ),
    "topology-device-without-index": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: device 0 in \"devices\" has no 'index'",
        {"box.json": json.dumps({"kind": "gpu", "devices": [{"kind": "gpu", "name": "gpu0"}]})},
    ),
    "topology-unknown-field": Refusal(
        ("topology", "--topology-file", "{d}/box.json"),
        "--topology-file: topology file '{d}/box.json' is not a topology: unknown field 'gpus'",
        {"box.json": json.dumps({"kind": "gpu", "devices": [GPU], "gpus": 1})},
    ),
}

CONTROLS: dict[str, Control] = {
    "report": Control(("report", "{d}/run"), 0, ("run/report.html",), run_folder()),
    "report-without-run-json": Control(
        ("report", "{d}/run"), 0, ("run/report.html",), {"run/results.jsonl": results(A_RUN)}
    ),
    "report-skips-one-record-of-the-wrong-type": Control(
        ("report", "{d}/run"),
        0,
        ("run/report.html",),
        {**run_folder(), "run/results.jsonl": results(A_RUN, {**A_RUN, "devices": 5})},
    ),
    "recommend": Control(("recommend", "{d}/run"), 0, ("run/recommended.env",), run_folder()),
    "compare": Control(
        ("compare", "{d}/old", "{d}/new"),
        0,
        ("new/comparison.json",),
        {**run_folder("old"), **run_folder("new", "run-b")},
    ),
    "report-of-a-junit-file": Control(("report", "{d}/a.xml"), 0, ("report.html",), MERGE_RUN_A),
    "merge": Control(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml", "{d}/b.xml"),
        0,
        ("out.xml",),
        {**MERGE_RUN_A, "b.xml": junit_xml(record("gpu0-gpu2", run_id="run-a"))},
    ),
    "merge-a-case-in-two-inputs-warns": Control(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml", "{d}/b.xml"),
        0,
        ("out.xml",),
        {**MERGE_RUN_A, "b.xml": junit_xml(record("gpu0-gpu2", run_id="run-a"), A_RUN)},
    ),
    "merge-one-test-in-two-runs": Control(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml", "{d}/b.xml"),
        0,
        ("out.xml",),
        {
            **MERGE_RUN_A,
            **run_folder("reports/run-b", "run-b"),
            "b.xml": junit_xml(record(run_id="run-b"), run="reports/run-b"),
        },
    ),
    "merge-over-an-earlier-merge": Control(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml"),
        0,
        ("out.xml",),
        {**MERGE_RUN_A, "out.xml": junit_xml(A_RUN, root="conformance")},
    ),
    "merge-over-an-empty-file": Control(
        ("merge-junit", "-o", "{d}/out.xml", "{d}/a.xml"), 0, ("out.xml",), {**MERGE_RUN_A, "out.xml": ""}
    ),
    "topology": Control(
        ("topology", "--topology-file", "{d}/box.json"),
        0,
        (),
        {"box.json": json.dumps({"kind": "gpu", "devices": TWO_GPUS, "links": {"gpu0-gpu1": "NV4"}})},
    ),
    "topology-of-one-gpu-needs-no-links": Control(
        ("topology", "--topology-file", "{d}/box.json"),
        0,
        (),
        {"box.json": json.dumps({"kind": "gpu", "devices": [GPU]})},
    ),
}


# --------------------------------------------------------------------------------------------
# running a row
# --------------------------------------------------------------------------------------------


def prepare(folder: Path, files: Files) -> None:
    for name, content in files.items():
        path = folder / name
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        if content == FIFO:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{d}", str(folder)))


def snapshot(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under the folder: its mtime and, for a file, its content."""
    return {
        str(path.relative_to(folder)): (path.lstat().st_mtime_ns, path.read_bytes() if path.is_file() else None)
        for path in folder.rglob("*")
    }


def command_line(argv: tuple[str, ...], folder: Path) -> list[str]:
    return [arg.replace("{d}", str(folder)) for arg in argv]


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("case", list(REFUSALS.values()), ids=list(REFUSALS))
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: Refusal
) -> None:
    monkeypatch.chdir(tmp_path)
    prepare(tmp_path, case.files)
    before = snapshot(tmp_path)
    argv = command_line(case.argv, tmp_path)
    status, out, err = run_cli(capsys, argv)
    assert (status, out) == (2, "")
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err.startswith(f"python -m conformance {argv[0]}: " + case.message.replace("{d}", str(tmp_path)))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", list(CONTROLS.values()), ids=list(CONTROLS))
def test_good_input_controls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: Control
) -> None:
    monkeypatch.chdir(tmp_path)
    prepare(tmp_path, case.files)
    before = snapshot(tmp_path)
    status, out, err = run_cli(capsys, command_line(case.argv, tmp_path))
    assert status == case.status, err
    assert out and "Traceback" not in err
    after = snapshot(tmp_path)
    changed = sorted(name for name in after if before.get(name) != after[name] and (tmp_path / name).is_file())
    assert changed == sorted(case.written)


def test_the_module_refuses_without_a_traceback(tmp_path: Path) -> None:
    """``python -m conformance`` itself: exit status 2 and the one line, from a fresh interpreter."""
    prepare(tmp_path, {"run/results.jsonl": results(WITHOUT_NODEID)})
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "report", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"python -m conformance report: {tmp_path}/run: {NOT_OF_THIS_SUITE}\n"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["results.jsonl"]


@pytest.mark.parametrize("command", ["report", "recommend", "compare"])
def test_a_deep_line_among_records_is_named_and_the_command_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The line is skipped and named on stderr; the records around it are read and the command does its work."""
    monkeypatch.chdir(tmp_path)
    prepare(tmp_path, {**run_folder("old"), **run_folder(), "run/results.jsonl": results(A_RUN) + DEEP_LINE})
    argv = [command, *([str(tmp_path / "old")] if command == "compare" else []), str(tmp_path / "run")]
    status, out, err = run_cli(capsys, argv)
    assert status == 0 and out, err
    assert "Traceback" not in err
    skipped = f"{tmp_path}/run/results.jsonl: {DEEP_LINE_SKIPPED.format(line=2)}"
    assert f"python -m conformance {command}: warning: {skipped}" in err.splitlines(), err
