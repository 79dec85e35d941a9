"""A state loaded from a snapshot behaves as the state it was taken from.

``MemorySequencer.from_snapshot`` leaves each stream's batches, time index and producer
states as the snapshot's rows until something first uses them (what makes a wide object-store
sequencer open fast). These tests run every operation that reads or changes them on
streams not yet used, beside the same operation on the original, and compare answers
and snapshots after each step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from disklesslog import OffsetOutOfRange
from disklesslog.sequencers.base import BatchLocation, BatchToCommit
from disklesslog.sequencers.memory import MemorySequencer

STREAMS = [f"s{i}" for i in range(8)]


def _populated() -> MemorySequencer:
    """Eight streams with several batches each, timestamps that go back and forth (so
    the time indexes have several entries), one named producer and one trim."""
    seq = MemorySequencer(clock=lambda: 1_000.0)
    for name in STREAMS:
        seq.create_stream(name, {})
    producer, epoch = seq.init_producer("p")
    for round_no in range(4):
        batches = [
            BatchToCommit(
                name,
                position=i * 10,
                size=10,
                span=2,
                record_count=2,
                max_timestamp=1_000 + 100 * round_no - 50 * (i % 2),
                producer_id=producer,
                producer_epoch=epoch,
                base_sequence=2 * round_no,
            )
            for i, name in enumerate(STREAMS)
        ]
        seq.commit(f"obj{round_no}", batches)
    seq.trim("s7", 2)
    return seq


def _pair() -> tuple[MemorySequencer, MemorySequencer]:
    original = _populated()
    return original, MemorySequencer.from_snapshot(original.snapshot(), clock=lambda: 1_000.0)


def test_a_loaded_state_untouched_snapshots_to_what_it_was_loaded_from() -> None:
    original, loaded = _pair()
    assert loaded.snapshot() == original.snapshot()
    assert loaded.live_batches() == original.live_batches() == 31


def _ops() -> list[tuple[str, Callable[[MemorySequencer], Any]]]:
    """One operation per stream not yet used, so each runs on rows not yet loaded."""

    def replace(seq: MemorySequencer) -> bool:
        page = seq.find_batches("s4", 0, 1 << 20)
        olds = page.batches[1:3]
        merged = BatchLocation(
            0,
            "merged",
            0,
            20,
            olds[0].base_offset,
            olds[-1].last_offset,
            max(b.max_timestamp for b in olds),
        )
        return seq.replace_batches("s4", [b.batch_id for b in olds], [merged])

    def commit(seq: MemorySequencer) -> Any:
        producer, epoch = 1, 0  # the named producer of _populated
        repeat = BatchToCommit("s5", 0, 10, 2, 2, 1_000, producer, epoch, 2)  # a duplicate
        fresh = BatchToCommit("s5", 10, 10, 2, 2, 900, producer, epoch, 8)
        return seq.commit("obj-new", [repeat, fresh])

    return [
        ("find_batches", lambda seq: seq.find_batches("s0", 3, 25)),
        (
            "offset_for_time",
            lambda seq: [seq.offset_for_time("s1", t) for t in (0, 975, 1_300, 9_999)],
        ),
        ("trim", lambda seq: seq.trim("s2", 5)),
        ("delete_stream", lambda seq: seq.delete_stream("s3")),
        ("replace_batches", replace),
        ("commit", commit),
        ("objects_to_delete", lambda seq: seq.objects_to_delete(0)),
        ("stream_info", lambda seq: seq.stream_info("s6")),
    ]


@pytest.mark.parametrize("only", [None, *range(8)])
def test_every_operation_on_streams_not_yet_loaded_matches_the_original(only: int | None) -> None:
    """All operations in turn (``None``), or one alone on a freshly loaded state."""
    original, loaded = _pair()
    ops = _ops() if only is None else [_ops()[only]]
    for what, op in ops:
        assert op(loaded) == op(original), what
        assert loaded.snapshot() == original.snapshot(), what


def test_a_trim_past_the_end_of_a_stream_not_yet_loaded_is_refused_alike() -> None:
    original, loaded = _pair()
    for seq in (original, loaded):
        with pytest.raises(OffsetOutOfRange):
            seq.trim("s0", 99)
    assert loaded.snapshot() == original.snapshot()


def test_a_state_loaded_twice_over_stays_equal() -> None:
    """Snapshot of a loaded state (rows passed through), loaded again, then used."""
    original, loaded = _pair()
    again = MemorySequencer.from_snapshot(loaded.snapshot(), clock=lambda: 1_000.0)
    for what, op in _ops():
        assert op(again) == op(original), what
    assert again.snapshot() == original.snapshot()
