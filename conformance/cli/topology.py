"""``python -m conformance topology``: the topology a run would use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from conformance.cli.common import argument_type, fail, say
from conformance.common import values
from conformance.common.tables import align_columns
from conformance.discover.topology import Device, Topology, TopologyError, link_matrix_lines, link_note_lines
from conformance.discover.topology_source import discover, load_topology_file

DEFAULT_VIRTUAL_DEVICES = 4
DEVICE_COLUMNS = ("device", "NVML", "model", "UUID", "bus id", "NUMA", "memory", "MIG")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "topology",
        help="print the topology a run would use",
        description="Print the topology a run would use: GPUs through NVML (never CUDA), else virtual CPU devices.",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON that --topology-file reads back")
    parser.add_argument("--topology-file", type=Path, metavar="FILE", help="show a saved topology instead")
    parser.add_argument(
        "--virtual-devices",
        type=argument_type(values.device_count),
        default=DEFAULT_VIRTUAL_DEVICES,
        metavar="N",
        help=f"CPU devices when there is no GPU (default {DEFAULT_VIRTUAL_DEVICES})",
    )
    parser.set_defaults(run=topology_command)


def topology_command(args: argparse.Namespace) -> int:
    try:
        if args.topology_file is not None:
            topology = load_topology_file(args.topology_file, "--topology-file")
        else:
            topology = discover("auto", args.virtual_devices)
    except TopologyError as exc:
        return fail("topology", str(exc))
    say(topology.to_json(indent=2) if args.json else "\n".join(topology_lines(topology)))
    return 0


def topology_lines(topology: Topology) -> list[str]:
    """The human-readable view: devices, link matrix and its notes, P2P exceptions, versions, note."""
    lines = [_summary(topology)]
    if topology.kind == "gpu":
        lines += ["", *align_columns([DEVICE_COLUMNS, *(_device_row(d) for d in topology.devices)])]
        lines += ["", "Links (as nvidia-smi topo -m):", *link_matrix_lines(topology)]
        lines += [f"Note: {line}" for line in link_note_lines(topology)]
        lines += _p2p_lines(topology)
        lines += ["", f"Driver {topology.driver or 'unknown'}, CUDA driver {topology.cuda_driver or 'unknown'}"]
    if topology.note:
        lines += ["", f"Note: {topology.note}"]
    return lines


def _summary(topology: Topology) -> str:
    count = len(topology.devices)
    plural = "" if count == 1 else "s"
    source = {"nvml": "NVML", "virtual": "virtual"}.get(topology.source, f"file {topology.source}")
    if topology.kind == "gpu":
        return f"{count} GPU{plural} from {source}"
    return f"{count} CPU device{plural} ({source}, gloo): {' '.join(d.name for d in topology.devices)}"


def _device_row(device: Device) -> tuple[str, ...]:
    def text(value: object) -> str:
        return "-" if value is None else str(value)

    memory = None if device.memory_mib is None else f"{device.memory_mib} MiB"
    mig = "on" if device.mig else "off"
    cells = (device.nvml_index, device.model, device.uuid, device.pci_bus_id, device.numa_node, memory, mig)
    return (device.name, *(text(c) for c in cells))


def _p2p_lines(topology: Topology) -> list[str]:
    """NVML's P2P status, one line per distinct status naming its pairs; OK everywhere is one line."""
    groups: dict[str, list[str]] = {}
    for a, b in topology.pairs():
        status = topology.p2p_status(a, b)
        if status is None:
            continue
        text = ", ".join(f"{cap} {value}" for cap, value in status.items()) if set(status.values()) != {"OK"} else ""
        groups.setdefault(text, []).append(f"{a.name}-{b.name}")
    problems = {text: pairs for text, pairs in groups.items() if text}
    if not problems:
        return ["", "NVML P2P status: OK for every pair"] if groups else []
    lines = ["", "NVML P2P status where not OK throughout:"]
    lines += [f"  {text}: {' '.join(pairs)}" for text, pairs in problems.items()]
    return lines
