"""What the nodes read of each other's values at the start and the end, parsed and checked before use.

Every value comes from the run's store: signed where the run signs, so a stranger's never gets this
far, but a node of another suite version, or an unsigned run's stranger, may still send anything.
Each reader parses with the bounded JSON reader (``common/bounded_parse.py``) and checks the shape it
needs, raising :class:`Unreadable` (a ``ValueError``) naming what is wrong; the caller drops the value
and names it.  The run id node 0 hands out names the other nodes' run folders: it is checked against
the run folder's name pattern (``record/run_folder.py``) before any path is built from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from conformance.common.bounded_parse import json_value
from conformance.common.outside_text import shown
from conformance.nodes.layout import Fingerprint, FingerprintCheck
from conformance.record.run_folder import run_id_of

SHOWN_CHARACTERS = 80  # of a bad value, in a message


class Unreadable(ValueError):
    """A value of the run's store that is not what it must be; the message says what is wrong."""


@dataclass(frozen=True)
class StartCheck:
    run_id: str
    check: FingerprintCheck | None  # None: no other node arrived to compare with
    missing: Mapping[int, str]
    interfaces: tuple[str, ...]

    @property
    def fatal_text(self) -> str:
        if self.check is None or self.check.ok:
            return ""
        fields = ", ".join(self.check.fatal)
        table = "\n".join(self.check.table)
        return f"the nodes differ in what must match ({fields}); stopping before any collective:\n{table}"


@dataclass(frozen=True)
class CheckRead:
    """Node 0's start check as another node reads it."""

    run_id: str
    prints: tuple[Fingerprint, ...]
    missing: dict[int, str]
    interfaces: tuple[str, ...]


def _shown(value: object) -> str:
    return shown(repr(value)[:SHOWN_CHARACTERS])


def read_check(text: str) -> CheckRead:
    """Node 0's start check (``check``), or Unreadable saying what is wrong with it."""
    data = json_value(text)
    if not isinstance(data, dict):
        raise Unreadable(f"it is {_shown(data)}, not an object")
    run_id = data.get("run_id")
    if not isinstance(run_id, str) or run_id_of(run_id) != run_id:  # before any path is built from it
        raise Unreadable(f"its run id {_shown(run_id)} is not a run id (YYYYMMDD-HHMMSS-hex)")
    missing = data.get("missing")
    if not isinstance(missing, dict) or not all(
        isinstance(k, str) and k.isdigit() and isinstance(v, str) for k, v in missing.items()
    ):
        raise Unreadable(f"its missing nodes {_shown(missing)} are not node -> reason")
    prints = tuple(read_fingerprint(item) for item in read_text_list(data.get("prints")))
    interfaces = tuple(read_text_list(data.get("interfaces")))
    return CheckRead(run_id, prints, {int(k): v for k, v in missing.items()}, interfaces)


def read_text_list(value: object) -> list[str]:
    """A JSON list of texts (parsed here where it is still text), or Unreadable."""
    data = json_value(value) if isinstance(value, str | bytes) else value
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
        raise Unreadable(f"{_shown(data)} is not a list of texts")
    return data


def read_fingerprint(text: object) -> Fingerprint:
    """A node's fingerprint, or Unreadable naming what is wrong."""
    if not isinstance(text, str):
        raise Unreadable(f"a fingerprint {_shown(text)} is not text")
    try:
        return Fingerprint.from_json(text)
    except ValueError as exc:
        raise Unreadable(f"not a fingerprint: {exc}") from None
