"""Key compaction of one local stream: a cleaner pass over its closed segments.

Kafka's log cleaner, for segment files. A pass holds the stream's cleaner lock (one
compactor per stream, across processes) and:

1. finishes or rolls back a swap a crashed compactor left, and clears the staging
   directory;
2. weighs the *dirty ratio*: the bytes of closed segments from the checkpoint on (not
   compacted yet) over the bytes of all closed segments; below
   ``min_cleanable_dirty_ratio`` it stops, unless forced;
3. maps the keys of the dirty segments, whole segments at a time, stopping before a
   segment once the map holds ``max_keys`` keys: the *cleanable end* is where it
   stopped (at most the active segment's base, which is never touched);
4. scans every closed segment from the start to the cleanable end for records to drop
   (superseded by a mapped key, or tombstones past ``delete_retention_ms``). A segment
   with something to drop starts a *group*; the following segments join it, changed or
   not, while the rewritten group is estimated to stay within ``segment_bytes``. Each
   group is rewritten as one new segment in the staging directory, named after its
   first segment, its batches tiling exactly the offsets the group covered;
5. swaps the new segments in under the stream lock (:meth:`StreamStore.replace_segments`,
   :mod:`.swap`), which also moves the checkpoint to the cleanable end; when nothing
   changed, only the checkpoint moves.

Besides the key map, memory stays bounded by a chunk of survivors: segments are
streamed, and a segment that is rewritten is read again rather than held (closed
segments never change, and the cleaner lock keeps other compactors away; retention may
delete one meanwhile, which the swap notices and refuses).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..config import StreamConfig
from ..errors import CorruptDataError
from ..format import HEADER_SIZE
from ..maintenance.compaction import (
    KeyMap,
    Piece,
    dirty_ratio,
    encode_piece,
    horizon,
    payload_bytes,
    retile,
    survivors,
    target_batch_bytes,
)
from ..maintenance.report import MaintenanceReport, Progress
from ..records import RecordBatch
from ..storage.atomic import fsync_directory
from . import swap
from .layout import (
    INDEX_SUFFIX,
    TIMEINDEX_SUFFIX,
    close_quietly,
    segment_name,
)
from .segment import DECODE, ENTRY_PREFIX, ENTRY_PREFIX_SIZE, Segment, SegmentReplaced, iter_entries
from .stream_store import StreamStore

__all__ = ["compact_stream"]

_U32_MAX = (1 << 32) - 1
_CHUNK_PIECES = 8
"""Survivors are laid out (:func:`retile`) a chunk of about this many target-size
batches at a time, so a rewrite never holds a whole segment's records."""


class _Changed(Exception):
    """Internal: a segment the pass reads was deleted or replaced meanwhile."""


@dataclass
class _Scan:
    """What compaction does to one closed segment."""

    seg: Segment
    size: int
    records: int = 0
    kept: int = 0
    estimate: int = 0
    """Bytes the survivors take rewritten (generous: :func:`payload_bytes` + framing)."""

    @property
    def changed(self) -> bool:
        return self.kept != self.records


def compact_stream(
    store: StreamStore,
    *,
    now_ms: int,
    force: bool,
    dry_run: bool,
    progress: Progress | None,
    max_keys: int,
    config: StreamConfig | None = None,
) -> MaintenanceReport:
    """One cleaner pass over ``store``'s stream (see the module docstring). Returns
    what it did, or with ``dry_run`` what it would do (then it writes nothing).
    ``config`` is the stream's current config (``Log.alter_stream`` may have changed
    its maintenance settings since ``store`` was opened)."""
    name, directory = store.name, store.directory
    try:
        with swap.cleaner_lock(directory, create=not dry_run) as mine:
            if not mine:
                return _skipped(name, dry_run, "another process is compacting it")
            store.recover_swap()
            cleaner = _Pass(store, config or store.config, now_ms, dry_run, progress, max_keys)
            try:
                return cleaner.run(force)
            except _Changed:
                return _skipped(
                    name,
                    dry_run,
                    "segments were deleted (by retention?) during the pass; nothing was "
                    "swapped, compact again",
                )
            finally:
                cleaner.abandon()
    except FileNotFoundError:
        if directory.exists():
            raise
        return _skipped(name, dry_run, "deleted during the pass")


