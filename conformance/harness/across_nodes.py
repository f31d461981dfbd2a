"""A multi-node run: the nodes met at its start, cases across nodes, re-checks, and records gathered at its end."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from conformance.common.verdicts import Verdict
from conformance.discover.nccl_plugins import nccl_plugins
from conformance.harness.context import RunContext
from conformance.harness.planned import PlannedCase, Planner
from conformance.harness.runner import Runner
from conformance.harness.strategy import CaseRequest, case_spec
from conformance.launch.case import CaseResult, CaseSpec, CrossNode
from conformance.nodes.group import NodeGroup, NodeGroupError
from conformance.nodes.layout import local_fingerprint
from conformance.nodes.liveness import GroupLimits, NodeProblem
from conformance.plan.matrix import DeviceSet, RungError, as_node_pair, build_ladder, node_rungs, recheck_partners
from conformance.record.runs import record_from_text
from conformance.summarise.answer import FAILED_ELSEWHERE
from conformance.verdict.decision import Decision, NodeVerdict, decide_across_nodes


def meet_nodes(run: RunContext) -> None:
    """A multi-node run meets the other nodes before the header and collection (not at configure)."""
    setup = run.node_setup
    if setup is None:
        return
    try:
        limits = GroupLimits(progress=run.deadlines.node_progress_limit, store=run.deadlines.step_deadline)
        group = NodeGroup.connect(setup, run.settings.rendezvous_timeout, limits)
    except NodeGroupError as exc:
        raise pytest.UsageError(f"conformance: {exc}") from None
    plugins = nccl_plugins(run.nccl_environ) if run.backend == "nccl" and not run.simulated else {}
    start = group.start(local_fingerprint(setup.node_rank, run.topology, run.nccl.used, plugins), run.run_id)
    if start.fatal_text:
        group.close()
        raise pytest.UsageError(f"conformance: node {setup.node_rank}: {start.fatal_text}")
    run.nodes, run.start = group, start
    try:
        run.replan(start.run_id, build_ladder(run.user_rungs, node_rungs(start.interfaces)))
    except RungError as exc:
        group.close()
        raise pytest.UsageError(f"conformance: {exc}") from None


def same_collection(run: RunContext, nodeids: list[str]) -> None:
    """Every node must run the same tests in the same order: cross-node cases meet by position."""
    differences = run.nodes.same_collection(nodeids) if run.nodes else []
    if differences:
        raise pytest.UsageError("conformance: the nodes collected different tests:\n" + "\n".join(differences))


class AcrossNodes:
    """Runs a case whose ranks span nodes: meet the others at it, run this node's ranks, agree on one verdict."""

    def __init__(self, run: RunContext, planner: Planner, runner: Callable[[], Runner]) -> None:
        self.run_context = run
        self.planner = planner
        self.runner = runner
        self._partners: dict[str, dict[int, int | None]] = {}  # node-pair re-checks: suspect -> known-good node

    @property
    def group(self) -> NodeGroup:
        if self.run_context.nodes is None:
            raise RuntimeError("a cross-node case in a one-node run")
        return self.run_context.nodes

    def place(self, request: CaseRequest, planned: PlannedCase) -> CaseRequest:
        device_set = request.device_set
        if device_set.kind == "node_recheck":
            device_set = self._recheck_pair(planned, device_set)
        me = self.run_context.node_rank
        if me not in device_set.nodes:
            self.planner.skip(planned, f"node {me} takes no part in {device_set.base_id}")
        gone = self.group.absent(device_set.nodes)
        if gone is not None and planned.step.rung_index > 0:
            self.planner.skip(planned, f"no environment rung brings a node back: {gone.reason}")
        return replace(request, device_set=device_set)

    def ran(self, planned: PlannedCase, result: CaseResult) -> None:
        """A node pair's first pass, for the re-checks every node plans from it."""
        placed = planned.device_set
        if placed.kind == "node_pair" and planned.step.rung_index == 0 and self.run_context.plan.pairing.rechecks:
            self.group.publish_first_pass(planned.step.key, result.verdict)

    def run(self, request: CaseRequest, planned: PlannedCase) -> CaseResult:
        spec = case_spec(self.run_context, request.item, request.probe, request.device_set, request.params)
        group, nodes = self.group, request.device_set.nodes
        deadlines = self.run_context.deadlines
        prefix = group.case_prefix(spec.nodeid)
        problem = group.absent(nodes) or group.meet(prefix, "arrived", nodes, "1", deadlines.node_progress_limit)
        if problem is not None:
            return self._node_missing(spec, problem)
        result = self.runner().run(self._across(spec, prefix, nodes), group.peers(prefix, nodes))
        mine = NodeVerdict.of(result.decision)
        problem = group.meet(prefix, "verdict", nodes, mine.to_text(), deadlines.verdict_wait)
        verdicts = {n: NodeVerdict.from_text(text) for n, text in group.read(prefix, "verdict", nodes).items()}
        missing = (problem.node, problem.reason) if problem else None
        result.decision, result.root_node = decide_across_nodes(group.me, result.decision, verdicts, missing)
        result.node_verdicts = {n: v.verdict for n, v in verdicts.items()}
        return result

    def _across(self, spec: CaseSpec, prefix: str, nodes: tuple[int, ...]) -> CaseSpec:
        """The ranks of the case on this node: their place among every node's, and the store they meet at."""
        group, setup, per_node = self.group, self.group.setup, len(spec.devices)
        cross_node = CrossNode(
            host=setup.master_addr or "",
            port=setup.master_port or 0,
            prefix=setup.store_key(f"{prefix}/ranks"),  # the ranks connect to the store itself
            rank_offset=nodes.index(group.me) * per_node,
            world_size=len(nodes) * per_node,
            node_rank=group.me,
        )
        return replace(spec, cross_node=cross_node)

    def _node_missing(self, spec: CaseSpec, problem: NodeProblem) -> CaseResult:
        decision = Decision(Verdict.HANG, None, [], f"hang in rendezvous: {problem.reason}")
        result = self.runner().not_started(spec, decision)
        result.root_node = problem.node
        return result

    def _recheck_pair(self, planned: PlannedCase, placeholder: DeviceSet) -> DeviceSet:
        """The node pair a re-check runs: its node with a node known good; skipped, saying why, where none is due."""
        node = placeholder.nodes[0]
        partners = self._recheck_partners(planned, placeholder)
        if node not in partners:
            self.planner.skip(planned, f"node {node} passed in the first pass: nothing to re-check")
        partner = partners[node]
        if partner is None:
            reason = f"node {node}: no pair of the first pass passed: no node known good to re-check with"
            self.planner.skip(planned, reason)
        return as_node_pair(placeholder, (node, partner))

    def _recheck_partners(self, planned: PlannedCase, placeholder: DeviceSet) -> dict[int, int | None]:
        """The first pass of this test, as every node saw it (waited for), and who re-checks whom."""
        key, plan = planned.step.key, self.run_context.plan
        test = key.replace(placeholder.base_id, "recheck")
        if test not in self._partners:
            passed = {}
            for pair in plan.pairing.first_pass():
                first = key.replace(placeholder.base_id, as_node_pair(placeholder, pair).base_id)
                if plan.selected is None or (first, 0) in plan.selected:
                    limit = self.run_context.deadlines.node_progress_limit
                    passed[pair] = self.group.first_pass_passed(first, pair, limit)
            self._partners[test] = recheck_partners(passed, plan.pairing.nnodes)
        return self._partners[test]


