"""Structured facts from NCCL_DEBUG=INFO output: versions, the transport of every channel, env, init progress.

NCCL writes one file per process when it runs with
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,ENV,GRAPH,P2P,SHM,NET NCCL_DEBUG_FILE=<dir>/nccl.%h.%p.log``.
Its lines look like ``host:pid:tid [cudaDev] NCCL INFO <message>``; WARN lines carry the source location
(``host:pid:tid [cudaDev] file.cc:123 NCCL WARN <message>``) and may start with a
``[YYYY-MM-DD hh:mm:ss]`` timestamp (``NCCL_DEBUG_TIMESTAMP_LEVELS``/``_FORMAT``).  Old versions print
``NCCL version ...`` with no prefix at all, so every pattern here is searched anywhere in the line.

Transport lines by NCCL era (the formats of ``src/transport/{p2p,shm,net,coll_net}.cc``):

    <= 2.6      Ring 00 : 0[0] -> 1[1] via P2P/IPC          Ring 00 : 15 -> 0 [send] via NET/Socket/0
                Ring 00 : 2[3d000] -> 3[3e000] via direct shared memory
    2.7-2.11    Channel 00 : 0[1a000] -> 1[1b000] via P2P/IPC/read        (brackets: busId in hex)
    2.12-2.18   Channel 00/0 : 8[0] -> 15[7] via P2P/IPC/read              (``/connIndex`` added)
                Channel 00 : 1[1] -> 0[0] via SHM/direct/direct           (SHM never prints connIndex)
    >= 2.19     via P2P/CUMEM[/read][/CE], P2P/MNNVL[/read][/CE], P2P/IPC[/read][/CE],
                P2P/direct pointer[/read], P2P/indirect/<rank>[<dev>][/read], SHM/<direct|CE>/<direct|CE>,
                [send|receive] via NET/<IB|Socket|plugin>/<dev>[(<proxyRank>)][/GDRDMA[(PCI)]][/Shared]
    CollNet     CollNet 00/0 : 3 [send] via COLLNET/<name>/<dev>[/GDRDMA]   (older: ``Coll 00 : 3 ...``)

A ``via`` text that fits none of the known forms (a line torn by another process writing to the same
stream, or a transport this module does not know) is kept with the transport ``OTHER`` rather than
dropped, so a check over the transports can see that something was not understood.  Lines that are
not transport lines and fit no other pattern are ignored; no input makes :func:`parse` raise.

This module holds the line patterns and the parser; what it returns (:class:`NcclLog`) is
:mod:`conformance.verdict.nccl_facts`'s, and the ``via`` text is read by :mod:`conformance.verdict.nccl_transport`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.common.inputs import read_bounded
from conformance.verdict.nccl_facts import CommInit, Connection, NcclLog
from conformance.verdict.nccl_transport import classify

# NCCL formats each line into a buffer of about 1 KiB (debug.cc); what lies past this is not NCCL's and would
# only make the searches slow (a line with many partial matches costs time quadratic in its length).
MAX_LINE = 4096
# Lines a builder keeps of each kind (connections, warnings, communicators): a log of any length parses in bounded
# memory; a job with more than this many channel lines or communicators keeps the first ones.
MAX_KEPT = 100_000
MAX_DISTINCT = 256  # distinct versions, interfaces, devices kept
MAX_REUSES = 16  # uses of one communicator pointer told apart

# --------------------------------------------------------------------------------------------
# Line patterns, compiled once.  Every number is bounded so that no match can feed int() a
# string longer than Python's digit limit.
# --------------------------------------------------------------------------------------------

# All eras: the debug.cc line prefix "host:pid:tid [cudaDev] " (after an optional timestamp).
_PREFIX = re.compile(r"(?P<host>[^\s:\[\]]{1,255}):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[-?\d{1,4}\] ", re.ASCII)

# Every era: "NCCL version 2.21.5+cuda12.4" (<= 2.6 printed it with no prefix).
_VERSION = re.compile(
    r"\bNCCL version (?P<version>\d{1,3}\.\d{1,3}\.\d{1,4})[^\s+]{0,32}(?:\+cuda(?P<cuda>\d{1,3}\.\d{1,3}))?"
)

# Newer releases (seen in 2.14 and later logs): "cudaDriverVersion 12080".
_CUDA_DRIVER = re.compile(r"\bcudaDriverVersion (?P<driver>\d{1,7})\b", re.ASCII)

# "Bootstrap : Using eth0:10.0.0.1<0>" (older), "Bootstrap: Using eth0:..." (seen in 2.25 and later logs),
# "Bootstrap : Using [0]ens5:172.31.41.105<0>" (2.4).
_BOOTSTRAP = re.compile(r"\bBootstrap ?: Using (?:\[\d{1,3}\])?(?P<iface>[^\s:<>\[\]]{1,64}):", re.ASCII)

# Socket transport: "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:10.0.1.1<0>".
_NET_SOCKET_USING = re.compile(r"\bNET/Socket ?: Using (?P<list>.*)$")
# IB transport: "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_4:1/RoCE [RO]; OOB eth0:10.0.0.1<0>".
_NET_IB_USING = re.compile(r"\bNET/IB ?: Using (?P<list>[^;]*)")
# One "[n]name" entry of those two lists.
_LIST_ENTRY = re.compile(r"\[\d{1,3}\](?P<entry>[^\s;<>]+)", re.ASCII)

# "Using network IB" / "Using network Socket" / "Using network AWS Libfabric" / "Using network IBext_v8".
_NETWORK = re.compile(r"\bUsing network (?P<network>\S.*)")

# param.cc / ncclGetEnv, every era: "NCCL_P2P_LEVEL set by environment to NVL",
# integer parameters end in a full stop: "NCCL_IB_DISABLE set by environment to 1.".
_ENV = re.compile(r"\b(?P<var>[A-Z][A-Z0-9_]{0,63}) set by environment to (?P<value>.*)", re.ASCII)

# transport/p2p.cc and graph/paths.cc, every era:
#   "Could not enable P2P between dev 0(=1a000) and dev 1(=3d000)"
#   "peer query failed between dev 0(=1a000) and dev 1(=3d000)"
#   "P2P is disabled between connected GPUs 0 and 1. You can repress this message with ..."
#   "P2P is disabled between NVLINK connected GPUs 1 and 0. This should not be the case ..." (a WARN)
#   "Legacy IPC not supported" (WSL)
_P2P_WARNING = re.compile(
    r"(?:Could not enable P2P between|peer query failed between|P2P is disabled between|Legacy IPC not supported).*$"
)

# init.cc: "comm 0x55d0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 - Init COMPLETE" (2.4),
# "comm 0x.. rank 0 nranks 2 cudaDev 0 busId 1a000 - Init COMPLETE" (2.7-2.11),
# "ncclCommInitRank comm 0x.. rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x.. - Init START" (>= 2.18),
# "ncclCommSplit comm 0x.. rank 0 nranks 2 ... parent 0x.. splitCount 1 color 0 key 0- Init START" (no space),
# "comm 0x.. rank 0 nRanks 2 cudaDev 0 busId 1000 - Abort COMPLETE".
_INIT = re.compile(
    r"\bcomm (?P<comm>0x[0-9a-fA-F]{1,16}) rank (?P<rank>\d{1,7}) n[Rr]anks (?P<nranks>\d{1,7})"
    r" cudaDev (?P<cuda_dev>-?\d{1,4})(?: nvmlDev (?P<nvml_dev>-?\d{1,4}))?(?: busId (?P<bus_id>[0-9a-fA-F]{1,16}))?"
    r"(?: commId (?P<comm_id>0x[0-9a-fA-F]{1,16}))?.{0,400}?-\s?(?P<event>Init START|Init COMPLETE|Abort COMPLETE)",
    re.ASCII,
)

# transport/nvls.cc (>= 2.17): "NVLS comm 0x55d0 headRank 0 nHeads 4 ..." -- NVLS prints no per-channel line.
_NVLS_COMM = re.compile(r"\bNVLS comm (?P<comm>0x[0-9a-fA-F]{1,16})\b", re.ASCII)

# debug.cc: "host:pid:tid [dev] misc/socket.cc:484 NCCL WARN <message>"; NCCL 2.3 and older printed no "NCCL" there:
# "host:pid:tid [dev] include/socket.h:311 WARN Socket creation failed : ..." (the source file and line before WARN).
_WARN = re.compile(r"(?:\bNCCL|\.(?:cc|cu|h):\d{1,5}) WARN ?(?P<message>.*)")

# The transport line of every era (see the module docstring):
#   "Ring 00 : 0[0] -> 1[1] via P2P/IPC", "Ring 00 : 15 -> 0 [send] via NET/Socket/0",
#   "Channel 00 : 0[1a000] -> 1[1b000] via P2P/IPC/read", "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA".
# The ring summary "Channel 00/02 : 0 1 2 3" and the TRACE-only "<-" lines have no "->" and do not match.
_CONNECTION = re.compile(
    r"\b(?:Channel|Ring) (?P<channel>\d{1,4})(?:/(?P<conn_index>\d{1,2}))? : "
    r"(?P<src>\d{1,7})(?:\[(?P<src_dev>[0-9a-fA-Fx]{1,16})\])? -> "
    r"(?P<dst>\d{1,7})(?:\[(?P<dst_dev>[0-9a-fA-Fx]{1,16})\])? "
    r"(?:\[(?P<direction>send|receive)\] )?via (?P<via>.*)",
    re.ASCII,
)

# transport/coll_net.cc: "Coll 00 : 3 [send] via COLLNET/SHARP/0/GDRDMA" (<= 2.11),
# "CollNet 00/0 : 3 [receive] via COLLNET/SHARP/0/GDRDMA(PCI)" (>= 2.12).  One rank, no peer.
_COLLNET_CONNECTION = re.compile(
    r"\bColl(?:Net)? (?P<channel>\d{1,4})(?:/(?P<conn_index>\d{1,2}))? : (?P<rank>\d{1,7}) "
    r"\[(?P<direction>send|receive)\] via (?P<via>.*)",
    re.ASCII,
)


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------


def _optional_int(text: str | None) -> int | None:
    return int(text) if text is not None else None


def _connection(m: re.Match[str], src: int, dst: int) -> Connection:
    via = m["via"].strip()
    transport, flags, relay = classify(via)
    groups = m.groupdict()
    return Connection(
        channel=int(m["channel"]),
        conn_index=_optional_int(m["conn_index"]),
        src_rank=src,
        dst_rank=dst,
        src_dev=groups.get("src_dev"),
        dst_dev=groups.get("dst_dev"),
        direction=m["direction"],
        transport=transport,
        flags=flags,
        detail=via,
        relay_rank=relay,
    )


@dataclass
class _InitState:
    comm: str
    host: str | None
    pid: int | None
    fields: dict[str, Any] = field(default_factory=dict)
    events: set[str] = field(default_factory=set)


_Identity = tuple[int, str | None, int | None]  # (file number, host, pid)


def _extend_bounded(items: list[Any], more: list[Any]) -> None:
    items.extend(more[: MAX_KEPT - len(items)])


def _append_new(items: list[str], item: str) -> None:
    if len(items) < MAX_DISTINCT and item not in items:
        items.append(item)


class NcclLogBuilder:
    """Collects facts line by line, over one text or several files."""

    def __init__(self) -> None:
        self.source = 0
        self.versions: list[str] = []
        self.cuda: str | None = None
        self.cuda_driver: int | None = None
        self.connections: list[Connection] = []
        self.bootstrap: list[str] = []
        self.net_interfaces: list[str] = []
        self.ib_devices: list[str] = []
        self.network: str | None = None
        self.env: dict[str, str] = {}
        self.p2p_warnings: list[str] = []
        self.inits: dict[tuple[_Identity, str], list[_InitState]] = {}  # one state per use of the pointer
        self.nvls_comms: list[str] = []
        self.warnings: list[str] = []

    def feed(self, text: str) -> None:
        """Every line of one source's text (a file, or one process's output)."""
        for whole in text.splitlines():
            self.feed_line(whole)
        self.end_source()

    def feed_line(self, whole: str) -> None:
        """One line of the current source (streamed readers feed a file line by line, then :meth:`end_source`)."""
        line = whole[:MAX_LINE]
        for needles, handler in _HANDLERS:
            for needle in needles:
                if needle in line:
                    handler(self, line)
                    break

    def end_source(self) -> None:
        self.source += 1

    def absorb(self, other: NcclLogBuilder) -> None:
        """Take in what another builder read from later sources (another process read them)."""
        for name in ("versions", "bootstrap", "net_interfaces", "ib_devices", "nvls_comms"):
            for item in getattr(other, name):
                _append_new(getattr(self, name), item)
        self.cuda = self.cuda or other.cuda
        self.cuda_driver = self.cuda_driver or other.cuda_driver
        self.network = self.network or other.network
        for var, value in other.env.items():
            self.env.setdefault(var, value)
        _extend_bounded(self.connections, other.connections)
        _extend_bounded(self.p2p_warnings, other.p2p_warnings)
        _extend_bounded(self.warnings, other.warnings)
        for (identity, comm), states in other.inits.items():
            if len(self.inits) < MAX_KEPT:
                self.inits[((identity[0] + self.source, *identity[1:]), comm)] = states
        self.source += other.source

    def build(self, files: list[str], skipped: list[str]) -> NcclLog:
        return NcclLog(
            version=self.versions[0] if self.versions else None,
            cuda=self.cuda,
            cuda_driver=self.cuda_driver,
            versions=self.versions,
            connections=self.connections,
            bootstrap_interface=self.bootstrap[0] if self.bootstrap else None,
            bootstrap_interfaces=self.bootstrap,
            net_interfaces=self.net_interfaces,
            ib_devices=self.ib_devices,
            network=self.network,
            env_settings=self.env,
            p2p_warnings=self.p2p_warnings,
            inits=self._frozen_inits(),
            nvls_comms=self.nvls_comms,
            warnings=self.warnings,
            files=files,
            skipped_files=skipped,
        )

    def _frozen_inits(self) -> dict[str, CommInit]:
        """Key by comm pointer.

        A pointer seen in more than one process gets ``@host:pid`` appended, and a pointer that one
        process initialised again (a communicator destroyed and a new one at the same address) gets
        ``#2``, ``#3``... on its later uses.
        """
        owners = Counter(comm for _, comm in self.inits)
        frozen = {}
        for (identity, comm), states in self.inits.items():
            key = comm if owners[comm] == 1 else f"{comm}@{_owner(identity)}"
            for use, state in enumerate(states, start=1):
                frozen[key if use == 1 else f"{key}#{use}"] = _freeze(state)
        return frozen


def _freeze(state: _InitState) -> CommInit:
    return CommInit(
        comm=state.comm,
        host=state.host,
        pid=state.pid,
        started="Init START" in state.events,
        completed="Init COMPLETE" in state.events,
        aborted="Abort COMPLETE" in state.events,
        **state.fields,
    )


def _owner(identity: _Identity) -> str:
    source, host, pid = identity
    return f"{host}:{pid}" if host is not None else f"file{source}"


def _on_version(b: NcclLogBuilder, line: str) -> None:
    m = _VERSION.search(line)
    if m:
        if not b.versions:
            b.cuda = m["cuda"]
        _append_new(b.versions, m["version"])


def _on_cuda_driver(b: NcclLogBuilder, line: str) -> None:
    m = _CUDA_DRIVER.search(line)
    if m and b.cuda_driver is None:
        b.cuda_driver = int(m["driver"])


def _on_bootstrap(b: NcclLogBuilder, line: str) -> None:
    m = _BOOTSTRAP.search(line)
    if m:
        _append_new(b.bootstrap, m["iface"])


def _on_net_using(b: NcclLogBuilder, line: str) -> None:
    socket = _NET_SOCKET_USING.search(line)
    if socket:
        for entry in _LIST_ENTRY.findall(socket["list"]):
            _append_new(b.net_interfaces, entry.split(":", 1)[0])
    ib = _NET_IB_USING.search(line)
    if ib:
        for entry in _LIST_ENTRY.findall(ib["list"]):
            _append_new(b.ib_devices, entry)


def _on_network(b: NcclLogBuilder, line: str) -> None:
    m = _NETWORK.search(line)
    if m and b.network is None:
        b.network = m["network"].strip()


def _on_env(b: NcclLogBuilder, line: str) -> None:
    m = _ENV.search(line)
    if m:
        value = m["value"].strip()
        b.env.setdefault(m["var"], value[:-1] if value.endswith(".") else value)


def _on_p2p_warning(b: NcclLogBuilder, line: str) -> None:
    m = _P2P_WARNING.search(line)
    if m:
        _extend_bounded(b.p2p_warnings, [m.group(0).strip()])


def _on_init(b: NcclLogBuilder, line: str) -> None:
    m = _INIT.search(line)
    if not m:
        return
    prefix = _PREFIX.search(line, 0, m.start())
    host = prefix["host"] if prefix else None
    pid = int(prefix["pid"]) if prefix else None
    identity: _Identity = (b.source, host, pid)
    if (identity, m["comm"]) not in b.inits and len(b.inits) >= MAX_KEPT:
        return
    uses = b.inits.setdefault((identity, m["comm"]), [])
    if not uses or (m["event"] in uses[-1].events and len(uses) < MAX_REUSES):  # a second START: the pointer reused
        uses.append(_InitState(m["comm"], host, pid))
    state = uses[-1]
    state.events.add(m["event"])
    for name in ("rank", "nranks", "cuda_dev", "nvml_dev"):
        if m[name] is not None:
            state.fields[name] = int(m[name])
    for name in ("bus_id", "comm_id"):
        if m[name] is not None:
            state.fields[name] = m[name]


def _on_nvls(b: NcclLogBuilder, line: str) -> None:
    m = _NVLS_COMM.search(line)
    if m:
        _append_new(b.nvls_comms, m["comm"])


def process_of(line: str) -> tuple[str, int] | None:
    """The (host, pid) of an NCCL debug line's ``host:pid:tid [dev]`` prefix (None for any other line)."""
    m = _PREFIX.search(line[:MAX_LINE])
    return (m["host"], int(m["pid"])) if m else None


