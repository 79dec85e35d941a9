"""What a writer's pipeline buys: overlapping uploads and group commits of one writer.

Group ``obj-pipeline`` (``./dev bench --only obj-pipeline``): one ``log.writer()`` is fed
64 MiB of 1 KiB records as fast as it accepts them (back-pressure bounds the buffer) and
cuts 1 MiB objects. The log is on ``faulty-memory://`` with 20 ms injected into every PUT,
and its sequencer is the object-store sequencer inside the log, so a commit entry costs a
PUT as well: the shape of a writer on a cloud bucket with no server at all.

* ``max_inflight=1`` (the baseline): one flush at a time, upload then commit, as the writer
  worked before pipelining; every flush pays two PUT latencies in a row.
* ``max_inflight=4`` (the default): up to four objects upload at once while commits go in
  flush order; flushes uploaded while a commit is under way are committed together, in
  one sequencer entry.

Reported per repetition: MB/s of record values, flushes (objects) per second, sequencer
entries per flush (below 1 means group commits), and commit calls per flush.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from common import Variant
from measured import Collect, Column, Extras, MeasuredGroup, MeasuredResult, delta
from objects import PlanLike

import disklesslog

GROUP_KEYS = ("obj-pipeline",)

PUT_DELAY = 0.02
OBJECT_BYTES = 1 << 20
RECORD_BYTES = 1024
STREAMS = 8


@contextmanager
def pipelined_writer(
    work: Path, shared: Any, *, max_inflight: int, records: int
) -> Iterator[Callable[[], Collect]]:
    """A fresh log per repetition; the timed run appends ``records`` records round robin
    over 8 streams through one writer and waits for the last acknowledgement."""
    import fsspec

    from disklesslog.testing import FaultyMemoryFileSystem

    FaultyMemoryFileSystem.reset()
    url = f"faulty-memory://dl-bench-{uuid.uuid4().hex}/log"
    values = [os.urandom(RECORD_BYTES) for _ in range(256)]
    names = [f"s{i}" for i in range(STREAMS)]
    log = disklesslog.open(url, sequencer="objectstore://")
    writer = None
    try:
        for name in names:
            log.create_stream(name)
        FaultyMemoryFileSystem.put_delay = PUT_DELAY
        writer = log.writer(linger_ms=5, max_object_bytes=OBJECT_BYTES, max_inflight=max_inflight)
        sequencer: Any = log.sequencer
        before, tail = log.metrics(), sequencer.tail

        def run() -> Collect:
            assert writer is not None
            append = writer.append
            for i in range(records):
                append(names[i % STREAMS], values[i & 255])
            writer.flush()

            def collect() -> Extras:
                d = delta(log.metrics(), before)
                flushes = d.get("committed_objects", 0)
                entries = sequencer.tail - tail
                return {
                    "flushes": flushes,
                    "entries_per_flush": entries / flushes,
                    "commits_per_flush": d.get("commits", 0) / flushes,
                    "puts_per_flush": (d.get("puts", 0)) / flushes,
                    "restamped": d.get("restamped_flushes", 0),
                }

            return collect

        yield run
    finally:
        FaultyMemoryFileSystem.put_delay = 0.0
        if writer is not None:
            writer.close()
        log.close()
        fs, root = fsspec.core.url_to_fs(url)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(root.rsplit("/", 1)[0], recursive=True)
        FaultyMemoryFileSystem.reset()


ONE = "max_inflight=1: one flush at a time (upload, then commit)"
FOUR = "max_inflight=4 (default): uploads overlap, waiting flushes committed together"


def _summary(result: MeasuredResult) -> list[str]:
    one, four = result.median(ONE, "rate"), result.median(FOUR, "rate")
    entries = result.median(FOUR, "entries_per_flush")
    if one is None or four is None or entries is None:
        return []
    return [
        f"pipelined / one at a time: **{four / one:.2f}x** the throughput; "
        f"{entries:.2f} sequencer entries per flush with max_inflight=4 (group commits)"
    ]


def pipeline_group(plan: PlanLike) -> MeasuredGroup:
    records = plan.n(65_536, 16_384)  # 64 MiB (16 MiB quick) of 1 KiB records
    variants = [
        Variant(
            name,
            role,
            partial(pipelined_writer, max_inflight=inflight, records=records),
            records,
            records * RECORD_BYTES,
            vs=ONE,
            tag="1 in flight" if role == "baseline" else "",
            note=f"{records * RECORD_BYTES >> 20} MiB",
        )
        for name, role, inflight in ((ONE, "baseline", 1), (FOUR, "subject", 4))
    ]
    return MeasuredGroup(
        key="obj-pipeline",
        title=f"one writer, {OBJECT_BYTES >> 20} MiB objects, {PUT_DELAY * 1000:.0f} ms "
        "injected into every PUT (objects and sequencer entries)",
        note=f"faulty-memory:// (put_delay {PUT_DELAY}) with the object-store sequencer in the "
        f"log; 1 KiB records round robin over {STREAMS} streams, appended as fast as the "
        "writer accepts them (linger 5 ms, max_object_bytes 1 MiB); the clock stops at the "
        "last acknowledgement (flush())",
        columns=[
            Column("flushes", "flushes", ",.0f"),
            Column("entries_per_flush", "entries/flush", ".2f"),
            Column("commits_per_flush", "commit calls/flush", ".2f"),
            Column("puts_per_flush", "PUTs/flush", ".2f"),
        ],
        summary=_summary,
        variants=variants,
    )
