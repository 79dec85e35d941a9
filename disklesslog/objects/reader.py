"""Reading a stream of the object backend: locations from the sequencer, bytes from objects.

``find_batches`` pages through a stream's batch locations; consecutive locations in one
object (close enough together) are fetched as one byte range through the process-wide
block cache; every batch is checked against its checksum *and* its coordinates, then
decoded into columns (for a read of offsets alone, only where they have gaps; see
:mod:`disklesslog.projection`). The first page fixes the end offset: a read returns what was
committed when it started.

Offsets may have no record: key compaction drops records (a batch's span may exceed its
record count) and whole batches (a stretch of offsets with no batch at all). Pages come
from the batch holding an offset *or the next one after it*, and every batch is clipped
to the range asked for, so reads from any start skip such gaps.

Maintenance swaps batches into new objects while reads run, and garbage collection
deletes the old objects after a grace period. A read that meets a deleted object asks
the sequencer again where the offsets it still needs live: if they moved, it reads
them there; only an object the sequencer *still* references is missing data
(:class:`~disklesslog.DataLossError`).

A batch that fails its check may have been damaged on its way (the network, the block
cache), not in storage: its range is fetched again straight from storage, bypassing and
replacing the cached blocks, a bounded number of times (:mod:`disklesslog.retries`)
before it is reported as :class:`~disklesslog.CorruptDataError`. Reads use the cache as
a checked reader: each run's bytes that passed are confirmed to it, so only they reach
its disk tier (:mod:`disklesslog.storage.cache`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CorruptDataError, DataLossError
from ..format import BatchHeader
from ..projection import COLUMNS, Part, Projection
from ..records import RecordBatch, limit_records
from ..retries import refetched
from ..sequencers.base import BatchLocation, BatchPage

if TYPE_CHECKING:
    from .log import ObjectLog

__all__ = [
    "COALESCE_GAP",
    "Run",
    "check_coordinates",
    "offset_for_time",
    "read",
    "read_batches",
    "runs",
]

PAGE_BYTES = 8 << 20
"""Bytes of batch locations asked for per ``find_batches`` call."""
COALESCE_GAP = 256 << 10
"""Neighbouring batches of one object this close are fetched as one range."""


@dataclass
class Run:
    """Batches of one object read with one ranged fetch."""

    object_key: str
    start: int
    end: int
    batches: list[BatchLocation]


def read_batches(
    log: ObjectLog, stream: str, start: int | None, end: int | None, max_records: int | None
) -> Iterator[RecordBatch]:
    """Batches covering ``[start, end)``, clipped; range errors raise now, reads are lazy."""
    return limit_records(read(log, stream, start, end, COLUMNS), max_records)


def read(
    log: ObjectLog, stream: str, start: int | None, end: int | None, projection: Projection[Part]
) -> Iterator[Part]:
    """What ``projection`` takes from the records of ``[start, end)``, batch by batch
    (empty parts left out); range errors raise now, reads are lazy."""
    sequencer = log.sequencer
    if start is None:
        start = sequencer.stream_info(stream).start_offset
    page = sequencer.find_batches(stream, start, PAGE_BYTES)
    hi = page.end_offset if end is None else min(end, page.end_offset)
    return _read(log, stream, page, start, hi, projection)


def _read(
    log: ObjectLog, stream: str, page: BatchPage, lo: int, hi: int, projection: Projection[Part]
) -> Iterator[Part]:
    config = log.stream_config(stream, create=False)
    max_batch_bytes = config.max_batch_bytes if config else 1 << 31
    missing: tuple[str, int] | None = None  # the object found missing, at offset lo
    while lo < hi:
        wanted = [b for b in page.batches if b.base_offset < hi and b.last_offset >= lo]
        if not wanted:
            return
        for run in runs(wanted):
            checked = run.start  # the run's bytes up to here passed their checks
            try:
                data = log.fetch(run.object_key, run.start, run.end)
                for location in run.batches:
                    try:
                        header, batch = _decode(
                            data, run.start, location, max_batch_bytes, projection
                        )
                    except CorruptDataError as failure:
                        header, batch = _refetched(
                            log, location, failure, max_batch_bytes, projection
                        )
                    checked = location.position + location.size
                    part = projection.clip(location.base_offset, header, batch, lo, hi)
                    lo = location.last_offset + 1
                    if len(part):
                        yield part
                    if lo >= hi:
                        return
            except DataLossError:
                # Deleted after maintenance replaced it? Then fresh locations lead
                # elsewhere; the same object again means it is really gone.
                if missing == (run.object_key, lo):
                    raise
                missing = (run.object_key, lo)
                log.storage.metrics.add("stale_locations")
                break
            finally:
                log.confirm(run.object_key, run.start, checked)
        page = log.sequencer.find_batches(stream, lo, PAGE_BYTES)


def _refetched(
    log: ObjectLog,
    location: BatchLocation,
    failure: CorruptDataError,
    max_batch_bytes: int,
    projection: Projection[Any],
) -> tuple[BatchHeader, RecordBatch | None]:
    """The batch at ``location``, whose bytes failed ``failure`` (from the cache or from
    storage), fetched again straight from storage (:mod:`disklesslog.retries`): bytes
    that pass are logged as a cure and replace the cached ones; bytes that fail on
    every fetch, or come back the same twice, are damage, dropped from the cache and
    reported as :class:`CorruptDataError` naming the object and position."""
    key, start = location.object_key, location.position
    end = start + location.size
    try:
        return refetched(
            lambda: log.fetch(key, start, end, refresh=True),
            lambda data: _decode(data, start, location, max_batch_bytes, projection),
            failure,
            metrics=log.storage.metrics,
            counter="refetches",
        )
    except DataLossError:
        raise
    except CorruptDataError:
        log.discard(key, start, end)
        raise


def runs(
    locations: list[BatchLocation], *, gap: int = COALESCE_GAP, max_bytes: int | None = None
) -> list[Run]:
    """Group consecutive locations into ranged fetches, one object at a time: a location
    joins the previous run if it is in the same object, after it and at most ``gap``
    bytes further, and (with ``max_bytes``) the run stays within that many bytes."""
    found: list[Run] = []
    for location in locations:
        last = found[-1] if found else None
        end = location.position + location.size
        if (
            last is not None
            and last.object_key == location.object_key
            and last.end <= location.position <= last.end + gap
            and (max_bytes is None or end - last.start <= max_bytes)
        ):
            last.end = end
            last.batches.append(location)
        else:
            found.append(Run(location.object_key, location.position, end, [location]))
    return found


def _decode(
    data: bytes,
    base: int,
    location: BatchLocation,
    max_batch_bytes: int,
    projection: Projection[Any],
) -> tuple[BatchHeader, RecordBatch | None]:
    """The batch at ``location`` out of ``data``, the object's bytes from ``base`` on."""
    at = location.position - base
    source = f"object {location.object_key}"
    if len(data) < at + location.size:
        raise CorruptDataError(
            f"object is {base + len(data)} bytes, the batch at {location.position} "
            f"needs {location.size} more",
            source=source,
            position=location.position,
        )
    try:
        header, batch = projection.decode(
            data, at, location.base_offset, max_batch_bytes=max_batch_bytes
        )
    except CorruptDataError as exc:
        raise exc.located(source, base) from None
    check_coordinates(header, location)
    return header, batch


def check_coordinates(header: BatchHeader, location: BatchLocation) -> None:
    """Refuse a (checksummed) batch that is not the one the sequencer describes: another
    size or offset span means the location points at the wrong bytes."""
    if (
        header.size != location.size
        or location.base_offset + header.span - 1 != location.last_offset
    ):
        raise CorruptDataError(
            f"batch does not match its coordinates (offsets {location.base_offset}.."
            f"{location.last_offset}, {location.size} bytes)",
            source=f"object {location.object_key}",
            position=location.position,
        )


def offset_for_time(log: ObjectLog, stream: str, timestamp: int) -> int | None:
    """First offset whose record timestamp is >= ``timestamp`` (Kafka's rule): the
    sequencer names the first batch whose max timestamp reaches it; the records decide."""
    candidate = log.sequencer.offset_for_time(stream, timestamp)
    if candidate is None:
        return None
    for batch in read_batches(log, stream, candidate, None, None):
        for offset, ts in zip(batch.offsets, batch.timestamps):
            if ts >= timestamp:
                return offset
    return None
