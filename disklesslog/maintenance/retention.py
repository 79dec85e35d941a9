"""Retention by time and size: which leading part of a stream may go.

One rule for both backends, on *units*: the closed segments of a local stream (and its
tiered copies), or the live batches of a stream on object storage. A unit goes, with
every unit before it, when its newest record is older than ``retention_ms``, or while
the stream without it still holds at least ``retention_bytes`` (Kafka's rules, judged
unit by unit from the oldest, stopping at the first that stays). Retention applies to
streams whose ``cleanup_policy`` includes ``delete``; it moves the start offset with
``Stream.trim`` and never touches a local stream's active segment.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import StreamConfig
from .report import MaintenanceReport, Progress

if TYPE_CHECKING:
    from ..api import AbstractLog

__all__ = ["Unit", "apply_retention", "retention_point"]


@dataclass(frozen=True)
class Unit:
    """A piece of a stream retention drops whole: offsets ``[base_offset, end_offset)``,
    ``size`` bytes, newest record at ``max_timestamp`` (ms)."""

    base_offset: int
    end_offset: int
    size: int
    max_timestamp: int


def retention_point(
    units: Iterable[Unit],
    tail_bytes: int,
    config: StreamConfig,
    now_ms: int,
    *,
    limits: tuple[int, int] | None = None,
) -> tuple[int, int, int, str] | None:
    """Where retention moves the start offset: ``(offset, units, bytes, reason)``, or
    ``None`` when every unit stays.

    ``units`` are in offset order; ``tail_bytes`` is what follows them and always stays
    (a local stream's active segment). ``limits`` overrides ``(retention_ms,
    retention_bytes)`` (tiering applies the local limits with the same rule).

    ``units`` may be lazy: by time alone they are read only up to the first that stays,
    so judging a stream costs what retention drops, not what the stream holds (a
    week's retention of an object stream is millions of batches, judged every pass).
    A size limit needs the stream's total, so it reads them all.
    """
    ms, size_limit = limits if limits is not None else (config.retention_ms, config.retention_bytes)
    if ms < 0 and size_limit < 0:
        return None
    if size_limit >= 0:
        units = list(units)
        total = sum(u.size for u in units) + tail_bytes
    else:
        total = 0  # unused: nothing goes by size
    cutoff = now_ms - ms if ms >= 0 else None
    point, count, dropped, reasons = None, 0, 0, set()
    for unit in units:
        by_time = cutoff is not None and unit.max_timestamp < cutoff
        by_size = size_limit >= 0 and total - unit.size >= size_limit
        if not (by_time or by_size):
            break
        reasons.add("retention_ms" if by_time else "retention_bytes")
        total -= unit.size
        point, count, dropped = unit.end_offset, count + 1, dropped + unit.size
    if point is None:
        return None
    return point, count, dropped, " and ".join(sorted(reasons))


def apply_retention(
    log: AbstractLog,
    stream: str | None = None,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    now_ms: int | None = None,
) -> MaintenanceReport:
    """Apply every stream's retention (or ``stream``'s): ``Stream.trim`` past the units
    :func:`retention_point` lets go. Safe alongside writers, readers and other
    maintenance: a trim never moves the start offset backwards."""
    report = MaintenanceReport("retention", dry_run=dry_run)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    names = [stream] if stream is not None else log.streams()
    for done, name in enumerate(names):
        handle = log.stream(name)
        config = handle.config
        report.streams += 1
        if progress is not None:
            progress("retention", done, len(names))
        if not config.deletes:
            if stream is not None:
                report.skipped.append(f"{name}: cleanup_policy={config.cleanup_policy!r}")
            continue
        units, tail = handle.retention_units()
        found = retention_point(units, tail, config, now)
        if found is None:
            continue
        point, count, size, reason = found
        start = handle.start_offset
        if point <= start:
            continue
        report.actions.append(
            f"{name}: start offset {start:,} -> {point:,} ({reason}; {count:,} "
            f"{handle.retention_unit_name(count)}, {size:,} bytes)"
        )
        report.add(records_removed=point - start, bytes_removed=size)
        if not dry_run:
            report.merge(handle.trim_for_retention(point))
    if progress is not None:
        progress("retention", len(names), len(names))
    return report
