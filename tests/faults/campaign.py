"""Fault campaigns: writers, readers and maintenance against a log whose storage fails.

One campaign opens a log on ``faulty://`` storage (:mod:`disklesslog.testing.faults`),
then for some rounds appends through ``log.writer()``, ``Stream.append`` and
``Stream.append_batch``, reads every stream, and runs merging, compaction, retention
and garbage collection, all while calls fail, lose their responses, time out and
return damaged bytes. Every public call must return or raise a ``DisklessLogError``.
Then faults stop, the log is closed and opened again (a fresh handle: the object-store
sequencer replays its entries), and the model is checked:

* every acknowledged record reads back, at its acknowledged offset, with its value;
* no record appears twice, and nothing appears that was never appended;
* no offset was acknowledged twice; a record whose append failed may be there (its
  outcome was unknown) or not, but only once;
* ``read_offsets`` agrees with ``read``, ``end_offset`` is past every acknowledged
  record, and a new append after the reopen gets an offset no one was given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fsspec

import disklesslog
from disklesslog import AbstractLog
from disklesslog.testing.faults import FaultyFileSystem

from .rule import TYPED, VIOLATION, Ledger

STREAMS = ("a", "b", "c")
COMPACTED = "c"
"""The stream created with ``cleanup_policy="compact"`` (unique keys: nothing is
superseded, so compaction must keep every record while it rewrites)."""


@dataclass
class Model:
    """What the writers were told."""

    acked: dict[tuple[str, int], bytes] = field(default_factory=dict)
    unknown: set[bytes] = field(default_factory=set)
    appended: set[bytes] = field(default_factory=set)
    duplicates: list[str] = field(default_factory=list)

    def ack(self, stream: str, offset: int, value: bytes) -> None:
        if (stream, offset) in self.acked:
            self.duplicates.append(
                f"offset {offset} of {stream} acknowledged twice: "
                f"{self.acked[(stream, offset)]!r} and {value!r}"
            )
        self.acked[(stream, offset)] = value


PADDING = b"p" * 200
"""Makes segments roll (and tier) within a few rounds."""

OpenLog = Callable[[], AbstractLog]


def faulty_fs(options: dict[str, Any]) -> FaultyFileSystem:
    """The (cached) instance a log opened with these storage options uses."""
    fs = fsspec.filesystem("faulty", **options)
    assert isinstance(fs, FaultyFileSystem)
    return fs


def run_campaign(
    ledger: Ledger,
    open_log: OpenLog,
    fs: FaultyFileSystem,
    *,
    rounds: int,
    per_round: int,
    objects: bool = True,
    tier: bool = False,
) -> Model:
    model = Model()
    fs.enabled = False
    log = open_log()
    for name in STREAMS:
        policy = "compact" if name == COMPACTED else "delete"
        log.create_stream(name, cleanup_policy=policy, segment_bytes=4096)
    fs.enabled = True
    serial = 0

    def payload(kind: str) -> bytes:
        nonlocal serial
        serial += 1
        value = b"%s-%06d-" % (kind.encode(), serial) + PADDING
        model.appended.add(value)
        return value

    for round_ in range(rounds):
        # 1. a buffering writer
        try:
            writer = log.writer(linger_ms=1)
        except BaseException as exc:
            ledger.exception("writer", exc, "log.writer()")
            writer = None
        if writer is not None:
            pending = []
            for i in range(per_round):
                stream = STREAMS[i % len(STREAMS)]
                value = payload("w")
                try:
                    future = writer.append(stream, value, key=value)
                except BaseException as exc:
                    ledger.exception("writer.append", exc, "Writer.append")
                    model.unknown.add(value)
                    continue
                pending.append((stream, value, future))
            for call, name in ((writer.flush, "flush"), (writer.close, "close")):
                try:
                    call()
                except BaseException as exc:
                    ledger.exception("writer." + name, exc, f"Writer.{name}")
            for stream, value, future in pending:
                try:
                    offset = future.result(timeout=60)
                except BaseException as exc:
                    ledger.exception("writer.future", exc, "Writer future")
                    model.unknown.add(value)
                    continue
                model.ack(stream, offset, value)
                ledger.add("writer.future", "acked")
        # 2. Stream.append and append_batch
        for i in range(max(1, per_round // 8)):
            stream = STREAMS[(i + round_) % len(STREAMS)]
            value = payload("s")
            try:
                offset = log.stream(stream).append(value, key=value)
            except BaseException as exc:
                ledger.exception("stream.append", exc, "Stream.append")
                model.unknown.add(value)
                continue
            model.ack(stream, offset, value)
            ledger.add("stream.append", "acked")
        values = [payload("b") for _ in range(3)]
        stream = STREAMS[round_ % len(STREAMS)]
        try:
            offsets = log.stream(stream).append_batch(values, keys=values)
        except BaseException as exc:
            ledger.exception("stream.append_batch", exc, "Stream.append_batch")
            model.unknown.update(values)
        else:
            for offset, value in zip(offsets, values):
                model.ack(stream, offset, value)
            ledger.add("stream.append_batch", "acked")
        # 3. reads under faults: right or a typed error
        for name in STREAMS:
            check_read_under_faults(ledger, log, name, model)
        # 4. maintenance under faults
        maintenance(ledger, log, objects=objects, tier=tier)

    # Faults off; a fresh handle sees everything.
    fs.enabled = False
    try:
        log.close()
    except BaseException as exc:
        ledger.exception("close", exc, "Log.close")
    reopened = open_log()
    try:
        verify(ledger, reopened, model)
    finally:
        reopened.close()
    stats = fs.stats()
    ledger.figures.update({k: v for k, v in stats.items() if not k.startswith("calls.")})
    ledger.figures["calls"] += sum(v for k, v in stats.items() if k.startswith("calls."))
    ledger.figures["acknowledged"] += len(model.acked)
    ledger.figures["unknown_outcome"] += len(model.unknown)
    return model


def maintenance(ledger: Ledger, log: AbstractLog, *, objects: bool, tier: bool) -> None:
    later = int(time.time() * 1000) + 3_600_000
    ops: list[tuple[str, Callable[[], Any]]] = [("compact", lambda: log.compact(force=True))]
    if objects:
        ops.append(("merge", lambda: log.merge(now_ms=later)))
    if tier:
        ops.append(("tier", log.tier))
    ops.append(("collect_garbage", lambda: log.collect_garbage(grace_seconds=0)))
    for name, call in ops:
        try:
            call()
        except BaseException as exc:
            ledger.exception("maintenance." + name, exc, f"Log.{name}")
        else:
            ledger.add("maintenance." + name, "done")


def check_read_under_faults(ledger: Ledger, log: AbstractLog, name: str, model: Model) -> None:
    try:
        records = [(r.offset, r.value) for r in log.stream(name).read()]
    except BaseException as exc:
        ledger.exception("read", exc, f"read {name} under faults")
        return
    bad = [
        (offset, value)
        for offset, value in records
        if (name, offset) in model.acked and model.acked[(name, offset)] != value
    ]
    bad += [(o, v) for o, v in records if v not in model.appended]
    if bad:
        ledger.add("read", VIOLATION, f"read {name} under faults returned wrong records {bad[:3]}")
    else:
        ledger.add("read", "right")


def verify(ledger: Ledger, log: AbstractLog, model: Model) -> None:
    for line in model.duplicates:
        ledger.add("verify.offsets", VIOLATION, line)
    seen: dict[bytes, tuple[str, int]] = {}
    for name in STREAMS:
        stream = log.stream(name)
        try:
            records = [(r.offset, r.value) for r in stream.read()]
            offsets = [o for batch in stream.read_offsets() for o in batch]
            end = stream.end_offset
        except BaseException as exc:
            outcome = ledger.exception("verify.read", exc, f"read {name} after faults")
            if outcome == TYPED:  # an honest error is still data the reader cannot get
                ledger.add("verify.read", VIOLATION, f"{name} unreadable after faults: {exc}")
            continue
        got = dict(records)
        if offsets != [o for o, _ in records]:
            ledger.add("verify.read_offsets", VIOLATION, f"{name}: read_offsets != read")
        for (stream_name, offset), value in model.acked.items():
            if stream_name != name:
                continue
            if got.get(offset) != value:
                ledger.add(
                    "verify.acked",
                    VIOLATION,
                    f"acknowledged {value!r} at {name}@{offset} reads back as {got.get(offset)!r}",
                )
            else:
                ledger.add("verify.acked", "read back")
        for offset, value in records:
            if value is None or value not in model.appended:
                ledger.add("verify.extra", VIOLATION, f"{name}@{offset} holds {value!r}")
            elif value in seen:
                ledger.add(
                    "verify.duplicate", VIOLATION, f"{value!r} at {seen[value]} and {name}@{offset}"
                )
            seen[value] = (name, offset)
        acked_here = [o for (s, o) in model.acked if s == name]
        if acked_here and end <= max(acked_here):
            ledger.add(
                "verify.end", VIOLATION, f"{name}: end offset {end} <= acked {max(acked_here)}"
            )
        try:
            fresh = stream.append(b"after-" + name.encode())
        except BaseException as exc:
            ledger.exception("verify.append", exc, f"append to {name} after faults")
            continue
        if fresh < end or (name, fresh) in model.acked:
            ledger.add("verify.append", VIOLATION, f"{name}: offset {fresh} handed out again")
    visible_unknown = sum(1 for v in model.unknown if v in seen)
    ledger.figures["unknown_visible"] += visible_unknown


def open_faulty(url: str, options: dict[str, Any], **log_options: Any) -> OpenLog:
    def open_log() -> AbstractLog:
        return disklesslog.open(url, storage_options=options, **log_options)

    return open_log
