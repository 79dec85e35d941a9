"""Diagnostics behind the object-storage findings in docs/benchmarks.md.

    .venv/bin/python benchmarks/objects_probes.py              all probes
    .venv/bin/python benchmarks/objects_probes.py writer-gc    one of: writer-gc, sqlite-busy,
                                                     sqlite-commit, close-while-reading

``writer-gc``            the object Writer (memory://, 100 streams, 200,000 records, the
                         obj-write workload) with the garbage collector on and off,
                         alternating, with the collections each run triggered and how long
                         the flusher thread was busy (``Writer._flush``), resolving futures
                         (``Writer._resolve``) and storing (``ObjectWriter._write``: PUT +
                         commit), timed by wrapping those methods in this process.
``sqlite-busy``          four processes committing to one SQLite sequencer: per process,
                         its rate and the commits that waited over 50 ms; then the same
                         contention in bare sqlite3 (BEGIN IMMEDIATE, 20 statements, COMMIT)
                         with SQLite's busy handler (``timeout=30``, as the sequencer opens
                         its connections) and with a retry loop sleeping 0.2-1 ms instead.
``sqlite-commit``        where a single writer's ``SqliteSequencer.commit`` spends its time
                         (the obj-sequencer workload, in this process): the rate, then
                         a cProfile of 1,500 commits.
``close-while-reading``  ``Log.close()`` while 8 threads read an objects log whose SQLite
                         sequencer the log owns (file:// + backend="objects"), five times,
                         each in a fresh process: the exit codes (-11: SIGSEGV).
"""

from __future__ import annotations

import cProfile
import gc
import os
import pstats
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import objects as obj

from disklesslog.sequencers import open_sequencer

SPAWN = obj.SPAWN


# ------------------------------------------------------------------------ writer-gc


def _timing(cls: type, name: str, spent: dict[str, float]) -> None:
    """Wrap ``cls.name`` (a method or staticmethod) to add its duration to ``spent``."""
    raw = cls.__dict__[name]
    static = isinstance(raw, staticmethod)
    method = raw.__func__ if static else raw

    def timed(*args: object) -> object:
        started = time.perf_counter()
        try:
            return method(*args)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

    setattr(cls, name, staticmethod(timed) if static else timed)


def writer_gc(records: int = 200_000, rounds: int = 3) -> None:
    from disklesslog.objects.writer import ObjectWriter
    from disklesslog.writer import Writer

    spent: dict[str, float] = {}
    _timing(Writer, "_flush", spent)
    _timing(Writer, "_resolve", spent)
    _timing(ObjectWriter, "_write", spent)
    print(f"object Writer, memory://, {records:,} records over 100 streams (obj-write)")
    values = [os.urandom(100) for _ in range(1000)]
    data = obj.WriteData(s3=None, values=values, chunks=[])  # type: ignore[arg-type]
    for _ in range(rounds):
        for enabled in (True, False):
            with (
                tempfile.TemporaryDirectory() as work,
                obj.dl_object_writer(Path(work), data, where="memory", records=records) as run,
            ):
                gc.collect()
                spent.clear()
                before = [s["collections"] for s in gc.get_stats()]
                if not enabled:
                    gc.disable()
                started = time.perf_counter()
                try:
                    collect = run()
                    elapsed = time.perf_counter() - started
                finally:
                    gc.enable()
                after = [s["collections"] for s in gc.get_stats()]
                flushes = collect()["commits"]
            counts = "/".join(str(a - b) for a, b in zip(after, before))
            busy = spent.get("_flush", 0.0)
            print(
                f"  gc {'on ' if enabled else 'off'}: {records / elapsed:9,.0f} records/s "
                f"({elapsed:.2f} s), {flushes:.0f} flushes, collections gen0/1/2: {counts}; "
                f"flusher busy {busy:.2f} s: resolving futures {spent.get('_resolve', 0):.2f} s, "
                f"PUT + commit {spent.get('_write', 0):.2f} s"
            )


# ---------------------------------------------------------------------- sqlite-busy


def _bare_worker(path: str, retry_in_python: bool, commits: int, go: object, out: object) -> None:
    db = sqlite3.connect(path, timeout=0 if retry_in_python else 30, isolation_level=None)
    db.execute("PRAGMA synchronous=NORMAL")
    go.wait()  # type: ignore[attr-defined]
    latencies = []
    started = time.monotonic()
    for i in range(commits):
        t = time.perf_counter()
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError:
                if not retry_in_python:
                    raise
                time.sleep(random.uniform(0.0002, 0.001))
        for j in range(10):
            db.execute("UPDATE s SET end_offset = end_offset + 10 WHERE id = ?", (j,))
            db.execute("INSERT INTO b (s, o) VALUES (?, ?)", (j, i))
        db.execute("COMMIT")
        latencies.append(time.perf_counter() - t)
    out.put((time.monotonic() - started, latencies))  # type: ignore[attr-defined]


def _describe(label: str, started: float, finished: float, latencies: list[float]) -> str:
    slow = [x for x in latencies if x > 0.05]
    return (
        f"  {label}: {len(latencies) / (finished - started):7,.0f} commits/s, "
        f"{len(slow)} waited > 50 ms ({sum(slow):.2f} s in all), "
        f"max {max(latencies) * 1000:,.0f} ms"
    )


