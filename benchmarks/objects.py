"""Object-storage backend workloads: what a flush costs in PUTs, how long an append waits
for its acknowledgement, how fast the sequencer commits, how reads use the block cache,
and what the naive one-object-per-append approach costs on the same S3 server.

Groups (``./dev bench --only NAME``, or ``--only objects`` for these and the sequencer
commit rates of :mod:`sequencers`):

``obj-write``      Writer throughput, 100 B values round-robin over 100 streams, on
                   ``memory://`` (memory sequencer) and on a moto S3 server (SQLite
                   sequencer), beside a raw ``pipe_file`` of the same bytes and the naive
                   ``pipe_file`` per record; PUTs per flush and per 1,000 records.
``obj-latency``    append-to-acknowledge latency (p50/p90/p99/max) of producer threads
                   appending at a steady rate, with 50 ms injected into every PUT.
``obj-read``       reads of 100,000 records from S3, cold (a fresh process-wide cache) and
                   cached, with 1 reader and 8 reader threads; GETs per object and block.

The S3 groups start ``python -m moto.server`` on a free port of 127.0.0.1 for the
group and stop it at the end (also on Ctrl-C or SIGTERM); each repetition works in a
fresh bucket, deleted afterwards. ``memory://`` logs are removed after each repetition.

Besides its time, each repetition reports measurements (PUTs, commits, GETs, latency
percentiles, ...) read from ``log.metrics()`` or taken by the workload itself, after the
clock stopped: see :mod:`measured`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from itertools import cycle, islice
from pathlib import Path
from typing import Any, Protocol

from common import Variant
from measured import (
    Collect,
    Column,
    Extras,
    MeasuredGroup,
    MeasuredResult,
    MetricGoal,
    delta,
    percentiles,
)

import disklesslog
from disklesslog.sequencers.memory import MemorySequencer
from disklesslog.storage.cache import configure_default_cache

VALUE_SIZE = 100
OBJECT_BYTES = 8 << 20  # the writer's default max_object_bytes
BLOCK_SIZE = 4 << 20  # BlockCache's default block size


class PlanLike(Protocol):
    """What the group builders need of run.py's ``Plan``."""

    quick: bool

    def n(self, full: int, quick: int) -> int: ...


# ==================================================================== environments


@dataclass
class S3:
    """A running moto S3 server and an s3fs filesystem on it."""

    endpoint: str
    options: dict[str, Any]
    fs: Any

    def new_bucket(self) -> str:
        bucket = f"dl-bench-{uuid.uuid4().hex[:16]}"
        self.fs.mkdir(bucket)
        return bucket

    def remove_bucket(self, bucket: str) -> None:
        with contextlib.suppress(Exception):
            self.fs.rm(bucket, recursive=True)
        self.fs.invalidate_cache()


@contextmanager
def moto_s3() -> Iterator[S3]:
    """Start ``python -m moto.server`` on a free local port; stop it however we leave."""
    # moto runs in its own process: only check that it is installed (importing it here
    # would add ~23,000 objects to every garbage collection of the benchmark process).
    try:
        import s3fs
    except ImportError:
        s3fs = None
    if s3fs is None or importlib.util.find_spec("moto") is None:
        raise SystemExit(
            "the object-storage benchmarks need moto[server] and s3fs: "
            "pip install -e '.[dev]' (./dev bench installs them)"
        ) from None
    from disklesslog.testing import moto_s3_server, s3_storage_options

    with moto_s3_server() as endpoint:
        options = s3_storage_options(endpoint)
        # A private instance (skip_instance_cache): the logs' s3fs instances stay separate.
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        yield S3(endpoint, options, fs)


@contextmanager
def s3_log(s3: S3, work: Path, **options: Any) -> Iterator[disklesslog.Log]:
    """A log in a fresh bucket, sequenced by SQLite in ``work``; the bucket is removed."""
    bucket = s3.new_bucket()
    log = disklesslog.open(
        f"s3://{bucket}/log",
        storage_options=s3.options,
        sequencer=f"sqlite://{work}/meta.db",
        **options,
    )
    try:
        yield log
    finally:
        log.close()
        s3.remove_bucket(bucket)


