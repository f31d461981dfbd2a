"""The GPUs' own health, as NVML reports it when the run starts: links, memory, fabric, modes.

Each check is a host check (no ranks): it judges the facts the topology read
(``conformance/discover/health.py``, where each rule cites its source), records every GPU's values
as its metrics, and fails naming each GPU at fault and the fix.  A check with nothing to read (no
GPU, or NVML refusing every query it needs) skips, saying why: unknown is never a pass.  A
simulated machine's topology file carries the same facts.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Sequence
from dataclasses import asdict

import psutil
import pytest

from conformance.discover import health as rules
from conformance.discover.iommu import IOMMU_FIX
from conformance.discover.kernel_log import kernel_xid_problems
from conformance.discover.platform import WSL_NOTE, PlatformFacts
from conformance.discover.rdma import port_problems, rdma_warnings
from conformance.harness.context import RunContext
from conformance.harness.host_checks import WARNING, HostMetric
from conformance.plan.acs import judge_acs
from conformance.plan.transport import NVLINK as NVLINK_CLASS
from conformance.verdict.cuda_errors import nccl_too_old
from conformance.verdict.machine_faults import MACHINE_FAULTS

PCIE = ("pcie_width", "pcie_max_width", "pcie_gen", "pcie_max_gen")
NVLINK = ("nvlinks",)
MEMORY = ("ecc_uncorrected", "remap_pending", "remap_failed", "retired_pages_pending")
FABRIC = ("fabric_state", "fabric_status")
MODES = ("persistence", "compute_mode")
CLOCKS = ("slowdowns",)
PROCESSES = ("processes",)
KERNEL_XIDS = ("kernel_xids", "kernel_xids_before_load")
NVLINK_P2P_FIX = next(f.fix for f in MACHINE_FAULTS if f.name.startswith("NVLINK P2P DISABLED"))


def _facts(
    conformance: RunContext, fields: Sequence[str], host_metric: HostMetric, unknown: str = ""
) -> rules.HealthMap:
    """The GPUs' facts for ``fields``, recorded as metrics; skips when there is nothing to judge (``unknown``: why)."""
    topology = conformance.topology
    if topology.kind != "gpu":
        pytest.skip(f"GPU-only check: {topology.note or 'no GPU in this run'}")
    health = topology.health
    for name, values in rules.health_values(health, fields).items():
        host_metric(name, values)
    if not rules.known(health, fields):
        pytest.skip(
            unknown
            or f"no GPU's health says {', '.join(fields)} (NVML does not support or denies them here, or the "
            "topology file has no health)"
        )
    return health


def _fail_on(problems: rules.Problems) -> None:
    """Fails naming each problem once, with every GPU that has it."""
    gpus: dict[str, list[str]] = {}
    for name, problem in problems.items():
        gpus.setdefault(problem, []).append(name)
    assert not problems, "; ".join(f"{', '.join(names)}: {problem}" for problem, names in gpus.items())


@pytest.mark.host_check("rdma_ports")
def test_rdma_ports_up_at_their_rate(conformance: RunContext, host_metric: HostMetric) -> None:
    """Every InfiniBand and RoCE port NCCL may use is ACTIVE at its siblings' rate (``discover/rdma.py``).

    A port down among active siblings, one whose link is up but not ACTIVE, or one below its siblings'
    rate is an ERROR naming it; no GPUDirect RDMA module, or RoCE without a RoCE v2 GID, a WARNING.
    """
    facts = conformance.topology.rdma
    if facts.unread:
        pytest.skip(f"the RDMA ports could not be read: {facts.unread}")
    if not facts.ports:
        pytest.skip("no InfiniBand or RoCE port on this node (/sys/class/infiniband)")
    host_metric("ports", [p.text() for p in facts.ports])
    warnings = rdma_warnings(facts, len(conformance.topology.devices) if conformance.topology.kind == "gpu" else 0)
    if warnings:
        host_metric(WARNING, "; ".join(warnings))
    problems = port_problems(facts, conformance.nccl_environ)
    assert not problems, "; ".join(problems)


@pytest.mark.host_check("pcie_link")
def test_pcie_links_trained_to_their_width(conformance: RunContext, host_metric: HostMetric) -> None:
    """Each GPU's PCIe link runs at the width the GPU and its slot allow."""
    _fail_on(rules.pcie_problems(_facts(conformance, PCIE, host_metric)))


@pytest.mark.host_check("nvlink")
def test_nvlinks_up(conformance: RunContext, host_metric: HostMetric) -> None:
    """No GPU has fewer NVLinks up than its siblings of the same model."""
    health = _facts(conformance, NVLINK, host_metric, "no NVLink: NVML reports none on these GPUs")
    models = {d.name: d.model for d in conformance.topology.devices}
    _fail_on(rules.nvlink_problems(health, models))


