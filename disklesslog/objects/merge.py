"""Merging: a stream's batches in small WAL objects are copied into large per-stream ones.

A writer's flush is one *WAL object* holding batches of every stream it wrote, and it
flushes often (``linger_ms``), so a stream's history is spread over many small objects
shared with other streams: a read of it makes many small GETs, and a WAL object stays
in storage until the last of its streams lets go of it. Merging copies a stream's
batches out of WAL objects into ``….merged`` objects of about ``target_bytes``
(64 MiB), each one run of consecutive batches, and swaps the coordinates in with
``replace_batches``: atomically, only if every batch is still live (else the copy is
discarded as an orphan), like every rewrite (``objects/rewrite.py``).

Batches are copied byte for byte (ranged reads, each batch checked against its checksum
and its coordinates first): no decoding, no re-encoding, so a merge cannot change a
record and costs little CPU.

**Policy (no churn).** Only batches in WAL objects are merged; batches in merged or
compacted objects are never rewritten by merging, so every batch is merged at most once.
A stream's WAL batches are taken in runs of consecutive batches, cut into pieces of at
most ``target_bytes``. Every piece is merged except the newest one of a run when it is
small (under a quarter of ``target_bytes``) and young (its oldest object is under
``MAX_WAIT_MS``, 10 minutes, old): that one waits for more data, so a busy stream gets
few large merged objects rather than one small one per maintenance run. A quiet stream
still gets its WAL batches merged (and its WAL objects freed) within about that time,
at the cost of a small merged object per ``MAX_WAIT_MS`` at most.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..api import validate_stream_name
from ..errors import ConfigError, DataLossError, StreamNotFound
from ..format import MAX_BATCH_BYTES_LIMIT
from ..maintenance.report import MaintenanceReport, Progress
from ..sequencers.base import BatchLocation
from .rewrite import SourceReader, live_snapshot, replaced_meanwhile, swap, upload
from .storage import MERGED, WAL, key_kind, key_time_ns

if TYPE_CHECKING:
    from .log import ObjectLog

__all__ = ["DEFAULT_TARGET_BYTES", "MAX_WAIT_MS", "MIN_FRACTION", "merge", "plan_pieces"]

DEFAULT_TARGET_BYTES = 64 << 20
"""Size merged objects grow to (a stream's whole run when smaller)."""
MIN_FRACTION = 4
"""The newest piece of a run waits while it is under ``target_bytes / MIN_FRACTION``..."""
MAX_WAIT_MS = 10 * 60 * 1000
"""...and its oldest WAL object is younger than this."""
MIN_TARGET_BYTES = 1024


def merge(
    object_log: ObjectLog,
    stream: str | None = None,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    target_bytes: int | None = None,
    now_ms: int | None = None,
) -> MaintenanceReport:
    """Merge the WAL batches of ``stream`` (StreamNotFound if it does not exist) or of
    every stream, by the policy of the module docstring. ``now_ms`` replaces the clock
    that decides whether a small run has waited long enough."""
    target = DEFAULT_TARGET_BYTES if target_bytes is None else target_bytes
    if type(target) is not int or not MIN_TARGET_BYTES <= target <= MAX_BATCH_BYTES_LIMIT:
        raise ConfigError(
            f"target_bytes={target_bytes!r} is out of range: an int of "
            f"{MIN_TARGET_BYTES}..{MAX_BATCH_BYTES_LIMIT} bytes (default 64 MiB)"
        )
    now = int(time.time() * 1000) if now_ms is None else now_ms
    report = MaintenanceReport("merge", dry_run=dry_run)
    if stream is not None:
        validate_stream_name(stream)
        object_log.sequencer.stream_info(stream)  # raises StreamNotFound
        names = [stream]
    else:
        names = object_log.streams()
    done = total = 0
    for name in names:
        try:
            config = object_log._current_config(name)
            batches = live_snapshot(object_log, name)
        except StreamNotFound:
            continue  # deleted since it was listed
        report.streams += 1
        pieces, waiting = plan_pieces(batches, target, now)
        total += sum(b.size for piece in pieces for b in piece)
        if waiting:
            report.skipped.append(
                f"{name}: {len(waiting):,} WAL batch(es) ({sum(b.size for b in waiting):,} "
                f"bytes) wait for {target // MIN_FRACTION:,} bytes or "
                f"{MAX_WAIT_MS // 60_000} minutes"
            )
        reader = SourceReader(object_log, config.max_batch_bytes)
        merged: list[int] = []
        try:
            for piece in pieces:
                if progress is not None:
                    progress("merge", done, total)
                done += sum(b.size for b in piece)
                if not _merge_piece(object_log, name, piece, reader, report, dry_run):
                    report.skipped.append(
                        f"{name}: offsets {piece[0].base_offset:,}..{piece[-1].last_offset:,} "
                        "changed while merging (a retention trim, compaction or another "
                        "maintainer; or the sequencer was too busy); they wait for the next run"
                    )
                    continue
                merged.append(len(piece))
        except DataLossError:
            if not replaced_meanwhile(object_log, name, reader):
                raise
            report.skipped.append(f"{name}: its batches changed while merging; run again")
        finally:
            reader.tally(report)
        if merged:
            report.actions.append(
                f"{name}: {sum(merged):,} WAL batch(es) from {len(reader.objects):,} "
                f"object(s) merged into {len(merged):,} object(s)"
            )
    if progress is not None:
        progress("merge", total, total)
    return report


def plan_pieces(
    batches: Sequence[BatchLocation], target_bytes: int, now_ms: int
) -> tuple[list[list[BatchLocation]], list[BatchLocation]]:
    """``(pieces to merge, WAL batches left waiting)`` for one stream's live batches.

    Runs of consecutive batches in WAL objects are cut greedily into pieces of at most
    ``target_bytes`` (a larger batch is a piece of its own); the last piece of a run
    waits while it is small and young (module docstring). Batches in merged or
    compacted objects end a run and are never taken.
    """
    pieces: list[list[BatchLocation]] = []
    waiting: list[BatchLocation] = []
    run: list[BatchLocation] = []
    for b in [*batches, None]:
        if b is not None and key_kind(b.object_key) == WAL:
            run.append(b)
            continue
        if not run:
            continue
        cut: list[list[BatchLocation]] = [[]]
        size = 0
        for location in run:
            if cut[-1] and size + location.size > target_bytes:
                cut.append([])
                size = 0
            cut[-1].append(location)
            size += location.size
        if size < target_bytes // MIN_FRACTION and not _waited(cut[-1], now_ms):
            waiting += cut.pop()
        pieces += cut
        run = []
    return pieces, waiting


def _waited(piece: list[BatchLocation], now_ms: int) -> bool:
    """Whether the oldest WAL object of ``piece`` is at least MAX_WAIT_MS old (by the time
    in its key, the writer's clock)."""
    times = [key_time_ns(b.object_key) for b in piece]
    oldest = min((t for t in times if t is not None), default=None)
    return oldest is not None and now_ms - oldest // 1_000_000 >= MAX_WAIT_MS


def _merge_piece(
    object_log: ObjectLog,
    stream: str,
    piece: list[BatchLocation],
    reader: SourceReader,
    report: MaintenanceReport,
    dry_run: bool,
) -> bool:
    """Copy one piece into a new merged object and swap it in; whether it applied."""
    parts: list[bytes] = []
    news: list[BatchLocation] = []
    position = 0
    for location, data in reader.raw(piece):
        parts.append(data)
        news.append(
            BatchLocation(
                0,
                "",
                position,
                location.size,
                location.base_offset,
                location.last_offset,
                location.max_timestamp,
            )
        )
        position += location.size
    if dry_run:
        report.add(objects_written=1, bytes_written=position)
        return True
    key, size, uploaded_at = upload(object_log, MERGED, parts)
    report.add(objects_written=1, bytes_written=size)
    news = [
        BatchLocation(0, key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp)
        for b in news
    ]
    return swap(object_log, stream, piece, news, (key, uploaded_at))
