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

The store itself (opened, signed, bounded) is :mod:`conformance.nodes.store`; the heartbeats, node
0's liveness listener and the waits that end when a node is gone are :mod:`conformance.nodes.liveness`.

The rendezvous is logged (logger ``conformance.nodes``; ``--log-cli-level=INFO`` shows it): the
store hosted or joined, each node heard, every wait for a node and what it ended with, the results
gathered.  The waits of each cross-node case are at DEBUG.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from conformance.nodes.layout import Fingerprint, FingerprintCheck, NodeSetup, compare_fingerprints, shared_interfaces
from conformance.nodes.liveness import HEARTBEAT_SECONDS, GroupLimits, GroupWatch, Liveness, NodeProblem, tampered
from conformance.nodes.munge import Munge, MungeError
from conformance.nodes.store import ForgedValue, host_store, open_store

log = logging.getLogger("conformance.nodes")
IDENTITY_KEY = "identity"  # node 0's run, as its launcher names it
NONCE_KEY = "nonce"  # node 0's random number for this run: the run token's signing key is derived with it
LIVENESS_KEY = "liveness"  # the port of node 0's liveness listener (class Liveness)
RANK_HOLDER_KEY = "rank_holder"  # rank_holder/<k>: the host and pid of the pytest that is node k
MUNGE_KEY = "munge"  # munge/<k>: node 0's MUNGE credential holding the run's key, for node k
STRANGER_COUNT_KEY = "stranger"  # how many nodes of other runs were turned away; each under stranger/<n>
BY_HAND = "a run started by hand without --run-token"
STRANGERS_NAMED = 5  # turned-away nodes named at the end; the rest are counted
# The most keys a run writes: the start's and the end's per node, and per test and node a case's meeting keys
# (arrived, verdict, failed, first pass) and those of torch's own process group for its ranks (gloo: a few a rank).
KEYS_BASE = 1000
KEYS_PER_TEST = 32
ACK_WAIT = 5.0  # node 0 keeps its store up this long for the others to read a fatal check
OUTCOME_KEY = "outcome"  # node 0's list of the nodes that failed, once every node's status is in


class NodeGroupError(RuntimeError):
    """The run cannot go on across nodes (node 0 cannot host the store, the nodes disagree)."""


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


def _loopback(name: str) -> bool:
    """Whether ``name`` resolves to loopback addresses only (127.0.0.0/8, ::1): no other host reaches it."""
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in found)


def _unresolved(name: str) -> str:
    """Why ``name`` does not resolve to an address ("" when it does)."""
    try:
        socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        return str(exc)
    return ""


def _hold_liveness(address: str, port: int, me: int) -> socket.socket | None:
    """A connection to node 0's liveness listener (None where it cannot be made: heartbeats decide)."""
    try:
        connection = socket.create_connection((address, port), timeout=10)
        connection.sendall(f"node {me}\n".encode())
    except OSError as exc:
        log.info("node %d: no liveness connection to node 0 (%s): its heartbeat alone tells", me, exc)
        return None
    return connection


