"""Idempotence and fencing: Kafka's producer rules, written once for every sequencer.

A writer gets ``(producer_id, epoch)`` from :meth:`Sequencer.init_producer` and numbers
its records per stream: each batch carries the sequence number of its first record.
For every (producer, stream) the sequencer keeps the epoch it last saw and its last
five **runs**: a run is a stretch of accepted batches that are consecutive both in
sequence numbers and in offsets (what one commit, or several commits in a row with no
other producer's batch between them, stored). A batch is then, in this order:

1. **fenced** if its epoch is below the producer's current epoch (a newer instance of a
   named producer was initialised), or names an unknown producer or future epoch;
2. **a duplicate** if its sequence numbers lie inside one of those runs: the commit
   answers with the original offsets (the run's base offset plus the distance in
   sequence numbers) and stores nothing;
3. **accepted** if it continues the sequence (first sequence = last accepted + 1, or 0
   for the first batch of a new epoch);
4. **out of order** otherwise: a gap or a partial overlap would lose or duplicate records.
   When the sequencer has no state at all for the producer on the stream, this is
   :class:`~disklesslog.UnknownProducerState` (Kafka's ``UNKNOWN_PRODUCER_ID``): state
   is dropped with the stream (deleted and created again since the producer last wrote
   there) or after ``producer_expiration_ms`` without a write
   (:meth:`~disklesslog.sequencers.Sequencer.expire_producers`), so the writer may
   number it from 0 again (none of its records can be in a new stream, and a retry of
   records older than the window is no longer recognised).

Kafka remembers five *batches*, which suffices for its five requests in flight. A
writer here retries a whole commit, or a group of commits, which may hold any number of
batches of one stream; tracking runs recognises every one of them, in constant space.
A batch joins a run only if its base offset is where the run's sequence numbers put it
(``run base offset + first sequence - run's first sequence``), so a retried batch's
first record always maps back to its original offset.

The functions are pure: sequencers load the state, call :func:`decide` and
:func:`advance` batch by batch inside their commit transaction, and store the result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import OutOfOrderSequence, ProducerFenced, UnknownProducerId, UnknownProducerState
from .base import NO_PRODUCER, BatchToCommit

__all__ = ["TRACKED_RUNS", "ProducerStreamState", "advance", "decide"]

TRACKED_RUNS = 5
"""Runs of batches remembered per (producer, stream) for deduplication."""


@dataclass(frozen=True)
class ProducerStreamState:
    """What a sequencer remembers about one producer on one stream.

    ``batches`` holds ``(first_sequence, last_sequence, base_offset)`` of the last
    accepted runs, oldest first, at most :data:`TRACKED_RUNS`: a batch of the run whose
    first sequence number is ``q`` has base offset ``base_offset + q - first_sequence``.
    (A state stored when every entry was a single batch reads the same way.)
    ``written_ms`` is when the producer's last accepted write to the stream was
    committed, by the sequencer's clock (milliseconds since the epoch): what
    :meth:`~disklesslog.sequencers.Sequencer.expire_producers` ages it by.
    """

    epoch: int
    batches: tuple[tuple[int, int, int], ...] = ()
    written_ms: int = 0

    def to_json(self) -> str:
        return json.dumps([self.epoch, [list(b) for b in self.batches], self.written_ms])

    @classmethod
    def from_json(cls, text: str) -> ProducerStreamState:
        """The state :meth:`to_json` wrote; a state stored before states had a time
        (``[epoch, runs]``) reads with ``written_ms`` 0 (the migration that added the
        time set it to the migration's time)."""
        epoch, batches, *written = json.loads(text)
        if len(written) > 1:
            raise ValueError("a producer state is [epoch, runs, written_ms]")
        return cls(
            int(epoch),
            tuple((int(a), int(b), int(c)) for a, b, c in batches),
            int(written[0]) if written else 0,
        )


def decide(
    state: ProducerStreamState | None, current_epoch: int | None, batch: BatchToCommit
) -> int | None:
    """Judge one batch: the original base offset if it is an exact duplicate, ``None``
    if it is to be accepted; raises ProducerFenced or OutOfOrderSequence otherwise.

    ``state`` is the (producer, stream) state (``None`` if the producer never wrote to
    the stream); ``current_epoch`` the producer's epoch from its registration (``None``
    if the producer id is unknown).
    """
    if batch.producer_id == NO_PRODUCER:
        return None
    if current_epoch is None:
        raise UnknownProducerId(
            f"producer {batch.producer_id} is unknown to this sequencer (dropped after "
            "producer_expiration_ms without a write, or never issued by it); initialise "
            "the producer again"
        )
    if batch.producer_epoch < current_epoch:
        raise ProducerFenced(
            f"producer {batch.producer_id} epoch {batch.producer_epoch} was fenced by epoch "
            f"{current_epoch} (a newer instance of this producer was started); create a "
            "new writer"
        )
    if batch.producer_epoch > current_epoch:
        raise ProducerFenced(
            f"producer {batch.producer_id} epoch {batch.producer_epoch} was never issued "
            f"(current epoch {current_epoch})"
        )
    if batch.record_count < 1 or batch.base_sequence < 0:
        raise OutOfOrderSequence(
            f"producer {batch.producer_id}: a batch needs a base sequence >= 0 and records"
        )
    first = batch.base_sequence
    last = first + batch.record_count - 1
    if state is None and first != 0:
        raise UnknownProducerState(
            f"producer {batch.producer_id} has no sequence numbers on stream "
            f"{batch.stream!r} (deleted and created again since it last wrote there?): "
            f"its first batch must start at sequence 0, not {first}",
            stream=batch.stream,
        )
    if state is None or state.epoch < batch.producer_epoch:
        if first != 0:
            raise OutOfOrderSequence(
                f"producer {batch.producer_id} epoch {batch.producer_epoch} on stream "
                f"{batch.stream!r}: the first batch must start at sequence 0, not {first}"
            )
        return None
    for known_first, known_last, base_offset in state.batches:
        if known_first <= first and last <= known_last:
            return base_offset + first - known_first
    expected = state.batches[-1][1] + 1 if state.batches else 0
    if first != expected:
        raise OutOfOrderSequence(
            f"producer {batch.producer_id} on stream {batch.stream!r}: batch has sequence "
            f"numbers {first}..{last}, expected it to start at {expected} (or to repeat "
            f"records of its last {TRACKED_RUNS} runs of batches)"
        )
    return None


def advance(
    state: ProducerStreamState | None, batch: BatchToCommit, base_offset: int, now_ms: int
) -> ProducerStreamState:
    """The (producer, stream) state after accepting ``batch`` at ``base_offset``, committed
    at ``now_ms``: the batch extends the last run if it follows it in both sequence and
    offset, else it starts a new run (and the oldest of more than :data:`TRACKED_RUNS`
    is forgotten)."""
    first = batch.base_sequence
    last = first + batch.record_count - 1
    runs: tuple[tuple[int, int, int], ...] = ()
    if state is not None and state.epoch == batch.producer_epoch:
        runs = state.batches
    if runs:
        run_first, run_last, run_base = runs[-1]
        if first == run_last + 1 and base_offset == run_base + first - run_first:
            return ProducerStreamState(
                batch.producer_epoch, (*runs[:-1], (run_first, last, run_base)), now_ms
            )
    kept = runs[-(TRACKED_RUNS - 1) :]
    return ProducerStreamState(batch.producer_epoch, (*kept, (first, last, base_offset)), now_ms)
