"""Accepted data loss: the ``.lost`` marker of a segment whose offsets storage lost.

When the active segment turns out shorter than its recovery point, records that were
acknowledged are gone. Recovery refuses to go on (:class:`~disklesslog.DataLossError`)
until an operator accepts the loss (``SegmentLog.repair(stream,
accept_data_loss=True)``), unless the recovery point was written under the fsync policy
"never", which accepts such a loss in advance; the offsets lost must then never be
handed out again. They become an empty closed segment ``[first, end)`` beside which a
checksummed marker, ``<first:020d>.lost``, records the decision (``docs/format.md``
2.11):

    {"version": 1, "first": FIRST, "end": END, "file": "<the damaged .log>",
     "reason": "accepted by an operator" | "fsync policy never: lost in an OS crash",
     "accepted_at_ms": MS}

Readers skip an empty closed segment only when its marker names exactly its range;
anywhere else an empty segment that should hold records is damage, as before. The
marker is deleted with its segment (trims, compaction).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from ..errors import CorruptDataError
from ..storage.atomic import fsync_directory
from .layout import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    LOST_SUFFIX,
    TIMEINDEX_SUFFIX,
    read_json,
    segment_name,
    write_json,
)

__all__ = ["BY_OPERATOR", "BY_POLICY", "accepted", "make_gap", "write_marker"]

_VERSION = 1
_WHAT = "accepted-loss marker"
BY_OPERATOR = "accepted by an operator"
BY_POLICY = "fsync policy never: lost in an OS crash"


def make_gap(
    directory: Path, base: int, position: int, first: int, end: int, reason: str, *, sync: bool
) -> None:
    """Steps 1 to 3 of ``docs/format.md`` 2.11 (the caller holds the stream lock, and
    then names segment ``end`` active in the state record): the active segment
    ``base`` keeps its verified entries (up to byte ``position``, offset ``first``),
    the offsets ``[first, end)`` become an empty closed segment with its marker, and
    ``end`` an empty new active segment."""
    name = segment_name(base, LOG_SUFFIX)
    # What follows the verified entries cannot be trusted and belongs to the loss; the
    # indexes are rebuilt (and sealed) when the closed segment is first read.
    os.truncate(directory / name, position)
    for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / segment_name(base, suffix))
    gap = base if position == 0 else first
    write_marker(directory.parent.parent, directory, gap, end, name, reason, sync=sync)
    for new in {gap, end}:
        os.close(
            os.open(directory / segment_name(new, LOG_SUFFIX), os.O_WRONLY | os.O_CREAT, 0o644)
        )
    if sync:
        fsync_directory(directory)


def write_marker(
    root: Path, directory: Path, first: int, end: int, file: str, reason: str, *, sync: bool
) -> None:
    """Record that offsets ``[first, end)`` of the stream in ``directory`` are lost and
    accepted (``file`` names the segment they were lost from, ``reason`` who accepted)."""
    content = {
        "version": _VERSION,
        "first": first,
        "end": end,
        "file": file,
        "reason": reason,
        "accepted_at_ms": int(time.time() * 1000),
    }
    write_json(root, directory / segment_name(first, LOST_SUFFIX), content, sync=sync)


def accepted(directory: Path, base: int, end: int) -> bool:
    """Whether a valid marker says offsets ``[base, end)`` are an accepted loss. A
    marker that fails its checksum, or names another range, is
    :class:`CorruptDataError`: nothing may be skipped on its word."""
    path = directory / segment_name(base, LOST_SUFFIX)
    found = read_json(path, what=_WHAT)
    if found is None:
        return False
    content, checked = found
    if not checked or not isinstance(content, dict) or content.get("version") != _VERSION:
        raise CorruptDataError(f"not a version {_VERSION} {_WHAT}", source=str(path))
    if content.get("first") != base or content.get("end") != end:
        raise CorruptDataError(
            f"the {_WHAT} names offsets [{content.get('first')}, {content.get('end')}), "
            f"the segment covers [{base}, {end})",
            source=str(path),
        )
    return True
