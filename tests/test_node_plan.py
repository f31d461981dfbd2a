"""Multi-node planning without running nodes: pair rounds, the quick pass, bad nodes, layouts, verdicts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.common.verdicts import Verdict
from conformance.discover.topology import Device, Topology
from conformance.nodes.group import collection_difference
from conformance.nodes.layout import node_setup
from conformance.plan.matrix import (
    BUILTIN_LADDER,
    GDR_OFF,
    NodePairing,
    node_pairs,
    node_rounds,
    node_rungs,
    random_pairing,
    recheck_partners,
)
from conformance.plan.parametrize import Plan
from conformance.record.records import CaseRecord
from conformance.summarise.summary import bad_nodes, one_record_per_case, summary_lines
from conformance.verdict.decision import Decision, NodeVerdict, decide_across_nodes

ONE_CPU = Topology("cpu", (Device("cpu0", 0, "cpu"),), "test")


def test_cross_node_verdict_names_the_node_with_the_real_failure() -> None:
    local = Decision(Verdict.HANG, None, [], "ranks 0,1 all stuck in probe (all_reduce 4B)")
    verdicts = {
        0: NodeVerdict(Verdict.HANG, local.summary),
        1: NodeVerdict(Verdict.ERROR, "rank 0 (cpu0) in probe: RuntimeError: boom"),
    }
    decision, node = decide_across_nodes(0, local, verdicts, None)
    assert (decision.verdict, node) == ("error", 1)
    assert decision.summary == "node 1: rank 0 (cpu0) in probe: RuntimeError: boom"
    decision, node = decide_across_nodes(0, local, {**verdicts, 1: NodeVerdict(Verdict.FAIL, "x")}, None)
    assert (decision.verdict, node, decision.summary) == ("fail", 1, "node 1: x")
    decision, node = decide_across_nodes(0, local, verdicts, (1, "node 1 stopped answering"))
    assert (decision.verdict, node, decision.summary) == ("hang", 1, "hang across nodes: node 1 stopped answering")
    stuck = {0: verdicts[0], 1: NodeVerdict(Verdict.HANG, "rank 0 all stuck in probe (all_reduce 4B)")}
    for me in (0, 1):  # each node's ranks stuck waiting for the other's: the link, neither node named
        decision, node = decide_across_nodes(me, local, stuck, None)
        assert (decision.verdict, node) == ("hang", None)
        assert decision.summary.startswith("the link between node 0 and node 1 (both stuck): node 0: ranks 0,1")
    errors = {n: NodeVerdict(Verdict.ERROR, f"rank 0 in probe: error on node {n}") for n in (0, 1)}
    assert decide_across_nodes(1, local, errors, None)[1] == 0  # errors keep naming a node, as before
    passed = {n: NodeVerdict(Verdict.PASS, "") for n in (0, 1)}
    assert decide_across_nodes(0, Decision(Verdict.PASS, None, [], ""), passed, None) == (
        Decision(Verdict.PASS, None, [], ""),
        None,
    )


def test_the_node_whose_stuck_ranks_got_least_far_is_named_from_their_flight_recorders() -> None:
    """The second real-GPU run: node 1's rank never issued the send node 0's rank waits in."""
    local = Decision(Verdict.HANG, None, [], "rank 0 (gpu0) in probe (send/recv 4B): made no progress")
    verdicts = {
        0: NodeVerdict(Verdict.HANG, "rank 0 (gpu0) in probe (send/recv 4B): made no progress", (5, 3)),
        1: NodeVerdict(Verdict.HANG, "rank 0 (gpu0) in probe (send/recv 4B): made no progress", (5, 0)),
    }
    for me in (0, 1):
        decision, node = decide_across_nodes(me, local, verdicts, None)
        assert (decision.verdict, node) == ("hang", 1)
        assert decision.summary == (
            "node 1: rank 0 (gpu0) in probe (send/recv 4B): made no progress; its ranks got least far (5 phase(s), 0 "
            "operation(s) issued; node 0: 5 phase(s), 3 operation(s) issued; flight recorder): the other nodes only "
            "waited for it"
        )
    # alike, or a node that cannot say: the link, as before
    for other in ((5, 0), None):
        _, node = decide_across_nodes(0, local, {**verdicts, 0: replace(verdicts[0], reached=other)}, None)
        assert node is None
    # what a node says of itself travels whole; a count that is no count is no evidence
    assert NodeVerdict.from_text(verdicts[1].to_text()) == verdicts[1]
    for bad in ("[5, -1]", "[5]", '["5", 0]', '{"a": 1}', "[true, 0]"):
        text = f'{{"verdict": "hang", "summary": "s", "reached": {bad}}}'
        assert NodeVerdict.from_text(text).reached is None


def test_collection_difference_lines() -> None:
    assert collection_difference(["a", "b"], ["a", "b"], 1) == []
    assert collection_difference(["a", "b", "c"], ["a", "d"], 2) == [
        "node 2 collected 2 tests, node 0 collected 3",
        "  only on node 0: b",
        "  only on node 0: c",
        "  only on node 2: d",
    ]
    assert collection_difference(["a", "b"], ["b", "a"], 1)[-1] == (
        "  same tests in another order; first difference at position 1: a"
    )


def test_node_rungs_and_node_pairs() -> None:
    rungs = node_rungs(["ib0", "eth-1"])
    assert [r.name for r in rungs] == ["gdr_off", "socket_ifname_eth_1", "socket_ifname_ib0"]
    assert rungs[0] is GDR_OFF and dict(GDR_OFF.set) == {"NCCL_NET_GDR_LEVEL": "LOC"}
    assert dict(rungs[1].set) == {"NCCL_SOCKET_IFNAME": "=eth-1", "GLOO_SOCKET_IFNAME": "eth-1"}
    assert all(r.across_nodes for r in rungs)
    topology = Topology("cpu", (Device("cpu0", 0, "cpu"),), "test")
    assert [s.base_id for s in node_pairs(topology, NodePairing(3))] == ["node1-node2", "node0-node2", "node0-node1"]
    plan = Plan(topology, (*BUILTIN_LADDER, *rungs), "full", pairing=NodePairing(2))
    assert not any(r.across_nodes for r in plan.local_rungs) and plan.rungs[-3:] == rungs


@pytest.mark.parametrize("nnodes", range(2, 10))
def test_node_pairs_run_in_rounds_of_disjoint_pairs(nnodes: int) -> None:
    """Every pair once; within a round no node twice, so a round's pairs run at once (N-1 rounds, N if N is odd)."""
    rounds = node_rounds(nnodes)
    assert len(rounds) == (nnodes - 1 if nnodes % 2 == 0 else nnodes)
    pairs = [pair for found in rounds for pair in found]
    assert sorted(pairs) == [(a, b) for a in range(nnodes) for b in range(a + 1, nnodes)]
    assert all(len({node for pair in found for node in pair}) == 2 * len(found) for found in rounds)
    # the plan runs them in that order
    assert [s.nodes for s in node_pairs(ONE_CPU, NodePairing(nnodes))] == pairs


