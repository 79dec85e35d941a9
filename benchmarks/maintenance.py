"""Maintenance workloads: what key compaction and object merging cost, beside the least
any rewrite of the same data can cost.

Groups (``./dev bench --only NAME``, or ``--only maintenance`` for all):

``maint-compact``  one compacted stream of 1,000,000 100-byte values over 10,000 keys
                   (each written 100 times on average), on small segments / objects: ``log.compact(
                   force=True)`` on a local log and on a ``file://`` object log (SQLite
                   sequencer), beside (A) a raw copy of the stream's bytes, the I/O floor
                   of any rewrite, and (B) decoding every batch and encoding it again, the
                   format's own floor. Rate: records of the stream per second.
``maint-merge``    a ``file://`` object log of 200 WAL objects (writer flushes over 50
                   streams): ``log.merge()`` into per-stream objects, beside a raw copy of
                   the same objects' bytes; objects a full read of a stream touches before
                   and after.
``maint-merge-read`` what merging buys a reader: 4 writers interleaved over 100 streams
                   (400 WAL objects); reading the 100,000 records of one stream before
                   merging (the baseline) and after, with no block cache: wall time and
                   GETs.
``maint-tier``     a local stream of 100-byte records on 1 MiB segments, tiered to a
                   ``file://`` tier with nothing kept locally but the active segment: a
                   full read through the tier with the block cache empty (cold) and
                   filled (cached), beside (A) the same read of an untiered copy.

Each repetition copies a log built once per group (untimed), so every run compacts or
merges the same bytes.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from common import Variant
from measured import Collect, Column, Extras, MeasuredGroup, MeasuredResult
from objects import PlanLike

import disklesslog
from disklesslog.format import encode_batch
from disklesslog.storage.cache import default_cache

GROUP_KEYS = ("maint-compact", "maint-merge", "maint-merge-read", "maint-tier")

VALUE_SIZE = 100
KEYS = 10_000
STREAM = "table"
NOW = 4_000_000_000_000  # ms: far enough ahead that merging's age rule never waits
COMPACTED = {"cleanup_policy": "compact", "segment_bytes": 1 << 20}


# ------------------------------------------------------------------- compaction


@dataclass
class CompactData:
    local: Path  # a local log holding the stream
    objects: Path  # a file:// object log holding the same records
    records: int
    bytes: int  # the local stream's size


def _fill(log: disklesslog.Log, records: int) -> None:
    rng = random.Random(7)
    value = os.urandom(VALUE_SIZE)
    with log.writer(linger_ms=60_000) as writer:
        for i in range(0, records, 500):
            keys = [b"key-%06d" % rng.randrange(KEYS) for _ in range(500)]
            writer.append_batch(STREAM, [value] * 500, keys=keys)
            if i % 50_000 == 0:
                writer.flush()  # several objects on object storage


@contextmanager
def compact_data(directory: Path, *, records: int) -> Iterator[CompactData]:
    local, objects = directory / "local", directory / "objects"
    with disklesslog.open(local, fsync="never", **COMPACTED) as log:
        _fill(log, records)
        size = log.stream(STREAM).info().size_bytes
    with disklesslog.open(f"file://{objects}", backend="objects", **COMPACTED) as log:
        _fill(log, records)
    yield CompactData(local, objects, records, size)


def _copy(data_dir: Path, work: Path) -> Path:
    target = work / data_dir.name
    shutil.copytree(data_dir, target)
    return target


@contextmanager
def raw_copy(work: Path, data: CompactData) -> Iterator[Callable[[], None]]:
    """Read every file of the stream and write it to a new directory (no fsync)."""
    source = data.local / "streams" / STREAM

    def run() -> None:
        target = work / "copy"
        target.mkdir()
        for path in source.iterdir():
            (target / path.name).write_bytes(path.read_bytes())

    yield run


@contextmanager
def decode_encode(work: Path, data: CompactData) -> Iterator[Callable[[], None]]:
    """Decode every batch of the stream (read_batches) and encode it again in memory."""
    log = disklesslog.open(data.local, create=False)

    def run() -> None:
        for batch in log.stream(STREAM).read_batches():
            encode_batch(batch.values, batch.keys, timestamps=list(batch.timestamps))

    try:
        yield run
    finally:
        log.close()


@contextmanager
def dl_compact(work: Path, data: CompactData, *, backend: str) -> Iterator[Callable[[], Collect]]:
    """``log.compact(force=True)`` on a fresh copy of the prepared log."""
    if backend == "segments":
        log = disklesslog.open(_copy(data.local, work), fsync="never", create=False)
    else:
        url = f"file://{_copy(data.objects, work)}"
        log = disklesslog.open(url, backend="objects", create=False)

    def run() -> Collect:
        report = log.compact(force=True)

        def collect() -> Extras:
            kept = sum(len(b) for b in log.stream(STREAM).read_batches())
            return {
                "removed_pct": 100 * report.records_removed / data.records,
                "kept": kept,
                "mb_written": report.bytes_written / 1e6,
            }

        return collect

    try:
        yield run
    finally:
        log.close()


RAW = "raw copy of the stream's files"
DECODE = "decode every batch and encode it again"


def compact_group(plan: PlanLike) -> MeasuredGroup:
    records = plan.n(1_000_000, 100_000)

    def variant(
        name: str, role: str, prepare: Any, tag: str = "", vs: str | None = None
    ) -> Variant:
        return Variant(name, role, prepare, records, records * VALUE_SIZE, tag=tag, vs=vs)

    return MeasuredGroup(
        key="maint-compact",
        title=f"key compaction: {records:,} records of {VALUE_SIZE} B over {KEYS:,} keys, "
        "1 MiB segments",
        shared=partial(compact_data, records=records),
        note="timed: one compact(force=True) pass over a fresh copy of the log (fsync "
        "never; object log on file:// with its SQLite sequencer); rate = records of the "
        "stream / second; kept = records after the pass",
        columns=[
            Column("removed_pct", "% removed", ".1f"),
            Column("kept", "kept", ",.0f"),
            Column("mb_written", "MB written", ".1f"),
        ],
        variants=[
            variant(RAW, "baseline", raw_copy, tag="A"),
            variant(DECODE, "baseline", decode_encode, tag="B"),
            variant(
                "compact, local segments",
                "subject",
                partial(dl_compact, backend="segments"),
                vs=RAW,
            ),
            variant(
                "compact, object log on file://",
                "subject",
                partial(dl_compact, backend="objects"),
                vs=RAW,
            ),
        ],
    )


# ---------------------------------------------------------------------- merging


MERGE_STREAMS = 50
MERGE_FLUSHES = 200


@contextmanager
def merge_data(directory: Path, *, per_flush: int) -> Iterator[Path]:
    """A file:// object log of MERGE_FLUSHES WAL objects, each with a batch of every stream."""
    path = directory / "objects"
    value = os.urandom(VALUE_SIZE)
    with disklesslog.open(f"file://{path}", backend="objects") as log:
        for _ in range(MERGE_FLUSHES):
            with log.writer(linger_ms=60_000) as writer:
                for s in range(MERGE_STREAMS):
                    writer.append_batch(f"s{s:02d}", [value] * per_flush)
    yield path


