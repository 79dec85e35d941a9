"""The object backend's block cache: exact bytes across block and object boundaries,
one fetch per contiguous missing run, LRU by bytes, single flight (shared successes,
shared failures, interrupted loaders), put_object, the disk tier (restarts, damaged
files and files of other blocks, files of an earlier version, eviction, sharing a
directory), and checked reads (disk writes only once confirmed, refreshes that replace
both tiers, ranges dropped after a failed check)."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import disklesslog
from disklesslog.errors import ConfigError
from disklesslog.format import crc32c
from disklesslog.metrics import Metrics
from disklesslog.storage import cache as cache_module
from disklesslog.storage.cache import (
    BLOCK_OVERHEAD,
    WRITTEN_SHARE,
    BlockCache,
    block_cost,
    configure_default_cache,
    default_cache,
)

DATA = bytes(random.Random(7).randrange(256) for _ in range(1000))
KEY = "streams/objects/0000-abc.obj"  # slashes: keys are not paths


class Source:
    """An immutable object behind a fetch function that records its calls."""

    def __init__(self, data: bytes = DATA) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def __call__(self, start: int, end: int) -> bytes:
        with self._lock:
            self.calls.append((start, end))
        return self.data[start:end]


def _cost(blocks: int, key: str = KEY, size: int = 10) -> int:
    """What ``blocks`` blocks of ``size`` bytes of ``key`` count against the memory bound."""
    return blocks * block_cost(key, bytes(size))


def _disk_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".blk"))


def _wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


@pytest.fixture
def waiters(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count readers that started waiting for another reader's fetch."""
    count = [0]
    lock = threading.Lock()

    class CountingEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            with lock:
                count[0] += 1
            return super().wait(timeout)

    original = cache_module._Flight.__init__

    def init(self: cache_module._Flight, epoch: int) -> None:
        original(self, epoch)
        self.done = CountingEvent()

    monkeypatch.setattr(cache_module._Flight, "__init__", init)

    def current() -> int:
        with lock:
            return count[0]

    return current


