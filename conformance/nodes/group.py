"""The nodes of a multi-node run, meeting through the one TCPStore that node 0's pytest hosts.

Keys of the run's store:

    identity, nonce, rank_holder/<k>                   which run the store serves; its nonce; which pytest is node k
    run_id, fingerprint/<k>, check, check_read/<k>   the start: node 0 judges every node's fingerprint
    collection/<k>, collection_check, collection_read/<k>   the same tests in the same order everywhere
    heartbeat/<k>, at/<k>                              each node's monitor thread: alive, and in which test
    case/<id>/arrived/<k>, case/<id>/verdict/<k>       one cross-node case; its ranks use case/<id>/ranks
    first_pass/<ladder key>/<k>                        a first-pass node pair's verdict, for the re-checks
    results/<k>, status/<k>, finished/<k>              each node's records and exit status, gathered by node 0
    outcome, outcome_read/<k>                          node 0's list of failed nodes: the run fails on every node

A node that never arrives, stops beating or ends its run early is a :class:`NodeProblem`: the case
that waited for it becomes a ``hang`` naming it, and later cases know at once.

The rendezvous is logged (logger ``conformance.nodes``; ``--log-cli-level=INFO`` shows it): the
store hosted or joined, each node heard, every wait for a node and what it ended with, the results
gathered.  The waits of each cross-node case are at DEBUG.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.nodes.layout import Fingerprint, FingerprintCheck, NodeSetup, compare_fingerprints, shared_interfaces

log = logging.getLogger("conformance.nodes")
HEARTBEAT_SECONDS = 0.5
IDENTITY_KEY = "identity"  # node 0's run, as its launcher names it
NONCE_KEY = "nonce"  # node 0's random number for this run: the run token's signing key is derived with it
LIVENESS_KEY = "liveness"  # the port of node 0's liveness listener (class Liveness)
DIED_KEY = "died"  # died/<k>: node 0 saw node k's connection close without its end
RANK_HOLDER_KEY = "rank_holder"  # rank_holder/<k>: the host and pid of the pytest that is node k
STRANGER_COUNT_KEY = "stranger"  # how many nodes of other runs were turned away; each under stranger/<n>
BY_HAND = "a run started by hand without --run-token"
POLL_SECONDS = 0.1
ACK_WAIT = 5.0  # node 0 keeps its store up this long for the others to read a fatal check
OUTCOME_KEY = "outcome"  # node 0's list of the nodes that failed, once every node's status is in


class NodeGroupError(RuntimeError):
    """The run cannot go on across nodes (node 0 cannot host the store, the nodes disagree)."""


@dataclass(frozen=True)
class NodeProblem:
    node: int
    reason: str


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


@dataclass(frozen=True)
class Gathered:
    """What node 0 holds of the other nodes at the end."""

    records: dict[int, list[str]]  # node -> its records, one JSON line each
    statuses: dict[int, int]  # node -> its pytest's exit status
    gone: dict[int, str]  # node -> why nothing came from it


@dataclass(frozen=True)
class StartCheck:
    run_id: str
    check: FingerprintCheck | None  # None: no other node arrived to compare with
    missing: Mapping[int, str]
    interfaces: tuple[str, ...]

    @property
    def fatal_text(self) -> str:
        if self.check is None or self.check.ok:
            return ""
        fields = ", ".join(self.check.fatal)
        table = "\n".join(self.check.table)
        return f"the nodes differ in what must match ({fields}); stopping before any collective:\n{table}"


def open_store(setup: NodeSetup, host: bool, timeout: float) -> Any:
    """The run's store: node 0 hosts it unless the launcher does; under the run's prefix when it has one."""
    import torch.distributed as dist

    serves = host and not setup.launcher_hosts_store
    # torch's TCPStore server given only a port listens on every interface (``*:port``), whatever the
    # address the run uses; a socket bound here to that address alone is handed over to it instead.
    listening = listening_socket(setup.master_addr or "", setup.master_port or 0).detach() if serves else None
    store = dist.TCPStore(  # type: ignore[attr-defined]
        setup.master_addr or "",
        setup.master_port or 0,
        is_master=serves,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
        master_listen_fd=listening,
    )
    return dist.PrefixStore(setup.store_prefix, store) if setup.store_prefix else store  # type: ignore[attr-defined]


def listening_socket(address: str, port: int) -> socket.socket:
    """A socket listening on ``address`` alone (port 0: one the kernel picks); RuntimeError naming why not."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        bound = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as exc:
        raise RuntimeError(f"cannot listen on {address}:{port}: {exc}") from None
    try:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind(where)
        bound.listen(socket.SOMAXCONN)
    except OSError as exc:
        bound.close()
        why = exc.strerror or exc
        raise RuntimeError(
            f"cannot listen on {where[0]}:{port} ({why}): is {address!r} this node's own address?"
        ) from None
    return bound


