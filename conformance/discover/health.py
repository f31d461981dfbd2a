"""What each GPU's NVML says of its health when the run starts, and how the host checks judge it.

Read once in the pytest process with the topology (``nvml_topology.py``), kept in ``run.json`` and in a
topology file (``"health"``, by GPU name), so a simulated machine carries the same facts.  Every
query is best effort: NVML answers NotSupported on consumer GPUs and NoPermission in containers,
and such a fact stays None (unknown), never a pass.  The judging functions return one problem
line per GPU (empty: healthy), each naming the fix; the host checks in
``suites/test_machine_health.py`` turn them into verdicts.

Sources of each rule are beside it.  NVML's API reference is
https://docs.nvidia.com/deploy/nvml-api/ (nvml.h of the driver); the memory rules follow NVIDIA's
"GPU Memory Error Management" (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from conformance.common.inputs import dataclass_from_json
from conformance.common.jsonl import JsonDict

T = TypeVar("T")

# nvmlGpuFabricState_t (nvml.h): NOT_SUPPORTED 0, NOT_STARTED 1, IN_PROGRESS 2, COMPLETED 3.
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# nvmlComputeMode_t (nvml.h): DEFAULT 0, EXCLUSIVE_THREAD 1 (deprecated), PROHIBITED 2, EXCLUSIVE_PROCESS 3.
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
# nvmlClocksEventReason* bits (nvml.h) that mean the hardware or its temperature holds the clocks down:
# HW slowdown (an external power brake or overheating), HW thermal, HW power brake, SW thermal.  The
# others (idle, application clocks, power cap, sync boost) are how a healthy GPU runs, and are not judged.
SLOWDOWN_REASONS = {0x8: "hw_slowdown", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x20: "sw_thermal"}


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health facts as NVML gave them; None where NVML would not say."""

    pcie_width: int | None = None  # lanes now (nvmlDeviceGetCurrPcieLinkWidth)
    pcie_max_width: int | None = None  # lanes this GPU and its slot can train to
    pcie_gen: int | None = None  # generation now: an idle GPU lowers it to save power, so it is not judged at rest
    pcie_max_gen: int | None = None
    nvlinks: tuple[bool, ...] | None = None  # per link the GPU has: up? (None: no NVLink, or NVML would not say)
    nvlink_version: int | None = None  # NVML_NVLINK_VERSION_* of link 0 (link_rate.py turns it into GB/s)
    ecc_uncorrected: int | None = None  # volatile uncorrectable ECC errors since the driver loaded
    remap_pending: bool | None = None  # row remapping waits for a GPU reset
    remap_failed: bool | None = None  # a row could not be remapped
    retired_pages_pending: bool | None = None  # page retirement waits for a reboot (GPUs before A100)
    fabric_state: str | None = None  # NVSwitch systems: Fabric Manager's registration of this GPU
    fabric_status: str | None = None  # NVML's words for the registration's result ("Success")
    persistence: bool | None = None
    compute_mode: str | None = None  # default, exclusive_process, prohibited
    slowdowns: tuple[str, ...] | None = None  # hardware and thermal clock slowdowns active when read
    processes: tuple[tuple[int, int], ...] | None = None  # (pid, MiB) of compute processes holding the GPU
    kernel_xids: tuple[int, ...] | None = None  # the kernel log's Xids of this GPU since the driver's last load
    kernel_xids_before_load: tuple[int, ...] | None = None  # those before it: the reload reset the GPU

    def to_json(self) -> JsonDict:
        return asdict(self)


class HealthError(ValueError):
    """A topology file's health of the wrong shape: the message names the GPU and the field."""


def health_from_json(data: object) -> dict[str, GpuHealth]:
    """A topology file's ``"health"``: GPU name -> its facts."""
    if not isinstance(data, dict):
        raise HealthError(f"health is {data!r}, not an object keyed by GPU name")
    return {
        str(name): dataclass_from_json(GpuHealth, facts, f"health of {name}", HealthError)
        for name, facts in data.items()
    }


# --------------------------------------------------------------------------------------------
# reading NVML
# --------------------------------------------------------------------------------------------