def _run_threads(count: int, target: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


# ------------------------------------------------------------------------ exact bytes


def test_every_range_across_block_boundaries_and_the_objects_end() -> None:
    data = DATA[:100]
    cold = [(s, e) for s in range(0, 120, 7) for e in range(s, 130, 5)]
    warm = BlockCache(block_size=16)
    for start, end in cold:
        fresh = BlockCache(block_size=16)
        source = Source(data)
        assert fresh.read(KEY, start, end, source) == data[start:end], (start, end)
        assert warm.read(KEY, start, end, source) == data[start:end], (start, end)
        for low, high in source.calls:
            assert low % 16 == 0
            assert high % 16 == 0


def test_one_fetch_per_contiguous_run_of_missing_blocks() -> None:
    cache = BlockCache(block_size=10)
    source = Source()
    assert cache.read(KEY, 35, 45, source) == DATA[35:45]
    assert source.calls == [(30, 50)]
    source.calls.clear()
    assert cache.read(KEY, 75, 80, source) == DATA[75:80]
    assert source.calls == [(70, 80)]
    source.calls.clear()
    assert cache.read(KEY, 5, 95, source) == DATA[5:95]
    assert source.calls == [(0, 30), (50, 70), (80, 100)]
    source.calls.clear()
    assert cache.read(KEY, 0, 100, source) == DATA[:100]
    assert source.calls == []


def test_a_short_fetch_marks_the_end_of_the_object() -> None:
    cache = BlockCache(block_size=16)
    source = Source(DATA[:100])
    assert cache.read(KEY, 0, 1000, source) == DATA[:100]
    assert source.calls == [(0, 1008)]
    # The short last block is cached and known to be the end: nothing more to fetch.
    assert cache.read(KEY, 90, 500, source) == DATA[90:100]
    assert cache.read(KEY, 100, 500, source) == b""
    assert source.calls == [(0, 1008)]
    # Beyond the end in a later block: fetched (nothing is known there), empty.
    assert cache.read(KEY, 200, 300, source) == b""


def test_an_object_ending_on_a_block_boundary() -> None:
    cache = BlockCache(block_size=10)
    source = Source(DATA[:30])
    assert cache.read(KEY, 0, 50, source) == DATA[:30]
    assert source.calls == [(0, 50)]
    assert cache.stats()["memory_blocks"] == 3  # empty blocks past the end: not cached
    assert cache.read(KEY, 25, 30, source) == DATA[25:30]
    assert len(source.calls) == 1


def test_empty_range_fetches_nothing_and_whole_blocks_are_returned_as_is() -> None:
    cache = BlockCache(block_size=10)
    source = Source()
    assert cache.read(KEY, 5, 5, source) == b""
    assert source.calls == []
    first = cache.read(KEY, 0, 10, source)
    assert first == DATA[:10]
    assert cache.read(KEY, 0, 10, source) is first


def test_fetch_may_return_any_bytes_like() -> None:
    cache = BlockCache(block_size=10)
    assert cache.read(KEY, 5, 25, lambda s, e: bytearray(DATA[s:e])) == DATA[5:25]  # type: ignore[arg-type,return-value]
    assert cache.read("k2", 5, 25, lambda s, e: memoryview(DATA)[s:e]) == DATA[5:25]  # type: ignore[arg-type,return-value]
    # Longer than asked: the extra bytes are ignored.
    assert cache.read("k3", 5, 15, lambda s, e: DATA[s : e + 50]) == DATA[5:15]
    with pytest.raises(TypeError):
        cache.read("k4", 0, 10, lambda s, e: "text")  # type: ignore[arg-type,return-value]
    assert cache.stats()["in_flight"] == 0


def test_objects_are_cached_separately() -> None:
    cache = BlockCache(block_size=10)
    other = bytes(reversed(DATA))
    assert cache.read("a", 0, 30, Source()) == DATA[:30]
    assert cache.read("b", 0, 30, Source(other)) == other[:30]
    assert cache.read("a", 0, 30, Source(other)) == DATA[:30]


# ------------------------------------------------------------------------ memory tier


def test_lru_eviction_by_bytes_keeps_the_recently_used() -> None:
    cache = BlockCache(max_bytes=_cost(4), block_size=10)
    source = Source()
    for block in range(4):
        cache.read(KEY, block * 10, block * 10 + 1, source)
    assert cache.stats()["memory_bytes"] == _cost(4)
    cache.read(KEY, 0, 1, source)  # block 0 is now the most recently used
    cache.read(KEY, 40, 41, source)  # block 4 evicts the least recently used: block 1
    stats = cache.stats()
    assert (stats["memory_bytes"], stats["memory_blocks"], stats["evictions"]) == (_cost(4), 4, 1)
    source.calls.clear()
    for block in (0, 2, 3, 4):
        cache.read(KEY, block * 10, block * 10 + 10, source)
    assert source.calls == []
    assert cache.read(KEY, 10, 20, source) == DATA[10:20]
    assert source.calls == [(10, 20)]


def test_eviction_counts_bytes_not_blocks() -> None:
    bound = _cost(1, size=5) + _cost(2)
    cache = BlockCache(max_bytes=bound, block_size=10)
    source = Source(DATA[:45])
    cache.read(KEY, 40, 45, source)  # a 5-byte last block
    cache.read(KEY, 0, 20, source)  # 10 + 10 more: all fit
    assert cache.stats()["memory_blocks"] == 3
    cache.read(KEY, 20, 21, source)
    assert cache.stats()["memory_bytes"] <= bound


def test_the_bound_counts_each_blocks_overhead_so_tiny_blocks_cannot_overrun_it() -> None:
    """Reads of 100-byte objects cache 100-byte blocks: counted by payload alone, a
    bound of 100 such blocks held 412 of them, about 4 times the memory it allowed."""
    key = "file:///var/log/streams/objects/0000000000000000-abc.obj"
    bound = 100 * (100 + len(key) + BLOCK_OVERHEAD)
    cache = BlockCache(max_bytes=bound)
    for n in range(1000):
        cache.read(key.replace("abc", f"{n:03d}"), 0, 100, Source(DATA[:100]))
        assert cache.stats()["memory_bytes"] <= bound
    stats = cache.stats()
    assert stats["memory_blocks"] == 100
    assert stats["memory_bytes"] == bound


def test_block_overhead_covers_what_a_cached_block_really_costs() -> None:
    """BLOCK_OVERHEAD is measured: 20,000 cached 100-byte blocks (fresh key strings, as
    callers build them) take no more memory than the bound counts for them."""
    keys = [f"file:///tmp/log/objects/{n:016x}.obj" for n in range(20_000)]
    payloads = [bytes([n % 256]) * 100 for n in range(20_000)]
    cache = BlockCache(max_bytes=1 << 30)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key, data in zip(keys, payloads):
            cache.put_object(key, data)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    real = grown + sum(sys.getsizeof(k) + sys.getsizeof(d) for k, d in zip(keys, payloads))
    # Never less than the real cost; more by what a dict's fill level varies (~15 %).
    assert real <= cache.stats()["memory_bytes"] <= real * 1.25


def test_a_block_larger_than_the_memory_bound_is_returned_not_cached() -> None:
    cache = BlockCache(max_bytes=5, block_size=10)
    source = Source()
    assert cache.read(KEY, 0, 10, source) == DATA[:10]
    assert cache.read(KEY, 0, 10, source) == DATA[:10]
    assert len(source.calls) == 2
    stats = cache.stats()
    assert (stats["memory_bytes"], stats["uncacheable"]) == (0, 2)


# ---------------------------------------------------------------------- single flight


def test_concurrent_readers_of_a_block_share_one_fetch(waiters: Callable[[], int]) -> None:
    cache = BlockCache(block_size=100)
    release = threading.Event()
    calls = []

    def fetch(start: int, end: int) -> bytes:
        calls.append((start, end))
        assert release.wait(5)
        return DATA[start:end]

    results: dict[int, bytes] = {}

    def reader(i: int) -> None:
        results[i] = cache.read(KEY, 10 + i, 50 + i, fetch)

    thread = threading.Thread(target=_run_threads, args=(8, reader), daemon=True)
    thread.start()
    _wait_until(lambda: waiters() == 7)  # one fetching, seven waiting
    assert len(calls) == 1
    release.set()
    thread.join(10)
    assert calls == [(0, 100)]
    assert results == {i: DATA[10 + i : 50 + i] for i in range(8)}
    stats = cache.stats()
    assert (stats["fetches"], stats["misses"], stats["waits"], stats["hits"]) == (1, 1, 7, 7)
    assert stats["in_flight"] == 0


def test_a_failed_fetch_reaches_every_waiter_and_caches_nothing(
    waiters: Callable[[], int],
) -> None:
    cache = BlockCache(block_size=100)
    release = threading.Event()
    boom = OSError("GET failed: 503")

    def fetch(start: int, end: int) -> bytes:
        assert release.wait(5)
        raise boom

    errors: dict[int, BaseException] = {}

    def reader(i: int) -> None:
        try:
            cache.read(KEY, 0, 150, fetch)
        except OSError as exc:
            errors[i] = exc

    thread = threading.Thread(target=_run_threads, args=(8, reader), daemon=True)
    thread.start()
    _wait_until(lambda: waiters() >= 7)
    release.set()
    thread.join(10)
    assert len(errors) == 8
    assert all(error is boom for error in errors.values())
    stats = cache.stats()
    assert (stats["memory_blocks"], stats["in_flight"], stats["fetches"]) == (0, 0, 1)
    source = Source()
    assert cache.read(KEY, 0, 150, source) == DATA[:150]
    assert source.calls == [(0, 200)]


def test_a_failed_run_does_not_poison_other_blocks() -> None:
    cache = BlockCache(block_size=10)
    cache.read(KEY, 10, 20, Source())  # block 1 cached: reading 0..3 needs runs 0 and 2-3

    def fetch(start: int, end: int) -> bytes:
        if start == 20:
            raise TimeoutError("slow GET")
        return DATA[start:end]

    with pytest.raises(TimeoutError):
        cache.read(KEY, 0, 40, fetch)
    source = Source()
    assert cache.read(KEY, 0, 40, source) == DATA[:40]
    assert source.calls == [(20, 40)]  # block 0 was cached by the failed read


def test_a_reader_fetches_its_missing_runs_and_waits_for_the_in_flight_one(
    waiters: Callable[[], int],
) -> None:
    cache = BlockCache(block_size=10)
    release = threading.Event()
    slow_calls: list[tuple[int, int]] = []

    def slow(start: int, end: int) -> bytes:
        slow_calls.append((start, end))
        assert release.wait(5)
        return DATA[start:end]

    first = threading.Thread(target=lambda: cache.read(KEY, 10, 20, slow), daemon=True)
    first.start()
    _wait_until(lambda: cache.stats()["in_flight"] == 1)
    source = Source()
    result: list[bytes] = []
    second = threading.Thread(
        target=lambda: result.append(cache.read(KEY, 0, 30, source)), daemon=True
    )
    second.start()
    _wait_until(lambda: waiters() == 1)
    assert source.calls == [(0, 10), (20, 30)]  # fetched before waiting for block 1
    release.set()
    first.join(5)
    second.join(5)
    assert result == [DATA[:30]]
    assert slow_calls == [(10, 20)]


def test_an_interrupted_loader_lets_its_waiters_fetch_for_themselves(
    waiters: Callable[[], int],
) -> None:
    class Abort(BaseException):
        pass

    cache = BlockCache(block_size=10)
    release = threading.Event()

    def aborting(start: int, end: int) -> bytes:
        assert release.wait(60)  # generous: a loaded CI machine schedules threads late
        raise Abort

    def owner() -> None:
        with pytest.raises(Abort):
            cache.read(KEY, 0, 10, aborting)

    first = threading.Thread(target=owner, daemon=True)
    first.start()
    _wait_until(lambda: cache.stats()["in_flight"] == 1)
    source = Source()
    result: list[bytes] = []
    second = threading.Thread(
        target=lambda: result.append(cache.read(KEY, 0, 10, source)), daemon=True
    )
    second.start()
    _wait_until(lambda: waiters() == 1)
    release.set()
    first.join(60)
    second.join(60)
    assert result == [DATA[:10]]
    assert source.calls == [(0, 10)]


def test_concurrent_random_reads_with_eviction_return_exact_bytes(tmp_path: Path) -> None:
    caches = [
        BlockCache(max_bytes=_cost(4, "o/0", 16), block_size=16),
        BlockCache(
            max_bytes=_cost(12, "o/0", 16), block_size=16, cache_dir=tmp_path, disk_max_bytes=300
        ),
    ]
    objects = {f"o/{n}": bytes(random.Random(n).randbytes(150 + n * 37)) for n in range(4)}
    failures: list[str] = []

    def reader(i: int) -> None:
        rng = random.Random(i)
        for _ in range(300):
            cache = caches[rng.randrange(2)]
            key = rng.choice(list(objects))
            start = rng.randrange(300)
            end = start + rng.randrange(80)
            got = cache.read(key, start, end, Source(objects[key]))
            if got != objects[key][start:end]:
                failures.append(f"{key} {start} {end}")

    _run_threads(8, reader)
    assert failures == []
    for cache in caches:
        stats = cache.stats()
        assert stats["in_flight"] == 0
        assert stats["memory_bytes"] <= stats["max_bytes"]
        assert stats["disk_bytes"] <= 300


# ------------------------------------------------------------------------- put_object


def test_put_object_then_read_fetches_nothing() -> None:
    cache = BlockCache(block_size=16)
    data = DATA[:100]
    cache.put_object(KEY, memoryview(data))
    assert cache.stats()["memory_blocks"] == 7  # the last block is 4 bytes
    source = Source(data)
    for start, end in [(0, 100), (15, 17), (90, 200), (100, 300), (0, 16)]:
        assert cache.read(KEY, start, end, source) == data[start:end]
    assert source.calls == []


def test_put_object_accepts_bytes_and_bytearray_and_small_objects() -> None:
    cache = BlockCache(block_size=16)
    cache.put_object("a", b"tiny")
    cache.put_object("b", bytearray(DATA[:40]))
    cache.put_object("empty", b"")
    source = Source(b"")
    assert cache.read("a", 0, 100, source) == b"tiny"
    assert cache.read("b", 10, 40, source) == DATA[10:40]
    assert source.calls == []


def test_put_objects_are_the_most_recently_used() -> None:
    cache = BlockCache(max_bytes=_cost(8, "old"), block_size=10)  # 2 blocks put, unread
    source = Source()
    cache.read("old", 0, 80, source)
    cache.put_object("new", DATA[:20])
    assert cache.read("new", 0, 20, Source(b"")) == DATA[:20]
    source.calls.clear()
    cache.read("old", 20, 80, source)
    assert source.calls == []  # the newest of the old blocks survived
    cache.read("old", 0, 10, source)
    assert source.calls == [(0, 10)]


def test_blocks_put_and_not_read_keep_to_their_share_of_the_bound() -> None:
    """A process that writes and never reads what it wrote holds at most
    max_bytes // WRITTEN_SHARE of it (the newest), whatever it writes, and what its
    readers cached stays; a block read is an ordinary block, no longer in the share."""
    cache = BlockCache(max_bytes=_cost(WRITTEN_SHARE * 4, "o-000"), block_size=10)
    source = Source()
    cache.read("o-old", 0, 30, source)  # 3 blocks read
    cache.put_object("o-001", DATA[:10])
    assert cache.read("o-001", 0, 10, Source(b"")) == DATA[:10]  # read: leaves the share
    for n in range(2, 100):
        cache.put_object(f"o-{n:03d}", DATA[:10])
        stats = cache.stats()
        assert stats["written_bytes"] <= _cost(4, "o-000")
        assert stats["memory_bytes"] <= cache.max_bytes
    assert (stats["written_blocks"], stats["memory_blocks"]) == (4, 4 + 3 + 1)
    for n in range(96, 100):  # the newest four
        assert cache.read(f"o-{n:03d}", 0, 10, Source(b"")) == DATA[:10]
    source.calls.clear()
    assert cache.read("o-old", 0, 30, source) == DATA[:30]
    assert cache.read("o-001", 0, 10, source) == DATA[:10]
    assert source.calls == []


# ---------------------------------------------------------------------------- invalidate


def test_invalidate_drops_an_object_from_memory_and_disk(tmp_path: Path) -> None:
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    cache.put_object(KEY, DATA[:50])
    cache.put_object("other", DATA[:50])
    assert len(_disk_files(tmp_path)) == 10
    cache.invalidate(KEY)
    assert len(_disk_files(tmp_path)) == 5
    assert cache.stats()["memory_blocks"] == 5
    source = Source()
    assert cache.read(KEY, 0, 50, source) == DATA[:50]
    assert source.calls == [(0, 50)]
    assert cache.read("other", 0, 50, Source(b"")) == DATA[:50]
    cache.invalidate("never-cached")


def test_forget_objects_drops_deleted_objects_from_memory_and_disk(tmp_path: Path) -> None:
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    cache.put_object(KEY, DATA[:45])
    cache.put_object("small", DATA[:3])
    cache.put_object("other", DATA[:50])
    assert (cache.stats()["memory_blocks"], len(_disk_files(tmp_path))) == (11, 11)
    cache.forget_objects({KEY: 45, "small": 0, "never-cached": 100})  # 0: size unknown
    assert (cache.stats()["memory_blocks"], len(_disk_files(tmp_path))) == (5, 5)
    assert cache.stats()["memory_bytes"] == _cost(5, "other")
    source = Source()
    assert cache.read(KEY, 0, 45, source) == DATA[:45]
    assert source.calls == [(0, 50)]
    assert cache.read("other", 0, 50, Source(b"")) == DATA[:50]


def test_forget_objects_leaves_loads_under_way_and_other_objects_alone() -> None:
    cache = BlockCache(block_size=10)
    started, release = threading.Event(), threading.Event()

    def fetch(start: int, end: int) -> bytes:
        started.set()
        assert release.wait(5)
        return DATA[start:end]

    loader = threading.Thread(target=cache.read, args=("other", 0, 10, fetch), daemon=True)
    loader.start()
    assert started.wait(5)
    cache.forget_objects({KEY: 10})
    release.set()
    loader.join(60)
    assert cache.read("other", 0, 10, Source(b"")) == DATA[:10]  # cached: no epoch bump


def test_forget_objects_refuses_bad_keys_and_changes_nothing() -> None:
    cache = BlockCache(block_size=10)
    cache.put_object(KEY, DATA[:10])
    with pytest.raises(ConfigError, match="non-empty str"):
        cache.forget_objects({KEY: 10, "": 10})
    assert cache.stats()["memory_blocks"] == 1


def test_a_load_under_way_during_invalidate_is_not_cached(tmp_path: Path) -> None:
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    started, release = threading.Event(), threading.Event()

    def fetch(start: int, end: int) -> bytes:
        started.set()
        assert release.wait(5)
        return DATA[start:end]

    result: list[bytes] = []
    reader = threading.Thread(
        target=lambda: result.append(cache.read(KEY, 0, 20, fetch)), daemon=True
    )
    reader.start()
    assert started.wait(5)
    cache.invalidate(KEY)
    release.set()
    reader.join(5)
    assert result == [DATA[:20]]
    assert cache.stats()["memory_blocks"] == 0
    assert _disk_files(tmp_path) == []


def test_clear_empties_both_tiers_and_leaves_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a cache file")
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    cache.put_object(KEY, DATA[:50])
    cache.clear()
    stats = cache.stats()
    assert (stats["memory_blocks"], stats["disk_blocks"], stats["disk_bytes"]) == (0, 0, 0)
    assert _disk_files(tmp_path) == []
    assert (tmp_path / "notes.txt").exists()


def test_invalidate_with_a_range_drops_only_the_blocks_holding_it(tmp_path: Path) -> None:
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    cache.put_object(KEY, DATA[:50])
    cache.invalidate(KEY, 15, 21)  # blocks 1 and 2
    assert len(_disk_files(tmp_path)) == 3
    assert cache.stats()["memory_blocks"] == 3
    source = Source()
    assert cache.read(KEY, 0, 50, source) == DATA[:50]
    assert source.calls == [(10, 30)]
    cache.invalidate(KEY, 30, 30)  # an empty range drops nothing
    assert cache.stats()["memory_blocks"] == 5


# ------------------------------------------------------- checked reads: confirm, refresh


def test_a_checked_read_reaches_the_disk_only_when_confirmed(tmp_path: Path) -> None:
    """Blocks fetched for a reader that checks them wait in memory until it confirms
    bytes in them: then (and only then) they are written to disk."""
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    assert cache.read(KEY, 0, 50, Source(), checked=True) == DATA[:50]
    assert _disk_files(tmp_path) == []
    assert cache.stats()["unconfirmed"] == 5
    cache.confirm(KEY, 12, 25)  # blocks 1 and 2
    assert len(_disk_files(tmp_path)) == 2
    assert cache.stats()["unconfirmed"] == 3
    fresh = BlockCache(block_size=10, cache_dir=tmp_path)
    assert fresh.read(KEY, 10, 30, Source(b"")) == DATA[10:30]
    cache.confirm(KEY, 0, 50)
    cache.confirm(KEY, 0, 50)  # confirming twice writes nothing more
    assert cache.stats()["disk_writes"] == 5
    assert cache.stats()["unconfirmed"] == 0
    # Blocks from disk or memory were confirmed before: nothing waits for them.
    BlockCache(block_size=10, cache_dir=tmp_path).read(KEY, 0, 50, Source(b""), checked=True)
    assert cache.stats()["unconfirmed"] == 0


def test_bytes_that_failed_their_check_never_reach_the_disk(tmp_path: Path) -> None:
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    cache.read(KEY, 0, 50, Source(), checked=True)
    cache.invalidate(KEY, 23, 27)  # the caller found block 2 bad
    cache.confirm(KEY, 0, 50)
    assert len(_disk_files(tmp_path)) == 4
    source = Source()
    assert BlockCache(block_size=10, cache_dir=tmp_path).read(KEY, 0, 50, source) == DATA[:50]
    assert source.calls == [(20, 30)]


def test_unconfirmed_blocks_evicted_from_memory_never_reach_the_disk(tmp_path: Path) -> None:
    cache = BlockCache(block_size=10, max_bytes=_cost(3), cache_dir=tmp_path)
    cache.read(KEY, 0, 50, Source(), checked=True)
    assert cache.stats()["unconfirmed"] == 3  # blocks 0 and 1 were evicted
    cache.confirm(KEY, 0, 50)
    assert len(_disk_files(tmp_path)) == 3
    assert cache.stats()["unconfirmed"] == 0


def test_an_unchecked_read_writes_through_as_before(tmp_path: Path) -> None:
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    cache.read(KEY, 0, 50, Source())
    assert len(_disk_files(tmp_path)) == 5
    assert cache.stats()["unconfirmed"] == 0


def test_a_refresh_fetches_again_and_replaces_both_tiers(tmp_path: Path) -> None:
    damaged = bytearray(DATA)
    damaged[15] ^= 0x01
    cache = BlockCache(block_size=10, cache_dir=tmp_path)
    assert cache.read(KEY, 0, 30, Source(bytes(damaged)))[15] != DATA[15]  # cached, on disk
    source = Source()
    metrics = Metrics()
    assert (
        cache.read(KEY, 12, 18, source, refresh=True, checked=True, metrics=metrics)
        == (DATA[12:18])
    )
    assert source.calls == [(10, 20)]  # only the blocks asked for, straight from the source
    assert metrics.snapshot()["cache_misses"] == 1
    assert cache.read(KEY, 0, 30, source) == DATA[:30]  # the others stay cached
    assert source.calls == [(10, 20)]
    assert len(_disk_files(tmp_path)) == 2  # the damaged file is gone ...
    cache.confirm(KEY, 12, 18)  # ... and the fresh block replaces it once confirmed
    assert (
        BlockCache(block_size=10, cache_dir=tmp_path).read(KEY, 0, 30, Source(b"")) == (DATA[:30])
    )


def test_a_load_of_old_bytes_under_way_cannot_undo_a_refresh() -> None:
    """A reader that began loading the block before the refresh gets what it loaded, but
    its bytes do not replace the refreshed ones in the cache."""
    damaged = bytes(b ^ 0xFF for b in DATA)
    cache = BlockCache(block_size=10)
    started, release = threading.Event(), threading.Event()

    def slow_damaged(start: int, end: int) -> bytes:
        started.set()
        assert release.wait(5)
        return damaged[start:end]

    old: list[bytes] = []
    reader = threading.Thread(
        target=lambda: old.append(cache.read(KEY, 0, 10, slow_damaged)), daemon=True
    )
    reader.start()
    assert started.wait(5)
    assert cache.read(KEY, 0, 10, Source(), refresh=True) == DATA[:10]  # does not wait
    release.set()
    reader.join(5)
    assert old == [damaged[:10]]
    assert cache.read(KEY, 0, 10, Source(b"")) == DATA[:10]


def test_readers_that_come_during_a_refresh_share_its_fetch(waiters: Callable[[], int]) -> None:
    damaged = bytes(b ^ 0xFF for b in DATA)
    cache = BlockCache(block_size=10)
    cache.read(KEY, 0, 10, Source(damaged))
    started, release = threading.Event(), threading.Event()

    def slow(start: int, end: int) -> bytes:
        started.set()
        assert release.wait(5)
        return DATA[start:end]

    results: list[bytes] = []
    refresher = threading.Thread(
        target=lambda: results.append(cache.read(KEY, 0, 10, slow, refresh=True)), daemon=True
    )
    refresher.start()
    assert started.wait(5)
    other = Source()
    follower = threading.Thread(
        target=lambda: results.append(cache.read(KEY, 0, 10, other)), daemon=True
    )
    follower.start()
    _wait_until(lambda: waiters() >= 1)
    release.set()
    refresher.join(5)
    follower.join(5)
    assert results == [DATA[:10], DATA[:10]]
    assert other.calls == []


# ---------------------------------------------------------------------------- disk tier


def test_the_disk_tier_survives_a_new_cache(tmp_path: Path) -> None:
    first = BlockCache(block_size=16, cache_dir=tmp_path)
    source = Source()
    assert first.read(KEY, 0, 100, source) == DATA[:100]
    assert len(_disk_files(tmp_path)) == 7
    assert not any(KEY in p.name or "/" in p.name for p in tmp_path.iterdir())
    second = BlockCache(block_size=16, cache_dir=tmp_path)
    assert second.stats()["disk_blocks"] == 7
    metrics = Metrics()
    assert second.read(KEY, 5, 100, source, metrics=metrics) == DATA[5:100]
    assert len(source.calls) == 1
    counters = metrics.snapshot()
    assert counters["cache_disk_hits"] == 7
    assert counters["cache_hits"] == 7
    assert "cache_misses" not in counters
    # Promoted to memory: the next read does not touch the disk.
    second.read(KEY, 0, 100, source, metrics=metrics)
    assert metrics.snapshot()["cache_disk_hits"] == 7


def test_a_short_last_block_on_disk_marks_the_end(tmp_path: Path) -> None:
    BlockCache(block_size=16, cache_dir=tmp_path).put_object(KEY, DATA[:40])
    cache = BlockCache(block_size=16, cache_dir=tmp_path)
    source = Source(DATA[:40])
    assert cache.read(KEY, 0, 200, source) == DATA[:40]
    assert source.calls == []


@pytest.mark.parametrize(
    "damage",
    [
        "flip a data byte",
        "flip a header byte",
        "truncate the data",
        "truncate the header",
        "empty file",
        "trailing garbage",
        "longer length field",
        "zero a range",
    ],
)
def test_a_damaged_disk_file_is_discarded_and_refetched(tmp_path: Path, damage: str) -> None:
    BlockCache(block_size=16, cache_dir=tmp_path).put_object(KEY, DATA[:16])
    (path,) = _disk_files(tmp_path)
    raw = bytearray(path.read_bytes())
    assert len(raw) == 16 + 16
    if damage == "flip a data byte":
        raw[20] ^= 0x01
    elif damage == "flip a header byte":
        raw[5] ^= 0x80
    elif damage == "truncate the data":
        del raw[-3:]
    elif damage == "truncate the header":
        del raw[10:]
    elif damage == "empty file":
        raw.clear()
    elif damage == "trailing garbage":
        raw += b"\0"
    elif damage == "longer length field":
        raw[8] = 17
    elif damage == "zero a range":
        raw[18:26] = bytes(8)
    path.write_bytes(bytes(raw))
    cache = BlockCache(block_size=16, cache_dir=tmp_path)
    metrics = Metrics()
    source = Source()
    assert cache.read(KEY, 0, 16, source, metrics=metrics) == DATA[:16]
    assert source.calls == [(0, 16)]
    assert metrics.snapshot()["cache_disk_discards"] == 1
    assert cache.stats()["disk_discards"] == 1
    # The refetched block replaced the damaged file.
    fresh = BlockCache(block_size=16, cache_dir=tmp_path)
    assert fresh.read(KEY, 0, 16, Source(b"")) == DATA[:16]


def test_an_object_log_reads_right_through_cache_files_with_a_lost_page(tmp_path: Path) -> None:
    """The object backend's reads through a disk tier whose files each lost a page
    (zeros where data was: length and header intact, as after a power cut): every
    damaged file is found by its checksum, discarded and fetched again, and the log
    reads exactly what it wrote. (The damage test above flips a byte in a bare cache.)"""
    url = f"file://{tmp_path}/log"
    cache_dir = tmp_path / "cache"
    values = [bytes([i]) * 3000 for i in range(1, 40)]
    writing = BlockCache(block_size=4096, cache_dir=cache_dir)
    with disklesslog.open(url, backend="objects", cache=writing) as log:
        for first in range(0, len(values), 5):
            log.stream("s").append_batch(values[first : first + 5])
        expected = list(log.stream("s").read())
    assert [r.value for r in expected] == values
    damaged = [path for path in _disk_files(cache_dir) if path.stat().st_size > 1024]
    assert len(damaged) > 5, "the writes should have filled the disk tier"
    for path in damaged:
        raw = bytearray(path.read_bytes())
        raw[-1024:] = bytes(1024)
        path.write_bytes(bytes(raw))
    reading = BlockCache(block_size=4096, cache_dir=cache_dir)
    with disklesslog.open(url, backend="objects", cache=reading) as log:
        assert list(log.stream("s").read()) == expected
    assert reading.stats()["disk_discards"] == len(damaged)


@pytest.mark.parametrize("other", ["another object's block", "another block of the object"])
def test_a_disk_file_of_another_block_is_discarded_and_refetched(
    tmp_path: Path, other: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A file copied, restored or renamed over a block's name holds a valid block with a
    valid CRC, just not this one: the CRC covers the file's name too, so it fails."""
    writer = BlockCache(block_size=16, cache_dir=tmp_path)
    writer.put_object(KEY, DATA[:16])
    (ours,) = _disk_files(tmp_path)
    if other == "another object's block":
        writer.put_object("objects/another", DATA[100:116])
    else:
        writer.put_object(KEY, DATA[:32])  # adds block 1
    (theirs,) = set(_disk_files(tmp_path)) - {ours}
    ours.write_bytes(theirs.read_bytes())
    cache = BlockCache(block_size=16, cache_dir=tmp_path)
    metrics = Metrics()
    source = Source()
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        assert cache.read(KEY, 0, 16, source, metrics=metrics) == DATA[:16]
    assert source.calls == [(0, 16)]
    assert metrics.snapshot()["cache_disk_discards"] == 1
    assert f"discarding damaged file {ours}" in caplog.text
    assert BlockCache(block_size=16, cache_dir=tmp_path).read(KEY, 0, 16, Source(b"")) == DATA[:16]


def test_a_disk_file_of_an_earlier_version_is_dropped_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    BlockCache(block_size=16, cache_dir=tmp_path).put_object(KEY, DATA[:16])
    (path,) = _disk_files(tmp_path)
    block = DATA[:16]  # as version 1 wrote it: the CRC of the block alone
    path.write_bytes(cache_module.DISK_HEADER.pack(b"DLC1", crc32c(block), 16) + block)
    cache = BlockCache(block_size=16, cache_dir=tmp_path)
    source = Source()
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        assert cache.read(KEY, 0, 16, source) == DATA[:16]
    assert source.calls == [(0, 16)]
    assert cache.stats()["disk_discards"] == 0
    assert "discarding" not in caplog.text
    assert path.read_bytes()[:4] == cache_module.DISK_MAGIC  # written again as version 2


def test_disk_eviction_by_bytes_oldest_first(tmp_path: Path) -> None:
    per_file = 16 + 10
    cache = BlockCache(block_size=10, cache_dir=tmp_path, disk_max_bytes=3 * per_file)
    source = Source()
    for block in range(5):
        cache.read(KEY, block * 10, block * 10 + 10, source)
    stats = cache.stats()
    assert (stats["disk_blocks"], stats["disk_bytes"], stats["disk_evictions"]) == (
        3,
        3 * per_file,
        2,
    )
    assert len(_disk_files(tmp_path)) == 3
    reopened = BlockCache(block_size=10, cache_dir=tmp_path)
    source.calls.clear()
    reopened.read(KEY, 0, 50, source)
    assert source.calls == [(0, 20)]  # blocks 0 and 1 were the oldest


def test_a_scan_at_startup_enforces_the_disk_bound(tmp_path: Path) -> None:
    BlockCache(block_size=10, cache_dir=tmp_path).put_object(KEY, DATA[:100])
    assert len(_disk_files(tmp_path)) == 10
    small = BlockCache(block_size=10, cache_dir=tmp_path, disk_max_bytes=4 * 26)
    assert small.stats()["disk_bytes"] <= 4 * 26
    assert len(_disk_files(tmp_path)) == 4


def test_a_block_larger_than_the_disk_bound_is_not_written(tmp_path: Path) -> None:
    cache = BlockCache(block_size=100, cache_dir=tmp_path, disk_max_bytes=50)
    cache.put_object(KEY, DATA[:100])
    assert _disk_files(tmp_path) == []


def test_two_caches_share_one_directory(tmp_path: Path) -> None:
    writer = BlockCache(block_size=16, cache_dir=tmp_path)
    reader = BlockCache(block_size=16, cache_dir=tmp_path)
    writer.put_object(KEY, DATA[:100])
    source = Source()
    assert reader.read(KEY, 0, 100, source) == DATA[:100]
    assert source.calls == []

    # Both writing the same blocks at once: no errors, no leftovers, exact bytes.
    both = [writer, reader]

    def worker(i: int) -> None:
        for n in range(20):
            both[i % 2].read(f"shared/{n}", 0, 200, Source(DATA[:200]))

    _run_threads(4, worker)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".blk")) == []
    fresh = BlockCache(block_size=16, cache_dir=tmp_path)
    for n in range(20):
        assert fresh.read(f"shared/{n}", 0, 200, Source(b"")) == DATA[:200]


