"""The bytes of the object-store sequencer: entries and checkpoints, both versions.

``docs/format.md`` (section 3.1) specifies them; this module is the only code that
reads or writes them, and every way stored bytes can be wrong ends here as a
:class:`~disklesslog.errors.CorruptDataError` naming the object, never as a raw
``TypeError``/``ValueError``/``KeyError`` of a decoder.

**Version 2** (written by this release): an entry is a 38-byte header and a msgpack
body; a checkpoint (**version 3**: version 2 plus the times of producer state, which
producer expiry needs) a 26-byte header and a zstd frame (with zstd's content checksum)
holding a msgpack map. Version 2 checkpoints are still read: their producer state gets
the checkpoint's own time. Both carry a CRC-32C over everything after the CRC field, the
length of what follows the header, and their own entry number, so damage, truncation,
appended bytes and an object under the wrong name are all caught before anything is
decoded. An entry also carries the *chain digest* of the entries before it (BLAKE2b
over the previous digest and each entry's bytes, like Raft's ``prevLogTerm``), so an
entry written by a replica with another history (an entry replaced underneath) stops
every replica that did not apply the same one.

**Version 1** (read only, so buckets written by earlier releases still open): magic
and msgpack, or magic and a zstd frame without content checksum; no CRC. Its entries
and checkpoints are superseded by version 2 ones and deleted within
``entry_retention_seconds`` once a process of this release writes a checkpoint.

Decoding checks the *shape* of everything it returns (every operation's arguments,
every row of a checkpoint's state), because an entry is applied operation by operation
to the replica: a value of the wrong type found halfway would leave half an entry
applied. A process opening a log defers one part of that: the rows of each stream
(batches, time index, producer states; most of a wide state) are checked when that
stream is first used (:func:`stream_rows_check`), so a log of 100,000 streams opens
without checking the 100,000 streams it will not touch. The CRC and zstd's checksum are
always checked whole first: what a deferred check can find is only a writer's bug (a
wrong shape under a valid CRC), and it is reported just as at load, naming the
checkpoint and the stream.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import operator
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import crc32c
import msgpack
import zstandard

from ..errors import CorruptDataError, SequencerError

__all__ = [
    "CHAIN_START",
    "CHECKPOINT_HEADER",
    "CHECKPOINT_MAGIC",
    "CHECKPOINT_MAGIC_V1",
    "CHECKPOINT_MAGIC_V2",
    "ENTRY_HEADER",
    "ENTRY_MAGIC",
    "ENTRY_MAGIC_V1",
    "OPERATIONS",
    "Checkpoint",
    "Entry",
    "chain",
    "decode_body",
    "decode_checkpoint",
    "decode_entry",
    "encode_checkpoint",
    "encode_entry",
    "entry_body",
    "stream_rows_check",
    "verify_checkpoint",
]

ENTRY_MAGIC = b"DLSQE2"
"""First bytes of an entry, format version 2 (checksummed)."""
ENTRY_MAGIC_V1 = b"DLSQE1"
"""First bytes of an entry of format version 1 (no checksum; read, never written)."""
CHECKPOINT_MAGIC = b"DLSQC3"
"""First bytes of a checkpoint, format version 3 (checksummed; producer state with times)."""
CHECKPOINT_MAGIC_V2 = b"DLSQC2"
"""First bytes of a checkpoint of format version 2 (the header of version 3; producer
state without times: read, never written)."""
CHECKPOINT_MAGIC_V1 = b"DLSQC1"
"""First bytes of a checkpoint of format version 1 (read, never written)."""

_ENTRY = struct.Struct("<6sIIQ16s")  # magic, crc, length, number, previous chain digest
_CHECKPOINT = struct.Struct("<6sIQQ")  # magic, crc, length, entry
ENTRY_HEADER = _ENTRY.size
"""Bytes before an entry's body (38)."""
CHECKPOINT_HEADER = _CHECKPOINT.size
"""Bytes before a checkpoint's zstd frame (26)."""
_CRC_START = 10  # the CRC covers every byte from here (after magic and crc) to the end

CHAIN_DIGEST_BYTES = 16
CHAIN_START = bytes(CHAIN_DIGEST_BYTES)
"""The chain digest of an empty log (before entry 1)."""


