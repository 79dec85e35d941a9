"""Key compaction of object logs: Kafka's log cleaner over a stream's live batches.

The rules of what survives are shared with local logs (:mod:`disklesslog.maintenance.
compaction`); this module decides the ranges and swaps the results in. Per stream:

* **The cleanable range** is the longest run of batches from the start offset in which
  every batch is followed by at least ``segment_bytes`` of the stream, or has a max
  timestamp older than ``segment_ms``. The rest is the *active tail*, which a pass never
  reads or changes: Kafka's active segment, judged by the same two settings.
* **Clean and dirty.** Objects written by compaction are named ``….compacted``
  (:data:`~disklesslog.objects.storage.COMPACTED`). The range up to the end of the last
  batch in such an object is *clean*: a pass went over it and left every key in it once.
  The rest of the cleanable range is *dirty*. The dirty ratio (dirty bytes over
  cleanable bytes) against ``min_cleanable_dirty_ratio`` decides whether a pass runs
  (``force`` runs it anyway). This is Kafka's cleaner checkpoint, kept in key names
  instead of a file, so any process can compact any stream without state of its own.
* **A pass** maps the latest offset of every key in the dirty part (a bounded
  :class:`~disklesslog.maintenance.compaction.KeyMap`: when it fills, the pass ends at
  the last batch it mapped, and the next pass goes on from there), then walks the range
  from the start offset: each batch's survivors are computed, and runs of consecutive
  batches where something changes are rewritten (survivors laid out again at their own
  offsets) into new compacted objects and swapped in with ``replace_batches``. The last
  batch of the range is always rewritten into a compacted object, so the next pass
  knows where this one stopped. Records, and whole batches, may vanish: a replacement
  may hold fewer batches, or none (the offsets become a gap that reads skip).
* **Order.** Runs are swapped in offset order and a pass stops at the first swap that
  does not apply (a trim or another maintainer changed those batches). So a tombstone
  or a newer record is never dropped while an older record of its key, earlier in the
  stream, stays: a deleted key cannot come back.

Every swap is one sequencer step that applies only to batches that are still live, so a
pass is safe beside writers, readers, retention and other maintainers, idempotent, and
resumable after a crash (an object uploaded but never swapped in is an orphan for
garbage collection).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import StreamConfig
from ..errors import DataLossError, StreamNotFound
from ..format import EncodedBatch
from ..maintenance.compaction import (
    DEFAULT_MAX_KEYS,
    KeyMap,
    Piece,
    dirty_ratio,
    encode_piece,
    horizon,
    require_compacted,
    retile,
    survivors,
    target_batch_bytes,
)
from ..maintenance.report import MaintenanceReport, Progress
from ..names import validate_stream_name
from ..records import RecordBatch
from ..sequencers.base import BatchLocation
from .rewrite import SourceReader, live_snapshot, replaced_meanwhile, swap, upload
from .storage import COMPACTED, key_kind

if TYPE_CHECKING:
    from .log import ObjectLog

__all__ = ["BRIDGE_BYTES", "RUN_MAX_BYTES", "cleanable_count", "compact"]

BRIDGE_BYTES = 1 << 20
"""Unchanged batches between two changed ones are rewritten with them when they total at
most this: one object and one sequencer step instead of two, for little extra writing."""
RUN_MAX_BYTES = 32 << 20
"""Source bytes of one rewritten run at most: bounds the memory a pass holds (decoded
survivors of one run) and the size of the objects it writes."""


def compact(
    object_log: ObjectLog,
    stream: str | None = None,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    now_ms: int | None = None,
    force: bool = False,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> MaintenanceReport:
    """Compact ``stream`` (which must be compacted: ConfigError naming its
    ``cleanup_policy`` otherwise; StreamNotFound if it does not exist), or every
    compacted stream. See the module docstring for what a pass does."""
    report = MaintenanceReport("compaction", dry_run=dry_run)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if stream is not None:
        require_compacted(stream, object_log.current_config(validate_stream_name(stream)))
        names = [stream]
    else:
        names = object_log.streams()
    meter = _Meter(progress)
    for name in names:
        try:
            config = object_log.current_config(name)
        except StreamNotFound:
            continue  # deleted since it was listed
        if not config.compacted:
            continue
        report.streams += 1
        try:
            _Pass(object_log, name, config, report, meter, now, dry_run, max_keys).run(force)
        except StreamNotFound:
            if stream is not None:
                raise
            report.skipped.append(f"{name}: deleted during the pass")
    meter.finish()
    return report


def cleanable_count(batches: list[BatchLocation], config: StreamConfig, now_ms: int) -> int:
    """How many leading ``batches`` lie below the active tail: each of them is followed
    by at least ``segment_bytes`` of the stream, or is older than ``segment_ms``."""
    after = sum(b.size for b in batches)
    old = now_ms - config.segment_ms
    count = 0
    for b in batches:
        after -= b.size
        if after < config.segment_bytes and b.max_timestamp >= old:
            break
        count += 1
    return count


@dataclass
class _Meter:
    """Progress in bytes over every stream of a run: the total grows as streams are
    planned, ``done`` as their bytes are read."""

    progress: Progress | None
    done: int = 0
    total: int = 0

    def plan(self, size: int) -> None:
        self.total += size
        self.tick(0)

    def tick(self, size: int) -> None:
        self.done += size
        if self.progress is not None:
            self.progress("compaction", self.done, self.total)

    def finish(self) -> None:
        self.done = self.total
        self.tick(0)


@dataclass
class _Member:
    """A batch of a run: where it is, its records, and those that survive."""

    location: BatchLocation
    records: RecordBatch
    kept: RecordBatch | None


@dataclass
class _Runs:
    """Groups the batches of a pass, in offset order, into the runs to rewrite: changed
    batches, with the unchanged ones between them when those are few (BRIDGE_BYTES)."""

    run: list[_Member] = field(default_factory=list)
    run_bytes: int = 0
    gap: list[_Member] = field(default_factory=list)
    gap_bytes: int = 0

    def add(self, member: _Member, changed: bool) -> Iterator[list[_Member]]:
        size = member.location.size
        if not changed:
            if self.run:
                self.gap.append(member)
                self.gap_bytes += size
                if self.gap_bytes > BRIDGE_BYTES:
                    yield from self.finish()
            return
        if self.gap:
            self.run += self.gap
            self.run_bytes += self.gap_bytes
            self.gap, self.gap_bytes = [], 0
        if self.run and self.run_bytes + size > RUN_MAX_BYTES:
            yield from self.finish()
        self.run.append(member)
        self.run_bytes += size

    def finish(self) -> Iterator[list[_Member]]:
        """The run under way (without the unchanged batches after it), if any."""
        run = self.run
        self.run, self.run_bytes, self.gap, self.gap_bytes = [], 0, [], 0
        if run:
            yield run


class _Pass:
    """One compaction pass over one stream."""

    def __init__(
        self,
        object_log: ObjectLog,
        name: str,
        config: StreamConfig,
        report: MaintenanceReport,
        meter: _Meter,
        now_ms: int,
        dry_run: bool,
        max_keys: int,
    ) -> None:
        self.log = object_log
        self.name = name
        self.config = config
        self.report = report
        self.meter = meter
        self.now_ms = now_ms
        self.dry_run = dry_run
        self.max_keys = max_keys
        self.reader = SourceReader(object_log, config.max_batch_bytes)
        # What the applied runs did, for the stream's report line.
        self.runs = 0
        self.records_removed = 0
        self.bytes_before = 0
        self.bytes_after = 0
        self.objects_written = 0

    def run(self, force: bool) -> None:
        try:
            self._run(force)
        except DataLossError:
            if not replaced_meanwhile(self.log, self.name, self.reader):
                raise
            self.report.skipped.append(
                f"{self.name}: its batches changed during the pass (another maintainer); run again"
            )
        finally:
            self.reader.tally(self.report)
            self._summarise()

    def _run(self, force: bool) -> None:
        name, config = self.name, self.config
        batches = live_snapshot(self.log, name)
        cleanable = cleanable_count(batches, config, self.now_ms)
        if not cleanable:
            if batches:
                self.report.skipped.append(
                    f"{name}: everything is in the active tail (the last segment_bytes="
                    f"{config.segment_bytes:,} bytes, or younger than segment_ms)"
                )
            return
        marker = max(
            (i for i in range(cleanable) if key_kind(batches[i].object_key) == COMPACTED),
            default=-1,
        )
        clean = sum(b.size for b in batches[: marker + 1])
        dirty = sum(b.size for b in batches[marker + 1 : cleanable])
        ratio = dirty_ratio(clean, dirty)
        if ratio < config.min_cleanable_dirty_ratio and not force:
            self.report.skipped.append(
                f"{name}: dirty ratio {ratio:.2f} is below min_cleanable_dirty_ratio="
                f"{config.min_cleanable_dirty_ratio} ({dirty:,} of {clean + dirty:,} "
                "cleanable bytes are new); force=True compacts anyway"
            )
            return
        self.meter.plan(dirty + clean + dirty)
        key_map, end = self._map(batches, marker + 1, cleanable)
        self._rewrite(batches[:end], key_map)

    def _map(self, batches: list[BatchLocation], first: int, stop: int) -> tuple[KeyMap, int]:
        """Map the dirty batches ``[first, stop)``; returns the map and the index after
        the last batch mapped (earlier than ``stop`` if the map filled)."""
        key_map = KeyMap(self.max_keys)
        end = first
        for location, records in self.reader.decoded(batches[first:stop]):
            if key_map.full:
                break
            key_map.add(records)
            end += 1
            self.meter.tick(location.size)
        return key_map, end

    def _rewrite(self, batches: list[BatchLocation], key_map: KeyMap) -> None:
        """Rewrite the runs of ``batches`` (from the start offset to the pass's end)
        where something changes, in offset order, stopping at a swap that fails."""
        limit = horizon(self.config, self.now_ms)
        runs = _Runs()
        last = len(batches) - 1
        for i, (location, records) in enumerate(self.reader.decoded(batches)):
            self.meter.tick(location.size)
            kept = survivors(records, key_map, limit)
            changed = kept is not records or (
                i == last and key_kind(location.object_key) != COMPACTED  # the pass's mark
            )
            for run in runs.add(_Member(location, records, kept), changed):
                if not self._swap(run):
                    return
        for run in runs.finish():
            self._swap(run)

    def _swap(self, run: list[_Member]) -> bool:
        """Rewrite one run and swap it in (or, in a dry run, count what it would do)."""
        config = self.config
        start = run[0].location.base_offset
        end = run[-1].location.last_offset + 1
        pieces = retile(
            start,
            end,
            (m.kept for m in run if m.kept is not None),
            target_bytes=target_batch_bytes(config),
        )
        encoded = [encode_piece(piece, config) for piece in pieces]
        removed = sum(len(m.records) for m in run) - sum(len(p.records) for p in pieces)
        before = sum(m.location.size for m in run)
        after = sum(batch.size for batch in encoded)
        if encoded:  # an object is (or in a dry run would be) written even if the swap fails
            self.report.add(objects_written=1, bytes_written=after)
        if not self.dry_run and not self._apply([m.location for m in run], pieces, encoded):
            self.report.skipped.append(
                f"{self.name}: offsets {start:,}..{end - 1:,} changed during the pass (a "
                "retention trim or another maintainer; or the sequencer was too busy); "
                "the rest waits for the next run"
            )
            return False
        self.runs += 1
        self.objects_written += bool(encoded)
        self.records_removed += removed
        self.bytes_before += before
        self.bytes_after += after
        self.report.add(records_removed=removed, bytes_removed=max(0, before - after))
        return True

    def _apply(
        self, olds: list[BatchLocation], pieces: list[Piece], encoded: list[EncodedBatch]
    ) -> bool:
        """Upload the rewritten batches as one compacted object (none if nothing
        survived) and swap them in for ``olds``; whether the swap applied."""
        if not encoded:
            return swap(self.log, self.name, olds, [], None)
        parts = [part for batch in encoded for part in (batch.header, bytes(batch.body))]
        key, _, uploaded_at = upload(self.log, COMPACTED, parts)
        news = []
        position = 0
        for piece, batch in zip(pieces, encoded):
            news.append(
                BatchLocation(
                    0, key, position, batch.size, piece.base, piece.end - 1, batch.max_timestamp
                )
            )
            position += batch.size
        return swap(self.log, self.name, olds, news, (key, uploaded_at))

    def _summarise(self) -> None:
        if not self.runs:
            return
        self.report.actions.append(
            f"{self.name}: {self.records_removed:,} records removed; {self.runs} run(s) of "
            f"{self.bytes_before:,} bytes rewritten as {self.bytes_after:,} bytes in "
            f"{self.objects_written} compacted object(s)"
        )
