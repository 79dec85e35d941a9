"""Row checksums and completeness checks of the SQL sequencers (SQLite, PostgreSQL).

A database can hand back a row that is not the one written: a damaged page, a bad disk,
a restore from a broken backup, a hand-made ``UPDATE``. So every row a later call
trusts carries a ``crc`` column: the CRC-32C of its other columns (:data:`LAYOUTS`, in
that order) packed as one msgpack array, computed in Python where the row is written
and verified where it is read back, before any of its values is used. A mismatch raises
:class:`~disklesslog.errors.CorruptDataError` naming the database, the table and the
row. Ids the database assigns (a batch's, an object's) are handles, not data: they are
left out, and a batch row names its object by key, so a batch joined to the wrong
object fails its check too.

A checksum cannot see a row that is *missing*: a damaged index can make a query return
fewer rows without any error. So a stream's batch rows carry what proves them
complete: each records ``gap``, how many offsets just before it no batch holds (a run
compaction left without records), and the stream's row records ``tail_gap``, those
after its last batch. Read in offset order, the batches then tile the stream: each
starts ``gap`` offsets after the one before it ends, and the last ends ``tail_gap``
before the end offset. :class:`Tiling` checks this as a read goes; a missing, extra or
moved row breaks it. A consumer group's row in ``groups`` counts its offset rows,
``objects`` rows their live batches, and ``stream_count`` the ``streams`` rows (in one
row, or in one per range of name keys), for the same reason: a stream whose row is gone
would otherwise simply not exist, and be created anew from offset 0
(:func:`check_stream_count`).
"""

from __future__ import annotations

import functools
import json
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import msgpack
from crc32c import crc32c  # the C function itself: format.crc32c adds a frame per row

from ..errors import CorruptDataError
from .producers import ProducerStreamState

__all__ = [
    "FLOOR_ROW",
    "INT64_MAX",
    "INT64_MIN",
    "LAYOUTS",
    "STREAM_TABLES",
    "StateCache",
    "StreamRow",
    "Tiling",
    "check_garbage",
    "check_leases",
    "check_stream_count",
    "damaged_row",
    "greatest",
    "json_value",
    "lease_floor",
    "name_key",
    "new_stream_row",
    "row_crc",
    "row_crcs",
    "stream_count",
    "tile_existing",
]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

LAYOUTS: dict[str, tuple[str, ...]] = {
    "streams": (
        "id",
        "name",
        "config",
        "start_offset",
        "end_offset",
        "max_timestamp",
        "unindexed",
        "tail_gap",
    ),
    "producers": ("id", "name", "epoch", "used_ms"),
    "producer_streams": ("stream_id", "producer_id", "state"),
    "objects": ("key", "live_batches", "dead_since"),
    "batches": (
        "stream_id",
        "object_key",
        "position",
        "size",
        "base_offset",
        "last_offset",
        "max_timestamp",
        "gap",
    ),
    "time_index": ("stream_id", "max_timestamp", "next_offset"),
    "group_offsets": ("group_name", "stream", "next_offset"),
    "groups": ("group_name", "streams"),
    "stream_count": ("streams",),
    "transactions": ("id", "committed_at", "ranges"),
    "leases": ("name", "holder", "token", "serial", "duration_ms"),
    "lease_count": ("leases",),
}
"""Per table, the values its ``crc`` covers, in order (``object_key`` is the key of the
batch's object, found through ``object_id``). docs/sequencers.md specifies them."""


STREAM_TABLES = ("batches", "producer_streams", "time_index")
"""The tables whose rows belong to a stream by its ``stream_id``."""


class StreamRow(NamedTuple):
    """A verified ``streams`` row: exactly what its checksum covers, in that order
    (built with :func:`new_stream_row`)."""

    id: int
    name: str
    config: str
    start_offset: int
    end_offset: int
    max_timestamp: int | None
    unindexed: int
    tail_gap: int


new_stream_row = functools.partial(tuple.__new__, StreamRow)
"""A :class:`StreamRow` from a sequence of its 8 values, without ``NamedTuple``'s
Python-level ``__new__`` (commits build one per stream)."""

