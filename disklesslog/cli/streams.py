"""``streams`` and ``describe``: what a log holds, per stream (extent, size, config,
segments or objects), as text or JSON."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from ..api import StreamInfo
from ..errors import CorruptDataError
from ..leases import Lease
from ..maintenance import LEASE_NAME, MaintenanceStatus
from .common import EXIT_OK, table
from .logs import open_log

__all__ = ["add_commands", "describe_dict", "describe_lines"]


def add_commands(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``streams`` and ``describe`` on ``commands`` (argparse subparsers)."""
    streams = commands.add_parser(
        "streams", parents=[log_options], help="list the streams of a log, one per line"
    )
    streams.add_argument("url", metavar="URL")
    streams.add_argument(
        "--json", action="store_true", help='print one JSON object: {"streams": [names]}'
    )
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


def _cmd_streams(args: argparse.Namespace) -> int:
    with open_log(args, create=False) as log:
        names = log.streams()
    if args.json:
        print(json.dumps({"streams": names}, indent=2))
        return EXIT_OK
    for name in names:
        print(name)
    return EXIT_OK


def _cmd_describe(args: argparse.Namespace) -> int:
    if args.stream is None:
        return _describe_log(args)
    with open_log(args, create=False) as log:
        info = log.stream(args.stream).info()
    if args.json:
        print(json.dumps(describe_dict(info), indent=2, default=str))
    else:
        print("\n".join(describe_lines(info)))
    return EXIT_OK


def _describe_log(args: argparse.Namespace) -> int:
    """``describe URL``: every stream's extent and size, and how many segments or objects
    hold it, with a total line."""
    with open_log(args, create=False) as log:
        infos = [log.stream(name).info() for name in log.streams()]
        maintainer = log.lease_holder(LEASE_NAME)
        try:
            last: MaintenanceStatus | str | None = log.last_maintenance()
        except CorruptDataError as exc:  # informative only: the next pass replaces it
            last = f"unreadable ({exc})"
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
    lines = table(
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
    print(_maintainer_line(maintainer))
    print("\n".join(_last_pass_lines(last)))
    held = [info.name for info in infos if info.details.get("pending_transactions")]
    if held:
        print(
            f"held back by a two-phase commit in progress or interrupted: {', '.join(held)} "
            "(`describe URL STREAM` shows it; docs/operations.md, section 7)"
        )
    return EXIT_OK


def _maintainer_line(lease: Lease | None) -> str:
    """Who runs the log's automatic maintenance (docs/operations.md, section 8)."""
    if lease is None:
        return "maintenance: no process holds the maintenance lease now"
    return f"maintenance: run by {lease.holder} (lease token {lease.token})"


def _last_pass_lines(last: MaintenanceStatus | str | None) -> list[str]:
    """What the last maintenance pass (of whichever process) stored: when it ended, by
    whom, and per operation when it last ran, failures and the last change."""
    if last is None:
        return ["last maintenance pass: none yet"]
    if isinstance(last, str):
        return [f"last maintenance pass: {last}"]
    lines = [f"last maintenance pass: {_when(last.last_pass_ms)} by {last.holder}"]
    for name, op in last.operations.items():
        if op.last_run_ms is None:
            continue
        runs = f"{op.runs} run{'s' if op.runs != 1 else ''}"
        line = f"  {name}: last ran {_when(op.last_run_ms)}, {runs}"
        if op.errors:
            line += f", {op.errors} failed (last: {op.last_error})"
        if op.last_changed:
            line += f"; last change: {op.last_changed}"
        lines.append(line)
    return lines


def _when(millis: int | None) -> str:
    if millis is None:
        return "never"
    moment = datetime.datetime.fromtimestamp(millis / 1000, datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


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
        lines += table(
            ["base offset", "end offset", "bytes", "file"],
            [[s["base_offset"], s["end_offset"], s["bytes"], s["file"]] for s in facts["segments"]],
        )
    if "tiered" in facts:
        lines.append(f"tiered:       {len(facts['tiered'])}")
        if facts["tiered"]:
            lines += table(
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
