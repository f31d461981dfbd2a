"""The transport NCCL picks between two GPUs of one node, by NCCL's own rule: P2P, SHM or the network.

NCCL uses P2P between two GPUs when their path is no farther than its P2P level and NVML reports
P2P read and write OK (``ncclTopoCheckP2p``, ``src/graph/paths.cc``); else SHM unless
``NCCL_SHM_DISABLE=1`` (``src/transport/shm.cc``); else the network.  The default level changed:

- NCCL 2.9 to 2.22 (``paths.cc`` v2.9.9-1 .. v2.22.3-1): SYS ("use P2P whenever we can"), lowered
  to PXB on ARM, on Intel x86 and on Zhaoxin x86 (so AMD and POWER keep SYS).  Older releases
  (v2.7.8-1: Intel PHB, PXB on Broadwell) are read with this rule too: torch 2.0 pinned NCCL 2.14.3.
- NCCL 2.23 on (``paths.cc`` v2.23.4-1 .. v2.30.7-1): PXB ("don't use P2P across CPU host
  bridges"), raised to SYS on AMD x86 when the communicator has at most 2 GPUs on the node.

``NCCL_P2P_DISABLE=1`` sets the level to LOC (no P2P between two GPUs); ``NCCL_P2P_LEVEL`` takes a
path name or an old number (0..5 -> LOC, PIX, PXB, PHB, SYS, SYS); any other value leaves the
default (``ncclGetLevel``, ``paths.cc`` v2.28.9-1).  nvidia-smi's ``NODE`` (host bridges of one
NUMA node) is NCCL's PHB: NCCL has no NODE path (``topoPathTypeStr``, ``src/graph/topo.cc``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from conformance.common.versions import release
from conformance.discover.cpu import AMD, ARM, INTEL, ZHAOXIN
from conformance.discover.topology import Device, Topology
from conformance.plan.net_path import net_better, network_off

P2P, SHM, NET, REFUSED = "P2P", "SHM", "NET", "REFUSED"  # REFUSED: NCCL's init fails (see pair_transport)
# NCCL's path types, nearest first (src/graph/topo.h, v2.28.9-1: LOC NVL NVB C2C PIX PXB P2C PXN PHB SYS).
NCCL_PATHS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")  # levelsOldToNew, paths.cc v2.28.9-1
# NVLink: nvidia-smi's NV<n>, or NV? where NVML's P2P status says NVLink but the link count is unknown
# (NVLink queries denied in a container: discover/nvml_topology.py).
NVLINK = re.compile(r"NV(?:\d+|\?)")
SMI_TO_NCCL = {"PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
PCIE_PATHS_NEAREST_FIRST = tuple(SMI_TO_NCCL)  # nvidia-smi's PCIe / CPU path classes, as nvidia-smi topo -m orders them
PCIE_PATHS = frozenset(PCIE_PATHS_NEAREST_FIRST)
PXB_DEFAULT_FROM = (2, 23, 0)  # paths.cc v2.23.4-1: default level PXB; v2.22.3-1 and before: SYS
NEWEST_RULE = "2.23+"


def cuda_version(text: str | None) -> tuple[int, int] | None:
    """A CUDA version's major and minor ("12.8", "12.6.1"): what the driver supports or torch was built for."""
    found = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(found[1]), int(found[2])) if found else None


@dataclass(frozen=True)
class PairPath:
    """What lies between two GPUs, as NCCL reads it: nvidia-smi's class and NVML's P2P read and write."""

    link: str  # "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"; anything else is not a path NCCL's rule covers
    p2p_ok: bool | None = None  # NVML reports read and write OK (None: not known, taken as OK)
    net_better: bool = False  # each GPU reaches a NIC faster than the other GPU (net_path.py: ncclTopoCheckNet)


@dataclass(frozen=True)
class Prediction:
    transport: str  # P2P, SHM, NET or REFUSED
    why: str


