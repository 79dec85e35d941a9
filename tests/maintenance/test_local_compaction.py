"""Key compaction of local segment logs: what the contract cannot see from outside.

Segments that lose every record become empty files; small segments are grouped; the
checkpoint and dirty ratio follow Kafka's arithmetic; indexes and time lookups are
right after a swap; other processes and old snapshots keep reading correctly while
segment files are replaced; and the swap survives a crash at every one of its steps
(deterministic crash points) and at random moments (SIGKILL), with recovery finishing
or rolling it back and leaving nothing behind.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import shutil
import signal
import time
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import kill_points
import pytest
from kill_points import Forked
from local_compaction_workers import (
    CONFIG,
    DELETE_RETENTION_MS,
    INDEX_INTERVAL,
    NOW,
    SEGMENT_BYTES,
    compact,
    read,
    write,
)

import disklesslog
from disklesslog import ConfigError, CorruptDataError, InvalidStreamName, cli
from disklesslog.segments import swap
from disklesslog.segments.layout import (
    CHECKPOINT,
    CLEANER_LOCK,
    INTENT,
    STAGING,
    STATE,
    STATE_COPY,
    list_segments,
    segment_name,
)
from disklesslog.segments.layout import CONFIG as STREAM_CONFIG
from disklesslog.segments.segment import Segment

SPAWN = multiprocessing.get_context("spawn")
HORIZON = NOW - DELETE_RETENTION_MS
Row = tuple[int, int, bytes | None, bytes | None]  # offset, timestamp, key, value
SWAP_STEPS = [
    "staging",  # a group half written in the staging directory
    "staged",  # every new segment staged and synced, before the stream lock
    "intent",  # the commit point: the intent is durable
    "flagged",  # the state record says a swap is under way
    "renamed-first",  # one staged file renamed into place
    "renamed",  # all renamed
    "unlinked",  # replaced segments unlinked, directory synced
    "checkpointed",  # the checkpoint moved
    "state",  # flag cleared, new generation
    "intent-removed",  # intent gone, staging directory not yet
]
COMMITTED = SWAP_STEPS.index("intent")


# ------------------------------------------------------------------- helpers


def _open(path: Path, **options: object) -> disklesslog.Log:
    return disklesslog.open(path, fsync=options.pop("fsync", "never"), **options)


def _write(
    log: disklesslog.Log,
    rows: Sequence[tuple[bytes, bytes | None, int]],
    per: int,
    **config: object,
) -> None:
    """Append ``(key, value, timestamp)`` rows to stream "s" (created with ``CONFIG``
    and ``config`` if it is new), ``per`` to a batch."""
    stream = log.stream("s") if "s" in log else log.create_stream("s", **{**CONFIG, **config})
    for i in range(0, len(rows), per):
        part = rows[i : i + per]
        stream.append_batch(
            [r[1] for r in part], keys=[r[0] for r in part], timestamps=[r[2] for r in part]
        )


def _random_rows(seed: int, count: int, keys: int) -> list[tuple[bytes, bytes | None, int]]:
    """Keyed rows, some tombstones, all old enough for their tombstones to be dropped."""
    rng = random.Random(seed)
    return [
        (
            b"key-%03d" % rng.randrange(keys),
            None if rng.random() < 0.1 else b"v%06d-" % i + b"x" * rng.randrange(40, 120),
            NOW - 20_000 + i,
        )
        for i in range(count)
    ]


def _rows(log: disklesslog.Log) -> list[Row]:
    return [(r.offset, r.timestamp, r.key, r.value) for r in log.stream("s").read()]


def _model(rows: Sequence[Row], below: int, horizon: int = HORIZON) -> list[Row]:
    """Compaction of the offsets below ``below``: the latest row of each key there
    (without tombstones older than ``horizon``), and every row from ``below`` on."""
    last = {key: offset for offset, _, key, _ in rows if offset < below}
    return [
        row
        for row in rows
        if row[0] >= below or (last[row[2]] == row[0] and not (row[3] is None and row[1] < horizon))
    ]


def _segments(log: disklesslog.Log) -> list[tuple[int, int, int]]:
    """``(base, end, bytes)`` of every segment, the active one last."""
    details = log.stream("s").info().details["segments"]
    return [(s["base_offset"], s["end_offset"], s["bytes"]) for s in details]


def _active_base(log: disklesslog.Log) -> int:
    return _segments(log)[-1][0]


def _stream_dir(path: Path) -> Path:
    return path / "streams" / "s"


def _assert_tidy(path: Path) -> None:
    """Nothing of a compaction is left but the lock file and the checkpoint, and every
    index file belongs to a segment."""
    directory = _stream_dir(path)
    names = set(os.listdir(directory))
    assert STAGING not in names and INTENT not in names, sorted(names)
    bases = {segment_name(base, ".log")[:-4] for base in list_segments(directory)}
    for name in names - {STREAM_CONFIG, STATE, STATE_COPY, CLEANER_LOCK, CHECKPOINT}:
        stem, _, suffix = name.partition(".")
        assert suffix in ("log", "index", "timeindex") and stem in bases, name


def _assert_indexes_valid(path: Path, log: disklesslog.Log) -> None:
    """The index files of every closed segment are exactly what a rebuild from the
    segment's entries produces (the rule of docs/format.md 2.4)."""
    directory = _stream_dir(path)
    closed = _segments(log)[:-1]
    for base, end, size in closed:
        paths = [directory / segment_name(base, s) for s in (".index", ".timeindex")]
        on_disk = [path.read_bytes() if path.exists() else b"" for path in paths]
        seg = Segment(directory, base, INDEX_INTERVAL, compacted=True)
        seg.size, seg.end_offset = size, end
        seg.rebuild_indexes(log.stream("s").config.max_batch_bytes)
        rebuilt = [path.read_bytes() for path in paths]
        assert on_disk == rebuilt, f"indexes of segment {base}"


