"""Reads of tiered segments while their object storage misbehaves (issue 14): the same
treatment as the object backend's reads. A response damaged in transit (segment data or
index object) is fetched again and never cached as good, in memory or on disk; a flip
in a header the walk only peeked at is cured too (the walk starts again from where its
bytes were last checked); damage at rest is reported every time; failed GETs are
retried, and a missing object is data loss at once. On ``faulty-memory://``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import disklesslog
from disklesslog import CorruptDataError, DataLossError, StorageError
from disklesslog.format import DEFAULT_MAX_BATCH_BYTES
from disklesslog.segments.segment import PEEK, iter_entries
from disklesslog.segments.tiering import manifest as manifests
from disklesslog.segments.tiering import target as tier_module
from disklesslog.storage.cache import configure_default_cache
from disklesslog.testing import FaultyMemoryFileSystem

NOW = 10_000_000
BLOCK = 4096
Rows = list[tuple[int, bytes]]


class Tiered:
    """A local log whose stream ``s`` lives almost wholly in a faulty-memory:// tier."""

    def __init__(self, path: Path, **options: Any) -> None:
        self.path = path
        self.url = f"faulty-memory://tier-faults-{uuid.uuid4().hex[:12]}/tier"
        self.options = {"segment_bytes": 2048, "index_interval_bytes": 256, **options}
        self.log = self.open()
        stream = self.log.stream("s")
        for first in range(0, 240, 3):
            stream.append_batch([b"%06d-" % i + b"." * 90 for i in range(first, first + 3)])
        self.log.tier(now_ms=NOW)
        self.rows = self.read()
        local = int(stream.info().details["local_start_offset"])
        assert local > 200, "most of the stream must be read from the tier"

    def open(self) -> disklesslog.Log:
        return disklesslog.open(
            self.path, fsync="never", tier_url=self.url, local_retention_bytes=1, **self.options
        )

    def reopen(self) -> None:
        """A fresh log object: no index object parsed yet (as in another process)."""
        self.log.close()
        self.log = self.open()

    def read(self, start: int | None = None) -> Rows:
        return [(r.offset, r.value) for r in self.log.stream("s").read(start)]

    def segments(self) -> list[manifests.TieredSegment]:
        found = manifests.load(self.path / "streams" / "s")
        assert found is not None
        return list(found.tiered_run())

    def object_path(self, key: str) -> str:
        root = fsspec.core.url_to_fs(self.url)[1]
        return f"{str(root).rstrip('/')}/{key}"

    def metric(self, name: str) -> float:
        return self.log.metrics().get(name, 0)


@pytest.fixture
def faulty() -> Iterator[type[FaultyMemoryFileSystem]]:
    FaultyMemoryFileSystem.reset()
    yield FaultyMemoryFileSystem
    FaultyMemoryFileSystem.reset()
    configure_default_cache()  # the tests below give the process-wide cache small blocks


@pytest.fixture
def tiered(tmp_path: Path, faulty: type[FaultyMemoryFileSystem]) -> Iterator[Tiered]:
    configure_default_cache(block_size=BLOCK)
    found = Tiered(tmp_path / "log")
    yield found
    found.log.close()


# ------------------------------------------------------------- damage in transit


def test_a_bit_flipped_in_a_tiered_segment_read_is_fetched_again(
    tiered: Tiered, faulty: type[FaultyMemoryFileSystem], caplog: pytest.LogCaptureFixture
) -> None:
    configure_default_cache(block_size=BLOCK)  # index objects stay parsed, blocks are gone
    faulty.corrupt_gets = 1
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        assert tiered.read() == tiered.rows
    assert faulty.corrupt_gets == 0
    assert tiered.metric("tier_refetches") == 1
    assert "fetched again straight from storage" in caplog.text
    for start in (None, 5, 100):
        assert tiered.read(start) == tiered.rows[start or 0 :]
    assert tiered.metric("tier_refetches") == 1
    offsets = [o for part in tiered.log.stream("s").read_offsets() for o in part]
    assert offsets == [offset for offset, _ in tiered.rows]


def test_a_bit_flipped_in_an_index_object_is_fetched_again_not_ignored(
    tiered: Tiered, faulty: type[FaultyMemoryFileSystem], caplog: pytest.LogCaptureFixture
) -> None:
    tiered.reopen()
    configure_default_cache(block_size=BLOCK)
    faulty.corrupt_gets = 1  # the first GET of a read: the first segment's index
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        assert tiered.read(7) == tiered.rows[7:]
    assert tiered.metric("tier_refetches") == 1
    assert "index object fails its checksum" in caplog.text
    assert "reading without it" not in caplog.text


