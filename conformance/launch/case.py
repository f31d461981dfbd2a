"""Run one case: fresh ranks from the forkserver, a fresh FileStore, the watchdog, a verdict."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.common import casefiles
from conformance.common.casefiles import CaseFile, RankDevice, RankStatus, StoreAddress
from conformance.common.deadlines import Deadlines
from conformance.common.outside_text import shown, shown_lines
from conformance.common.verdicts import Verdict
from conformance.discover.topology import Device
from conformance.launch.environment import device_id, rank_environments
from conformance.launch.forkserver import ForkServerClient, ForkServerError
from conformance.launch.leases import LeaseTimeout, leased
from conformance.launch.measure_gate import GateHold
from conformance.launch.processes import CaseProcesses, RankProcess, StopReason, StopStep
from conformance.launch.watchdog import Confirm, Limits, OnWait, Peers, SmallStep, Supervision, Turn, supervise
from conformance.plan.transport import NET, P2P, REFUSED
from conformance.rank import flight_recorder
from conformance.verdict import nccl_log
from conformance.verdict.decision import (
    Decision,
    RankReport,
    decide,
    rank_report,
    stack_excerpt,
    traceback_excerpt,
)


@dataclass(frozen=True)
class CrossNode:
    """Where the ranks of a cross-node case meet: node 0's store, under the case's own prefix."""

    host: str
    port: int
    prefix: str
    rank_offset: int  # this node's first rank
    world_size: int  # the ranks of every node together
    node_rank: int


@dataclass(frozen=True)
class CaseSpec:
    """What to run: a probe on a device set, under one environment rung."""

    nodeid: str
    probe: str
    devices: tuple[Device, ...]
    backend: str
    link: str | None = None
    env_name: str = "inherited"
    env_set: Mapping[str, str] = field(default_factory=dict)
    env_unset: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    set_kind: str = "all"
    links: tuple[str, ...] = ()  # link classes between the devices (scenario rules match them)
    # What NCCL would use between the devices under this case's environment (plan/transport.py):
    # per link class, its transport(s); the link classes with P2P are what a scenario's ``p2p`` matches.
    predicted: Mapping[str, str] = field(default_factory=dict)
    isolate: bool = False  # the ranks see only these GPUs, renumbered from 0
    visible: tuple[Device, ...] = ()  # what the ranks see, in order (default: the case's devices)
    p2p_status: Mapping[str, str] | None = None  # NVML's view, for pairs
    single_process: bool = False  # one rank on the first device, the others as its peers
    cross_node: CrossNode | None = None
    nodes: tuple[int, ...] = ()  # the node ranks a cross-node case spans
    grace: float | None = None  # this case's grace after a failure (negative controls); None: --grace

    @property
    def world_size(self) -> int:
        """The ranks this node starts."""
        return 1 if self.single_process else len(self.devices)

    @property
    def seen(self) -> tuple[Device, ...]:
        """The devices the ranks see, in CUDA order: the case's own when isolated, else every visible one."""
        return self.devices if self.isolate or not self.visible else self.visible


@dataclass
class CaseResult:
    spec: CaseSpec
    decision: Decision
    reports: list[RankReport]
    seconds: float
    case_dir: Path
    simulated: bool
    stop_reason: StopReason | None
    stop_seconds: float
    nccl: dict[str, Any] | None = None  # what the ranks' NCCL_DEBUG logs said (nccl_facts.NcclLog.to_record)
    lease_wait: float = 0.0  # seconds spent waiting for another case to free the devices
    node_rank: int | None = None  # in a multi-node run: the node this result is from
    root_node: int | None = None  # across nodes: the node the verdict comes from
    node_verdicts: dict[int, str] | None = None  # across nodes: each node's own verdict
    shared_by: str | None = None  # the test whose case ran this one's collective too (conformance.harness.shared_group)
    stop_steps: tuple[StopStep, ...] = ()  # the stop ladder's signals and their waits, when it ran

    @property
    def verdict(self) -> Verdict:
        return self.decision.verdict

    @property
    def unkillable(self) -> list[RankReport]:
        return [r for r in self.reports if r.unkillable]

    @property
    def metrics(self) -> dict[str, Any]:
        """Rank 0's measurements (bus bandwidth per size, peer copies, versions)."""
        return dict(self.reports[0].metrics) if self.reports else {}

    @property
    def bandwidth_gbps(self) -> float | None:
        values = [r.metrics["bandwidth_gbps"] for r in self.reports if "bandwidth_gbps" in r.metrics]
        return min(values) if values else None


