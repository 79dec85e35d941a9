"""Batch encoding and decoding: the one place that knows the bytes of a batch.

``docs/format.md`` is the specification; this module is its reference implementation.
A batch is a fixed 53-byte little-endian header followed by a msgpack body that holds
the records as *columns*, so a whole batch decodes in one ``msgpack.unpackb`` call and
readers never run Python code per record. Offsets are not stored: a batch records only
its offset *span*, and whoever stores it (a segment file, the sequencer) knows its base
offset, so the same bytes live in a local segment or in a shared object unchanged.

Every length is checked against a limit before anything is allocated, both when
encoding (``max_record_bytes``, ``max_batch_bytes``) and when decoding (a corrupt
length field cannot make a reader allocate gigabytes).
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import islice, repeat
from operator import add, lt, sub
from typing import Any, NamedTuple

import crc32c as _crc32c
import msgpack
import zstandard

from .errors import (
    ConfigError,
    CorruptDataError,
    IncompleteBatchError,
    InvalidRecordError,
    RecordTooLarge,
)
from .records import Headers, RecordBatch

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_OFFSET",
    "MAX_TIMESTAMP",
    "BatchHeader",
    "EncodedBatch",
    "PreparedBatch",
    "as_column",
    "batch_size",
    "check_batch",
    "check_record",
    "compression_code",
    "crc32c",
    "decode_batch",
    "decode_unless_dense",
    "encode_batch",
    "encode_batch_borrowed",
    "encode_record",
    "now_ms",
    "peek_header",
    "prepare_batch",
    "restamp",
]

MAGIC = 1
"""Format version byte. Readers reject any other value."""

PREFIX = struct.Struct("<IBI")
"""length (u32), magic (u8), crc (u32): the part of the header the CRC does not cover."""

TAIL = struct.Struct("<HIIqqqhiI")
"""attributes, record_count, last_offset_delta, base_timestamp, max_timestamp,
producer_id, producer_epoch, base_sequence, body_size: covered by the CRC."""

PREFIX_SIZE = PREFIX.size  # 9
HEADER_SIZE = PREFIX_SIZE + TAIL.size  # 53
MIN_LENGTH = HEADER_SIZE - 4  # the length field counts the bytes after itself

COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
COMPRESSIONS = {"none": COMPRESSION_NONE, "zstd": COMPRESSION_ZSTD}
_COMPRESSION_MASK = 0x0007

DEFAULT_MAX_RECORD_BYTES = 1 << 20  # 1 MiB, Kafka's max.message.bytes neighbourhood
DEFAULT_MAX_BATCH_BYTES = 16 << 20
MAX_BATCH_BYTES_LIMIT = (1 << 31) - 1  # offsets inside a segment are u32; keep far below
ZSTD_LEVEL = 3

MAX_TIMESTAMP = (1 << 63) - 1
"""Latest record timestamp (ms since the epoch): a signed 64-bit field, as in Kafka."""
MAX_OFFSET = (1 << 63) - 1
"""Largest offset any log holds or accepts: offsets are signed 64-bit integers wherever
they are stored (segment entries, sequencer rows, Kafka's offsets), so every public call
refuses a larger one before it reaches a backend (:func:`disklesslog.api.check_offset`)."""

_BINARY_TYPES = frozenset({bytes, bytearray, type(None)})
_NONE = type(None)
_new_tuple = tuple.__new__
_DECODED_BINARY_TYPES = frozenset({bytes, type(None)})


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C (Castagnoli) of a bytes-like object, optionally continuing from ``value``."""
    return int(_crc32c.crc32c(data, value))


def now_ms() -> int:
    """Wall-clock time in milliseconds since the Unix epoch: the default record timestamp."""
    return time.time_ns() // 1_000_000


def compression_code(name: str | int) -> int:
    """The attribute code of a compression name (``"none"`` or ``"zstd"``)."""
    if isinstance(name, int) and name in COMPRESSIONS.values():
        return name
    try:
        return COMPRESSIONS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown compression {name!r}; choose one of {sorted(COMPRESSIONS)}"
        ) from None


class BatchHeader(NamedTuple):
    """The fixed header of a batch, as decoded. ``size`` is the whole batch in bytes."""

    size: int
    attributes: int
    record_count: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    body_size: int

    @property
    def span(self) -> int:
        """How many offsets the batch covers (``last_offset_delta + 1``)."""
        return self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & _COMPRESSION_MASK

    @property
    def dense(self) -> bool:
        """Whether the records hold every offset of the span (no compaction gaps), so
        their offsets follow from the header alone."""
        return self.record_count == self.last_offset_delta + 1


