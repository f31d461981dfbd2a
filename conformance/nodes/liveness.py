"""Whether the other nodes of a multi-node run are still there: the heartbeats, node 0's listener, the waits.

Each node's monitor thread beats under ``heartbeat/<k>`` and says which test it is in under ``at/<k>``;
node 0's :class:`Liveness` listener tells a node that died (its connection closed without ``bye``) from a
link that is down, and posts ``died/<k>``.  A node that never arrives, stops beating or ends its run
early is a :class:`NodeProblem`, and every wait for it (:meth:`GroupWatch.wait_for`) ends naming it.
The meetings built on these waits are :class:`conformance.nodes.group.NodeGroup`'s.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.common.clock import wall_ago
from conformance.nodes.layout import NodeSetup
from conformance.nodes.munge import Munge
from conformance.nodes.store import BoundedStore, SignedStore, StoreUnanswered, listening_socket, open_store
from conformance.nodes.store_server import StoreServer

log = logging.getLogger("conformance.nodes")
HEARTBEAT_SECONDS = 0.5
DIED_KEY = "died"  # died/<k>: node 0 saw node k's connection close without its end
POLL_SECONDS = 0.1


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
    loses nothing.
    """

    def __init__(self, address: str) -> None:
        self.listener = listening_socket(address, 0)
        self.port: int = self.listener.getsockname()[1]
        self._died: set[int] = set()  # nodes whose connection closed without their "bye"
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, name="conformance-liveness", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed at the end of the run
            threading.Thread(target=self._follow, args=(connection,), daemon=True).start()

    def _follow(self, connection: socket.socket) -> None:
        with connection, connection.makefile("r") as lines:
            hello = lines.readline().split()
            if len(hello) != 2 or hello[0] != "node" or not hello[1].isdigit():
                return
            node = int(hello[1])
            said = lines.readline().strip()  # blocks until the node's end, or its death
        if said != "bye":
            with self._lock:
                self._died.add(node)

    def died(self, node: int) -> bool:
        with self._lock:
            return node in self._died

    def close(self) -> None:
        self.listener.close()


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
        self.signed = SignedStore(store, setup.run_token, signs=setup.run_token is not None or munge is not None)
        self.store: Any = BoundedStore(self.signed, limits.store) if store is not None else None
        self.forged: list[str] = []  # values dropped because they do not verify with the run token
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
            store = open_store(self.setup, self.timeout)  # its own connection: the main thread's is busy
            while True:
                store.add(f"heartbeat/{self.me}", 1)
                store.set(f"at/{self.me}", self._at)
                for node in self.others:
                    self._hear(node, store.add(f"heartbeat/{node}", 0), store)
                self._look_and_post(store)
                if self.me == 0:  # a client not of this run writing keys: counted, since keys cannot be listed
                    self.most_keys = max(self.most_keys, int(store.num_keys()))
                if self.server is not None:  # and its bytes, as the server grows
                    self.server.sample()
                self._answered = time.monotonic()
                if self._stop.wait(HEARTBEAT_SECONDS):
                    return
        except RuntimeError as exc:
            if not self._stop.is_set():
                self.lose(exc)

    def _look_and_post(self, store: Any) -> None:
        """The running case's keys, for the watchdog, which must never wait on the store itself; who died."""
        with self._lock:
            watched, posts, self._to_post = self._watched, self._to_post, []
        if self.liveness is not None:
            posts += [f"{DIED_KEY}/{n}" for n in self.others if self.liveness.died(n)]
        for key in posts:
            store.set(key, "1")
        found = {key for key in watched if store.check([key])}
        died = {n for n in self.others if store.check([f"{DIED_KEY}/{n}"])}
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

    def _hear(self, node: int, count: int, store: Any) -> None:
        at = store.get(f"at/{node}").decode() if store.check([f"at/{node}"]) else ""
        now = time.monotonic()
        with self._lock:
            heard = self.heard[node]
            first = count > 0 >= heard.count
            if count != heard.count:
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
            self.lost = f"node 0 unreachable since {when}: {first_line}"
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
                pending = {n: k for n, k in pending.items() if not self.store.check([k])}
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
