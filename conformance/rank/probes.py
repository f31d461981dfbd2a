"""Probes: what a rank does between set-up and teardown, referred to by name.

Every probe moves rank-dependent, integer-valued data (exact in float32), checks what it received
against a reference computed independently on the CPU, and measures speed only after that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from conformance.rank.context import RankContext

if TYPE_CHECKING:
    import torch

Probe = Callable[[RankContext], None]
PROBES: dict[str, Probe] = {}


def probe(name: str) -> Callable[[Probe], Probe]:
    def register(fn: Probe) -> Probe:
        PROBES[name] = fn
        return fn

    return register


def pattern(rank: int, numel: int) -> torch.Tensor:
    """Rank-dependent integer values below 2**24, so float32 sums stay exact."""
    import torch

    return (torch.arange(numel, dtype=torch.float32) % 251 + 1) * (rank + 1)


def reduced(world_size: int, numel: int) -> torch.Tensor:
    """The element-wise sum of every rank's pattern, computed on the CPU."""
    total = pattern(0, numel)
    for rank in range(1, world_size):
        total = total + pattern(rank, numel)
    return total


def size_label(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def _numel(nbytes: int) -> int:
    return max(1, nbytes // 4)


def sized_steps(ctx: RankContext, name: str) -> Iterator[tuple[int, str]]:
    """For each message size of the case: report the step, then yield (elements, label)."""
    for nbytes in (int(s) for s in ctx.params.get("sizes", [4])):
        label = f"{name} {size_label(nbytes)}"
        ctx.phase("probe", label)
        yield _numel(nbytes), label


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factors: what each rank's link carries relative to algbw."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def measure_busbw(ctx: RankContext, collective: str, nbytes: int, run_once: Callable[[], object]) -> None:
    """Time the collective after its data was verified; record algbw and busbw in GB/s."""
    import torch.distributed as dist

    iterations = int(ctx.params.get("bandwidth_iterations", 5))
    ctx.phase("probe", f"{collective} bandwidth {size_label(nbytes)} x{iterations}")
    dist.barrier(group=ctx.group)
    start = time.perf_counter()
    for _ in range(iterations):
        run_once()
    _synchronize(ctx)
    elapsed = max(time.perf_counter() - start, 1e-9)
    algbw = nbytes * iterations / elapsed / 1e9
    ctx.metrics.setdefault("algbw_gbps", {})[size_label(nbytes)] = round(algbw, 4)
    ctx.metrics.setdefault("busbw_gbps", {})[size_label(nbytes)] = round(
        algbw * bus_factor(collective, ctx.world_size), 4
    )


def _largest(ctx: RankContext) -> int:
    return max(int(s) for s in ctx.params.get("sizes", [4]))


@probe("all_reduce")
def all_reduce(ctx: RankContext) -> None:
    import torch.distributed as dist

    for n, label in sized_steps(ctx, "all_reduce"):
        data = pattern(ctx.rank, n).to(ctx.torch_device)
        dist.all_reduce(data, group=ctx.group)
        ctx.verify(label, data, reduced(ctx.world_size, n))
    if ctx.params.get("measure"):
        data = pattern(ctx.rank, _numel(_largest(ctx))).to(ctx.torch_device)
        measure_busbw(ctx, "all_reduce", data.numel() * 4, lambda: dist.all_reduce(data, group=ctx.group))


@probe("barrier")
def barrier(ctx: RankContext) -> None:
    """Barrier as the first collective on the group (with device_ids), then an all-reduce."""
    _barrier_first(ctx, with_ids=True)


@probe("barrier_no_device_ids")
def barrier_no_device_ids(ctx: RankContext) -> None:
    """The same without device_ids, the group also made without ``device_id``.

    NCCL then guesses each rank's GPU (the "using GPU N to perform barrier as devices used by this
    process are currently unknown" hang on non-contiguous device subsets).
    """
    _barrier_first(ctx, with_ids=False)


def _barrier_first(ctx: RankContext, with_ids: bool) -> None:
    import torch.distributed as dist

    ctx.phase("probe", "barrier with device_ids" if with_ids else "barrier without device_ids")
    if with_ids and ctx.backend == "nccl":
        dist.barrier(group=ctx.group, device_ids=[ctx.torch_device.index])
    else:
        dist.barrier(group=ctx.group)
    ctx.phase("probe", "all_reduce after barrier")
    data = pattern(ctx.rank, 1).to(ctx.torch_device)
    dist.all_reduce(data, group=ctx.group)
    ctx.verify("all_reduce after barrier", data, reduced(ctx.world_size, 1))


@probe("broadcast")
def broadcast(ctx: RankContext) -> None:
    import torch.distributed as dist

    for root in sorted({0, ctx.world_size - 1}):
        for n, label in sized_steps(ctx, f"broadcast from rank {root}"):
            data = pattern(ctx.rank, n).to(ctx.torch_device)
            dist.broadcast(data, src=root, group=ctx.group)
            ctx.verify(label, data, pattern(root, n))


@probe("all_gather")
def all_gather(ctx: RankContext) -> None:
    import torch
    import torch.distributed as dist

    for n, label in sized_steps(ctx, "all_gather"):
        out = torch.zeros(ctx.world_size * n, device=ctx.torch_device)
        dist.all_gather_into_tensor(out, pattern(ctx.rank, n).to(ctx.torch_device), group=ctx.group)
        ctx.verify(label, out, torch.cat([pattern(r, n) for r in range(ctx.world_size)]))
    if ctx.params.get("measure"):
        n = _numel(_largest(ctx))
        mine, out = pattern(ctx.rank, n).to(ctx.torch_device), torch.zeros(ctx.world_size * n, device=ctx.torch_device)
        measure_busbw(
            ctx, "all_gather", out.numel() * 4, lambda: dist.all_gather_into_tensor(out, mine, group=ctx.group)
        )


@probe("reduce_scatter")
def reduce_scatter(ctx: RankContext) -> None:
    import torch
    import torch.distributed as dist

    for n, label in sized_steps(ctx, "reduce_scatter"):
        out = torch.zeros(n, device=ctx.torch_device)
        full = pattern(ctx.rank, n * ctx.world_size).to(ctx.torch_device)
        dist.reduce_scatter_tensor(out, full, group=ctx.group)
        total = reduced(ctx.world_size, n * ctx.world_size)
        ctx.verify(label, out, total[ctx.rank * n : (ctx.rank + 1) * n])
    if ctx.params.get("measure"):
        n = _numel(_largest(ctx))
        full, out = pattern(ctx.rank, n * ctx.world_size).to(ctx.torch_device), torch.zeros(n, device=ctx.torch_device)
        measure_busbw(
            ctx, "reduce_scatter", full.numel() * 4, lambda: dist.reduce_scatter_tensor(out, full, group=ctx.group)
        )


def _exchange(ctx: RankContext, n: int) -> torch.Tensor:
    """Rank 0 sends first, rank 1 receives first: both directions, no deadlock."""
    import torch.distributed as dist

    peer = 1 - ctx.rank
    received = pattern(0, n).to(ctx.torch_device) * 0
    mine = pattern(ctx.rank, n).to(ctx.torch_device)
    if ctx.rank == 0:
        dist.send(mine, dst=peer, group=ctx.group)
        dist.recv(received, src=peer, group=ctx.group)
    else:
        dist.recv(received, src=peer, group=ctx.group)
        dist.send(mine, dst=peer, group=ctx.group)
    return received


@probe("pair_exchange")
def pair_exchange(ctx: RankContext) -> None:
    """Send/recv both ways and all-reduce between two ranks, then bandwidth."""
    import torch.distributed as dist

    if ctx.world_size != 2:
        ctx.skip(f"pair_exchange needs exactly 2 ranks, got {ctx.world_size}")
    for n, label in sized_steps(ctx, "send/recv"):
        received = _exchange(ctx, n)
        ctx.verify(label, received, pattern(1 - ctx.rank, n))
    for n, label in sized_steps(ctx, "all_reduce"):
        data = pattern(ctx.rank, n).to(ctx.torch_device)
        dist.all_reduce(data, group=ctx.group)
        ctx.verify(label, data, pattern(0, n) + pattern(1, n))
    _measure_pair_bandwidth(ctx)


def _measure_pair_bandwidth(ctx: RankContext) -> None:
    """GB/s of one direction of a send/recv round trip, after the data was verified."""
    import torch.distributed as dist

    nbytes = int(ctx.params.get("bandwidth_bytes", 4 << 20))
    iterations = int(ctx.params.get("bandwidth_iterations", 5))
    ctx.phase("probe", f"bandwidth {size_label(nbytes)} x{iterations}")
    n = _numel(nbytes)
    _exchange(ctx, n)  # warm-up
    dist.barrier(group=ctx.group)
    start = time.perf_counter()
    for _ in range(iterations):
        _exchange(ctx, n)
    _synchronize(ctx)
    elapsed = time.perf_counter() - start
    # each iteration moves nbytes in each direction
    ctx.metrics["bandwidth_gbps"] = round(2 * nbytes * iterations / elapsed / 1e9, 4)


def _synchronize(ctx: RankContext) -> None:
    if ctx.torch_device.type == "cuda":
        import torch

        torch.cuda.synchronize(ctx.torch_device)


@probe("fail_one_rank")
def fail_one_rank(ctx: RankContext) -> None:
    """One rank raises while the others wait in an all-reduce: the harness must name it."""
    import torch.distributed as dist

    failing = int(ctx.params.get("failing_rank", ctx.world_size - 1))
    delay = float(ctx.params.get("delay", 0.2))
    ctx.phase("probe", "all_reduce while one rank fails")
    if ctx.rank == failing:
        time.sleep(delay)  # let the others enter the collective first
        raise RuntimeError(f"deliberate failure on rank {failing} while the others are in all_reduce")
    data = pattern(ctx.rank, 1).to(ctx.torch_device)
    dist.all_reduce(data, group=ctx.group)
    ctx.verify("all_reduce", data, reduced(ctx.world_size, 1))


@probe("peer_copy")
def peer_copy(ctx: RankContext) -> None:
    """In one process: write a pattern on one device, copy it to the peer and back, check it all.

    On GPUs this is ``tensor.to(peer)`` (cudaMemcpyPeer, the path framework copies take); on a
    CPU run the devices are virtual and the copy is a host copy, so the harness still runs it.
    """
    import torch

    peer = ctx.spec["peers"][0]
    here, there = ctx.torch_device, ctx.device_of(peer)
    if here.type == "cuda":
        ctx.metrics["peer_access"] = torch.cuda.can_device_access_peer(here.index, there.index)
    for src, dst, names in (
        (here, there, (ctx.device["name"], peer["name"])),
        (there, here, (peer["name"], ctx.device["name"])),
    ):
        for n, label in sized_steps(ctx, f"copy {names[0]}->{names[1]}"):
            data = pattern(ctx.rank, n).to(src)
            copied = data.to(dst)
            _synchronize(ctx)
            ctx.verify(label, copied, pattern(ctx.rank, n))
    n = _numel(_largest(ctx))
    data = pattern(ctx.rank, n).to(here)
    ctx.phase("probe", f"copy bandwidth {size_label(n * 4)}")
    start = time.perf_counter()
    for _ in range(int(ctx.params.get("bandwidth_iterations", 5))):
        data.to(there)
    _synchronize(ctx)
    elapsed = max(time.perf_counter() - start, 1e-9)
    ctx.metrics["bandwidth_gbps"] = round(n * 4 * int(ctx.params.get("bandwidth_iterations", 5)) / elapsed / 1e9, 4)


@probe("oom_while_waiting")
def oom_while_waiting(ctx: RankContext) -> None:
    """One rank runs into a real CUDA out-of-memory while the others wait in an all-reduce."""
    import torch
    import torch.distributed as dist

    if ctx.torch_device.type != "cuda":
        ctx.skip("a real CUDA out-of-memory needs a GPU; the CPU run covers this with a simulated one")
    failing = int(ctx.params.get("failing_rank", ctx.world_size - 1))
    ctx.phase("probe", "all_reduce while one rank runs out of memory")
    if ctx.rank == failing:
        time.sleep(float(ctx.params.get("delay", 0.5)))
        free, total = torch.cuda.mem_get_info(ctx.torch_device)
        torch.empty(int(total * 2), dtype=torch.uint8, device=ctx.torch_device)  # more than the GPU has
    data = pattern(ctx.rank, 1).to(ctx.torch_device)
    dist.all_reduce(data, group=ctx.group)
    ctx.verify("all_reduce", data, reduced(ctx.world_size, 1))


@probe("environment")
def environment(ctx: RankContext) -> None:
    """What the rank's torch says about itself: versions and backend availability."""
    import torch
    import torch.distributed as dist

    ctx.phase("probe", "versions")
    ctx.metrics["torch"] = torch.__version__
    ctx.metrics["distributed_available"] = dist.is_available()
    ctx.metrics["gloo_available"] = dist.is_gloo_available()
    ctx.metrics["nccl_available"] = dist.is_nccl_available()
    if ctx.backend == "nccl":
        ctx.metrics["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    ctx.phase("probe", "all_reduce 4B")
    data = pattern(ctx.rank, 1).to(ctx.torch_device)
    dist.all_reduce(data, group=ctx.group)
    ctx.verify("all_reduce 4B", data, reduced(ctx.world_size, 1))
