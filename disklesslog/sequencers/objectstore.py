"""The object-store sequencer: a replicated log of sequencer entries, no server at all.

Every process keeps a full replica of the sequencer's state in memory (a
:class:`~disklesslog.sequencers.memory.MemorySequencer`) and changes it only by
applying **entries**, objects named ``<root>/log/<20-digit number>`` in the same bucket
as the data. An entry lists operations (commit, trim, create stream, init producer,
...). Whoever manages to create entry ``n + 1`` with put-if-absent
(:func:`~disklesslog.sequencers.conditional.put_if_absent`) has ordered its operations
after entry ``n``; every replica applies the entries in number order and, because the
state machine is deterministic (the entry carries its own timestamp), reaches the same
state and the same verdict on every operation. This is Delta Lake's ``_delta_log`` and
SlateDB's manifest, used as a Raft-less replicated state machine.

Consequences worth knowing:

* Operations are judged when applied, not before they are written. A fenced or out of
  order commit still takes an entry number, and every replica rejects it the same way.
* Losing the race for a number means: read the entries you missed, apply them, try the
  next number (bounded, with jitter; then :class:`~disklesslog.SequencerConflict`). A
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
  than ``entry_retention_seconds`` are deleted. A replica that has not confirmed its
  tail for a quarter of that time lists the checkpoints before trusting a missing entry,
  so an entry deleted under it can never be mistaken for a free number.
* Reading state never writes: readers fetch the next entry numbers until one is missing.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zstandard

from ..api import validate_stream_name
from ..errors import (
    ConfigError,
    CorruptDataError,
    DisklessLogError,
    InvalidURL,
    LogClosedError,
    SequencerConflict,
    SequencerError,
)
from .base import (
    BatchLocation,
    BatchPage,
    BatchToCommit,
    CommitResult,
    Sequencer,
    StreamMeta,
    TransactionResult,
)
from .common import (
    Clock,
    check_batches,
    check_keys,
    check_object_key,
    check_offsets,
    check_old_ids,
    check_position,
    check_transaction,
    config_copy,
)
from .conditional import put_if_absent
from .memory import MemorySequencer

__all__ = ["ObjectStoreSequencer", "open_objectstore_sequencer"]

log = logging.getLogger(__name__)

ENTRY_MAGIC = b"DLSQE1"
"""First bytes of an entry object (format version 1)."""
CHECKPOINT_MAGIC = b"DLSQC1"
"""First bytes of a checkpoint object (format version 1, zstd-compressed msgpack)."""

MAX_OPS_PER_ENTRY = 512
"""Operations one group commit writes at most (bounds an entry's size)."""
RECENT_ENTRY_IDS = 1024
"""Entry ids remembered to ignore an entry that turns up twice (a delayed retry)."""
CHECKPOINT_BATCHES_PER_ENTRY = 40
"""Live batches a checkpoint may write per entry since the previous one (its cost, spread
over the entries it saves a replay of)."""
PREFETCH = 8
"""Entries fetched at once while catching up (one concurrent request batch)."""

_CHECKPOINT_NAME = re.compile(r"^(\d{20})-(\d{13})$")


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
class _Checkpoint:
    entry: int
    millis: int
    path: str


@dataclass
class _Replica:
    """The state as of entry ``tail``: the memory sequencer plus the ids of recent
    entries (part of the replicated state: every replica ignores the same repeats)."""

    state: MemorySequencer
    tail: int = 0
    recent: collections.OrderedDict[bytes, None] = field(default_factory=collections.OrderedDict)


class ObjectStoreSequencer(Sequencer):
    """A sequencer stored as entries and checkpoints under ``root`` of an fsspec
    filesystem that supports put-if-absent (S3, GCS, Azure, local or NFS disks,
    memory). Thread-safe; any number of processes on any machines may share ``root``.

    ``checkpoint_every``: entries between checkpoints (bounds replay on open).
    ``entry_retention_seconds``: how long entries and checkpoints superseded by a newer
    checkpoint are kept (a grace period for replicas reading them). ``max_attempts``:
    lost races tolerated per write before :class:`SequencerConflict`. ``clock``: the
    wall clock stamped into entries (when objects became garbage).
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
    ) -> None:
        if type(checkpoint_every) is not int or checkpoint_every < 1:
            raise ConfigError("checkpoint_every must be an int >= 1")
        if not isinstance(entry_retention_seconds, (int, float)) or entry_retention_seconds <= 0:
            raise ConfigError("entry_retention_seconds must be a positive number of seconds")
        if type(max_attempts) is not int or max_attempts < 1:
            raise ConfigError("max_attempts must be an int >= 1")
        self._fs = fs
        self._root = root.rstrip("/")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.url = url or f"objectstore+{protocol}://{self._root}"
        self._clock = clock
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
        self._awaiting: dict[bytes, list[_Slot]] = {}
        self._queue: list[_Slot] = []
        self._queue_cond = threading.Condition()
        self._leading = False
        self._last_cleanup = -float("inf")
        self._closed = False
        self._zstd_level = 3
        self._catch_up()

    def __repr__(self) -> str:
        return f"ObjectStoreSequencer({self.url})"

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
            if not isinstance(b, BatchLocation):
                raise SequencerError(f"new batches are BatchLocation items, not {type(b).__name__}")
            news.append(
                [b.object_key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp]
            )
        result: bool = self._submit(["replace_batches", stream, ids, news])
        return result

    def forget_objects(self, object_keys: Sequence[str]) -> None:
        self._submit(["forget_objects", check_keys(object_keys)])

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        self._submit(["commit_offsets", group, check_offsets(group, offsets)])

    def close(self) -> None:
        self._closed = True

    # ---------------------------------------------------------- group commit

    def _submit(self, op: list[Any]) -> Any:
        """Apply ``op`` through the group-commit queue; its result, or raise its error."""
        return self._submit_many([op])[0].result()

    def _submit_many(self, ops: list[list[Any]]) -> list[_Slot]:
        """Queue ``ops`` (together, in order) and wait until all are applied. The first
        waiter that finds nobody writing becomes the leader and writes every queued
        operation as one entry."""
        self._check_open()
        slots = [_Slot(op) for op in ops]
        with self._queue_cond:
            self._queue.extend(slots)
        while True:
            with self._queue_cond:
                while self._leading and not all(s.done for s in slots):
                    self._queue_cond.wait()
                if all(s.done for s in slots):
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

    def _write(self, group: list[_Slot]) -> tuple[int, dict[str, Any], list[bytes]] | None:
        """Write ``group`` as one entry at the next free number and apply it. Returns
        ``(entry, snapshot, recent entry ids)`` when this entry is due a checkpoint."""
        entry_id = secrets.token_bytes(16)
        data = ENTRY_MAGIC + msgpack.packb(
            [entry_id, float(self._clock()), [s.op for s in group]], use_bin_type=True
        )
        decoded = _decode_entry(data, "a new entry")
        with self._lock:
            self._awaiting[entry_id] = group
        try:
            for attempt in range(self._max_attempts):
                if time.monotonic() - self._confirmed > self._fresh_window:
                    self._catch_up()
                with self._lock:
                    number = self._replica.tail + 1
                started = time.monotonic()
                created = self._put_entry(number, data)
                with self._lock:
                    applied = created and self._replica.tail == number - 1
                    if applied:
                        self._confirmed = max(self._confirmed, started)
                        self._apply(number, decoded)
                if not applied:  # lost the race, or a reader applied ours: read what we missed
                    self._catch_up()
                with self._lock:
                    if all(s.done for s in group):
                        due = created and self._checkpoint_due(number)
                        if due and self._replica.tail == number:
                            replica = self._replica
                            return number, replica.state.snapshot(), list(replica.recent)
                        return None
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** min(attempt, 10))))
            raise SequencerConflict(
                f"{self.url}: lost the race for the next sequencer entry "
                f"{self._max_attempts} times to other writers; nothing was applied"
            )
        finally:
            with self._lock:
                self._awaiting.pop(entry_id, None)

    def _checkpoint_due(self, number: int) -> bool:
        """Whether entry ``number`` (just applied) is followed by a checkpoint: every
        ``checkpoint_every`` entries while the state is small; further apart as it grows
        (a power-of-two multiple), so that writing the whole state costs at most about
        :data:`CHECKPOINT_BATCHES_PER_ENTRY` live batches per entry since the last one.
        Every replica decides alike, from the same state, so one process writes it."""
        if number % self._checkpoint_every:
            return False
        live = self._replica.state.live_batches()
        wanted = live // (CHECKPOINT_BATCHES_PER_ENTRY * self._checkpoint_every)
        stride = 1 << max(0, wanted.bit_length() - 1) if wanted else 1
        return (number // self._checkpoint_every) % stride == 0

    def _put_entry(self, number: int, data: bytes) -> bool:
        """Put-if-absent with retries of failures whose outcome is unknown. A retry that
        finds the entry present reports a lost race; the caller's catch-up then reads
        it back and recognises its own entry id if the first attempt had succeeded."""
        path = self._entry_path(number)
        delay = 0.02
        for attempt in range(1, 6):
            try:
                return put_if_absent(self._fs, path, data)
            except DisklessLogError:
                raise
            except Exception as exc:  # clients' own transient errors are not OSErrors
                if attempt == 5:
                    raise OSError(
                        f"{self.url}: could not write sequencer entry {number}: {exc}; the "
                        "operation may or may not have been applied"
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    # -------------------------------------------------------------- replaying

    def _catch_up(self, asked: float | None = None) -> None:
        """Apply every entry after the tail; if the tail was not confirmed recently,
        first load a newer checkpoint if there is one. One thread fetches at a time, and
        a caller that ``asked`` at a monotonic time is content with any catch-up that
        began after it. Entries are fetched without the state lock and applied with it,
        skipping those a writer of this process applied meanwhile."""
        with self._fetch_lock:
            if asked is not None and self._confirmed >= asked:
                return
            started = time.monotonic()
            if started - self._confirmed > self._fresh_window:
                self._load_newest_checkpoint()
            window = 1
            while True:
                number = self._replica.tail + 1
                found = self._get_many(number, window)
                with self._lock:
                    for i, data in enumerate(found):
                        at = number + i
                        if at <= self._replica.tail:  # applied by a writer meanwhile
                            continue
                        if data is None:
                            self._confirmed = max(self._confirmed, started)
                            return
                        self._apply(at, _decode_entry(data, self._entry_path(at)))
                # Behind: fetch more entries at a time while every one of them exists
                # (s3fs, gcsfs and adlfs send the requests of one call concurrently).
                window = min(window * 2, PREFETCH)

    def _apply(self, number: int, entry: tuple[bytes, float, list[Any]]) -> None:
        entry_id, stamp, ops = entry
        replica = self._replica
        if number != replica.tail + 1:
            raise AssertionError(f"entry {number} applied after {replica.tail}")
        unknown = sorted({str(op[0]) for op in ops if not op or op[0] not in _OPS})
        if unknown:  # replaying past it would make this replica differ from newer ones
            raise SequencerError(
                f"{self.url}: entry {number} holds operations this version of disklesslog "
                f"does not know ({', '.join(unknown)}): upgrade disklesslog"
            )
        outcomes: list[tuple[Any, BaseException | None]] = []
        if entry_id not in replica.recent:
            self._replay_time = stamp
            try:
                outcomes = [_apply_op(replica.state, op) for op in ops]
            finally:
                self._replay_time = None
            replica.recent[entry_id] = None
            if len(replica.recent) > RECENT_ENTRY_IDS:
                replica.recent.popitem(last=False)
        replica.tail = number
        slots = self._awaiting.pop(entry_id, None)
        if slots is None:
            return
        if not outcomes:  # our entry was applied before, and its outcome is gone
            self._outcome_lost(slots)
            return
        for slot, (value, error) in zip(slots, outcomes, strict=True):
            slot.value, slot.error, slot.done = value, error, True

    def _outcome_lost(self, slots: list[_Slot]) -> None:
        """Our entry was applied but we could not watch it happen (it came back inside a
        checkpoint, after a lost response and a long stall): the effect stands, the
        result is unknown, as after any lost response."""
        for slot in slots:
            slot.error = OSError(
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

    def _load_newest_checkpoint(self) -> None:
        checkpoints = self._list_checkpoints()
        if not checkpoints or checkpoints[-1].entry <= self._replica.tail:
            return
        newest = checkpoints[-1]
        data = self._get(newest.path)
        if data is None:
            raise SequencerError(f"{self.url}: checkpoint {newest.path} vanished while read")
        loaded = self._decode_checkpoint(data, newest)
        with self._lock:
            if loaded.tail <= self._replica.tail:  # a writer of ours got further meanwhile
                return
            self._replica = loaded
            for entry_id in [i for i in self._awaiting if i in loaded.recent]:
                self._outcome_lost(self._awaiting.pop(entry_id))

    def _write_checkpoint(self, entry: int, snapshot: dict[str, Any], recent: list[bytes]) -> None:
        """Store the state as of ``entry``; then delete what a checkpoint older than the
        retention period supersedes. Failures only cost a longer replay later."""
        millis = int(self._clock() * 1000)
        body = msgpack.packb(
            {"entry": entry, "state": snapshot, "recent": recent}, use_bin_type=True
        )
        data = CHECKPOINT_MAGIC + zstandard.ZstdCompressor(level=self._zstd_level).compress(body)
        path = f"{self._root}/checkpoints/{entry:020d}-{millis:013d}"
        try:
            put_if_absent(self._fs, path, data)
            if time.monotonic() - self._last_cleanup > self._fresh_window:
                self._last_cleanup = time.monotonic()
                self.delete_superseded()
        except (OSError, TimeoutError):
            log.warning("%s: could not write checkpoint %s", self.url, path, exc_info=True)

    def delete_superseded(self) -> int:
        """Delete entries and checkpoints that a checkpoint older than
        ``entry_retention_seconds`` supersedes; returns how many objects went. Runs on
        its own after checkpoints; safe to call from any process at any time."""
        cutoff = (self._clock() - self._retention) * 1000
        checkpoints = self._list_checkpoints()
        old = [c for c in checkpoints if c.millis <= cutoff]
        if not old:
            return 0
        keep = max(old, key=lambda c: c.entry)
        doomed = [c.path for c in checkpoints if c.entry < keep.entry]
        for path in self._ls(f"{self._root}/log"):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if name.isdigit() and len(name) == 20 and int(name) <= keep.entry:
                doomed.append(path)
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):
                self._fs.rm_file(path)
        return len(doomed)

    def _list_checkpoints(self) -> list[_Checkpoint]:
        found = []
        for path in self._ls(f"{self._root}/checkpoints"):
            match = _CHECKPOINT_NAME.match(path.rstrip("/").rsplit("/", 1)[-1])
            if match:
                found.append(_Checkpoint(int(match[1]), int(match[2]), path))
        return sorted(found, key=lambda c: c.entry)

    def _decode_checkpoint(self, data: bytes, checkpoint: _Checkpoint) -> _Replica:
        if not data.startswith(CHECKPOINT_MAGIC):
            raise CorruptDataError(
                f"{checkpoint.path} is not a disklesslog sequencer checkpoint",
                source=checkpoint.path,
            )
        try:
            body = zstandard.ZstdDecompressor().decompress(data[len(CHECKPOINT_MAGIC) :])
            content = msgpack.unpackb(body, raw=False, strict_map_key=False)
            state = MemorySequencer.from_snapshot(content["state"], clock=self._state_clock)
            recent = collections.OrderedDict((bytes(i), None) for i in content["recent"])
            entry = int(content["entry"])
        except (zstandard.ZstdError, ValueError, KeyError, TypeError) as exc:
            raise CorruptDataError(
                f"{checkpoint.path}: damaged sequencer checkpoint ({exc})",
                source=checkpoint.path,
            ) from None
        if entry != checkpoint.entry:
            raise CorruptDataError(f"{checkpoint.path} holds entry {entry}", source=checkpoint.path)
        return _Replica(state, entry, recent)

    # ------------------------------------------------------------- storage

    def _entry_path(self, number: int) -> str:
        return f"{self._root}/log/{number:020d}"

    def _get_many(self, first: int, count: int) -> list[bytes | None]:
        """Entries ``first .. first + count - 1`` (None where missing)."""
        if count == 1:
            return [self._get(self._entry_path(first))]
        paths = [self._entry_path(first + i) for i in range(count)]
        fetched = self._fs.cat(paths, on_error="return")
        found: list[bytes | None] = []
        for path in paths:
            got = fetched.get(path, fetched.get(self._fs._strip_protocol(path)))
            if got is None or isinstance(got, FileNotFoundError):
                found.append(None)
            elif isinstance(got, BaseException):
                raise got
            else:
                found.append(bytes(got))
        return found

    def _get(self, path: str) -> bytes | None:
        try:
            return bytes(self._fs.cat_file(path))
        except FileNotFoundError:
            return None

    def _ls(self, path: str) -> list[str]:
        try:
            names = self._fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return [str(n) for n in names]

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self!r} was closed")


# ------------------------------------------------------------------ operations


def _decode_entry(data: bytes, where: str) -> tuple[bytes, float, list[Any]]:
    if not data.startswith(ENTRY_MAGIC):
        raise CorruptDataError(f"{where} is not a disklesslog sequencer entry", source=where)
    try:
        entry_id, stamp, ops = msgpack.unpackb(
            data[len(ENTRY_MAGIC) :], raw=False, strict_map_key=False
        )
    except (ValueError, TypeError) as exc:
        raise CorruptDataError(f"{where}: damaged sequencer entry ({exc})", source=where) from None
    return bytes(entry_id), float(stamp), list(ops)


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


def _create_stream(state: MemorySequencer, name: str, config: str) -> StreamMeta:
    import json  # noqa: PLC0415 - only on stream creation

    return state.create_stream(name, json.loads(config))


def _alter_stream(state: MemorySequencer, name: str, changes: str) -> StreamMeta:
    import json  # noqa: PLC0415 - only on stream changes

    return state.alter_stream(name, json.loads(changes))


def _replace(state: MemorySequencer, stream: str, ids: list[int], news: list[list[Any]]) -> bool:
    return state.replace_batches(stream, ids, [BatchLocation(0, *row) for row in news])


_OPS: dict[str, Callable[..., Any]] = {
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
}


def open_objectstore_sequencer(url: str) -> ObjectStoreSequencer:
    """``objectstore+PROTOCOL://path`` (e.g. ``objectstore+s3://bucket/log/_sequencer``,
    ``objectstore+file:///data/seq``): a sequencer stored at that fsspec location, with
    credentials from the environment. A log on object storage uses one inside itself by
    default; pass an instance to give storage options of its own."""
    from ..objects.storage import open_filesystem  # noqa: PLC0415 - avoids an import cycle

    scheme, sep, rest = url.partition("://")
    prefix, plus, protocol = scheme.partition("+")
    if not sep or prefix.lower() != "objectstore" or not plus or not protocol:
        raise InvalidURL(
            "an object-store sequencer URL looks like objectstore+s3://bucket/prefix or "
            f"objectstore+file:///path, not {url!r}"
        )
    fs, root = open_filesystem(f"{protocol}://{rest}", None)
    return ObjectStoreSequencer(fs, root, url=url)
