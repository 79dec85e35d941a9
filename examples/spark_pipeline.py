"""A Spark pipeline over a log: events in, a streaming aggregate out, a batch query over both.

    pip install 'disklesslog[spark]'      # needs Java 17+
    python examples/spark_pipeline.py [LOG_DIRECTORY]

1. A plain Python producer appends page-view events to the stream ``views``, over ten
   minutes of event time (record timestamps), then one late "tick" that moves time on.
2. A Structured Streaming query reads ``views``, counts views per page and minute
   (a window with a watermark: append mode, the one Spark offers Python sinks) and
   writes one record per closed window to the stream ``page-counts``, keyed by page.
   Writes are exactly once: a micro-batch replayed after a crash is committed once.
   ``Trigger.AvailableNow`` processes what is there and stops.
3. A batch query reads both streams back and checks the streamed counts against a
   recount of the raw events.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import disklesslog
import disklesslog.spark

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]
START_MS = 1_767_225_600_000  # 2026-01-01 00:00 UTC
MINUTE_MS = 60_000


def produce(url: str, count: int) -> None:
    """Step 1: events into the log, the way any application writes them."""
    rng = random.Random(7)
    with disklesslog.open(url) as log, log.writer() as writer:
        for i in range(count):
            page = rng.choice(PAGES)
            event = {"page": page, "user": f"u{rng.randrange(100)}", "n": i}
            at = START_MS + i * 10 * MINUTE_MS // count  # ten minutes of event time
            writer.append("views", json.dumps(event).encode(), key=page.encode(), timestamp=at)
        # A late event moves the watermark past every window above, so they close.
        tick = json.dumps({"page": "tick"}).encode()
        writer.append("views", tick, key=b"tick", timestamp=START_MS + 60 * MINUTE_MS)
    print(f"produced {count:,} page views into stream 'views'")


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    url = str(root)
    produce(url, 5_000)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("disklesslog-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    disklesslog.spark.register(spark)
    try:
        # Step 2: the streaming aggregate, written back to the log exactly once.
        views = (
            spark.readStream.format("disklesslog")
            .option("url", url)
            .option("streams", "views")
            .option("startingOffsets", "earliest")
            .load()
        )
        page = F.get_json_object(F.col("value").cast("string"), "$.page")
        counts = (
            views.select(page.alias("page"), "timestamp")
            .withWatermark("timestamp", "1 minute")
            .groupBy("page", F.window("timestamp", "1 minute"))
            .count()
            .select(
                F.col("page").alias("key"),
                F.to_json(F.struct(F.col("window.start").alias("minute"), "count")).alias("value"),
                F.col("window.end").alias("timestamp"),
            )
        )
        query = (
            counts.writeStream.format("disklesslog")
            .option("url", url)
            .option("stream", "page-counts")
            .option("checkpointLocation", str(root / "_checkpoints" / "page-counts"))
            .outputMode("append")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        with disklesslog.open(url) as log:
            windows = log.stream("page-counts").end_offset
        print(f"streaming query wrote {windows} per-minute counts to stream 'page-counts'")

        # Step 3: a batch query over both streams.
        latest = (
            spark.read.format("disklesslog")
            .option("url", url)
            .option("streams", "page-counts")
            .load()
            .groupBy(F.col("key").cast("string").alias("page"))
            .agg(
                F.sum(
                    F.get_json_object(F.col("value").cast("string"), "$.count").cast("long")
                ).alias("count")
            )
        )
        raw = (
            spark.read.format("disklesslog")
            .option("url", url)
            .option("streams", "views")
            .load()
            .groupBy(F.col("key").cast("string").alias("page"))
            .agg(F.count("*").alias("raw"))
        )
        rows = latest.join(raw, "page").orderBy("page").collect()
        for row in rows:
            print(f"{row['page']:10} streamed count {row['count']:>5}   recount {row['raw']:>5}")
        assert all(row["count"] == row["raw"] for row in rows), "counts disagree"
        print("the streamed counts match a batch recount of the raw events")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