def nvlink_states(nvml: Any, handle: Any) -> tuple[bool, ...] | None:
    """Up or down, per NVLink the GPU has; None when it has none (NotSupported on link 0).

    nvmlDeviceGetNvLinkState answers for links 0..NVML_NVLINK_MAX_LINKS-1; a link the GPU does not
    have answers NotSupported or InvalidArgument (nvml.h), which ends the list.
    """
    states = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            states.append(nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            break
    return tuple(states) or None


def ask(nvml: Any, query: Callable[[], T]) -> T | None:
    """What ``query`` answers, or None where NVML refuses (NotSupported, NoPermission, FunctionNotFound, ...)."""
    try:
        return query()
    except nvml.NVMLError:
        return None


def read_health(nvml: Any, handle: Any) -> GpuHealth:
    """Every fact NVML gives for one GPU (each one None where NVML refuses it)."""

    def optional(query: Callable[[], T]) -> T | None:
        return ask(nvml, query)

    remapped = optional(lambda: nvml.nvmlDeviceGetRemappedRows(handle))  # (corrected, uncorrected, pending, failed)
    fabric = optional(lambda: _fabric_info(nvml, handle))
    return GpuHealth(
        pcie_width=optional(lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))),
        pcie_max_width=optional(lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))),
        pcie_gen=optional(lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))),
        pcie_max_gen=optional(lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))),
        nvlinks=optional(lambda: nvlink_states(nvml, handle)),
        nvlink_version=optional(lambda: int(nvml.nvmlDeviceGetNvLinkVersion(handle, 0))),
        ecc_uncorrected=optional(
            lambda: int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
        ),
        remap_pending=None if remapped is None else bool(remapped[2]),
        remap_failed=None if remapped is None else bool(remapped[3]),
        retired_pages_pending=optional(lambda: bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))),
        fabric_state=None if fabric is None else fabric[0],
        fabric_status=None if fabric is None else fabric[1],
        persistence=optional(lambda: nvml.nvmlDeviceGetPersistenceMode(handle) == nvml.NVML_FEATURE_ENABLED),
        compute_mode=optional(lambda: COMPUTE_MODES.get(int(nvml.nvmlDeviceGetComputeMode(handle)), "unknown")),
        slowdowns=optional(lambda: slowdown_names(int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)))),
        processes=optional(lambda: _processes(nvml, handle)),
    )


