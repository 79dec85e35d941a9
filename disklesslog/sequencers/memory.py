"""The in-process sequencer: dicts and sorted maps behind one lock.

``memory://NAME`` names a process-wide instance (opening the same URL twice gives the
same state, like fsspec's memory filesystem); ``MemorySequencer()`` is a private one.
State dies with the process: this is the sequencer for tests and single-process logs.

This module also holds the pieces every sequencer shares beyond the producer rules
(argument checks, the commit planner, the replacement check), so that the SQL
sequencers apply exactly the same logic to the rows they load.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedDict

from ..api import validate_group_name, validate_stream_name
from ..errors import (
    ConfigError,
    InvalidURL,
    OffsetOutOfRange,
    SequencerError,
    StreamNotFound,
)
from .base import (
    NO_PRODUCER,
    BatchLocation,
    BatchPage,
    BatchToCommit,
    CommitResult,
    Sequencer,
    StreamMeta,
)
from .producers import ProducerStreamState, advance, decide

__all__ = [
    "TIME_INDEX_INTERVAL",
    "Clock",
    "CommitPlan",
    "MemorySequencer",
    "StreamCursor",
    "check_batches",
    "check_keys",
    "check_new_batches",
    "check_object_key",
    "check_offsets",
    "check_old_ids",
    "check_position",
    "config_copy",
    "not_contiguous",
    "open_memory_sequencer",
    "out_of_range",
    "plan_commit",
    "reset_memory_sequencers",
    "time_index_repair",
]

TIME_INDEX_INTERVAL = 16
"""Batches per stream between two time-index entries: bounds offset_for_time's scan
while costing one small entry per 16 batches committed."""

Clock = Callable[[], float]
"""Seconds since the epoch; injectable so tests can move time for garbage collection."""

# --------------------------------------------------------------------------- shared


def check_object_key(key: object) -> str:
    """An object key is a non-empty str: it is how garbage collection finds the object."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"an object key must be a non-empty str, not {key!r}")
    return key


def check_position(value: object, what: str) -> int:
    """An int offset argument (``bool`` is refused: it is a mistake, never an offset)."""
    if type(value) is not int:
        raise ConfigError(f"{what} must be an int, not {type(value).__name__}")
    return value


def check_keys(object_keys: Sequence[str]) -> Sequence[str]:
    """A sequence of object keys (a lone str would be taken apart character by character)."""
    if isinstance(object_keys, str):
        raise ConfigError("pass a list of object keys, not a single str")
    return object_keys


def check_batches(batches: Sequence[BatchToCommit]) -> Sequence[BatchToCommit]:
    """Refuse batch descriptions no writer produces before anything is looked up, so a
    bad one cannot leave a hole or an overlapping offset range behind. Returns them as
    a sequence that can be walked twice."""
    if not isinstance(batches, (list, tuple)):
        batches = list(batches)
    for b in batches:
        if not isinstance(b, BatchToCommit):
            raise SequencerError(f"commit takes BatchToCommit items, not {type(b).__name__}")
        if b.position < 0 or b.size < 0 or b.span < 1 or not 0 <= b.record_count <= b.span:
            raise SequencerError(
                f"malformed batch for stream {b.stream!r}: position={b.position} "
                f"size={b.size} span={b.span} record_count={b.record_count} (need "
                "position >= 0, size >= 0, span >= 1 and 0 <= record_count <= span)"
            )
    return batches


def check_offsets(group: str, offsets: Mapping[str, int]) -> dict[str, int]:
    """Validate a consumer group's offsets; returns a plain dict copy."""
    validate_group_name(group)
    if not isinstance(offsets, Mapping):
        raise ConfigError("offsets must be a mapping of stream name to next offset")
    checked: dict[str, int] = {}
    for name, offset in offsets.items():
        validate_stream_name(name)
        if check_position(offset, f"offset of {name!r}") < 0:
            raise OffsetOutOfRange(
                f"offset of {name!r} is {offset}; offsets start at 0",
                start_offset=0,
                end_offset=-1,
            )
        checked[name] = offset
    return checked


