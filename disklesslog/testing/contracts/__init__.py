"""The conformance suites, shipped so that another backend or sequencer can run them.

Each suite is a class whose tests a test module inherits by subclassing it, with a
name pytest collects (``Test...``) and the one method that opens the thing under test:

* :class:`LogContract`, :class:`ConsumerContract`, :class:`TransactionContract`,
  :class:`CompactionContract` and :class:`MaintenanceContract`: ``open_log(path,
  options, request)`` (see :class:`~.fixtures.LogFixtures`), one definition shared by
  the five;
* :class:`SequencerContract`: ``open_sequencer(path, clock, request)``.

The project runs them on each of its own backends and sequencers (``tests/``), and
``docs/testing.md`` shows a minimal subclass of each. These modules are test code:
they import pytest.
"""

from .compaction import CompactionContract
from .consumer import ConsumerContract
from .fixtures import LogFactory, LogFixtures
from .log import LogContract
from .maintenance import MaintenanceContract
from .sequencer import FakeClock, SequencerContract
from .transaction import TransactionContract

__all__ = [
    "CompactionContract",
    "ConsumerContract",
    "FakeClock",
    "LogContract",
    "LogFactory",
    "LogFixtures",
    "MaintenanceContract",
    "SequencerContract",
    "TransactionContract",
]
