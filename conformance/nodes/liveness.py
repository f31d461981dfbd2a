"""Whether the other nodes of a multi-node run are still there: the heartbeats, node 0's listener, the waits.

Each node's monitor thread beats under ``heartbeat/<k>``: a count that only grows and the test the node
is in, signed, so a stranger's beat, or one of this run's beats replayed, moves nothing.  Node 0's
:class:`Liveness` listener tells a node that died (its connection closed without ``bye``) from a link
that is down, and posts ``died/<k>`` (signed); a connection counts only once it has answered a fresh
challenge with the run's key.  A node that never arrives, stops beating or ends its run early is a
:class:`NodeProblem`, and every wait for it (:meth:`GroupWatch.wait_for`) ends naming it; a value that
does not verify is dropped and named (:meth:`GroupWatch.dropped`), and waited past as if it were not
there.  The meetings built on these waits are :class:`conformance.nodes.group.NodeGroup`'s.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.common.clock import wall_ago
from conformance.common.outside_text import shown
from conformance.nodes.layout import NodeSetup
from conformance.nodes.munge import Munge
from conformance.nodes.store import (
    BoundedStore,
    ForgedValue,
    KeyUnknown,
    SignedStore,
    StoreUnanswered,
    listening_socket,
    open_store,
)
from conformance.nodes.store_server import StoreServer

log = logging.getLogger("conformance.nodes")
HEARTBEAT_SECONDS = 0.5
HEARTBEAT_KEY = "heartbeat"  # heartbeat/<k>: "<count> <the test node k is in>", signed; the count only grows
DIED_KEY = "died"  # died/<k>: node 0 saw node k's connection close without its end
POLL_SECONDS = 0.1
HELLO_SECONDS = 10.0  # a connection to node 0's liveness port has this long to answer its challenge
LINE_BYTES = 256  # the most of a line read from a connection to the liveness port
DROPPED_NAMED = 10  # values and connections not of this run named at the end; the rest are counted
GREETING_AT_ONCE = 32  # connections to the liveness port greeted at once; more are closed at once, counted
Prover = Callable[[str, int], str]  # (a challenge, a node) -> that node's answer with the run's key


@dataclass(frozen=True)
class NodeProblem:
    node: int
    reason: str
    beats: bool = False  # the node is alive (its heartbeat is heard): what is missing was not its absence


def tampered(node: int, key: str, limit: float) -> str:
    return (
        f"node {node} arrived (it beats) but its {key or 'key'} is not in the run's store after {limit:g}s: removed "
        f"by a client not of this run (tampering), or node {node} is stuck before writing it"
    )


@dataclass
class Heard:
    """What this node's monitor knows of another node."""

    count: int = -1
    beat: float = field(default_factory=time.monotonic)  # when its heartbeat last moved
    at: str = ""
    moved: float = field(default_factory=time.monotonic)  # when it last changed test


@dataclass(frozen=True)
class GroupLimits:
    progress: float  # how long a node may stay in one test before the others stop waiting for it
    store: float  # how long node 0's store may leave a call unanswered before it is lost


