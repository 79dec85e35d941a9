"""What every command of ``disklesslog`` shares: the program's name and exit codes, and
the error a command raises for a mistake it detects itself (``main`` prints it as one
``disklesslog: error: ...`` line)."""

from __future__ import annotations

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "PROG", "CliError"]

PROG = "disklesslog"
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130


class CliError(Exception):
    """A mistake the command itself detects (e.g. a produce line without a key separator)."""
