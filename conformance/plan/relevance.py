"""Which built-in rungs can change a case, by what lies between its devices: the rule, as a table.

A rung is tried only where its variables act.  NCCL chooses a transport per pair of GPUs from the
path between them (``nvidia-smi topo -m``): NVLink (``NV<n>``), or a PCIe / CPU path (``PIX``,
``PXB``, ``PHB``, ``NODE``, ``SYS``).  A variable that only changes how NCCL uses one kind of path
cannot change a case whose devices are joined by the other kind, and a variable about transports
between GPUs cannot change a case on one GPU.  Paths this table does not know (``NET`` between
nodes, virtual CPU devices) and rungs it does not list (``inherited``, ``clean``, the user's, the
cross-node ones) may change anything, so they are always tried.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NVLINK = re.compile(r"NV\d+")
PCIE_PATHS = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS"})


@dataclass(frozen=True)
class Reach:
    """Where a rung's variables act."""

    one_gpu: bool  # a case on a single GPU (no transport between GPUs at all)
    nvlink: bool  # a case with an NVLink path between two of its GPUs
    pcie: bool  # a case with a PCIe or CPU path between two of its GPUs
    why: str


RUNG_REACH: Mapping[str, Reach] = {
    "cumem_off": Reach(True, True, False, "NCCL_CUMEM_ENABLE changes buffer allocation and NVLink P2P, not PCIe P2P"),
    "nvls_off": Reach(False, True, False, "NVLink SHARP (NVLS) needs NVLink"),
    "p2p_level_nvl": Reach(False, False, True, "NCCL_P2P_LEVEL=NVL only stops P2P over PCIe paths"),
    "p2p_off": Reach(False, True, True, "P2P is a transport between GPUs"),
    "shm_off": Reach(True, True, True, "NCCL makes shared-memory segments even for one GPU"),
    "p2p_shm_off": Reach(False, True, True, "P2P and SHM are transports between GPUs"),
    "ib_off": Reach(False, True, True, "InfiniBand is a transport between GPUs"),
    "net_socket": Reach(False, True, True, "the network transport is between GPUs"),
}


def path_kind(link: str) -> str:
    """``nvlink``, ``pcie`` or ``other`` (a path this table does not know)."""
    if NVLINK.fullmatch(link):
        return "nvlink"
    return "pcie" if link in PCIE_PATHS else "other"


# NCCL's ncclNvlsInit (src/transport/nvls.cc) returns without NVLS for `gpuCount <= 2` from v2.18.3-1
# to v2.28.3-1, and for `gpuCount < 2` from v2.28.7-1 on: before 2.28.7 a pair never uses NVLS.
NVLS_ON_PAIRS_FROM = (2, 28, 7)


def nvls_min_gpus(nccl: str | None) -> int:
    """The fewest GPUs a communicator of this NCCL version uses NVLS on (unknown version: 2, so it is tried)."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", nccl or "")
    version = tuple(int(part) for part in found.groups()) if found else None
    return 3 if version is not None and version < NVLS_ON_PAIRS_FROM else 2


def cannot_change(rung_name: str, devices: int, links: Sequence[str], nccl: str | None = None) -> str | None:
    """Why rung ``rung_name`` cannot change a case on ``devices`` GPUs joined by ``links``; None if it may.

    ``nccl``: the run's NCCL version, where a rule depends on it (None: unknown).
    """
    reach = RUNG_REACH.get(rung_name)
    kinds = {path_kind(link) for link in links}
    if reach is None or "other" in kinds:
        return None
    if rung_name == "nvls_off" and kinds == {"nvlink"} and devices < nvls_min_gpus(nccl):
        return f"rung nvls_off cannot change a case on {devices} GPUs: NCCL {nccl} uses NVLS from 3 GPUs only"
    if not kinds:  # no path between GPUs: one GPU, or a set whose devices are not known here
        if devices != 1 or reach.one_gpu:
            return None
        return f"rung {rung_name} cannot change a case on one GPU: {reach.why}"
    if (reach.nvlink and "nvlink" in kinds) or (reach.pcie and "pcie" in kinds):
        return None
    return f"rung {rung_name} cannot change a case over {', '.join(sorted(set(links)))}: {reach.why}"
