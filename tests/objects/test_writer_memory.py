"""A writer's memory stays flat with age: after warming up, more flushes (each one
object and one sequencer commit) with maintenance deleting what retention dropped
add next to nothing to what the process holds, on both sequencers that keep state
in files (SQLite, object store). Before, every object a writer uploaded stayed in the
block cache after maintenance deleted it, ~450 B per flush of a small record."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from object_workers import writer_memory_growth

SPAWN = multiprocessing.get_context("spawn")


@pytest.mark.parametrize("sequencer", ["sqlite", "objectstore"])
def test_a_writers_memory_does_not_grow_with_its_flushes(tmp_path: Path, sequencer: str) -> None:
    """Measured in a fresh process, so nothing else allocates meanwhile: two windows of
    400 flushes after 1,100 to warm up (the object-store sequencer remembers its last
    1,024 entry ids). The smaller growth counts, since things that grow once (a thread's
    first msgpack packer, ~0.5 MB) land in one window only. What still grows in both is
    bounded and settles: latency samples (24 B per flush and kind, up to 4,096 of them),
    the object-store sequencer's table of recent entry ids (~100-160 B per flush in
    these windows, flat from ~3,000 flushes)."""
    url = f"file://{tmp_path / 'log'}"
    sequencer_url = "objectstore://" if sequencer == "objectstore" else f"sqlite:///{tmp_path}/m.db"
    with ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
        growth, blocks = pool.submit(
            writer_memory_growth, url, sequencer_url, 1100, 400, 10
        ).result(timeout=300)
    assert blocks < 400  # what is live, not all 1,900 objects written
    assert min(growth) < 300, f"{growth} B per flush"
