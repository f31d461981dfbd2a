"""The one parser of each text format the suite reads from outside: JSON and TOML, bounded in depth.

Outside data (results.jsonl, run.json, topology, scenario and rungs files, store values, baselines,
diagnose's inputs) is written by whoever can reach the file or the port.  Python's parsers recurse
once per level: a line of JSON nested 100,000 deep raises ``RecursionError`` (json's C scanner calls
``Py_EnterRecursiveCall`` per level; tomllib is pure-Python recursive descent), which is no
``ValueError``, so every ``except ValueError`` around a parser let it through to the end of the run.
And a value nested just under the interpreter's limit still breaks whatever walks it next
(``json.dumps``, ``dataclass_from_json``, the report's templates).  So every parse comes here: what
is too deep, or cannot be parsed at all, is a ``ValueError`` (``NotParsed``) naming why, and a caller
that already handles ``ValueError`` refuses it as it refuses any bad input.
"""

from __future__ import annotations

import json
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

# The deepest of the suite's own formats nests some 8 levels (run.json's end, a topology's NICs);
# 64 leaves room for what users write by hand and stays far below the interpreter's recursion limit.
MAX_DEPTH = 64


class NotParsed(ValueError):
    """Text that is not a value of its format, or nests deeper than :data:`MAX_DEPTH`; the message says which."""


def json_value(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``, refused with ``NotParsed`` (a ``ValueError``) when bad or nested too deep."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise NotParsed(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes
        raise NotParsed(f"not JSON: {exc}") from None
    _refuse_deeper_than(value, max_depth)
    return value


def toml_table(text: str, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """``tomllib.loads(text)``, refused with ``NotParsed`` (a ``ValueError``) when bad or nested too deep."""
    try:
        value: dict[str, Any] = tomllib.loads(text)
    except RecursionError:
        raise NotParsed(f"nested deeper than {max_depth} levels") from None
    except tomllib.TOMLDecodeError as exc:
        raise NotParsed(f"not valid TOML: {exc}") from None
    _refuse_deeper_than(value, max_depth)
    return value


def depth(value: object) -> int:
    """How deep lists and objects nest in ``value`` (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _refuse_deeper_than(value: object, max_depth: int) -> None:
    if depth(value) > max_depth:
        raise NotParsed(f"nested deeper than {max_depth} levels")
