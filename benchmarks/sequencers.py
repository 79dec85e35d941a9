"""Sequencer commit rates: every sequencer on the same machine, in one run.

Group ``obj-sequencer`` (``./dev bench --only obj-sequencer``): ``Sequencer.commit`` of
10 batches (10 streams x 10 records) per commit, called directly (no objects are
written), from one writer and from four at once:

* SQLite (``sqlite:///<tmp>/meta.db``), the one-machine default and the baseline every
  other row's ratio is taken to (1 writer to 1 writer, 4 to 4);
* PostgreSQL (a server this benchmark starts from Debian's packages, like the tests);
* the object-store sequencer on ``file://`` (entries hard-linked into place), with four
  writer *threads* sharing one instance (group commit) and four writer *processes*
  racing for entry numbers; and on S3 (moto) with one writer, for scale;
* the in-process memory sequencer, the reference line.

Writers are spawned processes, each with its own producer; their start-up, producer
registration and batch lists happen before the clock, which runs from a shared "go" to
the last writer's report. Latency percentiles are per commit call.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from common import Variant
from measured import Collect, Column, Extras, MeasuredGroup, MeasuredResult, MetricGoal, percentiles
from objects import PlanLike

from disklesslog.sequencers import BatchToCommit, Sequencer, open_sequencer
from disklesslog.sequencers.memory import MemorySequencer

SPAWN = multiprocessing.get_context("spawn")
SEQ_STREAMS = 10
SEQ_RECORDS = 10  # records (and producer sequence numbers) per batch
VALUE_SIZE = 100

GROUP_KEYS = ("obj-sequencer",)


# ----------------------------------------------------------------- environment


@dataclass
class Servers:
    """The servers the group shares: PostgreSQL and a moto S3 server."""

    postgres: str
    s3_options: dict[str, Any]


@contextmanager
def servers(_work: Path) -> Iterator[Servers]:
    from disklesslog.testing.servers.postgres import postgres_server
    from disklesslog.testing.servers.s3 import moto_s3_server, s3_storage_options

    with postgres_server() as postgres, moto_s3_server() as endpoint:
        yield Servers(postgres, s3_storage_options(endpoint))


Where = Callable[[Path, Servers], tuple[Any, ...]]
"""How a variant reaches its sequencer: a picklable spec that :func:`_open` opens."""


def _sqlite(work: Path, _servers: Servers) -> tuple[Any, ...]:
    return ("url", f"sqlite://{work}/meta.db")


def _postgres(_work: Path, s: Servers) -> tuple[Any, ...]:
    return ("url", f"{s.postgres}?schema=bench_{uuid.uuid4().hex[:12]}")


def _objectstore_file(work: Path, _servers: Servers) -> tuple[Any, ...]:
    return ("url", f"objectstore+file://{work}/sequencer")


def _objectstore_s3(_work: Path, s: Servers) -> tuple[Any, ...]:
    import s3fs

    bucket = f"dl-bench-{uuid.uuid4().hex[:16]}"
    s3fs.S3FileSystem(**s.s3_options, skip_instance_cache=True).mkdir(bucket)
    return ("s3", s.s3_options, f"{bucket}/sequencer")


def _open(spec: tuple[Any, ...]) -> Sequencer:
    if spec[0] == "url":
        return open_sequencer(spec[1])
    import s3fs

    from disklesslog.sequencers.objectstore import ObjectStoreSequencer

    _, options, root = spec
    return ObjectStoreSequencer(s3fs.S3FileSystem(**options, skip_instance_cache=True), root)


# ------------------------------------------------------------------- workload


def _batches(producer: tuple[int, int], commits: int, tag: str) -> list[tuple[str, list[Any]]]:
    """Each commit's object key and its 10 batches (one per stream), built beforehand."""
    producer_id, epoch = producer
    now = int(time.time() * 1000)
    size = SEQ_RECORDS * (VALUE_SIZE + 10)
    out = []
    for i in range(commits):
        batches = [
            BatchToCommit(
                stream=f"s{j}",
                position=j * size,
                size=size,
                span=SEQ_RECORDS,
                record_count=SEQ_RECORDS,
                max_timestamp=now + i,
                producer_id=producer_id,
                producer_epoch=epoch,
                base_sequence=i * SEQ_RECORDS,
            )
            for j in range(SEQ_STREAMS)
        ]
        out.append((f"objects/{tag}-{i:09d}", batches))
    return out