class Liveness:
    """Node 0's listener that tells a node that ended from a link that is down.

    Each other node holds one plain TCP connection to it and says ``bye`` before it closes it at its
    end.  A node whose pytest died (killed, crashed) has its connection closed by its kernel: node 0
    reads the end of the stream at once.  A cut link closes nothing: the node goes quiet, and only its
    heartbeat's silence past the store's bound makes it gone, so a link that comes back in time
    loses nothing.  A connection counts only once it has answered a fresh challenge with the run's
    key (``prove``; unsigned, any answer): a client not of this run that says "node 1" is dropped and
    named, and never makes node 1 dead.
    """

    def __init__(self, address: str, nodes: Sequence[int], prove: Prover | None, dropped: Callable[[str], None]):
        self.listener = listening_socket(address, 0)
        self.port: int = self.listener.getsockname()[1]
        self.nodes = frozenset(nodes)
        self.prove = prove
        self.dropped = dropped
        self._died: set[int] = set()  # nodes whose connection closed without their "bye"
        self._lock = threading.Lock()
        self._greeting = threading.BoundedSemaphore(GREETING_AT_ONCE)  # a flood of connections holds no more threads
        threading.Thread(target=self._serve, name="conformance-liveness", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, peer = self.listener.accept()
            except OSError:
                return  # closed at the end of the run
            if not self._greeting.acquire(blocking=False):
                connection.close()
                self.dropped(f"a connection to node 0's liveness port past {GREETING_AT_ONCE} unproven ones: closed")
                continue
            threading.Thread(target=self._follow, args=(connection, peer), daemon=True).start()

    def _follow(self, connection: socket.socket, peer: Any) -> None:
        with connection, connection.makefile("rb") as lines:
            try:
                node = self._greet(connection, lines, peer)
            finally:
                self._greeting.release()
            if node is None:
                return
            try:
                said = lines.readline(LINE_BYTES).strip()  # blocks until the node's end, or its death
            except OSError:
                said = b""
        if said != b"bye":
            with self._lock:
                self._died.add(node)

    def _greet(self, connection: socket.socket, lines: Any, peer: Any) -> int | None:
        """The node a new connection proves it is (None: dropped, and named, within HELLO_SECONDS)."""
        challenge = secrets.token_hex(16)
        connection.settimeout(HELLO_SECONDS)
        try:
            connection.sendall(f"challenge {challenge}\n".encode())
            hello = lines.readline(LINE_BYTES).decode(errors="replace").split()
        except OSError:
            hello = []
        node = int(hello[1]) if len(hello) == 3 and hello[0] == "node" and hello[1].isdigit() else None
        proven = node is not None and (
            self.prove is None or hmac.compare_digest(hello[2].encode(), self.prove(challenge, node).encode())
        )
        if node in self.nodes and proven:
            connection.settimeout(None)
            return node
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"
        claim = shown(" ".join(hello)[:60]) or "nothing"
        self.dropped(f"a connection from {where} to node 0's liveness port did not prove the run's key (it said "
                     f"{claim!r}): dropped")  # fmt: skip
        return None

    def died(self, node: int) -> bool:
        with self._lock:
            return node in self._died

    def close(self) -> None:
        self.listener.close()


def hold_liveness(address: str, port: int, me: int, prove: Prover | None) -> socket.socket | None:
    """A connection to node 0's liveness listener, its challenge answered (None where it cannot be made)."""
    try:
        connection = socket.create_connection((address, port), timeout=HELLO_SECONDS)
    except OSError as exc:
        log.info("node %d: no liveness connection to node 0 (%s): its heartbeat alone tells", me, exc)
        return None
    try:
        with connection.makefile("rb") as lines:
            said = lines.readline(LINE_BYTES).decode(errors="replace").split()
        if len(said) != 2 or said[0] != "challenge":
            raise OSError(f"it said {shown(' '.join(said)[:60])!r}, not a challenge")
        answer = prove(said[1], me) if prove is not None else "-"
        connection.sendall(f"node {me} {answer}\n".encode())
        connection.settimeout(None)
    except OSError as exc:
        connection.close()
        log.info("node %d: no liveness connection to node 0 (%s): its heartbeat alone tells", me, exc)
        return None
    return connection


class GroupWatch:
    """A node's watch over the other nodes: the heartbeat monitor, the problems it finds, the waits.

    It holds the state of the node's part in the run (the store, what it has heard of each node);
    :class:`conformance.nodes.group.NodeGroup` builds the run's meetings on it.
    """

    def __init__(
        self,
        setup: NodeSetup,
        timeout: float,
        limits: GroupLimits,
        store: Any,
        lost: str = "",
        munge: Munge | None = None,
    ) -> None:
        self.setup = setup
        self.munge = munge  # under SLURM without a token: MUNGE hands out the run's key
        self.me = setup.node_rank
        self.others = [n for n in range(setup.nnodes) if n != self.me]
        self.timeout = timeout
        self.progress_limit = limits.progress  # how long a node may stay in one test before it counts as stuck
        self.store_limit = limits.store  # how long node 0's store may leave a call unanswered
        self.signed = SignedStore(store, signs=setup.run_token is not None or munge is not None)
        self.store: Any = BoundedStore(self.signed, limits.store) if store is not None else None
        self._dropped: list[str] = []  # values and connections not of this run, dropped: the first few named
        self._dropped_count = 0
        self.answer_hellos: Callable[[Any, list[int], Callable[[str], None]], None] | None = None  # node 0's
        self.liveness: Liveness | None = None  # node 0: who ended, who died
        self._held: socket.socket | None = None  # the others: their connection to node 0's liveness
        self.lost = lost  # why node 0's store cannot be reached, once it cannot
        self._answered = time.monotonic()  # when the monitor's last round through the store ended
        self._watched: tuple[str, ...] = ()  # keys the monitor looks for (the running case's failures)
        self._seen: set[str] = set()
        self._to_post: list[str] = []  # keys the monitor sets (this node's failure in the running case)
        self._died: set[int] = set()  # nodes node 0 saw die (its died/<k> keys, read by the monitor)
        self.gone: dict[int, str] = {}
        self.heard = {n: Heard() for n in self.others}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._at = ""
        self._monitor: threading.Thread | None = None
        self._case_counts: dict[str, int] = {}
        self.key_bound: int | None = None  # node 0: the most keys this run's protocol writes (known once collected)
        self.most_keys = 0  # node 0: the most keys its monitor saw the store hold
        self.server: StoreServer | None = None  # node 0, unless the launcher hosts the store

    # -- the heartbeat monitor ----------------------------------------------------------------
    def _start_monitor(self) -> None:
        self._monitor = threading.Thread(target=self._beat, name="conformance-node-monitor", daemon=True)
        self._monitor.start()

    def _beat(self) -> None:
        try:
            raw = open_store(self.setup, self.timeout)  # its own connection: the main thread's is busy
            store, count = self.signed.over(raw), 0
            while True:
                count += 1
                store.set(f"{HEARTBEAT_KEY}/{self.me}", f"{count} {self._at}")
                for node in self.others:
                    self._hear(node, store)
                self._look_and_post(store)
                if self.answer_hellos is not None:  # node 0: whoever says hello as a node of the run
                    self.answer_hellos(raw, self.others, self.dropped)
                if self.me == 0:  # a client not of this run writing keys: counted, since keys cannot be listed
                    self.most_keys = max(self.most_keys, int(store.num_keys()))
                if self.server is not None:  # and its bytes, as the server grows
                    self.server.sample()
                self._answered = time.monotonic()
                if self._stop.wait(HEARTBEAT_SECONDS):
                    return
        except (RuntimeError, KeyUnknown) as exc:
            if not self._stop.is_set():
                self.lose(exc)

    def dropped(self, what: str) -> None:
        """A value or a connection not of this run, dropped: named (the first ``DROPPED_NAMED``), else counted."""
        with self._lock:
            self._dropped_count += 1
            if what in self._dropped or len(self._dropped) >= DROPPED_NAMED:
                return
            self._dropped.append(what)
        log.warning("node %d: dropped %s", self.me, what)

    @property
    def forged(self) -> list[str]:
        """What was dropped as not of this run, one line each, the count of the rest last."""
        with self._lock:
            named, more = list(self._dropped), self._dropped_count - len(self._dropped)
        return [*named, *([f"{more} more values or connections not of this run"] if more > 0 else [])]

    def _verified_in(self, store: Any, key: str) -> str | None:
        """The value under ``key`` if it is there and verifies; a value that does not is dropped and named."""
        if not store.check([key]):
            return None
        try:
            return str(store.get(key).decode(errors="replace"))
        except ForgedValue as exc:
            self.dropped(str(exc))
            return None

    def _look_and_post(self, store: Any) -> None:
        """The running case's keys, for the watchdog, which must never wait on the store itself; who died."""
        with self._lock:
            watched, posts, self._to_post = self._watched, self._to_post, []
        if self.liveness is not None:
            posts += [f"{DIED_KEY}/{n}" for n in self.others if self.liveness.died(n)]
        for key in posts:
            store.set(key, "1")
        found = {key for key in watched if self._verified_in(store, key) is not None}
        died = {n for n in self.others if self._verified_in(store, f"{DIED_KEY}/{n}") is not None}
        with self._lock:
            self._seen |= found
            self._died |= died

    def watch(self, keys: Sequence[str]) -> bool:
        """Have the monitor look for ``keys``; whether it has seen one of them."""
        with self._lock:
            self._watched = tuple(keys)
            return any(key in self._seen for key in keys)

    def post(self, key: str) -> None:
        """Have the monitor set ``key`` at its next round."""
        with self._lock:
            self._to_post.append(key)

    def _hear(self, node: int, store: Any) -> None:
        """Node ``node``'s heartbeat: it moved only where its count grew (a beat replayed is no beat)."""
        beat = self._verified_in(store, f"{HEARTBEAT_KEY}/{node}")
        number, _, at = (beat or "").partition(" ")
        count = int(number) if number.isdigit() else -1
        now = time.monotonic()
        with self._lock:
            heard = self.heard[node]
            if count <= heard.count:
                return
            first = heard.count <= 0
            heard.count, heard.beat = count, now
            if at != heard.at:
                heard.at, heard.moved = at, now
                log.debug("node %d: node %d is at %s", self.me, node, at or "its start")
        if first:
            log.info("node %d: heard node %d (its first heartbeat)", self.me, node)

    def lose(self, exc: BaseException, silent: float = 0.0) -> None:
        """Node 0's store is gone for this node (silent for ``silent`` seconds): every wait ends at once, naming it."""
        if not self.lost:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            when = time.strftime("%H:%M:%S", time.localtime(wall_ago(silent)))
            self.lost = f"node 0's store unreachable since {when}: {first_line}"
            log.info("node %d: %s", self.me, self.lost)

    def _store_silent(self) -> None:
        """Lose node 0's store once the monitor's connection has gone unanswered past the bound."""
        if self.me == 0 or self._monitor is None or self.lost or self._stop.is_set():
            return
        silent = time.monotonic() - self._answered
        if silent > self.store_limit:
            self.lose(StoreUnanswered(f"its store did not answer for {silent:.0f}s"), silent)

    def now_at(self, nodeid: str) -> None:
        """Tell the other nodes which test this node is in."""
        self._at = nodeid

    def where(self, node: int) -> str:
        with self._lock:
            at = self.heard[node].at if node in self.heard else ""
        return at or "its start"

    def present(self, key: str) -> str | None:
        """The main thread's read of ``key``: its value where it is there and verifies, else None.

        A value that does not verify is dropped and named, and is as good as absent: a wait for the
        key goes on to its own deadline.  The store's own errors (RuntimeError) are the caller's.
        """
        if self.store is None:
            raise StoreUnanswered(self.lost or "no store")
        if not self.store.check([key]):
            return None
        try:
            return str(self.store.get(key).decode(errors="replace"))
        except ForgedValue as exc:
            self.dropped(str(exc))
            return None

    # -- problems ---------------------------------------------------------------------------
    def _known_problem(self, node: int) -> NodeProblem | None:
        """Node 0's store lost, or ``node`` already found gone."""
        self._store_silent()
        if self.lost:
            return NodeProblem(0, self.lost)
        if node in self.gone:
            return NodeProblem(node, self.gone[node])
        return None

    def problem(self, node: int) -> NodeProblem | None:
        """Why ``node`` cannot take part any more, if it cannot."""
        known = self._known_problem(node)
        if known is not None:
            return known
        with self._lock:
            heard = self.heard[node]
            silent = time.monotonic() - heard.beat if heard.count > 0 else 0.0  # never beat yet: deadlines decide
            died = node in self._died
        if died or (self.liveness is not None and self.liveness.died(node)):
            where = f"at {self.where(node)}"
            self.gone[node] = f"node {node} ended without its end of the run (killed or crashed {where})"
        elif silent > self.store_limit:  # quiet, not ended: a link down this long, or a frozen node
            self.gone[node] = (
                f"node {node} stopped answering: no heartbeat for {silent:.0f}s (last at {self.where(node)})"
            )
        else:
            return None
        log.info("node %d: %s", self.me, self.gone[node])
        return NodeProblem(node, self.gone[node])

    def _overdue(self, node: int, since: float, limit: float, fixed: bool, key: str = "") -> NodeProblem | None:
        """Waited past ``limit``: from ``since`` when ``fixed``, else from the node's last change of test."""
        with self._lock:
            last = since if fixed else max(since, self.heard[node].moved)
            beats = self.heard[node].count > 0
        if time.monotonic() - last <= limit:
            return None
        if fixed and beats:  # alive, yet what it writes first is not there: removed by a client not of this run
            return NodeProblem(node, tampered(node, key, limit), beats=True)
        if fixed:
            return NodeProblem(node, f"node {node} never arrived within {limit:g}s (rendezvous deadline)")
        return NodeProblem(node, f"node {node} did not get there within {limit:g}s; it is at {self.where(node)}")

    def wait_for(self, keys: Mapping[int, str], limit: float, fixed: bool = False) -> NodeProblem | None:
        """Wait until every node's key is set, or a node is gone or stuck.

        ``limit`` counts from the last time the node changed test, so a node busy with other cases
        is waited for; ``fixed`` counts it from now (the start, where nobody has moved yet).
        """
        since = time.monotonic()
        pending = dict(keys)
        for node, key in sorted(pending.items()):
            log.debug("node %d: waiting up to %gs for node %d (%s)", self.me, limit, node, key)
        while pending:
            try:
                pending = {n: k for n, k in pending.items() if self.present(k) is None}
            except RuntimeError as exc:
                self.lose(exc)
            for node in sorted(pending):
                found = self.problem(node) or self._overdue(node, since, limit, fixed, keys[node])
                if found is not None:
                    log.debug("node %d: stopped waiting for node %d (%s): %s", self.me, node, keys[node], found.reason)
                    return found
            if pending:
                time.sleep(POLL_SECONDS)
        return None