def sqlite_busy(processes: int = 4, commits: int = 1500) -> None:
    with tempfile.TemporaryDirectory() as work:
        url = f"sqlite://{work}/meta.db"
        with open_sequencer(url) as sequencer:
            for j in range(obj.SEQ_STREAMS):
                sequencer.create_stream(f"s{j}", {})
        ready, out, go = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Event()
        workers = [
            SPAWN.Process(target=obj.sequencer_worker, args=(url, i, commits, ready, go, out))
            for i in range(processes)
        ]
        for w in workers:
            w.start()
        for _ in workers:
            ready.get(timeout=120)
        go.set()
        reports = sorted(out.get(timeout=300) for _ in workers)
        for w in workers:
            w.join()
        print(f"SqliteSequencer.commit, {processes} processes x {commits:,} commits:")
        t0 = min(r[1] for r in reports)
        for index, started, finished, latencies in reports:
            line = _describe(f"process {index}", started, finished, latencies)
            print(f"{line}; ran {started - t0:.2f}-{finished - t0:.2f} s")
    for retry_in_python in (False, True):
        with tempfile.TemporaryDirectory() as work:
            path = f"{work}/bare.db"
            db = sqlite3.connect(path)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE s (id INTEGER PRIMARY KEY, end_offset INTEGER)")
            db.execute("CREATE TABLE b (id INTEGER PRIMARY KEY, s INTEGER, o INTEGER)")
            db.executemany("INSERT INTO s VALUES (?, 0)", [(j,) for j in range(10)])
            db.commit()
            db.close()
            out, go = SPAWN.Queue(), SPAWN.Event()
            workers = [
                SPAWN.Process(target=_bare_worker, args=(path, retry_in_python, commits, go, out))
                for _ in range(processes)
            ]
            for w in workers:
                w.start()
            time.sleep(1.5)  # let them start (spawn imports)
            go.set()
            results = [out.get(timeout=300) for _ in workers]
            for w in workers:
                w.join()
            latencies = [x for _, lat in results for x in lat]
            span = max(seconds for seconds, _ in results)
            label = (
                "bare sqlite3, retry loop sleeping 0.2-1 ms (timeout=0)"
                if retry_in_python
                else "bare sqlite3, SQLite's busy handler (timeout=30)"
            )
            print(_describe(f"{label}, {processes} processes", 0.0, span, latencies))


# ---------------------------------------------------------------------- sqlite-commit


def sqlite_commit(commits: int = 1500, top: int = 15) -> None:
    with tempfile.TemporaryDirectory() as work:
        sequencer = open_sequencer(f"sqlite://{work}/meta.db")
        try:
            for j in range(obj.SEQ_STREAMS):
                sequencer.create_stream(f"s{j}", {})
            todo = obj._batches(sequencer.init_producer(), 2 * commits, "probe")
            started = time.perf_counter()
            obj._commit_loop(sequencer, todo[:commits])
            rate = commits / (time.perf_counter() - started)
            print(f"SqliteSequencer.commit, 1 writer, 10 batches per commit: {rate:,.0f} commits/s")
            profiler = cProfile.Profile()
            profiler.runcall(obj._commit_loop, sequencer, todo[commits:])
        finally:
            sequencer.close()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)


# -------------------------------------------------------------- close-while-reading

CLOSE_WHILE_READING = """
import os, sys, threading, time
import disklesslog
root = sys.argv[1]
log = disklesslog.open(f"file://{root}/log", backend="objects")  # SQLite sequencer in root
stream = log.create_stream("s")
for _ in range(50):
    stream.append_batch([os.urandom(100)] * 100)
def reader():
    try:
        while True:
            for _ in stream.read():
                pass
    except Exception as exc:  # what a reader should get: a typed error
        os.write(1, type(exc).__name__.encode() + b"\\n")
threads = [threading.Thread(target=reader, daemon=True) for _ in range(8)]
for t in threads:
    t.start()
time.sleep(0.5)
log.close()
time.sleep(0.5)
"""


def close_while_reading(runs: int = 5) -> None:
    print("Log.close() while 8 threads read (file:// objects log, its own SQLite sequencer):")
    codes = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as root:
            done = subprocess.run(
                [sys.executable, "-c", CLOSE_WHILE_READING, root],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        codes.append(done.returncode)
        errors = sorted(set(done.stdout.split()))
        print(f"  exit code {done.returncode:4}; readers raised: {', '.join(errors) or '-'}")
    crashed = sum(code == -11 for code in codes)
    print(f"  {crashed} of {runs} processes died of SIGSEGV")


PROBES: dict[str, Callable[[], None]] = {
    "writer-gc": writer_gc,
    "sqlite-busy": sqlite_busy,
    "sqlite-commit": sqlite_commit,
    "close-while-reading": close_while_reading,
}


def main(argv: list[str]) -> int:
    names = argv or list(PROBES)
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        print(f"unknown probe(s) {unknown}; choose from {list(PROBES)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"== {name}")
        PROBES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
