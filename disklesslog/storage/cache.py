"""The process-wide read cache of object storage: :class:`BlockCache`, for object logs
and for the tiered segments of local logs.

Readers fetch byte ranges of immutable, write-once objects. Every range goes through
:meth:`BlockCache.read`, which serves it from cached *blocks* and fetches only what is
missing; writers hand each object they upload to :meth:`BlockCache.put_object`, because
the object a process just wrote is the one its readers (tailing consumers) want next.
Until read, such blocks keep to a share of the memory tier (:data:`WRITTEN_SHARE`), and
maintenance hands the objects it deletes to :meth:`BlockCache.forget_objects`, so a
writer's cache holds what is live rather than its whole history up to the bound.
The goal (docs/decisions/0006-block-cache.md): one object is downloaded at most once
per process while it stays hot.

Usage::

    cache = default_cache()  # or BlockCache(max_bytes=..., cache_dir=...)
    data = cache.read(key, start, end, lambda lo, hi: get_range(key, lo, hi), metrics=m)
    if len(data) < end - start:
        ...  # the object is shorter than the caller expected: its problem, not the cache's

Why blocks. An object is cut into aligned blocks of ``block_size`` bytes (block ``i``
covers ``[i * block_size, (i + 1) * block_size)``) and the cache is keyed by
``(object key, block index)``, as Inkless does with its 16 MiB blocks. Aligned keys
make neighbouring reads of the same object (consecutive batches, several streams packed
into one object) hit the same entries instead of caching overlapping arbitrary ranges,
turn many small range GETs into few large ones, and make the byte budget exact (it
counts each block's payload, key and a measured per-block overhead, :data:`BLOCK_OVERHEAD`,
so a cache of tiny blocks takes no more memory than its budget). Missing
blocks that are adjacent are fetched by *one* call per contiguous run, never one GET per
block. The last block of an object may be short; a short block marks the object's end,
so nothing after it is fetched.

Why single flight. When many consumers tail the same streams they ask for the same new
object at the same moment. Without coordination each would miss and issue its own GET.
The first reader of a block registers an in-flight entry; the others wait on its event
(no lock is held while fetching, nobody spins) and share the result. If the fetch
raises, every waiter gets that exception and nothing is cached, so the next read simply
retries. A reader that needs some in-flight and some missing blocks fetches its missing
runs itself and then waits for the rest. If a reader is interrupted (``KeyboardInterrupt``)
before fetching, its waiters are released to fetch for themselves.

Why the disk tier has CRCs. With ``cache_dir`` set, blocks are also written through to
local files (atomically: temp file + ``os.replace``, so several processes can share a
directory) and looked up there on memory misses, which survives restarts and spares
GETs that cost money. Local files are not trustworthy the way an object store is: a
crash can leave a renamed file whose data never reached the disk (the cache does not
``fsync``), disks rot, and another process, a tool or a person may truncate, copy or
restore files. Each file therefore starts with a 16-byte header (magic ``DLC2``,
CRC-32C of the file's name followed by the block, block length); a file that fails it
(flipped or zeroed bytes, cut short, bytes appended, empty, or another block's file
under this name) is deleted with a warning and the block fetched again: damage to the
disk tier is repaired, never reported, and bytes from it are never returned
unverified. The name is in the CRC because a block's own CRC cannot tell *which* block
it is, and a batch cannot either (see :func:`_disk_crc`). Files of an earlier version
(``DLC1``) are dropped quietly when met. File names are a hash of the object key plus
the block size and index (never the key text: keys hold slashes and are not paths),
and the directory is bounded by ``disk_max_bytes``, evicting the least recently
written or hit files first. Several processes sharing a directory each rescan it at
most every ``DISK_RESCAN_SECONDS`` to account for the others' files.

Why bytes are checked by readers, and reported back. The disk CRC proves a file holds
the bytes that were written to it, not that those bytes are what the storage holds: a
response damaged on the network (or by a proxy, or in this process's memory) would be
cached, in memory and on disk, with a valid CRC, and every later read, in this process
and in the next ones, would fail where the stored object is intact. The end-to-end
check is the batch CRC, which the writer computed; every reader checks it on every read,
from whichever tier. So the cache takes part in a protocol with its readers
(:mod:`disklesslog.objects.reader`, tiered segments):

* A reader that checks what it reads passes ``checked=True``. Blocks fetched for such a
  read are cached in memory at once (other readers may share them) but written to disk
  only when a reader confirms (:meth:`~BlockCache.confirm`) bytes in them that passed
  its check. A block whose bytes failed before anyone confirmed it never reaches the disk.
* A reader whose check fails fetches the bytes again with ``refresh=True``: their blocks
  are dropped from both tiers and fetched straight from storage, under a new epoch, so
  a load of the old bytes still under way cannot put them back, and readers that come
  later share the new fetch. It does that a bounded number of times
  (:mod:`disklesslog.retries`); bytes that still fail are dropped
  (:meth:`~BlockCache.invalidate` with their range) and reported as damage.

Confirming a block on one check is a choice: a 4 MiB block holds batches of many
streams, and waiting until every byte was checked would keep most blocks off the disk
forever. What makes it safe is the second rule: a block that reached the disk with
damage elsewhere in it is caught by the batch CRC of the reader that reads that part
(in any process), which drops it from both tiers and fetches it again. Damage in
transit therefore costs one more GET and a warning, never an error and never bad data.

Metrics (when a :class:`~disklesslog.metrics.Metrics` is passed to ``read``), per block:
``cache_hits`` (served without fetching: from memory, disk, or another reader's
fetch), ``cache_disk_hits`` (of those, from disk), ``cache_waits`` (of those, by
waiting for another reader's fetch), ``cache_misses`` (fetched by this read); and
``cache_fetches``, one per call of ``fetch``, plus ``cache_disk_discards`` for disk
files that failed their check. GETs are the caller's to count, in its ``fetch``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import re
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from ..errors import ConfigError
from ..forks import fork_safe_lock, reset_after_fork
from ..format import crc32c
from ..metrics import Metrics
from ..storage.atomic import replace_file

__all__ = [
    "BLOCK_OVERHEAD",
    "DISK_RESCAN_SECONDS",
    "WRITTEN_SHARE",
    "BlockCache",
    "block_cost",
    "configure_default_cache",
    "default_cache",
]

log = logging.getLogger("disklesslog")

DISK_HEADER = struct.Struct("<4sIQ")
"""Header of a disk-tier file: magic, CRC-32C of the file's name and then the block,
block length (16 bytes)."""
DISK_MAGIC = b"DLC2"
OLD_DISK_MAGICS = (b"DLC1",)
"""Files of earlier versions (``DLC1``: the CRC covered the block only, so a file under
another block's name passed). Dropped quietly when met: a cache needs no migration."""
DISK_SUFFIX = ".blk"
TEMP_SUFFIX = ".tmp"
DISK_RESCAN_SECONDS = 30.0
"""How often a disk tier re-lists its directory to see files other processes wrote."""
STALE_TEMP_SECONDS = 600.0
"""Temp files older than this are left over from a crashed writer and are deleted."""
_DISK_NAME = re.compile(r"[0-9a-f]{32}-[0-9a-f]+-[0-9a-f]+\.blk\Z")

_BlockKey = tuple[str, int]

BLOCK_OVERHEAD = 256
"""Bytes of memory a block in the memory tier costs besides its payload and its key's
characters, which the byte bound counts with them (:func:`block_cost`). Measured with
``tracemalloc`` on CPython 3.11, 64-bit, over 50,000 blocks: 160 B for the LRU entry (the
``(key, index)`` tuple, its ``OrderedDict`` slot and link), 33 B for the ``bytes``
header, 49 B for the key ``str``'s header (each key string is the cache's own: callers
build it per call), rounded up. Without it, a cache of 100-byte blocks (what a writer
of small flushes puts in) with 60-character keys held about 4 times its bound: 100
bytes counted of the ~400 each block takes."""

WRITTEN_SHARE = 4
"""Blocks a process put with :meth:`BlockCache.put_object` (objects it wrote) that no
read has used yet may take at most ``max_bytes // WRITTEN_SHARE`` of the memory tier.
A writer puts every object it uploads, for the tailing readers of its own process, who
read them within moments or not at all; without the share, a process that only writes
(or whose readers lag far behind) filled the whole tier with them, and kept them there
after another process's maintenance deleted them. A block read is an ordinary block."""


_COUNTERS = ("hits", "misses", "disk_hits", "waits", "fetches", "evictions", "uncacheable")


class _Flight:
    """One block being loaded by one reader; other readers of the block wait on ``done``.

    On completion exactly one holds: ``data`` is set (possibly ``b""``: the block lies
    beyond the object's end), ``error`` is set (the fetch raised), or neither (the
    loader was interrupted: waiters must load the block themselves).
    """

    __slots__ = ("data", "done", "epoch", "error")

    def __init__(self, epoch: int) -> None:
        self.done = threading.Event()
        self.data: bytes | None = None
        self.error: Exception | None = None
        self.epoch = epoch


def block_cost(key: str, data: bytes) -> int:
    """What the memory tier's byte bound counts for one block: its payload, its key's
    characters and :data:`BLOCK_OVERHEAD`."""
    return len(data) + len(key) + BLOCK_OVERHEAD


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise ConfigError(f"{name}={value} must be positive")
    return value


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"an object key must be a non-empty str, not {key!r}")
    return key


