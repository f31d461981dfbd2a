"""Collectives over every device together and over a world of one, data checked exactly.

On GPUs the sizes straddle NCCL's protocol switch points (4 B, 256 KiB, 1 MiB, 64 MiB) and the
bus bandwidth is reported with nccl-tests' definitions.  The collectives over one device set
declare themselves (``@pytest.mark.collective``) so that they can share one process group; each
test still gets its own verdict (``conformance/shared_group.py``).
"""

from __future__ import annotations

import pytest

from conformance.harness.context import RunContext
from conformance.plan.matrix import DeviceSet
from conformance.plugin import RunCase, RunCollective


def test_world_of_one(conformance_case: RunCase, conformance: RunContext, single_device: DeviceSet) -> None:
    """Each device alone: a world of one initialises, all-reduces and tears down.

    The "single-GPU machine fails with NCCL unhandled system error" case.
    """
    conformance_case("all_reduce", single_device, sizes=conformance.sizes)


@pytest.mark.parametrize("probe", ["barrier", "barrier_no_device_ids"])
def test_barrier_first(conformance_case: RunCase, barrier_device_set: DeviceSet, probe: str) -> None:
    """A barrier as the group's first collective, with and without device_ids.

    On all devices, on subsets a job may be given, and on sets where torch's guess of the barrier's
    GPU is wrong (the "using GPU N to perform barrier ... unknown" hang).  Without device_ids the
    group is also made without ``device_id``; each rank records its GPU and the barrier's.
    """
    conformance_case(probe, barrier_device_set, device_id_at_init=probe == "barrier")


@pytest.mark.collective("all_reduce", measure=True)
def test_all_reduce(collective_case: RunCollective, device_set: DeviceSet) -> None:
    collective_case(device_set)


@pytest.mark.collective("broadcast")
def test_broadcast(collective_case: RunCollective, device_set: DeviceSet) -> None:
    collective_case(device_set)


@pytest.mark.collective("all_gather", measure=True)
def test_all_gather(collective_case: RunCollective, device_set: DeviceSet) -> None:
    collective_case(device_set)


@pytest.mark.collective("reduce_scatter", measure=True)
def test_reduce_scatter(collective_case: RunCollective, device_set: DeviceSet) -> None:
    collective_case(device_set)


@pytest.mark.collective("all_to_all", measure=True)
def test_all_to_all(collective_case: RunCollective, device_set: DeviceSet) -> None:
    """Every rank a distinct chunk to every rank at once: MoE training's exchange, every pair busy together."""
    collective_case(device_set)
