"""The object backend's writer: one object per flush, flushes pipelined, commits grouped.

A flush takes every stream's buffered batches, lays them out in one object (sorted by
stream, as Inkless does) under a fresh write-once key, and uploads it while the flusher
goes on buffering. Commits follow strictly in flush order: whichever upload thread
finds no commit under way becomes the committer and commits every flush that is
uploaded and waiting, in one :meth:`Sequencer.commit_many` call (one sequencer entry
on the object-store sequencer). Within a flush, every stream becomes visible together
or none does. At most ``max_inflight`` flushes are uploading or waiting; beyond that the
flusher waits and new appends gather into the next, larger flush.

Each writer is an idempotent producer. Its batches carry ``(producer_id, epoch,
base_sequence)``; a commit whose response was lost is retried with the same objects and
numbers, and the sequencer answers with the original offsets instead of storing the
batches twice. Sequence numbers are given optimistically when a flush is encoded,
assuming every earlier flush will be stored. The committer holds the truth: the next
sequence number the sequencer expects per stream. When an earlier flush fails, or the
producer changes, or a stream is recreated, a waiting flush's numbers no longer match;
it is *restamped* (new producer fields and CRCs in the batch headers, same bodies) and
uploaded again under a new key before it is committed, the way Kafka's producer adjusts
the sequences of in-flight batches after a failed one. The flusher's counters are
corrected by the same amounts, so later flushes are numbered right from the start.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import StreamConfig
from ..errors import (
    ConfigError,
    DisklessLogError,
    ProducerFenced,
    SequencerConflict,
    StreamNotFound,
    UnknownProducerId,
    UnknownProducerState,
)
from ..format import EncodedBatch, restamp
from ..sequencers.base import BatchToCommit, CommitResult
from ..writer import Flush, StreamBuffer, Writer

if TYPE_CHECKING:
    from .log import ObjectLog

__all__ = ["COMMIT_ATTEMPTS", "MAX_INFLIGHT", "ObjectWriter"]

log = logging.getLogger("disklesslog")

COMMIT_ATTEMPTS = 5
"""Tries of one commit before its outcome is given up as unknown."""
MAX_INFLIGHT = 5
"""Most flushes a writer may have uploading or waiting to commit. A retried group commit
holds at most this many runs of one stream, and sequencers recognise the repeats of
their last five runs (:mod:`disklesslog.sequencers.producers`)."""
DEFAULT_INFLIGHT = 4
UPLOAD_MAX_AGE = 60.0
"""Seconds after which an uploaded object that still waits for its commit is uploaded
again under a new key before committing: garbage collection may delete objects the
sequencer does not know once they are older than its grace period and at least
``UNKNOWN_MIN_AGE`` (5 minutes), so a commit never refers to an object that old."""
INLINE_BELOW = 0.001
"""Seconds: while uploads and commits take less than this (memory, local disks), the
flusher uploads and commits itself instead of handing each flush to an upload thread:
overlapping buys nothing there, and two thread hand-offs per flush cost a third of a
small append's time. Slower storage (a cloud bucket) gets the pipeline."""
RESTARTS = 3
"""Times one flush may be restamped because its streams were deleted under it (and, per
stream, because one was deleted and created again elsewhere)."""
CONFLICT_RETRIES = 5
"""Times one flush is committed again after :class:`~disklesslog.SequencerConflict` (the
object-store sequencer lost every race for its next entry; nothing was applied)."""
_RETRY_DELAY = 0.05


@dataclass(eq=False)
class _Pending:
    """A flush between encoding and commit: its object and how its batches are numbered."""

    flush: Flush
    producer: tuple[int, int]
    firsts: dict[str, int]
    """Per stream, the sequence number of its first batch in this flush."""
    counts: dict[str, int]
    """Per stream, the records (sequence numbers) this flush uses."""
    key: str = ""
    data: bytes = b""
    commits: list[BatchToCommit] = field(default_factory=list)
    order: list[tuple[int, int]] = field(default_factory=list)
    queued: bool = False
    """In the pipeline (counted against ``max_inflight``) until settled."""
    uploaded: bool = False
    upload_error: BaseException | None = None
    uploaded_at: float = 0.0
    restarts: int = 0
    renumbered: dict[str, int] = field(default_factory=dict)
    """Per stream, times the flush was numbered from 0 again (:class:`UnknownProducerState`)."""
    reinitialised: int = 0
    """Times the producer was initialised again for it (:class:`UnknownProducerId`)."""
    conflicts: int = 0


