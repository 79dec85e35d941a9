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
