"""What a stranger's writes to node 0's store cost node 0: the attack of issue 40, measured.

    python benchmarks/store_flood.py [--values 1000] [--tests 100]

Node 0 and node 1 of a two-node run on loopback (``NodeGroup``, as each node's pytest holds it,
with a run token), both in this process, the run's tests known (``--tests`` on each node); then a
plain TCPStore client, not of the run, writes ``--values`` values of 1 MB to node 0's port, going
on (reconnecting) after each refusal until the store takes no new client.  Printed: how many values
the store took, the resident memory of this process (node 0's pytest) before and after, the store
server's growth against its bound, and what node 0 names.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import time

import psutil
import torch.distributed as dist
from node_pairs import free_port  # this folder's scripts: run as python benchmarks/...

from conformance.nodes.group import NodeGroup
from conformance.nodes.layout import NodeSetup
from conformance.nodes.liveness import GroupLimits
from conformance.nodes.store_server import mib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=1000)
    parser.add_argument("--tests", type=int, default=100)
    args = parser.parse_args()
    port, limits = free_port(), GroupLimits(progress=5, store=5)
    setups = [NodeSetup(2, n, "127.0.0.1", port, "settings", identity="bench", run_token="t") for n in (0, 1)]
    node0 = NodeGroup.connect(setups[0], 60, limits)
    node1 = NodeGroup.connect(setups[1], 60, limits)
    tests = [f"suites/test_x.py::test_{n}" for n in range(args.tests)]
    with concurrent.futures.ThreadPoolExecutor(1) as other:  # node 1 waits for node 0's comparison
        compared = other.submit(node1.same_collection, tests)
        node0.same_collection(tests)
        compared.result()
    server = node0.server
    assert server is not None
    me = psutil.Process(os.getpid())
    before = me.memory_info().rss
    taken, refused, value = 0, 0, b"x" * 2**20
    began = time.monotonic()
    stranger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    for n in range(args.values):
        try:
            stranger.set(f"junk/{n}", value)
            taken += 1
        except RuntimeError:
            refused += 1
            try:
                stranger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))
            except RuntimeError:  # at its bound the store has no room for a new client either
                print(f"after {taken} values taken and {refused} refused, the store takes no new client")
                break
    seconds = time.monotonic() - began
    after = me.memory_info().rss
    server.sample()
    tried = taken + refused
    print(f"stranger wrote {tried} values of 1 MB in {seconds:.1f}s: the store took {taken}, refused {refused}")
    print(f"node 0's pytest (this process) resident: {mib(before)} before, {mib(after)} after")
    print(f"store server grew by {mib(server.most_growth)}, {server.bound_text}")
    for problem in node0.store_problems:
        print(f"node 0 names: {problem}")
    node1.close()
    node0.close()


if __name__ == "__main__":
    main()
