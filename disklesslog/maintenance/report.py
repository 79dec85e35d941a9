"""What a maintenance operation did, or with ``dry_run`` would do: counts and lines.

Every operation (retention, compaction, merging, tiering, garbage collection) returns a
:class:`MaintenanceReport`; :meth:`MaintenanceReport.merge` adds them up for
``Log.maintain()``. *Logical* counts say what left the streams (``records_removed``,
``bytes_removed``); *physical* ones what was read, written and deleted in storage,
which for object logs can happen later (trimmed batches become garbage that garbage
collection deletes after a grace period).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COUNTERS", "MaintenanceReport", "Progress"]

Progress = Callable[[str, int, int], None]
"""``progress(task, done, total)``: called as a long operation advances, ``done`` and
``total`` in bytes (``total`` 0 when unknown). The CLI draws tqdm bars from it."""

COUNTERS = (
    "streams",
    "records_removed",
    "bytes_removed",
    "segments_read",
    "segments_written",
    "segments_deleted",
    "objects_read",
    "objects_written",
    "objects_deleted",
    "bytes_read",
    "bytes_written",
    "bytes_deleted",
)


@dataclass
class MaintenanceReport:
    """Counts and human-readable lines of one maintenance run.

    ``actions`` says what changed (one line each, e.g. a stream's new start offset);
    ``skipped`` what was left alone and why (a stream below its dirty ratio, an
    operation that does not apply to this backend).
    """

    operation: str
    dry_run: bool = False
    streams: int = 0
    """Streams examined."""
    records_removed: int = 0
    """Offsets that left their streams: trimmed by retention or compacted away."""
    bytes_removed: int = 0
    """Bytes of batches that left their streams."""
    segments_read: int = 0
    segments_written: int = 0
    segments_deleted: int = 0
    objects_read: int = 0
    objects_written: int = 0
    objects_deleted: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_deleted: int = 0
    actions: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    applicable: bool = True
    """False when the operation does not apply to this kind of log at all (merging a
    local log): automatic maintenance stops calling it."""

    def add(self, **counts: int) -> None:
        """Increase counters by name (``report.add(segments_deleted=2, bytes_deleted=n)``)."""
        for name, value in counts.items():
            if name not in COUNTERS:
                raise AttributeError(f"MaintenanceReport has no counter {name!r}")
            setattr(self, name, getattr(self, name) + value)

    def merge(self, other: MaintenanceReport) -> MaintenanceReport:
        """Add ``other``'s counts and lines to this report (prefixing its lines with its
        operation when they differ); returns ``self``."""
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        prefix = f"{other.operation}: " if other.operation != self.operation else ""
        self.actions += [prefix + line for line in other.actions]
        self.skipped += [prefix + line for line in other.skipped]
        self.dry_run = self.dry_run or other.dry_run
        return self

    @property
    def changed(self) -> bool:
        """Whether anything was (or, in a dry run, would be) changed."""
        return bool(self.actions)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> list[str]:
        """A few lines for people: what changed, the non-zero counts, what was skipped."""
        verb = "would " if self.dry_run else ""
        lines = [f"{self.operation}{' (dry run)' if self.dry_run else ''}:"]
        lines += [f"  {verb}{line}" if self.dry_run else f"  {line}" for line in self.actions]
        counts = [
            f"{name.replace('_', ' ')} {_amount(name, getattr(self, name))}"
            for name in COUNTERS
            if getattr(self, name)
        ]
        if counts:
            lines.append("  " + ", ".join(counts))
        if not self.actions:
            lines.append("  nothing to do")
        lines += [f"  skipped: {line}" for line in self.skipped]
        return lines


def _amount(name: str, value: int) -> str:
    if not name.startswith("bytes"):
        return f"{value:,}"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")
