"""Bandwidth judged within one run: a pair far below the pairs like it is SLOW, baseline or not.

Pairs are compared with the pairs of their own kind in the same run: the same probe, link class
and rung (the same hardware path, measured the same way).  A pair is SLOW when its bandwidth is
below ``slow_ratio`` (default 0.6) of that group's median, or below the floor a site set for its
link class (``--bandwidth-floor SYS=10``, e.g. a cloud's per-SKU figure).  0.6: healthy pairs of
one path measure within a few tens of per cent of each other, while the faults this looks for
take far more: a link at x8 of x16 carries half, a pair "at a third of its class's speed" (the
question nccl-tests #40, #149, #293 ask) a third.  A group of one pair has no peers to judge it
by: only a floor does.

A whole class can be slow too (an IOMMU that translates every P2P transaction slows every switch
pair alike, to 5% of its link), so every pair is also judged against **its link's physical rate**
(``discover/link_rate.py``): below a default floor, a fraction of that rate per probe and link kind
(:data:`LINK_FLOORS`), it is SLOW whatever its peers measure.  The floors sit well below what
healthy links measure and well above what broken ones do (sources beside the table); a site's own
``--bandwidth-floor CLASS=GBPS`` replaces the default for its class.

Judged only where the figure measures a GPU link: NCCL cases on GPUs, and simulated pairs, whose
figure is their link's physical rate (``discover/link_rate.py``, ``record.metrics.simulated_gbps``).
gloo on CPU ranks copies host memory: never judged.  SLOW is its own finding, never a ``fail``
(wrong data) or a ``hang``: the case passed, and the answer says how slow and against what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median

from conformance.common.verdicts import Verdict
from conformance.discover.health import nvlink_problems, pcie_problems
from conformance.discover.iommu import TRANSLATED
from conformance.record.machine import MachineFacts
from conformance.record.records import LINK_GBPS, SIMULATED_GBPS, CaseRecord

DEFAULT_SLOW_RATIO = 0.6  # settings.py's default for slow_ratio; older runs did not record one
NVLINK, THROUGH_A_SWITCH, THROUGH_THE_HOST = "NVLink", "a PCIe switch", "the host"
LINK_KINDS = {"PIX": THROUGH_A_SWITCH, "PXB": THROUGH_A_SWITCH, "PHB": THROUGH_THE_HOST, "NODE": THROUGH_THE_HOST,
              "SYS": THROUGH_THE_HOST}  # fmt: skip
# The default floors, a fraction of the pair's physical rate per direction, by probe (a copy engine's peer copy,
# NCCL's 2-rank send/recv at 512 MiB) and link kind.  Healthy links, measured (one direction, large messages):
# copy engines over NVLink 0.79-0.94 (p2pBandwidthLatencyTest on 8x H100 371-377 of 450 GB/s, NVIDIA/nccl#1264;
# 8x A100 271-277 of 300, stas00/ml-engineering network/README.md), over PCIe P2P 0.66-0.84 (nvbandwidth on RTX
# A6000 Gen4 26.3 of 31.5, NVIDIA/nvbandwidth#50), through the host 0.36-0.71 (a V100 pair on EPYC 5.7 of 15.75,
# reframe's cscs p2p_bandwidth check; staged copies 22.3 of 31.5); NCCL over NVLink 0.18-0.82 (2-rank sendrecv on
# H100 80-180 GB/s, nccl-tests#268; 370 GB/s effective, nccl-tests#212), over PCIe 0.76-0.78 (NCCL's own model
# PCI_BW 12 of 15.75, src/graph/topo.h; 6x RTX 4090 busbw 24.5 of 31.5). Broken ones: P2P through a redirecting
# IOMMU or a broken BAR 0.03-0.08 (RTX A6000 1.6-2.6 GB/s, stas00/ml-engineering#1; RTX 5090 2.0,
# aikitoria/open-gpu-kernel-modules#9), NVLink unused 0.08 (H100 staged through the host, nccl#1264).  Each
# floor keeps 2.4x or more below the lowest healthy figure and above the broken ones; a link one step slower
# (one NVLink down, x8 of x16) is the NVLink and PCIe host checks' to find, not the floors'.
LINK_FLOORS = {
    ("peer_copy", NVLINK): 0.30,
    ("peer_copy", THROUGH_A_SWITCH): 0.25,
    ("peer_copy", THROUGH_THE_HOST): 0.15,
    ("pair_exchange", NVLINK): 0.10,
    ("pair_exchange", THROUGH_A_SWITCH): 0.15,
    ("pair_exchange", THROUGH_THE_HOST): 0.08,
}


def link_kind(link: str) -> str | None:
    """NVLink, through a PCIe switch, or through the host, for a pair's link class (None: not a GPU link)."""
    return NVLINK if link.startswith("NV") else LINK_KINDS.get(link)


