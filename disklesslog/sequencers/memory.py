"""The in-process sequencer: dicts and sorted maps behind one lock.

``memory://NAME`` names a process-wide instance (opening the same URL twice gives the
same state, like fsspec's memory filesystem); ``MemorySequencer()`` is a private one.
State dies with the process: this is the sequencer for tests and single-process logs.

The checks and the commit planner it shares with the SQL sequencers live in
:mod:`disklesslog.sequencers.common`.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedDict

from ..errors import (
    ConfigError,
    InvalidURL,
    StreamNotFound,
)
from ..forks import fork_safe_lock
from ..leases import (
    LeaseRecord,
    check_lease_record,
    check_lease_serial,
    raised_floor,
    starts_above_floor,
)
from ..names import validate_group_name, validate_lease_name, validate_stream_name
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
from .object_table import ObjectState, ObjectTable
from .producers import ProducerStreamState

__all__ = ["MemorySequencer", "open_memory_sequencer", "reset_memory_sequencers"]

from .common import (
    TIME_INDEX_INTERVAL,
    TRACKED_TRANSACTIONS,
    Clock,
    CommitPlan,
    StreamCursor,
    already_known,
    check_batches,
    check_expiry_age,
    check_keys,
    check_new_batches,
    check_object_key,
    check_offsets,
    check_old_ids,
    check_position,
    check_transaction,
    clock_ms,
    config_copy,
    merged_config,
    not_contiguous,
    out_of_range,
    plan_commit,
    time_index_repair,
    transaction_cutoff,
    transaction_ranges,
)

# --------------------------------------------------------------------------- memory


RowsCheck = Callable[[str, list[Any], list[Any], list[Any]], None]
"""Checks a stream's snapshot rows (name, batches, time index, producer states) before
anything uses them: raises if they are not of the shape :meth:`MemorySequencer.snapshot`
gives (see :meth:`MemorySequencer.from_snapshot`)."""


@dataclass(eq=False, slots=True)  # identity hash: streams key producer states in a commit
class _Stream:
    """One stream of the state. A stream loaded from a snapshot keeps its batches, time
    index and producer states as the snapshot's rows until something first needs them:
    building two sorted maps and the states per stream is most of what loading a wide
    state would cost (about 40 us a map, seconds for 100,000 streams), and most streams
    of a wide log are never touched by a process that opens it. Rows that came with a
    :data:`RowsCheck` pass it before their first use, whatever the use (loading them, or
    :meth:`MemorySequencer.snapshot` writing them back as they came)."""

    id: int
    name: str
    config: str
    """JSON text (see :func:`config_copy`); every reader gets its own dict."""
    start: int = 0
    end: int = 0
    max_timestamp: int | None = None
    unindexed: int = 0
    batch_rows: list[list[Any]] | None = None
    """Snapshot rows of the live batches, until :attr:`batches` is first used."""
    index_rows: list[list[int]] | None = None
    """Snapshot rows of the time index, until :attr:`time_index` is first used."""
    producer_rows: list[list[Any]] | None = None
    """Snapshot rows of the producer states, until :attr:`producers` is first used."""
    rows_written_ms: int = 0
    """The write time of producer rows stored before states had one."""
    rows_check: RowsCheck | None = None
    """Not yet passed by the rows (see :meth:`_checked`)."""
    loaded_batches: Any = None
    loaded_index: Any = None
    loaded_producers: dict[int, ProducerStreamState] | None = None
    batch_ids: dict[int, int] | None = None
    """batch id -> base offset of the live batches, built the first time a batch is
    looked up by id (merging does): most streams never are."""

    def _checked(self) -> None:
        """Pass the snapshot rows through their check, once, before any use. A failed
        check raises every time (the rows stay unused), never only the first time."""
        if self.rows_check is not None:
            self.rows_check(
                self.name, self.batch_rows or [], self.index_rows or [], self.producer_rows or []
            )
            self.rows_check = None

    @property
    def producers(self) -> dict[int, ProducerStreamState]:
        """producer id -> its state on this stream."""
        if self.loaded_producers is None:
            self._checked()
            missing = self.rows_written_ms
            self.loaded_producers = {
                pid: ProducerStreamState(
                    epoch, tuple(map(tuple, tracked)), written[0] if written else missing
                )
                for pid, epoch, tracked, *written in self.producer_rows or ()
            }
            self.producer_rows = None
        return self.loaded_producers

    @property
    def batches(self) -> Any:
        """base offset -> BatchLocation, live batches only (a SortedDict)."""
        if self.loaded_batches is None:
            self._checked()
            rows = self.batch_rows or ()
            self.loaded_batches = SortedDict((row[4], BatchLocation(*row)) for row in rows)
            self.batch_rows = None
        return self.loaded_batches

    @property
    def time_index(self) -> Any:
        """running max timestamp -> next offset (see :func:`plan_commit`; a SortedDict)."""
        if self.loaded_index is None:
            self._checked()
            self.loaded_index = SortedDict(self.index_rows or ())
            self.index_rows = None
        return self.loaded_index

    def add_batch(self, loc: BatchLocation) -> None:
        """Make ``loc`` a live batch of this stream."""
        self.batches[loc.base_offset] = loc
        if self.batch_ids is not None:
            self.batch_ids[loc.batch_id] = loc.base_offset

    def forget_batch_id(self, batch_id: int) -> None:
        """The batch ``batch_id``, removed from :attr:`batches`, is no longer live."""
        if self.batch_ids is not None:
            del self.batch_ids[batch_id]

    def base_of(self, batch_id: int) -> int | None:
        """The base offset of this stream's live batch ``batch_id``, or None."""
        if self.batch_ids is None:
            self.batch_ids = {b.batch_id: base for base, b in self.batches.items()}
        return self.batch_ids.get(batch_id)

    def batch_snapshot(self) -> list[list[Any]]:
        """The live batches as snapshot rows (the loaded rows themselves if unused)."""
        if self.loaded_batches is None:
            self._checked()
            return self.batch_rows or []
        return [
            [
                b.batch_id,
                b.object_key,
                b.position,
                b.size,
                b.base_offset,
                b.last_offset,
                b.max_timestamp,
            ]
            for b in self.loaded_batches.values()
        ]

    def producer_snapshot(self) -> list[list[Any]]:
        """The producer states as snapshot rows, by producer id (the loaded rows
        themselves if unused and all have their time)."""
        if self.loaded_producers is None:
            self._checked()
            rows = self.producer_rows or []
            if all(len(row) == 4 for row in rows):
                return rows
            return [[*row, self.rows_written_ms] if len(row) == 3 else row for row in rows]
        return [
            [pid, st.epoch, [list(b) for b in st.batches], st.written_ms]
            for pid, st in sorted(self.loaded_producers.items())
        ]

    def index_snapshot(self) -> list[list[int]]:
        """The time index as snapshot rows (the loaded rows themselves if unused)."""
        if self.loaded_index is None:
            self._checked()
            return self.index_rows or []
        return [[ts, offset] for ts, offset in self.loaded_index.items()]


