"""``repair``: run a local stream's recovery now and apply the operator's decision about
damage the log will not decide on its own (accept lost records, or a new start offset),
then print what was repaired (docs/operations.md, "Damage and repair")."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..maintenance import MaintenanceReport
from .args import start_offset
from .common import EXIT_OK
from .logs import open_log

__all__ = ["add_command"]


def add_command(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register ``repair`` on ``commands`` (argparse subparsers)."""
    repair = commands.add_parser(
        "repair",
        parents=[log_options],
        help="take a stream of a local log past damage, with your decision",
        description="Run a local stream's recovery now and, with --accept-data-loss, "
        "accept that storage lost acknowledged records (their offsets become a gap that "
        "is never handed out again), or with --start-offset restart a stream whose state "
        "record and its copy are both unreadable. Prints what was repaired "
        "(docs/operations.md, 'Damage and repair').",
    )
    repair.add_argument("url", metavar="URL")
    repair.add_argument("stream", metavar="STREAM")
    repair.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="accept the loss a DataLossError named; its offsets are skipped, never reused",
    )
    repair.add_argument(
        "--start-offset",
        metavar="N",
        type=start_offset,
        help="the stream's start offset, when its state record and copy are unreadable",
    )
    repair.add_argument("--json", action="store_true", help="print the report as JSON")
    repair.set_defaults(handler=_repair, command_name="repair")


def _repair(args: argparse.Namespace) -> int:
    with open_log(args, create=False) as log:
        report: MaintenanceReport = log.repair(
            args.stream, accept_data_loss=args.accept_data_loss, start_offset=args.start_offset
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(report.summary()))
    return EXIT_OK
