"""A run across nodes is signed on every channel, and nothing published lets a token be tested offline.

Unit level, against a real TCPStore: two nodes of one run (``NodeGroup``s in this process, node 0's
store server a child of it) and a stranger, a plain TCPStore client of node 0's port without the
token.  One test per kind of attack walks every channel a node reads: a stranger's value is dropped
and named, changes no verdict, blames no node and holds nothing past its deadline.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.common.run_token import MIN_TOKEN_BITS, estimated_bits, new_token, token_file_refused, weak_token
from conformance.nodes.group import NodeGroup, NodeGroupError
from conformance.nodes.layout import Fingerprint, NodeSetup
from conformance.nodes.liveness import HEARTBEAT_SECONDS, GroupLimits
from conformance.nodes.store_server import StoreServer
from conformance.settings import SettingError, token_on_command_line
from conftest import free_port
from test_units import resolve_with

TOKEN = new_token()
LIMITS = GroupLimits(progress=6, store=3)
RENDEZVOUS = 10.0
GENUINE_AFTER = 0.8  # the node's own value comes this long after the stranger's, which the reader meets first
LOAD_MARGIN = 5.0  # a loaded machine's delay on top of what a wait is bounded by
ROUNDS = 4 * HEARTBEAT_SECONDS + 1.0  # a few rounds of the monitors


def fingerprint(rank: int) -> Fingerprint:
    return Fingerprint(rank, f"node{rank}", 1, ("cpu0",), None, None, None, "2.26.2", "2.13.0", "0.1.0")


@dataclass
class Pair:
    node0: NodeGroup
    node1: NodeGroup
    stranger: Any  # a plain TCPStore client of node 0's port: no token


def a_stranger(port: int) -> Any:
    """A plain client of node 0's store: anyone who reaches its port."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))  # type: ignore[attr-defined]


@contextmanager
def signed_pair(before_node_1: Callable[[NodeGroup, Any], None] | None = None) -> Iterator[Pair]:
    """Two nodes of one run signed with a run token, and a stranger on node 0's store."""
    port = free_port()
    setups = [NodeSetup(2, rank, "127.0.0.1", port, "settings", run_token=TOKEN) for rank in (0, 1)]
    node0 = NodeGroup.connect(setups[0], RENDEZVOUS, LIMITS)
    node1 = None
    try:
        stranger = a_stranger(port)
        if before_node_1 is not None:
            before_node_1(node0, stranger)
        node1 = NodeGroup.connect(setups[1], RENDEZVOUS, LIMITS)
        yield Pair(node0, node1, stranger)
    finally:
        if node1 is not None:
            node1.close()
        node0.close()


def eventually(condition: Callable[[], bool], within: float = ROUNDS + LOAD_MARGIN) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def named(node: NodeGroup, key: str) -> bool:
    return any(line.startswith(f"{key}:") for line in node.forged)


