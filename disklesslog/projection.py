"""What a read takes from each batch: every column, or the records' offsets alone.

Every read loop (local segments, tiered segments, objects) is written once over a
:class:`Projection`. :data:`COLUMNS` decodes whole batches into
:class:`~disklesslog.records.RecordBatch` columns (``Stream.read_batches``);
:data:`OFFSETS` yields only the offsets of the records (``Stream.read_offsets``) and
decodes a batch only when its offsets have compaction gaps: a dense batch's offsets
follow from its checksummed header, so counting a million records costs a checksum
pass, not a million decoded keys and values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, TypeVar

from .format import BatchHeader, decode_batch, decode_unless_dense
from .records import NO_RECORDS, RecordBatch, clip_offsets

__all__ = ["COLUMNS", "OFFSETS", "Part", "Projection"]

Part = TypeVar("Part", bound=Sized)
"""What a projection yields per batch: a :class:`RecordBatch`, or a sequence of offsets."""


@dataclass(frozen=True)
class Projection(Generic[Part]):
    """How a read turns a batch into what it yields (a ``Part``).

    ``decode(buf, pos, base_offset, max_batch_bytes=...)`` validates a batch (always
    its checksum) and returns its header and whatever of its records the projection
    needs, ``None`` if nothing. ``clip(base_offset, header, batch, lo, hi)`` gives the
    part of an entry within ``[lo, hi)`` (``batch`` is ``None`` for entries a reader
    only peeked at, which lie below ``lo``). ``offsets(part)`` are the offsets a part
    holds, for readers that resume after it.
    """

    decode: Callable[..., tuple[BatchHeader, RecordBatch | None]]
    clip: Callable[[int, BatchHeader, RecordBatch | None, int, int], Part]
    offsets: Callable[[Part], Sequence[int]]


def _clip_columns(
    base: int, header: BatchHeader, batch: RecordBatch | None, lo: int, hi: int
) -> RecordBatch:
    return NO_RECORDS if batch is None else batch.between(lo, hi)


def _clip_offsets(
    base: int, header: BatchHeader, batch: RecordBatch | None, lo: int, hi: int
) -> Sequence[int]:
    if batch is None:  # dense (or peeked, below lo: then the range is empty)
        return range(max(base, lo), min(base + header.span, hi))
    return clip_offsets(batch.offsets, lo, hi)


def _identity(offsets: Sequence[int]) -> Sequence[int]:
    return offsets


COLUMNS: Projection[RecordBatch] = Projection(decode_batch, _clip_columns, attrgetter("offsets"))
"""Whole batches as record columns."""

OFFSETS: Projection[Sequence[int]] = Projection(decode_unless_dense, _clip_offsets, _identity)
"""Offsets only: a ``range`` per dense batch, a tuple per batch with gaps."""
