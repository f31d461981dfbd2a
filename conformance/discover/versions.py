"""The software a run tests, as installed here: package versions and the NCCL wheel torch uses."""

from __future__ import annotations

import re
from importlib import metadata


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nccl_wheel_version() -> str | None:
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if re.fullmatch(r"nvidia-nccl-cu\d+", name):
            return f"{dist.version} ({name})"
    return None