def genuine_later(write: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(GENUINE_AFTER, write)
    timer.start()
    return timer


FORGED_RESULT = json.dumps({"verdict": "pass", "forged": True})
EVIL = "evil\x1b[2J text"


def through_the_start(pair: Pair) -> None:
    """fingerprint/1 (read by node 0) and check, with the run id node 0 hands out (read by node 1)."""
    node0, node1, stranger = pair.node0, pair.node1, pair.stranger
    stranger.set("fingerprint/1", fingerprint(1).to_json().replace("node1", "evil"))
    with run_beside(lambda: node0.start(fingerprint(0), "20990101-000000-beef")) as started0:
        assert eventually(lambda: named(node0, "fingerprint/1"))
        node1._set("fingerprint/1", fingerprint(1).to_json())
    assert started0().missing == {} and started0().check.ok
    genuine = stranger.get("check")
    stranger.set("check", json.dumps({"run_id": "../../../tmp/x", "prints": [], "missing": {}, "interfaces": []}))
    timer = genuine_later(lambda: node0.signed.raw.set("check", genuine))
    assert node1.start(fingerprint(1), "20990101-000000-dead").run_id == "20990101-000000-beef"
    timer.join()


def through_the_collection(pair: Pair) -> None:
    """collection/1 (read by node 0) and collection_check (read by node 1)."""
    node0, node1, stranger = pair.node0, pair.node1, pair.stranger
    tests = ["suites/test_multinode.py::test_barrier"]
    stranger.set("collection/1", json.dumps(["suites/evil.py::test"]))
    with run_beside(lambda: node0.same_collection(tests)) as compared0:
        assert eventually(lambda: named(node0, "collection/1"))
        node1._set("collection/1", json.dumps(tests))
    assert compared0() == []
    stranger.set("collection_check", json.dumps(["forged difference"]))
    timer = genuine_later(lambda: node0._set("collection_check", "[]"))
    assert node1.same_collection(tests) == []
    timer.join()


def through_a_case(pair: Pair) -> None:
    """case/<id>/arrived/<k> (a meeting ended by no stranger) and case/<id>/verdict/<k> (the verdicts read)."""
    node0, node1, stranger = pair.node0, pair.node1, pair.stranger
    stranger.set("case/x#1/arrived/1", "1")
    stranger.set("case/x#1/verdict/1", "pass")
    timer = genuine_later(lambda: node1._set("case/x#1/arrived/1", "1"))
    began = time.monotonic()
    assert node0.meet("case/x#1", "arrived", [0, 1], "1", 5) is None
    timer.join()
    assert GENUINE_AFTER <= time.monotonic() - began < GENUINE_AFTER + LOAD_MARGIN  # not ended by the stranger
    assert node0.read("case/x#1", "verdict", [1]) == {}
    genuine_later(lambda: node1._set("case/x#1/verdict/1", "fail")).join()
    assert node0.read("case/x#1", "verdict", [0, 1]) == {1: "fail"}  # node 0 wrote none: node 1's own
    assert named(node0, "case/x#1/arrived/1") and named(node0, "case/x#1/verdict/1")


def through_the_watchdog(pair: Pair) -> None:
    """case/<id>/failed/<k>: what the watchdog stops a case's ranks for."""
    node0, node1, stranger = pair.node0, pair.node1, pair.stranger
    stranger.set("case/x#1/failed/1", "1")
    node0.watch(["case/x#1/failed/1"])
    assert eventually(lambda: named(node0, "case/x#1/failed/1"))
    assert not node0.watch(["case/x#1/failed/1"]) and not node0.peers("case/x#1", [0, 1]).failed()
    node1.post("case/x#1/failed/1")  # node 1's own: seen
    assert eventually(lambda: node0.watch(["case/x#1/failed/1"]))


def through_the_first_pass(pair: Pair) -> None:
    """first_pass/<key>/<k>: which node pairs the re-checks trust."""
    node0, node1, stranger = pair.node0, pair.node1, pair.stranger
    stranger.set("first_pass/k/1", "pass")
    node0.publish_first_pass("k", "pass")
    timer = genuine_later(lambda: node1.publish_first_pass("k", "fail"))
    assert node0.first_pass_passed("k", [0, 1], 5) is False
    timer.join()
    assert named(node0, "first_pass/k/1")


def through_the_monitor(pair: Pair) -> None:
    """died/<k> (node 0's word that a node died) and heartbeat/<k> (alive, and the test it is in: "at")."""
    node0, node1, stranger = pair.node0, pair.node1, pair.stranger
    stranger.set("died/1", "1")
    stranger.set("died/0", "1")
    stranger.set("heartbeat/1", f"99999999 {EVIL}")
    node1.now_at("suites/test_multinode.py::test_barrier")
    assert eventually(lambda: named(node0, "died/1") and named(node1, "died/0") and named(node0, "heartbeat/1"))
    assert node0.problem(1) is None and node1.problem(0) is None
    assert eventually(lambda: node0.where(1) == "suites/test_multinode.py::test_barrier")


def through_the_end(pair: Pair) -> None:
    """results/<k> and status/<k> (gathered by node 0), and outcome (read by every node)."""
    node0, node1, stranger = pair.node0, pair.node1, pair.stranger
    stranger.set("results/1", FORGED_RESULT)
    stranger.set("status/1", "0")
    stranger.set("outcome", "[]")
    timer = genuine_later(lambda: node1.publish_results([json.dumps({"verdict": "fail"})], 1))
    gathered = node0.gather_results(lambda node: None)
    timer.join()
    assert gathered.records == {1: [json.dumps({"verdict": "fail"})]} and gathered.statuses == {1: 1}
    assert gathered.gone == {} and named(node0, "results/1")
    timer = genuine_later(lambda: node0.publish_outcome(["node 1: exit 1"], readers=[]))
    assert node1.run_outcome() == ["node 1: exit 1"]
    timer.join()
    assert named(node1, "outcome")


def before_node_1_joins(node0: NodeGroup, stranger: Any) -> None:
    """Liveness (the port node 1 reads), rank_holder/1 (which pytest is node 1), hello/1 (node 1's proof)."""
    stranger.set("liveness", "1")  # overwrites node 0's port: node 1 drops it, and heartbeats decide
    stranger.set("rank_holder/1", "host evil (pid 1)")  # a holder no node of the run wrote: named, replaced
    stranger.set(f"hello/1/{stranger.add('hellos/1', 1)}", "00 not-a-proof")  # answered, named, trusted in nothing
    assert eventually(lambda: named(node0, "hello/1/1"))


# Every key a node reads, by the walk that forges it first (the joining keys: before_node_1_joins).
CHANNELS = {
    through_the_start: ("fingerprint/1", "check"),
    through_the_collection: ("collection/1", "collection_check"),
    through_a_case: ("case/x#1/arrived/1", "case/x#1/verdict/1"),
    through_the_watchdog: ("case/x#1/failed/1",),
    through_the_first_pass: ("first_pass/k/1",),
    through_the_monitor: ("died/1", "died/0", "heartbeat/1"),
    through_the_end: ("results/1", "outcome"),
}


def test_a_strangers_value_on_every_channel_is_dropped_named_and_changes_nothing() -> None:
    """The stranger writes each key a node reads before the node of the run does; every reader takes the node's.

    Seen before: forged results made node 1 'gone' (blamed); a forged died/1 or failed key was believed
    on sight; a forged heartbeat moved node 1's test; a forged run id became a folder's name.
    """
    with signed_pair(before_node_1_joins) as pair:
        node0, node1 = pair.node0, pair.node1
        assert named(node1, "liveness") and named(node1, "rank_holder/1") and node1._held is None
        for walk, keys in CHANNELS.items():
            began = time.monotonic()
            walk(pair)
            assert time.monotonic() - began < RENDEZVOUS, walk.__name__  # no channel held past its deadline
            assert all(named(node0, key) or named(node1, key) for key in keys), keys
        assert node0.gone == {} and node1.gone == {} and not node0.lost and not node1.lost  # nobody blamed
        assert node0.problem(1) is None and node1.problem(0) is None
        assert all("\x1b" not in line for line in node0.forged + node1.forged)  # a stranger's words shown as data


@contextmanager
def run_beside(work: Callable[[], Any]) -> Iterator[Callable[[], Any]]:
    """``work`` in a thread beside the test; what it returned, once the block is done."""
    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.update(value=work()), daemon=True)
    thread.start()
    try:
        yield lambda: done["value"]
    finally:
        thread.join(RENDEZVOUS + LOAD_MARGIN)