class BlockCache:
    """A thread-safe cache of fixed-size blocks of immutable objects.

    ``max_bytes`` bounds the memory tier (least recently used blocks are evicted first);
    it counts what each block really costs, payload and bookkeeping (:func:`block_cost`),
    ``block_size`` is the unit of caching and of fetching, and ``cache_dir`` (optional)
    enables the disk tier, bounded by ``disk_max_bytes``. See the module documentation.
    """

    def __init__(
        self,
        *,
        max_bytes: int = 256 << 20,
        block_size: int = 4 << 20,
        cache_dir: str | os.PathLike[str] | None = None,
        disk_max_bytes: int = 4 << 30,
    ) -> None:
        self._max_bytes = _check_size("max_bytes", max_bytes)
        self._block_size = _check_size("block_size", block_size)
        self._disk_max_bytes = _check_size("disk_max_bytes", disk_max_bytes)
        self._lock = threading.Lock()
        self._memory: OrderedDict[_BlockKey, bytes] = OrderedDict()  # oldest use first
        # Put by put_object and not read since, oldest first; never also in _memory.
        self._written: OrderedDict[_BlockKey, bytes] = OrderedDict()
        self._memory_bytes = 0  # both: what max_bytes bounds
        self._written_bytes = 0
        self._inflight: dict[_BlockKey, _Flight] = {}
        self._epoch = 0  # bumped by invalidate/clear/refresh: loads begun before do not cache
        self._unconfirmed: set[_BlockKey] = set()  # in memory, fetched for a checked read
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._disk: _DiskTier | None = None
        if cache_dir is not None:
            try:
                directory = os.fspath(cache_dir)
            except TypeError:
                directory = None
            if not isinstance(directory, str):
                raise ConfigError(f"cache_dir must be a str or os.PathLike, not {cache_dir!r}")
            self._disk = _DiskTier(directory, self._disk_max_bytes, self._block_size)
        _CACHES.add(self)

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def cache_dir(self) -> str | None:
        return None if self._disk is None else self._disk.directory

    def __repr__(self) -> str:
        return (
            f"BlockCache(max_bytes={self._max_bytes}, block_size={self._block_size}, "
            f"cache_dir={self.cache_dir!r}, disk_max_bytes={self._disk_max_bytes})"
        )

    # -- reading -----------------------------------------------------------------------

    def read(
        self,
        key: str,
        start: int,
        end: int,
        fetch: Callable[[int, int], bytes],
        *,
        metrics: Metrics | None = None,
        checked: bool = False,
        refresh: bool = False,
    ) -> bytes:
        """Bytes ``[start, end)`` of the immutable object ``key``.

        Served from cached blocks; missing blocks are fetched with
        ``fetch(range_start, range_end)`` (block-aligned; one call per contiguous run of
        missing blocks) and cached. ``fetch`` may return fewer bytes than asked at the
        object's end; if the object is shorter than ``end`` the result is short too and
        the caller decides what that means. Concurrent reads of a block share one fetch.
        Whatever ``fetch`` raises propagates, to this reader and to every reader waiting
        for the same blocks, and nothing is cached for them.

        ``checked=True`` is for a caller that checks the bytes it gets (batch checksums)
        and says how that went: :meth:`confirm` for bytes that passed, :meth:`invalidate`
        with their range for bytes that did not. Blocks such a read fetches are cached in
        memory at once but written to the disk tier only when confirmed, so bytes damaged
        on their way from storage never reach the disk, nor another process through it.

        ``refresh=True`` is for bytes that failed the caller's check: the blocks holding
        them are fetched again straight from ``fetch`` (neither tier is looked at) and
        replace what both tiers held. Loads of those blocks that other readers began
        earlier finish for them but cache nothing; readers that come later share this
        fetch.
        """
        _check_key(key)
        for name, value in (("start", start), ("end", end)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an int, not {type(value).__name__}")
            if value < 0:
                raise ConfigError(f"{name}={value} must not be negative")
        if start > end:
            raise ConfigError(f"start={start} is after end={end}")
        if start == end:
            return b""
        size = self._block_size
        first, last = start // size, (end - 1) // size
        blocks: dict[int, bytes] = {}
        if refresh:
            owned = self._reclaim(key, first, last)
            if self._disk is not None:
                self._disk.remove_blocks(key, range(first, last + 1))
            self._load(key, owned, fetch, blocks, metrics, checked=checked, from_disk=False)
        while not self._complete(blocks, first, last):
            owned, waiting = self._claim(key, first, last, blocks, metrics)
            if owned:
                self._load(key, owned, fetch, blocks, metrics, checked=checked)
            for index, flight in waiting:
                flight.done.wait()
                if flight.error is not None:
                    raise flight.error
                if flight.data is not None:  # else the loader gave up: claim it next round
                    blocks[index] = flight.data
                    self._count(metrics, hits=1, waits=1)
        return self._assemble(blocks, start, end, first, last)

    def _complete(self, blocks: dict[int, bytes], first: int, last: int) -> bool:
        """Whether ``blocks`` holds every block of ``[first, last]`` up to the object's end."""
        for index in range(first, last + 1):
            data = blocks.get(index)
            if data is None:
                return False
            if len(data) < self._block_size:
                return True
        return True

    def _claim(
        self,
        key: str,
        first: int,
        last: int,
        blocks: dict[int, bytes],
        metrics: Metrics | None,
    ) -> tuple[list[tuple[int, _Flight]], list[tuple[int, _Flight]]]:
        """Take cached blocks into ``blocks``; register flights for the missing ones
        (returned as *owned*) and return the flights of other readers to wait for."""
        owned: list[tuple[int, _Flight]] = []
        waiting: list[tuple[int, _Flight]] = []
        hits = 0
        size = self._block_size
        with self._lock:
            for index in range(first, last + 1):
                data = blocks.get(index)
                if data is None:
                    block = (key, index)
                    data = self._memory.get(block)
                    if data is not None:
                        self._memory.move_to_end(block)
                    elif (data := self._written.pop(block, None)) is not None:
                        self._memory[block] = data  # read at last: an ordinary block
                        self._written_bytes -= block_cost(key, data)
                    if data is not None:
                        blocks[index] = data
                        hits += 1
                    else:
                        flight = self._inflight.get(block)
                        if flight is None:
                            flight = self._inflight[block] = _Flight(self._epoch)
                            owned.append((index, flight))
                        else:
                            waiting.append((index, flight))
                        continue
                if len(data) < size:
                    break  # the object ends in this block
        if hits:
            self._count(metrics, hits=hits)
        return owned, waiting

    def _reclaim(self, key: str, first: int, last: int) -> list[tuple[int, _Flight]]:
        """For a refresh: forget blocks ``[first, last]`` in memory and take their flights
        over, all in one step, so no reader sees the old bytes after it, and readers
        that come later wait for this load. Flights already under way keep their
        readers; the new epoch keeps them from caching what they bring."""
        owned: list[tuple[int, _Flight]] = []
        with self._lock:
            self._epoch += 1
            for index in range(first, last + 1):
                block = (key, index)
                self._drop(block)
                flight = self._inflight[block] = _Flight(self._epoch)
                owned.append((index, flight))
        return owned

    def _load(
        self,
        key: str,
        owned: list[tuple[int, _Flight]],
        fetch: Callable[[int, int], bytes],
        blocks: dict[int, bytes],
        metrics: Metrics | None,
        *,
        checked: bool,
        from_disk: bool = True,
    ) -> None:
        """Load the blocks whose flights this reader owns: from disk (unless
        ``from_disk`` is false), else by fetching each contiguous run once. Fetched
        blocks go to disk now, or for a ``checked`` read once confirmed. Every owned
        flight is completed, whatever happens."""
        size = self._block_size
        disk = self._disk if from_disk else None
        epoch = owned[0][1].epoch  # one _claim made them all
        stores: list[tuple[int, bytes]] = []
        end_block: int | None = None  # a block known to be short: later ones are empty
        try:
            missing: list[tuple[int, _Flight]] = []
            for index, flight in owned:
                data = None
                if end_block is not None and index > end_block:
                    data = b""
                elif disk is not None:
                    data, discarded = disk.load(key, index)
                    if discarded:
                        self._count(metrics, disk_discards=1)
                    if data is not None:
                        self._count(metrics, hits=1, disk_hits=1)
                if data is None:
                    missing.append((index, flight))
                    continue
                self._finish(key, index, flight, data=data)
                blocks[index] = data
                if len(data) < size and end_block is None:
                    end_block = index
            for run in _runs(missing):
                if end_block is not None and run[0][0] > end_block:
                    for index, flight in run:
                        self._finish(key, index, flight, data=b"")
                        blocks[index] = b""
                    continue
                low, high = run[0][0] * size, (run[-1][0] + 1) * size
                try:
                    pieces = _split(fetch(low, high), len(run), size)
                except Exception as exc:
                    self._count(metrics, fetches=1, misses=len(run))
                    for index, flight in run:
                        self._finish(key, index, flight, error=exc)
                    raise
                self._count(metrics, fetches=1, misses=len(run))
                for (index, flight), data in zip(run, pieces):
                    self._finish(key, index, flight, data=data, unconfirmed=checked)
                    blocks[index] = data
                    if data and not checked:
                        stores.append((index, data))
                    if len(data) < size and end_block is None:
                        end_block = index
        finally:
            for index, flight in owned:
                if not flight.done.is_set():  # interrupted: let the waiters load it
                    self._finish(key, index, flight)
        if self._disk is not None:
            for index, data in stores:
                self._disk.store(key, index, data, lambda: epoch == self._epoch)

    def _finish(
        self,
        key: str,
        index: int,
        flight: _Flight,
        *,
        data: bytes | None = None,
        error: Exception | None = None,
        unconfirmed: bool = False,
    ) -> None:
        """Complete a flight: cache its data (unless invalidated meanwhile; as waiting for
        :meth:`confirm` if ``unconfirmed``), wake waiters."""
        block = (key, index)
        with self._lock:
            if self._inflight.get(block) is flight:
                del self._inflight[block]
            if (
                data
                and flight.epoch == self._epoch
                and self._remember(block, data)
                and unconfirmed
                and self._disk is not None
            ):
                self._unconfirmed.add(block)
        flight.data = data
        flight.error = error
        flight.done.set()

    def _remember(self, block: _BlockKey, data: bytes, *, written: bool = False) -> bool:
        """Insert a block as the most recently used (``written``: one put, not read,
        held to :data:`WRITTEN_SHARE`); evict to the byte bounds; whether it was cached
        (not if larger than its bound). Lock held."""
        self._drop(block)
        cost = block_cost(block[0], data)
        if cost > (self._max_bytes // WRITTEN_SHARE if written else self._max_bytes):
            self._counters["uncacheable"] += 1
            return False
        self._memory_bytes += cost
        if written:
            self._written[block] = data
            self._written_bytes += cost
            while self._written_bytes > self._max_bytes // WRITTEN_SHARE:
                self._evict(self._written)
        else:
            self._memory[block] = data
        while self._memory_bytes > self._max_bytes:
            # Read blocks first (written ones are held to their share), but never the
            # one just inserted: each bound alone leaves room for it.
            older_read = len(self._memory) > (0 if written else 1)
            self._evict(self._memory if older_read else self._written)
        return True

    def _evict(self, blocks: OrderedDict[_BlockKey, bytes]) -> None:
        """Evict the least recently used of ``blocks`` (``_memory`` or ``_written``).
        Lock held."""
        victim, evicted = blocks.popitem(last=False)
        cost = block_cost(victim[0], evicted)
        self._memory_bytes -= cost
        if blocks is self._written:
            self._written_bytes -= cost
        self._unconfirmed.discard(victim)  # an unconfirmed block never reaches the disk
        self._counters["evictions"] += 1

    def _drop(self, block: _BlockKey) -> None:
        """Forget a block in memory (and that it awaits confirmation). Lock held."""
        old = self._memory.pop(block, None)
        if old is not None:
            self._memory_bytes -= block_cost(block[0], old)
            self._unconfirmed.discard(block)
        old = self._written.pop(block, None)
        if old is not None:
            cost = block_cost(block[0], old)
            self._memory_bytes -= cost
            self._written_bytes -= cost

    def _assemble(
        self, blocks: dict[int, bytes], start: int, end: int, first: int, last: int
    ) -> bytes:
        size = self._block_size
        parts: list[memoryview] = []
        for index in range(first, last + 1):
            data = blocks[index]
            base = index * size
            low, high = max(start - base, 0), min(end - base, len(data))
            if high > low:
                if low == 0 and high == len(data) and first == last:
                    return data  # exactly one whole cached block: no copy
                parts.append(memoryview(data)[low:high])
            if len(data) < size:
                break
        return b"".join(parts)

    def _count(self, metrics: Metrics | None, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                if name in self._counters:  # disk_discards is the disk tier's to keep
                    self._counters[name] += value
        if metrics is not None:
            for name, value in counts.items():
                metrics.add(f"cache_{name}", value)

    # -- writing and maintenance -------------------------------------------------------

    def put_object(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Insert a whole object this process just wrote, as its most recently used
        blocks (the last block may be short), in memory and, if enabled, on disk. Until
        read, such blocks share at most ``max_bytes // WRITTEN_SHARE`` of memory
        (:data:`WRITTEN_SHARE`), the oldest evicted first."""
        _check_key(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigError(f"object data must be bytes-like, not {type(data).__name__}")
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        size = self._block_size
        if isinstance(data, bytes) and 0 < len(data) <= size:
            pieces = [data]
        else:
            pieces = [bytes(view[low : low + size]) for low in range(0, len(view), size)]
        with self._lock:
            epoch = self._epoch
            for index, piece in enumerate(pieces):
                self._remember((key, index), piece, written=True)
        if self._disk is not None:
            for index, piece in enumerate(pieces):
                self._disk.store(key, index, piece, lambda: epoch == self._epoch)

    def confirm(self, key: str, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of ``key``, got from a ``checked`` :meth:`read`, passed
        the caller's check: the blocks holding them that were fetched for a checked read
        and still wait in memory are written to the disk tier now.

        One check confirms a block: its other bytes (other batches, other streams) are
        checked by whoever reads them, and bytes that fail a check are fetched again and
        replaced in both tiers (the module documentation says why that is enough)."""
        disk = self._disk
        if disk is None or start >= end:
            return
        size = self._block_size
        ready: list[tuple[int, bytes]] = []
        with self._lock:
            if not self._unconfirmed:
                return
            epoch = self._epoch
            for index in range(start // size, (end - 1) // size + 1):
                block = (key, index)
                if block in self._unconfirmed:
                    self._unconfirmed.remove(block)
                    ready.append((index, self._memory[block]))
        for index, data in ready:
            disk.store(key, index, data, lambda: epoch == self._epoch)

    def invalidate(self, key: str, start: int = 0, end: int | None = None) -> None:
        """Drop the blocks of object ``key`` from memory and disk: all of them, or with
        ``end`` only those holding bytes ``[start, end)`` (bytes that failed a check).

        Loads already under way (of any object) finish for their readers but cache nothing.
        """
        _check_key(key)
        size = self._block_size
        indices = None
        if end is not None:
            indices = range(start // size, (end - 1) // size + 1) if end > start else range(0)
        with self._lock:
            self._epoch += 1
            if indices is None:
                doomed = {block for block in self._memory if block[0] == key}
                doomed.update(block for block in self._written if block[0] == key)
                doomed.update(block for block in self._inflight if block[0] == key)
            else:
                doomed = {(key, index) for index in indices}
            for block in doomed:
                self._drop(block)
                self._inflight.pop(block, None)
        if self._disk is not None:
            if indices is None:
                self._disk.remove_object(key)
            else:
                self._disk.remove_blocks(key, indices)

    def forget_objects(self, sizes: Mapping[str, int]) -> None:
        """The objects ``key -> size in bytes`` were deleted from storage: drop their
        blocks from memory and disk, which would otherwise hold them until their turn to
        be evicted (a writer's cache holds the objects it uploaded, which its maintenance
        deletes once retention drops them). Looks up each block (``size`` says how many; 0 for an
        unknown size means the first only), never scans the cache, and unlike
        :meth:`invalidate` leaves loads under way alone: a deleted object's bytes were
        right, and one a slow reader still loads is cached like any other block."""
        size = self._block_size
        doomed: list[tuple[str, range]] = []
        for key, length in sizes.items():
            _check_key(key)
            doomed.append((key, range(max(1, -(-length // size)))))
        with self._lock:
            for key, indices in doomed:
                for index in indices:
                    self._drop((key, index))
        if self._disk is not None:
            for key, indices in doomed:
                self._disk.remove_blocks(key, indices)

    def clear(self) -> None:
        """Drop every block, in memory and on disk (only this cache's files are removed)."""
        with self._lock:
            self._epoch += 1
            self._memory.clear()
            self._written.clear()
            self._memory_bytes = self._written_bytes = 0
            self._unconfirmed.clear()
            self._inflight.clear()
        if self._disk is not None:
            self._disk.clear()

    def stats(self) -> dict[str, int]:
        """Sizes, limits and counters: ``memory_bytes`` (what ``max_bytes`` bounds: the
        blocks' :func:`block_cost`, bookkeeping included), ``memory_blocks``,
        ``written_bytes`` and ``written_blocks`` (of those, put and not read since:
        bounded by ``max_bytes // WRITTEN_SHARE``),
        ``disk_bytes``, ``disk_blocks``, ``in_flight``, ``hits``, ``misses``,
        ``disk_hits``, ``waits``, ``fetches``, ``evictions``, ``disk_writes``,
        ``disk_evictions``, ``disk_discards``, ``unconfirmed`` (blocks of checked reads
        in memory, not yet confirmed for the disk tier), ..."""
        with self._lock:
            result = {
                "block_size": self._block_size,
                "max_bytes": self._max_bytes,
                "memory_bytes": self._memory_bytes,
                "memory_blocks": len(self._memory) + len(self._written),
                "written_bytes": self._written_bytes,
                "written_blocks": len(self._written),
                "in_flight": len(self._inflight),
                "unconfirmed": len(self._unconfirmed),
                **self._counters,
            }
        disk = self._disk.stats() if self._disk is not None else {}
        for name in ("bytes", "blocks", "max_bytes", "writes", "evictions", "discards"):
            result[f"disk_{name}"] = disk.get(name, 0)
        return dict(sorted(result.items()))

    def _after_fork(self) -> None:
        """In a forked child no other thread exists: reset locks and drop flights whose
        loaders were left behind in the parent (their waiters would wait forever)."""
        self._lock = threading.Lock()
        self._inflight = {}
        if self._disk is not None:
            self._disk.after_fork()


def _runs(missing: list[tuple[int, _Flight]]) -> list[list[tuple[int, _Flight]]]:
    """Split ascending block indices into runs of consecutive ones."""
    runs: list[list[tuple[int, _Flight]]] = []
    for item in missing:
        if runs and runs[-1][-1][0] + 1 == item[0]:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def _split(raw: object, count: int, size: int) -> list[bytes]:
    """Cut a fetched range into ``count`` blocks (short or empty past the object's end)."""
    if isinstance(raw, bytes) and count == 1 and len(raw) <= size:
        return [raw]
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TypeError(f"fetch must return bytes, not {type(raw).__name__}")
    view = memoryview(raw)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return [bytes(view[i * size : (i + 1) * size]) for i in range(count)]


class _DiskTier:
    """Block files in one directory, shared safely by threads and processes."""

    def __init__(self, directory: str, max_bytes: int, block_size: int) -> None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create cache_dir {directory!r}: {exc}") from exc
        if not os.path.isdir(directory):
            raise ConfigError(f"cache_dir {directory!r} is not a directory")
        self.directory = directory
        self._max_bytes = max_bytes
        self._block_size = block_size
        self._lock = threading.Lock()
        self._files: OrderedDict[str, int] = OrderedDict()  # name -> size, oldest first
        self._bytes = 0
        self._scanned = 0.0
        self._temp_names = itertools.count()
        self._counters = {"writes": 0, "evictions": 0, "discards": 0}
        with self._lock:
            victims = self._rescan()
        self._unlink(victims)

    def _prefix(self, key: str) -> str:
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16)
        return digest.hexdigest() + "-"

    def _name(self, key: str, index: int) -> str:
        return f"{self._prefix(key)}{self._block_size:x}-{index:x}{DISK_SUFFIX}"

    def load(self, key: str, index: int) -> tuple[bytes | None, bool]:
        """The verified block, or None; and whether a damaged file was discarded."""
        name = self._name(key, index)
        path = os.path.join(self.directory, name)
        outdated = False
        try:
            with open(path, "rb") as file:
                header = file.read(DISK_HEADER.size)
                data = None
                if len(header) == DISK_HEADER.size:
                    magic, checksum, length = DISK_HEADER.unpack(header)
                    outdated = magic in OLD_DISK_MAGICS
                    if magic == DISK_MAGIC and 0 < length <= self._block_size:
                        data = file.read(length + 1)  # one more: detects trailing bytes
                        if len(data) != length or _disk_crc(name, data) != checksum:
                            data = None
        except FileNotFoundError:
            with self._lock:
                self._forget(name)
            return None, False
        except OSError as exc:
            log.warning("block cache: cannot read %s: %s", path, exc)
            return None, False
        if data is None:
            if not outdated:
                log.warning("block cache: discarding damaged file %s (fetching again)", path)
            with contextlib.suppress(OSError):
                os.unlink(path)
            with self._lock:
                self._forget(name)
                if not outdated:
                    self._counters["discards"] += 1
            return None, not outdated
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last, also by other processes
        with self._lock:
            self._track(name, DISK_HEADER.size + len(data))
            victims = self._evict()
        self._unlink(victims)
        return data, False

    def store(self, key: str, index: int, data: bytes, valid: Callable[[], bool]) -> None:
        """Write a block through to disk atomically; ``valid()`` false (the object was
        invalidated meanwhile) cancels it, also after the file appeared."""
        size = DISK_HEADER.size + len(data)
        if not data or size > self._max_bytes or not valid():
            return
        name = self._name(key, index)
        path = os.path.join(self.directory, name)
        temp = os.path.join(
            self.directory, f".{name}.{os.getpid()}.{next(self._temp_names)}{TEMP_SUFFIX}"
        )
        header = DISK_HEADER.pack(DISK_MAGIC, _disk_crc(name, data), len(data))
        try:
            replace_file(path, [header, data], sync=False, temporary=temp)
        except OSError as exc:
            log.warning("block cache: cannot write %s: %s", path, exc)
            return
        if not valid():
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        with self._lock:
            self._counters["writes"] += 1
            self._track(name, size)
            victims = (
                self._rescan()
                if time.monotonic() - self._scanned >= DISK_RESCAN_SECONDS
                else self._evict()
            )
        self._unlink(victims)

    def remove_blocks(self, key: str, indices: Iterable[int]) -> None:
        names = [self._name(key, index) for index in indices]
        with self._lock:
            for name in names:
                self._forget(name)
        self._unlink(names)

    def remove_object(self, key: str) -> None:
        prefix = self._prefix(key)
        with self._lock:
            for name in [name for name in self._files if name.startswith(prefix)]:
                self._forget(name)
        self._unlink(name for name in self._listdir() if name.startswith(prefix))

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._bytes = 0
        self._unlink(self._listdir())

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "bytes": self._bytes,
                "blocks": len(self._files),
                "max_bytes": self._max_bytes,
                **self._counters,
            }

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def _track(self, name: str, size: int) -> None:
        """Record a file as present and most recently used. Lock held."""
        old = self._files.pop(name, None)
        if old is not None:
            self._bytes -= old
        self._files[name] = size
        self._bytes += size

    def _forget(self, name: str) -> None:
        size = self._files.pop(name, None)
        if size is not None:
            self._bytes -= size

    def _evict(self) -> list[str]:
        """Names to delete, oldest first, to get back under the bound. Lock held."""
        victims: list[str] = []
        while self._bytes > self._max_bytes and self._files:
            name, size = self._files.popitem(last=False)
            self._bytes -= size
            victims.append(name)
        self._counters["evictions"] += len(victims)
        return victims

    def _rescan(self) -> list[str]:
        """Re-read the directory (other processes' files too), oldest first. Lock held."""
        found: list[tuple[int, str, int]] = []
        now = time.time()
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    try:
                        if _DISK_NAME.match(entry.name):
                            stat = entry.stat()
                            found.append((stat.st_mtime_ns, entry.name, stat.st_size))
                        elif (
                            entry.name.startswith(".")
                            and entry.name.endswith(TEMP_SUFFIX)
                            and now - entry.stat().st_mtime > STALE_TEMP_SECONDS
                        ):
                            os.unlink(entry.path)  # left by a crashed writer
                    except OSError:
                        continue  # vanished under us: another process evicted it
        except OSError as exc:
            log.warning("block cache: cannot list %s: %s", self.directory, exc)
            return []
        found.sort()
        self._files = OrderedDict((name, size) for _, name, size in found)
        self._bytes = sum(size for _, _, size in found)
        self._scanned = time.monotonic()
        return self._evict()

    def _listdir(self) -> list[str]:
        try:
            return [name for name in os.listdir(self.directory) if _DISK_NAME.match(name)]
        except OSError as exc:
            log.warning("block cache: cannot list %s: %s", self.directory, exc)
            return []

    def _unlink(self, names: Iterable[str]) -> None:
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, name))


def _disk_crc(name: str, data: bytes) -> int:
    """The checksum of a disk-tier file: CRC-32C of its name (which names the object, the
    block size and the block), then of the block. A file is valid only under its own
    name, so one copied, restored or renamed over another block's name fails like
    damage: its block would pass a CRC of the block alone, and could hold a batch of
    another stream with the very offsets and size a reader expects, which no later
    check would catch."""
    return crc32c(data, crc32c(name.encode("ascii")))


def _reset_after_fork(cache: BlockCache) -> None:
    cache._after_fork()


_CACHES: weakref.WeakSet[BlockCache] = reset_after_fork(_reset_after_fork)


class _Default:
    """Holder of the process-wide cache (created on first use)."""

    lock = fork_safe_lock()
    cache: BlockCache | None = None


def default_cache() -> BlockCache:
    """The process-wide :class:`BlockCache`, created with default settings on first use."""
    with _Default.lock:
        if _Default.cache is None:
            _Default.cache = BlockCache()
        return _Default.cache


def configure_default_cache(
    *,
    max_bytes: int = 256 << 20,
    block_size: int = 4 << 20,
    cache_dir: str | os.PathLike[str] | None = None,
    disk_max_bytes: int = 4 << 30,
) -> BlockCache:
    """Replace the process-wide cache with a new, empty one built with these settings.

    Readers that already hold the old cache keep using it; new lookups of
    :func:`default_cache` get the new one.
    """
    cache = BlockCache(
        max_bytes=max_bytes,
        block_size=block_size,
        cache_dir=cache_dir,
        disk_max_bytes=disk_max_bytes,
    )
    with _Default.lock:
        _Default.cache = cache
    return cache
