"""Garbage collection on object logs: after the grace period exactly the objects that
hold no live batch are deleted, never a referenced one; the reconcile pass deletes
objects the sequencer never knew once they are old, and leaves young uploads (commits
on their way) and files that are not ours alone; a collection killed half-way is
finished by the next one; dry runs change nothing; bad grace periods are refused."""

from __future__ import annotations

import math
import time

import pytest
from object_support import as_objects, referenced, rows, stored, write

import disklesslog
from disklesslog import ConfigError, DataLossError
from disklesslog.format import encode_batch
from disklesslog.objects import gc as gc_module
from disklesslog.objects.storage import ObjectStorage
from disklesslog.sequencers.base import BatchToCommit
from disklesslog.storage.cache import BlockCache

LATER = int(time.time() * 1000) + 3_600_000
HOUR_NS = 3_600 * 10**9


def _fill_and_merge(log: disklesslog.Log) -> None:
    """Ten flushes over two streams (ten WAL objects), then merged: the WAL objects
    become garbage, the merged ones hold everything."""
    for f in range(10):
        write(log, "a", [(b"k", b"a%d" % f * 50, 1_000 + f)], per_batch=1)
        write(log, "b", [(b"k", b"b%d" % f * 50, 1_000 + f)], per_batch=1)
    log.merge(now_ms=LATER)


