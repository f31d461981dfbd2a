"""How a node joins the run's store: which run it serves, the run token proven both ways, the run's key.

Keys (none of them signed: each proves what it needs itself):

    identity                 which run the store serves (the launcher's name for it; by hand, none)
    challenge                node 0's fresh random challenge for this run
    hellos/<k>               how many pytests said hello as node k (each takes the next number n)
    hello/<k>/<n>            one's own fresh challenge and its proof:      HMAC(token, challenge, its own, k, "node")
    answer/<k>/<n>           node 0's answer to that hello:                HMAC(token, challenge, its own, k, "node 0")
    munge/<k>                under SLURM without a token: node 0's MUNGE credential holding the run's key, for node k
    rank_holder/<k>          which pytest is node k (signed)
    stranger, stranger/<n>   how many nodes of other runs were turned away, and what each said it was

With a run token, each side proves it holds the token by an HMAC over the other side's fresh challenge,
so neither a digest of the token nor a proof of an earlier run is ever accepted, and the run's key,
``HMAC(token, "conformance run key", challenge)``, is new for every run.  Nothing published is a digest
of the token.  But whoever can read the store sees a challenge and its answer, and can test guesses of
the token against them offline: what stands against that is the token's own entropy, which is why a
token below 128 bits is refused (``conformance/common/run_token.py``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from conformance.common.outside_text import shown
from conformance.nodes.layout import NodeSetup
from conformance.nodes.munge import Munge, MungeError
from conformance.nodes.store import BoundedStore, ForgedValue, SignedStore

IDENTITY_KEY = "identity"
CHALLENGE_KEY = "challenge"
HELLO_COUNT_KEY = "hellos"
HELLO_KEY = "hello"
ANSWER_KEY = "answer"
HELLOS_ANSWERED = 8  # node 0 answers the latest hellos of each node: a raised counter costs it no more
MUNGE_KEY = "munge"
RANK_HOLDER_KEY = "rank_holder"
STRANGER_COUNT_KEY = "stranger"
BY_HAND = "a run started by hand"  # no launcher names it: the run token alone tells two such runs apart
ACK_WAIT = 5.0  # how long a node waits for a right answer once a wrong one is there; node 0 keeps its store up
POLL_SECONDS = 0.1
STRANGER_TEXT = 200  # the most of a stranger's own words kept


def proof(token: bytes, challenge: str, theirs: str, node: int, role: str) -> str:
    """``role``'s proof that it holds ``token``, over both sides' fresh challenges and the node it is for."""
    message = "\0".join(("conformance proof", challenge, theirs, str(node), role)).encode()
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def run_key(token: bytes, challenge: str) -> bytes:
    """The run's signing key: new for every run, since node 0's challenge is."""
    return hmac.new(token, b"conformance run key\0" + challenge.encode(), hashlib.sha256).digest()


class Handshake:
    """One node's part in joining the run: node 0 hosts the challenge and answers; the others prove and check.

    The store's errors (RuntimeError) are the caller's.
    """

    def __init__(
        self, setup: NodeSetup, store: BoundedStore, signed: SignedStore, munge: Munge | None, timeout: float
    ) -> None:
        self.setup = setup
        self.store = store
        self.signed = signed
        self.munge = munge
        self.timeout = timeout
        self.me = setup.node_rank
        self.token = setup.run_token.encode() if setup.run_token is not None else None
        self.challenge = ""
        self._hellos: dict[int, int] = {}  # node 0: node -> the hellos counted so far
        self._unanswered: dict[int, set[int]] = {}  # node 0: node -> the numbers of hellos not answered yet

    # -- node 0 -------------------------------------------------------------------------------
    def host(self) -> str:
        """Node 0: a fresh challenge and the run's key ("": done, else why not)."""
        self.challenge = secrets.token_hex(32)
        plain = self.signed.raw
        self.store.call(lambda: plain.set(CHALLENGE_KEY, self.challenge))
        if self.token is not None:
            self.signed.use_key(run_key(self.token, self.challenge))
        return self._hand_out_key()

    def open_to_nodes(self) -> None:
        """Node 0, once all the others need is there: which run this is (the others wait for it)."""
        plain = self.signed.raw
        self.store.call(lambda: plain.set(IDENTITY_KEY, self.setup.identity or BY_HAND))

    def _hand_out_key(self) -> str:
        """Node 0 under MUNGE: a random key for the run, in a credential for each other node ("": done)."""
        if self.munge is None or self.token is not None:
            return ""
        key = secrets.token_bytes(32)
        ttl = int(self.timeout + 2 * ACK_WAIT)  # the others read theirs within the rendezvous deadline
        for node in range(1, self.setup.nnodes):
            payload = {"job": self.setup.slurm_job, "run": self.challenge, "node": node, "key": key.hex()}
            try:
                credential = self.munge.credential(payload, os.getuid(), ttl)
            except MungeError as exc:
                return f"node 0 cannot sign the run with MUNGE ({exc}): start munged, or give every node a run token"
            self.store.call(functools.partial(self.signed.raw.set, f"{MUNGE_KEY}/{node}", credential))
        self.signed.use_key(key)
        return ""

    def answer_hellos(self, store: Any, nodes: list[int], dropped: Callable[[str], None]) -> None:
        """Node 0's monitor, each round: answer every new hello; name one that proves no token of this run.

        Every hello is answered (a node of another run learns at once that this store is not its run's,
        a second pytest given a rank already held learns it from the rank), the latest few of each node.
        """
        if self.token is None:
            return
        for node in nodes:
            count = int(store.add(f"{HELLO_COUNT_KEY}/{node}", 0))
            latest = range(max(self._hellos.get(node, 0) + 1, count - HELLOS_ANSWERED + 1), count + 1)
            waiting = {n for n in self._unanswered.get(node, set()) | set(latest) if n > count - HELLOS_ANSWERED}
            self._hellos[node], self._unanswered[node] = count, waiting
            for number in sorted(waiting):
                if self._answer(store, node, number, dropped):
                    waiting.discard(number)

    def _answer(self, store: Any, node: int, number: int, dropped: Callable[[str], None]) -> bool:
        """Answer hello ``number`` of ``node`` (False: not written yet)."""
        assert self.token is not None
        key = f"{HELLO_KEY}/{node}/{number}"
        if not store.check([key]):
            return False
        theirs, _, said = store.get(key).decode(errors="replace").partition(" ")
        expected = proof(self.token, self.challenge, theirs, node, "node")
        if not hmac.compare_digest(said.encode(), expected.encode()):
            dropped(f"{key}: it does not prove this run's token (a node of another run, or a client not of it)")
        store.set(
            f"{ANSWER_KEY}/{node}/{number}", f"{theirs} {proof(self.token, self.challenge, theirs, node, 'node 0')}"
        )
        return True

    # -- the other nodes ----------------------------------------------------------------------
    def join(self, where: str) -> str:
        """Another node: node 0's run and challenge, then the run's key ("": joined, else why not)."""
        mine = self.setup.identity or BY_HAND
        plain = self.signed.raw
        # node 0 may come later than this node where the launcher hosts the store: the rendezvous deadline
        theirs = self.store.call(lambda: plain.get(IDENTITY_KEY), self.timeout + ACK_WAIT).decode(errors="replace")
        if theirs != mine:
            self._leave_a_name(mine)
            return (
                f"node 0's store at {where} serves another run ({shown(theirs[:STRANGER_TEXT])}), not this one "
                f"({mine}): this node does not join it; give each job its own --master-port"
            )
        self.challenge = self.store.call(lambda: plain.get(CHALLENGE_KEY)).decode(errors="replace")
        if self.token is not None:
            return self._prove(where, mine)
        return self._take_key()

    def _prove(self, where: str, mine: str) -> str:
        """Prove the token over node 0's challenge, and check node 0's answer over this node's own."""
        assert self.token is not None
        own = secrets.token_hex(32)
        hello = f"{own} {proof(self.token, self.challenge, own, self.me, 'node')}"
        plain = self.signed.raw
        number = int(self.store.add(f"{HELLO_COUNT_KEY}/{self.me}", 1))
        self.store.call(lambda: plain.set(f"{HELLO_KEY}/{self.me}/{number}", hello))
        expected = f"{own} {proof(self.token, self.challenge, own, self.me, 'node 0')}".encode()
        deadline, wrong_since = time.monotonic() + self.timeout + ACK_WAIT, None
        key = f"{ANSWER_KEY}/{self.me}/{number}"
        while time.monotonic() < deadline:
            answer = self.store.call(lambda: plain.get(key)) if self.store.call(lambda: plain.check([key])) else None
            if answer is not None and hmac.compare_digest(answer, expected):
                self.signed.use_key(run_key(self.token, self.challenge))
                return ""
            if answer is not None and answer.startswith(own.encode()):  # an answer to this hello, not proving it
                wrong_since = wrong_since or time.monotonic()
                if time.monotonic() - wrong_since > ACK_WAIT:
                    self._leave_a_name(mine)
                    return (
                        f"node 0's store at {where} serves another run: its answer does not prove this node's run "
                        "token (every node of one run needs the same token); this node does not join it"
                    )
            time.sleep(POLL_SECONDS)
        return f"node 0's store at {where} never answered this node's proof of the run token within {self.timeout:g}s"

    def _take_key(self) -> str:
        """A node under MUNGE: the run's key from its own credential, made by its user for its job ("": taken)."""
        if self.munge is None:
            return ""
        raw = self.signed.raw
        try:
            credential = self.store.call(lambda: raw.get(f"{MUNGE_KEY}/{self.me}"), self.timeout + ACK_WAIT).decode()
            uid, payload = self.munge.decoded(credential)
        except (MungeError, RuntimeError, UnicodeDecodeError) as exc:
            return f"node 0's MUNGE credential for node {self.me} cannot be used: {exc}"
        expected = {"job": self.setup.slurm_job, "run": self.challenge, "node": self.me}
        if uid != os.getuid() or any(payload.get(name) != value for name, value in expected.items()):
            return (
                f"node 0's MUNGE credential for node {self.me} is not of this job's user, job, run and node "
                f"(uid {uid}, {', '.join(f'{k} {shown(repr(payload.get(k)))[:80]}' for k in expected)}): not taken"
            )
        try:
            self.signed.use_key(bytes.fromhex(str(payload.get("key", ""))))
        except ValueError:
            return f"node 0's MUNGE credential for node {self.me} holds no key: not taken"
        return ""

    def _leave_a_name(self, mine: str) -> None:
        """A node of another run leaves its name for node 0 to report, and joins nothing."""
        number = self.store.add(STRANGER_COUNT_KEY, 1)
        stranger = f"{mine}, node {self.me}, host {socket.gethostname()}"
        self.store.call(lambda: self.signed.raw.set(f"{STRANGER_COUNT_KEY}/{number}", stranger))

    # -- both ---------------------------------------------------------------------------------
    def claim_rank(self, dropped: Callable[[str], None]) -> str:
        """Take this node's rank in the run, or say who has it ("": taken).

        ``compare_set`` with an expected "" sets the key only where nobody has (torch's TCPStore), so
        of two pytests given one node rank exactly one holds it.  A holder that does not verify was
        written by no node of this run: it is named and replaced, in one ``compare_set`` again.
        """
        mine = f"host {socket.gethostname()} (pid {os.getpid()})"
        key = f"{RANK_HOLDER_KEY}/{self.me}"
        try:
            holder = self.store.compare_set(key, "", mine).decode(errors="replace")
        except ForgedValue as exc:
            dropped(str(exc))
            there = self.store.call(lambda: self.signed.raw.get(key))
            try:
                holder = self.store.compare_set(key, there, mine).decode(errors="replace")
            except ForgedValue as again:
                return f"node rank {self.me} cannot be taken: {again}"
        if holder == mine:
            return ""
        return (
            f"node rank {self.me} is already taken by {holder}; this pytest ({mine}) was given the same node rank "
            f"({self.setup.source}): give each node its own"
        )