class EncodedBatch(NamedTuple):
    """An encoded batch and the facts a store needs without decoding it again.

    The batch is ``header + body``; they are kept apart so a store can hand both to
    one ``writev`` instead of copying every batch into a joined buffer.
    """

    header: bytes
    body: bytes | memoryview
    record_count: int
    last_offset_delta: int
    max_timestamp: int

    @property
    def data(self) -> bytes:
        """The whole batch as one bytes object (a copy)."""
        return self.header + bytes(self.body)

    @property
    def size(self) -> int:
        return len(self.header) + len(self.body)

    @property
    def span(self) -> int:
        return self.last_offset_delta + 1


# --------------------------------------------------------------------------- encoding

_local = threading.local()


def _pack(columns: list[Any]) -> bytes:
    """msgpack the body with this thread's reusable Packer.

    ``msgpack.packb`` starts from a small buffer and grows it by realloc, which costs
    over a millisecond and hundreds of page faults per megabyte; a Packer reused per
    thread keeps its buffer (up to the largest batch this thread encoded).
    """
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True, autoreset=True)
    try:
        return packer.pack(columns)  # type: ignore[no-any-return]
    except BaseException:
        packer.reset()
        raise


def _compressor() -> zstandard.ZstdCompressor:
    # ZstdCompressor instances are not thread-safe; keep one per thread.
    comp = getattr(_local, "zstd", None)
    if comp is None:
        comp = _local.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return comp


def _check_binary_column(column: Sequence[Any], field: str) -> bool:
    """Raise unless every item is bytes-like or None; return whether any is None."""
    types = set(map(type, column))
    if types <= _BINARY_TYPES:
        return _NONE in types
    for kind in types - _BINARY_TYPES:
        if not issubclass(kind, (bytes, bytearray)):
            hint = " (encode text first, e.g. value.encode())" if issubclass(kind, str) else ""
            raise InvalidRecordError(
                f"record {field} must be bytes, bytearray or None, not {kind.__name__}{hint}"
            )
    return _NONE in types


def _total_len(column: Sequence[Any] | None, has_none: bool) -> int:
    if column is None:
        return 0
    return sum(map(len, filter(None, column) if has_none else column))


def _max_len(column: Sequence[Any] | None) -> int:
    if column is None:
        return 0
    return max(map(len, filter(None, column)), default=0)


def _normalize_headers(
    headers: Sequence[Any], count: int
) -> tuple[list[tuple[tuple[str, Any], ...] | None] | None, list[int]]:
    """Headers per record -> (column for the body or None, encoded size per record)."""
    if len(headers) != count:
        raise InvalidRecordError(f"headers has {len(headers)} entries for {count} records")
    column: list[tuple[tuple[str, Any], ...] | None] = []
    sizes: list[int] = []
    any_headers = False
    for item in headers:
        if not item:
            column.append(None)
            sizes.append(0)
            continue
        try:
            pairs = tuple(item.items()) if isinstance(item, Mapping) else tuple(item)
        except TypeError:
            raise InvalidRecordError(
                f"a record's headers must be a dict or a sequence of (key, value) pairs, "
                f"not {type(item).__name__}"
            ) from None
        size = 0
        for pair in pairs:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise InvalidRecordError(
                    f"a header must be a (key, value) pair or a dict entry, not {pair!r}"
                )
            key, value = pair
            if type(key) is not str:
                raise InvalidRecordError(f"header key must be str, not {type(key).__name__}")
            if value is not None and not isinstance(value, bytes | bytearray):
                raise InvalidRecordError(
                    f"header {key!r} value must be bytes or None, not {type(value).__name__}"
                )
            try:
                key_size = len(key.encode("utf-8"))
            except UnicodeEncodeError:
                raise InvalidRecordError(
                    f"header key {key!r} cannot be encoded as UTF-8 (lone surrogate)"
                ) from None
            size += key_size + (len(value) if value else 0)
        column.append(tuple((k, v) for k, v in pairs))
        sizes.append(size)
        any_headers = True
    return (column if any_headers else None), sizes


