"""How probes time a transfer: warm-up first, then only the transfer inside the timed loop.

The loop body is the operation alone (buffers exist before it, nothing is checked inside it).  On
GPUs the devices are synchronized before the clock starts and after the last iteration, outside
the loop body, so the time covers the transfers and not their launches; on CPU the operations are
synchronous.  The result is seconds per iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _synchronize(devices: Iterable[torch.device]) -> None:
    import torch

    for device in set(devices):
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def seconds_per_iteration(
    operation: Callable[[], object], devices: Iterable[torch.device], iterations: int, warmup: int
) -> float:
    """Run ``operation`` ``warmup`` times, then time ``iterations`` runs of it."""
    devices = tuple(devices)
    for _ in range(warmup):
        operation()
    _synchronize(devices)
    begun = time.perf_counter()
    for _ in range(iterations):
        operation()
    _synchronize(devices)
    return max(time.perf_counter() - begun, 1e-9) / max(1, iterations)


def gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 4)
