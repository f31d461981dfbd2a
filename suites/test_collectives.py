"""Collectives over every device together and over a world of one, data checked exactly."""

from __future__ import annotations

from conformance.matrix import DeviceSet
from conformance.plugin import RunCase
from conformance.session import ConformanceSession


def test_barrier_first(conformance_case: RunCase, device_set: DeviceSet) -> None:
    """A barrier as the group's first collective (the wrong-GPU barrier hang), then an all-reduce."""
    conformance_case("barrier", device_set)


def test_all_reduce(conformance_case: RunCase, conformance: ConformanceSession, device_set: DeviceSet) -> None:
    conformance_case("all_reduce", device_set, sizes=conformance.sizes)


def test_broadcast(conformance_case: RunCase, conformance: ConformanceSession, device_set: DeviceSet) -> None:
    conformance_case("broadcast", device_set, sizes=conformance.sizes)


def test_all_gather(conformance_case: RunCase, conformance: ConformanceSession, device_set: DeviceSet) -> None:
    conformance_case("all_gather", device_set, sizes=conformance.sizes)


def test_reduce_scatter(conformance_case: RunCase, conformance: ConformanceSession, device_set: DeviceSet) -> None:
    conformance_case("reduce_scatter", device_set, sizes=conformance.sizes)
