"""Tiering of local logs to object storage (KIP-405's idea), on ``memory://`` and the moto
S3 server, with ``file://`` tiers where several processes share one.

Every test compares reads with a reference model (the records as written): what a
stream holds after tiering, local deletion, retention, trims and garbage collection is
exactly a suffix of what was written, offsets unchanged, whichever part serves it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import kill_points
import pytest
from kill_points import Forked

import disklesslog
from disklesslog import (
    ConfigError,
    CorruptDataError,
    DataLossError,
    InvalidURL,
    MissingDependencyError,
    OffsetOutOfRange,
)
from disklesslog.cli import main
from disklesslog.segments import layout
from disklesslog.segments import log as segment_log
from disklesslog.segments.tiering import manifest as manifests
from disklesslog.segments.tiering import operations as tiering
from disklesslog.storage.cache import configure_default_cache, default_cache
from disklesslog.testing import FaultyMemoryFileSystem, create_bucket, s3_storage_options

WORKERS = Path(__file__).with_name("tier_workers.py")
NOW = 10_000_000  # ms: the clock tiering and retention run with
SMALL = {"segment_bytes": 2048, "index_interval_bytes": 256}
Row = tuple[int, int, bytes]


@dataclass
class Target:
    """A tier location and how to look inside it."""

    url: str
    options: dict[str, Any] | None

    @property
    def fs(self) -> Any:
        return fsspec.core.url_to_fs(self.url, **(self.options or {}))[0]

    @property
    def root(self) -> str:
        return str(fsspec.core.url_to_fs(self.url, **(self.options or {}))[1]).rstrip("/")

    def keys(self) -> set[str]:
        """Every object under ``streams/``, relative to the tier URL."""
        fs, root = self.fs, self.root
        fs.invalidate_cache()
        try:
            found = fs.find(f"{root}/streams")
        except FileNotFoundError:
            return set()
        return {path.strip("/")[len(root.strip("/")) + 1 :] for path in found}


def _memory_target() -> Target:
    return Target(f"memory://tier-{uuid.uuid4().hex[:12]}/tier", None)


def _s3_target(endpoint: str) -> Target:
    options = s3_storage_options(endpoint)
    return Target(f"s3://{create_bucket('s3', options)}/tier", options)


TARGETS = [pytest.param("memory"), pytest.param("s3", marks=pytest.mark.s3)]
"""Tier locations: memory://, and the moto S3 server (whose runs are slow, an HTTP round
trip per request, except for the tests that name these params themselves)."""


@pytest.fixture(
    params=[pytest.param("memory"), pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow])]
)
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "memory":
        return _memory_target()
    return _s3_target(request.getfixturevalue("s3_server"))


def _open(path: Path, target: Target, **options: Any) -> disklesslog.Log:
    """The test's log; automatic maintenance off, so that only the tiering each test
    calls (or kills) runs: a long test would otherwise see its own background pass tier
    what a killed child was counted on to tier."""
    options.setdefault("maintenance", "off")
    return disklesslog.open(
        path,
        fsync="never",
        tier_url=target.url,
        tier_storage_options=target.options,
        **options,
    )


def _fill(log: disklesslog.Log, name: str, count: int, *, first_ts: int = 1_000) -> list[Row]:
    """``count`` records in batches of 3, timestamps rising by 10 ms per batch; returns
    the reference ``(offset, timestamp, value)`` of each."""
    stream = log.stream(name)
    rows: list[Row] = []
    for first in range(0, count, 3):
        values = [b"%s-%06d-" % (name.encode(), i) + b"." * 90 for i in range(first, first + 3)]
        ts = first_ts + first * 10
        offsets = stream.append_batch(values, timestamps=ts)
        rows += [(offset, ts, value) for offset, value in zip(offsets, values)]
    return rows


def _rows(
    stream: disklesslog.Stream, start: int | None = None, end: int | None = None
) -> list[Row]:
    return [(r.offset, r.timestamp, r.value) for r in stream.read(start, end)]


def _local_start(stream: disklesslog.Stream) -> int:
    """The state record's start offset (shown once the stream has a manifest)."""
    info = stream.info()
    return int(info.details.get("local_start_offset", info.start_offset))


def _manifest(path: Path, name: str = "s") -> manifests.Manifest:
    found = manifests.load(path / "streams" / name)
    assert found is not None
    return found


def _referenced(path: Path) -> set[str]:
    return {
        key for _, m in manifests.iter_manifests(path / "streams") for key in m.referenced_keys()
    }


# ------------------------------------------------------------------- reads


