"""What the machine has, counted without NVML, and why a GPU box whose NVML fails is never a CPU box.

The PCI bus lists NVIDIA's GPUs whatever state the driver is in (sysfs needs no driver); the
driver's kernel module names its version in ``/proc/driver/nvidia/version`` and creates
``/dev/nvidia<n>``; its user-space NVML library is ``libnvidia-ml.so.<version>``.  When NVML then
fails, the machine is a broken GPU box, not a GPU-less one: :func:`broken_gpu_machine` says so in
one line, naming NVML's error, what it usually means and the fix, and the run stops before any case
(unless ``--backend gloo`` asked for CPU on purpose).

A topology file carries the same facts (``"inventory"``), so a simulated machine stops the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conformance.common.inputs import dataclass_from_json

NVIDIA_VENDOR = 0x10DE
# PCI class codes (PCI-SIG "PCI Code and ID Assignment", base class 03h): 0300 VGA-compatible
# controller (GeForce, RTX workstation boards), 0302 3D controller (the data-centre GPUs: A100,
# H100, L4 ...).  0301 (XGA) and NVIDIA's audio/USB functions (0403, 0c03) are not GPUs.
GPU_CLASSES = (0x0300, 0x0302)
# A GPU bound to these is handed to virtual machines on purpose (Linux's VFIO and pci-stub drivers):
# it is not this host's NVML's to list.
HANDED_TO_VMS = ("vfio-pci", "pci-stub")
# /proc/driver/nvidia/version's first line, proprietary and open modules alike:
#   NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023
#   NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (...)
_KERNEL_MODULE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_LIBRARY_VERSION = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")
MAX_BUS_IDS_NAMED = 4
BACKEND_GLOO_FIX = "or test the CPU on purpose with --backend gloo"


@dataclass(frozen=True)
class HostPaths:
    """Where the inventory is read (tests point these at a folder of their own)."""

    pci_devices: Path = Path("/sys/bus/pci/devices")
    driver_version: Path = Path("/proc/driver/nvidia/version")
    device_node: Path = Path("/dev/nvidia0")
    # where distributions and the container toolkit put the driver's libraries
    library_dirs: tuple[Path, ...] = (
        Path("/usr/lib/x86_64-linux-gnu"),
        Path("/usr/lib/aarch64-linux-gnu"),
        Path("/usr/lib64"),
        Path("/usr/lib"),
        Path("/usr/local/nvidia/lib64"),
    )
    cmdline: Path = Path("/proc/cmdline")  # the kernel's parameters (the IOMMU's, iommu.py)
    # files a container runtime leaves: Docker's /.dockerenv, Podman's /run/.containerenv
    container_markers: tuple[Path, ...] = (Path("/.dockerenv"), Path("/run/.containerenv"))
    kmsg: Path = Path("/dev/kmsg")  # the kernel's log: Xids before the run (watch.py)
    # what runs under the GPUs (platform.py): the CPU's flags, the DMI vendor strings, the kernel's release
    cpuinfo: Path = Path("/proc/cpuinfo")
    dmi: Path = Path("/sys/class/dmi/id")
    osrelease: Path = Path("/proc/sys/kernel/osrelease")


@dataclass(frozen=True)
class Inventory:
    """The machine's GPUs as the PCI bus and NVML count them, and the driver's traces."""

    pci_gpus: tuple[str, ...] = ()  # NVIDIA GPUs' bus ids on the PCI bus, sysfs spelling (0000:18:00.0)
    nvml_gpus: tuple[str, ...] | None = None  # the bus ids NVML lists, all of them; None: NVML gave none
    nvml_error: str | None = None  # why NVML gave no GPU ("" never: None when it did)
    kernel_module: str | None = None  # the loaded module's version (/proc/driver/nvidia/version)
    nvml_libraries: tuple[str, ...] = ()  # versions of libnvidia-ml.so.<version> found
    device_node: bool = False  # /dev/nvidia0 exists
    # In a container /sys and /proc/driver are the host's: the PCI bus lists every GPU of the host,
    # given to this container or not, so only the device nodes it was given say it has GPUs.
    container: bool = False

    @property
    def nvidia_present(self) -> bool:
        """Whether the machine (or this container) has NVIDIA GPUs or their driver, whatever NVML says."""
        if self.container:
            return self.device_node
        return bool(self.pci_gpus) or self.kernel_module is not None or self.device_node

    def not_in_nvml(self) -> tuple[str, ...]:
        """GPUs on the PCI bus that NVML does not list (fell off the bus, failed to initialise).

        None are judged in a container, whose PCI bus is the host's.
        """
        if self.container:
            return ()
        listed = set(self.nvml_gpus or ())
        return tuple(bus for bus in self.pci_gpus if bus not in listed)

    @property
    def machine_gpus(self) -> int:
        """The machine's GPU count: NVML's, else the PCI bus's (CUDA_VISIBLE_DEVICES hides none of them)."""
        return len(self.nvml_gpus) if self.nvml_gpus is not None else len(self.pci_gpus)

    def counts_text(self) -> str:
        """``8 on the PCI bus, 7 in NVML`` (what the header and the inventory check say)."""
        nvml = "NVML failed" if self.nvml_gpus is None else f"{len(self.nvml_gpus)} in NVML"
        host = " (the host's: in a container)" if self.container else ""
        return f"{len(self.pci_gpus)} on the PCI bus{host}, {nvml}"


