"""A record no reader can follow, written into a run or sent by a node, is skipped and named; the run answers.

Issue 51, item 2: one line of JSON nested 100,000 deep in results.jsonl (appended by a test, or written
into the run's file by anyone who can) ended the run in a RecursionError at its end: no answer, run.json
left ``started``, the metrics file left ``running``.  Another node's records reach node 0 as lines of
JSON over the store, read by the same bounded parser.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import COLLECTIVE_TEST
from test_compare import record

DEEP = 100_000  # levels of nesting, far past the interpreter's recursion limit
DEEP_LINE = "[" * DEEP + "]" * DEEP
pytestmark = pytest.mark.usefixtures("isolated_env")

APPEND_A_DEEP_LINE = """
from pathlib import Path

def test_writes_into_the_runs_records():
    with Path("reports/latest/results.jsonl").open("a") as results:
        results.write({line!r} + "\\n")
"""


def test_a_deep_line_in_the_runs_records_is_named_and_the_run_answers(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], reports_dir: Path
) -> None:
    pytester.makepyfile(test_a_case=COLLECTIVE_TEST.format(probe="all_reduce"))
    pytester.makepyfile(test_z_deep=APPEND_A_DEEP_LINE.format(line=DEEP_LINE))
    metrics = pytester.path / "metrics.prom"

    result = run_suite("--virtual-devices=2", f"--metrics-file={metrics}")

    out = result.stdout.str()
    assert "Traceback" not in out + result.stderr.str() and "RecursionError" not in out
    assert result.ret == pytest.ExitCode.OK, out
    run_dir = (reports_dir / "latest").resolve()
    answer = result.outlines[[i for i, line in enumerate(result.outlines) if "conformance: the answer" in line][-1] :]
    skipped = f"WARNING {run_dir}/results.jsonl: line 2 is nested deeper than 64 levels; skipped"
    assert skipped in answer, answer
    assert json.loads((run_dir / "run.json").read_text())["end"]["state"] == "complete"
    said = metrics.read_text()
    assert 'gpu_conformance_run_verdict{verdict="passed"} 1.0' in said
    assert 'gpu_conformance_run_verdict{verdict="running"} 0.0' in said


class FakeFolder:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def append(self, record: Any) -> None:
        self.records.append(record)


def test_a_nodes_record_nested_deep_is_skipped_and_named_and_its_others_kept() -> None:
    """Node 0 gathers every node's records: a line no parser follows is named with its node, never raised."""
    from conformance.harness.across_nodes import _gather

    good = json.dumps(record(run_id="run-1"))
    gathered = SimpleNamespace(records={1: [good, DEEP_LINE, "[1, 2]"]}, statuses={1: 0}, gone={})
    group = SimpleNamespace(
        gather_results=lambda waiting: gathered,
        strangers=lambda: ([], 0),
        store_problems=(),
        publish_outcome=lambda failed, readers: None,
    )
    folder = FakeFolder()
    outcome = SimpleNamespace(node_notes=[], store_problems=())
    run = SimpleNamespace(outcome=outcome, folder=folder, results_path="results.jsonl", ensure_run_dir=lambda: None)

    failed = _gather(run, group, 0)  # type: ignore[arg-type]

    assert failed == [] and len(folder.records) == 1 and folder.records[0].verdict_text == "pass"
    assert outcome.node_notes == [
        "node 1: record 2 of 3 skipped: nested deeper than 64 levels",
        "node 1: record 3 of 3 skipped: a JSON list, not a record",
        "node 1: 1 records gathered into results.jsonl",
    ]
