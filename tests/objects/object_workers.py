"""Child-process code for the object backend's multi-process tests (spawn-imported)."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc

import disklesslog
from disklesslog.storage.cache import BlockCache

STREAMS = ("a", "b", "c")


def two_writers(
    url: str, process: int, per_writer: int, sequencer: str | None = None
) -> list[tuple[str, int, bytes]]:
    """Two writers (threads) of this process append ``per_writer`` records each, spread
    over three streams; returns every acknowledged (stream, offset, value)."""
    acked: list[tuple[str, int, bytes]] = []
    lock = threading.Lock()

    with disklesslog.open(url, backend="objects", sequencer=sequencer) as log:

        def run(writer_no: int) -> None:
            with log.writer(linger_ms=2) as writer:
                pending = []
                for seq in range(per_writer):
                    stream = STREAMS[seq % 3]
                    value = b"p%d-w%d-%06d" % (process, writer_no, seq)
                    pending.append((stream, value, writer.append(stream, value)))
                writer.flush()
                with lock:
                    acked.extend((s, f.result(), v) for s, v, f in pending)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return acked


def open_new_and_append(url: str, tag: int) -> int:
    with disklesslog.open(url, backend="objects") as log:
        return log.stream("s").append(b"%d" % tag)


def take_over_producer(url: str, sequencer: str | None, producer: str, value: bytes) -> int:
    """Start a new instance of a named producer (fencing every older one) and append."""
    with (
        disklesslog.open(url, backend="objects", sequencer=sequencer) as log,
        log.writer(producer=producer, linger_ms=0) as writer,
    ):
        return writer.append("s", value).result()


def _flush_and_maintain(log: disklesslog.Log, flushes: int, start: int, streams: int) -> None:
    """``flushes`` appends of one 100-byte record, the streams in turn, maintenance
    every 100."""
    for n in range(start, start + flushes):
        log.stream(f"s{n % streams}").append(b"v" * 100)
        if (n + 1) % 100 == 0:
            log.maintain(grace_seconds=0)


def writer_memory_growth(
    url: str, sequencer: str, warm: int, window: int, streams: int
) -> tuple[list[float], int]:
    """In a fresh process (nothing else allocating): ``warm`` flushes, then the memory
    that each of two windows of ``window`` flushes added, per flush (tracemalloc), and
    the blocks the log's cache holds at the end."""
    cache = BlockCache()
    with disklesslog.open(
        url,
        backend="objects",
        sequencer=sequencer,
        cache=cache,
        retention_ms=100,
        maintenance="off",
    ) as log:
        for s in range(streams):
            log.create_stream(f"s{s}")
        _flush_and_maintain(log, warm, 0, streams)
        time.sleep(0.2)
        growth: list[float] = []
        tracemalloc.start()
        try:
            for n in range(2):
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
                _flush_and_maintain(log, window, warm + window * n, streams)
                gc.collect()
                growth.append((tracemalloc.get_traced_memory()[0] - before) / window)
        finally:
            tracemalloc.stop()
        return growth, cache.stats()["memory_blocks"]
