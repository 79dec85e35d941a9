"""Consumer groups (:class:`~disklesslog.testing.contracts.ConsumerContract`) on
every backend of ``backends.py``."""

from __future__ import annotations

from backends import test_classes

from disklesslog.testing.contracts import ConsumerContract

globals().update(test_classes(ConsumerContract, __name__))