@pytest.mark.parametrize("target", TARGETS, indirect=True)
def test_reads_fall_through_to_the_tier(tmp_path: Path, target: Target) -> None:
    """Every record reads back as written, from any start, across the boundary between
    tiered and local segments; offset_for_time and info cover both parts."""
    log = _open(tmp_path / "log", target, local_retention_bytes=4096, **SMALL)
    ref = _fill(log, "s", 240)
    report = log.tier(now_ms=NOW)
    stream = log.stream("s")
    local = _local_start(stream)
    tiered = [seg for seg in stream.info().details["tiered"] if seg["state"] == "tiered"]
    assert 0 < local < ref[-1][0] and stream.start_offset == 0
    assert report.objects_written == 3 * len(tiered) and report.segments_deleted > 0
    assert report.bytes_written >= sum(seg["bytes"] for seg in tiered)
    assert _rows(stream) == ref
    followed = [(r.offset, r.timestamp, r.value) for r in stream.follow(0, idle_timeout=0.05)]
    assert followed == ref
    for start in sorted({0, 1, 7, local - 1, local, local + 1, *random.sample(range(240), 12)}):
        assert _rows(stream, start) == ref[start:]
        assert _rows(stream, start, start + 9) == ref[start : start + 9]
    batches = list(stream.read_batches(local - 4, max_records=7))
    assert [o for batch in batches for o in batch.offsets] == list(range(local - 4, local + 3))
    for start, end in [(0, None), (local - 4, local + 3), (local, None)]:
        expected = [list(batch.offsets) for batch in stream.read_batches(start, end)]
        assert [list(part) for part in stream.read_offsets(start, end)] == expected
    assert [r.offset for r in stream.read(local - 4, max_records=7)] == list(
        range(local - 4, local + 3)
    )
    for ts in (0, 1_000, 1_005, 1_900, ref[local][1], ref[local - 1][1] + 1, 10**9):
        expected = next((row[0] for row in ref if row[1] >= ts), None)
        assert stream.offset_for_time(ts) == expected
    info = stream.info()
    files = {p.name for p in (tmp_path / "log" / "streams" / "s").glob("*.log")}
    assert min(int(name[:20]) for name in files) == local  # nothing below stays local
    assert info.size_bytes == sum(seg["bytes"] for seg in info.details["segments"]) + sum(
        seg["bytes"] for seg in tiered if seg["end_offset"] <= local
    )
    log.close()


def test_reopening_reads_the_tier_without_tier_url(tmp_path: Path, target: Target) -> None:
    log = _open(tmp_path / "log", target, local_retention_bytes=2048, **SMALL)
    ref = _fill(log, "s", 150)
    log.tier(now_ms=NOW)
    log.close()
    again = disklesslog.open(tmp_path / "log", fsync="never", tier_storage_options=target.options)
    assert again.tier_url == target.url  # type: ignore[attr-defined]
    stream = again.stream("s")
    assert stream.start_offset == 0 < _local_start(stream)
    assert _rows(stream) == ref
    more = _fill(again, "s", 60, first_ts=5_000)
    assert again.tier(now_ms=NOW).changed  # the persisted tier is tiered to again
    assert _rows(stream) == ref + more
    again.close()