def _compacted(
    path: Path, seed: int = 1, count: int = 900, keys: int = 40, **config: object
) -> list[Row]:
    """A fresh log at ``path`` with ``count`` random rows in stream "s" (``CONFIG``
    and ``config``); returns them as read."""
    with _open(path) as log:
        _write(log, _random_rows(seed, count, keys), per=10, **config)
        return _rows(log)


# ------------------------------------------------------------ local specifics


def test_segments_compacted_away_become_empty_files(tmp_path: Path) -> None:
    """Segments whose every record is superseded become one empty segment file (the
    next segment is too big to join their group); reads, indexes, time lookups and
    reopening all accept it."""
    with _open(tmp_path) as log:
        old = [(b"gone", b"x" * 100, NOW - 100 + i) for i in range(80)]  # ~2 segments
        _write(log, old, per=10)
        big = [(b"big-%02d" % i, b"y" * 100, NOW) for i in range(35)]  # one batch, ~4 KiB
        _write(log, big, per=35)
        _write(log, [(b"gone", None, NOW)] + [(b"new", b"z", NOW)] * 40, per=41)
        _write(log, big, per=35)  # closes the segment of the tombstone
        _write(log, [(b"tail", b"t", NOW)], per=1)
        before = _rows(log)
        report = log.compact(now_ms=NOW)
        segments = _segments(log)
        assert report.changed, report.summary()
        assert segments[0][0] == 0 and segments[0][2] == 0, segments  # an empty file
        assert segments[0][1] == 80  # that still covers the superseded offsets
        assert _rows(log) == _model(before, _active_base(log))
        assert [r.offset for r in log.stream("s").read(0, 100)] == list(range(80, 100))
        assert log.stream("s").offset_for_time(NOW - 100) == 80
        assert log.stream("s").start_offset == 0
        _assert_indexes_valid(tmp_path, log)
        after = _rows(log)
    for suffix in (".index", ".timeindex"):  # lost indexes of an empty segment: rebuilt
        (_stream_dir(tmp_path) / segment_name(0, suffix)).unlink()
    with _open(tmp_path) as log:
        assert _rows(log) == after
        assert log.stream("s").offset_for_time(0) == 80
        assert log.compact(now_ms=NOW, force=True).records_removed == 0
        assert _rows(log) == after
    _assert_tidy(tmp_path)


