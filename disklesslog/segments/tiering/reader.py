"""Reading a stream whose oldest segments live in object storage.

A tiered stream has two parts: tiered segments ``[start offset, local start)`` listed
by its manifest (:mod:`~disklesslog.segments.tiering.manifest`) and the local segments from the
local start on (the state record's ``start_offset``). A read takes a :class:`View` of
both, the local snapshot first and then the manifest, and falls through: offsets below
the local start come from the tier, the rest from the local files, in one iterator.

Tiered segments are read like local ones, by the same entry walker (every batch
returned is checked against its CRC, the chain of base offsets is checked), only the
bytes come from ranged GETs of the ``.log`` object through the process-wide block
cache, positioned by the segment's ``.index`` object.

Tiering moves things under a reader: the local start rises when local copies are
deleted, and retention trims tiered segments (their objects are deleted a grace period
later). A read that finds its local segment gone looks again and continues from the
tier; a read whose tiered object is gone because it was trimmed meanwhile raises
:class:`~disklesslog.OffsetOutOfRange`, as a local read of a trimmed segment does. A
missing object the manifest still lists is :class:`~disklesslog.DataLossError`.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...errors import CorruptDataError, DataLossError, IncompleteBatchError, OffsetOutOfRange
from ...forks import fork_safe_lock
from ...format import crc32c
from ...maintenance.retention import Unit
from ...projection import COLUMNS, Part, Projection
from ...records import RecordBatch, limit_records
from ...retries import REFETCHES, damaged, log_cured
from .. import reader
from ..index import OFFSET_ENTRY, TIME_ENTRY, Entries
from ..segment import DECODE, ENTRY_PREFIX_SIZE, Entry, SegmentReplaced, iter_entries
from ..stream_store import Snapshot, StreamStore
from .manifest import Manifest, ManifestCache, TieredObject, TieredSegment
from .target import Tier

__all__ = ["TieredReader", "View", "local_units", "make_view"]

log = logging.getLogger("disklesslog")

_RETRIES = 20
"""Fresh snapshots a retention pass takes while compaction keeps replacing segments."""
_INDEX_MEMO = 256
"""Parsed index objects kept per log (they are immutable; a few KiB each)."""


@dataclass(frozen=True)
class View:
    """What one read sees of a stream: its extent, where the local part starts, the
    tiered segments that serve the offsets below that, and the local snapshot."""

    start_offset: int
    local_start: int
    end_offset: int
    tiered: tuple[TieredSegment, ...]
    snapshot: Snapshot
    manifest: Manifest | None

    def segment_at(self, offset: int) -> TieredSegment:
        """The tiered segment holding ``offset`` (which lies in ``[start, local start)``)."""
        index = bisect_right(self.tiered, offset, key=_base_offset) - 1
        return self.tiered[max(0, index)]


def _base_offset(seg: TieredSegment) -> int:
    return seg.base_offset


class TieredReader:
    """Reads of the tiered streams of one log (thread-safe)."""

    def __init__(self, tier: Tier, manifests: ManifestCache) -> None:
        self.tier = tier
        self.manifests = manifests
        self._lock = fork_safe_lock()
        self._indexes: OrderedDict[str, Entries] = OrderedDict()

    # ----------------------------------------------------------------- views

    def view(self, store: StreamStore) -> View:
        """The stream as a read sees it now (local snapshot first, then the manifest, so
        a trim that happens in between is seen in full by the manifest)."""
        snap = store.snapshot()
        return make_view(snap, self.manifests.get(store.directory))

    # ----------------------------------------------------------------- reads

    def read_batches(
        self, store: StreamStore, start: int | None, end: int | None, max_records: int | None
    ) -> Iterator[RecordBatch]:
        """Batches of ``[start, end)`` across the tiered and the local part; the range is
        checked now, reading is lazy (see :func:`reader.read_batches`)."""
        return limit_records(self.read(store, start, end, COLUMNS), max_records)

    def read(
        self, store: StreamStore, start: int | None, end: int | None, projection: Projection[Part]
    ) -> Iterator[Part]:
        """What ``projection`` takes from the records of ``[start, end)``, across the
        tiered and the local part (see :func:`reader.read`)."""
        v = self.view(store)
        lo = v.start_offset if start is None else start
        if not v.start_offset <= lo <= v.end_offset:
            raise OffsetOutOfRange(
                f"offset {lo} is outside the range of stream {store.name!r}, "
                f"[{v.start_offset}, {v.end_offset}]",
                start_offset=v.start_offset,
                end_offset=v.end_offset,
            )
        hi = v.end_offset if end is None else min(end, v.end_offset)
        return self._read(store, v, lo, hi, projection)

    def _read(
        self, store: StreamStore, v: View, lo: int, hi: int, projection: Projection[Part]
    ) -> Iterator[Part]:
        while lo < hi:
            if lo < v.local_start:
                seg = v.segment_at(lo)
                stop = min(hi, v.local_start, seg.end_offset)
                yield from self._segment_parts(store, seg, lo, stop, projection)
                lo = stop
                continue
            try:
                for part in reader.read(store, lo, hi, projection):
                    lo = projection.offsets(part)[-1] + 1
                    yield part
                return
            except OffsetOutOfRange:
                # The local copies were deleted under this read (tiered meanwhile) or
                # trimmed: look again; a tiered offset continues from the tier.
                fresh = self.view(store)
                if not fresh.start_offset <= lo < fresh.local_start:
                    raise self._trimmed(store, lo, fresh) from None
                v = fresh

    def _segment_parts(
        self,
        store: StreamStore,
        seg: TieredSegment,
        lo: int,
        hi: int,
        projection: Projection[Part],
    ) -> Iterator[Part]:
        """What ``projection`` takes from one tiered segment, clipped to ``[lo, hi)``."""
        for _, base, header, batch in self._entries(store, seg, lo, projection):
            if base >= hi:
                return
            part = projection.clip(base, header, batch, lo, hi)
            if len(part):
                yield part

    def _entries(
        self,
        store: StreamStore,
        seg: TieredSegment,
        offset: int,
        projection: Projection[Any] = COLUMNS,
    ) -> Iterator[Entry]:
        """Entries of a tiered segment from the one holding ``offset``, decoded as
        ``projection`` needs: those below it are only peeked. Checks that the entries
        end at the segment's end.

        Bytes that fail a check may have been damaged on their way (or in the cache), so
        the walk fetches them again straight from storage and goes on from the end of
        the last entry that passed (a peeked entry proves nothing: before the first
        checked one, from where the walk began), never yielding an entry twice; after
        :data:`~disklesslog.retries.REFETCHES` failed fetches, or the same failure twice,
        the object is damaged (:mod:`disklesslog.retries`). As the walk moves on, what
        passed is confirmed to the block cache."""
        tier = self.tier
        key, size = seg.log.key, seg.log.size
        source = tier.object_url(key)
        refresh_to = -1  # reads starting at or before this byte go straight to storage
        passed = [-1, -1]  # bytes [from, to) of checked entries not yet confirmed

        def confirm() -> None:
            if passed[1] > passed[0] >= 0:
                tier.confirm(key, passed[0], passed[1])
                passed[0] = passed[1]

        def read(length: int, at: int) -> bytes:
            confirm()  # the walker asks for more only once it is done with what it had
            return tier.read(key, at, min(at + length, size), refresh=at <= refresh_to)

        with self._reading(store, seg, offset):
            hint = self._index(seg.index, OFFSET_ENTRY).floor(offset - seg.base_offset)
            position, base = (hint[1], seg.base_offset + hint[0]) if hint else (0, seg.base_offset)
            expected = base
            yielded = -1  # position of the last entry yielded
            refetches = 0
            previous: tuple[int | None, str] | None = None  # a failure after a refetch
            try:
                while True:
                    try:
                        for entry in iter_entries(
                            read,
                            source,
                            position,
                            size,
                            base,
                            max_batch_bytes=store.config.max_batch_bytes,
                            mode=DECODE,
                            skip_below=offset,
                            decode=projection.decode,
                        ):
                            at, first, header, _ = entry
                            expected = first + header.span
                            if expected > offset:  # checked, not only peeked
                                position, base = at + ENTRY_PREFIX_SIZE + header.size, expected
                                passed[0] = at if passed[0] < 0 else passed[0]
                                passed[1] = position
                            if at > yielded:
                                yielded = at
                                yield entry
                        break
                    except DataLossError:
                        raise
                    except CorruptDataError as exc:
                        failure = _damage(exc)
                        bad = position if failure.position is None else failure.position
                        signature = (failure.position, failure.reason)
                        if refetches == REFETCHES or signature == previous:
                            tier.discard(key, position, max(bad, refresh_to) + 1)
                            raise damaged(failure, refetches, same=signature == previous) from None
                        previous = signature if refetches else None
                        refetches += 1
                        tier.metrics.add("tier_refetches")
                        refresh_to = bad
                        passed[0] = passed[1]  # a block holding bad bytes is not confirmed
                if refetches:
                    log_cured(failure, refetches)
            finally:
                confirm()
        if expected != seg.end_offset:
            raise CorruptDataError(
                f"entries end at offset {expected}, the manifest says {seg.end_offset}",
                source=source,
                position=size,
            )

    @contextlib.contextmanager
    def _reading(self, store: StreamStore, seg: TieredSegment, offset: int) -> Iterator[None]:
        """A missing object of a segment the manifest no longer lists was trimmed and
        collected under this read (:class:`OffsetOutOfRange`, as for local segments);
        of a listed one, it is lost (:class:`DataLossError` propagates)."""
        try:
            yield
        except DataLossError:
            if self._still_listed(store, seg):
                raise
            raise self._trimmed(store, offset, self.view(store)) from None

    def offset_for_time(self, store: StreamStore, timestamp: int) -> int | None:
        """First offset whose record timestamp is >= ``timestamp`` (Kafka's rule): tiered
        segments are skipped by their max timestamp and narrowed with their time index,
        then the local part answers. If local copies were deleted meanwhile (the local
        start moved), the answer may have skipped them: it looks again."""
        for _ in range(_RETRIES):
            v = self.view(store)
            for seg in v.tiered:
                if seg.max_timestamp < timestamp:
                    continue
                with self._reading(store, seg, seg.base_offset):
                    hint = self._index(seg.timeindex, TIME_ENTRY).below(timestamp)
                lo = max(v.start_offset, seg.base_offset + (hint[1] if hint else 0))
                for batch in self._segment_parts(store, seg, lo, v.local_start, COLUMNS):
                    for offset, ts in zip(batch.offsets, batch.timestamps):
                        if ts >= timestamp:
                            return offset
            found = reader.offset_for_time(store, timestamp)
            if store.snapshot().start_offset == v.local_start:
                return found
        raise CorruptDataError(
            "the local start keeps moving while offset_for_time runs",
            source=str(store.directory),
        )

    def retention_units(self, store: StreamStore) -> tuple[list[Unit], int]:
        """Tiered segments below the local start, then the local closed segments, and
        the active segment's size (what retention judges)."""
        v = self.view(store)
        units = [
            Unit(seg.base_offset, seg.end_offset, seg.size, seg.max_timestamp) for seg in v.tiered
        ]
        local, tail = local_units(store, v.snapshot)
        return units + local, tail

    # --------------------------------------------------------------- helpers

    def _index(self, obj: TieredObject, entry: struct.Struct) -> Entries:
        """A tiered segment's ``.index``/``.timeindex`` object, parsed (and memoized: keys
        are content addressed). One that fails its CRC is fetched again like a segment's
        bytes; if it still fails, it is ignored with a warning: it is a hint, and a read
        without it scans the segment from its start."""
        with self._lock:
            found = self._indexes.get(obj.key)
            if found is not None:
                self._indexes.move_to_end(obj.key)
                return found
        tier = self.tier
        raw = tier.read(obj.key, 0, obj.size) if obj.size else b""
        refetches = 0
        previous: bytes | None = None
        while not _index_passes(raw, obj, entry) and refetches < REFETCHES and raw != previous:
            previous = raw if refetches else None
            refetches += 1
            tier.metrics.add("tier_refetches")
            raw = tier.read(obj.key, 0, obj.size, refresh=True)
        parsed = Entries(entry)
        if not _index_passes(raw, obj, entry):
            tier.discard(obj.key, 0, obj.size)
            log.warning("%s fails its checksum; reading without it", tier.object_url(obj.key))
        else:
            if obj.size:
                tier.confirm(obj.key, 0, obj.size)
            if refetches:
                failure = CorruptDataError(
                    "index object fails its checksum", source=tier.object_url(obj.key)
                )
                log_cured(failure, refetches)
            for key, value in entry.iter_unpack(raw):
                parsed.keys.append(key)
                parsed.values.append(value)
        with self._lock:
            self._indexes[obj.key] = parsed
            while len(self._indexes) > _INDEX_MEMO:
                self._indexes.popitem(last=False)
        return parsed

    def _still_listed(self, store: StreamStore, seg: TieredSegment) -> bool:
        manifest = self.manifests.get(store.directory)
        return manifest is not None and any(s.log.key == seg.log.key for s in manifest.tiered_run())

    @staticmethod
    def _trimmed(store: StreamStore, offset: int, v: View) -> OffsetOutOfRange:
        return OffsetOutOfRange(
            f"offset {offset} of {store.name!r} was trimmed while reading",
            start_offset=v.start_offset,
            end_offset=v.end_offset,
        )


def _index_passes(raw: bytes, obj: TieredObject, entry: struct.Struct) -> bool:
    return len(raw) == obj.size and crc32c(raw) == obj.crc32c and len(raw) % entry.size == 0


def _damage(exc: CorruptDataError) -> CorruptDataError:
    """What a failed walk of a tiered segment means: nothing is being appended to an
    object, so an entry cut short is damage too."""
    if isinstance(exc, IncompleteBatchError):
        return CorruptDataError(
            f"object ends inside an entry ({exc.reason})", source=exc.source, position=exc.position
        )
    return exc


def make_view(snap: Snapshot, manifest: Manifest | None) -> View:
    """A :class:`View` of a local snapshot and a manifest: the tiered segments serve the
    offsets from the manifest's start offset up to the local start, if they reach it."""
    local_start = snap.start_offset
    start = local_start
    run: tuple[TieredSegment, ...] = ()
    if manifest is not None and manifest.start_offset < local_start:
        usable = tuple(s for s in manifest.tiered_run() if s.base_offset < local_start)
        if usable and usable[-1].end_offset >= local_start:
            start, run = manifest.start_offset, usable
    return View(start, local_start, snap.end_offset, run, snap, manifest)


def local_units(store: StreamStore, snap: Snapshot) -> tuple[list[Unit], int]:
    """Retention units of the local part: its closed segments from the local start, and
    the active segment's size. A segment file compaction replaced meanwhile makes it
    look again with a fresh snapshot."""
    for _ in range(_RETRIES):
        try:
            found = []
            for seg, size in snap.segments[:-1]:
                if seg.end_offset > snap.start_offset:
                    store.ensure_indexes(seg)
                    found.append(Unit(seg.base, seg.end_offset, size, seg.max_timestamp))
            return found, snap.segments[-1][1]
        except (SegmentReplaced, FileNotFoundError):
            snap = store.snapshot(fresh=True)
    raise CorruptDataError(
        "segment files keep changing while retention reads them", source=str(store.directory)
    )
