"""The run folder and its records: one JSON line per case, written the moment the case ends.

    <reports dir>/<run id>/results.jsonl    appended under an exclusive lock, flushed and fsynced
    <reports dir>/latest -> <run id>        points at the newest run

xdist workers share the run id (the controller chooses it) and the file; the lock keeps their
lines whole.  A run killed half-way keeps every line written before the kill.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.verdict.decision import stack_excerpt

if TYPE_CHECKING:
    from conformance.launch.case import CaseResult

SCHEMA = 1
RESULTS_FILE = "results.jsonl"
LATEST = "latest"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def point_latest(reports_dir: Path, run_id: str) -> None:
    """Make ``latest`` point at this run, atomically (a rename over the old link)."""
    tmp = reports_dir / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_id)
    os.replace(tmp, reports_dir / LATEST)


def root_cause(result: CaseResult) -> dict[str, Any] | None:
    root = result.decision.root
    if result.verdict in ("pass", "skip"):
        return None
    if root is None:
        return {"rank": None, "kind": result.verdict, "message": result.decision.summary, "phase": None, "step": None}
    kind = root.error_type or root.status
    return {"rank": root.rank, "kind": kind, "message": root.message, "phase": root.phase, "step": root.step}


def case_record(
    result: CaseResult, run_id: str, expected_verdict: str | None = None, ladder_key: str | None = None
) -> dict[str, Any]:
    spec = result.spec
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "nodeid": spec.nodeid,
        "probe": spec.probe,
        "devices": [d.name for d in spec.devices],
        "device_ids": [d.uuid or d.name for d in spec.devices],
        "link": spec.link,
        "set_kind": spec.set_kind,
        "ladder_key": ladder_key,
        "backend": spec.backend,
        "env_name": spec.env_name,
        "env": {**spec.env_set, **{name: None for name in spec.env_unset}},
        "verdict": result.verdict,
        "expected_verdict": expected_verdict,
        "summary": result.decision.summary,
        "root_cause": root_cause(result),
        "victims": [r.rank for r in result.decision.victims],
        "ranks": [
            {
                "rank": r.rank,
                "device": r.device,
                "phase": r.phase,
                "step": r.step,
                "exit": r.exit,
                "status": r.status,
                "seconds": r.seconds,
                "stopped_by": r.stopped_by,
                "unkillable": r.unkillable,
                "stack": stack_excerpt(r.stack) or None,
                "collectives": r.collectives,
                "barrier": r.metrics.get("barrier"),  # the GPU the rank used and the one its barrier ran on
            }
            for r in result.reports
        ],
        "bandwidth_gbps": result.bandwidth_gbps,
        "metrics": result.metrics,
        "p2p_status": spec.p2p_status,
        "transports": (result.nccl or {}).get("transports", {}),
        "nccl_warnings": (result.nccl or {}).get("warnings", []),
        "nccl": result.nccl,
        "seconds": result.seconds,
        "lease_wait": result.lease_wait,
        "stop_reason": result.stop_reason,
        "stop_seconds": result.stop_seconds if result.stop_reason else None,
        "simulated": result.simulated,
        "node_rank": result.node_rank,
        "nodes": list(spec.nodes) if spec.nodes else None,
        "root_node": result.root_node,
        "node_verdicts": {str(k): v for k, v in result.node_verdicts.items()} if result.node_verdicts else None,
        "case_dir": str(result.case_dir),
        "time": time.time(),
    }


JUNIT_PROPERTIES = (
    "schema", "run_id", "nodeid", "probe", "devices", "device_ids", "link", "set_kind", "ladder_key",
    "backend", "env_name", "env", "verdict", "expected_verdict", "summary", "root_cause", "victims",
    "ranks", "bandwidth_gbps", "metrics", "p2p_status", "transports", "nccl_warnings", "seconds",
    "stop_reason", "simulated", "node_rank", "nodes", "root_node", "node_verdicts",
)  # fmt: skip
# Properties whose value is plain text; every other one is JSON.
JUNIT_TEXT_PROPERTIES = frozenset(
    {"run_id", "nodeid", "probe", "link", "set_kind", "ladder_key", "backend", "env_name", "verdict", "summary"}
)
JUNIT_PREFIX = "conformance."


def junit_properties(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The record's facts as JUnit properties (text as it is, the rest as JSON)."""
    properties = []
    for key in JUNIT_PROPERTIES:
        value = record.get(key)
        if key in JUNIT_TEXT_PROPERTIES and isinstance(value, str):
            text = value
        else:
            text = json.dumps(value, sort_keys=True)
        properties.append((f"{JUNIT_PREFIX}{key}", text))
    return properties


def record_from_junit_properties(properties: dict[str, str]) -> dict[str, Any]:
    """The inverse of :func:`junit_properties` (unknown ``conformance.*`` names are kept as text)."""
    record: dict[str, Any] = {}
    for name, text in properties.items():
        if not name.startswith(JUNIT_PREFIX):
            continue
        key = name[len(JUNIT_PREFIX) :]
        if key in JUNIT_TEXT_PROPERTIES:
            record[key] = text
            continue
        try:
            record[key] = json.loads(text)
        except ValueError:
            record[key] = text
    return record
