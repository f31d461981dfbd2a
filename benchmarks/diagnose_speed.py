"""How fast ``conformance diagnose`` reads a big log, against one compiled-regex pass over the same file.

    python benchmarks/diagnose_speed.py [--sizes 20,200] [--kinds nccl,train] [--repeat 3] [--keep DIR] [--files 4]

For each size (MB) and kind it writes a synthetic log of one failed 64-GPU job (8 nodes of 8 ranks):

* ``nccl``: ``NCCL_DEBUG=INFO`` output of every rank (versions, bootstrap, ring and tree set-up, a
  ``via`` line per channel and peer, ``Init COMPLETE``) interleaved with torchrun's ``[rankN]:``
  training lines, repeated as the job re-creates communicators, ending in one rank's CUDA out of
  memory and the others' watchdog timeouts;
* ``train``: torchrun's per-rank training output (``[default3]:`` step lines) with the same ending.

Then, in one process, one after the other so both see the same machine load:

* the baseline: the file read a line at a time in binary, one compiled regex searched in each line
  (the failure words a grep for errors would use) -- the cheapest useful pass in Python;
* ``conformance diagnose`` on the file, in-process (imports already done), its answer checked;
* its peak memory over the baseline's (``VmHWM`` of a child process each).

It prints seconds, MB/s and the ratio diagnose / baseline for each.  Best of ``--repeat`` runs each.
With ``--files N`` it also splits each log into N files (a job's per-node logs) and times diagnose
reading them in one process and in parallel (one share per core, ``conformance.diagnose.sources``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASELINE = re.compile(rb"error|warn|fail|timeout|exception|killed", re.IGNORECASE)
NODES, PER_NODE = 8, 8

NCCL_SETUP = (
    "{host}:{pid}:{tid} [{dev}] NCCL INFO cudaDriverVersion 12040",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Bootstrap : Using eth0:10.0.0.{node}<0>",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.{node}<0>",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Using non-device net plugin version 0",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Using network IB",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks 64 cudaDev {dev} "
    "nvmlDev {dev} busId {bus}000 commId 0x5f3e1a2b9c - Init START",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Setting affinity for GPU {dev} to ffff,ffffffff",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO comm {comm} rank {rank} nRanks 64 nNodes 8 localRanks 8 localRank {dev} "
    "MNNVL 0",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Trees [0] {up}/-1/-1->{rank}->{down} [1] {up}/-1/-1->{rank}->{down}",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO P2P Chunksize set to 131072",
)
NCCL_CHANNEL = (
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Channel {ch:02d}/0 : {rank}[{dev}] -> {peer}[{pdev}] via P2P/CUMEM/read",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Channel {ch:02d}/0 : {rank}[{dev}] -> {far}[{dev}] [send] via "
    "NET/IB/{ib}/GDRDMA",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Channel {ch:02d}/0 : {far}[{dev}] -> {rank}[{dev}] [receive] via "
    "NET/IB/{ib}/GDRDMA",
)
NCCL_DONE = (
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Connected all rings",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO Connected all trees",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels",
    "{host}:{pid}:{tid} [{dev}] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks 64 cudaDev {dev} "
    "nvmlDev {dev} busId {bus}000 commId 0x5f3e1a2b9c - Init COMPLETE",
)
TRAIN = "[rank{rank}]:[default{dev}]:Epoch {epoch} step {step} loss 0.{loss:04d} lr 0.0001 grad_norm 1.{loss:03d}"
WATCHDOG = (
    "[rank{rank}]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank {rank}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=9001, OpType=ALLREDUCE, NumelIn=131072000, NumelOut=131072000, "
    "Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)
OOM_RANK = 13
ENDING = (
    "[rank{r}]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {d} has a total capacity"
)


def _rank_fields(rank: int, round_: int) -> dict[str, object]:
    node, dev = divmod(rank, PER_NODE)
    return {
        "host": f"gpu-node-{node}",
        "node": node + 1,
        "pid": 4000 + rank,
        "tid": 4000 + rank + round_,
        "dev": dev,
        "rank": rank,
        "comm": f"0x{0x55D000 + round_ * 64 + rank:x}",
        "bus": f"{0x18 + dev * 0x10:x}",
        "up": (rank - 1) % 64,
        "down": (rank + 1) % 64,
    }


def _nccl_round(round_: int) -> bytes:
    lines: list[str] = []
    for rank in range(NODES * PER_NODE):
        fields = _rank_fields(rank, round_)
        if round_ == 0:
            lines.append("{host}:{pid}:{pid} [{dev}] NCCL INFO NCCL version 2.21.5+cuda12.4".format(**fields))
        lines += [t.format(**fields) for t in NCCL_SETUP]
        for ch in range(16):
            far = (fields["rank"] + PER_NODE) % 64  # type: ignore[operator]
            peer = fields["down"]
            extra = {"ch": ch, "peer": peer, "pdev": int(peer) % PER_NODE, "far": far, "ib": ch % 2}  # type: ignore[call-overload]
            lines += [t.format(**fields, **extra) for t in NCCL_CHANNEL]
        lines += [t.format(**fields) for t in NCCL_DONE]
        lines += [
            TRAIN.format(rank=rank, dev=rank % PER_NODE, epoch=round_, step=s, loss=s * 37 % 9973) for s in range(4)
        ]
    return ("\n".join(lines) + "\n").encode()


def _train_round(round_: int) -> bytes:
    lines = [
        TRAIN.format(rank=rank, dev=rank % PER_NODE, epoch=round_ // 100, step=round_ * 10 + s, loss=(rank * s) % 9973)
        for s in range(10)
        for rank in range(NODES * PER_NODE)
    ]
    return ("\n".join(lines) + "\n").encode()


def write_log(path: Path, kind: str, megabytes: int) -> None:
    make = _nccl_round if kind == "nccl" else _train_round
    rounds = [make(r) for r in range(8)]
    target = megabytes * 1024 * 1024
    with path.open("wb") as out:
        written, r = 0, 0
        while written < target:
            block = rounds[r % len(rounds)]
            out.write(block)
            written += len(block)
            r += 1
        out.write((ENDING.format(r=OOM_RANK, d=OOM_RANK % PER_NODE) + "\n").encode())
        for rank in range(NODES * PER_NODE):
            if rank != OOM_RANK:
                out.write((WATCHDOG.format(rank=rank) + "\n").encode())


def baseline_pass(path: Path) -> int:
    found = 0
    with path.open("rb") as stream:
        for line in stream:
            if BASELINE.search(line):
                found += 1
    return found


def diagnose_answer(path: Path) -> dict[str, object]:
    from conformance.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["diagnose", "--json", str(path)])
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def split_log(path: Path, files: int) -> Path:
    """The log cut into ``files`` files of whole lines, in a folder of their own."""
    folder = path.with_suffix(f".{files}files")
    if folder.is_dir():
        return folder
    folder.mkdir()
    size = path.stat().st_size
    with path.open("rb") as source:
        for index in range(files):
            chunk = source.read(size // files if index < files - 1 else size)
            rest = source.readline() if index < files - 1 else b""
            (folder / f"node{index}.log").write_bytes(chunk + rest)
    return folder


def parallel(folder: Path, repeat: int) -> None:
    from conformance.diagnose import sources

    limit = sources.PARALLEL_BYTES
    try:
        sources.PARALLEL_BYTES = 1 << 62
        alone = best_of(repeat, lambda: diagnose_answer(folder))
        sources.PARALLEL_BYTES = 1
        shared = best_of(repeat, lambda: diagnose_answer(folder))
        workers = sources._workers(sorted(folder.iterdir()))
    finally:
        sources.PARALLEL_BYTES = limit
    files = len(list(folder.iterdir()))
    print(
        f"      {files} files: one process {alone:7.2f} s, {workers} processes {shared:7.2f} s "
        f"(speed-up {alone / shared:4.2f}x)",
        flush=True,
    )


def best_of(repeat: int, run: object) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


PEAK = (
    "import re, sys\nfrom pathlib import Path\nsys.path.insert(0, {bench!r})\nimport diagnose_speed as d\n"
    "getattr(d, sys.argv[1])(Path(sys.argv[2]))\n"
    "print(re.search(r'VmHWM:\\s*(\\d+) kB', Path('/proc/self/status').read_text())[1])"
)


def peak_mb(function: str, path: Path) -> float:
    code = PEAK.format(bench=str(Path(__file__).resolve().parent))
    done = subprocess.run([sys.executable, "-c", code, function, str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1]) / 1024


def measure(folder: Path, kind: str, megabytes: int, repeat: int, files: int = 1) -> None:
    path = folder / f"{kind}-{megabytes}mb.log"
    if not path.exists():
        write_log(path, kind, megabytes)
    size = path.stat().st_size / 1e6
    answer = diagnose_answer(path)
    right = answer["class"] == "oom" and answer["root_ranks"] == [OOM_RANK]
    base = best_of(repeat, lambda: baseline_pass(path))
    diag = best_of(repeat, lambda: diagnose_answer(path))
    base_mem, diag_mem = peak_mb("baseline_pass", path), peak_mb("diagnose_answer", path)
    print(
        f"{kind:5} {size:7.1f} MB  baseline {base:7.2f} s ({size / base:6.1f} MB/s)  diagnose {diag:7.2f} s "
        f"({size / diag:6.1f} MB/s)  ratio {diag / base:5.2f}x  peak {diag_mem:5.0f} MB (baseline {base_mem:3.0f} MB)"
        f"  answer {'right' if right else 'WRONG: ' + str(answer['class']) + ' ' + str(answer['root_ranks'])}",
        flush=True,
    )
    if files > 1:
        parallel(split_log(path, files), repeat)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="20,200", help="log sizes in MB, comma-separated")
    parser.add_argument("--kinds", default="nccl,train", help="nccl, train or both")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs each")
    parser.add_argument("--keep", type=Path, help="write the logs here and keep them (reused when present)")
    parser.add_argument("--files", type=int, default=1, help="also read each log cut into this many files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.keep or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for megabytes in (int(s) for s in args.sizes.split(",")):
            for kind in args.kinds.split(","):
                measure(folder, kind, megabytes, args.repeat if megabytes <= 50 else 1, args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
