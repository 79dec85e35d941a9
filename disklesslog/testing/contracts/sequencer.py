"""The sequencer contract: every implementation passes the same tests.

A sequencer's test class subclasses :class:`SequencerContract` and defines
:meth:`~SequencerContract.open_sequencer`, which opens an empty sequencer in a fresh
directory with the injected clock that stamps when objects become garbage (it gets the
test's ``request`` too, for server fixtures and cleanup). The suite drives the
:class:`~disklesslog.sequencers.Sequencer` interface only.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from disklesslog.errors import (
    ConfigError,
    InvalidStreamName,
    OffsetOutOfRange,
    OutOfOrderSequence,
    ProducerFenced,
    SequencerError,
    StreamNotFound,
    TransactionError,
    UnknownProducerId,
    UnknownProducerState,
)
from disklesslog.leases import LeaseRecord
from disklesslog.sequencers import (
    NO_PRODUCER,
    BatchLocation,
    BatchToCommit,
    CommitResult,
    ProducerExpiry,
    Sequencer,
    TransactionResult,
)
from disklesslog.sequencers.base import TRANSACTION_RETENTION_SECONDS

from .leases import LeaseContract

__all__ = ["FakeClock", "SequencerContract"]

BIG = 1 << 40  # max_bytes that returns every batch


class FakeClock:
    """Seconds since the epoch that only move when a test says so."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now
        """The time the clock reads, in seconds since the epoch; tests may set it."""

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``: how tests age producer state and
        retention without sleeping."""
        self.now += seconds


# ----------------------------------------------------------------------- helpers


def batch(
    stream: str,
    span: int = 1,
    *,
    size: int = 100,
    position: int = 0,
    ts: int = 0,
    producer: tuple[int, int] | None = None,
    seq: int = -1,
    records: int | None = None,
) -> BatchToCommit:
    """A batch description; ``producer`` is ``(producer_id, epoch)``."""
    pid, epoch = producer if producer is not None else (NO_PRODUCER, -1)
    return BatchToCommit(
        stream, position, size, span, span if records is None else records, ts, pid, epoch, seq
    )


def offsets(results: list[CommitResult]) -> list[int]:
    return [r.base_offset for r in results]


def all_batches(seq: Sequencer, stream: str) -> list[BatchLocation]:
    info = seq.stream_info(stream)
    return seq.find_batches(stream, info.start_offset, BIG).batches


def spans(seq: Sequencer, stream: str) -> list[tuple[int, int]]:
    return [(b.base_offset, b.last_offset) for b in all_batches(seq, stream)]


def snapshot(seq: Sequencer) -> dict[str, Any]:
    """Everything a failed call must leave unchanged."""
    return {
        name: (seq.stream_info(name), all_batches(seq, name)) for name in seq.list_streams()
    } | {"garbage": seq.objects_to_delete(0)}


def make(seq: Sequencer, *names: str) -> None:
    for name in names:
        seq.create_stream(name, {})


MISSING_STREAM_CALLS: dict[str, Callable[[Sequencer], object]] = {
    "delete_stream": lambda s: s.delete_stream("nope"),
    "stream_info": lambda s: s.stream_info("nope"),
    "find_batches": lambda s: s.find_batches("nope", 0, 100),
    "offset_for_time": lambda s: s.offset_for_time("nope", 0),
    "trim": lambda s: s.trim("nope", 0),
    "replace_batches": lambda s: s.replace_batches("nope", [1], []),
    "commit": lambda s: s.commit("o", [batch("s"), batch("nope")]),
}


def _reject_unknown_stream(seq: Sequencer, p: tuple[int, int]) -> BatchToCommit:
    return batch("nope")


def _reject_fenced(seq: Sequencer, p: tuple[int, int]) -> BatchToCommit:
    seq.init_producer("w")  # a newer instance of the same named producer
    return batch("a", producer=p, seq=3)


def _reject_gap(seq: Sequencer, p: tuple[int, int]) -> BatchToCommit:
    return batch("a", producer=(p[0], p[1]), seq=9)


def _reject_unknown_producer(seq: Sequencer, p: tuple[int, int]) -> BatchToCommit:
    return batch("b", producer=(987_654, 0), seq=0)


REJECTIONS = {
    "unknown-stream": (_reject_unknown_stream, StreamNotFound),
    "fenced": (_reject_fenced, ProducerFenced),
    "out-of-order": (_reject_gap, OutOfOrderSequence),
    "unknown-producer": (_reject_unknown_producer, ProducerFenced),
}


# ------------------------------------------------------------------- find_batches


def _five_batches(seq: Sequencer) -> None:
    make(seq, "a")
    seq.commit("o1", [batch("a", 2, position=100 * i) for i in range(5)])  # 0-1, 2-3, ... 8-9


# ------------------------------------------------------------------ replace_batches


def _compactable(seq: Sequencer) -> list[BatchLocation]:
    make(seq, "a")
    seq.commit("o1", [batch("a", 3, position=300 * i, size=300) for i in range(3)])  # 0..8
    seq.commit("o2", [batch("a", 1)])  # 9
    return all_batches(seq, "a")


# ----------------------------------------------------------------- offset_for_time


def _timed(seq: Sequencer, stamps: list[int], span: int = 2) -> None:
    make(seq, "a")
    seq.commit("o", [batch("a", span, ts=t) for t in stamps])


def _brute_force(seq: Sequencer, ts: int) -> int | None:
    start = seq.stream_info("a").start_offset
    for b in all_batches(seq, "a"):
        if b.max_timestamp >= ts:
            return max(b.base_offset, start)
    return None


# --------------------------------------------------------------- 64-bit limits


def _beyond_64_bits(seq: Sequencer, value: int) -> dict[str, Callable[[], Any]]:
    """Every call that takes a number, given one no sequencer can store."""
    old = all_batches(seq, "a")
    return {
        "trim": lambda: seq.trim("a", value),
        "commit_offsets": lambda: seq.commit_offsets("g", {"a": value}),
        "offset_for_time": lambda: seq.offset_for_time("a", value),
        "offset_for_time-negative": lambda: seq.offset_for_time("a", -value - 1),
        "find_batches-offset": lambda: seq.find_batches("a", value, BIG),
        "find_batches-max_bytes": lambda: seq.find_batches("a", 0, value),
        "commit-timestamp": lambda: seq.commit("o2", [batch("a", ts=value)]),
        "commit-position": lambda: seq.commit("o2", [batch("a", position=value)]),
        "commit-sequence": lambda: seq.commit("o2", [batch("a", producer=(0, 0), seq=value)]),
        "transaction-size": lambda: seq.commit_transaction("t", [("o2", [batch("a", size=value)])]),
        "replace_batches-size": lambda: seq.replace_batches(
            "a", [old[0].batch_id], [BatchLocation(0, "n", 0, value, 0, 1, 0)]
        ),
        "replace_batches-id": lambda: seq.replace_batches("a", [value], []),
    }


class SequencerContract(LeaseContract):
    """The sequencer contract; a subclass defines :meth:`open_sequencer`. The injected
    clock measures lease durations too."""

    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        """Open an empty sequencer that keeps its state under ``path`` (the test's fresh
        directory) or elsewhere of its own, and reads the time from ``clock``. The
        suite closes it after the test; ``request`` reaches other fixtures and
        registers cleanup that runs after that close (``request.addfinalizer``)."""
        raise NotImplementedError(f"{type(self).__name__} must define open_sequencer()")

    @pytest.fixture
    def clock(self) -> FakeClock:
        """The test's :class:`FakeClock`, which :meth:`open_sequencer` hands to the
        sequencer."""
        return FakeClock()

    @pytest.fixture
    def sequencer(
        self, request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
    ) -> Iterator[Sequencer]:
        """The sequencer under test, opened by :meth:`open_sequencer` on the test's
        fresh directory and closed after the test."""
        seq = self.open_sequencer(tmp_path, clock, request)
        yield seq
        seq.close()

    @pytest.fixture
    def lease_owner(self, sequencer: Sequencer) -> Sequencer:
        return sequencer

    @pytest.fixture
    def wait(self, clock: FakeClock) -> Callable[[float], None]:
        return clock.advance

    # ----------------------------------------------------------------------- streams

    def test_create_returns_an_empty_stream(self, sequencer: Sequencer) -> None:
        meta = sequencer.create_stream("events", {"compression": "zstd"})
        assert (meta.name, meta.start_offset, meta.end_offset) == ("events", 0, 0)
        assert meta.config == {"compression": "zstd"}
        assert sequencer.stream_info("events") == meta

    def test_create_is_idempotent_and_keeps_the_first_config(self, sequencer: Sequencer) -> None:
        sequencer.create_stream("s", {"compression": "zstd"})
        sequencer.commit("o1", [batch("s", 3)])
        again = sequencer.create_stream("s", {"compression": "none"})
        assert again.config == {"compression": "zstd"}
        assert again.end_offset == 3
        assert sequencer.list_streams() == ["s"]

    def test_config_comes_back_as_a_fresh_plain_dict(self, sequencer: Sequencer) -> None:
        sequencer.create_stream("s", {"sizes": (1, 2), "nested": {"a": 1}})
        meta = sequencer.stream_info("s")
        assert meta.config == {"sizes": [1, 2], "nested": {"a": 1}}
        meta.config["nested"]["a"] = 99
        assert sequencer.stream_info("s").config["nested"] == {"a": 1}

    def test_config_must_be_json(self, sequencer: Sequencer) -> None:
        with pytest.raises(ConfigError):
            sequencer.create_stream("s", {"bad": object()})
        assert sequencer.list_streams() == []

    def test_list_streams_is_sorted(self, sequencer: Sequencer) -> None:
        make(sequencer, "b", "c", "a")
        assert sequencer.list_streams() == ["a", "b", "c"]

    @pytest.mark.parametrize("name", ["", "a/b", "..", "x" * 250, "sp ace"])
    def test_invalid_stream_names(self, sequencer: Sequencer, name: str) -> None:
        with pytest.raises(InvalidStreamName):
            sequencer.create_stream(name, {})
        with pytest.raises(InvalidStreamName):
            sequencer.stream_info(name)

    @pytest.mark.parametrize("call", MISSING_STREAM_CALLS.values(), ids=MISSING_STREAM_CALLS.keys())
    def test_missing_stream_raises_stream_not_found(
        self, sequencer: Sequencer, call: Callable[[Sequencer], object]
    ) -> None:
        make(sequencer, "s")
        before = snapshot(sequencer)
        with pytest.raises(StreamNotFound):
            call(sequencer)
        assert snapshot(sequencer) == before

    def test_delete_stream_removes_it_and_a_recreated_stream_starts_empty(
        self,
        sequencer: Sequencer,
    ) -> None:
        make(sequencer, "a", "b")
        sequencer.commit("o1", [batch("a", 5), batch("b", 2)])
        old_ids = [b.batch_id for b in all_batches(sequencer, "a")]
        sequencer.delete_stream("a")
        assert sequencer.list_streams() == ["b"]
        with pytest.raises(StreamNotFound):
            sequencer.stream_info("a")
        assert spans(sequencer, "b") == [(0, 1)]
        assert sequencer.objects_to_delete(0) == []  # o1 still holds b's batch

        meta = sequencer.create_stream("a", {"compression": "zstd"})
        assert (meta.start_offset, meta.end_offset, meta.config) == (0, 0, {"compression": "zstd"})
        assert sequencer.find_batches("a", 0, BIG).batches == []
        assert offsets(sequencer.commit("o2", [batch("a", 1)])) == [0]
        assert spans(sequencer, "a") == [(0, 0)]
        assert sequencer.replace_batches("a", old_ids, []) is False

    def test_delete_stream_makes_its_objects_garbage(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        make(sequencer, "a", "b")
        sequencer.commit("only-a", [batch("a"), batch("a")])
        sequencer.commit("shared", [batch("a"), batch("b")])
        sequencer.delete_stream("a")
        assert sequencer.objects_to_delete(0) == ["only-a"]
        clock.advance(5)
        assert sequencer.objects_to_delete(10) == []
        clock.advance(5)
        assert sequencer.objects_to_delete(10) == ["only-a"]

    def test_delete_stream_forgets_producer_state_and_group_offsets(
        self, sequencer: Sequencer
    ) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer("w")
        sequencer.commit("o1", [batch("a", 5, producer=p, seq=0)])
        sequencer.commit_offsets("g", {"a": 3, "other": 7})
        sequencer.delete_stream("a")
        make(sequencer, "a")
        # The state is gone: the same batch is new again, not a duplicate of the old one.
        assert sequencer.commit("o2", [batch("a", 5, producer=p, seq=0)]) == [CommitResult(0)]
        assert sequencer.committed_offsets("g") == {"other": 7}

    # ----------------------------------------------------------------------- commits

    def test_offsets_follow_batch_order_across_streams(self, sequencer: Sequencer) -> None:
        make(sequencer, "a", "b", "c")
        results = sequencer.commit(
            "o1",
            [
                batch("a", 3),
                batch("b", 2),
                batch("a", 1),
                batch("c", 5, records=2),  # compacted-style: span > record count
                batch("b", 4),
            ],
        )
        assert results == [CommitResult(o) for o in (0, 0, 3, 0, 2)]
        assert [sequencer.stream_info(n).end_offset for n in "abc"] == [4, 6, 5]
        assert spans(sequencer, "c") == [(0, 4)]
        assert offsets(sequencer.commit("o2", [batch("c", 1), batch("a", 2)])) == [5, 4]

    def test_committed_coordinates_are_returned_by_find_batches(self, sequencer: Sequencer) -> None:
        make(sequencer, "a", "b")
        sequencer.commit(
            "obj/1", [batch("a", 2, position=0, size=70, ts=5), batch("b", position=70, size=30)]
        )
        sequencer.commit("obj/2", [batch("a", 3, position=0, size=50, ts=9)])
        page = sequencer.find_batches("a", 0, BIG)
        assert [
            (b.object_key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp)
            for b in page.batches
        ] == [("obj/1", 0, 70, 0, 1, 5), ("obj/2", 0, 50, 2, 4, 9)]
        assert len({b.batch_id for b in page.batches}) == 2

    def test_producer_sequence_counts_records_not_span(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 10, records=3, producer=p, seq=0)])
        with pytest.raises(OutOfOrderSequence):
            sequencer.commit("o2", [batch("a", producer=p, seq=10)])
        assert offsets(sequencer.commit("o3", [batch("a", producer=p, seq=3)])) == [10]

    def test_commit_many_judges_each_object_on_its_own(self, sequencer: Sequencer) -> None:
        """A writer's group commit: objects in order, each atomic, a refusal stops nothing."""
        make(sequencer, "a", "b")
        p = sequencer.init_producer()
        first = [batch("a", 2, producer=p, seq=0), batch("b", producer=p, seq=0, position=100)]
        outcomes = sequencer.commit_many(
            [
                ("o1", first),
                ("o2", [batch("a", producer=p, seq=5)]),  # a gap: refused
                ("o3", [batch("b", 2), batch("nope")]),  # an unknown stream: all of o3 refused
                ("o4", [batch("a", producer=p, seq=2), batch("b", 3, position=100)]),
                ("o1", first),  # a retry of o1: duplicates
            ]
        )
        assert offsets(outcomes[0]) == [0, 0]  # type: ignore[arg-type]
        assert isinstance(outcomes[1], OutOfOrderSequence)
        assert isinstance(outcomes[2], StreamNotFound)
        assert offsets(outcomes[3]) == [2, 1]  # type: ignore[arg-type]
        assert outcomes[4] == [CommitResult(0, True), CommitResult(0, True)]
        assert (sequencer.stream_info("a").end_offset, sequencer.stream_info("b").end_offset) == (
            3,
            4,
        )
        assert [b.object_key for b in all_batches(sequencer, "b")] == ["o1", "o4"]
        assert sequencer.commit_many([]) == []

    def test_list_objects_names_every_known_object(self, sequencer: Sequencer) -> None:
        """Live objects, garbage not yet forgotten and orphans; forgotten ones leave."""
        make(sequencer, "a")
        assert sequencer.list_objects() == []
        sequencer.commit("o-trimmed", [batch("a")])  # offset 0
        sequencer.commit("o-kept", [batch("a")])  # offset 1
        sequencer.record_orphan("o-orphan")
        sequencer.record_orphan("o-kept")  # known already: stays live
        sequencer.trim("a", 1)  # o-trimmed's batch leaves: it becomes garbage
        assert sequencer.list_objects() == ["o-kept", "o-orphan", "o-trimmed"]
        assert sorted(sequencer.objects_to_delete(0)) == ["o-orphan", "o-trimmed"]
        sequencer.forget_objects(["o-trimmed", "o-orphan", "o-kept"])  # o-kept is live: kept
        assert sequencer.list_objects() == ["o-kept"]

    def test_empty_commit_records_a_dead_object(self, sequencer: Sequencer) -> None:
        assert sequencer.commit("empty", []) == []
        assert sequencer.objects_to_delete(0) == ["empty"]

    @pytest.mark.parametrize("bad_batch, error", REJECTIONS.values(), ids=REJECTIONS.keys())
    def test_one_bad_batch_rejects_the_whole_commit(
        self,
        sequencer: Sequencer,
        bad_batch: Callable[[Sequencer, tuple[int, int]], BatchToCommit],
        error: type[Exception],
    ) -> None:
        make(sequencer, "a", "b")
        p = sequencer.init_producer("w")
        sequencer.commit("o1", [batch("a", 3, producer=p, seq=0)])
        bad = bad_batch(sequencer, p)
        before = snapshot(sequencer)
        good = [batch("b", 2), batch("a", 2, producer=p, seq=3), batch("b", producer=p, seq=0)]
        with pytest.raises(error):
            sequencer.commit("o2", [*good[:2], bad, good[2]])
        assert snapshot(sequencer) == before  # no batch, no extent, no object row
        if error is ProducerFenced and bad.producer_id == p[0]:
            return  # the producer was fenced for good: nothing more to check
        # Producer state did not move either: the batches that were refused are new.
        assert sequencer.commit("o3", good) == [CommitResult(0), CommitResult(3), CommitResult(2)]

    @pytest.mark.parametrize(
        "bad",
        [
            batch("a", 0),
            batch("a", 2, records=3),
            batch("a", 1, position=-1),
            batch("a", 1, size=-5),
            batch("a", 1, position=True),
            batch("a", 1, ts=1.5),  # type: ignore[arg-type]
        ],
        ids=[
            "span-0",
            "records-over-span",
            "negative-position",
            "negative-size",
            "bool-position",
            "float-timestamp",
        ],
    )
    def test_malformed_batches_are_refused(self, sequencer: Sequencer, bad: BatchToCommit) -> None:
        make(sequencer, "a")
        with pytest.raises(SequencerError):
            sequencer.commit("o", [batch("a"), bad])
        assert sequencer.stream_info("a").end_offset == 0
        assert sequencer.objects_to_delete(0) == []

    def test_bad_object_keys_are_refused(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        for key in ("", None, 5):
            with pytest.raises(ConfigError):
                sequencer.commit(key, [batch("a")])  # type: ignore[arg-type]

    def test_exact_retry_of_a_commit_returns_the_original_offsets(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        make(sequencer, "a", "b")
        p = sequencer.init_producer("w")
        sequencer.commit("o0", [batch("a", 4)])  # someone else's batch first
        commit = [batch("a", 2, producer=p, seq=0), batch("b", 3, producer=p, seq=0)]
        first = sequencer.commit("o1", commit)
        assert first == [CommitResult(4), CommitResult(0)]
        before = snapshot(sequencer)
        assert sequencer.commit("o1", commit) == [CommitResult(4, True), CommitResult(0, True)]
        assert snapshot(sequencer) == before
        clock.advance(3600)
        assert "o1" not in sequencer.objects_to_delete(0)  # still referenced

    def test_retry_under_a_new_object_key_leaves_that_object_garbage(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer()
        commit = [batch("a", 2, producer=p, seq=0), batch("a", 1, producer=p, seq=2)]
        sequencer.commit("upload-1", commit)
        retried = sequencer.commit("upload-2", commit)
        assert retried == [CommitResult(0, True), CommitResult(2, True)]
        assert spans(sequencer, "a") == [(0, 1), (2, 2)]
        assert sequencer.objects_to_delete(0) == ["upload-2"]

    def test_a_commit_may_mix_duplicates_and_new_batches(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 2, producer=p, seq=0)])
        results = sequencer.commit(
            "o2", [batch("a", 2, producer=p, seq=0), batch("a", 3, producer=p, seq=2)]
        )
        assert results == [CommitResult(0, True), CommitResult(2)]
        assert spans(sequencer, "a") == [(0, 1), (2, 4)]

    def test_a_repeat_inside_one_commit_is_a_duplicate(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer()
        same = batch("a", 2, producer=p, seq=0)
        assert sequencer.commit("o1", [same, same]) == [CommitResult(0), CommitResult(0, True)]
        assert sequencer.stream_info("a").end_offset == 2

    def test_only_the_last_five_runs_are_deduplicated(self, sequencer: Sequencer) -> None:
        """Batches separated by another writer's batch form separate runs; five are kept."""
        make(sequencer, "a")
        p = sequencer.init_producer()
        for s in range(6):
            sequencer.commit(f"o{s}", [batch("a", producer=p, seq=s)])
            sequencer.commit(f"x{s}", [batch("a")])  # another writer's batch between
        for s in range(1, 6):
            assert sequencer.commit(f"r{s}", [batch("a", producer=p, seq=s)]) == [
                CommitResult(2 * s, True)
            ]
        with pytest.raises(OutOfOrderSequence):
            sequencer.commit("r0", [batch("a", producer=p, seq=0)])
        assert sequencer.stream_info("a").end_offset == 12

    def test_a_retried_commit_of_many_batches_of_one_stream_is_recognised(
        self,
        sequencer: Sequencer,
    ) -> None:
        """A writer retries whole commits (or groups of them); one may hold far more than
        five batches of a stream, and every one of them is a duplicate on retry."""
        make(sequencer, "a", "b")
        p = sequencer.init_producer()
        first = [batch("a", 2, producer=p, seq=2 * i, position=i) for i in range(20)]
        first.append(batch("b", producer=p, seq=0))
        assert offsets(sequencer.commit("o1", first)) == [*range(0, 40, 2), 0]
        second = [batch("a", 2, producer=p, seq=40 + 2 * i) for i in range(8)]
        assert offsets(sequencer.commit("o2", second)) == list(range(40, 56, 2))
        again = sequencer.commit("o1", first) + sequencer.commit("o2", second)
        assert all(r.duplicate for r in again)
        assert offsets(again) == [*range(0, 40, 2), 0, *range(40, 56, 2)]
        assert sequencer.stream_info("a").end_offset == 56

    @pytest.mark.parametrize(
        "seq_no, records", [(4, 1), (2, 2), (0, 4)], ids=["gap", "overlap-end", "overlap-all"]
    )
    def test_out_of_order_sequences(self, sequencer: Sequencer, seq_no: int, records: int) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 3, producer=p, seq=0)])  # sequences 0..2
        sequencer.commit("o2", [batch("a", 1, producer=p, seq=3)])  # 3, in the same run
        with pytest.raises(OutOfOrderSequence):
            sequencer.commit("o3", [batch("a", records, producer=p, seq=seq_no + 1)])
        assert sequencer.stream_info("a").end_offset == 4

    @pytest.mark.parametrize(
        "seq_no, records", [(1, 1), (0, 2), (2, 2)], ids=["inside", "prefix", "tail"]
    )
    def test_records_already_committed_are_duplicates(
        self, sequencer: Sequencer, seq_no: int, records: int
    ) -> None:
        """Sequence numbers wholly inside an accepted run were stored already: nothing is
        stored again, and the answer is the offset of the first of them."""
        make(sequencer, "a")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 3, producer=p, seq=0)])  # sequences 0..2
        sequencer.commit("o2", [batch("a", 1, producer=p, seq=3)])  # 3, in the same run
        result = sequencer.commit("o3", [batch("a", records, producer=p, seq=seq_no)])
        assert result == [CommitResult(seq_no, True)]
        assert sequencer.stream_info("a").end_offset == 4

    def test_a_producer_must_start_each_stream_and_epoch_at_zero(
        self, sequencer: Sequencer
    ) -> None:
        make(sequencer, "a", "b")
        p = sequencer.init_producer("w")
        with pytest.raises(OutOfOrderSequence):
            sequencer.commit("o1", [batch("a", producer=p, seq=1)])
        sequencer.commit("o2", [batch("a", 3, producer=p, seq=0)])
        sequencer.commit("o3", [batch("b", 1, producer=p, seq=0)])  # sequences are per stream
        p2 = sequencer.init_producer("w")
        assert p2 == (p[0], p[1] + 1)
        with pytest.raises(OutOfOrderSequence):
            sequencer.commit("o4", [batch("a", producer=p2, seq=3)])
        assert offsets(sequencer.commit("o5", [batch("a", producer=p2, seq=0)])) == [3]

    def test_a_stream_created_again_knows_no_producer(self, sequencer: Sequencer) -> None:
        """Deleting a stream drops its producers' numbers: a producer that goes on with its
        old numbering is told UnknownProducerState (naming the stream), and may start at 0;
        a stream that lived on keeps refusing a gap as plain OutOfOrderSequence."""
        make(sequencer, "a", "b")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 3, producer=p, seq=0), batch("b", 3, producer=p, seq=0)])
        sequencer.delete_stream("a")
        make(sequencer, "a")
        sequencer.commit("o2", [batch("a", 2)])  # another writer's records in the new stream
        with pytest.raises(UnknownProducerState) as info:
            sequencer.commit("o3", [batch("a", producer=p, seq=3)])
        assert info.value.stream == "a"
        with pytest.raises(OutOfOrderSequence) as gap:
            sequencer.commit("o4", [batch("b", producer=p, seq=4)])
        assert not isinstance(gap.value, UnknownProducerState)
        assert offsets(sequencer.commit("o5", [batch("a", producer=p, seq=0)])) == [2]
        assert sequencer.commit("o5", [batch("a", producer=p, seq=0)]) == [CommitResult(2, True)]
        assert (sequencer.stream_info("a").end_offset, sequencer.stream_info("b").end_offset) == (
            3,
            3,
        )

    def test_reinitialising_a_named_producer_fences_the_old_instance(
        self, sequencer: Sequencer
    ) -> None:
        make(sequencer, "a")
        old = sequencer.init_producer("writer-1")
        sequencer.commit("o1", [batch("a", producer=old, seq=0)])
        new = sequencer.init_producer("writer-1")
        assert new == (old[0], old[1] + 1)
        with pytest.raises(ProducerFenced):
            sequencer.commit("o2", [batch("a", producer=old, seq=1)])
        with pytest.raises(ProducerFenced):  # even an exact retry: the zombie is out
            sequencer.commit("o1", [batch("a", producer=old, seq=0)])
        assert offsets(sequencer.commit("o3", [batch("a", producer=new, seq=0)])) == [1]

    def test_anonymous_producers_get_distinct_ids_at_epoch_zero(self, sequencer: Sequencer) -> None:
        ids = [sequencer.init_producer() for _ in range(3)]
        named = sequencer.init_producer("n")
        assert all(epoch == 0 for _, epoch in ids) and named[1] == 0
        assert len({pid for pid, _ in [*ids, named]}) == 4
        assert all(pid >= 0 for pid, _ in [*ids, named])

    def test_unknown_producers_and_future_epochs_are_fenced(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        pid, epoch = sequencer.init_producer("w")
        with pytest.raises(ProducerFenced):
            sequencer.commit("o1", [batch("a", producer=(pid + 1000, 0), seq=0)])
        with pytest.raises(ProducerFenced):
            sequencer.commit("o2", [batch("a", producer=(pid, epoch + 1), seq=0)])
        assert sequencer.stream_info("a").end_offset == 0

    # ------------------------------------------------------------- producer expiry

    def test_producer_state_idle_past_the_window_expires(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        """A (producer, stream) state whose last write is older than the window goes; a
        recent one stays. Within the window a retry is still a duplicate; after it the
        producer's next batch there must start at 0 again (UnknownProducerState)."""
        make(sequencer, "a", "b")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 2, producer=p, seq=0)])
        clock.advance(10)
        sequencer.commit("o2", [batch("b", 2, producer=p, seq=0)])
        clock.advance(5)
        retry = sequencer.commit("o1", [batch("a", 2, producer=p, seq=0)])
        assert retry == [CommitResult(0, duplicate=True)]  # a retry does not renew it
        assert sequencer.expire_producers(12_000) == ProducerExpiry(states=1, producers=0)
        with pytest.raises(UnknownProducerState):
            sequencer.commit("o3", [batch("a", 1, producer=p, seq=2)])
        assert offsets(sequencer.commit("o3", [batch("a", 1, producer=p, seq=0)])) == [2]
        retry = sequencer.commit("o2", [batch("b", 2, producer=p, seq=0)])
        assert retry == [CommitResult(0, duplicate=True)]  # b's state was kept
        assert sequencer.expire_producers(12_000) == ProducerExpiry()

    def test_an_idle_producer_is_dropped_and_its_id_never_issued_again(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        """A producer with no state left and no use within the window goes, a named one
        with its name: its id is refused with UnknownProducerId (a ProducerFenced), and
        no id issued before is ever issued again."""
        make(sequencer, "a")
        anonymous = sequencer.init_producer()
        named = sequencer.init_producer("w")
        unused = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 1, producer=anonymous, seq=0)])
        clock.advance(60)
        recent = sequencer.init_producer()
        assert sequencer.expire_producers(30_000) == ProducerExpiry(states=1, producers=3)
        for gone, seq in ((anonymous, 1), (named, 0), (unused, 0)):
            with pytest.raises(UnknownProducerId):
                sequencer.commit("o2", [batch("a", 1, producer=gone, seq=seq)])
        assert offsets(sequencer.commit("o2", [batch("a", 1, producer=recent, seq=0)])) == [1]
        again = sequencer.init_producer("w")
        fresh = [sequencer.init_producer() for _ in range(3)]
        issued = [anonymous, named, unused, recent]
        assert again[1] == 0 and all(p[1] == 0 for p in fresh)
        assert len({pid for pid, _ in [*issued, again, *fresh]}) == len(issued) + 4
        assert offsets(sequencer.commit("o3", [batch("a", 1, producer=again, seq=0)])) == [2]

    def test_a_producer_that_wrote_within_the_window_is_kept(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        """A producer's last use counts its writes, also to a stream deleted since, and
        a named producer initialised again within the window keeps fencing its zombie."""
        make(sequencer, "a")
        p = sequencer.init_producer("w")
        clock.advance(50)
        sequencer.commit("o1", [batch("a", 1, producer=p, seq=0)])
        clock.advance(5)
        sequencer.delete_stream("a")
        clock.advance(15)  # 70 s after the init, 20 s after the write
        assert sequencer.expire_producers(30_000) == ProducerExpiry()
        make(sequencer, "a")
        assert offsets(sequencer.commit("o2", [batch("a", 1, producer=p, seq=0)])) == [0]
        newer = sequencer.init_producer("w")
        clock.advance(20)
        assert sequencer.expire_producers(30_000) == ProducerExpiry()
        with pytest.raises(ProducerFenced):
            sequencer.commit("o3", [batch("a", 1, producer=p, seq=1)])
        assert newer == (p[0], p[1] + 1)

    def test_expiry_dry_run_changes_nothing(self, sequencer: Sequencer, clock: FakeClock) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 2, producer=p, seq=0)])
        clock.advance(60)
        assert sequencer.expire_producers(1_000, dry_run=True) == ProducerExpiry(1, 1)
        assert sequencer.expire_producers(1_000, dry_run=True) == ProducerExpiry(1, 1)
        retry = sequencer.commit("o1", [batch("a", 2, producer=p, seq=0)])
        assert retry == [CommitResult(0, duplicate=True)]
        assert sequencer.expire_producers(1_000) == ProducerExpiry(1, 1)
        assert sequencer.expire_producers(1_000, dry_run=True) == ProducerExpiry()

    def test_bad_expiry_ages_are_refused(self, sequencer: Sequencer, clock: FakeClock) -> None:
        make(sequencer, "a")
        p = sequencer.init_producer()
        sequencer.commit("o1", [batch("a", 2, producer=p, seq=0)])
        clock.advance(60)
        for bad in (-1, 1.5, True, "1000", None, 1 << 63):
            with pytest.raises(ConfigError):
                sequencer.expire_producers(bad)  # type: ignore[arg-type]
        retry = sequencer.commit("o1", [batch("a", 2, producer=p, seq=0)])
        assert retry == [CommitResult(0, duplicate=True)]

    def test_producer_names_must_be_non_empty_strings(self, sequencer: Sequencer) -> None:
        for bad in ("", 5):
            with pytest.raises(ConfigError):
                sequencer.init_producer(bad)  # type: ignore[arg-type]

    def test_batches_without_a_producer_are_never_deduplicated(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        same = [batch("a", 2)]
        assert offsets(sequencer.commit("o1", same)) == [0]
        assert sequencer.commit("o1", same) == [CommitResult(2)]
        assert spans(sequencer, "a") == [(0, 1), (2, 3)]

    def test_producers_interleave_on_one_stream(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        p, q = sequencer.init_producer(), sequencer.init_producer()
        results = sequencer.commit(
            "o1",
            [
                batch("a", producer=p, seq=0),
                batch("a", 2, producer=q, seq=0),
                batch("a", producer=p, seq=1),
                batch("a", 1),
            ],
        )
        assert offsets(results) == [0, 1, 3, 4]
        assert sequencer.commit("o2", [batch("a", 2, producer=q, seq=0)]) == [CommitResult(1, True)]

    def test_concurrent_commits_from_threads(self, sequencer: Sequencer) -> None:
        make(sequencer, "a", "b")
        per_thread, threads = 40, 4
        got: dict[int, list[list[CommitResult]]] = {}

        def work(i: int) -> None:
            p = sequencer.init_producer(f"t{i}")
            got[i] = [
                sequencer.commit(
                    f"t{i}-{n}",
                    [batch("a", producer=p, seq=n), batch("b", 2, producer=p, seq=2 * n)],
                )
                for n in range(per_thread)
            ]

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        a_offsets = sorted(r[0].base_offset for rs in got.values() for r in rs)
        assert a_offsets == list(range(per_thread * threads))
        assert spans(sequencer, "b") == [(2 * i, 2 * i + 1) for i in range(per_thread * threads)]
        for results in got.values():  # each thread's commits landed in its order
            assert [r[0].base_offset for r in results] == sorted(r[0].base_offset for r in results)

    def test_find_batches_starts_with_the_batch_holding_the_offset(
        self, sequencer: Sequencer
    ) -> None:
        _five_batches(sequencer)
        page = sequencer.find_batches("a", 5, BIG)
        assert [(b.base_offset, b.position) for b in page.batches] == [(4, 200), (6, 300), (8, 400)]
        assert (page.start_offset, page.end_offset) == (0, 10)

    def test_find_batches_at_the_end_is_empty(self, sequencer: Sequencer) -> None:
        _five_batches(sequencer)
        page = sequencer.find_batches("a", 10, BIG)
        assert (page.batches, page.start_offset, page.end_offset) == ([], 0, 10)
        make(sequencer, "empty")
        assert sequencer.find_batches("empty", 0, BIG).batches == []

    @pytest.mark.parametrize("offset", [11, 1000, -1])
    def test_find_batches_outside_the_stream(self, sequencer: Sequencer, offset: int) -> None:
        _five_batches(sequencer)
        with pytest.raises(OffsetOutOfRange) as caught:
            sequencer.find_batches("a", offset, BIG)
        assert (caught.value.start_offset, caught.value.end_offset) == (0, 10)

    def test_find_batches_below_the_start_offset(self, sequencer: Sequencer) -> None:
        _five_batches(sequencer)
        sequencer.trim("a", 4)
        with pytest.raises(OffsetOutOfRange) as caught:
            sequencer.find_batches("a", 3, BIG)
        assert (caught.value.start_offset, caught.value.end_offset) == (4, 10)

    @pytest.mark.parametrize(
        "max_bytes, count", [(0, 1), (1, 1), (100, 1), (199, 1), (200, 2), (250, 2), (BIG, 4)]
    )
    def test_max_bytes_limits_a_page_but_returns_at_least_one_batch(
        self, sequencer: Sequencer, max_bytes: int, count: int
    ) -> None:
        _five_batches(sequencer)
        page = sequencer.find_batches("a", 3, max_bytes)
        assert [b.base_offset for b in page.batches] == [2, 4, 6, 8][:count]

    def test_find_batches_refuses_non_int_offsets(self, sequencer: Sequencer) -> None:
        _five_batches(sequencer)
        with pytest.raises(ConfigError):
            sequencer.find_batches("a", 1.0, BIG)  # type: ignore[arg-type]

    # ---------------------------------------------------------------------------- trim

    def test_trim_moves_the_start_and_drops_whole_batches_below_it(
        self, sequencer: Sequencer
    ) -> None:
        _five_batches(sequencer)
        sequencer.trim("a", 5)
        info = sequencer.stream_info("a")
        assert (info.start_offset, info.end_offset) == (5, 10)
        page = sequencer.find_batches("a", 5, BIG)
        assert [b.base_offset for b in page.batches] == [4, 6, 8]  # 4-5 straddles the start
        assert page.start_offset == 5

    def test_trim_never_moves_backwards(self, sequencer: Sequencer) -> None:
        _five_batches(sequencer)
        sequencer.trim("a", 6)
        sequencer.trim("a", 2)
        sequencer.trim("a", 6)
        assert sequencer.stream_info("a").start_offset == 6
        assert spans(sequencer, "a") == [(6, 7), (8, 9)]

    def test_trim_past_the_end_is_refused(self, sequencer: Sequencer) -> None:
        _five_batches(sequencer)
        with pytest.raises(OffsetOutOfRange) as caught:
            sequencer.trim("a", 11)
        assert (caught.value.start_offset, caught.value.end_offset) == (0, 10)
        sequencer.trim("a", 10)
        assert sequencer.stream_info("a").start_offset == 10
        assert sequencer.find_batches("a", 10, BIG).batches == []
        assert offsets(sequencer.commit("o2", [batch("a")])) == [10]

    def test_trimmed_objects_become_deletable_after_the_grace_period(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        make(sequencer, "a", "b")
        sequencer.commit("old", [batch("a", 2)])
        sequencer.commit("shared", [batch("a", 2), batch("b")])
        sequencer.commit("new", [batch("a", 2)])
        sequencer.trim("a", 4)
        assert sequencer.objects_to_delete(0) == ["old"]
        clock.advance(59)
        assert sequencer.objects_to_delete(60) == []
        clock.advance(1)
        assert sequencer.objects_to_delete(60) == ["old"]
        sequencer.trim("b", 1)
        assert sequencer.objects_to_delete(0) == ["old", "shared"]  # in the order they died

    def test_replace_batches_swaps_coordinates(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        old = _compactable(sequencer)
        merged = BatchLocation(-1, "o3", 0, 450, 0, 5, 77)
        assert sequencer.replace_batches("a", [old[0].batch_id, old[1].batch_id], [merged]) is True
        batches = all_batches(sequencer, "a")
        assert [(b.object_key, b.base_offset, b.last_offset, b.size) for b in batches] == [
            ("o3", 0, 5, 450),
            ("o1", 6, 8, 300),
            ("o2", 9, 9, 100),
        ]
        assert batches[0].batch_id not in {b.batch_id for b in old} | {-1}
        assert batches[0].max_timestamp == 77
        assert sequencer.objects_to_delete(0) == []  # o1 still holds 6..8
        rest = BatchLocation(0, "o3", 450, 200, 6, 8, 0)
        assert sequencer.replace_batches("a", [old[2].batch_id], [rest]) is True
        assert sequencer.objects_to_delete(0) == ["o1"]
        assert sequencer.stream_info("a").end_offset == 10

    def test_replace_batches_with_stale_ids_changes_nothing(self, sequencer: Sequencer) -> None:
        old = _compactable(sequencer)
        new = BatchLocation(0, "o3", 0, 10, 0, 2, 0)
        assert sequencer.replace_batches("a", [old[0].batch_id], [new]) is True
        before = snapshot(sequencer)
        for ids in ([old[0].batch_id], [old[0].batch_id, old[1].batch_id], [123_456]):
            assert sequencer.replace_batches("a", ids, [new]) is False
        sequencer.trim("a", 6)
        before = snapshot(sequencer)
        assert sequencer.replace_batches("a", [old[1].batch_id], []) is False
        assert snapshot(sequencer) == before

    def test_replace_batches_ignores_ids_of_another_stream(self, sequencer: Sequencer) -> None:
        old = _compactable(sequencer)
        make(sequencer, "b")
        before = snapshot(sequencer)
        assert sequencer.replace_batches("b", [old[0].batch_id], []) is False
        assert snapshot(sequencer) == before

    def test_replace_batches_may_drop_batches_entirely(self, sequencer: Sequencer) -> None:
        old = _compactable(sequencer)
        assert sequencer.replace_batches("a", [old[3].batch_id], []) is True
        assert spans(sequencer, "a") == [(0, 2), (3, 5), (6, 8)]
        assert sequencer.objects_to_delete(0) == ["o2"]
        assert sequencer.stream_info("a").end_offset == 10  # offsets are never reused

    def test_find_batches_from_offsets_left_without_a_batch(self, sequencer: Sequencer) -> None:
        """Compaction leaves offsets with no batch (here 0..3 and 9): a read from one of
        them starts at the next batch, or finds nothing before the end offset."""
        old = _compactable(sequencer)
        ids = [old[0].batch_id, old[1].batch_id]
        assert sequencer.replace_batches("a", ids, [BatchLocation(0, "o3", 0, 10, 4, 5, 0)])
        assert sequencer.replace_batches("a", [old[3].batch_id], [])
        for offset in (0, 3, 4):
            page = sequencer.find_batches("a", offset, 1 << 20)
            assert [(b.base_offset, b.last_offset) for b in page.batches] == [(4, 5), (6, 8)]
        assert sequencer.find_batches("a", 9, 1 << 20).batches == []
        assert sequencer.find_batches("a", 10, 1 << 20).batches == []

    @pytest.mark.parametrize(
        "ids, news",
        [
            ([0], [BatchLocation(0, "n", 0, 1, 0, 3, 0)]),  # beyond the replaced offsets
            ([0, 1], [BatchLocation(0, "n", 0, 1, 0, 3, 0), BatchLocation(0, "n", 0, 1, 3, 5, 0)]),
            ([0, 1], [BatchLocation(0, "n", 0, 1, 3, 5, 0), BatchLocation(0, "n", 0, 1, 0, 2, 0)]),
            ([0, 2], [BatchLocation(0, "n", 0, 1, 0, 2, 0)]),  # not contiguous
            ([], []),
            ([0, 0], []),
            ([0], [BatchLocation(0, "n", 0, 1, 2, 1, 0)]),  # last < base
            ([0], [BatchLocation(0, "", 0, 1, 0, 2, 0)]),  # no object key
        ],
        ids=["outside", "overlap", "unordered", "gap-in-olds", "none", "repeated", "bad", "no-key"],
    )
    def test_invalid_replacements_are_refused(
        self, sequencer: Sequencer, ids: list[int], news: list[BatchLocation]
    ) -> None:
        old = _compactable(sequencer)
        before = snapshot(sequencer)
        with pytest.raises((SequencerError, ConfigError)):
            sequencer.replace_batches("a", [old[i].batch_id for i in ids], news)
        assert snapshot(sequencer) == before

    # ------------------------------------------------------------------ object garbage

    def test_objects_to_delete_honours_the_grace_period(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        make(sequencer, "a")
        sequencer.commit("x", [batch("a")])
        clock.advance(1000)
        assert sequencer.objects_to_delete(0) == []  # live objects never qualify
        sequencer.trim("a", 1)
        clock.advance(9.5)
        assert sequencer.objects_to_delete(10) == []
        assert sequencer.objects_to_delete(9.5) == ["x"]
        clock.advance(0.5)
        assert sequencer.objects_to_delete(10) == ["x"]

    def test_forget_objects_drops_dead_objects_only(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        sequencer.commit("dead", [batch("a")])
        sequencer.commit("live", [batch("a")])
        sequencer.trim("a", 1)
        sequencer.forget_objects(["dead", "live", "never-heard-of"])
        assert sequencer.objects_to_delete(0) == []
        assert [b.object_key for b in all_batches(sequencer, "a")] == ["live"]
        sequencer.trim("a", 2)
        assert sequencer.objects_to_delete(0) == ["live"]  # its row survived the forget

    def test_forget_objects_wants_a_list(self, sequencer: Sequencer) -> None:
        sequencer.record_orphan("k")
        with pytest.raises(ConfigError):
            sequencer.forget_objects("k")
        assert sequencer.objects_to_delete(0) == ["k"]

    def test_commit_accepts_any_iterable_of_batches(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        results = sequencer.commit("o", (batch("a", n) for n in (1, 2)))  # type: ignore[arg-type]
        assert offsets(results) == [0, 1]

    def test_record_orphan(self, sequencer: Sequencer, clock: FakeClock) -> None:
        make(sequencer, "a")
        sequencer.record_orphan("lost")
        clock.advance(5)
        sequencer.record_orphan("lost")  # the first time counts
        sequencer.commit("kept", [batch("a")])
        sequencer.record_orphan("kept")  # committed after all: never delete a live object
        clock.advance(5)
        assert sequencer.objects_to_delete(10) == ["lost"]
        sequencer.forget_objects(["lost"])
        assert sequencer.objects_to_delete(0) == []

    # ------------------------------------------------------------------ consumer groups

    def test_commit_offsets_merges_per_group(self, sequencer: Sequencer) -> None:
        assert sequencer.committed_offsets("g") == {}
        sequencer.commit_offsets("g", {"a": 5, "b": 1})
        sequencer.commit_offsets("g", {"b": 7})
        sequencer.commit_offsets("h", {"a": 2})
        sequencer.commit_offsets("g", {})
        assert sequencer.committed_offsets("g") == {"a": 5, "b": 7}
        assert sequencer.committed_offsets("h") == {"a": 2}
        sequencer.committed_offsets("g")["a"] = 0  # a copy
        assert sequencer.committed_offsets("g")["a"] == 5

    def test_list_groups_names_groups_with_offsets(self, sequencer: Sequencer) -> None:
        assert sequencer.list_groups() == []
        sequencer.create_stream("a", {})
        sequencer.create_stream("b", {})
        sequencer.commit_offsets("h", {"a": 2})
        sequencer.commit_offsets("g", {"a": 5, "b": 1})
        sequencer.commit_offsets("f", {})  # nothing stored: not a group
        sequencer.commit_offsets("Z-1", {"b": 0})
        assert sequencer.list_groups() == ["Z-1", "g", "h"]
        sequencer.delete_stream("a")  # h's only stream: h goes; g keeps b
        assert sequencer.list_groups() == ["Z-1", "g"]

    @pytest.mark.parametrize(
        "group, offsets_, error",
        [
            ("bad/group", {"a": 1}, InvalidStreamName),
            ("", {"a": 1}, InvalidStreamName),
            ("g", {"bad/stream": 1}, InvalidStreamName),
            ("g", {"a": -1}, OffsetOutOfRange),
            ("g", {"a": "1"}, ConfigError),
        ],
    )
    def test_commit_offsets_validates(
        self, sequencer: Sequencer, group: str, offsets_: dict[str, Any], error: type[Exception]
    ) -> None:
        with pytest.raises(error):
            sequencer.commit_offsets(group, offsets_)
        if group == "g":
            assert sequencer.committed_offsets("g") == {}
        else:
            with pytest.raises(InvalidStreamName):
                sequencer.committed_offsets(group)

    @pytest.mark.parametrize(
        "ts, expected", [(-5, 0), (10, 0), (11, 2), (20, 2), (25, 4), (30, 4), (31, None)]
    )
    def test_offset_for_time_with_rising_timestamps(
        self, sequencer: Sequencer, ts: int, expected: int | None
    ) -> None:
        _timed(sequencer, [10, 20, 30])
        assert sequencer.offset_for_time("a", ts) == expected

    @pytest.mark.parametrize("ts, expected", [(15, 2), (30, 2), (50, 2), (55, 6), (61, None)])
    def test_offset_for_time_with_unordered_timestamps(
        self, sequencer: Sequencer, ts: int, expected: int | None
    ) -> None:
        _timed(sequencer, [10, 50, 20, 60])  # the first batch whose max >= ts, in offset order
        assert sequencer.offset_for_time("a", ts) == expected

    def test_offset_for_time_after_trim(self, sequencer: Sequencer) -> None:
        _timed(sequencer, [100, 10, 20, 30], span=4)  # 0-3, 4-7, 8-11, 12-15
        sequencer.trim("a", 9)
        assert sequencer.offset_for_time("a", 15) == 9  # batch 8-11 begins below the start
        assert sequencer.offset_for_time("a", 25) == 12
        assert sequencer.offset_for_time("a", 50) is None  # only the trimmed batch was that late
        sequencer.trim("a", 16)
        assert sequencer.offset_for_time("a", 0) is None

    def test_offset_for_time_on_an_empty_stream(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        assert sequencer.offset_for_time("a", 0) is None

    def test_offset_for_time_sees_replacements(self, sequencer: Sequencer) -> None:
        _timed(sequencer, list(range(0, 400, 10)), span=1)  # 40 batches, ts = 10 * offset
        ids = [b.batch_id for b in all_batches(sequencer, "a")[3:5]]
        # A rewrite that raises a timestamp must not hide behind older index entries.
        assert sequencer.replace_batches("a", ids, [BatchLocation(0, "n", 0, 1, 3, 4, 1000)])
        assert sequencer.offset_for_time("a", 500) == 3
        assert sequencer.offset_for_time("a", 35) == 3
        assert sequencer.offset_for_time("a", 1001) is None

    def test_offset_for_time_sees_timestamps_moved_down(self, sequencer: Sequencer) -> None:
        _timed(sequencer, list(range(0, 400, 10)), span=1)
        # Swapping neighbours' timestamps keeps the maximum but moves a late one lower.
        ids = [b.batch_id for b in all_batches(sequencer, "a")[15:17]]
        swapped = [
            BatchLocation(0, "n", 0, 1, 15, 15, 160),
            BatchLocation(0, "n", 1, 1, 16, 16, 150),
        ]
        assert sequencer.replace_batches("a", ids, swapped)
        assert sequencer.offset_for_time("a", 155) == 15

    def test_offset_for_time_matches_a_full_scan(self, sequencer: Sequencer) -> None:
        rng = random.Random(7)
        make(sequencer, "a")
        now = 1000
        for n in range(12):
            commit = []
            for _ in range(20):
                now += rng.randint(0, 30)
                late = now - rng.randint(0, 400) if rng.random() < 0.2 else now  # stragglers
                commit.append(batch("a", rng.randint(1, 4), ts=late))
            sequencer.commit(f"o{n}", commit)
            if n % 4 == 3:
                info = sequencer.stream_info("a")
                sequencer.trim("a", info.start_offset + (info.end_offset - info.start_offset) // 5)
            if n % 3 == 2:
                live = all_batches(sequencer, "a")
                i = rng.randrange(len(live) - 2)
                olds = live[i : i + 2]
                stamp = rng.choice([olds[0].max_timestamp, now + 50])
                new = BatchLocation(
                    0, f"c{n}", 0, 1, olds[0].base_offset, olds[1].last_offset, stamp
                )
                assert sequencer.replace_batches("a", [b.batch_id for b in olds], [new])
            for ts in [*rng.sample(range(900, now + 100), 12), now + 50, now + 51]:
                assert sequencer.offset_for_time("a", ts) == _brute_force(sequencer, ts), ts

    def test_close_is_idempotent(self, sequencer: Sequencer) -> None:
        sequencer.close()
        sequencer.close()

    def test_alter_stream_merges_changes_into_the_config(self, sequencer: Sequencer) -> None:
        sequencer.create_stream("a", {"retention_ms": 5, "compression": "zstd"})
        meta = sequencer.alter_stream("a", {"retention_ms": 10})
        assert meta.config == {"retention_ms": 10, "compression": "zstd"}
        sequencer.alter_stream("a", {"retention_bytes": 7})  # a second change keeps the first
        assert sequencer.stream_info("a").config == {
            "retention_ms": 10,
            "compression": "zstd",
            "retention_bytes": 7,
        }
        with pytest.raises(StreamNotFound):
            sequencer.alter_stream("missing", {"retention_ms": 1})
        with pytest.raises(ConfigError):
            sequencer.alter_stream("a", {"retention_ms": object()})
        assert sequencer.stream_info("a").config["retention_ms"] == 10

    # --------------------------------------------------------------------- transactions

    def test_transaction_commits_every_object_atomically(self, sequencer: Sequencer) -> None:
        make(sequencer, "a", "b")
        sequencer.commit("before", [batch("a", 2)])
        result = sequencer.commit_transaction(
            "job-1",
            [
                ("t1", [batch("a", 3), batch("b", 1, position=100)]),
                ("t2", [batch("b", 2), batch("a", 1, position=100)]),
            ],
        )
        assert result == TransactionResult("job-1", {"a": (2, 6), "b": (0, 3)})
        assert spans(sequencer, "a") == [(0, 1), (2, 4), (5, 5)]
        assert spans(sequencer, "b") == [(0, 0), (1, 2)]
        assert [b.object_key for b in all_batches(sequencer, "a")] == ["before", "t1", "t2"]
        assert sorted(sequencer.list_objects()) == ["before", "t1", "t2"]

    def test_repeated_transaction_returns_the_original_ranges(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        first = sequencer.commit_transaction("q/7", [("t1", [batch("a", 2)])])
        before = snapshot(sequencer)
        again = sequencer.commit_transaction("q/7", [("t1", [batch("a", 2)])])
        assert again == TransactionResult("q/7", first.ranges, duplicate=True)
        assert snapshot(sequencer) == before  # nothing stored twice

    def test_replayed_transaction_orphans_its_new_uploads(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        make(sequencer, "a")
        sequencer.commit_transaction("q/8", [("t1", [batch("a", 2)])])
        # A replay re-ran the tasks: new objects, same transaction id.
        again = sequencer.commit_transaction("q/8", [("t1-retry", [batch("a", 2)]), ("t2", [])])
        assert again.duplicate and again.ranges == {"a": (0, 2)}
        assert sequencer.stream_info("a").end_offset == 2
        clock.advance(10)
        assert sorted(sequencer.objects_to_delete(5)) == ["t1-retry", "t2"]

    def test_a_rejected_transaction_changes_nothing(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        before = snapshot(sequencer)
        with pytest.raises(StreamNotFound):
            sequencer.commit_transaction("bad", [("t1", [batch("a")]), ("t2", [batch("nope")])])
        assert snapshot(sequencer) == before
        assert "t1" not in sequencer.list_objects()
        # The id was not remembered: the transaction can be committed once fixed.
        make(sequencer, "nope")
        result = sequencer.commit_transaction(
            "bad", [("t1", [batch("a")]), ("t2", [batch("nope")])]
        )
        assert not result.duplicate and result.ranges == {"a": (0, 1), "nope": (0, 1)}

    def test_an_empty_transaction_is_remembered(self, sequencer: Sequencer) -> None:
        assert sequencer.commit_transaction("empty", []) == TransactionResult("empty", {})
        assert sequencer.commit_transaction("empty", []).duplicate

    @pytest.mark.parametrize(
        "txn, objects, error",
        [
            ("", [], ConfigError),
            (7, [], ConfigError),
            ("x" * 1025, [], ConfigError),
            ("nul\x00", [], ConfigError),
            ("t", ("k", [batch("a")]), ConfigError),  # a lone pair, not a list of them
            ("t", "k", ConfigError),
            ("t", [("", [batch("a")])], ConfigError),
            ("t", [("k", [batch("a")]), ("k", [batch("a")])], SequencerError),
            ("t", [("k", [batch("a", producer=(1, 0), seq=0)])], SequencerError),
            ("t", [("k", [batch("a", 0)])], SequencerError),
        ],
        ids=[
            "empty-id",
            "int-id",
            "long-id",
            "nul-id",
            "lone-pair",
            "str-objects",
            "empty-key",
            "repeated-key",
            "producer-batch",
            "malformed-batch",
        ],
    )
    def test_bad_transactions_are_refused(
        self, sequencer: Sequencer, txn: Any, objects: Any, error: type[Exception]
    ) -> None:
        make(sequencer, "a")
        before = snapshot(sequencer)
        with pytest.raises(error):
            sequencer.commit_transaction(txn, objects)
        assert snapshot(sequencer) == before

    def test_transaction_ids_expire_after_the_retention_period(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        make(sequencer, "a")
        sequencer.commit_transaction("old", [("t1", [batch("a")])])
        clock.advance(TRANSACTION_RETENTION_SECONDS - 1)
        assert sequencer.commit_transaction("old", [("t1", [batch("a")])]).duplicate
        clock.advance(2)
        again = sequencer.commit_transaction("old", [("t2", [batch("a")])])
        assert not again.duplicate and again.ranges == {"a": (1, 2)}  # forgotten: stored again

    def test_only_the_newest_transaction_ids_are_remembered(
        self, monkeypatch: pytest.MonkeyPatch, sequencer: Sequencer
    ) -> None:
        # monkeypatch first: it is undone after the object-store replica's replay check
        for module in ("memory", "sqlite", "postgres"):
            monkeypatch.setattr(f"disklesslog.sequencers.{module}.TRACKED_TRANSACTIONS", 3)
        make(sequencer, "a")
        for i in range(5):
            sequencer.commit_transaction(f"t{i}", [(f"k{i}", [batch("a")])])
        assert sequencer.commit_transaction("t4", [("k4", [batch("a")])]).duplicate
        assert sequencer.commit_transaction("t2", [("k2", [batch("a")])]).duplicate
        assert not sequencer.commit_transaction("t0", [("k0b", [batch("a")])]).duplicate

    def test_concurrent_commits_of_one_transaction_apply_it_once(
        self, sequencer: Sequencer
    ) -> None:
        make(sequencer, "a")
        results: list[TransactionResult] = []
        errors: list[BaseException] = []

        def commit(i: int) -> None:
            try:
                results.append(sequencer.commit_transaction("race", [(f"k{i}", [batch("a", 4)])]))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=commit, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert sorted(r.duplicate for r in results) == [False, True, True, True]
        assert {tuple(r.ranges["a"]) for r in results} == {(0, 4)}
        assert sequencer.stream_info("a").end_offset == 4

    def test_a_transaction_refuses_objects_known_before(self, sequencer: Sequencer) -> None:
        make(sequencer, "a")
        sequencer.commit("committed", [batch("a")])
        sequencer.record_orphan("aborted")
        before = snapshot(sequencer)
        for key in ("committed", "aborted"):
            with pytest.raises(TransactionError):
                sequencer.commit_transaction("t", [("fresh", [batch("a")]), (key, [batch("a")])])
        assert snapshot(sequencer) == before

    @pytest.mark.parametrize("value", [1 << 63, 1 << 64], ids=["2**63", "2**64"])
    def test_numbers_beyond_64_bits_are_refused_before_anything_is_written(
        self, sequencer: Sequencer, value: int
    ) -> None:
        """Offsets, timestamps, sizes and ids are at most 2**63-1 on every sequencer (the
        SQL columns and msgpack integers they are stored as): a larger one is ConfigError
        (a ValueError), as an argument or inside a batch description, raised the same way
        by all of them before anything changes."""
        make(sequencer, "a")
        sequencer.commit("o1", [batch("a", 2)])
        before = snapshot(sequencer)
        for name, call in _beyond_64_bits(sequencer, value).items():
            with pytest.raises(ConfigError):
                call()
            assert snapshot(sequencer) == before, name
        assert snapshot(sequencer) == before
        assert sequencer.committed_offsets("g") == {}

    def test_the_64_bit_limit_is_inclusive(self, sequencer: Sequencer) -> None:
        top = (1 << 63) - 1
        make(sequencer, "a")
        sequencer.commit("o1", [batch("a", 2, ts=top)])
        assert sequencer.offset_for_time("a", top) == 0
        assert sequencer.offset_for_time("a", -(1 << 63)) == 0
        sequencer.commit_offsets("g", {"a": top})
        assert sequencer.committed_offsets("g") == {"a": top}
        with pytest.raises(OffsetOutOfRange):
            sequencer.trim("a", top)

    # ------------------------------------------------------------------------ leases

    def test_a_renew_restarts_a_contenders_wait(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        lease = sequencer.acquire_lease("m", "a", 10_000)
        assert lease is not None
        assert lease.expires_at_ms == clock() * 1000 + 9_000  # the safety margin taken off
        clock.advance(6)
        lease = sequencer.renew_lease(lease)
        assert lease.expires_at_ms == clock() * 1000 + 9_000
        clock.advance(6)  # 12 s since the acquire, 6 since the renew
        assert sequencer.acquire_lease("m", "b", 10_000) is None
        held = sequencer.lease_holder("m")
        assert held is not None and held.expires_at_ms == (clock() - 6) * 1000 + 10_000
        clock.advance(4)
        taken = sequencer.acquire_lease("m", "b", 5_000)
        assert taken is not None and (taken.token, taken.duration_ms) == (2, 5_000)
        clock.advance(4.999)  # the contender waits the duration the holder asked for
        assert sequencer.acquire_lease("m", "a", 10_000) is None
        clock.advance(0.001)
        assert sequencer.acquire_lease("m", "a", 10_000).token == 3  # type: ignore[union-attr]

    def test_an_expired_lease_nobody_took_is_renewed(
        self, sequencer: Sequencer, clock: FakeClock
    ) -> None:
        lease = sequencer.acquire_lease("m", "a", 1_000)
        assert lease is not None
        clock.advance(60)
        assert sequencer.lease_holder("m") is None
        renewed = sequencer.renew_lease(lease)
        assert renewed.token == lease.token
        assert sequencer.acquire_lease("m", "b", 1_000) is None

    def test_swap_lease_compares_the_serial(self, sequencer: Sequencer) -> None:
        record = LeaseRecord("a", 1, 1, 1_000)
        assert sequencer.read_lease("m") is None
        assert sequencer.swap_lease("m", 0, record)
        assert not sequencer.swap_lease("m", 0, record)
        assert not sequencer.swap_lease("m", 5, LeaseRecord(None, 1, 6, 1_000))
        assert sequencer.read_lease("m") == record
        assert sequencer.swap_lease("m", 1, LeaseRecord(None, 1, 2, 1_000))
        assert sequencer.read_lease("m") == LeaseRecord(None, 1, 2, 1_000)
        for serial, bad in [
            (2, LeaseRecord("a", 2, 4, 1_000)),  # the serial must move by one
            (2, LeaseRecord("", 2, 3, 1_000)),
            (2, LeaseRecord("a", 0, 3, 1_000)),
            (2, LeaseRecord("a", 1 << 63, 3, 1_000)),
            (-1, LeaseRecord("a", 2, 0, 1_000)),
        ]:
            with pytest.raises(ConfigError):
                sequencer.swap_lease("m", serial, bad)
        assert sequencer.read_lease("m") == LeaseRecord(None, 1, 2, 1_000)
        for bad_serial in (0, -1, 1.0, True):
            with pytest.raises(ConfigError):
                sequencer.drop_lease("m", bad_serial)  # type: ignore[arg-type]
        assert not sequencer.drop_lease("m", 1)  # the serial moved on
        assert not sequencer.drop_lease("other", 1)
        assert sequencer.lease_names() == ["m"]

    def test_a_swap_from_a_serial_read_before_pruning_misses_the_new_record(
        self, sequencer: Sequencer
    ) -> None:
        """A drop raises the token floor above the record's token and serial, and a
        name's first record starts above it: a contender that read the record before
        the drop cannot swap it (its serial never comes back) nor drop the new one."""
        lease = sequencer.acquire_lease("m", "a", 10_000)
        assert lease is not None
        sequencer.release_lease(lease)
        stale = sequencer.read_lease("m")
        assert stale == LeaseRecord(None, 1, 2, 10_000)
        assert sequencer.prune_leases(0) == ["m"]
        assert (sequencer.lease_names(), sequencer.lease_floor()) == ([], 2)
        again = sequencer.acquire_lease("m", "b", 10_000)
        assert again is not None and again.token == 3
        sequencer.release_lease(again)
        assert sequencer.read_lease("m") == LeaseRecord(None, 3, 4, 10_000)
        takeover = LeaseRecord("c", stale.token + 1, stale.serial + 1, 10_000)
        assert not sequencer.swap_lease("m", stale.serial, takeover)
        assert not sequencer.drop_lease("m", stale.serial)
        for first in (LeaseRecord("c", 2, 3, 1_000), LeaseRecord("c", 3, 2, 1_000)):
            assert not sequencer.swap_lease("n", 0, first)  # token or serial at the floor
        assert sequencer.swap_lease("n", 0, LeaseRecord("c", 3, 3, 1_000))
        assert sequencer.lease_names() == ["m", "n"]
