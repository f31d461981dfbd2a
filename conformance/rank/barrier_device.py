"""Which GPU ``dist.barrier()`` runs on under NCCL, by torch's own rule (torch 2.5 and later).

ProcessGroupNCCL implements barrier as a one-element all-reduce and must pick a device for it
(``distributed_c10d.barrier``'s docstring, and ``ProcessGroupNCCL::barrier``/``guessDeviceId``
since pytorch PR #134617), in this order:

1. the first of ``barrier(device_ids=[...])``;
2. the device given to ``init_process_group(device_id=...)`` (the group's bound device);
3. the lowest-numbered device an earlier collective of the group used (a ``std::set``);
4. a guess: the global rank modulo the number of devices the process sees.

``torch.cuda.set_device`` does not enter the choice: it only places the dispatch tensor.  A job
whose ranks see every GPU of the machine but use others than ``rank % count`` (a subset given by
its launcher, not by CUDA_VISIBLE_DEVICES) therefore runs its first barrier on the wrong GPUs:
seed b, "using GPU N to perform barrier as devices used by this process are currently unknown".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BarrierDevice:
    index: int  # the CUDA ordinal, as the rank sees devices
    chosen_by: str  # which of the four rules picked it


def barrier_device(
    global_rank: int,
    visible_count: int,
    device_ids: Sequence[int] | None = None,
    bound: int | None = None,
    used: Sequence[int] = (),
) -> BarrierDevice:
    if device_ids:
        return BarrierDevice(device_ids[0], "barrier(device_ids)")
    if bound is not None:
        return BarrierDevice(bound, "init_process_group(device_id)")
    if used:
        return BarrierDevice(min(used), "the device of an earlier collective")
    return BarrierDevice(global_rank % visible_count, f"a guess: global rank {global_rank} % {visible_count} devices")


def guessed_wrong(own: Sequence[int], visible_count: int, rank_offset: int = 0) -> list[int]:
    """The ranks (local numbers) whose first barrier, given no device, would run on another GPU than their own."""
    return [
        local for local, device in enumerate(own) if barrier_device(rank_offset + local, visible_count).index != device
    ]