def test_a_frozen_node_is_not_kept_alive_by_forged_or_replayed_heartbeats() -> None:
    """Node 1 freezes (its monitor stops); a stranger forges its beat and replays its last real ones.

    Seen before: heartbeats a stranger added kept a frozen node 1 "alive" for 7 minutes.
    """
    with signed_pair() as pair:
        node0, node1, stranger = pair.node0, pair.node1, pair.stranger
        assert eventually(lambda: node0.heard[1].count >= 2)
        recorded = [stranger.get("heartbeat/1")]
        assert eventually(lambda: stranger.get("heartbeat/1") != recorded[0])
        recorded.append(stranger.get("heartbeat/1"))
        node1._stop.set()  # frozen: it beats no more
        frozen_at = time.monotonic()
        stop = threading.Event()

        def keep_alive() -> None:
            n = 0
            while not stop.wait(0.1):
                n += 1
                stranger.set("heartbeat/1", recorded[n % 2] if n % 3 else f"{10**6 + n} suites/x.py::test".encode())

        forger = threading.Thread(target=keep_alive, daemon=True)
        forger.start()
        try:
            assert eventually(lambda: node0.problem(1) is not None, LIMITS.store + ROUNDS + LOAD_MARGIN)
        finally:
            stop.set()
            forger.join()
        assert time.monotonic() - frozen_at < LIMITS.store + ROUNDS + LOAD_MARGIN
        assert node0.gone[1].startswith("node 1 stopped answering: no heartbeat for ")
        assert named(node0, "heartbeat/1")


