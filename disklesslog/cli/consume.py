"""``consume``: print the records of one or more streams as JSON lines or raw values,
once or following new records until stopped (Ctrl-C, SIGTERM and a closed pipe end it
quietly), optionally resuming from and committing as a consumer group."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, BinaryIO

from ..api import AbstractLog, Stream
from ..errors import StreamNotFound
from ..records import Record
from .args import FromEnd, from_position, offset, positive_seconds, timestamp_ms
from .common import EXIT_OK
from .jsonlines import json_line
from .logs import open_log

__all__ = ["add_command", "json_line", "raw_line"]

_log = logging.getLogger(__name__)

POLL_INTERVAL = 0.1
FETCH_RECORDS = 1000
"""Records read from one stream before the next stream's turn while following."""
COMMIT_INTERVAL = 5.0
"""Seconds between a following group consumer's commits (Kafka's auto-commit default)."""


def add_command(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``consume`` on ``commands`` (argparse subparsers)."""
    consume = commands.add_parser(
        "consume",
        parents=[log_options],
        help="print records",
        description="Print records of each STREAM from --from (default: the start offset) "
        "up to --to (exclusive; default: the end offset, or forever with --follow). With "
        "--group, each stream resumes where the group's committed position is and the "
        "group's positions are committed. Ctrl-C, SIGTERM and a closed pipe end it quietly "
        "with exit code 0.",
    )
    consume.add_argument("url", metavar="URL")
    consume.add_argument("streams", metavar="STREAM", nargs="+")
    where = consume.add_mutually_exclusive_group()
    where.add_argument(
        "--from",
        dest="start",
        metavar="N",
        type=from_position,
        default="start",
        help="first offset N, -N (N offsets before the end), 'start' (default) or 'end' "
        "(only new records, with --follow)",
    )
    where.add_argument(
        "--from-time",
        metavar="TIME",
        type=timestamp_ms,
        help="the first record at or after TIME (ISO 8601, e.g. 2024-05-01T12:00:00Z, "
        "or ms since the epoch)",
    )
    consume.add_argument("--to", metavar="N", type=offset, help="stop before offset N")
    consume.add_argument("--max", metavar="N", type=offset, help="print at most N records")
    consume.add_argument(
        "--follow", action="store_true", help="keep waiting for new records (Ctrl-C stops)"
    )
    consume.add_argument(
        "--idle-timeout",
        metavar="DURATION",
        type=positive_seconds,
        help="with --follow: stop after DURATION without a new record (seconds, or 30s, 5m)",
    )
    consume.add_argument(
        "--group",
        metavar="G",
        help="resume each stream at consumer group G's committed position (--from/"
        "--from-time apply to streams G has none for) and commit G's positions",
    )
    consume.add_argument(
        "--format",
        choices=("json", "raw"),
        default="json",
        help="json: one object per line (default; with a 'stream' key; bytes that are not "
        "UTF-8 appear as key_base64/value_base64); raw: the value bytes and a newline, "
        "after STREAM and a tab when several streams are given",
    )
    consume.set_defaults(handler=_cmd_consume, interrupted=EXIT_OK)


def _cmd_consume(args: argparse.Namespace) -> int:
    names = list(dict.fromkeys(args.streams))
    out: BinaryIO = sys.stdout.buffer
    with open_log(args, create=False) as log:
        reader = _Reader(log, names, args, _encoder(args.format, several=len(names) > 1))
        try:
            if args.follow:
                with _sigterm_as_interrupt():
                    reader.follow(out)
            else:
                reader.once(out)
        finally:
            reader.commit()
    return EXIT_OK


def _encoder(format_name: str, *, several: bool) -> Callable[[str, Record], bytes]:
    """How one record becomes a line: JSON always names its stream; raw values do when
    several streams share the output (the name and a tab first)."""
    if format_name == "json":
        return lambda name, record: json_line(record, name)
    if several:
        return lambda name, record: name.encode("ascii") + b"\t" + raw_line(record)
    return lambda name, record: raw_line(record)


class _Reader:
    """Where each stream is read from and up to, and (with ``--group``) what is committed.

    A stream's position moves past a record only once its line is written (and, when
    following, flushed), so a group never commits a record it did not print."""

    def __init__(
        self,
        log: AbstractLog,
        names: list[str],
        args: argparse.Namespace,
        encode: Callable[[str, Record], bytes],
    ) -> None:
        self._log = log
        self._handles = {name: log.stream(name) for name in names}  # validates the names
        self._args = args
        self._encode = encode
        self._group: str | None = args.group
        self._committed = {} if args.group is None else log.committed_offsets(args.group)
        self._positions: dict[str, int] = {}  # streams found so far: the next offset to print
        self._to: int | None = args.to
        self._left: int | None = args.max  # records still to print

    # ---------------------------------------------------------------- reading

    def once(self, out: BinaryIO) -> None:
        """Print each stream's records up to ``--to`` or its end offset, stream after
        stream; positions count once the output is flushed."""
        done: dict[str, int] = {}
        for name, handle in self._handles.items():
            start = self._resolve(name, handle)
            if self._left == 0:
                break
            for record in handle.read(start, self._to, max_records=self._left):
                out.write(self._encode(name, record))
                done[name] = record.offset + 1
                if self._left is not None:
                    self._left -= 1
        out.flush()
        self._positions.update(done)

    def follow(self, out: BinaryIO) -> None:
        """Print records as they land, streams taking turns, until every stream reached
        ``--to``, ``--max`` records were printed or ``--idle-timeout`` passed without one;
        streams that do not exist yet are waited for."""
        idle: float | None = self._args.idle_timeout
        idle_since = last_commit = time.monotonic()
        delay = 0.001
        while self._left != 0:
            progressed, finished = False, True
            for name, handle in self._handles.items():
                if name not in self._positions:
                    try:
                        self._positions[name] = self._resolve(name, handle)
                    except StreamNotFound:
                        finished = False
                        continue
                if self._to is not None and self._positions[name] >= self._to:
                    continue
                finished = False
                progressed |= self._print_new(name, handle, out)
                if self._left == 0:
                    return
            if finished:
                return
            now = time.monotonic()
            if self._group is not None and now - last_commit >= COMMIT_INTERVAL:
                self.commit()
                last_commit = now
            if progressed:
                idle_since, delay = now, 0.001
                continue
            if idle is not None and now - idle_since >= idle:
                return
            time.sleep(delay if idle is None else min(delay, max(0.0, idle_since + idle - now)))
            delay = min(delay * 2, POLL_INTERVAL)

    def _print_new(self, name: str, handle: Stream, out: BinaryIO) -> bool:
        """Print up to :data:`FETCH_RECORDS` new records of one stream, flushing each;
        whether there were any."""
        limit = FETCH_RECORDS if self._left is None else min(FETCH_RECORDS, self._left)
        try:
            records = handle.read(self._positions[name], self._to, max_records=limit)
        except StreamNotFound:  # deleted meanwhile: wait for it to come back
            del self._positions[name]
            return False
        printed = False
        for record in records:
            out.write(self._encode(name, record))
            out.flush()
            self._positions[name] = record.offset + 1
            printed = True
            if self._left is not None:
                self._left -= 1
        return printed

    def _resolve(self, name: str, handle: Stream) -> int:
        """Where ``name`` starts: the group's committed position (moved into the stream's
        range, as Kafka's auto.offset.reset does), else ``--from`` or ``--from-time``."""
        first, end = handle.start_offset, handle.end_offset
        committed = self._committed.get(name)
        if committed is not None and first <= committed <= end:
            return committed
        start = self._requested(handle, first, end)
        if committed is not None:
            _log.warning(
                "consumer group %r: its position %d in stream %r is outside the stream's "
                "offsets %d..%d (records were deleted, or the stream was recreated); "
                "starting at %d",
                self._group,
                committed,
                name,
                first,
                end,
                start,
            )
        return start

    def _requested(self, handle: Stream, first: int, end: int) -> int:
        """The start ``--from`` or ``--from-time`` asks for."""
        if self._args.from_time is not None:
            found = handle.offset_for_time(self._args.from_time)
            return end if found is None else max(found, first)
        position = self._args.start
        if position == "start":
            return first
        if position == "end":
            return end
        if isinstance(position, FromEnd):
            return max(first, end - position.count)
        start: int = position
        return start

    # ------------------------------------------------------------- committing

    def commit(self) -> None:
        """Commit the group's positions that moved (nothing without ``--group``)."""
        if self._group is None:
            return
        moved = {
            name: position
            for name, position in self._positions.items()
            if self._committed.get(name) != position
        }
        if moved:
            self._log.commit_offsets(self._group, moved)
            self._committed.update(moved)


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
