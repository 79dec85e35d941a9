"""Code that runs in child processes for the local compaction tests: a writer, a reader
and a compactor working on one stream at once (imported by ``multiprocessing`` with
the spawn start method)."""

from __future__ import annotations

import random
import time
import zlib
from pathlib import Path

import disklesslog

NOW = 50_000_000
SEGMENT_BYTES = 4096
INDEX_INTERVAL = 256
DELETE_RETENTION_MS = 10_000
CONFIG: dict[str, object] = {
    "cleanup_policy": "compact",
    "segment_bytes": SEGMENT_BYTES,
    "index_interval_bytes": INDEX_INTERVAL,
    "delete_retention_ms": DELETE_RETENTION_MS,
}
KEYS = 40


def value_for(key: bytes, seq: int) -> bytes:
    """A value naming its key and sequence number (readers check the key part)."""
    return b"%s@%d-" % (key, seq) + b"v" * (seq * 37 % 90)


def write(directory: str, count: int, seed: int) -> list[tuple[int, bytes, bytes]]:
    """Append ``count`` keyed records in small batches; return every acknowledged
    ``(offset, key, value)``."""
    rng = random.Random(seed)
    acked: list[tuple[int, bytes, bytes]] = []
    with disklesslog.open(directory, fsync="never") as log:
        stream = log.create_stream("s", **CONFIG)
        seq = 0
        while seq < count:
            n = min(count - seq, rng.choice([1, 3, 10]))
            keys = [b"k%02d" % rng.randrange(KEYS) for _ in range(n)]
            values = [value_for(key, seq + i) for i, key in enumerate(keys)]
            offsets = stream.append_batch(values, keys=keys, timestamps=NOW)
            acked += zip(offsets, keys, values)
            seq += n
    return acked


def read(directory: str, stop: str) -> tuple[str, dict[int, int], int]:
    """Read the whole stream again and again until ``stop`` exists. Returns the first
    problem seen ("" if none), the CRC of the value seen at each offset, and how many
    complete reads were made. Every read must be in offset order with values that
    match their keys, and an offset must always hold the same value."""
    seen: dict[int, int] = {}
    reads = 0
    with disklesslog.open(directory, fsync="never") as log:
        stream = log.stream("s")
        Path(f"{stop}.reader-ready").touch()
        while not Path(stop).exists():
            last = -1
            try:
                for record in stream.read():
                    if record.offset <= last:
                        return f"offset {record.offset} after {last}", seen, reads
                    last = record.offset
                    if record.key is None or record.value is None:
                        return f"offset {record.offset}: no key or value", seen, reads
                    if not record.value.startswith(record.key + b"@"):
                        return f"offset {record.offset}: {record.value[:20]!r}", seen, reads
                    crc = zlib.crc32(record.value)
                    if seen.setdefault(record.offset, crc) != crc:
                        return f"offset {record.offset} changed its value", seen, reads
            except disklesslog.StreamNotFound:
                continue  # not created yet
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}", seen, reads
            reads += 1
    return "", seen, reads


def compact(directory: str, stop: str) -> tuple[str, int]:
    """Compact (forced) again and again until ``stop`` exists. Returns the first error
    ("" if none) and the number of passes that rewrote segments."""
    passes = 0
    with disklesslog.open(directory, fsync="never") as log:
        Path(f"{stop}.compactor-ready").touch()
        while not Path(stop).exists():
            try:
                if "s" in log.streams():
                    passes += int(log.compact("s", now_ms=NOW, force=True).changed)
                else:
                    time.sleep(0.01)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}", passes
    return "", passes