@pytest.mark.parametrize("nnodes", range(2, 18))
def test_the_quick_pass_is_one_random_round_then_a_recheck_per_node(nnodes: int) -> None:
    first = random_pairing(nnodes, "run-a")
    assert len(first) == nnodes // 2 and len({node for pair in first for node in pair}) == 2 * len(first)
    assert random_pairing(nnodes, "run-a") == first  # every node draws the same from the run id
    if nnodes >= 4:
        assert len({tuple(random_pairing(nnodes, f"run-{seed}")) for seed in range(20)}) > 1
    quick = node_pairs(ONE_CPU, NodePairing.of(nnodes, "quick", "run-a"))
    assert [s.nodes for s in quick[: len(first)]] == first
    assert [s.base_id for s in quick[len(first) :]] == [f"recheck-node{n}" for n in range(nnodes)]
    assert NodePairing.of(nnodes, "auto", "x").mode == ("all" if nnodes <= 8 else "quick")


def test_each_node_not_known_good_is_rechecked_with_a_node_known_good() -> None:
    first = [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert recheck_partners({pair: pair != (2, 3) for pair in first}, 8) == {2: 0, 3: 1}  # disjoint: one round
    assert recheck_partners({(0, 1): True, (2, 3): True}, 5) == {4: 0}  # sat out the odd round
    assert recheck_partners({(0, 1): False, (2, 3): True}, 4) == {0: 2, 1: 3}
    assert recheck_partners({(0, 1): False, (2, 3): False}, 4) == {0: None, 1: None, 2: None, 3: None}
    # more suspects than good nodes: a good node serves twice (its re-checks run one after the other)
    assert recheck_partners({(0, 1): False, (2, 3): False, (4, 5): True}, 6) == {0: 4, 1: 5, 2: 4, 3: 5}


def node_pair_record(a: int, b: int, verdict: str, rung: str = "inherited") -> CaseRecord:
    return CaseRecord(f"t[node{a}-node{b}-{rung}]", "pair_exchange", verdict, set_kind="node_pair", env_name=rung,
                      nodes=(a, b), node_rank=a)  # fmt: skip


@pytest.mark.parametrize(
    ("pairs", "named"),
    [
        # quick: (2, 3) failed; re-checked, 2 passed with 0 and 3 failed with 1
        ({(0, 1): "pass", (2, 3): "error", (0, 2): "pass", (1, 3): "error"}, {3: (1, 2)}),
        # all pairs of 4 nodes, node 3 bad
        (
            {(0, 1): "pass", (0, 2): "pass", (1, 2): "pass", (0, 3): "hang", (1, 3): "fail", (2, 3): "error"},
            {3: (0, 1, 2)},
        ),
        # two bad nodes: each failed with the good ones
        (
            {(0, 1): "pass", (0, 2): "error", (0, 3): "error", (1, 2): "error", (1, 3): "error", (2, 3): "error"},
            {2: (0, 1), 3: (0, 1)},
        ),
        # a bad link, not a bad node: 2 and 3 each passed with another
        ({(0, 1): "pass", (2, 3): "error", (0, 2): "pass", (1, 3): "pass"}, {}),
        # nothing known good: no node can be named
        ({(0, 1): "error", (2, 3): "error"}, {}),
    ],
    ids=["quick", "all-one-bad", "all-two-bad", "bad-link", "all-failed"],
)
def test_the_summary_names_bad_nodes_not_only_bad_pairs(
    pairs: dict[tuple[int, int], str], named: dict[int, tuple[int, ...]]
) -> None:
    records = [node_pair_record(a, b, verdict) for (a, b), verdict in pairs.items()]
    records.append(node_pair_record(2, 3, "pass", rung="net_socket"))  # a fallback rung does not exonerate
    assert {bad.node: bad.failed_with for bad in bad_nodes(records)} == named
    lines = [text for text, _ in summary_lines(records)]
    assert [line for line in lines if line.startswith("BAD NODE")] == [
        f"BAD NODE node {node}: failed with {', '.join(f'node {n}' for n in partners)}, each of which passed with "
        "another node, and passed with none"
        for node, partners in named.items()
    ]


def test_a_run_token_is_never_in_the_identity_nor_anything_derived_from_it() -> None:
    """The identity is public (the store shows it to anyone): the launcher's name for the run, never the token."""
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NODELIST": "localhost"}  # fmt: skip
    setup = node_setup({}, slurm, "x")
    assert (setup.identity, setup.run_token) == ("SLURM job 7 step 0", "x")
    assert node_setup({"nnodes": 2, "master_addr": "h"}, {}, "x").identity == ""
    assert node_setup({"nnodes": 2, "master_addr": "h"}, {}).identity == ""


def test_a_cross_node_case_counts_once_whichever_nodes_records_are_there() -> None:
    both = [node_pair_record(0, 1, "pass"), replace(node_pair_record(0, 1, "pass"), node_rank=1)]
    assert [r.node_rank for r in one_record_per_case(both)] == [0]
    assert [r.node_rank for r in one_record_per_case(both[::-1])] == [0]
    assert [r.node_rank for r in one_record_per_case(both[1:])] == [1]  # node 1's own run folder
    local = [CaseRecord("t[cpu0]", "barrier", "pass"), CaseRecord("t[cpu0]", "barrier", "pass")]
    assert one_record_per_case(local) == local  # a case of one node is never folded


def test_negative_controls_that_went_as_expected_stay_out_of_the_verdict_counts() -> None:
    """A green run shows no error: the error a negative control expected is the suite checking itself."""
    control = CaseRecord("t::test_one_rank_raises", "all_reduce", "error", expected_verdict="error")
    missed = CaseRecord("t::test_oom", "all_reduce", "pass", expected_verdict="error")  # did not go as expected
    lines = [text for text, _ in summary_lines([node_pair_record(0, 1, "pass"), control, missed])]
    assert lines[-5].split() == ["probe", "pass"]  # only the verdicts some counted case had: no error column
    assert lines[-2].split() == ["total", "(cases", "+", "host", "checks)", "2"]
    assert lines[-1] == "negative controls: 1 ended as their tests expected (error); not counted above"
    assert not any("negative controls" in text for text, _ in summary_lines([missed]))