def _commit_loop(sequencer: Any, work: list[tuple[str, list[Any]]]) -> list[float]:
    latencies = []
    clock, commit = time.perf_counter, sequencer.commit
    for key, batches in work:
        t = clock()
        commit(key, batches)
        latencies.append(clock() - t)
    return latencies


def sequencer_worker(
    spec: tuple[Any, ...], index: int, commits: int, threads: int, ready: Any, go: Any, out: Any
) -> None:
    """One writer process: ``threads`` writer threads sharing one sequencer instance,
    each with its own producer and ``commits`` commits once ``go`` is set. Reports
    (index, started, finished, latencies) or an error."""
    try:
        sequencer = _open(spec)
        works = [
            _batches(sequencer.init_producer(), commits, f"p{index}-t{t}") for t in range(threads)
        ]
        results: list[list[float]] = [[] for _ in range(threads)]

        def run(t: int) -> None:
            results[t] = _commit_loop(sequencer, works[t])

        ready.put(index)
        go.wait()
        started = time.monotonic()
        pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        finished = time.monotonic()
        if any(len(r) != commits for r in results):
            raise RuntimeError("a writer thread failed")
        out.put((index, started, finished, [x for r in results for x in r]))
        sequencer.close()
    except BaseException as exc:
        out.put((index, None, None, repr(exc)))
        raise


def _extras(latencies: list[float], seconds: float, commits: int) -> Extras:
    return {**percentiles(latencies), "batches_per_s": commits * SEQ_STREAMS / seconds}


