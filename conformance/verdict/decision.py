"""One verdict per case, decided here from every rank's report (``common/verdicts.py`` names them).

The root cause is the earliest real failure.  A rank whose error only says that it timed out or
lost its peer, or that the watchdog had to stop while it waited, is a victim of that root cause.
"""

from __future__ import annotations

import importlib.util
import json
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from conformance.common import casefiles
from conformance.common.bounded_parse import NotParsed, json_value
from conformance.common.casefiles import PhaseLine, RankStatus
from conformance.common.verdicts import ROOT_CAUSE_PRECEDENCE, Verdict
from conformance.rank import context, flight_recorder
from conformance.verdict.stderr_causes import Cause, rank_cause

# Errors a rank gets because another rank failed or never arrived.
VICTIM_PATTERN = re.compile(
    r"timed? ?out|timeout|connection closed by peer|connection reset by peer|broken pipe"
    r"|watchdog caught collective operation timeout|communicator was aborted"
    r"|socket closed|wait timeout|remote worker crash",
    re.IGNORECASE,
)
# Where a waiting rank's Python stack stands while it waits on its peers.
WAITING_FRAME = re.compile(r"torch/distributed/|store\.wait|\bwait\b", re.IGNORECASE)


STACK_EXCERPT_LINES = 12
FLIGHT_RECORDER_FRAME = f'File "{flight_recorder.__file__}"'  # the rank's dumper thread, never the story


def thread_stacks(stack: str) -> list[list[str]]:
    """A faulthandler dump's frames, one list per thread, innermost first."""
    threads: list[list[str]] = []
    for line in stack.splitlines():
        if "thread 0x" in line.lower() or not threads:
            threads.append([])
        if line.strip().startswith("File "):
            threads[-1].append(line)
    return [frames for frames in threads if frames]


def rank_frames(stack: str) -> list[str]:
    """The frames of the thread doing the rank's work: the first one that is not the flight-recorder dumper."""
    threads = [t for t in thread_stacks(stack) if not any(FLIGHT_RECORDER_FRAME in line for line in t)]
    return threads[0] if threads else []


# The harness's own frames say nothing about the machine: the fork server a rank was forked from
# (and runpy under it), and the rank's context, which reports phases and injects simulated faults.
HARNESS_FILES = (
    f'File "{importlib.util.find_spec("conformance.launch.forkserver").origin}"',  # type: ignore[union-attr]
    f'File "{context.__file__}"',
    'File "<frozen runpy>"',
)


def _harness_frame(line: str) -> bool:
    return line.strip().startswith(HARNESS_FILES)


def stack_excerpt(stack: str, lines: int = STACK_EXCERPT_LINES) -> str:
    """The innermost frames of the rank's working thread in a faulthandler dump, without the harness's own."""
    frames = [line for line in rank_frames(stack) if not _harness_frame(line)]
    return "\n".join(frames[:lines])


def traceback_excerpt(traceback: str, chars: int = 1500) -> str:
    """A Python traceback without the harness's frames (each a ``File`` line and its source line); its end."""
    kept: list[str] = []
    skip_source = False
    for line in traceback.strip().splitlines():
        if skip_source and line.startswith("    ") and not line.strip().startswith("File "):
            continue  # the source line (and caret lines) of a dropped frame
        skip_source = _harness_frame(line)
        if not skip_source:
            kept.append(line)
    return "\n".join(kept)[-chars:]


def exit_label(code: int | None) -> str | int | None:
    """An exit code, or the signal's name for a rank killed by a signal."""
    if code is None or code >= 0:
        return code
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclass
class RankReport:
    rank: int
    device: str
    pid: int
    phase: str
    step: str
    phase_time: float | None  # when it entered its last phase (host monotonic clock: orders a case's ranks)
    progress: int  # how many phases it reported
    exit: str | int | None
    seconds: float
    status: RankStatus
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    time: float | None = None  # when it failed (host monotonic clock: the earliest failure is the root cause)
    stopped_by: str | None = None
    stack: str = ""
    unkillable: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    collectives: dict[str, Any] | None = None  # the flight recorder's last entries, when the rank dumped it
    cause: Cause | None = None  # a known cause its last log lines name (failed ranks only)

    @property
    def explained(self) -> str:
        """Its message, followed by the cause its logs name (the message alone decides whether it is a victim)."""
        return self.with_cause(self.message)

    def with_cause(self, message: str) -> str:
        return self.cause.explain(message) if self.cause else message

    @property
    def reached(self) -> tuple[int, int] | None:
        """How far it got: (phases reported, NCCL operations issued); None without a flight-recorder dump."""
        issued = flight_recorder.issued(self.collectives)
        return None if issued is None else (self.progress, issued)

    @property
    def victim(self) -> bool:
        return self.status == RankStatus.STOPPED or (
            self.status in (RankStatus.ERROR, RankStatus.CRASH) and bool(VICTIM_PATTERN.search(self.message))
        )

    @property
    def failed(self) -> bool:
        return self.status not in (RankStatus.OK, RankStatus.SKIP)

    @property
    def where(self) -> str:
        return casefiles.place(self.phase, self.step)


