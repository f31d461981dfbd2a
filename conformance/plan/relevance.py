"""Which built-in rungs can change a case, by what lies between its devices and what NCCL would do there.

A rung is tried only where its variables act.  NCCL chooses a transport per pair of GPUs
(``transport.py``): a rung that only changes that choice (``NCCL_P2P_LEVEL``, ``NCCL_P2P_DISABLE``,
``NCCL_SHM_DISABLE``) is tried only where it gives other transports than the caller's environment
and every earlier such rung of the run, so a pair that already uses SHM never pays a deadline for
"P2P off".  The other rungs act on one kind of path or resource (NVLS needs NVLink, cuMem host
memory backs SHM), so they are tried only where that is there.  Paths NCCL's rule does not cover
(``NET`` between nodes, virtual CPU devices) and rungs this table does not list (``inherited``,
``clean``, the user's, the cross-node ones) may change anything, so they are always tried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from conformance.common.versions import release
from conformance.plan.matrix import Rung
from conformance.plan.transport import NET, NVLINK, PCIE_PATHS, SHM, NcclHost, PairPath, cuda_version


@dataclass(frozen=True)
class Reach:
    """Where a rung's variables act."""

    one_gpu: bool  # a case on a single GPU (no transport between GPUs at all)
    nvlink: bool  # a case with an NVLink path between two of its GPUs
    pcie: bool  # a case with a PCIe or CPU path between two of its GPUs
    why: str


RUNG_REACH: Mapping[str, Reach] = {
    "nvls_off": Reach(False, True, False, "NVLink SHARP (NVLS) needs NVLink"),
    "cumem_host_off": Reach(False, True, True, "cuMem host memory backs NCCL's SHM transport between GPUs"),
    "cumem_off": Reach(True, True, True, "NCCL_CUMEM_ENABLE changes how every NCCL buffer is allocated"),
    "p2p_level_nvl": Reach(False, False, True, "NCCL_P2P_LEVEL=NVL only stops P2P over PCIe paths"),
    "p2p_off": Reach(False, True, True, "P2P is a transport between GPUs"),
    # shm.cc: the SHM transport connects the ranks of two GPUs; NCCL_SHM_DISABLE touches nothing else (the
    # proxy's /dev/shm pool, src/proxy.cc, serves connections, and a world of one has none).
    "shm_off": Reach(False, True, True, "NCCL's SHM transport connects two GPUs"),
    "p2p_shm_off": Reach(False, True, True, "P2P and SHM are transports between GPUs"),
    "ib_off": Reach(False, True, True, "InfiniBand is a transport between GPUs"),
    "net_socket": Reach(False, True, True, "the network transport is between GPUs"),
}
# Rungs that act only through the transport NCCL picks for each pair (transport.py).
TRANSPORT_CHOICE = ("p2p_level_nvl", "p2p_off", "shm_off", "p2p_shm_off")

# NCCL's ncclNvlsInit (src/transport/nvls.cc) returns without NVLS for `gpuCount <= 2` from v2.18.3-1
# to v2.28.3-1, and for `gpuCount < 2` from v2.28.7-1 on: before 2.28.7 a pair never uses NVLS.
NVLS_ON_PAIRS_FROM = (2, 28, 7)
# src/misc/cudawrap.cc: NCCL_CUMEM_ENABLE defaults to 0 in v2.18.3-1 and to -2 (on where the driver
# supports it) from v2.19.3-1; NCCL_CUMEM_HOST_ENABLE exists from v2.23.4-1 (default 0) and defaults
# to -1 (on with a CUDA driver >= 12.6) from v2.24.3-1, used by SHM only (src/transport/shm.cc).
CUMEM_DEFAULT_FROM = (2, 19, 0)
CUMEM_HOST_DEFAULT_FROM = (2, 24, 0)
CUMEM_HOST_DRIVER_FROM = (12, 6)  # cudawrap.cc v2.24.3-1: default on when cudaDriverGetVersion >= 12060


@dataclass(frozen=True)
class Between:
    """What lies between a case's devices."""

    devices: int  # how many GPUs (0: not known)
    paths: tuple[PairPath, ...] = ()  # every pair, as NCCL reads it

    @property
    def links(self) -> tuple[str, ...]:
        return tuple(sorted({p.link for p in self.paths}))


def path_kind(link: str) -> str:
    """``nvlink``, ``pcie`` or ``other`` (a path this table does not know)."""
    if NVLINK.fullmatch(link):
        return "nvlink"
    return "pcie" if link in PCIE_PATHS else "other"


def nvls_min_gpus(nccl: str | None) -> int:
    """The fewest GPUs a communicator of this NCCL version uses NVLS on (unknown version: 2, so it is tried)."""
    version = release(nccl)
    return 3 if version is not None and version < NVLS_ON_PAIRS_FROM else 2


