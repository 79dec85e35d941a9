"""Maintenance workloads: what key compaction and object merging cost, beside the least
any rewrite of the same data can cost.

Groups (``./dev bench --only NAME``, or ``--only maintenance`` for all):

``maint-compact``  one compacted stream of 100-byte values over 20,000 keys (each written
                   10 times on average), on small segments / objects: ``log.compact(
                   force=True)`` on a local log and on a ``file://`` object log (SQLite
                   sequencer), beside (A) a raw copy of the stream's bytes, the I/O floor
                   of any rewrite, and (B) decoding every batch and encoding it again, the
                   format's own floor. Rate: records of the stream per second.
``maint-merge``    a ``file://`` object log of 200 WAL objects (writer flushes over 50
                   streams): ``log.merge()`` into per-stream objects, beside a raw copy of
                   the same objects' bytes; objects a full read of a stream touches before
                   and after.

Each repetition copies a log built once per group (untimed), so every run compacts or
merges the same bytes.
"""

from __future__ import annotations

import os
import random
import shutil
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

GROUP_KEYS = ("maint-compact", "maint-merge")

VALUE_SIZE = 100
KEYS = 20_000
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
    records = plan.n(200_000, 40_000)

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


def maintenance_groups(plan: PlanLike) -> list[MeasuredGroup]:
    return [compact_group(plan), merge_group(plan)]
