"""Testing with disklesslog, and testing disklesslog's extensions.

* :mod:`disklesslog.testing.plugin`: the pytest plugin (entry point ``disklesslog``,
  loaded by pytest itself): ``local_log``, ``memory_log``, ``s3_log`` and the other
  fixtures.
* :mod:`disklesslog.testing.faults`: fault-injecting fsspec filesystems,
  ``faulty://`` (:class:`FaultyFileSystem`) and ``faulty-memory://``
  (:class:`FaultyMemoryFileSystem`).
* :mod:`disklesslog.testing.servers`: the local server processes (moto S3, Azurite,
  fake-gcs-server, PostgreSQL) the fixtures start.
* :mod:`disklesslog.testing.contracts`: the conformance suites, as classes that a test
  module subclasses to run them against another backend or sequencer.

Importing this package needs neither pytest nor hypothesis: fsspec loads
``faulty://`` from it through an entry point in any process. Only the plugin and the
contracts, which are test code, import pytest.
"""

from .faults import FaultyFileSystem, FaultyMemoryFileSystem, InjectedClientError
from .servers import create_bucket
from .servers.s3 import moto_s3_server, s3_storage_options

__all__ = [
    "FaultyFileSystem",
    "FaultyMemoryFileSystem",
    "InjectedClientError",
    "create_bucket",
    "moto_s3_server",
    "s3_storage_options",
]