def cannot_change(
    ladder: Sequence[Rung],
    k: int,
    between: Between,
    host: NcclHost,
    environ: Mapping[str, str],
    tried: Sequence[int] = (),
) -> str | None:
    """Why rung ``ladder[k]`` cannot change a case with ``between`` under ``environ``; None if it may.

    ``tried``: the earlier rungs of this run (their indices); a transport-choice rung giving the same
    transports as one of them, or as the first rung, adds nothing.
    """
    name = ladder[k].name
    reach = RUNG_REACH.get(name)
    kinds = {path_kind(link) for link in between.links}
    if reach is None or "other" in kinds:
        return None
    where = _by_reach(name, reach, between, kinds, host)
    if where is not None or not between.paths:
        return where
    if name == "cumem_host_off":
        return _cumem_host_futile(ladder[0], between, host, environ)
    if name == "cumem_off" and _older(host.nccl, CUMEM_DEFAULT_FROM):
        return f"rung cumem_off cannot change a case: NCCL {host.nccl} leaves cuMem off unless asked"
    if name in TRANSPORT_CHOICE:
        return _same_transports(ladder, k, between, host, environ, tried)
    if name == "ib_off":
        return _no_network(ladder[0], ladder[k], between, host, environ)
    return None


def _by_reach(name: str, reach: Reach, between: Between, kinds: set[str], host: NcclHost) -> str | None:
    """Why the rung cannot act on this kind of case at all (one GPU, NVLink only, PCIe only), else None."""
    if name == "nvls_off" and kinds == {"nvlink"} and between.devices < nvls_min_gpus(host.nccl):
        gpus = between.devices
        return f"rung nvls_off cannot change a case on {gpus} GPUs: NCCL {host.nccl} uses NVLS from 3 GPUs only"
    if not kinds:  # no path between GPUs: one GPU, or a set whose devices are not known here
        if between.devices != 1 or reach.one_gpu:
            return None
        return f"rung {name} cannot change a case on one GPU: {reach.why}"
    if (reach.nvlink and "nvlink" in kinds) or (reach.pcie and "pcie" in kinds):
        return None
    return f"rung {name} cannot change a case over {', '.join(between.links)}: {reach.why}"


def _cumem_host_futile(first: Rung, between: Between, host: NcclHost, environ: Mapping[str, str]) -> str | None:
    where = f"rung cumem_host_off cannot change a case over {', '.join(between.links)}"
    if _older(host.nccl, CUMEM_HOST_DEFAULT_FROM):
        return f"{where}: NCCL {host.nccl} uses no cuMem host memory unless asked"
    driver = cuda_version(host.cuda_driver)
    if driver is not None and driver < CUMEM_HOST_DRIVER_FROM:
        return f"{where}: NCCL uses cuMem host memory from CUDA driver 12.6 on, this one is {host.cuda_driver}"
    transports = host.transports(between.paths, between.devices, first.effective(environ))
    if transports is not None and SHM not in transports:
        return f"{where}: NCCL uses no SHM there"
    return None


def _no_network(first: Rung, rung: Rung, between: Between, host: NcclHost, environ: Mapping[str, str]) -> str | None:
    """Why InfiniBand off cannot change the case: NCCL uses no network between its GPUs (None: it may).

    Within a node NCCL tries P2P, then SHM, then the network (ncclTransports, src/transport.cc v2.28.9-1),
    unless the network is faster (ncclTopoCheckNet: net_path.py); the rung acts where either rung uses it.
    """
    for environment in (first.effective(environ), rung.effective(environ)):
        transports = host.transports(between.paths, between.devices, environment)
        if transports is None or NET in transports:
            return None
    return f"rung {rung.name} cannot change a case over {', '.join(between.links)}: NCCL uses no network there"


def _same_transports(
    ladder: Sequence[Rung], k: int, between: Between, host: NcclHost, environ: Mapping[str, str], tried: Sequence[int]
) -> str | None:
    """Why this transport-choice rung gives the transports of an earlier one (None: it gives new ones)."""
    mine = host.transports(between.paths, between.devices, ladder[k].effective(environ))
    if mine is None:
        return None
    for i in (0, *[i for i in tried if 0 < i < k]):
        if host.transports(between.paths, between.devices, ladder[i].effective(environ)) == mine:
            summary = host.summary(between.paths, between.devices, ladder[k].effective(environ))
            uses = ", ".join(f"{transport} over {link}" for link, transport in summary.items())
            where, earlier = ", ".join(between.links), ladder[i].name
            return (
                f"rung {ladder[k].name} cannot change a case over {where}: NCCL would use {uses} as on rung {earlier}"
            )
    return None


def _older(nccl: str | None, than: tuple[int, int, int]) -> bool:
    version = release(nccl)
    return version is not None and version < than
