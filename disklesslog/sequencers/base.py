"""The sequencer protocol: what orders batches for the object-storage backend.

A sequencer is Kafka KIP-1150's "batch coordinator" as a library interface. Writers
upload an object holding batches of many streams, then make one :meth:`Sequencer.commit`
that assigns offsets to all of them atomically. Readers ask :meth:`Sequencer.find_batches`
where a stream's batches live. The sequencer also keeps stream extents and settings,
producer state (idempotence and fencing), consumer-group offsets, and which objects no
longer hold any live batch.

Every implementation passes the same conformance suite,
:class:`disklesslog.testing.contracts.SequencerContract`, which a third-party sequencer
can subclass too. The idempotence and fencing rules live once, in
:mod:`disklesslog.sequencers.producers`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ..errors import DisklessLogError
from ..forks import fork_safe_lock
from ..leases import Lease, LeaseKeeper, LeaseRecord

__all__ = [
    "NO_PRODUCER",
    "TRACKED_TRANSACTIONS",
    "TRANSACTION_RETENTION_SECONDS",
    "BatchLocation",
    "BatchPage",
    "BatchToCommit",
    "CommitResult",
    "ProducerExpiry",
    "Sequencer",
    "StreamMeta",
    "TransactionResult",
]

NO_PRODUCER = -1
"""``producer_id`` of a batch written without idempotence (never deduplicated)."""

TRACKED_TRANSACTIONS = 10_000
"""Most transaction ids a sequencer remembers (the newest ones): a repeat of an id it
forgot is committed again. Each costs one small row or entry (its streams' ranges)."""
TRANSACTION_RETENTION_SECONDS = 7 * 24 * 3600.0
"""Longest a committed transaction id is remembered (7 days), by the sequencer's clock.
Whichever bound is reached first forgets an id: a replayed Spark micro-batch comes
within minutes, a re-run job within days, and 10,000 ids bound the space."""


@dataclass(frozen=True)
class BatchToCommit:
    """One batch of an uploaded object, as its writer describes it to :meth:`Sequencer.commit`.

    ``position``/``size`` locate the batch's bytes in the object. ``span`` is how many
    offsets it covers (its ``last_offset_delta + 1``); ``record_count`` how many records
    it holds (equal for batches a writer produces) and so how many producer sequence
    numbers it uses: ``base_sequence .. base_sequence + record_count - 1``.
    """

    stream: str
    position: int
    size: int
    span: int
    record_count: int
    max_timestamp: int
    producer_id: int = NO_PRODUCER
    producer_epoch: int = -1
    base_sequence: int = -1


@dataclass(frozen=True)
class CommitResult:
    """Where a committed batch landed. ``duplicate`` means it was an exact retry of a
    batch committed before, and ``base_offset`` is that batch's original offset."""

    base_offset: int
    duplicate: bool = False


@dataclass(frozen=True)
class TransactionResult:
    """Outcome of :meth:`Sequencer.commit_transaction`.

    ``ranges`` maps every stream the transaction wrote to ``(first_offset,
    end_offset)``: its records hold exactly those offsets, because one atomic step
    assigned them back to back. ``duplicate`` means the id had been committed before:
    the ranges are the original ones and nothing was stored this time.
    """

    transaction_id: str
    """The id the transaction was committed under."""
    ranges: dict[str, tuple[int, int]]
    """Per stream written, ``(first_offset, end_offset)``: the transaction's records
    hold exactly the offsets ``first_offset <= offset < end_offset``."""
    duplicate: bool = False
    """Whether the id had been committed before: then ``ranges`` are that commit's,
    and this call stored nothing."""


@dataclass(frozen=True)
class ProducerExpiry:
    """What :meth:`Sequencer.expire_producers` dropped (or, with ``dry_run``, would)."""

    states: int = 0
    """(producer, stream) states: their sequence numbers and epoch on one stream."""
    producers: int = 0
    """Registered producers (their ids; a named one's name with it)."""

    def lines(self) -> list[str]:
        """The maintenance report's lines (none when nothing was dropped)."""
        if not (self.states or self.producers):
            return []
        return [
            f"expired {self.states} idle producer stream states and {self.producers} idle producers"
        ]


@dataclass(frozen=True)
class BatchLocation:
    """A live batch: which object holds it, where, and which offsets it covers."""

    batch_id: int
    object_key: str
    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True)