@pytest.mark.host_check("gpu_memory")
def test_gpu_memory_errors(conformance: RunContext, host_metric: HostMetric) -> None:
    """No uncorrectable ECC error, no row remapping pending or failed, no page retirement pending."""
    _fail_on(rules.memory_problems(_facts(conformance, MEMORY, host_metric)))


@pytest.mark.host_check("fabric_manager")
def test_fabric_manager_registered_every_gpu(conformance: RunContext, host_metric: HostMetric) -> None:
    """NVSwitch systems: Fabric Manager has registered every GPU (else every CUDA call fails, error 802)."""
    no_fabric = "no NVSwitch fabric: NVML reports no Fabric Manager state for these GPUs"
    _fail_on(rules.fabric_problems(_facts(conformance, FABRIC, host_metric, no_fabric)))


@pytest.mark.host_check("gpu_modes")
def test_gpu_compute_modes(conformance: RunContext, host_metric: HostMetric) -> None:
    """No GPU prohibits compute; persistence off is a WARNING (as DCGM's); exclusive mode explains "busy"."""
    health = _facts(conformance, MODES, host_metric)
    off = rules.persistence_off(health)
    if off:
        host_metric(WARNING, f"{', '.join(off)}: persistence mode off: each job waits for the GPU to initialise and "
                             f"its clocks and modes reset between jobs -> {rules.PERSISTENCE_FIX}")  # fmt: skip
    _fail_on(rules.mode_problems(health))


@pytest.mark.host_check("gpu_clocks")
def test_no_gpu_held_down_by_its_hardware(conformance: RunContext, host_metric: HostMetric) -> None:
    """No GPU's clocks are held down by a hardware, thermal or power-brake slowdown when the run starts."""
    _fail_on(rules.clock_problems(_facts(conformance, CLOCKS, host_metric)))


@pytest.mark.host_check("gpu_processes")
def test_other_users_processes_on_the_gpus(conformance: RunContext, host_metric: HostMetric) -> None:
    """Processes not of this run holding GPU memory at the start (another user's, this user's leftover): a warning."""
    health = _facts(conformance, PROCESSES, host_metric)
    others = rules.foreign_processes(health, _process_owner, getpass.getuser())
    if others:
        host_metric(WARNING, "; ".join(f"{name}: {text}" for name, text in others.items()))


@pytest.mark.host_check("xid_log")
def test_no_gpu_fault_in_the_kernel_log(conformance: RunContext, host_metric: HostMetric) -> None:
    """No Xid of a GPU fault in the kernel log since the driver's last load (NVIDIA's Xid catalog).

    A WARNING: an application's Xid, one the table does not know, one before the driver's last load
    (the reload reset the GPU), and one of the GPU's memory that NVML's state shows reset since
    (``discover/watch.py``: xid_cleared). The Xids during the run come from NVML's events instead,
    each naming its case.
    """
    unread = conformance.topology.kernel_log or 'the kernel log was not read (a topology file without "kernel_xids")'
    machine, warnings = kernel_xid_problems(_facts(conformance, KERNEL_XIDS, host_metric, unread))
    if warnings:
        host_metric(WARNING, "; ".join(f"{name}: {text}" for name, text in warnings.items()))
    _fail_on(machine)


def _process_owner(pid: int) -> rules.ProcessOwner:
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            ours = _run_root() in (pid, *(p.pid for p in process.parents()))
            command = " ".join(" ".join(process.cmdline()).split())[:120] or process.name()  # one line
            return rules.ProcessOwner(str(process.username()), command, ours)
    except (psutil.Error, KeyError):  # gone, another container's, or a uid without a name
        return rules.ProcessOwner(None)


def _run_root() -> int:
    """The process every process of this run descends from: pytest, or xdist's controller in a worker."""
    return os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()


@pytest.mark.host_check("nvlink_p2p")
def test_p2p_enabled_between_nvlink_connected_gpus(conformance: RunContext, host_metric: HostMetric) -> None:
    """NVML reports P2P read and write OK between every pair of GPUs NVLink joins.

    NCCL refuses any communicator with a pair that is not (src/graph/paths.cc, v2.18-v2.30: "P2P is
    disabled between NVLINK connected GPUs ... probably due to a hardware issue"), and
    NCCL_P2P_DISABLE=1 would slow every pair to hide one: the GPUs or the link are at fault.
    """
    topology = conformance.topology
    pairs = [(a, b) for a, b in topology.pairs() if NVLINK_CLASS.fullmatch(topology.link(a, b))]
    if topology.kind != "gpu" or not pairs:
        pytest.skip("no NVLink between the GPUs")
    statuses = {f"{a.name}-{b.name}": topology.p2p_status(a, b) for a, b in pairs}
    host_metric("p2p", {pair: dict(status) for pair, status in statuses.items() if status})
    if not any(statuses.values()):
        pytest.skip("NVML gave no P2P status for the NVLink pairs")
    refused = {
        pair: status
        for pair, status in statuses.items()
        if status and (status.get("read") != "OK" or status.get("write") != "OK")
    }
    assert not refused, "; ".join(
        f"{pair} ({topology.link(*topology.by_name(pair.split('-')))}): NVML reports P2P read {status.get('read')}, "
        f"write {status.get('write')}, so NCCL refuses every communicator with both GPUs ('P2P is disabled between "
        f"NVLINK connected GPUs ... probably due to a hardware issue') -> {NVLINK_P2P_FIX}"
        for pair, status in refused.items()
    )


