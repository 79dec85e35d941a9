"""Streaming reads (``spark.readStream.format("disklesslog")``).

Spark's offsets for this source are JSON dicts ``{"stream": next_offset}``: the offset
of the first record a micro-batch has not read, per stream. Spark checkpoints them, so a
restarted query goes on exactly where the last committed micro-batch ended; a batch is
planned from ``(start, end)`` alone, so replaying it reads the same records.

Spark 4.2+ calls ``latestOffset(start, limit)`` (admission control, chosen because the
method takes parameters); Spark 4.0/4.1 call ``latestOffset()`` with none. One method
with optional parameters serves both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..api import AbstractLog
from ..errors import ConfigError, OffsetOutOfRange
from .options import LATEST, ReadOptions
from .read import (
    StreamRange,
    check_schema,
    read_partition,
    selected_streams,
    split_range,
    start_offset_for,
)
from .schema import arrow_schema

try:
    from pyspark.sql.streaming.datasource import (
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0/4.1: no read limits and no Trigger.AvailableNow hook
    ReadLimit = object  # type: ignore[assignment,misc]
    ReadMaxRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

__all__ = ["StreamReader", "admit"]

logger = logging.getLogger("disklesslog.spark")


def admit(begin: dict[str, int], latest: dict[str, int], budget: int) -> dict[str, int]:
    """End offsets that take at most ``budget`` offsets in all from ``begin`` towards
    ``latest``, shared in proportion to each stream's backlog (Kafka's
    ``maxOffsetsPerTrigger`` rule), the rounding remainder going to streams in name
    order. Every stream with a backlog gets a share once the budget allows, so none
    starves."""
    backlog = {name: latest[name] - begin[name] for name in latest if latest[name] > begin[name]}
    total = sum(backlog.values())
    if total <= budget:
        return dict(latest)
    shares = {name: budget * lag // total for name, lag in backlog.items()}
    left = budget - sum(shares.values())
    for name in sorted(backlog):
        if left == 0:
            break
        if shares[name] < backlog[name]:
            shares[name] += 1
            left -= 1
    return {
        name: begin[name] + shares[name] if name in backlog else latest[name] for name in latest
    }


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (in one long-lived Python process, which keeps
    the log open between calls) and reads them on executors like a batch read."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options
        self.arrow_schema = arrow_schema(schema)
        self._log: AbstractLog | None = None
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: read up to here

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the open log: executors open their own."""
        state = dict(self.__dict__)
        state["_log"] = None
        return state

    def _open(self) -> AbstractLog:
        if self._log is None:
            self._log = self.options.log.open()
        return self._log

    def _latest(self) -> dict[str, int]:
        """End offsets of the selected streams now; new streams show up here."""
        log = self._open()
        return {
            name: log.stream(name).end_offset
            for name in selected_streams(log, self.options, must_exist=False)
        }

    # ------------------------------------------------------------ Spark's calls

    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts: ``startingOffsets`` (default ``latest``, as Kafka's
        streaming source) or ``startingTimestamp``. A named stream that does not exist yet
        is read from its beginning once it appears."""
        log = self._open()
        offsets = {}
        for name in selected_streams(log, self.options, must_exist=False):
            stream = log.stream(name)
            first, last = stream.start_offset, stream.end_offset
            offsets[name] = start_offset_for(stream, self.options, first, last, default=LATEST)
        return offsets

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        """The end offsets of the next micro-batch.

        With ``start`` (Spark 4.2+), ``limit`` may be ``ReadMaxRows`` (from
        ``maxRecordsPerTrigger`` via :meth:`getDefaultReadLimit`): the batch then takes at
        most that many offsets, shared across streams by backlog. Streams that match and
        are new since ``start`` are read from their earliest offset. Under
        ``Trigger.AvailableNow`` nothing past the offsets noted at the query's start is
        read.
        """
        latest = self._latest()
        if self._target is not None:
            target = self._target
            latest = {
                name: min(end, target[name]) for name, end in latest.items() if name in target
            }
        if start is None:
            if self.options.max_records_per_trigger is not None:
                raise ConfigError(
                    "maxRecordsPerTrigger needs Spark 4.2 or newer (admission control for "
                    "Python data sources); remove it or upgrade pyspark"
                )
            return latest
        begin: dict[str, int] = {}
        log = self._open()
        for name, end in latest.items():
            if name not in start:
                begin[name] = log.stream(name).start_offset  # new: from its earliest
            elif end < start[name]:
                latest[name] = self._went_back(name, start[name], end)
                begin[name] = latest[name]
            else:
                begin[name] = start[name]
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            latest = admit(begin, latest, limit.max_rows)
        # A stream deleted since ``start`` keeps its offset: offsets never go back.
        return {**start, **latest}

    def _went_back(self, name: str, was: int, now: int) -> int:
        """A stream's end offset is below what was already read: it was deleted and
        created again. ``failOnDataLoss`` decides: fail, or go on from its new end."""
        message = (
            f"stream {name!r}: its end offset went back from {was} to {now} (deleted and "
            "created again?)"
        )
        if self.options.fail_on_data_loss:
            raise OffsetOutOfRange(
                f"{message}; set the option failOnDataLoss=false to go on from its new end",
                start_offset=0,
                end_offset=now,
            )
        logger.warning("%s; going on from offset %d (failOnDataLoss=false)", message, now)
        return now

    def getDefaultReadLimit(self) -> Any:
        """``ReadMaxRows(maxRecordsPerTrigger)`` when that option is set (Spark 4.2+)."""
        if self.options.max_records_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return super().getDefaultReadLimit()

    def reportLatestOffset(self) -> dict[str, int]:
        """The streams' end offsets now, for the query's progress reports."""
        return self._latest()

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: note the end offsets now; the query reads up to them
        (in several micro-batches if ``maxRecordsPerTrigger`` says so) and stops."""
        self._target = self._latest()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        """The ranges ``[start, end)`` per stream (a stream new since ``start`` from its
        earliest offset), split by ``maxRecordsPerPartition``."""
        ranges: list[StreamRange] = []
        for name, until in sorted(end.items()):
            begin = start.get(name)
            if begin is None:
                begin = self._open().stream(name).start_offset
            ranges += split_range(name, begin, until, self.options.max_records_per_partition)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, StreamRange):
            return iter(())  # Spark's stand-in when a read plans no partitions
        return read_partition(
            self.options.log, partition, self.arrow_schema, self.options.fail_on_data_loss
        )

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the log keeps every record until retention, whatever a
        query has read. (Spark's checkpoint, not the log, remembers the position.)"""

    def stop(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