def test_exactly_the_unreferenced_objects_go_after_the_grace(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    _fill_and_merge(log)
    before = {s: rows(log, s) for s in ("a", "b")}
    live, present = referenced(log), stored(log)
    garbage = present - live
    assert len(garbage) == 20 and len(live) == 2
    sizes = as_objects(log).storage.list_objects()

    assert log.collect_garbage(grace_seconds=3600).objects_deleted == 0  # still in grace
    dry = log.collect_garbage(grace_seconds=0, dry_run=True)
    assert dry.objects_deleted == 20 and stored(log) == present
    time.sleep(0.3)
    report = log.collect_garbage(grace_seconds=0.2)  # unreferenced for 0.3 s now
    assert report.objects_deleted == 20
    assert report.bytes_deleted == sum(sizes[key] for key in garbage)
    assert stored(log) == live == referenced(log)
    assert {s: rows(log, s) for s in ("a", "b")} == before
    assert not set(as_objects(log).sequencer.list_objects()) & garbage  # forgotten
    again = log.collect_garbage(grace_seconds=0)
    assert not again.changed and again.objects_deleted == 0  # idempotent


@pytest.mark.all_backends
def test_reconcile_takes_old_unknown_objects_only(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    objects = as_objects(log)
    storage, sequencer = objects.storage, objects.sequencer
    log.stream("s").append(b"v", key=b"k")
    batch = encode_batch([b"old but live"], [b"k"], None, [5]).data
    now = time.time_ns()
    # Committed an hour ago and still referenced: never deleted, whatever its age.
    old_live = ObjectStorage.new_key(time_ns=now - HOUR_NS)
    storage.put(old_live, batch)
    sequencer.commit(old_live, [BatchToCommit("s", 0, len(batch), 1, 1, 5)])
    # Uploaded an hour ago, never committed (its writer died): taken.
    old_unknown = ObjectStorage.new_key(time_ns=now - HOUR_NS)
    storage.put(old_unknown, b"never committed")
    # Uploaded just now, its commit perhaps on its way: kept, even with no grace.
    young_unknown = ObjectStorage.new_key()
    storage.put(young_unknown, b"commit on its way")
    # A file that is not ours (no time in its name): kept.
    storage.put("objects/notes.txt", b"someone else's")
    # An orphan the sequencer was told about: taken once the grace passes.
    orphan = ObjectStorage.new_key()
    storage.put(orphan, b"refused commit")
    sequencer.record_orphan(orphan)

    report = log.collect_garbage(grace_seconds=0)
    left = stored(log)
    assert old_unknown not in left and orphan not in left
    assert {old_live, young_unknown, "objects/notes.txt"} <= left
    assert report.objects_deleted == 2
    assert any("never knew" in line for line in report.actions)
    assert any("no time in their name" in line for line in report.skipped)
    assert [r.value for r in log.stream("s").read()] == [b"v", b"old but live"]
    assert storage.read_small("disklesslog.json")  # nothing outside the data folder is touched
    # With the floor lowered (as an operator sure that no writer runs might), the young
    # unknown upload goes too: the floor is the only thing that kept it.
    gc_module.collect_garbage(objects, grace_seconds=0)
    assert young_unknown in stored(log)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gc_module, "UNKNOWN_MIN_AGE", 0)
        gc_module.collect_garbage(objects, grace_seconds=0)
    assert young_unknown not in stored(log) and old_live in stored(log)


@pytest.mark.all_backends
def test_a_collection_without_reconcile_takes_only_what_the_sequencer_names(  # type: ignore[no-untyped-def]
    object_maintenance_factory,
) -> None:
    """``reconcile=False`` (automatic maintenance between its reconciling passes):
    the sequencer's garbage goes with its exact sizes, looked up without listing the
    data folder; an old upload the sequencer never knew stays for the next reconcile."""
    log = object_maintenance_factory()
    _fill_and_merge(log)
    objects = as_objects(log)
    storage = objects.storage
    unknown = ObjectStorage.new_key(time_ns=time.time_ns() - HOUR_NS)
    storage.put(unknown, b"never committed")
    sizes = storage.list_objects()
    garbage = set(objects.sequencer.objects_to_delete(0))
    assert len(garbage) == 20
    assert storage.sizes([*sorted(garbage), "objects/missing"], "objects") == {
        key: sizes[key] for key in garbage
    }

    def no_listing() -> dict[str, int]:
        raise AssertionError("a collection without reconcile listed the data folder")

    with pytest.MonkeyPatch.context() as patch:
        if storage.local_root() is not None:  # elsewhere sizes() is one LIST by design
            patch.setattr(storage, "list_objects", no_listing)
        report = log.collect_garbage(grace_seconds=0, reconcile=False)
    assert report.objects_deleted == 20
    assert report.bytes_deleted == sum(sizes[key] for key in garbage)
    assert stored(log) == referenced(log) | {unknown}
    assert not set(objects.sequencer.list_objects()) & garbage  # forgotten
    assert log.collect_garbage(grace_seconds=0).objects_deleted == 1  # reconciled now
    assert stored(log) == referenced(log)


def test_a_collection_killed_between_deleting_and_forgetting_is_finished(  # type: ignore[no-untyped-def]
    object_maintenance_factory,
) -> None:
    log = object_maintenance_factory()
    _fill_and_merge(log)
    objects = as_objects(log)
    garbage = objects.sequencer.objects_to_delete(0)
    objects.storage.delete(garbage[:7])  # the first chunk went; then the process died
    report = log.collect_garbage(grace_seconds=0)
    assert report.objects_deleted == len(garbage) - 7
    assert stored(log) == referenced(log)
    assert not set(objects.sequencer.list_objects()) & set(garbage)


def test_progress_and_bad_grace_periods(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory()
    _fill_and_merge(log)
    calls: list[tuple[str, int, int]] = []
    log.collect_garbage(grace_seconds=0, progress=lambda *call: calls.append(call))
    assert calls[0][1] == 0 and calls[-1][1] == calls[-1][2] > 0
    assert {task for task, _, _ in calls} == {"gc"}
    for bad in (-1, -0.5, math.nan, math.inf, "5", True):
        with pytest.raises(ConfigError, match="grace_seconds"):
            log.collect_garbage(grace_seconds=bad)
    with pytest.raises(ConfigError, match="grace_seconds"):
        log.maintain(grace_seconds=-1)


@pytest.mark.all_backends
def test_maintain_compacts_merges_and_collects(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = object_maintenance_factory(cleanup_policy="compact", segment_bytes=4096)
    items = [(b"k%d" % (i % 5), b"v%04d" % i + b"x" * 100, 1_000 + i) for i in range(400)]
    write(log, "s", items, per_batch=20, flushes=10)
    report = log.maintain(now_ms=2_000, grace_seconds=0)
    assert report.records_removed > 0 and report.objects_deleted > 0
    assert stored(log) == referenced(log)
    kept = rows(log, "s")
    assert {key for _, _, key, _ in kept} == {b"k%d" % i for i in range(5)}
    assert all(value == b"v%04d" % offset + b"x" * 100 for offset, _, _, value in kept)


def test_a_read_holding_collected_locations_finds_the_new_ones(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    """A read fixed its locations (the WAL objects), then merging moved the batches and
    garbage collection deleted those objects: the read asks the sequencer again and goes
    on from the merged object. An object deleted while still referenced is data loss."""
    log = object_maintenance_factory(cache=None)
    for f in range(10):
        write(log, "a", [(b"k", b"a%d" % f, 1_000 + f)], per_batch=1)
    expected = rows(log, "a")
    records = log.stream("a").read()
    first = next(records)  # the first page of locations is fixed now
    log.merge(now_ms=LATER)
    assert log.collect_garbage(grace_seconds=0).objects_deleted == 10
    rest = [(r.offset, r.timestamp, r.key, r.value) for r in records]
    assert [(first.offset, first.timestamp, first.key, first.value), *rest] == expected
    assert log.metrics()["stale_locations"] == 1
    objects = as_objects(log)
    objects.storage.delete([next(objects.live_batches("a")).object_key])  # by hand
    with pytest.raises(DataLossError, match="still references"):
        list(log.stream("a").read())


def test_collected_objects_leave_the_block_cache(object_maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    """A writer puts each object it uploads into the block cache; those collected must
    leave it, or a long-running writer's cache fills with deleted objects (up to its
    whole budget: 256 MB by default, ~0.5 KB per flush of a small object)."""
    cache = BlockCache()
    log = object_maintenance_factory(cache=cache)
    _fill_and_merge(log)
    before = {s: rows(log, s) for s in ("a", "b")}
    assert cache.stats()["memory_blocks"] >= 20  # the WAL objects, as uploaded
    assert log.collect_garbage(grace_seconds=0).objects_deleted == 20
    assert cache.stats()["memory_blocks"] <= len(stored(log)) == 2
    assert {s: rows(log, s) for s in ("a", "b")} == before
