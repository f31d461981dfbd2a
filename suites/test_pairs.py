"""Every device pair: a 2-rank group exchanging verified data both ways, then bandwidth."""

from __future__ import annotations

from conformance.matrix import DeviceSet
from conformance.plugin import RunCase
from conformance.session import ConformanceSession


def test_pair_exchange(conformance_case: RunCase, conformance: ConformanceSession, device_pair: DeviceSet) -> None:
    """send/recv both ways and an all-reduce, checked exactly; GB/s measured afterwards."""
    conformance_case("pair_exchange", device_pair, sizes=conformance.sizes)