def is_warning(line: str) -> bool:
    """Whether a line is one of NCCL's WARN lines (of any era)."""
    return " WARN" in line and _WARN.search(line[:MAX_LINE]) is not None


def warning_text(line: str) -> str | None:
    """The message of an ``NCCL WARN`` line (None for any other line)."""
    m = _WARN.search(line[:MAX_LINE])
    return m["message"].strip() if m else None


def _on_warn(b: NcclLogBuilder, line: str) -> None:
    message = warning_text(line)
    if message is not None:
        _extend_bounded(b.warnings, [message])


def _on_via(b: NcclLogBuilder, line: str) -> None:
    m = _CONNECTION.search(line)
    if m:
        _extend_bounded(b.connections, [_connection(m, int(m["src"]), int(m["dst"]))])
        return
    m = _COLLNET_CONNECTION.search(line)
    if m:
        rank = int(m["rank"])
        _extend_bounded(b.connections, [_connection(m, rank, rank)])


# (substrings, any of which sends the line to the handler); a line may go to several handlers.
_HANDLERS: tuple[tuple[tuple[str, ...], Callable[[NcclLogBuilder, str], None]], ...] = (
    (("NCCL version",), _on_version),
    (("cudaDriverVersion",), _on_cuda_driver),
    (("Bootstrap",), _on_bootstrap),
    (("NET/Socket", "NET/IB"), _on_net_using),
    (("Using network",), _on_network),
    (("set by environment to",), _on_env),
    (("P2P", "peer query failed", "Legacy IPC"), _on_p2p_warning),
    (("comm 0x",), _on_init),
    (("NVLS comm",), _on_nvls),
    ((" WARN",), _on_warn),
    ((" via ",), _on_via),
)


def parse(text: str) -> NcclLog:
    """Parse the NCCL_DEBUG output of one process (or several, interleaved); never raises."""
    builder = NcclLogBuilder()
    builder.feed(text)
    return builder.build([], [])


NCCL_LOG_BYTES = 256 << 20  # a rank's NCCL_DEBUG=INFO output of one case: some MiB where it is large


def parse_files(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> NcclLog:
    """Parse and merge several log files (one per rank); files that cannot be read are listed, not fatal."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    builder = NcclLogBuilder()
    files: list[str] = []
    skipped: list[str] = []
    for path in paths:
        try:
            data = read_bounded(Path(path), NCCL_LOG_BYTES)
        except (OSError, ValueError):  # NotReadable: too big, or a FIFO; ValueError: a NUL byte in the path
            skipped.append(os.fspath(path))
            continue
        builder.feed(data.decode("utf-8", errors="replace"))
        files.append(os.fspath(path))
    return builder.build(files, skipped)