@dataclass(frozen=True)
class NcclHost:
    """What NCCL reads about the node besides a case's environment."""

    cpu: str = ""  # discover/cpu.py's kind ("" unknown: NCCL's rule for an unknown x86 vendor)
    nccl: str | None = None  # the NCCL version (None: unknown, the newest rule is assumed)
    cuda_driver: str | None = None  # the CUDA version the driver supports ("12.8"; None: unknown)

    def default_level(self, gpus: int) -> tuple[str, str]:
        """NCCL's default P2P level for a communicator with ``gpus`` GPUs on this node, and why."""
        version = release(self.nccl)
        era = f"NCCL {self.nccl}" if version else f"NCCL of unknown version (rule of {NEWEST_RULE})"
        if version is not None and version < PXB_DEFAULT_FROM:
            if self.cpu in (INTEL, ZHAOXIN, ARM):
                return "PXB", f"{era} on {self.cpu} CPUs: default P2P level PXB"
            return "SYS", f"{era} on {self.cpu or 'this'} CPU: default P2P level SYS"
        if self.cpu == AMD and gpus <= 2:
            return "SYS", f"{era} on AMD CPUs with {gpus} GPUs: default P2P level SYS"
        return "PXB", f"{era}: default P2P level PXB (no P2P across CPU host bridges)"

    def level(self, gpus: int, environ: Mapping[str, str]) -> tuple[str, str]:
        """The P2P level under ``environ``: NCCL_P2P_DISABLE=1, else a valid NCCL_P2P_LEVEL, else the default."""
        if _integer(environ.get("NCCL_P2P_DISABLE", "")) == 1:
            return "LOC", "NCCL_P2P_DISABLE=1"
        text = environ.get("NCCL_P2P_LEVEL", "")
        if text in NCCL_PATHS:
            return text, f"NCCL_P2P_LEVEL={text}"
        number = _leading_integer(text)
        if number is not None:
            return OLD_LEVELS[min(number, len(OLD_LEVELS) - 1)], f"NCCL_P2P_LEVEL={text}"
        return self.default_level(gpus)

    def pair_transport(self, pair: PairPath, gpus: int, environ: Mapping[str, str]) -> Prediction | None:
        """What NCCL uses between these two GPUs in a communicator of ``gpus`` GPUs (None: not a path it knows)."""
        path = "NVL" if NVLINK.fullmatch(pair.link) else SMI_TO_NCCL.get(pair.link)
        if path is None:
            return None
        level, why = self.level(gpus, environ)
        # p2p.cc and shm.cc (v2.18.3-1 .. v2.30.7-1) both give way to the network where it is faster (net_path.py)
        net = Prediction(NET, f"{pair.link}: each GPU reaches a NIC faster than the other GPU (ncclTopoCheckNet)")
        if pair.net_better and network_off(environ) is None and not (path == "NVL" and pair.p2p_ok is False):
            return net
        if NCCL_PATHS.index(path) <= NCCL_PATHS.index(level):
            if pair.p2p_ok is not False:
                return Prediction(P2P, f"{pair.link} within P2P level {level} ({why})")
            # paths.cc (v2.18.3-1 .. v2.30.7-1): NVML not OK on an NVLink path fails NCCL's init with a WARN
            # unless NCCL_IGNORE_DISABLED_P2P is set; on a PCIe path P2P is quietly not used.
            if path == "NVL" and _integer(environ.get("NCCL_IGNORE_DISABLED_P2P", "0")) in (0, None):
                return Prediction(REFUSED, "NVML reports P2P disabled between NVLink-connected GPUs")
            why = f"NVML reports P2P read or write not OK over {pair.link}"
        else:
            why = f"{pair.link} beyond P2P level {level} ({why})"
        if _integer(environ.get("NCCL_SHM_DISABLE", "0")) == 1:
            return Prediction(NET, f"{why}; NCCL_SHM_DISABLE=1")
        return Prediction(SHM, why)

    def transports(self, pairs: Sequence[PairPath], gpus: int, environ: Mapping[str, str]) -> tuple[str, ...] | None:
        """Each pair's transport in a communicator of ``gpus`` GPUs (None: a path NCCL's rule does not cover)."""
        predicted = [self.pair_transport(pair, gpus, environ) for pair in pairs]
        if any(p is None for p in predicted):
            return None
        return tuple(p.transport for p in predicted if p is not None)

    def summary(self, pairs: Sequence[PairPath], gpus: int, environ: Mapping[str, str]) -> dict[str, str]:
        """Per link class, the transport(s) predicted for its pairs: ``{"PIX": "P2P", "SYS": "SHM"}``."""
        by_link: dict[str, set[str]] = {}
        for pair in pairs:
            predicted = self.pair_transport(pair, gpus, environ)
            if predicted is not None:
                by_link.setdefault(pair.link, set()).add(predicted.transport)
        return {link: "+".join(sorted(found)) for link, found in sorted(by_link.items())}


def _integer(text: str) -> int | None:
    """NCCL's strtol(str, NULL, 0) of a whole value (None: not a number)."""
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def _leading_integer(text: str) -> int | None:
    """An old-style level: NCCL reads the leading digits of a value starting with one."""
    found = re.match(r"\d+", text)
    return int(found.group()) if found else None


def used_transport(label: str) -> str:
    """P2P, SHM or NET for a transport label of the NCCL log (``nccl_transport.py``: ``P2P_IPC/read``, ``NET_IB``)."""
    kind = label.split("/")[0]
    if kind.startswith("P2P"):
        return P2P
    if kind.startswith(("NET", "COLLNET")):
        return NET
    return kind


def transport_surprise(predicted: Mapping[str, str], used_labels: Iterable[str]) -> str:
    """How the transports NCCL logged differ from the predicted ones ("" when they agree or one is unknown).

    A ring connects only neighbours, so a set may leave a predicted transport unused: only a
    transport used but not predicted is a disagreement.
    """
    expected = {t for value in predicted.values() for t in value.split("+")}
    used = {used_transport(label) for label in used_labels}
    if not expected or not used or used <= expected:
        return ""
    over = ", ".join(f"{transport} over {link}" for link, transport in predicted.items())
    return f"NCCL used {', '.join(sorted(used))} where the suite predicted {over}"


def pair_paths(topology: Topology, devices: Sequence[Device]) -> tuple[PairPath, ...]:
    """Every pair of ``devices`` as NCCL reads it, in order (a CPU topology's pairs cover no NCCL path)."""
    paths = []
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            status = topology.p2p_status(a, b)
            ok = None if not status else status.get("read") == "OK" and status.get("write") == "OK"
            paths.append(PairPath(topology.link(a, b), ok, net_better(topology, a, b)))
    return tuple(paths)