def test_an_empty_segment_is_damage_on_a_stream_that_is_not_compacted(tmp_path: Path) -> None:
    """The allowance is for compacted streams only: elsewhere a closed segment file
    emptied by damage fails reads and index rebuilds instead of hiding records."""
    with _open(tmp_path, segment_bytes=4096) as log:
        log.stream("plain").append_batch([b"x" * 100] * 40)
        log.stream("plain").append_batch([b"y" * 100] * 40)
        log.stream("plain").append(b"tail")
    directory = tmp_path / "streams" / "plain"
    os.truncate(directory / segment_name(0, ".log"), 0)
    for suffix in (".index", ".timeindex"):
        (directory / segment_name(0, suffix)).unlink(missing_ok=True)
    with _open(tmp_path) as log, pytest.raises(CorruptDataError):
        list(log.stream("plain").read())


def test_small_segments_are_grouped_into_one(tmp_path: Path) -> None:
    """Segments that shrink are rewritten together while the result fits in
    segment_bytes; groups stay contiguous and within the limit."""
    before = _compacted(tmp_path, seed=3, count=1200, keys=20)
    with _open(tmp_path) as log:
        closed_before = len(_segments(log)) - 1
        report = log.compact(now_ms=NOW)
        segments = _segments(log)
        assert report.segments_deleted == closed_before
        assert report.segments_written == len(segments) - 1 < closed_before / 5, report.summary()
        assert all(size <= SEGMENT_BYTES for _, _, size in segments)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(segments))  # contiguous
        assert _rows(log) == _model(before, segments[-1][0])
        _assert_indexes_valid(tmp_path, log)
        # A second pass finds nothing to remove and nothing worth regrouping.
        again = log.compact(now_ms=NOW, force=True)
        assert again.records_removed == 0 and not again.changed, again.summary()
        assert _segments(log) == segments


def test_checkpoint_and_dirty_ratio(tmp_path: Path) -> None:
    """The checkpoint is the cleanable end of the last pass; the dirty ratio is the
    bytes of closed segments from there over all closed bytes."""
    _compacted(tmp_path, seed=5, count=600, keys=400, min_cleanable_dirty_ratio=0.9)
    with _open(tmp_path) as log:
        log.compact(now_ms=NOW)
        end = _active_base(log)
        assert swap.read_checkpoint(_stream_dir(tmp_path)) == end
        _write(log, _random_rows(6, 150, 400), per=10)
        closed = _segments(log)[:-1]
        dirty = sum(size for base, _, size in closed if base >= end)
        ratio = dirty / sum(size for _, _, size in closed)
        report = log.compact("s", now_ms=NOW)
        assert report.skipped == [
            f"s: dirty ratio {ratio:.2f} is below min_cleanable_dirty_ratio 0.9 "
            "(force=True, or --force, compacts anyway)"
        ]
        forced = log.compact("s", now_ms=NOW, force=True)
        assert forced.actions[0].endswith(f"dirty ratio {ratio:.2f}"), forced.actions
        assert swap.read_checkpoint(_stream_dir(tmp_path)) == _active_base(log)
        # Nothing new since: no dirty bytes, ratio 0.
        assert "dirty ratio 0.00" in log.compact("s", now_ms=NOW).skipped[0]


def test_a_full_key_map_compacts_in_several_passes(tmp_path: Path) -> None:
    """A pass maps whole dirty segments until cleaner_max_keys keys are mapped and
    stops there (the checkpoint says where); the next passes go on from there, and
    the result is the same as one pass with room for every key."""
    before = _compacted(tmp_path, seed=7, count=900, keys=400)
    with _open(tmp_path, cleaner_max_keys=50) as log:
        end = _active_base(log)
        checkpoints = []
        for _ in range(40):
            log.compact(now_ms=NOW, force=True)
            checkpoints.append(swap.read_checkpoint(_stream_dir(tmp_path)))
            if checkpoints[-1] == end:
                break
        assert len(checkpoints) > 3 and checkpoints == sorted(checkpoints), checkpoints
        assert checkpoints[-1] == end
        assert _rows(log) == _model(before, end)


