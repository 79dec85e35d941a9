"""Tiering of a local log (KIP-405's remote log manager, as explicit calls): copy closed
segments to object storage, delete local copies past local retention, collect garbage.

Per stream, :func:`tier_stream` walks the closed segments after the verified tiered
ones, oldest first, and for each:

1. reads the local file once through one descriptor (so the bytes cannot change under
   it), checks every batch and the offset chain, builds the ``.index``/``.timeindex``
   objects by the local index rule, and computes the CRC-32C that names its keys;
2. under the stream lock, records it in the manifest as ``copying`` (nothing is
   uploaded that no manifest names, so garbage collection never mistakes an upload in
   progress for an orphan);
3. uploads the three objects, or adopts them if a crashed or concurrent run left them
   complete, and reads each back (size and CRC-32C);
4. under the stream lock, marks the entry ``tiered``; readers may use it from now on.

Then the local copies of tiered segments past ``local_retention_ms``/``_bytes`` go
(the retention rule, :func:`~disklesslog.maintenance.retention.retention_point`),
never beyond the verified tiered segments: the state record's start offset moves, the
stream's start offset stays at the oldest tiered segment.

A crash anywhere leaves a state the next run finishes: a ``copying`` entry is picked up
again (same segment, same keys) and its objects adopted or re-uploaded; a ``tiered``
entry whose local copy was not deleted yet is deleted by the next run. Two runs at
once do the same work twice and agree (keys are content addressed).

:func:`collect_garbage` deletes objects the manifests list as garbage once their grace
period has passed, then reconciles: objects under the tier prefix that no manifest
names (an upload that failed before its ``copying`` entry could be replaced, the
segments of a deleted stream) are deleted once they are older than the grace period.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...config import StreamConfig
from ...errors import CorruptDataError, OffsetOutOfRange
from ...format import crc32c
from ...maintenance.grace import resolve_grace
from ...maintenance.report import MaintenanceReport, Progress
from ...maintenance.retention import retention_point
from ..index import OFFSET_ENTRY, TIME_ENTRY
from ..layout import STREAMS, close_quietly
from ..segment import CHECK, Segment
from ..stream_store import Snapshot, StreamStore
from . import manifest as manifests
from .manifest import COPYING, TIERED, Manifest, TieredObject, TieredSegment
from .reader import TieredReader, local_units, make_view
from .target import STREAMS_PREFIX, Tier

if TYPE_CHECKING:
    from ..log import SegmentLog

__all__ = ["Tally", "collect_garbage", "tier_stream", "trim_stream"]

_TASK = "tiering"


@dataclass
class _Prepared:
    """A closed local segment read for upload: the open file and what it holds."""

    base: int
    end: int
    size: int
    fd: int
    crc: int
    max_timestamp: int
    index: bytes
    timeindex: bytes


@dataclass
class Tally:
    """Bytes uploaded so far in one run, for the progress callback."""

    progress: Progress | None
    done: int = 0
    total: int = 0

    def plan(self, size: int) -> None:
        self.total += size
        self.report()

    def advance(self, size: int) -> None:
        self.done += size
        self.report()

    def report(self) -> None:
        if self.progress is not None:
            self.progress(_TASK, self.done, self.total)


def _now_ms() -> int:
    return int(time.time() * 1000)


@contextlib.contextmanager
def _locked(store: StreamStore) -> Iterator[Snapshot]:
    """Hold the stream lock, caught up with other processes: the only place the manifest
    changes. Yields the current snapshot; a stream deleted meanwhile raises (its
    directory may already hold a new stream of the same name)."""
    with store.locked():
        yield store.snapshot()


def _keys(name: str, incarnation: str, prepared: _Prepared) -> tuple[str, str, str]:
    """The write-once keys of a segment: stream, manifest incarnation, base and end
    offsets and the CRC-32C of the ``.log`` (the indexes follow from it)."""
    stem = (
        f"{STREAMS_PREFIX}/{name}/{incarnation}/"
        f"{prepared.base:020d}-{prepared.end:020d}-{prepared.crc:08x}"
    )
    return f"{stem}.log", f"{stem}.index", f"{stem}.timeindex"


# ------------------------------------------------------------------ tiering


def tier_stream(
    log: SegmentLog,
    tiered: TieredReader,
    name: str,
    *,
    dry_run: bool,
    now_ms: int,
    tally: Tally,
) -> MaintenanceReport:
    """Tier one stream's closed segments, then delete local copies past local retention."""
    report = MaintenanceReport(_TASK, dry_run=dry_run)

    def run(store: StreamStore) -> None:
        config = log.read_config(name)  # local_retention_* may be altered at any time
        if config.compacted:
            report.skipped.append(
                f"{name}: cleanup_policy={config.cleanup_policy!r}: compacted streams are "
                "not tiered (as in Kafka)"
            )
            return
        planned = _copy_segments(store, tiered, name, report, dry_run=dry_run, tally=tally)
        _delete_local_copies(
            store, config, name, report, dry_run=dry_run, now_ms=now_ms, planned=planned
        )

    log.with_store(name, run, create=False)
    return report


