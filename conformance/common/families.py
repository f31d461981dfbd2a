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


# Image labels that share the prefix and that nothing reads: NVIDIA's CUDA images set NCCL_VERSION to the
# NCCL their packages held (2.28.3-1 on the H200 of docs/gpu-runs/2026-11-27-h200, whose torch loaded 2.28.9).
# NCCL reads no such variable: no NCCL_PARAM(Version...) nor getenv of it in src/ at v2.28.3-1 (NCCL_VERSION is
# nccl.h's version macro).
NOT_SETTINGS = frozenset({"NCCL_VERSION"})


def inherited_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's NCCL_/TORCH_NCCL_/GLOO_/TORCH_DISTRIBUTED_ variables, sorted, less the image labels."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(INHERITED_FAMILIES) and k not in NOT_SETTINGS}