def test_time_lookups_and_reopening_after_a_swap(tmp_path: Path) -> None:
    before = _compacted(tmp_path, seed=9, count=900)
    with _open(tmp_path) as log:
        log.compact(now_ms=NOW)
        after = _rows(log)
        assert after == _model(before, _active_base(log))
        _assert_indexes_valid(tmp_path, log)
        stream = log.stream("s")
        for ts in range(NOW - 20_100, NOW - 19_000, 37):
            expected = next((o for o, t, _, _ in after if t >= ts), None)
            assert stream.offset_for_time(ts) == expected, ts
    with _open(tmp_path) as log:
        assert _rows(log) == after
    _assert_tidy(tmp_path)


def test_another_log_object_sees_the_swap(tmp_path: Path) -> None:
    """A second log object on the directory (as another process would) has cached the
    segments before the swap; it must not reuse them after it."""
    before = _compacted(tmp_path, seed=11)
    with _open(tmp_path) as reader_log, _open(tmp_path) as compactor_log:
        assert _rows(reader_log) == before
        pending = reader_log.stream("s").read()  # a snapshot taken before the swap
        compactor_log.compact(now_ms=NOW)
        expected = _model(before, _active_base(compactor_log))
        assert [(r.offset, r.timestamp, r.key, r.value) for r in pending] == expected
        assert _rows(reader_log) == expected
        assert reader_log.stream("s").offset_for_time(NOW - 20_000) == expected[0][0]


def test_a_read_in_progress_carries_on_across_a_swap(tmp_path: Path) -> None:
    """A read that is half way through when segments are swapped goes on from its
    position: it sees the old records before it and the survivors after it."""
    before = _compacted(tmp_path, seed=13, count=900)
    by_offset = {row[0]: row for row in before}
    with _open(tmp_path) as log:
        records = log.stream("s").read()
        seen = [next(records) for _ in range(100)]
        log.compact(now_ms=NOW)
        survivors = _model(before, _active_base(log))
        seen += list(records)
    rows = [(r.offset, r.timestamp, r.key, r.value) for r in seen]
    assert [r[0] for r in rows] == sorted({r[0] for r in rows})  # in order, no repeats
    assert all(by_offset[r[0]] == r for r in rows)  # nothing that was not written
    position = rows[99][0]
    later = [r for r in survivors if r[0] > position]
    assert set(later) <= set(rows)  # every survivor after the position was read


def test_dry_run_reports_what_a_pass_would_do(tmp_path: Path) -> None:
    _compacted(tmp_path, seed=15)
    directory = _stream_dir(tmp_path)

    def state() -> dict[str, tuple[int, int]]:
        return {p.name: (p.stat().st_ino, p.stat().st_size) for p in directory.iterdir()}

    with _open(tmp_path) as log:
        files = state()
        dry = log.compact(now_ms=NOW, dry_run=True)
        assert state() == files and CHECKPOINT not in files
        real = log.compact(now_ms=NOW)
    assert dry.dry_run and dry.actions == real.actions
    for name in ("records_removed", "bytes_removed", "segments_written", "bytes_written"):
        assert getattr(dry, name) == getattr(real, name) > 0, name


