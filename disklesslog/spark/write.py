"""The write side of the data source: exactly-once batch and streaming writes.

Every Spark task is an independent stager (:mod:`disklesslog.transactions`): its
``write()`` turns the Arrow batches Spark hands it into record batches per stream,
stores them without making them visible, and returns the :class:`StagedPart` as its
commit message. The driver's ``commit()`` commits every task's part in one
:meth:`~disklesslog.AbstractLog.commit_transaction` keyed by a transaction id, so the
job's records become visible all at once on either backend (local logs append stream
by stream but hold the records back from readers until the commit point), and
committing the same id again stores nothing:

* batch writes use the ``transactionId`` option if given (so re-running the same job,
  e.g. an orchestrator's retry, never duplicates), else a fresh id per write;
* streaming writes use ``(query, batch id)``: the query is named by the ``queryId``
  option or else by the ``checkpointLocation`` (the stable identity of a streaming
  query across restarts: Spark keeps its own query id in that directory), so a
  micro-batch replayed after a restart is recognised and not applied twice.

Only the messages Spark passes to ``commit()`` count: a failed task attempt's part is
never committed. A task that fails cleanly discards (orphans) what it staged itself; an
executor that dies leaves its staged objects to garbage collection (after 24 hours).
``abort()`` discards every part it is given.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ..errors import ConfigError, DisklessLogError, InvalidStreamName
from ..names import validate_stream_name
from ..sequencers.base import TransactionResult
from ..transactions import StagedPart, Stager
from .options import LogOptions, check_known, get_option, parse_log_options, parse_positive_int

try:  # Spark 4.1+: streaming writers get Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
except ImportError:  # pragma: no cover - Spark 4.0: rows, converted in _batches()
    _StreamBase = DataSourceStreamWriter  # type: ignore[assignment,misc]

__all__ = ["BatchWriter", "StagedMessage", "StreamWriter", "WriteOptions"]

WRITE_OPTIONS = ("stream", "transactionid", "queryid", "checkpointlocation", "maxobjectbytes")
COLUMNS = ("value", "key", "headers", "stream", "timestamp")
CHUNK_ROWS = 8192
"""Rows converted at once when Spark hands a (4.0) streaming writer rows, not Arrow."""


@dataclass(frozen=True)
class WriteOptions:
    """The write options, parsed on the driver (see ``docs/spark.md``)."""

    log: LogOptions
    stream: str | None
    transaction_id: str | None
    query: str | None
    max_object_bytes: int | None


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    check_known(options, WRITE_OPTIONS, "write")
    stream = get_option(options, "stream")
    if stream is not None:
        try:
            validate_stream_name(stream)
        except InvalidStreamName as exc:
            raise ConfigError(f"option stream: {exc}") from None
    query = get_option(options, "queryid")
    checkpoint = get_option(options, "checkpointlocation")
    if query is None and checkpoint is not None:
        query = "checkpoint:" + checkpoint.rstrip("/")
    return WriteOptions(
        log=parse_log_options(options),
        stream=stream,
        transaction_id=get_option(options, "transactionid"),
        query=query,
        max_object_bytes=parse_positive_int(options, "maxobjectbytes"),
    )


@dataclass
class StagedMessage(WriterCommitMessage):
    """A task's commit message: what it staged (object keys and batch coordinates)."""

    part: StagedPart


def check_write_schema(schema: StructType, options: WriteOptions) -> None:
    """Refuse, on the driver, a DataFrame the sink cannot write exactly as given."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    unknown = sorted(set(fields) - set(COLUMNS))
    if unknown:
        raise ConfigError(
            f"column(s) {', '.join(unknown)} cannot be written to disklesslog; a DataFrame "
            "to write has value and optionally key, headers, stream, timestamp (select "
            "or rename the columns first)"
        )
    if "value" not in fields:
        raise ConfigError("a DataFrame written to disklesslog needs a value column")
    for name in ("value", "key"):
        if name in fields and not isinstance(fields[name], (BinaryType, StringType)):
            raise ConfigError(f"column {name} must be binary or string, not {fields[name]}")
    if "stream" in fields and not isinstance(fields["stream"], StringType):
        raise ConfigError(f"column stream must be a string, not {fields['stream']}")
    if "stream" not in fields and options.stream is None:
        raise ConfigError("say where records go: a stream column or the option stream")
    if "timestamp" in fields and not isinstance(
        fields["timestamp"], (TimestampType, TimestampNTZType)
    ):
        raise ConfigError(f"column timestamp must be a timestamp, not {fields['timestamp']}")
    if "headers" in fields and not _headers_type(fields["headers"]):
        raise ConfigError(
            "column headers must be array<struct<key:string,value:binary>> (Kafka's), not "
            f"{fields['headers']}"
        )


def _headers_type(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    inner = {f.name: f.dataType for f in data_type.elementType.fields}
    return isinstance(inner.get("key"), StringType) and isinstance(
        inner.get("value"), (BinaryType, StringType)
    )


class _Writing:
    """What the batch and the streaming writer share: options, and the executor side."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError(
                "disklesslog streams are append-only: overwrite (mode('overwrite') or a "
                "complete-mode stream) is not supported; use mode('append') or update mode"
            )
        self.options = parse_write_options(options)
        check_write_schema(schema, self.options)
        self.columns = [f.name for f in schema.fields]

    def _stage(self, iterator: Iterator[Any]) -> StagedMessage:
        """Executor side: stage every batch Spark hands this task; on failure, discard
        what was staged (orphans) before failing the task."""
        started_ms = int(time.time() * 1000)
        with self.options.log.open(create=True) as log:
            stager = log.stager(max_object_bytes=self.options.max_object_bytes)
            try:
                for batch in _batches(iterator, self.columns):
                    _stage_batch(stager, batch, self.options.stream, started_ms)
                part = stager.finish()
            except BaseException:
                stager.abort()
                raise
        return StagedMessage(part)

    def _commit(
        self, transaction_id: str, messages: Sequence[WriterCommitMessage | None]
    ) -> TransactionResult:
        parts = [m.part for m in messages if isinstance(m, StagedMessage)]
        with self.options.log.open(create=True) as log:
            return log.commit_transaction(transaction_id, parts)

    def _abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        parts = [m.part for m in messages if isinstance(m, StagedMessage)]
        if not parts:
            return
        with self.options.log.open(create=True) as log:
            log.abort_transaction(parts)


