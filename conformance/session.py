"""The state of one pytest run of the suite, registered as a plugin object by ``plugin.py``."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from conformance import junit
from conformance.common import casefiles
from conformance.common.deadlines import DeadlineError
from conformance.common.families import inherited_variables
from conformance.common.jsonl import read_lines
from conformance.common.suite import record_nodeid
from conformance.common.verdicts import Verdict
from conformance.discover.link_rate import simulated_gbps, slowest_link_gbps
from conformance.discover.topology import Topology, choose_backend, link_matrix_lines, link_note_lines, watch_run
from conformance.discover.versions import (
    NcclVersions,
    loaded_nccl_version,
    nccl_wheel_version,
    package_version,
    suite_version,
)
from conformance.discover.watch import CaseSpan, RunWatch, Watch, attribute_xids, busy_windows
from conformance.failed_tests import FailedTests
from conformance.launch.case import CaseResult, CaseRunner, CaseSpec, CrossNode
from conformance.launch.forkserver import ForkServerClient
from conformance.nodes.group import GroupLimits, NodeGroup, NodeGroupError, NodeProblem, StartCheck
from conformance.nodes.layout import NodeSetup, local_fingerprint
from conformance.plan.ladder import LADDER_FILE, SKIPPED, LadderBook, RungDecision, Step
from conformance.plan.matrix import (
    NODE_SET_FIXTURES,
    DeviceSet,
    NodePairing,
    Rung,
    RungError,
    as_node_pair,
    build_ladder,
    node_rungs,
    recheck_partners,
)
from conformance.plan.parametrize import NO_NCCL, Plan, device_set_of
from conformance.plan.transport import SHM, NcclHost, pair_paths
from conformance.progress import CaseProgress
from conformance.rank.scenario import Scenario
from conformance.record import results
from conformance.record.coverage import Coverage
from conformance.record.records import (
    HOST_SET_KIND,
    LINK_GBPS,
    SIMULATED_GBPS,
    CaseRecord,
    JunitRun,
    RunEnd,
    RunFacts,
    RungFacts,
)
from conformance.record.runs import RUN_FACTS, Run
from conformance.settings import Settings, deadlines
from conformance.shared_group import Part, declared, part_of, shared_spec
from conformance.side_by_side import CaseCall, CasesAhead, PartOf, Pending, case_call
from conformance.summarise.answer import FAILED_ELSEWHERE, Tone
from conformance.summarise.collectives import collective_lines
from conformance.summarise.conclude import Conclusion, conclude
from conformance.summarise.summary import ladder_summary_lines, one_record_per_case, summary_lines
from conformance.verdict.decision import Decision, decide_across_nodes, stuck_place
from conformance.verdict.machine_faults import unchangeable

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

# pytest options under which a session runs no test (their dests): no forkserver, no run folder.
NO_CASES_OPTIONS = ("collectonly", "showfixtures", "show_fixtures_per_test")
# One folder for every user of the machine: /tmp, not TMPDIR, which users may set differently.
MACHINE_LEASE_DIR = Path("/tmp") / "conformance-leases"
# Message sizes per case; on GPU they straddle NCCL's protocol switch points (LL, LL128, Simple).
COLLECTIVE_SIZES = {"cpu": [4, 64 << 10, 1 << 20], "gpu": [4, 256 << 10, 1 << 20, 64 << 20]}
# How bandwidth is timed: the send/recv message, then warm-up and timed iterations (probes.py);
# on CPU, collectives larger than chunk_bytes move in parts, each reported as progress.
# On GPU 512 MiB: bandwidth-bound on the fastest link (H100's 18 NVLinks, 450 GB/s a direction:
# 1.2 ms a message, so a launch's ~10 us is under 1% of the figure; nccl-tests judges all-reduce at
# 1 GiB, whose bus bandwidth needs more bytes per rank than a two-rank copy), and its two buffers
# (1 GiB a GPU) fit beside any training job's leftovers on a 16 GiB data-centre GPU.
MEASUREMENT = {
    "cpu": {"bandwidth_bytes": 4 << 20, "bandwidth_warmup": 1, "bandwidth_iterations": 5, "chunk_bytes": 4 << 20},
    "gpu": {"bandwidth_bytes": 512 << 20, "bandwidth_warmup": 5, "bandwidth_iterations": 20},
}


def uses_xdist(config: pytest.Config) -> bool:
    """The run is spread over xdist workers (this process is their controller, or one of them)."""
    return bool(config.getoption("numprocesses", None)) or config.getoption("dist", "no") != "no"


DECISION_KEY = pytest.StashKey[RungDecision]()
# pytest's terminal writer drops the markup where pytest has no colour (no tty, --color=no, NO_COLOR).
TONE_MARKUP: dict[Tone, dict[str, bool]] = {
    "bad": {"red": True},
    "good": {"green": True},
    "warn": {"yellow": True},
    "plain": {},
}
NOT_NEEDED_KEY = "conformance_not_needed"  # an xdist worker's later rungs not run, for the controller


class ConformanceSession:
    """Plans the cases, runs them, records them and summarises the run."""

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings,
        topology: Topology,
        scenario: Scenario | None,
        run_id: str,
        user_rungs: Sequence[tuple[Rung, str]] = (),
        baseline: Run | None = None,
        node_setup: NodeSetup | None = None,
    ) -> None:
        """``node_setup``: a multi-node run's layout; the nodes are met when the session starts."""
        self.baseline = baseline
        self.node_setup = node_setup
        self.nodes: NodeGroup | None = None  # multi-node runs, once met
        self.start: StartCheck | None = None
        self.node_notes: list[str] = []
        self.failed_nodes: tuple[str, ...] = ()  # other nodes that failed: the run failed here too
        self.conclusion = Conclusion()
        self.config = config
        self.settings = settings
        self.topology = topology
        self.scenario = scenario
        self.user_rungs = tuple(user_rungs)
        self.backend = choose_backend(settings.backend, topology)
        self.deadlines = deadlines(settings, self.backend)
        self._runner: CaseRunner | None = None
        self._forkserver: ForkServerClient | None = None
        self._started: set[str] = set()  # ladder keys whose case has started in this process
        self.not_needed: list[str] = []  # a worker's later rungs not needed (never run as tests), for the controller
        self._partners: dict[str, dict[int, int | None]] = {}  # node-pair re-checks: suspect -> known-good node
        self.progress = CaseProgress(config)
        self.ahead = CasesAhead()
        self.coverage = Coverage()
        self.failed_tests = FailedTests(config.rootpath)
        self.end: RunEnd | None = None  # how far the run got, once it has ended
        self.gpu_watch: Watch | None = None  # the run's owner watches its GPUs from start to end
        self._plan_run(run_id, build_ladder(self.user_rungs))

    def _plan_run(self, run_id: str, ladder: Sequence[Rung]) -> None:
        """The run's id, folder, plan and ladder book (again once the nodes have agreed on them)."""
        self.run_id = run_id
        folder = run_id if not self.node_rank else f"{run_id}-node{self.node_rank}"  # shared file systems
        self.run_dir = self.settings.reports_dir / folder
        self.results_path = self.run_dir / results.RESULTS_FILE
        fallbacks_matter = self.backend == "nccl" or self.simulated
        nnodes = self.node_setup.nnodes if self.node_setup else 1
        pairing = NodePairing.of(nnodes, self.settings.node_pairs, seed=run_id)
        self.plan = Plan(self.topology, ladder, self.settings.matrix, fallbacks_matter, pairing)
        self.deadlines.check(rungs=len(self.plan.ladder))
        wait = self.deadlines.rung_wait
        # The library torch loads, asked only on NCCL runs (importing torch here costs a second or two).
        self.nccl = NcclVersions(loaded_nccl_version() if self.backend == "nccl" else None, nccl_wheel_version())
        self.nccl_host = NcclHost(self.topology.cpu, self.nccl.used, self.topology.cuda_driver)
        self.book = LadderBook(self.run_dir / LADDER_FILE, ladder, self.settings.matrix, wait, self.nccl_host)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Claim the run folder, meet the other nodes of a multi-node run, then start the forkserver.

        Before the header, so it names the run id claimed; before xdist starts its workers, who are given it.
        """
        if self._owns_run_folder:
            self._plan_run(results.claim_run_folder(self.settings.reports_dir, self.run_id), self.plan.ladder)
        self._meet_nodes()
        if not self._runs_nothing:
            self.ensure_run_dir()  # run.json says the run has started
        if not self.is_worker and not self._runs_nothing:
            self.gpu_watch = watch_run(self.topology, self.backend)
        self.launch_forkserver()

    @property
    def _runs_nothing(self) -> bool:
        return any(self.config.getoption(name, False) for name in NO_CASES_OPTIONS)

    @property
    def _owns_run_folder(self) -> bool:
        """A plain run or xdist's controller chooses the run id; node 0 for every node of a multi-node run."""
        first_node = self.node_setup is None or self.node_setup.node_rank == 0
        return not self.is_worker and first_node and not self._runs_nothing

    def launch_forkserver(self) -> None:
        """Start the forkserver now if this process will run cases; it imports torch while pytest collects.

        On the main thread: its parent-death signal follows the thread that starts it.
        """
        if self._runs_nothing or (uses_xdist(self.config) and not self.is_worker):
            return  # nothing runs here (xdist's controller leaves the cases to its workers)
        self.forkserver.launch()

    def _meet_nodes(self) -> None:
        """A multi-node run meets the other nodes before the header and collection (not at configure)."""
        setup = self.node_setup
        if setup is None:
            return
        try:
            limits = GroupLimits(progress=self.deadlines.node_progress_limit, store=self.deadlines.step_deadline)
            group = NodeGroup.connect(setup, self.settings.rendezvous_timeout, limits)
        except NodeGroupError as exc:
            raise pytest.UsageError(f"conformance: {exc}") from None
        start = group.start(local_fingerprint(setup.node_rank, self.topology), self.run_id)
        if start.fatal_text:
            group.close()
            raise pytest.UsageError(f"conformance: node {setup.node_rank}: {start.fatal_text}")
        self.nodes, self.start = group, start
        try:
            self._plan_run(start.run_id, build_ladder(self.user_rungs, node_rungs(start.interfaces)))
        except (RungError, DeadlineError) as exc:
            group.close()
            raise pytest.UsageError(f"conformance: {exc}") from None

    @property
    def simulated(self) -> bool:
        """Faults injected, or a GPU machine (a topology file) played by gloo ranks on CPU."""
        return self.scenario is not None or (self.topology.kind == "gpu" and self.backend == "gloo")

    @property
    def cpu_only(self) -> str | None:
        """Why no GPU was tested, on a run of CPU ranks that stands for itself (a simulated one says SIMULATED)."""
        if self.topology.kind != "cpu" or self.simulated:
            return None
        return self.topology.note or "virtual CPU devices"

    @property
    def node_rank(self) -> int | None:
        return self.nodes.me if self.nodes else None

    @property
    def setup(self) -> NodeSetup | None:
        return self.nodes.setup if self.nodes else None

    @property
    def sizes(self) -> list[int]:
        return COLLECTIVE_SIZES["gpu" if self.backend == "nccl" else "cpu"]

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    # -- run folder and records ------------------------------------------------------------
    def run_facts(self) -> RunFacts:
        return RunFacts(
            run_id=self.run_id,
            host=socket.gethostname(),
            backend=self.backend,
            topology=json.loads(self.topology.to_json()),
            torch=package_version("torch"),
            nccl=self.nccl.used,
            nccl_warning=self.nccl.warning,
            inherited_env=inherited_variables(),
            simulated=self.simulated,
            scenario=self.scenario.path if self.scenario else None,
            matrix=self.plan.mode,
            ladder=tuple(RungFacts(r.name, dict(r.set), r.unset_families) for r in self.plan.ladder),
            case_timeout=self.settings.case_timeout,
            step_deadline=self.deadlines.step_deadline,
            node_rank=self.node_rank,
            nnodes=self.setup.nnodes if self.setup else 1,
            cpu_only=self.cpu_only,
            slow_ratio=self.settings.slow_ratio,
            bandwidth_floors=dict(self.settings.bandwidth_floor),
            end=RunEnd(),
        )

    def ensure_run_dir(self) -> Path:
        """The run folder with its run.json (the run's facts, ``end`` still ``started``) and ``latest`` at it."""
        run_json = self.run_dir / RUN_FACTS
        if not run_json.exists():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.results_path.touch()  # a run folder holds both from its start, records or not
            casefiles.write_json_atomic(run_json, self.run_facts().to_json())
            if not self.node_rank:  # other nodes leave 'latest' to node 0 (a shared file system)
                results.point_latest(self.settings.reports_dir, self.run_id)
        return self.run_dir

    def results_file(self) -> Path:
        """results.jsonl, in a run folder that exists."""
        self.ensure_run_dir()
        return self.results_path

    def _write_end(self, session: pytest.Session) -> None:
        """run.json says how far the run got (``RunEnd``), before anything reads the run back."""
        run_json = self.run_dir / RUN_FACTS
        if self.is_worker or not run_json.exists():
            if self.gpu_watch is not None:
                self.gpu_watch.close()
            return
        records = self._own_records()
        end = self.coverage.end(session.exitstatus, session.shouldfail or session.shouldstop)
        self.end = replace(end, harness_errors=self.failed_tests.unexplained(records), failed_nodes=self.failed_nodes)
        watched = self._stop_watch(records)
        facts = replace(self.run_facts(), end=self.end, watch=watched.to_json() if watched else None)
        casefiles.write_json_atomic(run_json, facts.to_json())

    def _stop_watch(self, records: Sequence[CaseRecord]) -> RunWatch | None:
        """What the GPUs' watch saw, each Xid naming the case that ran on its GPU then."""
        if self.gpu_watch is None:
            return None
        spans = [
            CaseSpan(r.nodeid, r.probe, r.verdict, r.devices, r.time - r.seconds, r.time)
            for r in records
            if r.set_kind != HOST_SET_KIND and r.node_rank == self.node_rank and r.time and r.seconds is not None
        ]
        watched = self.gpu_watch.stop(busy_windows(spans))
        self.gpu_watch = None
        return attribute_xids(watched, spans)

    @property
    def shm_predicted(self) -> bool:
        """Whether NCCL would use its SHM transport between some of the run's GPUs (transport.py; unknown: yes)."""
        devices = self.topology.devices
        transports = self.nccl_host.transports(pair_paths(self.topology, devices), len(devices), os.environ)
        return transports is None or SHM in transports

    @property
    def lease_dir(self) -> Path | None:
        """GPUs are leased machine-wide; a simulated GPU machine within its run; CPU ranks not at all."""
        if self.topology.kind != "gpu":
            return None
        if self.backend == "nccl":
            return MACHINE_LEASE_DIR
        return self.run_dir / "leases"

    @property
    def runner(self) -> CaseRunner:
        if self._runner is None:
            self._runner = CaseRunner(
                self.ensure_run_dir(),
                self.deadlines,
                rules=[r.to_dict() for r in self.scenario.rules] if self.scenario else [],
                simulated=self.simulated,
                lease_dir=self.lease_dir,
                server=self.forkserver,
            )
            self._runner.server.ensure_started()  # here, on the main thread: cases run in threads of their own
        return self._runner

    @property
    def forkserver(self) -> ForkServerClient:
        """The forkserver client of this pytest process (launched at session start, waited for at the first case)."""
        if self._forkserver is None:
            self._forkserver = ForkServerClient(self.run_dir / "forkserver" / f"{os.getpid()}.log")
        return self._forkserver

    def _rung_decision(self, step: Step) -> RungDecision:
        return self.book.decide(step, os.environ, self.plan.selected)

    def case_spec(self, item: pytest.Item, probe: str, device_set: DeviceSet, params: dict[str, Any]) -> CaseSpec:
        rung = device_set.rung
        pair = device_set.devices if len(device_set.devices) == 2 else None
        single_process = bool(params.pop("single_process", False))
        grace = params.pop("grace", None)
        return CaseSpec(
            nodeid=record_nodeid(item.path, item.nodeid),
            probe=probe,
            devices=device_set.devices,
            backend=self.backend,
            link=device_set.link,
            env_name=rung.name,
            env_set=dict(rung.set),
            env_unset=rung.unset(os.environ),
            params={**MEASUREMENT["gpu" if self.backend == "nccl" else "cpu"], **params},
            set_kind=device_set.kind,
            links=device_set.links,
            predicted=self.nccl_host.summary(
                self.plan.paths(device_set), len(device_set.devices), rung.effective(os.environ)
            ),
            isolate=device_set.isolate,
            visible=self.topology.devices,
            p2p_status=self.topology.p2p_status(*pair) if pair else None,
            single_process=single_process,
            nodes=device_set.nodes,
            grace=None if grace is None else float(grace),
        )

    def run(
        self, item: pytest.Item, probe: str, device_set: DeviceSet, expect: str | None = None, **params: Any
    ) -> CaseResult:
        """Run one case for ``item`` (unless the ladder skips its rung) and record it when it ends."""
        step = self.plan.step(item, device_set)
        self.ensure_run_dir()
        placed = device_set
        if device_set.kind == "node_recheck":
            device_set = self._recheck_pair(step, device_set)
        if device_set.nodes and self.node_rank not in device_set.nodes:
            self._skip(step, f"node {self.node_rank} takes no part in {device_set.base_id}")
        gone = self.nodes.absent(device_set.nodes) if self.nodes and device_set.nodes else None
        if gone is not None and step.rung_index > 0:
            self._skip(step, f"no environment rung brings a node back: {gone.reason}")
        decision = item.stash.get(DECISION_KEY, None) or self._rung_decision(step)
        if not decision.run:
            self._skip(step, decision.reason)
        outcome, final_reason, stuck = Verdict.ERROR.value, "", ""
        try:
            if device_set.nodes:
                result = self._run_across_nodes(self.case_spec(item, probe, device_set, params), device_set)
            else:
                result = self._run_here(item, probe, device_set, expect, params, decision.confirm_at)
            result.node_rank = self.node_rank
            outcome, stuck = result.verdict, stuck_place(result.decision)
            if unchangeable(result.verdict, result.decision.summary):
                final_reason = result.decision.summary
        finally:
            self.book.record(step, outcome, final_reason, final=bool(final_reason), stuck=stuck)
        if self.nodes and placed.kind == "node_pair" and step.rung_index == 0 and self.plan.pairing.rechecks:
            self.nodes.publish_first_pass(step.key, result.verdict)
        no_nccl = item.get_closest_marker(NO_NCCL) is not None
        one_rung = no_nccl or self.plan.item_step(item) is None  # a device set of the test's own: not parametrised
        record = results.case_record(result, self.run_id, expect, step.key, one_rung, no_nccl)
        record = self._with_link_figures(record)
        results.append_case(self.results_path, record)
        item.stash[junit.CASE_SECONDS] = result.seconds
        if result.verdict not in (Verdict.PASS, Verdict.SKIP):
            self._attach_logs(item, result)
        return result

    def _with_link_figures(self, record: CaseRecord) -> CaseRecord:
        """A GPU set's slowest physical link; a simulated pair's bandwidth is its link's, not gloo's host copies."""
        if len(record.devices) < 2 or record.outcome is not Verdict.PASS:
            return record
        figures = {LINK_GBPS: slowest_link_gbps(self.topology, record.devices)}
        if self.simulated and record.set_kind == "pair" and record.bandwidth_gbps is not None:
            rules = self.scenario.rules if self.scenario else ()
            figures[SIMULATED_GBPS] = simulated_gbps(self.topology, record.devices, record.probe, rules)
        known = {name: figure for name, figure in figures.items() if figure is not None}
        return replace(record, metrics={**record.metrics, **known}) if known else record

    def _run_here(
        self,
        item: pytest.Item,
        probe: str,
        device_set: DeviceSet,
        expect: str | None,
        params: dict[str, Any],
        confirm_at: str,
    ) -> CaseResult:
        """The item's case (already running if it was started ahead), and later items' cases beside it."""
        call = case_call(probe, expect, params)
        pending = self.ahead.take(item.nodeid, call)
        if pending is None:
            pending = self._start(item, probe, device_set, params, confirm_at, call)
        if expect is None:  # negative controls run alone
            for later, later_set in self.ahead.candidates(item, pending.devices, self._runs_at_once):
                later_confirm = self._rung_decision(self.plan.step(later, later_set)).confirm_at
                self.ahead.pending[later.nodeid] = self._start(later, probe, later_set, params, later_confirm, call)
        try:
            result = pending.wait(self.progress.watch(item.nodeid))
            if result is None:  # the shared case stopped before this item's collective: it runs alone
                alone = self._start(item, probe, device_set, params, confirm_at, call, share=False)
                result = alone.wait(self.progress.watch(item.nodeid))
            assert result is not None
            return result
        except BaseException:  # interrupted: no case of this process outlives the wait
            self.runner.sweep()
            raise
        finally:
            self.progress.done()

    def _start(
        self,
        item: pytest.Item,
        probe: str,
        device_set: DeviceSet,
        params: dict[str, Any],
        confirm_at: str,
        call: CaseCall,
        share: bool = True,
    ) -> Pending | PartOf:
        """Start the item's case; with ``share``, later declared collectives on its devices join it."""
        spec = self.case_spec(item, probe, device_set, dict(params))
        step = self.plan.step(item, device_set)
        self._started.add(step.key)
        together = self._together(item, device_set, call) if share else []
        for claimed in [step, *(self.plan.step(later, device_set) for later, _, _ in together)]:
            self.book.claim(claimed)
        parts = [Part(spec), *(Part(self.case_spec(it, p, device_set, dict(pp))) for it, p, pp in together)]
        runner = self.runner
        pending = Pending(item.nodeid, call, frozenset(d.name for d in device_set.devices))
        case = shared_spec(parts) if together else spec
        pending.run(lambda on_wait: runner.run(case, confirm_at=confirm_at, on_wait=on_wait))
        if not together:
            return pending
        for (later, later_probe, later_params), later_part in zip(together, parts[1:], strict=True):
            later_call = case_call(later_probe, None, later_params)
            self.ahead.pending[later.nodeid] = PartOf(
                later.nodeid, later_call, pending, partial(part_of, later_part, parts)
            )
        return PartOf(item.nodeid, call, pending, partial(part_of, parts[0], parts))

    def collective(self, item: pytest.Item) -> tuple[str, dict[str, Any]] | None:
        """The collective and parameters the item declares (``shared.MARKER``), at the run's sizes."""
        found = declared(item)
        return None if found is None else (found[0], {"sizes": self.sizes, **found[1]})

    def _together(
        self, item: pytest.Item, device_set: DeviceSet, call: CaseCall
    ) -> list[tuple[pytest.Item, str, dict[str, Any]]]:
        """Later items whose declared collectives can run in this item's case (``conformance.shared_group``)."""
        mine = self.collective(item)
        if mine is None or case_call(mine[0], None, mine[1]) != call or not self._runs_at_once(item, device_set):
            return []
        probes, together = {call[0]}, []
        for later in self.ahead.upcoming(item):
            theirs = self.collective(later)
            if theirs is None or theirs[0] in probes or later.nodeid in self.ahead.pending:
                continue
            if device_set_of(later) != device_set or any(later.iter_markers("skip")):
                continue
            if self._runs_at_once(later, device_set):
                probes.add(theirs[0])
                together.append((later, *theirs))
        return together

    def _runs_at_once(self, item: pytest.Item, device_set: DeviceSet) -> bool:
        """An item whose rung is decided, to run, without waiting for another case (first rungs always are).

        A class follower on its first rung also waits until its class leader has started here (or is
        done): if the class hangs, it then hangs beside its leader, not in the way of it.
        """
        step = self.plan.step(item, device_set)
        leader = step.leader_key
        if leader and step.rung_index == 0 and leader not in self._started and not self.book.known(leader, 0):
            return False
        return self.book.ready(step, self.plan.selected) and self._rung_decision(step).run

    def _skip(self, step: Step, reason: str) -> NoReturn:
        self.book.record(step, SKIPPED, reason)
        pytest.skip(reason)

    def _recheck_pair(self, step: Step, placeholder: DeviceSet) -> DeviceSet:
        """The node pair a re-check runs: its node with a node known good; skipped, saying why, where none is due."""
        node = placeholder.nodes[0]
        partners = self._recheck_partners(step, placeholder)
        if node not in partners:
            self._skip(step, f"node {node} passed in the first pass: nothing to re-check")
        partner = partners[node]
        if partner is None:
            self._skip(step, f"node {node}: no pair of the first pass passed: no node known good to re-check with")
        return as_node_pair(placeholder, (node, partner))

    def _recheck_partners(self, step: Step, placeholder: DeviceSet) -> dict[int, int | None]:
        """The first pass of this test, as every node saw it (waited for), and who re-checks whom."""
        test = step.key.replace(placeholder.base_id, "recheck")
        if test not in self._partners:
            if self.nodes is None:
                raise RuntimeError(f"{step.key}: a re-check of node pairs in a one-node run")
            passed = {}
            for pair in self.plan.pairing.first_pass():
                key = step.key.replace(placeholder.base_id, as_node_pair(placeholder, pair).base_id)
                if self.plan.selected is None or (key, 0) in self.plan.selected:
                    passed[pair] = self.nodes.first_pass_passed(key, pair, self.deadlines.node_progress_limit)
            self._partners[test] = recheck_partners(passed, self.plan.pairing.nnodes)
        return self._partners[test]

    def _run_across_nodes(self, spec: CaseSpec, device_set: DeviceSet) -> CaseResult:
        """Meet the other nodes at this case, run this node's ranks, then agree on one verdict."""
        group = self.nodes
        if group is None:
            raise RuntimeError(f"{spec.nodeid}: a cross-node case in a one-node run")
        nodes = device_set.nodes
        prefix = group.case_prefix(spec.nodeid)
        problem = group.absent(nodes) or group.meet(prefix, "arrived", nodes, "1", self.deadlines.node_progress_limit)
        if problem is not None:
            return self._node_missing(spec, problem)
        setup = group.setup
        per_node = len(spec.devices)
        spec = replace(
            spec,
            cross_node=CrossNode(
                host=setup.master_addr or "",
                port=setup.master_port or 0,
                prefix=setup.store_key(f"{prefix}/ranks"),  # the ranks connect to the store itself
                rank_offset=nodes.index(group.me) * per_node,
                world_size=len(nodes) * per_node,
                node_rank=group.me,
            ),
        )
        result = self.runner.run(spec, group.peers(prefix, nodes))
        mine = json.dumps({"verdict": result.verdict, "summary": result.decision.summary})
        problem = group.meet(prefix, "verdict", nodes, mine, self.deadlines.verdict_wait)
        verdicts = {n: json.loads(text) for n, text in group.read(prefix, "verdict", nodes).items()}
        missing = (problem.node, problem.reason) if problem else None
        result.decision, result.root_node = decide_across_nodes(group.me, result.decision, verdicts, missing)
        result.node_verdicts = {n: v["verdict"] for n, v in verdicts.items()}
        return result

    def _node_missing(self, spec: CaseSpec, problem: NodeProblem) -> CaseResult:
        decision = Decision(Verdict.HANG, None, [], f"hang in rendezvous: {problem.reason}")
        result = self.runner.not_started(spec, decision)
        result.root_node = problem.node
        return result

    def _attach_logs(self, item: pytest.Item, result: CaseResult) -> None:
        for report in result.reports:
            path = casefiles.rank_dir(result.case_dir, report.rank)
            for name in (casefiles.STDERR, casefiles.STDOUT):
                text = casefiles.tail(path / name)
                if text.strip():
                    item.add_report_section("call", f"rank {report.rank} {name}", text)

    # -- hooks ------------------------------------------------------------------------------
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        t = self.topology
        models = sorted({d.model for d in t.devices if d.model})
        devices = ", ".join(d.name for d in t.devices) + (f" ({', '.join(models)})" if models else "")
        lines = [
            f"conformance: run {self.run_id}, backend {self.backend}, {len(t.devices)} devices: {devices}",
            f"conformance: torch {package_version('torch') or 'not installed'}, "
            f"NCCL {self.nccl.used or 'n/a'}, reports in {self.run_dir}",
        ]
        if self.nccl.warning:
            lines.append(f"conformance: WARNING {self.nccl.warning}")
        if t.note:
            lines.append(f"conformance: {t.note}")
        if t.driver or t.cuda_driver:
            lines.append(f"conformance: driver {t.driver or '?'}, CUDA driver {t.cuda_driver or '?'}")
        lines += self._inventory_header_lines()
        lines.extend(f"conformance:   {line}" for line in link_matrix_lines(t))
        lines.extend(f"conformance: {line}" for line in link_note_lines(t))
        lines.append(f"conformance: matrix {self.plan.mode}, rungs: {', '.join(r.name for r in self.plan.rungs)}")
        inherited = inherited_variables()
        if inherited:
            lines.append("conformance: inherited " + " ".join(f"{k}={v}" for k, v in inherited.items()))
        if self.scenario:
            lines.append(f"conformance: SIMULATED run, scenario {self.scenario.name!r} ({self.scenario.path})")
        return lines + self._node_header_lines()

    def _inventory_header_lines(self) -> list[str]:
        """The machine's GPUs counted on the PCI bus and by NVML, beside those this run tests."""
        inventory, expected = self.topology.inventory, self.settings.expect_gpus
        if not (inventory.nvidia_present or inventory.nvml_gpus or expected):
            return []
        tested = sum(d.kind == "gpu" for d in self.topology.devices)
        wanted = f", {expected} expected" if expected else ""
        return [f"conformance: GPUs: {inventory.counts_text()}, {tested} tested{wanted}"]

    def _node_header_lines(self) -> list[str]:
        if self.nodes is None or self.start is None:
            return []
        setup = self.nodes.setup
        lines = [
            f"conformance: node {setup.node_rank} of {setup.nnodes} (layout from {setup.source}), "
            f"run store on {setup.master_addr}:{setup.master_port}; shared interfaces: "
            f"{', '.join(self.start.interfaces) or 'none'}"
        ]
        identity = setup.identity or "none (by hand: --run-token gives one)"
        pairing = self.plan.pairing
        first = "every pair in rounds" if pairing.mode == "all" else "one random round, then re-checks"
        lines.append(f"conformance: run identity {identity}; node pairs {pairing.mode} ({first})")
        lines += [f"conformance: {reason}" for reason in self.start.missing.values()]
        if self.start.check is not None and self.start.check.differing:
            differing = ", ".join(self.start.check.differing)
            lines.append(f"conformance: the nodes differ where they may ({differing}):")
            lines += [f"conformance:   {row}" for row in self.start.check.table]
        return lines

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """A later rung its ladder does not need is not a test that could not run: it never runs as one.

        No setup, no report, no JUnit test case; pytest counts it ``deselected`` (most items of a
        healthy adaptive run are such rungs).  The decision is the one ``run`` would take, kept for it.
        One that must wait for other cases waits here, within the same bound ``run`` would give it,
        so a plain run and one over xdist workers (where a class leader may be another worker's)
        report the same tests.  What it waits for always comes earlier: the item's own earlier
        rungs, and its class leader's (first in every rung of a plain run; an earlier scope of
        xdist's, ``Plan.worker_scope``).
        """
        step = self._later_local_rung(item)
        # Not an item whose case already started side by side: its run takes that case (and its turn).
        if step is None or item.nodeid in self.ahead.pending:
            return None
        decision = item.stash[DECISION_KEY] = self._rung_decision(step)
        if decision.run:
            return None
        self.ensure_run_dir()
        self.book.record(step, SKIPPED, decision.reason)
        self.not_needed.append(item.nodeid)
        # What the item before kept up for this one (its module, a fixture) goes now if the next needs it not,
        # as pytest's own teardown of an item does (pytest_runtest_teardown needs a setup to have run).
        item.session._setupstate.teardown_exact(nextitem)
        item.ihook.pytest_deselected(items=[item])
        item.session.testscollected -= 1  # as pytest counts deselection at collection: progress ends at 100%
        self.coverage.reported(item.nodeid)
        return True

    def _later_local_rung(self, item: pytest.Item) -> Step | None:
        """The ladder step of a case on one node on a rung after the first; None for anything else."""
        fixtures = getattr(item, "fixturenames", ())
        if "conformance_case" not in fixtures or any(name in fixtures for name in NODE_SET_FIXTURES):
            return None
        step = self.plan.item_step(item)
        return step if step is not None and step.rung_index > 0 else None

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.nodes is not None:
            self.nodes.now_at(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A test's last report: its teardown, or the one xdist makes up for a test its worker died in.
        # An interrupted test gets a setup report only, and did not run.
        if report.when not in ("setup", "call"):
            self.coverage.reported(report.nodeid)
        self.failed_tests.note(report)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Counted for the run's end; every node must run the same tests in the same order.

        Cross-node cases meet by position.
        """
        self.coverage.collected(len(session.items))
        if self.nodes is None:
            return
        differences = self.nodes.same_collection([item.nodeid for item in session.items])
        if differences:
            raise pytest.UsageError("conformance: the nodes collected different tests:\n" + "\n".join(differences))

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        self.plan.parametrize(metafunc)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Rung-by-rung order; pytest-timeout as the outer net, above the case watchdog."""
        self.plan.order(items)
        if not self.config.pluginmanager.hasplugin("timeout"):
            return
        for item in items:
            fixtures = getattr(item, "fixturenames", ())
            if "conformance_case" in fixtures and not item.get_closest_marker("timeout"):
                step = self.plan.item_step(item)
                crosses = any(name in fixtures for name in NODE_SET_FIXTURES)
                net = self.deadlines.outer_net(step.rung_index if step else 0, crosses)
                item.add_marker(pytest.mark.timeout(net, method="thread"))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._runner is not None:
            self._runner.close()
        elif self._forkserver is not None:  # launched, but no case ran
            self._forkserver.close()
        if self.nodes is not None:
            self._exchange_records(session)
            self.nodes.close()
        if self.is_worker:
            self.config.workeroutput[NOT_NEEDED_KEY] = self.not_needed  # type: ignore[attr-defined]
        self._write_end(session)
        if self.is_worker or not self.results_path.exists():
            return
        self.conclusion = conclude(self.run_dir, self.settings, self.baseline)
        if self.conclusion.regressed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def junit_summary(self) -> junit.JunitSummary:
        """The run and its answer, for the testsuite of the JUnit file (``conformance.junit``)."""
        answer = self.conclusion.answer
        return junit.JunitSummary(
            run=JunitRun(self.run_id, str(self.results_path.resolve()), suite_version() or "unknown"),
            node_rank=self.node_rank,
            answer=tuple(answer.lines()) if answer else (),
            exports=answer.exports if answer else (),
            cpu_only=self.cpu_only,
            findings=answer.findings() if answer else (),
        )

    def _own_records(self) -> list[CaseRecord]:
        """The records of this run in its results file (none yet: an empty list)."""
        read = [CaseRecord.from_json(r) for r in read_lines(self.results_path).objects]
        return [r for r in read if r.run_id == self.run_id]

    def _exchange_records(self, session: pytest.Session) -> None:
        """Node 0 gathers every node's records and exit status; every node learns which nodes failed.

        A failed node fails the run on every node: a node whose own tests passed while another's
        failed (or was lost) ends with a failed exit status too, and says which.
        """
        group = self.nodes
        if group is None:
            return
        group.now_at("the end of its run")
        status = int(session.exitstatus)
        if group.me != 0:  # records go over the wire as JSON text, one per line
            records = [CaseRecord.from_json(r) for r in read_lines(self.results_path).objects]
            mine = [json.dumps(r.to_json(), sort_keys=True) for r in records]
            self.node_notes.append(f"node {group.me}: {group.publish_results(mine, status)}")
            failed = group.run_outcome()
        else:
            failed = self._gather(group, status)
        for forged in group.forged:
            self.node_notes.append(f"node {group.me}: dropped {forged}")
        self.failed_nodes = tuple(line for line in failed if not line.startswith(f"node {group.me}: "))
        if self.failed_nodes:
            self.node_notes.append(f"{FAILED_ELSEWHERE} {'; '.join(self.failed_nodes)}: so it fails here too")
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _gather(self, group: NodeGroup, status: int) -> list[str]:
        """Node 0: every node's records into results.jsonl; the nodes that failed, told to every node."""

        def waiting(node: int) -> None:
            self.node_notes.append(f"node 0 waited for node {node}'s records (it was at {group.where(node)})")

        gathered = group.gather_results(waiting)
        self.ensure_run_dir()
        for node, lines in sorted(gathered.records.items()):
            for line in lines:
                results.append_case(self.results_path, CaseRecord.from_json(json.loads(line)))
            self.node_notes.append(f"node {node}: {len(lines)} records gathered into {self.results_path}")
        for node, reason in sorted(gathered.gone.items()):
            self.node_notes.append(f"node {node}: records missing: {reason}")
        for stranger in group.strangers():
            self.node_notes.append(f"turned away a node of another run ({stranger}); none of its records entered")
        statuses = {0: status, **gathered.statuses}
        failed = [f"node {n}: exit {code}" for n, code in sorted(statuses.items()) if code != pytest.ExitCode.OK]
        failed += [f"node {n}: {reason}" for n, reason in sorted(gathered.gone.items())]
        group.publish_outcome(failed, readers=gathered.statuses)
        return failed

    def pytest_terminal_summary(self, terminalreporter: TerminalReporter) -> None:
        if self.is_worker:
            return
        write = terminalreporter
        simulated = " (SIMULATED)" if self.simulated else ""
        self._write_answer(write, simulated)
        if self.end is not None and self.end.incomplete:
            write.write_line(
                f"conformance: INCOMPLETE RUN ({self.end.incomplete}): what follows covers only what ran",
                yellow=True,
                bold=True,
            )
        records = one_record_per_case(self._own_records())
        if records or self.node_notes:
            write.write_sep("=", f"conformance summary{simulated}")
        for line in self.node_notes:
            write.write_line(f"conformance: {line}")
        if records:
            for text, bad in summary_lines(records):
                write.write_line(text, red=bad)
            for line in ladder_summary_lines(records, self.plan.ladder, self.deadlines.step_deadline):
                write.write_line(line)
            for line in collective_lines(records):
                write.write_line(line)
        for line in self.conclusion.lines:
            write.write_line(line)

    def _write_answer(self, write: TerminalReporter, simulated: str) -> None:
        """The answer, first: red where something failed, green where all passed."""
        answer = self.conclusion.answer
        if answer is None:
            return
        write.write_sep("=", f"conformance: the answer{simulated}", **TONE_MARKUP[answer.tone], bold=True)
        for text, tone in answer.rows():
            write.write_line(text, **TONE_MARKUP[tone], bold=tone != "plain")