def _candidates(store: StreamStore, tiered: TieredReader) -> list[tuple[Segment, int]]:
    """Closed local segments after the verified tiered ones, oldest first."""
    v = tiered.view(store)
    snap = v.snapshot
    closed = [  # an empty segment (it spans no offsets) needs no copy
        (seg, size)
        for seg, size in snap.segments[:-1]
        if seg.end_offset > snap.start_offset and seg.end_offset > seg.base and size
    ]
    tiered_end = v.manifest.tiered_end() if v.manifest is not None else None
    if tiered_end is None or tiered_end < snap.start_offset:
        return closed
    return [(seg, size) for seg, size in closed if seg.base >= tiered_end]


def _copy_segments(
    store: StreamStore,
    tiered: TieredReader,
    name: str,
    report: MaintenanceReport,
    *,
    dry_run: bool,
    tally: Tally,
) -> int | None:
    """Steps 1-4 of the module documentation for each candidate; returns the end offset
    the run tiered (or, in a dry run, would tier) up to, ``None`` if nothing."""
    candidates = _candidates(store, tiered)
    tally.plan(sum(size for _, size in candidates))
    copied: list[tuple[int, int, int]] = []  # base, end, size
    adopted = 0
    for seg, size in candidates:
        if dry_run:
            report.add(segments_read=1, bytes_read=size, objects_written=3, bytes_written=size)
            copied.append((seg.base, seg.end_offset, size))
            continue
        try:
            prepared = _prepare(store, seg, size)
        except FileNotFoundError:
            break  # trimmed meanwhile
        except CorruptDataError as exc:
            report.skipped.append(
                f"{name}: segment {seg.base:,} is not tiered, nor any after it: {exc}. "
                "Run `disklesslog verify`; trim past the damage to go on"
            )
            break
        try:
            entry = _begin_copy(store, name, prepared)
            if entry is None:
                break
            if entry.tiered:  # a concurrent run finished it
                tally.advance(size)
                continue
            report.add(segments_read=1, bytes_read=size)
            adopted += _upload(tiered.tier, entry, prepared, report, tally)
            if not _finish_copy(store, entry):
                break  # trimmed meanwhile: its objects are garbage already
            copied.append((prepared.base, prepared.end, size))
        finally:
            os.close(prepared.fd)
    if not copied:
        return None
    total = sum(size for _, _, size in copied)
    extra = f"; {adopted} of their objects were stored already" if adopted else ""
    report.actions.append(
        f"{name}: tiered offsets {copied[0][0]:,}..{copied[-1][1]:,} ({len(copied)} "
        f"segment{'s' if len(copied) != 1 else ''}, {total:,} bytes{extra})"
    )
    return copied[-1][1]


def _upload(
    tier: Tier, entry: TieredSegment, prepared: _Prepared, report: MaintenanceReport, tally: Tally
) -> int:
    """Store a segment's three objects (step 3); returns how many were adopted."""
    adopted = 0
    sources: tuple[int | bytes, ...] = (prepared.fd, prepared.index, prepared.timeindex)
    for obj, data in zip(entry.objects, sources):
        is_log = obj is entry.log
        if tier.store(obj.key, data, obj.size, obj.crc32c, tally.advance if is_log else None):
            report.add(objects_written=1, bytes_written=obj.size)
        else:
            adopted += 1
            if is_log:
                tally.advance(obj.size)
    return adopted


def _prepare(store: StreamStore, seg: Segment, size: int) -> _Prepared:
    """Read a closed segment for upload through one descriptor (a file replaced or
    deleted meanwhile cannot mix into it): check every batch and the offset chain,
    rebuild its indexes by the local rule, compute its CRC-32C."""
    fd = os.open(seg.log_path, os.O_RDONLY)
    try:
        if os.fstat(fd).st_size != size:
            raise CorruptDataError(
                f"closed segment is {os.fstat(fd).st_size} bytes, expected {size}",
                source=str(seg.log_path),
            )
        config = store.config
        scan = Segment(store.directory, seg.base, config.index_interval_bytes)
        scan.walk(fd, size, mode=CHECK, max_batch_bytes=config.max_batch_bytes, persist=False)
        if scan.end_offset != seg.end_offset:
            raise CorruptDataError(
                f"entries end at offset {scan.end_offset}, the next segment starts at "
                f"{seg.end_offset}",
                source=str(seg.log_path),
                position=size,
            )
        scan.seal(persist=False)
        crc, position = 0, 0
        while position < size:
            chunk = os.pread(fd, min(8 << 20, size - position), position)
            if not chunk:
                raise CorruptDataError("segment shrank while read", source=str(seg.log_path))
            crc = crc32c(chunk, crc)
            position += len(chunk)
        index = b"".join(map(OFFSET_ENTRY.pack, scan.index.keys, scan.index.values))
        timeindex = b"".join(map(TIME_ENTRY.pack, scan.timeindex.keys, scan.timeindex.values))
        return _Prepared(
            seg.base, seg.end_offset, size, fd, crc, scan.max_timestamp, index, timeindex
        )
    except BaseException:
        close_quietly(fd)
        raise