class BatchPage:
    """Answer of :meth:`Sequencer.find_batches`: batches in offset order plus the
    stream's extent at the time of the call (the reader's snapshot)."""

    batches: list[BatchLocation]
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class StreamMeta:
    """A stream as the sequencer knows it. ``config`` is the stream's
    :class:`~disklesslog.StreamConfig` as a plain dict."""

    name: str
    start_offset: int
    end_offset: int
    config: dict[str, Any] = field(default_factory=dict)


_KEEPERS_LOCK = fork_safe_lock()


class Sequencer(ABC):
    """Orders batches of shared objects into streams. Thread-safe.

    Rejections are all-or-nothing and raise typed errors:
    :class:`~disklesslog.StreamNotFound`, :class:`~disklesslog.ProducerFenced`,
    :class:`~disklesslog.OutOfOrderSequence`, :class:`~disklesslog.OffsetOutOfRange`.
    """

    url: str = ""

    lease_clock: Callable[[], float] = time.monotonic
    """Monotonic seconds that measure lease durations (an implementation sets the clock
    a test injects)."""

    # ----------------------------------------------------------------- streams

    @abstractmethod
    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        """Create ``name`` with ``config`` if it does not exist; return the stream as it
        is (with its existing config if it existed). Idempotent."""

    @abstractmethod
    def alter_stream(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        """Merge ``changes`` into the stored config of an existing stream, atomically (two
        processes changing different settings at once both take effect); the caller
        validated them. Returns the stream as it now is. StreamNotFound."""

    @abstractmethod
    def delete_stream(self, name: str) -> None:
        """Delete a stream, its batches and its producer state; objects left without a
        live batch become garbage. Raises StreamNotFound."""

    @abstractmethod
    def list_streams(self) -> list[str]:
        """Names of all streams, sorted."""

    @abstractmethod
    def stream_info(self, name: str) -> StreamMeta:
        """Extent and config of a stream. Raises StreamNotFound."""

    # --------------------------------------------------------------- producers

    @abstractmethod
    def init_producer(self, name: str | None = None) -> tuple[int, int]:
        """``(producer_id, epoch)`` for a writer. A new anonymous producer gets a fresh
        id with epoch 0. A named producer keeps its id and gets ``epoch + 1``, which
        fences every older instance: their next commit raises ProducerFenced."""

    @abstractmethod
    def expire_producers(self, older_than_ms: int, *, dry_run: bool = False) -> ProducerExpiry:
        """Forget producers idle for ``older_than_ms`` (Kafka's
        ``producer.id.expiration.ms``), in one atomic step, and say how many went (with
        ``dry_run``: would go; nothing changes).

        First every (producer, stream) state whose last accepted write was committed
        more than ``older_than_ms`` before now (the sequencer's clock) is dropped: the
        producer's next batch there gets :class:`~disklesslog.UnknownProducerState`
        unless it starts at sequence 0, and a retry of those old records is no longer
        recognised as a duplicate. Then every producer with no state left whose last
        use (:meth:`init_producer`, or the last write of any of its states, including
        those dropped with their stream) is that old is dropped, its name with it: its
        next commit raises :class:`~disklesslog.UnknownProducerId`, and its zombies are
        no longer fenced. Producer ids are never issued again, dropped or not, so an old
        id can never be mistaken for a new producer. A producer that wrote (or was
        initialised) within the window keeps all of it: deduplication and fencing are
        guaranteed inside that window only. ``older_than_ms`` is an int >= 0
        (:class:`~disklesslog.ConfigError` otherwise, nothing changed)."""

    # ----------------------------------------------------------------- commits

    @abstractmethod
    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        """Record an uploaded object and assign offsets to its batches, in one atomic step.

        Offsets are assigned in the order of ``batches``, each stream continuing from its
        end offset. For a producer's batch (``producer_id >= 0``) the rules of
        :mod:`~disklesslog.sequencers.producers` apply: a repeat of records from its
        last five runs of batches on that stream is answered with the original offsets
        (``duplicate=True``) and not stored again; any other rejection (fenced epoch,
        sequence gap, unknown stream or producer) refuses the whole commit and changes
        nothing. Committing the same object key again is allowed (a retry).
        """

    def commit_many(
        self, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> list[list[CommitResult] | DisklessLogError]:
        """Commit several uploaded objects ``(object_key, batches)`` in this order, in one
        round trip where the implementation can (the object-store sequencer writes them
        as one entry): a writer's group commit of the flushes it has waiting.

        Each object is judged on its own, exactly as by :meth:`commit`: atomic, in order,
        and a refused one does not stop the next. Returns, per object, its results or the
        :class:`~disklesslog.DisklessLogError` that refused it (StreamNotFound,
        ProducerFenced, OutOfOrderSequence...). Any other exception (a lost connection)
        leaves the outcome of every object unknown, like a failed :meth:`commit`.
        """
        outcomes: list[list[CommitResult] | DisklessLogError] = []
        for object_key, batches in objects:
            try:
                outcomes.append(self.commit(object_key, batches))
            except DisklessLogError as exc:
                outcomes.append(exc)
        return outcomes

    @abstractmethod
    def commit_transaction(
        self, transaction_id: str, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> TransactionResult:
        """Commit several uploaded objects ``(object_key, batches)`` as **one** atomic
        step keyed by ``transaction_id``: the second phase of a two-phase commit whose
        first phase (staging) uploaded the objects from many processes.

        All or nothing across every object and stream: offsets are assigned in the
        order of ``objects`` and their batches, each stream continuing from its end
        offset; any rejection (unknown stream, malformed batch) refuses the whole
        transaction and changes nothing. Transactional batches carry no producer
        (``producer_id`` is :data:`NO_PRODUCER`): the transaction id deduplicates them.

        If ``transaction_id`` was committed before (and is still remembered: see
        :data:`TRACKED_TRANSACTIONS`, :data:`TRANSACTION_RETENTION_SECONDS`), nothing is
        stored, the original ranges come back with ``duplicate=True``, and objects given
        now that the sequencer does not know are recorded as orphans in the same step
        (a replayed job uploaded them again; garbage collection deletes them).
        """

    @abstractmethod
    def record_orphan(self, object_key: str) -> None:
        """Note an uploaded object that will never be committed (its commit failed), so
        garbage collection deletes it after the grace period."""

    # ------------------------------------------------------------------- reads

    @abstractmethod
    def find_batches(self, stream: str, offset: int, max_bytes: int) -> BatchPage:
        """Live batches of ``stream`` from the one containing ``offset``, in offset order,
        until their sizes reach ``max_bytes`` (always at least one batch when any
        exists). Empty when ``offset`` equals the end offset. Raises OffsetOutOfRange
        below the start offset or above the end offset, StreamNotFound."""

    @abstractmethod
    def offset_for_time(self, stream: str, timestamp: int) -> int | None:
        """First offset >= the start offset of the first batch whose max timestamp is
        >= ``timestamp`` (the batch's base offset, or the start offset if the batch
        begins below it); ``None`` if no batch is that late. The caller refines the
        answer record by record inside that batch."""

    # -------------------------------------------------------------- maintenance

    @abstractmethod
    def trim(self, stream: str, before: int) -> None:
        """Move the start offset to ``before`` (never backwards; OffsetOutOfRange past the
        end offset). Batches wholly below it stop being live."""

    @abstractmethod
    def replace_batches(
        self, stream: str, old_batch_ids: Sequence[int], new_batches: Sequence[BatchLocation]
    ) -> bool:
        """Swap live batches for rewritten ones covering the same offsets (merging,
        compaction): applies only if every old batch is still live, else returns False
        and changes nothing. ``new_batches``' ``batch_id`` fields are ignored."""

    @abstractmethod
    def objects_to_delete(self, grace_seconds: float) -> list[str]:
        """Keys of objects that have held no live batch (or were recorded as orphans)
        for at least ``grace_seconds``: safe to delete from storage."""

    @abstractmethod
    def forget_objects(self, object_keys: Sequence[str]) -> None:
        """Drop deleted objects from the sequencer's records."""

    @abstractmethod
    def list_objects(self) -> list[str]:
        """Every object key the sequencer knows, sorted: objects holding live batches,
        garbage not yet forgotten, and recorded orphans. An object in storage that is
        not listed here (and is older than any upload still in flight) was never
        committed: garbage collection's reconcile pass deletes it."""

    # ---------------------------------------------------------- consumer groups

    @abstractmethod
    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        """Store a consumer group's next offset per stream (merged with earlier ones)."""

    @abstractmethod
    def committed_offsets(self, group: str) -> dict[str, int]:
        """A consumer group's stored offsets ({} for an unknown group)."""

    @abstractmethod
    def list_groups(self) -> list[str]:
        """The groups with at least one stored offset, sorted."""

    # ------------------------------------------------------------------ leases

    @abstractmethod
    def read_lease(self, name: str) -> LeaseRecord | None:
        """The stored record of lease ``name`` (None if never acquired); see
        :class:`~disklesslog.leases.LeaseStore`. A damaged record raises
        :class:`~disklesslog.CorruptDataError`."""

    @abstractmethod
    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        """Store ``record`` for lease ``name`` if its stored serial is still ``serial``
        (0: none stored), atomically; False and no change otherwise. Callers use the
        ``*_lease`` methods below, which keep the rules of
        :class:`~disklesslog.leases.LeaseKeeper`."""

    @abstractmethod
    def drop_lease(self, name: str, serial: int) -> bool:
        """Remove the record of lease ``name`` if its serial is still ``serial``, raising
        the token floor to its token in the same atomic step; see
        :class:`~disklesslog.leases.LeaseStore`. Callers use :meth:`prune_leases`."""

    @abstractmethod
    def lease_names(self) -> list[str]:
        """The lease names that have a record, sorted."""

    @abstractmethod
    def lease_floor(self) -> int:
        """The token floor: the greatest token of a removed lease record (0: none)."""

    def acquire_lease(self, name: str, holder: str, duration_ms: int) -> Lease | None:
        """:meth:`LeaseKeeper.acquire <disklesslog.leases.LeaseKeeper.acquire>`."""
        return self.lease_keeper().acquire(name, holder, duration_ms)

    def renew_lease(self, lease: Lease) -> Lease:
        """:meth:`LeaseKeeper.renew <disklesslog.leases.LeaseKeeper.renew>` (LeaseLost)."""
        return self.lease_keeper().renew(lease)

    def release_lease(self, lease: Lease) -> None:
        """:meth:`LeaseKeeper.release <disklesslog.leases.LeaseKeeper.release>`."""
        self.lease_keeper().release(lease)

    def lease_holder(self, name: str) -> Lease | None:
        """:meth:`LeaseKeeper.holder <disklesslog.leases.LeaseKeeper.holder>`."""
        return self.lease_keeper().holder(name)

    def prune_leases(self, older_than_ms: int) -> list[str]:
        """:meth:`LeaseKeeper.prune <disklesslog.leases.LeaseKeeper.prune>`."""
        return self.lease_keeper().prune(older_than_ms)

    def lease_keeper(self) -> LeaseKeeper:
        """This instance's keeper (for the package's own modules: an object log's leases
        use its sequencer's). Its observations of other holders' records are what lets
        it take an expired lease over, so there is one per sequencer object."""
        with _KEEPERS_LOCK:
            keeper: LeaseKeeper | None = self.__dict__.get("_leases")
            if keeper is None:
                keeper = self.__dict__["_leases"] = LeaseKeeper(self, self.lease_clock)
            return keeper

    # -------------------------------------------------------------- housekeeping

    def housekeeping(self, *, dry_run: bool = False) -> list[str]:
        """Delete what the sequencer no longer needs of its own storage, and say what
        went (one line each; nothing by default), or with ``dry_run`` what would.
        Automatic maintenance calls it once per round over the log's streams; safe from
        any process at any time."""
        return []

    # ------------------------------------------------------------------ metrics

    def metrics(self) -> dict[str, float]:
        """Counters of what this instance's commits cost since it was opened, named
        ``sequencer_*`` (an object log's :meth:`~disklesslog.Log.metrics` includes
        them); none by default. The object-store sequencer reports its races here."""
        return {}

    # ------------------------------------------------------------------ closing

    def close(self) -> None:  # noqa: B027 - optional hook, most have nothing to release
        """Release connections and files. Idempotent."""

    def __enter__(self) -> Sequencer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