def default_floor(probe: str, link: str) -> float | None:
    """The default floor of a probe over a link class, as a fraction of the link's rate (None: not judged)."""
    kind = link_kind(link)
    return None if kind is None else LINK_FLOORS.get((probe, kind))


def floors_text() -> str:
    """The default floors in one line, for the run's header."""
    by_probe: dict[str, list[str]] = {}
    for (probe, kind), fraction in LINK_FLOORS.items():
        by_probe.setdefault(probe, []).append(f"{kind} {fraction:g}")
    said = "; ".join(f"{probe}: {', '.join(kinds)}" for probe, kinds in by_probe.items())
    return f"bandwidth floors, a fraction of each pair's link rate: {said} (--bandwidth-floor CLASS=GBPS replaces one)"


SLOW_FIX = "check the pair's path: both GPUs' PCIe links (`nvidia-smi -q -d PCIE`) and NVLinks (`nvidia-smi nvlink -s`)"


def judged_gbps(record: CaseRecord) -> float | None:
    """The figure a pair is judged by, or None where it does not measure a GPU link."""
    if record.set_kind != "pair" or record.outcome is not Verdict.PASS:
        return None
    if record.simulated:
        figure = record.metrics.get(SIMULATED_GBPS)
        return float(figure) if isinstance(figure, (int, float)) and not isinstance(figure, bool) else None
    if record.backend == "nccl" and record.bandwidth_gbps:
        return float(record.bandwidth_gbps)
    return None


def link_gbps(record: CaseRecord) -> float | None:
    """The pair's physical link rate the run recorded (``record.metrics.link_gbps``), where it knew it."""
    rate = record.metrics.get(LINK_GBPS)
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0 else None


@dataclass(frozen=True)
class SlowPair:
    """One pair below its group's median times the ratio, or below its class's floor."""

    case: str
    pair: str
    link: str
    probe: str
    rung: str
    gbps: float
    median: float | None  # of its group (None: alone in it)
    ratio: float
    floor: float | None  # the site's floor for its class, GB/s
    link_gbps: float | None = None  # its link's physical rate (``discover/link_rate.py``), where known
    link_floor: float | None = None  # the default floor, a fraction of the link's rate (None: a site's floor, or none)

    @property
    def test_name(self) -> str:
        """Its failed test case's name in the JUnit file."""
        return f"slow_pair[{self.pair}-{self.link}-{self.probe}-{self.rung}]"

    def figure_text(self) -> str:
        """``gpu1-gpu5 7.56 GB/s (0.30 of the median 25.2)``, or ``(below the floor 10)``."""
        reasons = []
        if self.median is not None and self.gbps < self.ratio * self.median:
            reasons.append(f"{self.gbps / self.median:.2f} of the median {self.median:g}")
        if self.floor is not None and self.gbps < self.floor:
            reasons.append(f"below the floor {self.floor:g}")
        if self.link_gbps:
            share = f"{self.gbps / self.link_gbps:.2f} of its link's {self.link_gbps:g}"
            below = self.link_floor is not None and self.gbps < self.link_floor * self.link_gbps
            reasons.append(f"{share}, below the floor {self.link_floor:g}" if below else share)
        return f"{self.pair} {self.gbps:g} GB/s ({', '.join(reasons)})"

    @property
    def below_link_floor(self) -> bool:
        return (
            self.link_floor is not None and self.link_gbps is not None and self.gbps < self.link_floor * self.link_gbps
        )


