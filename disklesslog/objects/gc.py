"""Garbage collection of object logs: deleting objects nothing refers to any more.

Two passes:

1. **Garbage the sequencer knows.** Objects whose batches were all trimmed, replaced
   (merging, compaction) or deleted with their stream, and orphans recorded by writers
   and maintainers whose commit or swap did not happen, once they have been in that
   state for ``grace_seconds`` (``Sequencer.objects_to_delete``): deleted from storage,
   then forgotten by the sequencer (``forget_objects``). The grace period protects
   readers: a read takes batch locations from the sequencer, then fetches them; an
   object replaced in between must stay until such reads are done. (A read of this
   library that still finds one missing asks the sequencer again, so only slower
   readers elsewhere - another tool holding locations - depend on the grace.)
2. **Reconcile.** Objects in storage the sequencer never knew: an upload whose process
   died before its commit or swap, or whose orphan record failed. Storage is listed
   *before* the sequencer is asked what it knows, so an object committed in between is
   never taken for unknown; an unknown object is deleted once the time in its key is
   older than both ``grace_seconds`` and :data:`UNKNOWN_MIN_AGE`. That floor is what
   keeps uploads in flight safe whatever grace a caller chooses: a writer commits an
   object within ``UPLOAD_MAX_AGE`` (60 s) of its upload, or uploads it again under a
   new key, and merging and compaction swap theirs in under the same rule, so an
   object older than the floor that the sequencer does not know never will. Key times
   come from the clock of the machine that wrote the object: the floor also absorbs
   clock differences between machines of up to a few minutes. Objects staged for a
   two-phase commit (``….staged``) may wait up to ``STAGED_MAX_AGE`` (12 h) for their
   commit, so their floor is ``STAGED_UNKNOWN_MIN_AGE`` (24 h).

The reconcile pass costs what the log holds, not what it collects: one LIST of every
data object and a verified read of every object the sequencer knows (a busy log holds
hundreds of thousands). A collection with ``reconcile=False`` skips it, and looks up
only the sizes of the objects it deletes (a ``stat`` each on a local disk). Automatic
maintenance reconciles at most every :data:`UNKNOWN_MIN_AGE`: an object it finds must
be that old before it goes anyway, so reconciling more often deletes nothing sooner
than one such interval later.

Deleting is idempotent and forgetting comes after deleting, so a collection killed at
any point is finished by the next one. Dry runs list what would go and change nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import SequencerConflict
from ..maintenance.grace import resolve_grace
from ..maintenance.report import MaintenanceReport, Progress
from ..transactions import STAGED_UNKNOWN_MIN_AGE
from .storage import OBJECTS, STAGED, key_kind, key_time_ns
from .writer import UPLOAD_MAX_AGE

if TYPE_CHECKING:
    from .log import ObjectLog

__all__ = ["UNKNOWN_MIN_AGE", "collect_garbage"]

UNKNOWN_MIN_AGE = 5 * UPLOAD_MAX_AGE
"""Seconds an object the sequencer does not know must have existed (by the time in its
key) before the reconcile pass deletes it: 5 minutes, five times the longest a writer
or maintainer lets an upload wait for its commit."""
_DELETE_CHUNK = 256


def collect_garbage(
    object_log: ObjectLog,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    grace_seconds: float | None = None,
    reconcile: bool = True,
) -> MaintenanceReport:
    """Delete unreferenced objects after ``grace_seconds`` (default 60), then, with
    ``reconcile``, objects the sequencer never knew once they are that old and at least
    UNKNOWN_MIN_AGE old."""
    grace = resolve_grace(grace_seconds)
    report = MaintenanceReport("gc", dry_run=dry_run)
    storage = object_log.storage
    sequencer = object_log.sequencer
    if not reconcile:
        garbage = sequencer.objects_to_delete(grace)
        stored = storage.sizes(garbage, OBJECTS)
        unknown: list[str] = []
        undated = 0
    else:
        stored = storage.list_objects()  # first: see "Reconcile" in the module docstring
        garbage = sequencer.objects_to_delete(grace)
        unknown, undated = _unknown(stored, garbage, set(sequencer.list_objects()), grace)
    total = sum(stored.get(key, 0) for key in (*garbage, *unknown))
    done = 0
    if progress is not None:
        progress("gc", done, total)
    unforgotten = 0
    for start in range(0, len(garbage), _DELETE_CHUNK):
        chunk = garbage[start : start + _DELETE_CHUNK]
        done += _delete(object_log, chunk, stored, report, dry_run)
        if not dry_run:
            try:
                sequencer.forget_objects(chunk)
            except SequencerConflict:  # nothing applied; the next collection forgets them
                unforgotten += len(chunk)
        if progress is not None:
            progress("gc", done, total)
    if unforgotten:
        report.skipped.append(
            f"{unforgotten:,} deleted object(s) not yet forgotten by the sequencer (too busy); "
            "the next collection does it"
        )
    for start in range(0, len(unknown), _DELETE_CHUNK):
        done += _delete(object_log, unknown[start : start + _DELETE_CHUNK], stored, report, dry_run)
        if progress is not None:
            progress("gc", done, total)
    if garbage:
        report.actions.append(
            f"{len(garbage):,} unreferenced object(s) deleted (unreferenced for "
            f"{grace:g} s or more)"
        )
    if unknown:
        report.actions.append(
            f"{len(unknown):,} object(s) the sequencer never knew deleted (older than "
            f"{max(grace, UNKNOWN_MIN_AGE):g} s: uploads whose commit never came)"
        )
    if undated:
        report.skipped.append(
            f"{undated:,} file(s) under {storage.url}/objects with no time in their name "
            "(not written by disklesslog): left alone"
        )
    return report


def _unknown(
    stored: dict[str, int], garbage: list[str], known: set[str], grace: float
) -> tuple[list[str], int]:
    """The stored objects the sequencer never knew that are old enough to delete, and
    how many files have no time in their name (not ours: left alone)."""
    collected = set(garbage)
    floor_ns = int(max(grace, UNKNOWN_MIN_AGE) * 1e9)
    # Staged objects wait for a two-phase commit up to STAGED_MAX_AGE: a longer floor.
    staged_floor_ns = int(max(grace, STAGED_UNKNOWN_MIN_AGE) * 1e9)
    now_ns = time.time_ns()
    unknown: list[str] = []
    undated = 0
    for key in stored:
        if key in known or key in collected:
            continue
        born = key_time_ns(key)
        if born is None:
            undated += 1
        elif now_ns - born >= (staged_floor_ns if key_kind(key) == STAGED else floor_ns):
            unknown.append(key)
    return unknown, undated


def _delete(
    object_log: ObjectLog,
    keys: list[str],
    stored: dict[str, int],
    report: MaintenanceReport,
    dry_run: bool,
) -> int:
    """Delete ``keys`` from storage and from the read cache (where a writer's uploads
    stay until evicted), and count those the listing saw; returns their bytes."""
    present = [key for key in keys if key in stored]
    size = sum(stored[key] for key in present)
    report.add(objects_deleted=len(present), bytes_deleted=size)
    if not dry_run:
        object_log.storage.delete(keys)
        object_log.uncache_objects({key: stored.get(key, 0) for key in keys})
    return size