def test_caches_with_different_block_sizes_do_not_mix_on_disk(tmp_path: Path) -> None:
    BlockCache(block_size=10, cache_dir=tmp_path).put_object(KEY, DATA[:100])
    other = BlockCache(block_size=20, cache_dir=tmp_path)
    source = Source()
    assert other.read(KEY, 0, 100, source) == DATA[:100]
    assert source.calls == [(0, 100)]


def test_stale_temp_files_are_removed_at_startup(tmp_path: Path) -> None:
    stale = tmp_path / ".leftover.123.0.tmp"
    recent = tmp_path / ".inflight.456.0.tmp"
    stale.write_bytes(b"x")
    recent.write_bytes(b"x")
    old = time.time() - cache_module.STALE_TEMP_SECONDS - 10
    os.utime(stale, (old, old))
    BlockCache(cache_dir=tmp_path)
    assert not stale.exists()
    assert recent.exists()


def test_cache_dir_accepts_a_path_and_is_created(tmp_path: Path) -> None:
    cache = BlockCache(cache_dir=tmp_path / "a" / "b")
    assert cache.cache_dir == str(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()


# ----------------------------------------------------------------------- metrics, stats


def test_metrics_count_blocks_and_fetches() -> None:
    cache = BlockCache(block_size=10)
    metrics = Metrics()
    cache.read(KEY, 5, 35, Source(), metrics=metrics)  # blocks 0-3: one run
    cache.read(KEY, 0, 50, Source(), metrics=metrics)  # 4 hits, block 4 missing
    counters = metrics.snapshot()
    assert counters == {"cache_fetches": 2, "cache_hits": 4, "cache_misses": 5}
    stats = cache.stats()
    assert (stats["fetches"], stats["hits"], stats["misses"]) == (2, 4, 5)
    assert {"memory_bytes", "disk_bytes", "in_flight", "block_size"} <= set(stats)


# ------------------------------------------------------------------------ the default


@pytest.fixture
def restore_default() -> Iterator[None]:
    saved = cache_module._Default.cache
    yield
    cache_module._Default.cache = saved


@pytest.mark.usefixtures("restore_default")
def test_default_cache_is_one_instance_until_reconfigured(tmp_path: Path) -> None:
    cache_module._Default.cache = None
    first = default_cache()
    assert default_cache() is first
    assert first.block_size == 4 << 20
    assert first.max_bytes == 256 << 20
    assert first.cache_dir is None
    configured = configure_default_cache(max_bytes=1 << 20, block_size=1 << 16, cache_dir=tmp_path)
    assert configured is not first
    assert default_cache() is configured
    assert (configured.block_size, configured.cache_dir) == (1 << 16, str(tmp_path))
    with pytest.raises(ConfigError):
        configure_default_cache(block_size=0)
    assert default_cache() is configured
    assert "BlockCache(" in repr(configured)


# --------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "options",
    [
        {"max_bytes": 0},
        {"max_bytes": -1},
        {"max_bytes": 1.5},
        {"max_bytes": True},
        {"block_size": 0},
        {"block_size": "4MiB"},
        {"disk_max_bytes": 0},
        {"cache_dir": 42},
        {"cache_dir": b"/tmp/bytes"},
    ],
)
def test_bad_options_are_config_errors(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        BlockCache(**options)  # type: ignore[arg-type]


def test_a_cache_dir_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError):
        BlockCache(cache_dir=tmp_path / "file")


