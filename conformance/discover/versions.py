"""The software a run tests, as installed here: package versions and the NCCL wheel torch uses."""

from __future__ import annotations

import re
from dataclasses import dataclass
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


def nccl_version_text(parts: tuple[object, ...]) -> str:
    """``2.21.5``, or with its suffix as NCCL prints it (``2.21.5+cuda12.4``).

    torch appends the suffix as a fourth element where NCCL was built with one (torch/cuda/nccl.py ``version``).
    """
    text = ".".join(str(part) for part in parts[:3])
    return text + "".join(str(part) for part in parts[3:])


def loaded_nccl_version() -> str | None:
    """The NCCL the torch of this process loads (``torch.cuda.nccl.version()``); None on CPU torch.

    What the dynamic loader found: LD_PRELOAD, LD_LIBRARY_PATH and NGC or source builds included.
    """
    try:
        import torch

        return nccl_version_text(torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    except Exception:  # a CPU build has no NCCL: torch raises AttributeError or RuntimeError, by version
        return None


@dataclass(frozen=True)
class NcclVersions:
    """The NCCL a run uses, and pip's word where it differs."""

    loaded: str | None  # what torch loads; None: not known here (CPU torch)
    pip: str | None  # nvidia-nccl-cu* metadata, e.g. "2.27.5 (nvidia-nccl-cu12)"

    @property
    def used(self) -> str | None:
        """The version the run tests: the library loaded, else pip's."""
        return self.loaded or self.pip

    @property
    def warning(self) -> str | None:
        """A warning where pip's metadata names another version than the library loaded."""
        pip_version = (self.pip or "").split(" ")[0]
        if not self.loaded or not pip_version or pip_version == self.loaded:
            return None
        return (
            f"NCCL {self.loaded} is the library torch loads, while pip's {self.pip} says otherwise "
            "(LD_PRELOAD, LD_LIBRARY_PATH, an NGC or source build, or a wheel installed over torch's pin)"
        )


def nccl_versions() -> NcclVersions:
    return NcclVersions(loaded_nccl_version(), nccl_wheel_version())


def nccl_wheel_version() -> str | None:
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if re.fullmatch(r"nvidia-nccl-cu\d+", name):
            return f"{dist.version} ({name})"
    return None
