"""A GPU's PCIe generation while a rank's timed transfer runs, from NVML in the rank itself.

An idle GPU lowers its link's generation to save power (NVML's "current" generation: Gen1 at rest),
so only a reading taken while data moves says what the link trains to. The rank reads it after
launching its timed iterations and before waiting for them: the GPU is moving data then (CUDA and
NCCL calls return to the host at once). The controller's watch judges the highest reading of each
GPU against the generation the GPU and slot allow (``discover/watch.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class LinkGenerations:
    """Reads GPUs' PCIe generation by UUID; NVML is started on first use and never fails the rank."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._broken = False

    def read(self, uuids: Iterable[str]) -> dict[str, int]:
        """UUID -> the link's generation now; a GPU NVML will not answer for is left out (unknown)."""
        nvml = self._started()
        if nvml is None:
            return {}
        found: dict[str, int] = {}
        for uuid in uuids:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                found[uuid] = int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
            except nvml.NVMLError:
                continue
        return found

    def _started(self) -> Any:
        if self._nvml is None and not self._broken:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # no pynvml, no driver library, NVML refusing: the generation stays unknown
                self._broken = True
        return self._nvml
