"""The two shapes records take in memory: one :class:`Record`, or a :class:`RecordBatch` of columns.

A ``Record`` is a tuple subclass so millions can be built at C speed; a ``RecordBatch``
holds whole columns so bulk readers (Spark, compaction, analytics) never build a Python
object per record at all.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import NamedTuple

__all__ = ["Header", "Headers", "Record", "RecordBatch", "clip_offsets", "limit_records"]

Header = tuple[str, "bytes | None"]
"""One header: a text key and a binary (or null) value, as in Kafka."""

Headers = tuple[Header, ...]
"""A record's headers, in order; keys may repeat. Empty tuple when there are none."""


class Record(NamedTuple):
    """One record of a stream. Immutable; unpacks like a tuple.

    ``value is None`` is a tombstone for key compaction. ``timestamp`` is milliseconds
    since the Unix epoch.
    """

    offset: int
    """Its position in the stream: dense from 0, never reused (compaction and trimming
    leave gaps, they do not renumber)."""
    timestamp: int
    """When it was appended (or the time the producer gave), in milliseconds since the
    Unix epoch."""
    key: bytes | None
    """The key compaction keeps the latest record of, or ``None``."""
    value: bytes | None
    """The payload; ``None`` is a tombstone (deletes the key when compacted)."""
    headers: Headers = ()
    """``(str, bytes | None)`` pairs in the order appended; keys may repeat."""


_new_record = tuple.__new__


class RecordBatch:
    """Consecutive records of one stream as parallel columns, in offset order.

    Columns are read-only sequences of equal length: ``offsets`` (a ``range`` when the
    offsets are dense), ``timestamps``, ``keys``, ``values`` and ``headers``.
    """

    __slots__ = ("headers", "keys", "offsets", "timestamps", "values")

    def __init__(
        self,
        offsets: Sequence[int],
        timestamps: Sequence[int],
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        headers: Sequence[Headers],
    ) -> None:
        self.offsets = offsets
        """Each record's offset, ascending; a ``range`` when there are no gaps."""
        self.timestamps = timestamps
        """Each record's timestamp, in milliseconds since the Unix epoch."""
        self.keys = keys
        """Each record's key, or ``None``."""
        self.values = values
        """Each record's value; ``None`` is a tombstone."""
        self.headers = headers
        """Each record's headers: a tuple of ``(str, bytes | None)`` pairs."""

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        if not self.offsets:
            return "RecordBatch(<empty>)"
        return f"RecordBatch(offsets {self.offsets[0]}..{self.offsets[-1]}, {len(self)} records)"

    def records(self) -> Iterator[Record]:
        """Yield the batch as :class:`Record` objects (built in C, no Python frame per record)."""
        return map(
            _new_record,
            repeat(Record),
            zip(self.offsets, self.timestamps, self.keys, self.values, self.headers),
        )

    def __iter__(self) -> Iterator[Record]:
        return self.records()

    def between(self, start: int, end: int) -> RecordBatch:
        """The records whose offset is in ``[start, end)``, as a new batch (slices, no copies
        of the bytes themselves)."""
        offsets = self.offsets
        if not offsets or (offsets[0] >= start and offsets[-1] < end):
            return self
        lo = _bisect_left(offsets, start)
        hi = _bisect_left(offsets, end)
        return RecordBatch(
            offsets[lo:hi],
            self.timestamps[lo:hi],
            self.keys[lo:hi],
            self.values[lo:hi],
            self.headers[lo:hi],
        )

    def head(self, count: int) -> RecordBatch:
        """The first ``count`` records."""
        if count >= len(self):
            return self
        return RecordBatch(
            self.offsets[:count],
            self.timestamps[:count],
            self.keys[:count],
            self.values[:count],
            self.headers[:count],
        )

    def to_pylist(self) -> list[Record]:
        """All records as a list (convenience for small batches and tests)."""
        return list(self.records())


NO_RECORDS = RecordBatch((), (), (), (), ())
"""An empty batch (what clipping a batch to a range outside it gives)."""


def clip_offsets(offsets: Sequence[int], start: int, end: int) -> Sequence[int]:
    """The offsets in ``[start, end)`` of an ascending sequence (a slice, so a ``range``
    stays a ``range``)."""
    if not offsets or (offsets[0] >= start and offsets[-1] < end):
        return offsets
    return offsets[_bisect_left(offsets, start) : _bisect_left(offsets, end)]


def limit_records(batches: Iterator[RecordBatch], max_records: int | None) -> Iterator[RecordBatch]:
    """``batches`` cut after ``max_records`` records in all (``None``: not cut). Stops
    pulling from ``batches`` as soon as the limit is reached, so a lazy read reads no
    further."""
    if max_records is None:
        return batches
    return _limited(batches, max_records)


def _limited(batches: Iterator[RecordBatch], remaining: int) -> Iterator[RecordBatch]:
    if remaining <= 0:
        return
    for batch in batches:
        part = batch.head(remaining)
        remaining -= len(part)
        if len(part):
            yield part
        if remaining <= 0:
            return


def _bisect_left(offsets: Sequence[int], target: int) -> int:
    if isinstance(offsets, range):
        first = offsets[0] if offsets else 0
        return max(0, min(len(offsets), target - first))
    return bisect_left(offsets, target)