@contextmanager
def memory_log(protocol: str = "memory") -> Iterator[disklesslog.Log]:
    """A log on ``memory://`` (or ``faulty-memory://``) with its own memory sequencer;
    its objects are removed afterwards (both protocols share one process-wide store)."""
    import fsspec

    url = f"{protocol}://dl-bench-{uuid.uuid4().hex}/log"
    log = disklesslog.open(url, sequencer=MemorySequencer())
    try:
        yield log
    finally:
        log.close()
        fs, root = fsspec.core.url_to_fs(url)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(root.rsplit("/", 1)[0], recursive=True)


def _plural(count: float, noun: str) -> str:
    return f"{count:,.0f} {noun}" + ("" if count == 1 else "s")


def _drain(iterable: Any) -> None:
    deque(iterable, maxlen=0)


# =================================================================== 1+5. writing


@dataclass
class WriteData:
    s3: S3
    values: list[bytes]  # 1,000 random 100-byte values, cycled
    chunks: list[bytes]  # the baseline's objects: as many bytes as the writer PUTs


def writer_bytes(records: int) -> int:
    """Bytes the writer PUTs for ``records`` 100-byte records over 100 streams (measured:
    about 103.4 per record; rounded up)."""
    return records * 104


@contextmanager
def write_data(_dir: Path, *, records: int) -> Iterator[WriteData]:
    values = [os.urandom(VALUE_SIZE) for _ in range(1000)]
    total = writer_bytes(records)
    chunks = [os.urandom(min(OBJECT_BYTES, total - at)) for at in range(0, total, OBJECT_BYTES)]
    with moto_s3() as s3:
        yield WriteData(s3, values, chunks)


def _latencies(after: dict[str, float]) -> Extras:
    """PUT and commit latency percentiles of ``log.metrics()`` (a fresh log per repetition:
    they describe this repetition's PUTs and commits, up to the last 4,096 of each)."""
    keys = ("put_p50_ms", "put_p99_ms", "commit_p50_ms", "commit_p99_ms")
    return {k: after[k] for k in keys if k in after}


def _writer_extras(log: disklesslog.Log, before: dict[str, float], records: int) -> Collect:
    def collect() -> Extras:
        after = log.metrics()
        d = delta(after, before)
        puts, commits = d.get("puts", 0), d.get("commits", 0)
        flushes = d.get("committed_objects", 0)
        return {
            **_latencies(after),
            "puts": puts,
            "commits": commits,
            "puts_per_flush": puts / flushes if flushes else math.nan,
            "puts_per_1k": puts * 1000 / records,
            "batches_per_commit": d.get("committed_batches", 0) / commits if commits else 0,
            "records_per_put": records / puts if puts else math.nan,
            "put_mb": d.get("put_bytes", 0) / 1e6,
            "put_errors": d.get("put_errors", 0),
        }

    return collect


@contextmanager
def dl_object_writer(
    work: Path, data: WriteData, *, where: str, records: int, streams: int = 100
) -> Iterator[Callable[[], Collect]]:
    """``log.writer()`` (defaults: linger 100 ms, 8 MiB objects): ``append(stream, value)``
    round-robin over ``streams`` streams, then ``flush()``. Streams are created and the
    writer opened before the clock starts; metrics are read before and after."""
    opened = memory_log() if where == "memory" else s3_log(data.s3, work)
    with opened as log:
        names = [f"s{i:03d}" for i in range(streams)]
        for name in names:
            log.create_stream(name)
        writer = log.writer()
        before = log.metrics()  # opening the log wrote its marker object: not counted

        def run() -> Collect:
            append = writer.append
            for name, value in zip(cycle(names), islice(cycle(data.values), records)):
                append(name, value)
            writer.flush()
            return _writer_extras(log, before, records)

        try:
            yield run
        finally:
            writer.close()