def test_a_connection_to_the_liveness_port_that_proves_no_key_blames_no_node() -> None:
    """One TCP connection saying "node 1" and closing made node 0 blame node 1: now it is dropped and named."""
    with signed_pair() as pair:
        node0 = pair.node0
        assert node0.liveness is not None
        for said in (b"node 1\n", b"node 1 " + b"0" * 64 + b"\n", b"node 1 \xff\xfe\n", b"\x1b[2Jnode 1\n"):
            with socket.create_connection(("127.0.0.1", node0.liveness.port), timeout=5) as client:
                assert client.recv(256).startswith(b"challenge ")
                client.sendall(said)
        assert eventually(lambda: sum("to node 0's liveness port did not prove" in f for f in node0.forged) == 4)
        time.sleep(ROUNDS)  # the monitor's rounds: a died/1 would be posted and read by now
        assert not node0.liveness.died(1) and node0.problem(1) is None and node0.gone == {}
        assert all("\x1b" not in line for line in node0.forged)
        from conformance.nodes.liveness import GREETING_AT_ONCE

        flood = [socket.create_connection(("127.0.0.1", node0.liveness.port)) for _ in range(GREETING_AT_ONCE + 8)]
        try:  # connections that say nothing hold a thread each, up to a bound: the rest are closed and counted
            assert eventually(lambda: any(f"past {GREETING_AT_ONCE} unproven ones" in line for line in node0.forged))
        finally:
            for client in flood:
                client.close()
        assert node0.problem(1) is None
        pair.node1.close()  # node 1's own end, through its proven connection: an end, not a death
        time.sleep(ROUNDS)
        assert not node0.liveness.died(1)


def test_a_value_that_is_not_what_it_must_be_is_dropped_and_named_even_unsigned() -> None:
    """--unsigned: a stranger's values reach the readers; nested 100,000 deep or not JSON, each is named, no crash."""
    port = free_port()
    setups = [NodeSetup(2, rank, "127.0.0.1", port, "settings", unsigned=True) for rank in (0, 1)]
    node0 = NodeGroup.connect(setups[0], RENDEZVOUS, LIMITS)
    node1 = NodeGroup.connect(setups[1], RENDEZVOUS, LIMITS)
    stranger = a_stranger(port)
    deep = "[" * 100_000 + "]" * 100_000
    try:
        why = "--unsigned: no run token (CONFORMANCE_RUN_TOKEN, --run-token-file or --run-token), not under SLURM"
        assert node0.unsigned == node1.unsigned == f"{why} (no MUNGE)"
        stranger.set("check", deep)
        start1 = node1.start(fingerprint(1), "20990101-000000-dead")
        assert start1.missing == {0: node1.lost} and "nested deeper than 64 levels" in node1.lost
        stranger.set("fingerprint/1", "{not json")
        missing = node0.start(fingerprint(0), "20990101-000000-beef").missing
        assert missing[1].startswith("node 1: its fingerprint cannot be read: not a fingerprint: not JSON: ")
        stranger.set("collection/1", deep)
        node0.gone.clear()
        assert node0.same_collection(["t"]) == [] and "its collection cannot be read" in node0.gone[1]
        stranger.set("outcome", json.dumps({"a": 1}))
        fresh = NodeGroup(setups[1], RENDEZVOUS, LIMITS, node1.signed.raw)
        assert fresh.run_outcome()[0].startswith("node 0: its outcome of the run cannot be read (")
    finally:
        node1.close()
        node0.close()


def test_the_run_id_node_0_hands_out_is_checked_before_any_path_is_built() -> None:
    """A start check signed with the run's key whose run id is a path: refused, this node keeps its own id."""
    with signed_pair() as pair:
        node0, node1 = pair.node0, pair.node1
        for bad in ("../../../etc", "20990101-000000-beef/../../x", "20990101-000000-beef-node1", "", 7):
            node0._set("check", json.dumps({"run_id": bad, "prints": [], "missing": {}, "interfaces": []}))
            node1.lost = ""
            start = node1.start(fingerprint(1), "20990101-000000-dead")
            assert start.run_id == "20990101-000000-dead" and "is not a run id (YYYYMMDD-HHMMSS-hex)" in node1.lost


