"""What every sequencer shares beyond the producer rules: argument checks, the commit
planner and the checks for replacing batches.

The memory sequencer applies them to its dicts, the SQL sequencers to the rows they load
inside a transaction: the same logic, so every implementation behaves alike under the
conformance suite.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    ConfigError,
    OffsetOutOfRange,
    SequencerError,
    StreamNotFound,
    TransactionError,
)
from ..names import validate_group_name, validate_stream_name
from .base import (
    NO_PRODUCER,
    TRACKED_TRANSACTIONS,
    TRANSACTION_RETENTION_SECONDS,
    BatchLocation,
    BatchToCommit,
    CommitResult,
)
from .producers import ProducerStreamState, advance, decide

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_TRANSACTION_ID_CHARS",
    "TIME_INDEX_INTERVAL",
    "TRACKED_TRANSACTIONS",
    "Clock",
    "CommitPlan",
    "StreamCursor",
    "already_known",
    "check_batches",
    "check_expiry_age",
    "check_keys",
    "check_location",
    "check_new_batches",
    "check_object_key",
    "check_offsets",
    "check_old_ids",
    "check_position",
    "check_transaction",
    "check_transaction_id",
    "clock_ms",
    "config_copy",
    "merged_config",
    "not_contiguous",
    "out_of_range",
    "plan_commit",
    "ranges_from_json",
    "ranges_to_json",
    "time_index_repair",
    "transaction_cutoff",
    "transaction_ranges",
]

INT64_MAX = (1 << 63) - 1
"""The largest offset, timestamp, position, size, id, epoch or sequence number any
sequencer takes. Every one stores them as signed 64-bit integers (SQL ``INTEGER`` and
``bigint`` columns, msgpack integers in object-store entries), so every one refuses a
larger value up front with :class:`ConfigError` (a ``ValueError``), also inside a batch
description, before anything is written: the same answer from all four, instead of an
``OverflowError`` from whichever driver meets it first."""
INT64_MIN = -(1 << 63)
"""The smallest such value; what a call accepts below 0 is its own rule (a timestamp
may be negative, an offset may not)."""

MAX_TRANSACTION_ID_CHARS = 1024
"""Longest transaction id: ids are keys (a row, a file name hash), not payloads."""

TIME_INDEX_INTERVAL = 16
"""Batches per stream between two time-index entries: bounds offset_for_time's scan
while costing one small entry per 16 batches committed."""

Clock = Callable[[], float]
"""Seconds since the epoch; injectable so tests can move time for garbage collection."""

# --------------------------------------------------------------------------- shared


def clock_ms(clock: Clock) -> int:
    """The clock's time in whole milliseconds since the epoch: what producer state is
    stamped with (an int, so every replica and every database stores it alike)."""
    return int(clock() * 1000)


def check_expiry_age(older_than_ms: object) -> int:
    """``older_than_ms`` of :meth:`Sequencer.expire_producers`: an int >= 0."""
    if type(older_than_ms) is not int or not 0 <= older_than_ms <= INT64_MAX:
        raise ConfigError(
            f"older_than_ms must be an int of milliseconds >= 0, not {older_than_ms!r}"
        )
    return older_than_ms


def check_object_key(key: object) -> str:
    """An object key is a non-empty str: it is how garbage collection finds the object."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"an object key must be a non-empty str, not {key!r}")
    return key


