"""The object writer's pipeline: uploads overlap, commits go in flush order, and a writer
with several flushes waiting commits them together (one sequencer entry on the
object-store sequencer). When a flush fails, the flushes behind it are renumbered, not
failed; per stream, records keep their append order and nothing is stored twice."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import fsspec
import pytest

import disklesslog
from disklesslog import (
    DisklessLogError,
    OutOfOrderSequence,
    ProducerFenced,
    RecordTooLarge,
    SequencerConflict,
    StreamConfig,
    UnknownProducerState,
)
from disklesslog.errors import ConfigError
from disklesslog.objects.writer import COMMIT_ATTEMPTS, RESTARTS, ObjectWriter
from disklesslog.sequencers.base import BatchToCommit, CommitResult
from disklesslog.sequencers.memory import MemorySequencer
from disklesslog.sequencers.objectstore import ObjectStoreSequencer


@pytest.fixture(autouse=True)
def pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the pipeline: every flush goes through an upload thread, as
    on slow storage (on memory:// the writer would otherwise upload inline)."""
    monkeypatch.setattr("disklesslog.objects.writer.INLINE_BELOW", 0.0)


def _url() -> str:
    return f"memory://pipeline-{uuid.uuid4().hex}/log"


class GatedSequencer(MemorySequencer):
    """Holds commits at a gate while a test lines flushes up behind them; records every
    commit call as the list of object keys it carried; ``refuse`` picks objects to
    refuse (key -> error) as if the sequencer had judged them so."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls: list[list[str]] = []
        self.refuse: Callable[[str], DisklessLogError | None] = lambda key: None

    def hold(self) -> None:
        """Hold the next commits at the gate (``entered`` is set when one arrives)."""
        self.entered.clear()
        self.gate.clear()

    def _wait(self, keys: list[str]) -> None:
        self.calls.append(keys)
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        self._wait([object_key])
        refusal = self.refuse(object_key)
        if refusal is not None:
            raise refusal
        return super().commit(object_key, batches)

    def commit_many(self, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]) -> list[Any]:
        self._wait([key for key, _ in objects])
        outcomes: list[Any] = []
        for key, batches in objects:
            refusal = self.refuse(key)
            if refusal is not None:
                outcomes.append(refusal)
                continue
            try:
                outcomes.append(super().commit(key, batches))
            except DisklessLogError as exc:
                outcomes.append(exc)
        return outcomes


def _put_count(log: disklesslog.Log) -> int:
    return int(log.metrics()["puts"])


def _line_up(log: disklesslog.Log, writer: ObjectWriter, appends: list[tuple[str, bytes]]) -> list:
    """Append each record as its own flush (waits until each one's object is uploaded)."""
    futures = []
    for stream, value in appends:
        puts = _put_count(log)
        futures.append(writer.append(stream, value))
        deadline = time.monotonic() + 10
        while _put_count(log) == puts:
            assert time.monotonic() < deadline, "the flush was never uploaded"
            time.sleep(0.001)
    return futures


def _values(log: disklesslog.Log, stream: str) -> list[bytes | None]:
    return [r.value for r in log.stream(stream).read()]


# ------------------------------------------------------------- grouping


def test_flushes_waiting_behind_a_commit_are_committed_together() -> None:
    sequencer = GatedSequencer()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0)
        sequencer.hold()
        first = writer.append("s", b"r0")
        assert sequencer.entered.wait(10)  # flush 1 is committing, held at the gate
        waiting = _line_up(log, writer, [("s", b"r1"), ("t", b"t0"), ("s", b"r2")])
        sequencer.gate.set()
        writer.flush()
        assert [f.result() for f in [first, *waiting]] == [0, 1, 0, 2]
        assert [len(keys) for keys in sequencer.calls] == [1, 3]  # one group of three
        assert _values(log, "s") == [b"r0", b"r1", b"r2"]
        metrics = log.metrics()
        assert (metrics["commits"], metrics["committed_objects"]) == (2, 4)
        writer.close()


