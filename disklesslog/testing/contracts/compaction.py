"""Key compaction, the same contract on every backend.

After ``log.compact(...)`` a compacted stream holds, for the range that was compactable,
exactly what the reference model keeps (the latest record of each key; tombstones only
while younger than ``delete_retention_ms``), at unchanged offsets; its active tail is
untouched; reads skip the gaps; the dirty ratio decides when a pass runs; a dry run
changes nothing; bad input raises typed errors; and compaction runs safely while other
threads append and read.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import disklesslog
from disklesslog import ConfigError, InvalidRecordError, StreamNotFound

from .fixtures import LogFactory, LogFixtures

__all__ = ["CompactionContract"]

NOW = 50_000_000  # ms: the clock compaction runs with in these tests
DAY = 86_400_000
# Small segments (local) and a small tail (objects: the newest segment_bytes stay).
COMPACTED: dict[str, Any] = {
    "cleanup_policy": "compact",
    "segment_bytes": 4096,
    "delete_retention_ms": 10_000,
}

Row = tuple[int, int, bytes | None, bytes | None]  # offset, timestamp, key, value


def _write(
    log: disklesslog.Log,
    name: str,
    rows: Sequence[tuple[bytes, bytes | None, int]],
    per_batch: int,
) -> None:
    """Append ``(key, value, timestamp)`` rows, ``per_batch`` to a batch, in one flush."""
    with log.writer(linger_ms=60_000) as writer:
        for i in range(0, len(rows), per_batch):
            part = rows[i : i + per_batch]
            writer.append_batch(
                name,
                [r[1] for r in part],
                keys=[r[0] for r in part],
                timestamps=[r[2] for r in part],
            )


def _rows(log: disklesslog.Log, name: str) -> list[Row]:
    return [(r.offset, r.timestamp, r.key, r.value) for r in log.stream(name).read()]


def _model(rows: list[Row], compacted_below: int, horizon: int) -> list[Row]:
    """What compaction of offsets below ``compacted_below`` keeps: every later row, and
    of the earlier ones the latest per key (seen anywhere below ``compacted_below``),
    without tombstones older than ``horizon``."""
    last: dict[bytes | None, int] = {}
    for offset, _, key, _ in rows:
        if offset < compacted_below:
            last[key] = offset
    kept = []
    for row in rows:
        offset, ts, key, value = row
        expired = value is None and ts < horizon
        if offset >= compacted_below or (last[key] == offset and not expired):
            kept.append(row)
    return kept


def _random_rows(seed: int, count: int, keys: int) -> list[tuple[bytes, bytes | None, int]]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        key = b"key-%03d" % rng.randrange(keys)
        value = None if rng.random() < 0.1 else b"value-%06d-" % i + b"x" * rng.randrange(40, 120)
        rows.append((key, value, NOW - 20_000 + i))  # old rows' tombstones pass the horizon
    return rows


def _compacted_range(log: disklesslog.Log, name: str, before: list[Row], horizon: int) -> int:
    """The end of the range compaction went over: the offset ``x`` for which the model of
    compacting ``[0, x)`` is exactly the result. It is at or after the first offset whose
    row is still exactly as written from there to the end, but not necessarily there:
    the last rows of a compacted range stay as written (each is the latest of its key)
    while the older rows of their keys went, so the rows alone do not show where the
    range ended. Fails if no such ``x`` exists."""
    after = _rows(log, name)
    tail_start = after[-1][0] + 1 if after else 0
    by_offset = {r[0]: r for r in after}
    for row in reversed(before):
        if by_offset.get(row[0]) != row:
            break
        tail_start = row[0]
    end = before[-1][0] + 1 if before else 0
    for boundary in range(tail_start, end + 1):
        if after == _model(before, boundary, horizon):
            return boundary
    pytest.fail(f"no compacted range [0, x) with x >= {tail_start} explains the result")


class CompactionContract(LogFixtures):
    """Key compaction, against the reference model."""

    @pytest.mark.all_backends
    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_compaction_keeps_the_latest_record_per_key(
        self, log_factory: LogFactory, seed: int
    ) -> None:
        log = log_factory(**COMPACTED)
        rows = _random_rows(seed, 600, keys=40)
        _write(log, "s", rows, per_batch=25)
        before = _rows(log, "s")
        report = log.compact(now_ms=NOW)
        after = _rows(log, "s")
        assert report.changed and report.records_removed > 0, report.summary()
        end = log.stream("s").end_offset
        assert end == 600  # offsets never change: the end stays where it was
        # The compacted range ends before the tail that must stay untouched; everything in
        # it follows the model, and the model applied to exactly that range is the result.
        boundary = _compacted_range(log, "s", before, NOW - COMPACTED["delete_retention_ms"])
        assert 0 < boundary < end, "something was compacted and a tail stayed"
        assert after == _model(before, boundary, NOW - COMPACTED["delete_retention_ms"])
        assert [r[0] for r in after] == sorted(r[0] for r in after)
        # Every key written stays readable with its latest value (unless deleted for good).
        latest = {key: (value, off) for off, _, key, value in before}
        result = {key: value for _, _, key, value in after}
        for key, (value, off) in latest.items():
            if value is not None or off >= boundary:
                assert result[key] == value

    def test_the_active_tail_is_never_compacted(self, log_factory: LogFactory) -> None:
        log = log_factory(**COMPACTED)
        _write(log, "s", [(b"k", b"v%d" % i, NOW) for i in range(30)], per_batch=10)
        before = _rows(log, "s")
        log.compact(now_ms=NOW, force=True)
        assert _rows(log, "s") == before  # 30 small rows: all in the tail

    def test_reads_skip_gaps_and_start_anywhere(self, log_factory: LogFactory) -> None:
        log = log_factory(**COMPACTED)
        rows = _random_rows(7, 500, keys=10)
        _write(log, "s", rows, per_batch=20)
        log.compact(now_ms=NOW)
        after = _rows(log, "s")
        offsets = [r[0] for r in after]
        stream = log.stream("s")
        for start in (0, 1, 57, offsets[len(offsets) // 2], 499, 500):
            assert [r.offset for r in stream.read(start)] == [o for o in offsets if o >= start]
        assert [r.offset for r in stream.read(10, 200)] == [o for o in offsets if 10 <= o < 200]
        assert [r.offset for r in stream.read(max_records=3)] == offsets[:3]
        # Offsets alone: batches with gaps are decoded, dense ones are not; the same offsets.
        for start, end in [(0, None), (57, None), (10, 200), (499, None)]:
            batches = [list(b.offsets) for b in stream.read_batches(start, end)]
            assert [list(part) for part in stream.read_offsets(start, end)] == batches
            wanted = [o for o in offsets if o >= start and (end is None or o < end)]
            assert [o for batch in batches for o in batch] == wanted
        assert any(type(part) is tuple for part in stream.read_offsets())  # some have gaps

    def test_compaction_is_idempotent_and_resumes_with_new_records(
        self, log_factory: LogFactory
    ) -> None:
        log = log_factory(**COMPACTED)
        _write(log, "s", _random_rows(11, 500, keys=20), per_batch=25)
        log.compact(now_ms=NOW)
        once = _rows(log, "s")
        again = log.compact(now_ms=NOW, force=True)
        assert _rows(log, "s") == once
        assert again.records_removed == 0
        _write(log, "s", _random_rows(12, 500, keys=20), per_batch=25)
        before = _rows(log, "s")
        log.compact(now_ms=NOW, force=True)
        boundary = _compacted_range(log, "s", before, NOW - COMPACTED["delete_retention_ms"])
        assert _rows(log, "s") == _model(before, boundary, NOW - COMPACTED["delete_retention_ms"])

    def test_tombstones_are_kept_until_delete_retention_passes(
        self, log_factory: LogFactory
    ) -> None:
        log = log_factory(**{**COMPACTED, "delete_retention_ms": DAY})
        rows = [(b"gone", b"v", NOW - 1000), (b"gone", None, NOW - 500)]
        rows += [(b"k%03d" % (i % 50), b"x" * 100, NOW) for i in range(400)]
        _write(log, "s", rows, per_batch=20)
        log.compact(now_ms=NOW, force=True)
        assert [(r[2], r[3]) for r in _rows(log, "s")[:1]] == [(b"gone", None)]  # kept: young
        log.compact(now_ms=NOW + 2 * DAY, force=True)
        assert all(r[2] != b"gone" for r in _rows(log, "s"))  # then dropped for good

    def test_dirty_ratio_decides_when_a_pass_runs(self, log_factory: LogFactory) -> None:
        log = log_factory(**{**COMPACTED, "min_cleanable_dirty_ratio": 0.9})
        _write(log, "s", _random_rows(21, 500, keys=25), per_batch=25)
        first = log.compact(now_ms=NOW)  # never compacted: everything is dirty (ratio 1.0)
        assert first.changed
        _write(log, "s", _random_rows(22, 60, keys=25), per_batch=20)
        before = _rows(log, "s")
        second = log.compact(now_ms=NOW)  # a little new data: below 0.9
        assert not second.changed and second.skipped and _rows(log, "s") == before
        assert any("dirty ratio" in line for line in second.skipped)
        forced = log.compact(now_ms=NOW, force=True)
        assert forced.streams == 1

    def test_dry_run_changes_nothing(self, log_factory: LogFactory) -> None:
        log = log_factory(**COMPACTED)
        _write(log, "s", _random_rows(31, 500, keys=10), per_batch=25)
        before = _rows(log, "s")
        report = log.compact(now_ms=NOW, dry_run=True)
        assert report.dry_run and report.changed and report.records_removed > 0
        assert _rows(log, "s") == before

    def test_only_compacted_streams_are_compacted(self, log_factory: LogFactory) -> None:
        log = log_factory(segment_bytes=4096)
        log.create_stream("compacted", cleanup_policy="compact")
        rows = [(b"same", b"v%d" % i + b"x" * 100, NOW) for i in range(300)]
        _write(log, "plain", rows, per_batch=10)
        _write(log, "compacted", rows, per_batch=10)
        before = _rows(log, "plain")
        log.compact(now_ms=NOW, force=True)
        assert _rows(log, "plain") == before
        assert len(_rows(log, "compacted")) < 300
        with pytest.raises(ConfigError, match="cleanup_policy"):
            log.compact("plain", now_ms=NOW)
        with pytest.raises(StreamNotFound):
            log.compact("missing", now_ms=NOW)

    def test_keyless_records_are_refused_on_compacted_streams(
        self, log_factory: LogFactory
    ) -> None:
        log = log_factory()
        stream = log.create_stream("s", cleanup_policy="compact,delete")
        attempts: list[Callable[[], object]] = [
            lambda: stream.append(b"no key"),
            lambda: stream.append_batch([b"a", b"b"], keys=[b"k", None]),
            lambda: stream.append_batch([b"a"]),
            lambda: log.writer().append("s", b"no key"),
            lambda: log.writer().append_batch("s", [b"x"], keys=[None]),
        ]
        for attempt in attempts:
            with pytest.raises(InvalidRecordError, match="needs a key"):
                attempt()
        assert stream.end_offset == 0  # nothing was written
        assert stream.append(b"v", key=b"k") == 0

    def test_compaction_runs_while_writers_and_readers_work(self, log_factory: LogFactory) -> None:
        """Appends and reads go on while compaction rewrites: readers only ever see records
        whose value matches their key and offset, in offset order; nothing acknowledged is
        lost except what compaction may drop (older records of a key)."""
        log = log_factory(**COMPACTED)
        stream = log.create_stream("s")
        stop = threading.Event()
        problems: list[BaseException] = []
        acknowledged: list[tuple[int, bytes]] = []

        def write() -> None:
            try:
                for i in range(60):
                    keys = [b"k%02d" % ((i * 5 + j) % 30) for j in range(5)]
                    values = [
                        b"%s@%d" % (key, i * 5 + j) + b"y" * 100 for j, key in enumerate(keys)
                    ]
                    offsets = stream.append_batch(values, keys=keys, timestamps=NOW)
                    acknowledged.extend(zip(offsets, keys))
            except BaseException as exc:
                problems.append(exc)
            finally:
                stop.set()

        def read() -> None:
            while not stop.is_set():
                try:
                    last = -1
                    for record in stream.read():
                        assert record.offset > last
                        last = record.offset
                        assert record.value.startswith(record.key + b"@")  # type: ignore[operator, union-attr]
                except BaseException as exc:
                    problems.append(exc)
                    return

        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for thread in threads:
            thread.start()
        while not stop.is_set():
            log.compact(now_ms=NOW, force=True)
        for thread in threads:
            thread.join()
        assert not problems, problems
        log.compact(now_ms=NOW, force=True)
        final = {r.key: r for r in stream.read()}
        latest: dict[bytes, int] = {}
        for offset, key in acknowledged:
            latest[key] = max(latest.get(key, -1), offset)
        for key, offset in latest.items():  # the latest acknowledged record of every key stays
            assert final[key].offset == offset