class InventoryError(ValueError):
    """A topology file's inventory of the wrong shape: the message names the field."""


def inventory_from_json(data: object) -> Inventory:
    """A topology file's ``"inventory"`` object; raises InventoryError naming the field that is wrong."""
    return dataclass_from_json(Inventory, data, "inventory", InventoryError)


DEFAULT_HOST = HostPaths()


def host_paths(paths: HostPaths | None = None) -> HostPaths:
    """``paths``, else the real host's (``DEFAULT_HOST``, which tests point elsewhere)."""
    return paths or DEFAULT_HOST


# Kubernetes sets it in every pod's containers; systemd-nspawn, Podman and LXC set "container".
CONTAINER_VARIABLES = ("KUBERNETES_SERVICE_HOST", "container")


def read_inventory(paths: HostPaths | None = None, environ: Mapping[str, str] | None = None) -> Inventory:
    """The PCI bus's NVIDIA GPUs and the driver's traces (NVML's part is added by whoever asks it)."""
    paths = host_paths(paths)
    environ = {} if environ is None else environ
    return Inventory(
        pci_gpus=pci_gpus(paths.pci_devices),
        kernel_module=kernel_module_version(paths.driver_version),
        nvml_libraries=nvml_library_versions(paths.library_dirs),
        device_node=paths.device_node.exists(),
        container=any(marker.exists() for marker in paths.container_markers)
        or any(name in environ for name in CONTAINER_VARIABLES),
    )


def pci_gpus(pci_devices: Path) -> tuple[str, ...]:
    """Bus ids of NVIDIA display and 3D controllers, in bus order; none where sysfs cannot be read."""
    found = []
    try:
        entries = sorted(pci_devices.iterdir())
    except OSError:
        return ()
    for entry in entries:
        try:
            vendor = int(((entry / "vendor").read_text()).strip(), 16)
            pci_class = int(((entry / "class").read_text()).strip(), 16) >> 8  # 0x030200 -> 0x0302
        except (OSError, ValueError):
            continue
        if vendor == NVIDIA_VENDOR and pci_class in GPU_CLASSES and _bound_driver(entry) not in HANDED_TO_VMS:
            found.append(entry.name)
    return tuple(found)


def _bound_driver(device: Path) -> str | None:
    try:
        return device.joinpath("driver").resolve(strict=True).name
    except OSError:
        return None


def kernel_module_version(version_file: Path) -> str | None:
    try:
        found = _KERNEL_MODULE.search(version_file.read_text(errors="replace"))
    except OSError:
        return None
    return found[1] if found else None


def nvml_library_versions(library_dirs: tuple[Path, ...]) -> tuple[str, ...]:
    versions: set[str] = set()
    for folder in library_dirs:
        try:
            names = [path.name for path in folder.glob("libnvidia-ml.so.*")]
        except OSError:
            continue
        versions.update(found[1] for name in names if (found := _LIBRARY_VERSION.search(name)))
    return tuple(sorted(versions))


@dataclass(frozen=True)
class NvmlFailure:
    """What an NVML error usually means on a machine with NVIDIA GPUs, and what to do."""

    said: str  # a fragment of NVML's (nvidia-ml-py's) error text, lower case
    meaning: str
    fix: str


