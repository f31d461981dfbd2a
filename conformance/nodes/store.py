"""The run's store as one node reaches it: opened, its values signed, every call bounded.

Node 0 hosts the store (a torch TCPStore, in a process of its own: :mod:`conformance.nodes.store_server`)
unless the launcher does, listening on the run's address alone; where the run can sign (a run token,
or MUNGE under SLURM) every value is signed (:class:`SignedStore`), and the main thread's calls are
bounded in time (:class:`BoundedStore`), so a node whose link to node 0 is cut goes on without it.
What the keys mean is :mod:`conformance.nodes.group`'s.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import socket
import threading
from collections.abc import Callable
from typing import Any

from conformance.nodes.layout import NodeSetup
from conformance.nodes.store_server import StoreServer


def open_store(setup: NodeSetup, timeout: float) -> Any:
    """A client of the run's store (node 0's, or the launcher's); under the run's prefix when it has one."""
    import torch.distributed as dist

    store = dist.TCPStore(  # type: ignore[attr-defined]
        setup.master_addr or "",
        setup.master_port or 0,
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    return dist.PrefixStore(setup.store_prefix, store) if setup.store_prefix else store  # type: ignore[attr-defined]


def host_store(setup: NodeSetup) -> StoreServer:
    """Node 0 serves the run's store on the run's address alone, in a process whose memory is bounded."""
    # torch's TCPStore server given only a port listens on every interface (``*:port``), whatever the
    # address the run uses; a socket bound here to that address alone is handed over to it instead.
    listening = listening_socket(setup.master_addr or "", setup.master_port or 0)
    return StoreServer.start(listening, setup.master_addr or "", listening.getsockname()[1])


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
    """A value of the run's store that does not verify with the run's key: not written by a node of this run."""


SIGNATURE = b"\n#hmac-sha256:"


class KeyUnknown(RuntimeError):
    """The run signs its values, and this node has no key: the store is lost to it (a RuntimeError, as the store's)."""


class SignedStore:
    """The run's store with every value signed, where the run can sign: a run token, or MUNGE under SLURM.

    A value is stored as itself, then ``SIGNATURE`` and the hex HMAC-SHA256 of its key and itself
    under the run's key (:mod:`conformance.nodes.handshake`: derived from the run token and node 0's
    fresh challenge, or drawn by node 0 and handed out in MUNGE credentials), so a value of one run
    never verifies in another.  Neither the token nor the key is stored.  Unsigned (``--unsigned``),
    values are stored as they are.  Counters (``add``), key checks and the handshake's own values
    (which run the store serves, the challenge and the proofs, the strangers turned away) are not
    signed: the handshake proves what it needs itself.
    """

    def __init__(self, store: Any, signs: bool) -> None:
        self.raw = store
        self.signs = signs  # False: the run is UNSIGNED
        self._key: bytes | None = None

    def use_key(self, key: bytes) -> None:
        self._key = key

    def over(self, store: Any) -> SignedStore:
        """Another connection to the same store (a thread's own), signing with the same key."""
        other = SignedStore(store, self.signs)
        other._key = self._key
        return other

    def tag(self, *parts: str) -> str:
        """The hex HMAC-SHA256 of ``parts`` under the run's key (KeyUnknown before it is known)."""
        if self._key is None:  # a node turned away, or one whose key never came: it writes and believes nothing
            raise KeyUnknown("the run's key is not known to this node")
        return hmac.new(self._key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()

    def _signature(self, key: str, value: bytes) -> bytes:
        if self._key is None:
            raise KeyUnknown(f"{key}: the run's key is not known to this node")
        return hmac.new(self._key, key.encode() + b"\0" + value, hashlib.sha256).hexdigest().encode()

    def _signed(self, key: str, value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else value
        return data + SIGNATURE + self._signature(key, data) if self.signs else data

    def _verified(self, key: str, stored: bytes) -> bytes:
        if not self.signs:
            return stored
        data, mark, signature = stored.rpartition(SIGNATURE)
        if not mark or not hmac.compare_digest(signature, self._signature(key, data)):
            raise ForgedValue(
                f"{key}: its value does not verify with the run's key (not written by a node of this run)"
            )
        return data

    def set(self, key: str, value: str | bytes) -> None:
        self.raw.set(key, self._signed(key, value))

    def get(self, key: str) -> bytes:
        return self._verified(key, self.raw.get(key))

    def compare_set(self, key: str, expected: str | bytes, desired: str) -> bytes:
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
