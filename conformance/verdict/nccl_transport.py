"""The transports NCCL names in its connection lines, and the ``via`` text of such a line read into one.

:func:`classify` turns the text after ``via`` (``P2P/IPC/read``, ``NET/IB/0/GDRDMA``, ...) into a
transport of :data:`TRANSPORTS`, its sorted flags and its relay rank; a text that fits none of the known
forms is ``OTHER``.  The forms by NCCL era are in the module docstring of :mod:`conformance.verdict.nccl_log`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

P2P_CUMEM = "P2P_CUMEM"
P2P_IPC = "P2P_IPC"
P2P_DIRECT = "P2P_DIRECT"
P2P_INDIRECT = "P2P_INDIRECT"
P2P_MNNVL = "P2P_MNNVL"
SHM = "SHM"
NET_IB = "NET_IB"
NET_SOCKET = "NET_SOCKET"
NET_PLUGIN = "NET_PLUGIN"
NVLS = "NVLS"
COLLNET = "COLLNET"
OTHER = "OTHER"
TRANSPORTS = (
    P2P_CUMEM,
    P2P_IPC,
    P2P_DIRECT,
    P2P_INDIRECT,
    P2P_MNNVL,
    SHM,
    NET_IB,
    NET_SOCKET,
    NET_PLUGIN,
    NVLS,
    COLLNET,
    OTHER,
)

FLAG_READ = "read"
FLAG_CE = "CE"
FLAG_GDRDMA = "GDRDMA"
FLAG_PXN = "PXN"
FLAG_SHARED = "shared"

# --------------------------------------------------------------------------------------------
# The via patterns, compiled once.  Every number is bounded so that no match can feed int() a
# string longer than Python's digit limit.
# --------------------------------------------------------------------------------------------

# The "via" text, matched whole.
# P2P: "P2P/CUMEM/read", "P2P/CUMEM/CE", "P2P/MNNVL", "P2P/IPC/read/CE", "P2P/direct pointer/read" (>= 2.19);
# "P2P/IPC" and "P2P/direct pointer" (ranks of one process) in every era.
_VIA_P2P = re.compile(r"P2P/(?P<kind>CUMEM|MNNVL|IPC|direct pointer)(?P<mods>(?:/read|/CE)*)")
# >= 2.12: routed through the GPU of another rank, "P2P/indirect/2[2]/read" (busId in the bracket before 2.19).
_VIA_P2P_INDIRECT = re.compile(
    r"P2P/indirect/(?P<rank>\d{1,7})\[[0-9a-fA-Fx]{1,16}\](?P<mods>(?:/read|/CE)*)", re.ASCII
)
# SHM: "direct shared memory" (older), "SHM/direct/direct", "SHM/CE/direct", "SHM/CE/CE" (newer).
_VIA_SHM = re.compile(r"SHM/(?P<send>direct|CE)/(?P<recv>direct|CE)|direct shared memory")
# NET: "NET/Socket/0" (all eras), "NET/IB/0/GDRDMA" (>= 2.4), "NET/IB/1(3)/GDRDMA/Shared" (>= 2.12, PXN),
# "NET/IB/0/GDRDMA(PCI)/Shared" (>= 2.19), "NET/AWS Libfabric/0", "NET/NCCL RDMA Plugin v6/0(2)/GDRDMA/Shared".
_VIA_NET = re.compile(
    r"NET/(?P<name>[^/]{1,64})/(?P<dev>\d{1,4})(?:\((?P<proxy>\d{1,7})\))?"
    r"(?P<gdr>/GDRDMA(?:\(PCI\))?)?(?P<shared>/Shared)?",
    re.ASCII,
)
# CollNet: "COLLNET/SHARP/0", "COLLNET/SHARP/0/GDRDMA", "COLLNET/SHARP/0/GDRDMA(PCI)".
_VIA_COLLNET = re.compile(r"COLLNET/(?P<name>[^/]{1,64})/(?P<dev>\d{1,4})(?P<gdr>/GDRDMA(?:\(PCI\))?)?", re.ASCII)
# NVLS: no release prints "via NVLS..." per channel; accepted in case one does.
_VIA_NVLS = re.compile(r"NVLS(?:/\S*)?")

_P2P_KINDS = {"CUMEM": P2P_CUMEM, "MNNVL": P2P_MNNVL, "IPC": P2P_IPC, "direct pointer": P2P_DIRECT}
_NET_KINDS = {"IB": NET_IB, "Socket": NET_SOCKET}


# --------------------------------------------------------------------------------------------
# The via text
# --------------------------------------------------------------------------------------------

Kind = tuple[str, tuple[str, ...], int | None]  # transport, flags, relay rank


def _mods(text: str) -> tuple[str, ...]:
    return tuple(sorted(part for part in text.split("/") if part))


def _p2p(m: re.Match[str]) -> Kind:
    return _P2P_KINDS[m["kind"]], _mods(m["mods"]), None


def _p2p_indirect(m: re.Match[str]) -> Kind:
    return P2P_INDIRECT, _mods(m["mods"]), int(m["rank"])


def _shm(m: re.Match[str]) -> Kind:
    return SHM, ((FLAG_CE,) if FLAG_CE in (m["send"], m["recv"]) else ()), None


def _net(m: re.Match[str]) -> Kind:
    flags = [FLAG_GDRDMA] if m["gdr"] else []
    if m["proxy"] is not None:
        flags.append(FLAG_PXN)
    if m["shared"]:
        flags.append(FLAG_SHARED)
    relay = int(m["proxy"]) if m["proxy"] is not None else None
    return _NET_KINDS.get(m["name"], NET_PLUGIN), tuple(sorted(flags)), relay


def _collnet(m: re.Match[str]) -> Kind:
    return COLLNET, ((FLAG_GDRDMA,) if m["gdr"] else ()), None


def _nvls(m: re.Match[str]) -> Kind:
    return NVLS, (), None


_VIA_FORMS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], Kind]], ...] = (
    (_VIA_P2P, _p2p),
    (_VIA_P2P_INDIRECT, _p2p_indirect),
    (_VIA_SHM, _shm),
    (_VIA_NET, _net),
    (_VIA_COLLNET, _collnet),
    (_VIA_NVLS, _nvls),
)


def classify(via: str) -> Kind:
    """The normalised transport, sorted flags and relay rank of a ``via`` text; ``OTHER`` if unknown."""
    for pattern, kind in _VIA_FORMS:
        m = pattern.fullmatch(via)
        if m:
            return kind(m)
    return OTHER, (), None