@pytest.mark.host_check("p2p_path")
def test_no_acs_redirect_between_the_gpus(conformance: RunContext, host_metric: HostMetric) -> None:
    """No switch port below which a PIX or PXB pair runs P2P redirects it to the root complex (ACS).

    NCCL's troubleshooting guide (ACS): the redirect costs P2P much of its bandwidth, or hangs it.
    Linux sets the redirect bits on every ACS-capable port, root ports included, whenever an IOMMU
    driver asked for ACS (``iommu=pt`` too), so only a switch downstream port above a pair NCCL joins
    with P2P is judged (``conformance/plan/acs.py``); every other redirecting bridge is recorded.
    IOMMU translation alone is recorded, not failed: it is judged beside a P2P failure (the answer's
    cause line), where it is the likely cause.
    """
    topology = conformance.topology
    if topology.kind != "gpu" or len(topology.devices) < 2:
        pytest.skip("needs two GPUs or more: P2P is between GPUs")
    iommu = topology.iommu
    for name in ("mode", "cmdline", "acs_redirect", "acs_unreadable"):
        host_metric(name, getattr(iommu, name))
    host_metric("bridges", [f"{b.bus_id} {b.kind} acs={b.acs}" for b in iommu.bridges])
    if iommu.mode is None:
        pytest.skip('the IOMMU and ACS were not read (a topology file without "iommu")')
    judged = judge_acs(topology, conformance.nccl_host, os.environ)
    host_metric("not_judged", list(judged.recorded))
    assert not judged.problems, f"{'; '.join(judged.problems)}; {topology.platform.p2p_fix(IOMMU_FIX)}"


@pytest.mark.host_check("nccl_gpu")
def test_nccl_built_for_these_gpus(conformance: RunContext, host_metric: HostMetric) -> None:
    """The NCCL the run loads is a release that runs on every GPU's architecture (compute capability).

    An older one has no kernel for the GPU: every collective fails ("invalid device function", "no kernel
    image is available"), under every NCCL variable (``verdict/cuda_errors.py`` GPU_GENERATIONS: the
    first NCCL release for each architecture, from NCCL's own history).
    """
    topology = conformance.topology
    if topology.kind != "gpu":
        pytest.skip(f"GPU-only check: {topology.note or 'no GPU in this run'}")
    capabilities = {d.name: d.compute_capability for d in topology.devices if d.compute_capability}
    nccl = conformance.nccl.used
    host_metric("compute_capability", capabilities)
    host_metric("nccl", nccl)
    if not capabilities:
        pytest.skip("no GPU's compute capability is known (NVML did not say, or the topology file has none)")
    if nccl is None:
        why = 'the simulated machine names no "nccl"' if conformance.simulated else "torch loads no NCCL here"
        pytest.skip(f"NCCL's version is not known: {why}")
    models = {d.name: d.model for d in topology.devices}
    problems = {
        name: f"NCCL {nccl} is too old for {models[name]} (compute capability {capability}): upgrade NCCL or torch "
        f"to one with NCCL >= {generation.nccl} ({generation.source})"
        for name, capability in capabilities.items()
        if (generation := nccl_too_old(nccl, capability))
    }
    _fail_on(problems)


@pytest.mark.host_check("platform")
def test_what_runs_under_the_gpus(conformance: RunContext, host_metric: HostMetric) -> None:
    """libcuda.so.1 loads where NVML works: else no CUDA call can run, a fault.

    WSL and ``ulimit -s unlimited`` are WARNINGs; a virtual machine is said in the header and changes the
    P2P advice (``conformance/discover/platform.py``).
    """
    topology = conformance.topology
    if topology.kind != "gpu":
        pytest.skip(f"GPU-only check: {topology.note or 'no GPU in this run'}")
    facts = topology.platform
    for name, value in asdict(facts).items():
        host_metric(name, value)
    if facts == PlatformFacts():
        pytest.skip('what runs under the GPUs was not read (a topology file without "platform")')
    warnings = [facts.stack_warning(conformance.nccl.used), facts.wsl and WSL_NOTE]
    if any(warnings):
        host_metric(WARNING, "; ".join(w for w in warnings if w))
    assert not facts.libcuda, facts.libcuda_problem()
