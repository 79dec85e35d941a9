"""disklesslog's side of each workload, and the raw-file baselines beside it.

Every function here is a ``prepare`` context manager (see :mod:`common`): untimed
setup, then ``yield`` the function that is timed, then cleanup. Record values are
random bytes generated before anything is timed; the raw baselines write exactly the
bytes disklesslog writes (each batch as ``disklesslog.format`` encodes it, prefixed
with its 8-byte little-endian base offset, as a segment file stores it).
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import disklesslog
from disklesslog.format import encode_batch, encode_record
from disklesslog.segments.segment import ENTRY_PREFIX

STREAM = "bench"
BATCH = 1000  # records per append_batch call
POOL = 16  # distinct pre-generated batches, cycled


def random_values(count: int, size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


def entry_bytes(value_size: int, records: int) -> int:
    """Bytes one segment entry of ``records`` values of ``value_size`` bytes takes."""
    sample = encode_batch(random_values(records, value_size)) if records > 1 else None
    data = sample.data if sample else encode_record(os.urandom(value_size)).data
    return ENTRY_PREFIX.size + len(data)


def _drain(iterable: Any) -> None:
    deque(iterable, maxlen=0)


def _open_stream(path: Path, **options: Any) -> tuple[disklesslog.Log, Any]:
    """Open a log and one stream, with the stream's files opened (outside the timing)."""
    log = disklesslog.open(path, **options)
    stream = log.create_stream(STREAM)
    _ = stream.end_offset
    return log, stream


# ----------------------------------------------------------------- batched append


@dataclass
class BatchData:
    pool: list[list[bytes]]  # POOL lists of BATCH values
    entries: list[bytes]  # the raw baseline's bytes: one segment entry per batch
    rows: list[list[tuple[None, bytes]]]  # the same values as SQLite rows (key, value)


@contextmanager
def batch_data(_dir: Path, *, value_size: int, batches: int) -> Iterator[BatchData]:
    pool = [random_values(BATCH, value_size) for _ in range(POOL)]
    encoded = [encode_batch(values).data for values in pool]
    entries = [ENTRY_PREFIX.pack(i * BATCH) + encoded[i % POOL] for i in range(batches)]
    rows = [[(None, v) for v in values] for values in pool]
    yield BatchData(pool, entries, rows)


@contextmanager
def raw_batch_write(
    work: Path, data: BatchData, *, batches: int, sync: bool
) -> Iterator[Callable[[], None]]:
    """Buffered ``f.write`` of each pre-encoded entry, then flush (and fdatasync)."""
    f = open(work / "00000000000000000000.log", "ab")  # noqa: SIM115 - closed below

    def run() -> None:
        write = f.write
        for entry in data.entries[:batches]:
            write(entry)
        f.flush()
        if sync:
            os.fdatasync(f.fileno())
        f.close()

    try:
        yield run
    finally:
        f.close()


@contextmanager
def dl_append_batch(
    work: Path, data: BatchData, *, batches: int, fsync: str
) -> Iterator[Callable[[], None]]:
    """``Stream.append_batch`` of BATCH values per call, then ``log.close()``."""
    log, stream = _open_stream(work / "log", fsync=fsync)

    def run() -> None:
        append = stream.append_batch
        for values in islice(cycle(data.pool), batches):
            append(values)
        log.close()

    try:
        yield run
    finally:
        log.close()


# ------------------------------------------------------------------ single append


@dataclass
class SingleData:
    values: list[bytes]  # cycled
    entries: list[bytes]  # the raw baseline's bytes: one single-record entry per record


@contextmanager
def single_data(_dir: Path, *, value_size: int, records: int) -> Iterator[SingleData]:
    values = random_values(1000, value_size)
    entries = [
        ENTRY_PREFIX.pack(i) + encode_record(v).data
        for i, v in enumerate(islice(cycle(values), records))
    ]
    yield SingleData(values, entries)


