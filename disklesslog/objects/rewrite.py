"""What merging and key compaction share: reading a stream's batches for a rewrite, and
swapping a rewritten object in.

Both follow one protocol, which is what makes them safe to run from any process while
others read, write and maintain the same log, and to kill at any moment:

1. List the stream's live batches (a snapshot; it may be stale by the time it is used).
2. Read the batches from storage (:class:`SourceReader`), checking every one against its
   checksum and its coordinates; nothing unverified is ever copied.
3. Write the result as a *new* object under a fresh key (:func:`upload`), never over an
   existing one.
4. Swap it in with one ``Sequencer.replace_batches`` call (:func:`swap`), which applies
   only if every batch it replaces is still live. If a retention trim, another
   maintainer or a deleted stream got there first, nothing changes and the new object
   is recorded as an orphan: a stale result is never applied.

A crash between 3 and 4 leaves an object the sequencer never heard of; garbage
collection's reconcile pass deletes it once it is old enough (``objects/gc.py``). The
new object is swapped in right after its upload, within ``UPLOAD_MAX_AGE`` of it like a
writer's commit, or not at all, so that pass can never take it while it is on its way.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..errors import CorruptDataError, DataLossError, SequencerConflict, StreamNotFound
from ..format import BatchHeader, check_batch, decode_batch
from ..records import RecordBatch
from ..retries import refetched
from ..sequencers.base import BatchLocation
from .reader import check_coordinates, runs
from .writer import UPLOAD_MAX_AGE

if TYPE_CHECKING:
    from ..maintenance.report import MaintenanceReport
    from .log import ObjectLog

__all__ = [
    "MAX_RANGE_BYTES",
    "SourceReader",
    "live_snapshot",
    "replaced_meanwhile",
    "swap",
    "upload",
]

log = logging.getLogger("disklesslog")

T = TypeVar("T")

MAX_RANGE_BYTES = 16 << 20
"""Largest ranged GET a rewrite makes: neighbouring batches of one object are fetched
together up to this size, which also bounds the bytes held per fetch."""


def live_snapshot(object_log: ObjectLog, stream: str) -> list[BatchLocation]:
    """The live batches of ``stream`` from its start offset, in offset order (a listing
    that follows the start offset if retention moves it meanwhile)."""
    return list(object_log.live_batches(stream))


_Check = Callable[[bytes, int, BatchLocation], tuple[BatchHeader, T]]
"""Checks the batch at a position of fetched bytes: its header and what the caller
wants of it (its bytes, its records); raises CorruptDataError located in those bytes."""


class SourceReader:
    """Reads batches for a rewrite with coalesced ranged GETs straight from storage.

    Not through the process's block cache: a rewrite reads a stream's whole cleanable
    range once, which would evict what readers need, and gains nothing from caching.
    A batch that fails its check is fetched again (alone, straight from storage) like a
    reader's (:func:`~disklesslog.retries.refetched`, counted in ``refetches``): bytes
    damaged on their way cost a GET and a warning, not the pass; only bytes that fail on
    every fetch, or that storage returns the same twice, are reported as damage.
    Counts the objects and bytes it reads for the report.
    """

    def __init__(self, object_log: ObjectLog, max_batch_bytes: int) -> None:
        self._log = object_log
        self._max_batch_bytes = max_batch_bytes
        self.objects: set[str] = set()
        self.bytes = 0
        self.missing: str | None = None
        """An object found missing (DataLossError): the caller decides whether its
        batches were replaced meanwhile or are lost."""

    def raw(self, locations: Sequence[BatchLocation]) -> Iterator[tuple[BatchLocation, bytes]]:
        """Each batch's bytes, verified (checksum, header, coordinates) but not decoded."""

        def check(data: bytes, at: int, location: BatchLocation) -> tuple[BatchHeader, bytes]:
            header = check_batch(data, at, max_batch_bytes=self._max_batch_bytes)
            return header, data[at : at + location.size]

        return self._verified(locations, check)

    def decoded(
        self, locations: Sequence[BatchLocation]
    ) -> Iterator[tuple[BatchLocation, RecordBatch]]:
        """Each batch decoded into columns (checksum, structure and coordinates checked)."""

        def check(data: bytes, at: int, location: BatchLocation) -> tuple[BatchHeader, RecordBatch]:
            return decode_batch(
                data, at, location.base_offset, max_batch_bytes=self._max_batch_bytes
            )

        return self._verified(locations, check)

    def tally(self, report: MaintenanceReport) -> None:
        """Add what was read to ``report``."""
        report.add(objects_read=len(self.objects), bytes_read=self.bytes)

    def _verified(
        self, locations: Sequence[BatchLocation], check: _Check[T]
    ) -> Iterator[tuple[BatchLocation, T]]:
        """What ``check`` makes of each batch, fetched lazily, one coalesced range at a
        time; a batch that fails is fetched again on its own."""
        for run in runs(list(locations), max_bytes=MAX_RANGE_BYTES):
            data = self._get(run.object_key, run.start, run.end)
            for location in run.batches:
                at = location.position - run.start
                try:
                    value = _checked(check, data, at, location)
                except CorruptDataError as failure:
                    start, end = location.position, location.position + location.size
                    value = refetched(
                        functools.partial(self._get, location.object_key, start, end),
                        functools.partial(_checked, check, at=0, location=location),
                        failure,
                        metrics=self._log.storage.metrics,
                        counter="refetches",
                        previous=data[at : at + location.size],
                    )
                yield location, value

    def _get(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of object ``key`` from storage, counted; a missing
        object is remembered (:attr:`missing`) and its DataLossError raised."""
        try:
            data = self._log.storage.get_range(key, start, end)
        except DataLossError:
            self.missing = key
            raise
        self.objects.add(key)
        self.bytes += len(data)
        return data


def _checked(check: _Check[T], data: bytes, at: int, location: BatchLocation) -> T:
    """``check`` of the batch at ``location``, ``at`` bytes into ``data`` (fetched from
    ``location.position - at``): failures are located in the object, and the batch must
    be whole and match its coordinates."""
    base = location.position - at
    if len(data) < at + location.size:
        raise CorruptDataError(
            f"object is {base + len(data)} bytes, the batch at {location.position} needs "
            f"{location.size}",
            source=f"object {location.object_key}",
            position=location.position,
        )
    try:
        header, value = check(data, at, location)
    except CorruptDataError as exc:
        raise exc.located(f"object {location.object_key}", base) from None
    check_coordinates(header, location)
    return value


def replaced_meanwhile(object_log: ObjectLog, stream: str, reader: SourceReader) -> bool:
    """After a DataLossError while ``reader`` read ``stream``: whether the missing object
    no longer holds a live batch of the stream (a rewrite elsewhere replaced them, or the
    stream was deleted, and garbage collection deleted it: the caller's snapshot was
    stale). If the sequencer still references it, the data is lost and the caller raises."""
    if reader.missing is None:
        return False
    try:
        live = {b.object_key for b in live_snapshot(object_log, stream)}
    except StreamNotFound:
        return True  # deleted with its stream
    return reader.missing not in live


def upload(object_log: ObjectLog, kind: str, parts: Sequence[bytes]) -> tuple[str, int, float]:
    """Store ``parts`` joined as a new object of ``kind`` under a fresh key, and hand it to
    this process's cache (readers of the stream want it next). Returns ``(key, size,
    monotonic time the upload finished)``."""
    key = object_log.storage.new_key(kind)
    data = b"".join(parts)
    object_log.storage.put(key, data)
    uploaded_at = time.monotonic()
    object_log.cache_object(key, data)
    return key, len(data), uploaded_at


def swap(
    object_log: ObjectLog,
    stream: str,
    olds: Sequence[BatchLocation],
    news: Sequence[BatchLocation],
    uploaded: tuple[str, float] | None,
) -> bool:
    """Replace ``olds`` (consecutive live batches) with ``news`` in one sequencer step.

    ``uploaded`` is ``(key, monotonic upload time)`` of the new object holding ``news``,
    ``None`` when nothing survived (the offsets become a gap). Returns whether the swap
    applied; when it did not (a batch was no longer live, the stream was deleted, the
    sequencer lost every race for its log and applied nothing, or the upload is older
    than ``UPLOAD_MAX_AGE``), or its outcome is unknown (an exception, re-raised), the
    new object is recorded as an orphan for garbage collection. Recording an object the
    swap did store is a no-op, so that is safe.
    """
    if uploaded is not None and time.monotonic() - uploaded[1] > UPLOAD_MAX_AGE:
        _orphan(object_log, uploaded[0])
        return False
    try:
        applied = object_log.sequencer.replace_batches(
            stream, [b.batch_id for b in olds], list(news)
        )
    except (StreamNotFound, SequencerConflict):  # deleted; or too busy: nothing applied
        applied = False
    except BaseException:
        if uploaded is not None:
            _orphan(object_log, uploaded[0])
        raise
    if not applied and uploaded is not None:
        _orphan(object_log, uploaded[0])
    return applied


def _orphan(object_log: ObjectLog, key: str) -> None:
    """Record ``key`` as garbage; if even that fails, the reconcile pass finds it."""
    try:
        object_log.sequencer.record_orphan(key)
    except Exception:
        log.warning("could not record orphan object %s", key, exc_info=True)
    object_log.storage.metrics.add("orphaned_objects")
