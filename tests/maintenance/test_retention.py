"""Retention by time and size on every backend: what stays is a suffix of the stream
with its offsets unchanged; everything dropped was expired (or over the size limit),
and nothing more could go; a local stream's active segment always stays; dry runs
change nothing; runs are idempotent; bad settings are refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import disklesslog
from disklesslog import ConfigError, OffsetOutOfRange, StreamNotFound
from disklesslog.maintenance.retention import Unit, retention_point

NOW = 10_000_000  # ms: the clock retention runs with in these tests
SMALL = {"segment_bytes": 4096}  # local logs roll often, so retention has segments to drop


def _fill(log: disklesslog.Log, name: str, batches: int, *, first_ts: int = 1_000) -> None:
    """``batches`` batches of 10 records of 200 B, timestamps rising by 1,000 per batch,
    through one writer flush (one object on object storage, many batches)."""
    with log.writer(linger_ms=60_000) as writer:
        for i in range(batches):
            values = [b"%06d" % (i * 10 + j) + b"x" * 194 for j in range(10)]
            writer.append_batch(name, values, timestamps=first_ts + i * 1_000)


def _records(log: disklesslog.Log, name: str) -> list[tuple[int, int, bytes]]:
    return [(r.offset, r.timestamp, r.value) for r in log.stream(name).read()]


@pytest.mark.all_backends
def test_time_retention_drops_only_expired_units_and_keeps_a_suffix(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory(retention_ms=30_000, **SMALL)
    _fill(log, "s", 60)
    before = _records(log, "s")
    cutoff = NOW - 30_000
    report = log.apply_retention(now_ms=NOW + 20_000)  # cutoff = 0:00:00 + 50 s... see below
    after = _records(log, "s")
    start = log.stream("s").start_offset
    assert after == [r for r in before if r[0] >= start]  # a suffix, offsets unchanged
    dropped = [r for r in before if r[0] < start]
    assert dropped, "something must have expired"
    cutoff = NOW + 20_000 - 30_000
    assert all(ts < cutoff for _, ts, _ in dropped)
    assert all(r in after for r in before if r[1] >= cutoff)  # nothing unexpired went
    assert report.records_removed == start and report.actions
    again = log.apply_retention(now_ms=NOW + 20_000)
    assert not again.changed and log.stream("s").start_offset == start  # idempotent


def test_size_retention_keeps_at_least_the_limit(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory(retention_bytes=8_000, **SMALL)
    _fill(log, "s", 40)
    before = _records(log, "s")
    report = log.apply_retention(now_ms=NOW)
    stream = log.stream("s")
    lazy, tail = stream.retention_units()
    units = list(lazy)
    kept = sum(u.size for u in units) + tail
    assert kept >= 8_000
    if units:  # and not a unit more: without the oldest remaining one it would be below
        assert kept - units[0].size < 8_000
    assert _records(log, "s") == [r for r in before if r[0] >= stream.start_offset]
    assert report.bytes_removed > 0


def test_dry_run_changes_nothing(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory(retention_ms=1_000, **SMALL)
    _fill(log, "s", 30)
    before = _records(log, "s")
    report = log.apply_retention(dry_run=True, now_ms=NOW)
    assert report.dry_run and report.changed and report.records_removed > 0
    assert _records(log, "s") == before
    assert log.stream("s").start_offset == 0
    assert any("would" in line for line in report.summary())


def test_a_local_active_segment_always_stays(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with disklesslog.open(tmp_path / "log", retention_ms=1, **SMALL) as log:
        _fill(log, "s", 30)
        log.apply_retention(now_ms=NOW)
        stream = log.stream("s")
        info = stream.info()
        active = info.details["segments"][-1]
        assert stream.start_offset == active["base_offset"] > 0
        assert [r[0] for r in _records(log, "s")] == list(range(active["base_offset"], 300))


def test_object_streams_may_be_trimmed_to_empty_and_leave_garbage() -> None:
    url = "memory://retention-empty/log"
    with disklesslog.open(url, retention_ms=1) as log:
        _fill(log, "s", 5)
        log.apply_retention(now_ms=NOW)
        stream = log.stream("s")
        assert stream.start_offset == stream.end_offset == 50
        assert list(stream.read()) == []
        assert len(log.sequencer.objects_to_delete(0)) == 1  # type: ignore[attr-defined]
        assert stream.append(b"next") == 50


def test_only_streams_with_the_delete_policy_are_trimmed(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory(retention_ms=1, **SMALL)
    log.create_stream("kept", cleanup_policy="compact")
    log.create_stream("both", cleanup_policy="compact,delete")
    for name in ("kept", "both", "plain"):
        with log.writer(linger_ms=60_000) as writer:
            for i in range(20):
                keys = [b"k%d" % j for j in range(10)]
                writer.append_batch(name, [b"v" * 200] * 10, keys=keys, timestamps=1 + i)
    log.apply_retention(now_ms=NOW)
    assert log.stream("kept").start_offset == 0
    assert log.stream("both").start_offset > 0
    assert log.stream("plain").start_offset > 0
    report = log.apply_retention("kept", now_ms=NOW)
    assert report.skipped == ["kept: cleanup_policy='compact'"]


def test_one_stream_only(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory(retention_ms=1, **SMALL)
    _fill(log, "a", 20)
    _fill(log, "b", 20)
    log.apply_retention("a", now_ms=NOW)
    assert log.stream("a").start_offset > 0 and log.stream("b").start_offset == 0
    with pytest.raises(StreamNotFound):
        log.apply_retention("missing", now_ms=NOW)
    with pytest.raises(disklesslog.InvalidStreamName):
        log.apply_retention("../etc", now_ms=NOW)


def test_retention_runs_while_writers_and_readers_work(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    """Appends and reads go on while retention trims: readers see suffixes with the
    right values at their offsets (or an OffsetOutOfRange when they fall behind)."""
    log = maintenance_factory(retention_bytes=6_000, **SMALL)
    stream = log.create_stream("s")
    stop = threading.Event()
    problems: list[BaseException] = []

    def write() -> None:
        for i in range(60):
            stream.append_batch([b"%06d" % (i * 5 + j) + b"y" * 300 for j in range(5)])
        stop.set()

    def read() -> None:
        while not stop.is_set():
            try:
                for record in stream.read():
                    assert record.value[:6] == b"%06d" % record.offset
            except OffsetOutOfRange:
                continue  # trimmed under a slow reader: it starts again
            except BaseException as exc:
                problems.append(exc)
                return

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    while not stop.is_set():
        log.apply_retention(now_ms=NOW)
    for thread in threads:
        thread.join()
    assert not problems
    log.apply_retention(now_ms=NOW)
    records = _records(log, "s")
    assert [r[0] for r in records] == list(range(stream.start_offset, 300))


# ------------------------------------------------------------- the rule itself


def _units(*sizes_and_times: tuple[int, int]) -> list[Unit]:
    units, offset = [], 0
    for size, ts in sizes_and_times:
        units.append(Unit(offset, offset + 10, size, ts))
        offset += 10
    return units


def test_rule_time_stops_at_the_first_unit_that_stays() -> None:
    config = disklesslog.StreamConfig(retention_ms=100)
    units = _units((10, 50), (10, 950), (10, 60), (10, 990))  # the third is old but behind
    assert retention_point(units, 0, config, 1_000) == (10, 1, 10, "retention_ms")


def test_rule_time_reads_units_only_up_to_the_first_that_stays() -> None:
    """Judged by time alone, units are read lazily and no further than the first that
    stays: what a pass costs follows what it drops, not what the stream holds."""
    config = disklesslog.StreamConfig(retention_ms=100)
    read: list[int] = []

    def units() -> Iterator[Unit]:
        for unit in _units((10, 50), (10, 60), (10, 950), *[(10, 990)] * 1000):
            read.append(unit.base_offset)
            yield unit

    assert retention_point(units(), 0, config, 1_000) == (20, 2, 20, "retention_ms")
    assert read == [0, 10, 20]
    read.clear()  # a size limit needs the stream's total: every unit is read
    sized = disklesslog.StreamConfig(retention_ms=100, retention_bytes=10_015)
    assert retention_point(units(), 0, sized, 1_000) == (20, 2, 20, "retention_ms")
    assert len(read) == 1003


def test_object_retention_reads_what_it_drops_not_the_whole_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An object stream of 3,000 live batches of which retention drops 10: the sequencer
    is asked for a small first page, not for every batch."""
    with disklesslog.open(
        "memory://lazy-retention", backend="objects", retention_ms=30_000, maintenance="off"
    ) as log:
        with log.writer(linger_ms=60_000) as writer:
            for i in range(3_000):
                writer.append_batch("s", [b"%06d" % i], timestamps=1_000 if i < 10 else NOW)
        fetched: list[int] = []
        find_batches = log.sequencer.find_batches

        def counted(stream: str, offset: int, max_bytes: int) -> Any:
            page = find_batches(stream, offset, max_bytes)
            fetched.append(len(page.batches))
            return page

        monkeypatch.setattr(log.sequencer, "find_batches", counted)
        report = log.apply_retention("s", now_ms=NOW)
        assert log.stream("s").start_offset == 10 and report.records_removed == 10
        assert 0 < sum(fetched) < 1_000, fetched
        monkeypatch.undo()
        assert next(iter(log.stream("s").read())).offset == 10