@contextmanager
def raw_single_write(
    work: Path, data: SingleData, *, records: int, sync: bool
) -> Iterator[Callable[[], None]]:
    """One ``os.write`` per pre-encoded entry on an O_APPEND fd (plus fdatasync each)."""
    fd = os.open(work / "00000000000000000000.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def run() -> None:
        write = os.write
        if sync:
            fdatasync = os.fdatasync
            for entry in data.entries[:records]:
                write(fd, entry)
                fdatasync(fd)
        else:
            for entry in data.entries[:records]:
                write(fd, entry)

    try:
        yield run
    finally:
        os.close(fd)


@contextmanager
def dl_append(
    work: Path, data: SingleData, *, records: int, fsync: str
) -> Iterator[Callable[[], None]]:
    """One ``Stream.append(value)`` per record (log closed untimed: each append returned
    only once its record was as durable as the policy promises)."""
    log, stream = _open_stream(work / "log", fsync=fsync)

    def run() -> None:
        append = stream.append
        for value in islice(cycle(data.values), records):
            append(value)

    try:
        yield run
    finally:
        log.close()


# ------------------------------------------------------------------------- writer


@contextmanager
def future_floor(work: Path, data: SingleData, *, records: int) -> Iterator[Callable[[], None]]:
    """The floor of any future-per-record API: build one ``concurrent.futures.Future`` and
    resolve it, per record, with no I/O at all."""

    def run() -> None:
        for offset in range(records):
            Future().set_result(offset)

    yield run


@contextmanager
def dl_writer(
    work: Path, data: SingleData, *, records: int, streams: int
) -> Iterator[Callable[[], None]]:
    """``Writer.append(stream, value)`` round-robin over ``streams`` streams, then flush."""
    log = disklesslog.open(work / "log")  # the default fsync policy ("interval")
    names = [f"s{i}" for i in range(streams)]
    for name in names:
        _ = log.create_stream(name).end_offset
    writer = log.writer()

    def run() -> None:
        append = writer.append
        for name, value in zip(cycle(names), islice(cycle(data.values), records)):
            append(name, value)
        writer.flush()

    try:
        yield run
    finally:
        writer.close()
        log.close()


# ------------------------------------------------------------------- many streams


@contextmanager
def many_streams_log(work: Path, *, streams: int) -> Iterator[Path]:
    """A local log with ``streams`` empty streams, shared by the repetitions (creating
    10,000 streams takes tens of seconds here)."""
    path = work / "many"
    with disklesslog.open(path, fsync="never") as log:
        for i in range(streams):
            log.create_stream(f"s{i}")
    yield path


@contextmanager
def dl_round_robin(
    work: Path, path: Path, *, streams: int, records: int, max_open: int, fsync: str
) -> Iterator[Callable[[], None]]:
    """One ``Stream.append`` of 100 B per record, round-robin over the first ``streams``
    streams, with ``max_open_streams=max_open``. Every stream is opened once untimed
    (the first open of a store runs recovery), so the timed run measures the steady
    state: with more streams than ``max_open``, each append reopens a parked stream and
    parks another."""
    log = disklesslog.open(path, fsync=fsync, max_open_streams=max_open)
    handles = [log.stream(f"s{i}") for i in range(streams)]
    for stream in handles:
        _ = stream.end_offset
    value = b"v" * 100

    def run() -> None:
        for stream in islice(cycle(handles), records):
            stream.append(value)

    try:
        yield run
    finally:
        log.close()


# --------------------------------------------------------------------------- read


@dataclass
class ReadData:
    log: Path
    segment_files: list[Path]
    sqlite: Path
    pq_file: Path
    pq_sqlite: Path


@contextmanager
def dl_read(work: Path, data: ReadData, *, method: str) -> Iterator[Callable[[], None]]:
    """Drain ``Stream.<method>()``: ``read`` (Record objects), ``read_batches`` (columns)
    or ``read_offsets`` (offsets alone)."""
    log, stream = _open_stream(data.log)
    read = getattr(stream, method)

    def run() -> None:
        _drain(read())

    try:
        yield run
    finally:
        log.close()


@contextmanager
def raw_read(work: Path, data: ReadData, *, passes: int) -> Iterator[Callable[[], None]]:
    """``f.read(1 MiB)`` over the stream's segment files until EOF, ``passes`` times:
    the bytes, no decoding."""

    def run() -> None:
        for _ in range(passes):
            for path in data.segment_files:
                with open(path, "rb", buffering=0) as f:
                    read = f.read
                    while read(1 << 20):
                        pass

    yield run


def write_read_log(path: Path, value_size: int, batches: int) -> list[Path]:
    """The log the read workloads read: ``batches`` batches of BATCH records."""
    pool = [random_values(BATCH, value_size) for _ in range(POOL)]
    with disklesslog.open(path, fsync="never") as log:
        stream = log.create_stream(STREAM)
        for values in islice(cycle(pool), batches):
            stream.append_batch(values)
    return sorted((path / "streams" / STREAM).glob("*.log"))


# ----------------------------------------------------------------------- recovery


@dataclass
class RecoveryData:
    clean: Path
    crashed: Path
    records: int


@contextmanager
def recovery_images(work: Path, *, records: int, value_size: int) -> Iterator[RecoveryData]:
    """A stream of ``records`` single-record entries, copied while its writer still had
    it open (what a killed process leaves: every byte written, no clean close), and the
    same stream after ``close()``. Written with fsync="never", so the crashed image's
    recovery point is still at the start of the segment: the worst case."""
    live = work / "live"
    values = random_values(1000, value_size)
    log, stream = _open_stream(live, fsync="never")
    try:
        for value in islice(cycle(values), records):
            stream.append(value)
        shutil.copytree(live, work / "crashed")
    finally:
        log.close()
    live.rename(work / "clean")
    yield RecoveryData(work / "clean", work / "crashed", records)


@contextmanager
def dl_reopen(work: Path, data: RecoveryData, *, crashed: bool) -> Iterator[Callable[[], None]]:
    """Time ``disklesslog.open(path)`` plus the first ``end_offset`` (which opens the
    stream, recovering it if needed) on a fresh copy of the image."""
    target = work / "log"
    shutil.copytree(data.crashed if crashed else data.clean, target)
    opened: list[disklesslog.Log] = []

    def run() -> None:
        log = disklesslog.open(target)
        opened.append(log)
        end = log.stream(STREAM).end_offset
        if end != data.records:
            raise AssertionError(f"recovered {end} records, expected {data.records}")

    try:
        yield run
    finally:
        for log in opened:
            log.close()