def test_report_counts_and_progress(tmp_path: Path) -> None:
    _compacted(tmp_path, seed=17)
    calls: list[tuple[str, int, int]] = []
    with _open(tmp_path) as log:
        sizes_before = {base: size for base, _, size in _segments(log)}
        report = log.compact(now_ms=NOW, progress=lambda *call: calls.append(call))
        sizes_after = {base: size for base, _, size in _segments(log)}
    assert report.streams == 1 and len(report.actions) == 1
    deleted = {base for base in sizes_before if sizes_after.get(base) != sizes_before[base]}
    deleted |= set(sizes_before) - set(sizes_after)
    assert report.segments_deleted == len(deleted)
    assert report.bytes_deleted == sum(sizes_before[base] for base in deleted)
    written = [base for base in sizes_after if base in deleted]
    assert report.segments_written == len(written)
    assert report.bytes_written == sum(sizes_after[base] for base in written)
    assert report.bytes_removed == report.bytes_deleted - report.bytes_written
    assert sum(sizes_after.values()) == sum(sizes_before.values()) - report.bytes_removed
    assert report.segments_read == len(sizes_before) - 1 and report.bytes_read > 0
    assert {task for task, _, _ in calls} == {"compact s"}
    assert [done for _, done, _ in calls] == sorted(done for _, done, _ in calls)
    assert calls[-1][1] == calls[-1][2] > 0


def test_a_compactor_elsewhere_makes_the_pass_skip(tmp_path: Path) -> None:
    before = _compacted(tmp_path, seed=19)
    with _open(tmp_path) as log, swap.cleaner_lock(_stream_dir(tmp_path)) as mine:
        assert mine
        report = log.compact(now_ms=NOW)
        assert report.skipped == ["s: another process is compacting it"]
        assert not report.changed and _rows(log) == before


def test_retention_during_a_pass_aborts_its_swap(tmp_path: Path) -> None:
    """A trim that deletes a segment the pass read makes the swap refuse; nothing is
    changed, and the next pass compacts what is left."""
    _compacted(tmp_path, seed=21)
    with _open(tmp_path) as log:
        stream = log.stream("s")
        cut = _segments(log)[2][0]
        trimmed = False

        def trim_once(task: str, done: int, total: int) -> None:
            nonlocal trimmed
            if done and not trimmed:
                trimmed = True
                stream.trim(cut)

        report = log.compact(now_ms=NOW, progress=trim_once)
        assert not report.changed and "deleted (by retention?)" in report.skipped[0], report
        kept = _rows(log)
        assert kept[0][0] >= cut
        assert log.compact(now_ms=NOW).changed
        assert _rows(log) == _model(kept, _active_base(log))
    _assert_tidy(tmp_path)


def test_maintain_compacts_compacted_streams_and_skips_the_others(tmp_path: Path) -> None:
    before = _compacted(tmp_path, seed=31)
    with _open(tmp_path) as log:
        log.stream("plain").append(b"x")
        skipped = log.maintain("plain", now_ms=NOW)
        assert "compaction: plain: cleanup_policy='delete'" in skipped.skipped
        report = log.maintain(now_ms=NOW)
        assert any(line.startswith("compaction: s: ") for line in report.actions), report
        assert _rows(log) == _model(before, _active_base(log))


def test_compact_and_delete_streams_get_both(tmp_path: Path) -> None:
    """cleanup_policy "compact,delete": retention drops the oldest segments, then
    compaction the superseded records of the rest."""
    before = _compacted(
        tmp_path, seed=35, count=900, cleanup_policy="compact,delete", retention_bytes=20_000
    )
    with _open(tmp_path) as log:
        report = log.maintain(now_ms=NOW)
        start = log.stream("s").start_offset
        assert start > 0 and any(line.startswith("compaction: s:") for line in report.actions)
        kept = [row for row in before if row[0] >= start]
        assert _rows(log) == _model(kept, _active_base(log))


def test_the_compact_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _compacted(tmp_path, seed=33, min_cleanable_dirty_ratio=1.0)
    assert cli.main(["compact", str(tmp_path), "--no-progress"]) == 0
    assert "segments rewritten into" in capsys.readouterr().out  # never compacted: ratio 1
    with _open(tmp_path) as log:
        _write(log, _random_rows(34, 100, 40), per=10)
        before = _rows(log)
    assert cli.main(["compact", str(tmp_path), "--stream", "s", "--no-progress"]) == 0
    assert "below min_cleanable_dirty_ratio 1.0" in capsys.readouterr().out
    assert cli.main(["compact", str(tmp_path), "--force", "--no-progress"]) == 0
    assert "segments rewritten into" in capsys.readouterr().out
    with _open(tmp_path) as log:
        assert _rows(log) == _model(before, _active_base(log))


