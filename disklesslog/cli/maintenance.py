"""The maintenance subcommands of ``disklesslog``: retention, compact, merge, tier, gc,
maintain, and alter and repair of one stream. Each opens the log (never creating one),
runs the operation (with a tqdm progress bar on a terminal where it reports progress),
and prints the report's summary (or JSON)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..config import ALTERABLE
from .report import MaintenanceReport, Progress

__all__ = ["add_commands"]

OpenLog = Callable[..., Any]

_COMMANDS = {
    "retention": (
        "apply_retention",
        "delete records past retention_ms/retention_bytes (whole segments or batches)",
    ),
    "compact": (
        "compact",
        "key compaction: keep the latest record per key of compacted streams",
    ),
    "merge": (
        "merge",
        "object logs: rewrite small combined objects into per-stream objects",
    ),
    "tier": (
        "tier",
        "local logs with a tier URL: copy closed segments to object storage",
    ),
    "gc": ("collect_garbage", "delete objects nothing refers to after a grace period"),
    "maintain": ("maintain", "all of the above that apply, in that order"),
}


def add_commands(commands: Any, log_options: argparse.ArgumentParser, open_log: OpenLog) -> None:
    """Register the maintenance subcommands on ``commands`` (argparse subparsers)."""
    for name, (method, help_text) in _COMMANDS.items():
        sub = commands.add_parser(
            name, parents=[log_options], help=help_text, description=help_text
        )
        sub.add_argument("url", metavar="URL")
        if name != "gc":
            sub.add_argument("--stream", metavar="S", help="only this stream")
        sub.add_argument(
            "--dry-run", action="store_true", help="report what would be done; change nothing"
        )
        if name == "compact":
            sub.add_argument(
                "--force",
                action="store_true",
                help="compact even below the streams' min_cleanable_dirty_ratio",
            )
        if name == "merge":
            sub.add_argument(
                "--target-bytes",
                metavar="N",
                type=_size,
                help="size of the per-stream objects merging writes (default 64 MiB)",
            )
        if name in ("gc", "maintain"):
            sub.add_argument(
                "--grace",
                metavar="SECONDS",
                type=_grace,
                help="gc: delete what has been unreferenced this long (default 300)",
            )
        sub.add_argument("--json", action="store_true", help="print the report as JSON")
        sub.add_argument(
            "--no-progress", action="store_true", help="no progress bar (default: on a terminal)"
        )
        sub.set_defaults(handler=lambda args, m=method: _run(args, m, open_log), command_name=name)
    alter = commands.add_parser(
        "alter",
        parents=[log_options],
        help="change a stream's retention and compaction settings",
        description="Change maintenance settings of an existing stream and print its new "
        f"config. Alterable: {', '.join(sorted(ALTERABLE))}.",
    )
    alter.add_argument("url", metavar="URL")
    alter.add_argument("stream", metavar="STREAM")
    alter.add_argument(
        "settings",
        metavar="KEY=VALUE",
        nargs="+",
        type=_setting,
        help="e.g. retention_ms=86400000 min_cleanable_dirty_ratio=0.3",
    )
    alter.set_defaults(handler=lambda args: _alter(args, open_log), command_name="alter")
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
        type=_offset,
        help="the stream's start offset, when its state record and copy are unreadable",
    )
    repair.add_argument("--json", action="store_true", help="print the report as JSON")
    repair.set_defaults(handler=lambda args: _repair(args, open_log), command_name="repair")


def _setting(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: {value!r} is not a number") from None


def _alter(args: argparse.Namespace, open_log: OpenLog) -> int:
    with open_log(args, create=False) as log:
        config = log.alter_stream(args.stream, **dict(args.settings))
    for key, value in config.to_dict().items():
        print(f"{key:<26} {value}")
    return 0


def _repair(args: argparse.Namespace, open_log: OpenLog) -> int:
    with open_log(args, create=False) as log:
        report: MaintenanceReport = log.repair(
            args.stream, accept_data_loss=args.accept_data_loss, start_offset=args.start_offset
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(report.summary()))
    return 0


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an offset: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


_SIZE = re.compile(r"\s*(-?\d+)\s*([kmg]ib)?\s*", re.IGNORECASE)
_UNITS = {None: 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _size(text: str) -> int:
    """Bytes: an integer, optionally with a KiB/MiB/GiB suffix (``64MiB``)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (an integer, optionally with KiB, MiB or GiB)"
        )
    digits, unit = match.groups()
    value = int(digits) * _UNITS[unit and unit.lower()]
    if value < 1024:
        raise argparse.ArgumentTypeError(f"must be at least 1024 bytes, not {text}")
    return value


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _run(args: argparse.Namespace, method: str, open_log: OpenLog) -> int:
    with open_log(args, create=False) as log, _progress(not args.no_progress) as progress:
        options: dict[str, Any] = {"dry_run": args.dry_run, "progress": progress}
        stream = getattr(args, "stream", None)
        if getattr(args, "grace", None) is not None:
            options["grace_seconds"] = args.grace
        if getattr(args, "target_bytes", None) is not None:
            options["target_bytes"] = args.target_bytes
        if getattr(args, "force", False):
            options["force"] = True
        if method == "collect_garbage":
            report: MaintenanceReport = log.collect_garbage(**options)
        else:
            report = getattr(log, method)(stream, **options)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(report.summary()))
    return 0


@contextmanager
def _progress(enabled: bool) -> Iterator[Progress | None]:
    """A :data:`Progress` that draws one tqdm bar per task on stderr (tqdm stays quiet
    when stderr is not a terminal)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm  # noqa: PLC0415 - only for the maintenance commands

    bars: dict[str, Any] = {}

    def progress(task: str, done: int, total: int) -> None:
        bar = bars.get(task)
        if bar is None:
            bar = bars[task] = tqdm(total=total or None, desc=task, unit="", disable=None)
        if total and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()