def _processes(nvml: Any, handle: Any) -> tuple[tuple[int, int], ...]:
    """The GPU's compute processes as (pid, MiB); NVML's "not available" memory (WDDM) counts 0."""
    return tuple(
        (int(p.pid), int(p.usedGpuMemory or 0) // (1024 * 1024))
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    )


def slowdown_names(reasons: int) -> tuple[str, ...]:
    return tuple(name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit)


def _fabric_info(nvml: Any, handle: Any) -> tuple[str, str] | None:
    """(state, status text) of the GPU's registration with Fabric Manager; None where there is no fabric."""
    info = nvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    state = FABRIC_STATES.get(int(info.state), "unknown")
    if state == "not_supported":
        return None
    status = "Success" if info.status == nvml.NVML_SUCCESS else str(nvml.NVMLError(info.status))
    return state, status


# --------------------------------------------------------------------------------------------
# judging
# --------------------------------------------------------------------------------------------

Problems = dict[str, str]  # GPU name -> what is wrong with it, naming the fix
HealthMap = Mapping[str, GpuHealth]  # GPU name -> its facts


def pcie_problems(health: Mapping[str, GpuHealth]) -> Problems:
    """A link trained narrower than the GPU and its slot allow (x8 where x16 is possible).

    nvmlDeviceGetMaxPcieLinkWidth is "the maximum PCIe link width possible with this device and
    system" (NVML API reference), so a current width below it is a downtrained link: a bad riser,
    a dirty or loose card, a failing lane.  The generation is not judged here: idle GPUs lower it to
    save power (NVML: "the current link generation may be reduced when the GPU is not in use").
    """
    return {
        name: f"PCIe link x{h.pcie_width}, the GPU and slot allow x{h.pcie_max_width}: a downtrained link (reseat "
        "the card or its riser, clean the contacts; `nvidia-smi -q -d PCIE`)"
        for name, h in health.items()
        if h.pcie_width is not None and h.pcie_max_width is not None and h.pcie_width < h.pcie_max_width
    }


def nvlink_problems(health: Mapping[str, GpuHealth], models: Mapping[str, str | None]) -> Problems:
    """A GPU with fewer NVLinks up than the best of its siblings (the same model in this machine).

    Links down are no fault by themselves: a PCIe card without its NVLink bridge reports every link
    down, and with one bridge of three only that bridge's links up; an SXM board wires the same
    links on every GPU, so one GPU with fewer up has lost some: NCCL then routes less bandwidth, or
    none, that way.  A GPU without siblings is not judged.
    """
    most_up: dict[str | None, int] = {}
    for name, h in health.items():
        if h.nvlinks is not None:
            most_up[models.get(name)] = max(most_up.get(models.get(name), 0), sum(h.nvlinks))
    problems = {}
    for name, h in health.items():
        if h.nvlinks is None:
            continue
        up, expected = sum(h.nvlinks), most_up[models.get(name)]
        if up >= expected:
            continue
        down = ", ".join(str(link) for link, is_up in enumerate(h.nvlinks) if not is_up)
        problems[name] = (
            f"{up} of {len(h.nvlinks)} NVLinks up where its siblings have {expected} (link {down} down): reset "
            "the GPU or reboot; links that stay down need the board or the NVSwitch tray checked "
            "(`nvidia-smi nvlink -s`, `nvidia-smi nvlink -e`)"
        )
    return problems


def memory_problems(health: Mapping[str, GpuHealth]) -> Problems:
    """Uncorrectable ECC errors, row remapping pending or failed, page retirement pending.

    NVIDIA's GPU Memory Error Management: an uncorrectable error is contained by killing the
    processes that used the memory; a pending row remap takes effect at the next GPU reset, and
    until then the row stays unusable; a failed remap means the GPU should be replaced (RMA);
    retired pages (GPUs before A100) pending need a reboot or reset.
    """
    problems = {}
    for name, h in health.items():
        found = []
        if h.ecc_uncorrected:
            found.append(f"{h.ecc_uncorrected} uncorrectable ECC error(s) since the driver loaded (reset the GPU)")
        if h.remap_failed:
            found.append("a row remapping failed (the GPU needs replacing: RMA)")
        elif h.remap_pending:
            found.append("row remapping pending (reset the GPU: `nvidia-smi -r`, or reboot)")
        if h.retired_pages_pending:
            found.append("page retirement pending (reboot or reset the GPU)")
        if found:
            problems[name] = "; ".join(found) + " (`nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`)"
    return problems


def fabric_problems(health: Mapping[str, GpuHealth]) -> Problems:
    """NVSwitch systems: a GPU that Fabric Manager has not registered (state not completed, or failed).

    Without it every CUDA call on the GPU fails with error 802 ("system not yet initialized"), and no
    NCCL variable changes that (NVIDIA Fabric Manager user guide: start nvidia-fabricmanager, of the
    driver's exact version).
    """
    return {
        name: f"Fabric Manager state {h.fabric_state}, status {h.fabric_status or 'unknown'}: start "
        "nvidia-fabricmanager (the driver's exact version): `systemctl status nvidia-fabricmanager`, "
        "`nvidia-smi -q -d FABRIC`"
        for name, h in health.items()
        if h.fabric_state is not None and (h.fabric_state != "completed" or h.fabric_status not in (None, "Success"))
    }


def mode_problems(health: Mapping[str, GpuHealth]) -> Problems:
    """A GPU whose compute mode prohibits every process (nvmlComputeMode_t PROHIBITED: no context allowed)."""
    return {
        name: "compute mode PROHIBITED: no process may use this GPU (`nvidia-smi -i <n> -c DEFAULT`, as root)"
        for name, h in health.items()
        if h.compute_mode == "prohibited"
    }


def persistence_off(health: Mapping[str, GpuHealth]) -> list[str]:
    """GPUs whose persistence mode is off: a WARNING, as DCGM's diagnostic has it (nvvs Software.cpp).

    The driver then tears the GPU's state down when no process holds it: each job waits for the GPU's
    initialisation, and clocks, power limits and modes set between jobs are lost.
    """
    return [name for name, h in health.items() if h.persistence is False]


PERSISTENCE_FIX = "`nvidia-smi -pm 1` as root, or run nvidia-persistenced (NVIDIA's driver persistence guide)"


def clock_problems(health: Mapping[str, GpuHealth]) -> Problems:
    """A GPU whose clocks the hardware or its temperature holds down when the run starts (nvml.h's reasons)."""
    return {
        name: f"clocks held down ({', '.join(h.slowdowns)}): check cooling, power and the power-brake signal "
        "(`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`)"
        for name, h in health.items()
        if h.slowdowns
    }


@dataclass(frozen=True)
class ProcessOwner:
    """Who holds a GPU process: its user (None: another container's, or a uid without a name) and its command."""

    user: str | None
    command: str = ""
    ours: bool = False  # a process of this run: pytest and what it started


def foreign_processes(health: Mapping[str, GpuHealth], owner: Callable[[int], ProcessOwner], me: str) -> Problems:
    """Processes not of this run holding a GPU's memory when the run starts: another user's, or this user's own.

    Not a fault of the machine: a warning.  Another user's (or one this host cannot see: another
    container's) takes memory the cases may need and time on the links the bandwidth figures measure
    (DCGM's diagnostic refuses to run beside them).  This user's own is left from an earlier job (a
    launcher that died before its workers, a notebook's kernel): named by its command, since a case
    that then runs out of memory on that GPU is its doing, not the machine's.
    """
    found = {}
    for name, h in health.items():
        held = []
        for pid, mib in h.processes or ():
            who = owner(pid)
            if who.ours:
                continue
            if who.user is not None and who.user == me:
                held.append(f"pid {pid} ({who.command or 'unknown command'}: this user's, not of this run) {mib} MiB")
            else:
                held.append(f"pid {pid} ({who.user or 'another container or user'}) {mib} MiB")
        if held:
            found[name] = ", ".join(held)
    return found


def health_values(health: Mapping[str, GpuHealth], fields: Sequence[str]) -> dict[str, dict[str, object]]:
    """The named facts of every GPU, for a host check's metrics."""
    return {name: {f: getattr(h, f) for f in fields} for name, h in health.items()}


def known(health: Mapping[str, GpuHealth], fields: Sequence[str]) -> bool:
    """Whether NVML said any of ``fields`` for any GPU (a check with nothing to read skips, saying so)."""
    return any(getattr(h, f) is not None for h in health.values() for f in fields)
