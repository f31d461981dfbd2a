"""What the run's watch saw (run.json's ``watch``, ``discover/watch.py``), judged: for the answer and compare."""

from __future__ import annotations

from conformance.discover.watch import WatchError, WatchFinding, watch_findings, watch_from_json
from conformance.record.runs import Run


def run_watch_findings(run: Run) -> list[WatchFinding]:
    """What the run's watch saw that matters (run.json's ``watch``; none where the run was not watched)."""
    if run.facts.watch is None:
        return []
    try:
        watched = watch_from_json(run.facts.watch, "run.json watch")
    except WatchError as exc:
        return [WatchFinding("watch", "", f"run.json's watch does not read ({exc}): the run's GPUs are not judged")]
    return watch_findings(watched, run.machine.health)