def test_rule_size_keeps_at_least_the_limit() -> None:
    config = disklesslog.StreamConfig(retention_bytes=25)
    units = _units((10, 0), (10, 0), (10, 0))
    assert retention_point(units, 5, config, 0) == (10, 1, 10, "retention_bytes")
    assert retention_point(units, 0, config, 0) is None  # 30 - 10 < 25


def test_rule_unlimited_keeps_everything() -> None:
    assert retention_point(_units((10, 0)), 0, disklesslog.StreamConfig(), 10**12) is None


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "option",
    [
        {"retention_ms": -7},
        {"retention_ms": 0},
        {"retention_ms": 10**15},
        {"retention_bytes": -2},
        {"retention_bytes": 2.5},
        {"retention_ms": True},
        {"delete_retention_ms": -1},
        {"min_cleanable_dirty_ratio": 1.5},
        {"cleanup_policy": "archive"},
        {"local_retention_ms": -3},
        {"local_retention_bytes": 100, "retention_bytes": 50},
    ],
)
def test_bad_retention_settings_are_refused(tmp_path, option: dict) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        disklesslog.open(tmp_path / "log", **option)
    with disklesslog.open(tmp_path / "log2") as log, pytest.raises(ConfigError):
        log.create_stream("s", **option)


def test_trimming_past_the_end_is_refused(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory()
    _fill(log, "s", 2)
    with pytest.raises(OffsetOutOfRange):
        log.stream("s").trim(21)
    log.stream("s").trim(20)
    assert log.stream("s").start_offset == 20
