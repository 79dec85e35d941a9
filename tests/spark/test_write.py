"""Spark writes to disklesslog, exactly once: batch writes with a retried task and with a
failed job, streaming writes replayed after a failure, and one S3 round trip.

Every test runs a real ``local[2]`` SparkSession (``tests/spark/conftest.py``). A task
fails on purpose through a UDF that raises in the first attempt of partition 0 (Spark's
``TaskContext`` says which attempt runs), after the writer has uploaded some objects.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog.testing import create_bucket
from disklesslog.testing.servers.s3 import s3_storage_options

SparkLog = Any  # tests/spark/conftest.py's SparkLog: url, options, open()

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = 20000
FAIL_AT = ROWS // 2 - 1000
"""Partition 0 holds ids below ROWS // 2: it fails near its end, so its writer has
staged (and, with a small maxObjectBytes, uploaded) most of its rows by then."""


def _input(spark: Any, rows: int = ROWS, partitions: int = 2) -> Any:
    """Rows with every column the sink takes: value, key, headers, stream, timestamp."""
    return spark.range(0, rows, 1, partitions).selectExpr(
        "cast(id as string) as value",
        "cast(cast(id % 7 as string) as binary) as key",
        "array(named_struct('key', 'n', 'value', cast(cast(id as string) as binary))) as headers",
        "concat('s', cast(id % 3 as string)) as stream",
        "timestamp_millis(1700000000000 + id) as timestamp",
    )


def _contents(log: disklesslog.Log) -> dict[str, list[int]]:
    return {
        name: sorted(int(r.value) for r in log.stream(name).read())  # type: ignore[arg-type]
        for name in log.streams()
    }


def _expected(rows: int = ROWS) -> dict[str, list[int]]:
    return {f"s{k}": [i for i in range(rows) if i % 3 == k] for k in range(3)}


def _fail_first_attempt(spark: Any, df: Any, *, always: bool = False) -> Any:
    """``df`` through a UDF that raises in partition 0 (every attempt if ``always``,
    else only the first) near its end."""
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import StringType

    def check(value: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if (
            context is not None
            and context.partitionId() == 0
            and (always or context.attemptNumber() == 0)
            and int(value) >= FAIL_AT
        ):
            raise RuntimeError("injected task failure")
        return value

    return df.withColumn("value", udf(check, StringType())(col("value")))


@pytest.fixture
def small_arrow_batches(spark: Any) -> Any:
    """Spark hands writers Arrow batches of 100 rows (default 10,000), so a task writes
    several objects and a failing one has uploaded some before it fails."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "100")
    yield
    spark.conf.set(key, before)


def _write(df: Any, spark_log: SparkLog, **options: str) -> None:
    writer = df.write.format("disklesslog").options(**spark_log.options, **options)
    writer.mode("append").save()


def _staged_left(spark_log: SparkLog, log: disklesslog.Log) -> tuple[set[str], set[str]]:
    """(staged objects or files still stored, those recorded as orphans)."""
    storage = getattr(log, "storage", None)
    if storage is None:  # local segments: staged files, deleted by an abort
        return {p.name for p in Path(spark_log.url, "staged").glob("*.staged")}, set()
    stored = {key for key in storage.list_objects() if key.endswith(".staged")}
    orphans = {key for key in log.sequencer.objects_to_delete(0) if key.endswith(".staged")}
    return stored, orphans


