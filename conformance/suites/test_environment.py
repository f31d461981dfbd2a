"""The host around the GPUs: torch.distributed, name resolution, /dev/shm, limits, variables.

Each check states what a run needs and why.  The checks of the host itself (``host_check``) run no
ranks, and are recorded like cases all the same: the values they find (``host_metric``) are their
record's ``metrics`` in results.jsonl.
"""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

import pytest

from conformance.common.families import inherited_variables
from conformance.discover.inventory import bus_id_list, cuda_count_problem
from conformance.harness.context import RunContext
from conformance.harness.host_checks import HostMetric
from conformance.plan.matrix import DeviceSet
from conformance.plugin import RunCase

# Every host figure below cites where it comes from.  "NCCL's troubleshooting guide" is
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html

# /dev/shm, GPU (NCCL) runs.  NCCL's troubleshooting guide, "Shared memory": NCCL's SHM transport
# creates its segments in /dev/shm; Docker's default of 64 MB is too small, and the guide recommends
# `--shm-size=1g --ulimit memlock=-1` (and systemd `RemoveIPC=no`, so that a logout does not remove
# them).  One SHM connection takes about 9.6 MB: "Error while creating shared memory segment
# /dev/shm/nccl-... (size 9637888)" (NVIDIA/nccl#1518, NVIDIA/nccl#342), that is 4 MiB Simple +
# 512 KiB LL + 4.7 MiB LL128 buffers + a 4 KiB header.  NCCL >= 2.24 with CUDA driver >= 12.6 may
# use cuMem host allocations instead.  1 GiB is NCCL's own Docker recommendation.
SHM_NEEDED_NCCL = 1 << 30
# /dev/shm, CPU (gloo) runs.  gloo exchanges data over TCP, not /dev/shm, so this is only a sanity
# floor: Docker's default size (64 MiB).  Less free than that means /dev/shm is full or missing,
# which breaks torch's shared-memory tensors (torch.multiprocessing, DataLoader workers).
SHM_NEEDED_GLOO = 64 << 20
SHM_RECOMMENDED = "1g"  # NCCL's troubleshooting guide: --shm-size=1g

# Open files.  NCCL's troubleshooting guide, "File Descriptors": "NCCL uses a considerable number of
# file descriptors when running at scale ... a 144-rank job using 16 GIN contexts may require over
# 32K file descriptors per process"; it recommends `* - nofile 131072` in /etc/security/limits.d/.
# NCCL raises the soft limit to the hard limit itself, but only in its bootstrap root
# (NVIDIA/nccl src/bootstrap.cc: setFilesLimit(), called from bootstrapRoot()), i.e. rank 0; every
# other rank keeps the soft limit it inherits, so the soft limit is what is checked.  The hard limit
# matters too: rank 0 runs with it, and without root `ulimit -n` cannot go above it.
# One node: the common soft limit of 1024 is enough: goodfire-ai/spd PR #957 ("At 4+ nodes, NCCL
# bootstrap exhausts it ... 1-node runs never hit it").
OPEN_FILES_ONE_NODE = 1024
# Several nodes: NVIDIA/nccl#127 (socket transport, "too many open files") was fixed by
# `ulimit -n 4096`.  Large jobs need far more (NVIDIA/nccl#1917: a 1000-rank alltoall), hence the
# recommendation below rather than this floor.
OPEN_FILES_MULTI_NODE = 4096
OPEN_FILES_RECOMMENDED = 131072  # NCCL's troubleshooting guide: * - nofile 131072

# Locked memory, where an InfiniBand device exists.  NCCL's troubleshooting guide, "InfiniBand":
# "NCCL WARN Call to ibv_create_qp failed" / "ibv_reg_mr failed": remove the user limits on
# registering pinned memory, `* soft memlock unlimited` and `* hard memlock unlimited` in
# /etc/security/limits.conf; containers: `--ulimit memlock=-1`.  NVIDIA/nccl-tests#206: the limit
# was 8192 (ulimit -l) inside mpirun, and NCCL failed.
MEMLOCK_NEEDED = resource.RLIM_INFINITY
NET_DIR = Path("/sys/class/net")
IB_DIR = Path("/sys/class/infiniband")


