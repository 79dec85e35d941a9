"""Two-phase commits (:class:`~disklesslog.testing.contracts.TransactionContract`) on
every backend of ``backends.py``."""

from __future__ import annotations

from backends import test_classes

from disklesslog.testing.contracts import TransactionContract

globals().update(test_classes(TransactionContract, __name__))