def local_store(case_dir: Path) -> Path:
    """The case's FileStore path, its folder made (a local temporary folder: casefiles.local_store_path)."""
    path = casefiles.local_store_path(case_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a store left by a killed run of the same case folder starts afresh
    return path


def case_dir_name(nodeid: str) -> str:
    name = nodeid.split("/")[-1].replace("::", "--")
    return re.sub(r"[^A-Za-z0-9._\-\[\]]", "_", name)[:180]


def rank_devices(spec: CaseSpec) -> list[RankDevice]:
    """Each rank's device, with ``index`` the CUDA ordinal the rank will see."""
    order = {d.name: position for position, d in enumerate(spec.seen)}
    return [RankDevice(d.name, order.get(d.name, d.index), d.uuid) for d in spec.devices]


def read_nccl_logs(spec: CaseSpec, case_dir: Path) -> dict[str, Any] | None:
    if spec.backend != "nccl":
        return None
    paths = sorted(case_dir.glob(f"rank*/{casefiles.NCCL_LOG}"))
    return nccl_log.parse_files(paths).to_record()


class CaseRunner:
    """Runs cases one at a time for one pytest process and remembers every group it started."""

    def __init__(
        self,
        run_dir: Path,
        deadlines: Deadlines,
        rules: Sequence[Mapping[str, Any]] = (),
        simulated: bool = False,
        lease_dir: Path | None = None,
        server: ForkServerClient | None = None,
    ) -> None:
        """``server``: a forkserver client already launched (default: one of its own, started at the first case)."""
        self.run_dir = run_dir
        self.deadlines = deadlines
        self.lease_dir = lease_dir
        self.rules = list(rules)
        self.simulated = simulated
        log = run_dir / "forkserver" / f"{os.getpid()}.log"
        self.server = server or ForkServerClient(log, deadlines.forkserver_ready_wait, deadlines.spawn_wait)
        self.live: dict[int, CaseProcesses] = {}  # process group -> its case's ranks, for the final sweep

    def _fresh_case_dir(self, nodeid: str) -> Path:
        base = self.run_dir / "cases" / case_dir_name(nodeid)
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        path.mkdir(parents=True)
        return path

    def _write_spec(self, spec: CaseSpec, case_dir: Path) -> None:
        environments = rank_environments(spec, case_dir, self.deadlines)
        devices = rank_devices(spec)
        across = spec.cross_node
        case = CaseFile(
            nodeid=spec.nodeid,
            probe=spec.probe,
            backend=spec.backend,
            world_size=across.world_size if across else spec.world_size,
            devices=tuple(devices[: spec.world_size]),
            peers=tuple(devices[spec.world_size :]),
            rank_offset=across.rank_offset if across else 0,
            store=StoreAddress(across.host, across.port, across.prefix) if across else None,
            single_process=spec.single_process,
            set_kind=spec.set_kind,
            links=spec.links,
            store_file=str(local_store(case_dir)),
            p2p_links=tuple(link for link, used in spec.predicted.items() if P2P in used.split("+")),
            net_links=tuple(link for link, used in spec.predicted.items() if NET in used.split("+")),
            refused=any(REFUSED in used.split("+") for used in spec.predicted.values()),
            visible=tuple(device_id(d) for d in spec.seen),
            params=dict(spec.params),
            rank_env=environments.per_rank,
            env_unset=environments.unset,
            init_timeout=self.deadlines.init_timeout,
            process_group_timeout=self.deadlines.process_group_timeout,
            rules=tuple(self.rules),
        )
        casefiles.write_case(case_dir, case)

    def not_started(self, spec: CaseSpec, decision: Decision) -> CaseResult:
        """A case whose ranks were never started (a node it needs is gone)."""
        case_dir = self._fresh_case_dir(spec.nodeid)
        self._write_spec(spec, case_dir)
        return CaseResult(spec, decision, [], 0.0, case_dir, self.simulated, None, 0.0)

    def run(
        self, spec: CaseSpec, peers: Peers | None = None, confirm_at: str = "", on_wait: OnWait | None = None
    ) -> CaseResult:
        """Run one case; ``confirm_at``: where its class leader hung on this rung (stop sooner when stuck there)."""
        case_dir = self._fresh_case_dir(spec.nodeid)
        self._write_spec(spec, case_dir)
        device_ids = [d.uuid or d.name for d in spec.devices]
        begun = time.monotonic()
        try:
            self.server.ensure_started()  # once per process (the caller starts it first); not part of the case's time
            with leased(self.lease_dir, device_ids, self.deadlines.lease_wait) as waited:
                hold = GateHold(self.run_dir / "gate")
                try:
                    hold.enter(self.deadlines.turn_wait)
                    begun = time.monotonic()
                    confirm = Confirm(confirm_at, self.deadlines.confirm_wait) if confirm_at else None
                    turn = Turn(hold, case_dir, self.deadlines.turn_wait)
                    ranks, supervision = self._start_and_supervise(spec, case_dir, peers, confirm, on_wait, turn)
                finally:
                    hold.close()
        except LeaseTimeout as exc:  # decide for itself: the case could not be judged
            decision = Decision(Verdict.INCONCLUSIVE, None, [], f"not run: {exc} for {self.deadlines.lease_wait:g}s")
            result = CaseResult(spec, decision, [], 0.0, case_dir, self.simulated, None, 0.0)
            result.lease_wait = self.deadlines.lease_wait
            return result
        except ForkServerError as exc:  # the suite lost the ranks' parent: not a verdict on the machine
            decision = Decision(Verdict.INCONCLUSIVE, None, [], f"not judged: {exc}")
            seconds = round(time.monotonic() - begun, 3)
            return CaseResult(spec, decision, [], seconds, case_dir, self.simulated, None, 0.0)
        reports = [rank_report(r, spec.devices[r.rank].name, supervision.started) for r in ranks]
        return CaseResult(
            spec=spec,
            decision=decide(reports),
            reports=reports,
            seconds=round(time.monotonic() - begun, 3),
            case_dir=case_dir,
            simulated=self.simulated,
            stop_reason=supervision.stop_reason,
            stop_seconds=round(supervision.stop_seconds, 3),
            stop_steps=tuple(supervision.stop_steps),
            nccl=read_nccl_logs(spec, case_dir),
            lease_wait=round(waited, 3),
        )

    def _start_and_supervise(
        self,
        spec: CaseSpec,
        case_dir: Path,
        peers: Peers | None,
        confirm: Confirm | None = None,
        on_wait: OnWait | None = None,
        turn: Turn | None = None,
    ) -> tuple[list[RankProcess], Supervision]:
        processes = CaseProcesses(self.server, case_dir, spec.world_size)
        self.live[processes.pgid] = processes
        try:
            deadlines = self.deadlines
            grace = deadlines.grace if spec.grace is None else min(spec.grace, deadlines.grace)
            limits = Limits(step=deadlines.step_deadline, case=deadlines.case_timeout, grace=grace)
            # Across nodes a first send/recv may set up connections for seconds: the step deadline decides there,
            # as it does where it comes as soon.
            shorter = deadlines.small_step_wait < deadlines.step_deadline
            small = SmallStep(deadlines.small_step_wait) if peers is None and shorter else None
            supervision = supervise(processes, limits, deadlines.stop_ladder, peers, confirm, on_wait, turn, small)
        except BaseException:  # interrupted (Ctrl-C, the outer timeout): the case's ranks go with it
            processes.kill("the case was interrupted")
            raise
        finally:
            if processes.ended:
                self.live.pop(processes.pgid, None)
            casefiles.local_store_path(case_dir).unlink(missing_ok=True)
        return processes.ranks, supervision

    def sweep(self) -> list[int]:
        """SIGKILL every case group that may still have a rank; return the groups signalled."""
        signalled = [pgid for pgid, processes in list(self.live.items()) if processes.kill("end-of-session sweep")]
        self.live.clear()
        return signalled

    def close(self) -> None:
        self.sweep()
        self.server.close()


def headline(result: CaseResult) -> str:
    """A failed case on one line, for a CI annotation: ``HANG gpu0-gpu4 (SYS) in send/recv 4B: <summary>``.

    The verdict in capitals, the device set (its nodes, across nodes) and link class, where it
    stopped (a hang: where every stopped rank stood; else the root cause's place), whether the fault
    was simulated, then the verdict's summary.
    """
    decision, spec = result.decision, result.spec
    words = [f"{decision.verdict}".upper()]
    words.append("-".join(f"node{n}" for n in spec.nodes) if spec.nodes else "-".join(d.name for d in spec.devices))
    links = spec.link or ",".join(sorted(set(spec.links)))
    if links:
        words.append(f"({links})")
    place = _stopped_at(decision)
    if place:
        words.append(f"in {place}")
    if result.simulated:
        words.append("[simulated]")
    return shown(" ".join(words) + ": " + " ".join(decision.summary.split()))


def _stopped_at(decision: Decision) -> str:
    """Where the case stopped, as a step when the probe was in one (``send/recv 4B``); "" when not one place."""
    if decision.verdict == Verdict.HANG:
        ranks = [r for r in (decision.root, *decision.victims) if r is not None and r.status == RankStatus.STOPPED]
    else:
        ranks = [decision.root] if decision.root is not None else []
    places = {r.step if r.phase == "probe" and r.step else r.where for r in ranks}
    return places.pop() if len(places) == 1 else ""


def failure_text(result: CaseResult, full: bool = True) -> str:
    """Verdict word first, then the root cause, the phase, victims and where the logs are.

    ``full``: the ranks' stacks and tracebacks too (``-v``, ``--tb=long``); they are in the logs either way.
    """
    decision = result.decision
    lines = [f"{decision.verdict}: {decision.summary}"]
    if result.simulated:
        lines[0] = "[simulated] " + lines[0]
    root = decision.root
    if root is not None:
        lines.append(f"root cause: rank {root.rank} on {root.device}, phase {root.where}, exit {root.exit}")
    if decision.victims:
        victims = ", ".join(f"rank {v.rank} ({v.status} in {v.where})" for v in decision.victims)
        lines.append(f"victims: {victims}")
    if result.stop_reason:
        why = {
            StopReason.CONFIRM: ", stuck where the first pair of its link class hung",
            StopReason.SMALL_STEP: ", every rank stuck in the same small step",
            StopReason.STALLED: ": no rank reported progress for the step deadline",
            StopReason.DEADLINE: ": the whole-case limit",
        }.get(result.stop_reason, "")
        lines.append(
            f"stopped by the watchdog ({result.stop_reason}{why}); last rank reaped {result.stop_seconds:.2f}s later"
        )
    for r in result.unkillable:
        lines.append(f"rank {r.rank} (pid {r.pid}) would not die after SIGKILL: host may need to be recycled")
    stacked = [root] if root is not None and root.stack else [r for r in result.reports if r.stack]
    for r in stacked if full else ():
        lines.append(f"stack of rank {r.rank} at the deadline:\n{stack_excerpt(r.stack)}")
    for r in result.reports:
        if r.collectives is not None and (r.failed or r.stopped_by):
            lines.append(f"rank {r.rank}: {flight_recorder.describe(r.collectives)}")
    if full and root is not None and root.traceback and not root.stack:
        lines.append(f"traceback of rank {root.rank}:\n{traceback_excerpt(root.traceback)}")
    lines.append(f"rank logs: {result.case_dir}")
    return shown_lines("\n".join(lines))  # rank messages, causes and stacks quote what the ranks wrote
