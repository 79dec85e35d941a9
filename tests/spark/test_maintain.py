"""``disklesslog.spark.maintain``: per-stream maintenance on executors, gc on the driver."""

from __future__ import annotations

from typing import Any

import pytest

import disklesslog.spark

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DAY_MS = 24 * 3600 * 1000


def test_maintain_runs_every_stream_on_executors(spark: Any, spark_log: Any) -> None:
    with spark_log.open() as log:
        for name in ("a", "b", "c"):
            # Small segments (local logs): old records sit in closed segments, which
            # retention may delete whole; object logs trim batch by batch.
            log.create_stream(name, retention_ms=DAY_MS, segment_bytes=1024)
            stream = log.stream(name)
            for day in range(3):
                stream.append_batch([b"x" * 200] * 5, timestamps=day * DAY_MS)
        log.create_stream("kept", segment_bytes=1024)
        log.stream("kept").append_batch([b"y"] * 5, timestamps=0)
    report = disklesslog.spark.maintain(
        spark,
        spark_log.url,
        backend=spark_log.open_options.get("backend"),
        now_ms=3 * DAY_MS,
    )
    assert report.operation == "maintain" and report.streams == 4
    assert report.records_removed == 3 * 10  # days 0 and 1 of a, b and c
    with spark_log.open() as log:
        for name in ("a", "b", "c"):
            assert log.stream(name).start_offset == 10
        assert log.stream("kept").start_offset == 0
    with pytest.raises(disklesslog.ConfigError):
        disklesslog.spark.maintain(spark, spark_log.url, streams="a")


def test_maintain_compacts_and_merges_on_executors(spark: Any, spark_log: Any) -> None:
    """A compacted stream keeps the latest record per key once its closed part is
    compacted on an executor; on object logs, streams spread over many small WAL
    objects are merged into a few per-stream objects."""
    later = 10**13  # ms: merging's age rule never makes the newest piece wait
    latest: dict[bytes, bytes] = {}
    with spark_log.open() as log:
        log.create_stream("table", cleanup_policy="compact", segment_bytes=1024)
        log.create_stream("events", segment_bytes=1024)
        for round_no in range(30):  # one flush per round: thirty WAL objects on objects
            with log.writer(linger_ms=60_000) as writer:
                keys = [b"k%d" % (n % 7) for n in range(round_no, round_no + 10)]
                values = [b"v%d-%d" % (round_no, n) for n in range(10)]
                writer.append_batch("table", values, keys=keys)
                writer.append_batch("events", [b"e%d" % round_no] * 10)
            latest.update(zip(keys, values, strict=True))
        objects = spark_log.open_options.get("backend") == "objects"
        before = log.stream("events").info().details.get("objects")
    report = disklesslog.spark.maintain(
        spark, spark_log.url, backend=spark_log.open_options.get("backend"), now_ms=later
    )
    assert report.records_removed > 0, report.summary()
    with spark_log.open() as log:
        rows = list(log.stream("table").read())
        assert len(rows) < 300, "nothing was compacted"
        assert {r.key: r.value for r in rows} == latest, "compaction lost a latest value"
        assert [r.value for r in log.stream("events").read()] == [
            b"e%d" % n for n in range(30) for _ in range(10)
        ]
        if objects:
            after = log.stream("events").info().details["objects"]
            assert before == 30 and after < before, (before, after)


def test_maintain_tiers_local_segments_on_executors(spark: Any, tmp_path: Any) -> None:
    """A local log tiered once (``tier.json`` names the tier): executors opened without
    ``tier_url`` copy closed segments there and drop the local copies past
    local_retention_bytes; every record still reads back through the tier."""
    url = str(tmp_path / "log")
    tier = f"file://{tmp_path}/tier"
    values = [b"%04d" % i + b"x" * 196 for i in range(60)]
    with disklesslog.open(url, tier_url=tier, fsync="never") as log:
        for name in ("a", "b"):
            log.create_stream(name, segment_bytes=1024, local_retention_bytes=2048)
            for i in range(0, 60, 5):
                log.stream(name).append_batch(values[i : i + 5])
    report = disklesslog.spark.maintain(spark, url)
    assert report.streams == 2
    assert report.objects_written > 0 and report.segments_deleted > 0
    with disklesslog.open(url) as log:
        for name in ("a", "b"):
            info = log.stream(name).info()
            assert info.details["local_start_offset"] > 0  # the rest is only in the tier
            assert [r.value for r in log.stream(name).read()] == values