def test_at_most_max_inflight_flushes_wait_and_the_rest_gather_into_one() -> None:
    sequencer = GatedSequencer()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0, max_inflight=2)
        sequencer.hold()
        futures = [writer.append("s", b"0")]
        assert sequencer.entered.wait(10)
        futures += _line_up(log, writer, [("s", b"1")])  # the second in flight
        futures += [writer.append("s", b"%d" % i) for i in range(2, 50)]  # no room: buffered
        time.sleep(0.05)
        assert _put_count(log) == 3  # the marker and two objects; the flusher waits
        sequencer.gate.set()
        writer.flush()
        assert [f.result() for f in futures] == list(range(50))
        assert _put_count(log) == 4  # everything else went into one more object
        writer.close()


def test_a_writer_commits_its_waiting_flushes_in_one_objectstore_entry() -> None:
    """The object-store sequencer: a group of waiting flushes is one entry, one PUT."""
    fs = fsspec.filesystem("memory")
    root = f"/pipeline-seq-{uuid.uuid4().hex}"
    gate, entered = threading.Event(), threading.Event()
    gate.set()

    class Gated(ObjectStoreSequencer):
        def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> Any:
            entered.set()
            gate.wait(10)
            return super().commit(object_key, batches)

    sequencer = Gated(fs, root)
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0)
        writer.append("s", b"warm").result()  # creates the stream and its producer state
        gate.clear()
        entered.clear()
        before = sequencer.tail
        futures = [writer.append("s", b"0")]
        assert entered.wait(10)
        futures += _line_up(log, writer, [("s", b"1"), ("s", b"2"), ("s", b"3")])
        gate.set()
        writer.flush()
        assert [f.result() for f in futures] == [1, 2, 3, 4]
        assert sequencer.tail == before + 2  # flush 1 alone, then flushes 2-4 in one entry
        writer.close()
    fresh = ObjectStoreSequencer(fs, root)
    assert fresh.stream_info("s").end_offset == 5


# ------------------------------------------------- failures in a pipeline


def test_a_refused_flush_fails_alone_and_the_flushes_behind_it_are_renumbered() -> None:
    sequencer = GatedSequencer()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0)
        sequencer.hold()
        doomed = writer.append("s", b"refused")
        assert sequencer.entered.wait(10)
        refused_key = sequencer.calls[-1][0]
        sequencer.refuse = lambda key: (
            OutOfOrderSequence("injected refusal") if key == refused_key else None
        )
        behind = _line_up(log, writer, [("s", b"a"), ("t", b"t0"), ("s", b"b")])
        sequencer.gate.set()
        with pytest.raises(OutOfOrderSequence, match="injected"):
            writer.flush()
        with pytest.raises(OutOfOrderSequence):
            doomed.result()
        assert [f.result() for f in behind] == [0, 0, 1]
        assert _values(log, "s") == [b"a", b"b"]
        restamped = log.metrics()["restamped_flushes"]
        assert restamped >= 1
        assert writer.append("s", b"c").result() == 2  # numbered right from the start
        assert log.metrics()["restamped_flushes"] == restamped
        assert refused_key in sequencer.objects_to_delete(0)  # orphans, for the collector
        writer.close()


def test_a_stream_deleted_under_waiting_flushes_is_created_again() -> None:
    sequencer = GatedSequencer()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        log.stream("s").append_batch([b"old"] * 3)
        writer = log.writer(linger_ms=0)
        writer.append("s", b"x").result()
        sequencer.hold()
        futures = [writer.append("s", b"n0")]
        assert sequencer.entered.wait(10)
        futures += _line_up(log, writer, [("s", b"n1"), ("s", b"n2")])
        log.delete_stream("s")
        sequencer.gate.set()
        writer.flush()
        assert [f.result() for f in futures] == [0, 1, 2]
        assert _values(log, "s") == [b"n0", b"n1", b"n2"]
        writer.close()