def test_torch_distributed_and_backend(conformance_case: RunCase, conformance: RunContext) -> None:
    """torch.distributed imports in a rank, the backend initialises and all-reduces."""
    result = conformance_case("environment", DeviceSet(conformance.topology.devices[:1], None, kind="single"))
    metrics = result.reports[0].metrics
    assert metrics["distributed_available"] is True
    assert metrics[f"{conformance.backend}_available"] is True
    problem = cuda_count_problem(metrics.get("cuda_devices"), len(conformance.topology.devices))  # GPU runs only
    assert problem is None, problem


@pytest.mark.host_check("hostname")
def test_hostname_resolves_to_bindable_address(host_metric: HostMetric) -> None:
    """Gloo (and NCCL's bootstrap) bind to what the host name resolves to."""
    hostname = socket.gethostname()
    try:
        infos = socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        pytest.fail(f"host name {hostname!r} does not resolve ({exc}); fix /etc/hosts or set GLOO_SOCKET_IFNAME")
    addresses = sorted({str(info[4][0]) for info in infos})
    host_metric("hostname_addresses", ",".join(addresses))
    bindable = []
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], 0))
                bindable.append(sockaddr[0])
            except OSError:
                continue
    assert bindable, f"{hostname!r} resolves to {addresses}, none of which this host can bind"


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def shm_needed(backend: str, shm_used: bool = True) -> int:
    """NCCL's 1 GiB where its SHM transport is used; else the sanity floor."""
    return SHM_NEEDED_NCCL if backend == "nccl" and shm_used else SHM_NEEDED_GLOO


def shm_problem(free: int, backend: str, shm_used: bool = True) -> str | None:
    """None when ``free`` bytes in /dev/shm are enough for ``backend``; else what to do, in one paragraph.

    ``shm_used``: NCCL would use its SHM transport between some of the run's GPUs (plan/transport.py).
    """
    needed = shm_needed(backend, shm_used)
    if free >= needed:
        return None
    if backend == "nccl" and shm_used:
        why = (
            "NCCL's SHM transport creates its segments there, about 9.6 MB per connection "
            "(NVIDIA/nccl#1518), and NCCL's troubleshooting guide asks for 1 GiB"
        )
    else:
        user = "gloo itself uses TCP" if backend != "nccl" else "no pair of its GPUs uses NCCL's SHM transport"
        why = f"{user}, but torch's shared-memory tensors live there; this is only a sanity floor"
    return (
        f"/dev/shm has {free >> 20} MiB free; a {backend} run needs at least {needed >> 20} MiB: {why}. "
        f"Containers: start with `--shm-size={SHM_RECOMMENDED} --ulimit memlock=-1` (NCCL's troubleshooting guide) "
        f"or `--ipc=host`; Kubernetes: mount an emptyDir with medium Memory at /dev/shm; a host: remove stale "
        f"/dev/shm/nccl-* segments or enlarge it as root with `mount -o remount,size=1G /dev/shm`."
    )


@pytest.mark.host_check("dev_shm")
def test_dev_shm_space(conformance: RunContext, host_metric: HostMetric) -> None:
    """/dev/shm has room for NCCL's SHM transport (GPU runs) or a sanity floor (CPU runs)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError as exc:
        pytest.fail(f"/dev/shm is not usable ({exc}); NCCL's SHM transport and torch's shared tensors need it")
    free = stat.f_bavail * stat.f_frsize
    shm_used = conformance.shm_predicted
    host_metric("dev_shm_free_bytes", free)
    host_metric("dev_shm_needed_bytes", shm_needed(conformance.backend, shm_used))
    if conformance.backend == "nccl" and not shm_used and free < SHM_NEEDED_NCCL:
        host_metric(
            "note", f"/dev/shm has {free >> 20} MiB free, less than NCCL's 1 GiB, but no pair of this run's GPUs uses "
            "NCCL's SHM transport by default (P2P or one GPU): only the sanity floor applies",
        )  # fmt: skip
    problem = shm_problem(free, conformance.backend, shm_used)
    assert problem is None, problem


def open_files_needed(nnodes: int) -> int:
    """The soft open-file limit a run over ``nnodes`` nodes needs (see the constants' sources)."""
    return OPEN_FILES_MULTI_NODE if nnodes > 1 else OPEN_FILES_ONE_NODE


def open_files_problem(soft: int, hard: int, nnodes: int) -> str | None:
    """None when the soft limit is enough for ``nnodes`` nodes; else what to do, in one paragraph."""
    needed = open_files_needed(nnodes)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    run = "a one-node run" if nnodes <= 1 else f"a {nnodes}-node run"
    evidence = (
        "1024 is enough on one node (goodfire-ai/spd PR #957: 1-node runs never hit it)"
        if nnodes <= 1
        else "across nodes NCCL's sockets ran out of descriptors until the limit was 4096 (NVIDIA/nccl#127)"
    )
    if hard != resource.RLIM_INFINITY and hard < needed:
        how = (
            f"The hard limit ({hard}) is below that too, so only root can raise it: "
            f"`* - nofile {OPEN_FILES_RECOMMENDED}` in a file under /etc/security/limits.d/ (NCCL's "
            "troubleshooting guide), then log in again"
        )
    else:
        target = OPEN_FILES_RECOMMENDED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_RECOMMENDED)
        how = (
            f"Raise it with `ulimit -n {target}` in the job script before the run (at most the hard limit), "
            f"or for every login with `* - nofile {OPEN_FILES_RECOMMENDED}` in a file under "
            "/etc/security/limits.d/ (NCCL's troubleshooting guide)"
        )
    return (
        f"open-file limit (RLIMIT_NOFILE) is soft {soft}, hard {_limit(hard)}; {run} needs a soft limit of at "
        f"least {needed}: NCCL raises only rank 0 to the hard limit, every other rank keeps the soft limit it "
        f"inherits, and {evidence}. {how}; containers: "
        f"`--ulimit nofile={OPEN_FILES_RECOMMENDED}:{OPEN_FILES_RECOMMENDED}`."
    )