def _objects_per_stream(log: disklesslog.Log) -> float:
    total = 0
    for name in log.streams():
        total += len({b.object_key for b in log.live_batches(name)})  # type: ignore[attr-defined]
    return total / len(log.streams())


@contextmanager
def raw_object_copy(work: Path, data: Path) -> Iterator[Callable[[], None]]:
    """Read every WAL object and write its bytes to a new file (the merge's I/O floor)."""
    sources = sorted((data / "objects").iterdir())

    def run() -> None:
        target = work / "copy"
        target.mkdir()
        for path in sources:
            (target / path.name).write_bytes(path.read_bytes())

    yield run


@contextmanager
def dl_merge(work: Path, data: Path) -> Iterator[Callable[[], Collect]]:
    url = f"file://{_copy(data, work)}"
    log = disklesslog.open(url, backend="objects", create=False)
    before = _objects_per_stream(log)

    def run() -> Collect:
        report = log.merge(now_ms=NOW)

        def collect() -> Extras:
            return {
                "objects_before": before,
                "objects_after": _objects_per_stream(log),
                "mb_written": report.bytes_written / 1e6,
            }

        return collect

    try:
        yield run
    finally:
        log.close()


MERGE_RAW = "raw copy of the WAL objects"


def merge_group(plan: PlanLike) -> MeasuredGroup:
    per_flush = plan.n(100, 20)
    records = per_flush * MERGE_STREAMS * MERGE_FLUSHES
    return MeasuredGroup(
        key="maint-merge",
        title=f"object merging: {MERGE_FLUSHES} WAL objects x {MERGE_STREAMS} streams x "
        f"{per_flush} records of {VALUE_SIZE} B, file:// (SQLite sequencer)",
        shared=partial(merge_data, per_flush=per_flush),
        note="timed: one merge() over a fresh copy of the log; objects/stream = distinct "
        "objects a full read of one stream touches (mean over streams)",
        columns=[
            Column("objects_before", "objects/stream before", ".1f"),
            Column("objects_after", "objects/stream after", ".1f"),
            Column("mb_written", "MB written", ".1f"),
        ],
        summary=_merge_summary,
        variants=[
            Variant(
                MERGE_RAW,
                "baseline",
                raw_object_copy,
                records,
                records * VALUE_SIZE,
                tag="A",
            ),
            Variant("merge", "subject", dl_merge, records, records * VALUE_SIZE, vs=MERGE_RAW),
        ],
    )


