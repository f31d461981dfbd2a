"""The plugins NCCL will load (network, tuner), found as NCCL and the dynamic loader find them.

NCCL's net plugin (src/net.cc, ``openNetPluginLib``, v2.23.4-1): ``NCCL_NET_PLUGIN`` set and not
empty: that name as given, else ``libnccl-net-<name>.so``; unset: ``libnccl-net.so``.  Its tuner
(src/misc/tuner.cc, v2.23.4-1): ``NCCL_TUNER_PLUGIN`` (as given, else ``libnccl-tuner-<name>.so``),
else ``libnccl-tuner.so``, else the net plugin's library (a net plugin may carry a tuner).  Each
name goes to ``dlopen``, which (dlopen(3)) takes a name with a slash as a path and otherwise looks
in ``LD_LIBRARY_PATH``, then ``/etc/ld.so.cache`` (``ldconfig -p``), then ``/lib`` and ``/usr/lib``
(``/lib64`` and ``/usr/lib64`` on 64-bit systems).  The library is found here without loading
it, and named by its path and a digest of its bytes: two nodes agree only where they would load
the same plugin.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from conformance.common.inputs import read_bounded

NONE = "none"
DEFAULT_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")
PLUGIN_BYTES = 256 << 20  # a plugin larger than this is not digested: its size stands in


def net_names(environ: Mapping[str, str]) -> list[str]:
    """The names NCCL tries for its net plugin, in order."""
    name = environ.get("NCCL_NET_PLUGIN", "")
    return [name, f"libnccl-net-{name}.so"] if name else ["libnccl-net.so"]


def tuner_names(environ: Mapping[str, str]) -> list[str]:
    """The names NCCL tries for its tuner plugin, in order: its own, then the net plugin's library."""
    name = environ.get("NCCL_TUNER_PLUGIN", "")
    own = [name, f"libnccl-tuner-{name}.so"] if name else ["libnccl-tuner.so"]
    return own + net_names(environ)


def loader_cache() -> dict[str, str]:
    """``ldconfig -p``: library name -> path (the first listed); empty where ldconfig cannot be run."""
    try:
        listed = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, str] = {}
    for line in listed.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow:
            found.setdefault(name.split(" (", 1)[0], path.strip())
    return found


def find_library(name: str, environ: Mapping[str, str], cache: Mapping[str, str]) -> Path | None:
    """Where dlopen would find ``name`` (dlopen(3)'s order), or None."""
    if "/" in name:
        return Path(name) if Path(name).is_file() else None
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for folder in dirs:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    if name in cache and Path(cache[name]).is_file():
        return Path(cache[name])
    return next((Path(d) / name for d in DEFAULT_DIRS if (Path(d) / name).is_file()), None)


def identity(path: Path) -> str:
    """``<path> sha256:<first 12 hex>``: the same bytes on every node read the same."""
    size = path.stat().st_size
    if size > PLUGIN_BYTES:
        return f"{path} ({size} bytes)"
    digest = hashlib.sha256(read_bounded(path, PLUGIN_BYTES)).hexdigest()[:12]
    return f"{path} sha256:{digest}"


def nccl_plugins(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{"net": ..., "tuner": ...}``: each plugin NCCL would load here, or ``none``."""
    environ = os.environ if environ is None else environ
    cache = loader_cache()
    found = {}
    for kind, names in (("net", net_names(environ)), ("tuner", tuner_names(environ))):
        path = next((p for p in (find_library(n, environ, cache) for n in names) if p is not None), None)
        try:
            found[kind] = identity(path) if path is not None else NONE
        except OSError as exc:
            found[kind] = f"{path} (unreadable: {exc.strerror or exc})"
    return found
