"""``produce``: append one record per line of standard input, in atomic chunks, and say
on stderr what was written (also when a chunk fails or the run is interrupted)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..api import Stream
from ..config import StreamConfig
from ..errors import DisklessLogError, StreamNotFound
from ..names import validate_stream_name
from .args import key_separator, positive
from .common import EXIT_INTERRUPTED, EXIT_OK, PROG, CliError
from .logs import open_log

__all__ = ["add_command"]

DEFAULT_CHUNK_LINES = 1000
PER_RECORD_OVERHEAD = 32
"""Bytes budgeted per record for encoding (msgpack lengths, timestamp deltas) on top of
its key and value, so a produce chunk stays under the stream's ``max_batch_bytes``."""


def add_command(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``produce`` on ``commands`` (argparse subparsers)."""
    produce = commands.add_parser(
        "produce",
        parents=[log_options],
        help="append one record per stdin line",
        description="Append one record per line of standard input (bytes as read; only "
        "the trailing newline is removed), in atomic chunks. Creates the log and stream "
        "if needed.",
    )
    produce.add_argument("url", metavar="URL")
    produce.add_argument("stream", metavar="STREAM")
    produce.add_argument(
        "--key-sep",
        metavar="SEP",
        type=key_separator,
        help="split each line at the first SEP into key and value; a line without SEP "
        "is an error and nothing from its chunk on is written",
    )
    produce.add_argument(
        "--batch-size",
        metavar="N",
        type=positive,
        default=DEFAULT_CHUNK_LINES,
        help=f"lines per atomic append (default {DEFAULT_CHUNK_LINES}; 1 for live input)",
    )
    produce.set_defaults(handler=_cmd_produce, interrupted=EXIT_INTERRUPTED)


@dataclass
class _Chunk:
    """Lines gathered for one atomic ``append_batch``."""

    first_line: int
    keys: list[bytes] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    size: int = 0


@dataclass
class _Produced:
    """What a produce run has made durable so far (reported even when it fails)."""

    count: int = 0
    first: int | None = None
    last: int | None = None

    def add(self, offsets: list[int]) -> None:
        if offsets:
            self.first = offsets[0] if self.first is None else self.first
            self.last = offsets[-1]
            self.count += len(offsets)


def _cmd_produce(args: argparse.Namespace) -> int:
    validate_stream_name(args.stream)  # before the log is created: a bad name leaves none
    with open_log(args, create=True) as log:
        stream = log.stream(args.stream)
        produced = _Produced()
        try:
            _produce(stream, _input_lines(), args.key_sep, args.batch_size, produced)
        finally:
            print(_produced_message(stream.name, produced), file=sys.stderr)
    return EXIT_OK


def _input_lines() -> BinaryIO:
    """Standard input as bytes (binary-safe: no decoding, no newline translation)."""
    if sys.stdin is None:
        raise CliError("there is no standard input to read records from")
    if sys.stdin.isatty():
        print(f"{PROG}: reading one record per line; end with Ctrl-D", file=sys.stderr)
    return sys.stdin.buffer


def _produced_message(name: str, produced: _Produced) -> str:
    plural = "" if produced.count == 1 else "s"
    where = "" if produced.first is None else f" (offsets {produced.first}..{produced.last})"
    return f"{PROG}: wrote {produced.count} record{plural} to {name!r}{where}"


def _produce(
    stream: Stream, lines: Iterable[bytes], sep: bytes | None, chunk_lines: int, out: _Produced
) -> None:
    """Append ``lines`` in chunks of at most ``chunk_lines`` lines and about half of the
    stream's ``max_batch_bytes``: one atomic batch per chunk instead of one per line.
    A chunk is appended as soon as it is full, before the next line is read: a live
    feed's lines land as they come, and a bad line never takes a full chunk with it."""
    budget = _chunk_budget(stream)
    chunk = _Chunk(first_line=1)
    for number, line in enumerate(lines, 1):
        key, value = _parse_line(line, sep, number, chunk.first_line)
        size = len(value) + len(key) + PER_RECORD_OVERHEAD
        if chunk.values and chunk.size + size > budget:
            _append_chunk(stream, chunk, sep is not None, out)
            chunk = _Chunk(first_line=number)
        chunk.keys.append(key)
        chunk.values.append(value)
        chunk.size += size
        if len(chunk.values) >= chunk_lines:
            _append_chunk(stream, chunk, sep is not None, out)
            chunk = _Chunk(first_line=number + 1)
    if chunk.values:
        _append_chunk(stream, chunk, sep is not None, out)


def _chunk_budget(stream: Stream) -> int:
    """Half the stream's ``max_batch_bytes`` (a new stream gets the defaults)."""
    try:
        config = stream.config
    except StreamNotFound:
        config = StreamConfig()
    return config.max_batch_bytes // 2


def _parse_line(
    line: bytes, sep: bytes | None, number: int, chunk_start: int
) -> tuple[bytes, bytes]:
    """``(key, value)`` of one input line; only its trailing ``\\n`` is removed."""
    if line.endswith(b"\n"):
        line = line[:-1]
    if sep is None:
        return b"", line
    key, found, value = line.partition(sep)
    if not found:
        raise CliError(
            f"line {number} has no key separator {os.fsdecode(sep)!r}; "
            f"nothing from line {chunk_start} on was written"
        )
    return key, value


def _append_chunk(stream: Stream, chunk: _Chunk, keyed: bool, out: _Produced) -> None:
    last_line = chunk.first_line + len(chunk.values) - 1
    try:
        offsets = stream.append_batch(chunk.values, keys=chunk.keys if keyed else None)
    except DisklessLogError as exc:
        raise CliError(
            f"lines {chunk.first_line}..{last_line} were not written (nor any later line): {exc}"
        ) from exc
    out.add(offsets)