def _timestamps(
    timestamps: int | Sequence[int] | None, count: int
) -> tuple[int, int, list[int] | None]:
    """-> (base_timestamp, max_timestamp, deltas or None when all equal)."""
    if timestamps is None:
        ts = now_ms()
        return ts, ts, None
    if type(timestamps) is int:
        if not 0 <= timestamps <= MAX_TIMESTAMP:
            raise InvalidRecordError(f"timestamp {timestamps} is outside 0..2**63-1 (ms)")
        return timestamps, timestamps, None
    if isinstance(timestamps, str | bytes) or not isinstance(timestamps, Sequence):
        raise InvalidRecordError(
            f"timestamp must be an int (ms since the epoch), not {type(timestamps).__name__}"
        )
    if len(timestamps) != count:
        raise InvalidRecordError(f"timestamps has {len(timestamps)} entries for {count} records")
    kinds = set(map(type, timestamps))
    if kinds != {int}:
        bad = next(iter(kinds - {int}))
        raise InvalidRecordError(
            f"timestamp must be an int (ms since the epoch), not {bad.__name__}"
        )
    low, high = min(timestamps), max(timestamps)
    if low < 0 or high > MAX_TIMESTAMP:
        raise InvalidRecordError("timestamps must be within 0..2**63-1 (ms since the epoch)")
    base = timestamps[0]
    if low == high:
        return base, high, None
    return base, high, list(map(sub, timestamps, repeat(base)))


def _check_offset_deltas(deltas: Sequence[int], count: int, last_offset_delta: int) -> None:
    if len(deltas) != count:
        raise InvalidRecordError(f"offset_deltas has {len(deltas)} entries for {count} records")
    if set(map(type, deltas)) != {int}:
        raise InvalidRecordError("offset_deltas must be ints")
    if deltas[0] < 0 or deltas[-1] > last_offset_delta or last_offset_delta > 0xFFFFFFFF:
        raise InvalidRecordError("offset_deltas must lie within 0..last_offset_delta (u32)")
    if not all(map(lt, deltas, islice(deltas, 1, None))):
        raise InvalidRecordError("offset_deltas must be strictly increasing")


_NOT_COLUMNS = (str, bytes, bytearray, memoryview, Mapping, AbstractSet)


def as_column(items: Iterable[Any], field: str) -> Sequence[Any]:
    """One column of a batch (``values``, ``keys``, ``headers``, ``timestamps``) as a
    sequence with one item per record: a list or tuple as it is, another ordered
    iterable (a generator, a range) as a list.

    Anything else is an :class:`InvalidRecordError`, never taken apart: ``None`` or a
    number; one value (``str``, ``bytes``), which would become a record per character;
    a mapping or a set, whose items have no order the caller chose (records would get
    arbitrary offsets, and a dict would be stored as its keys).
    """
    if isinstance(items, list | tuple):
        return items
    if isinstance(items, _NOT_COLUMNS) or not isinstance(items, Iterable):
        raise InvalidRecordError(
            f"{field} must be a sequence with one item per record, not {type(items).__name__}"
        )
    try:
        return list(items)
    except TypeError as exc:  # an iterable that fails while iterated
        raise InvalidRecordError(f"{field} could not be read as a column: {exc}") from None


def _as_sequence(items: Iterable[Any] | None, field: str) -> Sequence[Any] | None:
    return None if items is None else as_column(items, field)


