"""Where a GPU rank's end goes: destroy_process_group, the process's exit, with and without the first.

    python tools/gpu_teardown.py [REPEATS] [OUT.json]

A benchmark, not a test: each trial is a fresh process that does what a conformance case's rank does
(set_device, eager NCCL init of a world of one from a FileStore, a checked all-reduce, a 1 GiB
buffer like the bandwidth probe's), then ends one of three ways, stamping the host's monotonic clock
as it goes; the parent stamps the moment ``waitpid`` returns. The variants run interleaved (A B C A B
C ...), so load on the machine falls on each alike:

    destroy   destroy_process_group(), then os._exit (what rank/main.py did up to 2026-11-28)
    exit      os._exit at once: NCCL's communicator ends with the process
    abort     torch's _abort_process_group (ncclCommAbort: no wait for work in flight), then os._exit

Prints per variant the median of destroy (the call), exit (last stamp to reaped) and their sum, and
the CUDA context's start (set_device with a first allocation) beside NCCL's init, for scale.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("destroy", "exit", "abort")

CHILD = r"""
import datetime, json, os, sys, time
stamps = {"start": time.monotonic()}
import torch, torch.distributed as dist
stamps["imported"] = time.monotonic()
variant, store_path, stamps_path = sys.argv[1], sys.argv[2], sys.argv[3]
device = torch.device("cuda:0")
torch.cuda.set_device(device)
torch.zeros(1, device=device)
stamps["cuda"] = time.monotonic()
store = dist.FileStore(store_path, 1)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device,
                        timeout=datetime.timedelta(seconds=60))
stamps["nccl"] = time.monotonic()
buffer = torch.empty(1 << 30, dtype=torch.uint8, device=device)
x = torch.ones(1 << 20, device=device)
dist.all_reduce(x)
torch.cuda.synchronize()
assert bool((x == 1).all())
stamps["probe"] = time.monotonic()
if variant == "destroy":
    dist.destroy_process_group()
elif variant == "abort":
    dist.distributed_c10d._abort_process_group()
stamps["ended"] = time.monotonic()
with open(stamps_path, "w") as out:  # not stdout: NCCL's WARN lines go there
    out.write(json.dumps(stamps))
os._exit(0)
"""


def trial(variant: str, folder: Path) -> dict[str, float]:
    name = f"{variant}-{time.monotonic_ns()}"
    store, stamps = folder / f"store-{name}", folder / f"stamps-{name}.json"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, variant, str(store), str(stamps)])
    proc.wait(timeout=120)
    reaped = time.monotonic()
    if proc.returncode != 0 or not stamps.exists():
        return {"failed": float(proc.returncode)}
    s = json.loads(stamps.read_text())
    return {
        "cuda init": s["cuda"] - s["imported"],
        "nccl init": s["nccl"] - s["cuda"],
        "destroy": s["ended"] - s["probe"],
        "exit": reaped - s["ended"],
        "end": reaped - s["probe"],
    }


def main(argv: list[str]) -> int:
    repeats = int(argv[0]) if argv else 5
    trials: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for variant in VARIANTS:
                trials[variant].append(trial(variant, Path(tmp)))
    summary = {}
    for variant, rows in trials.items():
        good = [r for r in rows if "failed" not in r]
        medians = {k: round(statistics.median(r[k] for r in good), 3) for k in good[0]} if good else {}
        summary[variant] = {"trials": len(rows), "failed": len(rows) - len(good), **medians}
        print(variant.ljust(8), json.dumps(summary[variant]))
    if len(argv) > 1:
        Path(argv[1]).write_text(json.dumps({"summary": summary, "trials": trials}, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    sys.exit(main(sys.argv[1:]))
