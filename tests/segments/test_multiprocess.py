"""Several processes on one local log: appends serialise on the stream's lock, readers
in other processes see only complete batches, and structural changes (rolls, trims,
deletes) made by one process are seen by the others."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from workers import STREAM_CONFIG, append_worker, prefix_reader

import disklesslog
from disklesslog.segments.index import OFFSET_ENTRY, TIME_ENTRY, SparseIndex

SPAWN = multiprocessing.get_context("spawn")


def _check_interleaving(directory: Path, processes: int, per_process: int) -> None:
    with disklesslog.open(directory, fsync="never") as log:
        records = list(log.stream("s").read())
    assert [r.offset for r in records] == list(range(processes * per_process))
    values = [r.value for r in records]
    assert len(set(values)) == len(values)
    for tag in range(processes):
        mine = [v for v in values if v.startswith(b"%d:" % tag)]
        assert mine == [b"%d:%d" % (tag, i) for i in range(per_process)]


@pytest.mark.parametrize("fsync", ["never", "always"])
def test_four_processes_append_to_one_stream(tmp_path: Path, fsync: str) -> None:
    per_process = 1500 if fsync == "never" else 300
    with ProcessPoolExecutor(4, mp_context=SPAWN) as pool:
        futures = [
            pool.submit(append_worker, str(tmp_path), tag, per_process, fsync) for tag in range(4)
        ]
        for future in futures:
            future.result(timeout=120)
    _check_interleaving(tmp_path, 4, per_process)
    segments = list((tmp_path / "streams" / "s").glob("*.log"))
    assert len(segments) > 3, "the processes never raced on a segment roll"


def test_reader_process_sees_only_complete_prefixes(tmp_path: Path) -> None:
    per_process = 1500
    with disklesslog.open(tmp_path) as log:
        log.create_stream("s", **STREAM_CONFIG)
    with ProcessPoolExecutor(4, mp_context=SPAWN) as pool:
        reader = pool.submit(prefix_reader, str(tmp_path), 2 * per_process, 120.0)
        writers = [
            pool.submit(append_worker, str(tmp_path), tag, per_process, "never") for tag in range(2)
        ]
        for future in writers:
            future.result(timeout=120)
        assert reader.result(timeout=120) == ""
    _check_interleaving(tmp_path, 2, per_process)


def _append_then_report(directory: str, values: list[bytes]) -> int:
    with disklesslog.open(directory, fsync="never") as log:
        return log.stream("s").append_batch(values)[0]


def _trim(directory: str, before: int) -> int:
    with disklesslog.open(directory, fsync="never") as log:
        log.stream("s").trim(before)
        return log.stream("s").start_offset


def _delete(directory: str) -> None:
    with disklesslog.open(directory, fsync="never") as log:
        log.delete_stream("s")


def test_changes_by_other_processes_are_seen(tmp_path: Path) -> None:
    """A long-lived log object keeps working while other processes roll, trim and delete."""
    with (
        disklesslog.open(tmp_path, fsync="never") as log,
        ProcessPoolExecutor(1, mp_context=SPAWN) as pool,
    ):
        stream = log.create_stream("s", segment_bytes=4096)
        stream.append_batch([b"mine-%d" % i for i in range(10)])
        base = pool.submit(_append_then_report, str(tmp_path), [b"x" * 500] * 40).result()
        assert base == 10
        assert stream.end_offset == 50  # their appends (and rolls) are visible here
        assert stream.append(b"after") == 50
        assert pool.submit(_trim, str(tmp_path), 30).result() == 30
        assert stream.start_offset == 30
        with pytest.raises(disklesslog.OffsetOutOfRange):
            list(stream.read(10))
        assert [r.offset for r in stream.read()] == list(range(30, 51))
        pool.submit(_delete, str(tmp_path)).result()
        with pytest.raises(disklesslog.StreamNotFound):
            stream.end_offset  # noqa: B018
        assert stream.append(b"reborn") == 0


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(10))
def test_four_processes_race_repeatedly(tmp_path: Path, round_no: int) -> None:
    per_process = 5000
    with ProcessPoolExecutor(4, mp_context=SPAWN) as pool:
        futures = [
            pool.submit(append_worker, str(tmp_path), tag + 10 * round_no, per_process, "never")
            for tag in range(4)
        ]
        for future in futures:
            future.result(timeout=300)
    with disklesslog.open(tmp_path, fsync="never") as log:
        records = list(log.stream("s").read())
    assert [r.offset for r in records] == list(range(4 * per_process))
    values = [r.value for r in records]
    assert len(set(values)) == len(values)
    for tag in range(10 * round_no, 10 * round_no + 4):
        mine = [v for v in values if v.startswith(b"%d:" % tag)]
        assert mine == [b"%d:%d" % (tag, i) for i in range(per_process)]


def _open_new_and_append(directory: str, tag: int) -> int:
    with disklesslog.open(directory, fsync="never") as log:
        return log.stream("s").append(b"%d" % tag)


def test_many_processes_create_one_new_log_at_once(tmp_path: Path) -> None:
    """A log (and its first stream) created by 8 processes at the same moment."""
    with ProcessPoolExecutor(8, mp_context=SPAWN) as pool:
        pool.submit(int).result()  # start the workers before the race
        for attempt in range(30):
            directory = str(tmp_path / f"new-{attempt}")
            offsets = [
                f.result(timeout=60)
                for f in [pool.submit(_open_new_and_append, directory, t) for t in range(8)]
            ]
            assert sorted(offsets) == list(range(8))
            with disklesslog.open(directory, create=False) as log:
                assert sorted(r.value for r in log.stream("s").read()) == sorted(
                    b"%d" % t for t in range(8)
                )


def test_an_index_cut_short_by_another_process_is_written_again_not_holed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process killed while its open rebuilt the active segment's index tail (recovery
    cuts the entries after the recovery point and writes them again) leaves the files
    shorter than a live writer's memory of them. The writer's next entries must not go
    past the end: that left a hole of zeros the checksum failed, and every later open
    rebuilt the indexes with a warning. The writer writes them whole from memory."""
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", index_interval_bytes=64)
        for i in range(40):  # a new max timestamp at every index entry
            stream.append(b"%04d" % i * 10, timestamp=1_000 + i)
        (index_path,) = tmp_path.rglob("*.index")
        (time_path,) = tmp_path.rglob("*.timeindex")
        for path, entry in ((index_path, OFFSET_ENTRY), (time_path, TIME_ENTRY)):
            cut = SparseIndex(path, entry)
            assert cut.load(max_key=2**63 - 1, max_value=2**32 - 1)
            assert len(cut) > 10
            cut.truncate(5)  # what the killed open left: a consistent, shorter file
        for i in range(40, 80):
            stream.append(b"%04d" % i * 10, timestamp=1_000 + i)
        size = (index_path.with_suffix(".log")).stat().st_size
    for path, entry in ((index_path, OFFSET_ENTRY), (time_path, TIME_ENTRY)):
        written = SparseIndex(path, entry)
        assert written.load(max_key=2**63 - 1, max_value=size, strict=True), path.name
        assert len(written) > 20  # the entries of all 80 records, not 5 and a hole
    assert "cut short by another process" in caplog.text
    caplog.clear()
    with disklesslog.open(tmp_path) as log:
        assert [r.value for r in log.stream("s").read()][-1] == b"0079" * 10
    assert "rebuilding" not in caplog.text
