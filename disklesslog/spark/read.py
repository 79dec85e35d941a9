"""Batch reads: planning offset ranges on the driver, reading them as Arrow on executors.

The driver decides, per stream, the offset range ``[start, end)`` to read and splits it
into :class:`StreamRange` partitions. A partition is three small values; each executor
opens the log itself (:meth:`LogOptions.open`) and turns the stream's column batches
(:meth:`Stream.read_batches`) into Arrow record batches without a Python object per
record. The streaming reader (:mod:`.stream`) plans differently and reads the same way.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ..api import AbstractLog, Stream
from ..errors import ConfigError, OffsetOutOfRange, StreamNotFound
from ..projection import COLUMNS, OFFSETS, Part
from ..records import RecordBatch
from .options import EARLIEST, LATEST, LogOptions, OffsetSpec, ReadOptions
from .schema import arrow_schema, read_schema

__all__ = [
    "BatchReader",
    "StreamRange",
    "check_schema",
    "offsets_to_arrow",
    "read_partition",
    "read_range",
    "read_range_offsets",
    "selected_streams",
    "split_range",
    "start_offset_for",
    "to_arrow",
]

logger = logging.getLogger("disklesslog.spark")

MAX_ROWS_PER_ARROW_BATCH = 65_536
"""Rows per Arrow batch handed to Spark: large enough that per-batch costs vanish (the
log's own batches are often a few hundred records), small enough to bound memory."""

MAX_BYTES_PER_ARROW_BATCH = 16 << 20
"""...and at most this many bytes of values, so large records do not pile up."""


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """One Spark partition: offsets ``[start, end)`` of one stream. Pickled to an
    executor, so it holds names and numbers only."""

    stream: str
    start: int
    end: int


def split_range(stream: str, start: int, end: int, size: int | None) -> list[StreamRange]:
    """``[start, end)`` as partitions of at most ``size`` offsets (one if ``size`` is None;
    none if the range is empty). After key compaction a partition may hold fewer records
    than offsets: the split is by offset, which needs no read to plan."""
    if end <= start:
        return []
    if size is None:
        return [StreamRange(stream, start, end)]
    return [StreamRange(stream, lo, min(lo + size, end)) for lo in range(start, end, size)]


def check_schema(schema: StructType, options: ReadOptions) -> None:
    """Refuse a user-given schema (``spark.read.schema(...)``) that is not ours: the
    columns are fixed, as with Spark's Kafka source."""
    expected = read_schema(columns=options.columns)
    if schema != expected:
        raise ConfigError(
            "the disklesslog data source has a fixed schema; do not pass .schema(...). "
            f"Expected {expected.simpleString()}, got {schema.simpleString()}"
        )


# ---------------------------------------------------------------------- planning


def selected_streams(log: AbstractLog, options: ReadOptions, *, must_exist: bool) -> list[str]:
    """The streams a read covers. Named streams that do not exist raise
    :class:`StreamNotFound` when ``must_exist`` (batch reads), else are left out until
    they appear (streaming)."""
    existing = log.streams()
    if options.streams is not None and must_exist:
        missing = [name for name in options.streams if name not in existing]
        if missing:
            raise StreamNotFound(
                f"stream(s) {', '.join(missing)} not found in {log.url} (option streams); "
                f"it has {len(existing)} stream(s)"
            )
    return options.select(existing)


def explicit_offset(spec: OffsetSpec | None, name: str, default: int) -> int:
    """The offset a ``{stream: offset}`` spec gives ``name`` (``default`` when absent or
    not a dict): ``-2`` earliest and ``-1`` latest are returned as they are."""
    if isinstance(spec, dict):
        return spec.get(name, default)
    return default


def start_offset_for(
    stream: Stream, options: ReadOptions, first: int, last: int, *, default: str
) -> int:
    """Where a read of ``stream`` (holding ``[first, last)``) starts, per
    ``startingTimestamp``/``startingOffsets`` (``default`` when neither is given)."""
    if options.starting_timestamp is not None:
        found = stream.offset_for_time(options.starting_timestamp)
        return last if found is None else max(found, first)
    spec = options.starting_offsets if options.starting_offsets is not None else default
    if spec == EARLIEST:
        return first
    if spec == LATEST:
        return last
    wanted = explicit_offset(spec, stream.name, -2)
    if wanted == -2:
        return first
    if wanted == -1:
        return last
    if wanted > last:
        raise OffsetOutOfRange(
            f"startingOffsets asks for stream {stream.name!r} from offset {wanted}, past its "
            f"end offset {last}",
            start_offset=first,
            end_offset=last,
        )
    return check_not_lost(stream.name, wanted, first, options.fail_on_data_loss)


def end_offset_for(name: str, options: ReadOptions, start: int, last: int) -> int:
    """Where a batch read of ``name`` ends (exclusive), per ``endingOffsets``. An offset
    past the end offset reads up to the end offset: there is nothing beyond it yet."""
    wanted = explicit_offset(options.ending_offsets, name, -1)
    if wanted == -1:
        return last
    if wanted < start:
        raise ConfigError(
            f"endingOffsets gives stream {name!r} offset {wanted}, below where the read "
            f"starts ({start})"
        )
    return min(wanted, last)


def check_not_lost(name: str, wanted: int, first: int, fail_on_data_loss: bool) -> int:
    """``wanted`` if its records still exist; else Kafka's ``failOnDataLoss`` rule:
    raise :class:`OffsetOutOfRange`, or (``false``) warn and go on from ``first``."""
    if wanted >= first:
        return wanted
    message = (
        f"stream {name!r}: offsets {wanted}..{first - 1} were trimmed (retention or trim) "
        f"before they were read"
    )
    if fail_on_data_loss:
        raise OffsetOutOfRange(
            f"{message}; set the option failOnDataLoss=false to skip them",
            start_offset=first,
            end_offset=-1,
        )
    logger.warning("%s; skipping them (failOnDataLoss=false)", message)
    return first


def plan_batch(options: ReadOptions) -> list[StreamRange]:
    """The partitions of a batch read: the offsets each selected stream holds now, cut
    by the starting and ending options, split by ``maxRecordsPerPartition``."""
    ranges: list[StreamRange] = []
    with options.log.open() as log:
        for name in selected_streams(log, options, must_exist=True):
            stream = log.stream(name)
            first, last = stream.start_offset, stream.end_offset
            start = start_offset_for(stream, options, first, last, default=EARLIEST)
            end = end_offset_for(name, options, start, last)
            ranges += split_range(name, start, end, options.max_records_per_partition)
    return ranges


# ----------------------------------------------------------------------- reading


def read_range(
    log: AbstractLog, part: StreamRange, fail_on_data_loss: bool
) -> Iterator[RecordBatch]:
    """The records of ``part``, as the log's column batches. Records trimmed while the
    read was planned or running follow the ``failOnDataLoss`` rule."""
    stream = log.stream(part.stream)
    return _resuming(stream.read_batches, part, fail_on_data_loss, COLUMNS.offsets)


def read_range_offsets(
    log: AbstractLog, part: StreamRange, fail_on_data_loss: bool
) -> Iterator[Sequence[int]]:
    """The offsets of ``part``'s records (:meth:`Stream.read_offsets`: dense batches are
    not decoded), for reads that want no column but ``stream`` and ``offset``."""
    stream = log.stream(part.stream)
    return _resuming(stream.read_offsets, part, fail_on_data_loss, OFFSETS.offsets)


def _resuming(
    read: Callable[[int, int], Iterator[Part]],
    part: StreamRange,
    fail_on_data_loss: bool,
    offsets_of: Callable[[Part], Sequence[int]],
) -> Iterator[Part]:
    """``read(start, end)`` over ``part``, going on past records trimmed under it as
    ``failOnDataLoss`` says."""
    position = part.start
    while position < part.end:
        try:
            for item in read(position, part.end):
                offsets = offsets_of(item)
                if len(offsets):
                    yield item
                    position = offsets[-1] + 1
            return
        except OffsetOutOfRange as exc:
            if exc.start_offset <= position:
                raise
            position = check_not_lost(part.stream, position, exc.start_offset, fail_on_data_loss)


OFFSET_COLUMNS = frozenset({"stream", "offset"})
"""Columns a read can answer from offsets alone."""


def to_arrow(
    batches: Iterator[RecordBatch], stream: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Gather the log's column batches into Arrow record batches of ``schema``.

    Columns are gathered with ``list.extend`` (C, a few ns per item) and converted to
    Arrow once per up to :data:`MAX_ROWS_PER_ARROW_BATCH` rows, so no Python code runs
    per record.
    """
    return _gather(batches, stream, schema, _Columns.add)


def offsets_to_arrow(
    parts: Iterator[Sequence[int]], stream: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of ``schema`` (columns from :data:`OFFSET_COLUMNS` only)
    from offsets alone: a run of dense offsets becomes one C-level ``first + 0, 1, ...``
    without a Python int per record."""
    if not set(schema.names) <= OFFSET_COLUMNS:
        raise ValueError(f"offsets give only {sorted(OFFSET_COLUMNS)}, not {schema.names}")
    return _gather(parts, stream, schema, _Columns.add_offsets)


def _gather(
    items: Iterator[Part],
    stream: str,
    schema: pa.Schema,
    add: Callable[[_Columns, Part], None],
) -> Iterator[pa.RecordBatch]:
    wanted = frozenset(schema.names)
    columns = _Columns(wanted)
    for item in items:
        add(columns, item)
        if columns.offsets.count >= MAX_ROWS_PER_ARROW_BATCH or (
            columns.size >= MAX_BYTES_PER_ARROW_BATCH
        ):
            yield columns.to_arrow(stream, schema)
            columns = _Columns(wanted)
    if columns.offsets.count:
        yield columns.to_arrow(stream, schema)


_TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")


class _OffsetColumn:
    """The offsets of one Arrow batch: while they are dense, only the first and the
    count (no Python int per record); a C array of them once a gap appears."""

    def __init__(self) -> None:
        self.first = 0
        self.count = 0
        self.listed: array[int] | None = None

    def add(self, offsets: Sequence[int]) -> None:
        if not offsets:
            return
        if self.listed is None and type(offsets) is range:
            if not self.count:
                self.first = offsets[0]
            if offsets[0] == self.first + self.count:
                self.count += len(offsets)
                return
        if self.listed is None:
            self.listed = array("q", range(self.first, self.first + self.count))
        self.listed.extend(offsets)
        self.count += len(offsets)

    def to_arrow(self) -> pa.Array:
        if self.listed is None:  # the common case: first offset + 0, 1, 2... in one C loop
            return pc.add(_iota(self.count), self.first)
        return pa.Array.from_buffers(pa.int64(), self.count, [None, pa.py_buffer(self.listed)])


class _Columns:
    """Columns gathered for one Arrow batch: offsets always (they count the rows and
    mark the gaps), the others only if the schema has them."""

    def __init__(self, wanted: frozenset[str]) -> None:
        self.wanted = wanted
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets = _OffsetColumn()
        self.timestamps: list[int] = []
        self.headers: list[object] = []
        self.size = 0  # bytes of values

    def add_offsets(self, offsets: Sequence[int]) -> None:
        self.offsets.add(offsets)

    def add(self, batch: RecordBatch) -> None:
        self.offsets.add(batch.offsets)
        wanted = self.wanted
        if "key" in wanted:
            self.keys += batch.keys
        if "value" in wanted:
            self.values += batch.values
            self.size += sum(map(len, filter(None, batch.values)))
        if "timestamp" in wanted:
            self.timestamps += batch.timestamps
        if "headers" in wanted:
            self.headers += batch.headers

    def to_arrow(self, stream: str, schema: pa.Schema) -> pa.RecordBatch:
        count = self.offsets.count
        builders: dict[str, Callable[[], pa.Array]] = {
            "key": lambda: pa.array(self.keys, pa.binary()),
            "value": lambda: pa.array(self.values, pa.binary()),
            "stream": lambda: pa.repeat(pa.scalar(stream, pa.string()), count),
            "offset": self.offsets.to_arrow,
            # The log keeps milliseconds; Spark wants microseconds (a checked, exact cast).
            "timestamp": lambda: _int64s(_TIMESTAMP_MS, self.timestamps).cast(
                schema.field("timestamp").type
            ),
            "headers": lambda: pa.array(self.headers, schema.field("headers").type),
        }
        columns = [builders[name]() for name in schema.names]
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def _int64s(kind: pa.DataType, values: list[int]) -> pa.Array:
    """An Arrow array of 64-bit ``kind``: ``array('q', list)`` converts in C faster than
    ``pa.array`` does, and Arrow takes its buffer without a copy."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(array("q", values))])


_IOTA: list[pa.Array] = []


def _iota(count: int) -> pa.Array:
    """``0, 1, ..., count - 1`` as int64, from one array built once per process."""
    if not _IOTA or len(_IOTA[0]) < count:
        _IOTA[:] = [pa.array(range(max(count, MAX_ROWS_PER_ARROW_BATCH)), pa.int64())]
    return _IOTA[0].slice(0, count)


def read_partition(
    log_options: LogOptions, part: StreamRange, schema: pa.Schema, fail_on_data_loss: bool
) -> Iterator[pa.RecordBatch]:
    """What an executor does for one partition, batch or streaming: open the log, read
    the range as Arrow, close the log. A read of ``stream``/``offset`` columns alone
    reads offsets, not records."""
    with log_options.open() as log:
        if set(schema.names) <= OFFSET_COLUMNS:
            offsets = read_range_offsets(log, part, fail_on_data_loss)
            yield from offsets_to_arrow(offsets, part.stream, schema)
        else:
            batches = read_range(log, part, fail_on_data_loss)
            yield from to_arrow(batches, part.stream, schema)


class BatchReader(DataSourceReader):
    """``spark.read.format("disklesslog")``: plans on the driver, reads on executors.
    Holds only the parsed options, so it pickles small."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options
        self.arrow_schema = arrow_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        return plan_batch(self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, StreamRange):
            return iter(())  # Spark's stand-in when a read plans no partitions
        return read_partition(
            self.options.log, partition, self.arrow_schema, self.options.fail_on_data_loss
        )
