"""The maintenance commands of ``disklesslog``: retention, compact, merge, tier, gc,
maintain, and alter of one stream's settings. Each opens the log (never creating one),
runs the operation (with a tqdm progress bar on a terminal where it reports progress),
and prints the report's summary (or JSON)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..config import ALTERABLE
from ..maintenance import MaintenanceReport, Progress
from .args import byte_size, seconds, setting
from .common import EXIT_OK
from .logs import open_log

__all__ = ["add_commands"]

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


def add_commands(commands: Any, log_options: argparse.ArgumentParser) -> None:
    """Register the maintenance commands and ``alter`` on ``commands`` (argparse
    subparsers)."""
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
                type=byte_size,
                help="size of the per-stream objects merging writes (default 64 MiB)",
            )
        if name in ("gc", "maintain"):
            sub.add_argument(
                "--grace",
                metavar="SECONDS",
                type=seconds,
                help="gc: delete what has been unreferenced this long (default 300)",
            )
        sub.add_argument("--json", action="store_true", help="print the report as JSON")
        sub.add_argument(
            "--no-progress", action="store_true", help="no progress bar (default: on a terminal)"
        )
        sub.set_defaults(handler=lambda args, m=method: _run(args, m), command_name=name)
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
        type=setting,
        help="e.g. retention_ms=86400000 min_cleanable_dirty_ratio=0.3",
    )
    alter.set_defaults(handler=_alter, command_name="alter")


def _alter(args: argparse.Namespace) -> int:
    with open_log(args, create=False) as log:
        config = log.alter_stream(args.stream, **dict(args.settings))
    for key, value in config.to_dict().items():
        print(f"{key:<26} {value}")
    return EXIT_OK


def _run(args: argparse.Namespace, method: str) -> int:
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
    return EXIT_OK


@contextmanager
def _progress(enabled: bool) -> Iterator[Progress | None]:
    """A :data:`Progress` that draws one tqdm bar per task on stderr (tqdm stays quiet
    when stderr is not a terminal)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm  # noqa: PLC0415 - slow to import: only when bars are drawn

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
