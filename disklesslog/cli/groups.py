"""``groups``: list consumer groups, describe a group's positions and lag per stream,
and reset its positions, in the shape of Kafka's ``kafka-consumer-groups.sh``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ..api import AbstractLog
from ..errors import OffsetOutOfRange, StreamNotFound
from .args import offset, timestamp_ms
from .common import EXIT_OK, CliError, table
from .logs import open_log

__all__ = ["add_command"]

_TARGETS = {"earliest": 0, "latest": 0, "offset": 1, "time": 1}
"""``reset --to``'s first word and how many values follow it."""


class _ResetTarget(argparse.Action):
    """``--to earliest|latest|offset N|time T``, checked and parsed while parsing, so a
    mistake is a usage error (exit 2)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        words = [values] if isinstance(values, str) else list(values or [])
        kind = words[0]
        if kind not in _TARGETS or len(words) != 1 + _TARGETS[kind]:
            raise argparse.ArgumentError(
                self, "use one of: earliest, latest, offset N, time T (ISO 8601 or ms)"
            )
        try:
            value = (
                None
                if len(words) == 1
                else (offset if kind == "offset" else timestamp_ms)(words[1])
            )
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, (kind, value))


def add_command(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``groups`` on ``commands`` (argparse subparsers)."""
    groups = commands.add_parser(
        "groups",
        parents=[log_options],
        help="list, describe and reset consumer groups",
        description="Without ACTION: the log's consumer groups, one per line. 'describe G': "
        "G's committed position, the stream's extent and the lag (records left to read) "
        "per stream. 'reset G --to ...': set G's positions in every stream it has one in, "
        "or in each --stream S; run it while no consumer of G is running.",
    )
    groups.add_argument("url", metavar="URL")
    groups.add_argument("action", nargs="?", choices=("describe", "reset"), metavar="ACTION")
    groups.add_argument("group", nargs="?", metavar="G")
    groups.add_argument(
        "--to",
        metavar="TARGET",
        nargs="+",
        action=_ResetTarget,
        help="reset: earliest (start offsets), latest (end offsets), offset N, or time T "
        "(the first record at or after T: ISO 8601 or ms since the epoch)",
    )
    groups.add_argument(
        "--stream",
        metavar="S",
        action="append",
        help="reset: only this stream (repeatable); it need not have a position yet",
    )
    groups.add_argument(
        "--dry-run", action="store_true", help="reset: show the new positions; commit nothing"
    )
    groups.add_argument("--json", action="store_true", help="print one JSON object")
    groups.set_defaults(handler=_cmd_groups, check_usage=_check_usage, usage_error=groups.error)


def _cmd_groups(args: argparse.Namespace) -> int:
    with open_log(args, create=False) as log:
        if args.action is None:
            document: dict[str, Any] = {"groups": log.groups()}
            lines = document["groups"]
        elif args.action == "describe":
            document = _describe(log, args.group)
            lines = _describe_lines(document)
        else:
            document = _reset(log, args)
            lines = _reset_lines(document)
    print(json.dumps(document, indent=2) if args.json else "\n".join(lines))
    return EXIT_OK


def _check_usage(args: argparse.Namespace) -> None:
    """Which options go with which action (argparse cannot say it): a usage error, exit 2,
    raised while parsing."""
    if args.action is None and args.group is not None:
        args.usage_error(f"{args.group!r}: name an ACTION (describe or reset) before the group")
    if args.action is not None and args.group is None:
        args.usage_error(f"{args.action} needs a consumer group G")
    if args.action == "reset" and args.to is None:
        args.usage_error("reset needs --to earliest|latest|offset N|time T")
    if args.action != "reset":
        for option, given in (
            ("--to", args.to),
            ("--stream", args.stream),
            ("--dry-run", args.dry_run),
        ):
            if given:
                args.usage_error(f"{option} goes with reset only")


def _describe(log: AbstractLog, group: str) -> dict[str, Any]:
    """``describe G``: per stream G has a position in, that position, the stream's
    extent, and the lag: records between the position and the end offset (from the
    start offset when the position was trimmed; ``None`` where the stream is gone or
    the position is past its end, which G's next consumer resets)."""
    committed = log.committed_offsets(group)
    if not committed:
        raise CliError(f"consumer group {group!r} has no committed positions in {log.url}")
    rows = []
    for name, position in sorted(committed.items()):
        row: dict[str, Any] = {
            "stream": name,
            "position": position,
            "start_offset": None,
            "end_offset": None,
            "lag": None,
        }
        try:
            stream = log.stream(name)
            row.update(start_offset=stream.start_offset, end_offset=stream.end_offset)
        except StreamNotFound:
            rows.append(row)
            continue
        if position <= row["end_offset"]:
            row["lag"] = row["end_offset"] - max(position, row["start_offset"])
        rows.append(row)
    return {"group": group, "streams": rows}


def _describe_lines(document: dict[str, Any]) -> list[str]:
    columns = ("position", "start_offset", "end_offset", "lag")
    rows = [[*(_shown(r[c]) for c in columns), r["stream"]] for r in document["streams"]]
    return [
        f"group: {document['group']}",
        *table(["position", "start", "end", "lag", "stream"], rows),
    ]


def _shown(value: int | None) -> str:
    return "-" if value is None else str(value)


def _reset(log: AbstractLog, args: argparse.Namespace) -> dict[str, Any]:
    """``reset G --to ...``: every new position is worked out and checked first, then all
    are committed at once (or none, with ``--dry-run``)."""
    group: str = args.group
    committed = log.committed_offsets(group)
    names = list(dict.fromkeys(args.stream)) if args.stream else sorted(committed)
    if not names:
        raise CliError(
            f"consumer group {group!r} has no committed positions in {log.url}; "
            "name the streams to set with --stream"
        )
    kind, value = args.to
    rows: list[dict[str, Any]] = []
    for name in names:
        stream = log.stream(name)
        start, end = stream.start_offset, stream.end_offset
        if kind == "earliest":
            target = start
        elif kind == "latest":
            target = end
        elif kind == "offset":
            target = value
            if not start <= target <= end:
                raise OffsetOutOfRange(
                    f"cannot reset group {group!r} to offset {target} of stream {name!r}: "
                    f"choose an offset in {start}..{end}",
                    start_offset=start,
                    end_offset=end,
                )
        else:
            found = stream.offset_for_time(value)
            target = end if found is None else max(found, start)
        rows.append({"stream": name, "previous": committed.get(name), "position": target})
    if not args.dry_run:
        log.commit_offsets(group, {row["stream"]: row["position"] for row in rows})
    return {"group": group, "dry_run": args.dry_run, "streams": rows}


def _reset_lines(document: dict[str, Any]) -> list[str]:
    verb = "would set" if document["dry_run"] else "set"
    header = f"group {document['group']}: {verb} positions"
    rows = [[_shown(r["previous"]), r["position"], r["stream"]] for r in document["streams"]]
    lines = [header, *table(["previous", "position", "stream"], rows)]
    if document["dry_run"]:
        lines.append("(dry run: nothing committed)")
    return lines