class BatchWriter(_Writing, DataSourceArrowWriter):
    """``df.write.format("disklesslog")``: one transaction per write."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        given = self.options.transaction_id
        self.transaction_id = given if given is not None else f"spark-batch:{uuid.uuid4()}"
        self.result: TransactionResult | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        return self._stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.result = self._commit(self.transaction_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(messages)


class StreamWriter(_Writing, _StreamBase):
    """``df.writeStream.format("disklesslog")``: one transaction per micro-batch, keyed
    by the query and the batch id."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        if self.options.query is None:
            raise ConfigError(
                "a streaming write needs a stable query identity for exactly-once commits: "
                "set checkpointLocation (or the option queryId)"
            )
        self.query_key = hashlib.sha256(self.options.query.encode()).hexdigest()[:32]

    def transaction_id(self, batch_id: int) -> str:
        return f"spark-stream:{self.query_key}:{batch_id}"

    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        return self._stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._commit(self.transaction_id(batchId), messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages)


# ---------------------------------------------------------------- executor side


def _batches(iterator: Iterator[Any], columns: list[str]) -> Iterator[pa.RecordBatch]:
    """Arrow batches from what Spark gives: Arrow already (Spark 4.1+), or rows (4.0's
    streaming writer), converted a chunk at a time."""
    rows: list[Any] = []
    for item in iterator:
        if isinstance(item, pa.RecordBatch):
            yield item
            continue
        rows.append(item)
        if len(rows) >= CHUNK_ROWS:
            yield _rows_to_batch(rows, columns)
            rows = []
    if rows:
        yield _rows_to_batch(rows, columns)


def _rows_to_batch(rows: list[Any], columns: list[str]) -> pa.RecordBatch:
    data = {name: [row[i] for row in rows] for i, name in enumerate(columns)}
    if "headers" in data:
        data["headers"] = [
            None if h is None else [{"key": e[0], "value": e[1]} for e in h]
            for h in data["headers"]
        ]
    return pa.RecordBatch.from_pydict(data)


def _binary(column: pa.Array | None) -> list[bytes | None] | None:
    """A value or key column as bytes (strings are encoded as UTF-8 by Arrow's cast)."""
    if column is None:
        return None
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    values: list[bytes | None] = column.to_pylist()
    return values


def _stage_batch(stager: Stager, batch: pa.RecordBatch, default: str | None, now: int) -> None:
    """Stage one Arrow batch: split by stream (one filter per stream present), convert
    each column once, and hand the columns to the stager."""
    names = {name.lower(): i for i, name in enumerate(batch.schema.names)}
    if batch.num_rows == 0:
        return
    if "stream" not in names:
        assert default is not None  # check_write_schema made sure
        _stage_columns(stager, default, batch, names, now)
        return
    streams = batch.column(names["stream"])
    if streams.null_count:
        if default is None:
            raise DisklessLogError(
                "a row has a null stream and there is no option stream to send it to"
            )
        streams = pc.fill_null(streams, default)
    distinct = pc.unique(streams).to_pylist()
    if len(distinct) == 1:
        _stage_columns(stager, distinct[0], batch, names, now)
        return
    for name in sorted(distinct):
        _stage_columns(stager, name, batch.filter(pc.equal(streams, name)), names, now)


def _stage_columns(
    stager: Stager, stream: str, batch: pa.RecordBatch, names: dict[str, int], now: int
) -> None:
    def column(name: str) -> pa.Array | None:
        return batch.column(names[name]) if name in names else None

    values = _binary(column("value"))
    assert values is not None
    keys = _binary(column("key"))
    headers = None
    raw_headers = column("headers")
    if raw_headers is not None:
        headers = [
            () if h is None else [(e["key"], _header_value(e["value"])) for e in h]
            for h in raw_headers.to_pylist()
        ]
    timestamps: int | list[int] = now
    raw_ts = column("timestamp")
    if raw_ts is not None:
        millis = pc.divide(raw_ts.cast(pa.timestamp("us")).cast(pa.int64()), 1000)
        timestamps = pc.fill_null(millis, now).to_pylist()
    stager.append_batch(stream, values, keys=keys, headers=headers, timestamps=timestamps)


def _header_value(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
