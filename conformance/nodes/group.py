"""The nodes of a multi-node run, meeting through the one TCPStore that node 0's pytest hosts.

Keys of the run's store (how a node joins, the identity and the proofs: :mod:`conformance.nodes.handshake`):

    liveness                                         the port of node 0's liveness listener
    run_id, fingerprint/<k>, check, check_read/<k>   the start: node 0 judges every node's fingerprint
    collection/<k>, collection_check, collection_read/<k>   the same tests in the same order everywhere
    heartbeat/<k>, died/<k>                            each node's monitor thread: alive, and in which test
    case/<id>/arrived/<k>, case/<id>/verdict/<k>       one cross-node case; its ranks use case/<id>/ranks
    first_pass/<ladder key>/<k>                        a first-pass node pair's verdict, for the re-checks
    results/<k>, status/<k>, finished/<k>              each node's records and exit status, gathered by node 0
    outcome, outcome_read/<k>                          node 0's list of failed nodes: the run fails on every node

Every one of these is signed where the run signs (a run token, or MUNGE under SLURM); a value that does
not verify is dropped and named, never read as a node's.  A run that cannot sign is refused unless
``--unsigned`` says so, and then says UNSIGNED on every node.  What is read is parsed by the bounded
reader (``common/bounded_parse.py``) and checked for its shape: a value that is not, is dropped and named.

A node that never arrives, stops beating or ends its run early is a :class:`NodeProblem`: the case
that waited for it becomes a ``hang`` naming it, and later cases know at once.  Node 0's store lost
(its server killed, the link cut) ends every wait at once, naming it, and every node still answers.

The store itself (opened, signed, bounded) is :mod:`conformance.nodes.store`; the heartbeats, node
0's liveness listener and the waits that end when a node is gone are :mod:`conformance.nodes.liveness`.

The rendezvous is logged (logger ``conformance.nodes``; ``--log-cli-level=INFO`` shows it): the
store hosted or joined, each node heard, every wait for a node and what it ended with, the results
gathered.  The waits of each cross-node case are at DEBUG.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from conformance.common.outside_text import shown
from conformance.nodes.handshake import ACK_WAIT, STRANGER_COUNT_KEY, STRANGER_TEXT, Handshake
from conformance.nodes.layout import Fingerprint, NodeSetup, compare_fingerprints, shared_interfaces
from conformance.nodes.liveness import (
    HEARTBEAT_SECONDS,
    GroupLimits,
    GroupWatch,
    Liveness,
    NodeProblem,
    hold_liveness,
    tampered,
)
from conformance.nodes.munge import Munge
from conformance.nodes.start_check import StartCheck, Unreadable, read_check, read_fingerprint, read_text_list
from conformance.nodes.store import KeyUnknown, host_store, open_store

log = logging.getLogger("conformance.nodes")
LIVENESS_KEY = "liveness"  # the port of node 0's liveness listener (class Liveness)
STRANGERS_NAMED = 5  # turned-away nodes named at the end; the rest are counted
# The most keys a run writes: the start's and the end's per node, and per test and node a case's meeting keys
# (arrived, verdict, failed, first pass) and those of torch's own process group for its ranks (gloo: a few a rank).
KEYS_BASE = 1000
KEYS_PER_TEST = 32
OUTCOME_KEY = "outcome"  # node 0's list of the nodes that failed, once every node's status is in


class NodeGroupError(RuntimeError):
    """The run cannot go on across nodes (node 0 cannot host the store, the nodes disagree, it cannot sign)."""


@dataclass(frozen=True)
class Gathered:
    """What node 0 holds of the other nodes at the end."""

    records: dict[int, list[str]]  # node -> its records, one JSON line each
    statuses: dict[int, int]  # node -> its pytest's exit status
    gone: dict[int, str]  # node -> why nothing came from it


def _unresolved(name: str) -> str:
    """Why ``name`` does not resolve to an address ("" when it does)."""
    try:
        socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        return str(exc)
    return ""


def cannot_sign(setup: NodeSetup, munge: Munge | None) -> str | None:
    """Why a run across nodes cannot sign its values (no token, no MUNGE); None where it can, or is one node."""
    if not setup.multi_node or setup.run_token is not None or munge is not None:
        return None
    munge_text = "no MUNGE answering here (munge, munged)" if setup.slurm_job else "not under SLURM (no MUNGE)"
    return f"no run token (CONFORMANCE_RUN_TOKEN, --run-token-file or --run-token), {munge_text}"


def unsigned_refusal(setup: NodeSetup, why: str) -> str:
    return (
        f"a run across {setup.nnodes} nodes cannot sign what its nodes exchange: {why}; make a token with "
        "`python -m conformance token --file FILE` and give every node --run-token-file FILE (or its text in "
        "CONFORMANCE_RUN_TOKEN), or say --unsigned to run unsigned (any client of node 0's port could then change "
        "the run's results)"
    )


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
        unsigned = cannot_sign(setup, munge)
        if unsigned and not setup.unsigned:
            raise NodeGroupError(unsigned_refusal(setup, unsigned))
        hosts = host and not setup.launcher_hosts_store
        log.info("node %d: %s the run's store at %s (%s)", me, "hosting" if hosts else "joining", where, setup.source)
        server = None
        try:  # the server's start has its own allowance: the rendezvous deadline counts once it serves
            server = host_store(setup) if hosts else None
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
            refusal = group._join(where)
        except (RuntimeError, KeyUnknown) as exc:  # the store's own error: node 0 never said which run it serves
            group.lose(exc)
            return group
        if refusal:
            log.info("node %d: %s", me, refusal)
            group.close()
            raise NodeGroupError(refusal)
        group._start_monitor()
        return group

    def _join(self, where: str) -> str:
        """Node 0 hosts the run (its challenge, key and liveness port); another node joins only the same run.

        A node of another run that reaches the same address and port (shared nodes) leaves its name
        under ``stranger/<n>`` for node 0 to report, and joins nothing: no key, no record of it enters.
        Returns why this node cannot take part ("": it does).  The store's errors are the caller's.
        """
        handshake = Handshake(self.setup, self.store, self.signed, self.munge, self.timeout)
        if self.me == 0:
            refusal = handshake.host()
            if refusal:
                return refusal
            self.liveness = Liveness(self.setup.master_addr or "", self.others, self._prover(), self.dropped)
            self.store.set(LIVENESS_KEY, str(self.liveness.port))
            self.answer_hellos = handshake.answer_hellos
            handshake.open_to_nodes()
            return handshake.claim_rank(self.dropped)
        refusal = handshake.join(where) or handshake.claim_rank(self.dropped)
        port = self.present(LIVENESS_KEY) if not refusal else None
        if port is not None and port.isdigit():  # only the pytest that holds the rank
            self._held = hold_liveness(self.setup.master_addr or "", int(port), self.me, self._prover())
        return refusal

    def _prover(self) -> Callable[[str, int], str] | None:
        """A node's answer to a liveness challenge, with the run's key; None where the run signs nothing."""
        if not self.signed.signs:
            return None
        return lambda challenge, node: self.signed.tag("conformance liveness", challenge, str(node))

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
        """Why a run across nodes signs nothing (it was let go on with --unsigned); None where it signs."""
        if self.signed.signs or not self.setup.multi_node:
            return None
        return f"--unsigned: {cannot_sign(self.setup, self.munge)}"

    def lose(self, exc: BaseException, silent: float = 0.0) -> None:
        """As :meth:`GroupWatch.lose`; on node 0 a store server that ended says so itself."""
        served = self.server.problem() if self.server is not None and not self.lost else None
        if served is None:
            super().lose(exc, silent)
            return
        self.lost = served
        log.info("node %d: %s", self.me, self.lost)

    def strangers(self) -> tuple[list[str], int]:
        """Nodes of other runs turned away (node 0): the first few by name (their own words, bounded), and how many.

        The count is a public counter anyone may raise: only ``STRANGERS_NAMED`` names are read, each
        one checked before it is read, so a raised counter costs no wait.
        """
        if self.store is None or self.lost:
            return [], 0
        plain, found = self.signed.raw, []
        try:
            count = int(self.store.add(STRANGER_COUNT_KEY, 0))
            for key in [f"{STRANGER_COUNT_KEY}/{n}" for n in range(1, min(count, STRANGERS_NAMED) + 1)]:
                if self.store.check([key]):
                    said = self.store.call(lambda k=key: plain.get(k)).decode(errors="replace")
                    found.append(shown(said[:STRANGER_TEXT]))
        except RuntimeError as exc:
            self.lose(exc)
            return found, len(found)
        return found, count

    def _verified(self, key: str) -> str | None:
        """The value under ``key``; None: not there, not verifying (dropped and named), or the store lost."""
        if self.store is None or self.lost:
            return None
        try:
            return self.present(key)
        except RuntimeError as exc:
            self.lose(exc)
            return None

    def _set(self, key: str, value: str) -> bool:
        """Set ``key`` (signed); False where node 0's store is lost (named)."""
        if self.store is None or self.lost:
            return False
        try:
            self.store.set(key, value)
        except RuntimeError as exc:
            self.lose(exc)
            return False
        return True

    # -- the start ----------------------------------------------------------------------------
    def start(self, mine: Fingerprint, run_id: str) -> StartCheck:
        """Exchange fingerprints; node 0 compares them and every node acts on its one check."""
        if not self._set(f"fingerprint/{self.me}", mine.to_json()):
            return StartCheck(run_id, None, {0: self.lost}, ())
        if self.me == 0:
            return self._judge(mine, run_id)
        log.info("node %d: fingerprint sent; waiting up to %gs for node 0's start check", self.me, self.timeout)
        text = self._from_node_0("check", self.timeout + 2 * ACK_WAIT)
        try:
            check = read_check(text) if text is not None else None
        except ValueError as exc:
            self.lose(Unreadable(f"node 0's start check cannot be used: {exc}"))
            check = None
        if check is None or not self._set(f"check_read/{self.me}", "1"):
            return StartCheck(run_id, None, {0: self.lost}, ())
        if self.me in check.missing:
            self.lost = f"this node arrived after node 0 had closed the rendezvous ({check.missing[self.me]})"
        self.gone.update({n: r for n, r in check.missing.items() if n != self.me})
        result = StartCheck(check.run_id, compare_fingerprints(check.prints), check.missing, check.interfaces)
        _log_start(self.me, check.prints, result)
        return result

    def _from_node_0(self, key: str, limit: float) -> str | None:
        """Node 0's value under ``key``, waited for up to ``limit`` (a value not of the run waited past); None: lost."""
        problem = self.wait_for({0: key}, limit, fixed=True)
        text = self._verified(key) if problem is None else None
        if text is None:
            self.lose(RuntimeError(problem.reason if problem else f"node 0's {key} is gone from its store"))
        return text

    def _judge(self, mine: Fingerprint, run_id: str) -> StartCheck:
        deadline = time.monotonic() + self.timeout
        for node in self.others:
            log.info("node 0: waiting for node %d's fingerprint (rendezvous deadline %gs)", node, self.timeout)
            problem = self.wait_for({node: f"fingerprint/{node}"}, max(0.0, deadline - time.monotonic()), fixed=True)
            if problem is not None and problem.beats:  # alive: its key went missing
                self.gone[node] = tampered(node, f"fingerprint/{node}", self.timeout)
            elif problem is not None:  # one deadline for all: name it, not what was left of it
                self.gone[node] = problem.reason if self.lost else f"node {node} never arrived within " \
                                  f"{self.timeout:g}s (rendezvous deadline)"  # fmt: skip
                log.info("node 0: %s", self.gone[node])
        prints = [mine]
        for node in [n for n in self.others if n not in self.gone]:
            try:
                prints.append(read_fingerprint(self._verified(f"fingerprint/{node}")))
            except ValueError as exc:
                self.gone[node] = f"node {node}: its fingerprint cannot be read: {exc}"
        interfaces = tuple(shared_interfaces(prints))
        check = {
            "run_id": run_id,
            "prints": [p.to_json() for p in prints],
            "missing": {str(n): reason for n, reason in self.gone.items()},
            "interfaces": list(interfaces),
        }
        self._set("check", json.dumps(check))
        result = StartCheck(run_id, compare_fingerprints(prints), dict(self.gone), interfaces)
        _log_start(0, prints, result)
        if result.fatal_text:  # the others must read the check before this store goes away
            self.wait_for({p.node_rank: f"check_read/{p.node_rank}" for p in prints[1:]}, ACK_WAIT, fixed=True)
        return result

    def same_collection(self, nodeids: Sequence[str]) -> list[str]:
        """Node 0 compares every node's collected tests; the lines of differences (none: the same)."""
        self.key_bound = KEYS_BASE + KEYS_PER_TEST * len(nodeids) * self.setup.nnodes
        if self.server is not None:
            self.server.expect(len(nodeids), self.setup.nnodes)
        if not self._set(f"collection/{self.me}", json.dumps(list(nodeids))):
            return []
        if self.me != 0:
            text = self._from_node_0("collection_check", self.timeout + 2 * ACK_WAIT)
            try:
                found = read_text_list(text) if text is not None else []
            except ValueError as exc:
                self.lose(Unreadable(f"node 0's comparison of the collections cannot be used: {exc}"))
                return []
            self._set(f"collection_read/{self.me}", "1")
            return found
        arrived = [n for n in self.others if n not in self.gone]
        for node in arrived:
            problem = self.wait_for({node: f"collection/{node}"}, self.timeout, fixed=True)
            if problem is not None:
                self.gone[node] = problem.reason
        differences: list[str] = []
        for node in (n for n in arrived if n not in self.gone):
            try:
                theirs = read_text_list(self._verified(f"collection/{node}"))
            except ValueError as exc:
                self.gone[node] = f"node {node}: its collection cannot be read: {exc}"
                continue
            differences.extend(collection_difference(nodeids, theirs, node))
        self._set("collection_check", json.dumps(differences))
        compared = [n for n in arrived if n not in self.gone]
        log.info("node 0: collections of nodes %s compared: %d line(s) of differences", compared, len(differences))
        if differences:  # the others must read it before this store goes away
            self.wait_for({n: f"collection_read/{n}" for n in compared}, ACK_WAIT, fixed=True)
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
        self._set(f"{prefix}/{stage}/{self.me}", value)
        others = [n for n in nodes if n != self.me]
        problem = self.absent(others) or self.wait_for({n: f"{prefix}/{stage}/{n}" for n in others}, limit)
        if problem is not None:
            log.info("node %d: %s %s without node %d: %s", self.me, prefix, stage, problem.node, problem.reason)
        return problem

    def peers(self, prefix: str, nodes: Sequence[int]) -> CasePeers:
        return CasePeers(self, prefix, [n for n in nodes if n != self.me])

    def read(self, prefix: str, stage: str, nodes: Sequence[int]) -> dict[int, str]:
        """The nodes' values of a case's ``stage`` that are there and verify."""
        found = {node: self._verified(f"{prefix}/{stage}/{node}") for node in nodes}
        return {node: text for node, text in found.items() if text is not None}

    # -- node pairs: the first pass, read by the re-checks ------------------------------------
    def publish_first_pass(self, case: str, verdict: str) -> None:
        """Post the verdict this node saw of a first-pass node pair (``case``: its ladder key), for the re-checks."""
        self._set(f"first_pass/{case}/{self.me}", verdict)

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
        for key, value in (("results", "\n".join(lines)), ("status", str(exit_status)), ("finished", "1")):
            if not self._set(f"{key}/{self.me}", value):
                return f"records not sent to node 0: {self.lost}"
        log.info("node %d: sent %d record(s) to node 0", self.me, len(lines))
        return f"{len(lines)} records sent to node 0"

    def gather_results(self, waiting: Callable[[int], None]) -> Gathered:
        """Node 0 collects each node's records and exit status; nodes that are gone are named instead."""
        gathered: dict[int, list[str]] = {}
        statuses: dict[int, int] = {}
        for node in self.others:
            problem = self.absent([node])
            if problem is None and self._verified(f"results/{node}") is None:
                waiting(node)
                log.info("node 0: waiting for node %d's records (it is at %s)", node, self.where(node))
                problem = self.wait_for({node: f"results/{node}"}, self.progress_limit) or self.absent([node])
            if problem is not None:
                lost = problem.node == 0  # node 0's own store lost: the node's records never reached it
                reason = f"its records never reached node 0: {problem.reason}" if lost else problem.reason
                self.gone.setdefault(node, reason)
                log.info("node 0: no records from node %d: %s", node, self.gone[node])
                continue
            text, status = self._verified(f"results/{node}"), self._verified(f"status/{node}")
            if text is None or status is None or not status.isdigit():
                missing = [key for key, value in (("results", text), ("status", status)) if value is None]
                self.gone[node] = f"its {' and '.join(missing) or 'status'} did not come as it must: dropped"
                continue
            gathered[node] = [line for line in text.splitlines() if line.strip()]
            statuses[node] = int(status)
            log.info("node 0: gathered %d record(s) from node %d (exit %d)", len(gathered[node]), node, statuses[node])
        return Gathered(gathered, statuses, dict(self.gone))

    def publish_outcome(self, failed: Sequence[str], readers: Iterable[int]) -> None:
        """Node 0 tells every node which nodes failed ("node 2: exit 1"), and keeps its store up for ``readers``."""
        if self._set(OUTCOME_KEY, json.dumps(list(failed))):
            self.wait_for({n: f"{OUTCOME_KEY}_read/{n}" for n in readers}, ACK_WAIT, fixed=True)

    def run_outcome(self) -> list[str]:
        """The nodes that failed, as node 0 found them; node 0 gone before it said is itself a failure."""
        problem = self._known_problem(0) or self.wait_for({0: OUTCOME_KEY}, self.progress_limit)
        text = self._verified(OUTCOME_KEY) if problem is None else None
        if text is None:
            return [f"node 0: no outcome of the run from it ({problem.reason if problem else self.lost})"]
        try:
            failed = read_text_list(text)
        except ValueError as exc:
            return [f"node 0: its outcome of the run cannot be read ({exc})"]
        self._set(f"{OUTCOME_KEY}_read/{self.me}", "1")
        return failed

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
