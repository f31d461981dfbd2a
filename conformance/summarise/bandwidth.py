"""Bandwidth judged within one run: a pair far below the pairs like it is SLOW, baseline or not.

Pairs are compared with the pairs of their own kind in the same run: the same probe, link class
and rung (the same hardware path, measured the same way).  A pair is SLOW when its bandwidth is
below ``slow_ratio`` (default 0.6) of that group's median, or below the floor a site set for its
link class (``--bandwidth-floor SYS=10``, e.g. a cloud's per-SKU figure).  0.6: healthy pairs of
one path measure within a few tens of per cent of each other, while the faults this looks for
take far more: a link at x8 of x16 carries half, a pair "at a third of its class's speed" (the
question nccl-tests #40, #149, #293 ask) a third.  A group of one pair has no peers to judge it
by: only a floor does.

Judged only where the figure measures a GPU link: NCCL cases on GPUs, and simulated pairs, whose
figure is their link's physical rate (``discover/link_rate.py``, ``record.metrics.simulated_gbps``).
gloo on CPU ranks copies host memory: never judged.  SLOW is its own finding, never a ``fail``
(wrong data) or a ``hang``: the case passed, and the answer says how slow and against what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median

from conformance.common.verdicts import Verdict
from conformance.record.records import LINK_GBPS, SIMULATED_GBPS, CaseRecord

DEFAULT_SLOW_RATIO = 0.6  # settings.py's default for slow_ratio; older runs did not record one
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
    floor: float | None
    link_gbps: float | None = None  # its link's physical rate (``discover/link_rate.py``), where known

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
            reasons.append(f"{self.gbps / self.link_gbps:.2f} of its link's {self.link_gbps:g}")
        return f"{self.pair} {self.gbps:g} GB/s ({', '.join(reasons)})"


def slow_lines(slow: Iterable[SlowPair]) -> list[str]:
    """One answer line per probe, link class and rung with slow pairs, naming each pair and its figure."""
    groups: dict[tuple[str, str, str], list[SlowPair]] = {}
    for pair in slow:
        groups.setdefault((pair.link, pair.probe, pair.rung), []).append(pair)
    return [
        f"SLOW: {link} pairs' {probe} on {rung}, below {pairs[0].ratio:g} of their class's median or its floor: "
        f"{'; '.join(p.figure_text() for p in pairs)} -> {SLOW_FIX}"
        for (link, probe, rung), pairs in groups.items()
    ]


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
        for record, figure in members:
            below_peers = middle is not None and figure < ratio * middle
            if below_peers or (floor is not None and figure < floor):
                pair, rate = "-".join(record.devices), link_gbps(record)
                slow.append(SlowPair(record.nodeid, pair, link, probe, rung, figure, middle, ratio, floor, rate))
    return slow