def check_position(value: object, what: str) -> int:
    """An int argument (an offset, a timestamp, a size, an id) within the 64-bit range
    sequencers store (:data:`INT64_MIN` .. :data:`INT64_MAX`); ``bool`` is refused: it
    is a mistake, never an offset. Whether a negative one means anything is up to the
    call (an offset below a stream's start is out of range, a timestamp is not)."""
    if type(value) is not int:
        raise ConfigError(f"{what} must be an int, not {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ConfigError(f"{what}={value} is outside the 64-bit range (at most 2**63-1)")
    return value


def check_keys(object_keys: Sequence[str]) -> Sequence[str]:
    """A sequence of object keys (a lone str would be taken apart character by character;
    anything but a non-empty str is refused before it is stored)."""
    if isinstance(object_keys, str):
        raise ConfigError("pass a list of object keys, not a single str")
    if not isinstance(object_keys, (list, tuple)):
        object_keys = list(object_keys)
    for key in object_keys:
        check_object_key(key)
    return object_keys


def _check_numbers(values: tuple[Any, ...], what: str) -> None:
    """Every one of ``values`` an ``int`` (not ``bool``: else the description is
    malformed, :class:`SequencerError`) within the 64-bit range (else
    :class:`ConfigError`, as for any other number too large to store)."""
    if set(map(type, values)) != {int}:
        raise SequencerError(f"malformed {what}: its numbers must be ints")
    if min(values) < INT64_MIN or max(values) > INT64_MAX:
        raise ConfigError(f"{what} holds a number outside the 64-bit range (at most 2**63-1)")


def _batch_fits(b: BatchToCommit) -> bool:
    """Whether a batch's stream is a str and its eight numbers pass
    :func:`_check_numbers`, spelt out: it runs for every batch of every commit (and of
    every entry an object-store replica replays), where this costs half of building a
    tuple and a set."""
    p, s, n, r = b.position, b.size, b.span, b.record_count
    t, i, e, q = b.max_timestamp, b.producer_id, b.producer_epoch, b.base_sequence
    lo, hi = INT64_MIN, INT64_MAX
    return (
        type(b.stream) is str
        and type(p) is int
        and type(s) is int
        and type(n) is int
        and type(r) is int
        and type(t) is int
        and type(i) is int
        and type(e) is int
        and type(q) is int
        and lo <= p <= hi
        and lo <= s <= hi
        and lo <= n <= hi
        and lo <= r <= hi
        and lo <= t <= hi
        and lo <= i <= hi
        and lo <= e <= hi
        and lo <= q <= hi
    )


def check_location(b: object, stream: str) -> BatchLocation:
    """A :class:`BatchLocation` whose object key is a non-empty str and whose numbers are
    ints within the 64-bit range (checked before anything is looked up or stored)."""
    if not isinstance(b, BatchLocation):
        raise SequencerError(f"new batches are BatchLocation items, not {type(b).__name__}")
    check_object_key(b.object_key)
    numbers = (b.batch_id, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp)
    _check_numbers(numbers, f"replacement batch for stream {stream!r}: {b}")
    return b


def check_batches(batches: Sequence[BatchToCommit]) -> Sequence[BatchToCommit]:
    """Refuse batch descriptions no writer produces before anything is looked up, so a
    bad one cannot leave a hole or an overlapping offset range behind. Returns them as
    a sequence that can be walked twice."""
    if not isinstance(batches, (list, tuple)):
        batches = list(batches)
    for b in batches:
        if not isinstance(b, BatchToCommit):
            raise SequencerError(f"commit takes BatchToCommit items, not {type(b).__name__}")
        if not _batch_fits(b):  # say why, the slow way
            if type(b.stream) is not str:
                raise SequencerError(f"malformed batch {b!r}: its stream name must be a str")
            numbers: tuple[Any, ...] = (b.position, b.size, b.span, b.record_count)
            numbers += (b.max_timestamp, b.producer_id, b.producer_epoch, b.base_sequence)
            _check_numbers(numbers, f"batch {b!r}")
        if b.position < 0 or b.size < 0 or b.span < 1 or not 0 <= b.record_count <= b.span:
            raise SequencerError(
                f"malformed batch for stream {b.stream!r}: position={b.position} "
                f"size={b.size} span={b.span} record_count={b.record_count} (need "
                "position >= 0, size >= 0, span >= 1 and 0 <= record_count <= span)"
            )
    return batches


def check_transaction_id(transaction_id: object) -> str:
    """A transaction id is a non-empty str of at most 1024 characters without NUL (which
    PostgreSQL cannot store): the caller's stable name for one all-or-nothing commit."""
    if not isinstance(transaction_id, str) or not transaction_id:
        raise ConfigError(f"a transaction id must be a non-empty str, not {transaction_id!r}")
    if len(transaction_id) > MAX_TRANSACTION_ID_CHARS or "\x00" in transaction_id:
        raise ConfigError(
            f"a transaction id must be at most {MAX_TRANSACTION_ID_CHARS} characters "
            "without NUL; derive a short one (e.g. a hash) from a longer name"
        )
    return transaction_id


def check_transaction(
    transaction_id: object, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
) -> tuple[str, list[tuple[str, Sequence[BatchToCommit]]], list[BatchToCommit]]:
    """Validate a :meth:`Sequencer.commit_transaction` call before anything is looked up.

    Returns the id, the objects as a list of ``(key, batches)`` and all batches in commit
    order. Refuses a lone pair (not a list of them), repeated object keys (the same
    object would be counted twice) and producer batches (the transaction id, not a
    producer, deduplicates a transaction; mixing both would make a retry ambiguous).
    """
    txn = check_transaction_id(transaction_id)
    if isinstance(objects, (str, bytes)) or not isinstance(objects, Sequence):
        raise ConfigError("objects must be a list of (object key, batches) pairs")
    checked: list[tuple[str, Sequence[BatchToCommit]]] = []
    flat: list[BatchToCommit] = []
    seen: set[str] = set()
    for item in objects:
        if not isinstance(item, tuple) or len(item) != 2:
            raise ConfigError(f"objects must hold (object key, batches) pairs, not {item!r}")
        key = check_object_key(item[0])
        if key in seen:
            raise SequencerError(f"object {key!r} appears twice in transaction {txn!r}")
        seen.add(key)
        batches = check_batches(item[1])
        for b in batches:
            if b.producer_id != NO_PRODUCER:
                raise SequencerError(
                    f"transaction {txn!r}: batches of a transaction carry no producer id "
                    f"(got producer {b.producer_id}); the transaction id deduplicates them"
                )
        checked.append((key, batches))
        flat.extend(batches)
    return txn, checked, flat


def already_known(transaction_id: str, keys: Sequence[str]) -> TransactionError:
    """A new transaction may only bring objects the sequencer has never seen: a known one
    was committed before (its records would count twice) or aborted (recorded as an
    orphan, so garbage collection may delete it at any moment)."""
    shown = ", ".join(sorted(keys)[:3])
    return TransactionError(
        f"transaction {transaction_id!r}: object(s) {shown} were committed or aborted "
        "before; stage the data again"
    )


def transaction_ranges(plan: CommitPlan) -> dict[str, tuple[int, int]]:
    """Per stream, ``(first offset, end offset)`` of a planned transaction's batches:
    contiguous, because one step assigned them back to back."""
    ranges: dict[str, tuple[int, int]] = {}
    for _, b, base in plan.accepted:
        first = ranges.get(b.stream, (base, base))[0]
        ranges[b.stream] = (first, base + b.span)
    return dict(sorted(ranges.items()))


def transaction_cutoff(now: float) -> float:
    """Transactions committed before this time are forgotten (the age bound; the count
    bound, :data:`TRACKED_TRANSACTIONS`, is applied by each sequencer's ordering)."""
    return now - TRANSACTION_RETENTION_SECONDS


def ranges_to_json(ranges: Mapping[str, tuple[int, int]]) -> str:
    """Stored form of a transaction's ranges (SQL sequencers): ``{stream: [first, end]}``."""
    return json.dumps({name: list(r) for name, r in ranges.items()}, sort_keys=True)


def ranges_from_json(text: str) -> dict[str, tuple[int, int]]:
    return {name: (int(a), int(b)) for name, (a, b) in json.loads(text).items()}


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


def merged_config(stored: str, changes: Mapping[str, Any]) -> str:
    """A stored config (JSON text) with ``changes`` applied, as JSON text."""
    config, _ = config_copy(changes)
    current = json.loads(stored)
    current.update(config)
    return json.dumps(current, sort_keys=True)


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
    now_ms: int,
) -> CommitPlan:
    """Judge every batch of a commit and assign offsets, without side effects.

    ``streams`` maps each named stream to a cursor (a missing one raises
    StreamNotFound), ``epochs`` producer ids to their current epoch, ``states`` the
    stored (stream key, producer id) states. Producer state is threaded from batch to
    batch, so two batches of one producer on one stream in one commit are judged in
    order, and every state a batch advances records ``now_ms`` (the commit's time, by
    the sequencer's clock) as its last write. Any rejection raises before the caller
    has written anything.

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
            plan.states[state_key] = advance(state, b, base, now_ms)
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
        check_location(b, stream)
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