_ADVICE = (
    "the sequencer database is damaged; see 'A damaged sequencer database' in docs/operations.md"
)

_local = threading.local()


def _pack() -> Callable[[Any], bytes]:
    """This thread's msgpack packer (``msgpack.packb`` builds a new one per call: twice
    the cost of packing a row)."""
    try:
        pack: Callable[[Any], bytes] = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer().pack
    return pack


def row_crc(values: Sequence[Any]) -> int:
    """CRC-32C of ``values`` packed as one msgpack array (ints in their shortest form,
    floats as float 64, text as str, NULL as nil): what a row's ``crc`` column holds."""
    return int(crc32c(_pack()(values)))


def name_key(name: str) -> int:
    """A stream's ``name_key``: CRC-32C of its name in UTF-8. Indexed, so a lookup by
    name that finds nothing can still find, in O(log n), a row whose name was damaged
    (its checksum then fails) or that a damaged name index misses."""
    return int(crc32c(name.encode("utf-8", "surrogatepass")))


def row_crcs(rows: Iterable[Sequence[Any]]) -> Iterator[int]:
    """:func:`row_crc` of each of ``rows``, with no Python frame per row (commits
    checksum every row they write)."""
    return map(crc32c, map(_pack(), rows))


def damaged_row(
    database: str, table: str, key: str, problem: str = "its checksum does not match its columns"
) -> CorruptDataError:
    """The error for a row that is damaged, missing or inconsistent with the rows
    around it. ``key`` says which row (``"stream 'a'"``)."""
    return CorruptDataError(f"{problem}; {_ADVICE}", source=f"{database} table {table} row {key}")


def check_garbage(database: str, listed: int, due: int, undated: int) -> None:
    """What ``objects_to_delete`` read through the index of dead objects (``listed``)
    against a scan of the whole table: as many rows ``due`` (dead long enough), and none
    ``undated`` (no live batch, yet no time of death: a damaged ``dead_since`` would hide
    the object from every collection)."""
    if due != listed or undated:
        raise damaged_row(
            database,
            "objects",
            "(garbage)",
            f"{listed} objects listed as garbage where a scan of the table finds {due}, "
            f"and {undated} without live batches nor a time of death",
        )


def stream_count(database: str, row: Sequence[Any] | None, bucket: int = 0) -> int:
    """The number of streams the ``stream_count`` row ``(streams, crc)`` of id
    ``bucket`` records, its checksum verified. (SQLite keeps one row, id 0, counting
    every stream; PostgreSQL one per range of name keys.) Rows are written with the
    schema and never deleted, so a row that is not there (None, or NULLs from an outer
    join) is damage too."""
    if row is None or row[0] is None:
        raise damaged_row(database, "stream_count", f"id {bucket}", "it is missing")
    if row_crc(row[:1]) != row[1]:
        raise damaged_row(database, "stream_count", f"id {bucket}")
    return int(row[0])


def check_stream_count(
    database: str, row: Sequence[Any] | None, found: int, bucket: int | None = None
) -> int:
    """Check that the ``streams`` rows ``found`` (counted, or listed, in the snapshot the
    ``stream_count`` row ``row`` was read in) are as many as it records; returns the
    count. ``bucket`` is the row's id where there is one row per range of name keys
    (``found`` then counts the streams of that range), None where one row counts them
    all. Called before a stream is said not to exist, and before one is created:
    the row of a stream can be lost (a damaged page, a bad restore, a stray ``DELETE``)
    and a checksum cannot see a row that is gone, while ``create_stream`` would then
    hand out the lost stream's offsets again from 0."""
    count = stream_count(database, row, bucket or 0)
    if found != count:
        which = "" if bucket is None else f" whose name_key is in range {bucket}"
        raise damaged_row(
            database,
            "streams",
            "(all)",
            f"the table holds {found} stream rows{which} but {count} such streams were "
            f"created and not deleted (table stream_count, id {bucket or 0}): a stream's "
            "row is missing or its name_key damaged, or one was added behind the "
            "sequencer's back",
        )
    return count