def encode_batch(
    values: Iterable[bytes | None],
    keys: Iterable[bytes | None] | None = None,
    headers: Iterable[Any] | None = None,
    timestamps: int | Sequence[int] | None = None,
    *,
    compression: str | int = COMPRESSION_NONE,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
) -> EncodedBatch:
    """Encode records (given as columns) into one batch.

    ``values`` is required; ``keys`` and ``headers`` are optional parallel sequences
    (``None`` means "none at all"). ``timestamps`` is one int for all records, a
    sequence with one per record, or ``None`` for "now". A header entry is a dict or a
    sequence of ``(str, bytes | None)`` pairs.

    ``offset_deltas``/``last_offset_delta`` describe a batch with offset gaps (what key
    compaction produces); by default the records get dense offsets ``0..n-1``.

    Raises :class:`InvalidRecordError` for wrong types or shapes and
    :class:`RecordTooLarge` for a record over ``max_record_bytes`` or a batch over
    ``max_batch_bytes``, in both cases before encoding anything.
    """
    return prepare_batch(
        values,
        keys,
        headers,
        timestamps,
        max_record_bytes=max_record_bytes,
        max_batch_bytes=max_batch_bytes,
        offset_deltas=offset_deltas,
        last_offset_delta=last_offset_delta,
    ).encode(
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


class PreparedBatch(NamedTuple):
    """A validated batch, not yet encoded: its body columns and header facts.

    Validation (types, limits) happens when a batch is prepared, at the caller's
    ``append``; encoding can wait until the producer fields are known, which for an
    idempotent writer is when it flushes.
    """

    columns: list[Any]
    record_count: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    max_batch_bytes: int

    def encode(
        self,
        *,
        compression: str | int = COMPRESSION_NONE,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
    ) -> EncodedBatch:
        """Pack and seal the batch with these producer fields."""
        _check_producer(producer_id, producer_epoch, base_sequence)
        return _seal(
            _pack(self.columns),
            self.record_count,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            compression,
            self.max_batch_bytes,
            producer_id,
            producer_epoch,
            base_sequence,
        )


def prepare_batch(
    values: Iterable[bytes | None],
    keys: Iterable[bytes | None] | None = None,
    headers: Iterable[Any] | None = None,
    timestamps: int | Sequence[int] | None = None,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
) -> PreparedBatch:
    """Validate records (as columns, see :func:`encode_batch`) into a :class:`PreparedBatch`."""
    columns, count, last, base_ts, max_ts = _prepare_batch(
        values,
        keys,
        headers,
        timestamps,
        max_record_bytes,
        max_batch_bytes,
        offset_deltas,
        last_offset_delta,
    )
    return PreparedBatch(columns, count, last, base_ts, max_ts, max_batch_bytes)


@contextlib.contextmanager
def encode_batch_borrowed(
    values: Iterable[bytes | None],
    keys: Iterable[bytes | None] | None = None,
    headers: Iterable[Any] | None = None,
    timestamps: int | Sequence[int] | None = None,
    *,
    compression: str | int = COMPRESSION_NONE,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> Iterator[EncodedBatch]:
    """:func:`encode_batch` for a caller that writes the batch at once, in this thread.

    The batch's body is a view of this thread's packer buffer, valid only inside the
    ``with`` block (then released): this saves allocating and copying every batch.
    """
    columns, count, last, base_ts, max_ts = _prepare_batch(
        values, keys, headers, timestamps, max_record_bytes, max_batch_bytes, None, None
    )
    packer = getattr(_local, "view_packer", None)
    if packer is None or getattr(_local, "view_in_use", False):
        packer = msgpack.Packer(use_bin_type=True, autoreset=False)
        if not getattr(_local, "view_in_use", False):
            _local.view_packer = packer
    _local.view_in_use = True
    try:
        packer.pack(columns)
        view = packer.getbuffer()
        try:
            yield _seal(
                view, count, last, base_ts, max_ts, compression, max_batch_bytes, -1, -1, -1
            )
        finally:
            view.release()
    finally:
        packer.reset()
        if packer is getattr(_local, "view_packer", None):
            _local.view_in_use = False


def _prepare_batch(
    values: Iterable[bytes | None],
    keys: Iterable[bytes | None] | None,
    headers: Iterable[Any] | None,
    timestamps: int | Sequence[int] | None,
    max_record_bytes: int,
    max_batch_bytes: int,
    offset_deltas: Iterable[int] | None,
    last_offset_delta: int | None,
) -> tuple[list[Any], int, int, int, int]:
    """Validate a batch's columns and limits; return (body columns, record count, last
    offset delta, base timestamp, max timestamp). Nothing is allocated for the body yet."""
    values_seq = _as_sequence(values, "values")
    if values_seq is None:
        raise InvalidRecordError("values must be a sequence with one value per record")
    count = len(values_seq)
    if count == 0:
        raise InvalidRecordError("a batch needs at least one record")
    keys_seq = _as_sequence(keys, "keys")
    headers_seq = _as_sequence(headers, "headers")
    _check_limits(max_record_bytes, max_batch_bytes)

    value_nones = _check_binary_column(values_seq, "value")
    key_nones = False
    if keys_seq is not None:
        if len(keys_seq) != count:
            raise InvalidRecordError(f"keys has {len(keys_seq)} entries for {count} records")
        key_nones = _check_binary_column(keys_seq, "key")
        if key_nones and keys_seq.count(None) == count:
            keys_seq = None
    header_column, header_sizes = None, None
    if headers_seq is not None:
        header_column, header_sizes = _normalize_headers(headers_seq, count)

    # Limits, before the body is allocated. The payload total bounds every record, so
    # the per-record work happens only when that bound exceeds max_record_bytes.
    payload = (
        _total_len(values_seq, value_nones)
        + _total_len(keys_seq, key_nones)
        + (sum(header_sizes) if header_sizes else 0)
    )
    if payload > max_record_bytes:
        bound = _max_len(values_seq) + _max_len(keys_seq) + max(header_sizes or [0])
        if bound > max_record_bytes:
            _check_each_record(values_seq, keys_seq, header_sizes, max_record_bytes)
    if HEADER_SIZE + payload > max_batch_bytes:
        raise RecordTooLarge(
            f"a batch of {count} records needs at least {HEADER_SIZE + payload} bytes, over "
            f"max_batch_bytes={max_batch_bytes}; append fewer records per batch"
        )

    base_ts, max_ts, ts_deltas = _timestamps(timestamps, count)
    deltas_field: list[int] | None = None
    if last_offset_delta is not None and type(last_offset_delta) is not int:
        raise InvalidRecordError("last_offset_delta must be an int")
    deltas_seq = _as_sequence(offset_deltas, "offset_deltas")
    if deltas_seq is not None:
        last = last_offset_delta
        if last is None:
            last = deltas_seq[-1] if deltas_seq else -1
        _check_offset_deltas(deltas_seq, count, last)
        if last != count - 1:  # otherwise the deltas are exactly 0..n-1: dense
            deltas_field = list(deltas_seq)
    else:
        last = count - 1 if last_offset_delta is None else last_offset_delta
        if not count - 1 <= last <= 0xFFFFFFFF:
            raise InvalidRecordError("last_offset_delta must be in count-1..2**32-1")
        if last != count - 1:
            deltas_field = list(range(count))
    return (
        [deltas_field, ts_deltas, keys_seq, values_seq, header_column],
        count,
        last,
        base_ts,
        max_ts,
    )


def restamp(
    batch: EncodedBatch, *, producer_id: int, producer_epoch: int, base_sequence: int
) -> EncodedBatch:
    """The same batch with other producer fields: a new header (and CRC), the same body.

    For a writer that must renumber batches it already encoded (its stream was deleted
    and created again, so the sequence starts over at 0).
    """
    _check_producer(producer_id, producer_epoch, base_sequence)
    length, magic, _ = PREFIX.unpack_from(batch.header)
    fields = TAIL.unpack_from(batch.header, PREFIX_SIZE)
    tail = TAIL.pack(*fields[:5], producer_id, producer_epoch, base_sequence, fields[8])
    crc = _crc32c.crc32c(batch.body, _crc32c.crc32c(tail))
    header = PREFIX.pack(length, magic, crc) + tail
    return batch._replace(header=header)


def encode_record(
    value: bytes | None,
    key: bytes | None = None,
    headers: Any = None,
    timestamp: int | None = None,
    *,
    compression: str | int = COMPRESSION_NONE,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> EncodedBatch:
    """Encode one record as a batch: the lean path behind ``Stream.append``.

    Same checks and same bytes as ``encode_batch([value], ...)``.
    """
    _check_limits(max_record_bytes, max_batch_bytes)
    if key is None and headers is None and timestamp is None and type(value) is bytes:
        # The common case, without check_record's general path.
        if len(value) > max_record_bytes:
            raise RecordTooLarge(
                f"record is {len(value)} bytes (key + value + headers), over "
                f"max_record_bytes={max_record_bytes}"
            )
        timestamp = time.time_ns() // 1_000_000
        body = _pack([None, None, None, (value,), None])
    else:
        normalized, _, timestamp = check_record(
            value, key, headers, timestamp, max_record_bytes=max_record_bytes
        )
        body = _pack(
            [
                None,
                None,
                None if key is None else (key,),
                (value,),
                None if normalized is None else (normalized,),
            ]
        )
    return _seal(body, 1, 0, timestamp, timestamp, compression, max_batch_bytes, -1, -1, -1)


def _seal(
    body: Any,
    count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    compression: str | int,
    max_batch_bytes: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> EncodedBatch:
    """Compress (if asked and worth it), add the header and checksum: the batch bytes."""
    body_size = len(body)
    if HEADER_SIZE + body_size > max_batch_bytes:
        raise RecordTooLarge(
            f"a batch of {count} records encodes to {HEADER_SIZE + body_size} bytes, over "
            f"max_batch_bytes={max_batch_bytes}; append fewer records per batch"
        )
    attributes = (
        compression
        if type(compression) is int and 0 <= compression <= COMPRESSION_ZSTD
        else compression_code(compression)  # raises ConfigError for unknown codes
    )
    if attributes == COMPRESSION_ZSTD:
        packed = _compressor().compress(body)
        if len(packed) < body_size:
            body = packed
        else:
            attributes = COMPRESSION_NONE  # incompressible: store as is, never larger
    tail = TAIL.pack(
        attributes,
        count,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        body_size,
    )
    crc = _crc32c.crc32c(body, _crc32c.crc32c(tail))
    header = PREFIX.pack(MIN_LENGTH + len(body), MAGIC, crc) + tail
    # tuple.__new__ skips the NamedTuple's Python-level __new__ (hot for single appends).
    return _new_tuple(EncodedBatch, (header, body, count, last_offset_delta, max_timestamp))


def check_record(
    value: Any,
    key: Any = None,
    headers: Any = None,
    timestamp: Any = None,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> tuple[tuple[tuple[str, Any], ...] | None, int, int]:
    """Validate one record's fields; return (normalized headers, size in bytes, timestamp).

    The per-record path of buffering writers: it raises the same typed errors as
    :func:`encode_batch`, at the caller's ``append``, before anything is buffered.
    """
    if type(value) not in _BINARY_TYPES:
        _check_binary_column((value,), "value")
    if type(key) not in _BINARY_TYPES:
        _check_binary_column((key,), "key")
    size = (len(value) if value else 0) + (len(key) if key else 0)
    normalized = None
    if headers:
        column, sizes = _normalize_headers((headers,), 1)
        normalized = column[0] if column else None
        size += sizes[0]
    if size > max_record_bytes:
        raise RecordTooLarge(
            f"record is {size} bytes (key + value + headers), over max_record_bytes="
            f"{max_record_bytes}"
        )
    if timestamp is None:
        timestamp = now_ms()
    elif type(timestamp) is not int:
        raise InvalidRecordError(
            f"timestamp must be an int (ms since the epoch), not {type(timestamp).__name__}"
        )
    elif not 0 <= timestamp <= MAX_TIMESTAMP:
        raise InvalidRecordError(f"timestamp {timestamp} is outside 0..2**63-1 (ms)")
    return normalized, size, timestamp


def _check_limits(max_record_bytes: int, max_batch_bytes: int) -> None:
    if (
        type(max_batch_bytes) is not int
        or not HEADER_SIZE < max_batch_bytes <= MAX_BATCH_BYTES_LIMIT
    ):
        raise ConfigError(
            f"max_batch_bytes must be an int in {HEADER_SIZE + 1}..{MAX_BATCH_BYTES_LIMIT}"
        )
    if type(max_record_bytes) is not int or max_record_bytes < 1:
        raise ConfigError("max_record_bytes must be a positive int")


_PRODUCER_RANGES = (
    ("producer_id", -1, (1 << 63) - 1),
    ("producer_epoch", -1, (1 << 15) - 1),
    ("base_sequence", -1, (1 << 31) - 1),
)


def _check_producer(producer_id: int, producer_epoch: int, base_sequence: int) -> None:
    for (name, low, high), value in zip(
        _PRODUCER_RANGES, (producer_id, producer_epoch, base_sequence)
    ):
        if type(value) is not int or not low <= value <= high:
            raise InvalidRecordError(f"{name} must be an int in {low}..{high}, not {value!r}")


def _check_each_record(
    values: Sequence[Any],
    keys: Sequence[Any] | None,
    header_sizes: list[int] | None,
    limit: int,
) -> None:
    key_column = keys if keys is not None else repeat(None)
    size_column = header_sizes if header_sizes is not None else repeat(0)
    for index, (value, key, hsize) in enumerate(zip(values, key_column, size_column)):
        size = (len(value) if value else 0) + (len(key) if key else 0) + hsize
        if size > limit:
            raise RecordTooLarge(
                f"record {index} is {size} bytes (key + value + headers), over "
                f"max_record_bytes={limit}"
            )


# --------------------------------------------------------------------------- decoding


def batch_size(buf: Any, pos: int = 0, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> int:
    """Total size in bytes of the batch that starts at ``buf[pos]``, from its length field.

    Checks the magic byte and bounds the length by ``max_batch_bytes`` before the
    caller reads or allocates anything. Raises :class:`IncompleteBatchError` when fewer
    than 9 bytes are available, :class:`CorruptDataError` for a bad magic or length.
    """
    available = len(buf) - pos
    if available < PREFIX_SIZE:
        raise IncompleteBatchError(
            f"need {PREFIX_SIZE} bytes for a batch prefix, {available} available", position=pos
        )
    length, magic, _ = PREFIX.unpack_from(buf, pos)
    if magic != MAGIC:
        raise CorruptDataError(f"bad magic byte {magic}, expected {MAGIC}", position=pos)
    if length < MIN_LENGTH or length + 4 > max_batch_bytes:
        raise CorruptDataError(
            f"batch length {length + 4} outside {HEADER_SIZE}..{max_batch_bytes}", position=pos
        )
    return int(length) + 4


def peek_header(
    buf: Any, pos: int = 0, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> BatchHeader:
    """The header of the batch at ``buf[pos:]``, bounds-checked but *not* checksummed.

    For walking data that was verified before (a local segment before its recovery
    point): cheap, but trust it only as far as that earlier verification goes.
    """
    size = batch_size(buf, pos, max_batch_bytes=max_batch_bytes)
    if len(buf) - pos < HEADER_SIZE:
        raise IncompleteBatchError("batch header cut short", position=pos)
    header = BatchHeader(size, *TAIL.unpack_from(buf, pos + PREFIX_SIZE))
    problem = _header_problem(header, max_batch_bytes)
    if problem:
        raise CorruptDataError(problem, position=pos)
    return header


def check_batch(
    buf: Any, pos: int = 0, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> BatchHeader:
    """Validate the batch at ``buf[pos:]`` (bounds, CRC-32C, header fields) without
    decoding its records, and return its header."""
    size = batch_size(buf, pos, max_batch_bytes=max_batch_bytes)
    available = len(buf) - pos
    if available < size:
        raise IncompleteBatchError(
            f"batch of {size} bytes, only {available} available", position=pos
        )
    _, _, stored_crc = PREFIX.unpack_from(buf, pos)
    actual_crc = _crc32c.crc32c(memoryview(buf)[pos + PREFIX_SIZE : pos + size])
    if actual_crc != stored_crc:
        raise CorruptDataError(
            f"CRC-32C mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x}",
            position=pos,
        )
    header = BatchHeader(size, *TAIL.unpack_from(buf, pos + PREFIX_SIZE))
    problem = _header_problem(header, max_batch_bytes)
    if problem:
        raise CorruptDataError(problem, position=pos)
    return header


def _header_problem(h: BatchHeader, max_batch_bytes: int) -> str | None:
    if h.attributes & ~_COMPRESSION_MASK or h.compression not in COMPRESSIONS.values():
        return f"unknown attributes {h.attributes:#06x}"
    if h.record_count < 1:
        return "record count is 0"
    if h.last_offset_delta < h.record_count - 1:
        return f"last offset delta {h.last_offset_delta} < record count - 1"
    if h.max_timestamp < h.base_timestamp or h.base_timestamp < 0:
        return "timestamps out of order or negative"
    if h.body_size > max_batch_bytes - HEADER_SIZE:
        return f"body size {h.body_size} over the batch limit"
    stored = h.size - HEADER_SIZE
    if h.compression == COMPRESSION_NONE and stored != h.body_size:
        return f"body is {stored} bytes, header says {h.body_size}"
    if h.compression == COMPRESSION_ZSTD and stored > h.body_size:
        return "compressed body larger than the uncompressed body"
    return None


def decode_batch(
    buf: Any,
    pos: int,
    base_offset: int,
    *,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> tuple[BatchHeader, RecordBatch]:
    """Validate and decode the batch at ``buf[pos:]``, whose first offset is ``base_offset``.

    Returns the header and the records as columns. Never returns data that failed its
    checksum or structure checks: raises :class:`CorruptDataError` instead.
    """
    header = check_batch(buf, pos, max_batch_bytes=max_batch_bytes)
    return header, _decode_checked(buf, pos, header, base_offset)


def decode_unless_dense(
    buf: Any,
    pos: int,
    base_offset: int,
    *,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> tuple[BatchHeader, RecordBatch | None]:
    """Validate the batch at ``buf[pos:]`` like :func:`decode_batch`, but decode its
    records only if their offsets have gaps; ``None`` when they are dense.

    For readers that want offsets alone: a batch whose record count equals its span
    holds ``base_offset .. base_offset + span - 1`` (see :attr:`BatchHeader.dense`), and
    the header saying so is covered by the checksum. Only key compaction writes
    batches with gaps.
    """
    header = check_batch(buf, pos, max_batch_bytes=max_batch_bytes)
    if header.dense:
        return header, None
    return header, _decode_checked(buf, pos, header, base_offset)


def _decode_checked(buf: Any, pos: int, header: BatchHeader, base_offset: int) -> RecordBatch:
    """Decode the body of the batch at ``buf[pos:]``, whose header passed :func:`check_batch`."""
    body: Any = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    try:
        if header.compression == COMPRESSION_ZSTD:
            declared = zstandard.frame_content_size(body)
            if declared != header.body_size:
                raise CorruptDataError(
                    f"zstd frame declares {declared} bytes, header says {header.body_size}",
                    position=pos,
                )
            body = zstandard.ZstdDecompressor().decompress(
                body, max_output_size=header.body_size, allow_extra_data=False
            )
            if len(body) != header.body_size:
                raise CorruptDataError("zstd body decompressed to the wrong size", position=pos)
        columns = msgpack.unpackb(body, use_list=False, raw=False)
    except CorruptDataError:
        raise
    except (ValueError, TypeError, zstandard.ZstdError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"undecodable body: {exc}", position=pos) from None
    try:
        return _columns_to_batch(columns, header, base_offset)
    except _BadColumns as exc:
        raise CorruptDataError(f"malformed body: {exc}", position=pos) from None


class _BadColumns(Exception):
    pass


def _columns_to_batch(columns: Any, h: BatchHeader, base_offset: int) -> RecordBatch:
    if type(columns) is not tuple or len(columns) != 5:
        raise _BadColumns("expected an array of 5 columns")
    offset_deltas, ts_deltas, keys, values, headers = columns
    n = h.record_count

    if type(values) is not tuple or len(values) != n:
        raise _BadColumns("values column has the wrong length")
    if not set(map(type, values)) <= _DECODED_BINARY_TYPES:
        raise _BadColumns("values must be bin or nil")

    if keys is None:
        keys = (None,) * n
    elif type(keys) is not tuple or len(keys) != n:
        raise _BadColumns("keys column has the wrong length")
    elif not set(map(type, keys)) <= _DECODED_BINARY_TYPES:
        raise _BadColumns("keys must be bin or nil")

    offsets: Sequence[int]
    if offset_deltas is None:
        if h.last_offset_delta != n - 1:
            raise _BadColumns("dense offsets but the span is larger than the record count")
        offsets = range(base_offset, base_offset + n)
    else:
        if type(offset_deltas) is not tuple or len(offset_deltas) != n:
            raise _BadColumns("offset deltas column has the wrong length")
        if set(map(type, offset_deltas)) != {int}:
            raise _BadColumns("offset deltas must be ints")
        if offset_deltas[0] < 0 or offset_deltas[-1] > h.last_offset_delta:
            raise _BadColumns("offset deltas outside the batch span")
        if not all(map(lt, offset_deltas, islice(offset_deltas, 1, None))):
            raise _BadColumns("offset deltas not strictly increasing")
        offsets = tuple(map(add, offset_deltas, repeat(base_offset)))

    timestamps: Sequence[int]
    if ts_deltas is None:
        if h.max_timestamp != h.base_timestamp:
            raise _BadColumns("uniform timestamps but max timestamp differs")
        timestamps = (h.base_timestamp,) * n
    else:
        if type(ts_deltas) is not tuple or len(ts_deltas) != n:
            raise _BadColumns("timestamp deltas column has the wrong length")
        if set(map(type, ts_deltas)) != {int}:
            raise _BadColumns("timestamp deltas must be ints")
        timestamps = tuple(map(add, ts_deltas, repeat(h.base_timestamp)))
        if max(timestamps) != h.max_timestamp or min(timestamps) < 0:
            raise _BadColumns("timestamps disagree with the header")

    header_column: Sequence[Headers]
    if headers is None:
        header_column = ((),) * n
    else:
        if type(headers) is not tuple or len(headers) != n:
            raise _BadColumns("headers column has the wrong length")
        header_column = tuple(_decoded_headers(item) for item in headers)

    return RecordBatch(offsets, timestamps, keys, values, header_column)


def _decoded_headers(item: Any) -> Headers:
    if item is None:
        return ()
    if type(item) is not tuple:
        raise _BadColumns("a record's headers must be an array or nil")
    for pair in item:
        if (
            type(pair) is not tuple
            or len(pair) != 2
            or type(pair[0]) is not str
            or type(pair[1]) not in _DECODED_BINARY_TYPES
        ):
            raise _BadColumns("a header must be a [str, bin|nil] pair")
    return item
