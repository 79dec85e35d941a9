"""The ``disklesslog`` command: inspect, feed, read and check logs from a shell.

Every subcommand opens the log at a URL, does one thing and closes it. Only ``produce``
and ``create`` create a log, so a mistyped path is an error instead of a new empty log.
Failures a user can cause (bad URL, bad stream name, missing stream, offsets out of
range, permissions) print one line ``disklesslog: error: ...`` and exit 1; usage
errors exit 2 (argparse). See ``docs/cli.md`` for the reference.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable

from .. import __version__
from ..errors import DisklessLogError
from . import admin, consume, groups, maintenance, produce, repair, streams, verify
from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, PROG, CliError
from .logs import log_options

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (public so docs and tests can render the help)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, produce to, consume from and verify disklesslog logs.",
        epilog="URL is a log directory, a file:// URL, or another URL a backend supports.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    options = log_options()
    streams.add_commands(commands, options)
    admin.add_commands(commands, options)
    produce.add_command(commands, options)
    consume.add_command(commands, options)
    verify.add_command(commands, options)
    groups.add_command(commands, options)
    maintenance.add_commands(commands, options)
    repair.add_command(commands, options)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    try:
        args = _parse(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    _show_library_warnings()
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except BrokenPipeError:  # the reader went away (`| head`): not an error
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        code: int = getattr(args, "interrupted", EXIT_INTERRUPTED)
        return code
    except (CliError, DisklessLogError, OSError) as exc:
        _print_error(exc)
        return EXIT_ERROR


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; usage errors raise ``SystemExit(2)`` as argparse does."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "idle_timeout", None) is not None and not args.follow:
        parser.error("--idle-timeout needs --follow")
    check: Callable[[argparse.Namespace], None] | None = getattr(args, "check_usage", None)
    if check is not None:  # a command's rules about which options go together
        check(args)
    return args


def _show_library_warnings() -> None:
    """Print what the library logs (e.g. a damaged segment found on open) as
    ``disklesslog: logged warning: ...`` lines, unless the host program set up logging.

    "logged" tells these apart from the command's own final ``disklesslog: error:``."""
    logger = logging.getLogger("disklesslog")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_WarningFormatter())
    logger.addHandler(handler)


class _WarningFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{PROG}: logged {record.levelname.lower()}: {record.getMessage()}"


def _print_error(exc: BaseException) -> None:
    """One line on stderr, never a traceback: the message of a library error already
    says what went wrong and what to do."""
    message = " ".join(str(exc).splitlines()) or type(exc).__name__
    print(f"{PROG}: error: {message}", file=sys.stderr)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