@pytest.mark.s3
@pytest.mark.parametrize(
    "where", ["file", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow])]
)
def test_another_process_reads_the_tiered_part(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """The tier is found from the log directory alone: a process that never tiered reads
    the tiered part (file:// by default; the S3 server's client stack under slow)."""
    if where == "s3":
        target = _s3_target(request.getfixturevalue("s3_server"))
    else:
        target = Target(f"file://{tmp_path}/tier", None)
    with _open(tmp_path / "log", target, local_retention_bytes=2048, **SMALL) as log:
        ref = _fill(log, "s", 150)
        log.tier(now_ms=NOW)
        assert _local_start(log.stream("s")) > 0
    options = json.dumps({"tier_storage_options": target.options})
    out = subprocess.run(
        [sys.executable, str(WORKERS), "dump", str(tmp_path / "log"), options],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    dumped = [json.loads(line) for line in out.splitlines()]
    assert [(o, ts, bytes.fromhex(v)) for _, o, ts, v in dumped] == ref


def test_a_process_that_opened_before_tiering_began_sees_the_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log opened without a tier looks for one at most once a second (so logs that
    never tier pay nothing per read), and at once when a read falls below its local
    start."""
    monkeypatch.setattr(segment_log, "TIER_RECHECK_SECONDS", 0.2)
    early = disklesslog.open(tmp_path / "log", fsync="never", local_retention_bytes=2048, **SMALL)
    ref = _fill(early, "s", 120)
    stream = early.stream("s")
    assert _rows(stream) == ref  # and now it will not look for a tier for a while
    late = _open(tmp_path / "log", _memory_target())
    late.tier(now_ms=NOW)
    local = _local_start(late.stream("s"))
    assert local > 0
    assert _rows(stream, 0) == ref  # below the local start: it looks at once
    time.sleep(0.2)
    assert stream.start_offset == 0 and _rows(stream) == ref
    early.close()
    late.close()


# -------------------------------------------------------------- retention, gc


def test_retention_removes_tiered_copies_and_gc_deletes_them_after_the_grace(
    tmp_path: Path, target: Target
) -> None:
    log = _open(tmp_path / "log", target, retention_ms=2_000, local_retention_bytes=2048, **SMALL)
    ref = _fill(log, "s", 240)  # timestamps 1,000 .. 3,390
    log.tier(now_ms=NOW)
    stream = log.stream("s")
    local = _local_start(stream)
    before = target.keys()
    report = log.apply_retention(now_ms=4_000)  # cutoff 2,000: the oldest tiered segments go
    start = stream.start_offset
    assert 0 < start < local, "retention should have dropped tiered segments only"
    assert report.records_removed == start and report.segments_deleted == 0
    assert _rows(stream) == ref[start:]
    with pytest.raises(OffsetOutOfRange) as caught:
        list(stream.read(start - 1))
    assert str(caught.value).startswith(
        f"offset {start - 1} is outside the range of stream 's', [{start}, 240]"
    )
    doomed = {item.key for item in _manifest(tmp_path / "log").garbage}
    assert doomed and doomed <= before and not doomed & _referenced_live(tmp_path / "log")
    kept = log.collect_garbage(grace_seconds=300)
    assert kept.objects_deleted == 0 and doomed <= target.keys()  # not before the grace
    gone = log.collect_garbage(grace_seconds=0)
    assert gone.objects_deleted == len(doomed) and gone.bytes_deleted > 0
    assert not doomed & target.keys() and not _manifest(tmp_path / "log").garbage
    assert target.keys() == before - doomed
    assert _rows(stream) == ref[start:]
    log.close()


def test_gc_drops_the_deleted_tiered_objects_from_the_block_cache(tmp_path: Path) -> None:
    """Blocks of tiered objects that garbage collection deletes leave the process's
    block cache (memory and disk) at once; those of live objects stay."""
    target = _memory_target()
    configure_default_cache(block_size=512)
    try:
        log = _open(
            tmp_path / "log", target, retention_ms=2_000, local_retention_bytes=2048, **SMALL
        )
        ref = _fill(log, "s", 240)
        log.tier(now_ms=NOW)
        stream = log.stream("s")
        assert _rows(stream) == ref  # reads every tiered object through the cache
        log.apply_retention(now_ms=4_000)
        doomed = {item.key for item in _manifest(tmp_path / "log").garbage}
        live = target.keys() - doomed
        assert doomed and live
        log.collect_garbage(grace_seconds=0)
        fetched: list[str] = []

        def cached(key: str) -> bool:
            def fetch(start: int, end: int) -> bytes:
                fetched.append(key)
                return b"x" * (end - start)

            before = len(fetched)
            default_cache().read(f"{target.url}/{key}", 0, 1, fetch)
            return len(fetched) == before

        assert not any(cached(key) for key in doomed)
        assert any(cached(key) for key in live if key.endswith(".log"))
        log.close()
    finally:
        configure_default_cache()


def _referenced_live(path: Path) -> set[str]:
    return {key for seg in _manifest(path).segments for key in seg.object_keys()}


def test_retention_past_the_local_start_trims_both_parts(tmp_path: Path) -> None:
    target = _memory_target()
    log = _open(
        tmp_path / "log", target, retention_bytes=3_000, local_retention_bytes=2048, **SMALL
    )
    ref = _fill(log, "s", 240)
    log.tier(now_ms=NOW)
    log.apply_retention(now_ms=NOW)
    stream = log.stream("s")
    start = stream.start_offset
    units, tail = stream.retention_units()
    assert sum(u.size for u in units) + tail >= 3_000
    assert start == _local_start(stream)  # every tiered segment went, and local ones too
    assert _rows(stream) == ref[start:]
    assert log.collect_garbage(grace_seconds=0).objects_deleted > 0
    assert target.keys() == _referenced(tmp_path / "log")
    log.close()


def test_reconcile_deletes_orphans_after_the_grace(tmp_path: Path, target: Target) -> None:
    log = _open(tmp_path / "log", target, local_retention_bytes=2048, **SMALL)
    ref = _fill(log, "s", 120)
    _fill(log, "doomed", 120)
    log.tier(now_ms=NOW)
    incarnation = _manifest(tmp_path / "log").incarnation
    fs, root = target.fs, target.root
    orphan = f"streams/s/{incarnation}/00000000000000999999-00000000000001000000-deadbeef.log"
    fs.pipe_file(f"{root}/{orphan}", b"an upload whose manifest entry was lost")
    deleted_stream_keys = _manifest(tmp_path / "log", "doomed").referenced_keys()
    log.delete_stream("doomed")
    assert log.collect_garbage(grace_seconds=300).objects_deleted == 0  # all too young
    stored = target.keys()
    assert orphan in stored and deleted_stream_keys <= stored
    # Without the reconcile pass (automatic maintenance between its reconciling runs)
    # what no manifest names stays, whatever its age.
    assert log.collect_garbage(grace_seconds=0, reconcile=False).objects_deleted == 0
    assert target.keys() == stored
    report = log.collect_garbage(grace_seconds=0)
    assert report.objects_deleted == 1 + len(deleted_stream_keys)
    assert target.keys() == _referenced(tmp_path / "log")
    assert _rows(log.stream("s")) == ref
    log.close()


# ----------------------------------------------------------- local retention


def test_local_retention_by_size_keeps_the_limit_locally(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), local_retention_bytes=5_000, **SMALL)
    _fill(log, "s", 240)
    log.tier(now_ms=NOW)
    stream = log.stream("s")
    local = stream.info().details["segments"]
    kept = sum(seg["bytes"] for seg in local)
    assert kept >= 5_000 and kept - local[0]["bytes"] < 5_000  # not a segment more
    log.close()


def test_local_retention_by_time(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), local_retention_ms=1_000, **SMALL)
    ref = _fill(log, "s", 240)  # timestamps 1,000 .. 3,390
    log.tier(now_ms=3_000)  # local copies older than 2,000 go
    stream = log.stream("s")
    local = _local_start(stream)
    assert local > 0 and ref[local - 1][1] < 2_000 <= ref[local + 30][1]
    assert _rows(stream) == ref
    log.close()


def test_without_local_retention_tiering_only_copies(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), **SMALL)
    ref = _fill(log, "s", 120)
    report = log.tier(now_ms=NOW)
    assert report.objects_written > 0 and report.segments_deleted == 0
    assert _local_start(log.stream("s")) == 0 and _rows(log.stream("s")) == ref
    log.close()


def test_local_retention_follows_alter_stream(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), **SMALL)
    ref = _fill(log, "s", 240)
    log.tier(now_ms=NOW)
    assert _local_start(log.stream("s")) == 0  # local retention unlimited so far
    log.alter_stream("s", local_retention_bytes=5_000)
    report = log.tier(now_ms=NOW)
    assert report.segments_deleted > 0 and report.objects_written == 0
    local = log.stream("s").info().details["segments"]
    assert sum(seg["bytes"] for seg in local) >= 5_000 and _local_start(log.stream("s")) > 0
    assert _rows(log.stream("s")) == ref
    log.close()


def test_the_active_segment_is_never_tiered(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), local_retention_bytes=1, **SMALL)
    ref = _fill(log, "s", 120)
    log.tier(now_ms=NOW)
    stream = log.stream("s")
    active = stream.info().details["segments"][-1]
    assert _manifest(tmp_path / "log").segments[-1].end_offset == active["base_offset"]
    assert _local_start(stream) == active["base_offset"] > 0  # everything else went
    assert _rows(stream) == ref
    log.close()


def test_a_segment_that_failed_to_upload_is_never_deleted_locally(tmp_path: Path) -> None:
    FaultyMemoryFileSystem.reset()
    url = f"faulty-memory://tier-{uuid.uuid4().hex[:12]}/tier"
    log = disklesslog.open(
        tmp_path / "log", fsync="never", tier_url=url, local_retention_bytes=1, **SMALL
    )
    ref = _fill(log, "s", 120)
    FaultyMemoryFileSystem.failing_puts = 1000
    try:
        with pytest.raises(OSError, match="could not store"):
            log.tier(now_ms=NOW)
    finally:
        FaultyMemoryFileSystem.reset()
    stream = log.stream("s")
    assert _local_start(stream) == 0 and _rows(stream) == ref
    assert [seg.state for seg in _manifest(tmp_path / "log").segments] == ["copying"]
    assert log.tier(now_ms=NOW).segments_deleted > 0  # the next run finishes the job
    assert _local_start(stream) > 0 and _rows(stream) == ref
    log.close()


def test_a_damaged_local_segment_stops_tiering_there(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), local_retention_bytes=1, **SMALL)
    ref = _fill(log, "s", 150)
    segments = log.stream("s").info().details["segments"]
    damaged = segments[3]
    path = tmp_path / "log" / "streams" / "s" / damaged["file"]
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    report = log.tier(now_ms=NOW)
    assert any("is not tiered" in line for line in report.skipped)
    stream = log.stream("s")
    assert _local_start(stream) == damaged["base_offset"]  # the damage stays local
    assert _rows(stream, 0, damaged["base_offset"]) == ref[: damaged["base_offset"]]
    with pytest.raises(CorruptDataError):
        list(stream.read(damaged["base_offset"]))
    log.close()


# ----------------------------------------------------- dry runs, idempotence


def test_dry_run_changes_nothing_and_runs_are_idempotent(tmp_path: Path) -> None:
    target = _memory_target()
    log = _open(tmp_path / "log", target, local_retention_bytes=2048, **SMALL)
    ref = _fill(log, "s", 120)
    dry = log.tier(dry_run=True, now_ms=NOW)
    assert dry.dry_run and dry.changed and dry.objects_written > 0 and dry.segments_deleted > 0
    assert target.keys() == set() and manifests.load(tmp_path / "log" / "streams" / "s") is None
    assert _local_start(log.stream("s")) == 0
    real = log.tier(now_ms=NOW)
    assert (real.objects_written, real.segments_deleted) == (
        dry.objects_written,
        dry.segments_deleted,
    )
    again = log.tier(now_ms=NOW)
    assert not again.changed and again.objects_written == 0
    log.stream("s").trim(30)
    dry_gc = log.collect_garbage(dry_run=True, grace_seconds=0)
    assert dry_gc.objects_deleted > 0 and _manifest(tmp_path / "log").garbage
    assert _rows(log.stream("s")) == ref[30:]
    log.close()


def test_progress_reports_bytes(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), **SMALL)
    _fill(log, "s", 120)
    calls: list[tuple[str, int, int]] = []
    log.tier(now_ms=NOW, progress=lambda task, done, total: calls.append((task, done, total)))
    tiered = sum(seg.size for seg in _manifest(tmp_path / "log").segments)
    assert calls[-1] == ("tiering", tiered, tiered)
    assert all(done <= total for _, done, total in calls)
    log.close()


def test_a_crash_between_upload_and_manifest_adopts_the_uploaded_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _memory_target()
    log = _open(tmp_path / "log", target, **SMALL)
    ref = _fill(log, "s", 60)

    def crash(store: Any, entry: Any) -> bool:
        raise KeyboardInterrupt("killed after the upload")

    with monkeypatch.context() as patch:
        patch.setattr(tiering, "_finish_copy", crash)
        with pytest.raises(KeyboardInterrupt):
            log.tier(now_ms=NOW)
    (entry,) = _manifest(tmp_path / "log").segments
    assert entry.state == "copying" and set(entry.object_keys()) <= target.keys()
    report = log.tier(now_ms=NOW)
    assert any("3 of their objects were stored already" in line for line in report.actions)
    done = _manifest(tmp_path / "log").segments[0]
    assert done == dataclasses.replace(entry, state="tiered", since_ms=done.since_ms)
    assert target.keys() == _referenced(tmp_path / "log")
    assert _rows(log.stream("s")) == ref
    log.close()


# ------------------------------------------------------------ trims, damage


def test_trims_below_and_above_the_local_start(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), local_retention_bytes=2048, **SMALL)
    ref = _fill(log, "s", 150)
    log.tier(now_ms=NOW)
    stream = log.stream("s")
    local = _local_start(stream)
    stream.trim(25)  # inside the tiered part: only the manifest changes
    assert stream.start_offset == 25 and _local_start(stream) == local
    assert _rows(stream) == ref[25:]
    with pytest.raises(OffsetOutOfRange) as caught:
        stream.trim(151)
    assert (caught.value.start_offset, caught.value.end_offset) == (25, 150)
    stream.trim(local + 10)  # past the tiered part: both move
    assert stream.start_offset == _local_start(stream) == local + 10
    assert all(seg.end_offset > local + 10 for seg in _manifest(tmp_path / "log").segments)
    assert _rows(stream) == ref[local + 10 :]
    stream.trim(3)  # never backwards
    assert stream.start_offset == local + 10
    log.close()


@pytest.mark.parametrize("edge", ["first", "last"])
def test_trims_at_the_edges_of_tiered_and_local_segments(tmp_path: Path, edge: str) -> None:
    """Trims to the first or the last offset of tiered segments in turn, up to the last
    tiered one and the first local one: the segment that holds the new start stays (in
    the manifest or on disk), and reads start exactly there, also after garbage
    collection and after reopening."""
    path = tmp_path / "log"
    target = _memory_target()
    log = _open(path, target, local_retention_bytes=2048, **SMALL)
    ref = _fill(log, "s", 150)
    log.tier(now_ms=NOW)
    stream = log.stream("s")
    tiered = [(seg.base_offset, seg.end_offset) for seg in _manifest(path).segments]
    local = [(s["base_offset"], s["end_offset"]) for s in stream.info().details["segments"]]
    untiered = [(base, end) for base, end in local if base >= tiered[-1][1]]
    assert len(tiered) > 4 and untiered[0][0] == tiered[-1][1]
    assert tiered[3][1] < _local_start(stream) <= tiered[-1][0]  # local copies stay a while
    for base, end in [*tiered[:3], tiered[-1], untiered[0]]:
        before = base if edge == "first" else end - 1
        stream.trim(before)
        assert stream.start_offset == before and _rows(stream) == ref[before:], before
        log.collect_garbage(grace_seconds=0)
        assert _rows(stream) == ref[before:], f"{before}: after garbage collection"
        log.close()
        log = _open(path, target, local_retention_bytes=2048, **SMALL)
        stream = log.stream("s")
        assert stream.start_offset == before and _rows(stream) == ref[before:], before
    log.close()


def test_corrupt_and_missing_tiered_objects_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _memory_target()
    log = _open(tmp_path / "log", target, local_retention_bytes=1, **SMALL)
    _fill(log, "s", 120)
    log.tier(now_ms=NOW)
    first, second = _manifest(tmp_path / "log").segments[:2]
    fs, root = target.fs, target.root
    path = f"{root}/{first.log.key}"
    data = bytearray(fs.cat_file(path))
    data[700] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    stream = log.stream("s")
    with pytest.raises(CorruptDataError) as corrupt:
        list(stream.read(0))
    assert corrupt.value.source == f"{target.url}/{first.log.key}"
    assert corrupt.value.position is not None and corrupt.value.position <= 700

    fs.rm_file(f"{root}/{second.log.key}")
    with pytest.raises(DataLossError, match="is missing") as lost:
        list(stream.read(second.base_offset))
    assert lost.value.source == f"{target.url}/{second.log.key}"
    assert main(["verify", str(tmp_path / "log")]) == 1  # going on after each damage
    out = capsys.readouterr().out
    assert f"CORRUPT s: {target.url}/{first.log.key} at byte" in out
    assert f"CORRUPT s: {target.url}/{second.log.key} at byte" in out
    assert "2 corruption(s) found" in out
    log.close()


def test_compacted_streams_are_not_tiered(tmp_path: Path) -> None:
    log = _open(tmp_path / "log", _memory_target(), **SMALL)
    log.create_stream("c", cleanup_policy="compact")
    log.stream("c").append_batch([b"v" * 100] * 60, keys=[b"k%d" % i for i in range(60)])
    report = log.tier("c", now_ms=NOW)
    assert report.skipped == [
        "c: cleanup_policy='compact': compacted streams are not tiered (as in Kafka)"
    ]
    assert manifests.load(tmp_path / "log" / "streams" / "c") is None
    log.close()


# -------------------------------------------------------------- bad input


def test_bad_tier_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log"
    with pytest.raises(InvalidURL):
        disklesslog.open(path, tier_url="no-such-protocol://bucket/x")
    with pytest.raises(InvalidURL, match="not a URL"):
        disklesslog.open(path, tier_url=str(tmp_path / "tier"))
    with pytest.raises(InvalidURL):
        disklesslog.open(path, tier_url="")
    with pytest.raises(InvalidURL, match="overlaps the log directory"):
        disklesslog.open(path, tier_url=f"file://{path}/tier")
    with pytest.raises(InvalidURL, match="overlaps the log directory"):
        disklesslog.open(path, tier_url=f"file://{tmp_path}")
    with pytest.raises(ConfigError, match="pass tier_url too"):
        disklesslog.open(path, tier_storage_options={"anon": True})
    with pytest.raises(ConfigError, match="mapping"):
        disklesslog.open(path, tier_url="memory://x/y", tier_storage_options=["anon"])
    with pytest.raises(ConfigError, match="apply to object-storage logs"):
        disklesslog.open(path, storage_options={"anon": True})

    def no_client(url: str, **options: Any) -> Any:
        raise ImportError("No module named 's3fs'")

    with monkeypatch.context() as patch:
        patch.setattr(fsspec.core, "url_to_fs", no_client)
        with pytest.raises(MissingDependencyError, match=r"disklesslog\[s3\]"):
            disklesslog.open(path, tier_url="s3://bucket/tier")
    assert not (path / "tier.json").exists()  # nothing was recorded by the failures

    target = _memory_target()
    with _open(path, target) as log:
        assert log.tier_url == target.url  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="cannot move"):
        disklesslog.open(path, tier_url=_memory_target().url)
    with pytest.raises(ConfigError, match="another log"):  # two logs, one prefix
        _open(tmp_path / "other", target)
    objects_log = f"memory://objects-{uuid.uuid4().hex[:8]}/log"
    disklesslog.open(objects_log).close()
    with pytest.raises(InvalidURL, match="another kind"):
        disklesslog.open(tmp_path / "third", tier_url=objects_log)
    with disklesslog.open(path, fsync="never") as log, pytest.raises(ConfigError, match="grace"):
        log.collect_garbage(grace_seconds=-1)


def test_a_tiered_log_opens_without_its_client_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends and local reads need no object-store client; tiered reads name what to
    install."""
    with _open(tmp_path / "log", _memory_target(), local_retention_bytes=2048, **SMALL) as log:
        ref = _fill(log, "s", 120)
        log.tier(now_ms=NOW)
        local = _local_start(log.stream("s"))

    def no_client(url: str, **options: Any) -> Any:
        raise ImportError("no client")

    monkeypatch.setattr(fsspec.core, "url_to_fs", no_client)
    with disklesslog.open(tmp_path / "log", fsync="never") as log:
        stream = log.stream("s")
        assert stream.append(b"more") == 120
        assert _rows(stream, local, 120) == ref[local:]
        with pytest.raises(MissingDependencyError, match="memory://"):
            list(stream.read(0))


def test_tier_and_gc_without_a_tier_url_say_so(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path / "log", fsync="never", **SMALL) as log:
        _fill(log, "s", 60)
        report = log.tier()
        assert not report.changed and report.skipped[0].startswith("no tier_url")
        assert log.collect_garbage().skipped[0].startswith("no tier_url")
        assert log.maintain().skipped  # retention, compaction, merge, tiering, gc


def test_absurd_stream_settings_are_refused(tmp_path: Path) -> None:
    target = _memory_target()
    with pytest.raises(ConfigError):
        _open(tmp_path / "a", target, local_retention_bytes=10_000, retention_bytes=100)
    with pytest.raises(ConfigError):
        _open(tmp_path / "b", target, local_retention_ms=-5)


# -------------------------------------------------------------------- CLI


def test_cli_tiers_and_describes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    with disklesslog.open(path, fsync="never", local_retention_bytes=2048, **SMALL) as log:
        ref = _fill(log, "s", 120)
    url = _memory_target().url
    assert main(["tier", str(path), "--tier-url", url, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "s: tiered offsets 0.." in out and "local start offset 0 ->" in out
    assert main(["describe", str(path), "s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "state" in line and "object" in line)
    rows = lines[lines.index(header) + 1 :]
    assert rows and all(row.split()[3] == "tiered" for row in rows)
    assert main(["describe", str(path), "s", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["tiered"][0]["base_offset"] == 0 and facts["start_offset"] == 0
    assert main(["verify", str(path)]) == 0
    assert "120 records" in capsys.readouterr().out
    with disklesslog.open(path) as log:
        assert _rows(log.stream("s")) == ref


# -------------------------------------------------- several processes, crashes


def _file_target(tmp_path: Path) -> Target:
    return Target(f"file://{tmp_path}/tier", None)


def _run(mode: str, path: Path, *args: str, options: dict[str, Any] | None = None) -> str:
    command = [sys.executable, str(WORKERS), mode, str(path), json.dumps(options or {}), *args]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout


def _check_tier_consistent(path: Path, target: Target) -> None:
    """Every object of a segment a manifest lists as tiered exists. (Manifests first,
    then the listing: an object listed as tiered cannot be collected within the check,
    which takes far less than the grace period.)"""
    listed = [
        key
        for _, manifest in manifests.iter_manifests(path / "streams")
        for seg in manifest.segments
        if seg.tiered
        for key in seg.object_keys()
    ]
    missing = set(listed) - target.keys()
    assert not missing, f"objects a manifest lists are gone: {sorted(missing)[:3]}"


TIERING_STEPS = ("_begin_copy", "_upload", "_finish_copy", "_delete_local_copies")
"""The steps of a tiering run (``segments/tiering/operations.py``) a kill is aimed at."""
KILL_WINDOWS = [
    "_upload",
    "_finish_copy",
    "anywhere",
    "_begin_copy",
    "_upload",
    "_delete_local_copies",
]
"""Where the rounds of the crash test kill, in turn: inside one call of a step (of one
segment, chosen at random), or anywhere in the run."""


def _tier_armed(path: Path, report: Path, stop_at: int | None) -> Forked:
    """Run one ``log.tier()`` in a forked tiering process that counts its file calls,
    marks its steps, and stops at call ``stop_at`` (``kill_points``)."""
    report.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            with disklesslog.open(path, create=False, fsync="never") as log:
                kill_points.arm(report, stop_at)
                kill_points.marking(tiering, *TIERING_STEPS)
                log.tier()
            kill_points.finish()
        except BaseException as exc:
            kill_points.finish(exc)
            code = 1
        os._exit(code)
    return Forked(pid)


def _copy_tiered_log(path: Path, tier: Path, to: Path) -> Path:
    """A copy of a tiered log and its tier under ``to``, the copy's ``tier.json`` naming
    the copied tier; returns the copied log's path. The tier is copied as hard links:
    tiering never writes an object in place (it renames a synced temporary file)."""
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(path, to / "log")
    shutil.copytree(tier, to / "tier", copy_function=os.link)
    tier_json = to / "log" / "tier.json"
    config, _ = layout.decode_json(tier_json.read_bytes(), str(tier_json), what="tier.json")
    tier_json.write_bytes(layout.encode_json({**config, "url": f"file://{to}/tier"}))
    return to / "log"


@pytest.mark.parametrize(
    "rounds",
    [pytest.param(6, id="6-rounds"), pytest.param(40, id="40-rounds", marks=pytest.mark.slow)],
)
def test_sigkill_while_tiering_loses_nothing(tmp_path: Path, rounds: int) -> None:
    """Kill a tiering process inside its run, ``rounds`` times: every record reads back
    once at its offset at once, the next run completes, and no orphan survives gc.

    The kill lands at a file call drawn at random from one step of the run (uploading a
    segment's objects, recording it as copying or tiered, deleting local copies) or from
    the whole run, by construction (tests/kill_points.py): a calibration run on a copy
    of the log and its tier counts the run's calls and where each step made them."""
    target = _file_target(tmp_path)
    path = tmp_path / "log"
    report = tmp_path / "kill-points"
    rng = random.Random(1234)
    log = disklesslog.open(
        path,
        maintenance="off",  # only the killed child tiers: the calibration counts its calls
        fsync="never",  # SIGKILL is a process crash: the OS keeps what was written
        tier_url=target.url,
        segment_bytes=1024,
        index_interval_bytes=128,
        local_retention_bytes=3072,
    )
    refs: dict[str, list[Row]] = {"a": [], "b": []}
    for round_no in range(rounds):
        for name in refs:
            refs[name] += _fill(log, name, 60, first_ts=1_000 + round_no * 1_000)
        copy = _copy_tiered_log(path, tmp_path / "tier", tmp_path / "copy")
        child = _tier_armed(copy, report, None)
        calibration = kill_points.wait(report, child)
        assert child.join() == 0 and calibration.finished, calibration
        window = KILL_WINDOWS[round_no % len(KILL_WINDOWS)]
        spans = [(1, calibration.calls)] if window == "anywhere" else calibration.spans(window)
        assert spans, f"the run never made a file call in {window}: {calibration}"
        stop_at = rng.randint(*rng.choice(spans))
        child = _tier_armed(path, report, stop_at)
        stopped = kill_points.wait(report, child)
        status = child.kill()
        assert stopped.stopped_at == stop_at, stopped
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        for name, ref in refs.items():  # before any repair
            assert _rows(log.stream(name)) == ref, f"{window}: call {stop_at}"
        log.tier(now_ms=NOW)
        for name, ref in refs.items():
            stream = log.stream(name)
            assert _rows(stream) == ref
            segments = _manifest(path, name).segments
            assert all(seg.tiered for seg in segments)
            assert segments[-1].end_offset == stream.info().details["segments"][-1]["base_offset"]
        _check_tier_consistent(path, target)
    log.collect_garbage(grace_seconds=0)
    assert target.keys() == _referenced(path), "orphans survived garbage collection"
    for name, ref in refs.items():
        assert _rows(log.stream(name)) == ref
    log.close()


def _concurrent_round(
    tmp_path: Path, target: Target, *, writers: int, records: int, readers: int
) -> None:
    path = tmp_path / "log"
    stop = tmp_path / "stop"
    options = {"tier_storage_options": target.options} if target.options else {}
    with disklesslog.open(
        path,
        fsync="never",
        tier_url=target.url,
        tier_storage_options=target.options,
        segment_bytes=2048,
        index_interval_bytes=256,
        retention_bytes=20_000,
        local_retention_bytes=6_000,
    ) as log:
        log.create_stream("s")
    children: list[tuple[subprocess.Popen[bytes], Path]] = []

    def spawn(mode: str, *args: str, extra: dict[str, Any] | None = None) -> int:
        payload = json.dumps({**options, **(extra or {})})
        out = tmp_path / f"{mode}-{len(children)}.out"
        with open(out, "wb") as sink:  # files, not pipes: a full pipe would block a child
            child = subprocess.Popen(
                [sys.executable, str(WORKERS), mode, str(path), payload, *args],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        children.append((child, out))
        return len(children) - 1

    def finish(index: int) -> list[str]:
        child, out = children[index]
        try:
            child.wait(timeout=300)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGUSR1)  # its threads' stacks, into its output
            time.sleep(2)
            raise AssertionError(f"a child process hangs: {out.read_text()[-6000:]}") from None
        text = out.read_text()
        assert child.returncode == 0, f"a child process failed: {text[-3000:]}"
        return text.splitlines()

    try:
        maintainer = spawn("maintain", str(stop), extra={"grace": 0.5})
        reading = [spawn("read", str(stop)) for _ in range(readers)]
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob(f"{stop.name}.ready-*"))) < readers + 1:
            assert time.monotonic() < deadline, "readers or the maintainer never started"
            assert all(c.poll() is None for c, _ in children), "a child process died"
            time.sleep(0.01)
        writing = [spawn("write", str(records)) for _ in range(writers)]
        while any(children[i][0].poll() is None for i in writing):
            _check_tier_consistent(path, target)  # no object a manifest lists goes
            time.sleep(0.05)
        acked: dict[int, bytes] = {}
        for index in writing:
            for line in finish(index):
                _, offset, value = line.split()
                assert int(offset) not in acked, "two writers got one offset"
                acked[int(offset)] = bytes.fromhex(value)
        stop.touch()
        seen: dict[int, bytes] = {}
        reads = []
        for index in reading:
            for line in finish(index):
                kind, *rest = line.split()
                if kind == "reads":
                    reads.append(int(rest[0]))
                else:
                    offset, value = int(rest[0]), bytes.fromhex(rest[1])
                    assert seen.setdefault(offset, value) == value
        (rounds,) = finish(maintainer)
    finally:
        stop.touch()
        for child, _ in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert len(acked) == writers * records
    assert len(reads) == readers and min(reads) > 0 and int(rounds.split()[1]) > 0
    wrong = [offset for offset, value in seen.items() if acked[offset] != value]
    assert not wrong, f"readers saw wrong values at {wrong[:5]}"
    with disklesslog.open(path, fsync="never", tier_storage_options=target.options) as log:
        log.tier(now_ms=NOW)
        _check_tier_consistent(path, target)
        stream = log.stream("s")
        rows = list(stream.read())
        start = stream.start_offset
        assert 0 < start < _local_start(stream), "retention and tiering should both have run"
        assert [r.offset for r in rows] == list(range(start, writers * records))
        assert all(acked[r.offset] == r.value for r in rows), "an acknowledged record changed"
        log.collect_garbage(grace_seconds=0)
        assert target.keys() == _referenced(path)


def test_writers_readers_and_maintenance_in_several_processes(tmp_path: Path) -> None:
    """Two writers, two readers and a tier/retention/gc loop, each its own process,
    on one stream: no reader fails, no acknowledged record is lost or changed, no
    object a manifest still lists is deleted."""
    _concurrent_round(tmp_path, _file_target(tmp_path), writers=2, records=400, readers=2)


@pytest.mark.slow
@pytest.mark.s3
def test_writers_readers_and_maintenance_in_several_processes_on_s3(
    tmp_path: Path, s3_server: str
) -> None:
    _concurrent_round(tmp_path, _s3_target(s3_server), writers=3, records=1500, readers=2)


@pytest.mark.slow
def test_writers_readers_and_maintenance_longer(tmp_path: Path) -> None:
    _concurrent_round(tmp_path, _file_target(tmp_path), writers=3, records=4000, readers=3)


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    yield
    FaultyMemoryFileSystem.reset()
