"""Across nodes: every rank of every node in one group, and each pair of nodes on its own.

Runs when the suite is started on several nodes (``--nnodes``/``--node-rank``/``--master-addr``,
or SLURM / torchrun variables), one pytest per node; skipped with the reason on one node.  The
nodes have compared fingerprints before any of this, so a node seeing fewer GPUs stops the run
instead of hanging here.
"""

from __future__ import annotations

from conformance.harness.context import RunContext
from conformance.plan.matrix import DeviceSet
from conformance.plugin import RunCase


def test_all_reduce_across_nodes(
    conformance_case: RunCase, conformance: RunContext, node_device_set: DeviceSet
) -> None:
    conformance_case("all_reduce", node_device_set, sizes=conformance.sizes, measure=True)


def test_all_gather_across_nodes(
    conformance_case: RunCase, conformance: RunContext, node_device_set: DeviceSet
) -> None:
    conformance_case("all_gather", node_device_set, sizes=conformance.sizes, measure=True)


def test_barrier_across_nodes(conformance_case: RunCase, node_device_set: DeviceSet) -> None:
    """The group's first collective is a barrier, as in a training script's start."""
    conformance_case("barrier", node_device_set)


def test_node_pair(conformance_case: RunCase, conformance: RunContext, node_pair: DeviceSet) -> None:
    """One rank on each of two nodes: send/recv both ways and an all-reduce, checked; GB/s after."""
    conformance_case("pair_exchange", node_pair, sizes=conformance.sizes)
