"""Each case's wall time split into its parts, from the fork to the parent's record.

    python tools/gpu_case_times.py RUN_DIR [OUT.json]

RUN_DIR is a run's folder (reports/<run id>, holding results.jsonl). Read from rank 0's phase lines
(conformance/rank/main.py writes one as each part begins; on NCCL "CUDA device (set_device)" comes
before "init_process_group(nccl)"). The case's start is its record's time less its seconds, so
"fork" also holds the few milliseconds the record took to write. The teardown is three parts:
"destroy" (destroy_process_group, or the store barrier that replaced it in every case but the
environment test, and the result's write, up to the rank's last stamp), "exit" (from
that stamp until the forkserver reaped the rank: the process's end, its CUDA context's with it) and
"collect" (from the reaping to the parent's record).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from conformance.common.casefiles import PhaseLine, rank_dir, read_phases
from conformance.rank.main import EXIT_STEP

PARTS = ("fork", "store", "cuda init", "nccl init", "probe", "destroy", "exit", "collect")


def part_of(line: PhaseLine) -> str | None:
    if line.phase == "start":
        return "store"
    if line.phase == "init":
        return "cuda init" if line.step.startswith("CUDA device") else "nccl init"
    if line.phase in ("probe", "verify"):
        return "probe"
    if line.step == EXIT_STEP:
        return "exit"
    if line.phase == "teardown":
        return "destroy"
    return None  # control: still the store check-in


def split(record: dict[str, Any]) -> dict[str, float]:
    """The case's seconds by part, from rank 0's phase stamps on the host's monotonic clock (``clock``)."""
    end = float(record["clock"])
    start = end - float(record["seconds"])
    lines = [p for p in read_phases(rank_dir(Path(record["case_dir"]), 0)) if p.clock is not None]
    times = {part: 0.0 for part in PARTS}
    if not lines:
        return times
    times["fork"] = max(0.0, float(lines[0].clock or start) - start)
    current, since = "store", float(lines[0].clock or start)
    for line in lines[1:]:
        part = part_of(line) or current
        times[current] += float(line.clock or since) - since
        current, since = part, float(line.clock or since)
    rank0 = next((r for r in record.get("ranks") or () if r.get("rank") == 0), None)
    reaped = start + float(rank0["seconds"]) if rank0 and rank0.get("seconds") else end
    times[current] += max(0.0, min(reaped, end) - since)
    times["collect"] += max(0.0, end - max(reaped, since))
    return {k: round(v, 3) for k, v in times.items()}


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    results = Path(argv[0]) / "results.jsonl"
    records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    # cases (host checks have no case folder), stamped on the monotonic clock
    records = [r for r in records if r.get("case_dir") and r.get("seconds") is not None and r.get("clock")]
    rows = [{"case": r["nodeid"].split("::")[-1], "verdict": r["verdict"], "seconds": r["seconds"], **split(r)}
            for r in records]  # fmt: skip
    width = max([len(r["case"]) for r in rows] + [4])
    print(f"{'case'.ljust(width)}  verdict  total  " + "  ".join(f"{p:>9}" for p in PARTS))
    for r in rows:
        parts = "  ".join(f"{r[p]:9.3f}" for p in PARTS)
        print(f"{r['case'].ljust(width)}  {r['verdict']:<7}  {r['seconds']:5.2f}  {parts}")
    if len(argv) == 2:
        Path(argv[1]).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
