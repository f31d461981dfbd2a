"""The software a run tests, as installed here: package versions and the NCCL wheel torch uses."""

from __future__ import annotations

import re
from importlib import metadata

SUITE_DISTRIBUTION = "gpu-conformance"  # this suite's own package, as pip names it


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def suite_version() -> str | None:
    """The installed version of this suite (None: not installed, e.g. run from a bare checkout)."""
    return package_version(SUITE_DISTRIBUTION)


def nccl_wheel_version() -> str | None:
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if re.fullmatch(r"nvidia-nccl-cu\d+", name):
            return f"{dist.version} ({name})"
    return None