def test_damage_stops_the_pass_of_its_stream_only(tmp_path: Path) -> None:
    """A corrupt closed segment is never rewritten: compacting that stream by name
    raises, compacting every stream reports it and goes on with the others."""
    before = _compacted(tmp_path, seed=37)
    with _open(tmp_path) as log:
        log.create_stream("other", **CONFIG).append_batch([b"x" * 2000] * 3, keys=[b"k"] * 3)
        log.stream("other").append(b"y", key=b"k")
        damaged = _stream_dir(tmp_path) / segment_name(_segments(log)[1][0], ".log")
    with damaged.open("r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with _open(tmp_path) as log:
        with pytest.raises(CorruptDataError):
            log.compact("s", now_ms=NOW)
        report = log.compact(now_ms=NOW)
        assert [line.split(":")[0] for line in report.skipped] == ["s"], report.skipped
        assert "not compacted: corrupt data in" in report.skipped[0]
        assert report.actions and report.actions[0].startswith("other: ")
    _assert_tidy(tmp_path)
    with _open(tmp_path) as log:  # the damage is where it was, for reads to report
        with pytest.raises(CorruptDataError, match=damaged.name):
            list(log.stream("s").read())
        tail = [r.offset for r in log.stream("s").read(_active_base(log))]
        assert tail == [row[0] for row in before if row[0] >= _active_base(log)]


def test_bad_requests_raise_typed_errors(tmp_path: Path) -> None:
    with _open(tmp_path) as log:
        with pytest.raises(InvalidStreamName):
            log.compact("../s")
        log.stream("plain").append(b"x")
        with pytest.raises(ConfigError, match="cleanup_policy"):
            log.compact("plain")
        assert log.compact().streams == 0  # only compacted streams are looked at
    with pytest.raises(ConfigError, match="cleaner_max_keys"):
        _open(tmp_path, cleaner_max_keys=0)


# ------------------------------------------------------- several processes


def _run_concurrently(path: Path, count: int) -> None:
    """A writer, a reader and a compactor process on one stream at once."""
    stop = path.parent / f"{path.name}.stop"
    with ProcessPoolExecutor(3, mp_context=SPAWN) as pool:
        reader = pool.submit(read, str(path), str(stop))
        compactor = pool.submit(compact, str(path), str(stop))
        deadline = time.monotonic() + 120  # spawned interpreters start slowly under load
        while not all(Path(f"{stop}.{who}-ready").exists() for who in ("reader", "compactor")):
            assert time.monotonic() < deadline, "reader or compactor never started"
            time.sleep(0.01)
        acked = pool.submit(write, str(path), count, 1).result(timeout=300)
        time.sleep(0.2)  # let the others see the last appends
        stop.touch()
        problem, seen, reads = reader.result(timeout=300)
        error, passes = compactor.result(timeout=300)
    assert problem == "" and error == "", (problem, error)
    assert reads > 0 and passes > 0, (reads, passes)
    written = {offset: (key, value) for offset, key, value in acked}
    for offset, crc in seen.items():  # readers saw only what was written, where it was
        assert zlib.crc32(written[offset][1]) == crc, offset
    with _open(path) as log:
        log.compact(now_ms=NOW, force=True)
        rows = [(offset, NOW, key, value) for offset, (key, value) in sorted(written.items())]
        assert _rows(log) == _model(rows, _active_base(log))  # nothing else was lost
    _assert_tidy(path)


def test_processes_append_read_and_compact_at_once(tmp_path: Path) -> None:
    _run_concurrently(tmp_path / "log", 1500)


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(3))
def test_processes_append_read_and_compact_at_once_longer(tmp_path: Path, round_no: int) -> None:
    _run_concurrently(tmp_path / "log", 12_000)


# ------------------------------------------------------------------ crashes


