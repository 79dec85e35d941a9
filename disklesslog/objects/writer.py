"""The object backend's writer: one object and one sequencer commit per flush.

A flush takes every stream's buffered batches, lays them out in one object (sorted by
stream, as Inkless does), uploads it under a fresh write-once key, inserts it into the
read cache, and makes a single :meth:`Sequencer.commit` that assigns all their offsets
atomically: every stream of a flush becomes visible together, or none does.

Each writer is an idempotent producer. Its batches carry ``(producer_id, epoch,
base_sequence)``; a commit whose response was lost is retried with the same object
and numbers, and the sequencer answers with the original offsets instead of storing
the batches twice. Sequence numbers are assigned when a flush is encoded and taken
back when its batches are not stored, so the next flush continues without a gap.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from ..config import StreamConfig
from ..errors import DisklessLogError, ProducerFenced, StreamNotFound
from ..format import EncodedBatch, restamp
from ..sequencers.base import BatchToCommit, CommitResult
from ..writer import Writer

if TYPE_CHECKING:
    from .log import ObjectLog

__all__ = ["ObjectWriter"]

log = logging.getLogger("disklesslog")

COMMIT_ATTEMPTS = 5
"""Tries of one commit before its outcome is given up as unknown."""
_RETRY_DELAY = 0.05


class ObjectWriter(Writer):
    """A :class:`~disklesslog.writer.Writer` whose flushes are one object + one commit."""

    def __init__(
        self,
        log_: ObjectLog,
        *,
        linger_ms: float,
        max_object_bytes: int,
        producer: str | None,
    ) -> None:
        if producer is not None and not isinstance(producer, str):
            raise TypeError(f"producer must be a name (str) or None, not {producer!r}")
        self._log = log_
        self._producer_name = producer
        self._producer_id, self._epoch = log_.sequencer.init_producer(producer)
        self._sequences: dict[str, int] = {}
        self._before_flush: dict[str, int] = {}
        self._assigned: dict[str, list[int]] = {}  # this flush's base sequences, per stream
        self._known_streams: set[str] = set()
        self._fenced: ProducerFenced | None = None
        super().__init__(
            linger_ms=linger_ms,
            max_buffer_bytes=max_object_bytes,
            name=f"disklesslog-writer {log_.url}",
        )

    @property
    def producer(self) -> tuple[int, int]:
        """This writer's ``(producer_id, epoch)``."""
        return self._producer_id, self._epoch

    # ------------------------------------------------------------ Writer hooks

    def _config_for(self, stream: str) -> StreamConfig:
        return self._log._stream_config(stream, create=False) or self._log.stream_defaults

    def _producer_fields(self, stream: str, record_count: int) -> tuple[int, int, int]:
        sequence = self._sequences.get(stream, 0)
        self._sequences[stream] = sequence + record_count
        self._assigned.setdefault(stream, []).append(sequence)
        return self._producer_id, self._epoch, sequence

    def _flush_started(self) -> None:
        self._before_flush = dict(self._sequences)
        self._assigned = {}

    def _flush_finished(self, stored: set[str]) -> None:
        """Take back the sequence numbers of batches that were not stored."""
        for stream in list(self._sequences):
            if stream in stored:
                continue
            if stream in self._before_flush:
                self._sequences[stream] = self._before_flush[stream]
            else:
                del self._sequences[stream]

    def _write(
        self, batches: list[tuple[str, list[EncodedBatch]]]
    ) -> list[list[int] | BaseException]:
        if self._fenced is not None:
            raise self._fenced
        try:
            return self._store(batches)
        except StreamNotFound:
            # A stream was deleted under us: create it again and start its sequence over.
            return self._store(self._renumber_missing(batches))

    def _store(
        self, batches: list[tuple[str, list[EncodedBatch]]]
    ) -> list[list[int] | BaseException]:
        """Upload one object holding ``batches`` and commit it; base offsets per stream."""
        for stream, _ in batches:
            if stream not in self._known_streams:
                self._log._ensure_stream(stream, self._configs.get(stream))
                self._known_streams.add(stream)
        key, data, commits, order = self._layout(batches)
        self._log.storage.put(key, data)
        self._log.cache_object(key, data)
        results = self._commit(key, commits)
        offsets: list[list[int]] = [[0] * len(encoded) for _, encoded in batches]
        for (i, j), result in zip(order, results):
            offsets[i][j] = result.base_offset
        return list(offsets)

    def _renumber_missing(
        self, batches: list[tuple[str, list[EncodedBatch]]]
    ) -> list[tuple[str, list[EncodedBatch]]]:
        """Restamp the batches of streams that no longer exist with sequences from 0 (a
        new stream has no producer state); the others keep theirs."""
        renewed = []
        for stream, encoded in batches:
            try:
                self._log.sequencer.stream_info(stream)
            except StreamNotFound:
                renewed.append((stream, self._renumber(stream, encoded)))
            else:
                renewed.append((stream, encoded))
        return renewed

    def _renumber(self, stream: str, encoded: list[EncodedBatch]) -> list[EncodedBatch]:
        self._known_streams.discard(stream)
        self._before_flush.pop(stream, None)
        sequence, assigned, fresh = 0, [], []
        for batch in encoded:
            fields = {"producer_id": self._producer_id, "producer_epoch": self._epoch}
            fresh.append(restamp(batch, base_sequence=sequence, **fields))
            assigned.append(sequence)
            sequence += batch.record_count
        self._sequences[stream] = sequence
        self._assigned[stream] = assigned
        return fresh

    # ----------------------------------------------------------------- flushes

    def _layout(
        self, batches: list[tuple[str, list[EncodedBatch]]]
    ) -> tuple[str, bytes, list[BatchToCommit], list[tuple[int, int]]]:
        """The object's bytes (batches sorted by stream), the commit's batch list, and
        where each committed batch came from in ``batches``."""
        parts: list[bytes | memoryview] = []
        commits: list[BatchToCommit] = []
        order: list[tuple[int, int]] = []
        position = 0
        by_stream = sorted(range(len(batches)), key=lambda i: batches[i][0])
        for i in by_stream:
            stream, encoded = batches[i]
            sequences = self._assigned[stream]
            for j, batch in enumerate(encoded):
                size = batch.size
                commits.append(
                    BatchToCommit(
                        stream=stream,
                        position=position,
                        size=size,
                        span=batch.span,
                        record_count=batch.record_count,
                        max_timestamp=batch.max_timestamp,
                        producer_id=self._producer_id,
                        producer_epoch=self._epoch,
                        base_sequence=sequences[j],
                    )
                )
                parts.append(batch.header)
                parts.append(batch.body)
                order.append((i, j))
                position += size
        return self._log.storage.new_key(), b"".join(parts), commits, order

    def _commit(self, key: str, commits: list[BatchToCommit]) -> list[CommitResult]:
        """Commit with retries. A refusal (fenced, out of order, unknown stream) is final
        and leaves the object an orphan; other failures are retried, safe because the
        sequencer recognises exact repeats of this producer's batches."""
        sequencer = self._log.sequencer
        metrics = self._log._metrics
        error: BaseException | None = None
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            started = time.monotonic()
            try:
                results = sequencer.commit(key, commits)
            except DisklessLogError as exc:
                self._refused(key, exc)
                raise
            except Exception as exc:  # the outcome is unknown: retry the same commit
                error = exc
                metrics.add("commit_errors")
                time.sleep(_RETRY_DELAY * 2 ** (attempt - 1) * (0.5 + random.random()))
                continue
            metrics.observe("commit", time.monotonic() - started)
            metrics.add("committed_batches", len(commits))
            metrics.add("duplicate_batches", sum(r.duplicate for r in results))
            return results
        # Gave up without knowing whether the commit landed: continue as a new producer
        # instance so later flushes do not depend on this one's sequence numbers.
        self._producer_id, self._epoch = sequencer.init_producer(self._producer_name)
        self._sequences.clear()
        self._before_flush.clear()
        raise DisklessLogError(
            f"commit of object {key} failed {COMMIT_ATTEMPTS} times ({error!r}); its records "
            "may or may not be visible"
        ) from error

    def _refused(self, key: str, exc: DisklessLogError) -> None:
        if isinstance(exc, ProducerFenced):
            self._fenced = self._fatal = exc
        if isinstance(exc, StreamNotFound):
            self._known_streams.clear()  # deleted meanwhile: create again next time
        try:
            self._log.sequencer.record_orphan(key)
        except Exception:  # the object stays, unreferenced, for a bucket-listing GC
            log.warning("could not record orphan object %s", key, exc_info=True)
        self._log._metrics.add("orphaned_objects")
