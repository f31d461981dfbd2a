"""The environment-variable families the suite reads, sets or clears, defined once."""

from __future__ import annotations

import os
from collections.abc import Mapping

# What NCCL itself and torch's NCCL process group read: what the rung "clean" removes.
NCCL_FAMILIES = ("NCCL_", "TORCH_NCCL_")
# What a rung may set: NCCL's, torch's, gloo's and CUDA's variables.
RUNG_FAMILIES = ("NCCL_", "TORCH_NCCL_", "TORCH_", "GLOO_", "CUDA_")
# What a run records as inherited from the caller's shell (and what the tests clear).
INHERITED_FAMILIES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_")


def inherited_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's NCCL_/TORCH_NCCL_/GLOO_/TORCH_DISTRIBUTED_ variables, sorted."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(INHERITED_FAMILIES)}
