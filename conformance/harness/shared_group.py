"""One process group for the collectives of several tests over the same device set.

Each test of a collective (all-reduce, broadcast, all-gather, reduce-scatter) over a device set
would start its own ranks and make its own communicator.  A test that declares its collective with
``@pytest.mark.collective(probe, **params)`` (and runs it through the ``collective_case``
fixture) lets the session run it in one case together with the other declared collectives of the
same device set and rung that this process will run later: the ranks make one group and run the
collectives one after another (the rank's ``collectives`` probe), noting each one they finish.

Every test still gets its own verdict and record, written when pytest reaches it:

- a collective every rank finished passes, with its own metrics and seconds;
- the first collective not finished by every rank (or, if all were, the last one) takes the
  case's verdict: its failure, hang or skip, with the root cause and the victims;
- the collectives after it were never run: their tests run a case of their own, alone.

So a failure costs no more than before, and a healthy device set makes one communicator where it
made four.  Only first-rung items are put together (their rung needs no other case's outcome).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from conformance.common.casefiles import SEQUENCE, SHARED_DONE
from conformance.common.jsonl import JsonDict
from conformance.common.verdicts import Verdict
from conformance.launch.case import CaseResult, CaseSpec
from conformance.verdict.decision import Decision, RankReport

MARKER = "collective"
ProbeParams = dict[str, object]  # a probe's parameters as a test gives them (JSON-able: they go in the case file)
SHARED_PROBE = "collectives"  # the rank probe that runs a sequence (rank/probes.py)
# Collectives with no set-up of their own and nothing left behind in the group: running one after
# another changes nothing for the next one.
SHAREABLE = frozenset({"all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"})
MARKER_HELP = (
    f"{MARKER}(probe, **params): the test runs this collective (one of {', '.join(sorted(SHAREABLE))}) "
    "through the collective_case fixture; it may share one process group with the other collectives "
    "over the same device set"
)


def declared(item: pytest.Item) -> tuple[str, ProbeParams] | None:
    """The collective and parameters an item declares with the marker (None: none, or not shareable)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None or len(marker.args) != 1 or marker.args[0] not in SHAREABLE:
        return None
    return str(marker.args[0]), dict(marker.kwargs)


@dataclass(frozen=True)
class Part:
    """One test's collective in a shared case: the test's own spec (its node id, probe, parameters)."""

    spec: CaseSpec

    @property
    def probe(self) -> str:
        return self.spec.probe

    def to_json(self) -> JsonDict:
        return {"probe": self.probe, "params": dict(self.spec.params)}


def shared_spec(parts: Sequence[Part]) -> CaseSpec:
    """The one case that runs every part: the first part's case, running the sequence."""
    first = parts[0].spec
    return replace(first, probe=SHARED_PROBE, params={SEQUENCE: [p.to_json() for p in parts]})


def _done(report: RankReport) -> Mapping[str, Any]:
    done = report.metrics.get(SHARED_DONE)
    return done if isinstance(done, dict) else {}


def _own_reports(reports: Sequence[RankReport], probe: str | None) -> list[RankReport]:
    """The ranks' reports with the group's metrics and, for ``probe``, its own (the others' left out)."""
    own = []
    for report in reports:
        metrics = {k: v for k, v in report.metrics.items() if k != SHARED_DONE}
        if probe is not None:
            metrics.update(_done(report).get(probe, {}).get("metrics", {}))
        own.append(replace(report, metrics=metrics))
    return own


def _seconds(reports: Sequence[RankReport], probe: str) -> float:
    return max((float(_done(r)[probe].get("seconds", 0.0)) for r in reports), default=0.0)


def split(result: CaseResult, parts: Sequence[Part]) -> dict[str, CaseResult | None]:
    """Each part's result, by node id; None for a part that must run alone (never reached).

    The part that carries the case's verdict (the first one not finished, else the last) also
    carries the case's set-up and teardown seconds; each part before it has its own seconds.
    """
    finished = [p for p in parts if all(p.probe in _done(r) for r in result.reports)]
    unfinished = [p for p in parts if p not in finished]
    carrier = unfinished[0] if unfinished else parts[-1]
    first = parts[0].spec.nodeid
    out: dict[str, CaseResult | None] = {p.spec.nodeid: None for p in parts}
    for part in parts[: parts.index(carrier)]:
        out[part.spec.nodeid] = replace(
            result,
            spec=part.spec,
            decision=Decision(Verdict.PASS, None, [], ""),
            reports=_own_reports(result.reports, part.probe),
            seconds=_seconds(result.reports, part.probe),
            stop_reason=None,
            stop_seconds=0.0,
            stop_steps=(),
            shared_by=first,
        )
    own = _own_reports(result.reports, carrier.probe if carrier in finished else None)
    others = sum(r.seconds for r in out.values() if r is not None)
    out[carrier.spec.nodeid] = replace(
        result, spec=carrier.spec, reports=own, seconds=max(0.0, result.seconds - others), shared_by=first
    )
    return out


def part_of(part: Part, parts: Sequence[Part], result: CaseResult) -> CaseResult | None:
    """One part's own result out of the shared case (None: it runs alone).

    By the part's own spec, never by pytest's node id: that differs with how the suite was named
    (``suites/``, ``conformance/suites``, ``--pyargs`` from elsewhere), the spec's does not.
    """
    return split(result, parts)[part.spec.nodeid]
