"""The run folder and its records: one JSON line per case, written the moment the case ends.

    <reports dir>/<run id>/results.jsonl    appended under an exclusive lock, flushed and fsynced
    <reports dir>/latest -> <run id>        points at the newest run

xdist workers share the run id (the controller chooses it) and the file; the lock keeps their
lines whole.  A run killed half-way keeps every line written before the kill.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.common.clock import wall
from conformance.common.jsonl import append_line
from conformance.common.verdicts import Verdict
from conformance.record.records import CaseRecord, RankRecord, RootCause
from conformance.verdict.decision import stack_excerpt

if TYPE_CHECKING:
    from conformance.launch.case import CaseResult

RESULTS_FILE = "results.jsonl"
LATEST = "latest"
CLAIM_TRIES = 100  # a collision needs two runs in one second drawing one of 65536 suffixes


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def claim_run_folder(reports_dir: Path, run_id: str) -> str:
    """Create the run's folder, which must be new; returns the id whose folder this process created.

    Two runs started in the same second may draw the same id, and must not share a ladder.
    """
    reports_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(CLAIM_TRIES):
        try:
            (reports_dir / run_id).mkdir()
        except FileExistsError:
            run_id = new_run_id()
            continue
        return run_id
    raise FileExistsError(f"{reports_dir}: {CLAIM_TRIES} new run ids were all taken")


def point_latest(reports_dir: Path, run_id: str) -> None:
    """Make ``latest`` point at this run, atomically (a rename over the old link)."""
    tmp = reports_dir / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_id)
    os.replace(tmp, reports_dir / LATEST)


def root_cause(result: CaseResult) -> RootCause | None:
    root = result.decision.root
    if result.verdict in (Verdict.PASS, Verdict.SKIP):
        return None
    if root is None:
        return RootCause(None, str(result.verdict), result.decision.summary, None, None)
    return RootCause(root.rank, root.error_type or root.status, root.explained, root.phase, root.step)


def rank_records(result: CaseResult) -> tuple[RankRecord, ...]:
    return tuple(
        RankRecord(
            rank=r.rank,
            device=r.device,
            phase=r.phase,
            step=r.step,
            exit=r.exit,
            status=r.status,
            seconds=r.seconds,
            stopped_by=r.stopped_by,
            unkillable=r.unkillable,
            stack=stack_excerpt(r.stack) or None,
            collectives=r.collectives,
            barrier=r.metrics.get("barrier"),
            cause=r.cause.text if r.cause else None,
        )
        for r in result.reports
    )


def case_record(
    result: CaseResult,
    run_id: str,
    expected_verdict: str | None = None,
    ladder_key: str | None = None,
    one_rung: bool = False,
    no_nccl: bool = False,
) -> CaseRecord:
    spec, nccl = result.spec, result.nccl or {}
    return CaseRecord(
        run_id=run_id,
        nodeid=spec.nodeid,
        probe=spec.probe,
        devices=tuple(d.name for d in spec.devices),
        device_ids=tuple(d.uuid or d.name for d in spec.devices),
        link=spec.link,
        set_kind=spec.set_kind,
        ladder_key=ladder_key,
        backend=spec.backend,
        env_name=spec.env_name,
        env={**spec.env_set, **{name: None for name in spec.env_unset}},
        verdict=result.verdict,
        expected_verdict=expected_verdict,
        summary=result.decision.summary,
        root_cause=root_cause(result),
        victims=tuple(r.rank for r in result.decision.victims),
        ranks=rank_records(result),
        bandwidth_gbps=result.bandwidth_gbps,
        metrics=result.metrics,
        p2p_status=spec.p2p_status,
        transports=nccl.get("transports", {}),
        predicted=dict(spec.predicted),
        nccl_warnings=tuple(nccl.get("warnings", [])),
        nccl=result.nccl,
        seconds=result.seconds,
        lease_wait=result.lease_wait,
        stop_reason=result.stop_reason,
        stop_seconds=result.stop_seconds if result.stop_reason else None,
        simulated=result.simulated,
        node_rank=result.node_rank,
        nodes=tuple(spec.nodes) if spec.nodes else None,
        root_node=result.root_node,
        node_verdicts={str(k): v for k, v in result.node_verdicts.items()} if result.node_verdicts else None,
        case_dir=str(result.case_dir),
        time=wall(),
        clock=time.monotonic(),
        shared_by=result.shared_by,
        one_rung=one_rung,
        no_nccl=no_nccl,
    )


def append_case(path: Path, record: CaseRecord) -> None:
    """Append the record to results.jsonl the moment its case ends (locked, fsynced)."""
    append_line(path, record.to_json())
