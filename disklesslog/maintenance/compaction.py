"""Key compaction, the part both backends share: which records survive, and how the
survivors are laid out again.

Compaction keeps the latest record per key (Kafka's log cleaner). A pass works on a
*cleanable range* of a stream, which never includes its active tail:

1. Build a :class:`KeyMap`, the latest offset of every key in the *dirty* part of the
   range (written since the previous pass). It is built per batch in C
   (``dict.update(zip(keys, offsets))``: later records overwrite earlier ones).
2. Rewrite the range from the stream's start: a record survives if no later record of
   its key is in the map, unless it is a tombstone (``value is None``) written more than
   ``delete_retention_ms`` ago (:func:`survivors`). Records of the clean part that the
   map does not mention survive: the previous pass already made their keys unique.
3. Lay the survivors out again (:func:`retile`) as batches that cover the rewritten
   offsets exactly: every offset keeps its record or becomes a gap, the next batch still
   starts where the range ended, so segments stay contiguous and readers skip the gaps
   (``docs/format.md``: a batch's span may exceed its record count).

The backends decide the ranges (closed segments locally; batches older than the tail on
object storage), write the new batches and swap them in atomically.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, pairwise, repeat
from typing import Any

from ..config import StreamConfig
from ..errors import ConfigError
from ..format import HEADER_SIZE, EncodedBatch, encode_batch
from ..records import Headers, RecordBatch

__all__ = [
    "DEFAULT_MAX_KEYS",
    "KeyMap",
    "Piece",
    "dirty_ratio",
    "encode_piece",
    "horizon",
    "payload_bytes",
    "retile",
    "survivors",
    "target_batch_bytes",
]

DEFAULT_MAX_KEYS = 4_000_000
"""Keys a pass maps at most (Kafka's dedupe buffer, by count): a larger dirty range is
compacted in several passes, each up to where its map filled."""
_RECORD_OVERHEAD = 24  # msgpack framing per record in a rewritten batch, generously


class KeyMap:
    """The latest offset of each key seen so far (keys as bytes; keyless records are
    not mapped, so they always survive)."""

    __slots__ = ("latest", "max_keys", "reached")

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.latest: dict[bytes | None, int] = {}
        self.max_keys = max_keys
        self.reached = -1
        """One past the last offset mapped (-1: nothing yet)."""

    def __len__(self) -> int:
        return len(self.latest)

    @property
    def full(self) -> bool:
        return len(self.latest) >= self.max_keys

    def add(self, batch: RecordBatch) -> None:
        """Map every record of ``batch`` (in offset order, after what is mapped)."""
        if not len(batch):
            return
        self.latest.update(zip(batch.keys, batch.offsets))
        self.latest.pop(None, None)
        self.reached = batch.offsets[-1] + 1

    def supersedes(self, batch: RecordBatch) -> bool:
        """Whether some record of ``batch`` has a later record of its key in the map."""
        get = self.latest.get
        return not all(map(operator.eq, map(get, batch.keys, batch.offsets), batch.offsets))


def survivors(batch: RecordBatch, key_map: KeyMap, horizon_ms: int) -> RecordBatch | None:
    """The records of ``batch`` compaction keeps: the latest of their key (or of a key
    the map does not know), except tombstones older than ``horizon_ms``. Returns
    ``batch`` itself when everything stays, ``None`` when nothing does. No Python code
    runs per record: the masks are built with C-level ``map``."""
    keys, offsets, values = batch.keys, batch.offsets, batch.values
    latest = map(operator.eq, map(key_map.latest.get, keys, offsets), offsets)
    if None in values:  # tombstones: they stay until the horizon passes
        alive = map(
            operator.or_,
            map(operator.is_not, values, repeat(None)),
            map(operator.ge, batch.timestamps, repeat(horizon_ms)),
        )
        mask = list(map(operator.and_, latest, alive))
    else:
        mask = list(latest)
    kept = mask.count(True)
    if kept == len(mask):
        return batch
    if not kept:
        return None
    return RecordBatch(
        list(compress(offsets, mask)),
        list(compress(batch.timestamps, mask)),
        list(compress(keys, mask)),
        list(compress(values, mask)),
        list(compress(batch.headers, mask)),
    )


@dataclass(frozen=True)
class Piece:
    """A rewritten batch: it covers offsets ``[base, base + span)`` and holds
    ``records`` (a subset of them, in order)."""

    base: int
    span: int
    records: RecordBatch

    @property
    def end(self) -> int:
        return self.base + self.span


def retile(start: int, end: int, kept: Iterable[RecordBatch], *, target_bytes: int) -> list[Piece]:
    """Lay surviving records out as batches that tile offsets ``[start, end)`` exactly:
    the first begins at ``start``, each next one where the previous ended, the last ends
    at ``end``; a batch is cut before it would exceed ``target_bytes`` of keys, values
    and headers (:func:`payload_bytes`). Returns ``[]`` when no record survived (the
    range becomes one gap)."""
    columns: list[list[Any]] = [[], [], [], [], []]
    for batch in kept:
        for column, values in zip(
            columns, (batch.offsets, batch.timestamps, batch.keys, batch.values, batch.headers)
        ):
            column.extend(values)
    offsets, timestamps, keys, values, headers = columns
    if not offsets:
        return []
    # Running byte totals (in C), then one bisect per batch boundary.
    totals = list(accumulate(_record_sizes(keys, values, headers)))
    cuts = [0]
    while cuts[-1] < len(totals):
        done = totals[cuts[-1] - 1] if cuts[-1] else 0
        cuts.append(max(cuts[-1] + 1, bisect_right(totals, done + target_bytes)))
    pieces = []
    for n, (lo, hi) in enumerate(pairwise(cuts)):
        base = start if n == 0 else offsets[lo]
        stop = end if hi == len(offsets) else offsets[hi]
        pieces.append(
            Piece(
                base,
                stop - base,
                RecordBatch(
                    offsets[lo:hi], timestamps[lo:hi], keys[lo:hi], values[lo:hi], headers[lo:hi]
                ),
            )
        )
    return pieces


def encode_piece(piece: Piece, config: StreamConfig) -> EncodedBatch:
    """Encode a :class:`Piece` with the stream's compression; its records keep their
    offsets, timestamps, keys, values and headers."""
    records = piece.records
    return encode_batch(
        records.values,
        records.keys,
        records.headers if any(records.headers) else None,
        list(records.timestamps),
        compression=config.compression_code,
        max_record_bytes=config.max_record_bytes,
        max_batch_bytes=config.max_batch_bytes,
        offset_deltas=list(map(operator.sub, records.offsets, repeat(piece.base))),
        last_offset_delta=piece.span - 1,
    )


def require_compacted(stream: str, config: StreamConfig) -> None:
    """A :class:`ConfigError` unless ``stream`` is compacted: naming a stream to compact
    that is not is a mistake worth hearing about (without a name, the others are
    skipped)."""
    if not config.compacted:
        raise ConfigError(
            f"stream {stream!r} has cleanup_policy={config.cleanup_policy!r}, so it is not "
            "compacted: only streams created with cleanup_policy='compact' or "
            "'compact,delete' are (compact() without a stream skips the others)"
        )


def target_batch_bytes(config: StreamConfig) -> int:
    """How large rewritten batches grow: half the stream's batch limit, at most 1 MiB
    (reads fetch whole batches), leaving room for framing."""
    return max(1024, min(1 << 20, (config.max_batch_bytes - HEADER_SIZE) // 2))


def dirty_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    """The share of the cleanable bytes written since the last pass (1.0 when nothing
    was ever compacted, 0.0 for an empty range)."""
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0


def horizon(config: StreamConfig, now_ms: int) -> int:
    """Tombstones with a timestamp below this are dropped."""
    return now_ms - config.delete_retention_ms


def payload_bytes(batch: RecordBatch) -> int:
    """About what ``batch``'s records take in a rewritten batch: keys, values, header
    keys and values, and generous framing per record (never less than they take)."""
    return sum(_record_sizes(batch.keys, batch.values, batch.headers))


def _record_sizes(
    keys: Sequence[bytes | None], values: Sequence[bytes | None], headers: Sequence[Headers]
) -> Iterator[int]:
    """Per record: key + value + headers + framing, in C unless some record has headers."""
    sizes = map(operator.add, map(_length, keys), map(_length, values))
    if any(headers):
        sizes = map(operator.add, sizes, map(_headers_length, headers))
    return map(operator.add, sizes, repeat(_RECORD_OVERHEAD))


def _headers_length(headers: Headers) -> int:
    return sum(len(key.encode()) + _length(value) + 8 for key, value in headers)


def _length(item: bytes | None) -> int:
    return 0 if item is None else len(item)
