"""Exactly-once writes: Spark batch writes, and what a transactional commit costs.

Groups (``./dev bench --only NAME``):

``spark-write``  a ``local[2]`` Spark job writes 1,000,000 rows (100-byte string values,
                 4 partitions) with ``df.write.format("disklesslog")`` to a ``file://``
                 object log (SQLite sequencer) and to a local log, beside (A) the same
                 DataFrame written as Parquet by Spark itself. Rate: rows per second,
                 the DataFrame's generation included in every variant. Extra column:
                 objects (staged files for the local log) the write stored.
``txn-commit``   the second phase alone, on a SQLite sequencer: ``commit_transaction``
                 of one object of 10 batches, and of 16 objects of 10 batches (a Spark
                 job's 16 tasks), beside (A) a plain ``commit`` of one object of 10
                 batches. Rate: batches committed per second.
``local-txn``    the second phase on a local log (fsync "interval"): committing 16
                 staged parts of 100 records in each of 10 streams (staged before the
                 clock starts), beside (A) appending the same records directly, one
                 ``append_batch`` per stream. Rate: records per second.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from common import Variant
from measured import Collect, Column, Extras, MeasuredGroup
from objects import PlanLike

import disklesslog
from disklesslog.sequencers import BatchToCommit
from disklesslog.sequencers.sqlite import SqliteSequencer

GROUP_KEYS = ("spark-write", "txn-commit", "local-txn")
VALUE_SIZE = 100
PARTITIONS = 4
TXN_BATCHES = 10
TXN_TASKS = 16


# ------------------------------------------------------------------ spark-write


@contextmanager
def spark_session(_work: Path) -> Iterator[Any]:
    """One SparkSession for the group (a JVM takes ~20 s to start)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import disklesslog.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("disklesslog-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    disklesslog.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


def _frame(spark: Any, rows: int) -> Any:
    return spark.range(0, rows, 1, PARTITIONS).selectExpr(
        f"lpad(cast(id as string), {VALUE_SIZE}, 'x') as value"
    )


@contextmanager
def parquet_write(work: Path, spark: Any, *, rows: int) -> Iterator[Callable[[], Collect]]:
    target = work / f"parquet-{uuid.uuid4().hex}"

    def run() -> Collect:
        _frame(spark, rows).write.parquet(str(target))
        files = len(list(target.glob("*.parquet")))
        return lambda: {"objects": float(files)}

    yield run


@contextmanager
def disklesslog_write(
    work: Path, spark: Any, *, rows: int, objects: bool
) -> Iterator[Callable[[], Collect]]:
    name = f"log-{uuid.uuid4().hex}"
    url = f"file://{work / name}" if objects else str(work / name)
    options = {"url": url, "stream": "events"}
    if objects:
        options["backend"] = "objects"

    def run() -> Collect:
        _frame(spark, rows).write.format("disklesslog").options(**options).mode("append").save()

        def collect() -> Extras:
            pattern = "objects/*.staged" if objects else "streams/events/*.log"
            stored = len(list((work / name).glob(pattern)))
            with disklesslog.open(url, **({"backend": "objects"} if objects else {})) as log:
                assert log.stream("events").end_offset == rows
            return {"objects": float(stored)}

        return collect

    yield run


def spark_write_group(plan: PlanLike) -> MeasuredGroup:
    rows = plan.n(1_000_000, 100_000)
    parquet = "Spark -> Parquet"
    return MeasuredGroup(
        key="spark-write",
        title=f"Spark batch write of {rows:,} rows of {VALUE_SIZE} B ({PARTITIONS} "
        "partitions, local[2])",
        shared=spark_session,
        unit="rows",
        note="timed: generating the DataFrame and writing it; objects = Parquet files, "
        "staged objects (file:// log) or segment files (local log) stored",
        columns=[Column("objects", "objects", ",.0f")],
        variants=[
            Variant(
                parquet,
                "baseline",
                partial(parquet_write, rows=rows),
                rows,
                rows * VALUE_SIZE,
                tag="A",
            ),
            Variant(
                "disklesslog file:// objects",
                "subject",
                partial(disklesslog_write, rows=rows, objects=True),
                rows,
                rows * VALUE_SIZE,
                vs=parquet,
            ),
            Variant(
                "disklesslog local log",
                "subject",
                partial(disklesslog_write, rows=rows, objects=False),
                rows,
                rows * VALUE_SIZE,
                vs=parquet,
            ),
        ],
    )


# ------------------------------------------------------------------- txn-commit


def _batches() -> list[BatchToCommit]:
    return [
        BatchToCommit(f"s{i}", i * 1000, 1000, 10, 10, 1_700_000_000_000)
        for i in range(TXN_BATCHES)
    ]


@contextmanager
def plain_commits(work: Path, _shared: Any, *, commits: int) -> Iterator[Callable[[], None]]:
    sequencer = _sequencer(work)
    batches = _batches()

    def run() -> None:
        for _ in range(commits):
            sequencer.commit(f"objects/{uuid.uuid4().hex}", batches)

    try:
        yield run
    finally:
        sequencer.close()


@contextmanager
def transactions(
    work: Path, _shared: Any, *, commits: int, objects: int
) -> Iterator[Callable[[], None]]:
    sequencer = _sequencer(work)
    batches = _batches()

    def run() -> None:
        for _ in range(commits):
            parts = [(f"objects/{uuid.uuid4().hex}", batches) for _ in range(objects)]
            sequencer.commit_transaction(uuid.uuid4().hex, parts)

    try:
        yield run
    finally:
        sequencer.close()


def _sequencer(work: Path) -> SqliteSequencer:
    sequencer = SqliteSequencer(work / f"meta-{uuid.uuid4().hex}.db")
    for i in range(TXN_BATCHES):
        sequencer.create_stream(f"s{i}", {})
    return sequencer


def txn_commit_group(plan: PlanLike) -> MeasuredGroup:
    commits = plan.n(2000, 300)
    plain = "commit (1 object)"
    return MeasuredGroup(
        key="txn-commit",
        title=f"SQLite sequencer: {commits:,} commits of {TXN_BATCHES}-batch objects, plain "
        "and transactional",
        unit="batches",
        note="rate: batches committed per second; a transaction also stores and looks up "
        "its id (and prunes expired ones)",
        variants=[
            Variant(
                plain,
                "baseline",
                partial(plain_commits, commits=commits),
                commits * TXN_BATCHES,
                tag="A",
            ),
            Variant(
                "commit_transaction (1 object)",
                "subject",
                partial(transactions, commits=commits, objects=1),
                commits * TXN_BATCHES,
                vs=plain,
            ),
            Variant(
                f"commit_transaction ({TXN_TASKS} objects)",
                "subject",
                partial(transactions, commits=commits // TXN_TASKS, objects=TXN_TASKS),
                commits // TXN_TASKS * TXN_TASKS * TXN_BATCHES,
                vs=plain,
            ),
        ],
    )


# -------------------------------------------------------------------- local-txn

LOCAL_RECORDS = 100
"""Records per stream in one staged part (a task's share of a stream)."""


def _local_log(work: Path) -> disklesslog.Log:
    return disklesslog.open(str(work / f"log-{uuid.uuid4().hex}"), fsync="interval")


@contextmanager
def local_appends(work: Path, _shared: Any, *, commits: int) -> Iterator[Callable[[], None]]:
    log = _local_log(work)
    values = [b"v" * VALUE_SIZE] * (LOCAL_RECORDS * TXN_TASKS)

    def run() -> None:
        for _ in range(commits):
            for i in range(TXN_BATCHES):
                log.stream(f"s{i}").append_batch(values)

    try:
        yield run
    finally:
        log.close()


@contextmanager
def local_commits(work: Path, _shared: Any, *, commits: int) -> Iterator[Callable[[], None]]:
    log = _local_log(work)
    values = [b"v" * VALUE_SIZE] * LOCAL_RECORDS
    staged = []
    for _ in range(commits):  # phase one, as the executors would: not timed
        parts = []
        for _ in range(TXN_TASKS):
            stager = log.stager()
            for i in range(TXN_BATCHES):
                stager.append_batch(f"s{i}", values)
            parts.append(stager.finish())
        staged.append(parts)

    def run() -> None:
        for parts in staged:
            log.commit_transaction(uuid.uuid4().hex, parts)

    try:
        yield run
    finally:
        log.close()


def local_txn_group(plan: PlanLike) -> MeasuredGroup:
    commits = plan.n(40, 8)
    records = commits * TXN_TASKS * TXN_BATCHES * LOCAL_RECORDS
    direct = "append_batch per stream"
    return MeasuredGroup(
        key="local-txn",
        title=f"local log: {commits} transactions of {TXN_TASKS} parts x {TXN_BATCHES} "
        f"streams x {LOCAL_RECORDS} records of {VALUE_SIZE} bytes",
        unit="records",
        note="rate: records made visible per second; the transactions' parts are staged "
        "before the clock starts (phase one runs on the executors)",
        variants=[
            Variant(direct, "baseline", partial(local_appends, commits=commits), records, tag="A"),
            Variant(
                "commit_transaction",
                "subject",
                partial(local_commits, commits=commits),
                records,
                vs=direct,
            ),
        ],
    )


def spark_write_groups(plan: PlanLike) -> list[MeasuredGroup]:
    return [spark_write_group(plan), txn_commit_group(plan), local_txn_group(plan)]