@contextmanager
def process_commits(
    work: Path,
    shared: Servers,
    *,
    where: Where,
    processes: int,
    threads: int,
    commits: int,
) -> Iterator[Callable[[], Collect]]:
    """``processes`` spawned processes x ``threads`` threads commit ``commits`` times each
    to one sequencer (the same 10 streams for all)."""
    spec = where(work, shared)
    with contextlib.closing(_open(spec)) as sequencer:
        for j in range(SEQ_STREAMS):
            sequencer.create_stream(f"s{j}", {})
    ready, out, go = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Event()
    workers = [
        SPAWN.Process(
            target=sequencer_worker,
            args=(spec, i, commits, threads, ready, go, out),
            name=f"sequencer-writer-{i}",
        )
        for i in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        for _ in workers:
            _get(ready, workers)

        def run() -> Collect:
            go.set()
            reports = [_get(out, workers) for _ in workers]

            def collect() -> Extras:
                failed = [r for r in reports if r[1] is None]
                if failed:
                    raise RuntimeError(f"sequencer writer process failed: {failed[0][3]}")
                span = max(r[2] for r in reports) - min(r[1] for r in reports)
                latencies = [x for r in reports for x in r[3]]
                return _extras(latencies, span, commits * processes * threads)

            return collect

        yield run
    finally:
        go.set()
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.terminate()
                worker.join()


def _get(channel: Any, workers: list[Any], timeout: float = 600.0) -> Any:
    """The next message, failing early if every worker has died without sending it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return channel.get(timeout=0.5)
        except queue.Empty:
            if all(not w.is_alive() for w in workers) or time.monotonic() > deadline:
                raise RuntimeError("sequencer writer processes stopped without reporting") from None


@contextmanager
def memory_commits(work: Path, shared: Any, *, commits: int) -> Iterator[Callable[[], Collect]]:
    """The same commits on an in-process memory sequencer (the reference line)."""
    sequencer = MemorySequencer()
    for j in range(SEQ_STREAMS):
        sequencer.create_stream(f"s{j}", {})
    todo = _batches(sequencer.init_producer(), commits, "m")

    def run() -> Collect:
        started = time.perf_counter()
        latencies = _commit_loop(sequencer, todo)
        seconds = time.perf_counter() - started
        return lambda: _extras(latencies, seconds, commits)

    yield run


# ---------------------------------------------------------------------- group

SQLITE_1 = "SQLite, 1 writer process"
SQLITE_4 = "SQLite, 4 writer processes"
POSTGRES_1 = "PostgreSQL, 1 writer process"
OBJECTSTORE_1 = "object store on file://, 1 writer process"
OBJECTSTORE_T4 = "object store on file://, 4 writer threads in 1 process (group commit)"


def _group_commit_line(result: MeasuredResult) -> list[str]:
    """The goal on two variants: total throughput flat or rising from 1 to 4 writers."""
    one = result.median(OBJECTSTORE_1, "rate")
    four = result.median(OBJECTSTORE_T4, "rate")
    if one is None or four is None:
        return []
    ratio = four / one
    verdict = "MET" if ratio >= 0.95 else "NOT MET"
    return [
        "goal: **object-store sequencer group commit keeps total commits/s flat or rising "
        f"from 1 to 4 writers (>= 0.95x): 4 threads {four:,.0f} vs 1 writer {one:,.0f} "
        f"commits/s = {ratio:.2f}x: {verdict}**"
    ]


def sequencer_group(plan: PlanLike) -> MeasuredGroup:
    fast = plan.n(3000, 400)  # SQLite, PostgreSQL, object store on file://
    each = plan.n(1000, 150)
    s3 = plan.n(300, 60)
    memory = plan.n(10_000, 1_000)

    def commits(
        name: str, where: Where, processes: int, threads: int, n: int, role: str, vs: str
    ) -> Variant:
        return Variant(
            name,
            role,
            partial(process_commits, where=where, processes=processes, threads=threads, commits=n),
            n * processes * threads,
            vs=vs,
            tag=f"SQLite {processes}w" if role == "baseline" else "",
            note=f"{n:,} commits per writer",
        )

    return MeasuredGroup(
        key="obj-sequencer",
        title=f"sequencer commits: {SEQ_STREAMS} batches per commit ({SEQ_STREAMS} streams, "
        f"{SEQ_RECORDS} records each), every sequencer, no objects involved",
        unit="commits",
        shared=servers,
        note="Sequencer.commit(object_key, [BatchToCommit x 10]) called directly, batch lists "
        "built before the clock; writers are spawned processes (or threads of one) with their "
        "own producer, all on the same 10 streams; rate = all commits / (last end - first "
        "start); ratios are to SQLite with the same number of writers; SQLite WAL "
        "synchronous=normal; PostgreSQL 15 started by the benchmark (fsync off: a test "
        "server); object store on file:// = entries hard-linked into a local directory; "
        "S3 = moto server on 127.0.0.1; p50/p99 per commit call",
        columns=[
            Column("batches_per_s", "batches/s", ",.0f"),
            Column("p50_ms", "p50 ms", ".2f"),
            Column("p99_ms", "p99 ms", ".2f"),
            Column("max_ms", "max ms", ".1f"),
        ],
        goals=[
            MetricGoal(
                "PostgreSQL >= 1,000 commits/s", POSTGRES_1, at_least=1000, unit="commits/s"
            ),
            MetricGoal(
                "object-store sequencer on file:// >= 200 commits/s, 1 writer",
                OBJECTSTORE_1,
                at_least=200,
                unit="commits/s",
            ),
        ],
        summary=_group_commit_line,
        variants=[
            commits(SQLITE_1, _sqlite, 1, 1, fast, "baseline", SQLITE_1),
            commits(SQLITE_4, _sqlite, 4, 1, each, "baseline", SQLITE_4),
            commits(POSTGRES_1, _postgres, 1, 1, fast, "subject", SQLITE_1),
            commits("PostgreSQL, 4 writer processes", _postgres, 4, 1, each, "subject", SQLITE_4),
            commits(OBJECTSTORE_1, _objectstore_file, 1, 1, fast, "subject", SQLITE_1),
            commits(OBJECTSTORE_T4, _objectstore_file, 1, 4, each, "subject", SQLITE_4),
            commits(
                "object store on file://, 4 writer processes",
                _objectstore_file,
                4,
                1,
                each,
                "subject",
                SQLITE_4,
            ),
            commits(
                "object store on S3 (moto), 1 writer process",
                _objectstore_s3,
                1,
                1,
                s3,
                "subject",
                SQLITE_1,
            ),
            Variant(
                "memory sequencer, 1 thread (reference)",
                "subject",
                partial(memory_commits, commits=memory),
                memory,
                note=f"{memory:,} commits, in this process",
            ),
        ],
    )