@pytest.mark.host_check("open_files")
def test_open_file_limit(conformance: RunContext, host_metric: HostMetric) -> None:
    """The soft open-file limit suits the run's node count (NCCL raises only rank 0's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nnodes = conformance.setup.nnodes if conformance.setup else 1
    host_metric("nofile_soft", _limit(soft))
    host_metric("nofile_hard", _limit(hard))
    host_metric("nofile_needed", open_files_needed(nnodes))
    problem = open_files_problem(soft, hard, nnodes)
    assert problem is None, problem


def memlock_problem(soft: int, hard: int, ib_devices: list[str]) -> str | None:
    """None when the locked-memory limit is unlimited; else what to do, in one paragraph."""
    if soft == MEMLOCK_NEEDED:
        return None
    user = "`ulimit -l unlimited` in the job script, or " if hard == resource.RLIM_INFINITY else ""
    return (
        f"locked-memory limit (RLIMIT_MEMLOCK) is soft {_limit(soft)} bytes, hard {_limit(hard)}, with InfiniBand "
        f"devices {ib_devices}; it must be unlimited: NCCL registers its buffers with the InfiniBand devices and "
        "otherwise fails with 'NCCL WARN Call to ibv_reg_mr failed' or 'ibv_create_qp failed'. "
        f"Set {user}`* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.conf "
        "(NCCL's troubleshooting guide), then log in again; containers: `--ulimit memlock=-1`; launchers such as "
        "mpirun must pass the limit on to the ranks (NVIDIA/nccl-tests#206)."
    )


@pytest.mark.host_check("locked_memory")
def test_locked_memory_limit(conformance: RunContext, host_metric: HostMetric) -> None:
    """InfiniBand registers memory: the locked-memory limit must be unlimited where IB is used (across nodes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    host_metric("memlock_soft", _limit(soft))
    host_metric("memlock_hard", _limit(hard))
    ib_devices = sorted(p.name for p in IB_DIR.iterdir()) if IB_DIR.is_dir() else []
    if not ib_devices:
        pytest.skip(f"no InfiniBand device, so the locked-memory limit ({_limit(soft)}) does not matter here")
    nnodes = conformance.setup.nnodes if conformance.setup else 1
    problem, note = memlock_verdict(soft, hard, ib_devices, nnodes)
    if note:
        host_metric("note", note)
    assert problem is None, problem


def memlock_verdict(soft: int, hard: int, ib_devices: list[str], nnodes: int) -> tuple[str | None, str | None]:
    """(the problem that fails the check, a note for a pass) for a run over ``nnodes`` nodes.

    Within a node NCCL connects GPUs by P2P or SHM and registers no InfiniBand memory (ncclTransports
    order, src/transport.cc v2.28.9-1): only a run across nodes needs the limit.
    """
    problem = memlock_problem(soft, hard, ib_devices)
    if problem is not None and nnodes <= 1:
        return None, f"one node: NCCL registers no InfiniBand memory here; a job across nodes: {problem}"
    return problem, None


def _interface_matches(spec: str, interfaces: list[str], exact: bool) -> list[str]:
    names = [n for n in spec.split(",") if n]
    if exact:
        return [i for i in interfaces if i in names]
    return [i for i in interfaces if any(i.startswith(n) for n in names)]


@pytest.mark.host_check("socket_interfaces")
def test_socket_interface_variables(host_metric: HostMetric) -> None:
    """Inherited NCCL_/GLOO_ variables are listed; an interface they name must exist."""
    inherited = inherited_variables()
    host_metric("inherited_env", " ".join(f"{k}={v}" for k, v in inherited.items()))
    interfaces = sorted(p.name for p in NET_DIR.iterdir()) if NET_DIR.is_dir() else []
    checked = 0
    gloo = inherited.get("GLOO_SOCKET_IFNAME")
    if gloo is not None:
        checked += 1
        assert not gloo.startswith(("^", "=")), (
            f"GLOO_SOCKET_IFNAME={gloo!r}: gloo takes concrete interface names, not NCCL's ^/= syntax"
        )
        missing = [n for n in gloo.split(",") if n not in interfaces]
        assert not missing, f"GLOO_SOCKET_IFNAME={gloo!r} names {missing}, not among {interfaces}"
    nccl = inherited.get("NCCL_SOCKET_IFNAME")
    if nccl is not None and not nccl.startswith("^"):
        checked += 1
        exact = nccl.startswith("=")
        assert _interface_matches(nccl.lstrip("="), interfaces, exact), (
            f"NCCL_SOCKET_IFNAME={nccl!r} matches none of {interfaces}"
        )
    if not checked:
        pytest.skip("no GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME (without ^) to check")


@pytest.mark.host_check("gpu_inventory")
def test_gpu_inventory(conformance: RunContext, host_metric: HostMetric) -> None:
    """NVML lists every NVIDIA GPU on the PCI bus, and the machine has the GPUs --expect-gpus asks for.

    The PCI bus lists a GPU whatever its driver's state; one missing from NVML failed to initialise
    (``RmInitAdapter failed``) or fell off the bus (Xid 79).  CUDA_VISIBLE_DEVICES hiding GPUs on
    purpose is no loss: the machine's count is NVML's, the tested set is the visible one.
    """
    inventory, expected = conformance.topology.inventory, conformance.settings.expect_gpus
    host_metric("pci_gpus", len(inventory.pci_gpus))
    host_metric("nvml_gpus", None if inventory.nvml_gpus is None else len(inventory.nvml_gpus))
    host_metric("tested_gpus", sum(d.kind == "gpu" for d in conformance.topology.devices))
    host_metric("container", inventory.container)
    if expected is None and not inventory.nvidia_present and not inventory.nvml_gpus:
        pytest.skip("no NVIDIA GPU on this machine, and none expected (--expect-gpus)")
    if expected is None and inventory.container:
        pytest.skip(
            "in a container the PCI bus lists the host's GPUs, given to it or not: only --expect-gpus judges the count"
        )
    missing = inventory.not_in_nvml()
    assert not missing, (
        f"{len(missing)} GPU(s) on the PCI bus that NVML does not list: {bus_id_list(missing)} "
        f"({inventory.counts_text()}); they failed to initialise or fell off the bus: "
        "`dmesg | grep -i -e RmInitAdapter -e Xid`; reset the GPU or reboot, a GPU that stays lost is a hardware case"
    )
    assert expected is None or inventory.machine_gpus >= expected, (
        f"the machine has {inventory.machine_gpus} GPU(s) ({inventory.counts_text()}) where "
        f"{conformance.settings.source('expect_gpus')} expects {expected}"
    )


@pytest.mark.conformance_gpu
@pytest.mark.host_check("nvml_driver")
def test_nvml_driver(conformance: RunContext, host_metric: HostMetric) -> None:
    """NVML answers and reports a driver version (GPU only)."""
    if conformance.topology.source != "nvml":
        pytest.skip(f"GPU-only check: {conformance.topology.note or 'no GPU in this run'}")
    import pynvml

    pynvml.nvmlInit()
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    host_metric("driver", version)
    assert version, "NVML reports no driver version"