class _Unknown(Exception):
    """A group commit whose outcome stayed unknown after every retry."""


class ObjectWriter(Writer):
    """A :class:`~disklesslog.writer.Writer` whose flushes are one object each, uploaded
    concurrently and committed in order, several at a time when they wait together."""

    def __init__(
        self,
        log_: ObjectLog,
        *,
        linger_ms: float,
        max_object_bytes: int,
        producer: str | None,
        max_inflight: int = DEFAULT_INFLIGHT,
    ) -> None:
        if producer is not None and (not isinstance(producer, str) or not producer):
            raise ConfigError(
                f"producer must be a name (a non-empty str) or None, not {producer!r}"
            )
        if type(max_inflight) is not int or not 1 <= max_inflight <= MAX_INFLIGHT:
            raise ConfigError(
                f"max_inflight must be an int in 1..{MAX_INFLIGHT}, not {max_inflight!r} "
                "(sequencers recognise retried commits of the last five runs of batches)"
            )
        self.check_options(linger_ms, max_object_bytes)  # before a producer is registered
        self._log = log_
        self._producer_name = producer
        self._max_inflight = max_inflight
        # Numbering. The flusher stamps batches from _sequences (optimistic: every
        # earlier flush is assumed stored); the committer keeps _next (what the
        # sequencer expects) and corrects _sequences by the same deltas. All of it,
        # and the producer identity, under _stamp_lock.
        self._stamp_lock = threading.Lock()
        self._producer_id, self._epoch = log_.sequencer.init_producer(producer)
        self._sequences: dict[str, int] = {}
        self._next: dict[str, int] = {}
        self._stamps: dict[str, list[int]] = {}  # the flush being encoded: base sequences
        self._stamped_by: tuple[int, int] = (self._producer_id, self._epoch)
        self._known_streams: set[str] = set()
        self._fenced: ProducerFenced | None = None
        # The pipeline: flushes in flush order, uploading or uploaded; one committer.
        self._pipe = threading.Condition()
        self._queue: list[_Pending] = []
        self._pending = 0  # flushes dispatched and not finished
        self._committing = False
        self._storage_time = 0.0  # moving average of upload + commit seconds (fast until seen)
        self._uploads = ThreadPoolExecutor(
            max_workers=max_inflight, thread_name_prefix=f"disklesslog-upload {log_.url}"
        )
        super().__init__(
            linger_ms=linger_ms,
            max_buffer_bytes=max_object_bytes,
            # Room for the flushes in the pipeline and one more being buffered.
            max_held_bytes=(max_inflight + 1) * max_object_bytes,
            name=f"disklesslog-writer {log_.url}",
        )

    @property
    def producer(self) -> tuple[int, int]:
        """This writer's ``(producer_id, epoch)``."""
        with self._stamp_lock:
            return self._producer_id, self._epoch

    # ------------------------------------------------------------ Writer hooks

    def _config_for(self, stream: str) -> StreamConfig:
        return self._log.stream_config(stream, create=False) or self._log.stream_defaults

    def _prepare(self, taken: dict[str, StreamBuffer], target: int) -> Flush:
        self._stamps = {}
        with self._stamp_lock:
            self._stamped_by = (self._producer_id, self._epoch)
        return super()._prepare(taken, target)

    def _producer_fields(self, stream: str, record_count: int) -> tuple[int, int, int]:
        with self._stamp_lock:
            producer_id, epoch = self._producer_id, self._epoch
            sequence = self._sequences.get(stream, 0)
            self._sequences[stream] = sequence + record_count
        if (producer_id, epoch) != self._stamped_by:
            # The producer changed during this flush's encoding: the committer will
            # restamp it (its numbers already disagree); keep the batch consistent.
            producer_id, epoch = self._stamped_by
        self._stamps.setdefault(stream, []).append(sequence)
        return producer_id, epoch, sequence

    def _room(self) -> bool:
        return self._pending < self._max_inflight

    def _dispatch(self, flush: Flush) -> None:
        """Lay the flush out as one object and start its upload (from the flusher; the
        flusher took it only when the pipeline had room, see :meth:`_room`)."""
        if not flush.work:
            self._finish(flush, [])
            return
        counts = {
            stream: sum(batch.record_count for batch in encoded) for stream, encoded in flush.work
        }
        firsts = {stream: self._stamps[stream][0] for stream, _ in flush.work}
        pending = _Pending(flush, self._stamped_by, firsts, counts)
        if self._fenced is not None:
            self._abandon(pending, self._fenced, uploaded=False)
            return
        try:
            for stream, _ in flush.work:
                if stream not in self._known_streams:
                    # Reading costs nothing on the object-store sequencer; creating is an
                    # entry. A stream deleted since is caught at commit (StreamNotFound).
                    if self._log.stream_config(stream, create=False) is None:
                        self._log.ensure_stream(stream, self._configs.get(stream))
                    self._known_streams.add(stream)
            self._layout(pending, [self._stamps[stream] for stream, _ in flush.work])
        except Exception as exc:  # delivered through the futures
            self._abandon(pending, exc, uploaded=False)
            return
        with self._pipe:
            self._pending += 1
            pending.queued = True
            self._queue.append(pending)
        if self._storage_time < INLINE_BELOW:
            self._upload_then_commit(pending)
        else:
            self._uploads.submit(self._upload_then_commit, pending)

    def _drain(self) -> None:
        with self._pipe:
            while self._pending:
                self._pipe.wait()
        self._uploads.shutdown(wait=True)

    # ----------------------------------------------------------------- uploads

    def _layout(self, pending: _Pending, sequences: list[list[int]]) -> None:
        """The object's bytes (batches sorted by stream), the commit's batch list, and
        where each committed batch came from in the flush; a fresh key."""
        work = pending.flush.work
        producer_id, epoch = pending.producer
        parts: list[bytes | memoryview] = []
        commits: list[BatchToCommit] = []
        order: list[tuple[int, int]] = []
        position = 0
        for i in sorted(range(len(work)), key=lambda i: work[i][0]):
            stream, encoded = work[i]
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
                        producer_id=producer_id,
                        producer_epoch=epoch,
                        base_sequence=sequences[i][j],
                    )
                )
                parts.append(batch.header)
                parts.append(batch.body)
                order.append((i, j))
                position += size
        pending.key = self._log.storage.new_key()
        pending.data = b"".join(parts)
        pending.commits = commits
        pending.order = order

    def _put(self, pending: _Pending) -> None:
        started = time.monotonic()
        self._log.storage.put(pending.key, pending.data)
        self._log.cache_object(pending.key, pending.data)
        pending.uploaded_at = time.monotonic()
        self._observe(pending.uploaded_at - started)

    def _observe(self, seconds: float) -> None:
        """Feed the moving average that chooses between inline and pooled uploads."""
        self._storage_time += (seconds - self._storage_time) / 8

    def _upload_then_commit(self, pending: _Pending) -> None:
        """Upload (in a pool thread); then commit whatever is ready, unless another
        thread is committing already: it takes this flush when it gets to it (both
        decide under the pipeline lock, so no flush is left waiting)."""
        error: BaseException | None = None
        try:
            self._put(pending)
        except Exception as exc:  # the committer fails the flush, in order
            error = exc
        with self._pipe:
            pending.upload_error = error
            pending.uploaded = True
            if self._committing:
                return
            self._committing = True
        self._commit_ready()

    # ----------------------------------------------------------------- commits

    def _commit_ready(self) -> None:
        """The committer's loop: commit the uploaded flushes at the head of the queue, in
        order, as one group, until the head is still uploading or the queue is empty."""
        while True:
            with self._pipe:
                group: list[_Pending] = []
                for pending in self._queue:
                    if not pending.uploaded:
                        break
                    group.append(pending)
                if not group:
                    self._committing = False
                    self._pipe.notify_all()
                    return
                del self._queue[: len(group)]
            try:
                retry = self._commit_group(group)
            except BaseException as exc:  # a bug: fail the group, never hang the writer
                log.exception("writer for %s: group commit failed", self._log.url)
                retry = []
                for pending in group:
                    if not pending.flush.done:
                        self._abandon(pending, exc)
            if retry:
                with self._pipe:
                    self._queue[:0] = retry

    def _commit_group(self, group: list[_Pending]) -> list[_Pending]:
        """Commit ``group``; returns the flushes to commit again (restamped first),
        which were refused only because an earlier flush of the group was."""
        ready: list[_Pending] = []
        expected = self._expected()
        for pending in group:
            if self._fenced is not None:
                self._abandon(pending, self._fenced)
                continue
            if pending.upload_error is not None:  # nothing of it can become visible
                self._abandon(pending, pending.upload_error)
                continue
            try:
                if not self._matches(pending, expected) or self._too_old(pending):
                    self._restamp(pending, expected)
            except Exception as exc:
                self._abandon(pending, exc)
                continue
            for stream, count in pending.counts.items():
                expected[stream] = expected.get(stream, 0) + count
            ready.append(pending)
        if not ready:
            return []
        try:
            outcomes = self._commit_with_retries(ready)
        except _Unknown as exc:
            self._outcome_unknown(ready, exc)
            return []
        retry: list[_Pending] = []
        for pending, outcome in zip(ready, outcomes):
            if isinstance(outcome, list):
                self._stored(pending, outcome)
            elif isinstance(outcome, SequencerConflict) and pending.conflicts < CONFLICT_RETRIES:
                pending.conflicts += 1  # nothing was applied: commit it again
                self._log.storage.metrics.add("commit_conflicts")
                retry.append(pending)
            elif not self._matches(pending, self._expected()):
                retry.append(pending)  # refused for a gap an earlier refusal left
            elif isinstance(outcome, StreamNotFound) and pending.restarts < RESTARTS:
                pending.restarts += 1
                self._recreate_missing(pending)
                retry.append(pending)
            elif isinstance(outcome, UnknownProducerState) and self._may_renumber(
                pending, outcome.stream
            ):
                self._start_over(outcome.stream)
                retry.append(pending)
            elif isinstance(outcome, UnknownProducerId) and pending.reinitialised < RESTARTS:
                pending.reinitialised += 1
                if self._initialise_again(pending):
                    retry.append(pending)
            else:
                self._refused(pending, outcome)
        return retry

    def _commit_with_retries(
        self, ready: list[_Pending]
    ) -> list[list[CommitResult] | DisklessLogError]:
        """One ``commit_many`` for the group, retried while its outcome is unknown: safe,
        because the sequencer recognises exact repeats of this producer's batches."""
        sequencer = self._log.sequencer
        metrics = self._log.storage.metrics
        objects = [(p.key, p.commits) for p in ready]
        error: BaseException | None = None
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            started = time.monotonic()
            try:
                if len(objects) == 1:
                    key, commits = objects[0]
                    try:
                        outcomes: list[list[CommitResult] | DisklessLogError] = [
                            sequencer.commit(key, commits)
                        ]
                    except DisklessLogError as exc:
                        outcomes = [exc]
                else:
                    outcomes = sequencer.commit_many(objects)
            except DisklessLogError:
                raise
            except Exception as exc:  # the outcome is unknown: retry the same commits
                error = exc
                metrics.add("commit_errors")
                time.sleep(_RETRY_DELAY * 2 ** (attempt - 1) * (0.5 + random.random()))
                continue
            took = time.monotonic() - started
            metrics.observe("commit", took)
            metrics.add("committed_objects", len(objects))
            self._observe(took)
            return outcomes
        raise _Unknown(
            f"commit of object(s) {', '.join(p.key for p in ready)} failed {COMMIT_ATTEMPTS} "
            f"times ({error!r}); their records may or may not be visible"
        ) from error

    # ------------------------------------------------------ numbering, truth

    def _expected(self) -> dict[str, int]:
        with self._stamp_lock:
            return dict(self._next)

    def _matches(self, pending: _Pending, expected: dict[str, int]) -> bool:
        """Whether the flush is numbered as the sequencer now expects (same producer,
        each stream's first batch continuing where that stream stands)."""
        with self._stamp_lock:
            if pending.producer != (self._producer_id, self._epoch):
                return False
        return all(first == expected.get(s, 0) for s, first in pending.firsts.items())

    def _too_old(self, pending: _Pending) -> bool:
        return time.monotonic() - pending.uploaded_at > UPLOAD_MAX_AGE

    def _restamp(self, pending: _Pending, expected: dict[str, int]) -> None:
        """Renumber the flush from ``expected`` with the current producer, lay it out and
        upload it again under a new key; the old object is left to garbage collection."""
        with self._stamp_lock:
            pending.producer = (self._producer_id, self._epoch)
        producer_id, epoch = pending.producer
        renumbered: list[tuple[str, list[EncodedBatch]]] = []
        sequences: list[list[int]] = []
        for stream, encoded in pending.flush.work:
            sequence = expected.get(stream, 0)
            pending.firsts[stream] = sequence
            fresh, assigned = [], []
            for batch in encoded:
                fresh.append(
                    restamp(
                        batch,
                        producer_id=producer_id,
                        producer_epoch=epoch,
                        base_sequence=sequence,
                    )
                )
                assigned.append(sequence)
                sequence += batch.record_count
            renumbered.append((stream, fresh))
            sequences.append(assigned)
        pending.flush.work[:] = renumbered
        old_key = pending.key
        self._layout(pending, sequences)
        self._log.storage.metrics.add("restamped_flushes")
        self._orphan(old_key)
        self._put(pending)

    def _stored(self, pending: _Pending, results: list[CommitResult]) -> None:
        with self._stamp_lock:
            for stream, count in pending.counts.items():
                self._next[stream] = self._next.get(stream, 0) + count
        metrics = self._log.storage.metrics
        metrics.add("committed_batches", len(results))
        metrics.add("duplicate_batches", sum(r.duplicate for r in results))
        work = pending.flush.work
        offsets: list[list[int]] = [[0] * len(encoded) for _, encoded in work]
        for (i, j), result in zip(pending.order, results):
            offsets[i][j] = result.base_offset
        self._settle(pending, list(offsets))

    def _take_back(self, pending: _Pending) -> None:
        """The flush will never be stored: later flushes are numbered as if it were."""
        with self._stamp_lock:
            for stream, count in pending.counts.items():
                self._sequences[stream] = self._sequences.get(stream, 0) - count

    def _recreate_missing(self, pending: _Pending) -> None:
        """Streams of the flush were deleted under the writer: create them again; a new
        stream has no producer state, so their numbering starts over at 0."""
        for stream in pending.counts:
            try:
                self._log.sequencer.stream_info(stream)
            except StreamNotFound:
                self._known_streams.discard(stream)
                self._log.ensure_stream(stream, self._configs.get(stream))
                self._known_streams.add(stream)
                self._number_from_zero(stream)

    def _may_renumber(self, pending: _Pending, stream: str) -> bool:
        """Whether the flush may be numbered from 0 again on ``stream`` (bounded, so a
        stream re-created over and over under the writer fails the flush at last)."""
        if stream not in pending.counts:
            return False  # not this flush's stream: the refusal is not understood
        times = pending.renumbered.get(stream, 0)
        pending.renumbered[stream] = times + 1
        return times < RESTARTS

    def _start_over(self, stream: str) -> None:
        """The sequencer has no sequence numbers of this producer on ``stream``: another
        process deleted it and created it again since this writer last stored records
        there. None of this writer's records can be in the new stream, so it is numbered
        from 0 again (the refused flush and those behind it are restamped; nothing can be
        taken for a duplicate). The new stream's settings replace the cached ones, for
        the appends from now on (flushes encoded already keep theirs: readable alike)."""
        self._number_from_zero(stream)
        self._configs.pop(stream, None)
        try:
            self._log.current_config(stream)
        except StreamNotFound:
            self._known_streams.discard(stream)  # gone again: the next commit says so

    def _number_from_zero(self, stream: str) -> None:
        """Forget what the sequencer expected on ``stream`` (a new stream expects 0); the
        flusher's counter keeps only the flushes not yet stored, which are restamped."""
        with self._stamp_lock:
            stood = self._next.pop(stream, 0)
            self._sequences[stream] = self._sequences.get(stream, 0) - stood

    def _initialise_again(self, pending: _Pending) -> bool:
        """The sequencer forgot this writer's producer (idle past
        ``producer_expiration_ms``): register it again (a named writer under its name)
        and number every stream from 0, as a new producer's first batches. Nothing of
        the old id can be deduplicated any more, and nothing needs to be: the refused
        flush stored nothing, and every earlier one was answered. Whether the flush may
        be committed again (restamped); a failed registration fails it."""
        if pending.producer != self.producer:
            return True  # initialised again already (for an earlier flush of the group)
        try:
            producer = self._log.sequencer.init_producer(self._producer_name)
        except DisklessLogError as exc:
            self._refused(pending, exc)
            return False
        with self._stamp_lock:
            for stream, stood in self._next.items():
                self._sequences[stream] = self._sequences.get(stream, 0) - stood
            self._next.clear()
            self._producer_id, self._epoch = producer
        log.info(
            "writer for %s: producer %d was forgotten by the sequencer (idle past "
            "producer_expiration_ms); continuing as producer %d",
            self._log.url,
            pending.producer[0],
            producer[0],
        )
        return True

    def _outcome_unknown(self, ready: list[_Pending], exc: _Unknown) -> None:
        """Gave up on a group without knowing whether it landed: fail its flushes and
        continue as a new producer instance, so later flushes do not depend on them."""
        try:
            producer = self._log.sequencer.init_producer(self._producer_name)
        except Exception as init_error:
            self._fatal = DisklessLogError(
                f"writer for {self._log.url} cannot continue: a commit's outcome is unknown "
                f"and a new producer could not be started ({init_error!r})"
            )
            producer = None
        with self._stamp_lock:
            for pending in ready:
                for stream, count in pending.counts.items():
                    self._sequences[stream] = self._sequences.get(stream, 0) - count
            if producer is not None:
                for stream, stood in self._next.items():
                    self._sequences[stream] = self._sequences.get(stream, 0) - stood
                self._next.clear()
                self._producer_id, self._epoch = producer
        error = DisklessLogError(str(exc))
        error.__cause__ = exc.__cause__
        for pending in ready:
            self._settle(pending, [error] * len(pending.flush.work))

    def _refused(self, pending: _Pending, exc: DisklessLogError) -> None:
        if isinstance(exc, ProducerFenced):
            self._fenced = exc
            self._fatal = exc
        if isinstance(exc, StreamNotFound):
            self._known_streams.clear()  # deleted meanwhile: create again next time
        self._abandon(pending, exc)

    def _abandon(self, pending: _Pending, exc: BaseException, *, uploaded: bool = True) -> None:
        """Fail a flush that will never be committed; its object (if any) is an orphan."""
        self._take_back(pending)
        if uploaded and pending.key:
            self._orphan(pending.key)
        self._settle(pending, [exc] * len(pending.flush.work))

    def _orphan(self, key: str) -> None:
        try:
            self._log.sequencer.record_orphan(key)
        except Exception:  # the object stays, unreferenced, for a bucket-listing GC
            log.warning("could not record orphan object %s", key, exc_info=True)
        self._log.storage.metrics.add("orphaned_objects")

    def _settle(self, pending: _Pending, results: list[list[int] | BaseException]) -> None:
        if pending.queued:  # room in the pipeline before _finish wakes the flusher
            with self._pipe:
                pending.queued = False
                self._pending -= 1
                self._pipe.notify_all()
        self._finish(pending.flush, results)
