"""Release numbers as the suite compares them: NCCL's, torch's, the driver's."""

from __future__ import annotations

import re

_RELEASE = re.compile(r"\s*(\d+)\.(\d+)(?:\.(\d+))?")


def release(text: str | None) -> tuple[int, int, int] | None:
    """A version's major, minor and patch: "2.21.5", "2.28" (2.28.0), pip's "2.21.5 (nvidia-nccl-cu12)"."""
    found = _RELEASE.match(text or "")
    return (int(found[1]), int(found[2]), int(found[3] or 0)) if found else None
