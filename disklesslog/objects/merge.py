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
record and costs little CPU. Every stream's pieces are planned first and read together,
sorted by object, in groups of up to ``MAX_HELD_BYTES``: a WAL object holds batches of
many streams, and this way it costs one coalesced GET per group, not one per stream.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError, DataLossError, StreamNotFound
from ..format import MAX_BATCH_BYTES_LIMIT
from ..maintenance.report import MaintenanceReport, Progress
from ..names import validate_stream_name
from ..sequencers.base import BatchLocation
from .rewrite import SourceReader, live_snapshot, replaced_meanwhile, swap, upload
from .storage import MERGED, STAGED, WAL, key_kind, key_time_ns

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
MAX_HELD_BYTES = 256 << 20
"""Bytes of batches one pass over the WAL objects holds before writing merged objects:
larger backlogs are merged in several passes (each WAL object read once per pass)."""


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
    planned: list[_Piece] = []
    for name in names:
        try:
            config = object_log.current_config(name)
            batches = live_snapshot(object_log, name)
        except StreamNotFound:
            continue  # deleted since it was listed
        report.streams += 1
        pieces, waiting = plan_pieces(batches, target, now)
        planned += [_Piece(name, config.max_batch_bytes, piece) for piece in pieces]
        if waiting:
            report.skipped.append(
                f"{name}: {len(waiting):,} WAL batch(es) ({sum(b.size for b in waiting):,} "
                f"bytes) wait for {target // MIN_FRACTION:,} bytes or "
                f"{MAX_WAIT_MS // 60_000} minutes"
            )
    total = sum(piece.size for piece in planned)
    done = 0
    merged: dict[str, list[int]] = {}
    sources: dict[str, set[str]] = {}
    for group in _groups(planned, MAX_HELD_BYTES):
        if progress is not None:
            progress("merge", done, total)
        done += sum(piece.size for piece in group)
        for piece, parts in _read_group(object_log, group, report):
            sources.setdefault(piece.stream, set()).update(b.object_key for b in piece.batches)
            if not _merge_piece(object_log, piece, parts, report, dry_run):
                report.skipped.append(
                    f"{piece.stream}: offsets {piece.batches[0].base_offset:,}.."
                    f"{piece.batches[-1].last_offset:,} changed while merging (a retention "
                    "trim, compaction or another maintainer; or the sequencer was too busy); "
                    "they wait for the next run"
                )
                continue
            merged.setdefault(piece.stream, []).append(len(piece.batches))
    for name, counts in merged.items():
        report.actions.append(
            f"{name}: {sum(counts):,} WAL batch(es) from {len(sources[name]):,} "
            f"object(s) merged into {len(counts):,} object(s)"
        )
    if progress is not None:
        progress("merge", total, total)
    return report


@dataclass
class _Piece:
    """Consecutive WAL batches of one stream that become one merged object."""

    stream: str
    max_batch_bytes: int
    batches: list[BatchLocation]

    @property
    def size(self) -> int:
        return sum(b.size for b in self.batches)


def _groups(pieces: list[_Piece], max_bytes: int) -> Iterator[list[_Piece]]:
    """Pieces in groups of at most ``max_bytes`` (a larger piece alone): what one pass
    over the WAL objects holds in memory before writing the merged objects."""
    group: list[_Piece] = []
    size = 0
    for piece in pieces:
        if group and size + piece.size > max_bytes:
            yield group
            group, size = [], 0
        group.append(piece)
        size += piece.size
    if group:
        yield group


def _read_group(
    object_log: ObjectLog, group: list[_Piece], report: MaintenanceReport
) -> list[tuple[_Piece, list[bytes]]]:
    """Every batch of ``group``'s pieces, read in (object, position) order: a WAL object
    holds batches of many streams, and this way each object costs one coalesced ranged
    GET for the whole group instead of one per stream. A piece whose object vanished
    because its batches moved meanwhile (another maintainer) is left out; an object the
    sequencer still references is lost data (DataLossError)."""
    while True:
        owner = {id(b): piece for piece in group for b in piece.batches}
        wanted = sorted(
            (b for piece in group for b in piece.batches),
            key=lambda b: (b.object_key, b.position),
        )
        reader = SourceReader(object_log, max(piece.max_batch_bytes for piece in group))
        copied: dict[int, dict[int, bytes]] = {id(piece): {} for piece in group}
        try:
            for location, data in reader.raw(wanted):
                copied[id(owner[id(location)])][id(location)] = data
        except DataLossError:
            gone = [p for p in group if any(b.object_key == reader.missing for b in p.batches)]
            for piece in gone:
                if not replaced_meanwhile(object_log, piece.stream, reader):
                    raise
                report.skipped.append(f"{piece.stream}: its batches changed while merging")
            group = [p for p in group if p not in gone]
            continue
        finally:
            reader.tally(report)
        return [(piece, [copied[id(piece)][id(b)] for b in piece.batches]) for piece in group]


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
        if b is not None and key_kind(b.object_key) in (WAL, STAGED):  # both many-stream
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
    piece: _Piece,
    parts: list[bytes],
    report: MaintenanceReport,
    dry_run: bool,
) -> bool:
    """Write one piece's batches (already read and verified) into a new merged object and
    swap it in; whether it applied."""
    news: list[BatchLocation] = []
    position = 0
    for location, data in zip(piece.batches, parts):
        news.append(
            BatchLocation(
                0,
                "",
                position,
                len(data),
                location.base_offset,
                location.last_offset,
                location.max_timestamp,
            )
        )
        position += len(data)
    if dry_run:
        report.add(objects_written=1, bytes_written=position)
        return True
    key, size, uploaded_at = upload(object_log, MERGED, parts)
    report.add(objects_written=1, bytes_written=size)
    news = [
        BatchLocation(0, key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp)
        for b in news
    ]
    return swap(object_log, piece.stream, piece.batches, news, (key, uploaded_at))
