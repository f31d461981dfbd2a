"""What a value given as text must be: the one parser for each kind, wherever it was given.

Each raises :class:`BadValue` naming the text and what it must be; the caller adds where it came
from (a setting's source, a command-line argument, an environment variable).
"""

from __future__ import annotations

import math
import re


class BadValue(ValueError):
    """The message says what is wrong with the value, not where it came from."""


def number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise BadValue(f"{raw!r} is not a number") from None


def positive_seconds(raw: str) -> float:
    value = number(raw)
    if not value > 0 or math.isinf(value):
        raise BadValue(f"{raw!r} must be a positive, finite number of seconds")
    return value


def ratio(raw: str) -> float:
    value = number(raw)
    if not 0 < value <= 1:
        raise BadValue(f"{raw!r} must be a ratio above 0 and at most 1")
    return value


def whole_number(raw: str, minimum: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise BadValue(f"{raw!r} is not a whole number") from None
    if minimum == 1 and value < 1:
        raise BadValue(f"{raw!r} must be a positive whole number")
    if minimum is not None and value < minimum:
        raise BadValue(f"{raw!r} must be {minimum} or more")
    return value


# The most devices one node's plan takes.  The largest single machines have 16 GPUs (DGX-2, HGX-2);
# pairs grow as n(n-1)/2 per rung and test, so at 200 devices collection alone took minutes
# (40,023 tests) with no output.
MAX_DEVICES = 32


def device_count(raw: str) -> int:
    value = whole_number(raw, minimum=1)
    if value > MAX_DEVICES:
        raise BadValue(f"{raw!r} devices is more than the {MAX_DEVICES} one node's plan takes")
    return value


def port(raw: str) -> int:
    value = whole_number(raw, minimum=1)
    if value > 65535:
        raise BadValue(f"{raw!r} is not a TCP port (1-65535)")
    return value


def host(raw: str) -> str:
    value = raw.strip()
    if not value or any(c.isspace() for c in value):
        raise BadValue(f"{raw!r} is not a host name or address")
    return value


_SIZE = re.compile(r"(\d+)\s*([KMG]?)(?:I?B)?", re.IGNORECASE)
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_MESSAGE_BYTES = 16 << 30  # nccl-tests users judge at 1-8 GiB; beyond 16 GiB a GPU holds little else


def message_bytes(raw: str) -> int:
    """A message size: bytes, or with K, M or G (powers of 1024: ``8G`` is 8 GiB, as nccl-tests' ``-e 8G``)."""
    found = _SIZE.fullmatch(raw.strip())
    if found is None:
        raise BadValue(f"{raw!r} is not a size (bytes, or a number with K, M or G: 64M, 8G)")
    value = int(found.group(1)) * SIZE_UNITS[found.group(2).upper()]
    if not 4 <= value <= MAX_MESSAGE_BYTES:
        raise BadValue(f"{raw!r} must be from 4 bytes to {MAX_MESSAGE_BYTES >> 30} GiB")
    return value


# The link classes a GPU pair has (nvidia-smi topo -m's names; NV<n>: n NVLinks).
PAIR_LINK_CLASS = re.compile(r"NV[1-9][0-9]*|PIX|PXB|PHB|NODE|SYS")


def bandwidth_floor(raw: str) -> tuple[str, float]:
    """``CLASS=GBPS``: the least bandwidth a pair of that link class may have (``NV18=300``, ``SYS=10``)."""
    link, sep, rate = raw.partition("=")
    link = link.strip().upper()
    if not sep:
        raise BadValue(f"{raw!r} is not CLASS=GBPS (e.g. NV18=300 or SYS=10)")
    if not PAIR_LINK_CLASS.fullmatch(link):
        raise BadValue(f"{raw!r}: unknown link class {link!r}; classes are NV<n>, PIX, PXB, PHB, NODE, SYS")
    value = number(rate)
    if not 0 < value < math.inf:
        raise BadValue(f"{raw!r}: the floor must be a positive number of GB/s")
    return link, value
