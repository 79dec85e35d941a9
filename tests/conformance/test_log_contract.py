"""The Log/Stream contract (:class:`~disklesslog.testing.contracts.LogContract`) on
every backend of ``backends.py``."""

from __future__ import annotations

from backends import test_classes

from disklesslog.testing.contracts import LogContract

globals().update(test_classes(LogContract, __name__))
