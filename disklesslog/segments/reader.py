"""Reading a local stream: records (or offsets) by offset range, and the first offset at a time.

Both work on a :class:`~disklesslog.segments.stream_store.Snapshot`, so a read sees the
stream as it was when it started (records appended later wait for the next read) and
never holds a lock while it decodes.

Segment files are opened by path, and key compaction may have replaced one (or merged
it into its predecessor) since the snapshot was taken: :meth:`Segment.open_log`
notices, and the read goes on from the offset it reached with a fresh snapshot. The
records from there on are the same, less those compaction removed. A file already
open stays readable (POSIX keeps an unlinked or replaced inode alive).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ..errors import CorruptDataError, OffsetOutOfRange
from ..projection import COLUMNS, Part, Projection
from ..records import RecordBatch, limit_records
from .layout import close_quietly
from .segment import DECODE, Entry, Segment, SegmentReplaced, iter_entries
from .stream_store import Snapshot, StreamStore

__all__ = ["offset_for_time", "read", "read_batches"]

log = logging.getLogger("disklesslog")

_MAX_STALE = 100
"""Fresh snapshots a read takes in a row without progress before giving up: each means
a compaction swap replaced a file between the snapshot and the open, so this many
means something else keeps changing the files."""


class _Stale(Exception):
    """Internal: a segment file of the snapshot was replaced or removed."""


def read_batches(
    store: StreamStore,
    start: int | None,
    end: int | None,
    max_records: int | None,
    *,
    raw: bool = False,
) -> Iterator[RecordBatch]:
    """Batches covering ``[start, end)`` of the stream, clipped to the requested range.

    Checks the range now (raising :class:`OffsetOutOfRange`) and reads lazily. Only
    the stable part of the stream is read, unless ``raw`` (see :meth:`StreamStore.snapshot`).
    """
    return limit_records(read(store, start, end, COLUMNS, raw=raw), max_records)


def read(
    store: StreamStore,
    start: int | None,
    end: int | None,
    projection: Projection[Part],
    *,
    raw: bool = False,
) -> Iterator[Part]:
    """What ``projection`` takes from the records of ``[start, end)``, batch by batch
    (empty parts left out); the range is checked now, reading is lazy."""
    snap = store.snapshot(raw=raw)
    lo = snap.start_offset if start is None else start
    if not snap.start_offset <= lo <= snap.end_offset:
        raise OffsetOutOfRange(
            f"offset {lo} is outside the range of stream {store.name!r}, "
            f"[{snap.start_offset}, {snap.end_offset}]",
            start_offset=snap.start_offset,
            end_offset=snap.end_offset,
        )
    hi = snap.end_offset if end is None else min(end, snap.end_offset)
    return _read(store, snap, lo, hi, projection, raw)


def _read(
    store: StreamStore, snap: Snapshot, lo: int, hi: int, projection: Projection[Part], raw: bool
) -> Iterator[Part]:
    stale = 0
    while True:
        try:
            for seg, seg_end, end_pos in _segments_from(store, snap, lo):
                if lo >= hi:
                    return
                expected = None
                for _, base, header, batch in _entries(store, seg, lo, end_pos, projection):
                    expected = base + header.span
                    if base >= hi:
                        return
                    part = projection.clip(base, header, batch, lo, hi)
                    if len(part):
                        store.metrics.add("read_batches")
                        stale = 0
                        yield part
                    lo = max(lo, expected)
                _check_end(seg, seg_end, end_pos, expected, lo)
                lo = max(lo, seg_end)
            return
        except _Stale as exc:
            stale += 1
            snap = _fresh_snapshot(store, stale, str(exc), raw=raw)
            if lo < snap.start_offset:
                raise OffsetOutOfRange(
                    f"offset {lo} of {store.name!r} was trimmed while reading",
                    start_offset=snap.start_offset,
                    end_offset=snap.end_offset,
                ) from None


def _check_end(seg: Segment, seg_end: int, end_pos: int, expected: int | None, lo: int) -> None:
    """A segment's entries must reach its end offset (the next segment's base). Only a
    compacted segment, or one whose loss an operator accepted, may have none at all;
    elsewhere an empty segment file that should hold records is damage."""
    if expected is not None and expected != seg_end:
        raise CorruptDataError(
            f"entries end at offset {expected}, the segment should reach {seg_end}",
            source=str(seg.log_path),
        )
    if expected is None and not end_pos and seg_end > lo and not seg.may_be_empty():
        raise CorruptDataError(
            f"the segment is empty but should hold offsets up to {seg_end}",
            source=str(seg.log_path),
        )


def _fresh_snapshot(store: StreamStore, attempts: int, path: str, *, raw: bool) -> Snapshot:
    """The snapshot a read continues with after it found the segment file at ``path``
    replaced or gone (``attempts`` times in a row)."""
    if attempts > _MAX_STALE:
        raise CorruptDataError(
            f"segment files keep changing under the reader ({attempts} times in a row); "
            "is something other than disklesslog modifying the stream directory?",
            source=path,
        )
    return store.snapshot(fresh=True, raw=raw)


def offset_for_time(store: StreamStore, timestamp: int) -> int | None:
    """First offset (>= the start offset) whose record timestamp is >= ``timestamp``.

    Segments are skipped by their max timestamp, the time index narrows the scan inside
    a segment, then batches are checked by their max timestamp, as Kafka's ListOffsets.
    A segment file replaced meanwhile makes the lookup start again on a fresh snapshot.
    """
    snap = store.snapshot()
    for attempt in range(1, _MAX_STALE + 2):
        try:
            return _offset_for_time(store, snap, timestamp)
        except _Stale as exc:
            snap = _fresh_snapshot(store, attempt, str(exc), raw=False)
    raise AssertionError("unreachable: _fresh_snapshot gives up first")


def _offset_for_time(store: StreamStore, snap: Snapshot, timestamp: int) -> int | None:
    for seg, _, end_pos in _segments_from(store, snap, snap.start_offset):
        if seg.max_timestamp < timestamp:
            continue
        hint = seg.timeindex.below(timestamp)
        lo = max(snap.start_offset, seg.base + hint[1] if hint else seg.base)
        for _, base, header, batch in _entries(store, seg, lo, end_pos):
            if base >= snap.end_offset:  # held back by a commit in progress
                return None
            if batch is None or header.max_timestamp < timestamp:
                continue
            for offset, ts in zip(batch.offsets, batch.timestamps):
                if ts >= timestamp and offset >= lo:
                    return offset
    return None


def _segments_from(
    store: StreamStore, snap: Snapshot, offset: int
) -> Iterator[tuple[Segment, int, int]]:
    """``(segment, end offset, byte end)`` of the snapshot's segments that reach past
    ``offset``, with the indexes of closed segments loaded."""
    last = len(snap.segments) - 1
    for index, (seg, end_pos) in enumerate(snap.segments):
        seg_end = snap.end_offset if index == last else seg.end_offset
        if seg_end <= offset:
            continue
        if index != last:
            try:
                store.ensure_indexes(seg)
            except (FileNotFoundError, SegmentReplaced):  # the rebuild found it changed
                raise _Stale(str(seg.log_path)) from None
        yield seg, seg_end, end_pos


def _entries(
    store: StreamStore,
    seg: Segment,
    offset: int,
    end_pos: int,
    projection: Projection[Any] = COLUMNS,
) -> Iterator[Entry]:
    """Entries of ``seg`` from the one holding ``offset`` (found via the index), decoded
    as ``projection`` needs.

    An index is only a hint: if the entry it points at is not valid, the segment is
    read from its start instead, so a damaged index never fails a read of good data.
    """
    pos, base = seg.position_for(offset)
    fd = _open_segment(seg)
    try:
        entries = _walk(store, fd, seg, pos, base, end_pos, offset, projection)
        try:
            first = next(entries, None)
        except CorruptDataError as exc:
            if pos == 0:
                raise
            log.warning("index of %s points at a bad entry (%s); scanning", seg.log_path, exc)
            entries = _walk(store, fd, seg, 0, seg.base, end_pos, offset, projection)
            first = next(entries, None)
        if first is not None:
            yield first
            yield from entries
    finally:
        close_quietly(fd)  # read only


def _walk(
    store: StreamStore,
    fd: int,
    seg: Segment,
    pos: int,
    base: int,
    end_pos: int,
    offset: int,
    projection: Projection[Any],
) -> Iterator[Entry]:
    max_batch_bytes = store.config.max_batch_bytes
    return iter_entries(
        fd,
        str(seg.log_path),
        pos,
        end_pos,
        base,
        max_batch_bytes=max_batch_bytes,
        mode=DECODE,
        skip_below=offset,
        decode=projection.decode,
    )


def _open_segment(seg: Segment) -> int:
    """Open ``seg``'s file, or raise :class:`_Stale` if it is no longer the snapshot's:
    deleted by a trim (the fresh snapshot then puts the read out of range), merged into
    another segment or replaced by compaction (the read carries on)."""
    try:
        return seg.open_log()
    except (FileNotFoundError, SegmentReplaced):
        raise _Stale(str(seg.log_path)) from None
