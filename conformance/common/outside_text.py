"""Text written by someone else, made safe to show: the one function every outside text passes through.

A job's log, a rank's stderr, a store value or a scenario name is written by any user's code, and
is read by whoever runs this suite or ``conformance diagnose``, often an administrator.  Shown raw,
such text can move the cursor, erase lines, set the terminal's title, write the clipboard (OSC 52),
forge an answer line over the real one (``\\r``, ``ESC [2K``), or reorder what is read with Unicode
bidi overrides (CVE-2021-42574).  :func:`shown` replaces every character that does any of that with
a visible escape, so the text reads as what it is and nothing more.
"""

from __future__ import annotations

import unicodedata

# Categories whose characters are not text to look at: Cc (C0 and C1 controls, DEL: ESC, CR, BS, BEL, NEL, CSI),
# Cf (format: the bidi embeddings/overrides/isolates U+202A-202E, U+2066-2069, marks, zero-width characters),
# Zl/Zp (line and paragraph separators, U+2028/2029: a line break inside one "line"), Co/Cs/Cn (private use,
# surrogates from a bad decode, unassigned).
_NOT_TEXT = frozenset(("Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"))
_KEPT = frozenset("\t")  # a tab moves the cursor forward only: kept so quoted tracebacks keep their shape


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _is_text(char: str) -> bool:
    return char in _KEPT or unicodedata.category(char) not in _NOT_TEXT


def shown(text: str) -> str:
    """``text`` with every control, format, separator or unassigned character as ``\\xNN``/``\\uNNNN``."""
    if text.isprintable():  # the common case, in C: no character of the categories above (nor a tab)
        return text
    return "".join(char if _is_text(char) else _escape(char) for char in text)


def shown_lines(text: str) -> str:
    """Each line of ``text`` :func:`shown`, the line breaks between them kept (``\\n`` only: ``\\r`` is shown)."""
    return "\n".join(shown(line) for line in text.split("\n"))
