"""Key compaction on object logs, beyond the shared contract: passes over several rounds
match the reference model exactly at the cleanable end the active-tail rule gives; a
bounded key map converges in several passes; reads, time lookups and stream info handle
offsets with no record (inside batches and between them) from any start; a stale result
is never applied, and nothing after it either; the clean mark lives in key names."""

from __future__ import annotations

import random

import pytest
from object_support import Row, as_objects, model, rows, write

import disklesslog
from disklesslog.objects import compact as compact_module
from disklesslog.objects.compact import cleanable_count
from disklesslog.objects.storage import COMPACTED, key_kind

NOW = 50_000_000
RETENTION = 10_000  # delete_retention_ms
SETTINGS = {"cleanup_policy": "compact", "segment_bytes": 4096, "delete_retention_ms": RETENTION}


def _items(
    rng: random.Random, count: int, keys: int, first_ts: int
) -> list[tuple[bytes, bytes | None, int]]:
    items = []
    for i in range(count):
        key = b"k%03d" % rng.randrange(keys)
        value = (
            None
            if rng.random() < 0.15
            else b"%s=%d-" % (key, first_ts + i) + b"v" * rng.randrange(20, 90)
        )
        items.append((key, value, first_ts + i))
    return items


def _cleanable_end(log: disklesslog.Log, name: str, now_ms: int) -> int:
    """The offset the active tail starts at, by the rule of docs/architecture.md."""
    objects = as_objects(log)
    batches = list(objects.live_batches(name))
    count = cleanable_count(batches, log.stream(name).config, now_ms)
    return batches[count - 1].last_offset + 1 if count else log.stream(name).start_offset


