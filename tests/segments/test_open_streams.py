"""Many streams in one process: a local log keeps at most ``max_open_streams`` streams'
descriptors open (two each), parks the others and reopens them on use, so a process
under the common ``ulimit -n 1024`` reads and writes any number of streams; running out
of descriptors anyway is a ``TooManyOpenFiles`` that says what to do, and the log goes on.

The tests that need the limit run in a child process that lowers its own limit first
(``resource.setrlimit``), so the test process keeps its own."""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import disklesslog

SPAWN = multiprocessing.get_context("spawn")
LIMIT = 1024
SLACK = 4
"""Files the log may hold open besides its open streams': the fsync thread syncs a
parked stream through two of its own, and a read in progress holds a segment file."""


def _run_limited(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a new process whose descriptor limit is ``ulimit -n 1024``."""
    with ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
        return pool.submit(_limited, function, *args).result(timeout=3000)


def _limited(function: Callable[..., Any], *args: Any) -> Any:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, hard))
    return function(*args)


def _open_under(directory: Path) -> list[str]:
    """The files this process has open under ``directory`` (from /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the descriptor listing the directory itself
            continue
        if target.startswith(str(directory) + os.sep):
            found.append(target)
    return found


def _write_and_read(directory: str, streams: int) -> tuple[int, float]:
    """Append to ``streams`` streams twice over, read every one back; the largest number
    of the log's files open at once (checked every 1,000 streams), and seconds taken."""
    began = time.monotonic()
    root = Path(directory)
    most = 0
    with disklesslog.open(directory, fsync="never") as log:
        assert log.max_open_streams == LIMIT // 4
        for round_no in range(2):
            for i in range(streams):
                assert log.stream(f"s{i}").append(b"%d-%d" % (round_no, i)) == round_no
                if i % 1000 == 0:
                    most = max(most, len(_open_under(root)))
        for i in range(streams):
            assert [r.value for r in log.stream(f"s{i}").read()] == [b"0-%d" % i, b"1-%d" % i]
            if i % 1000 == 0:
                most = max(most, len(_open_under(root)))
    with disklesslog.open(directory, fsync="never") as log:  # and after reopening the log
        for i in range(0, streams, max(1, streams // 500)):
            assert log.stream(f"s{i}").end_offset == 2
    return most, time.monotonic() - began


def test_5000_streams_are_written_and_read_back_under_ulimit_1024(tmp_path: Path) -> None:
    most, _ = _run_limited(_write_and_read, str(tmp_path), 5000)
    assert most <= 2 * (LIMIT // 4) + SLACK


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_20000_streams_are_written_and_read_back_under_ulimit_1024(tmp_path: Path) -> None:
    """80 times the bound; the 100,000 streams of the goal take 10-25 minutes here,
    mostly creating their directories, so ``benchmarks/probes.py streams`` measures
    those instead of every test run."""
    most, seconds = _run_limited(_write_and_read, str(tmp_path), 20_000)
    assert most <= 2 * (LIMIT // 4) + SLACK
    print(f"20,000 streams written twice and read back in {seconds:.0f} s")


def test_the_bound_is_honoured_by_appends_writers_and_reads(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="interval", max_open_streams=50) as log:
        assert log.max_open_streams == 50
        for i in range(400):
            log.stream(f"s{i}").append(b"a")
        assert len(_open_under(tmp_path)) <= 100 + SLACK
        with log.writer(linger_ms=0) as writer:
            for i in range(400):
                writer.append(f"s{i}", b"b")
        assert len(_open_under(tmp_path)) <= 100 + SLACK
        for i in range(400):
            assert [r.value for r in log.stream(f"s{i}").read()] == [b"a", b"b"]
            assert log.stream(f"s{i}").end_offset == 2
        assert len(_open_under(tmp_path)) <= 100 + SLACK
        time.sleep(1.2)  # the fsync thread syncs parked streams through files of its own
        assert len(_open_under(tmp_path)) <= 100 + SLACK
        assert log.metrics()["appended_records"] == 800


def test_threads_share_a_small_bound(tmp_path: Path) -> None:
    failures: list[BaseException] = []
    with disklesslog.open(tmp_path, fsync="never", max_open_streams=4) as log:
        for i in range(12):
            log.create_stream(f"s{i}")

        def work(tag: int) -> None:
            try:
                for round_no in range(30):
                    for i in range(12):
                        log.stream(f"s{i}").append(b"%d:%d" % (tag, round_no))
                        list(log.stream(f"s{(i + tag) % 12}").read(max_records=3))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(tag,)) for tag in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures
        for i in range(12):
            records = list(log.stream(f"s{i}").read())
            assert [r.offset for r in records] == list(range(180))
            for tag in range(6):
                mine = [r.value for r in records if r.value.startswith(b"%d:" % tag)]
                assert mine == [b"%d:%d" % (tag, n) for n in range(30)]
        assert len(_open_under(tmp_path)) <= 8 + SLACK


def _append_elsewhere(directory: str, stream: str, count: int, tag: bytes) -> list[int]:
    with disklesslog.open(directory, fsync="never") as log:
        return [log.stream(stream).append(tag + b"%d" % i) for i in range(count)]


def _recreate_elsewhere(directory: str, stream: str) -> None:
    with disklesslog.open(directory, fsync="never") as log:
        log.delete_stream(stream)
        log.stream(stream).append(b"new")


def test_a_parked_stream_catches_up_with_other_processes(tmp_path: Path) -> None:
    directory = str(tmp_path)
    with (
        disklesslog.open(tmp_path, fsync="interval", max_open_streams=1) as log,
        ProcessPoolExecutor(1, mp_context=SPAWN) as pool,
    ):
        stream = log.create_stream("s", segment_bytes=2048, index_interval_bytes=128)
        expected: list[bytes] = []
        for round_no in range(6):
            expected += [b"mine-%d-%d" % (round_no, i) for i in range(20)]
            for value in expected[-20:]:
                stream.append(value)
            log.stream("other").append(b"x")  # parks "s": one stream may stay open
            assert not any("/streams/s/" in path for path in _open_under(tmp_path))
            # Another process appends meanwhile (rolling segments: 2 KiB each).
            tag = b"theirs-%d-" % round_no
            offsets = pool.submit(_append_elsewhere, directory, "s", 40, tag).result(timeout=120)
            assert offsets == list(range(len(expected), len(expected) + 40))
            expected += [tag + b"%d" % i for i in range(40)]
            assert stream.end_offset == len(expected)  # reopened: sees their records
            assert stream.append(b"after-%d" % round_no) == len(expected)  # offsets go on
            expected.append(b"after-%d" % round_no)
            log.stream("other").append(b"x")
            assert [r.value for r in stream.read()] == expected
        assert len(list((tmp_path / "streams" / "s").glob("*.log"))) > 3
        # Deleted and created again by another process while parked: the new stream.
        log.stream("other").append(b"x")
        pool.submit(_recreate_elsewhere, directory, "s").result(timeout=120)
        assert [r.value for r in stream.read()] == [b"new"]
        assert stream.append(b"next") == 1
    with disklesslog.open(tmp_path) as log:
        assert [r.value for r in log.stream("s").read()] == [b"new", b"next"]


def _consume_all(directory: str, streams: int) -> int:
    with disklesslog.open(directory, fsync="never") as log:
        for i in range(streams):
            log.stream(f"s{i}").append_batch([b"%d-a" % i, b"%d-b" % i])
        with log.consumer("g", [f"s{i}" for i in range(streams)], idle_timeout=0) as consumer:
            seen = {}
            for name, record in consumer:
                seen[(name, record.offset)] = record.value
            consumer.commit()
        assert log.committed_offsets("g") == {f"s{i}": 2 for i in range(streams)}
    assert seen == {
        (f"s{i}", offset): b"%d-%s" % (i, side)
        for i in range(streams)
        for offset, side in enumerate((b"a", b"b"))
    }
    return len(seen)


def test_a_consumer_of_thousands_of_streams_under_ulimit_1024(tmp_path: Path) -> None:
    assert _run_limited(_consume_all, str(tmp_path), 2000) == 4000


def _spark_read_all(directory: str, streams: int) -> tuple[int, int]:
    """What a Spark batch read does, without a JVM: the driver plans every stream (their
    offsets), then each task opens the log and reads its range. Rows read, and the most
    files of the log the planning process held open at once."""
    from disklesslog.spark.options import parse_read_options
    from disklesslog.spark.read import plan_batch, read_partition
    from disklesslog.spark.schema import arrow_schema, read_schema

    with disklesslog.open(directory, fsync="never") as log:
        for i in range(streams):
            log.stream(f"s{i}").append_batch([b"%d-a" % i, b"%d-b" % i])
    options = parse_read_options({"url": directory, "streampattern": "s[0-9]+"})
    parts = plan_batch(options)
    most = len(_open_under(Path(directory)))
    schema = arrow_schema(read_schema(False))
    rows = 0
    for part in parts:
        for batch in read_partition(options.log, part, schema, True):
            rows += batch.num_rows
        most = max(most, len(_open_under(Path(directory))))
    return rows, most


@pytest.mark.slow  # 30 s: each of the 1,200 tasks opens and closes the log, as Spark's do
def test_a_spark_read_of_more_streams_than_descriptors_under_ulimit_1024(tmp_path: Path) -> None:
    rows, most = _run_limited(_spark_read_all, str(tmp_path), 1200)
    assert rows == 2400
    assert most <= SLACK  # every log the read opened is closed again


def _run_out_of_descriptors(directory: str) -> str:
    log = disklesslog.open(directory, fsync="never")
    log.stream("a").append(b"1")
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        with pytest.raises(disklesslog.TooManyOpenFiles) as caught:
            log.stream("b").append(b"x")
        assert isinstance(caught.value, disklesslog.StorageError)
    finally:
        for fd in held:
            os.close(fd)
    # Usable again once descriptors are free: nothing of the failed call is visible.
    assert log.stream("b").append(b"x") == 0
    assert [r.value for r in log.stream("a").read()] == [b"1"]
    assert [r.value for r in log.stream("b").read()] == [b"x"]
    log.close()
    return str(caught.value)


def test_running_out_of_descriptors_is_a_typed_error_saying_what_to_do(tmp_path: Path) -> None:
    message = _run_limited(_run_out_of_descriptors, str(tmp_path))
    assert "max_open_streams" in message and "ulimit -n: 1024" in message


@pytest.mark.parametrize("bad", [0, -1, 1_000_001, 2.5, "10", True])
def test_a_bad_max_open_streams_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(disklesslog.ConfigError, match=r"max_open_streams must be an int in 1\.\."):
        disklesslog.open(tmp_path / "log", max_open_streams=bad)
    assert not (tmp_path / "log").exists()


def test_the_default_is_a_quarter_of_the_descriptor_limit(tmp_path: Path) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    with disklesslog.open(tmp_path) as log:
        assert log.max_open_streams == max(16, min(soft, 1 << 20) // 4)


def _object_log_streams(directory: str, streams: int) -> list[str]:
    """The log's files open after ``streams`` streams were written and read back."""
    with disklesslog.open(directory, backend="objects") as log:
        for i in range(streams):
            log.stream(f"s{i}").append(b"x")
        for i in range(streams):
            assert [r.value for r in log.stream(f"s{i}").read()] == [b"x"]
        return _open_under(Path(directory))


def test_an_object_log_holds_no_descriptor_per_stream(tmp_path: Path) -> None:
    """Object logs keep no file open per stream: only their SQLite sequencer's database
    files (a connection or two); objects and cache files are opened per request. So
    they need no bound."""
    files = _run_limited(_object_log_streams, str(tmp_path), 1500)
    assert all(Path(path).name.startswith("disklesslog-meta.db") for path in files)
    assert len(files) <= 12
