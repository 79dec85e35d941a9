"""One segment: a ``.log`` file of entries (8-byte base offset + batch) and its indexes.

A segment entry is the batch exactly as :mod:`disklesslog.format` encodes it, preceded
by the absolute offset of its first record. Entries are contiguous: each base offset
is the previous one plus the previous batch's span, and the first equals the segment's
base (its file name). Scanning checks that chain, so a damaged base offset is caught
even though the CRC does not cover it.

On a compacted stream a closed segment may hold fewer records than its span (batches
rewritten with gaps) or none at all (an empty file): every record it covered was
compacted away. A :class:`Segment` remembers the inode of its file, because
compaction replaces closed segment files by renaming new ones over them; code that
opens a segment by path checks it got the file it meant (:meth:`Segment.open_log`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from ..errors import CorruptDataError, IncompleteBatchError
from ..forks import fork_safe_lock
from ..format import (
    HEADER_SIZE,
    PREFIX_SIZE,
    BatchHeader,
    batch_size,
    check_batch,
    decode_batch,
    peek_header,
)
from ..records import RecordBatch
from . import loss
from .index import OFFSET_ENTRY, TIME_ENTRY, SparseIndex
from .layout import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, close_quietly, segment_name

__all__ = ["ENTRY_PREFIX", "ENTRY_PREFIX_SIZE", "Segment", "SegmentReplaced", "iter_entries"]

log = logging.getLogger("disklesslog")

ENTRY_PREFIX = struct.Struct("<Q")
"""The absolute base offset that precedes each batch in a segment file."""
ENTRY_PREFIX_SIZE = ENTRY_PREFIX.size
READ_CHUNK = 1 << 20
_PEEK = ENTRY_PREFIX_SIZE + HEADER_SIZE
_LAST_DELTA = struct.Struct("<I")
_LAST_DELTA_AT = PREFIX_SIZE + 2 + 4  # inside the tail: after attributes and record count
NO_TIMESTAMP = -1

Entry = tuple[int, int, BatchHeader, RecordBatch | None]


class SegmentReplaced(Exception):
    """Internal: the file at a segment's path is not the one this :class:`Segment`
    describes (compaction renamed a new file over it, or merged it into another and
    deleted it). The caller takes a fresh snapshot and carries on from where it was."""


PEEK, CHECK, DECODE = "peek", "check", "decode"
"""How :func:`iter_entries` treats each entry: headers only, checksummed, or decoded."""


def iter_entries(
    fd: int | Callable[[int, int], bytes],
    source: str,
    start: int,
    end: int,
    expected_base: int,
    *,
    max_batch_bytes: int,
    mode: str,
    skip_below: int = -1,
    decode: Callable[..., tuple[BatchHeader, RecordBatch | None]] = decode_batch,
) -> Iterator[Entry]:
    """Walk the entries of a segment file from byte ``start`` to byte ``end``.

    ``fd`` is an open file, or a function ``read(size, position) -> bytes`` in its
    place (tiered segments are read that way, through the block cache).

    Yields ``(position, base_offset, header, batch)``. ``mode`` is ``PEEK``
    (header read without checksum: for data verified before), ``CHECK`` (checksummed
    with :func:`check_batch`) or ``DECODE`` (checksummed and decoded into ``batch`` by
    ``decode``: :func:`decode_batch`, or what a read's projection needs).
    Entries whose offsets all lie below ``skip_below`` are only peeked. The chain of
    base offsets is checked in every mode. Raises :class:`IncompleteBatchError` when an
    entry runs past ``end`` or the file, :class:`CorruptDataError` for anything
    invalid, both naming ``source`` and the entry's byte position.
    """
    read = fd if callable(fd) else functools.partial(os.pread, fd)
    pos = start
    buf = b""
    buf_pos = start
    try:
        while pos < end:
            off = pos - buf_pos
            if len(buf) - off < _PEEK:
                buf = read(min(READ_CHUNK, end - pos), pos)
                buf_pos, off = pos, 0
            if len(buf) - off < ENTRY_PREFIX_SIZE + PREFIX_SIZE:
                raise IncompleteBatchError("entry cut short", position=0)
            (base,) = ENTRY_PREFIX.unpack_from(buf, off)
            total = ENTRY_PREFIX_SIZE + batch_size(
                buf, off + ENTRY_PREFIX_SIZE, max_batch_bytes=max_batch_bytes
            )
            if pos + total > end:
                raise IncompleteBatchError(
                    f"entry of {total} bytes runs past the end ({end - pos} bytes left)",
                    position=0,
                )
            if len(buf) - off < total:
                buf = read(max(total, min(READ_CHUNK, end - pos)), pos)
                buf_pos, off = pos, 0
                if len(buf) < total:
                    raise IncompleteBatchError("file shorter than the entry", position=0)
            if base != expected_base:
                raise CorruptDataError(
                    f"entry base offset {base}, expected {expected_base}", position=0
                )
            at = off + ENTRY_PREFIX_SIZE
            batch: RecordBatch | None = None
            last = base + _LAST_DELTA.unpack_from(buf, at + _LAST_DELTA_AT)[0]
            if mode == PEEK or last < skip_below:
                header = peek_header(buf, at, max_batch_bytes=max_batch_bytes)
            elif mode == DECODE:
                header, batch = decode(buf, at, base, max_batch_bytes=max_batch_bytes)
            else:
                header = check_batch(buf, at, max_batch_bytes=max_batch_bytes)
            yield pos, base, header, batch
            pos += total
            expected_base = base + header.span
    except CorruptDataError as exc:
        raise type(exc)(exc.reason, source=source, position=pos) from None


class Segment:
    """One segment of a stream, as this process knows it.

    ``size`` and ``end_offset`` describe the complete entries seen so far; for a closed
    segment they are final. Indexes of closed segments load lazily on first use.
    """

    __slots__ = (
        "_load_lock",
        "base",
        "compacted",
        "end_offset",
        "first_timestamp",
        "index",
        "index_interval",
        "indexes_loaded",
        "inode",
        "last_entry_base",
        "log_path",
        "max_timestamp",
        "size",
        "timeindex",
    )

    def __init__(
        self, directory: Path, base: int, index_interval: int, *, compacted: bool = False
    ) -> None:
        self.base = base
        self.index_interval = index_interval
        self.compacted = compacted
        """Whether the stream is compacted: the segment, once closed, may be sparse or empty."""
        self.inode = 0
        """The inode of the ``.log`` file this object describes (0: not known yet)."""
        self.log_path = directory / segment_name(base, LOG_SUFFIX)
        self.index = SparseIndex(directory / segment_name(base, INDEX_SUFFIX), OFFSET_ENTRY)
        self.timeindex = SparseIndex(directory / segment_name(base, TIMEINDEX_SUFFIX), TIME_ENTRY)
        self.size = 0
        self.end_offset = base
        self.last_entry_base = base
        self.max_timestamp = NO_TIMESTAMP
        self.first_timestamp = NO_TIMESTAMP
        self.indexes_loaded = False
        self._load_lock = fork_safe_lock()

    def __repr__(self) -> str:
        return f"<Segment {self.base}..{self.end_offset} {self.size} bytes>"

    def note_entry(
        self,
        pos: int,
        base: int,
        span: int,
        max_timestamp: int,
        total: int,
        *,
        index: bool = True,
        persist: bool = True,
    ) -> None:
        """Account for the ``total``-byte entry at ``pos``: extent, timestamps, indexes.

        The index rule: an offset-index entry is due once ``index_interval`` bytes have
        passed since the last one (the segment start counts as an implicit entry); a
        time-index entry (max timestamp so far) goes with it when that maximum grew.
        ``index=False`` skips the rule, for entries another process wrote (their index
        entries are in the files); ``persist=False`` keeps new entries in memory only,
        for rebuilds that rewrite the files at the end.
        """
        if pos == 0:
            self.first_timestamp = max_timestamp
        self.max_timestamp = max(self.max_timestamp, max_timestamp)
        self.size = pos + total
        self.end_offset = base + span
        self.last_entry_base = base
        if not index:
            return
        last = self.index.last
        if pos - (last[1] if last else 0) >= self.index_interval:
            rel = base - self.base
            self.index.append(rel, pos, persist=persist)
            last_time = self.timeindex.last
            if last_time is None or self.max_timestamp > last_time[0]:
                self.timeindex.append(self.max_timestamp, rel, persist=persist)

    def walk(
        self,
        fd: int,
        end: int,
        *,
        mode: str,
        max_batch_bytes: int,
        index: bool = True,
        persist: bool = True,
    ) -> None:
        """Walk the entries from ``self.size`` to byte ``end`` (in ``mode``, see
        :func:`iter_entries`) and account for each with :meth:`note_entry`. On an error
        the segment stays positioned after the last good entry."""
        for pos, base, header, _ in iter_entries(
            fd,
            str(self.log_path),
            self.size,
            end,
            self.end_offset,
            max_batch_bytes=max_batch_bytes,
            mode=mode,
        ):
            total = ENTRY_PREFIX_SIZE + header.size
            self.note_entry(
                pos, base, header.span, header.max_timestamp, total, index=index, persist=persist
            )

    def seal(self, *, persist: bool = True) -> None:
        """Before the segment closes: make its last time-index entry its max timestamp,
        so a closed segment's max timestamp is read from one index entry; and write an
        ``.index`` without entries if none was due, so that a closed segment missing
        one lost it."""
        last_time = self.timeindex.last
        if self.size and (last_time is None or self.max_timestamp > last_time[0]):
            self.timeindex.append(
                self.max_timestamp, self.last_entry_base - self.base, persist=persist
            )
        if persist and not self.index.keys and not self.index.path.exists():
            self.index.rewrite()

    def position_for(self, offset: int) -> tuple[int, int]:
        """Byte position and base offset of an entry at or before ``offset`` (via the index)."""
        entry = self.index.floor(offset - self.base)
        if entry is None:
            return 0, self.base
        rel, pos = entry
        return pos, self.base + rel

    def open_log(self) -> int:
        """Open the ``.log`` file for reading and check it is the file this object
        describes. Raises :class:`SegmentReplaced` if compaction put another file at
        the path, ``FileNotFoundError`` if none is there (trimmed, or merged away)."""
        fd = os.open(self.log_path, os.O_RDONLY)
        try:
            replaced = self.inode and os.fstat(fd).st_ino != self.inode
        except BaseException:
            close_quietly(fd)
            raise
        if replaced:
            close_quietly(fd)
            raise SegmentReplaced(str(self.log_path))
        return fd

    def may_be_empty(self) -> bool:
        """Whether this closed segment may hold no entry although it covers offsets: on
        a compacted stream (every record compacted away), or where an operator accepted
        the loss of its offsets (a valid ``.lost`` marker names exactly its range)."""
        return self.compacted or loss.accepted(self.log_path.parent, self.base, self.end_offset)

    def ensure_indexes(
        self,
        max_batch_bytes: int,
        exclusive: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        """Load a closed segment's indexes, rebuilding them if they are missing or bad.

        Loaded into new objects, installed only once complete: a load or rebuild that
        fails leaves this segment as it was (and the next use tries again). A rebuild
        writes the index files by path, so it runs inside ``exclusive()`` (the stream
        lock): no compaction swap can rename new index files into place between its
        check of the segment file and its writes.
        """
        if self.indexes_loaded:
            return
        with self._load_lock:
            if self.indexes_loaded:
                return
            span = self.end_offset - self.base
            index = SparseIndex(self.index.path, OFFSET_ENTRY)
            timeindex = SparseIndex(self.timeindex.path, TIME_ENTRY)
            ok = index.load(max_key=span, max_value=self.size) and timeindex.load(
                max_key=2**63 - 1, max_value=span
            )
            missing = not (index.path.exists() and timeindex.path.exists())
            if not ok or (missing and self.size) or (self.size and not len(timeindex)):
                with exclusive():
                    index, timeindex = self._rebuilt(max_batch_bytes)
            last_time = timeindex.last
            self.index, self.timeindex = index, timeindex
            self.max_timestamp = last_time[0] if last_time else NO_TIMESTAMP
            self.indexes_loaded = True

    def rebuild_indexes(self, max_batch_bytes: int) -> None:
        """Recreate both index files of a closed segment from a full scan; on failure
        nothing of this segment changes."""
        self.index, self.timeindex = self._rebuilt(max_batch_bytes)
        last_time = self.timeindex.last
        self.max_timestamp = last_time[0] if last_time else NO_TIMESTAMP

    def _rebuilt(self, max_batch_bytes: int) -> tuple[SparseIndex, SparseIndex]:
        """Both index files of this closed segment rebuilt from a full scan into a new
        :class:`Segment`, written, and returned; raises (writing nothing) if the scan
        fails or the entries do not reach the next segment's base, except that a
        segment may be empty where :meth:`may_be_empty` says so."""
        fd = self.open_log()
        log.warning("rebuilding the indexes of %s", self.log_path)
        scan = Segment(self.log_path.parent, self.base, self.index_interval)
        try:
            scan.walk(fd, self.size, mode=CHECK, max_batch_bytes=max_batch_bytes, persist=False)
        finally:
            close_quietly(fd)  # read only
        if scan.end_offset != self.end_offset and not (scan.size == 0 and self.may_be_empty()):
            raise CorruptDataError(
                f"segment ends at offset {scan.end_offset}, the next one starts at "
                f"{self.end_offset}",
                source=str(self.log_path),
            )
        scan.seal(persist=False)
        scan.index.rewrite()
        scan.timeindex.rewrite()
        return scan.index, scan.timeindex
