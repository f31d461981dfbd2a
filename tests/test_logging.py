"""The harness's actions are log records: ``--log-cli-level=INFO`` shows them, a plain run prints none.

A real run through pytester on a simulated two-GPU box (so the case takes device leases), with rank 1
hanging in its all-reduce and ignoring SIGTERM (``scenarios/hang-ignores-sigterm.toml``): the stop
ladder goes all the way to SIGKILL, and each of its signals names the case, the pids and why.  Two
nodes on loopback log their rendezvous (logger ``conformance.nodes``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from conftest import COLLECTIVE_TEST, REPO, copy_suites, free_port, start_node

SCENARIO = REPO / "scenarios" / "hang-ignores-sigterm.toml"
TOPOLOGY = REPO / "scenarios" / "topologies" / "pcie-2gpu.json"
TIMEOUTS = ("--step-timeout=4", "--op-timeout=3", "--init-timeout=3", "--grace=1")
NODE_DEADLINES = ("--init-timeout=5", "--op-timeout=5", "--step-timeout=10", "--rendezvous-timeout=20")
CASE = "test_x.py--test_case"
LOGGER = r"INFO +conformance\.launch:\S+ "  # how pytest's live log begins each record
GPUS = "GPU-nvid0000-0000-0000-0000-000000000000, GPU-nvid0001-0000-0000-0000-000000000001"
# Lines only the log writes: none of them may reach a plain run's output.
HARNESS_WORDS = ("to process group", "device leases", "rank(s) forked", "reaped:", "forkserver started", "SIGUSR1")


def run_hang(pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], *options: str) -> str:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    result = run_suite(f"--scenario={SCENARIO}", f"--topology-file={TOPOLOGY}", *TIMEOUTS, *options)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["[[]simulated[]] hang: rank 1 (gpu1) in probe (all_reduce 4B)*"])
    return "\n".join(result.outlines + result.errlines)


def found(pattern: str, text: str) -> re.Match[str]:
    match = re.search(rf"^{LOGGER}{pattern}$", text, re.M)
    assert match, f"no line matching {pattern!r} in:\n{text}"
    return match


def test_log_cli_level_info_shows_signals_leases_and_ranks(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult]
) -> None:
    text = run_hang(pytester, run_suite, "--log-cli-level=INFO")
    forked = found(rf"case {CASE}: 2 rank\(s\) forked \(pids (\d+), (\d+)\) in process group (\d+)", text)
    rank0, rank1, group = forked.groups()
    assert group == rank0  # the group is the first rank's
    found(rf"device leases taken: {GPUS} in \S+/leases after [\d.]+s \(pid \d+\)", text)
    found(rf"case {CASE}: rank 0 \(pid {rank0}\) reaped: exit 1", text)  # its all-reduce timed out
    found(rf"case {CASE}: (no rank reported progress|the grace).*; stopping ranks 1 \(pid {rank1}\)", text)
    dump = found(rf"case {CASE}: SIGUSR1 to rank 1 \(pid {rank1}\): dump its stacks", text)
    term = found(rf"SIGTERM to process group {group} \(pids {rank1}\): case {CASE}, stop ladder \((\w+)\)", text)
    kill = found(
        rf"SIGKILL to process group {group} \(pids {rank1}\): case {CASE}, stop ladder \({term.group(1)}\): "
        r"1 rank\(s\) ignored SIGTERM",
        text,
    )
    found(rf"case {CASE}: rank 1 \(pid {rank1}\) reaped: killed by SIGKILL", text)
    released = found(rf"device leases released: {GPUS} \(pid \d+\)", text)
    order = [line.start() for line in (dump, term, kill, released)]
    assert order == sorted(order), "the ladder's signals, then the leases given back, in that order"


def test_without_the_option_nothing_of_it_is_printed(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult]
) -> None:
    text = run_hang(pytester, run_suite)
    assert not [line for line in text.splitlines() if any(word in line for word in HARNESS_WORDS)], text


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_env", "run_tag")
def test_the_rendezvous_of_two_nodes_is_logged(pytester: pytest.Pytester) -> None:
    files = copy_suites(pytester, "test_multinode.py")
    port = free_port()
    args = (*files, *NODE_DEADLINES, "--virtual-devices=1", "-k", "node_pair", "--log-cli-level=INFO")
    nodes = [start_node(pytester.path, rank, 2, port, *args) for rank in (0, 1)]
    for node in nodes:
        code, _ = node.wait()
        assert code == 0, node.output
    first, second = (node.output for node in nodes)
    where = rf"127\.0\.0\.1:{port}"
    node_log = r"INFO +conformance\.nodes:\S+ "
    for pattern, text in [
        (rf"node 0: started the run's store at {where}", first),
        (r"node 0: waiting for node 1's fingerprint \(rendezvous deadline 20s\)", first),
        (r"node 0: start check: nodes 0 \(\S+\), 1 \(\S+\) arrived; shared interfaces: .*; may go on", first),
        (r"node 0: gathered 1 record\(s\) from node 1 \(exit 0\)", first),
        (rf"node 1: joined the run's store at {where}", second),
        (r"node 1: fingerprint sent; waiting up to 20s for node 0's start check", second),
        (r"node 1: sent 1 record\(s\) to node 0", second),
    ]:
        assert re.search(rf"^{node_log}{pattern}$", text, re.M), f"no {pattern!r} in:\n{text}"
