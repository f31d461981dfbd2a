"""Every device pair: a peer copy in one process, and a 2-rank group exchanging verified data.

A pair that NVML says cannot do P2P is not a failure when NCCL falls back correctly: the record
shows the transport it used.
"""

from __future__ import annotations

import pytest

from conformance.harness.context import RunContext
from conformance.plan.matrix import DeviceSet
from conformance.plugin import RunCase


def test_pair_exchange(conformance_case: RunCase, conformance: RunContext, device_pair: DeviceSet) -> None:
    """send/recv both ways and an all-reduce, checked exactly; GB/s measured afterwards."""
    conformance_case("pair_exchange", device_pair, sizes=conformance.sizes)


@pytest.mark.no_nccl
def test_peer_copy(conformance_case: RunCase, conformance: RunContext, device_pair: DeviceSet) -> None:
    """Both directions of ``tensor.to(peer)`` at 8 B and the largest size, every element checked."""
    conformance_case("peer_copy", device_pair, sizes=[8, max(conformance.sizes)], single_process=True)
