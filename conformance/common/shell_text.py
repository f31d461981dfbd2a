"""Text a POSIX shell reads: the shell sink's one escape, for ``recommended.env`` and the export lines.

``recommended.env`` is sourced (``set -a; . ./recommended.env; set +a``) and its export lines are
pasted into launch scripts, so every name, value and note in them is read by a shell.  A value is
outside text (a rung's, NCCL's configuration file's, an interface name another node sent), and so
is every note (a class, a test id, an inherited variable's value): raw, a newline ends a comment
and starts a command, and ``$(...)`` or a backtick runs one.

* A value is quoted with ``shlex.quote`` (POSIX sh quoting, XCU §2.2.2 single quotes: nothing
  inside them is special), so the shell reads back exactly the value; a value with no character a
  shell treats specially is left bare (``NCCL_P2P_LEVEL=NVL``).
* A name is set only when it is a shell variable name (XBD §3.235 "Name": ``[A-Za-z_][A-Za-z0-9_]*``);
  a value only when it has no NUL (no environment variable holds one: ``execve`` takes C strings)
  and is bytes (a lone surrogate other than one ``os.fsdecode`` makes cannot be written).  What
  cannot be set is said on a comment line instead (:func:`unsettable`).
* A note is a comment line whose text is :func:`~conformance.common.outside_text.shown`: no
  newline, carriage return or other control is left to end the comment.
"""

from __future__ import annotations

import re
import shlex

from conformance.common.outside_text import shown

SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX XBD §3.235 Name
ENCODING = "utf-8"
ERRORS = "surrogateescape"  # a value read from the environment (os.environ) is written back as its bytes


def unsettable(name: str, value: str) -> str | None:
    """Why a shell cannot set ``name`` to ``value``; None when it can."""
    if not SHELL_NAME.fullmatch(name):
        return "not a shell variable name"
    if "\0" in value:
        return "its value holds a NUL, which no environment variable can"
    try:
        value.encode(ENCODING, ERRORS)
    except UnicodeEncodeError:
        return "its value holds a character that is no bytes (a lone surrogate)"
    return None


def assignment(name: str, value: str) -> str:
    """``NAME=VALUE`` with the value quoted for a POSIX shell; a comment saying why, where it cannot be set."""
    why = unsettable(name, value)
    if why is not None:
        return comment(f"{name}={value} NOT set here: {why}")
    return f"{name}={shlex.quote(value) if value else ''}"  # empty bare: docker --env-file reads '' as two quotes


def export_line(name: str, value: str) -> str:
    """``export NAME=VALUE`` for a launch script (the value quoted), or the comment :func:`assignment` gives."""
    line = assignment(name, value)
    return line if line.startswith("#") else f"export {line}"


def comment(text: str) -> str:
    """``text`` as one comment line: every control (a newline too) shown as its escape."""
    return f"# {shown(text)}"


def file_bytes(lines: list[str]) -> bytes:
    """The lines as a file's bytes, each ended by a newline; a value from the environment keeps its bytes."""
    return "".join(f"{line}\n" for line in lines).encode(ENCODING, ERRORS)
