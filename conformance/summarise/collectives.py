"""The collectives' bandwidth as nccl-tests prints it: size x collective, algbw and busbw (GB/s).

A collective's record keeps ``metrics.algbw_gbps`` and ``metrics.busbw_gbps`` per size (the probes
time the largest size, after its data was checked: ``rank/probes.py``); busbw is algbw times
nccl-tests' factor (2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter).  The
terminal summary shows one compact table, the report the same rows.  On GPUs each row also gives
busbw as a fraction of the set's slowest link's physical rate (``metrics.link_gbps``, the bound
busbw cannot pass: ``discover/link_rate.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from conformance.common.tables import align_columns
from conformance.common.verdicts import Verdict
from conformance.record.records import CaseRecord
from conformance.summarise.bandwidth import link_gbps

HOST_MEMORY = "gloo on CPU ranks: host memory copies, not a GPU link"


@dataclass(frozen=True)
class CollectiveRow:
    collective: str
    devices: str  # the device set as the test id names it: all8, last_half-gpu4-gpu5-...
    ranks: int
    size: str
    algbw: float
    busbw: float | None
    rung: str
    backend: str
    link_gbps: float | None = None  # the set's slowest link's physical rate (GPU runs)

    def cells(self) -> tuple[str, ...]:
        busbw = "-" if self.busbw is None else f"{self.busbw:.2f}"
        share = "-" if self.busbw is None or not self.link_gbps else f"{self.busbw / self.link_gbps:.2f}"
        return (self.collective, self.devices, str(self.ranks), self.size, f"{self.algbw:.2f}", busbw, share, self.rung)


def size_bytes(label: str) -> int:
    """The bytes of a size as the probes name it (``rank/probes.py``'s ``size_label``: 4B, 64KiB, 8192MiB)."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if label.endswith(unit) and label[: -len(unit)].isdigit():
            return int(label[: -len(unit)]) * scale
    return 0


def _set_name(record: CaseRecord) -> str:
    """``all4`` from ``test_all_reduce[all4]`` (the ladder key: the test id without the rung)."""
    key = record.ladder_key or ""
    return key[key.find("[") + 1 : -1] if key.endswith("]") and "[" in key else str(record.set_kind or "?")


def _numbers(value: object) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def collective_rows(records: Iterable[CaseRecord]) -> list[CollectiveRow]:
    """One row per passing collective case and size it timed, by collective, then device set and size."""
    rows = []
    for record in records:
        if record.outcome is not Verdict.PASS or not isinstance(record.metrics, Mapping):
            continue
        algbw, busbw = _numbers(record.metrics.get("algbw_gbps")), _numbers(record.metrics.get("busbw_gbps"))
        ranks = len(record.devices) * (len(record.nodes) if record.nodes else 1)
        link = link_gbps(record)
        for size, value in algbw.items():
            rows.append(
                CollectiveRow(record.probe, _set_name(record), ranks, size, value, busbw.get(size),
                              str(record.env_name), str(record.backend or "?"), link)
            )  # fmt: skip
    return sorted(rows, key=lambda r: (r.collective, r.devices, r.rung, r.size))


HEADER = ("collective", "devices", "ranks", "size", "algbw", "busbw", "of link", "rung")


def collective_lines(records: Iterable[CaseRecord]) -> list[str]:
    """The compact table for the terminal (nothing when no collective was timed)."""
    rows = collective_rows(records)
    if not rows:
        return []
    note = f"; {HOST_MEMORY}" if all(r.backend == "gloo" for r in rows) else ""
    title = (
        "collectives (GB/s as nccl-tests prints them: algbw = bytes / time, busbw = algbw x its factor; "
        f"of link: busbw / the slowest link's physical rate{note})"
    )
    return [title, *align_columns([HEADER, *(row.cells() for row in rows)])]
