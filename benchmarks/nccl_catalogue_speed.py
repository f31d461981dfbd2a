"""How fast the NCCL catalogue names a WARN line: matches per second over a log made of the catalogue's own formats.

    python benchmarks/nccl_catalogue_speed.py [--mb 4] [--repeat 3] [--seed 1]

It writes (in memory) a log of about ``--mb`` MB of NCCL WARN lines as ``NCCL_DEBUG=WARN`` prints them
(``host:pid:tid [dev] file.cc:line NCCL WARN <text>``), each text one of the catalogue's formats with its
conversions filled by sample values (a word for %s, a number for %d, an address for %p, ...), drawn at random.
Then, in one process, best of ``--repeat``: ``nccl_log.warning_text`` and ``catalogue.nccl_warning`` on every line.
It prints lines per second, MB/s, and how many lines got an entry and how many the entry of their own format (a
line another, equally or more specific format also prints counts as found, not as its own).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conformance.diagnose.catalogue import CatalogueEntry, nccl_warning, warning_entries  # noqa: E402
from conformance.verdict.nccl_log import warning_text  # noqa: E402

_SPEC = re.compile(r"%[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*)?)?(?:hh|h|ll|l|L|q|j|z|Z|t)?([diouxXeEfFgGaAcspnm%])")
_PARAM = re.compile(r"\$\{\w+\}")
_SAMPLES = {
    "d": "17", "i": "3", "u": "4096", "o": "17", "x": "1a000", "X": "1A000", "p": "0x7f3a2c000000", "c": "x",
    "s": "mlx5_0", "m": "Connection timed out", "%": "%", "n": "",
}  # fmt: skip


def render(entry: CatalogueEntry) -> str:
    """One text the format prints (its first line, as a WARN line holds it)."""
    text = entry.format.strip().split("\n", 1)[0].strip()
    text = _PARAM.sub("ibv_reg_mr", text)
    return _SPEC.sub(lambda m: _SAMPLES.get(m.group(1), "1.5"), text)


def log_lines(mb: float, seed: int) -> list[tuple[str, CatalogueEntry]]:
    entries = [e for e in warning_entries() if nccl_warning(render(e)) is not None]
    rng, lines, size = random.Random(seed), [], 0
    while size < mb * 1e6:
        entry = rng.choice(entries)
        line = f"node3:41234:41290 [5] {entry.provenance.file.removeprefix('src/')}:{entry.provenance.line} NCCL WARN "
        lines.append((line + render(entry), entry))
        size += len(lines[-1][0]) + 1
    return lines


def run(lines: list[tuple[str, CatalogueEntry]]) -> tuple[float, int, int]:
    found = own = 0
    start = time.perf_counter()
    for line, entry in lines:
        text = warning_text(line)
        got = nccl_warning(text) if text is not None else None
        found += got is not None
        own += got is not None and (got.format == entry.format or got.literal >= entry.literal)
    return time.perf_counter() - start, found, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    nccl_warning("warm up: load the catalogue")
    lines = log_lines(args.mb, args.seed)
    size = sum(len(line) + 1 for line, _ in lines) / 1e6
    seconds, found, own = min(run(lines) for _ in range(max(1, args.repeat)))
    print(f"{len(lines)} WARN lines, {size:.1f} MB, {len(warning_entries())} formats in the catalogue")
    print(f"{len(lines) / seconds:,.0f} lines/s ({size / seconds:.1f} MB/s), best of {args.repeat}")
    print(f"found {found}/{len(lines)}; its own format or a more specific one: {own}/{len(lines)}")


if __name__ == "__main__":
    main()
