"""Outside text in a JUnit file: the JUnit sink's one escape (:func:`junit_text`) and its one writer.

XML 1.0 §2.2 allows a document only the characters of its ``Char`` production::

    Char ::= #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]

One other character anywhere (NUL, VT, ESC, a lone surrogate, U+FFFE) and the file is not XML:
CI's parser rejects all of it, every test case with it.  A rank's message, a host name, a path or
a variable's value can hold any of them, and no character reference (``&#x1b;``) helps: §2.2's
rule holds for referenced characters too (§4.1, well-formedness constraint "Legal Character").

:func:`junit_text` is :func:`~conformance.common.outside_text.shown_lines`: each control, format,
separator, surrogate or unassigned character becomes its visible escape (``\\x1b``), which keeps
every ``Char`` out but TAB and LF, and shows a person reading the file in CI what was there.
Markup (``<``, ``&``, ``"``, ``]]>``) is the XML serialiser's to escape, not this function's.

:func:`write_junit` is the one place the suite writes a JUnit file: every attribute value and
text of the tree goes through :func:`junit_text` first, whoever put it there.  pytest's own
writer escapes what it calls text (``bin_xml_escape``), but not every attribute: the testsuite's
``hostname`` (``platform.node()``), ``classname`` and ``file`` are written raw, so a host name
with a control character makes pytest's file unreadable.  :func:`parse_pytest_junit` reads such a
file with each character §2.2 forbids shown as its escape, so the run can still complete it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from conformance.common.files import write_via_temporary
from conformance.common.outside_text import shown, shown_lines

NOT_XML_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")  # XML 1.0 §2.2 Char


def junit_text(text: str) -> str:
    """``text`` as a JUnit file may carry it: no character XML 1.0 forbids, every control shown as its escape."""
    return shown_lines(text)


def parse_pytest_junit(path: Path) -> Any:
    """The root element of the JUnit file pytest wrote, each character XML 1.0 forbids shown as its escape.

    Those characters can stand only inside attribute values and texts (every character of markup is
    a ``Char``), so showing them leaves the document's structure as pytest wrote it.
    """
    document = path.read_text(encoding="utf-8", errors="replace")
    return ElementTree.fromstring(NOT_XML_CHAR.sub(lambda found: shown(found.group()), document))


def junit_escaped(root: Any) -> None:
    """Every attribute value and text under ``root`` through :func:`junit_text` (ElementTree or lxml elements)."""
    for element in root.iter():
        for name, value in list(element.attrib.items()):
            element.set(name, junit_text(value))
        if element.text:
            element.text = junit_text(element.text)
        if element.tail:
            element.tail = junit_text(element.tail)


def write_junit(path: Path, root: Any) -> None:
    """Write the JUnit tree under ``root`` to ``path`` whole (beside it, then renamed), escaped first.

    ``root`` is an ElementTree element or, where junitparser found lxml, an lxml one.
    """
    junit_escaped(root)
    tree = root.getroottree() if hasattr(root, "getroottree") else ElementTree.ElementTree(root)
    write_via_temporary(path, lambda temporary: tree.write(str(temporary), encoding="utf-8", xml_declaration=True))