@contextmanager
def raw_s3_objects(work: Path, data: WriteData) -> Iterator[Callable[[], Extras]]:
    """s3fs ``pipe_file`` of the bytes the writer PUTs, as 8 MiB objects: the server's pace."""
    bucket = data.s3.new_bucket()

    def run() -> Extras:
        pipe = data.s3.fs.pipe_file
        for i, chunk in enumerate(data.chunks):
            pipe(f"{bucket}/raw/{i:06d}", chunk)
        return {"puts": float(len(data.chunks))}

    try:
        yield run
    finally:
        data.s3.remove_bucket(bucket)


@contextmanager
def naive_s3_per_record(
    work: Path, data: WriteData, *, records: int
) -> Iterator[Callable[[], Extras]]:
    """What a Python user writes today: one object per record, ``fs.pipe_file`` under a
    unique key (uuid4), synchronously. Durable when the call returns, but no order, no
    offsets: listing the keys back is left out (it would only add to its cost)."""
    bucket = data.s3.new_bucket()

    def run() -> Extras:
        pipe = data.s3.fs.pipe_file
        for value in islice(cycle(data.values), records):
            pipe(f"{bucket}/records/{uuid.uuid4().hex}", value)
        return {"puts": float(records), "puts_per_1k": 1000.0, "records_per_put": 1.0}

    try:
        yield run
    finally:
        data.s3.remove_bucket(bucket)


