"""Distributed maintenance: per-stream work spread over Spark executors, then one
garbage collection on the driver.

Retention, key compaction, merging and tiering are per stream and safe to run from any
process at once (each is idempotent and swaps its result in atomically), so one Spark
task per stream runs them where the cluster has room; a log with thousands of streams
is maintained by the whole cluster instead of one machine. Garbage collection is
log-wide (one listing of storage), so it runs once, on the driver, afterwards.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import ConfigError
from ..maintenance.report import MaintenanceReport
from ..names import validate_stream_name
from .options import LogOptions

__all__ = ["maintain"]


def maintain(
    spark: Any,
    url: str,
    *,
    streams: Iterable[str] | None = None,
    backend: str | None = None,
    sequencer: str | None = None,
    storage_options: dict[str, Any] | None = None,
    dry_run: bool = False,
    now_ms: int | None = None,
    grace_seconds: float | None = None,
) -> MaintenanceReport:
    """Maintain the log at ``url`` with Spark: one task per stream (``streams``, default
    all) runs ``Log.maintain(stream)``'s per-stream steps (retention, compaction,
    merging, tiering) on an executor; then the driver collects garbage once. Returns
    every task's report added up, as ``Log.maintain()`` does.

    The executors open the log themselves (``backend``, ``sequencer``,
    ``storage_options`` as for :func:`disklesslog.open`): a local log must be on a disk
    they all see.
    """
    where = LogOptions(
        url=url, backend=backend, sequencer=sequencer, storage_options=storage_options or {}
    )
    if isinstance(streams, str):
        raise ConfigError("streams must be a list of stream names, not one str")
    with where.open() as log:
        names = log.streams() if streams is None else [validate_stream_name(s) for s in streams]
        report = MaintenanceReport("maintain", dry_run=dry_run)
        if names:
            task = functools.partial(_maintain_streams, where=where, dry_run=dry_run, now_ms=now_ms)
            rdd = spark.sparkContext.parallelize(names, len(names))
            for part in rdd.mapPartitions(task).collect():
                report.merge(part)
        report.merge(log.collect_garbage(dry_run=dry_run, grace_seconds=grace_seconds))
        report.streams = len(names)  # last: the parts' and gc's counts overlap
    return report


def _maintain_streams(
    names: Iterator[str], *, where: LogOptions, dry_run: bool, now_ms: int | None
) -> Iterator[MaintenanceReport]:
    """Executor side: the per-stream steps of ``Log.maintain`` for this task's streams."""
    with where.open() as log:
        for name in names:
            report = MaintenanceReport("maintain", dry_run=dry_run)
            report.merge(log.apply_retention(name, dry_run=dry_run, now_ms=now_ms))
            if log.stream(name).config.compacted:
                report.merge(log.compact(name, dry_run=dry_run, now_ms=now_ms))
            report.merge(log.merge(name, dry_run=dry_run, now_ms=now_ms))
            report.merge(log.tier(name, dry_run=dry_run, now_ms=now_ms))
            yield report
