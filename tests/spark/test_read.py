"""Batch reads through a real SparkSession, on local segments and file:// objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from spark_logs import SparkLog

import disklesslog
from disklesslog import Record

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _fill(log: disklesslog.Log) -> dict[str, list[Record]]:
    """Three streams written in several appends (several batches each), with keys,
    headers (repeated keys, a null value), a tombstone and distinct timestamps."""
    for round_ in range(3):
        base = 1_700_000_000_000 + round_ * 1000
        log.stream("alpha").append_batch(
            [b"a%d-%d" % (round_, i) for i in range(9)] + [None],
            keys=[b"k%d" % (i % 4) for i in range(9)] + [b"k0"],
            headers=[[("h", b"1"), ("h", None)]] * 5 + [{}] * 5,
            timestamps=[base + i for i in range(10)],
        )
        log.stream("beta").append_batch([b"b%d" % i for i in range(4)], timestamps=base)
    log.stream("gamma").append(b"g")
    return {name: list(log.stream(name).read()) for name in log.streams()}


def _rows(df: Any) -> list[tuple[Any, ...]]:
    """The DataFrame's rows as comparable tuples, in (stream, offset) order."""
    rows = []
    for row in df.collect():
        item = (row.stream, row.offset, row.key, row.value, row.timestamp)
        if "headers" in df.columns:
            item += (tuple((h.key, h.value) for h in row.headers),)
        rows.append(item)
    return sorted(rows, key=lambda r: (r[0], r[1]))


def _expected(records: dict[str, list[Record]], headers: bool = False) -> list[tuple[Any, ...]]:
    from datetime import datetime, timezone

    out = []
    for name in sorted(records):
        for r in records[name]:
            # Spark returns naive local datetimes for timestamp columns (session zone).
            when = datetime.fromtimestamp(r.timestamp / 1000, tz=timezone.utc).astimezone()
            item = (name, r.offset, r.key, r.value, when.replace(tzinfo=None))
            if headers:
                item += (tuple(r.headers),)
            out.append(item)
    return out


def test_batch_read_equals_stream_read(spark: Any, spark_log: SparkLog) -> None:
    with spark_log.open() as log:
        records = _fill(log)
    wanted = {name: records[name] for name in ("alpha", "beta")}

    df = spark_log.read(spark, streams="alpha,beta", includeHeaders="true")
    assert df.columns == ["key", "value", "stream", "offset", "timestamp", "headers"]
    assert _rows(df) == _expected(wanted, headers=True)

    split = spark_log.read(spark, streams="alpha,beta", maxRecordsPerPartition="7")
    assert split.rdd.getNumPartitions() == 5 + 2  # 30 offsets of alpha by 7, 12 of beta
    assert _rows(split) == _expected(wanted)
    assert split.groupBy("key").count().where("key = 'k0'").first()["count"] == 3 * 4


def test_columns_option_reads_only_those_columns(spark: Any, spark_log: SparkLog) -> None:
    """``columns`` stands in for the column pruning Spark's Python data sources lack: the
    DataFrame has exactly those columns, in that order, with the same contents."""
    with spark_log.open() as log:
        records = _fill(log)
    df = spark_log.read(spark, streams="alpha", columns="offset,key,headers")
    assert df.columns == ["offset", "key", "headers"]
    got = sorted(
        (r.offset, r.key, tuple((h.key, h.value) for h in r.headers)) for r in df.collect()
    )
    assert got == [(r.offset, r.key, tuple(r.headers)) for r in records["alpha"]]
    assert spark_log.read(spark, streams="alpha,beta", columns="key").count() == 42
    counts = spark_log.read(spark, streams="alpha", columns="key").groupBy("key").count()
    # bytes(): Spark 4.0 collects binary columns as bytearray (unhashable).
    assert {bytes(r.key): r["count"] for r in counts.collect()}[b"k0"] == 3 * 4


def test_offset_columns_are_read_from_offsets_alone(spark: Any, spark_log: SparkLog) -> None:
    """``columns`` of ``stream``/``offset`` only read offsets (Stream.read_offsets, no
    dense batch decoded): the same rows as a full read, across compaction gaps (batches
    with gaps are decoded) and a partition split."""
    with spark_log.open() as log:
        log.create_stream("c", cleanup_policy="compact", segment_bytes=2048)
        for round_ in range(12):
            log.stream("c").append_batch(
                [b"v%d-%d" % (round_, i) + b"x" * 60 for i in range(20)],
                keys=[b"k%d" % (i % 3) for i in range(20)],
                timestamps=1_000 + round_,
            )
        log.compact("c", now_ms=10**12)
        offsets = [r.offset for r in log.stream("c").read()]
        assert len(offsets) < 240 and any(type(p) is tuple for p in log.stream("c").read_offsets())
    for extra in ({}, {"maxRecordsPerPartition": "37"}):
        df = spark_log.read(spark, streams="c", columns="stream,offset", **extra)
        assert df.columns == ["stream", "offset"]
        assert sorted((r.stream, r.offset) for r in df.collect()) == [("c", o) for o in offsets]
        assert spark_log.read(spark, streams="c", columns="offset", **extra).count() == len(offsets)


