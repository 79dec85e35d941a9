"""Helpers of the object-maintenance tests: reading a stream as rows, the reference model
of compaction, which objects a log references and stores. Imported by the tests and by
their spawned processes (``maintenance_workers.py``)."""

from __future__ import annotations

import disklesslog
from disklesslog.objects.log import ObjectLog

Row = tuple[int, int, bytes | None, bytes | None]  # offset, timestamp, key, value


def rows(log: disklesslog.Log, name: str) -> list[Row]:
    return [(r.offset, r.timestamp, r.key, r.value) for r in log.stream(name).read()]


def write(
    log: disklesslog.Log,
    name: str,
    items: list[tuple[bytes, bytes | None, int]],
    per_batch: int,
    *,
    flushes: int = 1,
) -> None:
    """Append ``(key, value, timestamp)`` items, ``per_batch`` to a batch, spread over
    ``flushes`` writer flushes (one WAL object each)."""
    step = -(-len(items) // flushes)
    for f in range(0, len(items), step):
        with log.writer(linger_ms=60_000) as writer:
            part = items[f : f + step]
            for i in range(0, len(part), per_batch):
                chunk = part[i : i + per_batch]
                writer.append_batch(
                    name,
                    [c[1] for c in chunk],
                    keys=[c[0] for c in chunk],
                    timestamps=[c[2] for c in chunk],
                )


def model(before: list[Row], compacted_below: int, horizon: int) -> list[Row]:
    """Compaction of offsets below ``compacted_below`` (the contract's reference model):
    every later row, and of the earlier ones the latest per key seen below it, without
    tombstones older than ``horizon``."""
    last: dict[bytes | None, int] = {}
    for offset, _, key, _ in before:
        if offset < compacted_below:
            last[key] = offset
    return [
        row
        for row in before
        if row[0] >= compacted_below or (last[row[2]] == row[0] and not _expired(row, horizon))
    ]


def _expired(row: Row, horizon: int) -> bool:
    return row[3] is None and row[1] < horizon


def as_objects(log: disklesslog.Log) -> ObjectLog:
    assert isinstance(log, ObjectLog)
    return log


def referenced(log: disklesslog.Log) -> set[str]:
    """Keys of the objects holding a live batch of any stream."""
    objects = as_objects(log)
    return {b.object_key for s in objects.streams() for b in objects.live_batches(s)}


def stored(log: disklesslog.Log) -> set[str]:
    """Keys of the files in the log's data folder."""
    return set(as_objects(log).storage.list_objects())


def objects_per_stream(log: disklesslog.Log, name: str) -> int:
    return len({b.object_key for b in as_objects(log).live_batches(name)})
