"""Sparse indexes beside a segment: offset -> file position, and timestamp -> offset.

Both are append-only files of fixed-size little-endian entries with strictly
increasing keys (Kafka's ``.index``/``.timeindex`` idea). They carry no checksum:
they are hints, validated when loaded and rebuilt from the segment when they are
missing, short or inconsistent, and recovery truncates them with the segment.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice
from operator import le, lt
from pathlib import Path

__all__ = ["OFFSET_ENTRY", "TIME_ENTRY", "SparseIndex"]

OFFSET_ENTRY = struct.Struct("<II")
"""relative offset (u32), file position (u32) of the first byte of a segment entry."""

TIME_ENTRY = struct.Struct("<qI")
"""max timestamp so far (i64 ms), relative offset (u32) of the entry that reached it."""

_TYPECODES = {OFFSET_ENTRY.format: ("I", "I"), TIME_ENTRY.format: ("q", "I")}


class SparseIndex:
    """An in-memory copy of one index file, kept in step with the file on disk."""

    __slots__ = ("_entry", "_file_length", "keys", "path", "values")

    def __init__(self, path: Path, entry: struct.Struct) -> None:
        self.path = path
        self._entry = entry
        key_code, value_code = _TYPECODES[entry.format]
        self.keys = array(key_code)
        self.values = array(value_code)
        self._file_length = 0

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def last(self) -> tuple[int, int] | None:
        if not self.keys:
            return None
        return self.keys[-1], self.values[-1]

    # ------------------------------------------------------------------- lookup

    def floor(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key <= ``key``."""
        i = bisect_right(self.keys, key)
        return (self.keys[i - 1], self.values[i - 1]) if i else None

    def below(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key < ``key``."""
        i = bisect_left(self.keys, key)
        return (self.keys[i - 1], self.values[i - 1]) if i else None

    # -------------------------------------------------------------- file sync

    def load(self, *, max_key: int, max_value: int, strict: bool = True) -> bool:
        """Read the whole file; return False if it is inconsistent.

        Consistent means: strictly increasing keys and non-decreasing values, and (when
        ``strict``) every entry within ``max_key``/``max_value``. Without ``strict``,
        entries past the bounds describe data this process has not seen yet: they are
        left for :meth:`refresh`. A partial trailing entry is ignored.
        """
        self.clear()
        self._file_length = 0
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return True
        usable = len(data) - len(data) % self._entry.size
        consistent = self._extend(data, max_key=max_key, max_value=max_value)
        return consistent and (not strict or self._file_length == usable)

    def refresh(self, *, max_key: int, max_value: int) -> bool:
        """Read entries another process appended since the last load or refresh.

        Entries beyond ``max_key``/``max_value`` describe data this process has not
        seen yet; they are left for a later refresh. Returns False if inconsistent.
        """
        try:
            with open(self.path, "rb") as f:
                f.seek(self._file_length)
                data = f.read()
        except FileNotFoundError:
            return not self.keys
        return self._extend(data, max_key=max_key, max_value=max_value)

    def _extend(self, data: bytes, *, max_key: int, max_value: int) -> bool:
        size = self._entry.size
        usable = len(data) - len(data) % size
        if not usable:
            return True
        pairs = list(self._entry.iter_unpack(memoryview(data)[:usable]))
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
        self._file_length += keep * size
        return True

    def append(self, key: int, value: int, *, persist: bool = True) -> None:
        """Add an entry in memory and (unless ``persist=False``) at the end of the file."""
        self.keys.append(key)
        self.values.append(value)
        if not persist:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != self._file_length:
                # A torn entry from a crash, or entries dropped in memory: the caller holds
                # the stream lock, so memory is authoritative.
                os.close(fd)
                fd = -1
                self.rewrite()
                return
            os.write(fd, self._entry.pack(key, value))
        finally:
            if fd >= 0:
                os.close(fd)
        self._file_length += self._entry.size

    def truncate(self, keep: int) -> None:
        """Keep only the first ``keep`` entries, in memory and on disk."""
        del self.keys[keep:]
        del self.values[keep:]
        self.rewrite()

    def rewrite(self) -> None:
        """Replace the file with the in-memory entries (after a rebuild or truncation).

        Written in place and then cut to length, not truncated to zero first: ext4
        flushes files truncated to zero and rewritten (``auto_da_alloc``), which costs
        milliseconds per index.
        """
        data = b"".join(self._entry.pack(k, v) for k, v in zip(self.keys, self.values))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        self._file_length = len(data)

    def clear(self) -> None:
        """Forget the in-memory entries (the file is untouched)."""
        self.keys = array(self.keys.typecode)
        self.values = array(self.values.typecode)

    def fsync(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