@pytest.mark.parametrize(
    ("key", "start", "end"),
    [
        (KEY, -1, 10),
        (KEY, 10, 5),
        (KEY, 0, 10.0),
        (KEY, None, 10),
        (KEY, False, 10),
        ("", 0, 10),
        (None, 0, 10),
    ],
)
def test_bad_read_arguments_are_value_errors(key: object, start: object, end: object) -> None:
    cache = BlockCache()
    source = Source()
    with pytest.raises(ConfigError) as caught:
        cache.read(key, start, end, source)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert source.calls == []


def test_bad_put_object_arguments() -> None:
    cache = BlockCache()
    with pytest.raises(ConfigError):
        cache.put_object(KEY, "text")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        cache.put_object("", b"x")
    with pytest.raises(ConfigError):
        cache.invalidate(3)  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_wait_for_the_parents_loads() -> None:
    cache = BlockCache(block_size=10)
    started, release = threading.Event(), threading.Event()

    def blocked(start: int, end: int) -> bytes:
        started.set()
        assert release.wait(5)
        return DATA[start:end]

    loader = threading.Thread(target=lambda: cache.read(KEY, 0, 10, blocked), daemon=True)
    loader.start()
    assert started.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the parent's loader thread does not exist here
        ok = False
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(10)  # a hang kills the child instead of the suite
            ok = cache.stats()["in_flight"] == 0 and cache.read(KEY, 0, 10, Source()) == DATA[:10]
        finally:
            os._exit(0 if ok else 1)
    release.set()
    loader.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_cache_keeps_its_earlier_public_name() -> None:
    """``disklesslog.objects.cache`` was the cache's home, and the README named it."""
    from disklesslog.objects.cache import configure_default_cache as earlier

    assert earlier is configure_default_cache