def _merge_summary(result: MeasuredResult) -> list[str]:
    before = result.median("merge", "objects_before")
    after = result.median("merge", "objects_after")
    if before is None or after is None:
        return []
    return [f"a stream's full read touches {before:.0f} objects before merging, {after:.0f} after"]


# ----------------------------------------------------------- reads after merging


READ_STREAMS = 100
READ_WRITERS = 4
READ_FLUSHES = 100  # per writer
HOT = "hot"


@contextmanager
def merge_read_data(directory: Path, *, hot_per_flush: int) -> Iterator[tuple[Path, Path]]:
    """Two copies of one file:// object log written by READ_WRITERS threads at once, each
    flush holding a batch of every stream (``hot_per_flush`` records of HOT, a tenth of
    that of each other stream): one left as written, one merged."""
    path = directory / "objects"
    value = os.urandom(VALUE_SIZE)
    cold = max(1, hot_per_flush // 10)
    with disklesslog.open(f"file://{path}", backend="objects") as log:
        for s in range(READ_STREAMS - 1):
            log.create_stream(f"s{s:02d}")
        log.create_stream(HOT)

        def write() -> None:
            with log.writer(linger_ms=60_000) as writer:
                for _ in range(READ_FLUSHES):
                    writer.append_batch(HOT, [value] * hot_per_flush)
                    for s in range(READ_STREAMS - 1):
                        writer.append_batch(f"s{s:02d}", [value] * cold)
                    writer.flush()

        threads = [threading.Thread(target=write) for _ in range(READ_WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    merged = directory / "merged"
    shutil.copytree(path, merged)
    with disklesslog.open(f"file://{merged}", backend="objects", create=False) as log:
        log.merge(now_ms=NOW)
    yield path, merged


@contextmanager
def read_hot(
    work: Path, data: tuple[Path, Path], *, merged: bool
) -> Iterator[Callable[[], Collect]]:
    """Read every record of HOT with no block cache; count the GETs it took."""
    log = disklesslog.open(f"file://{data[merged]}", backend="objects", create=False, cache=None)

    def run() -> Collect:
        before = log.metrics().get("gets", 0)
        count = sum(len(batch) for batch in log.stream(HOT).read_batches())

        def collect() -> Extras:
            return {"gets": log.metrics()["gets"] - before, "records": count}

        return collect

    try:
        yield run
    finally:
        log.close()


UNMERGED = "read before merging"


def merge_read_group(plan: PlanLike) -> MeasuredGroup:
    hot_per_flush = plan.n(250, 50)
    records = hot_per_flush * READ_FLUSHES * READ_WRITERS
    return MeasuredGroup(
        key="maint-merge-read",
        title=f"reading one stream of {records:,} records of {VALUE_SIZE} B written by "
        f"{READ_WRITERS} interleaved writers over {READ_STREAMS} streams, before and after "
        "merging; file:// (SQLite sequencer), no block cache",
        shared=partial(merge_read_data, hot_per_flush=hot_per_flush),
        note="timed: one full read_batches() of the stream; GETs = ranged reads it made",
        columns=[Column("gets", "GETs", ",.0f"), Column("records", "records", ",.0f")],
        variants=[
            Variant(
                UNMERGED,
                "baseline",
                partial(read_hot, merged=False),
                records,
                records * VALUE_SIZE,
                tag="A",
            ),
            Variant(
                "read after merging",
                "subject",
                partial(read_hot, merged=True),
                records,
                records * VALUE_SIZE,
                vs=UNMERGED,
            ),
        ],
    )


# ---------------------------------------------------------------------- tiering


TIER_CONFIG = {"segment_bytes": 1 << 20, "local_retention_bytes": 1}


@contextmanager
def tier_data(directory: Path, *, records: int) -> Iterator[tuple[Path, Path]]:
    """A local log holding one stream, and a copy of it tiered to ``file://`` with only
    the active segment kept locally."""
    plain, tiered = directory / "plain", directory / "tiered"
    value = os.urandom(VALUE_SIZE)
    with disklesslog.open(plain, fsync="never", **TIER_CONFIG) as log:
        stream = log.create_stream(STREAM)
        for _ in range(0, records, 1_000):
            stream.append_batch([value] * 1_000)
    shutil.copytree(plain, tiered)
    with disklesslog.open(tiered, fsync="never", tier_url=f"file://{directory}/tier") as log:
        log.tier(now_ms=NOW)
    local = list((tiered / "streams" / STREAM).glob("*.log"))
    assert len(local) == 1, f"expected only the active segment left locally, not {local}"
    yield plain, tiered


@contextmanager
def read_tier(
    work: Path, data: tuple[Path, Path], *, tiered: bool, cached: bool
) -> Iterator[Callable[[], Collect]]:
    """Read the whole stream; for the tiered log with the block cache emptied first
    (cold) or already holding every block (cached)."""
    log = disklesslog.open(data[tiered], fsync="never", create=False)
    stream = log.stream(STREAM)
    if cached:
        sum(len(batch) for batch in stream.read_batches())

    def run() -> Collect:
        if tiered and not cached:
            default_cache().clear()
        count = sum(len(batch) for batch in stream.read_batches())

        def collect() -> Extras:
            return {"records": count}

        return collect

    try:
        yield run
    finally:
        log.close()


LOCAL_READ = "read of an untiered local log"


def tier_group(plan: PlanLike) -> MeasuredGroup:
    records = plan.n(500_000, 100_000)

    def variant(name: str, role: str, tiered: bool, cached: bool, tag: str = "") -> Variant:
        prepare = partial(read_tier, tiered=tiered, cached=cached)
        vs = None if role == "baseline" else LOCAL_READ
        return Variant(name, role, prepare, records, records * VALUE_SIZE, tag=tag, vs=vs)

    return MeasuredGroup(
        key="maint-tier",
        title=f"reading a stream of {records:,} records of {VALUE_SIZE} B, 1 MiB segments, "
        "all but the active segment tiered to file://",
        shared=partial(tier_data, records=records),
        note="timed: one full read_batches(); cold = the process-wide block cache emptied "
        "before the read (the tier's files are in the page cache, as a local log's are)",
        columns=[Column("records", "records", ",.0f")],
        variants=[
            variant(LOCAL_READ, "baseline", tiered=False, cached=False, tag="A"),
            variant("tiered read, block cache cold", "subject", tiered=True, cached=False),
            variant("tiered read, block cache warm", "subject", tiered=True, cached=True),
        ],
    )


def maintenance_groups(plan: PlanLike) -> list[MeasuredGroup]:
    return [compact_group(plan), merge_group(plan), merge_read_group(plan), tier_group(plan)]
