"""The ``disklesslog`` command: inspect, feed, read and check logs from a shell.

Every subcommand opens the log at a URL, does one thing and closes it. Read commands
open with ``create=False`` so a mistyped path is an error instead of a new empty log.
Failures a user can cause (bad URL, bad stream name, missing stream, offsets out of
range, permissions) print one line ``disklesslog: error: ...`` and exit 1; usage
errors exit 2 (argparse). See ``docs/cli.md`` for the reference.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO, Literal

from . import __version__
from . import open as open_log
from .api import AbstractLog as Log
from .api import Stream, StreamInfo, validate_stream_name
from .config import StreamConfig
from .errors import CorruptDataError, DisklessLogError, StreamNotFound
from .maintenance import cli as maintenance_commands
from .records import Record

__all__ = ["main"]

PROG = "disklesslog"
DEFAULT_CHUNK_LINES = 1000
PER_RECORD_OVERHEAD = 32
"""Bytes budgeted per record for encoding (msgpack lengths, timestamp deltas) on top of
its key and value, so a produce chunk stays under the stream's ``max_batch_bytes``."""
POLL_INTERVAL = 0.1
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130

Position = int | Literal["start", "end"]


class CliError(Exception):
    """A mistake the command itself detects (e.g. a produce line without a key separator)."""


# --------------------------------------------------------------------------- parsing


def _offset(text: str) -> int:
    """argparse type: a non-negative offset or count (a negative one is a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _positive(text: str) -> int:
    value = _offset(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _position(text: str) -> Position:
    """argparse type for ``--from``: an offset, or ``start``/``end`` of the stream."""
    if text in ("start", "end"):
        return "start" if text == "start" else "end"
    return _offset(text)


def _key_separator(text: str) -> bytes:
    """argparse type for ``--key-sep``: bytes as given on the command line (binary-safe
    through the filesystem encoding's surrogateescape)."""
    if not text:
        raise argparse.ArgumentTypeError("the key separator must not be empty")
    return os.fsencode(text)


def _storage_option(text: str) -> tuple[str, Any]:
    """argparse type: ``KEY=VALUE``; VALUE is JSON when it parses (numbers, true,
    objects), else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _log_options() -> argparse.ArgumentParser:
    """Options every command takes to reach a log on object storage."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("object storage")
    group.add_argument(
        "--backend",
        choices=("segments", "objects"),
        help="force a backend (a path or file:// URL opens segments unless 'objects')",
    )
    group.add_argument(
        "--sequencer", metavar="URL", help="the log's sequencer, e.g. sqlite:///path/meta.db"
    )
    group.add_argument(
        "--storage-option",
        metavar="KEY=VALUE",
        type=_storage_option,
        action="append",
        default=[],
        help="an fsspec storage option (repeatable), e.g. anon=true or "
        'client_kwargs={"endpoint_url": "http://127.0.0.1:9000"}',
    )
    tiering = options.add_argument_group("tiering (local logs)")
    tiering.add_argument(
        "--tier-url",
        metavar="URL",
        help="where the log's closed segments are tiered, e.g. s3://bucket/prefix; recorded "
        "in the log the first time, so later commands need not repeat it",
    )
    tiering.add_argument(
        "--tier-storage-option",
        metavar="KEY=VALUE",
        type=_storage_option,
        action="append",
        default=[],
        help="an fsspec storage option of the tier (repeatable; never recorded)",
    )
    return options


def _open_log(args: argparse.Namespace, *, create: bool) -> Log:
    """Open the log a command names, with the connection options it was given."""
    options: dict[str, Any] = {"create": create}
    if args.backend is not None:
        options["backend"] = args.backend
    if args.sequencer is not None:
        options["sequencer"] = args.sequencer
    if args.storage_option:
        options["storage_options"] = dict(args.storage_option)
    if args.tier_url is not None:
        options["tier_url"] = args.tier_url
    if args.tier_storage_option:
        options["tier_storage_options"] = dict(args.tier_storage_option)
    return open_log(args.url, **options)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (public so docs and tests can render the help)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, produce to, consume from and verify disklesslog logs.",
        epilog="URL is a log directory, a file:// URL, or another URL a backend supports.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    log_options = _log_options()

    streams = commands.add_parser(
        "streams", parents=[log_options], help="list the streams of a log, one per line"
    )
    streams.add_argument("url", metavar="URL")
    streams.set_defaults(handler=_cmd_streams)

    describe = commands.add_parser(
        "describe",
        parents=[log_options],
        help="show a stream's extent, config, segments; or every stream's size",
        description="With STREAM: its extent, config and segments (local) or objects. "
        "Without: one line per stream with its records, bytes and segment or object count.",
    )
    describe.add_argument("url", metavar="URL")
    describe.add_argument("stream", metavar="STREAM", nargs="?")
    describe.add_argument("--json", action="store_true", help="print one JSON object")
    describe.set_defaults(handler=_cmd_describe)

    _add_produce(commands, log_options)
    _add_consume(commands, log_options)

    verify = commands.add_parser(
        "verify", parents=[log_options], help="checksum every batch; exit 1 on corruption"
    )
    verify.add_argument("url", metavar="URL")
    verify.add_argument("--stream", metavar="S", help="check only this stream")
    verify.set_defaults(handler=_cmd_verify)
    maintenance_commands.add_commands(commands, log_options, _open_log)
    return parser


def _add_produce(commands: Any, log_options: argparse.ArgumentParser) -> None:
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
        type=_key_separator,
        help="split each line at the first SEP into key and value; a line without SEP "
        "is an error and nothing from its chunk on is written",
    )
    produce.add_argument(
        "--batch-size",
        metavar="N",
        type=_positive,
        default=DEFAULT_CHUNK_LINES,
        help=f"lines per atomic append (default {DEFAULT_CHUNK_LINES}; 1 for live input)",
    )
    produce.set_defaults(handler=_cmd_produce, interrupted=EXIT_INTERRUPTED)


