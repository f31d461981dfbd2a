"""The transport NCCL picks by default, and so the rungs a pair case climbs (plan/transport.py, relevance.py).

Each row cites the NCCL source it encodes (read in NVIDIA/nccl at the tag named).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance.discover.cpu import cpu_kind, host_cpu
from conformance.discover.versions import NcclVersions, loaded_nccl_version
from conformance.plan.matrix import BUILTIN_LADDER
from conformance.plan.relevance import Between, cannot_change
from conformance.plan.transport import NcclHost, PairPath, transport_surprise

TRANSPORT_TABLE = [
    # link, NVML P2P read+write OK, CPU, GPUs in the communicator, NCCL -> transport, rungs a pair climbs
    # paths.cc v2.23.4-1 .. v2.30.7-1: default level PXB; PIX and PXB pairs use P2P
    ("PIX", True, "intel", 2, "2.27.3", "P2P", ["cumem_off", "p2p_level_nvl", "p2p_shm_off", "net_socket"]),
    ("PXB", True, "intel", 8, "2.28.9", "P2P", ["cumem_off", "p2p_level_nvl", "p2p_shm_off", "net_socket"]),
    # ... and nothing beyond: PHB, nvidia-smi's NODE (NCCL's PHB: topo.cc topoPathTypeStr) and SYS use SHM;
    # cuMem host memory backs SHM from 2.24 (cudawrap.cc v2.24.3-1), so cumem_host_off comes first
    ("PHB", True, "intel", 2, "2.27.3", "SHM", ["cumem_host_off", "cumem_off", "shm_off", "net_socket"]),
    ("NODE", True, "intel", 2, "2.27.3", "SHM", ["cumem_host_off", "cumem_off", "shm_off", "net_socket"]),
    ("SYS", True, "intel", 2, "2.27.3", "SHM", ["cumem_host_off", "cumem_off", "shm_off", "net_socket"]),
    # paths.cc v2.23.4-1 ..: AMD x86 with at most 2 GPUs in the communicator: level SYS
    ("SYS", True, "amd", 2, "2.27.3", "P2P", ["cumem_off", "p2p_level_nvl", "p2p_shm_off", "net_socket"]),
    ("SYS", True, "amd", 3, "2.27.3", "SHM", ["cumem_host_off", "cumem_off", "shm_off", "net_socket"]),
    # paths.cc v2.9.9-1 .. v2.22.3-1: default SYS, PXB on Intel, Zhaoxin and ARM: AMD keeps SYS for any count
    ("SYS", True, "amd", 8, "2.21.5", "P2P", ["cumem_off", "p2p_level_nvl", "p2p_shm_off", "net_socket"]),
    ("SYS", True, "intel", 2, "2.21.5", "SHM", ["cumem_off", "shm_off", "net_socket"]),  # no cuMem host before 2.24
    ("PHB", True, "arm", 2, "2.18.3", "SHM", ["shm_off", "net_socket"]),  # cuMem off by default in 2.18 (cudawrap.cc)
    ("SYS", True, "power", 2, "2.20.5", "P2P", ["cumem_off", "p2p_level_nvl", "p2p_shm_off", "net_socket"]),
    # paths.cc (every era read): P2P only where NVML reports read and write OK
    ("PIX", False, "intel", 2, "2.27.3", "SHM", ["cumem_host_off", "cumem_off", "shm_off", "net_socket"]),
    # NVLink: P2P at every level but LOC; NVLS on pairs from 2.28.7 (nvls.cc), not before
    ("NV18", True, "intel", 2, "2.27.3", "P2P", ["cumem_off", "p2p_off", "p2p_shm_off", "net_socket"]),
    ("NV18", True, "intel", 2, "2.28.7", "P2P", ["nvls_off", "cumem_off", "p2p_off", "p2p_shm_off", "net_socket"]),
    # NV?: NVLink by NVML's P2P status, its link count unknown (NVLink queries denied): still NVLink rungs
    ("NV?", True, "intel", 2, "2.27.3", "P2P", ["cumem_off", "p2p_off", "p2p_shm_off", "net_socket"]),
    # paths.cc v2.18.3-1 ..: NVML not OK over NVLink fails NCCL's init (WARN ... NCCL_IGNORE_DISABLED_P2P)
    ("NV4", False, "intel", 2, "2.27.3", "REFUSED", ["cumem_off", "p2p_off", "p2p_shm_off", "net_socket"]),
    # NCCL version unknown: the newest rule (PXB), every version-dependent rung tried
    ("PIX", None, "", 2, None, "P2P", ["cumem_off", "p2p_level_nvl", "p2p_shm_off", "net_socket"]),
]  # fmt: skip


@pytest.mark.parametrize(("link", "ok", "cpu", "gpus", "nccl", "transport", "rungs"), TRANSPORT_TABLE)
def test_transport_nccl_picks_and_the_rungs_a_pair_climbs(
    link: str, ok: bool | None, cpu: str, gpus: int, nccl: str | None, transport: str, rungs: list[str]
) -> None:
    host = NcclHost(cpu, nccl)
    predicted = host.pair_transport(PairPath(link, ok), gpus, {})
    assert predicted is not None and predicted.transport == transport, predicted
    pair = Between(2, (PairPath(link, ok),))
    if gpus == 2:
        tried = [
            rung.name
            for k, rung in enumerate(BUILTIN_LADDER)
            if k > 1 and cannot_change(BUILTIN_LADDER, k, pair, host, {}, tuple(range(k))) is None
        ]
        assert tried == rungs


@pytest.mark.parametrize(
    ("environ", "transport"),
    [
        ({"NCCL_P2P_DISABLE": "1"}, "SHM"),  # ncclGetLevel: disable == 1 -> PATH_LOC
        ({"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "SYS"}, "P2P"),  # another value: NCCL_P2P_LEVEL decides
        ({"NCCL_P2P_LEVEL": "NVL"}, "SHM"),
        ({"NCCL_P2P_LEVEL": "SYS"}, "P2P"),
        ({"NCCL_P2P_LEVEL": "NODE"}, "SHM"),  # not one of topoPathTypeStr: ignored, the default PXB stays
        ({"NCCL_P2P_LEVEL": "4"}, "P2P"),  # old numbers: levelsOldToNew[4] = SYS
        ({"NCCL_P2P_LEVEL": "1"}, "SHM"),  # levelsOldToNew[1] = PIX
        ({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, "NET"),  # neither connects: the network
    ],
)
def test_the_environment_moves_the_level_as_ncclGetLevel_reads_it(environ: dict[str, str], transport: str) -> None:
    """paths.cc v2.28.9-1 ncclGetLevel, for a NODE pair on Intel (default PXB: SHM)."""
    predicted = NcclHost("intel", "2.28.9").pair_transport(PairPath("NODE", True), 2, environ)
    assert predicted is not None and predicted.transport == transport


def test_paths_nccl_has_no_rule_for_are_not_predicted() -> None:
    host = NcclHost("intel", "2.28.9")
    assert host.pair_transport(PairPath("NET"), 2, {}) is None
    assert host.transports((PairPath("CPU"),), 2, {}) is None
    rungs = [k for k in range(2, len(BUILTIN_LADDER))]
    assert all(cannot_change(BUILTIN_LADDER, k, Between(2, (PairPath("NET"),)), host, {}) is None for k in rungs)


def test_a_set_is_summarised_per_link_class() -> None:
    host = NcclHost("intel", "2.28.9")
    paths = (PairPath("PIX", True), PairPath("SYS", True), PairPath("PIX", False))
    assert host.summary(paths, 3, {}) == {"PIX": "P2P+SHM", "SYS": "SHM"}


@pytest.mark.parametrize(
    ("predicted", "used", "surprise"),
    [
        ({"PIX": "P2P"}, ["P2P_CUMEM/read"], ""),
        ({"PIX": "P2P"}, ["SHM"], "NCCL used SHM where the suite predicted P2P over PIX"),
        ({"NV18": "P2P", "SYS": "SHM"}, ["P2P_IPC"], ""),  # a ring need not use every pair
        ({"SYS": "SHM"}, ["NET_SOCKET", "SHM"], "NCCL used NET, SHM where the suite predicted SHM over SYS"),
        ({}, ["SHM"], ""),  # nothing predicted (CPU ranks, a path NCCL's rule does not cover)
        ({"PIX": "P2P"}, [], ""),  # no NCCL log (gloo)
    ],
)
def test_a_transport_logged_but_not_predicted_is_a_surprise(
    predicted: dict[str, str], used: list[str], surprise: str
) -> None:
    assert transport_surprise(predicted, used) == surprise


@pytest.mark.parametrize(
    ("machine", "cpuinfo", "kind"),
    [
        ("x86_64", "processor\t: 0\nvendor_id\t: GenuineIntel\n", "intel"),
        ("x86_64", "vendor_id\t: AuthenticAMD\n", "amd"),
        ("x86_64", "vendor_id\t: CentaurHauls\n", "zhaoxin"),
        ("x86_64", "vendor_id\t:   Shanghai  \n", "zhaoxin"),  # NCCL's kvDictCpuVendor: "  Shanghai  "
        ("x86_64", "processor\t: 0\n", "x86"),
        ("aarch64", "CPU implementer\t: 0x41\n", "arm"),
        ("ppc64le", "cpu\t\t: POWER9\n", "power"),
        ("riscv64", "", "other"),
    ],
)
def test_the_cpu_is_classified_as_nccl_does(machine: str, cpuinfo: str, kind: str) -> None:
    """topo.cc v2.28.9-1 kvDictCpuVendor; Linux prints the same CPUID vendor as vendor_id."""
    assert cpu_kind(machine, cpuinfo) == kind


def test_an_unreadable_cpuinfo_is_an_unknown_cpu(tmp_path: Path) -> None:
    assert host_cpu(tmp_path / "no-cpuinfo") == ""


@pytest.mark.parametrize(
    ("loaded", "pip", "used", "warned"),
    [
        ("2.27.5", "2.27.5 (nvidia-nccl-cu12)", "2.27.5", False),
        ("2.28.9", "2.27.5 (nvidia-nccl-cu12)", "2.28.9", True),  # LD_LIBRARY_PATH or a wheel over torch's pin
        ("2.21.5", None, "2.21.5", False),  # an NGC or source build: no wheel at all
        (None, "2.27.5 (nvidia-nccl-cu12)", "2.27.5 (nvidia-nccl-cu12)", False),  # CPU torch: pip's word only
        (None, None, None, False),
    ],
)
def test_the_nccl_version_is_the_library_loaded_and_pip_is_named_only_where_it_differs(
    loaded: str | None, pip: str | None, used: str | None, warned: bool
) -> None:
    versions = NcclVersions(loaded, pip)
    assert versions.used == used
    assert (versions.warning is not None) == warned
    if warned:
        assert versions.warning == (
            "NCCL 2.28.9 is the library torch loads, while pip's 2.27.5 (nvidia-nccl-cu12) says otherwise "
            "(LD_PRELOAD, LD_LIBRARY_PATH, an NGC or source build, or a wheel installed over torch's pin)"
        )


def test_only_a_cuda_build_of_torch_loads_nccl() -> None:
    import torch

    loaded = loaded_nccl_version()
    assert (loaded is None) == (torch.version.cuda is None), loaded
    assert loaded is None or re.fullmatch(r"\d+\.\d+\.\d+", loaded)


@pytest.mark.parametrize(("cuda_driver", "tried"), [("12.4", False), ("12.6", True), ("12.8", True), (None, True)])
def test_cumem_host_off_is_tried_only_where_nccl_uses_cumem_host_memory(cuda_driver: str | None, tried: bool) -> None:
    """cudawrap.cc v2.24.3-1: NCCL_CUMEM_HOST_ENABLE defaults on only with cudaDriverGetVersion >= 12060."""
    host = NcclHost("intel", "2.27.3", cuda_driver)
    k = [r.name for r in BUILTIN_LADDER].index("cumem_host_off")
    reason = cannot_change(BUILTIN_LADDER, k, Between(2, (PairPath("SYS", True),)), host, {}, tuple(range(k)))
    assert (reason is None) == tried, reason