def _skipped(name: str, dry_run: bool, why: str) -> MaintenanceReport:
    report = MaintenanceReport("compaction", dry_run=dry_run)
    report.skipped.append(f"{name}: {why}")
    return report


class _Pass:
    """The steps of one pass, with its counters (the report and the progress)."""

    def __init__(
        self,
        store: StreamStore,
        config: StreamConfig,
        now_ms: int,
        dry_run: bool,
        progress: Progress | None,
        max_keys: int,
    ) -> None:
        self.store = store
        self.config = config
        self.name = store.name
        self.directory = store.directory
        self.cutoff = horizon(config, now_ms)
        self.dry_run = dry_run
        self.progress = progress
        self.max_keys = max_keys
        self.report = MaintenanceReport("compaction", dry_run=dry_run)
        self.segments_read: set[int] = set()
        self.done = 0
        self.total = 0
        self.groups: list[_Group] = []

    def run(self, force: bool) -> MaintenanceReport:
        snap = self.store.snapshot()
        closed = [
            (seg, size) for seg, size in snap.segments[:-1] if seg.end_offset > snap.start_offset
        ]
        if not closed:
            return _skipped(self.name, self.dry_run, "nothing to compact: no closed segments")
        stored = swap.read_checkpoint(self.directory)
        checkpoint = min(max(stored, closed[0][0].base), closed[-1][0].end_offset)
        clean = sum(size for seg, size in closed if seg.end_offset <= checkpoint)
        everything = sum(size for _, size in closed)
        ratio = dirty_ratio(clean, everything - clean)
        minimum = self.config.min_cleanable_dirty_ratio
        if ratio < minimum and not force:
            return _skipped(
                self.name,
                self.dry_run,
                f"dirty ratio {ratio:.2f} is below min_cleanable_dirty_ratio {minimum} "
                "(force=True, or --force, compacts anyway)",
            )
        self.total = 2 * everything - clean  # the key map reads the dirty bytes, the scan all
        self._advance(None, 0)
        key_map, end = self._map_keys(closed, checkpoint)
        self._stage(closed, end, key_map)
        self._advance(None, 0, finished=True)
        self.report.add(segments_read=len(self.segments_read))
        if not self.groups:
            if not self.dry_run and end > stored:
                swap.write_checkpoint(self.directory, end, sync=self.store.durable)
            self.report.skipped.append(f"{self.name}: nothing to remove (dirty ratio {ratio:.2f})")
            return self.report
        if not self.dry_run:
            self._swap(end)
        self._account(ratio)
        return self.report

    def abandon(self) -> None:
        """Close what a failed pass left open and remove its staging directory (unless
        an intent needs it: recovery finishes that swap)."""
        for group in self.groups:
            group.abandon()
        if not self.dry_run:
            swap.drop_staging(self.directory)

    def _map_keys(self, closed: list[tuple[Segment, int]], checkpoint: int) -> tuple[KeyMap, int]:
        """The key map of the dirty segments, whole segments until it holds
        ``max_keys`` keys, and the cleanable end: where it stopped."""
        key_map = KeyMap(self.max_keys)
        end = checkpoint
        for seg, size in closed:
            if seg.end_offset <= checkpoint:
                continue
            if key_map.full and end > checkpoint:
                break
            for batch in _batches(seg, size, self.config):
                key_map.add(batch)
            end = seg.end_offset
            self._advance(seg, size)
        return key_map, end

    def _stage(self, closed: list[tuple[Segment, int]], end: int, key_map: KeyMap) -> None:
        """Scan the closed segments below ``end``; group those to rewrite and write each
        group as a new segment in the staging directory (in a dry run, only measure)."""
        staging = None if self.dry_run else swap.clear_staging(self.directory)
        group: _Group | None = None
        for seg, size in closed:
            if seg.base >= end:
                break
            scan = _scan(seg, size, self.config, key_map, self.cutoff)
            self._advance(seg, size)
            if group is not None and not group.fits(scan):
                group.close()
                group = None
            if group is None and scan.changed:
                group = _Group(staging, seg.base, self.config, sync=self.store.durable)
                self.groups.append(group)
            if group is not None:
                self.total += size
                group.add(scan, _rewrite(seg, size, self.config, key_map, self.cutoff))
                self._advance(seg, size)
                if staging is not None and len(self.groups) == 1 and len(group.members) == 1:
                    swap.crash_point("staging")
        if group is not None:
            group.close()
        if staging is not None and self.store.durable:
            fsync_directory(staging)

    def _swap(self, end: int) -> None:
        """Swap the staged groups in (:meth:`StreamStore.replace_segments`); the
        checkpoint moves to ``end`` with them."""
        swap.crash_point("staged")
        intent = swap.Intent(
            end,
            tuple(
                swap.Replaced(scan.seg.base, scan.seg.inode, scan.size)
                for group in self.groups
                for scan in group.members
            ),
            tuple(group.staged for group in self.groups if group.staged is not None),
        )
        if not self.store.replace_segments(intent):
            raise _Changed

    def _account(self, ratio: float) -> None:
        members = [scan for group in self.groups for scan in group.members]
        removed = sum(scan.records - scan.kept for scan in members)
        old_bytes = sum(scan.size for scan in members)
        new_bytes = sum(group.size for group in self.groups)
        self.report.add(
            records_removed=removed,
            bytes_removed=old_bytes - new_bytes,
            segments_written=len(self.groups),
            bytes_written=new_bytes,
            segments_deleted=len(members),
            bytes_deleted=old_bytes,
        )
        self.report.actions.append(
            f"{self.name}: {len(members):,} segments rewritten into {len(self.groups):,}, "
            f"{removed:,} records removed, dirty ratio {ratio:.2f}"
        )

    def _advance(self, seg: Segment | None, size: int, *, finished: bool = False) -> None:
        """Count ``size`` bytes read from ``seg`` and tell ``progress``."""
        if seg is not None:
            self.segments_read.add(seg.base)
            self.report.add(bytes_read=size)
            self.done += size
        if finished:
            self.total = self.done
        if self.progress is not None:
            self.progress(f"compact {self.name}", self.done, max(self.total, self.done))


