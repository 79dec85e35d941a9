"""What every command of ``disklesslog`` shares: the program's name and exit codes, the
error a command raises for a mistake it detects itself (``main`` prints it as one
``disklesslog: error: ...`` line), and how tables are printed."""

from __future__ import annotations

from typing import Any

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "PROG", "CliError", "table"]

PROG = "disklesslog"
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130


class CliError(Exception):
    """A mistake the command itself detects (e.g. a produce line without a key separator)."""


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Right-aligned numbers, left-aligned last column, two spaces of indent."""
    cells = [header, *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  " + "  ".join(c.rjust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1]
        for row in cells
    ]
