"""Child-process code of the multi-process maintenance tests (spawn-imported): writers,
readers and maintainers working on one object log at once."""

from __future__ import annotations

import os
import random
import time
import traceback
from pathlib import Path
from typing import Any

import disklesslog
from disklesslog import OffsetOutOfRange, SequencerConflict

KEYED = "keyed"  # compacted
EVENTS = "events"  # retention by size
PLAIN = "plain"  # keeps everything
STREAMS = (KEYED, EVENTS, PLAIN)
KEYS = 25
PAD = b"." * 60
Acked = tuple[str, int, bytes | None, bytes]  # stream, offset, key, value


def start_together(gate: str | None, parties: int) -> None:
    """Wait until ``parties`` processes have reached this point (each leaves a file in
    the ``gate`` directory): spawned interpreters start at different times under load,
    and a time-bounded run only tests something while they overlap."""
    if gate is None:
        return
    Path(gate, f"{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(os.listdir(gate)) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(os.listdir(gate))} of {parties} processes started")
        time.sleep(0.01)


def key_of(value: bytes) -> bytes:
    """The key a keyed record's value names: values are ``key@writer-seq....``."""
    return value.split(b"@", 1)[0]


def write_for(
    url: str,
    sequencer: str,
    writer_no: int,
    seconds: float,
    gate: str | None = None,
    parties: int = 0,
) -> list[Acked]:
    """Append to every stream for ``seconds`` (after :func:`start_together`); returns
    each acknowledged record."""
    rng = random.Random(writer_no)
    pending: list[tuple[str, bytes | None, bytes, Any]] = []
    with (
        disklesslog.open(url, backend="objects", sequencer=sequencer) as log,
        log.writer(linger_ms=20) as writer,
    ):
        start_together(gate, parties)
        deadline = time.monotonic() + seconds
        seq = 0
        while time.monotonic() < deadline:
            key = b"k%02d" % rng.randrange(KEYS)
            tag = b"w%d-%06d" % (writer_no, seq)
            for stream, k, value in (
                (KEYED, key, key + b"@" + tag + PAD),
                (EVENTS, None, tag + PAD),
                (PLAIN, None, tag + PAD),
            ):
                pending.append((stream, k, value, writer.append(stream, value, key=k)))
            seq += 1
            time.sleep(0.004)
        writer.flush()
    return [(stream, future.result(), k, value) for stream, k, value, future in pending]


def read_for(
    url: str, sequencer: str, seconds: float, gate: str | None = None, parties: int = 0
) -> tuple[int, list[str]]:
    """Read every stream over and over for ``seconds``, whole and from random offsets,
    checking order, content, and that an offset always holds the same record. Returns
    ``(full reads, problems)``; reading below a start offset that retention just moved
    is not a problem (OffsetOutOfRange), anything else is."""
    rng = random.Random(99)
    seen: dict[str, dict[int, bytes]] = {s: {} for s in STREAMS}
    problems: list[str] = []
    reads = 0
    with disklesslog.open(url, backend="objects", sequencer=sequencer) as log:
        start_together(gate, parties)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(problems) < 10:
            for stream in STREAMS:
                handle = log.stream(stream)
                try:
                    if rng.random() < 0.5:
                        records = list(handle.read())
                        reads += 1
                    else:
                        start = rng.randrange(handle.start_offset, handle.end_offset + 1)
                        records = list(handle.read(start, max_records=rng.randrange(1, 200)))
                        if records and records[0].offset < start:
                            problems.append(f"{stream}: read from {start} began below it")
                except OffsetOutOfRange:
                    continue
                except Exception:
                    problems.append(f"{stream}: {traceback.format_exc()}")
                    continue
                last = -1
                for record in records:
                    value = record.value
                    if record.offset <= last:
                        problems.append(f"{stream}: offset {record.offset} after {last}")
                    last = record.offset
                    if value is None or (stream == KEYED and key_of(value) != record.key):
                        problems.append(f"{stream}: record {record} does not match its key")
                    if seen[stream].setdefault(record.offset, value) != value:
                        problems.append(f"{stream}: offset {record.offset} changed its record")
    return reads, problems


def maintain(log: disklesslog.Log, grace: float, target_bytes: int = 16 << 10) -> dict[str, int]:
    """One round of everything: compaction, merging (small runs at once, as if they had
    waited), retention, garbage collection. Returns its counts."""
    later = int(time.time() * 1000) + 3_600_000
    total = log.compact(force=True)
    total.merge(log.merge(target_bytes=target_bytes, now_ms=later))
    total.merge(log.apply_retention())
    total.merge(log.collect_garbage(grace_seconds=grace))
    return {
        "passes": 1,
        "records_removed": total.records_removed,
        "objects_written": total.objects_written,
        "objects_deleted": total.objects_deleted,
    }


def maintain_for(
    url: str,
    sequencer: str,
    seconds: float,
    grace: float,
    gate: str | None = None,
    parties: int = 0,
) -> tuple[dict[str, int], list[str]]:
    """Run :func:`maintain` over and over for ``seconds``; returns the summed counts and
    any failure (there must be none). A SequencerConflict (the object-store sequencer
    lost every race for its next entry to the other processes, and applied nothing) is
    counted, not a failure: every operation is resumable, the next round goes on."""
    counts: dict[str, int] = {"conflicts": 0}
    problems: list[str] = []
    with disklesslog.open(url, backend="objects", sequencer=sequencer) as log:
        start_together(gate, parties)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                for name, value in maintain(log, grace).items():
                    counts[name] = counts.get(name, 0) + value
            except SequencerConflict:
                counts["conflicts"] += 1
            except Exception:
                problems.append(traceback.format_exc())
                break
    return counts, problems
