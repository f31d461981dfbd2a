"""Reading the files a user points the suite at (scenarios, topologies, rung files)."""

from __future__ import annotations

from pathlib import Path


def read_user_file(path: Path, what: str, where: str, error: type[ValueError]) -> str:
    """The file's text, or ``error`` naming the setting, the file and what is wrong with it."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{where}: {what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: {what} {str(path)!r} is not UTF-8 text: {exc}") from None