class ForgedValue(ValueError):
    """A value of the run's store that does not verify with the run token: not written by a node of this run."""


SIGNATURE = b"\n#hmac-sha256:"


class SignedStore:
    """The run's store with every value signed, where the run has a token (``--run-token``).

    A value is stored as itself, then ``SIGNATURE`` and the hex HMAC-SHA256 of its key and itself
    under a key derived from the run token and node 0's nonce for the run (a fresh random one per
    run, so a value of one run never verifies in another).  The token itself is never stored.
    Without a token, values are stored as they are.  Counters (``add``), key checks and the public
    keys (which run the store serves, the strangers turned away) are not signed.
    """

    def __init__(self, store: Any, token: str | None) -> None:
        self.raw = store
        self.token = token
        self._key: bytes | None = None

    def use_nonce(self, nonce: str) -> None:
        if self.token is not None:
            self._key = hmac.new(self.token.encode(), f"conformance run {nonce}".encode(), hashlib.sha256).digest()

    def _signature(self, key: str, value: bytes) -> bytes:
        assert self._key is not None  # set before any signed value is written or read
        return hmac.new(self._key, key.encode() + b"\0" + value, hashlib.sha256).hexdigest().encode()

    def _signed(self, key: str, value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else value
        return data + SIGNATURE + self._signature(key, data) if self.token is not None else data

    def _verified(self, key: str, stored: bytes) -> bytes:
        if self.token is None:
            return stored
        data, mark, signature = stored.rpartition(SIGNATURE)
        if not mark or not hmac.compare_digest(signature, self._signature(key, data)):
            raise ForgedValue(
                f"{key}: its value does not verify with the run token (not written by a node of this run)"
            )
        return data

    def set(self, key: str, value: str | bytes) -> None:
        self.raw.set(key, self._signed(key, value))

    def get(self, key: str) -> bytes:
        return self._verified(key, self.raw.get(key))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self._verified(key, self.raw.compare_set(key, expected, self._signed(key, desired)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class StoreUnanswered(RuntimeError):
    """Node 0's store did not answer a call within its bound: this node has lost it."""


class BoundedStore:
    """The main thread's client of the run's store, every call bounded by ``limit`` seconds.

    torch's TCPStore client waits in its socket until TCP gives up (about 15 minutes with Linux's
    default tcp_retries2) when the link to node 0 is cut and stays down: its own timeout bounds only
    the waits for a key.  A call that does not return in time leaves its thread behind (a daemon)
    and this client for good: every later call fails at once, and the node goes on without node 0.
    """

    def __init__(self, store: Any, limit: float) -> None:
        self.raw = store
        self.limit = limit
        self.dead = ""

    def call(self, operation: Callable[[], Any], limit: float | None = None) -> Any:
        """``operation`` on the store, or StoreUnanswered after ``limit`` (default: the bound) seconds."""
        if self.dead:
            raise StoreUnanswered(self.dead)
        bound = self.limit if limit is None else limit
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = operation()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as the store's own error
                outcome["error"] = exc

        worker = threading.Thread(target=run, name="conformance-store-call", daemon=True)
        worker.start()
        worker.join(bound)
        if worker.is_alive():
            self.dead = f"its store did not answer for {bound:g}s"
            raise StoreUnanswered(self.dead)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.raw, name)
        return lambda *args, **kwargs: self.call(lambda: method(*args, **kwargs))


def _unresolved(name: str) -> str:
    """Why ``name`` does not resolve to an address ("" when it does)."""
    try:
        socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        return str(exc)
    return ""


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


def _hold_liveness(address: str, port: int, me: int) -> socket.socket | None:
    """A connection to node 0's liveness listener (None where it cannot be made: heartbeats decide)."""
    try:
        connection = socket.create_connection((address, port), timeout=10)
        connection.sendall(f"node {me}\n".encode())
    except OSError as exc:
        log.info("node %d: no liveness connection to node 0 (%s): its heartbeat alone tells", me, exc)
        return None
    return connection


class NodeGroup:
    """A node's part in a multi-node run: the store, the heartbeats, the meeting points."""

    def __init__(self, setup: NodeSetup, timeout: float, limits: GroupLimits, store: Any, lost: str = "") -> None:
        self.setup = setup
        self.me = setup.node_rank
        self.others = [n for n in range(setup.nnodes) if n != self.me]
        self.timeout = timeout
        self.progress_limit = limits.progress  # how long a node may stay in one test before it counts as stuck
        self.store_limit = limits.store  # how long node 0's store may leave a call unanswered
        self.signed = SignedStore(store, setup.run_token)
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

    @classmethod
    def connect(cls, setup: NodeSetup, timeout: float, limits: GroupLimits) -> NodeGroup:
        """Node 0 starts the store; the others connect to it, waiting up to ``timeout``."""
        host = setup.node_rank == 0
        where = f"{setup.master_addr}:{setup.master_port}"
        unresolved = _unresolved(setup.master_addr or "")
        if unresolved:  # else torch's store client retries the name for about twice the timeout
            address = f"node 0's address {setup.master_addr!r} ({setup.source})"
            raise NodeGroupError(f"{address} does not resolve: {unresolved}")
        me = setup.node_rank
        hosts = host and not setup.launcher_hosts_store
        log.info("node %d: %s the run's store at %s (%s)", me, "hosting" if hosts else "joining", where, setup.source)
        try:
            store = open_store(setup, host, timeout)
        except RuntimeError as exc:
            if host:
                raise NodeGroupError(f"node 0 cannot host the run's store on {where}: {exc}") from None
            lost = f"node 0's store at {where} never answered within {timeout:g}s (rendezvous deadline)"
            log.info("node %d: %s", me, lost)
            return cls(setup, timeout, limits, None, lost)
        log.info("node %d: %s the run's store at %s", me, "started" if hosts else "joined", where)
        group = cls(setup, timeout, limits, store)
        try:
            refusal = group._present_identity(where)
        except RuntimeError as exc:  # the store's own error: node 0 never said which run its store serves
            group.lose(exc)
            return group
        if refusal:
            log.info("node %d: %s", me, refusal)
            raise NodeGroupError(refusal)
        group._start_monitor()
        return group

    def _present_identity(self, where: str) -> str:
        """Node 0 says which run its store serves; another node joins only the same run ("": it does).

        A node of another job that reaches the same address and port (shared nodes) leaves its name
        under ``stranger/<n>`` for node 0 to report, and joins nothing: no key, no record of it enters.
        The store's errors (RuntimeError) are the caller's.
        """
        mine = self.setup.identity or BY_HAND
        plain = self.signed.raw  # which run this is, and who was turned away: public, not signed
        if self.me == 0:
            nonce = secrets.token_hex(16)
            self.store.call(lambda: plain.set(NONCE_KEY, nonce))
            self.signed.use_nonce(nonce)
            self.liveness = Liveness(self.setup.master_addr or "")
            self.store.set(LIVENESS_KEY, str(self.liveness.port))
            self.store.call(lambda: plain.set(IDENTITY_KEY, mine))
            return self._claim_rank()
        # node 0 may come later than this node where the launcher hosts the store: the rendezvous deadline
        theirs = self.store.call(lambda: plain.get(IDENTITY_KEY), self.timeout + ACK_WAIT).decode()
        if theirs == mine:
            self.signed.use_nonce(self.store.call(lambda: plain.get(NONCE_KEY)).decode())
            refusal = self._claim_rank()
            port = self._verified(LIVENESS_KEY)
            if not refusal and port is not None and port.isdigit():  # only the pytest that holds the rank
                self._held = _hold_liveness(self.setup.master_addr or "", int(port), self.me)
            return refusal
        number = self.store.add(STRANGER_COUNT_KEY, 1)
        stranger = f"{mine}, node {self.me}, host {socket.gethostname()}"
        self.store.call(lambda: plain.set(f"{STRANGER_COUNT_KEY}/{number}", stranger))
        return (
            f"node 0's store at {where} serves another run ({theirs}), not this one ({mine}): this node does not "
            "join it; give each job its own --master-port"
        )

    def _claim_rank(self) -> str:
        """Take this node's rank in the run, or say who has it ("": taken).

        ``compare_set`` with an expected "" sets the key only where nobody has (torch's TCPStore), so
        of two pytests given one node rank exactly one holds it.
        """
        mine = f"host {socket.gethostname()} (pid {os.getpid()})"
        try:
            holder = self.store.compare_set(f"{RANK_HOLDER_KEY}/{self.me}", "", mine).decode()
        except ForgedValue as exc:
            return f"node rank {self.me} cannot be taken: {exc}"
        if holder == mine:
            return ""
        return (
            f"node rank {self.me} is already taken by {holder}; this pytest ({mine}) was given the same node rank "
            f"({self.setup.source}): give each node its own"
        )

    def strangers(self) -> list[str]:
        """Nodes of other runs that reached this run's store and were turned away (node 0)."""
        if self.store is None or self.lost:
            return []
        count = self.store.add(STRANGER_COUNT_KEY, 0)
        plain = self.signed.raw
        return [
            self.store.call(lambda n=n: plain.get(f"{STRANGER_COUNT_KEY}/{n}")).decode() for n in range(1, count + 1)
        ]

    def _verified(self, key: str) -> str | None:
        """The value under ``key``, or None where it does not verify with the run token (dropped, and named)."""
        try:
            text: str = self.store.get(key).decode()
        except ForgedValue as exc:
            if str(exc) not in self.forged:
                self.forged.append(str(exc))
                log.warning("node %d: dropped %s", self.me, exc)
            return None
        return text

    # -- the heartbeat monitor ----------------------------------------------------------------
    def _start_monitor(self) -> None:
        self._monitor = threading.Thread(target=self._beat, name="conformance-node-monitor", daemon=True)
        self._monitor.start()

    def _beat(self) -> None:
        try:
            store = open_store(self.setup, False, self.timeout)  # its own connection: the main thread's is busy
            while True:
                store.add(f"heartbeat/{self.me}", 1)
                store.set(f"at/{self.me}", self._at)
                for node in self.others:
                    self._hear(node, store.add(f"heartbeat/{node}", 0), store)
                self._look_and_post(store)
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

    def lose(self, exc: BaseException, since: float | None = None) -> None:
        """Node 0's store is gone for this node: every wait ends at once, naming it and since when."""
        if not self.lost:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            when = time.strftime("%H:%M:%S", time.localtime(since if since is not None else time.time()))
            self.lost = f"node 0 unreachable since {when}: {first_line}"
            log.info("node %d: %s", self.me, self.lost)

    def _store_silent(self) -> None:
        """Lose node 0's store once the monitor's connection has gone unanswered past the bound."""
        if self.me == 0 or self._monitor is None or self.lost or self._stop.is_set():
            return
        silent = time.monotonic() - self._answered
        if silent > self.store_limit:
            self.lose(StoreUnanswered(f"its store did not answer for {silent:.0f}s"), time.time() - silent)

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

    def _overdue(self, node: int, since: float, limit: float, fixed: bool) -> NodeProblem | None:
        """Waited past ``limit``: from ``since`` when ``fixed``, else from the node's last change of test."""
        with self._lock:
            last = since if fixed else max(since, self.heard[node].moved)
        if time.monotonic() - last <= limit:
            return None
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
                found = self.problem(node) or self._overdue(node, since, limit, fixed)
                if found is not None:
                    log.debug("node %d: stopped waiting for node %d (%s): %s", self.me, node, keys[node], found.reason)
                    return found
            if pending:
                time.sleep(POLL_SECONDS)
        return None

    # -- the start ----------------------------------------------------------------------------
    def start(self, mine: Fingerprint, run_id: str) -> StartCheck:
        """Exchange fingerprints; node 0 compares them and every node acts on its one check."""
        if self.store is None:
            return StartCheck(run_id, None, {0: self.lost}, ())
        self.store.set(f"fingerprint/{self.me}", mine.to_json())
        if self.me == 0:
            return self._judge(mine, run_id)
        log.info("node %d: fingerprint sent; waiting up to %gs for node 0's start check", self.me, self.timeout)
        try:
            self.store.set_timeout(datetime.timedelta(seconds=self.timeout + ACK_WAIT))
            check = json.loads(self.store.call(lambda: self.signed.get("check"), self.timeout + 2 * ACK_WAIT))
            self.store.set(f"check_read/{self.me}", "1")
        except (RuntimeError, ForgedValue) as exc:
            self.lose(exc)
            return StartCheck(run_id, None, {0: self.lost}, ())
        missing = {int(n): reason for n, reason in check["missing"].items()}
        if self.me in missing:
            self.lost = f"this node arrived after node 0 had closed the rendezvous ({missing[self.me]})"
        self.gone.update({n: r for n, r in missing.items() if n != self.me})
        prints = [Fingerprint.from_json(text) for text in check["prints"]]
        result = StartCheck(check["run_id"], compare_fingerprints(prints), missing, tuple(check["interfaces"]))
        _log_start(self.me, prints, result)
        return result

    def _judge(self, mine: Fingerprint, run_id: str) -> StartCheck:
        deadline = time.monotonic() + self.timeout
        for node in self.others:
            log.info("node 0: waiting for node %d's fingerprint (rendezvous deadline %gs)", node, self.timeout)
            problem = self.wait_for({node: f"fingerprint/{node}"}, max(0.0, deadline - time.monotonic()), fixed=True)
            if problem is not None:  # one deadline for all: name it, not what was left of it
                self.gone[node] = f"node {node} never arrived within {self.timeout:g}s (rendezvous deadline)"
                log.info("node 0: %s", self.gone[node])
        texts = {n: self._verified(f"fingerprint/{n}") for n in self.others if n not in self.gone}
        self.gone.update({n: f"node {n}: dropped: {self.forged[-1]}" for n, text in texts.items() if text is None})
        arrived = [n for n, text in texts.items() if text is not None]
        prints = [mine, *(Fingerprint.from_json(texts[n] or "") for n in arrived)]
        interfaces = tuple(shared_interfaces(prints))
        check = {
            "run_id": run_id,
            "prints": [p.to_json() for p in prints],
            "missing": {str(n): reason for n, reason in self.gone.items()},
            "interfaces": list(interfaces),
        }
        self.store.set("check", json.dumps(check))
        result = StartCheck(run_id, compare_fingerprints(prints), dict(self.gone), interfaces)
        _log_start(0, prints, result)
        if result.fatal_text:  # the others must read the check before this store goes away
            self.wait_for({n: f"check_read/{n}" for n in arrived}, ACK_WAIT, fixed=True)
        return result

    def same_collection(self, nodeids: Sequence[str]) -> list[str]:
        """Node 0 compares every node's collected tests; the lines of differences (none: the same)."""
        if self.store is None or self.lost:
            return []
        self.store.set(f"collection/{self.me}", json.dumps(list(nodeids)))
        if self.me != 0:
            try:
                waiting = self.store.call(lambda: self.signed.get("collection_check"), self.timeout + 2 * ACK_WAIT)
                found = list(json.loads(waiting))
                self.store.set(f"collection_read/{self.me}", "1")
                return found
            except (RuntimeError, ForgedValue) as exc:
                self.lose(exc)
                return []
        arrived = [n for n in self.others if n not in self.gone]
        for node in arrived:
            problem = self.wait_for({node: f"collection/{node}"}, self.timeout, fixed=True)
            if problem is not None:
                self.gone[node] = problem.reason
        differences: list[str] = []
        for node in (n for n in arrived if n not in self.gone):
            text = self._verified(f"collection/{node}")
            if text is None:
                self.gone[node] = f"node {node}: dropped: {self.forged[-1]}"
                continue
            differences.extend(collection_difference(list(nodeids), json.loads(text), node))
        self.store.set("collection_check", json.dumps(differences))
        compared = [n for n in arrived if n not in self.gone]
        log.info("node 0: collections of nodes %s compared: %d line(s) of differences", compared, len(differences))
        if differences:  # the others must read it before this store goes away
            self.wait_for({n: f"collection_read/{n}" for n in arrived if n not in self.gone}, ACK_WAIT, fixed=True)
        return differences

    # -- cases --------------------------------------------------------------------------------
    def case_prefix(self, nodeid: str) -> str:
        """The store prefix of this run of ``nodeid``: the same on every node (same tests, same order)."""
        count = self._case_counts[nodeid] = self._case_counts.get(nodeid, 0) + 1
        return f"case/{nodeid}#{count}"

    def absent(self, nodes: Iterable[int]) -> NodeProblem | None:
        """A node of ``nodes`` already known to be gone (no case needs to wait for it)."""
        return next((found for node in nodes if (found := self._known_problem(node)) is not None), None)

    def meet(self, prefix: str, stage: str, nodes: Sequence[int], value: str, limit: float) -> NodeProblem | None:
        """Set this node's ``stage`` key of a case and wait for the other nodes' keys."""
        try:
            self.store.set(f"{prefix}/{stage}/{self.me}", value)
        except RuntimeError as exc:
            self.lose(exc)
        others = [n for n in nodes if n != self.me]
        problem = self.absent(others) or self.wait_for({n: f"{prefix}/{stage}/{n}" for n in others}, limit)
        if problem is not None:
            log.info("node %d: %s %s without node %d: %s", self.me, prefix, stage, problem.node, problem.reason)
        return problem

    def peers(self, prefix: str, nodes: Sequence[int]) -> CasePeers:
        return CasePeers(self, prefix, [n for n in nodes if n != self.me])

    def read(self, prefix: str, stage: str, nodes: Sequence[int]) -> dict[int, str]:
        found = {}
        for node in nodes:
            key = f"{prefix}/{stage}/{node}"
            try:
                if self.store.check([key]) and (text := self._verified(key)) is not None:
                    found[node] = text
            except RuntimeError as exc:
                self.lose(exc)
        return found

    # -- node pairs: the first pass, read by the re-checks ------------------------------------
    def publish_first_pass(self, case: str, verdict: str) -> None:
        """Post the verdict this node saw of a first-pass node pair (``case``: its ladder key), for the re-checks."""
        try:
            self.store.set(f"first_pass/{case}/{self.me}", verdict)
        except RuntimeError as exc:
            self.lose(exc)

    def first_pass_passed(self, case: str, pair: Sequence[int], limit: float) -> bool:
        """Whether a first-pass pair passed, waiting for its nodes' verdicts; a node gone fails it."""
        keys = {n: f"first_pass/{case}/{n}" for n in pair if n != self.me}
        if self.absent(pair) is not None or self.wait_for(keys, limit) is not None:
            return False
        verdicts = self.read("first_pass", case, pair)
        return len(verdicts) == len(pair) and all(v == "pass" for v in verdicts.values())

    # -- the end ------------------------------------------------------------------------------
    def publish_results(self, lines: Sequence[str], exit_status: int) -> str:
        """A node other than 0 hands its records and its exit status to node 0; returns what happened."""
        if self.store is None or self.lost:
            return f"records not sent to node 0: {self.lost}"
        try:
            self.store.set(f"results/{self.me}", "\n".join(lines))
            self.store.set(f"status/{self.me}", str(exit_status))
            self.store.set(f"finished/{self.me}", "1")
        except RuntimeError as exc:
            self.lose(exc)
            return f"records not sent to node 0: {self.lost}"
        log.info("node %d: sent %d record(s) to node 0", self.me, len(lines))
        return f"{len(lines)} records sent to node 0"

    def gather_results(self, waiting: Callable[[int], None]) -> Gathered:
        """Node 0 collects each node's records and exit status; nodes that are gone are named instead."""
        gathered: dict[int, list[str]] = {}
        statuses: dict[int, int] = {}
        for node in self.others:
            problem = self.absent([node])
            if problem is None and not self.store.check([f"results/{node}"]):
                waiting(node)
                log.info("node 0: waiting for node %d's records (it is at %s)", node, self.where(node))
                problem = self.wait_for({node: f"results/{node}"}, self.progress_limit)
            if problem is not None:
                self.gone.setdefault(node, problem.reason)
                log.info("node 0: no records from node %d: %s", node, self.gone[node])
                continue
            text, status = self._verified(f"results/{node}"), self._verified(f"status/{node}")
            if text is None or status is None:
                dropped = [key for key, value in (("results", text), ("status", status)) if value is None]
                self.gone[node] = f"its {' and '.join(dropped)} did not verify with the run token: dropped"
                continue
            gathered[node] = [line for line in text.splitlines() if line.strip()]
            statuses[node] = int(status)
            log.info("node 0: gathered %d record(s) from node %d (exit %d)", len(gathered[node]), node, statuses[node])
        return Gathered(gathered, statuses, dict(self.gone))

    def publish_outcome(self, failed: Sequence[str], readers: Iterable[int]) -> None:
        """Node 0 tells every node which nodes failed ("node 2: exit 1"), and keeps its store up for ``readers``."""
        self.store.set(OUTCOME_KEY, json.dumps(list(failed)))
        self.wait_for({n: f"{OUTCOME_KEY}_read/{n}" for n in readers}, ACK_WAIT, fixed=True)

    def run_outcome(self) -> list[str]:
        """The nodes that failed, as node 0 found them; node 0 gone before it said is itself a failure."""
        problem = self._known_problem(0) or self.wait_for({0: OUTCOME_KEY}, self.progress_limit)
        if problem is not None:
            return [f"node 0: no outcome of the run from it ({problem.reason})"]
        try:
            failed = json.loads(self.store.get(OUTCOME_KEY))
            self.store.set(f"{OUTCOME_KEY}_read/{self.me}", "1")
        except ForgedValue as exc:
            return [f"node 0: its outcome of the run was dropped ({exc})"]
        except RuntimeError as exc:
            self.lose(exc)
            return [f"node 0: no outcome of the run from it ({self.lost})"]
        return [str(line) for line in failed]

    def close(self) -> None:
        log.debug("node %d: leaving the run's store", self.me)
        if self._held is not None:  # this node's end, not its death
            try:
                self._held.sendall(b"bye\n")
            except OSError:
                pass
            self._held.close()
        if self.liveness is not None:
            self.liveness.close()
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=2 * HEARTBEAT_SECONDS + 1.0)
        self.store = None  # node 0: the server goes with its last reference


def _log_start(me: int, prints: Sequence[Fingerprint], start: StartCheck) -> None:
    """One line: who arrived, who did not, the interfaces they share and whether they may go on."""
    arrived = ", ".join(f"{p.node_rank} ({p.hostname})" for p in sorted(prints, key=lambda p: p.node_rank))
    verdict = f"differ in {', '.join(start.check.fatal)}" if start.check and start.check.fatal else "may go on"
    log.info(
        "node %d: start check: nodes %s arrived%s; shared interfaces: %s; %s",
        me, arrived, "".join(f", node {n} missing" for n in sorted(start.missing)),
        ", ".join(start.interfaces) or "none", verdict,
    )  # fmt: skip


@dataclass
class CasePeers:
    """The other nodes of one running case, as the watchdog sees them (``watchdog.Peers``)."""

    group: NodeGroup
    prefix: str
    others: list[int]

    def failed(self) -> bool:
        """A rank failed on another node, or another node is gone: what the monitor has seen, never a wait."""
        failed_there = self.group.watch([f"{self.prefix}/failed/{n}" for n in self.others])
        return failed_there or any(self.group.problem(n) is not None for n in self.others)

    def report_failure(self) -> None:
        self.group.post(f"{self.prefix}/failed/{self.group.me}")


def collection_difference(mine: Sequence[str], theirs: Sequence[str], node: int, shown: int = 5) -> list[str]:
    """What node ``node`` collected differently from node 0, as lines to show."""
    if list(mine) == list(theirs):
        return []
    mine_set, theirs_set = set(mine), set(theirs)
    only_here = [n for n in mine if n not in theirs_set]
    only_there = [n for n in theirs if n not in mine_set]
    lines = [f"node {node} collected {len(theirs)} tests, node 0 collected {len(mine)}"]
    lines += [f"  only on node 0: {n}" for n in only_here[:shown]]
    lines += [f"  only on node {node}: {n}" for n in only_there[:shown]]
    hidden = len(only_here) + len(only_there) - min(len(only_here), shown) - min(len(only_there), shown)
    if hidden > 0:
        lines.append(f"  ... and {hidden} more")
    if not only_here and not only_there:
        first = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b)
        lines.append(f"  same tests in another order; first difference at position {first + 1}: {mine[first]}")
    return lines
