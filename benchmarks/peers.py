"""The peers' side of each workload: SQLite (stdlib ``sqlite3``) and persist-queue.

SQLite is set up as an append-only log would be: one table
``(id INTEGER PRIMARY KEY, key BLOB, value BLOB)``, WAL journal, ``synchronous=NORMAL``
(commits reach the OS; the WAL is fsynced at checkpoints), except where a row says
``synchronous=FULL`` (the WAL is fsynced at every commit).

persist-queue (``pip install persist-queue``) is used with its defaults:
``persistqueue.Queue`` (a file queue: pickles each item into a chunk file, flushes it,
and rewrites its small ``info`` file through a temporary file and a rename; fsync only
when a 100-item chunk fills) and ``persistqueue.SQLiteQueue`` (one INSERT and commit
per put, SQLite in WAL mode with SQLite's default ``synchronous=FULL``).
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import cycle, islice
from pathlib import Path
from typing import Any

from workloads import BatchData, ReadData, SingleData

try:
    import persistqueue
except ImportError:  # reported by run.py; the peers are skipped
    persistqueue = None

CREATE = "CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY, key BLOB, value BLOB)"
INSERT = "INSERT INTO log (key, value) VALUES (?, ?)"


def sqlite_connect(path: Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(CREATE)
    conn.commit()
    return conn


# -------------------------------------------------------------------------- SQLite


@contextmanager
def sqlite_batch(work: Path, data: BatchData, *, batches: int) -> Iterator[Callable[[], None]]:
    """``executemany`` of 1,000 rows in one transaction per batch."""
    conn = sqlite_connect(work / "log.db")

    def run() -> None:
        for rows in islice(cycle(data.rows), batches):
            with conn:  # one transaction, committed at the end of the block
                conn.executemany(INSERT, rows)

    try:
        yield run
    finally:
        conn.close()


@contextmanager
def sqlite_single(
    work: Path, data: SingleData, *, records: int, synchronous: str
) -> Iterator[Callable[[], None]]:
    """One INSERT and one commit per record."""
    conn = sqlite_connect(work / "log.db", synchronous)

    def run() -> None:
        execute, commit = conn.execute, conn.commit
        for value in islice(cycle(data.values), records):
            execute(INSERT, (None, value))
            commit()

    try:
        yield run
    finally:
        conn.close()


@contextmanager
def sqlite_read(work: Path, data: ReadData) -> Iterator[Callable[[], None]]:
    """``SELECT value FROM log ORDER BY id``, drained."""
    conn = sqlite3.connect(data.sqlite)

    def run() -> None:
        deque(conn.execute("SELECT value FROM log ORDER BY id"), maxlen=0)

    try:
        yield run
    finally:
        conn.close()


def write_read_sqlite(path: Path, pool: list[list[bytes]], batches: int) -> None:
    conn = sqlite_connect(path)
    try:
        for values in islice(cycle(pool), batches):
            with conn:
                conn.executemany(INSERT, [(None, v) for v in values])
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


# -------------------------------------------------------------------- persist-queue


def _file_queue(path: Path) -> Any:
    path.mkdir(exist_ok=True)
    # tempdir=path keeps the info file's temporary copies on the benchmark disk
    return persistqueue.Queue(str(path), tempdir=str(path))


@contextmanager
def pq_file_put(work: Path, data: SingleData, *, records: int) -> Iterator[Callable[[], None]]:
    """``persistqueue.Queue.put`` per record."""
    queue = _file_queue(work / "queue")

    def run() -> None:
        put = queue.put
        for value in islice(cycle(data.values), records):
            put(value)

    yield run


@contextmanager
def pq_sqlite_put(work: Path, data: SingleData, *, records: int) -> Iterator[Callable[[], None]]:
    """``persistqueue.SQLiteQueue.put`` per record (every put is its own commit)."""
    queue = persistqueue.SQLiteQueue(str(work / "queue"))

    def run() -> None:
        put = queue.put
        for value in islice(cycle(data.values), records):
            put(value)

    try:
        yield run
    finally:
        queue.close()


@contextmanager
def pq_file_get(work: Path, data: ReadData, *, records: int) -> Iterator[Callable[[], None]]:
    """``persistqueue.Queue.get`` per record. No ``task_done``: like ``Stream.read`` the
    reader's position is not persisted, so every repetition reads the same items."""
    queue = _file_queue(data.pq_file)

    def run() -> None:
        get = queue.get
        for _ in range(records):
            get()

    yield run


@contextmanager
def pq_sqlite_get(work: Path, data: ReadData, *, records: int) -> Iterator[Callable[[], None]]:
    """``persistqueue.SQLiteQueue.get`` per record with ``auto_commit=False``: a SELECT per
    get and nothing persisted (with auto_commit=True each get also deletes and commits)."""
    queue = persistqueue.SQLiteQueue(str(data.pq_sqlite), auto_commit=False)

    def run() -> None:
        get = queue.get
        for _ in range(records):
            get()

    try:
        yield run
    finally:
        queue.close()


def write_read_queues(file_path: Path, sqlite_path: Path, values: list[bytes]) -> None:
    queue = _file_queue(file_path)
    for value in values:
        queue.put(value)
    del queue
    squeue = persistqueue.SQLiteQueue(str(sqlite_path), auto_commit=False)
    # Setup only: every put commits, so skip the fsyncs to fill the queue quickly.
    squeue._putter.execute("PRAGMA synchronous=OFF")
    for value in values:
        squeue.put(value)
    squeue.close()