def _add_consume(commands: Any, log_options: argparse.ArgumentParser) -> None:
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
        type=_position,
        default="start",
        help="first offset, or 'start' (default) or 'end' (only new records, with --follow)",
    )
    consume.add_argument("--to", metavar="N", type=_offset, help="stop before offset N")
    consume.add_argument("--max", metavar="N", type=_offset, help="print at most N records")
    consume.add_argument(
        "--follow", action="store_true", help="keep waiting for new records (Ctrl-C stops)"
    )
    consume.add_argument(
        "--idle-timeout",
        metavar="SECONDS",
        type=_seconds,
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


# ------------------------------------------------------------------------------ main


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


# -------------------------------------------------------------------- streams, describe


def _cmd_streams(args: argparse.Namespace) -> int:
    with _open_log(args, create=False) as log:
        names = log.streams()
    for name in names:
        print(name)
    return EXIT_OK


def _cmd_describe(args: argparse.Namespace) -> int:
    if args.stream is None:
        return _describe_log(args)
    with _open_log(args, create=False) as log:
        info = log.stream(args.stream).info()
    if args.json:
        print(json.dumps(describe_dict(info), indent=2, default=str))
    else:
        print("\n".join(describe_lines(info)))
    return EXIT_OK


def _describe_log(args: argparse.Namespace) -> int:
    """``describe URL``: every stream's extent and size, and how many segments or objects
    hold it, with a total line."""
    with _open_log(args, create=False) as log:
        infos = [log.stream(name).info() for name in log.streams()]
    rows = []
    for info in infos:
        parts = info.details.get("objects", len(info.details.get("segments", [])))
        rows.append(
            {
                "stream": info.name,
                "start_offset": info.start_offset,
                "end_offset": info.end_offset,
                "records": info.end_offset - info.start_offset,
                "bytes": info.size_bytes,
                "objects" if "objects" in info.details else "segments": parts,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    unit = "objects" if any("objects" in r for r in rows) else "segments"
    total = ["(total)", "", "", sum(r["records"] for r in rows), sum(r["bytes"] for r in rows)]
    lines = _table(
        [unit, "start", "end", "records", "bytes", "stream"],
        [
            [
                r.get(unit, 0),
                r["start_offset"],
                r["end_offset"],
                r["records"],
                r["bytes"],
                r["stream"],
            ]
            for r in rows
        ]
        + [["", *total[1:], total[0]]],
    )
    print("\n".join(lines) if rows else "no streams")
    held = [info.name for info in infos if info.details.get("pending_transactions")]
    if held:
        print(
            f"held back by a two-phase commit in progress or interrupted: {', '.join(held)} "
            "(`describe URL STREAM` shows it; docs/operations.md, section 7)"
        )
    return EXIT_OK


def describe_dict(info: StreamInfo) -> dict[str, Any]:
    """``describe --json``: the extent, config and (local backend) segments of a stream."""
    details = dict(info.details)
    segments = details.pop("segments", [])
    facts = {
        "stream": info.name,
        "start_offset": info.start_offset,
        "end_offset": info.end_offset,
        "records": info.end_offset - info.start_offset,
        "bytes": info.size_bytes,
        "config": info.config.to_dict(),
        "segments": segments,
        "details": details,
    }
    if "tiered" in details:  # a local stream with segments in object storage
        facts["tiered"] = details.pop("tiered")
    return facts


def describe_lines(info: StreamInfo) -> list[str]:
    """``describe``: a human-readable block; segments as an aligned table."""
    facts = describe_dict(info)
    lines = [f"{label:<13} {facts[key]}" for label, key in _DESCRIBE_FIELDS]
    lines += [f"{key + ':':<13} {value}" for key, value in facts["details"].items()]
    lines.append("config:")
    width = max(map(len, facts["config"]))
    lines += [f"  {key:<{width}}  {value}" for key, value in facts["config"].items()]
    if "segments" in info.details:  # the local backend
        lines.append(f"segments:     {len(facts['segments'])}")
    if facts["segments"]:
        lines += _table(
            ["base offset", "end offset", "bytes", "file"],
            [[s["base_offset"], s["end_offset"], s["bytes"], s["file"]] for s in facts["segments"]],
        )
    if "tiered" in facts:
        lines.append(f"tiered:       {len(facts['tiered'])}")
        if facts["tiered"]:
            lines += _table(
                ["base offset", "end offset", "bytes", "state", "object"],
                [
                    [s["base_offset"], s["end_offset"], s["bytes"], s["state"], s["object"]]
                    for s in facts["tiered"]
                ],
            )
    return lines


_DESCRIBE_FIELDS = [
    ("stream:", "stream"),
    ("start offset:", "start_offset"),
    ("end offset:", "end_offset"),
    ("records:", "records"),
    ("bytes:", "bytes"),
]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Right-aligned numbers, left-aligned last column, two spaces of indent."""
    cells = [header, *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  " + "  ".join(c.rjust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1]
        for row in cells
    ]


# --------------------------------------------------------------------------- produce


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
    with _open_log(args, create=True) as log:
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
    stream's ``max_batch_bytes``: one atomic batch per chunk instead of one per line."""
    budget = _chunk_budget(stream)
    chunk = _Chunk(first_line=1)
    for number, line in enumerate(lines, 1):
        key, value = _parse_line(line, sep, number, chunk.first_line)
        size = len(value) + len(key) + PER_RECORD_OVERHEAD
        if chunk.values and (len(chunk.values) >= chunk_lines or chunk.size + size > budget):
            _append_chunk(stream, chunk, sep is not None, out)
            chunk = _Chunk(first_line=number)
        chunk.keys.append(key)
        chunk.values.append(value)
        chunk.size += size
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


# --------------------------------------------------------------------------- consume


def _cmd_consume(args: argparse.Namespace) -> int:
    encode = json_line if args.format == "json" else raw_line
    out: BinaryIO = sys.stdout.buffer
    with _open_log(args, create=False) as log:
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


def json_line(record: Record) -> bytes:
    """One record as a JSON object and a newline (UTF-8).

    ``key``, ``value`` and header values are text when they are valid UTF-8 and
    ``null`` when absent; other bytes appear base64-encoded under ``key_base64`` /
    ``value_base64`` instead, so exactly one of the two names is present.
    """
    obj: dict[str, Any] = {"offset": record.offset, "timestamp": record.timestamp}
    _put_bytes(obj, "key", record.key)
    _put_bytes(obj, "value", record.value)
    obj["headers"] = [_put_bytes({"key": name}, "value", value) for name, value in record.headers]
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def _put_bytes(obj: dict[str, Any], name: str, data: bytes | None) -> dict[str, Any]:
    if data is None:
        obj[name] = None
    else:
        try:
            obj[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            obj[f"{name}_base64"] = base64.b64encode(data).decode("ascii")
    return obj


def raw_line(record: Record) -> bytes:
    """The value bytes and a newline (a tombstone prints as an empty line)."""
    return (record.value or b"") + b"\n"


# ---------------------------------------------------------------------------- verify


@dataclass
class _Checked:
    """Running totals of a verify run."""

    streams: int = 0
    records: int = 0
    bytes: int = 0
    corruptions: int = 0


def _cmd_verify(args: argparse.Namespace) -> int:
    checked = _Checked()
    with _open_log(args, create=False) as log:
        names = [args.stream] if args.stream is not None else log.streams()
        for name in names:
            _verify_stream(log.stream(name), checked)
    found = f"{checked.corruptions} corruption(s) found" if checked.corruptions else "no corruption"
    print(
        f"checked {checked.streams} stream(s): {checked.records} records, "
        f"{checked.bytes} bytes; {found}"
    )
    return EXIT_ERROR if checked.corruptions else EXIT_OK


def _verify_stream(stream: Stream, checked: _Checked) -> None:
    """Read (and so checksum) every batch from the start offset to the end offset.

    After a corruption, checking resumes at the next segment when the backend reports
    segments, so one bad file does not hide damage in the others.
    """
    checked.streams += 1
    try:
        info = stream.info()
    except CorruptDataError as exc:
        _report_corruption(stream.name, exc, checked)
        return
    position: int | None = info.start_offset
    records, problems = 0, 0
    while position is not None:
        start, position = position, None
        try:
            for batch in stream.read_batches(start, info.end_offset):
                records += len(batch)
        except CorruptDataError as exc:
            problems += 1
            _report_corruption(stream.name, exc, checked)
            position = _next_segment(info, exc, start)
    checked.records += records
    checked.bytes += info.size_bytes
    status = "ok     " if not problems else "CORRUPT"
    print(f"{status} {stream.name}: {records} records, {info.size_bytes} bytes")


def _report_corruption(name: str, exc: CorruptDataError, checked: _Checked) -> None:
    checked.corruptions += 1
    where = exc.source or "(unknown file)"
    at = "unknown position" if exc.position is None else f"byte {exc.position}"
    print(f"CORRUPT {name}: {where} at {at}: {exc.reason}")


def _next_segment(info: StreamInfo, exc: CorruptDataError, position: int) -> int | None:
    """Base offset of the segment after the damaged file, or None to give up the stream."""
    if exc.source is None:
        return None
    damaged = Path(exc.source).name
    pieces = [  # tiered segments (objects) first, then the local files, in offset order
        (Path(str(seg.get("object"))).name, seg.get("base_offset"))
        for seg in info.details.get("tiered", [])
    ] + [(seg.get("file"), seg.get("base_offset")) for seg in info.details.get("segments", [])]
    for (name, _), (_, base) in itertools.pairwise(pieces):
        if name == damaged:
            return base if isinstance(base, int) and base > position else None
    return None