def slow_lines(slow: Iterable[SlowPair], causes: SlowCauses | None = None) -> list[str]:
    """One answer line per probe, link class and rung with slow pairs, naming each pair and its figure.

    ``causes``: what the machine's facts say slows its links, where they say something.
    """
    groups: dict[tuple[str, str, str], list[SlowPair]] = {}
    for pair in slow:
        groups.setdefault((pair.link, pair.probe, pair.rung), []).append(pair)
    lines = []
    for (link, probe, rung), pairs in groups.items():
        judged = (
            "the floor for their link"
            if all(p.below_link_floor for p in pairs)
            else (f"{pairs[0].ratio:g} of their class's median or its floor")
        )
        cause = causes.for_pairs(link, pairs) if causes is not None else ""
        likely = f"likely cause: {cause}; " if cause else ""
        lines.append(
            f"SLOW: {link} pairs' {probe} on {rung}, below {judged}: {'; '.join(p.figure_text() for p in pairs)} "
            f"-> {likely}{SLOW_FIX}"
        )
    return lines


def slow_pairs(records: Iterable[CaseRecord], ratio: float, floors: Mapping[str, float]) -> list[SlowPair]:
    """Every pair judged slow, in the order the run recorded them."""
    groups: dict[tuple[str, str, str], list[tuple[CaseRecord, float]]] = {}
    for record in records:
        figure = judged_gbps(record)
        if figure is not None:
            key = (record.probe, str(record.link), str(record.env_name))
            groups.setdefault(key, []).append((record, figure))
    slow = []
    for (probe, link, rung), members in groups.items():
        middle = median(figure for _, figure in members) if len(members) > 1 else None
        floor = floors.get(link)
        fraction = None if floor is not None else default_floor(probe, link)  # a site's floor replaces the default
        for record, figure in members:
            rate = link_gbps(record)
            below_peers = middle is not None and figure < ratio * middle
            below_link = fraction is not None and rate is not None and figure < fraction * rate
            if below_peers or below_link or (floor is not None and figure < floor):
                pair = "-".join(record.devices)
                slow.append(
                    SlowPair(record.nodeid, pair, link, probe, rung, figure, middle, ratio, floor, rate, fraction)
                )
    return slow


@dataclass(frozen=True)
class SlowCauses:
    """What the machine's own facts say slows its links: per link kind (the IOMMU, ACS) and per GPU."""

    by_kind: Mapping[str, str] = field(default_factory=dict)
    by_gpu: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # link kind -> GPU -> its cause

    def for_pairs(self, link: str, pairs: Iterable[SlowPair]) -> str:
        kind = link_kind(link) or ""
        gpus = {gpu for pair in pairs for gpu in pair.pair.split("-")}
        said = [self.by_kind[kind]] if kind in self.by_kind else []
        said += [text for gpu, text in sorted(self.by_gpu.get(kind, {}).items()) if gpu in gpus]
        return "; ".join(said)


def slow_causes(machine: MachineFacts) -> SlowCauses:
    """The IOMMU or ACS for switch pairs, a link trained down for PCIe pairs, NVLinks down for NVLink pairs."""
    by_kind: dict[str, str] = {}
    by_gpu: dict[str, dict[str, str]] = {}
    iommu = machine.iommu
    if iommu.mode == TRANSLATED or iommu.p2p_redirected:
        said = iommu.cause_text()
        if iommu.acs_unreadable and not iommu.acs_redirect and not machine.platform.virtualised:  # a guest's: moot
            said += (
                "; the bridges' ACS control could not be read here (read it as root: "
                "`sudo lspci -vvv | grep -i -e '^[0-9a-f]' -e acsctl`; ReqRedir+ or CmpltRedir+ on a switch port "
                "above the GPUs redirects their P2P)"
            )
        by_kind[THROUGH_A_SWITCH] = f"{said} -> {machine.p2p_fix}"
    topology = machine.topology
    if topology is not None and topology.kind == "gpu":
        for name, problem in pcie_problems(topology.health).items():
            for kind in (THROUGH_A_SWITCH, THROUGH_THE_HOST):
                by_gpu.setdefault(kind, {})[name] = f"{name} {problem.split(':')[0]}"
        models = {d.name: d.model for d in topology.devices}
        for name, problem in nvlink_problems(topology.health, models).items():
            by_gpu.setdefault(NVLINK, {})[name] = f"{name}: {problem.split(':')[0]}"
    return SlowCauses(by_kind, by_gpu)