def test_a_stream_created_again_elsewhere_under_waiting_flushes_is_numbered_from_zero() -> None:
    """Another process deletes and creates the stream while flushes wait: the sequencer
    has no numbers of this producer there (UnknownProducerState), so the writer numbers
    the stream from 0 again; the flushes behind are restamped, the other stream's
    numbering is untouched, and later flushes are numbered right from the start."""
    sequencer = GatedSequencer()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0)
        assert [writer.append(s, b"old").result() for s in ("s", "t")] == [0, 0]
        sequencer.hold()
        futures = [writer.append("s", b"n0")]
        assert sequencer.entered.wait(10)
        refused_key = sequencer.calls[-1][0]
        futures += _line_up(log, writer, [("s", b"n1"), ("t", b"t1"), ("s", b"n2")])
        MemorySequencer.delete_stream(sequencer, "s")  # as another process would
        smaller = StreamConfig().replace(max_record_bytes=1024)  # and with other settings
        MemorySequencer.create_stream(sequencer, "s", smaller.to_dict())
        sequencer.gate.set()
        writer.flush()
        assert [f.result() for f in futures] == [0, 1, 1, 2]
        with pytest.raises(RecordTooLarge):  # later appends follow the new stream's settings
            writer.append("s", b"x" * 2048)
        assert _values(log, "s") == [b"n0", b"n1", b"n2"]
        assert _values(log, "t") == [b"old", b"t1"]
        assert log.metrics()["restamped_flushes"] >= 1
        restamped = log.metrics()["restamped_flushes"]
        assert writer.append("s", b"n3").result() == 3
        assert writer.append("t", b"t2").result() == 2
        assert log.metrics()["restamped_flushes"] == restamped
        assert refused_key in sequencer.objects_to_delete(0)  # its numbers were stale
        writer.close()


def test_a_stream_created_again_over_and_over_fails_the_flush_at_last() -> None:
    """Numbering from 0 again is bounded per stream: a flush refused every time fails
    with the sequencer's UnknownProducerState instead of looping."""
    sequencer = GatedSequencer()
    sequencer.refuse = lambda key: UnknownProducerState("injected", stream="s")
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0)
        future = writer.append("s", b"x")
        with pytest.raises(UnknownProducerState, match="injected"):
            future.result(timeout=10)
        assert len(sequencer.calls) == 1 + RESTARTS
        sequencer.refuse = lambda key: None
        assert writer.append("s", b"y").result() == 0
        assert _values(log, "s") == [b"y"]
        with contextlib.suppress(UnknownProducerState):
            writer.close()


class _Flaky(MemorySequencer):
    """Fails every commit with a lost connection while ``down`` is set."""

    down = False

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        if self.down:
            raise ConnectionError("sequencer unreachable")
        return super().commit(object_key, batches)

    def commit_many(self, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]) -> Any:
        if self.down:
            raise ConnectionError("sequencer unreachable")
        return super().commit_many(objects)


def test_an_unknown_outcome_fails_its_flushes_and_a_new_producer_carries_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("disklesslog.objects.writer._RETRY_DELAY", 0.001)
    sequencer = _Flaky()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0, producer="ingest")
        assert writer.append("s", b"kept").result() == 0
        producer = writer.producer
        sequencer.down = True
        lost = writer.append("s", b"unknown")
        with pytest.raises(DisklessLogError, match="may or may not be visible"):
            lost.result(timeout=10)
        sequencer.down = False
        assert writer.append("s", b"after").result() == 1
        assert writer.producer == (producer[0], producer[1] + 1)  # a new instance
        assert log.metrics()["commit_errors"] == COMMIT_ATTEMPTS
        with pytest.raises(DisklessLogError):
            writer.flush()  # the failure is reported once
        writer.flush()
        assert _values(log, "s") == [b"kept", b"after"]
        writer.close()