def test_rounds_of_writes_and_passes_follow_the_model(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(**SETTINGS)
    rng = random.Random(5)
    for round_no in range(4):
        now = NOW + round_no * 8_000  # tombstones of earlier rounds pass the horizon
        write(log, "s", _items(rng, 250, keys=30, first_ts=now - 12_000), per_batch=20, flushes=3)
        before = rows(log, "s")
        end = _cleanable_end(log, "s", now)
        report = log.compact(now_ms=now, force=True)
        assert rows(log, "s") == model(before, end, now - RETENTION), f"round {round_no}"
        assert log.stream("s").end_offset == before[-1][0] + 1
        assert report.records_removed == len(before) - len(rows(log, "s"))
        # The pass marked where it ended: the last batch below the tail is compacted.
        below = [b for b in as_objects(log).live_batches("s") if b.last_offset < end]
        assert below and key_kind(below[-1].object_key) == COMPACTED


def test_a_bounded_key_map_compacts_in_several_passes(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(**SETTINGS)
    items = [(b"k%02d" % (i // 10 % 12), b"v%04d" % i + b"x" * 60, NOW) for i in range(600)]
    write(log, "s", items, per_batch=20)  # each batch holds 2 keys
    before = rows(log, "s")
    end = _cleanable_end(log, "s", NOW)
    ends = []
    for _ in range(40):
        report = compact_module.compact(as_objects(log), now_ms=NOW, force=True, max_keys=3)
        if not report.changed:
            break
        after = rows(log, "s")
        ends.append(next(x for x in range(end + 1) if after == model(before, x, 0)))
    assert len(ends) > 3, "the map filled: several passes"
    assert ends == sorted(ends) and ends[-1] == end  # each pass went on where the last one ended
    assert rows(log, "s") == model(before, end, 0)


def _with_gaps(log: disklesslog.Log) -> list[Row]:
    """A stream whose compaction leaves gaps of every kind: expired tombstones that vanish
    with their whole batches, batches that lose some records, batches left as they are."""
    items: list[tuple[bytes, bytes | None, int]] = []
    items += [(b"gone%02d" % i, None, NOW - 50_000 + i) for i in range(60)]  # 3 batches: vanish
    items += [(b"u%03d" % i, b"unique", NOW - 40_000 + i) for i in range(20)]  # unchanged
    items += [(b"hot", b"old%03d" % i, NOW - 30_000 + i) for i in range(40)]  # all but 1 go
    items += [(b"u2%03d" % i, b"unique", NOW - 20_000 + i) for i in range(20)]  # unchanged
    items += [(b"k%02d" % (i % 7), b"x" * 150, NOW - 10_000 + i) for i in range(100)]  # tail
    write(log, "s", items, per_batch=20)
    return rows(log, "s")


def test_reads_from_anywhere_skip_offsets_without_records(  # type: ignore[no-untyped-def]
    object_maintenance_factory, monkeypatch
) -> None:
    monkeypatch.setattr(compact_module, "BRIDGE_BYTES", 0)  # every change its own run
    log = object_maintenance_factory(**SETTINGS)
    before = _with_gaps(log)
    end = _cleanable_end(log, "s", NOW)
    log.compact(now_ms=NOW, force=True)
    expected = model(before, end, NOW - RETENTION)
    assert rows(log, "s") == expected
    batches = list(as_objects(log).live_batches("s"))
    assert batches[0].base_offset > 0, "the tombstones' batches vanished: a gap with no batch"
    assert any(b.last_offset - b.base_offset + 1 > 20 or b.base_offset % 20 for b in batches)
    stream = log.stream("s")
    offsets = [r[0] for r in expected]
    for start in range(stream.start_offset, stream.end_offset + 1):
        assert [r.offset for r in stream.read(start)] == [o for o in offsets if o >= start]
    for start, stop, limit in [
        (0, 60, None),
        (0, 61, None),
        (59, 150, 3),
        (70, 300, 1),
        (100, 101, None),
    ]:
        got = [r.offset for r in stream.read(start, stop, max_records=limit)]
        assert got == [o for o in offsets if start <= o < stop][:limit]
    for batch in stream.read_batches(0):
        assert len(batch) > 0, "no empty batches"
    for ts in [
        0,
        NOW - 50_000,
        NOW - 40_001,
        NOW - 40_000,
        NOW - 25_000,
        NOW - 10_001,
        NOW,
        NOW + 1,
    ]:
        late = [r for r in expected if r[1] >= ts]
        assert stream.offset_for_time(ts) == (late[0][0] if late else None), ts
    info = stream.info()
    assert (info.start_offset, info.end_offset) == (0, before[-1][0] + 1)
    assert info.size_bytes == sum(b.size for b in batches)
    followed = stream.follow(0, idle_timeout=0.05)
    assert [r.offset for r in followed] == offsets


@pytest.mark.all_backends
def test_everything_may_vanish(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    """Expired tombstones older than segment_ms are all cleanable, the tail included, and
    all go: the stream keeps its end offset and reads nothing."""
    log = object_maintenance_factory(**SETTINGS, segment_ms=60_000)
    write(log, "s", [(b"k%d" % i, None, NOW - 100_000 + i) for i in range(100)], per_batch=10)
    report = log.compact(now_ms=NOW)
    stream = log.stream("s")
    assert report.records_removed == 100
    assert rows(log, "s") == [] and stream.end_offset == 100
    assert list(stream.read(37)) == [] and stream.offset_for_time(0) is None
    assert list(as_objects(log).live_batches("s")) == []
    assert stream.append(b"v", key=b"k") == 100


def test_old_batches_are_cleanable_even_in_the_last_segment_bytes(
    object_maintenance_factory,
) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(**SETTINGS, segment_ms=60_000)
    write(log, "s", [(b"k", b"v%d" % i, NOW - 100_000) for i in range(30)], per_batch=10)
    log.compact(now_ms=NOW)
    assert rows(log, "s") == [(29, NOW - 100_000, b"k", b"v29")]  # old: no tail kept
    write(log, "s", [(b"k", b"w%d" % i, NOW) for i in range(30)], per_batch=10)
    before = rows(log, "s")
    log.compact(now_ms=NOW, force=True)
    assert rows(log, "s") == before  # young and small: all of it is the active tail


def test_a_stale_run_is_not_applied_and_nor_is_anything_after_it(  # type: ignore[no-untyped-def]
    object_maintenance_factory, monkeypatch
) -> None:
    """Retention trims the stream after the pass listed it: the swap of the first run
    with survivors (offsets 80..119; the tombstones before it vanished without an upload)
    finds a batch gone, so it changes nothing, its object becomes an orphan, and the pass
    stops there (a later run could drop a newer record of a key whose older one stays)."""
    monkeypatch.setattr(compact_module, "BRIDGE_BYTES", 0)
    log = object_maintenance_factory(**SETTINGS)
    before = _with_gaps(log)
    real_upload = compact_module.upload
    uploads: list[str] = []

    def upload_then_lose_the_race(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = real_upload(*args, **kwargs)
        if not uploads:
            log.stream("s").trim(100)  # meanwhile, retention moves the start offset
        uploads.append(found[0])
        return found

    monkeypatch.setattr(compact_module, "upload", upload_then_lose_the_race)
    report = log.compact(now_ms=NOW, force=True)
    assert rows(log, "s") == [r for r in before if r[0] >= 100]
    assert len(uploads) == 1 and report.records_removed == 60  # only the tombstones' run
    assert any("changed during the pass" in line for line in report.skipped)
    assert uploads[0] in as_objects(log).sequencer.objects_to_delete(0)  # an orphan
    monkeypatch.setattr(compact_module, "upload", real_upload)
    end = _cleanable_end(log, "s", NOW)
    log.compact(now_ms=NOW, force=True)  # the next run does the work
    assert rows(log, "s") == model([r for r in before if r[0] >= 100], end, NOW - RETENTION)


def test_dry_run_reports_what_a_run_does_and_changes_nothing(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(**SETTINGS)
    write(log, "s", _items(random.Random(3), 400, keys=20, first_ts=NOW - 5_000), per_batch=20)
    before = rows(log, "s")
    keys_before = {b.object_key for b in as_objects(log).live_batches("s")}
    stored_before = set(as_objects(log).storage.list_objects())
    dry = log.compact(now_ms=NOW, dry_run=True)
    assert rows(log, "s") == before
    assert {b.object_key for b in as_objects(log).live_batches("s")} == keys_before
    assert set(as_objects(log).storage.list_objects()) == stored_before
    real = log.compact(now_ms=NOW)
    counts = ("records_removed", "bytes_removed", "objects_written", "bytes_written")
    assert [getattr(dry, c) for c in counts] == [getattr(real, c) for c in counts]
    assert real.objects_written == 1 and real.bytes_written > 0 and real.objects_read > 0


def test_progress_is_reported_in_bytes(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(**SETTINGS)
    write(log, "s", _items(random.Random(4), 300, keys=20, first_ts=NOW - 5_000), per_batch=20)
    calls: list[tuple[str, int, int]] = []
    log.compact(now_ms=NOW, progress=lambda *call: calls.append(call))
    assert calls and {task for task, _, _ in calls} == {"compaction"}
    done = [d for _, d, _ in calls]
    assert done == sorted(done) and calls[-1][1] == calls[-1][2] > 0
    assert all(d <= t for _, d, t in calls)


def test_the_next_pass_skips_a_clean_stream_by_its_dirty_ratio(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(**SETTINGS)
    write(log, "s", _items(random.Random(6), 300, keys=20, first_ts=NOW - 5_000), per_batch=20)
    log.compact(now_ms=NOW)
    again = log.compact(now_ms=NOW)
    assert not again.changed
    assert any("dirty ratio 0.00" in line for line in again.skipped), again.skipped


def test_a_stream_deleted_during_a_run_is_skipped(object_maintenance_factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(**SETTINGS)
    for name in ("a", "b"):
        write(log, name, _items(random.Random(8), 300, keys=10, first_ts=NOW), per_batch=20)
    real_snapshot = compact_module.live_snapshot

    def delete_b_first(objects, name):  # type: ignore[no-untyped-def]
        if name == "b":
            log.delete_stream("b")  # another process deletes it as the pass reaches it
        return real_snapshot(objects, name)

    monkeypatch.setattr(compact_module, "live_snapshot", delete_b_first)
    report = log.compact(now_ms=NOW, force=True)
    assert "b: deleted during the pass" in report.skipped
    assert report.changed and log.streams() == ["a"]