# nvidia-ml-py's texts for NVML's return codes (pynvml.NVMLError._errcode_to_string, nvidia-ml-py
# 13.615): 18 NVML_ERROR_LIB_RM_VERSION_MISMATCH "RM has detected an NVML/RM version mismatch."
# (nvidia-smi: "Failed to initialize NVML: Driver/library version mismatch"), 9 "Driver Not
# Loaded", 4 "Insufficient Permissions", 12 "NVML Shared Library Not Found" (raised by pynvml
# itself when dlopen("libnvidia-ml.so.1") fails).  The meanings are NVIDIA's: the container
# toolkit mounts libnvidia-ml only with the "utility" driver capability (NVIDIA_DRIVER_CAPABILITIES,
# https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html).
NVML_FAILURES = (
    NvmlFailure(
        "version mismatch",
        "the driver was upgraded and the old kernel module is still loaded",
        "reboot, or reload the module (stop what uses the GPUs; rmmod nvidia_drm nvidia_modeset nvidia_uvm "
        "nvidia; modprobe nvidia)",
    ),
    NvmlFailure(
        "driver not loaded",
        "the NVIDIA kernel module is not loaded (a failed install or upgrade, or Secure Boot refusing it)",
        "load it (modprobe nvidia) and read `dmesg | grep -i nvrm` for why it failed; reinstall the driver "
        "for this kernel",
    ),
    NvmlFailure(
        "insufficient permissions",
        "this user may not open /dev/nvidia*",
        "run as a user allowed to use the GPUs (the device files' group), or give the container the GPUs "
        "(docker --gpus all)",
    ),
    NvmlFailure(
        "shared library not found",
        "the driver's NVML library is not installed here (a container without the driver's utility "
        "libraries, or a driver install without them)",
        "give the container the utility capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility, or all) or "
        "install the driver's utilities (libnvidia-ml.so.1)",
    ),
    NvmlFailure(
        "nvidia-ml-py",
        "the suite's NVML binding is missing from this Python environment",
        "pip install nvidia-ml-py",
    ),
    NvmlFailure(
        "no gpu",
        "NVML lists none of the GPUs the PCI bus has (they failed to initialise: `dmesg | grep -i "
        "RmInitAdapter`, or an Xid 79 'fallen off the bus')",
        "reset or reseat the GPUs, or reboot; a GPU that stays lost is a hardware case",
    ),
)
UNKNOWN_FAILURE = NvmlFailure("", "NVML cannot talk to the driver", "fix the driver (nvidia-smi shows the same error)")


def nvml_failure(error: str) -> NvmlFailure:
    said = error.lower()
    return next((known for known in NVML_FAILURES if known.said in said), UNKNOWN_FAILURE)


def broken_gpu_machine(inventory: Inventory) -> str | None:
    """One line when NVML failed on a machine with NVIDIA GPUs (it must not be tested as a CPU box)."""
    if inventory.nvml_error is None or not inventory.nvidia_present:
        return None
    failure = nvml_failure(inventory.nvml_error)
    meaning = failure.meaning + _versions_seen(inventory, failure)
    error = inventory.nvml_error.rstrip(".")
    return (
        f"this machine has NVIDIA GPUs ({_traces(inventory)}) but NVML gives none ({error}): "
        f"{meaning}; {failure.fix}; {BACKEND_GLOO_FIX}"
    )


def _traces(inventory: Inventory) -> str:
    seen = []
    if inventory.container:
        return "/dev/nvidia0 in this container"
    if inventory.pci_gpus:
        seen.append(f"{len(inventory.pci_gpus)} on the PCI bus: {bus_id_list(inventory.pci_gpus)}")
    if inventory.kernel_module is not None:
        seen.append(f"kernel module {inventory.kernel_module}")
    elif inventory.device_node:
        seen.append("/dev/nvidia0")
    return "; ".join(seen)


def _versions_seen(inventory: Inventory, failure: NvmlFailure) -> str:
    """The two versions that disagree, where a version mismatch is the failure."""
    if failure.said != "version mismatch":
        return ""
    library = ", ".join(inventory.nvml_libraries) or "not found"
    return f" (kernel module {inventory.kernel_module or 'unknown'}, NVML library {library})"


def bus_id_list(bus_ids: tuple[str, ...]) -> str:
    if len(bus_ids) <= MAX_BUS_IDS_NAMED:
        return ", ".join(bus_ids)
    return ", ".join(bus_ids[:MAX_BUS_IDS_NAMED]) + f" and {len(bus_ids) - MAX_BUS_IDS_NAMED} more"


def cuda_count_problem(cuda_devices: object, given: int) -> str | None:
    """What is wrong when CUDA in a rank sees another number of GPUs than the run gave it (NVML's), else None.

    The rank's CUDA_VISIBLE_DEVICES lists the run's GPUs by UUID (``launch/case.py``); CUDA stops at
    the first one it cannot initialise, so a GPU NVML lists but CUDA cannot use shows here only.
    """
    if not isinstance(cuda_devices, int) or cuda_devices == given:
        return None
    return (
        f"CUDA sees {cuda_devices} GPU(s) in a rank where NVML lists {given} for this run: a GPU CUDA cannot "
        "initialise (`dmesg | grep -i -e NVRM -e Xid`; nvidia-smi shows it, CUDA does not)"
    )
