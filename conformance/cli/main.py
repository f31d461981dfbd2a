"""``python -m conformance``: what happens outside a test run.

    python -m conformance topology [--json] [--topology-file FILE] [--virtual-devices N]
    python -m conformance recommend [RUN]
    python -m conformance compare BASELINE CURRENT [--bandwidth-tolerance R] [--json]
    python -m conformance report [RUN]
    python -m conformance merge-junit OUT IN...
    python -m conformance smoke [--out DIR] [--skip-suite]

Each command is an argparse subcommand with a ``run`` function returning the exit status; bad
input prints one line to stderr and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from conformance.cli.common import PROG, USAGE_ERROR
from conformance.discover.topology import (
    Device,
    Topology,
    TopologyError,
    align_columns,
    discover,
    link_matrix_lines,
    link_note_lines,
    load_topology_file,
)

# Each exposes register(commands); see cli_common.
COMMAND_MODULES = (
    "conformance.summarise.recommend",
    "conformance.summarise.compare",
    "conformance.summarise.report",
    "conformance.summarise.junit_merge",
    "conformance.cli.smoke",
)
DEFAULT_VIRTUAL_DEVICES = 4
DEVICE_COLUMNS = ("device", "NVML", "model", "UUID", "bus id", "NUMA", "memory", "MIG")


class UsageError(Exception):
    """A command line argparse rejects; main turns it into one line on stderr and exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="GPU environment conformance: what happens outside a test run.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    topology = commands.add_parser(
        "topology",
        help="print the topology a run would use",
        description="Print the topology a run would use: GPUs through NVML (never CUDA), else virtual CPU devices.",
    )
    topology.add_argument("--json", action="store_true", help="print the JSON that --topology-file reads back")
    topology.add_argument("--topology-file", type=Path, metavar="FILE", help="show a saved topology instead")
    topology.add_argument(
        "--virtual-devices",
        type=_positive_int,
        default=DEFAULT_VIRTUAL_DEVICES,
        metavar="N",
        help=f"CPU devices when there is no GPU (default {DEFAULT_VIRTUAL_DEVICES})",
    )
    topology.set_defaults(run=topology_command)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


# --------------------------------------------------------------------------------------------
# topology
# --------------------------------------------------------------------------------------------


def topology_command(args: argparse.Namespace) -> int:
    try:
        if args.topology_file is not None:
            topology = load_topology_file(args.topology_file, "--topology-file")
        else:
            topology = discover("auto", args.virtual_devices)
    except TopologyError as exc:
        print(f"{PROG} topology: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(topology.to_json(indent=2) if args.json else "\n".join(topology_lines(topology)))
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
