"""Where a run's topology comes from, and what the run takes from it.

What the cases run on: GPUs found through NVML (``nvml_topology.py``), or N virtual CPU devices for
gloo (:func:`discover`); or a simulated machine read from a topology file (:func:`load_topology_file`,
which checks the file and names what is wrong with it).  NVML failing on a machine with NVIDIA GPUs
is refused (:func:`refuse_broken_gpu_machine`) rather than tested as a CPU box.  From the topology
follow the backend (:func:`choose_backend`) and what watches the GPUs during the run
(:func:`watch_run`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import NotParsed, json_value
from conformance.common.inputs import json_type_name, read_user_file, wrong_field_type
from conformance.common.values import MAX_DEVICES
from conformance.discover.cpu import CPU_KINDS, UNKNOWN_CPU
from conformance.discover.inventory import HostPaths, Inventory, broken_gpu_machine, host_paths, read_inventory
from conformance.discover.iommu import read_iommu
from conformance.discover.kernel_log import KernelXids, kernel_log_lines, kernel_xids
from conformance.discover.nvml_topology import nvml_view, sysfs_bus_id
from conformance.discover.platform import read_platform
from conformance.discover.rdma import read_nics, read_rdma
from conformance.discover.topology import BrokenGpuMachine, Device, Topology, TopologyError, cpu_topology, pair_key
from conformance.discover.watch import PlayedWatch, Watch, start_nvml_watch


def load_topology_file(path: Path, where: str) -> Topology:
    """A topology saved by ``python -m conformance topology --json`` (or written by hand)."""
    text = read_user_file(path, "topology file", where, TopologyError)
    source = f"{where}: topology file {str(path)!r}"
    read = _read_topology(text, path)
    if isinstance(read, str):
        raise TopologyError(f"{source} is not a topology: {read}")
    topology, data = read
    problem = _content_problem(topology, data)
    if problem:
        raise TopologyError(f"{source} {problem}")
    if "inventory" not in data and topology.kind == "gpu":  # a file from before inventories: its GPUs, all present
        bus_ids = tuple(sysfs_bus_id(d.pci_bus_id or d.name) for d in topology.devices)
        return replace(topology, inventory=Inventory(pci_gpus=bus_ids, nvml_gpus=bus_ids))
    return topology


def _read_topology(text: str, path: Path) -> tuple[Topology, dict[str, Any]] | str:
    """The topology and its JSON, or why the text is not a topology at all."""
    try:
        data = json_value(text)
    except NotParsed as exc:
        return str(exc)
    if not isinstance(data, dict):
        return f"it holds a JSON {json_type_name(data)}, not an object"
    problem = _shape_problem(data)
    if problem:
        return problem
    try:
        return Topology.from_json(json.dumps({**data, "source": str(path)})), data
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return str(exc)


def _content_problem(topology: Topology, data: Mapping[str, Any]) -> str:
    """What is wrong with a topology read from a file, to follow its name ("" when nothing is)."""
    count = len(topology.devices)
    if not count:
        return "lists no devices"
    if count > MAX_DEVICES:
        return f"lists {count} devices, more than the {MAX_DEVICES} one node's plan takes"
    problem = _wrong_type(topology)
    if problem:
        return f"is not a topology: {problem}"
    for field_name in ("name", "uuid"):
        values = [getattr(d, field_name) for d in topology.devices if getattr(d, field_name)]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            return f"lists device {field_name} {twice[0]!r} more than once"
    if topology.kind == "gpu" and count > 1 and "links" not in data:
        example = '{"gpu0-gpu1": "NV4"}'
        return f'is not a topology: no "links" for its {count} GPUs (each pair\'s link class, e.g. {example})'
    return _link_problem(topology) if topology.kind == "gpu" else ""


def _link_problem(topology: Topology) -> str:
    """A link key that names no pair of the file's devices, or a pair with no link class ("" when none)."""
    devices = topology.devices
    pairs = [pair_key(a, b) for i, a in enumerate(devices) for b in devices[i + 1 :]]
    for key in topology.links:
        if key not in pairs:
            return (
                f"has link {key!r}, which is not a pair of its devices written lower index first as the suite "
                f"reads it (e.g. {pairs[0]!r})"
            )
    missing = [pair for pair in pairs if pair not in topology.links]
    if missing and topology.links:
        return f"has no link class for {missing[0]} ({len(missing)} of its {len(pairs)} pairs have none)"
    return ""


TOPOLOGY_FIELDS = {f.name for f in fields(Topology)}
DEVICE_FIELDS = {f.name for f in fields(Device)}
REQUIRED_DEVICE_FIELDS = ("name", "index", "kind")
MAPPING_FIELDS = ("links", "p2p", "link_notes")


def _shape_problem(data: Mapping[str, Any]) -> str:
    """What keeps a file's JSON from being a topology at all, in words ("" when nothing does)."""
    unknown = sorted(set(data) - TOPOLOGY_FIELDS)
    if unknown:
        return f"unknown field {unknown[0]!r} (a topology has {', '.join(sorted(TOPOLOGY_FIELDS))})"
    if "devices" not in data:
        return 'no "devices" list'
    if "kind" not in data:
        return 'no "kind" ("cpu" or "gpu")'
    devices = data["devices"]
    if not isinstance(devices, list):
        return f'"devices" is {devices!r}, not a list of devices'
    for number, device in enumerate(devices):
        problem = _device_shape_problem(device)
        if problem:
            return f'device {number} in "devices" {problem}'
    for name in MAPPING_FIELDS:
        if not isinstance(data.get(name, {}), dict):
            return f'"{name}" is {data[name]!r}, not an object keyed by device pair ("gpu0-gpu1")'
    return ""