def test_a_fenced_writer_fails_every_waiting_flush_and_shows_nothing() -> None:
    sequencer = GatedSequencer()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0, producer="p")
        writer.append("s", b"before").result()
        sequencer.hold()
        futures = [writer.append("s", b"z0")]
        assert sequencer.entered.wait(10)
        futures += _line_up(log, writer, [("s", b"z1"), ("t", b"z2")])
        sequencer.gate.set()
        sequencer.init_producer("p")  # a newer instance elsewhere
        with pytest.raises(ProducerFenced):
            writer.flush()
        for future in futures:
            with pytest.raises(ProducerFenced):
                future.result()
        assert _values(log, "s") == [b"before"]
        assert "t" not in log.streams() or log.stream("t").end_offset == 0
        assert len(sequencer.objects_to_delete(0)) >= 3  # every uploaded object is an orphan
        with pytest.raises(ProducerFenced):
            writer.append("s", b"more")  # at once, without uploading
        writer.close()  # flush() reported the failure already


def test_a_failed_upload_fails_its_flush_only(monkeypatch: pytest.MonkeyPatch) -> None:
    sequencer = GatedSequencer()
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0)
        real_put = log.storage.put
        calls = []

        def put(key: str, data: bytes) -> None:
            calls.append(key)
            if len(calls) == 2:
                raise OSError("upload failed after every retry")
            real_put(key, data)

        monkeypatch.setattr(log.storage, "put", put)
        sequencer.hold()
        futures = [writer.append("s", b"0")]
        assert sequencer.entered.wait(10)
        futures.append(writer.append("s", b"lost"))
        deadline = time.monotonic() + 10
        while len(calls) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        futures += _line_up(log, writer, [("s", b"1")])
        sequencer.gate.set()
        with pytest.raises(OSError, match="upload failed"):
            writer.flush()
        assert futures[0].result() == 0 and futures[2].result() == 1
        with pytest.raises(OSError):
            futures[1].result()
        assert _values(log, "s") == [b"0", b"1"]
        writer.close()


def test_a_sequencer_conflict_is_committed_again_not_failed() -> None:
    """SequencerConflict means nothing was applied (the object-store sequencer lost every
    race for its next entry): the writer commits the flush again."""
    sequencer = GatedSequencer()
    conflicts = [2]

    def refuse(key: str) -> DisklessLogError | None:
        if conflicts[0]:
            conflicts[0] -= 1
            return SequencerConflict("lost the race 100 times")
        return None

    sequencer.refuse = refuse
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        with log.writer(linger_ms=0) as writer:
            assert writer.append("s", b"x").result() == 0
        assert log.metrics()["commit_conflicts"] == 2
        assert _values(log, "s") == [b"x"]


def test_fast_storage_is_written_inline_and_slow_storage_through_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While uploads and commits take less than ``INLINE_BELOW``, the flusher does both
    itself (thread hand-offs would cost more than overlapping saves); slower, flushes go
    to the pool.

    The fast half raises the threshold to 10 s: memory storage takes microseconds, but on
    a loaded machine a scheduling pause can make one of them take over the real 1 ms and
    start a thread, which would test the machine's load, not the decision."""
    monkeypatch.setattr("disklesslog.objects.writer.INLINE_BELOW", 10.0)
    with disklesslog.open(_url(), sequencer=MemorySequencer()) as log:
        writer = log.writer(linger_ms=0)
        for i in range(20):
            assert writer.append("s", b"%d" % i).result() == i
        assert not writer._uploads._threads  # never needed an upload thread
        monkeypatch.setattr("disklesslog.objects.writer.INLINE_BELOW", 0.001)
        slow = GatedSequencer()
        real_commit = slow.commit

        def sluggish(key: str, batches: Any) -> Any:
            time.sleep(0.01)
            return real_commit(key, batches)

        slow.commit = sluggish  # type: ignore[method-assign]
    with disklesslog.open(_url(), sequencer=slow) as log:
        writer = log.writer(linger_ms=0)
        for i in range(20):
            writer.append("s", b"%d" % i).result()
        assert writer._uploads._threads  # commits of 10 ms: the pipeline took over
        writer.close()


