"""A writer's memory stays flat with age: after warming up, more flushes (each one
object and one sequencer commit) with maintenance deleting what retention dropped
add next to nothing to what the process holds, on both sequencers that keep state
in files (SQLite, object store). Before, every object a writer uploaded stayed in the
block cache after maintenance deleted it, ~0.4 KB per flush of a small record."""

from __future__ import annotations

import gc
import time
import tracemalloc
from pathlib import Path

import pytest

import disklesslog
from disklesslog.storage.cache import BlockCache

STREAMS = 10
VALUE = b"v" * 100


def _flush(log: disklesslog.Log, flushes: int, start: int) -> None:
    """``flushes`` appends of one record, the streams in turn, maintenance every 100."""
    for n in range(start, start + flushes):
        log.stream(f"s{n % STREAMS}").append(VALUE)
        if (n + 1) % 100 == 0:
            log.maintain(grace_seconds=0)


def _growth_per_flush(log: disklesslog.Log, flushes: int, start: int) -> float:
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    _flush(log, flushes, start)
    gc.collect()
    return (tracemalloc.get_traced_memory()[0] - before) / flushes


@pytest.mark.parametrize("sequencer", ["sqlite", "objectstore"])
def test_a_writers_memory_does_not_grow_with_its_flushes(tmp_path: Path, sequencer: str) -> None:
    """Two windows of 400 flushes after 1,100 to warm up (the object-store sequencer
    remembers its last 1,024 entry ids); the smaller growth counts, since things that
    grow once (a thread's first msgpack packer, ~0.5 MB) land in one window only. What
    still grows in both is bounded and settles: latency samples (24 B per flush and kind,
    up to 4,096 of them), the object-store sequencer's table of recent entry ids (~100-160
    B per flush in these windows, flat from ~3,000 flushes). Before, the cache alone
    added ~450 B per flush, for good."""
    url = f"file://{tmp_path / 'log'}"
    sequencer_url = "objectstore://" if sequencer == "objectstore" else f"sqlite:///{tmp_path}/m.db"
    cache = BlockCache()
    with disklesslog.open(
        url,
        backend="objects",
        sequencer=sequencer_url,
        cache=cache,
        retention_ms=100,
        maintenance="off",
    ) as log:
        for s in range(STREAMS):
            log.create_stream(f"s{s}")
        _flush(log, 1100, 0)  # warm: every stream has dropped records and objects
        time.sleep(0.2)
        tracemalloc.start()
        try:
            growth = [_growth_per_flush(log, 400, 1100 + 400 * n) for n in range(2)]
        finally:
            tracemalloc.stop()
        assert cache.stats()["memory_blocks"] < 400  # what is live, not all 1,900
    assert min(growth) < 300, f"{growth} B per flush"
