"""``produce``: append one record per line of standard input, in atomic chunks written
as soon as they are full or their first line has waited ``--linger-ms``, and say on
stderr what was written (also when a chunk fails or the run is interrupted)."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ..api import Stream
from ..config import StreamConfig
from ..errors import DisklessLogError, StreamNotFound
from ..format import now_ms
from ..names import validate_stream_name
from ..records import Header
from .args import header, key_separator, milliseconds, positive
from .common import EXIT_INTERRUPTED, EXIT_OK, PROG, CliError
from .jsonlines import NewRecord, parse_json_line
from .logs import open_log

__all__ = ["add_command"]

DEFAULT_CHUNK_LINES = 1000
DEFAULT_LINGER_MS = 100
PER_RECORD_OVERHEAD = 32
"""Bytes budgeted per record for encoding (msgpack lengths, timestamp deltas) on top of
its key and value, so a produce chunk stays under the stream's ``max_batch_bytes``."""
PER_HEADER_OVERHEAD = 16
"""Bytes budgeted per header on top of its name and value (msgpack lengths of the pair)."""
READ_SIZE = 1 << 16
"""Bytes asked of standard input per read: one read returns what has arrived, up to this."""
MAX_WAIT = 3600.0
"""Seconds one ``select`` waits at most; a longer ``--linger-ms`` waits in several (a
timeout of about 300 years or more overflows it)."""

Parse = Callable[[bytes, int, int], NewRecord]
"""Turns line N (without its newline) into a record; the third argument is the first
line of the chunk it would join, for the error message."""


