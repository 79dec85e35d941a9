"""Merging on object logs: every record, offset and batch byte stays as it was while a
stream's batches move from many small WAL objects into few large merged ones, so a read
makes few GETs; small young runs wait, merged and compacted objects are never merged
again; stale and corrupt sources change nothing; bad input raises typed errors."""

from __future__ import annotations

import random
import time

import pytest
from object_support import as_objects, objects_per_stream, rows, write

import disklesslog
from disklesslog import ConfigError, CorruptDataError, InvalidStreamName, StreamNotFound
from disklesslog.objects import merge as merge_module
from disklesslog.objects import rewrite as rewrite_module
from disklesslog.objects.merge import plan_pieces
from disklesslog.objects.storage import COMPACTED, MERGED, WAL, ObjectStorage, key_kind
from disklesslog.sequencers.base import BatchLocation

LATER = int(time.time() * 1000) + 3_600_000  # an hour on: every small run has waited


def _fill(log: disklesslog.Log, flushes: int, seed: int = 1) -> None:
    """``flushes`` writer flushes (one WAL object each) over streams a, b and c: records
    of random sizes, some with headers, tombstones and keys."""
    rng = random.Random(seed)
    for f in range(flushes):
        with log.writer(linger_ms=60_000) as writer:
            for name in ("a", "b", "c"):
                for _ in range(rng.randrange(1, 3)):
                    count = rng.randrange(1, 8)
                    writer.append_batch(
                        name,
                        [
                            None if rng.random() < 0.1 else b"%s%d-" % (name.encode(), f) * 20
                            for _ in range(count)
                        ],
                        keys=[b"k%d" % rng.randrange(9) if rng.random() < 0.5 else None] * count,
                        headers=[{"h": b"%d" % f}] * count if rng.random() < 0.3 else None,
                        timestamps=1_000_000 + f,
                    )


def _full_rows(log: disklesslog.Log, name: str) -> list[tuple[object, ...]]:
    return [tuple(r) for r in log.stream(name).read()]


def _coordinates(log: disklesslog.Log, name: str) -> list[tuple[int, int, int, int]]:
    return [
        (b.base_offset, b.last_offset, b.max_timestamp, b.size)
        for b in as_objects(log).live_batches(name)
    ]


def _gets_of_a_read(log: disklesslog.Log, name: str) -> int:
    before = log.metrics()["gets"]
    for _ in log.stream(name).read_batches():
        pass
    return int(log.metrics()["gets"] - before)


