"""Writing a file whole: a hidden temporary file beside it, then ``os.replace``.

A reader never sees half a file, and a write that fails (a full disk, a folder that turned
read-only) leaves the old file as it was and no temporary file behind: OSError says why.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` whole, readable by all (``mode``)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    write_via_temporary(path, lambda temporary: temporary.write_bytes(data), mode)


def write_via_temporary(path: Path, write: Callable[[Path], object], mode: int = 0o644) -> None:
    """``write`` a temporary file beside ``path``, flush it to disk, then rename it over ``path``."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        os.close(descriptor)
        write(temporary)
        with temporary.open("rb+") as f:
            os.fsync(f.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
