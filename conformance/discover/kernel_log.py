"""The kernel log: the Xids NVIDIA's driver logged before the run, each judged against the GPU's state now.

Read once at discovery where ``/dev/kmsg`` is readable (``topology_source.py``); an Xid since the
driver's last load is a machine fault unless NVML shows it cleared by a reset (``xid_cleared``);
older, unknown and applications' Xids are WARNINGs.  Meanings: NVIDIA's Xid catalog (``watch.XIDS``).
"""

from __future__ import annotations

import errno
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from conformance.discover.health import GpuHealth
from conformance.discover.watch import xid_kind

KMSG = Path("/dev/kmsg")
# The driver's line (NVIDIA's Xid catalog): "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
KMSG_PREFIX = re.compile(r"^\d+,\d+,\d+,[^;]*;")  # /dev/kmsg's "priority,sequence,microseconds,flags;"
KERNEL_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): (\d+)")
# The module prints "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  <version> ..." (or "... UNIX x86_64
# Kernel Module ...", the proprietary one) once per load (open-gpu-kernel-modules 595.45.04, kernel-open/nvidia/nv.c,
# nvidia_init_module; the string from utils.mk GENERATE_NVIDSTRING). A load initialises every GPU afresh; no line
# marks a GPU reset (its prints are debug level, nv.c "Trigger FLR"), so NVML's state judges that (xid_cleared).
DRIVER_LOAD = re.compile(r"NVRM: loading NVIDIA UNIX")


def kernel_log_lines(kmsg: Path = KMSG) -> tuple[list[str] | None, str]:
    """The kernel ring buffer's messages, or None and why it could not be read.

    ``/dev/kmsg`` gives one record per read; a non-blocking read ends with EAGAIN at the newest one.
    Reading it needs CAP_SYSLOG where ``kernel.dmesg_restrict`` is 1 (most distributions).
    """
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        needs = " (needs root or CAP_SYSLOG)" if exc.errno in (errno.EACCES, errno.EPERM) else ""
        return None, f"the kernel log ({kmsg}) is not readable here: {exc.strerror}{needs}"
    lines: list[str] = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    return lines, ""
                if exc.errno == errno.EPIPE:  # overwritten while read: go on from the next record
                    continue
                return None, f"the kernel log ({kmsg}) could not be read: {exc.strerror}"
            if not record:
                return lines, ""
            lines += [KMSG_PREFIX.sub("", line) for line in record.decode(errors="replace").splitlines()]
    finally:
        os.close(fd)


class KernelXids(NamedTuple):
    """One GPU's Xids in the kernel log, split at the driver's last load (the log is in time order)."""

    since_load: tuple[int, ...]
    before_load: tuple[int, ...]


def kernel_xids(lines: Iterable[str], bus_ids: Mapping[str, str]) -> dict[str, KernelXids]:
    """Per GPU name, the Xids the kernel log names for it; ``bus_ids``: GPU name -> its PCI bus id.

    Where the load line has left the ring buffer, every Xid in it came after the load.
    """
    by_bus = {_short_bus(bus): name for name, bus in bus_ids.items()}
    since: dict[str, list[int]] = {name: [] for name in bus_ids}
    before: dict[str, list[int]] = {name: [] for name in bus_ids}
    for line in lines:
        if DRIVER_LOAD.search(line):
            for name, xids in since.items():
                before[name] += xids
                xids.clear()
            continue
        match = KERNEL_XID.search(line)
        if match and _short_bus(match.group(1)) in by_bus:
            since[by_bus[_short_bus(match.group(1))]].append(int(match.group(2)))
    return {name: KernelXids(tuple(since[name]), tuple(before[name])) for name in bus_ids}


ECC_XIDS = frozenset({48, 94, 95, 140})  # uncorrectable ECC errors: NVML's volatile uncorrectable count holds them


def xid_cleared(xid: int, health: GpuHealth) -> str | None:
    """How NVML's state now shows the GPU was reset since an Xid of its memory; None where it does not.

    nvml.h (nvmlEccCounterType_t): "Volatile counts are reset each time the driver loads" (on Linux each
    time the GPU is initialised afresh); a pending row remapping is applied by a GPU reset (NVIDIA's GPU
    Memory Error Management). Any other Xid after the load stays the machine's until a reboot or reload.
    """
    if xid == 63 and health.remap_pending is False:
        return "NVML reports no row remapping pending now (a reset applied it)"
    if xid in ECC_XIDS and health.ecc_uncorrected == 0:
        return "NVML's volatile uncorrectable ECC count is 0 now (it restarts when the GPU is initialised afresh)"
    return None


def kernel_xid_problems(health: Mapping[str, GpuHealth]) -> tuple[dict[str, str], dict[str, str]]:
    """Per GPU, the kernel log's Xids of a fault of the machine, and the WARNINGs.

    A WARNING: an application's Xid, one the table does not know, one before the driver's last load
    (which reset the GPU), and one of the GPU's memory that NVML shows cleared since.
    """
    machine: dict[str, str] = {}
    warnings: dict[str, str] = {}

    def add(found: dict[str, str], name: str, text: str) -> None:
        found[name] = f"{found[name]}; {text}" if name in found else text

    for name, h in health.items():
        for xid, times in sorted(Counter(h.kernel_xids or ()).items()):
            kind = xid_kind(xid)
            said = f"Xid {xid} ({kind.meaning}) {times}x in the kernel log since the driver's last load"
            cleared = xid_cleared(xid, h) if kind.machine else None
            if cleared:
                add(warnings, name, f"{said}, cleared since: {cleared}")
            else:
                add(machine if kind.machine else warnings, name, f"{said} -> {kind.fix}")
        for xid, times in sorted(Counter(h.kernel_xids_before_load or ()).items()):
            add(warnings, name, f"Xid {xid} ({xid_kind(xid).meaning}) {times}x before the driver's last load, which "
                f"reset the GPU ('NVRM: loading NVIDIA' in the kernel log)")  # fmt: skip
    return machine, warnings


def _short_bus(bus: str) -> str:
    """``00000000:3B:00.0`` and the kernel's ``0000:3b:00`` alike as ``3b:00`` with its domain's value."""
    parts = bus.lower().split(".")[0].split(":")
    return f"{int(parts[-3], 16):x}:{parts[-2]}:{parts[-1]}"