def test_merging_keeps_every_record_and_byte_and_cuts_the_gets_of_a_read(  # type: ignore[no-untyped-def]
    object_maintenance_factory,
) -> None:
    log = object_maintenance_factory(cache=None)  # every fetch is a GET
    _fill(log, flushes=40)
    objects = as_objects(log)
    streams = ("a", "b", "c")
    records = {s: _full_rows(log, s) for s in streams}
    coordinates = {s: _coordinates(log, s) for s in streams}
    old_bytes = {
        s: [
            objects.fetch(b.object_key, b.position, b.position + b.size)
            for b in objects.live_batches(s)
        ]
        for s in streams
    }
    gets_before = _gets_of_a_read(log, "a")
    assert gets_before == objects_per_stream(log, "a") == 40

    report = log.merge(target_bytes=8 << 10, now_ms=LATER)

    for s in streams:
        assert _full_rows(log, s) == records[s], s
        assert _coordinates(log, s) == coordinates[s], s
        live = list(objects.live_batches(s))
        assert all(key_kind(b.object_key) == MERGED for b in live)
        new_bytes = [objects.fetch(b.object_key, b.position, b.position + b.size) for b in live]
        assert new_bytes == old_bytes[s], "batches are copied byte for byte"
        sizes: dict[str, int] = {}
        for b in live:
            sizes[b.object_key] = sizes.get(b.object_key, 0) + b.size
        assert all(size <= 8 << 10 for size in sizes.values())
        total = sum(sizes.values())
        assert len(sizes) <= -(-total // (6 << 10)), "pieces are close to the target size"
    gets_after = _gets_of_a_read(log, "a")
    assert gets_after == objects_per_stream(log, "a") <= gets_before // 5
    # Every WAL object holds batches of all three streams and is read once, not thrice.
    assert report.objects_read == 40 and report.objects_written == sum(
        objects_per_stream(log, s) for s in streams
    )
    assert len(report.actions) == 3
    again = log.merge(target_bytes=8 << 10, now_ms=LATER)  # merged objects stay as they are
    assert not again.changed and again.objects_written == again.objects_read == 0


@pytest.mark.all_backends
def test_small_young_runs_wait_and_old_ones_merge_whole(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    _fill(log, flushes=10)
    before = _coordinates(log, "a")
    waiting = log.merge()  # a few KiB, under a quarter of 64 MiB, and young
    assert not waiting.changed and _coordinates(log, "a") == before
    assert any("wait for" in line for line in waiting.skipped)
    merged = log.merge(now_ms=LATER)  # 10 minutes on: the whole run, one object per stream
    assert merged.changed and merged.objects_written == 3
    assert objects_per_stream(log, "a") == 1 and _coordinates(log, "a") == before


def test_the_policy_cuts_runs_at_the_target_and_keeps_the_young_remainder() -> None:
    now_ns = time.time_ns()

    def batch(i: int, size: int, kind: str = WAL, age_ms: int = 0) -> BatchLocation:
        key = ObjectStorage.new_key(kind, time_ns=now_ns - age_ms * 1_000_000)
        return BatchLocation(i, key, 0, size, i * 10, i * 10 + 9, 0)

    now = now_ns // 1_000_000
    run = [batch(i, 300) for i in range(10)]  # pieces of 900 bytes (a 4th would exceed 1,000)
    pieces, waiting = plan_pieces(run, 1000, now)
    assert [len(p) for p in pieces] == [3, 3, 3, 1] and not waiting  # 300 >= 1000/4: merged
    pieces, waiting = plan_pieces([*run[:3], batch(3, 200)], 1000, now)
    assert [len(p) for p in pieces] == [3] and len(waiting) == 1  # 200 < 250 and young
    old = [batch(0, 200, age_ms=11 * 60_000)]
    assert plan_pieces(old, 1000, now) == ([old], [])  # small but old: merged
    big = [batch(0, 5000), batch(1, 10)]
    assert plan_pieces(big, 1000, now)[0] == [[big[0]]]  # a large batch is a piece alone
    mixed = [
        batch(0, 600),
        batch(1, 600, MERGED),
        batch(2, 600),
        batch(3, 600, COMPACTED),
        batch(4, 600),
    ]
    pieces, waiting = plan_pieces(mixed, 1000, now)
    assert pieces == [[mixed[0]], [mixed[2]], [mixed[4]]] and not waiting  # runs end there


def test_compacted_and_merged_batches_are_never_merged_again(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(cleanup_policy="compact", segment_bytes=4096)
    items = [(b"k%02d" % (i % 30), b"v%04d" % i + b"x" * 80, 1_000_000 + i) for i in range(600)]
    write(log, "s", items, per_batch=20, flushes=15)
    log.compact(now_ms=2_000_000)
    compacted = [
        b for b in as_objects(log).live_batches("s") if key_kind(b.object_key) == COMPACTED
    ]
    assert compacted
    before = rows(log, "s")
    log.merge(target_bytes=4096, now_ms=LATER)
    live = list(as_objects(log).live_batches("s"))
    assert [b for b in live if key_kind(b.object_key) == COMPACTED] == compacted
    assert {key_kind(b.object_key) for b in live} == {COMPACTED, MERGED}
    assert rows(log, "s") == before
    assert not log.merge(target_bytes=4096, now_ms=LATER).changed


def test_a_stale_merge_is_discarded(object_maintenance_factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    _fill(log, flushes=12)
    real_upload = merge_module.upload
    uploads: list[str] = []
    second = next(as_objects(log).live_batches("a")).last_offset + 1

    def upload_then_lose_the_race(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = real_upload(*args, **kwargs)
        if not uploads:
            log.stream("a").trim(second)  # meanwhile, retention takes the first batch
        uploads.append(found[0])
        return found

    monkeypatch.setattr(merge_module, "upload", upload_then_lose_the_race)
    before = _full_rows(log, "a")
    report = log.merge("a", target_bytes=1 << 20, now_ms=LATER)
    kept = [r for r in before if r[0] >= second]
    assert _full_rows(log, "a") == kept
    assert all(key_kind(b.object_key) == WAL for b in as_objects(log).live_batches("a"))
    assert any("changed while merging" in line for line in report.skipped)
    assert uploads[0] in as_objects(log).sequencer.objects_to_delete(0)
    monkeypatch.setattr(merge_module, "upload", real_upload)
    assert log.merge("a", target_bytes=1 << 20, now_ms=LATER).changed
    assert _full_rows(log, "a") == kept and objects_per_stream(log, "a") == 1


def test_a_corrupt_batch_is_never_copied(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    _fill(log, flushes=5)
    objects = as_objects(log)
    victim = list(objects.live_batches("b"))[2]
    path = objects.storage.path(victim.object_key)
    data = bytearray(objects.storage.fs.cat_file(path))
    data[victim.position + victim.size - 3] ^= 0xFF  # inside the body: the CRC catches it
    objects.storage.fs.pipe_file(path, bytes(data))
    before = _coordinates(log, "b")
    with pytest.raises(CorruptDataError, match="CRC"):
        log.merge("b", target_bytes=1 << 20, now_ms=LATER)
    assert _coordinates(log, "b") == before
    assert all(key_kind(b.object_key) == WAL for b in objects.live_batches("b"))


def test_dry_run_progress_and_bad_input(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    _fill(log, flushes=8)
    before = {s: _coordinates(log, s) for s in ("a", "b", "c")}
    stored = set(as_objects(log).storage.list_objects())
    dry = log.merge(dry_run=True, now_ms=LATER)
    assert dry.dry_run and dry.changed and dry.objects_written == 3
    assert {s: _coordinates(log, s) for s in ("a", "b", "c")} == before
    assert set(as_objects(log).storage.list_objects()) == stored
    assert all(key_kind(b.object_key) == WAL for b in as_objects(log).live_batches("a"))
    calls: list[tuple[str, int, int]] = []
    log.merge(progress=lambda *call: calls.append(call), now_ms=LATER)
    assert calls[-1] == ("merge", calls[-1][2], calls[-1][2]) and calls[-1][2] > 0
    assert [d for _, d, _ in calls] == sorted(d for _, d, _ in calls)
    with pytest.raises(StreamNotFound):
        log.merge("missing")
    with pytest.raises(InvalidStreamName):
        log.merge("no/slash")
    for bad in (10, 1.5, True, -1):
        with pytest.raises(ConfigError, match="target_bytes"):
            log.merge(target_bytes=bad)


def test_an_upload_that_waited_too_long_is_not_swapped_in(
    object_maintenance_factory, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Garbage collection may take an object the sequencer does not know once it is old
    enough, so a result whose upload is older than UPLOAD_MAX_AGE when its swap comes is
    discarded as an orphan rather than referenced (here every upload counts as too old)."""
    monkeypatch.setattr(rewrite_module, "UPLOAD_MAX_AGE", -1.0)
    log = object_maintenance_factory()
    _fill(log, flushes=5)
    before = {s: _coordinates(log, s) for s in ("a", "b", "c")}
    report = log.merge(now_ms=LATER)
    assert not report.changed and report.objects_written == 3
    assert {s: _coordinates(log, s) for s in ("a", "b", "c")} == before
    orphans = as_objects(log).sequencer.objects_to_delete(0)
    assert sorted(key_kind(key) for key in orphans) == [MERGED] * 3


def test_a_stream_deleted_during_a_merge_is_skipped(
    object_maintenance_factory, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    _fill(log, flushes=4)
    real_raw = merge_module.SourceReader.raw
    of_b = {b.batch_id for b in as_objects(log).live_batches("b")}

    def delete_then_read(reader, locations):  # type: ignore[no-untyped-def]
        if any(b.batch_id in of_b for b in locations) and "b" in log.streams():
            log.delete_stream("b")  # deleted between the listing and the copy
            as_objects(log).collect_garbage(grace_seconds=0)  # and its objects collected
        return real_raw(reader, locations)

    monkeypatch.setattr(merge_module.SourceReader, "raw", delete_then_read)
    report = log.merge(now_ms=LATER)
    assert log.streams() == ["a", "c"] and report.objects_written >= 2
    assert any(line.startswith("b: ") for line in report.skipped)
    assert all(
        key_kind(b.object_key) == MERGED
        for s in ("a", "c")
        for b in as_objects(log).live_batches(s)
    )