def test_offset_options(spark: Any, spark_log: SparkLog) -> None:
    with spark_log.open() as log:
        records = _fill(log)

    def offsets(**options: str) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        df = spark_log.read(spark, streamPattern="alpha|beta", **options)
        for row in df.select("stream", "offset").collect():
            found.setdefault(row.stream, []).append(row.offset)
        return {name: sorted(found[name]) for name in sorted(found)}

    everything = {n: [r.offset for r in records[n]] for n in ("alpha", "beta")}
    assert offsets() == everything
    assert offsets(startingOffsets="earliest", endingOffsets="latest") == everything
    assert offsets(startingOffsets="latest") == {}
    assert offsets(
        startingOffsets=json.dumps({"alpha": 25, "beta": -2}),
        endingOffsets=json.dumps({"alpha": 28, "beta": 5}),
    ) == {"alpha": [25, 26, 27], "beta": [0, 1, 2, 3, 4]}
    # A stream left out of the JSON: from earliest / to latest; past the end: to the end.
    assert offsets(
        startingOffsets=json.dumps({"alpha": 29}), endingOffsets=json.dumps({"alpha": 99})
    ) == {"alpha": [29], "beta": list(range(12))}
    # From the first record at or after the time; beta has none that late: nothing.
    assert offsets(startingTimestamp=str(1_700_000_000_000 + 2005)) == {
        "alpha": list(range(25, 30))
    }
    assert offsets(startingTimestamp=str(1_700_000_000_000 + 2000)) == {
        "alpha": list(range(20, 30)),
        "beta": list(range(8, 12)),
    }


def test_empty_result_and_discovery(spark: Any, spark_log: SparkLog) -> None:
    """Found by name through the ``pyspark_disklesslog`` module, without register();
    register() works too; a pattern that matches nothing reads nothing; ``load(url)``."""
    from disklesslog.spark import register

    with spark_log.open() as log:
        _fill(log)
    assert spark_log.read(spark, streamPattern="nothing.*").count() == 0
    register(spark)
    assert spark_log.read(spark, streams="gamma").first().value == b"g"
    # The URL as load()'s path, as with file formats.
    options = {k: v for k, v in spark_log.options.items() if k != "url"}
    df = spark.read.format("disklesslog").options(**options, streams="gamma").load(spark_log.url)
    assert df.first().value == b"g"


def test_trimmed_offsets_follow_fail_on_data_loss(spark: Any, spark_log: SparkLog) -> None:
    with spark_log.open() as log:
        _fill(log)
        log.stream("alpha").trim(10)
    start = json.dumps({"alpha": 5})
    with pytest.raises(Exception, match="failOnDataLoss=false") as caught:
        spark_log.read(spark, streams="alpha", startingOffsets=start).count()
    assert "offsets 5..9 were trimmed" in str(caught.value)
    df = spark_log.read(spark, streams="alpha", startingOffsets=start, failOnDataLoss="false")
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(10, 30))


def test_bad_options_fail_when_the_query_is_defined(spark: Any, spark_log: SparkLog) -> None:
    with spark_log.open() as log:
        _fill(log)
    with pytest.raises(Exception, match="unknown read option 'startingoffset'"):
        spark_log.read(spark, streams="alpha", startingOffset="earliest")
    with pytest.raises(Exception, match=r"stream\(s\) missing not found"):
        spark_log.read(spark, streams="alpha,missing").count()
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("disklesslog").options(**spark_log.options, streams="alpha").schema(
            "value binary"
        ).load().count()


def test_not_a_log_is_an_error(spark: Any, tmp_path: Path) -> None:
    """Reads never create a log: a mistyped URL fails instead of reading nothing."""
    with pytest.raises(Exception, match="this does not create a log"):
        spark.read.format("disklesslog").options(
            url=str(tmp_path / "nothing"), streams="a"
        ).load().count()


@pytest.mark.s3
def test_s3_round_trip(spark: Any, s3_server: str) -> None:
    """One read from the moto S3 server, reached through ``storage.<key>`` options
    (the log's sequencer is the object-store one inside the bucket)."""
    from disklesslog.testing import create_bucket, s3_storage_options

    storage = s3_storage_options(s3_server)
    bucket = create_bucket("s3", storage, "spark-read")
    url = f"s3://{bucket}/log"
    with disklesslog.open(url, storage_options=storage) as log:
        records = _fill(log)
    df = (
        spark.read.format("disklesslog")
        .options(
            url=url,
            streams="alpha,beta,gamma",
            includeHeaders="true",
            **{
                "storage.key": storage["key"],
                "storage.secret": storage["secret"],
                "storage.client_kwargs.endpoint_url": s3_server,
            },
        )
        .load()
    )
    assert _rows(df) == _expected(records, headers=True)
