"""The Log/Stream contract (:class:`~disklesslog.testing.contracts.LogContract`) on
every backend of ``backends.py``."""

from __future__ import annotations

import pytest
from backends import (
    S3,
    Azure,
    FileObjects,
    FileObjectstore,
    FilePostgres,
    Gcs,
    Memory,
    MemoryObjectstore,
    Segments,
)

from disklesslog.testing.contracts import LogContract


class TestSegments(Segments, LogContract):
    pass


class TestMemory(Memory, LogContract):
    pass


class TestFileObjects(FileObjects, LogContract):
    pass


class TestMemoryObjectstore(MemoryObjectstore, LogContract):
    pass


class TestFileObjectstore(FileObjectstore, LogContract):
    pass


@pytest.mark.postgres
class TestFilePostgres(FilePostgres, LogContract):
    pass


# The emulators answer in milliseconds, not microseconds: their full conformance runs
# belong to the whole suite (slow); tests/objects/test_clouds.py keeps a quick round
# trip on each in the fast one.
@pytest.mark.s3
@pytest.mark.slow
class TestS3(S3, LogContract):
    pass


@pytest.mark.azure
@pytest.mark.slow
class TestAzure(Azure, LogContract):
    pass


@pytest.mark.gcs
@pytest.mark.slow
class TestGcs(Gcs, LogContract):
    pass
