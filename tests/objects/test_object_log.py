"""The object backend's own promises, beyond the shared Log/Stream contract: one object
and one commit per flush, atomic multi-stream flushes, retried PUTs, lost commit
responses without duplicates, fencing, the read cache, and typed errors."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence

import pytest

import disklesslog
from disklesslog import (
    ConfigError,
    CorruptDataError,
    DataLossError,
    ProducerFenced,
    StreamNotFound,
)
from disklesslog.sequencers.base import BatchToCommit, CommitResult
from disklesslog.sequencers.memory import MemorySequencer
from disklesslog.storage.cache import BlockCache
from disklesslog.testing import FaultyMemoryFileSystem


@pytest.fixture
def faulty() -> Iterator[type[FaultyMemoryFileSystem]]:
    FaultyMemoryFileSystem.reset()
    yield FaultyMemoryFileSystem
    FaultyMemoryFileSystem.reset()


def _url(scheme: str = "memory") -> str:
    return f"{scheme}://objects-test-{uuid.uuid4().hex}/log"


def _open(url: str | None = None, **options: object) -> disklesslog.Log:
    options.setdefault("sequencer", MemorySequencer())
    return disklesslog.open(url or _url(), **options)


# --------------------------------------------------------------- flushes


def test_one_object_and_one_commit_per_flush_whatever_the_streams() -> None:
    with _open(cache=None) as log:
        puts_before = log.metrics()["puts"]  # opening wrote the log's marker
        with log.writer(linger_ms=60_000) as writer:
            futures = [writer.append(f"s{i % 100}", b"x" * 100) for i in range(5_000)]
            writer.flush()
            metrics = log.metrics()
            assert metrics["puts"] - puts_before == 1
            assert metrics["commits"] == 1
            assert metrics["committed_batches"] == 100
        assert {f.result() for f in futures} == set(range(50))
        assert len(log.streams()) == 100


def test_a_flush_is_atomic_across_streams() -> None:
    """Either every stream of a flush becomes visible, or none: a refused commit leaves
    all of them untouched."""
    sequencer = MemorySequencer()
    with _open(sequencer=sequencer) as log:
        log.stream("a").append(b"a0")
        log.stream("b").append(b"b0")
        writer = log.writer(linger_ms=60_000, producer="p")
        writer.append("a", b"a1")
        writer.append("b", b"b1")
        log.writer(producer="p").close()  # fences the first writer's producer
        with pytest.raises(ProducerFenced):
            writer.flush()
        assert [r.value for r in log.stream("a").read()] == [b"a0"]
        assert [r.value for r in log.stream("b").read()] == [b"b0"]
        assert log.metrics()["orphaned_objects"] == 1
        assert sequencer.objects_to_delete(0)  # the orphan is left for the collector


def test_objects_hold_batches_sorted_by_stream() -> None:
    sequencer = MemorySequencer()
    with _open(sequencer=sequencer) as log, log.writer(linger_ms=60_000) as writer:
        for name in ("c", "a", "b", "a"):
            writer.append(name, name.encode())
        writer.flush()
        keys = {
            name: sequencer.find_batches(name, 0, 1 << 20).batches[0] for name in ("a", "b", "c")
        }
        assert len({b.object_key for b in keys.values()}) == 1
        assert keys["a"].position < keys["b"].position < keys["c"].position


def test_put_failures_are_retried(faulty: type[FaultyMemoryFileSystem]) -> None:
    faulty.failing_puts = 2
    with _open(_url("faulty-memory")) as log:
        assert log.stream("s").append(b"x") == 0
        assert log.metrics()["put_errors"] == 2
    with _open(_url("faulty-memory")) as log:
        faulty.failing_puts = 100
        with pytest.raises(OSError, match="after 5 attempts"):
            log.stream("s").append(b"y")
        faulty.failing_puts = 0
        assert log.stream("s").append(b"z") == 0  # nothing of the failed append is visible


class _LosesFirstResponse(MemorySequencer):
    """Commits, then pretends the connection dropped before the answer arrived."""

    def __init__(self, losses: int) -> None:
        super().__init__()
        self.losses = losses

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        results = super().commit(object_key, batches)
        if self.losses:
            self.losses -= 1
            raise ConnectionError("the response was lost")
        return results


def test_a_lost_commit_response_never_duplicates() -> None:
    sequencer = _LosesFirstResponse(losses=2)
    with _open(sequencer=sequencer) as log:
        with log.writer(linger_ms=60_000) as writer:
            futures = [writer.append("s", b"%d" % i) for i in range(10)]
            futures += [writer.append("t", b"t%d" % i) for i in range(3)]
        assert [f.result() for f in futures] == [*range(10), 0, 1, 2]
        assert [r.value for r in log.stream("s").read()] == [b"%d" % i for i in range(10)]
        assert log.stream("t").end_offset == 3
        metrics = log.metrics()
        assert metrics["commit_errors"] == 2
        assert metrics["duplicate_batches"] == 2  # the retries were recognised
        assert log.stream("s").append(b"next") == 10  # sequences continue without a gap


def test_named_producers_fence_older_instances() -> None:
    with _open() as log:
        old = log.writer(producer="ingest", linger_ms=0)
        assert old.append("s", b"from old").result() == 0
        new = log.writer(producer="ingest", linger_ms=0)
        assert new.producer[0] == old.producer[0] and new.producer[1] == old.producer[1] + 1
        with pytest.raises(ProducerFenced):
            old.append("s", b"zombie").result()
        with pytest.raises(ProducerFenced):  # and it stays fenced, without uploading
            old.append("s", b"zombie again").result()
        assert new.append("s", b"from new").result() == 1
        assert [r.value for r in log.stream("s").read()] == [b"from old", b"from new"]
        new.close()
        with pytest.raises(ProducerFenced):
            old.close()


# ------------------------------------------------------------------ reads


def test_concurrent_readers_share_each_block() -> None:
    """8 threads reading the same streams cause at most one GET per block."""
    url = _url()
    sequencer = MemorySequencer()
    with _open(url, sequencer=sequencer) as writer_log:
        for i in range(40):
            writer_log.stream(f"s{i % 4}").append_batch([b"v%05d" % j * 20 for j in range(50)])
    cache = BlockCache(max_bytes=64 << 20, block_size=16 << 10)
    with _open(url, sequencer=sequencer, cache=cache) as log:
        barrier = threading.Barrier(8)
        results: list[list[bytes]] = []

        def read() -> None:
            barrier.wait()
            results.append([r.value for s in range(4) for r in log.stream(f"s{s}").read()])

        threads = [threading.Thread(target=read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 8 and all(r == results[0] for r in results)
        assert len(results[0]) == 2000
        metrics = log.metrics()
        blocks = metrics["cache_misses"]
        assert metrics["gets"] <= blocks, metrics
        assert metrics["cache_hits"] >= 7 * blocks, metrics


def test_freshly_written_objects_are_read_from_the_cache() -> None:
    cache = BlockCache()
    with _open(cache=cache) as log:
        log.stream("s").append_batch([b"x"] * 100)
        assert len(list(log.stream("s").read())) == 100
        assert log.metrics()["gets"] == 0


def test_a_deleted_object_is_data_loss_not_an_empty_read() -> None:
    url = _url()
    sequencer = MemorySequencer()
    with _open(url, sequencer=sequencer, cache=None) as log:
        log.stream("s").append_batch([b"a", b"b"])
        location = sequencer.find_batches("s", 0, 1 << 20).batches[0]
        log.storage.delete([location.object_key])
        with pytest.raises(DataLossError, match=location.object_key.split("/")[-1]):
            list(log.stream("s").read())


def test_a_corrupt_object_is_reported_with_its_name_and_position() -> None:
    url = _url()
    sequencer = MemorySequencer()
    with _open(url, sequencer=sequencer, cache=None) as log:
        log.stream("s").append_batch([b"a" * 50, b"b" * 50])
        location = sequencer.find_batches("s", 0, 1 << 20).batches[0]
        path = log.storage.path(location.object_key)
        data = bytearray(log.storage.fs.cat_file(path))
        data[location.position + 60] ^= 0x01
        log.storage.fs.pipe_file(path, bytes(data))
        for read in (log.stream("s").read, log.stream("s").read_offsets):
            with pytest.raises(CorruptDataError) as info:
                list(read())
            assert location.object_key in str(info.value.source)
            assert info.value.position == location.position


# ------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("url", "options", "error", "message"),
    [
        ("nosuchscheme://x/y", {}, disklesslog.InvalidURL, "no backend"),
        ("memory://x/y", {"sequencer": "nosuch://z"}, disklesslog.InvalidURL, "no sequencer"),
        ("memory://x/y", {"sequencer": "sqlite://host/x.db"}, disklesslog.InvalidURL, None),
        ("memory://x/y", {"sequencer": 42}, disklesslog.ConfigError, "sequencer"),
        ("memory://x/y", {"cache": "big"}, disklesslog.ConfigError, "cache"),
        ("memory://x/y", {"no_such_option": 1}, disklesslog.ConfigError, "no_such_option"),
        ("/tmp/x", {"sequencer": "memory://"}, disklesslog.ConfigError, "backend='objects'"),
    ],
)
def test_bad_urls_and_options(url: str, options: dict, error: type, message: str | None) -> None:
    with pytest.raises(error, match=message):
        disklesslog.open(url, **options)


def test_missing_extra_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    def no_gcsfs(url: str, **kwargs: object) -> object:
        raise ImportError("Install gcsfs to access Google Storage")

    monkeypatch.setattr(fsspec.core, "url_to_fs", no_gcsfs)
    with pytest.raises(disklesslog.MissingDependencyError, match=r"disklesslog\[gcs\]"):
        disklesslog.open("gs://bucket/log", sequencer="memory://")
    with pytest.raises(ImportError):  # also an ImportError, for generic handlers
        disklesslog.open("gs://bucket/log", sequencer="memory://")


def test_other_kinds_of_log_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with disklesslog.open(tmp_path / "segments"):
        pass
    with pytest.raises(disklesslog.InvalidURL, match="another kind"):
        disklesslog.open(f"file://{tmp_path}/segments", backend="objects")
    with disklesslog.open(f"file://{tmp_path}/objects", backend="objects"):
        pass
    with pytest.raises(disklesslog.InvalidURL):
        disklesslog.open(tmp_path / "objects")
    with pytest.raises(
        disklesslog.InvalidURL, match=r"is not a log: it has no .*this does not create a log"
    ):
        disklesslog.open(_url(), sequencer=MemorySequencer(), create=False)


def test_deleted_stream_while_writing_is_recreated() -> None:
    with _open() as log:
        stream = log.stream("s")
        stream.append_batch([b"1", b"2", b"3"])
        log.delete_stream("s")
        with pytest.raises(StreamNotFound):
            stream.end_offset  # noqa: B018
        assert stream.append(b"again") == 0  # sequence numbers start over too
        assert stream.append(b"more") == 1


def test_live_batches_follow_a_start_offset_moved_by_another_process() -> None:
    """Retention in another process trims while a listing pages through the batches:
    the listing from the start offset goes on from the new start (the batches below are
    no longer live); a listing from an explicit offset raises as a read would."""
    sequencer = MemorySequencer()
    with _open(sequencer=sequencer) as log:
        for i in range(6):
            log.stream("s").append_batch([b"%d" % i] * 10)
        real_find = sequencer.find_batches
        calls: list[int] = []

        def find_after_a_trim(stream: str, offset: int, max_bytes: int):  # type: ignore[no-untyped-def]
            if not calls:
                sequencer.trim("s", 35)  # between stream_info and the first page
            calls.append(offset)
            return real_find(stream, offset, max_bytes)

        sequencer.find_batches = find_after_a_trim  # type: ignore[method-assign]
        listed = [(b.base_offset, b.last_offset) for b in log.live_batches("s")]  # type: ignore[attr-defined]
        assert listed == [(30, 39), (40, 49), (50, 59)] and calls == [0, 35]
        calls.clear()
        with pytest.raises(disklesslog.OffsetOutOfRange):
            list(log.live_batches("s", 0))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "option", [{"tier_url": "file:///tmp/tier"}, {"fsync": "always"}, {"fsync_interval_ms": 5}]
)
def test_local_only_options_are_refused_by_name(option: dict[str, object]) -> None:
    (name,) = option
    with pytest.raises(ConfigError, match=f"{name} apply to local"):
        disklesslog.open("memory://local-only/log", **option)