def test_node_0s_store_server_starts_outside_the_rendezvous_deadline_and_its_failure_is_one_line() -> None:
    """Seen: a 2 s rendezvous on a loaded machine; the server did not start in it and the error path crashed.

    The server, a fresh interpreter importing torch, took longer than the rendezvous deadline, and its
    error path read a closed file (ValueError, INTERNALERROR).
    """
    from conformance.nodes.store import listening_socket

    setup = NodeSetup(2, 0, "127.0.0.1", free_port(), "settings", run_token=TOKEN)
    node0 = NodeGroup.connect(setup, 0.2, LIMITS)  # far below what the server takes to start: it starts all the same
    node0.close()
    listening = listening_socket("127.0.0.1", 0)
    with pytest.raises(RuntimeError) as failed:
        StoreServer.start(listening, "127.0.0.1", listening.getsockname()[1], 0.001)
    assert "\n" not in str(failed.value)
    assert str(failed.value).startswith("its store server did not start within 0.001s: ")


STRANGERS_CONNECTIONS = 300  # held open to node 0's port before its server serves (a port scanner, idle clients)


@pytest.mark.parametrize(("limit", "serves"), [((100, 100), False), ((100, 1 << 14), True)], ids=["hard", "soft"])
def test_a_stranger_holding_connections_to_node_0s_port_is_named_not_waited_out(
    monkeypatch: pytest.MonkeyPatch, limit: tuple[int, int], serves: bool
) -> None:
    """Seen: 1,100 idle connections used up node 0's 1024 descriptors; its start waited 120 s and blamed nobody.

    The server takes every descriptor the system allows (its soft limit raised to the hard one); where that
    is not enough it says so at once, naming the connections, instead of retrying its own check-in.
    """
    import resource
    import subprocess

    from conformance.nodes import store_server
    from conformance.nodes.store import listening_socket

    popen = subprocess.Popen

    def limited(*args: Any, **kwargs: Any) -> Any:
        return popen(*args, **kwargs, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))

    monkeypatch.setattr(store_server.subprocess, "Popen", limited)
    listening = listening_socket("127.0.0.1", 0)
    port = listening.getsockname()[1]
    strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(STRANGERS_CONNECTIONS)]
    try:
        if serves:
            StoreServer.start(listening, "127.0.0.1", port, 60.0).close()
            return
        begun = time.monotonic()
        with pytest.raises(RuntimeError) as failed:
            StoreServer.start(listening, "127.0.0.1", port, 60.0)
        assert time.monotonic() - begun < 60.0  # said once seen, not at the end of the allowance
        # the count is read as the server meets its limit: one descriptor may be between close and reuse
        said = re.fullmatch(
            r"its store server cannot serve: it holds (\d+) of the 100 connections and files its limit allows "
            r"\(RLIMIT_NOFILE\): clients not of this run keep connections to the run's port open",
            str(failed.value),
        )
        assert said is not None and 90 <= int(said[1]) <= 100, str(failed.value)
    finally:
        for stranger in strangers:
            stranger.close()


# -- the token itself -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "strong"),
    [
        ("gpu7", False),  # guessed offline in 1-3 s before
        ("correct-horse", False),
        ("a" * 64, False),  # long, one character
        ("abcabcabcabcabcabcabcabcabcabcabcabcabcabc", False),
        ("conformanceconformanceconformance", False),  # a word repeated: long, yet a few bits
        ("0123456789012345678901234567890123456789", False),  # a sequence repeated
        ("Password123!Password123!", False),
        ("correct-horse-battery-staple-tr0ub4dor", False),  # dictionary words: zxcvbn counts them as words
        ("7f9c2ba4e88f827d616045507605853e", False),  # 128 random bits in 32 hex digits: zxcvbn counts 106
        ("7f9c2ba4e88f827d616045507605853e2a1c9b0d4e7f6a8b3c5d1e9f0a2b4c6d", True),  # openssl rand -hex 32
        ("mK3_pQv8Zr-1xYt0Lw9NaEo4Uj7sHd2GbCf5Vi6ReTk", True),  # python -m conformance token's kind
    ],
    ids=[
        "gpu7",
        "a-phrase",
        "one-character",
        "a-pattern",
        "a-word-repeated",
        "a-sequence-repeated",
        "a-password-repeated",
        "dictionary-words",
        "hex-128-bits",
        "hex-256-bits",
        "token-urlsafe-32",
    ],
)
def test_a_short_or_guessable_token_is_refused_in_one_line_saying_how_to_make_one(
    tmp_path: Path, token: str, strong: bool
) -> None:
    assert (weak_token(token) is None) == strong
    if strong:
        assert estimated_bits(token) >= MIN_TOKEN_BITS
        return
    for given in ({"cli": {"run_token": token}}, {"env": {"CONFORMANCE_RUN_TOKEN": token}}):
        with pytest.raises(SettingError) as refused:
            resolve_with(tmp_path, **given)  # type: ignore[arg-type]
        message = str(refused.value)
        assert token not in message and "\n" not in message
        assert "is guessable" in message and "python -m conformance token --file FILE" in message