class NodeGroup(GroupWatch):
    """A node's part in a multi-node run: the store, the heartbeats, the meeting points."""

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
        munge = Munge.find(os.environ) if setup.run_token is None and setup.slurm_job else None
        hosts = host and not setup.launcher_hosts_store
        log.info("node %d: %s the run's store at %s (%s)", me, "hosting" if hosts else "joining", where, setup.source)
        server = None
        try:
            server = host_store(setup, timeout) if hosts else None
            store = open_store(setup, timeout)
        except RuntimeError as exc:
            if server is not None:
                server.close()
            if host:
                raise NodeGroupError(f"node 0 cannot host the run's store on {where}: {exc}") from None
            lost = f"node 0's store at {where} never answered within {timeout:g}s (rendezvous deadline)"
            log.info("node %d: %s", me, lost)
            return cls(setup, timeout, limits, None, lost, munge)
        log.info("node %d: %s the run's store at %s", me, "started" if hosts else "joined", where)
        group = cls(setup, timeout, limits, store, munge=munge)
        group.server = server
        try:
            refusal = group._present_identity(where)
        except RuntimeError as exc:  # the store's own error: node 0 never said which run its store serves
            group.lose(exc)
            return group
        if refusal:
            log.info("node %d: %s", me, refusal)
            group.close()
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
            failed = self._hand_out_key(nonce)
            if failed:
                return failed
            self.liveness = Liveness(self.setup.master_addr or "")
            self.store.set(LIVENESS_KEY, str(self.liveness.port))
            self.store.call(lambda: plain.set(IDENTITY_KEY, mine))
            return self._claim_rank()
        # node 0 may come later than this node where the launcher hosts the store: the rendezvous deadline
        theirs = self.store.call(lambda: plain.get(IDENTITY_KEY), self.timeout + ACK_WAIT).decode()
        if theirs == mine:
            nonce = self.store.call(lambda: plain.get(NONCE_KEY)).decode()
            self.signed.use_nonce(nonce)
            refusal = self._take_key(nonce) or self._claim_rank()
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

    def _hand_out_key(self, nonce: str) -> str:
        """Node 0 under MUNGE: a random key for the run, in a credential for each other node ("": done)."""
        if self.munge is None:
            return ""
        key = secrets.token_bytes(32)
        ttl = int(self.timeout + 2 * ACK_WAIT)  # the others read theirs within the rendezvous deadline
        for node in self.others:
            payload = {"job": self.setup.slurm_job, "run": nonce, "node": node, "key": key.hex()}
            try:
                credential = self.munge.credential(payload, os.getuid(), ttl)
            except MungeError as exc:
                return f"node 0 cannot sign the run with MUNGE ({exc}): start munged, or give every node a run token"
            self.store.call(lambda n=node, c=credential: self.signed.raw.set(f"{MUNGE_KEY}/{n}", c))
        self.signed.use_key(key)
        return ""

    def _take_key(self, nonce: str) -> str:
        """A node under MUNGE: the run's key from its own credential, made by its user for its job ("": taken)."""
        if self.munge is None:
            return ""
        raw = self.signed.raw
        try:
            credential = self.store.call(lambda: raw.get(f"{MUNGE_KEY}/{self.me}"), self.timeout + ACK_WAIT).decode()
            uid, payload = self.munge.decoded(credential)
        except (MungeError, RuntimeError, UnicodeDecodeError) as exc:
            return f"node 0's MUNGE credential for node {self.me} cannot be used: {exc}"
        expected = {"job": self.setup.slurm_job, "run": nonce, "node": self.me}
        if uid != os.getuid() or any(payload.get(name) != value for name, value in expected.items()):
            return (
                f"node 0's MUNGE credential for node {self.me} is not of this job's user, job, run and node "
                f"(uid {uid}, {', '.join(f'{k} {payload.get(k)!r}' for k in expected)}): not taken"
            )
        try:
            self.signed.use_key(bytes.fromhex(str(payload.get("key", ""))))
        except ValueError:
            return f"node 0's MUNGE credential for node {self.me} holds no key: not taken"
        return ""

    @property
    def store_problems(self) -> tuple[str, ...]:
        """Node 0: keys or bytes beyond what this run writes (a client not of this run), its server's end."""
        found = []
        if self.key_bound is not None and self.most_keys > self.key_bound:
            found.append(
                f"a client not of this run wrote keys to node 0's store: it held {self.most_keys} keys, where this "
                f"run writes at most {self.key_bound}"
            )
        served = self.server.problem() if self.server is not None else None
        return (*found, served) if served else tuple(found)

    @property
    def unsigned(self) -> str | None:
        """Why a run across nodes beyond loopback cannot sign its values; None where it signs or stays local."""
        if self.signed.signs or not self.setup.multi_node or _loopback(self.setup.master_addr or ""):
            return None
        munge = "no MUNGE answering here (munge, munged)" if self.setup.slurm_job else "not under SLURM (no MUNGE)"
        return f"no run token (--run-token, CONFORMANCE_RUN_TOKEN or --run-token-file), {munge}"

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

    def strangers(self) -> tuple[list[str], int]:
        """Nodes of other runs turned away (node 0): the first few by name, and how many in all.

        The count is a public counter anyone may raise: only ``STRANGERS_NAMED`` names are read, each
        one checked before it is read, so a raised counter costs no wait.
        """
        if self.store is None or self.lost:
            return [], 0
        count = self.store.add(STRANGER_COUNT_KEY, 0)
        plain = self.signed.raw
        keys = [f"{STRANGER_COUNT_KEY}/{n}" for n in range(1, min(count, STRANGERS_NAMED) + 1)]
        found = [self.store.call(lambda k=k: plain.get(k)).decode(errors="replace") for k in keys
                 if self.store.check([k])]  # fmt: skip
        return found, count

    def _verified(self, key: str) -> str | None:
        """The value under ``key``, or None where it does not verify with the run's key (dropped, and named)."""
        try:
            text: str = self.store.get(key).decode()
        except ForgedValue as exc:
            if str(exc) not in self.forged:
                self.forged.append(str(exc))
                log.warning("node %d: dropped %s", self.me, exc)
            return None
        return text

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
            if problem is not None and problem.beats:  # alive: its key went missing
                self.gone[node] = tampered(node, f"fingerprint/{node}", self.timeout)
            elif problem is not None:  # one deadline for all: name it, not what was left of it
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
        self.key_bound = KEYS_BASE + KEYS_PER_TEST * len(nodeids) * self.setup.nnodes
        if self.server is not None:
            self.server.expect(len(nodeids), self.setup.nnodes)
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
                self.gone[node] = f"its {' and '.join(dropped)} did not verify with the run's key: dropped"
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
        self.store = None
        if self.server is not None:
            self.server.close()


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
