"""The idempotence and fencing rules of ``disklesslog.sequencers.producers``, directly."""

from __future__ import annotations

import pytest

from disklesslog.errors import OutOfOrderSequence, ProducerFenced, UnknownProducerState
from disklesslog.sequencers import NO_PRODUCER, BatchToCommit
from disklesslog.sequencers.producers import (
    TRACKED_RUNS,
    ProducerStreamState,
    advance,
    decide,
)

PID = 7


def b(seq: int, records: int = 1, epoch: int = 0, pid: int = PID) -> BatchToCommit:
    return BatchToCommit("s", 0, 10, records, records, 0, pid, epoch, seq)


def history(*entries: tuple[int, int, int], epoch: int = 0) -> ProducerStreamState:
    return ProducerStreamState(epoch, tuple(entries))


def test_batches_without_a_producer_are_always_accepted() -> None:
    anonymous = BatchToCommit("s", 0, 10, 1, 1, 0)
    assert anonymous.producer_id == NO_PRODUCER
    assert decide(None, None, anonymous) is None
    assert decide(history((0, 0, 0)), 3, anonymous) is None


def test_unknown_producer_is_fenced() -> None:
    with pytest.raises(ProducerFenced, match="unknown"):
        decide(None, None, b(0))


@pytest.mark.parametrize("epoch", [0, 2])
def test_an_epoch_other_than_the_current_one_is_fenced(epoch: int) -> None:
    with pytest.raises(ProducerFenced):
        decide(None, 1, b(0, epoch=epoch))


@pytest.mark.parametrize("seq, records", [(-1, 1), (0, 0)])
def test_a_producer_batch_needs_a_sequence_and_records(seq: int, records: int) -> None:
    with pytest.raises(OutOfOrderSequence):
        decide(None, 0, b(seq, records))


def test_the_first_batch_starts_at_zero() -> None:
    assert decide(None, 0, b(0, 3)) is None
    with pytest.raises(OutOfOrderSequence, match="sequence 0"):
        decide(None, 0, b(1))


def test_no_state_on_the_stream_is_told_apart_from_a_gap() -> None:
    """Only a producer the stream knows nothing of (a stream created again) gets
    UnknownProducerState, which lets a writer number the stream from 0 again; a gap
    or a new epoch not starting at 0 stays a plain refusal."""
    with pytest.raises(UnknownProducerState) as info:
        decide(None, 0, b(5))
    assert info.value.stream == "s"
    for state, batch in [(history((0, 4, 0)), b(7)), (history((0, 4, 0)), b(5, epoch=1))]:
        with pytest.raises(OutOfOrderSequence) as refused:
            decide(state, 1 if batch.producer_epoch else 0, batch)
        assert not isinstance(refused.value, UnknownProducerState)


def test_a_new_epoch_starts_at_zero_whatever_came_before() -> None:
    old = history((0, 9, 0))
    assert decide(old, 1, b(0, epoch=1)) is None
    with pytest.raises(OutOfOrderSequence):
        decide(old, 1, b(10, epoch=1))


def test_the_next_batch_continues_the_sequence() -> None:
    state = history((0, 2, 0), (3, 4, 3))
    assert decide(state, 0, b(5, 2)) is None
    for wrong in (6, 8):  # gaps
        with pytest.raises(OutOfOrderSequence, match="start at 5"):
            decide(state, 0, b(wrong, 2))
    with pytest.raises(OutOfOrderSequence):  # overlaps the end: part new, part repeated
        decide(state, 0, b(4, 2))


def test_a_repeat_answers_with_the_original_offsets() -> None:
    state = history((0, 2, 100), (3, 9, 200))
    assert decide(state, 0, b(0, 3)) == 100
    assert decide(state, 0, b(3, 2)) == 200
    assert decide(state, 0, b(5, 4)) == 202  # inside a run of several batches
    with pytest.raises(OutOfOrderSequence):  # straddles two runs
        decide(state, 0, b(2, 2))


def test_consecutive_batches_form_one_run() -> None:
    """Batches following each other in sequence and offset extend one run, so the retry
    of a commit holding any number of one stream's batches is recognised."""
    state = None
    for i in range(50):
        state = advance(state, b(i * 2, 2), 1000 + i * 2, 0)
    assert state is not None and state.batches == ((0, 99, 1000),)
    assert [decide(state, 0, b(i * 2, 2)) for i in range(50)] == [1000 + i * 2 for i in range(50)]


def test_advance_keeps_the_last_five_runs() -> None:
    state = None
    for i in range(7):  # offsets jump: another producer wrote between these batches
        state = advance(state, b(i * 2, 2), i * 10, 0)
    assert state is not None
    assert len(state.batches) == TRACKED_RUNS == 5
    assert state.batches[0] == (4, 5, 20)
    assert state.batches[-1] == (12, 13, 60)
    assert decide(state, 0, b(4, 2)) == 20
    with pytest.raises(OutOfOrderSequence):
        decide(state, 0, b(2, 2))  # dropped from the window


def test_advance_into_a_new_epoch_forgets_the_old_history() -> None:
    state = advance(history((0, 4, 0), (5, 9, 5)), b(0, 3, epoch=1), 50, 0)
    assert state == ProducerStreamState(1, ((0, 2, 50),))


def test_state_round_trips_through_json() -> None:
    state = history((0, 2, 100), (3, 4, 200), epoch=3)
    assert ProducerStreamState.from_json(state.to_json()) == state
    assert ProducerStreamState.from_json(ProducerStreamState(0).to_json()) == ProducerStreamState(0)