def _wait_for_cancelled_tasks(spark: Any, spark_log: SparkLog, log: disklesslog.Log) -> None:
    """A failed job's other tasks are cancelled, but a task already in its Python worker
    may go on staging for a moment (Spark 4.0 seen doing so): wait until Spark runs no
    job and the staged data stops changing, so what follows sees all of it."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 60
    while tracker.getActiveJobsIds() or tracker.getActiveStageIds():
        assert time.monotonic() < deadline, "Spark still runs the failed job's tasks"
        time.sleep(0.05)
    seen = _staged_left(spark_log, log)[0]
    while True:
        time.sleep(0.5)
        now = _staged_left(spark_log, log)[0]
        if now == seen:
            return
        assert time.monotonic() < deadline, "staged data keeps changing"
        seen = now


def _collect_everything(log: disklesslog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """Garbage collection with no grace and no minimum age for unknown staged data."""
    for name in ("UNKNOWN_MIN_AGE", "STAGED_UNKNOWN_MIN_AGE"):
        monkeypatch.setattr(f"disklesslog.objects.gc.{name}", 0)
    monkeypatch.setattr("disklesslog.segments.transactions.STAGED_UNKNOWN_MIN_AGE", 0)
    log.collect_garbage(grace_seconds=0)


@pytest.mark.usefixtures("small_arrow_batches")
def test_batch_write_with_a_retried_task_is_exactly_once(
    spark: Any, spark_log: SparkLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    df = _fail_first_attempt(spark, _input(spark))
    _write(df, spark_log, maxObjectBytes="20000")  # the failed attempt uploads some first
    with spark_log.open() as log:
        assert _contents(log) == _expected()
        records = list(log.stream("s1").read())
        first = next(r for r in records if r.value == b"1")
        assert (first.key, first.timestamp, first.headers) == (b"1", 1700000000001, (("n", b"1"),))
        storage = getattr(log, "storage", None)
        if storage is None:
            return
        # The failed attempt's uploads: never committed; the sequencer does not know
        # them (its task was cut off) or has them as orphans (it failed cleanly).
        stored, orphans = _staged_left(spark_log, log)
        live = set(log.sequencer.list_objects()) - orphans
        assert stored - live
        _collect_everything(log, monkeypatch)
        assert _staged_left(spark_log, log)[0] == live
        assert _contents(log) == _expected()


@pytest.mark.usefixtures("small_arrow_batches")
def test_a_failed_batch_job_leaves_nothing_visible(
    spark: Any, spark_log: SparkLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    df = _fail_first_attempt(spark, _input(spark), always=True)
    with pytest.raises(Exception, match="injected task failure"):
        _write(df, spark_log, maxObjectBytes="20000")
    with spark_log.open() as log:
        _wait_for_cancelled_tasks(spark, spark_log, log)
        assert all(not records for records in _contents(log).values())
        _, orphans = _staged_left(spark_log, log)
        if getattr(log, "storage", None) is not None:
            # Nothing was committed: every object the sequencer knows is an orphan
            # (aborted by abort() or by its own failing task); the uploads of a task cut
            # off are unknown to it. Garbage collection takes both.
            assert set(log.sequencer.list_objects()) <= orphans
        _collect_everything(log, monkeypatch)
        assert _staged_left(spark_log, log)[0] == set()


def test_the_same_transaction_id_is_written_once(spark: Any, spark_log: SparkLog) -> None:
    df = _input(spark, 300)
    _write(df, spark_log, transactionId="nightly-2026-11-23")
    _write(df, spark_log, transactionId="nightly-2026-11-23")  # an orchestrator's re-run
    with spark_log.open() as log:
        assert _contents(log) == _expected(300)


def test_overwrite_and_bad_columns_are_refused(spark: Any, spark_log: SparkLog) -> None:
    df = _input(spark, 10)
    with pytest.raises(Exception, match="append-only"):
        df.write.format("disklesslog").options(**spark_log.options).mode("overwrite").save()
    with pytest.raises(Exception, match="cannot be written"):
        _write(df.withColumn("extra", df.value), spark_log)
    with pytest.raises(Exception, match="needs a value column"):
        _write(df.drop("value"), spark_log)


def _stream_once(spark: Any, source: Path, spark_log: SparkLog, checkpoint: Path) -> Any:
    """One ``availableNow`` run of a query copying JSON files to the log."""
    query = (
        spark.readStream.schema("id long")
        .json(str(source))
        .selectExpr("cast(id as string) as value", "concat('s', cast(id % 3 as string)) as stream")
        .writeStream.format("disklesslog")
        .options(**spark_log.options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def _add_input(source: Path, first: int, count: int) -> None:
    source.mkdir(exist_ok=True)
    lines = "\n".join(json.dumps({"id": i}) for i in range(first, first + count))
    (source / f"part-{first:06d}.json").write_text(lines)


def test_a_replayed_micro_batch_is_not_applied_twice(
    spark: Any, spark_log: SparkLog, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    _add_input(source, 0, 300)
    _stream_once(spark, source, spark_log, checkpoint)
    # The driver died after our commit but before Spark noted the batch as committed:
    # without its entry in commits/, a restarted query runs the batch again.
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    crc = commits[-1].with_name(f".{commits[-1].name}.crc")  # Hadoop's checksum beside it
    crc.unlink(missing_ok=True)
    _add_input(source, 300, 150)
    _stream_once(spark, source, spark_log, checkpoint)
    with spark_log.open() as log:
        assert _contents(log) == _expected(450)


def test_a_streaming_write_restarted_after_a_failed_commit(
    spark: Any, tmp_path: Path, spark_log: SparkLog
) -> None:
    """The tasks staged their data, the commit failed: the query stops; once the cause
    is gone, the restarted query commits the batch, once."""
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    _add_input(source, 0, 200)
    _stream_once(spark, source, spark_log, checkpoint)
    _add_input(source, 200, 100)
    with spark_log.open() as log:
        log.stream("s0").append(b"-1")  # the log exists; now break its commits:
    blocker = _block_commits(spark_log)
    with pytest.raises(Exception):  # noqa: B017 - Spark wraps the cause in its own error
        _stream_once(spark, source, spark_log, checkpoint)
    blocker()
    _stream_once(spark, source, spark_log, checkpoint)
    with spark_log.open() as log:
        expected = _expected(300)
        expected["s0"] = [-1, *expected["s0"]]
        assert _contents(log) == expected


def _block_commits(spark_log: SparkLog) -> Any:
    """Make the next commit fail after the tasks staged; returns the undo. Local logs:
    a file where the transaction records go. Object logs: the SQLite sequencer's
    transactions table renamed away (staging never touches it)."""
    if spark_log.options.get("backend") != "objects":
        blocker = Path(spark_log.url) / "transactions"
        if blocker.is_dir():
            blocker.rename(blocker.with_name("transactions.away"))
        blocker.write_text("in the way")

        def undo() -> None:
            blocker.unlink()
            away = blocker.with_name("transactions.away")
            if away.exists():
                away.rename(blocker)

        return undo
    import sqlite3

    db = Path(spark_log.url.removeprefix("file://")) / "disklesslog-meta.db"
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE transactions RENAME TO transactions_away")

    def undo_sql() -> None:
        with sqlite3.connect(db) as conn:
            conn.execute("ALTER TABLE transactions_away RENAME TO transactions")

    return undo_sql


@pytest.mark.s3
def test_s3_round_trip(spark: Any, s3_server: str, tmp_path: Path) -> None:
    options = s3_storage_options(s3_server)
    bucket = create_bucket("s3", options, f"spark-write-{int(time.time() * 1000)}")
    url = f"s3://{bucket}/log"
    spark_options = {
        "url": url,
        "storage.key": options["key"],
        "storage.secret": options["secret"],
        "storage.client_kwargs.endpoint_url": s3_server,
    }
    _input(spark, 500).write.format("disklesslog").options(**spark_options).mode("append").save()
    with disklesslog.open(url, storage_options=options) as log:
        assert _contents(log) == _expected(500)
    back = spark.read.format("disklesslog").options(**spark_options, streams="s0,s1,s2").load()
    assert sorted(int(r.value) for r in back.select("value").collect()) == list(range(500))
