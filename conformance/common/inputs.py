"""Reading the files a user points the suite at (scenarios, topologies, rung files, runs)."""

from __future__ import annotations

import dataclasses
import errno
import functools
import importlib
import os
import stat
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

JSON_TYPE_NAMES = {dict: "object", list: "list", str: "string", int: "number", float: "number", bool: "true/false"}
SCALAR_WORDS = {str: "a text", int: "a whole number", float: "a number", bool: "true or false", type(None): "null"}


USER_FILE_BYTES = 16 << 20  # a scenario, topology or rungs file: the shipped ones are under 100 KiB
RUN_FILE_BYTES = 1 << 30  # a run's results.jsonl or run.json, a JUnit file: 100,000 records fit
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


class NotReadable(OSError):
    """A file the suite will not read: not a regular file, or over its size cap; the message says which."""


def read_bounded(path: Path, limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; NotReadable (or the OSError met) otherwise.

    Opened without blocking, so a FIFO cannot hang the open; its kind is read from the open file itself,
    and at most ``limit`` + 1 bytes are read, so /dev/zero or a file that grows cannot fill the memory.
    """
    data = read_part(path, 0, limit + 1)
    if len(data) > limit:
        raise NotReadable(f"is over {limit >> 20} MiB, the most the suite reads of such a file")
    return data


def read_part(path: Path, offset: int, most: int) -> bytes:
    """At most ``most`` bytes of a regular file from ``offset`` (a file others append to, read in turns)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        kind = next((name for test, name in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")
        if kind is not None:
            raise NotReadable(f"is {kind}, not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(offset)
            return f.read(most)
    finally:
        os.close(fd)


def absolute(path: Path) -> Path:
    """``path.resolve()``, with a symbolic link loop on its way refused as NotReadable on every Python.

    Python 3.10-3.12 raise RuntimeError for a loop (pathlib's ``check_eloop``); 3.13 returns the path as far as
    it got, and the loop shows at the first use (ELOOP, "Too many levels of symbolic links").
    """
    try:
        resolved = path.resolve()
    except RuntimeError:
        raise NotReadable("is a symbolic link loop") from None
    try:
        os.stat(resolved)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotReadable("is a symbolic link loop") from None
    return resolved


def read_user_file(path: Path, what: str, where: str, error: type[ValueError], limit: int = USER_FILE_BYTES) -> str:
    """The file's text, or ``error`` naming the setting, the file and what is wrong with it."""
    try:
        return read_bounded(path, limit).decode("utf-8")
    except NotReadable as exc:
        raise error(f"{where}: {what} {str(path)!r} {exc}") from None
    except OSError as exc:
        raise error(f"{where}: {what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: {what} {str(path)!r} is not UTF-8 text: {exc}") from None


T = typing.TypeVar("T")


def dataclass_from_json(kind: type[T], data: object, what: str, error: type[ValueError]) -> T:
    """A JSON object as the dataclass ``kind`` (lists as tuples); ``error`` names ``what`` and the field at fault."""
    if not isinstance(data, dict):
        raise error(f"{what} is {data!r}, not an object")
    known = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise error(f"{what}: unknown field {unknown[0]!r} (it has {', '.join(sorted(known))})")
    values = {str(k): tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    problem = wrong_field_type(values, kind)
    if problem:
        raise error(f"{what}: {problem}")
    return kind(**values)


def json_type_name(value: object) -> str:
    """What JSON calls the type of a value ``json.loads`` returned."""
    return "null" if value is None else JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def wrong_field_type(data: Mapping[str, Any], kind: type, lenient: bool = False) -> str:
    """The first field of ``data`` (JSON for the dataclass ``kind``) of the wrong type, in words; "" when none.

    ``lenient``: null stands for an empty list or object (how ``CaseRecord.from_json`` reads it).
    """
    hints = _type_hints(kind)
    for name, value in data.items():
        problem = _value_problem(value, hints[name], lenient) if name in hints else ""
        if problem:
            return f"{name}{problem}"
    return ""


@functools.cache
def _type_hints(kind: type) -> dict[str, Any]:
    """A dataclass's field types, resolved once (records are read by the hundred)."""
    return typing.get_type_hints(kind)


def _value_problem(value: object, hint: Any, lenient: bool) -> str:
    """What follows the field name when ``value`` does not fit ``hint`` (" is 5, which is not a text"), or ""."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if lenient and value is None and any(_is_container(option) for option in options):
        return ""
    for option in options:
        if _fits(value, option):
            return _inner_problem(value, option, lenient)
    return f" is {value!r}, which is not {type_words(hint)}"


def _fits(value: object, hint: Any) -> bool:
    """The value's own kind (a bool is no number here); items and nested fields are checked after."""
    origin = typing.get_origin(hint) or hint
    if hint is Any:
        return True
    if hint is float:
        return type(value) in (int, float)
    if hint in SCALAR_WORDS:
        return type(value) is hint
    if origin is tuple or origin is list:
        return isinstance(value, (list, tuple))
    if isinstance(origin, type) and issubclass(origin, Mapping) or dataclasses.is_dataclass(origin):
        return isinstance(value, Mapping)
    return True


def _inner_problem(value: object, hint: Any, lenient: bool) -> str:
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        inner = wrong_field_type(value, typing.cast(type, hint), lenient)
        return f".{inner}" if inner else ""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis and isinstance(value, list | tuple):
        for number, item in enumerate(value):
            problem = _value_problem(item, args[0], lenient)
            if problem:
                return f"[{number}]{problem}"
    return ""


def _is_container(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return origin in (tuple, list) or isinstance(origin, type) and issubclass(origin, Mapping)


def type_words(hint: Any) -> str:
    """A declared type in words: "a whole number or null", "a list", "an object"."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return " or ".join(_one_type_words(option) for option in options)


def _one_type_words(hint: Any) -> str:
    if hint in SCALAR_WORDS:
        return SCALAR_WORDS[hint]
    return "a list" if _is_container(hint) and (typing.get_origin(hint) or hint) in (tuple, list) else "an object"


# junitparser is the ``junit`` extra, absent from some GPU images: a command given a JUnit file says so in one line.
NO_JUNITPARSER = "reading a JUnit file needs junitparser: pip install 'gpu-conformance[junit]'"


# jinja2 is the ``report`` extra: a GPU image may run the suite without it (its torch brings it anyway).
NO_JINJA2 = "the HTML report needs jinja2: pip install 'gpu-conformance[report]'"


def junitparser_missing() -> bool:
    """Whether junitparser cannot be imported here."""
    return _cannot_import("junitparser")


NO_PROMETHEUS_CLIENT = "the metrics file needs prometheus_client: pip install 'gpu-conformance[metrics]'"


def prometheus_client_missing() -> bool:
    """Whether prometheus_client cannot be imported here (the metrics file's text is its)."""
    return _cannot_import("prometheus_client")


def jinja2_missing() -> bool:
    """Whether jinja2 cannot be imported here (the HTML report needs it)."""
    return _cannot_import("jinja2")


def _cannot_import(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return True
    return False