class EndedRank(Protocol):
    """What the launcher knows of a rank once the case is over (``launch.processes.RankProcess``)."""

    rank: int
    pid: int
    path: Path
    exit_code: int | None
    exit_time: float | None
    stack: str
    unkillable: bool

    @property
    def stopped_by(self) -> str | None: ...  # why the watchdog stopped it (launch.processes.StopReason)


def _status_without_result(proc: EndedRank) -> tuple[RankStatus, str]:
    """A rank that wrote no result.json: what its end says (its exit code, when it exited itself)."""
    if proc.stopped_by:
        return RankStatus.STOPPED, f"stopped by the watchdog ({proc.stopped_by}) in its current phase"
    if proc.exit_code is None:
        return RankStatus.LOST, "no exit status"
    if proc.exit_code < 0:
        stderr = casefiles.tail(proc.path / casefiles.STDERR).splitlines()
        last_words = [line for line in stderr if VICTIM_PATTERN.search(line)]
        said = f"; it last said: {last_words[-1].strip()}" if last_words else ""
        return RankStatus.CRASH, f"killed by {exit_label(proc.exit_code)}{said}"
    status = casefiles.STATUS_BY_EXIT.get(proc.exit_code, RankStatus.ERROR)
    return status, f"exited with code {proc.exit_code} ({status}) without a result"


def rank_report(proc: EndedRank, device: str, started: float) -> RankReport:
    report = _ended_report(proc, device, started)
    if report.failed:  # a passing rank's logs are never read
        report.cause = rank_cause(proc.path)
    return report


def _ended_report(proc: EndedRank, device: str, started: float) -> RankReport:
    phases = casefiles.read_phases(proc.path)
    last = phases[-1] if phases else PhaseLine("start")
    report = RankReport(
        rank=proc.rank,
        device=device,
        pid=proc.pid,
        phase=last.phase,
        step=last.step,
        phase_time=last.clock,
        progress=len(phases),
        exit=exit_label(proc.exit_code),
        seconds=round((proc.exit_time or started) - started, 3) if proc.exit_time else 0.0,
        status=RankStatus.LOST,
        stopped_by=proc.stopped_by,
        stack=proc.stack,
        unkillable=proc.unkillable,
        collectives=flight_recorder.last_collectives(proc.path),
        metrics={k: v for line in phases for k, v in line.facts.items()},  # known even if the rank was killed
    )
    result = casefiles.read_result(proc.path)
    if result is None:
        report.status, report.message = _status_without_result(proc)
        report.time = proc.exit_time
        return report
    report.status, report.error_type, report.message = result.status, result.error_type, result.message
    report.traceback, report.time = result.traceback, result.clock if result.clock is not None else proc.exit_time
    report.metrics = {**report.metrics, **result.metrics}
    report.phase, report.step = result.phase or report.phase, result.step if result.step is not None else report.step
    return report


@dataclass
class Decision:
    verdict: Verdict
    root: RankReport | None  # None: no rank stands out (all stuck alike), or nothing failed
    victims: list[RankReport]
    summary: str


def _hang_root(stuck: Sequence[RankReport]) -> RankReport | None:
    """The stuck rank that got least far (phases, then NCCL operations issued); None when they all wait alike."""
    counted = all(r.reached is not None for r in stuck)  # operations issued compare only where every rank dumped

    def key(r: RankReport) -> tuple[int, int, bool, float]:
        reached = (r.reached if counted else None) or (r.progress, 0)
        waiting = bool(WAITING_FRAME.search("\n".join(rank_frames(r.stack))))
        return (*reached, waiting, r.phase_time or 0.0)

    ordered = sorted(stuck, key=key)
    if len(ordered) > 1 and key(ordered[0])[:3] == key(ordered[1])[:3]:
        return None
    return ordered[0]