def chain(previous: bytes, data: bytes) -> bytes:
    """The chain digest after an entry: BLAKE2b-128 of the previous digest followed by
    the entry's stored bytes (any version)."""
    digest = hashlib.blake2b(previous, digest_size=CHAIN_DIGEST_BYTES)
    digest.update(data)
    return digest.digest()


# ----------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Entry:
    """A decoded entry. ``ops`` are checked operations whose JSON arguments are already
    parsed; ``previous`` is the chain digest it was written after (None: version 1)."""

    entry_id: bytes
    timestamp: float
    ops: list[list[Any]]
    previous: bytes | None


def entry_body(entry_id: bytes, timestamp: float, ops: list[list[Any]]) -> bytes:
    """An entry's msgpack body; packed once, however many numbers a writer tries."""
    body: bytes = msgpack.packb([entry_id, timestamp, ops], use_bin_type=True)
    return body


def encode_entry(number: int, previous: bytes, body: bytes) -> bytes:
    """Entry ``number`` (version 2): the header, then ``body`` (:func:`entry_body`)."""
    fields = _ENTRY.pack(ENTRY_MAGIC, 0, len(body), number, previous)[_CRC_START:]
    crc = crc32c.crc32c(body, crc32c.crc32c(fields))
    return b"".join((ENTRY_MAGIC, crc.to_bytes(4, "little"), fields, body))


def decode_entry(data: bytes, number: int, where: str) -> Entry:
    """Check and decode entry ``number`` read from ``where``: a typed error for any
    damage (:class:`CorruptDataError`), or for operations of a newer release
    (:class:`SequencerError`: upgrade)."""
    if data[: len(ENTRY_MAGIC)] == ENTRY_MAGIC:
        if len(data) < ENTRY_HEADER:
            raise _damaged(where, f"{len(data)} bytes, shorter than an entry header")
        _, crc, length, stored_number, previous = _ENTRY.unpack_from(data)
        if ENTRY_HEADER + length != len(data):
            raise _damaged(where, f"the header says {length} body bytes, {len(data)} stored")
        if crc32c.crc32c(memoryview(data)[_CRC_START:]) != crc:
            raise _damaged(where, "CRC-32C mismatch")
        if stored_number != number:
            raise _damaged(where, f"it holds entry {stored_number}, not {number}")
        body = memoryview(data)[ENTRY_HEADER:]
    elif data[: len(ENTRY_MAGIC_V1)] == ENTRY_MAGIC_V1:
        previous, body = None, memoryview(data)[len(ENTRY_MAGIC_V1) :]
    else:
        raise _damaged(where, "not a disklesslog sequencer entry (unknown magic)")
    return decode_body(body, previous, where)


def decode_body(body: bytes | memoryview, previous: bytes | None, where: str) -> Entry:
    """Decode and check an entry's msgpack body (:func:`decode_entry` after the header;
    a writer checks its own entry with it, exactly as every replica will)."""
    content = _unpack(body, where)
    if type(content) is not list or len(content) != 3:
        raise _damaged(where, "the body is not [entry id, timestamp, operations]")
    entry_id, stamp, ops = content
    if type(entry_id) is not bytes or len(entry_id) != 16:
        raise _damaged(where, "the entry id is not 16 bytes")
    if type(stamp) is not float or not math.isfinite(stamp):
        raise _damaged(where, "the timestamp is not a finite float")
    if type(ops) is not list:
        raise _damaged(where, "the operations are not an array")
    return Entry(entry_id, stamp, [_operation(op, i, where) for i, op in enumerate(ops)], previous)


def _operation(op: Any, index: int, where: str) -> list[Any]:
    if type(op) is not list or not op or type(op[0]) is not str:
        raise _damaged(where, f"operation {index} is not an array starting with its name")
    signature = OPERATIONS.get(op[0])
    if signature is None:
        raise SequencerError(
            f"{where} holds an operation this version of disklesslog does not know "
            f"({op[0][:60]}): upgrade disklesslog"
        )
    if len(op) != len(signature) + 1:
        raise _damaged(where, f"operation {index} ({op[0]}) has {len(op) - 1} arguments")
    try:
        return [op[0], *(check(arg) for check, arg in zip(signature, op[1:]))]
    except _Shape as exc:
        raise _damaged(where, f"operation {index} ({op[0]}): {exc}") from None


