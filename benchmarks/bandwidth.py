"""What the suite's pair bandwidth figure measures, and what checking the data costs.

    python benchmarks/bandwidth.py [--rounds 7] [--ranks 8] [--check-size-mib 64]

1. Pair bandwidth: the figure the suite records for a 2-rank pair case (the ``pair_exchange``
   probe through the real harness, with the suite's CPU measurement settings) next to a bare
   send/recv loop of the same size and backend written with torch alone: two fresh processes, one
   gloo group, buffers made once, the same exchange (both ranks send and receive at once, one
   ``batch_isend_irecv`` per iteration, as nccl-tests' sendrecv), the same warm-up and iteration
   count, timed with ``perf_counter`` around the loop.  Both report bytes of one message per
   second of one iteration (per direction), the slower rank's.  The two alternate, ``--rounds``
   times each, in one run on this machine; the ratio of the medians is what to read (a shared
   CPU machine is noisy in absolute terms).
2. Check data: each collective probe at ``--ranks`` gloo ranks through the harness, at one message
   size; from rank 0's phase log, the seconds of the transfer step (send, receive, synchronize)
   next to the seconds of its check (the reference built in closed form, then compared).
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
from typing import Any

from conformance.common import casefiles
from conformance.common.deadlines import Deadlines
from conformance.discover.topology import cpu_topology
from conformance.harness.strategy import MEASUREMENT
from conformance.launch.case import CaseRunner, CaseSpec
from conformance.rank.probes import size_label

SETTINGS = MEASUREMENT["cpu"]

BARE_LOOP = r"""
import datetime, json, sys, time
import torch, torch.distributed as dist
rank, store_path, nbytes, warmup, iterations = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
rank = int(rank)
dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
send, receive = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4)
def exchange():
    ops = [dist.P2POp(dist.isend, send, 1 - rank), dist.P2POp(dist.irecv, receive, 1 - rank)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
for _ in range(warmup):
    exchange()
begun = time.perf_counter()
for _ in range(iterations):
    exchange()
seconds = (time.perf_counter() - begun) / iterations
print(json.dumps({"gbps": nbytes / seconds / 1e9}))
dist.destroy_process_group()
"""


def bare_loop(work: Path, round_: int) -> float:
    script = work / "bare_loop.py"
    script.write_text(BARE_LOOP)
    store = work / f"bare-store-{round_}"
    args = [str(SETTINGS["bandwidth_bytes"]), str(SETTINGS["bandwidth_warmup"]), str(SETTINGS["bandwidth_iterations"])]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(store), *args], stdout=subprocess.PIPE, env=env)
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"bare loop failed: {[p.returncode for p in procs]}")
    return min(json.loads(out)["gbps"] for out in outputs)


def suite_pair(runner: CaseRunner, round_: int) -> float:
    spec = CaseSpec(
        nodeid=f"bench::pair{round_}",
        probe="pair_exchange",
        devices=cpu_topology(2).devices,
        backend="gloo",
        params={**SETTINGS, "sizes": [4]},
    )
    result = runner.run(spec)
    if result.verdict != "pass" or result.bandwidth_gbps is None:
        raise RuntimeError(f"suite pair case: {result.verdict} {result.decision.summary}")
    return result.bandwidth_gbps


def pair_bandwidth(work: Path, rounds: int) -> tuple[list[float], list[float]]:
    runner = CaseRunner(work / "suite", Deadlines(60, 60, 120, 3))
    suite, bare = [], []
    try:
        for i in range(rounds):
            suite.append(suite_pair(runner, i))
            bare.append(bare_loop(work, i))
    finally:
        runner.close()
    return suite, bare


def step_seconds(rank_dir: Path) -> list[tuple[str, float, float]]:
    """(step, transfer seconds, check seconds) for every verified step of a rank."""
    phases = casefiles.read_phases(rank_dir)
    steps = []
    for before, verify, after in zip(phases, phases[1:], phases[2:], strict=False):
        if before.phase == "probe" and verify.phase == "verify" and None not in (before.t, verify.t, after.t):
            steps.append((verify.step, (verify.t or 0) - (before.t or 0), (after.t or 0) - (verify.t or 0)))
    return steps


def check_costs(work: Path, ranks: int, nbytes: int) -> list[tuple[str, float, float]]:
    runner = CaseRunner(work / "check", Deadlines(300, 300, 600, 10))
    devices = cpu_topology(ranks).devices
    rows = []
    try:
        for probe in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
            params = {"sizes": [nbytes]}
            spec = CaseSpec(nodeid=f"bench::{probe}", probe=probe, devices=devices, backend="gloo", params=params)
            result = runner.run(spec)
            if result.verdict != "pass":
                raise RuntimeError(f"{probe}: {result.verdict} {result.decision.summary}")
            rows += step_seconds(casefiles.rank_dir(result.case_dir, 0))
    finally:
        runner.close()
    return rows


def median_table(suite: list[float], bare: list[float]) -> str:
    lines = ["| pair, gloo, 2 ranks | n | median GB/s | min | max |", "|---|---|---|---|---|"]
    for name, values in (("suite's recorded figure (pair_exchange probe)", suite), ("bare send/recv loop", bare)):
        lines.append(
            f"| {name} | {len(values)} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="pair cases and bare loops, alternating")
    parser.add_argument("--ranks", type=int, default=8, help="ranks for the check-data measurement")
    parser.add_argument("--check-size-mib", type=int, default=64, help="message size for the check-data measurement")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    nbytes = args.check_size_mib << 20
    with tempfile.TemporaryDirectory(prefix="conformance-bandwidth-") as tmp:
        work = Path(tmp)
        begun = time.monotonic()
        suite, bare = pair_bandwidth(work, args.rounds)
        costs = check_costs(work, args.ranks, nbytes)
        took = time.monotonic() - begun
    size = size_label(int(SETTINGS["bandwidth_bytes"]))
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {took:.0f}s in all")
    print(f"\nPair bandwidth, {size} message, {SETTINGS['bandwidth_warmup']} warm-up + "
          f"{SETTINGS['bandwidth_iterations']} timed iterations, per direction:")  # fmt: skip
    print(median_table(suite, bare))
    ratio = statistics.median(suite) / statistics.median(bare)
    print(f"\nsuite / bare loop, ratio of medians: {ratio:.2f} (must be >= 0.8)")
    print(f"\nCheck data at {args.ranks} gloo ranks, {size_label(nbytes)} per rank, rank 0:")
    print("| step | transfer s | check s | check / transfer |\n|---|---|---|---|")
    for step, transfer, check in costs:
        print(f"| {step} | {transfer:.3f} | {check:.3f} | {check / max(transfer, 1e-9):.2f} |")
    if args.json:
        figures: dict[str, Any] = {"suite_gbps": suite, "bare_gbps": bare, "ratio": ratio, "check": costs}
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
