"""NCCL's configuration files, read as NCCL reads them, so the suite predicts what NCCL will do.

NCCL's ``initEnv`` (src/misc/param.cc) reads, once per process, before any variable:

* v2.23.4-1 on: the file ``NCCL_CONF_FILE`` names (when set and not empty), else ``~/.nccl.conf``
  (the home of the process's user, ``getpwuid``); then ``/etc/nccl.conf`` in every case.
* v2.18.3-1 to v2.22.3-1: ``~/.nccl.conf``, then ``/etc/nccl.conf`` (no ``NCCL_CONF_FILE``).

Each line ``NAME=VALUE`` (split at the first ``=``, nothing trimmed, a line without ``=`` skipped)
is passed to ``setenv(NAME, VALUE, 0)``: the environment wins over every file, and the first file
read wins over a later one.  A line starting with ``#`` is skipped (later versions); older ones
set a variable named ``#...``, which nothing reads: the same result.

A variable in a file cannot be removed by unsetting it in the environment: NCCL sets it again.
``NCCL_CONF_FILE=/dev/null`` keeps the user's file out (``NCCL_CONF_FILE``'s or ``~/.nccl.conf``),
never ``/etc/nccl.conf``.  What removes a variable of a file still read is the environment giving
it an empty value, where NCCL reads an empty value as unset: its integer parameters take their
default when the value is empty (``ncclLoadParam``: ``strlen(str) > 0``), ``NCCL_P2P_LEVEL``
matches no level name (``ncclGetLevel``, src/graph/paths.cc), ``NCCL_SOCKET_IFNAME`` needs more
than one character (src/misc/socket.cc); ``NCCL_TOPO_FILE`` logs a WARN that it cannot open ``''``
and detects the topology.  Not so ``NCCL_NET`` (``EMPTY_IS_A_VALUE``): an empty one names a
network no plugin has, and every communicator fails; such a variable of ``/etc/nccl.conf`` cannot
be removed from the environment at all.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from conformance.common.inputs import read_bounded

ETC_FILE = Path("/etc/nccl.conf")
CONF_FILE_VARIABLE = "NCCL_CONF_FILE"
CONF_FILE_SINCE = (2, 23, 0)  # NCCL_CONF_FILE first read in v2.23.4-1's src/misc/param.cc
NO_FILE = "/dev/null"
LINE_BYTES = 1023  # NCCL copies at most 1023 bytes of a name or a value (envVar[1024], envValue[1024])
FILE_BYTES = 1 << 20  # a configuration file larger than this is not one: it is not read


@dataclass(frozen=True)
class ConfigValue:
    value: str
    file: str  # the file that set it: the first one read that names it


@dataclass(frozen=True)
class NcclConfig:
    """What NCCL's configuration files set, as NCCL will see it; the files read, in NCCL's order."""

    values: Mapping[str, ConfigValue] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # those that exist and were read
    unreadable: tuple[str, ...] = ()  # "<file>: <why>": files NCCL may read that the suite could not

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment a process of NCCL sees: ``environ`` first, then what the files add."""
        return {**{k: v.value for k, v in self.values.items()}, **environ}

    def from_files(self, environ: Mapping[str, str]) -> dict[str, ConfigValue]:
        """The values a process gets from the files alone (the environment does not set them)."""
        return {k: v for k, v in self.values.items() if k not in environ}

    def header_lines(self, environ: Mapping[str, str]) -> list[str]:
        lines = [
            f"NCCL config {v.file}: {k}={v.value}"
            + (f" (the environment's {environ[k]!r} wins)" if k in environ else "")
            for k, v in sorted(self.values.items())
        ]
        return lines + [f"NCCL config NOT read: {why}" for why in self.unreadable]

    def to_json(self) -> dict[str, object]:
        return {
            "values": {k: {"value": v.value, "file": v.file} for k, v in sorted(self.values.items())},
            "files": list(self.files),
            "unreadable": list(self.unreadable),
        }

    @classmethod
    def from_json(cls, data: object) -> NcclConfig:
        if not isinstance(data, Mapping):
            return cls()
        raw = data.get("values")
        values = {
            str(k): ConfigValue(str(v.get("value", "")), str(v.get("file", "")))
            for k, v in (raw.items() if isinstance(raw, Mapping) else ())
            if isinstance(v, Mapping)
        }
        files = data.get("files")
        unreadable = data.get("unreadable")
        return cls(
            values,
            tuple(str(f) for f in files) if isinstance(files, list) else (),
            tuple(str(u) for u in unreadable) if isinstance(unreadable, list) else (),
        )


