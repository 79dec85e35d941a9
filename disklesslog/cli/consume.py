"""``consume``: print a stream's records as JSON lines or raw values, once or following
new records until stopped (Ctrl-C, SIGTERM and a closed pipe end it quietly)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any, BinaryIO

from ..api import Stream
from ..errors import StreamNotFound
from ..records import Record
from .args import Position, from_position, offset, positive_seconds
from .common import EXIT_OK
from .jsonlines import json_line
from .logs import open_log

__all__ = ["add_command", "json_line", "raw_line"]

POLL_INTERVAL = 0.1


def add_command(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``consume`` on ``commands`` (argparse subparsers)."""
    consume = commands.add_parser(
        "consume",
        parents=[log_options],
        help="print records",
        description="Print records from --from (default: the start offset) up to --to "
        "(exclusive; default: the end offset, or forever with --follow). Ctrl-C, SIGTERM "
        "and a closed pipe end it quietly with exit code 0.",
    )
    consume.add_argument("url", metavar="URL")
    consume.add_argument("stream", metavar="STREAM")
    consume.add_argument(
        "--from",
        dest="start",
        metavar="N",
        type=from_position,
        default="start",
        help="first offset, or 'start' (default) or 'end' (only new records, with --follow)",
    )
    consume.add_argument("--to", metavar="N", type=offset, help="stop before offset N")
    consume.add_argument("--max", metavar="N", type=offset, help="print at most N records")
    consume.add_argument(
        "--follow", action="store_true", help="keep waiting for new records (Ctrl-C stops)"
    )
    consume.add_argument(
        "--idle-timeout",
        metavar="SECONDS",
        type=positive_seconds,
        help="with --follow: stop after SECONDS without a new record",
    )
    consume.add_argument(
        "--format",
        choices=("json", "raw"),
        default="json",
        help="json: one object per line (default; bytes that are not UTF-8 appear as "
        "key_base64/value_base64); raw: the value bytes and a newline",
    )
    consume.set_defaults(handler=_cmd_consume, interrupted=EXIT_OK)


def _cmd_consume(args: argparse.Namespace) -> int:
    encode = json_line if args.format == "json" else raw_line
    out: BinaryIO = sys.stdout.buffer
    with open_log(args, create=False) as log:
        stream = log.stream(args.stream)
        if args.follow:
            with _sigterm_as_interrupt():
                _write_all(out, map(encode, _follow(stream, args)), flush_each=True)
        else:
            start = _resolve(stream, args.start)
            records = stream.read(start, args.to, max_records=args.max)
            _write_all(out, map(encode, records), flush_each=False)
    return EXIT_OK


def _write_all(out: BinaryIO, lines: Iterable[bytes], *, flush_each: bool) -> None:
    """Write to the binary stdout; flush per line only when tailing (so a pipe sees
    records as they land) and once at the end otherwise."""
    for line in lines:
        out.write(line)
        if flush_each:
            out.flush()
    out.flush()


def _resolve(stream: Stream, position: Position) -> int:
    if position == "start":
        return stream.start_offset
    if position == "end":
        return stream.end_offset
    return position


def _follow(stream: Stream, args: argparse.Namespace) -> Iterator[Record]:
    """Records from ``--from`` on as they land, stopping at ``--to``/``--max``/idle timeout."""
    if not _wait_for_stream(stream, args.idle_timeout):
        return
    start = _resolve(stream, args.start)
    to: int | None = args.to
    if args.max == 0 or (to is not None and start >= to):
        return
    tail = stream.follow(start, poll_interval=POLL_INTERVAL, idle_timeout=args.idle_timeout)
    for count, record in enumerate(tail, 1):
        if to is not None and record.offset >= to:
            return
        yield record
        if count == args.max or (to is not None and record.offset + 1 >= to):
            return


def _wait_for_stream(stream: Stream, timeout: float | None) -> bool:
    """Wait until the stream exists, so ``--follow`` can start before the first producer;
    False if ``timeout`` seconds pass first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            _ = stream.end_offset
        except StreamNotFound:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL)
        else:
            return True


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While tailing, treat SIGTERM (supervisors, ``kill``) like Ctrl-C: a clean exit 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def raw_line(record: Record) -> bytes:
    """The value bytes and a newline (a tombstone prints as an empty line)."""
    return (record.value or b"") + b"\n"