# ---------------------------------------------------------------------- reading


def _batches(seg: Segment, size: int, config: StreamConfig) -> Iterator[RecordBatch]:
    """The decoded batches of a closed segment, checked to reach its end offset."""
    try:
        fd = seg.open_log()
    except (FileNotFoundError, SegmentReplaced):
        raise _Changed from None
    try:
        end = seg.base
        for _, base, header, batch in iter_entries(
            fd,
            str(seg.log_path),
            0,
            size,
            seg.base,
            max_batch_bytes=config.max_batch_bytes,
            mode=DECODE,
        ):
            end = base + header.span
            if batch is not None:
                yield batch
        if end != seg.end_offset and (size or not seg.compacted):
            raise CorruptDataError(
                f"entries end at offset {end}, the segment should reach {seg.end_offset}",
                source=str(seg.log_path),
            )
    finally:
        close_quietly(fd)  # read only


def _scan(seg: Segment, size: int, config: StreamConfig, key_map: KeyMap, cutoff: int) -> _Scan:
    """Count what compaction keeps of ``seg`` (nothing is held in memory)."""
    scan = _Scan(seg, size)
    target = target_batch_bytes(config)
    for batch in _batches(seg, size, config):
        kept = survivors(batch, key_map, cutoff)
        scan.records += len(batch)
        if kept is not None:
            scan.kept += len(kept)
            scan.estimate += payload_bytes(kept)
    if scan.kept:  # framing of the batches the survivors will be cut into
        scan.estimate += (scan.estimate // target + 1) * (ENTRY_PREFIX_SIZE + HEADER_SIZE)
    return scan


def _rewrite(
    seg: Segment, size: int, config: StreamConfig, key_map: KeyMap, cutoff: int
) -> Iterator[Piece]:
    """The survivors of ``seg`` as pieces that tile its offsets, a chunk at a time (a
    chunk without survivors yields nothing: a gap the group writer closes)."""
    target = target_batch_bytes(config)
    start, payload = seg.base, 0
    chunk: list[RecordBatch] = []
    for batch in _batches(seg, size, config):
        kept = survivors(batch, key_map, cutoff)
        if kept is not None:
            chunk.append(kept)
            payload += payload_bytes(kept)
        if payload >= _CHUNK_PIECES * target:
            stop = chunk[-1].offsets[-1] + 1
            yield from retile(start, stop, chunk, target_bytes=target)
            start, payload, chunk = stop, 0, []
    yield from retile(start, seg.end_offset, chunk, target_bytes=target)


# ---------------------------------------------------------------------- writing


class _Group:
    """Consecutive closed segments rewritten as one new segment (staged, or only
    measured in a dry run).

    Pieces arrive in offset order, each tiling part of the group's range; the last one
    is held back, so that offsets left without any survivor (a gap: a chunk or a whole
    segment compacted away) are absorbed into the piece before them, or, at the start
    of the group, into the first piece after them. A group without survivors is an
    empty segment file.
    """

    def __init__(self, staging: Path | None, base: int, config: StreamConfig, *, sync: bool):
        self.base = base
        self.end = base
        self.config = config
        self.members: list[_Scan] = []
        self.estimate = 0
        self.size = 0
        self.staged: swap.Staged | None = None
        self._sync = sync
        self._pending: Piece | None = None
        self._segment: Segment | None = None
        self._file: BinaryIO | None = None
        if staging is not None:
            self._segment = Segment(staging, base, config.index_interval_bytes)
            self._file = open(self._segment.log_path, "wb", buffering=1 << 20)  # noqa: SIM115

    def fits(self, scan: _Scan) -> bool:
        """Whether ``scan``'s segment may join: the estimated result stays within
        ``segment_bytes`` and the offsets within what a segment's indexes can address."""
        return (
            self.estimate + scan.estimate <= self.config.segment_bytes
            and scan.seg.end_offset - self.base <= _U32_MAX
        )

    def add(self, scan: _Scan, pieces: Iterator[Piece]) -> None:
        """Write the pieces of a member segment (all of them tiling its offsets)."""
        for piece in pieces:
            pending = self._pending
            if pending is not None:
                if piece.base > pending.end:  # a gap after the pending piece
                    pending = Piece(pending.base, piece.base - pending.base, pending.records)
                self._write(pending)
                self._pending = piece
            elif piece.base > self.base:  # a gap opens the group
                self._pending = Piece(self.base, piece.end - self.base, piece.records)
            else:
                self._pending = piece
        self.members.append(scan)
        self.estimate += scan.estimate
        self.end = scan.seg.end_offset

    def close(self) -> None:
        """Write the held-back piece, then finish the staged files: the ``.log``
        synced, the indexes sealed, written and synced; note their inodes."""
        pending = self._pending
        if pending is not None:
            if pending.end < self.end:  # a gap closes the group
                pending = Piece(pending.base, self.end - pending.base, pending.records)
            self._write(pending)
            self._pending = None
        segment, file = self._segment, self._file
        if segment is None or file is None:
            return
        self._file = None
        with file:
            file.flush()
            if self._sync:
                os.fsync(file.fileno())
            log_inode = os.fstat(file.fileno()).st_ino
        segment.seal(persist=False)
        segment.index.rewrite()
        segment.timeindex.rewrite()
        if self._sync:
            segment.index.fsync()
            segment.timeindex.fsync()
        staging = segment.log_path.parent
        index_inode = os.stat(staging / segment_name(self.base, INDEX_SUFFIX)).st_ino
        time_inode = os.stat(staging / segment_name(self.base, TIMEINDEX_SUFFIX)).st_ino
        self.staged = swap.Staged(self.base, self.size, (log_inode, index_inode, time_inode))

    def abandon(self) -> None:
        """Close the staged file of a pass that failed (the directory goes with it)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, piece: Piece) -> None:
        encoded = encode_piece(piece, self.config)
        total = ENTRY_PREFIX_SIZE + encoded.size
        if self._file is not None and self._segment is not None:
            self._file.write(ENTRY_PREFIX.pack(piece.base))
            self._file.write(encoded.header)
            self._file.write(encoded.body)
            self._segment.note_entry(
                self.size, piece.base, piece.span, encoded.max_timestamp, total, persist=False
            )
        self.size += total
