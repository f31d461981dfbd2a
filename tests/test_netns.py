"""Two nodes in two network namespaces joined by a veth pair: the wrong network interface and its fix.

Each namespace has ``lo`` and a veth end named ``cfnet0`` (the same name on both sides, as on a real
cluster), with an address from a private range that exists only inside the namespaces.  One pytest
runs in each namespace as a node of a two-node run on ``suites/test_multinode.py``.  ``cfnet0`` is
then the only interface the nodes share (loopback never counts), so the adaptive ladder's fallback
for a cross-node case is rung ``socket_ifname_cfnet0``.  Another namespace holds an interface with
only an IPv6 address, read back through the kernel as a node's fingerprint reads it.

Needs root and iproute2; skipped with the reason where a namespace cannot be made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import REPO, Node, copy_suites, free_port, read_records, start_node, tagged_processes

pytestmark = pytest.mark.slow  # two nodes in network namespaces, a whole suite each

IFNAME = "cfnet0"
INHERITED = "inherited"
FALLBACK = f"socket_ifname_{IFNAME}"
CROSS_NODE_KINDS = ("node_pair", "across_nodes")
SUITE = "test_multinode.py"
DEADLINES = ("--init-timeout=4", "--op-timeout=4", "--step-timeout=8", "--rendezvous-timeout=30")
NODE_ARGS = ("--virtual-devices=1", *DEADLINES, f"suites/{SUITE}")
# Measured: about 20 s per node on this 2-core machine (four inherited cases, each ended by the
# grace, 3 s, after the other node's rank failed; four fallback cases under 1 s each; start-up).
# Were the waiting node not told of the other's failure, each inherited case would pay its 8 s step
# deadline (about 38 s in all): that is asserted from the records (no case stopped as stalled), not
# from the wall clock, which a busy machine stretches.  A hang is caught at NODE_LIMIT, where both
# nodes are stopped.
NODE_LIMIT = 90.0
HEADER = re.compile(r"^conformance: node (\d+) of (\d+) \(.*\), run store on (\S+); shared interfaces: (.*)$", re.M)
CLASS_LINE = re.compile(r"^# (\S+): (\w+): (.*)$", re.M)


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


@dataclass(frozen=True)
class NamespacePair:
    """Two network namespaces, ``cfnet0`` in each, one veth between them."""

    names: tuple[str, str]
    addresses: tuple[str, str]  # cfnet0's IPv4 address in each

    def prefix(self, node: int) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.names[node])


def _make(*args: str) -> None:
    done = ip(*args)
    if done.returncode != 0:
        pytest.skip(f"cannot set up the network namespaces: `ip {' '.join(args)}` failed: {done.stderr.strip()}")


@pytest.fixture
def namespaces() -> Iterator[NamespacePair]:
    """Namespaces A and B, a veth pair between them named ``cfnet0`` in both; all gone in teardown."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot make network namespaces")
    suffix = uuid.uuid4().hex[:12]
    names = (f"cfnsA-{suffix}", f"cfnsB-{suffix}")
    subnet = f"10.213.{int(suffix[:2], 16)}"
    addresses = (f"{subnet}.1", f"{subnet}.2")
    made: list[str] = []
    try:
        for name in names:
            _make("netns", "add", name)
            made.append(name)
        # Each end is born inside its namespace under its final name: nothing appears on the host.
        _make("link", "add", IFNAME, "netns", names[0], "type", "veth", "peer", "name", IFNAME, "netns", names[1])
        for name, address in zip(names, addresses, strict=True):
            _make("-n", name, "addr", "add", f"{address}/24", "dev", IFNAME)
            _make("-n", name, "link", "set", "lo", "up")
            _make("-n", name, "link", "set", IFNAME, "up")
        yield NamespacePair(names, addresses)
    finally:
        for name in made:
            ip("netns", "delete", name)  # takes its veth end, and with it the peer, along
    left = ip("netns", "list").stdout
    assert not [name for name in names if name in left], f"namespaces left behind: {left}"


