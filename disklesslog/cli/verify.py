"""``verify``: read and checksum every batch of a log's streams and every lease record,
report each corruption with its file and byte position (as text, or one JSON
document), and exit 1 if there was any."""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api import AbstractLog, Stream, StreamInfo
from ..errors import CorruptDataError
from .common import EXIT_ERROR, EXIT_OK
from .logs import open_log

__all__ = ["add_command"]


def add_command(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``verify`` on ``commands`` (argparse subparsers)."""
    verify = commands.add_parser(
        "verify",
        parents=[log_options],
        help="checksum every batch and lease record; exit 1 on corruption",
    )
    verify.add_argument("url", metavar="URL")
    verify.add_argument("--stream", metavar="S", help="check only this stream")
    verify.add_argument(
        "--json", action="store_true", help="print the result as one JSON object at the end"
    )
    verify.set_defaults(handler=_cmd_verify)


@dataclass
class _Checked:
    """Running totals of a verify run, and what it found per stream (for ``--json``)."""

    quiet: bool = False
    streams: int = 0
    records: int = 0
    bytes: int = 0
    corruptions: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)
    leases: dict[str, Any] | None = None

    def say(self, line: str) -> None:
        """A line of the text report (``--json`` prints only the document)."""
        if not self.quiet:
            print(line)


def _cmd_verify(args: argparse.Namespace) -> int:
    checked = _Checked(quiet=args.json)
    with open_log(args, create=False) as log:
        names = [args.stream] if args.stream is not None else log.streams()
        for name in names:
            _verify_stream(log.stream(name), checked)
        if args.stream is None:
            _verify_leases(log, checked)
    found = f"{checked.corruptions} corruption(s) found" if checked.corruptions else "no corruption"
    leases = checked.leases["records"] if checked.leases else 0
    checked.say(
        f"checked {checked.streams} stream(s): {checked.records} records, "
        f"{checked.bytes} bytes{f', {leases} lease(s)' if leases else ''}; {found}"
    )
    if args.json:
        document = {
            "ok": not checked.corruptions,
            "streams_checked": checked.streams,
            "records": checked.records,
            "bytes": checked.bytes,
            "corruptions": checked.corruptions,
            "streams": checked.results,
            "leases": checked.leases,
        }
        print(json.dumps(document, indent=2))
    return EXIT_ERROR if checked.corruptions else EXIT_OK


def _verify_stream(stream: Stream, checked: _Checked) -> None:
    """Read (and so checksum) every batch from the start offset to the end offset.

    After a corruption, checking resumes at the next segment when the backend reports
    segments, so one bad file does not hide damage in the others.
    """
    checked.streams += 1
    result: dict[str, Any] = {
        "stream": stream.name,
        "ok": True,
        "records": 0,
        "bytes": None,
        "corruptions": [],
    }
    checked.results.append(result)
    try:
        info = stream.info()
    except CorruptDataError as exc:
        _report_corruption(result, exc, checked)
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
            _report_corruption(result, exc, checked)
            position = _next_segment(info, exc, start)
    checked.records += records
    checked.bytes += info.size_bytes
    result.update(records=records, bytes=info.size_bytes)
    status = "ok     " if not problems else "CORRUPT"
    checked.say(f"{status} {stream.name}: {records} records, {info.size_bytes} bytes")


def _verify_leases(log: AbstractLog, checked: _Checked) -> None:
    """Read every lease record (a local log's files and index, or the sequencer's rows
    or state): a damaged or missing one is reported with its file or row. Said only
    when there are leases or damage, so a log without leases reports as before."""
    count, damage = log.lease_keeper().verify()
    checked.corruptions += len(damage)
    checked.leases = {
        "records": count,
        "ok": not damage,
        "corruptions": [
            {"file": exc.source, "position": exc.position, "reason": exc.reason} for exc in damage
        ],
    }
    for exc in damage:
        checked.say(f"CORRUPT leases: {exc.source or '(unknown file)'}: {exc.reason}")
    if count or damage:
        checked.say(f"{'CORRUPT' if damage else 'ok     '} leases: {count} records")


def _report_corruption(result: dict[str, Any], exc: CorruptDataError, checked: _Checked) -> None:
    checked.corruptions += 1
    result["ok"] = False
    result["corruptions"].append(
        {"file": exc.source, "position": exc.position, "reason": exc.reason}
    )
    where = exc.source or "(unknown file)"
    at = "unknown position" if exc.position is None else f"byte {exc.position}"
    checked.say(f"CORRUPT {result['stream']}: {where} at {at}: {exc.reason}")


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
