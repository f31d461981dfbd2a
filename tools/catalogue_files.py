"""How every catalogue generator in tools/ writes its files: all of them, or with ``--check`` none.

``--check`` compares each file with what the generator made and says which are stale (exit 1); otherwise each
file is written, its folder made where missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def write_or_check(texts: Mapping[Path, str], check: bool) -> int:
    """Write ``texts`` (path -> text), or with ``check`` only say which differ: 1 when any does, else 0."""
    if check:
        stale = [str(p.relative_to(REPO)) for p, text in texts.items() if not p.is_file() or p.read_text() != text]
        print("stale: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0