def _earliest(reports: Sequence[RankReport]) -> RankReport:
    return min(reports, key=lambda r: (r.time or float("inf"), r.rank))


def _describe(verdict: str, root: RankReport | None, stuck: Sequence[RankReport]) -> str:
    if root is None:
        ranks = ",".join(str(r.rank) for r in stuck)
        phases = sorted({r.where for r in stuck})
        return f"ranks {ranks} all stuck in {'; '.join(phases)}"
    text = f"rank {root.rank} ({root.device}) in {root.where}"
    if root.status == RankStatus.STOPPED:
        return (
            text
            + ": "
            + root.with_cause(f"made no progress and was stopped ({root.stopped_by})")
            + _behind(root, stuck)
        )
    kind = f"{root.error_type}: " if root.error_type else ""
    return text + f": {kind}{root.explained}"


def _behind(root: RankReport, others: Sequence[RankReport]) -> str:
    """What the flight recorders say of a root that issued fewer NCCL operations than the ranks waiting for it."""
    mine = flight_recorder.issued(root.collectives)
    ahead = [(r.rank, n) for r in others if r is not root and (n := flight_recorder.issued(r.collectives)) is not None]
    if mine is None or not ahead or max(n for _, n in ahead) <= mine:
        return ""
    ranks = ",".join(str(rank) for rank, n in ahead if n > mine)
    return (
        f"; it issued {mine} operation(s) where rank {ranks} issued {max(n for _, n in ahead)}: they wait in one it "
        "never joined (flight recorder)"
    )


def _other_causes(root: RankReport | None, failed: Sequence[RankReport]) -> str:
    """``; rank 2: <cause>`` for each cause the root's logs do not name, the ranks that share one together."""
    ranks_by_cause: dict[str, list[str]] = {}
    for r in failed:
        if r.cause is not None and (root is None or r.cause != root.cause):
            ranks_by_cause.setdefault(r.cause.text, []).append(str(r.rank))
    return "".join(
        f"; {'ranks' if len(ranks) > 1 else 'rank'} {','.join(ranks)}: {text}" for text, ranks in ranks_by_cause.items()
    )


def decide(reports: Sequence[RankReport]) -> Decision:
    """The verdict and root cause for one case."""
    failed = [r for r in reports if r.failed]
    wrong = [r for r in failed if r.status == RankStatus.FAIL]
    real = [r for r in failed if not r.victim and r.status != RankStatus.FAIL]
    stuck = [r for r in failed if r.victim]
    root: RankReport | None
    if wrong:
        verdict, root = Verdict.FAIL, _earliest(wrong)
    elif real:
        root = _earliest(real)
        verdict = Verdict.CRASH if root.status == RankStatus.CRASH else Verdict.ERROR
    elif stuck:
        stopped = [r for r in stuck if r.status == RankStatus.STOPPED]
        root = _hang_root(stopped) if stopped else _earliest(stuck)
        verdict = Verdict.HANG
    else:
        skipped = [r for r in reports if r.status == RankStatus.SKIP]
        if skipped:
            return Decision(Verdict.SKIP, None, [], skipped[0].message)
        return Decision(Verdict.PASS, None, [], "")
    anchor = root or stuck[0]
    if anchor.phase == "control":
        verdict = Verdict.INCONCLUSIVE
    victims = [r for r in failed if r is not root]
    summary = _describe(verdict, root, stuck) + _other_causes(root, failed)
    return Decision(verdict, root, victims, summary)


def stuck_place(decision: Decision) -> str:
    """Where a hung case's stopped ranks were, when they were all in one place ("" otherwise)."""
    if decision.verdict != Verdict.HANG:
        return ""
    places = {r.where for r in [decision.root, *decision.victims] if r is not None and r.status == RankStatus.STOPPED}
    return places.pop() if len(places) == 1 else ""


def _precedence(verdict: Verdict) -> int:
    """Where a node's verdict stands in explaining the others."""
    return ROOT_CAUSE_PRECEDENCE.index(verdict)