_INSTANCES: dict[str, MemorySequencer] = {}
_INSTANCES_LOCK = fork_safe_lock()


def open_memory_sequencer(url: str) -> MemorySequencer:
    """The process-wide sequencer named by ``memory://NAME`` (``memory://``: name "")."""
    scheme, sep, name = url.partition("://")
    if not sep or scheme.lower() != "memory":
        raise InvalidURL(f"a memory sequencer URL looks like memory://NAME, not {url!r}")
    with _INSTANCES_LOCK:
        instance = _INSTANCES.get(name)
        if instance is None:
            instance = _INSTANCES[name] = MemorySequencer(name=name)
        return instance


def reset_memory_sequencers() -> None:
    """Forget every named memory sequencer (test isolation: the next open starts empty)."""
    with _INSTANCES_LOCK:
        _INSTANCES.clear()


class MemorySequencer(Sequencer):
    """A sequencer in this process's memory. Thread-safe (one lock); commits are
    validated on a copy of the touched state and applied only if every batch passes.

    ``find_batches`` is a binary search plus the page; ``offset_for_time`` a binary
    search of a time index plus a scan that is short unless timestamps go backwards
    or the batch that set a late timestamp was trimmed. ``close()`` does nothing: a
    named instance is shared by everyone who opened its URL.
    """

    def __init__(self, *, name: str | None = None, clock: Clock = time.time) -> None:
        self.url = "" if name is None else f"memory://{name}"
        self._clock = clock
        if clock is not time.time:  # an injected clock measures leases too
            self.lease_clock = clock
        self._lock = fork_safe_lock()
        self._streams: dict[str, _Stream] = {}
        self._next_stream_id = 1
        self._producers: dict[int, int] = {}  # id -> epoch
        # id -> ms of its last use as far as its states no longer tell: init_producer,
        # and the last write of every state dropped (see expire_producers)
        self._producer_used: dict[int, int] = {}
        self._producer_names: dict[str, int] = {}
        self._next_producer_id = 1
        self._next_batch_id = 1
        self._live_batches = 0  # of all streams
        self._objects = ObjectTable()
        self._groups: dict[str, dict[str, int]] = {}
        # transaction id -> (commit time, ranges), oldest first (see _forget_transactions)
        self._transactions: OrderedDict[str, tuple[float, dict[str, tuple[int, int]]]] = (
            OrderedDict()
        )
        self._lease_records: dict[str, LeaseRecord] = {}
        self._lease_floor = 0  # the greatest token or serial of a dropped lease record

    def __repr__(self) -> str:
        return f"MemorySequencer({self.url or '<private>'})"

    # ----------------------------------------------------------------- streams

    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _, stored = config_copy(config)
        with self._lock:
            stream = self._streams.get(name)
            if stream is None:
                stream = _Stream(self._next_stream_id, name, stored)
                self._next_stream_id += 1
                self._streams[name] = stream
            return _meta(stream)

    def alter_stream(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        config_copy(changes)  # checked before anything changes
        with self._lock:
            stream = self._stream(name)
            stream.config = merged_config(stream.config, changes)
            return _meta(stream)

    def delete_stream(self, name: str) -> None:
        with self._lock:
            stream = self._stream(name)
            self._keep_use(stream.producers)
            self._live_batches -= len(stream.batches)
            for loc in stream.batches.values():
                self._release(loc.object_key)
            del self._streams[name]
            for offsets in self._groups.values():
                offsets.pop(name, None)

    def list_streams(self) -> list[str]:
        with self._lock:
            return sorted(self._streams)

    def stream_info(self, name: str) -> StreamMeta:
        with self._lock:
            return _meta(self._stream(name))

    # --------------------------------------------------------------- producers

    def init_producer(self, name: str | None = None) -> tuple[int, int]:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"a producer name must be a non-empty str or None, not {name!r}")
        with self._lock:
            producer_id = None if name is None else self._producer_names.get(name)
            if producer_id is None:
                producer_id = self._next_producer_id  # never issued again, even if dropped
                self._next_producer_id += 1
                self._producers[producer_id] = 0
                if name is not None:
                    self._producer_names[name] = producer_id
            else:
                self._producers[producer_id] += 1
            used = self._producer_used.get(producer_id, 0)
            self._producer_used[producer_id] = max(used, clock_ms(self._clock))
            return producer_id, self._producers[producer_id]

    def expire_producers(self, older_than_ms: int, *, dry_run: bool = False) -> ProducerExpiry:
        """States and producers are scanned whole (the state is in memory): a
        maintenance pass's cost, once a minute at most."""
        check_expiry_age(older_than_ms)
        with self._lock:
            cutoff = clock_ms(self._clock) - older_than_ms
            states = [
                (stream, pid)
                for stream in self._streams.values()
                for pid, state in stream.producers.items()
                if state.written_ms < cutoff
            ]
            left = {
                pid
                for stream in self._streams.values()
                for pid, state in stream.producers.items()
                if state.written_ms >= cutoff
            }
            written: dict[int, int] = {}
            for stream, pid in states:
                written[pid] = max(written.get(pid, 0), stream.producers[pid].written_ms)
            producers = [
                pid
                for pid in self._producers
                if pid not in left
                and max(self._producer_used.get(pid, 0), written.get(pid, 0)) < cutoff
            ]
            if not dry_run:
                for stream, pid in states:
                    self._keep_use({pid: stream.producers.pop(pid)})
                doomed = set(producers)
                for pid in producers:
                    del self._producers[pid]
                    self._producer_used.pop(pid, None)
                for name in [n for n, pid in self._producer_names.items() if pid in doomed]:
                    del self._producer_names[name]
            return ProducerExpiry(states=len(states), producers=len(producers))

    def _keep_use(self, states: Mapping[int, ProducerStreamState]) -> None:
        """States about to go (their stream deleted, or expired): their producers' last
        use keeps their last writes, so a producer is never taken for idle while it
        wrote within the window."""
        used = self._producer_used
        for pid, state in states.items():
            if pid in self._producers and state.written_ms > used.get(pid, 0):
                used[pid] = state.written_ms

    # ----------------------------------------------------------------- commits

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        check_object_key(object_key)
        batches = check_batches(batches)
        with self._lock:
            plan = self._plan(batches)
            self._apply(object_key, plan)
            return plan.results

    def _plan(self, batches: Sequence[BatchToCommit]) -> CommitPlan:
        cursors: dict[str, StreamCursor] = {}
        states: dict[tuple[Hashable, int], ProducerStreamState] = {}
        for b in batches:
            stream = self._streams.get(b.stream)
            if stream is None:
                continue
            if b.stream not in cursors:
                cursors[b.stream] = StreamCursor(
                    stream, stream.end, stream.max_timestamp, stream.unindexed
                )
            state = stream.producers.get(b.producer_id)
            if state is not None:
                states[(stream, b.producer_id)] = state
        return plan_commit(
            batches, cursors, self._producers, states, TIME_INDEX_INTERVAL, clock_ms(self._clock)
        )

    def _apply(self, object_key: str, plan: CommitPlan) -> None:
        """Store a plan. Cannot fail: every check ran in :meth:`_plan`."""
        self._store_batches(object_key, plan.accepted)
        self._move_streams(plan)

    def _store_batches(
        self, object_key: str, accepted: Sequence[tuple[StreamCursor, BatchToCommit, int]]
    ) -> None:
        """Add one object's accepted batches (its part of a plan)."""
        self._acquire(object_key, len(accepted))
        for cursor, b, base in accepted:
            stream: _Stream = cursor.key  # type: ignore[assignment]
            loc = BatchLocation(
                self._new_batch_id(),
                object_key,
                b.position,
                b.size,
                base,
                base + b.span - 1,
                b.max_timestamp,
            )
            stream.add_batch(loc)
        self._live_batches += len(accepted)

    def _move_streams(self, plan: CommitPlan) -> None:
        """Apply a plan's new extents, time-index entries and producer states."""
        for cursor, running_max, next_offset in plan.time_index:
            cursor.key.time_index[running_max] = next_offset  # type: ignore[attr-defined]
        for cursor in {id(c): c for c, _, _ in plan.accepted}.values():
            stream: _Stream = cursor.key  # type: ignore[assignment]
            stream.end = cursor.end
            stream.max_timestamp = cursor.max_timestamp
            stream.unindexed = cursor.unindexed
        for (stream_key, producer_id), state in plan.states.items():
            stream_key.producers[producer_id] = state  # type: ignore[attr-defined]

    def commit_transaction(
        self, transaction_id: str, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> TransactionResult:
        """Plan every object's batches as one commit, then store them object by object
        under the same lock hold: all or nothing. Ids are kept in commit order, so the
        oldest go first when a bound is reached (and every replica of the object-store
        sequencer forgets the same ones)."""
        txn, checked, flat = check_transaction(transaction_id, objects)
        with self._lock:
            now = self._clock()
            self._forget_transactions(now)
            known = self._transactions.get(txn)
            if known is not None:
                for key, _ in checked:
                    if key not in self._objects:
                        self._objects.add(key, ObjectState(0, now))
                return TransactionResult(txn, dict(known[1]), duplicate=True)
            known_keys = [key for key, _ in checked if key in self._objects]
            if known_keys:
                raise already_known(txn, known_keys)
            plan = self._plan(flat)
            start = 0
            for key, batches in checked:  # no producers: one accepted entry per batch
                self._store_batches(key, plan.accepted[start : start + len(batches)])
                start += len(batches)
            self._move_streams(plan)
            ranges = transaction_ranges(plan)
            self._transactions[txn] = (now, ranges)
            self._forget_transactions(now)
            return TransactionResult(txn, dict(ranges))

    def _forget_transactions(self, now: float) -> None:
        """Drop ids past either bound (:data:`TRACKED_TRANSACTIONS`, the age limit)."""
        cutoff = transaction_cutoff(now)
        ids = self._transactions
        while ids and (len(ids) > TRACKED_TRANSACTIONS or next(iter(ids.values()))[0] < cutoff):
            ids.popitem(last=False)

    def transactions(self) -> list[str]:
        """The remembered transaction ids, oldest first (for tests and operators)."""
        with self._lock:
            return list(self._transactions)

    def record_orphan(self, object_key: str) -> None:
        check_object_key(object_key)
        with self._lock:
            if object_key not in self._objects:
                self._objects.add(object_key, ObjectState(0, self._clock()))

    # ------------------------------------------------------------------- reads

    def find_batches(self, stream: str, offset: int, max_bytes: int) -> BatchPage:
        check_position(offset, "offset")
        check_position(max_bytes, "max_bytes")
        with self._lock:
            s = self._stream(stream)
            if not s.start <= offset <= s.end:
                raise out_of_range(stream, offset, s.start, s.end)
            found: list[BatchLocation] = []
            total = 0
            for loc in _batches_from(s, offset):
                if found and total + loc.size > max_bytes:
                    break
                found.append(loc)
                total += loc.size
            return BatchPage(found, s.start, s.end)

    def offset_for_time(self, stream: str, timestamp: int) -> int | None:
        check_position(timestamp, "timestamp")  # any int: timestamps may be negative
        with self._lock:
            s = self._stream(stream)
            lower = s.start
            entry = s.time_index.bisect_left(timestamp) - 1  # last entry with max < ts
            if entry >= 0:
                lower = max(lower, s.time_index.peekitem(entry)[1])
            for loc in _batches_from(s, lower):
                if loc.max_timestamp >= timestamp:
                    return max(loc.base_offset, s.start)
            return None

    # -------------------------------------------------------------- maintenance

    def trim(self, stream: str, before: int) -> None:
        check_position(before, "before")
        with self._lock:
            s = self._stream(stream)
            if before > s.end:
                raise out_of_range(stream, before, s.start, s.end)
            if before <= s.start:
                return
            s.start = before
            while s.batches and s.batches.peekitem(0)[1].last_offset < before:
                _, loc = s.batches.popitem(0)
                s.forget_batch_id(loc.batch_id)
                self._live_batches -= 1
                self._release(loc.object_key)
            while s.time_index and s.time_index.peekitem(0)[1] <= before:
                s.time_index.popitem(0)

    def replace_batches(
        self, stream: str, old_batch_ids: Sequence[int], new_batches: Sequence[BatchLocation]
    ) -> bool:
        ids = check_old_ids(old_batch_ids)
        news = list(new_batches)
        with self._lock:
            s = self._stream(stream)
            olds = []
            for batch_id in ids:
                base = s.base_of(batch_id)
                if base is None:
                    return False
                olds.append(s.batches[base])
            olds.sort(key=lambda b: b.base_offset)
            first = s.batches.index(olds[0].base_offset)
            if s.batches.index(olds[-1].base_offset) - first != len(olds) - 1:
                raise not_contiguous(stream)
            check_new_batches(stream, olds, news)
            for loc in olds:
                del s.batches[loc.base_offset]
                s.forget_batch_id(loc.batch_id)
                self._live_batches -= 1
                self._release(loc.object_key)
            for b in news:
                self._add_replacement(s, b)
            _repair_time_index(s, news)
            return True

    def _add_replacement(self, s: _Stream, b: BatchLocation) -> None:
        loc = BatchLocation(
            self._new_batch_id(),
            b.object_key,
            b.position,
            b.size,
            b.base_offset,
            b.last_offset,
            b.max_timestamp,
        )
        s.add_batch(loc)
        self._live_batches += 1
        self._acquire(loc.object_key, 1)

    def objects_to_delete(self, grace_seconds: float) -> list[str]:
        with self._lock:
            cutoff = self._clock() - grace_seconds
            dead = [
                (o.dead_since, key)
                for key, o in self._objects.items()
                if o.dead_since is not None and o.dead_since <= cutoff
            ]
            return [key for _, key in sorted(dead)]

    def forget_objects(self, object_keys: Sequence[str]) -> None:
        with self._lock:
            for key in check_keys(object_keys):
                o = self._objects.get(key)
                if o is not None and o.live == 0:
                    self._objects.remove(key)

    def list_objects(self) -> list[str]:
        with self._lock:
            return sorted(self._objects.keys())

    # ---------------------------------------------------------- consumer groups

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        checked = check_offsets(group, offsets)
        with self._lock:
            self._groups.setdefault(group, {}).update(checked)

    def committed_offsets(self, group: str) -> dict[str, int]:
        validate_group_name(group)
        with self._lock:
            return dict(self._groups.get(group, {}))

    def list_groups(self) -> list[str]:
        with self._lock:
            return sorted(group for group, offsets in self._groups.items() if offsets)

    # ------------------------------------------------------------------ leases

    def read_lease(self, name: str) -> LeaseRecord | None:
        validate_lease_name(name)
        with self._lock:
            return self._lease_records.get(name)

    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        validate_lease_name(name)
        check_lease_record(serial, record)
        with self._lock:
            current = self._lease_records.get(name)
            if (0 if current is None else current.serial) != serial:
                return False
            if current is None and not starts_above_floor(record, self._lease_floor):
                return False
            self._lease_records[name] = record
            return True

    def drop_lease(self, name: str, serial: int) -> bool:
        validate_lease_name(name)
        check_lease_serial(serial)
        with self._lock:
            current = self._lease_records.get(name)
            if current is None or current.serial != serial:
                return False
            self._lease_floor = raised_floor(self._lease_floor, current)
            del self._lease_records[name]
            return True

    def lease_names(self) -> list[str]:
        with self._lock:
            return sorted(self._lease_records)

    def lease_floor(self) -> int:
        with self._lock:
            return self._lease_floor

    # ---------------------------------------------------------------- snapshots

    def live_batches(self) -> int:
        """How many live batches all streams hold."""
        with self._lock:
            return self._live_batches

    def snapshot_rows(self) -> int:
        """How many rows a snapshot holds, near enough (live batches, objects, streams and
        producers; what writing one costs). Objects count as much as batches: dead ones
        stay until garbage collection's grace has passed, so at a high commit rate a
        state can hold many more objects than live batches."""
        with self._lock:
            return (
                self._live_batches + len(self._objects) + len(self._streams) + len(self._producers)
            )

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain lists, ints and strings (msgpack- and JSON-ready).

        The object-store sequencer checkpoints a replica with this, and tests compare
        two replicas with it: equal snapshots mean equal state, because every part is
        listed in a canonical (sorted) order.
        """
        with self._lock:
            streams = [
                [
                    s.id,
                    s.name,
                    s.config,
                    s.start,
                    s.end,
                    s.max_timestamp,
                    s.unindexed,
                    s.batch_snapshot(),
                    s.index_snapshot(),
                    s.producer_snapshot(),
                ]
                for s in sorted(self._streams.values(), key=lambda s: s.name)
            ]
            return {
                "streams": streams,
                "next_stream_id": self._next_stream_id,
                "producers": sorted(
                    [pid, epoch, self._producer_used.get(pid, 0)]
                    for pid, epoch in self._producers.items()
                ),
                "producer_names": sorted([n, pid] for n, pid in self._producer_names.items()),
                "next_producer_id": self._next_producer_id,
                "next_batch_id": self._next_batch_id,
                "objects": self._objects.rows(),
                "groups": sorted(
                    [g, sorted([s, off] for s, off in offsets.items())]
                    for g, offsets in self._groups.items()
                ),
                # commit order, not sorted: it decides which ids the count bound drops
                "transactions": [
                    [txn, at, [[name, first, end] for name, (first, end) in ranges.items()]]
                    for txn, (at, ranges) in self._transactions.items()
                ],
                "leases": sorted(
                    [name, r.holder, r.token, r.serial, r.duration_ms]
                    for name, r in self._lease_records.items()
                ),
                "lease_floor": self._lease_floor,
            }

    @classmethod
    def from_snapshot(
        cls,
        snapshot: Mapping[str, Any],
        *,
        clock: Clock = time.time,
        missing_ms: int = 0,
        rows_check: RowsCheck | None = None,
    ) -> MemorySequencer:
        """A private sequencer holding the state :meth:`snapshot` returned. A snapshot
        taken before producers had times (rows ``[pid, epoch]`` and ``[pid, epoch,
        runs]``) gives them ``missing_ms``: a checkpoint's own time, so nothing in it
        counts as idle before the window has passed since it was written.

        ``rows_check``: the snapshot's per-stream rows (batches, time index, producer
        states: most of a wide state) have not been checked yet; each stream's pass this
        check before their first use (an exception from it is what that use raises).
        Without it they must already be of the right shape. The rest of the snapshot
        always must be."""
        seq = cls(clock=clock)
        configs: dict[str, str] = {}  # one copy of each distinct config text, not one a stream
        live = 0
        for row in snapshot["streams"]:
            sid, name, config, start, end, max_ts, unindexed, batches, index, producers = row
            config = configs.setdefault(config, config)
            stream = _Stream(sid, name, config, start, end, max_ts, unindexed)
            if batches:
                stream.batch_rows = batches
                live += len(batches)
            if index:
                stream.index_rows = index
            if producers:
                stream.producer_rows = producers
                stream.rows_written_ms = missing_ms
            if rows_check is not None and (batches or index or producers):
                stream.rows_check = rows_check
            seq._streams[name] = stream
        seq._live_batches = live
        seq._next_stream_id = snapshot["next_stream_id"]
        for pid, epoch, *used in snapshot["producers"]:
            seq._producers[pid] = epoch
            seq._producer_used[pid] = used[0] if used else missing_ms
        seq._producer_names = dict(snapshot["producer_names"])
        seq._next_producer_id = snapshot["next_producer_id"]
        seq._next_batch_id = snapshot["next_batch_id"]
        seq._objects = ObjectTable(snapshot["objects"])
        seq._groups = {g: dict(offsets) for g, offsets in snapshot["groups"]}
        for txn, at, ranges in snapshot.get("transactions", ()):  # absent before transactions
            seq._transactions[txn] = (at, {name: (first, end) for name, first, end in ranges})
        for name, *fields in snapshot.get("leases", ()):  # absent before leases
            seq._lease_records[name] = LeaseRecord(*fields)
        seq._lease_floor = snapshot.get("lease_floor", 0)  # absent before pruning
        return seq

    # ----------------------------------------------------------------- helpers

    def _new_batch_id(self) -> int:
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        return batch_id

    def _stream(self, name: str) -> _Stream:
        stream = self._streams.get(name)
        if stream is None:
            validate_stream_name(name)
            raise StreamNotFound(f"stream {name!r} does not exist")
        return stream

    def _acquire(self, key: str, batches: int) -> None:
        """Count ``batches`` new live batches in object ``key`` (it stays dead if 0)."""
        o = self._objects.get(key)
        if o is None:
            o = ObjectState(0, None if batches else self._clock())
            self._objects.add(key, o)
        if batches:
            o.live += batches
            o.dead_since = None

    def _release(self, key: str) -> None:
        o = self._objects.get(key)
        if o is None:
            raise KeyError(key)
        o.live -= 1
        if o.live == 0:
            o.dead_since = self._clock()


def _meta(stream: _Stream) -> StreamMeta:
    return StreamMeta(stream.name, stream.start, stream.end, json.loads(stream.config))


def _batches_from(s: _Stream, offset: int) -> Iterable[BatchLocation]:
    """Live batches of ``s`` in offset order, from the first whose last offset is >= offset."""
    batches = s.batches
    i = batches.bisect_right(offset) - 1
    if i < 0 or batches.peekitem(i)[1].last_offset < offset:
        i += 1
    for base in batches.islice(i):
        yield batches[base]


def _repair_time_index(s: _Stream, news: Sequence[BatchLocation]) -> None:
    """See :func:`time_index_repair`."""
    repair = time_index_repair(news)
    if repair is None:
        return
    new_max, low = repair
    stale = []
    for ts in s.time_index.irange(maximum=new_max, inclusive=(True, False), reverse=True):
        if s.time_index[ts] <= low:
            break
        stale.append(ts)
    for ts in stale:
        del s.time_index[ts]
    if s.max_timestamp is None or new_max > s.max_timestamp:
        s.max_timestamp = new_max