def check_leases(database: str, row: Sequence[Any] | None, leases: Sequence[Sequence[Any]]) -> int:
    """Check every ``leases`` row ``(name, holder, token, serial, duration_ms, crc)``
    and that they are as many as the ``lease_count`` row ``row = (leases, crc)`` (read
    in the same snapshot) records; returns the count. Called before a lease is said
    never to have been taken, and before its first record is written: a row that is
    lost, or whose name was damaged (so a lookup by name misses it), would restart the
    lease's fencing tokens at 1 and so fence nothing. Leases are few: reading them all
    on this rare path costs little. The count row is written with the schema and
    never deleted."""
    for name, *values, crc in leases:
        if row_crc((name, *values)) != crc:
            raise damaged_row(database, "leases", repr(name))
    if row is None or row[0] is None:
        raise damaged_row(database, "lease_count", "id 0", "it is missing")
    if row_crc(row[:1]) != row[1]:
        raise damaged_row(database, "lease_count", "id 0")
    count = int(row[0])
    if len(leases) != count:
        raise damaged_row(
            database,
            "leases",
            "(all)",
            f"the table holds {len(leases)} lease rows but {count} leases were taken "
            "(table lease_count): a lease's row is missing, or one was added behind the "
            "sequencer's back",
        )
    return count


FLOOR_ROW = ""
"""The name of the ``leases`` row that holds the token floor (no lease has the empty
name): its ``token`` is the greatest token of a dropped lease row, its ``serial`` how
many drops moved it. Written by the first drop; counted in ``lease_count`` like every
row, so its loss is reported as damage."""


def lease_floor(leases: Sequence[Sequence[Any]]) -> tuple[int, int]:
    """The token floor and the serial of its row (0, 0 without one) among ``leases``
    rows ``(name, holder, token, serial, ...)`` already checked by :func:`check_leases`."""
    for name, _holder, token, serial, *_ in leases:
        if name == FLOOR_ROW:
            return int(token), int(serial)
    return 0, 0


def json_value(text: object, kind: type, database: str, table: str, key: str) -> Any:
    """``text`` parsed as JSON into a ``kind`` (dict, list), or the typed error naming
    the row: a checksum blesses what was written, not that it parses (rows a migration
    checksummed were written before there were checksums)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, kind):
        raise damaged_row(database, table, key, f"its JSON column does not hold a {kind.__name__}")
    return value


_NUMBERS = operator.attrgetter(
    "position",
    "size",
    "span",
    "record_count",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
)


def greatest(current: int | None, new: int | None) -> int | None:
    """The larger of two running maxima, either possibly unknown (None)."""
    if current is None:
        return new
    return current if new is None else max(current, new)


class Tiling:
    """Checks that a stream's batch rows, read in offset order from ``offset``, account
    for every offset: the first row's claim (its base offset less its ``gap``) begins at
    or before ``offset``, each next claim begins where the previous batch ended, and,
    once every row up to the end has been read, the last batch ends ``tail_gap`` before
    the end offset. Rows are checked as a read takes them, so a page read stops early
    without reading the rest."""

    __slots__ = ("_database", "_next", "_offset", "_stream")

    def __init__(self, database: str, stream: str, offset: int) -> None:
        self._database = database
        self._stream = stream
        self._offset = offset
        self._next: int | None = None

    def add(self, base_offset: int, last_offset: int, gap: int) -> None:
        claim = base_offset - gap
        expected = self._next
        if expected is None:
            if claim > self._offset:
                raise self._broken(
                    f"the first batch from offset {self._offset} holds offsets "
                    f"{base_offset}..{last_offset} after a gap of {gap}: a batch row before "
                    "it is missing"
                )
        elif claim != expected:
            raise self._broken(
                f"the batch at offsets {base_offset}..{last_offset} (gap {gap}) does not "
                f"follow the one ending at offset {expected - 1}: a batch row is missing or "
                "out of place"
            )
        self._next = last_offset + 1

    def finish(self, end_offset: int, tail_gap: int) -> None:
        """Every row up to the stream's end was read: they must reach it."""
        reached = self._next
        if (
            (end_offset - tail_gap > self._offset)
            if reached is None
            else (reached + tail_gap != end_offset)
        ):
            where = f"offset {self._offset}" if reached is None else f"offset {reached - 1}"
            raise self._broken(
                f"the stream's batches end at {where} but its end offset is {end_offset} "
                f"with {tail_gap} offsets without batches before it: batch rows are missing"
            )

    def _broken(self, problem: str) -> CorruptDataError:
        return damaged_row(self._database, "batches", f"stream {self._stream!r}", problem)