def test_max_inflight_is_checked() -> None:
    with disklesslog.open(_url(), sequencer=MemorySequencer()) as log:
        for bad in (0, 6, 2.0, None):
            with pytest.raises(ConfigError, match="max_inflight"):
                log.writer(max_inflight=bad)  # type: ignore[arg-type]


# ------------------------------------------------------- the model check


class _Chaos(MemorySequencer):
    """A sequencer that misbehaves at random: slow commits (so flushes pile up), lost
    connections before or after a commit is applied, and refusals of whole objects."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.refused: dict[str, bool] = {}  # one verdict per object, kept on retries
        self.outage = 0  # calls left that fail: bursts long enough to give up on a group

    def _maybe_fail(self) -> None:
        time.sleep(self.rng.choice([0, 0, 0.001, 0.005]))
        if self.outage == 0 and self.rng.random() < 0.03:
            self.outage = self.rng.randint(1, 7)
        if self.outage or self.rng.random() < 0.05:
            self.outage = max(0, self.outage - 1)
            raise ConnectionError("lost before the commit")

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        return self.commit_many([(object_key, batches)])[0]  # type: ignore[return-value]

    def commit_many(self, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]) -> Any:
        self._maybe_fail()
        outcomes: list[Any] = []
        for key, batches in objects:
            if self.refused.setdefault(key, self.rng.random() < 0.05):
                outcomes.append(OutOfOrderSequence(f"chaos refused {key}"))
                continue
            try:
                outcomes.append(MemorySequencer.commit(self, key, batches))
            except DisklessLogError as exc:
                outcomes.append(exc)
        if self.rng.random() < 0.08:
            raise ConnectionError("lost after the commit")
        return outcomes


@pytest.mark.parametrize("seed", range(12))
def test_random_failures_never_reorder_duplicate_or_lose_acknowledged_records(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many small flushes through a sequencer that loses connections and refuses objects
    at random. Every acknowledged record is at its offset; per stream, acknowledged
    records are in append order; nothing appears twice; nothing appears that was
    refused; only flushes whose outcome stayed unknown may or may not show."""
    monkeypatch.setattr("disklesslog.objects.writer._RETRY_DELAY", 0.0005)
    rng = random.Random(seed)
    sequencer = _Chaos(rng)
    streams = ["a", "b", "c"]
    with disklesslog.open(_url(), sequencer=sequencer) as log:
        writer = log.writer(linger_ms=0, max_inflight=rng.choice([2, 4, 5]))
        sent: list[tuple[str, bytes, Future[int]]] = []
        for i in range(300):
            stream = rng.choice(streams)
            value = b"%s-%d" % (stream.encode(), i)
            sent.append((stream, value, writer.append(stream, value)))
            time.sleep(rng.choice([0, 0, 0.0002, 0.001]))
        with contextlib.suppress(DisklessLogError):  # reported through the futures
            writer.close()
        for stream in streams:
            if stream not in log.streams():
                continue
            stored = [(r.offset, r.value) for r in log.stream(stream).read()]
            values = [v for _, v in stored]
            assert len(values) == len(set(values)), "a record was stored twice"
            at = dict(stored)
            acked = [(f.result(), v) for s, v, f in sent if s == stream and f.exception() is None]
            for offset, value in acked:
                assert at.get(offset) == value
            assert [o for o, _ in acked] == sorted(o for o, _ in acked)
            for s, value, future in sent:
                if s != stream or future.exception() is None:
                    continue
                if "may or may not" not in str(future.exception()):
                    assert value not in values, "a refused record became visible"
        assert any(f.exception() is None for _, _, f in sent)
