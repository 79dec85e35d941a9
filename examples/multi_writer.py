"""Three processes write to shared object storage at once; a consumer group reads.

The log lives in objects on ``file://`` storage (any fsspec URL works the same way:
``s3://bucket/log`` with ``storage_options``), ordered by the SQLite sequencer that
``backend="objects"`` puts in the log directory. Each writer process flushes one object
and one commit at a time, under its own named producer (idempotent, fenced if a second
instance starts). Run: ``python examples/multi_writer.py [DIRECTORY]``.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import disklesslog

WRITERS = 3
EVENTS = 3_000  # per writer


def write(url: str, number: int) -> None:
    """One writer process: clicks and orders, through one buffered writer."""
    with disklesslog.open(url, backend="objects") as log:
        with log.writer(linger_ms=20, producer=f"writer-{number}") as writer:
            for n in range(EVENTS):
                if n % 100 == 0:
                    time.sleep(0.005)  # events arrive over time: several flushes
                stream = "orders" if n % 10 == 0 else "clicks"
                event = {"writer": number, "n": n, "at": time.time()}
                writer.append(stream, json.dumps(event).encode(), key=b"user-%d" % (n % 50))
        metrics = log.metrics()
        print(
            f"writer {number}: {EVENTS:,} events in {metrics['puts']:.0f} objects and "
            f"{metrics['commits']:.0f} commits"
        )


def main(directory: Path) -> None:
    url = f"file://{directory}"
    with disklesslog.open(url, backend="objects") as log:
        for stream in ("clicks", "orders"):
            log.create_stream(stream)
        context = multiprocessing.get_context("spawn")
        writers = [context.Process(target=write, args=(url, n)) for n in range(WRITERS)]
        for process in writers:
            process.start()

        # A consumer group reads both streams while they are written, at least once.
        seen: dict[str, int] = {"clicks": 0, "orders": 0}
        last: dict[tuple[str, int], int] = {}
        with log.consumer("dashboard", ["clicks", "orders"], idle_timeout=30) as consumer:
            for stream, record in consumer:
                event = json.loads(record.value)
                previous = last.get((stream, event["writer"]), -1)
                assert event["n"] > previous, "a writer's events arrived out of order"
                last[(stream, event["writer"])] = event["n"]
                seen[stream] += 1
                if sum(seen.values()) == WRITERS * EVENTS:
                    break
            consumer.commit()
        for process in writers:
            process.join()

        print(
            f"\nconsumer group 'dashboard' read {seen['clicks']:,} clicks and "
            f"{seen['orders']:,} orders, each writer's in its own order"
        )
        print(f"committed positions: {log.committed_offsets('dashboard')}")
        for stream in ("clicks", "orders"):
            info = log.stream(stream).info()
            print(
                f"{stream}: offsets {info.start_offset}..{info.end_offset - 1} in "
                f"{info.details['objects']} objects, {info.size_bytes:,} bytes"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory(prefix="disklesslog-multi-writer-") as tmp:
            main(Path(tmp) / "log")