class StateCache:
    """Producer states by (stream id, producer id), verified and decoded from their
    ``producer_streams`` rows. A writer's next commit loads the row it stored itself, so
    a row whose text and checksum are those this process last wrote or verified skips
    the checksum and the JSON decode. Always correct: only an identical row hits,
    whoever wrote it, and a rolled-back entry simply misses. One dict access per call,
    so the GIL makes it safe to share between threads."""

    LIMIT = 65536

    def __init__(self, database: str) -> None:
        self._database = database
        self._seen: dict[tuple[Any, int], tuple[tuple[str, int], ProducerStreamState]] = {}

    def load(self, stream_id: Any, producer_id: int, text: Any, crc: Any) -> ProducerStreamState:
        """The state a ``producer_streams`` row holds, its checksum verified."""
        key = (stream_id, producer_id)
        seen = self._seen.get(key)
        if seen is not None and seen[0] == (text, crc):
            return seen[1]
        where = f"(stream id {stream_id}, producer {producer_id})"
        if row_crc((stream_id, producer_id, text)) != crc:
            raise damaged_row(self._database, "producer_streams", where)
        try:
            state = ProducerStreamState.from_json(text)
        except (ValueError, TypeError):
            raise damaged_row(
                self._database, "producer_streams", where, "its state does not parse"
            ) from None
        self._keep([(key, ((text, crc), state))])
        return state

    def store(
        self, states: Mapping[tuple[Any, int], ProducerStreamState]
    ) -> list[tuple[Any, int, str, int]]:
        """``(stream id, producer id, text, crc)`` of the rows that store ``states``."""
        rows = [(*key, state.to_json()) for key, state in states.items()]
        out = [(*row, crc) for row, crc in zip(rows, row_crcs(rows))]
        self._keep(zip(states, zip(((r[2], r[3]) for r in out), states.values())))
        return out

    def _keep(
        self, entries: Iterable[tuple[tuple[Any, int], tuple[tuple[str, int], ProducerStreamState]]]
    ) -> None:
        if len(self._seen) >= self.LIMIT:
            self._seen.clear()  # crude but bounded; a miss only costs a decode
        self._seen.update(entries)


def tile_existing(
    database: str,
    extents: dict[Any, tuple[str, int, int]],
    batches: Sequence[tuple[Any, Any, int, int]],
) -> tuple[list[tuple[int, Any]], dict[Any, int]]:
    """The ``gap`` of every batch row and the ``tail_gap`` of every stream of a database
    written before these columns existed (the schema migration that adds them).

    ``extents``: stream id -> (name, start offset, end offset); ``batches``:
    ``(batch id, stream id, base offset, last offset)`` sorted by stream id, then last
    offset. Returns ``[(gap, batch id)]`` and ``{stream id: tail_gap}``. Offsets from the
    start offset to the first batch, between batches and after the last are taken as
    compaction left them (there is no telling a row lost earlier from a gap); batches
    that overlap, lie beyond the end offset or belong to no stream are damage, refused
    before anything changes."""
    gaps: list[tuple[int, Any]] = []
    reached: dict[Any, int] = {}
    for batch_id, stream_id, base, last in batches:
        if stream_id not in extents:
            raise damaged_row(database, "batches", f"id {batch_id}", "it belongs to no stream")
        name, start, end = extents[stream_id]
        previous = reached.get(stream_id)
        claim = start if previous is None else previous
        if last < base or last >= end or (previous is not None and base < previous):
            raise damaged_row(
                database,
                "batches",
                f"(stream {name!r}, last_offset {last})",
                f"offsets {base}..{last} overlap another batch or lie beyond the end offset {end}",
            )
        gaps.append((max(0, base - claim), batch_id))
        reached[stream_id] = last + 1
    tails = {
        stream_id: end - reached.get(stream_id, start)
        for stream_id, (_, start, end) in extents.items()
    }
    return gaps, tails