def config_copy(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """A stream config as stored: a JSON round trip, so every sequencer hands back the
    same plain dict (lists, not tuples) whatever the caller passed. Returns (dict, json)."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"a stream config must be a mapping, not {type(config).__name__}")
    try:
        text = json.dumps(dict(config), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"a stream config must be JSON-serialisable: {exc}") from None
    return json.loads(text), text


@dataclass
class StreamCursor:
    """One stream's mutable extent during a commit: a private copy, so a rejected
    commit simply drops it. ``key`` is what the sequencer finds the stream by."""

    key: Hashable
    end: int
    max_timestamp: int | None
    unindexed: int
    dirty: bool = False


@dataclass
class CommitPlan:
    """What a commit will store, computed before anything is written.

    ``accepted``: (cursor, batch, base_offset) of batches to store, in order.
    ``states``: every (stream key, producer id) state after the commit (changed ones only).
    ``time_index``: (cursor, running max timestamp, next offset) entries to add.
    """

    results: list[CommitResult] = field(default_factory=list)
    accepted: list[tuple[StreamCursor, BatchToCommit, int]] = field(default_factory=list)
    states: dict[tuple[Hashable, int], ProducerStreamState] = field(default_factory=dict)
    time_index: list[tuple[StreamCursor, int, int]] = field(default_factory=list)


def plan_commit(
    batches: Sequence[BatchToCommit],
    streams: Mapping[str, StreamCursor],
    epochs: Mapping[int, int],
    states: Mapping[tuple[Hashable, int], ProducerStreamState],
    index_interval: int,
) -> CommitPlan:
    """Judge every batch of a commit and assign offsets, without side effects.

    ``streams`` maps each named stream to a cursor (a missing one raises
    StreamNotFound), ``epochs`` producer ids to their current epoch, ``states`` the
    stored (stream key, producer id) states. Producer state is threaded from batch to
    batch, so two batches of one producer on one stream in one commit are judged in
    order. Any rejection raises before the caller has written anything.

    Every ``index_interval``-th stored batch of a stream adds a time-index entry
    ``(running max timestamp, next offset)``: no batch below ``next offset`` has a
    later timestamp, so :meth:`Sequencer.offset_for_time` may start scanning there.
    """
    plan = CommitPlan()
    for b in batches:
        cursor = streams.get(b.stream)
        if cursor is None:
            raise StreamNotFound(f"stream {b.stream!r} does not exist; create it first")
        state_key: tuple[Hashable, int] | None = None
        state: ProducerStreamState | None = None
        if b.producer_id != NO_PRODUCER:
            state_key = (cursor.key, b.producer_id)
            state = plan.states[state_key] if state_key in plan.states else states.get(state_key)
            duplicate_of = decide(state, epochs.get(b.producer_id), b)
            if duplicate_of is not None:
                plan.results.append(CommitResult(duplicate_of, duplicate=True))
                continue
        base = cursor.end
        cursor.end = base + b.span
        cursor.dirty = True
        if state_key is not None:
            plan.states[state_key] = advance(state, b, base)
        plan.accepted.append((cursor, b, base))
        plan.results.append(CommitResult(base))
        if cursor.max_timestamp is None or b.max_timestamp > cursor.max_timestamp:
            cursor.max_timestamp = b.max_timestamp
        cursor.unindexed += 1
        if cursor.unindexed >= index_interval:
            plan.time_index.append((cursor, cursor.max_timestamp, cursor.end))
            cursor.unindexed = 0
    return plan


def check_new_batches(
    stream: str, olds: Sequence[BatchLocation], news: Sequence[BatchLocation]
) -> None:
    """Replacements must lie inside the offsets of the (contiguous) batches they replace,
    in order and without overlapping, or readers would see offsets twice or vanish."""
    low = min(b.base_offset for b in olds)
    high = max(b.last_offset for b in olds)
    previous_last = low - 1
    for b in news:
        if not isinstance(b, BatchLocation):
            raise SequencerError(f"new batches are BatchLocation items, not {type(b).__name__}")
        check_object_key(b.object_key)
        if b.position < 0 or b.size < 0 or b.last_offset < b.base_offset:
            raise SequencerError(f"malformed replacement batch for stream {stream!r}: {b}")
        if b.base_offset <= previous_last or b.last_offset > high:
            raise SequencerError(
                f"replacement batches for stream {stream!r} must be in offset order, not "
                f"overlap, and stay within offsets {low}..{high} of the batches they replace"
            )
        previous_last = b.last_offset


def time_index_repair(news: Sequence[BatchLocation]) -> tuple[int, int] | None:
    """``(highest new timestamp, first new offset)`` after a replacement, or None.

    A time-index entry ``(ts, next_offset)`` promises that no batch below
    ``next_offset`` is later than ``ts``. Compaction and merging keep every record's
    timestamp, so they keep that promise; a rewriter that does not could hide its batch
    from :meth:`Sequencer.offset_for_time`. So every replacement drops the entries it
    could break, those with ``next_offset`` above the first new offset and ``ts`` below
    the highest new timestamp (entries rise in both, so they are one run just below
    that timestamp), and raises the stream's running maximum. Cheap and always safe.
    """
    if not news:
        return None
    return max(b.max_timestamp for b in news), news[0].base_offset


def check_old_ids(old_batch_ids: Sequence[int]) -> list[int]:
    ids = list(old_batch_ids)
    if not ids or len(set(ids)) != len(ids):
        raise SequencerError("replace_batches needs distinct ids of at least one batch")
    for i in ids:
        check_position(i, "a batch id")
    return ids


def not_contiguous(stream: str) -> SequencerError:
    return SequencerError(
        f"replace_batches on {stream!r}: the batches to replace must be contiguous (no other "
        "live batch between them); replace each run separately"
    )


def out_of_range(stream: str, offset: int, start: int, end: int) -> OffsetOutOfRange:
    where = "was trimmed (below the start offset)" if offset < start else "does not exist yet"
    return OffsetOutOfRange(
        f"offset {offset} of stream {stream!r} {where}; valid offsets are {start}..{end}",
        start_offset=start,
        end_offset=end,
    )


# --------------------------------------------------------------------------- memory


@dataclass(eq=False)  # identity hash: streams key producer states during a commit
class _Stream:
    id: int
    name: str
    config: str
    """JSON text (see :func:`config_copy`); every reader gets its own dict."""
    start: int = 0
    end: int = 0
    max_timestamp: int | None = None
    unindexed: int = 0
    batches: Any = field(default_factory=SortedDict)
    """base offset -> BatchLocation, live batches only."""
    time_index: Any = field(default_factory=SortedDict)
    """running max timestamp -> next offset (see :func:`plan_commit`)."""
    producers: dict[int, ProducerStreamState] = field(default_factory=dict)


@dataclass
class _Object:
    live: int = 0
    dead_since: float | None = None


_INSTANCES: dict[str, MemorySequencer] = {}
_INSTANCES_LOCK = threading.Lock()


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
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._stream_ids = itertools.count(1)
        self._producers: dict[int, int] = {}  # id -> epoch
        self._producer_names: dict[str, int] = {}
        self._producer_ids = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._batch_index: dict[int, tuple[_Stream, int]] = {}  # id -> (stream, base)
        self._objects: dict[str, _Object] = {}
        self._groups: dict[str, dict[str, int]] = {}

    def __repr__(self) -> str:
        return f"MemorySequencer({self.url or '<private>'})"

    # ----------------------------------------------------------------- streams

    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _, stored = config_copy(config)
        with self._lock:
            stream = self._streams.get(name)
            if stream is None:
                stream = _Stream(next(self._stream_ids), name, stored)
                self._streams[name] = stream
            return _meta(stream)

    def delete_stream(self, name: str) -> None:
        with self._lock:
            stream = self._stream(name)
            for loc in stream.batches.values():
                del self._batch_index[loc.batch_id]
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
                producer_id = next(self._producer_ids)
                self._producers[producer_id] = 0
                if name is not None:
                    self._producer_names[name] = producer_id
            else:
                self._producers[producer_id] += 1
            return producer_id, self._producers[producer_id]

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
        return plan_commit(batches, cursors, self._producers, states, TIME_INDEX_INTERVAL)

    def _apply(self, object_key: str, plan: CommitPlan) -> None:
        """Store a plan. Cannot fail: every check ran in :meth:`_plan`."""
        self._acquire(object_key, len(plan.accepted))
        for cursor, b, base in plan.accepted:
            stream: _Stream = cursor.key  # type: ignore[assignment]
            loc = BatchLocation(
                next(self._batch_ids),
                object_key,
                b.position,
                b.size,
                base,
                base + b.span - 1,
                b.max_timestamp,
            )
            stream.batches[base] = loc
            self._batch_index[loc.batch_id] = (stream, base)
        for cursor, running_max, next_offset in plan.time_index:
            cursor.key.time_index[running_max] = next_offset  # type: ignore[attr-defined]
        for cursor in {id(c): c for c, _, _ in plan.accepted}.values():
            stream = cursor.key  # type: ignore[assignment]
            stream.end = cursor.end
            stream.max_timestamp = cursor.max_timestamp
            stream.unindexed = cursor.unindexed
        for (stream_key, producer_id), state in plan.states.items():
            stream_key.producers[producer_id] = state  # type: ignore[attr-defined]

    def record_orphan(self, object_key: str) -> None:
        check_object_key(object_key)
        with self._lock:
            if object_key not in self._objects:
                self._objects[object_key] = _Object(0, self._clock())

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
                del self._batch_index[loc.batch_id]
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
                where = self._batch_index.get(batch_id)
                if where is None or where[0] is not s:
                    return False
                olds.append(s.batches[where[1]])
            olds.sort(key=lambda b: b.base_offset)
            first = s.batches.index(olds[0].base_offset)
            if s.batches.index(olds[-1].base_offset) - first != len(olds) - 1:
                raise not_contiguous(stream)
            check_new_batches(stream, olds, news)
            for loc in olds:
                del s.batches[loc.base_offset]
                del self._batch_index[loc.batch_id]
                self._release(loc.object_key)
            for b in news:
                self._add_replacement(s, b)
            _repair_time_index(s, news)
            return True

    def _add_replacement(self, s: _Stream, b: BatchLocation) -> None:
        loc = BatchLocation(
            next(self._batch_ids),
            b.object_key,
            b.position,
            b.size,
            b.base_offset,
            b.last_offset,
            b.max_timestamp,
        )
        s.batches[loc.base_offset] = loc
        self._batch_index[loc.batch_id] = (s, loc.base_offset)
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
                    del self._objects[key]

    # ---------------------------------------------------------- consumer groups

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        checked = check_offsets(group, offsets)
        with self._lock:
            self._groups.setdefault(group, {}).update(checked)

    def committed_offsets(self, group: str) -> dict[str, int]:
        validate_group_name(group)
        with self._lock:
            return dict(self._groups.get(group, {}))

    # ----------------------------------------------------------------- helpers

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
            o = self._objects[key] = _Object(0, None if batches else self._clock())
        if batches:
            o.live += batches
            o.dead_since = None

    def _release(self, key: str) -> None:
        o = self._objects[key]
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
