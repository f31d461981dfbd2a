"""A GPU pair's physical link rate, GB/s per direction, from the facts NVML gave (``health.py``).

* NVLink: the pair's links (``NV<n>``) times one link's rate for the GPU's NVLink version.  Per
  link and direction (NVIDIA's architecture whitepapers): NVLink 1.0 (P100) 20 GB/s; 2.0 (V100)
  25; 3.0 (A100) 25 (50 GB/s both ways); 4.0 (H100) 25 (900 GB/s for 18 links both ways);
  5.0 (B200) 50 (1.8 TB/s for 18 links).  nvmlDeviceGetNvLinkVersion numbers them as
  ``NVML_NVLINK_VERSION_*`` (nvml.h): 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0.
* PCIe: the slower GPU's link, lanes now times one lane's rate at the highest generation the GPU
  and slot allow (an idle GPU lowers its generation; a downtrained width is real).  Per lane and
  direction (PCI-SIG): 2.5, 5, 8, 16, 32, 64 GT/s for Gen1..6, 8b/10b encoding to Gen2 and
  128b/130b from Gen3 (Gen6's FLIT mode about the same): 0.25, 0.5, 0.985, 1.969, 3.938, 7.877 GB/s.

A pair across sockets (SYS) may be held lower by the CPU interconnect, which NVML does not give:
the figure is the GPUs' own links, an upper bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import TYPE_CHECKING

from conformance.common.casefiles import TRANSFER_GENERATIONS
from conformance.discover.health import GpuHealth
from conformance.rank.scenario import Placement, Rule

if TYPE_CHECKING:
    from conformance.discover.topology import Topology

NVLINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}


def pcie_gbps(health: GpuHealth | None) -> float | None:
    if health is None or health.pcie_width is None or health.pcie_max_gen not in PCIE_LANE_GBPS:
        return None
    return round(health.pcie_width * PCIE_LANE_GBPS[health.pcie_max_gen], 2)


def pair_rate_gbps(link: str, first: GpuHealth | None, second: GpuHealth | None) -> float | None:
    """The physical rate of a pair's link class (``NV18``, ``PIX`` ...), or None where a fact is missing."""
    if link.startswith("NV"):
        if not link[2:].isdigit():
            return None  # NV?: NVLink, its count unknown
        version = (first or GpuHealth()).nvlink_version
        return None if version not in NVLINK_GBPS else int(link[2:]) * NVLINK_GBPS[version]
    rates = [rate for rate in (pcie_gbps(first), pcie_gbps(second)) if rate is not None]
    return min(rates) if len(rates) == 2 else None


# A healthy pair's share of its link's physical rate in a simulation: NCCL's send/recv reaches about
# 0.8 of a PCIe link (protocol and DMA overhead); the judgement compares pairs with each other, so
# the exact share matters less than its being the same for every healthy pair.
HEALTHY_SHARE = 0.8


def pair_link_gbps(topology: Topology, names: Sequence[str]) -> float | None:
    """The physical rate of the link between two of the topology's GPUs; None where a fact is missing."""
    if topology.kind != "gpu" or len(names) != 2:
        return None
    first, second = topology.by_name(names)
    return pair_rate_gbps(
        topology.link(first, second), topology.health.get(first.name), topology.health.get(second.name)
    )


def slowest_link_gbps(topology: Topology, names: Sequence[str]) -> float | None:
    """The slowest physical link between any two of the GPUs (a collective's busbw cannot pass it)."""
    if len(set(names)) < 2:
        return None
    rates = [pair_link_gbps(topology, (a, b)) for a, b in combinations(sorted(set(names)), 2)]
    return None if None in rates else min(r for r in rates if r is not None)


def simulated_gbps(topology: Topology, names: Sequence[str], probe: str, rules: Sequence[Rule]) -> float | None:
    """A simulated pair's bandwidth: its link's physical rate times the healthy share.

    Times ``slow_link``'s fraction where one selects the pair (by its devices, link class, probe, set
    kind); None where the topology lacks the facts.
    """
    rate = pair_link_gbps(topology, names)
    if rate is None:
        return None
    link = topology.link(*topology.by_name(names))
    share = HEALTHY_SHARE
    places = [Placement(rank, name, probe, "pair", (link,)) for rank, name in enumerate(names)]
    for rule in rules:
        # the pair is the unit: a rule naming devices selects the pairs both of whose GPUs it names
        if rule.effect == "slow_link" and all(rule.applies(place, rule.phase, {}) for place in places):
            share *= rule.fraction
    return round(rate * share, 2)


def simulated_transfer_generations(topology: Topology, names: Sequence[str]) -> dict[str, dict[str, int]]:
    """What a GPU rank reads while its timed transfers move data (``rank/link_gen.py``), on a simulated machine.

    Its topology file's ``watch`` gives each GPU's generation under load (``pcie_gen_busy``); the record
    carries it as a real rank's would, so the watch judges only GPUs that moved data, as on a real run.
    """
    watched = topology.watch.gpus if topology.watch else {}
    found = {name: gen for name in names if (gen := getattr(watched.get(name), "pcie_gen_busy", None)) is not None}
    return {TRANSFER_GENERATIONS: found} if found else {}
