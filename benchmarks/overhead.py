"""Per-case overhead of the harness against fresh interpreters per case, and hang reaping time.

    python benchmarks/overhead.py [--cases 20] [--fresh-cases 8] [--hangs 5]

Measured side by side in one run on the same machine (compare the ratio, not the absolute
figures, on a shared machine).  A case here is 2 gloo ranks: start, rendezvous through a FileStore,
a 4-byte all-reduce checked exactly, teardown, and one JSON record appended to a results file.

* harness: ranks forked from the torch-loaded forkserver (what `pytest suites/` does);
* fresh interpreters: one new `python` per rank per case, the way a torchrun-per-case script
  starts its workers (torchrun itself would add its agent on top);
* hang: a case whose rank 1 hangs (once honouring SIGTERM, once ignoring it) with a 2 s deadline:
  seconds from the watchdog's deadline to the last rank reaped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.common.deadlines import Deadlines
from conformance.common.jsonl import append_line
from conformance.discover.topology import cpu_topology
from conformance.launch.case import CaseRunner, CaseSpec
from conformance.record.results import case_record

FRESH_RANK = r"""
import datetime, json, sys, time
import torch, torch.distributed as dist
rank, world, store_path, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
store = dist.FileStore(store_path, world)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
data = torch.full((1,), float(rank + 1))
dist.all_reduce(data)
assert data.item() == world * (world + 1) / 2, data
dist.destroy_process_group()
if rank == 0:
    with open(out, "a") as f:
        f.write(json.dumps({"verdict": "pass", "t": time.time()}) + "\n")
"""


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {
        "n": len(values),
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "iqr": q[2] - q[0],
    }


def harness_cases(work: Path, count: int) -> list[float]:
    topology = cpu_topology(2)
    runner = CaseRunner(work / "harness", Deadlines(30, 30, 60, 3))
    results = work / "harness" / "results.jsonl"
    spec = CaseSpec(nodeid="bench::harness", probe="all_reduce", devices=topology.devices, backend="gloo")
    try:
        runner.run(spec)  # warm-up: starts the forkserver once, as a pytest run does
        times = []
        for _ in range(count):
            begun = time.perf_counter()
            result = runner.run(spec)
            append_line(results, case_record(result, "bench"))
            times.append(time.perf_counter() - begun)
            assert result.verdict == "pass", result.decision.summary
        return times
    finally:
        runner.close()


def fresh_cases(work: Path, count: int) -> list[float]:
    script = work / "fresh_rank.py"
    script.write_text(FRESH_RANK)
    results = work / "fresh-results.jsonl"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    times = []
    for i in range(count):
        store = work / f"fresh-store-{i}"
        begun = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(r), "2", str(store), str(results)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            for r in range(2)
        ]
        codes = [p.wait(timeout=120) for p in procs]
        times.append(time.perf_counter() - begun)
        assert codes == [0, 0], f"fresh-interpreter case failed: {codes}"
        store.unlink(missing_ok=True)
    return times


def hang_cases(work: Path, count: int, ignore_sigterm: bool) -> list[float]:
    topology = cpu_topology(2)
    deadline = 2.0
    rule = {"effect": "hang", "phase": "probe", "ranks": [1], "ignore_sigterm": ignore_sigterm}
    from conformance.rank.scenario import Rule

    runner = CaseRunner(
        work / f"hang-{ignore_sigterm}",
        Deadlines(1.5, 1.5, deadline, 3),
        rules=[Rule.from_dict(rule).to_dict()],
        simulated=True,
    )
    spec = CaseSpec(nodeid="bench::hang", probe="barrier", devices=topology.devices, backend="gloo")
    try:
        times = []
        for _ in range(count):
            result = runner.run(spec)
            assert result.verdict == "hang", result.decision.summary
            assert not result.unkillable
            times.append(result.stop_seconds)
        return times
    finally:
        runner.close()


def row(name: str, stats: dict[str, float]) -> str:
    return (
        f"| {name} | {stats['n']:.0f} | {stats['median']:.3f} | {stats['min']:.3f} | "
        f"{stats['max']:.3f} | {stats['iqr']:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20, help="harness cases to time")
    parser.add_argument("--fresh-cases", type=int, default=8, help="fresh-interpreter cases to time")
    parser.add_argument("--hangs", type=int, default=5, help="hung cases of each kind")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conformance-bench-") as tmp:
        work = Path(tmp)
        harness = spread(harness_cases(work, args.cases))
        fresh = spread(fresh_cases(work, args.fresh_cases))
        hang_term = spread(hang_cases(work, args.hangs, ignore_sigterm=False))
        hang_ignore = spread(hang_cases(work, args.hangs, ignore_sigterm=True))
    print(f"2-rank gloo case, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print("| measurement (seconds) | n | median | min | max | IQR |")
    print("|---|---|---|---|---|---|")
    print(row("case through the harness (forkserver)", harness))
    print(row("case with fresh interpreters per rank", fresh))
    print(row("hang: deadline -> last rank reaped", hang_term))
    print(row("hang ignoring SIGTERM: deadline -> reaped", hang_ignore))
    print(f"\nfresh interpreters / harness, median per case: {fresh['median'] / harness['median']:.1f}x")
    if args.json:
        figures = {"harness": harness, "fresh": fresh, "hang": hang_term, "hang_ignore_sigterm": hang_ignore}
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
