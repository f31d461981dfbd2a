"""The node-pair part of multi-node runs: N pytest processes as nodes on loopback, one gloo rank each.

    python benchmarks/node_pairs.py [--nodes 2,4,8] [--bad-of 8] [--bad-node 5]

* every pair (``--node-pairs all``) for each node count: the wall of the node-pair part (first
  node-pair case started to last ended, from node 0's gathered records), pairs, rounds, the
  seconds per round and per case, how many pair cases ran at once on average (their seconds added
  up over the wall), and the growth exponent against rounds and against pairs.  On this 2-core
  machine every node shares the same two cores, so a case slows as a round holds more of them;
* the quick pass (``--node-pairs quick``) on ``--bad-of`` nodes with node ``--bad-node`` made bad by
  a scenario on that node alone (its rank raises in every node pair): the rounds it took, the wall,
  and the bad nodes node 0's summary names.

Every run is ``--matrix inherited -k node_pair --virtual-devices 1``.  Seconds move with the load of
this shared machine; rounds and the ratios within one invocation are what to compare.
"""

from __future__ import annotations

import argparse
import math
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from conformance.record.records import CaseRecord
from conformance.record.runs import load_run
from conformance.summarise.summary import bad_nodes, one_record_per_case

REPO = Path(__file__).resolve().parent.parent
NODE_SECONDS = 600.0  # one node's whole pytest, the machine busy
BAD_NODE_SCENARIO = """[scenario]
name = "bad node"

[[rule]]
effect = "error"
phase = "probe"
sets = ["node_pair"]
message = "bad node (benchmark)"
"""


@dataclass(frozen=True)
class PairPart:
    nnodes: int
    mode: str
    pairs: int
    rounds: int
    wall: float
    case_seconds: float  # the pair cases' seconds, added up
    named: tuple[int, ...]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_nodes(folder: Path, nnodes: int, mode: str, bad: int | None) -> list[CaseRecord]:
    """Start the nodes, wait for all, and return node 0's records (every node's, gathered)."""
    (folder / "suites").mkdir(parents=True)
    shutil.copy(REPO / "suites" / "test_multinode.py", folder / "suites")
    (folder / "bad.toml").write_text(BAD_NODE_SCENARIO)
    port, processes = free_port(), []
    for rank in range(nnodes):
        command = [
            sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", "-q",
            "suites/test_multinode.py", "-k", "node_pair", "--matrix=inherited", "--virtual-devices=1",
            f"--node-pairs={mode}", f"--reports-dir=reports-node{rank}", f"--nnodes={nnodes}", f"--node-rank={rank}",
            "--master-addr=127.0.0.1", f"--master-port={port}", *(["--scenario=bad.toml"] if rank == bad else []),
        ]  # fmt: skip
        log = (folder / f"node{rank}.log").open("wb")
        processes.append(subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT))
    for process in processes:
        process.wait(timeout=NODE_SECONDS)
    return list(load_run(folder / "reports-node0" / "latest").records)


def pair_part(records: list[CaseRecord], nnodes: int, mode: str) -> PairPart:
    cases = [r for r in one_record_per_case(records) if r.set_kind == "node_pair" and r.time and r.seconds]
    begun = min(float(r.time or 0) - float(r.seconds or 0) for r in cases)
    wall = max(float(r.time or 0) for r in cases) - begun
    # a round is a set of disjoint pairs: the first pass's rounds, then as many as the busiest node's re-checks
    first_rounds = 1 if mode == "quick" else (nnodes - 1 if nnodes % 2 == 0 else nnodes)
    rechecks = Counter(node for r in cases if "recheck" in r.nodeid for node in r.nodes or ())
    rounds = first_rounds + (max(rechecks.values()) if rechecks else 0)
    named = tuple(bad.node for bad in bad_nodes(records))
    busy = sum(float(r.seconds or 0) for r in cases)
    return PairPart(nnodes, mode, len(cases), rounds, wall, busy, named)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="2,4,8", help="node counts for every pair (default 2,4,8)")
    parser.add_argument("--bad-of", type=int, default=8, help="nodes of the quick pass with one bad (default 8)")
    parser.add_argument("--bad-node", type=int, default=5, help="the node made bad (default 5)")
    args = parser.parse_args()
    parts = []
    with tempfile.TemporaryDirectory(prefix="node-pairs-") as tmp:
        for nnodes in (int(n) for n in args.nodes.split(",")):
            parts.append(pair_part(run_nodes(Path(tmp) / f"all{nnodes}", nnodes, "all", None), nnodes, "all"))
        quick = run_nodes(Path(tmp) / "quick", args.bad_of, "quick", args.bad_node)
        parts.append(pair_part(quick, args.bad_of, "quick"))
    print(f"{'nodes':>5} {'mode':>5} {'pairs':>5} {'rounds':>6} {'wall s':>7} {'s/round':>7} {'s/case':>6} "
          f"{'at once':>7}  bad nodes named")  # fmt: skip
    for p in parts:
        named = ", ".join(f"node {n}" for n in p.named) or "none"
        print(
            f"{p.nnodes:>5} {p.mode:>5} {p.pairs:>5} {p.rounds:>6} {p.wall:>7.1f} {p.wall / p.rounds:>7.2f} "
            f"{p.case_seconds / p.pairs:>6.2f} {p.case_seconds / p.wall:>7.1f}  {named}"
        )
    print("(s/case: a pair case's mean seconds; at once: pair cases running at the same time, on average)")
    full = [p for p in parts if p.mode == "all"]
    if len(full) >= 2:
        a, b = full[0], full[-1]
        by_rounds = math.log(b.wall / a.wall) / math.log(b.rounds / a.rounds)
        by_pairs = math.log(b.wall / a.wall) / math.log(b.pairs / a.pairs)
        print(f"growth {a.nnodes}->{b.nnodes} nodes: wall ~ rounds^{by_rounds:.2f}, ~ pairs^{by_pairs:.2f}")
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")
    sys.exit(code)