def parse_config(text: str, file: str) -> dict[str, ConfigValue]:
    """One file's lines as NCCL's ``setEnvFile`` reads them: the first line naming a variable wins.

    A line is a C string there: a NUL before the ``=`` ends the line (skipped: no ``=``), a NUL in
    the value ends the value (``strncpy``).
    """
    found: dict[str, ConfigValue] = {}
    for line in text.split("\n"):
        if not line or line.startswith("#") or "=" not in line.split("\0", 1)[0]:
            continue
        name, value = line.split("=", 1)
        found.setdefault(name[:LINE_BYTES], ConfigValue(value.split("\0", 1)[0][:LINE_BYTES], file))
    return found


def config_files(environ: Mapping[str, str], version: tuple[int, int, int] | None, home: str | None) -> list[Path]:
    """The files NCCL reads, in its order (``version`` unknown: the newest NCCL's rule)."""
    chosen = environ.get(CONF_FILE_VARIABLE, "")
    reads_variable = version is None or version >= CONF_FILE_SINCE
    files = [Path(chosen)] if reads_variable and chosen else [Path(home) / ".nccl.conf"] if home else []
    return [*files, ETC_FILE]


def user_home() -> str | None:
    """The home NCCL looks in: the process's user's, from the password database (not ``$HOME``)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return None


def read_nccl_config(environ: Mapping[str, str], version: tuple[int, int, int] | None) -> NcclConfig:
    """What this machine's NCCL configuration files set."""
    values: dict[str, ConfigValue] = {}
    files, unreadable = [], []
    for path in config_files(environ, version, user_home()):
        if str(path) == NO_FILE or not path.exists():
            continue
        try:
            text = read_bounded(path, FILE_BYTES).decode("utf-8", "replace")
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        files.append(str(path))
        for name, value in parse_config(text, str(path)).items():
            values.setdefault(name, value)
    return NcclConfig(values, tuple(files), tuple(unreadable))


def simulated_config(etc_text: str | None) -> NcclConfig:
    """A simulated image's: its ``/etc/nccl.conf`` only (this host's files are not the machine's)."""
    if not etc_text:
        return NcclConfig()
    return NcclConfig(parse_config(etc_text, str(ETC_FILE)), (str(ETC_FILE),))


# Variables whose empty value NCCL takes as a value, not as unset.  NCCL_NET: src/init.cc (v2.28.9-1,
# parseCommConfig) copies ncclGetEnv("NCCL_NET") as the net's name whenever it is set, empty too;
# src/plugin/net.cc ncclNetInit then finds no plugin named "" and fails every communicator with
# "Failed to initialize any NET plugin" (ncclInvalidUsage).
EMPTY_IS_A_VALUE = frozenset({"NCCL_NET"})


def still_read(name: str, config: NcclConfig, environ: Mapping[str, str], kept_out: frozenset[str]) -> bool:
    """Whether a file NCCL still reads sets ``name`` (``kept_out``: those ``NCCL_CONF_FILE=/dev/null`` keeps out)."""
    value = config.from_files(environ).get(name)
    return value is not None and value.file not in kept_out


def neutralised(
    names: list[str], config: NcclConfig, environ: Mapping[str, str], kept_out: frozenset[str] = frozenset()
) -> dict[str, str]:
    """What removes ``names`` for a process of NCCL: an empty value for each a file still read sets (module doc)."""
    return {name: "" for name in names if name not in EMPTY_IS_A_VALUE and still_read(name, config, environ, kept_out)}


def not_removable(
    names: list[str], config: NcclConfig, environ: Mapping[str, str], kept_out: frozenset[str] = frozenset()
) -> list[str]:
    """Those of ``names`` a file still read sets and no environment can remove: ``NAME=VALUE (file)``."""
    return [
        f"{name}={config.values[name].value} ({config.values[name].file})"
        for name in names
        if name in EMPTY_IS_A_VALUE and still_read(name, config, environ, kept_out)
    ]


def user_files(config: NcclConfig) -> frozenset[str]:
    """The files ``NCCL_CONF_FILE=/dev/null`` keeps out: every one read but ``/etc/nccl.conf``."""
    return frozenset(f for f in config.files if f != str(ETC_FILE))
