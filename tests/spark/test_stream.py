"""Streaming reads through a real SparkSession: checkpoints and restarts, admission
control, Trigger.AvailableNow, new streams, failOnDataLoss."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spark_logs import SparkLog

from disklesslog.spark.stream import ReadMaxRows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TIMEOUT = 180


def _available_now(
    spark: Any, spark_log: SparkLog, work: Path, **options: str
) -> tuple[Any, list[int]]:
    """Run one ``Trigger.AvailableNow`` query from the checkpoint in ``work`` into a
    Parquet sink (exactly once); return the query and its micro-batches' row counts."""
    query = (
        spark_log.read_stream(spark, streamPattern="s.*", startingOffsets="earliest", **options)
        .select("stream", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(TIMEOUT)
    if query.exception() is not None:
        raise query.exception()
    return query, [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def _output(spark: Any, work: Path) -> Counter[tuple[str, int]]:
    """How many times each (stream, offset) reached the sink."""
    rows = spark.read.parquet(str(work / "out")).select("stream", "offset").collect()
    return Counter((row.stream, row.offset) for row in rows)


def _all(**counts: int) -> Counter[tuple[str, int]]:
    return Counter({(name, i): 1 for name, n in counts.items() for i in range(n)})


def test_restart_from_checkpoint_limit_and_new_streams(
    spark: Any, spark_log: SparkLog, tmp_path: Path
) -> None:
    """With admission control (Spark 4.2+) each micro-batch takes at most
    ``maxRecordsPerTrigger``; before 4.2 that option is refused with a clear error and
    the query reads everything available per micro-batch."""
    with spark_log.open() as log:
        for _ in range(4):
            log.stream("s1").append_batch([b"one"] * 5)
        log.stream("s2").append_batch([b"two"] * 10)
        log.stream("other").append_batch([b"not matched"] * 3)

    limit: dict[str, str] = {"maxRecordsPerTrigger": "7"}
    if ReadMaxRows is None:  # Spark 4.0/4.1: latestOffset() takes no start, no limit
        with pytest.raises(Exception, match=r"maxRecordsPerTrigger needs Spark 4\.2"):
            _available_now(spark, spark_log, tmp_path / "refused", **limit)
        limit = {}
    _, batches = _available_now(spark, spark_log, tmp_path, **limit)
    assert sum(batches) == 30
    if limit:
        assert max(batches) <= 7
        assert len(batches) >= 5  # 30 records at most 7 at a time
    assert _output(spark, tmp_path) == _all(s1=20, s2=10)

    with spark_log.open() as log:
        log.stream("s1").append_batch([b"one"] * 15)
        log.stream("s3").append_batch([b"three"] * 5)  # new: read from its beginning

    _, batches = _available_now(spark, spark_log, tmp_path, **limit)
    assert sum(batches) == 20
    if limit:
        assert max(batches) <= 7
    assert _output(spark, tmp_path) == _all(s1=35, s2=10, s3=5)  # nothing lost or repeated


def test_running_query_starts_at_latest_and_follows(spark: Any, tmp_path: Path) -> None:
    import disklesslog

    url = str(tmp_path / "log")
    with disklesslog.open(url, fsync="never") as log:
        log.stream("s1").append_batch([b"before"] * 5)
        query = (
            spark.readStream.format("disklesslog")
            .options(url=url, streams="s1,s2", includeHeaders="true")
            .load()
            .writeStream.format("memory")
            .queryName("follow")
            .start()
        )
        try:
            query.processAllAvailable()
            log.stream("s1").append_batch([b"after"] * 3, headers=[{"h": b"v"}] * 3)
            log.stream("s2").append(b"new stream")  # named but absent at the start
            query.processAllAvailable()
            rows = spark.sql("select stream, offset, value, headers from follow").collect()
        finally:
            query.stop()
    got = sorted((r.stream, r.offset, r.value, [(h.key, h.value) for h in r.headers]) for r in rows)
    assert got == [
        ("s1", 5, b"after", [("h", b"v")]),
        ("s1", 6, b"after", [("h", b"v")]),
        ("s1", 7, b"after", [("h", b"v")]),
        ("s2", 0, b"new stream", []),
    ]


def test_fail_on_data_loss(spark: Any, tmp_path: Path) -> None:
    """Records trimmed between two runs of a query: an error by default, skipped with
    ``failOnDataLoss=false``; the query then goes on without repeating anything."""
    import disklesslog

    spark_log = SparkLog(str(tmp_path / "log"), {"url": str(tmp_path / "log")})
    with disklesslog.open(spark_log.url) as log:
        log.stream("s1").append_batch([b"x"] * 10)
    _available_now(spark, spark_log, tmp_path)
    with disklesslog.open(spark_log.url) as log:
        log.stream("s1").append_batch([b"y"] * 10)
        log.stream("s1").trim(15)

    with pytest.raises(Exception, match="failOnDataLoss=false") as caught:
        _available_now(spark, spark_log, tmp_path)
    assert "offsets 10..14 were trimmed" in str(caught.value)

    _, batches = _available_now(spark, spark_log, tmp_path, failOnDataLoss="false")
    assert sum(batches) == 5
    expected = _all(s1=10) + Counter({("s1", i): 1 for i in range(15, 20)})
    assert _output(spark, tmp_path) == expected


@pytest.mark.s3
def test_restart_from_checkpoint_on_s3(spark: Any, s3_server: str, tmp_path: Path) -> None:
    """The streaming read of a log in the moto S3 server, sequenced by the object-store
    sequencer in the bucket: a limit per trigger, a restart, nothing lost or repeated."""
    from disklesslog.testing import create_bucket, s3_storage_options

    storage = s3_storage_options(s3_server)
    url = f"s3://{create_bucket('s3', storage, 'spark-stream')}/log"
    spark_log = SparkLog(
        url,
        {
            "url": url,
            "storage.key": storage["key"],
            "storage.secret": storage["secret"],
            "storage.client_kwargs.endpoint_url": s3_server,
        },
        {"storage_options": storage},
    )
    with spark_log.open() as log:
        log.stream("s1").append_batch([b"one"] * 12)
        log.stream("s2").append_batch([b"two"] * 6)
    limit = {} if ReadMaxRows is None else {"maxRecordsPerTrigger": "8"}  # 4.2+
    _, batches = _available_now(spark, spark_log, tmp_path, **limit)
    assert sum(batches) == 18
    assert max(batches) <= (8 if limit else 18)
    with spark_log.open() as log:
        writer = log.writer()
        for i in range(10):  # several flushes, so several sequencer entries to replay
            writer.append("s1" if i % 2 else "s3", b"more")
            writer.flush()
        writer.close()
    _, batches = _available_now(spark, spark_log, tmp_path, **limit)
    assert sum(batches) == 10
    assert _output(spark, tmp_path) == _all(s1=17, s2=6, s3=5)