def _entry(name: str, incarnation: str, prepared: _Prepared) -> TieredSegment:
    log_key, index_key, time_key = _keys(name, incarnation, prepared)
    return TieredSegment(
        base_offset=prepared.base,
        end_offset=prepared.end,
        max_timestamp=prepared.max_timestamp,
        log=TieredObject(log_key, prepared.size, prepared.crc),
        index=TieredObject(index_key, len(prepared.index), crc32c(prepared.index)),
        timeindex=TieredObject(time_key, len(prepared.timeindex), crc32c(prepared.timeindex)),
        state=COPYING,
        since_ms=_now_ms(),
    )


def _begin_copy(store: StreamStore, name: str, prepared: _Prepared) -> TieredSegment | None:
    """Record the segment as ``copying`` (step 2). Returns its manifest entry (already
    ``tiered`` if another run finished it), or ``None`` when it cannot be tiered now
    (trimmed meanwhile, or not next to the tiered ones)."""
    with _locked(store) as snap:
        local_start = snap.start_offset
        if prepared.end <= local_start:
            return None
        manifest = manifests.load(store.directory) or Manifest.new(name)
        entry = _entry(name, manifest.incarnation, prepared)
        now = _now_ms()
        for i, seg in enumerate(manifest.segments):
            if seg.base_offset == prepared.base:
                if seg.object_keys() == entry.object_keys():
                    return seg  # a crashed run's (copying) or a concurrent one's
                manifest.discard_from(i, now)  # a stale copy of other bytes
                break
        if manifest.segments and manifest.segments[-1].end_offset < local_start:
            manifest.discard_from(0, now)  # a gap before the local part: unusable
        if manifest.segments and manifest.segments[-1].end_offset != prepared.base:
            return None
        if set(entry.object_keys()) & {item.key for item in manifest.garbage}:
            return None  # cannot happen (trimmed segments are never tiered again)
        if not manifest.segments:
            manifest.start_offset = max(manifest.start_offset, local_start)
        manifest.segments.append(entry)
        manifests.save(store.directory, manifest, sync=store.durable)
        return entry


def _finish_copy(store: StreamStore, entry: TieredSegment) -> bool:
    """Mark a verified upload ``tiered`` (step 4); False if the entry is gone."""
    with _locked(store):
        manifest = manifests.load(store.directory)
        if manifest is None:
            return False
        for i, seg in enumerate(manifest.segments):
            if seg.object_keys() == entry.object_keys():
                if seg.state == COPYING:
                    manifest.segments[i] = dataclasses.replace(
                        seg, state=TIERED, since_ms=_now_ms()
                    )
                    manifests.save(store.directory, manifest, sync=store.durable)
                return True
        return False


def _delete_local_copies(
    store: StreamStore,
    config: StreamConfig,
    name: str,
    report: MaintenanceReport,
    *,
    dry_run: bool,
    now_ms: int,
    planned: int | None,
) -> None:
    """Delete the local copies of verified tiered segments that local retention lets go,
    by moving the state record's start offset (the local start) past them."""
    snap = store.snapshot()
    units, tail = local_units(store, snap)
    found = retention_point(units, tail, config, now_ms, limits=config.local_limits())
    if found is None:
        return
    point, _, _, reason = found
    with contextlib.nullcontext(store.snapshot()) if dry_run else _locked(store) as snap:
        manifest = manifests.load(store.directory)
        local_start = snap.start_offset
        tiered_end = manifest.tiered_end() if manifest is not None else None
        if manifest is not None and manifest.start_offset > local_start:
            tiered_end = None  # not covering the local start: nothing to lean on
        if dry_run and planned is not None:
            tiered_end = max(tiered_end or 0, planned)
        if tiered_end is None:
            return
        new_start = min(point, tiered_end)
        if new_start <= local_start:
            return
        gone = [
            size for seg, size in snap.segments[:-1] if local_start < seg.end_offset <= new_start
        ]
        if not dry_run:
            store.trim(new_start)
    report.add(segments_deleted=len(gone), bytes_deleted=sum(gone))
    reasons = " and ".join(f"local_{part}" for part in reason.split(" and "))
    report.actions.append(
        f"{name}: local start offset {local_start:,} -> {new_start:,} ({reasons}; "
        f"{len(gone)} local segment{'s' if len(gone) != 1 else ''}, {sum(gone):,} bytes "
        "deleted; the tiered copies stay)"
    )