def test_a_flip_in_a_header_the_walk_only_peeked_at_is_cured(
    tmp_path: Path, faulty: type[FaultyMemoryFileSystem], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers below the offset asked for are peeked (not checksummed); a flipped span
    there shows only as a broken chain at the next entry. Fetching that entry again
    would not help: the walk starts again from its index hint, refreshing the bytes."""
    configure_default_cache(block_size=BLOCK)
    tiered = Tiered(tmp_path / "log", index_interval_bytes=1 << 20)  # hints at 0 only
    try:
        seg = tiered.segments()[0]
        fs, _ = fsspec.core.url_to_fs(tiered.url)
        data = bytes(fs.cat_file(tiered.object_path(seg.log.key)))
        entries = list(
            iter_entries(
                lambda n, at: data[at : at + n],
                "x",
                0,
                len(data),
                seg.base_offset,
                max_batch_bytes=DEFAULT_MAX_BATCH_BYTES,
                mode=PEEK,
            )
        )
        assert len(entries) >= 5
        # Entry 1's last offset delta (2) becomes 3: still below the offset read, so
        # peeked, and the chain breaks at entry 2.
        target = entries[1][0] + 8 + 15
        assert data[target] == 2
        original = tier_module.Tier.get_range
        flipped: list[int] = []

        def get_range(self: tier_module.Tier, key: str, start: int, end: int) -> bytes:
            got = original(self, key, start, end)
            if key == seg.log.key and start <= target < start + len(got) and not flipped:
                flipped.append(start)
                damaged = bytearray(got)
                damaged[target - start] ^= 0x01
                return bytes(damaged)
            return got

        monkeypatch.setattr(tier_module.Tier, "get_range", get_range)
        configure_default_cache(block_size=BLOCK)
        start = entries[4][1]
        assert tiered.read(start) == tiered.rows[start:]
        assert flipped
        assert tiered.metric("tier_refetches") == 1
    finally:
        tiered.log.close()


def test_a_damaged_response_never_reaches_a_later_process_through_the_disk_tier(
    tiered: Tiered, faulty: type[FaultyMemoryFileSystem], tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    tiered.reopen()
    configure_default_cache(block_size=BLOCK, cache_dir=cache_dir)
    faulty.corrupt_gets = 1
    assert tiered.read() == tiered.rows
    assert tiered.metric("tier_refetches") == 1
    tiered.reopen()
    configure_default_cache(block_size=BLOCK, cache_dir=cache_dir)
    faulty.gets = 0
    assert tiered.read() == tiered.rows
    assert tiered.metric("tier_refetches") == 0
    assert faulty.gets == 0  # segments and indexes all came from disk, intact


# ----------------------------------------------------------------- damage at rest


def test_damage_at_rest_is_reported_every_time_and_never_cached_as_good(
    tiered: Tiered, faulty: type[FaultyMemoryFileSystem]
) -> None:
    seg = tiered.segments()[1]
    fs, _ = fsspec.core.url_to_fs(tiered.url)
    path = tiered.object_path(seg.log.key)
    data = bytearray(fs.cat_file(path))
    data[300] ^= 0x10
    fs.pipe_file(path, bytes(data))
    configure_default_cache(block_size=BLOCK)  # the intact bytes read before are gone
    for _ in range(2):
        before = faulty.gets
        with pytest.raises(CorruptDataError) as info:
            tiered.read(seg.base_offset)
        assert info.value.source == f"{tiered.url}/{seg.log.key}"
        assert info.value.position is not None and info.value.position <= 300
        assert "storage returned the same bytes twice" in str(info.value)
        assert faulty.gets - before >= 3  # read, then fetched again: not kept as good
    assert tiered.read(seg.end_offset) == tiered.rows[seg.end_offset :]


# ------------------------------------------------------------------ failed requests


def test_tiered_reads_succeed_while_a_sixth_of_all_gets_fail(
    tiered: Tiered, faulty: type[FaultyMemoryFileSystem]
) -> None:
    faulty.get_failure_rate = 0.16
    for _ in range(8):
        configure_default_cache(block_size=BLOCK)  # every read GETs the segments again
        assert tiered.read() == tiered.rows
    assert tiered.metric("tier_get_errors") > 5


def test_a_tiered_get_that_keeps_failing_is_a_storage_error(
    tiered: Tiered, faulty: type[FaultyMemoryFileSystem]
) -> None:
    configure_default_cache(block_size=BLOCK)
    faulty.failing_gets = 1000
    with pytest.raises(StorageError, match="after 5 attempts") as info:
        tiered.read()
    assert isinstance(info.value, OSError)
    assert tiered.url in str(info.value)
    assert tiered.metric("tier_get_errors") == 5


def test_a_missing_tiered_object_is_data_loss_at_once(
    tiered: Tiered, faulty: type[FaultyMemoryFileSystem]
) -> None:
    seg = tiered.segments()[1]
    fs, _ = fsspec.core.url_to_fs(tiered.url)
    fs.rm_file(tiered.object_path(seg.log.key))
    configure_default_cache(block_size=BLOCK)
    with pytest.raises(DataLossError, match="is missing"):
        tiered.read(seg.base_offset)
    assert tiered.metric("tier_get_errors") == 0