def stop_tagged(tag: str) -> list[int]:
    """Kill what this test started (a node that did not exit, its forkserver and ranks)."""
    pids = tagged_processes(tag)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def run_two_nodes(pytester: pytest.Pytester, pair: NamespacePair, tag: str) -> tuple[list[Node], list[int], float]:
    """Node 0 in namespace A (its store on A's cfnet0), node 1 in B; (nodes, exit codes, slower node's seconds)."""
    copy_suites(pytester, SUITE)
    port = free_port()
    nodes = [
        start_node(pytester.path, rank, 2, port, *NODE_ARGS, addr=pair.addresses[0], prefix=pair.prefix(rank))
        for rank in (0, 1)
    ]
    deadline = time.monotonic() + NODE_LIMIT
    outcomes = []
    try:
        for node in nodes:
            outcomes.append(node.wait(timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        killed = stop_tagged(tag)
        logs = "\n".join(f"--- node {rank} ---\n{node.output[-3000:]}" for rank, node in enumerate(nodes))
        pytest.fail(f"the nodes did not exit within {NODE_LIMIT:g}s (killed {killed})\n{logs}")
    codes = [code for code, _ in outcomes]
    return nodes, codes, max(seconds for _, seconds in outcomes)


def describe(nodes: list[Node]) -> str:
    return "\n".join(f"--- node {rank} ---\n{node.output[-6000:]}" for rank, node in enumerate(nodes))


def check_header(node: Node, rank: int, pair: NamespacePair) -> None:
    found = HEADER.findall(node.output)
    assert found, f"node {rank}: no node header line\n{node.output[-3000:]}"
    number, nnodes, store, shared = found[0]
    assert (int(number), int(nnodes)) == (rank, 2)
    assert store.startswith(f"{pair.addresses[0]}:")
    assert shared == IFNAME, f"node {rank}: shared interfaces {shared!r}; loopback must not count"


def cross_node_records(nodes: list[Node]) -> list[dict[str, Any]]:
    """Node 0's gathered records of the cross-node cases (both nodes' records)."""
    records = [r for r in read_records(nodes[0].reports) if r.get("set_kind") in CROSS_NODE_KINDS]
    assert {r["node_rank"] for r in records} == {0, 1}, f"node 0 did not gather both nodes' records\n{describe(nodes)}"
    return records


def paid_the_step_deadline(records: list[dict[str, Any]]) -> list[str]:
    """Cases the watchdog stopped as stalled: a node that was not told its peer's rank had failed."""
    return [r["nodeid"] for r in records if r.get("stop_reason") == "stalled"]


def by_case(records: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, str]]:
    """(node rank, case without its rung) -> {rung: verdict}."""
    cases: dict[tuple[int, str], dict[str, str]] = {}
    for record in records:
        cases.setdefault((record["node_rank"], record["ladder_key"]), {})[record["env_name"]] = record["verdict"]
    return cases


def recommended_rungs(nodes: list[Node]) -> tuple[dict[str, str], str]:
    """Node 0's recommended.env: ({link class: rung}, the text)."""
    path = nodes[0].reports / "latest" / "recommended.env"
    assert path.exists(), f"node 0 wrote no recommended.env\n{describe(nodes)}"
    text = path.read_text()
    return {cls: rung for cls, rung, _ in CLASS_LINE.findall(text)}, text


def test_wrong_interface_falls_back_to_the_shared_one(
    pytester: pytest.Pytester,
    isolated_env: None,
    run_tag: str,
    namespaces: NamespacePair,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GLOO_SOCKET_IFNAME=lo on both nodes: inherited cannot cross; socket_ifname_cfnet0 can, and is recommended."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    nodes, codes, seconds = run_two_nodes(pytester, namespaces, run_tag)

    for rank, node in enumerate(nodes):
        check_header(node, rank, namespaces)
        assert "inherited GLOO_SOCKET_IFNAME=lo" in node.output
        failed = re.findall(r"^(?:FAILED|HANG|ERROR|CRASH|FAIL|INCONCLUSIVE) (\S+)", node.output, re.M)  # a verdict
        assert f"suites/{SUITE}::test_node_pair[node0-node1-{INHERITED}]" in failed
        assert not [nodeid for nodeid in failed if nodeid.endswith(f"-{FALLBACK}]")]
    assert codes == [1, 1], f"exit codes {codes}: the inherited failures must fail both runs\n{describe(nodes)}"
    records = cross_node_records(nodes)
    assert not paid_the_step_deadline(records), describe(nodes)

    pairs = [r for r in records if r["set_kind"] == "node_pair"]
    assert pairs and all(r["link"] == "NET" for r in pairs)
    for (rank, case), verdicts in by_case(records).items():
        # gloo bound to loopback listens on 127.0.0.1 in its own namespace: no peer can reach it
        assert verdicts.get(INHERITED) not in (None, "pass"), f"node {rank} {case}: {verdicts}"
        assert verdicts.get(FALLBACK) == "pass", f"node {rank} {case}: {verdicts}\n{describe(nodes)}"
    assert {case for _, case in by_case(pairs)} == {"test_node_pair[node0-node1]"}

    rungs, text = recommended_rungs(nodes)
    assert rungs.get("NET") == FALLBACK, text
    assert re.search(rf"^# NET: {FALLBACK}: .*\bGLOO_SOCKET_IFNAME={IFNAME}\b", text, re.M), text
    assert f"GLOO_SOCKET_IFNAME={IFNAME}" in text.splitlines()
    print(json.dumps({"exit codes": codes, "seconds": round(seconds, 1), "recommended": rungs}))


def test_no_interface_forced_ends_passing(
    pytester: pytest.Pytester, isolated_env: None, run_tag: str, namespaces: NamespacePair
) -> None:
    """No GLOO_SOCKET_IFNAME: gloo picks its own interface; every cross-node case still ends passing.

    Observed here: gloo (torch's ProcessGroupGloo default device) takes the address the hostname
    resolves to.  ``ip netns exec`` changes the network namespace only, so the hostname is still the
    host's (``vm``) and /etc/hosts maps it to 127.0.0.1 (there is no /etc/netns/<name>/hosts to
    override it): gloo binds to loopback, exactly as with GLOO_SOCKET_IFNAME=lo.  Every inherited
    cross-node case ended hang ("Gloo connectFullMesh failed ... Connection refused,
    remote=[127.0.0.1]:...": each rank dials its peer's loopback address in its own namespace), every
    socket_ifname_cfnet0 case passed, both nodes exited 1, and NET was recommended
    socket_ifname_cfnet0.  On a host whose hostname resolves to a routable address inherited would
    pass instead; that is why only the guarantees are asserted.
    """
    nodes, codes, seconds = run_two_nodes(pytester, namespaces, run_tag)

    for rank, node in enumerate(nodes):
        check_header(node, rank, namespaces)
    records = cross_node_records(nodes)
    assert not paid_the_step_deadline(records), describe(nodes)

    cases = by_case(records)
    inherited_failed = False
    for (rank, case), verdicts in cases.items():
        assert set(verdicts) <= {INHERITED, FALLBACK}, f"node {rank} {case}: {verdicts}"
        assert INHERITED in verdicts, f"node {rank} {case}: inherited runs first: {verdicts}"
        if verdicts[INHERITED] == "pass":
            assert FALLBACK not in verdicts, f"node {rank} {case}: a fallback after a pass: {verdicts}"
        else:
            inherited_failed = True
            assert verdicts.get(FALLBACK) == "pass", f"node {rank} {case}: {verdicts}\n{describe(nodes)}"
    assert codes == [int(inherited_failed)] * 2, f"exit codes {codes}\n{describe(nodes)}"

    rungs, text = recommended_rungs(nodes)
    assert rungs.get("NET") in (INHERITED, FALLBACK), text
    observed = {f"node {rank} {case}": verdicts for (rank, case), verdicts in sorted(cases.items())}
    print(json.dumps({"exit codes": codes, "seconds": round(seconds, 1), "recommended": rungs, **observed}))


V6_ONLY, V6_PEER = "cfv6only0", "cfv6peer0"
READ_INTERFACES = "import json; from conformance.nodes.layout import network_interfaces as n; print(json.dumps(n()))"


def test_an_ipv6_only_interface_is_read_from_the_kernel() -> None:
    """In a namespace of its own: an interface with only an IPv6 address counts; one with only link-local does not."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot make network namespaces")
    name = f"cfns6-{uuid.uuid4().hex[:12]}"
    _make("netns", "add", name)
    try:
        _make("link", "add", V6_ONLY, "netns", name, "type", "veth", "peer", "name", V6_PEER, "netns", name)
        _make("-n", name, "addr", "add", "fd00:cf::1/64", "dev", V6_ONLY, "nodad")
        for link in ("lo", V6_ONLY, V6_PEER):  # the peer gets a link-local address only
            _make("-n", name, "link", "set", link, "up")
        read = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-c", READ_INTERFACES],
            capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        )  # fmt: skip
    finally:
        ip("netns", "delete", name)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {"lo": ["127.0.0.1", "::1"], V6_ONLY: ["fd00:cf::1"]}


# A node whose link to node 0 is cut ends within its step deadline plus the stop ladder of the cut, with
# this much more for the rest of its run (its remaining cases start no ranks) and its end on a busy machine.
CUT_MARGIN = 15.0


def wait_for_first_case(node: Node, limit: float) -> None:
    """Until ``node`` has started the ranks of its first cross-node case."""
    deadline = time.monotonic() + limit
    while not list(node.reports.glob("*/cases/*/rank0/phase.jsonl")):
        assert time.monotonic() < deadline, f"no case started within {limit:g}s\n{node.output[-3000:]}"
        assert node.process.poll() is None, node.output[-3000:]
        time.sleep(0.05)


def link_down_mid_case(
    pytester: pytest.Pytester, pair: NamespacePair, tag: str, deadlines: tuple[str, ...], up_after: float | None
) -> tuple[list[Node], list[int], list[float]]:
    """Both nodes on the veth; node 1's end goes down in its first cross-node case (up again after ``up_after``).

    Returns the nodes, their exit codes and each one's seconds from the link going down to its exit.
    GLOO_SOCKET_IFNAME is the veth's: the hostname resolves to loopback here, and the ranks must cross it.
    """
    copy_suites(pytester, SUITE)
    port = free_port()
    args = ("--virtual-devices=1", *deadlines, "--rendezvous-timeout=30", "--matrix=inherited", f"suites/{SUITE}")
    nodes = [
        start_node(pytester.path, rank, 2, port, *args, addr=pair.addresses[0], prefix=pair.prefix(rank))
        for rank in (0, 1)
    ]
    ended: dict[int, float] = {}
    try:
        wait_for_first_case(nodes[1], 60)
        assert ip("-n", pair.names[1], "link", "set", IFNAME, "down").returncode == 0
        down = time.monotonic()
        if up_after is not None:
            time.sleep(up_after)
            assert ip("-n", pair.names[1], "link", "set", IFNAME, "up").returncode == 0
        while len(ended) < len(nodes) and time.monotonic() - down < NODE_LIMIT * 2:
            for rank, node in enumerate(nodes):
                if rank not in ended and node.process.poll() is not None:
                    ended[rank] = time.monotonic() - down
            time.sleep(0.05)
    finally:
        if len(ended) < len(nodes):  # whatever stopped the test: nothing of it stays behind
            killed = stop_tagged(tag)
            print(f"killed {killed}\n{describe(nodes)}")
    assert len(ended) == len(nodes), f"a node did not end after the link went down\n{describe(nodes)}"
    return nodes, [n.process.returncode for n in nodes], [ended[rank] for rank in range(len(nodes))]


def test_a_link_cut_mid_run_ends_in_a_verdict_on_both_nodes(
    pytester: pytest.Pytester,
    isolated_env: None,
    run_tag: str,
    namespaces: NamespacePair,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node 1's link goes down in its first cross-node case and stays down: each node ends in a verdict.

    Node 1 names node 0 unreachable and since when, writes its records where it runs, and exits 1
    within the step deadline plus the stop ladder (plus CUT_MARGIN); node 0 names node 1 and exits 1.
    """
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", IFNAME)
    deadlines = ("--init-timeout=4", "--op-timeout=4", "--step-timeout=8")
    nodes, codes, ended = link_down_mid_case(pytester, namespaces, run_tag, deadlines, up_after=None)
    assert codes == [1, 1], describe(nodes)
    bound = 8 + 2.0 + CUT_MARGIN  # step deadline + the CPU stop ladder (deadlines.CPU_STOP_LADDER) + margin
    assert max(ended) < bound, f"seconds from the cut to each node's end: {ended} (bound {bound:g})"
    (results,) = nodes[1].reports.glob("*-node1/results.jsonl")  # node 1's records, written where it runs
    own = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    unreachable = [r for r in own if "node 0's store unreachable since " in (r.get("summary") or "")]
    assert unreachable and all(r["verdict"] == "hang" for r in unreachable), describe(nodes)
    unanswered = "RUN FAILED on another node: node 0: no outcome of the run from it (node 0's store unreachable since"
    assert unanswered in nodes[1].output, describe(nodes)
    assert "node 1: records missing: node 1 stopped answering" in nodes[0].output, describe(nodes)


def test_a_link_down_for_30s_that_comes_back_keeps_the_run_going(
    pytester: pytest.Pytester,
    isolated_env: None,
    run_tag: str,
    namespaces: NamespacePair,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same cut, undone after 30 s, with deadlines longer than the outage and TCP's back-off after it.

    Nothing ended (no connection closed) and nobody was quiet past the step deadline: every case
    passes on both nodes and both exit 0.
    """
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", IFNAME)
    deadlines = ("--init-timeout=80", "--op-timeout=80", "--step-timeout=90")  # each longer than the outage
    nodes, codes, _ = link_down_mid_case(pytester, namespaces, run_tag, deadlines, up_after=30)
    assert codes == [0, 0], describe(nodes)
    records = cross_node_records(nodes)
    assert records and all(r["verdict"] == "pass" for r in records), describe(nodes)