def _fork(action: str, path: Path, env: dict[str, str]) -> int:
    """Run ``action`` ("compact" or "open") on the log in a forked child with ``env``;
    the child's exit status (77: it crashed at the step ``env`` names)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.environ.update(env)
            with _open(path, fsync="always") as log:
                if action == "compact":
                    log.compact(now_ms=NOW, force=True)
                else:
                    log.stream("s").end_offset  # noqa: B018 - opening recovers
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("step", SWAP_STEPS)
def test_a_crash_at_each_step_of_the_swap(tmp_path: Path, step: str) -> None:
    """The swap is all or nothing at every step: before the intent, reopening shows
    the old records; from it on, recovery finishes the swap. Compacting again then
    completes, and nothing is left behind."""
    before = _compacted(tmp_path, seed=23, count=800, keys=60)
    with _open(tmp_path) as log:
        end = _active_base(log)
    assert _fork("compact", tmp_path, {swap.CRASH_ENV: step}) == 77, "the step was not reached"
    expected = _model(before, end)
    with _open(tmp_path) as log:
        assert _rows(log) == (before if SWAP_STEPS.index(step) < COMMITTED else expected)
        log.compact(now_ms=NOW, force=True)
        assert _rows(log) == expected
        assert swap.read_checkpoint(_stream_dir(tmp_path)) == end
        _assert_indexes_valid(tmp_path, log)
    _assert_tidy(tmp_path)


@pytest.mark.parametrize("again", ["renamed-first", "unlinked", "checkpointed"])
def test_a_crash_while_recovery_finishes_a_swap(tmp_path: Path, again: str) -> None:
    """Finishing a swap is idempotent: recovery itself may crash and be run again."""
    before = _compacted(tmp_path, seed=25, count=800, keys=60)
    with _open(tmp_path) as log:
        end = _active_base(log)
    assert _fork("compact", tmp_path, {swap.CRASH_ENV: "flagged"}) == 77
    assert _fork("open", tmp_path, {swap.CRASH_ENV: again}) == 77
    with _open(tmp_path) as log:
        assert _rows(log) == _model(before, end)
    _assert_tidy(tmp_path)


def test_a_lost_staged_segment_rolls_back_a_swap_that_had_not_started(tmp_path: Path) -> None:
    before = _compacted(tmp_path, seed=27, count=800, keys=60)
    assert _fork("compact", tmp_path, {swap.CRASH_ENV: "intent"}) == 77
    staged = sorted((_stream_dir(tmp_path) / STAGING).glob("*.log"))
    staged[-1].unlink()
    with _open(tmp_path) as log:
        assert _rows(log) == before  # rolled back
    _assert_tidy(tmp_path)


def test_a_lost_staged_segment_after_the_swap_began_is_reported(tmp_path: Path) -> None:
    _compacted(tmp_path, seed=27, count=800, keys=60)
    assert _fork("compact", tmp_path, {swap.CRASH_ENV: "renamed-first"}) == 77
    staged = sorted((_stream_dir(tmp_path) / STAGING).glob("*.log"))
    assert staged, "the test needs a swap of two groups or more"
    staged[-1].unlink()
    with pytest.raises(CorruptDataError, match="cannot be completed"):
        _open(tmp_path).stream("s").end_offset  # noqa: B018


def test_a_lost_staged_index_is_rebuilt(tmp_path: Path) -> None:
    before = _compacted(tmp_path, seed=29, count=800, keys=60)
    with _open(tmp_path) as log:
        end = _active_base(log)
    assert _fork("compact", tmp_path, {swap.CRASH_ENV: "renamed-first"}) == 77
    (_stream_dir(tmp_path) / STAGING / segment_name(0, ".index")).unlink()
    with _open(tmp_path) as log:
        assert _rows(log) == _model(before, end)
        _assert_indexes_valid(tmp_path, log)
    _assert_tidy(tmp_path)


def _compact_armed(path: Path, fsync: str, report: Path, stop_at: int | None) -> Forked:
    """Compact the log at ``path`` in a forked child that counts its file calls and
    stops at call ``stop_at`` (``kill_points``), marking where it starts writing the
    intent and each step of the swap."""
    report.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            kill_points.arm(report, stop_at)
            kill_points.marking(swap, "write_intent")
            crash_point = swap.crash_point

            def marked(step: str) -> None:
                kill_points.mark(step)
                crash_point(step)

            swap.crash_point = marked
            with _open(path, fsync=fsync) as log:
                log.compact(now_ms=NOW, force=True)
            kill_points.finish()
        except BaseException as exc:
            kill_points.finish(exc)
            code = 1
        os._exit(code)
    return Forked(pid)


KILL_WINDOWS = ["before the intent", "in the swap", "anywhere", "in the swap"]
"""Where the rounds of :func:`_kill_rounds` kill, in turn (half of them in the swap,
which is a few file calls of a pass)."""


def _kill_rounds(path: Path, rounds: int, seed: int) -> Iterator[str]:
    """Compact in a forked child and SIGKILL it inside the pass, ``rounds`` times,
    appending more between rounds. The kill lands at a file call drawn at random from
    a window of the pass (``KILL_WINDOWS``), by construction (tests/kill_points.py):
    a calibration run of the same pass on a copy of the log counts its calls, marks
    where the swap begins and ends, and shows the records the whole pass leaves.

    After each kill, reopening (recovery) shows the records from before the pass if
    the kill came before the intent existed, else those after it (never a mix); then
    compacting again gives exactly the model, and nothing is left behind. Yields what
    recovery did: "rolled back" or "completed"."""
    rng = random.Random(seed)
    written: list[Row] = []
    intent = _stream_dir(path) / INTENT
    copy, report = path.parent / f"{path.name}.copy", path.parent / f"{path.name}.kill-points"
    for round_no in range(rounds):
        with _open(path) as log:
            _write(log, _random_rows(seed * 1000 + round_no, 600, 50), per=rng.choice([5, 20]))
            before = _rows(log)
            written = _with_offsets(written, before)
        fsync = rng.choice(["always", "never"])
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(path, copy)
        child = _compact_armed(copy, fsync, report, None)
        calibration = kill_points.wait(report, child)
        assert child.join() == 0 and calibration.finished, calibration
        with _open(copy) as log:
            after = _rows(log)
        assert after != before, "the pass changed nothing"
        begins, ends = calibration.mark("write_intent"), calibration.mark("intent-removed")
        window = KILL_WINDOWS[round_no % len(KILL_WINDOWS)]
        first, last = {
            "before the intent": (1, begins),  # its first call is never made
            "in the swap": (calibration.mark("intent") + 1, ends),  # once it is durable
            "anywhere": (1, calibration.calls),
        }[window]
        stop_at = rng.randint(first, last)
        child = _compact_armed(path, fsync, report, stop_at)
        stopped = kill_points.wait(report, child)
        status = child.kill()
        assert stopped.stopped_at == stop_at, stopped
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        completed = intent.exists() or stop_at > calibration.mark("intent")
        assert completed == (window == "in the swap") or window == "anywhere", window
        yield "completed" if completed else "rolled back"
        with _open(path) as log:
            assert _rows(log) == (after if completed else before), f"{window}: call {stop_at}"
            end = _active_base(log)
            log.compact(now_ms=NOW, force=True)
            assert _rows(log) == _model(written, end)
        _assert_tidy(path)


def _with_offsets(written: list[Row], current: list[Row]) -> list[Row]:
    """Everything ever written: what was written before, plus the new rows (those past
    the previous end), which are all still there (only compaction removes rows)."""
    previous_end = written[-1][0] + 1 if written else 0
    return written + [row for row in current if row[0] >= previous_end]


def test_sigkill_during_compaction(tmp_path: Path) -> None:
    outcomes = list(_kill_rounds(tmp_path / "log", 8, seed=1))
    assert {"rolled back", "completed"} <= set(outcomes), outcomes


@pytest.mark.slow
def test_sigkill_during_compaction_many_times(tmp_path: Path) -> None:
    outcomes = list(_kill_rounds(tmp_path / "log", 80, seed=2))
    assert outcomes.count("rolled back") >= 20 and outcomes.count("completed") >= 40, outcomes