def test_a_token_file_others_can_read_or_write_or_another_user_owns_is_refused(tmp_path: Path) -> None:
    """As OpenSSH refuses a private key (authfile.c sshkey_perm_ok, auth.c safe_path)."""
    path = tmp_path / "run.token"
    path.write_text(new_token() + "\n")
    for mode in (0o644, 0o640, 0o604, 0o660, 0o606, 0o610):
        path.chmod(mode)
        assert token_file_refused(path) == (
            f"is open to group or others (mode {mode:04o}; like an ssh key it must be 0600 or 0400): chmod 600 it"
        )
        with pytest.raises(SettingError, match=r"run token file .* is open to group or others"):
            resolve_with(tmp_path, env={"CONFORMANCE_RUN_TOKEN_FILE": str(path)})
    for mode in (0o600, 0o400):
        path.chmod(mode)
        assert (
            resolve_with(tmp_path, env={"CONFORMANCE_RUN_TOKEN_FILE": str(path)}).run_token == path.read_text().strip()
        )
    if os.geteuid() == 0:  # another user's file (root may hand it over)
        os.chown(path, 65534, 65534)
        assert (token_file_refused(path) or "").startswith("is owned by uid 65534, not by this user (uid 0) or root")


def test_a_token_on_the_command_line_is_warned_about_and_the_environment_is_not(tmp_path: Path) -> None:
    token = new_token()
    warned = token_on_command_line(resolve_with(tmp_path, cli={"run_token": token}))
    assert warned is not None and token not in warned
    assert warned.startswith("the run token is on the command line (command-line option --run-token): any user")
    assert "/proc/PID/cmdline" in warned and "CONFORMANCE_RUN_TOKEN or --run-token-file" in warned
    assert token_on_command_line(resolve_with(tmp_path, env={"CONFORMANCE_RUN_TOKEN": token})) is None


def test_the_token_command_makes_a_strong_token_and_a_file_only_its_user_reads(tmp_path: Path) -> None:
    from conformance.cli.main import main

    path = tmp_path / "run.token"
    assert main(["token", "--file", str(path)]) == 0
    assert oct(path.stat().st_mode & 0o777) == oct(0o600) and token_file_refused(path) is None
    assert weak_token(path.read_text().strip()) is None
    assert main(["token", "--file", str(path)]) == 2  # never over a file already there


def test_a_run_across_nodes_without_a_way_to_sign_is_refused_before_it_hosts_anything() -> None:
    port = free_port()
    with pytest.raises(NodeGroupError, match=r"^a run across 2 nodes cannot sign .* or say --unsigned to run"):
        NodeGroup.connect(NodeSetup(2, 0, "127.0.0.1", port, "settings"), RENDEZVOUS, LIMITS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # nothing listens there: refused before the store was hosted


# Where the run's store is read at all, outside the handshake (which proves what it reads itself):
# the verified readers, and the public count of strangers turned away.
STORE_READERS = {"present", "_verified_in", "strangers"}
STORE_READS = {"get", "check", "compare_set", "multi_get", "wait", "list_keys", "queue_pop"}


def test_every_read_of_the_runs_store_outside_the_handshake_is_a_verified_one() -> None:
    """Found by walking the code, not by memory: any other reader would take a stranger's value as a node's."""
    import ast

    from conftest import REPO

    found = []
    for module in ("group.py", "liveness.py", "start_check.py", "store_server.py", "layout.py", "munge.py"):
        tree = ast.parse((REPO / "conformance" / "nodes" / module).read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            for call in [n for n in ast.walk(function) if isinstance(n, ast.Call)]:
                target = call.func
                if not isinstance(target, ast.Attribute) or target.attr not in STORE_READS:
                    continue
                receiver = ast.unparse(target.value)
                if any(word in receiver for word in ("store", "plain", "raw")):
                    found.append((module, function.name, ast.unparse(call)))
    outside = [place for place in found if place[1] not in STORE_READERS]
    assert found and not outside, outside