def write_group(plan: PlanLike) -> MeasuredGroup:
    records = plan.n(200_000, 20_000)
    naive_records = plan.n(300, 40)
    memory = "disklesslog Writer, memory:// + memory sequencer"
    s3 = "disklesslog Writer, S3 (moto) + SQLite sequencer"
    naive = "naive: s3fs pipe_file per record, unique key"

    def summary(result: MeasuredResult) -> list[str]:
        writer_puts = result.median(s3, "puts_per_1k")
        lines = []
        if writer_puts:
            lines.append(
                f"PUTs per 1,000 records: naive 1,000 vs disklesslog Writer on S3 "
                f"{writer_puts:.3f}: {1000 / writer_puts:,.0f}x fewer PUTs"
            )
        return lines

    return MeasuredGroup(
        key="obj-write",
        title=f"object Writer: {VALUE_SIZE} B values round-robin over 100 streams, "
        "append() -> Future then flush(); PUTs per flush",
        shared=partial(write_data, records=records),
        baseline="s3fs pipe_file, same bytes as 8 MiB objects",
        note="writer defaults: linger 100 ms, 8 MiB objects; timed: the appends + flush(); "
        "PUTs, commits and bytes from log.metrics() (before/after, so the log's marker "
        "object is not counted); moto S3 server on 127.0.0.1 in its own process",
        columns=[
            Column("puts_per_flush", "PUTs/flush", ".2f"),
            Column("puts_per_1k", "PUTs per 1k records", ".3f"),
            Column("commits", "commits", ",.0f"),
            Column("batches_per_commit", "batches/commit", ",.0f"),
            Column("put_mb", "MB PUT", ",.1f"),
        ],
        summary=summary,
        goals=[
            MetricGoal(
                "memory:// Writer: 1 PUT per flush", memory, metric="puts_per_flush", at_most=1
            ),
            MetricGoal("S3 Writer: 1 PUT per flush", s3, metric="puts_per_flush", at_most=1),
        ],
        variants=[
            Variant(
                "s3fs pipe_file, same bytes as 8 MiB objects",
                "baseline",
                raw_s3_objects,
                records,
                records * VALUE_SIZE,
                tag="A",
                note=f"{writer_bytes(records) / 1e6:,.1f} MB of random bytes in "
                + _plural(-(-writer_bytes(records) // OBJECT_BYTES), "object"),
            ),
            Variant(
                memory,
                "subject",
                partial(dl_object_writer, where="memory", records=records),
                records,
                records * VALUE_SIZE,
                vs=memory,  # no baseline for memory://
            ),
            Variant(
                s3,
                "subject",
                partial(dl_object_writer, where="s3", records=records),
                records,
                records * VALUE_SIZE,
            ),
            Variant(
                naive,
                "peer",
                partial(naive_s3_per_record, records=naive_records),
                naive_records,
                naive_records * VALUE_SIZE,
                compare_to=s3,
                note=f"{naive_records:,} records: one PUT each",
            ),
        ],
    )


# ===================================================================== 2. latency


PUT_DELAY = 0.05
LINGER_MS = 100
PRODUCER_THREADS = 4
LATENCY_STREAMS = 10


@contextmanager
def dl_ack_latency(
    work: Path, shared: Any, *, rate: int, seconds: float
) -> Iterator[Callable[[], Collect]]:
    """``PRODUCER_THREADS`` threads append ``rate`` records/s in total (each thread at its
    own steady pace, interleaved) to 10 streams through one ``log.writer(linger_ms=100)``
    on ``faulty-memory://`` with ``put_delay`` added to every PUT. Latency of a record:
    ``time.perf_counter()`` just before ``append()`` to its future's done callback."""
    from disklesslog.testing import FaultyMemoryFileSystem

    FaultyMemoryFileSystem.reset()
    FaultyMemoryFileSystem.put_delay = PUT_DELAY
    try:
        with memory_log("faulty-memory") as log:
            names = [f"s{i}" for i in range(LATENCY_STREAMS)]
            for name in names:
                log.create_stream(name)
            writer = log.writer(linger_ms=LINGER_MS)
            values = [os.urandom(VALUE_SIZE) for _ in range(1000)]
            total = int(rate * seconds)
            latencies: list[float] = []
            stop = threading.Event()  # set when the run is interrupted
            producers: list[threading.Thread] = []
            before = log.metrics()

            def produce(index: int, start: float) -> None:
                clock, sleep, append = time.perf_counter, time.sleep, writer.append
                keep = latencies.append

                def acknowledged(appended: float, _future: object) -> None:
                    keep(clock() - appended)

                for k in range(index, total, PRODUCER_THREADS):
                    if stop.is_set():
                        return
                    due = start + k / rate
                    wait = due - clock()
                    if wait > 0:
                        sleep(wait)
                    t = clock()
                    future = append(names[k % LATENCY_STREAMS], values[k % 1000])
                    future.add_done_callback(partial(acknowledged, t))

            def run() -> Collect:
                start = time.perf_counter() + 0.01
                producers.extend(
                    threading.Thread(target=produce, args=(i, start), name=f"producer-{i}")
                    for i in range(PRODUCER_THREADS)
                )
                for thread in producers:
                    thread.start()
                for thread in producers:
                    thread.join()
                writer.flush()

                def collect() -> Extras:
                    if len(latencies) != total:
                        raise AssertionError(f"{len(latencies)} acknowledgements of {total}")
                    after = log.metrics()
                    d = delta(after, before)
                    puts, flushes = d.get("puts", 0), d.get("committed_objects", 0)
                    return {
                        **_latencies(after),
                        **percentiles(latencies),
                        "puts_per_flush": puts / flushes if flushes else math.nan,
                        "flushes_per_s": flushes / seconds,
                        "records_per_flush": total / flushes if flushes else math.nan,
                        "put_errors": d.get("put_errors", 0),
                    }

                return collect

            try:
                yield run
            finally:
                stop.set()
                for thread in producers:
                    thread.join()
                writer.close()
    finally:
        FaultyMemoryFileSystem.reset()


def latency_group(plan: PlanLike) -> MeasuredGroup:
    rate = 2000
    seconds = 10.0 if not plan.quick else 2.0
    records = int(rate * seconds)
    name = f"Writer, linger {LINGER_MS} ms, PUT +{PUT_DELAY * 1000:.0f} ms, {rate:,} records/s"
    budget = LINGER_MS + 2 * PUT_DELAY * 1000 + 20
    return MeasuredGroup(
        key="obj-latency",
        title=f"append-to-acknowledge latency: {PRODUCER_THREADS} producer threads, "
        f"{rate:,} records/s in total over {LATENCY_STREAMS} streams for {seconds:g} s, "
        f"{PUT_DELAY * 1000:.0f} ms injected into every PUT",
        warmup=0,  # ten seconds of steady state per repetition: no warm-up run
        note=f"faulty-memory:// (FaultyMemoryFileSystem.put_delay = {PUT_DELAY}) + memory "
        f"sequencer; latency = perf_counter() before append() to the future's done "
        f"callback; the records/s column is the achieved rate (appends + final flush())",
        columns=[
            Column("p50_ms", "p50 ms"),
            Column("p90_ms", "p90 ms"),
            Column("p99_ms", "p99 ms"),
            Column("max_ms", "max ms"),
            Column("flushes_per_s", "flushes/s", ".1f"),
            Column("records_per_flush", "records/flush", ",.0f"),
            Column("puts_per_flush", "PUTs/flush", ".2f"),
        ],
        goals=[
            MetricGoal(
                f"p99 append-to-acknowledge <= linger + 2 x PUT latency + 20 ms = {budget:.0f} ms",
                name,
                metric="p99_ms",
                at_most=budget,
                unit="ms",
            )
        ],
        variants=[
            Variant(
                name,
                "subject",
                partial(dl_ack_latency, rate=rate, seconds=seconds),
                records,
                records * VALUE_SIZE,
                note=f"{records:,} records",
            )
        ],
    )


# ======================================================================= 4. reads


@dataclass
class ReadData:
    s3: S3
    url: str
    storage_options: dict[str, Any]
    sequencer: str
    records: int
    objects: int
    blocks: int  # BLOCK_SIZE blocks over all objects: the most GETs a cold read needs


@contextmanager
def read_data(directory: Path, *, records: int) -> Iterator[ReadData]:
    """``records`` 100-byte records in one stream, written by one writer whose linger
    is long enough that only the 8 MiB object bound and the final flush() cut objects."""
    with moto_s3() as s3:
        bucket = s3.new_bucket()
        url = f"s3://{bucket}/log"
        sequencer = f"sqlite://{directory}/meta.db"
        values = [os.urandom(VALUE_SIZE) for _ in range(1000)]
        with disklesslog.open(url, storage_options=s3.options, sequencer=sequencer) as log:
            stream = log.create_stream("bench")
            with log.writer(linger_ms=60_000) as writer:
                for value in islice(cycle(values), records):
                    writer.append("bench", value)
                writer.flush()
            put = log.metrics()
            if stream.end_offset != records:
                raise AssertionError(f"wrote {stream.end_offset} records, not {records}")
        sizes = [info["size"] for info in s3.fs.ls(f"{bucket}/log/objects", detail=True)]
        if len(sizes) != put["puts"] - 1:  # every PUT but the marker is an object
            raise AssertionError(f"{len(sizes)} objects listed, {put['puts'] - 1} PUT")
        blocks = sum(-(-size // BLOCK_SIZE) for size in sizes)
        try:
            yield ReadData(s3, url, s3.options, sequencer, records, len(sizes), blocks)
        finally:
            s3.remove_bucket(bucket)


@contextmanager
def dl_object_read(
    work: Path, data: ReadData, *, threads: int, cached: bool
) -> Iterator[Callable[[], Collect]]:
    """Drain ``Stream.read()`` (Record objects) from S3 with ``threads`` reader threads
    (each reads the whole stream) sharing one log and the process-wide cache, replaced by
    a fresh one (``configure_default_cache()``) first. Cached: one untimed read first."""
    configure_default_cache()
    log = disklesslog.open(data.url, storage_options=data.storage_options, sequencer=data.sequencer)
    stream = log.stream("bench")
    if cached:
        _drain(stream.read())
    before = log.metrics()
    pool: list[threading.Thread] = []

    def reader() -> None:
        _drain(stream.read())

    def run() -> Collect:
        if threads == 1:
            reader()
        else:
            pool.extend(threading.Thread(target=reader) for _ in range(threads))
            for thread in pool:
                thread.start()
            for thread in pool:
                thread.join()

        def collect() -> Extras:
            d = delta(log.metrics(), before)
            gets = d.get("gets", 0)
            return {
                "gets": gets,
                "gets_per_object": gets / data.objects,
                "gets_per_block": gets / data.blocks,
                "get_mb": d.get("get_bytes", 0) / 1e6,
                "cache_hits": d.get("cache_hits", 0),
                "cache_misses": d.get("cache_misses", 0),
                "cache_waits": d.get("cache_waits", 0),
                "objects": float(data.objects),
                "blocks": float(data.blocks),
            }

        return collect

    try:
        yield run
    finally:
        # Interrupted (Ctrl-C in join): let the readers finish before the log closes
        # under them (closing it while they read can crash the process: see
        # docs/benchmarks.md, "Object storage").
        for thread in pool:
            thread.join()
        log.close()
        configure_default_cache()  # drop the blocks this repetition cached


def read_group(plan: PlanLike) -> MeasuredGroup:
    records = plan.n(100_000, 20_000)
    cold1 = "cold, 1 reader"
    cold8 = "cold, 8 reader threads"
    variants = []
    for threads in (1, 8):
        for cached in (False, True):
            name = f"{'cached' if cached else 'cold'}, " + (
                "1 reader" if threads == 1 else f"{threads} reader threads"
            )
            variants.append(
                Variant(
                    name,
                    "subject",
                    partial(dl_object_read, threads=threads, cached=cached),
                    records * threads,
                    records * threads * VALUE_SIZE,
                    note="each thread reads every record" if threads > 1 else "",
                )
            )

    def summary(result: MeasuredResult) -> list[str]:
        objects = result.median(cold1, "objects") or 0
        blocks = result.median(cold1, "blocks") or 0
        return [
            f"the stream is {_plural(objects, 'object')} ({_plural(blocks, 'block')} of "
            f"{BLOCK_SIZE >> 20} MiB): a cold read needs at most {blocks:.0f} GETs"
        ]

    return MeasuredGroup(
        key="obj-read",
        title=f"object reads from S3 (moto): {records:,} records of {VALUE_SIZE} B in one "
        "stream, Stream.read() -> Record",
        shared=partial(read_data, records=records),
        note="written beforehand by one log.writer(linger_ms=60000): objects cut at 8 MiB "
        "buffered and at the final flush(); timed: draining read() (collections.deque); "
        "GETs from log.metrics(); BlockCache defaults (4 MiB blocks, 256 MiB)",
        columns=[
            Column("gets", "GETs", ",.0f"),
            Column("gets_per_object", "GETs/object", ".2f"),
            Column("gets_per_block", "GETs/block", ".2f"),
            Column("get_mb", "MB GET", ",.1f"),
            Column("cache_waits", "single-flight waits", ",.0f"),
        ],
        summary=summary,
        goals=[
            MetricGoal(
                "cold read, 1 reader: <= 1 GET per block", cold1, metric="gets_per_block", at_most=1
            ),
            MetricGoal(
                "cold read, 8 threads: <= 1 GET per block",
                cold8,
                metric="gets_per_block",
                at_most=1,
            ),
        ],
        variants=variants,
    )


# ========================================================================= groups


def object_groups(plan: PlanLike) -> list[MeasuredGroup]:
    return [write_group(plan), latency_group(plan), read_group(plan)]


GROUP_KEYS = ("obj-write", "obj-latency", "obj-read")
