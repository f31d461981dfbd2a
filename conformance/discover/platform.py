"""What runs under the GPUs: a virtual machine or WSL, the stack limit NCCL's threads get, libcuda.

Each fact is read once with the topology of a GPU run and kept in it (a topology file's
``"platform"``); the host check ``platform`` and the header name them, each as what it is:

* A virtual machine: the CPU's ``hypervisor`` flag (CPUID leaf 1, ECX bit 31; Linux's
  ``X86_FEATURE_HYPERVISOR`` in /proc/cpuinfo) or a DMI vendor string systemd's ``virt.c``
  (``detect_vm_dmi``) knows. There ACS and the IOMMU are the host's: NCCL's troubleshooting guide,
  "Virtual machines require ACS to function, hence disabling ACS is not an option".
* WSL: the kernel release names it (systemd ``virt.c``, "Microsoft" or "WSL" in
  /proc/sys/kernel/osrelease). NCCL turns its P2P transport off there ("Legacy IPC not supported",
  ``src/transport/p2p.cc`` since 2.12.7), and NVML cannot report modes or set them (NVIDIA's CUDA on
  WSL guide, 5.2).
* ``ulimit -s unlimited``: glibc then gives new threads 2 MB of stack, and NCCL's recursive graph
  search has crashed in it (NCCL's troubleshooting guide, "Stack size": "reset it to 8192 KB");
  NCCL 2.28 and later set a safe size themselves (``src/os/linux.cc``).
* libcuda.so.1 that does not load while NVML works: a container given the ``utility`` capability
  without ``compute`` (NVIDIA Container Toolkit, NVIDIA_DRIVER_CAPABILITIES): no CUDA call can run.
"""

from __future__ import annotations

import ctypes
import resource
from dataclasses import dataclass
from pathlib import Path

from conformance.common.inputs import dataclass_from_json
from conformance.common.versions import release

# systemd's virt.c, detect_vm_dmi: the DMI files it reads, in its order, and the prefixes that name a hypervisor.
# "Microsoft Corporation" alone is a Surface laptop too (systemd#21468): Hyper-V shows as product_version "Hyper-V".
DMI_FILES = ("product_name", "sys_vendor", "board_vendor", "bios_vendor", "product_version")
DMI_HYPERVISORS = ("KVM", "OpenStack", "KubeVirt", "Amazon EC2", "QEMU", "VMware", "VMW", "innotek GmbH", "VirtualBox",
                   "Oracle Corporation", "Xen", "Bochs", "Parallels", "BHYVE", "Hyper-V", "Apple Virtualization",
                   "Google Compute Engine")  # fmt: skip
SAFE_STACK_KB = 8192  # NCCL's SAFE_STACK_SIZE (src/os/linux.cc) and its guide's "ulimit -s 8192"
STACK_SAFE_FROM = "2.28"  # NCCL sets its threads' stack itself from this release on
UNLIMITED = -1

VM_FIX = (
    "in a virtual machine ACS and the IOMMU are the host's, not this system's (NCCL's troubleshooting guide: "
    "'Virtual machines require ACS to function'): ask the host's administrator for GPU P2P between the "
    "passed-through GPUs (ATS, the hypervisor's P2P or GPUDirect clique settings), or test on bare metal"
)
WSL_NOTE = (
    "WSL: NCCL runs without its P2P transport here ('Legacy IPC not supported', src/transport/p2p.cc) and NVML "
    "cannot report the GPUs' modes (NVIDIA's CUDA on WSL guide); pairs move data through host memory"
)


class PlatformError(ValueError):
    """A topology file's platform of the wrong shape: the message names the field."""


@dataclass(frozen=True)
class PlatformFacts:
    """The machine under the GPUs; None: not read (an older topology file, or not asked)."""

    virtual_machine: str | None = None  # how it shows ("hypervisor CPU flag; DMI product_name 'KVM'"); "": none
    wsl: str | None = None  # the kernel release that names WSL; "": not WSL
    stack_kb: int | None = None  # RLIMIT_STACK's soft limit in KiB (-1: unlimited)
    libcuda: str | None = None  # why libcuda.so.1 does not load ("": it loads)

    @property
    def virtualised(self) -> bool:
        return bool(self.virtual_machine or self.wsl)

    def p2p_fix(self, bare_metal_fix: str) -> str:
        """The fix for P2P through the root complex: the host's in a virtual machine, else ``bare_metal_fix``."""
        return VM_FIX if self.virtual_machine else WSL_NOTE if self.wsl else bare_metal_fix

    def stack_warning(self, nccl: str | None) -> str:
        """``ulimit -s unlimited`` named, with what it means for this NCCL ("" where the limit is fine)."""
        if self.stack_kb != UNLIMITED:
            return ""
        loaded = release(nccl)
        safe = loaded is not None and loaded >= (release(STACK_SAFE_FROM) or ())
        risk = (
            f"NCCL {nccl} sets its threads' stack itself (2.28 on), but other programs still get 2 MB"
            if safe
            else "NCCL before 2.28 has crashed creating communicators with it"
        )
        return (
            "ulimit -s is unlimited, so glibc gives new threads only 2 MB of stack (pthread_create(3)): "
            f"{risk} -> `ulimit -s {SAFE_STACK_KB}` in the job's shell, on every node (NCCL's troubleshooting guide)"
        )

    def libcuda_problem(self) -> str:
        return (
            f"libcuda.so.1 does not load ({self.libcuda}) though NVML works: no CUDA call can run here -> in a "
            "container, give it the compute capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility, `docker run "
            "--gpus all`, Kubernetes runtimeClassName: nvidia); elsewhere reinstall the driver's user-space "
            "libraries, or set LD_LIBRARY_PATH to them"
        )

    def header_lines(self) -> list[str]:
        lines = []
        if self.virtual_machine:
            lines.append(f"a virtual machine ({self.virtual_machine}): ACS and the IOMMU are the host's")
        if self.wsl:
            lines.append(f"WSL (kernel {self.wsl}): NCCL runs without P2P; NVML reports no modes")
        return lines


def platform_from_json(data: object) -> PlatformFacts:
    return dataclass_from_json(PlatformFacts, data, "platform", PlatformError)


def read_platform(cpuinfo: Path, dmi: Path, osrelease: Path) -> PlatformFacts:
    return PlatformFacts(
        virtual_machine=virtual_machine(cpuinfo, dmi),
        wsl=_wsl(osrelease),
        stack_kb=_stack_kb(),
        libcuda=_libcuda(),
    )


def virtual_machine(cpuinfo: Path, dmi: Path) -> str:
    """How this machine shows it is a virtual machine ("" where nothing says so)."""
    signs = []
    if any(line.startswith("flags") and "hypervisor" in line.split() for line in _lines(cpuinfo)):
        signs.append("hypervisor CPU flag")
    for name in DMI_FILES:
        value = next(iter(_lines(dmi / name)), "").strip()
        if value.startswith(DMI_HYPERVISORS):
            signs.append(f"DMI {name} {value!r}")
            break
    return "; ".join(signs)


def _wsl(osrelease: Path) -> str:
    release = next(iter(_lines(osrelease)), "").strip()
    return release if "microsoft" in release.lower() or "wsl" in release.lower() else ""


def _stack_kb() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return UNLIMITED if soft == resource.RLIM_INFINITY else soft // 1024


def _libcuda() -> str:
    try:
        ctypes.CDLL("libcuda.so.1")  # the SONAME: libcuda.so is only a courtesy link
    except OSError as exc:
        return str(exc)
    return ""


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []
