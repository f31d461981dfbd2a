"""The host around the GPUs: torch.distributed, name resolution, /dev/shm, limits, variables.

Each check states what a run needs and why; the values found go into the JUnit properties.
"""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

import pytest

from conformance.matrix import DeviceSet
from conformance.plugin import RunCase
from conformance.session import ConformanceSession, inherited_variables

# NCCL's SHM transport needs segments of tens of MB per peer; Docker's 64 MB default breaks it.
SHM_NEEDED = {"gpu": 1 << 30, "cpu": 64 << 20}
# Each rank holds sockets (and on GPU, NCCL proxy and IPC handles) to every peer.
OPEN_FILES_PER_DEVICE = 256
OPEN_FILES_MINIMUM = 1024
NET_DIR = Path("/sys/class/net")
IB_DIR = Path("/sys/class/infiniband")


def test_torch_distributed_and_backend(conformance_case: RunCase, conformance: ConformanceSession) -> None:
    """torch.distributed imports in a rank, the backend initialises and all-reduces."""
    result = conformance_case("environment", DeviceSet(conformance.topology.devices[:1], None, kind="single"))
    metrics = result.reports[0].metrics
    assert metrics["distributed_available"] is True
    assert metrics[f"{conformance.backend}_available"] is True


def test_hostname_resolves_to_bindable_address(record_property: pytest.RecordProperty) -> None:
    """Gloo (and NCCL's bootstrap) bind to what the host name resolves to."""
    hostname = socket.gethostname()
    try:
        infos = socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        pytest.fail(f"host name {hostname!r} does not resolve ({exc}); fix /etc/hosts or set GLOO_SOCKET_IFNAME")
    addresses = sorted({info[4][0] for info in infos})
    record_property("hostname_addresses", ",".join(addresses))
    bindable = []
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], 0))
                bindable.append(sockaddr[0])
            except OSError:
                continue
    assert bindable, f"{hostname!r} resolves to {addresses}, none of which this host can bind"


def test_dev_shm_space(conformance: ConformanceSession, record_property: pytest.RecordProperty) -> None:
    needed = SHM_NEEDED[conformance.topology.kind]
    try:
        stat = os.statvfs("/dev/shm")
    except OSError as exc:
        pytest.fail(f"/dev/shm is not usable ({exc}); NCCL's SHM transport and torch need it")
    free = stat.f_bavail * stat.f_frsize
    record_property("dev_shm_free_bytes", free)
    assert free >= needed, (
        f"/dev/shm has {free >> 20} MiB free, a {conformance.topology.kind} run needs {needed >> 20} MiB "
        "(containers: --shm-size=1g or --ipc=host)"
    )


def test_open_file_limit(conformance: ConformanceSession, record_property: pytest.RecordProperty) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    record_property("nofile_soft", soft)
    needed = max(OPEN_FILES_MINIMUM, OPEN_FILES_PER_DEVICE * len(conformance.topology.devices))
    assert soft == resource.RLIM_INFINITY or soft >= needed, (
        f"open-file limit {soft} (hard {hard}) is below the {needed} a run on "
        f"{len(conformance.topology.devices)} devices needs; raise it with ulimit -n"
    )


def test_locked_memory_limit(record_property: pytest.RecordProperty) -> None:
    """InfiniBand registers memory: the locked-memory limit must be unlimited where IB is used."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    record_property("memlock_soft", "unlimited" if soft == resource.RLIM_INFINITY else soft)
    ib_devices = sorted(p.name for p in IB_DIR.iterdir()) if IB_DIR.is_dir() else []
    if not ib_devices:
        pytest.skip(f"no InfiniBand device, so the locked-memory limit ({soft}) does not matter here")
    assert soft == resource.RLIM_INFINITY, (
        f"locked-memory limit is {soft} bytes with InfiniBand devices {ib_devices}; "
        "set ulimit -l unlimited (containers: --ulimit memlock=-1)"
    )


def _interface_matches(spec: str, interfaces: list[str], exact: bool) -> list[str]:
    names = [n for n in spec.split(",") if n]
    if exact:
        return [i for i in interfaces if i in names]
    return [i for i in interfaces if any(i.startswith(n) for n in names)]


def test_socket_interface_variables(record_property: pytest.RecordProperty) -> None:
    """Inherited NCCL_/GLOO_ variables are listed; an interface they name must exist."""
    inherited = inherited_variables()
    record_property("inherited_env", " ".join(f"{k}={v}" for k, v in inherited.items()))
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


@pytest.mark.conformance_gpu
def test_nvml_driver(conformance: ConformanceSession, record_property: pytest.RecordProperty) -> None:
    """NVML answers and reports a driver version (GPU only)."""
    if conformance.topology.source != "nvml":
        pytest.skip(f"GPU-only check: {conformance.topology.note or 'no GPU in this run'}")
    import pynvml

    pynvml.nvmlInit()
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    record_property("driver", version)
    assert version, "NVML reports no driver version"
