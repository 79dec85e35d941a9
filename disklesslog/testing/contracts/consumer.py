"""Consumer groups (committed offsets and :class:`~disklesslog.consumer.Consumer`), the
same on every backend, through the public Log API only.

Like :mod:`.log`, each test gets ``log_factory`` or ``log`` and never names a backend.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest

import disklesslog
from disklesslog import (
    ConfigError,
    InvalidStreamName,
    LogClosedError,
    OffsetOutOfRange,
    Record,
    StreamNotFound,
)

from .fixtures import LogFactory, LogFixtures

__all__ = ["ConsumerContract"]


def _fill(log: disklesslog.Log, name: str, count: int, start: int = 0) -> None:
    log.stream(name).append_batch([b"%s-%d" % (name.encode(), i) for i in range(start, count)])


def _drain(consumer: Any, max_records: int = 1000) -> list[tuple[str, Record]]:
    """Poll until a poll comes back empty."""
    out: list[tuple[str, Record]] = []
    while batch := consumer.poll(max_records):
        out.extend(batch)
    return out


def _by_stream(records: list[tuple[str, Record]]) -> dict[str, list[int]]:
    result: dict[str, list[int]] = {}
    for stream, record in records:
        result.setdefault(stream, []).append(record.offset)
    return result


# ------------------------------------------------------ consumers of compacted streams

NOW = 50_000_000  # ms: the clock compaction runs with
COMPACTED = {
    "cleanup_policy": "compact",
    "segment_bytes": 1024,
    "max_batch_bytes": 1024,  # rewritten batches of about ten records
    "max_record_bytes": 512,
    "delete_retention_ms": 10_000,
}
OLD, YOUNG = NOW - 20_000, NOW - 1_000  # tombstones: dropped / kept
SUPERSEDED = [b"a0", b"a1", b"b4", b"b5", b"c8", b"c9", *(b"d%d" % i for i in range(10))]
# What survives of offsets 0..69 (see _compacted): gaps at the start of batch a, in the
# middle of b (with b0 and b1: a tombstone's key), at the end of c, all of batch d, and
# offset 45 (an expired tombstone); 46 is a tombstone still kept.
SURVIVORS = [
    *range(2, 10),
    *(12, 13, 16, 17, 18, 19),
    *range(20, 28),
    *range(40, 45),
    *range(46, 70),
]
FILLER = 20  # records of unique keys after offset 70: the active tail compaction keeps


def _compacted(log: disklesslog.Log) -> list[tuple[int, bytes | None, bytes | None]]:
    """Stream "c", key-compacted, with offset gaps of every shape; its ``(offset, key,
    value)`` after compaction, which every read must show."""
    stream = log.create_stream("c", **COMPACTED)
    batches = [[(b"%s%d" % (name, i), OLD) for i in range(10)] for name in (b"a", b"b", b"c", b"d")]
    batches.append(
        [(b"e%d" % i, OLD) for i in range(5)]
        + [(b"b0", OLD), (b"b1", YOUNG)]  # tombstones, below
        + [(b"e%d" % i, OLD) for i in range(7, 10)]
    )
    batches.append([(key, OLD) for key in SUPERSEDED[:10]])
    batches.append([(key, OLD) for key in SUPERSEDED[10:]] + [(b"g%d" % i, OLD) for i in range(4)])
    batches += [[(b"f%d" % (i + j), OLD) for i in range(10)] for j in range(0, FILLER, 10)]
    written: list[tuple[int, bytes, bytes | None]] = []
    for batch in batches:
        offset = stream.end_offset
        values = [
            None if offset + i in (45, 46) else key + b"=" + b"x" * 60
            for i, (key, _) in enumerate(batch)
        ]
        keys = [key for key, _ in batch]
        stream.append_batch(values, keys=keys, timestamps=[ts for _, ts in batch])
        written += zip(range(offset, offset + len(batch)), keys, values)
    log.compact("c", now_ms=NOW, force=True)
    kept = [(r.offset, r.key, r.value) for r in stream.read()]
    assert [offset for offset, _, _ in kept] == [*SURVIVORS, *range(70, 70 + FILLER)]
    assert kept == [row for row in written if row[0] in set(SURVIVORS) or row[0] >= 70]
    assert kept[SURVIVORS.index(46)][2] is None  # a tombstone is a record like any other
    # The gaps fall inside rewritten batches and between them, whatever their layout.
    batches_read = [list(batch.offsets) for batch in stream.read_batches()]
    assert any(b[-1] - b[0] + 1 > len(b) for b in batches_read), batches_read
    assert any(n[0] > p[-1] + 1 for p, n in itertools.pairwise(batches_read)), batches_read
    return kept


def _offsets_of(records: list[tuple[str, Record]]) -> list[int]:
    return [record.offset for _, record in records]


class ConsumerContract(LogFixtures):
    """Consumer groups: committed offsets and :class:`~disklesslog.consumer.Consumer`,
    through the public API only."""

    # -------------------------------------------------------------- committed offsets

    def test_commit_offsets_round_trip_and_merge(self, log: disklesslog.Log) -> None:
        for name in ("a", "b", "c"):
            _fill(log, name, 10)
        assert log.committed_offsets("g") == {}
        log.commit_offsets("g", {"a": 3, "b": 0})
        assert log.committed_offsets("g") == {"a": 3, "b": 0}
        log.commit_offsets("g", {"c": 10})  # merged with the group's other streams
        assert log.committed_offsets("g") == {"a": 3, "b": 0, "c": 10}
        log.commit_offsets("g", {"a": 7})  # replaces only a's offset
        assert log.committed_offsets("g") == {"a": 7, "b": 0, "c": 10}
        log.commit_offsets("g", {"a": 2})  # positions may move backwards (a replay)
        assert log.committed_offsets("g")["a"] == 2
        log.commit_offsets("g", {})  # nothing to store: no change
        assert log.committed_offsets("g") == {"a": 2, "b": 0, "c": 10}

    def test_groups_are_independent(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 5)
        log.commit_offsets("g1", {"s": 1})
        log.commit_offsets("g2", {"s": 4})
        log.commit_offsets("s", {"s": 2})  # a group may share a stream's name
        assert log.committed_offsets("g1") == {"s": 1}
        assert log.committed_offsets("g2") == {"s": 4}
        assert log.committed_offsets("s") == {"s": 2}
        assert log.committed_offsets("g3") == {}
        assert log.streams() == ["s"]  # groups are not streams

    def test_groups_lists_the_groups_with_positions(self, log: disklesslog.Log) -> None:
        assert log.groups() == []
        _fill(log, "a", 3)
        _fill(log, "b", 3)
        log.commit_offsets("reports", {"a": 1})
        log.commit_offsets("billing", {"a": 2, "b": 3})
        log.commit_offsets("empty", {})  # nothing stored: not a group
        assert log.groups() == ["billing", "reports"]
        log.delete_stream("a")  # reports' only stream: it has no position left
        assert log.groups() == ["billing"]
        assert log.committed_offsets("billing") == {"b": 3}

    def test_committed_offset_may_lie_past_the_end(self, log: disklesslog.Log) -> None:
        # Kafka's rule: the offset is stored as given; a consumer resets it when it reads.
        _fill(log, "s", 3)
        log.commit_offsets("g", {"s": 1_000})
        assert log.committed_offsets("g") == {"s": 1_000}

    def test_committed_offsets_persist_across_reopen(self, log_factory: LogFactory) -> None:
        log = log_factory()
        _fill(log, "a", 5)
        _fill(log, "b", 5)
        log.commit_offsets("g", {"a": 5, "b": 2})
        log.close()
        again = log_factory()
        assert again.committed_offsets("g") == {"a": 5, "b": 2}
        again.commit_offsets("g", {"b": 4})
        again.close()
        assert log_factory().committed_offsets("g") == {"a": 5, "b": 4}

    @pytest.mark.parametrize("group", ["", ".", "..", "a/b", "../x", "x" * 250, "a b", 7, None])
    def test_invalid_group_names_are_rejected(self, log: disklesslog.Log, group: Any) -> None:
        _fill(log, "s", 1)
        with pytest.raises(InvalidStreamName, match="group"):
            log.commit_offsets(group, {"s": 0})
        with pytest.raises(InvalidStreamName, match="group"):
            log.committed_offsets(group)
        with pytest.raises(InvalidStreamName, match="group"):
            log.consumer(group, ["s"])

    @pytest.mark.parametrize(
        ("offsets", "error"),
        [
            ({"s": -1}, OffsetOutOfRange),
            ({"s": "1"}, ConfigError),
            ({"s": 1.0}, ConfigError),
            ({"s": True}, ConfigError),
            ({"s": None}, ConfigError),
            ({"../s": 1}, InvalidStreamName),
            ({"": 1}, InvalidStreamName),
            ({"missing": 1}, StreamNotFound),
            ([("s", 1)], ConfigError),
        ],
    )
    def test_invalid_offsets_store_nothing(
        self, log: disklesslog.Log, offsets: Any, error: type[Exception]
    ) -> None:
        _fill(log, "s", 3)
        _fill(log, "t", 3)
        log.commit_offsets("g", {"t": 1})
        with pytest.raises(error):
            log.commit_offsets("g", offsets)
        if isinstance(offsets, dict):  # a valid entry next to a bad one is not stored either
            with pytest.raises(error):
                log.commit_offsets("g", {"t": 2, **offsets})
        assert log.committed_offsets("g") == {"t": 1}
        assert "missing" not in log

    def test_offsets_of_a_closed_log(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 1)
        log.close()
        with pytest.raises(LogClosedError):
            log.commit_offsets("g", {"s": 0})
        with pytest.raises(LogClosedError):
            log.committed_offsets("g")

    # ----------------------------------------------------------------------- consumer

    def test_consumer_reads_several_streams_exactly_once(self, log: disklesslog.Log) -> None:
        _fill(log, "a", 300)
        _fill(log, "b", 5)
        log.stream("c").append(b"v", key=b"k", headers={"h": b"1"}, timestamp=1234)
        with log.consumer("g", ["a", "b", "c", "a"], auto_commit_interval_ms=None) as consumer:
            assert consumer.streams == ["a", "b", "c"]  # duplicates dropped
            records = _drain(consumer, max_records=64)
            assert consumer.poll() == []
            assert consumer.positions() == {"a": 300, "b": 5, "c": 1}
        assert _by_stream(records) == {"a": list(range(300)), "b": list(range(5)), "c": [0]}
        values = {s: [r.value for r in (rec for st, rec in records if st == s)] for s in "ab"}
        assert values["a"] == [b"a-%d" % i for i in range(300)]
        assert ("c", Record(0, 1234, b"k", b"v", (("h", b"1"),))) in records

    def test_consumer_resumes_after_reopen_without_loss_or_repeat(
        self, log_factory: LogFactory
    ) -> None:
        log = log_factory()
        _fill(log, "a", 50)
        _fill(log, "b", 50)
        first = log.consumer("g", ["a", "b"], auto_commit_interval_ms=None)
        seen = first.poll(max_records=30)
        assert len(seen) == 30
        assert first.commit() == first.positions()
        first.close()
        log.close()

        log = log_factory()
        _fill(log, "a", 60, start=50)  # more records arrive while nobody consumes
        second = log.consumer("g", ["a", "b"], auto_commit_interval_ms=None)
        rest = _drain(second)
        second.commit()
        second.close()
        everything = [(s, r.offset) for s, r in seen + rest]
        assert len(everything) == len(set(everything)) == 110
        assert _by_stream(seen + rest) == {"a": list(range(60)), "b": list(range(50))}
        assert log.committed_offsets("g") == {"a": 60, "b": 50}

    def test_uncommitted_records_are_delivered_again(self, log_factory: LogFactory) -> None:
        log = log_factory()
        _fill(log, "s", 30)
        consumer = log.consumer("g", ["s"], auto_commit_interval_ms=None)
        assert [r.offset for _, r in consumer.poll(max_records=10)] == list(range(10))
        consumer.commit()  # the first ten are processed
        assert [r.offset for _, r in consumer.poll(max_records=10)] == list(range(10, 20))
        consumer.close()  # "crash" before committing: auto-commit is off, close does not commit
        log.close()

        log = log_factory()
        with log.consumer("g", ["s"]) as again:
            assert [r.offset for _, r in _drain(again)] == list(range(10, 30))  # at least once

    def test_leaving_a_with_block_by_an_exception_does_not_commit(
        self, log: disklesslog.Log
    ) -> None:
        _fill(log, "s", 10)
        with pytest.raises(RuntimeError), log.consumer("g", ["s"]) as consumer:
            assert len(consumer.poll(max_records=4)) == 4
            raise RuntimeError("processing failed")
        assert consumer.closed
        assert log.committed_offsets("g") == {}
        with log.consumer("g", ["s"]) as consumer:
            assert len(consumer.poll(max_records=4)) == 4
        assert log.committed_offsets("g") == {"s": 4}  # a clean exit commits (auto-commit on)

    def test_close_commits_only_with_auto_commit(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 10)
        auto = log.consumer("auto", ["s"])
        auto.poll(max_records=3)
        auto.close()
        manual = log.consumer("manual", ["s"], auto_commit_interval_ms=None)
        manual.poll(max_records=3)
        manual.close()
        forced = log.consumer("forced", ["s"], auto_commit_interval_ms=None)
        forced.poll(max_records=5)
        forced.close(commit=True)
        skipped = log.consumer("skipped", ["s"])
        skipped.poll(max_records=5)
        skipped.close(commit=False)
        assert log.committed_offsets("auto") == {"s": 3}
        assert log.committed_offsets("manual") == {}
        assert log.committed_offsets("forced") == {"s": 5}
        assert log.committed_offsets("skipped") == {}

    def test_committed_offsets_win_over_reset(self, log: disklesslog.Log) -> None:
        _fill(log, "a", 10)
        _fill(log, "b", 10)
        log.commit_offsets("g", {"a": 6})
        with log.consumer("g", ["a", "b"], reset="latest") as consumer:
            assert consumer.positions() == {"a": 6, "b": 10}  # b was never committed: latest
            assert consumer.committed() == {"a": 6}
            assert _by_stream(consumer.poll()) == {"a": [6, 7, 8, 9]}

    def test_reset_earliest_and_latest(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 10)
        log.stream("s").trim(4)
        earliest = log.consumer("e", ["s"], reset="earliest")
        latest = log.consumer("l", ["s"], reset="latest")
        assert earliest.positions() == {"s": 4}
        assert latest.positions() == {"s": 10}
        assert latest.poll() == []
        log.stream("s").append(b"new")
        assert [r.offset for _, r in earliest.poll()] == [4, 5, 6, 7, 8, 9, 10]
        assert [(s, r.offset, r.value) for s, r in latest.poll()] == [("s", 10, b"new")]
        earliest.close()
        latest.close()
        assert log.committed_offsets("e") == {"s": 11}
        assert log.committed_offsets("l") == {"s": 11}

    def test_trimmed_committed_offset_resets_to_start(
        self, log: disklesslog.Log, caplog: pytest.LogCaptureFixture
    ) -> None:
        _fill(log, "s", 20)
        log.commit_offsets("g", {"s": 3})
        log.stream("s").trim(12)
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            consumer = log.consumer("g", ["s"], reset="latest")  # trimmed: earliest, not latest
            records = consumer.poll()
        assert [r.offset for _, r in records] == list(range(12, 20))
        assert any("trimmed" in m and "'s'" in m for m in caplog.messages), caplog.messages
        consumer.close()

    def test_position_trimmed_while_consuming_resets_to_start(
        self, log: disklesslog.Log, caplog: pytest.LogCaptureFixture
    ) -> None:
        for first in range(0, 20, 5):  # batches of five: the first poll takes one whole
            _fill(log, "s", first + 5, start=first)
        consumer = log.consumer("g", ["s"], auto_commit_interval_ms=None)
        assert [r.offset for _, r in consumer.poll(max_records=5)] == [0, 1, 2, 3, 4]
        log.stream("s").trim(15)
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            assert [r.offset for _, r in consumer.poll()] == [15, 16, 17, 18, 19]
        assert any("trimmed" in m for m in caplog.messages)
        consumer.close()

    def test_committed_offset_past_the_end_resets(
        self, log: disklesslog.Log, caplog: pytest.LogCaptureFixture
    ) -> None:
        _fill(log, "s", 5)
        log.commit_offsets("g", {"s": 20})  # accepted, as Kafka does, though past the end
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            consumer = log.consumer("g", ["s"])
            assert [r.value for _, r in consumer.poll()] == [b"s-%d" % i for i in range(5)]
        assert any("past its end" in m for m in caplog.messages), caplog.messages
        consumer.close()
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            log.commit_offsets("l", {"s": 50})
            latest = log.consumer("l", ["s"], reset="latest")
            assert latest.positions() == {"s": 5}
            latest.close()

    def test_deleting_a_stream_forgets_its_committed_offsets(self, log: disklesslog.Log) -> None:
        """As Kafka does for a deleted topic: a stream created again has no stale position."""
        _fill(log, "s", 20)
        _fill(log, "t", 3)
        log.commit_offsets("g", {"s": 20, "t": 3})
        log.commit_offsets("h", {"s": 7})
        log.delete_stream("s")
        assert log.committed_offsets("g") == {"t": 3}
        assert log.committed_offsets("h") == {}
        _fill(log, "s", 5)
        consumer = log.consumer("g", ["s"], auto_commit_interval_ms=None)
        assert [r.value for _, r in consumer.poll()] == [b"s-%d" % i for i in range(5)]
        consumer.close()

    def test_a_stream_created_later_is_picked_up(self, log: disklesslog.Log) -> None:
        _fill(log, "a", 3)
        consumer = log.consumer("g", ["a", "later"], reset="latest", auto_commit_interval_ms=None)
        assert consumer.positions() == {"a": 3, "later": 0}
        _fill(log, "a", 5, start=3)
        assert _by_stream(consumer.poll()) == {"a": [3, 4]}
        assert consumer.commit() == {"a": 5}  # nothing to commit for a stream that does not exist
        assert "later" not in log
        _fill(log, "later", 4)  # created after the consumer: read from its first record
        assert _by_stream(consumer.poll()) == {"later": [0, 1, 2, 3]}
        assert consumer.commit() == {"a": 5, "later": 4}
        assert log.committed_offsets("g") == {"a": 5, "later": 4}
        consumer.close()

    def test_a_compacted_stream_is_consumed_exactly_once(self, log: disklesslog.Log) -> None:
        """Polls of any size hand out each surviving record once, in order, and a
        consumer's position is the offset after the last record handed out, never a count
        of records: after a record followed by a gap it points into the gap."""
        kept = _compacted(log)
        for max_records in (1, 2, 3, 7, 1000):
            group = f"g{max_records}"
            with log.consumer(group, ["c"], auto_commit_interval_ms=None) as consumer:
                records: list[tuple[str, Record]] = []
                while polled := consumer.poll(max_records):
                    assert len(polled) <= max_records
                    records += polled
                    assert consumer.positions() == {"c": polled[-1][1].offset + 1}
                assert consumer.commit() == {"c": kept[-1][0] + 1}
            assert [(r.offset, r.key, r.value) for _, r in records] == kept, max_records

    @pytest.mark.parametrize("max_records", [1, 4])
    def test_commits_and_resumes_on_a_compacted_stream(
        self, log_factory: LogFactory, max_records: int
    ) -> None:
        """A consumer commits after each poll and is replaced by a new one (now and then
        on a reopened log): together they hand out each record once, and each resumes at
        the offset after the last record handed out, also inside a gap."""
        log = log_factory()
        kept = _compacted(log)
        seen: list[int] = []
        for turn in range(len(kept)):
            with log.consumer("g", ["c"], auto_commit_interval_ms=None) as consumer:
                # Past the gaps, the filler goes in one poll.
                polled = consumer.poll(max_records if not seen or seen[-1] < 70 else 1000)
                if not polled:
                    break
                committed = consumer.commit()
            seen += _offsets_of(polled)
            assert committed == {"c": seen[-1] + 1} == log.committed_offsets("g")
            if turn % 8 == 3:
                log.close()
                log = log_factory()
        assert seen == [offset for offset, _, _ in kept]

    def test_iterating_a_compacted_stream_auto_commits_what_was_handed_out(
        self,
        log: disklesslog.Log,
    ) -> None:
        """Auto-commits while iterating cover every record handed out before the current
        one, and not the current one, across gaps; the next consumer goes on from there."""
        kept = _compacted(log)
        handed_out: list[int] = []
        consumer = log.consumer("g", ["c"], auto_commit_interval_ms=1, idle_timeout=0)
        for _, record in consumer:
            if handed_out:
                committed = log.committed_offsets("g")["c"]
                assert handed_out[-1] < committed <= record.offset, (handed_out[-1], record)
            handed_out.append(record.offset)
            if record.offset == 27:  # the last record before the gap 28..39
                break
            time.sleep(0.002)  # processing outlasts the auto-commit interval
        consumer.close(commit=True)
        assert log.committed_offsets("g")["c"] in range(28, 41)
        with log.consumer("g", ["c"]) as again:
            rest = _offsets_of(_drain(again, max_records=5))
        assert handed_out + rest == [offset for offset, _, _ in kept]

    def test_a_position_inside_a_gap_resumes_at_the_next_record(self, log: disklesslog.Log) -> None:
        """A committed offset or a seek that lands in a gap starts at the next surviving
        record, and commits nothing new until a record is handed out."""
        kept = [offset for offset, _, _ in _compacted(log)]
        for position in (0, 1, 10, 11, 14, 28, 30, 39, 45):
            expected = [offset for offset in kept if offset >= position]
            group = f"committed-{position}"
            log.commit_offsets(group, {"c": position})
            with log.consumer(group, ["c"], auto_commit_interval_ms=None) as consumer:
                assert consumer.positions() == {"c": position}
                assert _offsets_of(_drain(consumer, max_records=4)) == expected, position
            with log.consumer(f"seek-{position}", ["c"], auto_commit_interval_ms=None) as consumer:
                assert [r.offset for _, r in consumer.poll(3)] == kept[:3]
                consumer.seek("c", position)
                assert consumer.commit() == {"c": position}
                assert _offsets_of(_drain(consumer, max_records=1000)) == expected, position

    def test_a_busy_stream_does_not_starve_a_quiet_one(self, log: disklesslog.Log) -> None:
        _fill(log, "busy", 5000)
        _fill(log, "quiet", 3)
        with log.consumer("g", ["busy", "quiet"]) as consumer:
            records = consumer.poll(max_records=100)
            assert len(records) == 100
            assert _by_stream(records) == {"busy": list(range(97)), "quiet": [0, 1, 2]}
            _fill(log, "quiet", 6, start=3)
            assert Counter(s for s, _ in consumer.poll(max_records=10)) == {"busy": 7, "quiet": 3}

    def test_every_stream_gets_a_turn_when_polls_are_small(self, log: disklesslog.Log) -> None:
        names = [f"s{i}" for i in range(10)]
        for name in names:
            _fill(log, name, 5)
        with log.consumer("g", names) as consumer:
            served: set[str] = set()
            for _ in range(4):
                batch = consumer.poll(max_records=3)
                assert len(batch) == 3
                served.update(s for s, _ in batch)
            assert served == set(names)  # 4 polls of 3 reach all 10 streams
            rest = _drain(consumer, max_records=7)
        assert sum(len(v) for v in _by_stream(rest).values()) == 50 - 12

    def test_poll_timeout(self, log: disklesslog.Log) -> None:
        log.create_stream("s")
        with log.consumer("g", ["s"], poll_interval=0.05) as consumer:
            began = time.monotonic()
            assert consumer.poll() == []  # timeout 0: one look, no wait
            assert consumer.poll(timeout=0.3) == []
            waited = time.monotonic() - began
            assert 0.3 <= waited < 2.0

            timer = threading.Timer(0.2, lambda: log.stream("s").append(b"late"))
            timer.start()
            began = time.monotonic()
            records = consumer.poll(timeout=10)
            waited = time.monotonic() - began
            timer.join()
            assert [(s, r.value) for s, r in records] == [("s", b"late")]
            assert 0.15 <= waited < 2.0  # returned once the record came, not after 10 s

    def test_iteration_yields_until_idle_timeout(self, log: disklesslog.Log) -> None:
        _fill(log, "a", 2500)
        _fill(log, "b", 10)
        consumer = log.consumer("g", ["a", "b"], idle_timeout=0.2, auto_commit_interval_ms=None)
        began = time.monotonic()
        records = list(consumer)
        assert time.monotonic() - began < 5
        assert _by_stream(records) == {"a": list(range(2500)), "b": list(range(10))}
        assert consumer.positions() == {"a": 2500, "b": 10}
        consumer.close()

    def test_iteration_counts_only_records_handed_out(self, log_factory: LogFactory) -> None:
        log = log_factory()
        _fill(log, "s", 500)
        consumer = log.consumer("g", ["s"], auto_commit_interval_ms=None)
        for _, record in consumer:
            if record.offset == 41:
                break
        assert consumer.positions() == {"s": 42}  # not where the read-ahead stopped
        assert consumer.poll(max_records=3)[0][1].offset == 42  # poll continues the same sequence
        assert consumer.commit() == {"s": 45}
        for _, record in consumer:
            assert record.offset == 45
            consumer.close()  # closing inside the loop ends it after this record
        assert consumer.closed
        log.close()
        with log_factory().consumer("g", ["s"]) as again:
            assert again.positions() == {"s": 45}

    def test_auto_commit_interval_during_polls(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 100)
        consumer = log.consumer("g", ["s"], auto_commit_interval_ms=200)
        consumer.poll(max_records=10)
        assert consumer.poll(max_records=10)  # too soon: nothing committed yet
        assert log.committed_offsets("g") == {}
        time.sleep(0.25)
        consumer.poll(max_records=10)  # commits what earlier polls handed out, first
        assert log.committed_offsets("g") == {"s": 20}
        time.sleep(0.25)
        consumer.poll(timeout=0)
        assert log.committed_offsets("g") == {"s": 30}
        consumer.close(commit=False)

        off = log.consumer("off", ["s"], auto_commit_interval_ms=None)
        off.poll(max_records=10)
        time.sleep(0.05)
        off.poll(max_records=10)
        off.close()
        assert log.committed_offsets("off") == {}

    def test_auto_commit_while_iterating_never_covers_the_current_record(
        self,
        log: disklesslog.Log,
    ) -> None:
        _fill(log, "s", 8)
        consumer = log.consumer("g", ["s"], auto_commit_interval_ms=1, idle_timeout=0.1)
        seen = []
        for _, record in consumer:
            time.sleep(0.005)  # "processing" outlasts the interval
            committed = log.committed_offsets("g").get("s", 0)
            assert committed == record.offset  # everything before it, not the record itself
            seen.append(record.offset)
        assert seen == list(range(8))
        assert log.committed_offsets("g") == {"s": 8}  # the idle loop committed the last one
        consumer.close()

    def test_closed_consumer(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 5)
        consumer = log.consumer("g", ["s"])
        consumer.close()
        consumer.close()  # idempotent
        assert consumer.closed
        with pytest.raises(LogClosedError):
            consumer.poll()
        with pytest.raises(LogClosedError):
            iter(consumer)
        with pytest.raises(LogClosedError):
            consumer.commit()
        with pytest.raises(LogClosedError):
            consumer.seek("s", 0)
        assert not log.closed  # the consumer does not own its log
        assert log.stream("s").end_offset == 5

    def test_close_from_another_thread_ends_a_waiting_iteration(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 3)
        consumer = log.consumer("g", ["s"], poll_interval=0.05)
        closer = threading.Timer(0.3, consumer.close)
        closer.start()
        began = time.monotonic()
        assert [r.offset for _, r in consumer] == [0, 1, 2]
        assert time.monotonic() - began < 3
        closer.join()  # its commit may finish just after the iteration ends
        assert log.committed_offsets("g") == {"s": 3}

    def test_seek(self, log: disklesslog.Log) -> None:
        _fill(log, "a", 10)
        _fill(log, "b", 10)
        consumer = log.consumer("g", ["a", "b"], auto_commit_interval_ms=None)
        _drain(consumer)
        consumer.seek("a", 7)  # backwards: a replay
        assert consumer.positions() == {"a": 7, "b": 10}
        assert _by_stream(consumer.poll()) == {"a": [7, 8, 9]}
        consumer.seek("b", 10)
        consumer.seek("a", 2)
        assert _by_stream(consumer.poll(max_records=2)) == {"a": [2, 3]}  # the rest is read ahead
        consumer.seek("a", 0)  # ... and dropped by a seek
        assert _by_stream(consumer.poll(max_records=3)) == {"a": [0, 1, 2]}
        with pytest.raises(OffsetOutOfRange):
            consumer.seek("a", 11)
        log.stream("a").trim(3)
        with pytest.raises(OffsetOutOfRange):
            consumer.seek("a", 2)
        with pytest.raises(ConfigError):
            consumer.seek("c", 0)
        with pytest.raises(ConfigError):
            consumer.seek("a", "3")  # type: ignore[arg-type]
        consumer.seek("a", 3)
        assert consumer.commit() == {"a": 3, "b": 10}
        consumer.close()

    def test_two_groups_consume_independently(self, log: disklesslog.Log) -> None:
        _fill(log, "s", 20)
        one = log.consumer("one", ["s"], auto_commit_interval_ms=None)
        two = log.consumer("two", ["s"], auto_commit_interval_ms=None)
        assert len(one.poll(max_records=15)) == 15
        assert [r.offset for _, r in two.poll(max_records=5)] == [0, 1, 2, 3, 4]
        one.commit()
        two.commit()
        assert [r.offset for _, r in two.poll()] == list(range(5, 20))
        assert log.committed_offsets("one") == {"s": 15}
        assert log.committed_offsets("two") == {"s": 5}
        one.close()
        two.close()

    def test_consumers_of_disjoint_streams_share_a_group(self, log: disklesslog.Log) -> None:
        _fill(log, "a", 4)
        _fill(log, "b", 6)
        with log.consumer("g", ["a"]) as for_a, log.consumer("g", ["b"]) as for_b:
            assert len(for_a.poll()) == 4
            assert len(for_b.poll()) == 6
            for_a.commit()
            for_b.commit()
        assert log.committed_offsets("g") == {"a": 4, "b": 6}

    @pytest.mark.parametrize(
        ("args", "kwargs"),
        [
            (("g", "s"), {}),  # one name instead of a list
            (("g", []), {}),
            (("g", ["s"]), {"reset": "middle"}),
            (("g", ["s"]), {"reset": None}),
            (("g", ["s"]), {"auto_commit_interval_ms": 0}),
            (("g", ["s"]), {"auto_commit_interval_ms": -5}),
            (("g", ["s"]), {"auto_commit_interval_ms": "5000"}),
            (("g", ["s"]), {"poll_interval": 0}),
            (("g", ["s"]), {"poll_interval": True}),
            (("g", ["s"]), {"idle_timeout": -1}),
            (("g", ["s"]), {"idle_timeout": float("nan")}),
        ],
    )
    def test_invalid_consumer_options(self, log: disklesslog.Log, args: Any, kwargs: Any) -> None:
        _fill(log, "s", 1)
        with pytest.raises(ConfigError):
            log.consumer(*args, **kwargs)
        assert log.committed_offsets("g") == {}

    def test_invalid_stream_names_and_poll_arguments(self, log: disklesslog.Log) -> None:
        with pytest.raises(InvalidStreamName):
            log.consumer("g", ["ok", "../escape"])
        with log.consumer("g", ["s"]) as consumer:
            for bad in (0, -1, 1.5, None):
                with pytest.raises(ConfigError):
                    consumer.poll(max_records=bad)  # type: ignore[arg-type]
            with pytest.raises(ConfigError):
                consumer.poll(timeout=-1)
            assert consumer.poll(timeout=0) == []
        assert log.streams() == []  # consuming creates nothing
