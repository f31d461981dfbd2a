"""The one parser of each text format the suite reads from outside: JSON, TOML and XML, bounded in depth.

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
from xml.etree import ElementTree
from xml.parsers import expat

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

# The deepest of the suite's own formats nests some 8 levels (run.json's end, a topology's NICs);
# 64 leaves room for what users write by hand and stays far below the interpreter's recursion limit.
MAX_DEPTH = 64


class NotParsed(ValueError):
    """Text that is not a value of its format, or nests deeper than :data:`MAX_DEPTH`; the message says which."""


class TooDeep(NotParsed):
    """A value of its format that nests deeper than the limit: whole, not cut off, and still refused."""


def json_value(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``, refused with ``NotParsed`` (a ``ValueError``) when bad or nested too deep."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes
        raise NotParsed(f"not JSON: {exc}") from None
    opened = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if opened > max_depth:  # fewer brackets than levels cannot nest that deep: a results line is not walked
        _refuse_deeper_than(value, max_depth)
    return value


def toml_table(text: str, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """``tomllib.loads(text)``, refused with ``NotParsed`` (a ``ValueError``) when bad or nested too deep."""
    try:
        value: dict[str, Any] = tomllib.loads(text)
    except RecursionError:
        raise TooDeep(f"nested deeper than {max_depth} levels") from None
    except tomllib.TOMLDecodeError as exc:
        raise NotParsed(f"not valid TOML: {exc}") from None
    _refuse_deeper_than(value, max_depth)
    return value


XML_CHUNK = 1 << 20


def xml_root(data: bytes, max_depth: int = MAX_DEPTH) -> ElementTree.Element:
    """The root element of an XML document, refused with ``NotParsed`` when bad, nested too deep, or declaring entities.

    A JUnit file nests four levels (testsuites, testsuite, testcase, failure); elements nested
    100,000 deep parse (expat keeps its own stack) but break whatever walks them by recursion next
    (``ElementTree.tostring``, junitparser's writer).  Entity declarations (XML 1.0 §4.2) are what
    entity expansion attacks (the "billion laughs") are made of, and no JUnit writer uses them.
    Callers that parse with another library (junitparser, lxml where installed) pass the same bytes
    here first.
    """
    _refuse_document_type(data)
    parser: ElementTree.XMLPullParser[ElementTree.Element] = ElementTree.XMLPullParser(events=("start", "end"))
    level, root = 0, None
    try:
        for start in range(0, len(data), XML_CHUNK):
            parser.feed(data[start : start + XML_CHUNK])
            for event in parser.read_events():  # ("start", element) and ("end", element): the events asked for
                element = event[-1]
                if root is None and isinstance(element, ElementTree.Element):
                    root = element
                level += 1 if event[0] == "start" else -1
                if level > max_depth:
                    raise TooDeep(f"nested deeper than {max_depth} elements")
        parser.close()
    except ElementTree.ParseError as exc:
        raise NotParsed(f"not XML: {exc}") from None
    if root is None:
        raise NotParsed("not XML: no element")
    return root


class _DocumentType(Exception):
    """Raised from expat's handler: the document declares a document type."""


def _refuse_document_type(data: bytes) -> None:
    """``NotParsed`` for a document with a DOCTYPE, in whatever encoding it is written.

    Read by expat itself, which decodes every encoding the document may declare (UTF-16, or any
    codec Python has): a byte search for ``<!ENTITY`` misses the same declaration in UTF-16.  The
    handler fires at the declaration, before any entity in it can be expanded.
    """
    parser = expat.ParserCreate()

    def refuse(*_: object) -> None:
        raise _DocumentType

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    try:
        parser.Parse(data, True)
    except _DocumentType:
        raise NotParsed(
            "declares a document type (<!DOCTYPE>, where entities are made), which no JUnit file does"
        ) from None
    except expat.ExpatError:
        pass  # what is wrong with it is the parse proper's to say


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
        raise TooDeep(f"nested deeper than {max_depth} levels")
