"""Sparse indexes beside a segment: offset -> file position, and timestamp -> offset.

Both are files of fixed-size little-endian entries with strictly increasing keys
(Kafka's ``.index``/``.timeindex`` idea) after a 16-byte header: a magic, the number of
entries, the CRC-32C of the entries and the header's own CRC-32C (``docs/format.md``
2.4). Appending writes the entry, then the header. The count makes a file cut short
detectable (a ``.timeindex`` missing its last entries would give a closed segment too
low a max timestamp, and time lookups a later offset); the checksum makes a damaged
entry detectable. They are hints: a file that is missing, fails its checks, is
inconsistent or has no header (written by version 1) is rebuilt from the segment, and
recovery truncates them with the segment.
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice
from operator import le, lt
from pathlib import Path

from ..format import crc32c
from .layout import close_quietly

__all__ = ["HEADER", "OFFSET_ENTRY", "TIME_ENTRY", "Entries", "SparseIndex"]

log = logging.getLogger("disklesslog")

OFFSET_ENTRY = struct.Struct("<II")
"""relative offset (u32), file position (u32) of the first byte of a segment entry."""

TIME_ENTRY = struct.Struct("<qI")
"""max timestamp so far (i64 ms), relative offset (u32) of the entry that reached it."""

HEADER = struct.Struct("<4sIII")
"""magic, entry count (u32), CRC-32C of the entries (u32), CRC-32C of bytes 0..12 (u32)."""

_HEAD = struct.Struct("<4sII")  # the header's bytes 0..12
_U32 = struct.Struct("<I")
_MAGICS = {OFFSET_ENTRY.format: b"DLXO", TIME_ENTRY.format: b"DLXT"}
_TYPECODES = {OFFSET_ENTRY.format: ("I", "I"), TIME_ENTRY.format: ("q", "I")}


class Entries:
    """Index entries in memory, looked up by key: strictly increasing ``keys`` and their
    ``values``, in arrays typed for ``entry`` (:data:`OFFSET_ENTRY` or :data:`TIME_ENTRY`).
    Local segments keep them in step with their files (:class:`SparseIndex`); tiered
    segments parse them from their index objects."""

    __slots__ = ("keys", "values")

    def __init__(self, entry: struct.Struct) -> None:
        key_code, value_code = _TYPECODES[entry.format]
        self.keys = array(key_code)
        self.values = array(value_code)

    def floor(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key <= ``key``."""
        i = bisect_right(self.keys, key)
        return (self.keys[i - 1], self.values[i - 1]) if i else None

    def below(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key < ``key``."""
        i = bisect_left(self.keys, key)
        return (self.keys[i - 1], self.values[i - 1]) if i else None


class SparseIndex(Entries):
    """An in-memory copy of one index file, kept in step with the file on disk.

    ``_disk`` is how many of the file's entries the memory holds (a prefix: a reader
    in another process leaves entries for data it has not seen yet), ``_disk_crc`` their
    CRC-32C, which the next entries' checksum continues.
    """

    __slots__ = ("_disk", "_disk_crc", "_entry", "_magic", "path", "tidy")

    def __init__(self, path: Path, entry: struct.Struct) -> None:
        super().__init__(entry)
        self.path = path
        self._entry = entry
        self._magic = _MAGICS[entry.format]
        self._disk = 0
        self._disk_crc = 0
        self.tidy = True
        """Whether the last :meth:`load` found nothing after the counted entries."""

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def last(self) -> tuple[int, int] | None:
        if not self.keys:
            return None
        return self.keys[-1], self.values[-1]

    # -------------------------------------------------------------- file sync

    def load(self, *, max_key: int, max_value: int, strict: bool = True) -> bool:
        """Read the whole file; return False if it fails its checks or is inconsistent.

        A missing file holds no entries. Otherwise the header must be valid, the file
        must hold the ``count`` entries it names with their checksum, the keys must
        strictly increase and the values never decrease, and (when ``strict``) the file
        must hold nothing more and every entry be within ``max_key``/``max_value``.
        Without ``strict`` (an active segment's index, being appended to), bytes after
        the counted entries are an entry whose header is not written yet, and entries
        past the bounds describe data this process has not seen yet: both are left for
        :meth:`refresh`.
        """
        self.clear()
        self.tidy = True
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return True
        header = self._header(data)
        if header is None:
            return False
        count, crc = header
        end = self._end(count)
        self.tidy = len(data) == end
        if len(data) < end or (strict and not self.tidy):
            return False
        entries = memoryview(data)[HEADER.size : end]
        if crc32c(entries) != crc:
            return False
        consistent = self._extend(entries, max_key=max_key, max_value=max_value)
        return consistent and (not strict or self._disk == count)

    def refresh(self, *, max_key: int, max_value: int) -> bool:
        """Read entries another process appended since the last load or refresh.

        Entries beyond ``max_key``/``max_value`` describe data this process has not
        seen yet; they are left for a later refresh. Returns False if the file fails its
        checks or is inconsistent (rewritten by a recovery meanwhile: the memory, only
        hints, stays as it is).
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return not self.keys
        try:
            header = self._header(os.pread(fd, HEADER.size, 0))
            if header is None or header[0] < self._disk:
                return False
            count, crc = header
            size = (count - self._disk) * self._entry.size
            data = os.pread(fd, size, self._end(self._disk))
        finally:
            close_quietly(fd)  # read only
        if len(data) != size or crc32c(data, self._disk_crc) != crc:
            return False
        return self._extend(data, max_key=max_key, max_value=max_value)

    def _header(self, data: bytes) -> tuple[int, int] | None:
        """``(count, entries CRC)`` from a valid header at the start of ``data``."""
        if len(data) < HEADER.size:
            return None
        magic, count, crc, header_crc = HEADER.unpack_from(data)
        if magic != self._magic or header_crc != crc32c(memoryview(data)[: HEADER.size - 4]):
            return None
        return count, crc

    def _pack_header(self, count: int, crc: int) -> bytes:
        head = _HEAD.pack(self._magic, count, crc)
        return head + _U32.pack(crc32c(head))

    def _extend(self, data: bytes | memoryview, *, max_key: int, max_value: int) -> bool:
        size = self._entry.size
        if not len(data):
            return True
        pairs = list(self._entry.iter_unpack(data))
        keys = array(self.keys.typecode, [pair[0] for pair in pairs])
        values = array(self.values.typecode, [pair[1] for pair in pairs])
        if (
            (self.keys and keys[0] <= self.keys[-1])
            or (self.values and values[0] < self.values[-1])
            or not all(map(lt, keys, islice(keys, 1, None)))
            or not all(map(le, values, islice(values, 1, None)))
        ):
            return False
        keep = min(bisect_right(keys, max_key), bisect_right(values, max_value))
        self.keys.extend(keys[:keep])
        self.values.extend(values[:keep])
        self._disk += keep
        self._disk_crc = crc32c(data[: keep * size], self._disk_crc)
        return True

    def append(self, key: int, value: int, *, persist: bool = True) -> None:
        """Add an entry in memory and (unless ``persist=False``) to the file: the entry
        at its end, then the header counting it."""
        self.keys.append(key)
        self.values.append(value)
        if not persist:
            return
        if len(self.keys) != self._disk + 1:  # entries held in memory only: write them all
            self.rewrite()
            return
        # The caller holds the stream lock, so memory is authoritative: the entry goes
        # right after the counted ones (over a torn one a crash left there). Should the
        # file differ from memory anyway, its checksum tells the next load.
        entry = self._entry.pack(key, value)
        crc = crc32c(entry, self._disk_crc)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            # Shorter than the entries this process wrote: another process's open, which
            # cuts the entries after the recovery point and writes them again, was killed
            # half-way. An entry written past the end would leave a hole that fails the
            # checksum (and every later open would rebuild the index), so the memory,
            # complete, is written whole instead.
            cut_short = bool(self._disk) and os.fstat(fd).st_size < self._end(self._disk)
            if not cut_short and self._disk:
                os.pwrite(fd, entry, self._end(self._disk))
                os.pwrite(fd, self._pack_header(self._disk + 1, crc), 0)
            elif not cut_short:
                os.pwrite(fd, self._pack_header(1, crc) + entry, 0)
        finally:
            os.close(fd)
        if cut_short:
            log.warning("%s was cut short by another process; writing it again", self.path)
            self.rewrite()
            return
        self._disk += 1
        self._disk_crc = crc

    def _end(self, count: int) -> int:
        """The file's length with ``count`` entries."""
        return HEADER.size + count * self._entry.size

    def truncate(self, keep: int) -> None:
        """Keep only the first ``keep`` entries, in memory and on disk."""
        del self.keys[keep:]
        del self.values[keep:]
        self.rewrite()

    def rewrite(self) -> None:
        """Replace the file with the in-memory entries (after a rebuild or truncation).

        Written in place and then cut to length, not truncated to zero first: ext4
        flushes files truncated to zero and rewritten (``auto_da_alloc``), which costs
        milliseconds per index. A reader meeting it half-written sees a bad checksum.
        """
        entries = b"".join(self._entry.pack(k, v) for k, v in zip(self.keys, self.values))
        crc = crc32c(entries)
        data = self._pack_header(len(self.keys), crc) + entries
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        self._disk, self._disk_crc = len(self.keys), crc
        self.tidy = True

    def clear(self) -> None:
        """Forget the in-memory entries (the file is untouched)."""
        self.keys = array(self.keys.typecode)
        self.values = array(self.values.typecode)
        self._disk, self._disk_crc = 0, 0

    def fsync(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            close_quietly(fd)  # opened to fsync, which succeeded or raised
