"""Plain-text tables for terminals and logs."""

from __future__ import annotations

from collections.abc import Sequence


def align_columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
