"""Spark workloads: reading a log into a DataFrame beside Spark reading the same records
from Parquet.

Group (``./dev bench --only spark``):

``spark-read``  1,000,000 records of 100-byte values (1,000 distinct keys) in one
                stream, written in batches of 1,000. Timed: ``count()`` and
                ``groupBy("key").count()`` over ``spark.read.format("disklesslog")``
                (local segments, and a ``file://`` object log with its SQLite sequencer;
                each also with the ``columns`` option naming only the column the query
                needs: ``offset`` for count, which reads offsets alone, ``key`` for
                groupBy),
                beside the same two queries over a Parquet file of the same columns written
                with pyarrow in the same run. Rate: records of the stream per second.

One ``local[2]`` SparkSession serves every run (started once, untimed: a JVM takes
~25 s). ``maxRecordsPerPartition`` cuts the stream into 4 partitions, so both cores read;
the Parquet file has 4 row groups for the same reason. Spark answers a Parquet
``count()`` from row-group metadata without reading a value, while a Python data source
always reads and ships every column: the count rows measure that gap, the groupBy rows
a query that reads the data on both sides. A third baseline, ``floor``, is a Python data
source that yields pre-built Arrow batches of the same columns (nothing read or
decoded): what the Python data source path itself costs, over all columns and over the
one column the ``columns`` variants read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from common import Goal, Group, Variant

import disklesslog

GROUP_KEYS = ("spark-read",)

VALUE_SIZE = 100
KEYS = 1000
BATCH = 1000
STREAM = "events"
PARTITIONS = 4


@dataclass
class SparkData:
    spark: Any
    local: Path  # a local log holding the stream
    objects: Path  # a file:// object log holding the same records
    parquet: Path
    records: int


def _fill(log: disklesslog.Log, records: int, value: bytes) -> None:
    keys = [b"key-%04d" % (i % KEYS) for i in range(BATCH)]
    stream = log.stream(STREAM)
    for _ in range(records // BATCH):
        stream.append_batch([value] * BATCH, keys=keys)


def _write_parquet(local: Path, path: Path, records: int) -> None:
    """The stream's records, as the data source's columns, in a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from disklesslog.spark.read import StreamRange, read_range, to_arrow
    from disklesslog.spark.schema import arrow_schema, read_schema

    schema = arrow_schema(read_schema(False))
    with disklesslog.open(local, create=False) as log:
        part = StreamRange(STREAM, 0, records)
        table = pa.Table.from_batches(list(to_arrow(read_range(log, part, True), STREAM, schema)))
    pq.write_table(table, path, row_group_size=records // PARTITIONS)


@contextmanager
def spark_data(directory: Path, *, records: int) -> Iterator[SparkData]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    value = os.urandom(VALUE_SIZE)
    local, objects, parquet = directory / "local", directory / "objects", directory / "p.parquet"
    with disklesslog.open(local, fsync="never") as log:
        _fill(log, records, value)
    with disklesslog.open(f"file://{objects}", backend="objects") as log:
        _fill(log, records, value)
    _write_parquet(local, parquet, records)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("disklesslog-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    _register_floor(spark, records)
    try:
        yield SparkData(spark, local, objects, parquet, records)
    finally:
        spark.stop()


def _query(df: Any, query: str, records: int) -> None:
    if query == "count":
        got = df.count()
        assert got == records, f"count() gave {got}, expected {records}"
    else:
        groups = df.groupBy("key").count().collect()
        assert len(groups) == KEYS and sum(row["count"] for row in groups) == records


@contextmanager
def parquet_read(work: Path, data: SparkData, *, query: str) -> Iterator[Callable[[], None]]:
    yield lambda: _query(data.spark.read.parquet(str(data.parquet)), query, data.records)


def _register_floor(spark: Any, records: int) -> None:
    """Register ``floor``: a Python data source whose tasks yield one pre-built Arrow
    batch of the same columns over and over. Nothing is read or decoded, so its rate is
    the most any Python data source reaches here. Defined in a function so Spark pickles
    the classes by value (executors cannot import this benchmark module)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from disklesslog.spark.schema import arrow_schema, read_schema

    class FloorReader(DataSourceReader):
        def __init__(self, schema: Any) -> None:
            self.schema = schema

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(PARTITIONS)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import pyarrow as pa

            rows = 65_536
            columns = {  # built only if the schema has them
                "key": lambda: pa.array(
                    [b"key-%04d" % (i % KEYS) for i in range(rows)], pa.binary()
                ),
                "value": lambda: pa.array([os.urandom(VALUE_SIZE)] * rows, pa.binary()),
                "stream": lambda: pa.repeat(pa.scalar(STREAM, pa.string()), rows),
                "offset": lambda: pa.array(range(rows), pa.int64()),
                "timestamp": lambda: pa.array([0] * rows, pa.timestamp("us", tz="UTC")),
            }
            batch = pa.RecordBatch.from_arrays(
                [columns[name]() for name in self.schema.fieldNames()],
                schema=arrow_schema(self.schema),
            )
            left = records // PARTITIONS
            while left > 0:
                yield batch.slice(0, min(rows, left))
                left -= rows

    class Floor(DataSource):
        """Options: ``columns`` as disklesslog's (a comma-separated subset)."""

        @classmethod
        def name(cls) -> str:
            return "floor"

        def schema(self) -> Any:
            columns = self.options.get("columns")
            if columns:
                return read_schema(columns=tuple(columns.split(",")))
            return read_schema(False)

        def reader(self, schema: Any) -> FloorReader:
            return FloorReader(schema)

    spark.dataSource.register(Floor)


@contextmanager
def floor_read(
    work: Path, data: SparkData, *, query: str, columns: str | None = None
) -> Iterator[Callable[[], None]]:
    options = {} if columns is None else {"columns": columns}
    yield lambda: _query(
        data.spark.read.format("floor").options(**options).load(), query, data.records
    )


@contextmanager
def disklesslog_read(
    work: Path, data: SparkData, *, query: str, backend: str, columns: str | None = None
) -> Iterator[Callable[[], None]]:
    if backend == "segments":
        options = {"url": str(data.local)}
    else:
        options = {"url": f"file://{data.objects}", "backend": "objects"}
    if columns is not None:
        options["columns"] = columns
    per_partition = str(-(-data.records // PARTITIONS))

    def run() -> None:
        df = (
            data.spark.read.format("disklesslog")
            .options(**options, streams=STREAM, maxRecordsPerPartition=per_partition)
            .load()
        )
        _query(df, query, data.records)

    yield run


def spark_group(plan: Any) -> Group:
    records = plan.n(1_000_000, 200_000)
    variants = []
    for query, label in (("count", "count()"), ("group", 'groupBy("key").count()')):
        baseline = f"Parquet (pyarrow-written), {label}"
        variants.append(
            Variant(
                baseline,
                "baseline",
                partial(parquet_read, query=query),
                records,
                records * VALUE_SIZE,
                tag="P" if query == "count" else "Q",
            )
        )
        variants.append(
            Variant(
                f"Python data source floor (pre-built Arrow batches), {label}",
                "baseline",
                partial(floor_read, query=query),
                records,
                records * VALUE_SIZE,
                tag="F" if query == "count" else "G",
                note="yields one Arrow batch repeatedly: no read, no decode",
            )
        )
        # The columns option: what the query needs, as column pruning would give it.
        # columns=offset reads offsets alone (Stream.read_offsets: no batch decoded).
        columns = "offset" if query == "count" else "key"
        variants.append(
            Variant(
                f"Python data source floor, columns={columns}, {label}",
                "baseline",
                partial(floor_read, query=query, columns=columns),
                records,
                records * VALUE_SIZE,
                note="pre-built Arrow batches of that one column",
            )
        )
        for picked in (None, columns):
            for backend, where in (("segments", "local segments"), ("objects", "file:// objects")):
                shown = "" if picked is None else f", columns={picked}"
                variants.append(
                    Variant(
                        f"disklesslog {where}{shown}, {label}",
                        "subject",
                        partial(disklesslog_read, query=query, backend=backend, columns=picked),
                        records,
                        records * VALUE_SIZE,
                        vs=baseline,
                        note="" if picked is None else "only the column the query needs",
                    )
                )
    return Group(
        key="spark-read",
        title=f"Spark batch read into a DataFrame: {records:,} records of {VALUE_SIZE} B, "
        f"{KEYS:,} keys, local[2]",
        shared=partial(spark_data, records=records),
        baseline="Parquet (pyarrow-written), count()",
        goals=[
            Goal(
                "Spark read of a log >= 50% of Parquet rows/s (groupBy on key, local segments)",
                'disklesslog local segments, groupBy("key").count()',
                ratio=0.5,
            ),
            Goal(
                "Spark read of a log >= 50% of Parquet rows/s (count(), local segments)",
                "disklesslog local segments, count()",
                ratio=0.5,
            ),
            Goal(
                "... the same with the columns option (groupBy on key, columns=key)",
                'disklesslog local segments, columns=key, groupBy("key").count()',
                ratio=0.5,
            ),
            Goal(
                "... the same with the columns option (count(), columns=offset)",
                "disklesslog local segments, columns=offset, count()",
                ratio=0.5,
            ),
        ],
        note="timed: building the DataFrame and running the query (the SparkSession is "
        "started once, untimed); rate = records of the stream per second",
        variants=variants,
    )