def _device_shape_problem(device: object) -> str:
    if not isinstance(device, dict):
        return f"is {device!r}, not an object"
    unknown = sorted(set(device) - DEVICE_FIELDS)
    if unknown:
        return f"has unknown field {unknown[0]!r} (a device has {', '.join(sorted(DEVICE_FIELDS))})"
    missing = [name for name in REQUIRED_DEVICE_FIELDS if name not in device]
    return f"has no {', '.join(repr(m) for m in missing)}" if missing else ""


def _wrong_type(topology: Topology) -> str:
    """The first value of the wrong type in a topology read from a file ("" when there is none)."""
    if topology.kind not in ("cpu", "gpu"):
        return f"kind is {topology.kind!r}, not 'cpu' or 'gpu'"
    if topology.cpu not in (UNKNOWN_CPU, *CPU_KINDS):
        return f"cpu is {topology.cpu!r}, not one of {', '.join(CPU_KINDS)}"
    for device in topology.devices:
        problem = wrong_field_type(asdict(device), Device)
        if problem:
            return f"device {device.name!r}: {problem}"
    for pair, link in topology.links.items():
        if not isinstance(link, str):
            return f"the link class of {pair} is {link!r}, not a text such as 'NV4' or 'SYS'"
    return ""


def refuse_broken_gpu_machine(inventory: Inventory, backend: str, prefix: str = "") -> None:
    """Raises BrokenGpuMachine where NVML failed on a machine with NVIDIA GPUs, unless gloo was asked for."""
    problem = broken_gpu_machine(inventory)
    if problem is not None and backend != "gloo":
        raise BrokenGpuMachine(prefix + problem)


def discover(
    backend: str, virtual_devices: int, environ: Mapping[str, str] | None = None, paths: HostPaths | None = None
) -> Topology:
    """Pick the topology for a run; its inventory counts the GPUs on the PCI bus and in NVML.

    Raises BrokenGpuMachine where NVML fails on a machine with NVIDIA GPUs (backend gloo excepted),
    ValueError when ``nccl`` is asked for without GPUs, and TopologyError (a ValueError) when NVML
    cannot list the GPUs or CUDA_VISIBLE_DEVICES names something that is not a GPU here.
    """
    environ = os.environ if environ is None else environ
    machine = read_inventory(paths, environ)
    if backend == "gloo":
        untested = f": the NVIDIA GPUs here are not tested ({machine.counts_text()})" if machine.pci_gpus else ""
        return cpu_topology(virtual_devices, note=f"backend gloo chosen{untested}", inventory=machine)
    view = nvml_view(environ)
    failed = view.listed is None or (not view.listed and machine.nvidia_present)
    machine = replace(machine, nvml_gpus=view.listed, nvml_error=view.reason if failed else None)
    if view.topology is not None:
        host = host_paths(paths)
        buses = tuple(sysfs_bus_id(d.pci_bus_id or "") for d in view.topology.devices)
        iommu = read_iommu(buses, host.pci_devices, host.cmdline)
        platform = read_platform(host.cpuinfo, host.dmi, host.osrelease)
        rdma = read_rdma()
        gpus = {d.name: sysfs_bus_id(d.pci_bus_id or "") for d in view.topology.devices if d.pci_bus_id}
        nics = read_nics(rdma, gpus, host.pci_devices)
        facts = replace(view.topology, inventory=machine, iommu=iommu, platform=platform, rdma=rdma, nics=nics)
        return with_kernel_xids(facts, host.kmsg)
    note = f"no GPU: {view.reason}"
    refuse_broken_gpu_machine(machine, backend)
    if backend == "nccl":
        raise ValueError(f"the nccl backend needs GPUs, and none was found ({view.reason})")
    return cpu_topology(virtual_devices, note=note, inventory=machine)


def with_kernel_xids(topology: Topology, kmsg: Path) -> Topology:
    """The topology with each GPU's Xids from the kernel log, or the reason the log could not be read."""
    lines, unread = kernel_log_lines(kmsg)
    if lines is None:
        return replace(topology, kernel_log=unread)
    found = kernel_xids(lines, {d.name: d.pci_bus_id or "" for d in topology.devices if d.pci_bus_id})
    none = KernelXids((), ())
    health = {
        name: replace(
            h, kernel_xids=found.get(name, none).since_load, kernel_xids_before_load=found.get(name, none).before_load
        )
        for name, h in topology.health.items()
    }
    return replace(topology, health=health)


def watch_run(topology: Topology, backend: str) -> Watch | None:
    """What watches the GPUs during the run: NVML on real GPUs, a simulated machine's file; else nothing."""
    if topology.watch is not None:
        return PlayedWatch(topology.watch)
    if topology.source != "nvml" or backend != "nccl":
        return None
    indexes = {d.name: d.nvml_index for d in topology.devices if d.nvml_index is not None and not d.mig}
    links = {name: len(topology.health[name].nvlinks or ()) for name in indexes if name in topology.health}
    return start_nvml_watch(indexes, links)


def choose_backend(setting: str, topology: Topology) -> str:
    """Nccl on GPUs NVML found; gloo on CPU devices and on simulated machines (topology files)."""
    if setting == "auto":
        return "nccl" if topology.kind == "gpu" and topology.source == "nvml" else "gloo"
    return setting
