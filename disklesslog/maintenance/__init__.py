"""Maintenance: retention, key compaction, object merging, tiering, garbage collection.

A log that writes runs them by itself (:mod:`.auto`, ``maintenance="auto"``, the
default). Every operation is also an explicit call on a log (``log.apply_retention()``,
``log.compact()``, ``log.merge()``, ``log.tier()``, ``log.collect_garbage()``, or all of
them with ``log.maintain()``) and a CLI command, safe to run from any process while
others read and write, idempotent, and resumable after a crash. Each returns a
:class:`MaintenanceReport`. The rules shared by both backends live here; what touches a
backend's storage lives with the backend.
"""

from .auto import LEASE_NAME, MaintenanceStatus, OperationStatus
from .report import MaintenanceReport, Progress

__all__ = ["LEASE_NAME", "MaintenanceReport", "MaintenanceStatus", "OperationStatus", "Progress"]