def add_command(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``produce`` on ``commands`` (argparse subparsers)."""
    produce = commands.add_parser(
        "produce",
        parents=[log_options],
        help="append one record per stdin line",
        description="Append one record per line of standard input (bytes as read; only "
        "the trailing newline is removed), or one JSON object per line with --format json. "
        "Lines are appended in atomic chunks, each written as soon as it has --batch-size "
        "lines or its first line has waited --linger-ms, so live input (tail -f) is stored "
        "as it comes. Creates the log and stream if needed.",
    )
    produce.add_argument("url", metavar="URL")
    produce.add_argument("stream", metavar="STREAM")
    produce.add_argument(
        "--format",
        choices=("lines", "json"),
        default="lines",
        help="lines: each line is a value (default); json: each line is an object "
        '{"key", "value", "headers", "timestamp"} as consume --format json prints it',
    )
    produce.add_argument(
        "--key-sep",
        metavar="SEP",
        type=key_separator,
        help="with --format lines: split each line at the first SEP into key and value; a "
        "line without SEP is an error and nothing from its chunk on is written",
    )
    produce.add_argument(
        "-H",
        "--header",
        metavar="KEY=VALUE",
        type=header,
        action="append",
        default=[],
        help="add this header to every record (repeatable)",
    )
    produce.add_argument(
        "--batch-size",
        metavar="N",
        type=positive,
        default=DEFAULT_CHUNK_LINES,
        help=f"write a chunk once it has N lines (default {DEFAULT_CHUNK_LINES})",
    )
    produce.add_argument(
        "--linger-ms",
        metavar="MS",
        type=milliseconds,
        default=DEFAULT_LINGER_MS,
        help="write a chunk at the latest MS milliseconds (or a duration: 2s) after its "
        "first line arrived, "
        f"even if no more input follows (default {DEFAULT_LINGER_MS})",
    )
    produce.set_defaults(handler=_cmd_produce, interrupted=EXIT_INTERRUPTED)


@dataclass
class _Chunk:
    """Records gathered for one atomic ``append_batch``, as its columns."""

    first_line: int
    deadline: float
    """When the chunk must be written (``time.monotonic()``): its first line's arrival
    plus the linger."""
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[tuple[Header, ...]] = field(default_factory=list)
    timestamps: list[int | None] = field(default_factory=list)
    size: int = 0

    def add(self, record: NewRecord, size: int) -> None:
        self.keys.append(record.key)
        self.values.append(record.value)
        self.headers.append(record.headers)
        self.timestamps.append(record.timestamp)
        self.size += size

    def stamped(self) -> list[int] | None:
        """The timestamps column: ``None`` (the append stamps all) when no line gave one,
        else one per record, now for those that gave none."""
        if all(ts is None for ts in self.timestamps):
            return None
        now = now_ms()
        return [now if ts is None else ts for ts in self.timestamps]


@dataclass
class _Produced:
    """What a produce run has made durable so far (reported even when it fails)."""

    count: int = 0
    first: int | None = None
    last: int | None = None
    unsure: str | None = None
    """The lines whose append a second Ctrl-C cut short: stored or not, nobody knows."""

    def add(self, offsets: list[int]) -> None:
        if offsets:
            self.first = offsets[0] if self.first is None else self.first
            self.last = offsets[-1]
            self.count += len(offsets)


def _cmd_produce(args: argparse.Namespace) -> int:
    if args.key_sep is not None and args.format == "json":
        raise CliError("--key-sep applies to --format lines; a JSON line gives its own key")
    validate_stream_name(args.stream)  # before the log is created: a bad name leaves none
    parse = _json_parser(args.header) if args.format == "json" else _line_parser(args)
    with open_log(args, create=True) as log:
        stream = log.stream(args.stream)
        produced = _Produced()
        try:
            _produce(stream, _input_lines(), parse, args, produced)
        finally:
            print(_produced_message(stream.name, produced), file=sys.stderr)
    return EXIT_OK


def _input_lines() -> _Lines:
    """Standard input as bytes (binary-safe: no decoding, no newline translation)."""
    if sys.stdin is None:
        raise CliError("there is no standard input to read records from")
    if sys.stdin.isatty():
        print(f"{PROG}: reading one record per line; end with Ctrl-D", file=sys.stderr)
    return _Lines(sys.stdin)


def _produced_message(name: str, produced: _Produced) -> str:
    plural = "" if produced.count == 1 else "s"
    where = "" if produced.first is None else f" (offsets {produced.first}..{produced.last})"
    unsure = (
        ""
        if produced.unsure is None
        else f"; stopped while writing lines {produced.unsure}, which may or may not be stored"
    )
    return f"{PROG}: wrote {produced.count} record{plural} to {name!r}{where}{unsure}"


class _Lines:
    """The lines of standard input as they arrive, without their newlines, waiting for
    the next one no longer than the caller can afford.

    A blocking ``readline`` would keep a chunk unwritten until the next line arrives
    (forever, on a quiet ``tail -f``). So this waits with ``select`` on the file
    descriptor (pipes, terminals, sockets; a regular file or an in-memory stream is
    always ready) and then takes whatever one read returns, splitting lines itself. A last
    line without a newline is still a line.
    """

    def __init__(self, stdin: Any) -> None:
        self._read: Callable[[int], bytes] = stdin.buffer.read1
        self._fd = _waitable_fd(stdin)
        self._lines: deque[bytes] = deque()
        self._partial = bytearray()
        self._ended = False

    @property
    def finished(self) -> bool:
        """True once input has ended and every line was taken."""
        return self._ended and not self._lines

    def next_line(self, deadline: float | None) -> bytes | None:
        """The next line, or ``None`` if input has ended (see :attr:`finished`) or the
        lines read so far are used up and ``deadline`` (``time.monotonic()``; ``None``:
        none) has passed. Lines that arrived together are returned before the deadline is
        looked at, so a due chunk still takes all of them (up to its size)."""
        while not self._lines:
            if self._ended or (deadline is not None and time.monotonic() >= deadline):
                return None
            if self._wait(deadline):
                self._take(self._read(READ_SIZE))
        return self._lines.popleft()

    def _wait(self, deadline: float | None) -> bool:
        """Whether input is ready, after waiting until ``deadline`` at most (``MAX_WAIT``
        at a time)."""
        if self._fd is None:
            return True
        timeout = None if deadline is None else deadline - time.monotonic()
        ready, _, _ = select.select(
            [self._fd], [], [], None if timeout is None else min(max(0.0, timeout), MAX_WAIT)
        )
        return bool(ready)

    def _take(self, block: bytes) -> None:
        if not block:  # end of input
            self._ended = True
            if self._partial:
                self._lines.append(bytes(self._partial))
            return
        if b"\n" not in block:
            self._partial += block
            return
        lines = block.split(b"\n")
        if self._partial:
            lines[0] = bytes(self._partial) + lines[0]
        self._partial = bytearray(lines.pop())
        self._lines.extend(lines)


def _waitable_fd(stdin: Any) -> int | None:
    """The file descriptor to wait on with ``select``, or ``None`` when reads never wait
    long: a regular file, or a stream without a descriptor (a program embedding ``main``
    may have replaced ``sys.stdin`` with one)."""
    try:
        fd: int = stdin.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None
    return None if stat.S_ISREG(os.fstat(fd).st_mode) else fd


def _line_parser(args: argparse.Namespace) -> Parse:
    """``--format lines``: the line is the value, or ``KEY SEP VALUE`` with ``--key-sep``."""
    sep: bytes | None = args.key_sep
    headers: tuple[Header, ...] = tuple(args.header)

    def parse(line: bytes, number: int, chunk_start: int) -> NewRecord:
        if sep is None:
            return NewRecord(None, line, headers, None)
        key, found, value = line.partition(sep)
        if not found:
            raise CliError(
                f"line {number} has no key separator {os.fsdecode(sep)!r}; "
                f"nothing from line {chunk_start} on was written"
            )
        return NewRecord(key, value, headers, None)

    return parse


def _json_parser(extra: list[Header]) -> Parse:
    """``--format json``: one object per line as ``consume --format json`` prints it;
    ``-H`` headers follow the line's own."""
    headers: tuple[Header, ...] = tuple(extra)

    def parse(line: bytes, number: int, chunk_start: int) -> NewRecord:
        try:
            record = parse_json_line(line)
        except ValueError as exc:
            raise CliError(
                f"line {number}: {exc}; nothing from line {chunk_start} on was written"
            ) from None
        return record._replace(headers=record.headers + headers) if headers else record

    return parse


def _produce(
    stream: Stream, lines: _Lines, parse: Parse, args: argparse.Namespace, out: _Produced
) -> None:
    """Append ``lines`` in chunks of at most ``--batch-size`` lines and about half of the
    stream's ``max_batch_bytes``: one atomic batch per chunk instead of one per line. A
    chunk is written as soon as it is full, or ``--linger-ms`` after its first line
    arrived, or at the end of input, whichever comes first."""
    budget = _chunk_budget(stream)
    chunk_lines: int = args.batch_size
    linger = args.linger_ms / 1000
    chunk: _Chunk | None = None
    number = 0
    while True:
        line = lines.next_line(None if chunk is None else chunk.deadline)
        if line is None:
            if chunk is not None:
                _append_chunk(stream, chunk, out)
                chunk = None
            if lines.finished:
                return
            continue
        number += 1
        record = parse(line, number, number if chunk is None else chunk.first_line)
        size = _record_size(record)
        if chunk is not None and chunk.size + size > budget:
            _append_chunk(stream, chunk, out)
            chunk = None
        if chunk is None:
            chunk = _Chunk(first_line=number, deadline=time.monotonic() + linger)
        chunk.add(record, size)
        if len(chunk.values) >= chunk_lines:
            _append_chunk(stream, chunk, out)
            chunk = None


def _record_size(record: NewRecord) -> int:
    size = len(record.key or b"") + len(record.value or b"") + PER_RECORD_OVERHEAD
    for name, value in record.headers:
        size += len(name.encode("utf-8")) + len(value or b"") + PER_HEADER_OVERHEAD
    return size


def _chunk_budget(stream: Stream) -> int:
    """Half the stream's ``max_batch_bytes`` (a new stream gets the defaults)."""
    try:
        config = stream.config
    except StreamNotFound:
        config = StreamConfig()
    return config.max_batch_bytes // 2


def _append_chunk(stream: Stream, chunk: _Chunk, out: _Produced) -> None:
    lines = f"{chunk.first_line}..{chunk.first_line + len(chunk.values) - 1}"
    counted = False
    try:
        with _ctrl_c_after_append():
            offsets = stream.append_batch(
                chunk.values, keys=chunk.keys, headers=chunk.headers, timestamps=chunk.stamped()
            )
            out.add(offsets)
            counted = True
    except DisklessLogError as exc:
        raise CliError(f"lines {lines} were not written (nor any later line): {exc}") from exc
    except KeyboardInterrupt:
        if not counted:
            out.unsure = lines
        raise


@contextlib.contextmanager
def _ctrl_c_after_append() -> Iterator[None]:
    """Hold a Ctrl-C that arrives while a chunk is appended until the append is done, so
    the report says exactly what was written; a second Ctrl-C stops at once (the report
    then says which lines may or may not be stored)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return
    pressed = False

    def hold(signum: int, frame: FrameType | None) -> None:
        nonlocal pressed
        if pressed:
            raise KeyboardInterrupt
        pressed = True

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    if pressed:
        raise KeyboardInterrupt
