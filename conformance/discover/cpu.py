"""The host CPU as NCCL classifies it: its default P2P level depends on the CPU's architecture and vendor.

NCCL's ``ncclTopoCpuType`` (``src/graph/topo.cc``) gives an architecture (x86, POWER, ARM) and, on
x86, a vendor from CPUID: Intel (``GenuineIntel``), AMD (``AuthenticAMD``), Zhaoxin
(``CentaurHauls`` or ``  Shanghai  ``).  Linux prints the same CPUID text as ``vendor_id`` in
``/proc/cpuinfo``.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

INTEL, AMD, ZHAOXIN, X86_OTHER, ARM, POWER, OTHER = "intel", "amd", "zhaoxin", "x86", "arm", "power", "other"
CPU_KINDS = (INTEL, AMD, ZHAOXIN, X86_OTHER, ARM, POWER, OTHER)
UNKNOWN_CPU = ""
X86_VENDORS = {"GenuineIntel": INTEL, "AuthenticAMD": AMD, "CentaurHauls": ZHAOXIN, "Shanghai": ZHAOXIN}
CPUINFO = Path("/proc/cpuinfo")


def cpu_kind(machine: str, cpuinfo: str) -> str:
    """The CPU's kind from ``platform.machine()`` and the text of ``/proc/cpuinfo``."""
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "i686", "i386"):
        vendor = re.search(r"^vendor_id\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        return X86_VENDORS.get(vendor.group(1).strip(), X86_OTHER) if vendor else X86_OTHER
    if machine.startswith(("aarch64", "arm")):
        return ARM
    if machine.startswith(("ppc64", "powerpc")):
        return POWER
    return OTHER


def host_cpu(cpuinfo: Path = CPUINFO) -> str:
    """The CPU kind of this host ("" when /proc/cpuinfo cannot be read)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return UNKNOWN_CPU
    return cpu_kind(platform.machine(), text)
