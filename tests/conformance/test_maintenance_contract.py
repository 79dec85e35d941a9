"""Automatic maintenance (:class:`~disklesslog.testing.contracts.MaintenanceContract`)
on every backend of ``backends.py``."""

from __future__ import annotations

from backends import test_classes

from disklesslog.testing.contracts import MaintenanceContract

globals().update(test_classes(MaintenanceContract, __name__))
