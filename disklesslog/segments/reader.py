"""Reading a local stream: records by offset range, and the first offset at a time.

Both work on a :class:`~disklesslog.segments.store.Snapshot`, so a read sees the
stream as it was when it started (records appended later wait for the next read) and
never holds a lock while it decodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from ..errors import CorruptDataError, OffsetOutOfRange
from ..records import RecordBatch
from .segment import Segment, iter_entries
from .store import Snapshot, StreamStore

__all__ = ["offset_for_time", "read_batches"]


def _extent(snap: Snapshot, index: int) -> int:
    """End offset of the ``index``-th segment in the snapshot."""
    segments = snap.segments
    return snap.end_offset if index == len(segments) - 1 else segments[index][0].end_offset


def read_batches(
    store: StreamStore, start: int | None, end: int | None, max_records: int | None
) -> Iterator[RecordBatch]:
    """Batches covering ``[start, end)`` of the stream, clipped to the requested range."""
    snap = store.snapshot()
    lo = snap.start_offset if start is None else start
    if not snap.start_offset <= lo <= snap.end_offset:
        raise OffsetOutOfRange(
            f"offset {lo} is outside {store.name!r}'s range "
            f"[{snap.start_offset}, {snap.end_offset}]",
            start_offset=snap.start_offset,
            end_offset=snap.end_offset,
        )
    hi = snap.end_offset if end is None else min(end, snap.end_offset)
    return _read(store, snap, lo, hi, max_records)


def _read(
    store: StreamStore, snap: Snapshot, lo: int, hi: int, remaining: int | None
) -> Iterator[RecordBatch]:
    max_batch_bytes = store.config.max_batch_bytes
    last = len(snap.segments) - 1
    for index, (seg, end_pos) in enumerate(snap.segments):
        if lo >= hi or remaining == 0:
            return
        seg_end = _extent(snap, index)
        if seg_end <= lo:
            continue
        if index != last:
            seg.ensure_indexes(max_batch_bytes)
        pos, first_base = seg.position_for(lo)
        fd = _open_segment(store, seg, lo)
        try:
            expected = first_base
            for _, base, span, _, batch in iter_entries(
                fd,
                str(seg.log_path),
                pos,
                end_pos,
                first_base,
                max_batch_bytes=max_batch_bytes,
                decode=True,
                skip_below=lo,
            ):
                expected = base + span
                if batch is None:
                    continue
                if base >= hi:
                    return
                part = batch.between(lo, hi)
                if remaining is not None:
                    part = part.head(remaining)
                    remaining -= len(part)
                if len(part):
                    lo = part.offsets[-1] + 1
                    yield part
                if remaining == 0:
                    return
                lo = max(lo, expected)
            if expected != seg_end:
                raise CorruptDataError(
                    f"entries end at offset {expected}, the segment should reach {seg_end}",
                    source=str(seg.log_path),
                )
        finally:
            os.close(fd)


def _open_segment(store: StreamStore, seg: Segment, offset: int) -> int:
    try:
        return os.open(seg.log_path, os.O_RDONLY)
    except FileNotFoundError:
        # Deleted by a trim since the snapshot: the offset is now below the start.
        snap = store.snapshot()
        raise OffsetOutOfRange(
            f"offset {offset} of {store.name!r} was trimmed while reading",
            start_offset=snap.start_offset,
            end_offset=snap.end_offset,
        ) from None


def offset_for_time(store: StreamStore, timestamp: int) -> int | None:
    """First offset (>= the start offset) whose record timestamp is >= ``timestamp``.

    Segments are skipped by their max timestamp, the time index narrows the scan inside
    a segment, then batches are checked by their max timestamp, as Kafka's ListOffsets.
    """
    snap = store.snapshot()
    max_batch_bytes = store.config.max_batch_bytes
    last = len(snap.segments) - 1
    for index, (seg, end_pos) in enumerate(snap.segments):
        seg_end = _extent(snap, index)
        if seg_end <= snap.start_offset or seg.base >= snap.end_offset:
            continue
        if index != last:
            seg.ensure_indexes(max_batch_bytes)
        if seg.max_timestamp < timestamp:
            continue
        hint = seg.timeindex.below(timestamp)
        lo = max(snap.start_offset, seg.base + hint[1] if hint else seg.base)
        pos, base = seg.position_for(lo)
        fd = _open_segment(store, seg, lo)
        try:
            for _, _, _, _, batch in iter_entries(
                fd,
                str(seg.log_path),
                pos,
                end_pos,
                base,
                max_batch_bytes=max_batch_bytes,
                decode=True,
                skip_below=lo,
            ):
                if batch is None:
                    continue
                for offset, ts in zip(batch.offsets, batch.timestamps):
                    if ts >= timestamp and offset >= lo:
                        return offset
        finally:
            os.close(fd)
    return None