def exchange_records(run: RunContext, session: pytest.Session) -> None:
    """Node 0 gathers every node's records and exit status; every node learns which nodes failed.

    A failed node fails the run on every node: a node whose own tests passed while another's
    failed (or was lost) ends with a failed exit status too, and says which.
    """
    group, notes = run.nodes, run.outcome.node_notes
    if group is None:
        return
    group.now_at("the end of its run")
    status = int(session.exitstatus)
    if group.me != 0:  # records go over the wire as JSON text, one per line
        mine = [json.dumps(r.to_json(), sort_keys=True) for r in run.folder.all_records()]
        notes.append(f"node {group.me}: {group.publish_results(mine, status)}")
        failed = group.run_outcome()
    else:
        failed = _gather(run, group, status)
    notes.extend(f"node {group.me}: dropped {forged}" for forged in group.forged)
    run.outcome.failed_nodes = tuple(line for line in failed if not line.startswith(f"node {group.me}: "))
    if run.outcome.failed_nodes:
        notes.append(f"{FAILED_ELSEWHERE} {'; '.join(run.outcome.failed_nodes)}: so it fails here too")
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _gather(run: RunContext, group: NodeGroup, status: int) -> list[str]:
    """Node 0: every node's records into results.jsonl; the nodes that failed, told to every node."""
    notes = run.outcome.node_notes

    def waiting(node: int) -> None:
        notes.append(f"node 0 waited for node {node}'s records (it was at {group.where(node)})")

    gathered = group.gather_results(waiting)
    run.ensure_run_dir()
    for node, lines in sorted(gathered.records.items()):
        kept = 0
        for number, line in enumerate(lines, start=1):
            record = record_from_text(line)
            if isinstance(record, str):  # a node's line that is no record: skipped, and said
                notes.append(f"node {node}: record {number} of {len(lines)} skipped: {record}")
                continue
            run.folder.append(record)
            kept += 1
        notes.append(f"node {node}: {kept} records gathered into {run.results_path}")
    notes.extend(f"node {node}: records missing: {reason}" for node, reason in sorted(gathered.gone.items()))
    named, count = group.strangers()
    notes.extend(f"turned away a node of another run ({stranger}); none of its records entered" for stranger in named)
    if count > len(named):
        notes.append(f"{count} turns away counted in all (a public counter: a client not of this run may raise it)")
    statuses = {0: status, **gathered.statuses}
    failed = [f"node {n}: exit {code}" for n, code in sorted(statuses.items()) if code != pytest.ExitCode.OK]
    failed += [f"node {n}: {reason}" for n, reason in sorted(gathered.gone.items())]
    # the store written by someone else, or gone: what it held cannot be trusted to be all; node 0 fails too
    run.outcome.store_problems = group.store_problems
    failed += [f"node 0: {problem}" for problem in run.outcome.store_problems]
    group.publish_outcome(failed, readers=gathered.statuses)
    return failed
