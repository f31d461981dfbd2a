"""The data ranks send and the references they check it against: small integers, exact in float32.

Rank r's pattern is ``(i % 251 + 1) * (r + 1)``.  References are closed forms, built on the rank's
own device and only for what the rank receives: a sum over the ranks is the base pattern times
``W(W+1)/2``, a reduce-scatter share is that sum's slice, a broadcast is the root's pattern.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CYCLE = 251
EXACT_LIMIT = 1 << 24  # float32 holds every integer below this exactly


def cycle_values(start: int, n: int, device: torch.device | str = "cpu", scale: int = 1) -> torch.Tensor:
    """``((start + i) % 251 + 1) * scale`` for ``i < n``, float32, built by repeating one scaled cycle.

    Scaling the 251 values before repeating them, not the n after, halves what a rank spends on
    making check data (it was a third of a pair rank's CPU time on a CPU run).
    """
    import torch

    offset = start % CYCLE
    repeats = -(-(offset + n) // CYCLE)
    one_cycle = torch.arange(1, CYCLE + 1, dtype=torch.float32, device=device)
    if scale != 1:
        one_cycle.mul_(scale)
    return one_cycle.repeat(repeats)[offset : offset + n]


def pattern(rank: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank ``rank``'s data: integer values, exact in float32."""
    return cycle_values(0, n, device, scale=rank + 1)


def rank_sum(world_size: int) -> int:
    """The factor a sum over every rank's pattern multiplies the base pattern by."""
    total = world_size * (world_size + 1) // 2
    if total * CYCLE >= EXACT_LIMIT:
        raise ValueError(f"{world_size} ranks: sums of the check pattern would not be exact in float32")
    return total


def reduced(world_size: int, n: int, device: torch.device | str = "cpu", start: int = 0) -> torch.Tensor:
    """Elements ``start .. start+n`` of the element-wise sum of every rank's pattern."""
    return cycle_values(start, n, device, scale=rank_sum(world_size))


def gathered(world_size: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Every rank's pattern one after the other, as all-gather delivers them."""
    import torch

    scales = torch.arange(1, world_size + 1, dtype=torch.float32, device=device).unsqueeze(1)
    return (cycle_values(0, n, device).unsqueeze(0) * scales).reshape(-1)


def exchanged(world_size: int, chunk: int, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """What all-to-all delivers to ``rank``: chunk ``rank`` of every rank's pattern, in rank order.

    Each rank's chunks carry its scale and their own offset in its pattern (251 is prime, the chunks
    powers of two), so a chunk from the wrong rank or for the wrong rank differs from this.
    """
    import torch

    scales = torch.arange(1, world_size + 1, dtype=torch.float32, device=device).unsqueeze(1)
    return (cycle_values(rank * chunk, chunk, device).unsqueeze(0) * scales).reshape(-1)
