"""The object-store sequencer: a replicated log of sequencer entries, no server at all.

Every process keeps a full replica of the sequencer's state in memory (a
:class:`~disklesslog.sequencers.memory.MemorySequencer`) and changes it only by
applying **entries**, objects named ``<root>/log/<20-digit number>`` in the same bucket
as the data. An entry lists operations (commit, trim, create stream, init producer,
...). Whoever manages to create entry ``n + 1`` with put-if-absent
(:func:`~disklesslog.storage.conditional.put_if_absent`) has ordered its operations
after entry ``n``; every replica applies the entries in number order and, because the
state machine is deterministic (the entry carries its own timestamp), reaches the same
state and the same verdict on every operation. This is Delta Lake's ``_delta_log`` and
SlateDB's manifest, used as a Raft-less replicated state machine.

Consequences worth knowing:

* Operations are judged when applied, not before they are written. A fenced or out of
  order commit still takes an entry number, and every replica rejects it the same way.
* Losing the race for a number means: read the entries you missed, apply them, try the
  next number (paced so that processes take turns, :mod:`.objectstore_pacing`; bounded,
  then :class:`~disklesslog.SequencerConflict`). A
  write whose response was lost is recognised by its random entry id when read back,
  so it is never applied twice, and an entry id seen recently is ignored if it turns
  up again under another number.
* Group commit: callers of one instance queue their operations and one of them writes
  the whole queue as a single entry, so N concurrent writers in a process cost one PUT;
  :meth:`ObjectStoreSequencer.commit_many` queues a writer's waiting flushes together.
* Checkpoints ``<root>/checkpoints/<entry>-<unix ms>`` hold the whole state every
  ``checkpoint_every`` entries, further apart as the state grows (so their cost per
  entry stays bounded); a process opening the log loads the newest and replays what
  follows. Entries and checkpoints older than a checkpoint that is itself older
  than ``entry_retention_seconds`` (and intact) are deleted. A replica that has not
  confirmed its tail for a quarter of that time lists the checkpoints before trusting a
  missing entry, so an entry deleted under it can never be mistaken for a free number.
* Reading state never writes: readers fetch the next entry numbers until one is missing.
* **Damage is never skipped.** Entries and checkpoints are checksummed and checked
  whole before anything of them is applied (:mod:`.objectstore_format`), and every entry
  names the history it was written after. A damaged entry is read once more, then
  passed only by loading an intact checkpoint that covers it (the state of a replica
  that applied it); a damaged checkpoint is passed by an older one and the entries
  after it. Each such repair is logged. Without an intact route, the replica stops
  before the damage with :class:`~disklesslog.SequencerDamaged`: every replica either
  has the state every other one has, or raises. Storage calls retry transient failures
  (:mod:`.objectstore_storage`).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import gc
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    ConfigError,
    CorruptDataError,
    DisklessLogError,
    InvalidURL,
    LogClosedError,
    SequencerConflict,
    SequencerDamaged,
    SequencerError,
    StorageError,
)
from ..forks import reset_after_fork
from ..leases import LeaseRecord, check_lease_record, check_lease_serial
from ..names import validate_lease_name, validate_stream_name
from ..retries import DEADLINE
from ..storage.filesystems import open_filesystem
from .base import (
    BatchLocation,
    BatchPage,
    BatchToCommit,
    CommitResult,
    ProducerExpiry,
    Sequencer,
    StreamMeta,
    TransactionResult,
)
from .common import (
    Clock,
    check_batches,
    check_expiry_age,
    check_keys,
    check_location,
    check_object_key,
    check_offsets,
    check_old_ids,
    check_position,
    check_transaction,
    config_copy,
)
from .memory import MemorySequencer
from .objectstore_format import (
    CHAIN_START,
    CHECKPOINT_MAGIC_V1,
    Entry,
    chain,
    decode_body,
    decode_checkpoint,
    decode_entry,
    encode_checkpoint,
    encode_entry,
    entry_body,
    verify_checkpoint,
)
from .objectstore_pacing import Pacing
from .objectstore_storage import CheckpointName, SequencerStorage

__all__ = ["ObjectStoreSequencer", "open_objectstore_sequencer"]

log = logging.getLogger(__name__)

MAX_OPS_PER_ENTRY = 512
"""Operations one group commit writes at most (bounds an entry's size)."""
RECENT_ENTRY_IDS = 1024
"""Entry ids remembered to ignore an entry that turns up twice (a delayed retry)."""
CHECKPOINT_ROWS_PER_ENTRY = 40
"""Rows of state (:meth:`MemorySequencer.snapshot_rows`: live batches, objects, streams,
producers) a checkpoint may write per entry since the previous one (its cost, spread
over the entries it saves a replay of)."""
PREFETCH = 8
"""Entries fetched at once while catching up (one concurrent request batch)."""
CHECKPOINT_LISTINGS = 3
"""Listings of the checkpoints one load tries when the chosen one vanishes meanwhile
(deleted as superseded by a newer one, which the next listing shows)."""
DELETE_CHUNK = 64
"""Superseded entries and checkpoints the clean-up deletes at a time (several at once on
object storage: :meth:`~disklesslog.storage.store.ObjectStore.delete`), looking between
chunks whether the sequencer was closed: closing waits for one chunk at most, a few
round trips."""

NEWEST_CHECKPOINTS_KEPT = 2
"""Checkpoints kept however young besides the one that supersedes old entries: the
newest, and the one before it as the route around damage to the newest. One more is
kept, the oldest younger than the retention: the next to supersede entries, which must
be left to age past it (were it deleted, at a high commit rate no checkpoint would ever
live that long and no entry would ever go). The others between them and the
superseding one are deleted at once (every entry after the superseding checkpoint is
kept, so they are no route anybody needs), so a wide state's checkpoints take a few
times its size, not one copy per checkpoint in the retention."""


@dataclass
class _Slot:
    """One caller's operation waiting in the group-commit queue."""

    op: list[Any]
    done: bool = False
    value: Any = None
    error: BaseException | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


@dataclass
class _Replica:
    """The state as of entry ``tail``: the memory sequencer, the ids of recent entries
    (part of the replicated state: every replica ignores the same repeats) and the
    chain digest of the entries applied (which every new entry must name)."""

    state: MemorySequencer
    tail: int = 0
    recent: collections.OrderedDict[bytes, None] = field(default_factory=collections.OrderedDict)
    chain: bytes = CHAIN_START


class ObjectStoreSequencer(Sequencer):
    """A sequencer stored as entries and checkpoints under ``root`` of an fsspec
    filesystem that supports put-if-absent (S3, GCS, Azure, local or NFS disks,
    memory). Thread-safe; any number of processes on any machines may share ``root``.

    ``checkpoint_every``: entries between checkpoints (bounds replay on open).
    ``entry_retention_seconds``: how long entries and checkpoints superseded by a newer
    checkpoint are kept (a grace period for replicas reading them). ``max_attempts``:
    lost races tolerated per write before :class:`SequencerConflict`. ``clock``: the
    wall clock stamped into entries (when objects became garbage). ``repair``: open even
    if the stored state is damaged (the replica stops before the damage; every read and
    write still raises :class:`SequencerDamaged`), to call :meth:`verify`,
    :meth:`write_checkpoint` or :meth:`discard_entry` (``docs/operations.md``).
    ``retry_deadline``: seconds after a storage request's first attempt in which its
    retries must start (:mod:`disklesslog.retries`; a log passes its
    ``retry_deadline_ms``).
    """

    def __init__(
        self,
        fs: Any,
        root: str,
        *,
        url: str | None = None,
        clock: Clock = time.time,
        checkpoint_every: int = 100,
        entry_retention_seconds: float = 600.0,
        max_attempts: int = 300,
        repair: bool = False,
        retry_deadline: float = DEADLINE,
    ) -> None:
        if type(checkpoint_every) is not int or checkpoint_every < 1:
            raise ConfigError("checkpoint_every must be an int >= 1")
        if not isinstance(entry_retention_seconds, (int, float)) or entry_retention_seconds <= 0:
            raise ConfigError("entry_retention_seconds must be a positive number of seconds")
        if type(max_attempts) is not int or max_attempts < 1:
            raise ConfigError("max_attempts must be an int >= 1")
        if not isinstance(retry_deadline, (int, float)) or not retry_deadline > 0:
            raise ConfigError("retry_deadline must be a positive number of seconds")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.url = url or f"objectstore+{protocol}://{root.rstrip('/')}"
        self._storage = SequencerStorage(fs, root, self.url, deadline=retry_deadline)
        self._clock = clock
        if clock is not time.time:  # an injected clock measures leases too
            self.lease_clock = clock
        self._checkpoint_every = checkpoint_every
        self._retention = float(entry_retention_seconds)
        self._fresh_window = self._retention / 4
        self._max_attempts = max_attempts
        self._replay_time: float | None = None
        self._lock = threading.RLock()  # the replica, its tail and _awaiting; never held
        # during I/O, so readers fetching entries do not hold up writers applying theirs
        self._fetch_lock = threading.Lock()  # one catch-up at a time (single flight)
        self._replica = self._empty_replica()
        self._confirmed = -float("inf")  # monotonic time the tail was last known current
        self._floor: CheckpointName | None = None  # a damaged checkpoint replay must pass
        self._broken: SequencerError | None = None  # an entry failed to apply whole
        self._awaiting: dict[bytes, list[_Slot]] = {}
        self._queue: list[_Slot] = []
        self._queue_cond = threading.Condition()
        self._leading = False
        self._pacing = Pacing()
        self._last_cleanup = -float("inf")
        self._cleaner: threading.Thread | None = None  # deleting superseded entries
        self._cleaner_lock = threading.Lock()  # starting and joining it
        self._closed = False
        self._zstd_level = 3
        _LIVE.add(self)
        try:
            self._catch_up()
        except SequencerDamaged as exc:
            if not repair:
                raise
            log.warning("%s: opened for repair; the replica stopped before: %s", self.url, exc)

    def __repr__(self) -> str:
        return f"ObjectStoreSequencer({self.url})"

    def _forked(self) -> None:
        """In a fork child (:mod:`disklesslog.forks`): the queued operations, and the
        entries awaited, are the parent's threads' (the parent writes them; the child
        reads what landed as any other process does); the clean-up thread is the
        parent's. A thread of the parent may have been applying an entry when the fork
        came, so the replica is dropped: the child's first call replays from the newest
        checkpoint, as a process opening the log does."""
        self._lock = threading.RLock()
        self._fetch_lock = threading.Lock()
        self._queue_cond = threading.Condition()
        self._cleaner_lock = threading.Lock()
        self._queue = []
        self._awaiting = {}
        self._leading = False
        self._cleaner = None
        self._replica = self._empty_replica()
        self._confirmed = -float("inf")

    # ------------------------------------------------------------ state reads

    @property
    def tail(self) -> int:
        """Number of the last entry this replica has applied."""
        return self._replica.tail

    def snapshot(self) -> dict[str, Any]:
        """The replica's state after catching up (see :meth:`MemorySequencer.snapshot`)."""
        with self._reading() as state:
            return state.snapshot()

    def list_streams(self) -> list[str]:
        with self._reading() as state:
            return state.list_streams()

    def stream_info(self, name: str) -> StreamMeta:
        with self._reading() as state:
            return state.stream_info(name)

    def find_batches(self, stream: str, offset: int, max_bytes: int) -> BatchPage:
        with self._reading() as state:
            return state.find_batches(stream, offset, max_bytes)

    def offset_for_time(self, stream: str, timestamp: int) -> int | None:
        with self._reading() as state:
            return state.offset_for_time(stream, timestamp)

    def objects_to_delete(self, grace_seconds: float) -> list[str]:
        with self._reading() as state:
            return state.objects_to_delete(grace_seconds)

    def committed_offsets(self, group: str) -> dict[str, int]:
        with self._reading() as state:
            return state.committed_offsets(group)

    def list_groups(self) -> list[str]:
        with self._reading() as state:
            return state.list_groups()

    def list_objects(self) -> list[str]:
        with self._reading() as state:
            return state.list_objects()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[MemorySequencer]:
        self._check_open()
        self._catch_up(asked=time.monotonic())
        with self._lock:
            yield self._replica.state

    # ---------------------------------------------------------------- writes

    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _, text = config_copy(config)
        result: StreamMeta = self._submit(["create_stream", name, text])
        return result

    def alter_stream(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _, text = config_copy(changes)
        result: StreamMeta = self._submit(["alter_stream", name, text])
        return result

    def delete_stream(self, name: str) -> None:
        validate_stream_name(name)
        self._submit(["delete_stream", name])

    def init_producer(self, name: str | None = None) -> tuple[int, int]:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"a producer name must be a non-empty str or None, not {name!r}")
        result: tuple[int, int] = self._submit(["init_producer", name])
        return result

    def expire_producers(self, older_than_ms: int, *, dry_run: bool = False) -> ProducerExpiry:
        """One ``expire_producers`` operation, which every replica applies with the
        entry's timestamp as its clock, so all drop the same states and producers. It is
        written only when the replica, caught up, finds something to drop (a pass that
        finds nothing costs no entry); ``dry_run`` only looks (at this replica's clock)."""
        check_expiry_age(older_than_ms)
        with self._reading() as state:
            found = state.expire_producers(older_than_ms, dry_run=True)
        if dry_run or found == ProducerExpiry():
            return found
        result: ProducerExpiry = self._submit(["expire_producers", older_than_ms])
        return result

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        check_object_key(object_key)
        result: list[CommitResult] = self._submit(["commit", object_key, _rows(batches)])
        return result

    def commit_many(
        self, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> list[list[CommitResult] | DisklessLogError]:
        """Every object's commit as one operation each, written together in one entry
        (unless other callers' operations fill it first: then in consecutive entries)."""
        ops = [["commit", check_object_key(key), _rows(batches)] for key, batches in objects]
        outcomes: list[list[CommitResult] | DisklessLogError] = []
        for slot in self._submit_many(ops):
            if slot.error is None:
                outcomes.append(slot.value)
            elif isinstance(slot.error, DisklessLogError) and not isinstance(
                slot.error, LogClosedError
            ):
                outcomes.append(slot.error)
            else:
                raise slot.error
        return outcomes

    def commit_transaction(
        self, transaction_id: str, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> TransactionResult:
        """One ``commit_transaction`` operation in one entry: every replica applies all of
        its objects or none, and remembers the id in its replicated state."""
        txn, checked, _ = check_transaction(transaction_id, objects)
        op = ["commit_transaction", txn, [[key, _rows(batches)] for key, batches in checked]]
        result: TransactionResult = self._submit(op)
        return result

    def record_orphan(self, object_key: str) -> None:
        check_object_key(object_key)
        self._submit(["record_orphan", object_key])

    def trim(self, stream: str, before: int) -> None:
        validate_stream_name(stream)
        check_position(before, "before")
        self._submit(["trim", stream, before])

    def replace_batches(
        self, stream: str, old_batch_ids: Sequence[int], new_batches: Sequence[BatchLocation]
    ) -> bool:
        validate_stream_name(stream)
        ids = check_old_ids(old_batch_ids)
        news = []
        for b in new_batches:
            check_location(b, stream)
            news.append(
                [b.object_key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp]
            )
        result: bool = self._submit(["replace_batches", stream, ids, news])
        return result

    def forget_objects(self, object_keys: Sequence[str]) -> None:
        self._submit(["forget_objects", list(check_keys(object_keys))])

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        self._submit(["commit_offsets", group, check_offsets(group, offsets)])

    # ------------------------------------------------------------------ leases

    def read_lease(self, name: str) -> LeaseRecord | None:
        """The record as of the newest entry (read from storage first), so the time this
        process notes it as first seen is after the entry that wrote it."""
        validate_lease_name(name)
        with self._reading() as state:
            return state.read_lease(name)

    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        """One ``swap_lease`` operation: every replica compares the serial as it applies
        the entry, so of two processes swapping from one serial exactly one wins (the
        entry order decides)."""
        validate_lease_name(name)
        r = check_lease_record(serial, record)
        op = ["swap_lease", name, serial, r.holder, r.token, r.serial, r.duration_ms]
        result: bool = self._submit(op)
        return result

    def drop_lease(self, name: str, serial: int) -> bool:
        """One ``drop_lease`` operation: every replica compares the serial, raises the
        token floor and removes the record as it applies the entry."""
        validate_lease_name(name)
        result: bool = self._submit(["drop_lease", name, check_lease_serial(serial)])
        return result

    def lease_names(self) -> list[str]:
        with self._reading() as state:
            return state.lease_names()

    def lease_floor(self) -> int:
        with self._reading() as state:
            return state.lease_floor()

    def metrics(self) -> dict[str, float]:
        """Entries this process wrote, races it lost, writes given up
        (:class:`SequencerConflict`), commits and the seconds they waited in total,
        seconds spent yielding to other writers, operations queued now (the backlog),
        and the moving averages of PUT and GET latency (:mod:`.objectstore_pacing`)."""
        with self._queue_cond:
            backlog = len(self._queue)
        return self._pacing.metrics(backlog)

    def close(self) -> None:
        """Close; a clean-up in progress stops after the object it is deleting (the next
        one, in any process, finishes it)."""
        self._closed = True
        self._wait_for_clean_up()

    # ---------------------------------------------------------- group commit

    def _submit(self, op: list[Any]) -> Any:
        """Apply ``op`` through the group-commit queue; its result, or raise its error."""
        return self._submit_many([op])[0].result()

    def _submit_many(self, ops: list[list[Any]]) -> list[_Slot]:
        """Queue ``ops`` (together, in order) and wait until all are applied. The first
        waiter that finds nobody writing becomes the leader and writes every queued
        operation as one entry."""
        self._check_open()
        queued = time.monotonic()
        slots = [_Slot(op) for op in ops]
        with self._queue_cond:
            self._queue.extend(slots)
        while True:
            with self._queue_cond:
                while self._leading and not all(s.done for s in slots):
                    self._queue_cond.wait()
                if all(s.done for s in slots):
                    self._pacing.committed(time.monotonic() - queued)
                    return slots
                self._leading = True
                group = self._queue[:MAX_OPS_PER_ENTRY]
                del self._queue[:MAX_OPS_PER_ENTRY]
            try:
                checkpoint = self._write(group)
            except BaseException as exc:
                for s in group:
                    if not s.done:
                        s.error, s.done = exc, True
                checkpoint = None
            finally:
                with self._queue_cond:
                    self._leading = False
                    self._queue_cond.notify_all()
            if checkpoint is not None:
                self._write_checkpoint(*checkpoint)
            warning = self._pacing.saturation(self._replica.tail)
            if warning is not None:
                log.warning("%s: %s", self.url, warning)

    def _take_queued(self, group: list[_Slot]) -> None:
        """Add to ``group`` (in place) what was queued since it was taken, up to
        :data:`MAX_OPS_PER_ENTRY`: an entry carries everything its process has waiting
        when it tries for a number, so a process that wins seldom still commits all."""
        with self._queue_cond:
            room = MAX_OPS_PER_ENTRY - len(group)
            if room > 0 and self._queue:
                group.extend(self._queue[:room])
                del self._queue[:room]

    def _write(self, group: list[_Slot]) -> tuple[int, dict[str, Any], list[bytes], bytes] | None:
        """Write ``group`` as one entry at the next free number and apply it. Returns
        ``(entry, snapshot, recent entry ids, chain digest)`` when this entry is due a
        checkpoint. Before each try the process paces itself (:mod:`.objectstore_pacing`)
        and takes in what was queued meanwhile; the body is packed again only when that
        added something, and each number tried gets its own header (the number and the
        chain digest of the entries before it). After a lost race the entry it was lost
        to (ours, if the response was lost) and the next are read in one round trip."""
        ids: list[bytes] = []  # one per packing, each recognised when applied
        body, decoded, packed = b"", None, 0
        try:
            for _ in range(self._max_attempts):
                pause = self._pacing.pause_before_try()
                if pause > 0:
                    time.sleep(pause)
                    self._pacing.record_yield(pause)
                self._take_queued(group)
                if len(group) != packed or decoded is None:
                    entry_id = secrets.token_bytes(16)
                    body = entry_body(entry_id, float(self._clock()), [s.op for s in group])
                    # Checked as every replica will check it: it applies the same here.
                    decoded = decode_body(body, CHAIN_START, "a new entry")
                    packed = len(group)
                    ids.append(entry_id)
                    with self._lock:
                        self._awaiting[entry_id] = list(group)
                if time.monotonic() - self._confirmed > self._fresh_window:
                    self._catch_up()
                with self._lock:
                    number, previous = self._replica.tail + 1, self._replica.chain
                data = encode_entry(number, previous, body)
                started = time.monotonic()
                created = self._storage.create(self._storage.entry_path(number), data)
                self._pacing.observe_put(time.monotonic() - started)
                with self._lock:
                    applied = created and self._replica.tail == number - 1
                    if applied:
                        self._confirmed = max(self._confirmed, started)
                        self._apply(number, dataclasses.replace(decoded, previous=previous), data)
                if created:
                    self._pacing.won()
                    if not applied:  # a reader applied ours, and maybe more: catch up
                        self._catch_up()
                else:  # lost the race (or its response): read that entry and on
                    self._pacing.lost()
                    self._catch_up(window=2)
                with self._lock:
                    if all(s.done for s in group):
                        due = created and self._checkpoint_due(number)
                        if due and self._replica.tail == number:
                            return self._checkpoint_content(number)
                        return None
            self._pacing.gave_up()
            raise SequencerConflict(
                f"{self.url}: lost the race for the next sequencer entry "
                f"{self._max_attempts} times to other writers; nothing was applied"
            )
        finally:
            with self._lock:
                for entry_id in ids:
                    self._awaiting.pop(entry_id, None)

    def _checkpoint_content(
        self, number: int
    ) -> tuple[int, dict[str, Any], list[bytes], bytes] | None:
        """What the checkpoint of entry ``number`` holds; None (logged) if a stream's rows
        from the checkpoint this replica loaded fail their deferred check: damage is
        never written into a newer checkpoint. Caller holds the state lock."""
        r = self._replica
        try:
            with _collector_off():
                return number, r.state.snapshot(), list(r.recent), r.chain
        except CorruptDataError as exc:
            log.error("%s: no checkpoint of entry %d written: %s", self.url, number, exc)
            return None

    def _checkpoint_due(self, number: int) -> bool:
        """Whether entry ``number`` (just applied) is followed by a checkpoint: every
        ``checkpoint_every`` entries while the state is small; further apart as it grows
        (a power-of-two multiple), so that writing the whole state costs at most about
        :data:`CHECKPOINT_ROWS_PER_ENTRY` rows per entry since the last one. Every
        replica decides alike, from the same state, so one process writes it."""
        if number % self._checkpoint_every:
            return False
        rows = self._replica.state.snapshot_rows()
        wanted = rows // (CHECKPOINT_ROWS_PER_ENTRY * self._checkpoint_every)
        stride = 1 << max(0, wanted.bit_length() - 1) if wanted else 1
        return (number // self._checkpoint_every) % stride == 0

    # -------------------------------------------------------------- replaying

    def _catch_up(self, asked: float | None = None, *, window: int = 1) -> None:
        """Apply every entry after the tail; if the tail was not confirmed recently,
        first load a newer checkpoint if there is one. One thread fetches at a time, and
        a caller that ``asked`` at a monotonic time is content with any catch-up that
        began after it. Entries are fetched and checked without the state lock and
        applied with it, skipping those a writer of this process applied meanwhile. A
        damaged entry stops the batch before it (:meth:`_pass_damage`).

        ``window``: entries asked for in the first request (one round trip however
        many). A writer that lost a race asks for two, the one it lost to and the next:
        at the tail (the usual case) that tells it is current in one round trip instead
        of two, and a writer far behind fetches more at a time from there."""
        with self._fetch_lock:
            if asked is not None and self._confirmed >= asked:
                return
            started = time.monotonic()
            if started - self._confirmed > self._fresh_window:
                self._load_checkpoint(self._storage.checkpoints(), self._replica.tail + 1)
            while True:
                number = self._replica.tail + 1
                checked: list[tuple[int, Entry, bytes]] = []
                missing: int | None = None
                stop: tuple[int, DisklessLogError] | None = None
                fetching = time.monotonic()
                fetched = self._storage.get_entries(number, window)
                self._pacing.observe_get(time.monotonic() - fetching)
                for at, data in enumerate(fetched, number):
                    if data is None:
                        missing = at
                        break
                    try:
                        checked.append((at, decode_entry(data, at, self._path(at)), data))
                    except DisklessLogError as exc:  # damage, or a newer release's entry
                        stop = at, exc
                        break
                with self._lock:
                    for at, entry, data in checked:
                        if at > self._replica.tail:  # else applied by a writer meanwhile
                            self._apply(at, entry, data)
                    if missing is not None and missing > self._replica.tail:
                        self._check_end(missing)
                        self._confirmed = max(self._confirmed, started)
                        return
                if stop is not None:
                    self._pass_damage(*stop)
                    window = 1
                    continue
                # Behind: fetch more entries at a time while every one of them exists
                # (s3fs, gcsfs and adlfs send the requests of one call concurrently).
                window = min(window * 2, PREFETCH)

    def _apply(self, number: int, entry: Entry, data: bytes) -> None:
        """Apply entry ``number`` whole (its operations were checked when decoded), or
        nothing of it. Caller holds the state lock."""
        replica = self._replica
        if number != replica.tail + 1:
            raise AssertionError(f"entry {number} applied after {replica.tail}")
        if entry.previous is not None and entry.previous != replica.chain:
            raise SequencerDamaged(
                f"entry {number} was written after another history than the one this "
                f"process applied up to entry {number - 1} (an entry was replaced "
                "underneath a running process); this process stopped before it. Restart "
                "the processes using the log; see docs/operations.md",
                source=self._path(number),
            )
        outcomes: list[tuple[Any, BaseException | None]] = []
        if entry.entry_id not in replica.recent:
            self._replay_time = entry.timestamp
            try:
                outcomes = [_apply_op(replica.state, op) for op in entry.ops]
            except Exception as exc:  # not a verdict: the replica may hold part of it
                self._broken = SequencerError(
                    f"{self.url}: entry {number} could not be applied whole ({exc!r}); this "
                    "replica is no longer trusted: reopen the log"
                )
                raise self._broken from exc
            finally:
                self._replay_time = None
            replica.recent[entry.entry_id] = None
            if len(replica.recent) > RECENT_ENTRY_IDS:
                replica.recent.popitem(last=False)
        if entry.previous is not None:  # a version 1 entry leaves the chain as it is
            replica.chain = chain(replica.chain, data)
        replica.tail = number
        if self._floor is not None and number >= self._floor.entry:
            self._floor = None
        slots = self._awaiting.pop(entry.entry_id, None)
        if slots is None:
            return
        if not outcomes:  # our entry was applied before, and its outcome is gone
            self._outcome_lost(slots)
            return
        for slot, (value, error) in zip(slots, outcomes, strict=True):
            slot.value, slot.error, slot.done = value, error, True

    def _check_end(self, missing: int) -> None:
        """A missing entry ends the log, unless a damaged checkpoint passed over says the
        log goes further: then the entries that would replace it were deleted."""
        floor = self._floor
        if floor is not None and missing <= floor.entry:
            raise SequencerDamaged(
                f"checkpoint of entry {floor.entry} is damaged, and entry {missing}, which "
                "replaying past it from an older checkpoint needs, was deleted (superseded "
                "by it). A process whose tail reached it can write a checkpoint "
                "(write_checkpoint()); see docs/operations.md",
                source=floor.path,
            )

    def _pass_damage(self, number: int, damage: DisklessLogError) -> None:
        """Entry ``number`` did not decode. An entry of a newer release stops replay
        (skipping it would make this replica differ from newer ones). Damage is read once
        more (it may have been in transit), then passed only by loading an intact
        checkpoint that covers it: the state of a replica that applied the entry.
        Otherwise this replica stops before it, as every other one does."""
        if not isinstance(damage, CorruptDataError):
            raise damage
        path = self._path(number)
        with self._lock:
            if number <= self._replica.tail:  # a writer of ours applied it meanwhile
                return
        data = self._storage.get(path)
        if data is not None:
            try:
                entry = decode_entry(data, number, path)
            except CorruptDataError:
                pass
            else:
                log.warning("%s: %s read damaged, then intact (%s)", self.url, path, damage.reason)
                with self._lock:
                    if number == self._replica.tail + 1:
                        self._apply(number, entry, data)
                return
        if self._load_checkpoint(self._storage.checkpoints(), number) is not None:
            log.warning(
                "%s: entry %s is damaged (%s); replaced by a checkpoint that covers it",
                self.url,
                path,
                damage.reason,
            )
            return
        raise SequencerDamaged(
            f"entry {number} is damaged ({damage.reason}) and no intact checkpoint covers "
            f"it; this process stopped before it. A process whose tail reached {number} "
            "can write one (write_checkpoint()); see docs/operations.md",
            source=path,
        )

    def _outcome_lost(self, slots: list[_Slot]) -> None:
        """Our entry was applied but we could not watch it happen (it came back inside a
        checkpoint, after a lost response and a long stall): the effect stands, the
        result is unknown, as after any lost response."""
        for slot in slots:
            slot.error = StorageError(
                f"{self.url}: the operation was applied but its result was lost (a "
                "checkpoint superseded it while this process waited); read the state back"
            )
            slot.done = True

    def _state_clock(self) -> float:
        """The replica's clock: an entry's own timestamp while it is applied (every
        replica stamps the same time), the real clock otherwise."""
        stamp = self._replay_time
        return self._clock() if stamp is None else stamp

    def _empty_replica(self) -> _Replica:
        return _Replica(MemorySequencer(clock=self._state_clock))

    # ----------------------------------------------------------- checkpoints

    def _load_checkpoint(self, listed: list[CheckpointName], first: int) -> CheckpointName | None:
        """Load the newest intact checkpoint of an entry ``>= first`` (a later state than
        the replica's). A damaged one is logged and passed over for an older one; the
        log reaches at least its entry, so that becomes the floor replay must reach
        (:meth:`_check_end`). One that vanished meanwhile was deleted as superseded by
        a newer one (and so were the entries it covers): the checkpoints are listed
        again, a few times, then :class:`SequencerError`. Returns what was loaded."""
        damaged: list[CheckpointName] = []
        vanished: CheckpointName | None = None
        for _ in range(CHECKPOINT_LISTINGS):
            vanished = None
            for candidate in reversed([c for c in listed if c.entry >= first]):
                data = self._storage.get(candidate.path)
                if data is None:
                    vanished = candidate
                    break
                try:
                    loaded = self._decode_checkpoint(data, candidate)
                except CorruptDataError as exc:
                    log.warning(
                        "%s: checkpoint %s is damaged (%s); trying an older route",
                        self.url,
                        candidate.path,
                        exc.reason,
                    )
                    damaged.append(candidate)
                    continue
                self._set_floor(damaged)
                self._install(loaded)
                return candidate
            if vanished is None:
                break
            listed = self._storage.checkpoints()
        if vanished is not None:
            raise SequencerError(
                f"{self.url}: checkpoint {vanished.path} vanished while read, "
                f"{CHECKPOINT_LISTINGS} times (deleted as superseded); try again"
            )
        self._set_floor(damaged)
        return None

    def _set_floor(self, damaged: list[CheckpointName]) -> None:
        with self._lock:
            for c in damaged:
                if c.entry > self._replica.tail and (
                    self._floor is None or c.entry > self._floor.entry
                ):
                    self._floor = c

    def _install(self, loaded: _Replica) -> None:
        with self._lock:
            if loaded.tail <= self._replica.tail:  # a writer of ours got further meanwhile
                return
            self._replica = loaded
            if self._floor is not None and loaded.tail >= self._floor.entry:
                self._floor = None
            for entry_id in [i for i in self._awaiting if i in loaded.recent]:
                self._outcome_lost(self._awaiting.pop(entry_id))

    def _decode_checkpoint(
        self, data: bytes, checkpoint: CheckpointName, *, deferred: bool = True
    ) -> _Replica:
        """The replica a checkpoint holds. ``deferred``: each stream's rows are checked
        when first used (see :mod:`.objectstore_format`), not all of them now."""
        with _collector_paused():
            content = decode_checkpoint(data, checkpoint.entry, checkpoint.path, deferred=deferred)
            try:
                state = MemorySequencer.from_snapshot(
                    content.state,
                    clock=self._state_clock,
                    missing_ms=checkpoint.millis,
                    rows_check=content.rows_check,
                )
            except Exception as exc:  # the shape was checked: this is the last line of defence
                raise CorruptDataError(
                    f"the state does not load ({exc!r})", source=checkpoint.path
                ) from None
        recent = collections.OrderedDict((entry_id, None) for entry_id in content.recent)
        return _Replica(state, checkpoint.entry, recent, content.chain)

    def _write_checkpoint(
        self, entry: int, snapshot: dict[str, Any], recent: list[bytes], digest: bytes
    ) -> None:
        """Store the state as of ``entry``; then start deleting (in the background) what a
        checkpoint older than the retention period supersedes. Failures only cost a
        longer replay later."""
        try:
            self._store_checkpoint(entry, snapshot, recent, digest)
        except (OSError, TimeoutError):
            log.warning(
                "%s: could not write the checkpoint of entry %d", self.url, entry, exc_info=True
            )
            return
        if time.monotonic() - self._last_cleanup > self._fresh_window:
            self._last_cleanup = time.monotonic()
            self._clean_up_in_background()

    def _clean_up_in_background(self) -> None:
        """:meth:`delete_superseded`, decided now and done in a thread of its own, one
        at a time: a busy log supersedes hundreds of thousands of entries at once (a
        retention period's worth), and the commit that wrote the checkpoint, with its
        caller, must not wait while they are deleted one by one. What goes is decided
        here (the time and the checkpoints listed: one short LIST), as if it ran here;
        the thread only reads back the superseding checkpoint, lists the entries and
        deletes."""
        with self._cleaner_lock:
            if self._closed or (self._cleaner is not None and self._cleaner.is_alive()):
                return
            cutoff = self._clock()
            try:
                checkpoints = self._storage.checkpoints()
            except DisklessLogError:
                log.warning("%s: could not list the checkpoints", self.url, exc_info=True)
                return
            self._cleaner = threading.Thread(
                target=self._clean_up,
                args=(cutoff, checkpoints),
                name=f"disklesslog-sequencer-cleanup {self.url}",
                daemon=True,
            )
            self._cleaner.start()

    def _clean_up(self, now: float, checkpoints: list[CheckpointName]) -> None:
        try:
            self._delete(self._superseded(now, checkpoints))
        except Exception:  # only costs storage until the next clean-up
            log.warning("%s: could not delete superseded entries", self.url, exc_info=True)

    def _store_checkpoint(
        self, entry: int, snapshot: dict[str, Any], recent: list[bytes], digest: bytes
    ) -> str:
        data = encode_checkpoint(entry, snapshot, recent, digest, self._zstd_level)
        path = self._storage.checkpoint_path(entry, int(self._clock() * 1000))
        self._storage.create(path, data)
        return path

    def delete_superseded(self) -> int:
        """Delete entries and checkpoints that a checkpoint older than
        ``entry_retention_seconds`` supersedes, and the checkpoints between it and the
        newest :data:`NEWEST_CHECKPOINTS_KEPT`; returns how many objects went. Runs on
        its own after checkpoints; safe to call from any process at any time. Waits for
        a clean-up running after a checkpoint to finish first."""
        self._wait_for_clean_up()
        return self._delete(self._superseded())

    def _wait_for_clean_up(self) -> None:
        with self._cleaner_lock:
            cleaner = self._cleaner
        if cleaner is not None and cleaner is not threading.current_thread():
            cleaner.join()

    def _delete(self, doomed: list[str]) -> int:
        """Delete ``doomed`` in chunks of :data:`DELETE_CHUNK`, stopping between chunks
        once the sequencer is closed (what is left is still superseded: the next
        clean-up deletes it)."""
        deleted = 0
        for start in range(0, len(doomed), DELETE_CHUNK):
            if self._closed:
                break
            chunk = doomed[start : start + DELETE_CHUNK]
            self._storage.delete(chunk)
            deleted += len(chunk)
        return deleted

    def _superseded(
        self, now: float | None = None, listed: list[CheckpointName] | None = None
    ) -> list[str]:
        """The entries and checkpoints a checkpoint older than ``entry_retention_seconds``
        supersedes, and the checkpoints between it and the newest ones (but the oldest
        younger than the retention, the next to supersede: :data:`NEWEST_CHECKPOINTS_KEPT`).
        The superseding checkpoint is read back and verified first (its CRC; a version 1 one decoded
        whole): the entries it supersedes are the only other route to its state, so they
        stay while it is damaged, and an older intact one is used. A checkpoint between
        is never a route: the entries after the superseding one (or all entries, before
        there is one) stay, and a replica that finds the one it chose gone lists again.
        ``now`` and ``listed``: the time and the checkpoints, when decided earlier."""
        cutoff = ((self._clock() if now is None else now) - self._retention) * 1000
        checkpoints = self._storage.checkpoints() if listed is None else listed
        keep = None
        for candidate in reversed([c for c in checkpoints if c.millis <= cutoff]):
            data = self._storage.get(candidate.path)
            if data is None:
                continue
            try:
                if data.startswith(CHECKPOINT_MAGIC_V1):
                    decode_checkpoint(data, candidate.entry, candidate.path)
                else:
                    verify_checkpoint(data, candidate.entry, candidate.path)
            except CorruptDataError as exc:
                log.warning(
                    "%s: checkpoint %s is damaged (%s)", self.url, candidate.path, exc.reason
                )
                continue
            keep = candidate
            break
        kept = {c.entry for c in checkpoints[-NEWEST_CHECKPOINTS_KEPT:]}
        young = [c for c in checkpoints if c.millis > cutoff]
        if young:  # the next to supersede: it must live to age past the retention
            kept.add(young[0].entry)
        floor = -1 if keep is None else keep.entry
        doomed = [
            c.path
            for c in checkpoints
            if c.entry < floor or (c.entry > floor and c.entry not in kept)
        ]
        if keep is not None:
            numbers = self._storage.entry_numbers()
            doomed += map(self._path, numbers[: bisect.bisect_right(numbers, floor)])
        return doomed

    def housekeeping(self, *, dry_run: bool = False) -> list[str]:
        """:meth:`delete_superseded` (which checkpoints also run now and then): entries
        and checkpoints go as soon as a checkpoint older than the retention supersedes
        them, even while nothing is committed."""
        self._check_open()
        count = len(self._superseded()) if dry_run else self.delete_superseded()
        if not count:
            return []
        return [f"deleted {count} superseded sequencer entries and checkpoints"]

    # ---------------------------------------------------------------- repair

    def write_checkpoint(self) -> str:
        """Store this replica's state as a checkpoint now, as of its tail; returns the
        checkpoint's path. Writes even if the log has damage past the tail.

        This is the repair of a damaged entry: a process whose replica applied it (its
        :attr:`tail` is at or past the entry) writes a checkpoint, and every replica
        stopped before the damage loads it instead (``docs/operations.md``)."""
        self._check_open()
        with contextlib.suppress(SequencerDamaged):  # as far as this replica can get
            self._catch_up()
        with self._lock:
            r = self._replica
            entry, snapshot, recent, digest = r.tail, r.state.snapshot(), list(r.recent), r.chain
        path = self._store_checkpoint(entry, snapshot, recent, digest)
        log.info("%s: wrote checkpoint %s on request", self.url, path)
        return path

    def verify(self) -> list[CorruptDataError]:
        """Read every entry and checkpoint in storage and return what is damaged (each
        error's ``source`` names an object, ``reason`` says what is wrong); changes
        nothing. Entries are checked against their neighbours too: each must name the
        chain digest its predecessor (or a checkpoint of the entry before it) leads to."""
        found: list[CorruptDataError] = []
        anchors = {0: CHAIN_START}  # entry -> chain digest after it, from checkpoints
        for c in self._storage.checkpoints():
            data = self._storage.get(c.path)
            if data is None:
                continue
            try:
                anchors[c.entry] = self._decode_checkpoint(data, c, deferred=False).chain
            except CorruptDataError as exc:
                found.append(exc)
        expected: tuple[int, bytes] | None = None  # (number, chain digest after it)
        for number, path in self._storage.entries():
            data = self._storage.get(path)
            if data is None:
                continue
            if (expected is None or expected[0] != number - 1) and number - 1 in anchors:
                expected = (number - 1, anchors[number - 1])
            try:
                entry = decode_entry(data, number, path)
            except CorruptDataError as exc:
                found.append(exc)
                expected = None
                continue
            except SequencerError:  # a newer release's operation: not damage
                expected = None
                continue
            if entry.previous is None:  # version 1: the chain does not move
                if expected is not None and expected[0] == number - 1:
                    expected = (number, expected[1])
                continue
            if expected is not None and expected[0] == number - 1 and entry.previous != expected[1]:
                found.append(
                    CorruptDataError(
                        f"entry {number} does not follow entry {number - 1} (another history)",
                        source=path,
                    )
                )
            expected = (number, chain(entry.previous, data))
        return found

    def discard_entry(self, number: int, reason: str) -> None:
        """Replace damaged entry ``number``, the last of the log, by one that applies
        nothing: the last resort when no process has the entry's state and its bytes
        cannot be restored. Its operations are lost (records a writer saw acknowledged
        among them included), as a torn tail is lost. Every other process using the log
        must be stopped first; one that did apply the entry is stopped by the chain of
        digests instead of silently diverging. ``reason`` is stored in the new entry.

        Refused (:class:`SequencerError`) unless the entry is damaged, no entry follows
        it, no intact checkpoint covers it, and this replica stopped right before it."""
        if type(number) is not int or number < 1:
            raise ConfigError(f"an entry number is an int >= 1, not {number!r}")
        if not isinstance(reason, str) or not reason:
            raise ConfigError("say why the entry is discarded (a non-empty str)")
        self._check_open()
        path = self._path(number)
        data = self._storage.get(path)
        if data is None:
            raise SequencerError(f"{path} does not exist; nothing to discard")
        try:
            decode_entry(data, number, path)
        except CorruptDataError:
            pass
        else:
            raise SequencerError(f"{path} is intact; it is not discarded")
        later = [n for n, _ in self._storage.entries() if n > number]
        if later or self._storage.get(self._path(number + 1)) is not None:
            raise SequencerError(
                f"entries after {number} exist, written by a process that applied it: write "
                "a checkpoint from a process whose tail reached it, or restore its bytes"
            )
        try:
            self._catch_up()
        except SequencerDamaged as exc:
            if exc.source != path:
                raise
        if self._replica.tail != number - 1:
            raise SequencerError(
                f"this process's tail is {self._replica.tail}: entry {number} is not where "
                "it stopped (a checkpoint may cover it: then nothing needs discarding)"
            )
        body = entry_body(secrets.token_bytes(16), float(self._clock()), [["discard", reason]])
        with self._lock:
            void = encode_entry(number, self._replica.chain, body)
        self._storage.replace(path, void)
        log.warning("%s: discarded damaged entry %s: %s", self.url, path, reason)
        self._catch_up()

    # ------------------------------------------------------------- storage

    def _path(self, number: int) -> str:
        return self._storage.entry_path(number)

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self!r} was closed")
        if self._broken is not None:
            raise self._broken


# ------------------------------------------------------------------ operations


def _apply_op(state: MemorySequencer, op: list[Any]) -> tuple[Any, BaseException | None]:
    """Apply one operation to a replica: ``(result, None)`` or ``(None, error)``. A
    rejected operation changes nothing (the memory sequencer validates first)."""
    try:
        return _OPS[op[0]](state, *op[1:]), None
    except DisklessLogError as exc:
        return None, exc


def _rows(batches: Sequence[BatchToCommit]) -> list[list[Any]]:
    """A commit's batches as they are stored in an entry (checked first)."""
    return [
        [
            b.stream,
            b.position,
            b.size,
            b.span,
            b.record_count,
            b.max_timestamp,
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
        ]
        for b in check_batches(batches)
    ]


def _commit(state: MemorySequencer, key: str, rows: list[list[Any]]) -> list[CommitResult]:
    return state.commit(key, [BatchToCommit(*row) for row in rows])


def _commit_transaction(
    state: MemorySequencer, txn: str, objects: list[list[Any]]
) -> TransactionResult:
    return state.commit_transaction(
        txn, [(key, [BatchToCommit(*row) for row in rows]) for key, rows in objects]
    )


def _create_stream(state: MemorySequencer, name: str, config: dict[str, Any]) -> StreamMeta:
    return state.create_stream(name, config)


def _alter_stream(state: MemorySequencer, name: str, changes: dict[str, Any]) -> StreamMeta:
    return state.alter_stream(name, changes)


def _discard(state: MemorySequencer, reason: str) -> None:
    """What replaces an entry an operator discarded (:meth:`ObjectStoreSequencer.discard_entry`):
    nothing is applied; every replay says so."""
    log.warning(
        "a sequencer entry was discarded by an operator (%s): its operations are lost", reason
    )


def _swap_lease(
    state: MemorySequencer,
    name: str,
    serial: int,
    holder: str | None,
    token: int,
    new_serial: int,
    duration_ms: int,
) -> bool:
    return state.swap_lease(name, serial, LeaseRecord(holder, token, new_serial, duration_ms))


def _expire_producers(state: MemorySequencer, older_than_ms: int) -> ProducerExpiry:
    return state.expire_producers(older_than_ms)


def _replace(state: MemorySequencer, stream: str, ids: list[int], news: list[list[Any]]) -> bool:
    return state.replace_batches(stream, ids, [BatchLocation(0, *row) for row in news])


_OPS: dict[str, Callable[..., Any]] = {  # what each operation of objectstore_format.OPERATIONS does
    "commit": _commit,
    "commit_transaction": _commit_transaction,
    "create_stream": _create_stream,
    "alter_stream": _alter_stream,
    "delete_stream": MemorySequencer.delete_stream,
    "init_producer": MemorySequencer.init_producer,
    "record_orphan": MemorySequencer.record_orphan,
    "trim": MemorySequencer.trim,
    "replace_batches": _replace,
    "forget_objects": MemorySequencer.forget_objects,
    "commit_offsets": MemorySequencer.commit_offsets,
    "swap_lease": _swap_lease,
    "drop_lease": MemorySequencer.drop_lease,
    "discard": _discard,
    "expire_producers": _expire_producers,
}


def open_objectstore_sequencer(url: str, *, repair: bool = False) -> ObjectStoreSequencer:
    """``objectstore+PROTOCOL://path`` (e.g. ``objectstore+s3://bucket/log/_sequencer``,
    ``objectstore+file:///data/seq``): a sequencer stored at that fsspec location, with
    credentials from the environment. A log on object storage uses one inside itself by
    default; pass an instance to give storage options of its own. ``repair`` opens a
    damaged one for repair (see :class:`ObjectStoreSequencer`)."""
    scheme, sep, rest = url.partition("://")
    prefix, plus, protocol = scheme.partition("+")
    if not sep or prefix.lower() != "objectstore" or not plus or not protocol:
        raise InvalidURL(
            "an object-store sequencer URL looks like objectstore+s3://bucket/prefix or "
            f"objectstore+file:///path, not {url!r}"
        )
    fs, root = open_filesystem(f"{protocol}://{rest}", None)
    return ObjectStoreSequencer(fs, root, url=url, repair=repair)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a checkpoint is loaded.

    Loading allocates millions of small lists and objects and frees none; with the
    collector running, each allocation threshold reached starts a collection that walks
    them again, which was half the time of opening a wide state (100,000 streams: 11 of
    22 s). Nothing loaded forms a cycle, so pausing loses nothing. At the end what was
    loaded is moved to the oldest generation unwalked (``freeze`` then ``unfreeze``:
    list splices), instead of making the first young collection after the pause walk it
    all (another 0.3 s); objects of other threads allocated meanwhile move with it and
    are collected by the next full collection. The previous setting is restored."""
    with _collector_off():
        try:
            yield
        finally:
            gc.freeze()
            gc.unfreeze()


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a snapshot is taken (and, within
    :func:`_collector_paused`, while a checkpoint loads).

    A snapshot builds a list per row (hundreds of thousands in a busy log's state), all
    alive until it is written: enough new survivors to start full collections, each of
    which walks every object of the process, the replica's millions included. That was
    three quarters of taking a snapshot of 250,000 objects in a process holding
    5,000,000 (0.30 s against 0.08 s), and a quarter of a busy writer's time. The rows
    form no cycles and are freed by reference counting once written. The previous
    setting is restored (with threads pausing at once, it is on again when the one that
    found it on is done)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_LIVE: weakref.WeakSet[ObjectStoreSequencer] = reset_after_fork(
    lambda sequencer: sequencer._forked()
)