def trim_stream(store: StreamStore, before: int) -> list[TieredSegment]:
    """``Stream.trim`` of a stream that may have tiered segments. Under the stream lock
    (so tiering never records a segment against a stale local start), the manifest's
    start offset moves first, then the local one: a crash in between leaves the trim
    undone locally, never tiered records visible again. Returns the tiered segments
    that left the stream (their objects are garbage now)."""
    with _locked(store) as snap:
        manifest = manifests.load(store.directory)
        if before > snap.end_offset:
            start = make_view(snap, manifest).start_offset
            raise OffsetOutOfRange(
                f"cannot trim {store.name!r} before {before}: its end offset is {snap.end_offset}",
                start_offset=start,
                end_offset=snap.end_offset,
            )
        gone: list[TieredSegment] = []
        if manifest is not None and before > manifest.start_offset:
            gone = manifest.trim(before, _now_ms())
            manifests.save(store.directory, manifest, sync=store.durable)
        store.trim(before)
    return gone


# -------------------------------------------------------- garbage collection


def collect_garbage(
    log: SegmentLog,
    tier: Tier,
    *,
    dry_run: bool,
    progress: Progress | None,
    grace_seconds: float | None,
    reconcile: bool = True,
) -> MaintenanceReport:
    """Delete the tier's garbage, and with ``reconcile`` its orphans (one LIST of the
    tier), that are older than ``grace_seconds``."""
    grace = resolve_grace(grace_seconds)
    report = MaintenanceReport("gc", dry_run=dry_run)
    now = time.time()
    names = log.streams()
    for done, name in enumerate(names):
        if progress is not None:
            progress("gc", done, len(names))
        report.streams += 1
        _collect_doomed(log, tier, name, report, dry_run=dry_run, cutoff_ms=(now - grace) * 1000)
    if reconcile:
        _reconcile(log, tier, report, dry_run=dry_run, cutoff=now - grace)
    if progress is not None:
        progress("gc", len(names), len(names))
    return report


def _collect_doomed(
    log: SegmentLog,
    tier: Tier,
    name: str,
    report: MaintenanceReport,
    *,
    dry_run: bool,
    cutoff_ms: float,
) -> None:
    """Delete the objects a stream's manifest lists as garbage since before the cutoff,
    then drop them from the list (a crash in between deletes them again: harmless)."""
    manifest = manifests.load(log.stream_dir(name))
    if manifest is None:
        return
    live = {key for seg in manifest.segments for key in seg.object_keys()}
    due = [item for item in manifest.garbage if item.since_ms <= cutoff_ms and item.key not in live]
    if not due:
        return
    size = sum(item.size for item in due)
    report.add(objects_deleted=len(due), bytes_deleted=size)
    report.actions.append(
        f"{name}: deleted {len(due)} tiered object{'s' if len(due) != 1 else ''} "
        f"({size:,} bytes) that left the stream"
    )
    if dry_run:
        return
    tier.delete([item.key for item in due], {item.key: item.size for item in due})
    deleted = {item.key for item in due}

    def forget(store: StreamStore) -> None:
        with _locked(store):
            current = manifests.load(store.directory)
            if current is None:
                return
            current.garbage = [item for item in current.garbage if item.key not in deleted]
            manifests.save(store.directory, current, sync=store.durable)

    log.with_store(name, forget, create=False)


def _reconcile(
    log: SegmentLog, tier: Tier, report: MaintenanceReport, *, dry_run: bool, cutoff: float
) -> None:
    """Delete objects under the tier prefix that no manifest names and that are older
    than the cutoff. The listing comes first, the manifests after it: an object listed
    was uploaded after its ``copying`` entry was written, so a manifest read later
    still names it unless its stream is gone or it was deleted as garbage already."""
    listed = tier.list_objects()
    referenced: set[str] = set()
    for _, manifest in manifests.iter_manifests(log.path / STREAMS):
        referenced |= manifest.referenced_keys()
    orphans = [(key, modified) for key, modified in listed if key not in referenced]
    undated = [key for key, modified in orphans if modified is None]
    due = [key for key, modified in orphans if modified is not None and modified <= cutoff]
    if undated:
        report.skipped.append(
            f"reconcile: {len(undated)} unreferenced objects have no modification time in "
            f"the listing of {tier.url}; left alone"
        )
    if not due:
        return
    report.add(objects_deleted=len(due))
    report.actions.append(
        f"reconcile: deleted {len(due)} object{'s' if len(due) != 1 else ''} under "
        f"{tier.url}/{STREAMS_PREFIX} that no manifest names (failed uploads, deleted streams)"
    )
    if not dry_run:
        tier.delete(due)
