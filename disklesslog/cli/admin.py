"""``create``, ``delete`` and ``trim``: manage a log's streams from a shell, as Kafka's
``kafka-topics.sh --create/--delete`` and ``kafka-delete-records.sh`` do."""

from __future__ import annotations

import argparse
from typing import Any

from ..config import StreamConfig
from ..names import validate_stream_name
from .args import offset, setting
from .common import EXIT_OK
from .logs import open_log

__all__ = ["add_commands"]


def add_commands(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``create``, ``delete`` and ``trim`` on ``commands`` (argparse subparsers)."""
    create = commands.add_parser(
        "create",
        parents=[log_options],
        help="create a stream with its settings",
        description="Create STREAM (and the log, if URL holds none yet) with the given "
        "settings; the others are the log's defaults. Running it again with the same "
        "settings changes nothing; other settings for an existing stream are an error.",
    )
    create.add_argument("url", metavar="URL")
    create.add_argument("stream", metavar="STREAM")
    create.add_argument(
        "--config",
        metavar="KEY=VALUE",
        type=setting,
        action="append",
        default=[],
        help="a stream setting (repeatable), e.g. retention_bytes=8KiB retention_ms=7d "
        "cleanup_policy=compact compression=zstd",
    )
    create.set_defaults(handler=_create)

    delete = commands.add_parser(
        "delete",
        parents=[log_options],
        help="delete a stream and all its records",
        description="Delete STREAM and all its records, and forget consumer groups' "
        "positions in it. There is no undo.",
    )
    delete.add_argument("url", metavar="URL")
    delete.add_argument("stream", metavar="STREAM")
    delete.set_defaults(handler=_delete)

    trim = commands.add_parser(
        "trim",
        parents=[log_options],
        help="delete a stream's records before an offset",
        description="Delete STREAM's records below offset N: its start offset becomes N "
        "(a start offset already past N stays). N may be the end offset (the stream "
        "becomes empty), not more.",
    )
    trim.add_argument("url", metavar="URL")
    trim.add_argument("stream", metavar="STREAM")
    trim.add_argument(
        "--before", metavar="N", type=offset, required=True, help="the new start offset"
    )
    trim.set_defaults(handler=_trim)


def _create(args: argparse.Namespace) -> int:
    # Checked before the log is opened, which may create it: bad input leaves nothing.
    validate_stream_name(args.stream)
    given = dict(args.config)
    asked = StreamConfig.from_dict(given)
    with open_log(args, create=True) as log:
        existed = args.stream in log
        config = log.create_stream(args.stream, **given).config
    if not existed:
        print(f"created stream {args.stream!r}")
        return EXIT_OK
    # create_stream kept the settings alter may change as the stream has them: say so,
    # so that a rerun with new retention does not look as if it had applied it.
    kept = [
        f"{name}={getattr(config, name)!r} (asked {getattr(asked, name)!r})"
        for name in sorted(given)
        if getattr(config, name) != getattr(asked, name)
    ]
    if kept:
        print(
            f"stream {args.stream!r} already exists; kept its {', '.join(kept)}: "
            "change them with 'disklesslog alter'"
        )
    else:
        print(f"stream {args.stream!r} already exists with these settings")
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    with open_log(args, create=False) as log:
        log.delete_stream(args.stream)
    print(f"deleted stream {args.stream!r}")
    return EXIT_OK


def _trim(args: argparse.Namespace) -> int:
    with open_log(args, create=False) as log:
        stream = log.stream(args.stream)
        before = stream.start_offset
        stream.trim(args.before)
        after = stream.start_offset
    print(f"{args.stream}: start offset {before} -> {after}")
    return EXIT_OK