@dataclass(frozen=True)
class NodeVerdict:
    """One node's own verdict on a cross-node case: the message the nodes exchange to agree on one."""

    verdict: Verdict
    summary: str
    reached: tuple[int, int] | None = None  # a hang: how far its rank furthest behind got (RankReport.reached)

    @classmethod
    def of(cls, decision: Decision) -> NodeVerdict:
        """A node's verdict, with how far its stuck ranks got where every one of them says (flight recorder)."""
        stuck = [r for r in [decision.root, *decision.victims] if r is not None and r.victim]
        places = [r.reached for r in stuck]
        known = [p for p in places if p is not None]
        reached = min(known) if decision.verdict == Verdict.HANG and known and len(known) == len(places) else None
        return cls(decision.verdict, decision.summary, reached)

    def to_text(self) -> str:
        return json.dumps({"verdict": self.verdict.value, "summary": self.summary, "reached": self.reached})

    @classmethod
    def from_text(cls, text: str) -> NodeVerdict:
        """A node's verdict as it sent it; text that is no verdict is an error of that node's, saying so.

        Never a pass: a node whose verdict cannot be read did not say its part passed.
        """
        try:
            data = json_value(text)
        except NotParsed as exc:
            return cls(Verdict.ERROR, f"its verdict cannot be read: {exc}")
        if not isinstance(data, dict) or not isinstance(data.get("verdict"), str):
            return cls(Verdict.ERROR, f"its verdict cannot be read: {text[:200]!r} is no verdict")
        verdict = Verdict.of(data["verdict"]) or Verdict.ERROR  # unknown: an error
        reached = data.get("reached")
        counts = isinstance(reached, list) and len(reached) == 2 and all(type(n) is int and n >= 0 for n in reached)
        place = (int(reached[0]), int(reached[1])) if counts and isinstance(reached, list) else None
        return cls(verdict, str(data.get("summary", "")), place)


def decide_across_nodes(
    me: int, local: Decision, verdicts: Mapping[int, NodeVerdict], missing: tuple[int, str] | None
) -> tuple[Decision, int | None]:
    """One verdict for a cross-node case from every node's own: (decision, the node it comes from).

    ``missing`` (node, reason): a node that never came or stopped answering is the root cause.
    """
    local_failed = local.victims + ([local.root] if local.root else [])
    if missing is not None:
        node, reason = missing
        return Decision(Verdict.HANG, None, local_failed, f"hang across nodes: {reason}"), node
    node = min(verdicts, key=lambda n: (_precedence(verdicts[n].verdict), n))
    verdict, summary = verdicts[node].verdict, verdicts[node].summary
    if verdict == Verdict.PASS:
        return Decision(Verdict.PASS, None, [], ""), None
    behind = _node_behind(verdicts)
    if behind is not None:
        text = f"node {behind}: {verdicts[behind].summary}; {_node_behind_text(behind, verdicts)}"
        if behind == me:
            return Decision(Verdict.HANG, local.root, local.victims, text), behind
        return Decision(Verdict.HANG, None, local_failed, text), behind
    if len(verdicts) == 2 and all(v.verdict == Verdict.HANG for v in verdicts.values()):
        # Both nodes stuck waiting for each other (packet loss, a flapping link): the link between them,
        # naming neither; an error or wrong data on one node still names it (precedence above), and a node
        # bad with others too is named from the node pairs (summary.bad_nodes).
        a, b = sorted(verdicts)
        text = f"the link between node {a} and node {b} (both stuck): node {node}: {summary}"
        return Decision(verdict, local.root, local.victims, text), None
    if node == me:
        return Decision(verdict, local.root, local.victims, f"node {node}: {summary}"), node
    return Decision(verdict, None, local_failed, f"node {node}: {summary}"), node


def _node_behind(verdicts: Mapping[int, NodeVerdict]) -> int | None:
    """The one node whose stuck ranks got less far than every other node's, where all hung and all say how far."""
    reached = {n: v.reached for n, v in verdicts.items()}
    if len(reached) < 2 or any(v.verdict != Verdict.HANG for v in verdicts.values()):
        return None
    if any(place is None for place in reached.values()):
        return None
    ordered = sorted(reached, key=lambda n: reached[n] or (0, 0))
    return ordered[0] if reached[ordered[0]] != reached[ordered[1]] else None


def _node_behind_text(behind: int, verdicts: Mapping[int, NodeVerdict]) -> str:
    phases, issued = verdicts[behind].reached or (0, 0)
    others = [
        f"node {n}: {p} phase(s), {i} operation(s) issued"
        for n, v in sorted(verdicts.items())
        if n != behind and v.reached is not None
        for p, i in [v.reached]
    ]
    return (
        f"its ranks got least far ({phases} phase(s), {issued} operation(s) issued; {'; '.join(others)}; flight "
        "recorder): the other nodes only waited for it"
    )
