"""Probes: what a rank does between set-up and teardown, referred to by name.

Data.  Every element is a small integer, exact in float32: rank r's pattern is
``(i % 251 + 1) * (r + 1)``.  References are closed forms, built on the rank's own device and only
for what the rank receives: a sum over the ranks is the base pattern times ``W(W+1)/2``, a
reduce-scatter share is that sum's slice, a broadcast is the root's pattern.  The check compares
every element exactly.

Steps.  Each step reports its phase, moves the data, synchronizes the device inside that same
phase (NCCL calls return to the host at once, so a hung kernel is placed at the step that hung),
then verifies.

Bandwidth, measured after the data was verified, on buffers made before the clock starts (left
unwritten where nothing is computed on them, so that a rank does not zero megabytes only to time
moving them; zeros for reductions, where stray bits could be slow denormals), with warm-up
iterations first (``timing.py``), as nccl-tests defines it:
``algbw = bytes / time``; all-reduce ``busbw = algbw * 2(n-1)/n``; all-gather and reduce-scatter
``busbw = algbw * (n-1)/n`` with bytes the whole gathered or scattered buffer; send/recv (both
ranks send and receive at once, as nccl-tests' sendrecv) ``algbw`` per direction, bytes one
message; a peer copy ``bytes / time`` per copy, each direction.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

from conformance.common.casefiles import SEQUENCE, SHARED_DONE
from conformance.rank import timing
from conformance.rank.barrier_device import barrier_device
from conformance.rank.check_data import exchanged, gathered, pattern, reduced
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


# -- data and references ------------------------------------------------------------------------


def size_label(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def _numel(nbytes: int) -> int:
    return max(1, nbytes // 4)


def sized_steps(ctx: RankContext, name: str) -> Iterator[tuple[int, str]]:
    """For each message size of the case: report the step, then yield (elements, label).

    The step says its size once nothing is left to set up in it: a group made at init (gloo; NCCL with
    ``device_id``, eager) or no group at all (peer copies).  A lazy NCCL communicator is made by the
    first collective, which then takes as long as an init.
    """
    set_up = ctx.backend != "nccl" or ctx.case.single_process or ctx.bound_device is not None
    for nbytes in (int(s) for s in ctx.params.get("sizes", [4])):
        label = f"{name} {size_label(nbytes)}"
        ctx.phase("probe", label, nbytes=nbytes if set_up else None)
        yield _numel(nbytes), label


def in_parts(ctx: RankContext, n: int) -> Iterator[slice]:
    """A message of ``n`` elements as slices of at most ``chunk_bytes`` each, reporting each part done.

    The watchdog decides hangs from progress: a large gloo collective on a loaded CPU can take longer
    than the step deadline as one call, so it is moved in parts and each finished part is reported.
    Without ``chunk_bytes`` (NCCL: a 64 MiB collective takes milliseconds, and NCCL picks its protocol
    by message size) the message is one part.
    """
    chunk_bytes = ctx.params.get("chunk_bytes")
    chunk = _numel(int(chunk_bytes)) if chunk_bytes else n
    count = -(-n // chunk)
    for i in range(count):
        yield slice(i * chunk, min(n, (i + 1) * chunk))
        if count > 1:
            ctx.advance(f"{i + 1}/{count}")


def _largest(ctx: RankContext) -> int:
    return max(int(s) for s in ctx.params.get("sizes", [4]))


# -- bandwidth ---------------------------------------------------------------------------------


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factors: what each rank's link carries relative to algbw."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):  # nccl-tests' src/alltoall.cu: (n-1)/n
        return (n - 1) / n
    return 1.0


LINK_READ_ITERATIONS = 2  # transfers launched, untimed, while the rank reads its GPUs' PCIe generation


def timed(ctx: RankContext, label: str, operation: Callable[[], object], *devices: torch.device) -> float:
    """Seconds per iteration of ``operation``, as its own probe step, once no other case runs."""
    ctx.wait_for_turn()
    iterations = int(ctx.params.get("bandwidth_iterations", 5))
    warmup = int(ctx.params.get("bandwidth_warmup", 1))
    ctx.phase("probe", f"{label} x{iterations}")
    moving = devices or (ctx.torch_device,)
    seconds = timing.seconds_per_iteration(operation, moving, iterations, warmup)
    if ctx.backend == "nccl":  # untimed, so reading NVML costs the figure nothing: launched, so the data moves
        for _ in range(LINK_READ_ITERATIONS):
            operation()
        ctx.read_link_generations(moving)
    ctx.synchronize(*devices)
    return seconds


def measure_busbw(
    ctx: RankContext, collective: str, nbytes: int, run_once: Callable[[], object], size: int | None = None
) -> None:
    """Time the collective after its data was verified; record algbw and busbw in GB/s.

    ``size``: the size it is shown as, where the buffer had to be a multiple of the ranks (``nbytes``).
    """
    label = size_label(size or nbytes)
    seconds = timed(ctx, f"{collective} bandwidth {label}", run_once)
    algbw = timing.gbps(nbytes, seconds)
    ctx.metrics.setdefault("algbw_gbps", {})[label] = algbw
    ctx.metrics.setdefault("busbw_gbps", {})[label] = round(algbw * bus_factor(collective, ctx.world_size), 4)


# -- collectives over the whole group --------------------------------------------------------


@probe("all_reduce")
def all_reduce(ctx: RankContext) -> None:
    import torch
    import torch.distributed as dist

    device = ctx.torch_device
    for n, label in sized_steps(ctx, "all_reduce"):
        data = pattern(ctx.rank, n, device)
        for part in in_parts(ctx, n):
            dist.all_reduce(data[part], group=ctx.group)
        ctx.synchronize()
        ctx.verify(label, data, partial(reduced, ctx.world_size, n, device))
    if ctx.params.get("measure"):
        buffer = torch.zeros(_numel(_largest(ctx)), device=device)
        measure_busbw(ctx, "all_reduce", buffer.numel() * 4, lambda: dist.all_reduce(buffer, group=ctx.group))


@probe("broadcast")
def broadcast(ctx: RankContext) -> None:
    import torch.distributed as dist

    device = ctx.torch_device
    for root in sorted({0, ctx.world_size - 1}):
        for n, label in sized_steps(ctx, f"broadcast from rank {root}"):
            data = pattern(ctx.rank, n, device)
            for part in in_parts(ctx, n):
                dist.broadcast(data[part], src=root, group=ctx.group)
            ctx.synchronize()
            ctx.verify(label, data, partial(pattern, root, n, device))


@probe("all_gather")
def all_gather(ctx: RankContext) -> None:
    import torch
    import torch.distributed as dist

    device, world = ctx.torch_device, ctx.world_size
    for n, label in sized_steps(ctx, "all_gather"):
        out, mine = torch.zeros(world * n, device=device), pattern(ctx.rank, n, device)
        for part in in_parts(ctx, n):
            whole = part.stop - part.start == n
            target = out if whole else torch.empty(world * (part.stop - part.start), device=device)
            dist.all_gather_into_tensor(target, mine[part], group=ctx.group)
            if not whole:  # each rank's slice of this part, put back in its place
                out.view(world, n)[:, part].copy_(target.view(world, -1))
        ctx.synchronize()
        ctx.verify(label, out, partial(gathered, world, n, device))
    if ctx.params.get("measure"):
        n = _numel(_largest(ctx))
        mine, out = torch.empty(n, device=device), torch.empty(world * n, device=device)
        measure_busbw(
            ctx, "all_gather", out.numel() * 4, lambda: dist.all_gather_into_tensor(out, mine, group=ctx.group)
        )


@probe("reduce_scatter")
def reduce_scatter(ctx: RankContext) -> None:
    import torch
    import torch.distributed as dist

    device, world = ctx.torch_device, ctx.world_size
    for n, label in sized_steps(ctx, "reduce_scatter"):
        out, full = torch.zeros(n, device=device), pattern(ctx.rank, n * world, device)
        for part in in_parts(ctx, n):
            dist.reduce_scatter_tensor(out[part], full.view(world, n)[:, part].reshape(-1), group=ctx.group)
        ctx.synchronize()
        ctx.verify(label, out, partial(reduced, world, n, device, start=ctx.rank * n))
    if ctx.params.get("measure"):
        n = _numel(_largest(ctx))
        full, out = torch.zeros(n * world, device=device), torch.zeros(n, device=device)
        measure_busbw(
            ctx, "reduce_scatter", full.numel() * 4, lambda: dist.reduce_scatter_tensor(out, full, group=ctx.group)
        )


@probe("all_to_all")
def all_to_all(ctx: RankContext) -> None:
    """Every rank sends a distinct chunk to every rank (MoE's exchange), each delivered chunk checked.

    A size is each rank's whole send buffer, as nccl-tests' alltoall counts it (``count * nranks``).
    """
    import torch
    import torch.distributed as dist

    device, world = ctx.torch_device, ctx.world_size
    for n, label in sized_steps(ctx, "all_to_all"):
        chunk = max(1, n // world)
        send, out = pattern(ctx.rank, chunk * world, device), torch.zeros(chunk * world, device=device)
        for part in in_parts(ctx, chunk):
            width = part.stop - part.start
            received = torch.empty(world * width, device=device)
            dist.all_to_all_single(received, send.view(world, chunk)[:, part].reshape(-1), group=ctx.group)
            out.view(world, chunk)[:, part].copy_(received.view(world, width))
        ctx.synchronize()
        ctx.verify(label, out, partial(exchanged, world, chunk, ctx.rank, device))
    if ctx.params.get("measure"):
        n = max(world, _numel(_largest(ctx)) // world * world)
        send, out = torch.empty(n, device=device), torch.empty(n, device=device)
        run_once = partial(dist.all_to_all_single, out, send, group=ctx.group)
        measure_busbw(ctx, "all_to_all", n * 4, run_once, size=_largest(ctx))


@probe("collectives")
def collectives(ctx: RankContext) -> None:
    """The collectives of several tests over one process group, in turn (``conformance.harness.shared_group``).

    Each keeps its own name, parameters and metrics.  When one is done on this rank, its metrics and
    seconds go into a phase line at once, so the parent knows how far every rank got even when a
    later collective hangs and the rank is killed.
    """
    common = {k: v for k, v in ctx.params.items() if k != SEQUENCE}
    group_metrics, done = dict(ctx.metrics), {}
    for part in ctx.params[SEQUENCE]:
        started = time.monotonic()
        ctx.take_up(part["probe"], {**common, **part["params"]})
        PROBES[part["probe"]](ctx)
        done[part["probe"]] = {"metrics": ctx.metrics, "seconds": round(time.monotonic() - started, 3)}
        ctx.note({SHARED_DONE: dict(done)})
    ctx.metrics = {**group_metrics, SHARED_DONE: done}


# -- the first barrier -------------------------------------------------------------------------


@probe("barrier")
def barrier(ctx: RankContext) -> None:
    """Barrier as the first collective on the group (with device_ids), then an all-reduce."""
    _barrier_first(ctx, with_ids=True)


@probe("barrier_no_device_ids")
def barrier_no_device_ids(ctx: RankContext) -> None:
    """The same without device_ids, the group also made without ``device_id``.

    torch then picks the barrier's GPU by its own rule (``barrier_device.py``); where the ranks see
    more GPUs than they use, that guess can be another rank's GPU (seed b).
    """
    _barrier_first(ctx, with_ids=False)


def _barrier_first(ctx: RankContext, with_ids: bool) -> None:
    import torch.distributed as dist

    own = ctx.device.index
    chosen = barrier_device(ctx.rank, ctx.visible_count, device_ids=[own] if with_ids else None, bound=ctx.bound_device)
    facts = {"barrier": {"rank_device": own, "barrier_device": chosen.index, "chosen_by": chosen.chosen_by}}
    ctx.barrier_device_is(wrong=chosen.index != own)
    ctx.phase("probe", "barrier with device_ids" if with_ids else "barrier without device_ids", facts)
    if with_ids and ctx.backend == "nccl":
        dist.barrier(group=ctx.group, device_ids=[own])
    else:
        dist.barrier(group=ctx.group)
    ctx.synchronize()
    ctx.barrier_device_is(wrong=None)
    _all_reduce_one(ctx, "all_reduce after barrier")


def _all_reduce_one(ctx: RankContext, label: str) -> None:
    import torch.distributed as dist

    ctx.phase("probe", label)
    data = pattern(ctx.rank, 1, ctx.torch_device)
    dist.all_reduce(data, group=ctx.group)
    ctx.synchronize()
    ctx.verify(label, data, partial(reduced, ctx.world_size, 1, ctx.torch_device))


# -- pairs -------------------------------------------------------------------------------------


def _exchange(ctx: RankContext, send: torch.Tensor, receive: torch.Tensor) -> None:
    """Both ranks send and receive at once (one batch, as nccl-tests' sendrecv does)."""
    import torch.distributed as dist

    peer = 1 - ctx.rank
    ops = [dist.P2POp(dist.isend, send, peer, ctx.group), dist.P2POp(dist.irecv, receive, peer, ctx.group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


@probe("pair_exchange")
def pair_exchange(ctx: RankContext) -> None:
    """Send/recv both ways and all-reduce between two ranks, then bandwidth."""
    import torch
    import torch.distributed as dist

    if ctx.world_size != 2:
        ctx.skip(f"pair_exchange needs exactly 2 ranks, got {ctx.world_size}")
    device, peer = ctx.torch_device, 1 - ctx.rank
    for n, label in sized_steps(ctx, "send/recv"):
        received, mine = torch.zeros(n, device=device), pattern(ctx.rank, n, device)
        for part in in_parts(ctx, n):
            _exchange(ctx, mine[part], received[part])
        ctx.synchronize()
        ctx.verify(label, received, partial(pattern, peer, n, device))
    for n, label in sized_steps(ctx, "all_reduce"):
        data = pattern(ctx.rank, n, device)
        for part in in_parts(ctx, n):
            dist.all_reduce(data[part], group=ctx.group)
        ctx.synchronize()
        ctx.verify(label, data, partial(reduced, 2, n, device))
    nbytes = int(ctx.params.get("bandwidth_bytes", 4 << 20))
    send, receive = torch.empty(_numel(nbytes), device=device), torch.empty(_numel(nbytes), device=device)
    seconds = timed(ctx, f"send/recv bandwidth {size_label(nbytes)}", lambda: _exchange(ctx, send, receive))
    ctx.metrics["bandwidth_gbps"] = timing.gbps(nbytes, seconds)  # per direction


@probe("peer_copy")
def peer_copy(ctx: RankContext) -> None:
    """In one process: copy a pattern to the peer device and back, check every element, then GB/s.

    On GPUs this is a device-to-device copy (``tensor.to(peer)``, the path framework copies take);
    on a CPU run the devices are virtual and the copy is a host copy, so the harness still runs it.
    """
    import torch

    peer = ctx.case.peers[0]
    here, there = ctx.torch_device, ctx.device_of(peer)
    if here.type == "cuda":
        ctx.metrics["peer_access"] = torch.cuda.can_device_access_peer(here, there)
    directions = ((here, there, f"{ctx.device.name}->{peer.name}"), (there, here, f"{peer.name}->{ctx.device.name}"))
    for src, dst, names in directions:
        for n, label in sized_steps(ctx, f"copy {names}"):
            copied = pattern(ctx.rank, n, src).to(dst, copy=True)
            ctx.synchronize(src, dst)
            ctx.verify(label, copied, partial(pattern, ctx.rank, n, dst))
    nbytes = int(ctx.params.get("bandwidth_bytes", _largest(ctx)))
    rates = {}
    for src, dst, names in directions:
        data, out = torch.empty(_numel(nbytes), device=src), torch.empty(_numel(nbytes), device=dst)
        seconds = timed(ctx, f"copy bandwidth {names} {size_label(nbytes)}", partial(out.copy_, data), src, dst)
        rates[names] = timing.gbps(nbytes, seconds)
    ctx.metrics["copy_gbps"] = rates
    ctx.metrics["bandwidth_gbps"] = min(rates.values())


# -- the harness's own checks ------------------------------------------------------------------


@probe("fail_one_rank")
def fail_one_rank(ctx: RankContext) -> None:
    """One rank raises while the others wait in an all-reduce: the harness must name it."""
    failing = int(ctx.params.get("failing_rank", ctx.world_size - 1))
    delay = float(ctx.params.get("delay", 0.2))
    if ctx.rank == failing:
        ctx.phase("probe", "all_reduce while one rank fails")
        time.sleep(delay)  # let the others enter the collective first
        raise RuntimeError(f"deliberate failure on rank {failing} while the others are in all_reduce")
    _all_reduce_one(ctx, "all_reduce while one rank fails")


@probe("oom_while_waiting")
def oom_while_waiting(ctx: RankContext) -> None:
    """One rank runs into a real CUDA out-of-memory while the others wait in an all-reduce."""
    import torch

    if ctx.torch_device.type != "cuda":
        ctx.skip("a real CUDA out-of-memory needs a GPU; the CPU run covers this with a simulated one")
    failing = int(ctx.params.get("failing_rank", ctx.world_size - 1))
    if ctx.rank == failing:
        ctx.phase("probe", "allocate more than the GPU has")
        time.sleep(float(ctx.params.get("delay", 0.5)))
        _, total = torch.cuda.mem_get_info(ctx.torch_device)
        torch.empty(int(total * 2), dtype=torch.uint8, device=ctx.torch_device)
    _all_reduce_one(ctx, "all_reduce while one rank runs out of memory")


@probe("spin_kernel")
def spin_kernel(ctx: RankContext) -> None:
    """A kernel that spins far past any deadline: the watchdog must take the stack and reap the rank."""
    import torch

    if ctx.torch_device.type != "cuda":
        ctx.skip("a spinning CUDA kernel needs a GPU")
    ctx.phase("probe", "kernel spinning")
    torch.cuda._sleep(int(ctx.params.get("cycles", 10**14)))  # type: ignore[no-untyped-call]
    ctx.synchronize()


@probe("stuck_all_reduce")
def stuck_all_reduce(ctx: RankContext) -> None:
    """An all-reduce queued behind a kernel that never ends: the flight recorder must show it not retired."""
    import torch
    import torch.distributed as dist

    if ctx.torch_device.type != "cuda":
        ctx.skip("a kernel that never ends needs a GPU")
    data = pattern(ctx.rank, 1, ctx.torch_device)
    group = ctx.group
    if "group_timeout" in ctx.params:  # torch's own watchdog acts first, after this many seconds
        timeout = timedelta(seconds=float(ctx.params["group_timeout"]))
        group = dist.new_group(list(range(ctx.world_size)), timeout=timeout)
    torch.cuda._sleep(int(ctx.params.get("cycles", 10**14)))  # type: ignore[no-untyped-call]
    ctx.phase("probe", "all_reduce behind a sleeping kernel")
    dist.all_reduce(data, group=group)  # queued on the stream behind the sleep: it never starts
    ctx.synchronize()


def holding_step(what: str) -> str:
    """The step a ``hold`` rank reports once it holds what it was asked to."""
    return f"holding: {what}"


@probe("hold")
def hold(ctx: RankContext) -> None:
    """Stay until stopped: idle, spinning in a kernel, or holding memory (the smoke run times their reaping).

    ``memory``: most of the GPU's free memory and ``pinned_bytes`` of pinned host memory; on a CPU
    rank, ``host_bytes`` of ordinary memory, written so that it is really held.
    """
    import torch

    what = str(ctx.params.get("what", "idle"))
    if ctx.params.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL reaps it
    held = []
    if what == "memory" and ctx.torch_device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(ctx.torch_device)
        share = float(ctx.params.get("gpu_share", 0.9))
        held.append(torch.empty(int(free * share), dtype=torch.uint8, device=ctx.torch_device))
        held.append(torch.empty(int(ctx.params.get("pinned_bytes", 16 << 30)), dtype=torch.uint8, pin_memory=True))
    elif what == "memory":
        held.append(torch.ones(int(ctx.params.get("host_bytes", 64 << 20)), dtype=torch.uint8))
    elif what == "spinning":
        if ctx.torch_device.type != "cuda":
            ctx.skip("a spinning CUDA kernel needs a GPU")
        ctx.phase("probe", holding_step(what))
        torch.cuda._sleep(10**14)  # type: ignore[no-untyped-call]
        ctx.synchronize()
    elif what != "idle":
        raise ValueError(f"hold: what={what!r}: expected idle, spinning or memory")
    ctx.phase("probe", holding_step(what))
    while True:
        time.sleep(3600)


@probe("copy_timing")
def copy_timing(ctx: RankContext) -> None:
    """A device-to-device copy timed by the probes' own code and by CUDA events alone."""
    import torch

    if ctx.torch_device.type != "cuda":
        ctx.skip("CUDA events need a GPU")
    device, nbytes = ctx.torch_device, int(ctx.params.get("bandwidth_bytes", 256 << 20))
    iterations = int(ctx.params.get("bandwidth_iterations", 20))
    data, out = torch.zeros(_numel(nbytes), device=device), torch.empty(_numel(nbytes), device=device)
    seconds = timed(ctx, f"copy {size_label(nbytes)}", lambda: out.copy_(data))
    ctx.phase("probe", f"copy {size_label(nbytes)} timed with CUDA events x{iterations}")
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(iterations):
        out.copy_(data)
    end.record()
    end.synchronize()
    ctx.metrics["probe_timing_gbps"] = timing.gbps(nbytes, seconds)
    ctx.metrics["cuda_events_gbps"] = timing.gbps(nbytes, start.elapsed_time(end) / 1000 / iterations)


@probe("environment")
def environment(ctx: RankContext) -> None:
    """What the rank's torch says about itself: versions, backends, and the descriptors a rank holds."""
    import torch
    import torch.distributed as dist

    ctx.phase("probe", "versions")
    ctx.metrics["torch"] = torch.__version__
    ctx.metrics["distributed_available"] = dist.is_available()
    ctx.metrics["gloo_available"] = dist.is_gloo_available()
    ctx.metrics["nccl_available"] = dist.is_nccl_available()
    ctx.metrics["cpu_threads"] = torch.get_num_threads()
    if ctx.backend == "nccl":
        ctx.metrics["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
        ctx.metrics["cuda_devices"] = ctx.visible_count  # the inventory's third count: what CUDA sees in a rank
    _all_reduce_one(ctx, "all_reduce 4B")
    ctx.metrics["open_files"] = len(os.listdir("/proc/self/fd"))  # measured after the group is up