# ------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """A decoded checkpoint: the state (a checked ``MemorySequencer.snapshot()``), the
    recent entry ids and the chain digest as of its entry. ``timed``: whether its
    producer state has times (version 3); an older one's are the checkpoint's own time.
    ``rows_check``: decoded with ``deferred=True``, the check each stream's rows must
    still pass before their first use (``MemorySequencer.from_snapshot``); None when
    everything was checked."""

    state: dict[str, Any]
    recent: list[bytes]
    chain: bytes
    timed: bool = True
    rows_check: Callable[[str, list[Any], list[Any], list[Any]], None] | None = None


def encode_checkpoint(
    entry: int, state: dict[str, Any], recent: list[bytes], digest: bytes, level: int = 3
) -> bytes:
    """A version 3 checkpoint of the state as of ``entry``."""
    body = msgpack.packb({"state": state, "recent": recent, "chain": digest}, use_bin_type=True)
    frame = zstandard.ZstdCompressor(level=level, write_checksum=True).compress(body)
    fields = _CHECKPOINT.pack(CHECKPOINT_MAGIC, 0, len(frame), entry)[_CRC_START:]
    crc = crc32c.crc32c(frame, crc32c.crc32c(fields))
    return b"".join((CHECKPOINT_MAGIC, crc.to_bytes(4, "little"), fields, frame))


def verify_checkpoint(data: bytes, entry: int, where: str) -> memoryview:
    """Check a checkpoint's header and CRC without decompressing it (version 1 has
    neither: only its magic is checked); returns its zstd frame."""
    if data[: len(CHECKPOINT_MAGIC)] in (CHECKPOINT_MAGIC, CHECKPOINT_MAGIC_V2):
        if len(data) < CHECKPOINT_HEADER:
            raise _damaged(where, f"{len(data)} bytes, shorter than a checkpoint header")
        _, crc, length, stored_entry = _CHECKPOINT.unpack_from(data)
        if CHECKPOINT_HEADER + length != len(data):
            raise _damaged(where, f"the header says {length} frame bytes, {len(data)} stored")
        if crc32c.crc32c(memoryview(data)[_CRC_START:]) != crc:
            raise _damaged(where, "CRC-32C mismatch")
        if stored_entry != entry:
            raise _damaged(where, f"it holds the state as of entry {stored_entry}, not {entry}")
        return memoryview(data)[CHECKPOINT_HEADER:]
    if data[: len(CHECKPOINT_MAGIC_V1)] == CHECKPOINT_MAGIC_V1:
        return memoryview(data)[len(CHECKPOINT_MAGIC_V1) :]
    raise _damaged(where, "not a disklesslog sequencer checkpoint (unknown magic)")


def decode_checkpoint(data: bytes, entry: int, where: str, *, deferred: bool = False) -> Checkpoint:
    """Check and decode the checkpoint of ``entry`` read from ``where``. ``deferred``:
    leave the shape of each stream's rows to :attr:`Checkpoint.rows_check` (the bytes
    are checked whole all the same)."""
    frame = verify_checkpoint(data, entry, where)
    version1 = data[: len(CHECKPOINT_MAGIC_V1)] == CHECKPOINT_MAGIC_V1
    timed = data[: len(CHECKPOINT_MAGIC)] == CHECKPOINT_MAGIC
    try:
        # Streaming, so a damaged (version 1) frame header cannot make it allocate the
        # size it declares; the output grows with what the frame really holds.
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        body = decompressor.decompress(frame)
        if not decompressor.eof:
            raise zstandard.ZstdError("the frame is truncated")
        if decompressor.unused_data:
            raise zstandard.ZstdError("bytes follow the frame")
    except zstandard.ZstdError as exc:
        raise _damaged(where, f"zstd: {exc}") from None
    content = _unpack(body, where)
    del body, decompressor  # as large as what they became: not kept while it loads
    if type(content) is not dict:
        raise _damaged(where, "the content is not a map")
    try:
        if version1:
            if type(content.get("entry")) is not int or content["entry"] != entry:
                raise _Shape(f"it holds the state as of entry {content.get('entry')!r}")
            digest = CHAIN_START  # version 1 entries never move the chain
        else:
            digest = _digest(content.get("chain"))
        recent = _list_of(_entry_id)(content.get("recent"))
        _check_state(content.get("state"), timed=timed, streams_rows=not deferred)
    except _Shape as exc:
        raise _damaged(where, str(exc)) from None
    rows_check = stream_rows_check(where, timed=timed) if deferred else None
    return Checkpoint(content["state"], recent, digest, timed, rows_check)


def stream_rows_check(
    where: str, *, timed: bool = True
) -> Callable[[str, list[Any], list[Any], list[Any]], None]:
    """The deferred check of one stream's rows from the checkpoint at ``where``:
    ``check(name, batches, time_index, producer_states)`` raises
    :class:`CorruptDataError` naming the checkpoint and the stream, or returns."""

    def check(name: str, batches: list[Any], index: list[Any], producers: list[Any]) -> None:
        try:
            _check_stream_rows(batches, index, producers, timed=timed)
        except _Shape as exc:
            raise _damaged(where, f"stream {name!r}: {exc}") from None

    return check


# ------------------------------------------------------------------------ shapes


class _Shape(Exception):
    """A value of the wrong type or shape (turned into CorruptDataError by callers)."""


Check = Callable[[Any], Any]


def _of(*types: type) -> Check:
    def check(value: Any) -> Any:
        if type(value) not in types:
            raise _Shape(f"{type(value).__name__} where {'/'.join(t.__name__ for t in types)}")
        return value

    return check


_str, _int, _opt_str = _of(str), _of(int), _of(str, type(None))
_time = _of(float, int)
_opt_time = _of(float, int, type(None))


def _digest(value: Any) -> bytes:
    if type(value) is not bytes or len(value) != CHAIN_DIGEST_BYTES:
        raise _Shape("the chain digest is not 16 bytes")
    return value


def _entry_id(value: Any) -> bytes:
    if type(value) is not bytes or len(value) != 16:
        raise _Shape("an entry id is not 16 bytes")
    return value


def _list_of(check: Check) -> Check:
    def checked(value: Any) -> list[Any]:
        if type(value) is not list:
            raise _Shape(f"{type(value).__name__} where an array")
        return [check(item) for item in value]

    return checked


def _list_of_type(kind: type) -> Check:
    """An array of ``kind`` items (checked in C: no Python call per item)."""

    def check(value: Any) -> Any:
        if type(value) is not list or not set(map(type, value)) <= {kind}:
            raise _Shape(f"{_show(value)} is not an array of {kind.__name__}")
        return value

    return check


def _rows(*types: type | tuple[type, ...]) -> Check:
    """An array of fixed-length arrays (rows) whose items have exactly these types (a
    tuple: any of them). Checked column by column in C, with no Python call per row
    (this runs for every batch of every entry replayed and of every checkpoint loaded):
    every row a list of the right length, then the set of types in each column (read
    with ``itemgetter``: twice as fast as transposing the rows with ``zip``)."""
    columns = [{t} if isinstance(t, type) else set(t) for t in types]
    width = len(columns)
    getters = [(operator.itemgetter(i), allowed) for i, allowed in enumerate(columns)]

    def check(value: Any) -> Any:
        if type(value) is not list:
            raise _Shape(f"{type(value).__name__} where an array of rows")
        if value and not (
            set(map(type, value)) == {list}
            and set(map(len, value)) == {width}
            and all(set(map(type, map(column, value))) <= a for column, a in getters)
        ):
            bad = next(row for row in value if not _row_fits(row, columns))
            raise _Shape(f"a row {_show(bad)} is not [{', '.join(map(_name, types))}]")
        return value

    return check


def _row_fits(row: Any, columns: list[set[type]]) -> bool:
    return (
        type(row) is list
        and len(row) == len(columns)
        and all(type(item) in allowed for item, allowed in zip(row, columns))
    )


def _name(kind: type | tuple[type, ...]) -> str:
    return kind.__name__ if isinstance(kind, type) else " or ".join(t.__name__ for t in kind)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_object(value: Any) -> dict[str, Any]:
    """A config (or config changes) stored as JSON text: parsed here, once."""
    if type(value) is not str:
        raise _Shape(f"{type(value).__name__} where JSON text")
    try:
        parsed = json.loads(value)
    except ValueError:
        raise _Shape("the JSON text does not parse") from None
    if type(parsed) is not dict:
        raise _Shape("the JSON text is not an object")
    return parsed


def _str_to_int(value: Any) -> dict[str, int]:
    if type(value) is not dict or not (
        set(map(type, value)) <= {str} and set(map(type, value.values())) <= {int}
    ):
        raise _Shape("the offsets are not a map of str to int")
    return value


_commit_rows = _rows(str, int, int, int, int, int, int, int, int)
_object_parts = _rows(str, list)


def _transaction_objects(value: Any) -> list[Any]:
    return [[key, _commit_rows(rows)] for key, rows in _object_parts(value)]


OPERATIONS: Mapping[str, tuple[Check, ...]] = {
    "create_stream": (_str, _json_object),
    "alter_stream": (_str, _json_object),
    "delete_stream": (_str,),
    "init_producer": (_opt_str,),
    "commit": (_str, _commit_rows),
    "commit_transaction": (_str, _transaction_objects),
    "record_orphan": (_str,),
    "trim": (_str, _int),
    "replace_batches": (_str, _list_of_type(int), _rows(str, int, int, int, int, int)),
    "forget_objects": (_list_of_type(str),),
    "commit_offsets": (_str, _str_to_int),
    "swap_lease": (_str, _int, _opt_str, _int, _int, _int),
    "drop_lease": (_str, _int),
    "discard": (_str,),
    "expire_producers": (_int,),
}
"""Every operation an entry may hold and the checks of its arguments, in order."""

_STREAMS = _rows(int, str, str, int, int, (int, type(None)), int, list, list, list)
_BATCHES = _rows(int, str, int, int, int, int, int)
_TIME_INDEX = _rows(int, int)
_PRODUCERS = _rows(int, int, list)
_TIMED_PRODUCERS = _rows(int, int, list, int)  # version 3: with the last write's ms
_RUNS = _rows(int, int, int)
_OFFSETS = _rows(str, int)
_RANGES = _rows(str, int, int)
_LEASES = _rows(str, (str, type(None)), int, int, int)
_STATE_FIELDS: dict[str, Check] = {
    "next_stream_id": _int,
    "producers": _of(list),  # rows by version: _check_state
    "producer_names": _rows(str, int),
    "next_producer_id": _int,
    "next_batch_id": _int,
    "objects": _rows(str, int, (float, int, type(None))),
    "groups": _rows(str, list),
}


def _check_state(state: Any, *, timed: bool, streams_rows: bool = True) -> None:
    """A checkpoint's state has exactly the shape ``MemorySequencer.snapshot()`` gives
    (``timed``: with the times of producer state, version 3), so loading it can neither
    fail halfway nor leave a value of the wrong type. ``streams_rows=False`` leaves
    each stream's rows (only checked to be arrays) to :func:`stream_rows_check`."""
    if type(state) is not dict:
        raise _Shape("the state is not a map")
    for name, check in _STATE_FIELDS.items():
        if name not in state:
            raise _Shape(f"the state has no {name}")
        check(state[name])
    (_rows(int, int, int) if timed else _rows(int, int))(state.get("producers"))
    for _, offsets in state["groups"]:
        _OFFSETS(offsets)
    # Column by column over all streams at once, each distinct config parsed once: a
    # wide state (100,000 streams) is checked in C, not in a Python loop per stream.
    streams = _STREAMS(state.get("streams"))
    for config in {row[2] for row in streams}:
        _json_object(config)
    if streams_rows:
        _check_stream_rows(
            list(itertools.chain.from_iterable(row[7] for row in streams)),
            list(itertools.chain.from_iterable(row[8] for row in streams)),
            list(itertools.chain.from_iterable(row[9] for row in streams)),
            timed=timed,
        )
    _LEASES(state.get("leases", []))  # absent in checkpoints before leases
    _int(state.get("lease_floor", 0))  # absent in checkpoints before lease pruning
    transactions = state.get("transactions", [])  # absent in checkpoints before them
    for txn in _rows(str, (float, int), list)(transactions):
        _RANGES(txn[2])


def _check_stream_rows(batches: Any, index: Any, producers: Any, *, timed: bool) -> None:
    """Rows of streams' batches, time index and producer states (one stream's, or all
    streams' together)."""
    _BATCHES(batches)
    _TIME_INDEX(index)
    checked = (_TIMED_PRODUCERS if timed else _PRODUCERS)(producers)
    _RUNS(list(itertools.chain.from_iterable(producer[2] for producer in checked)))


# ------------------------------------------------------------------------ helpers


def _unpack(body: Any, where: str) -> Any:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises ValueError, TypeError and its own kinds
        raise _damaged(where, f"msgpack: {exc}") from None


def _damaged(where: str, reason: str) -> CorruptDataError:
    return CorruptDataError(reason, source=where)
