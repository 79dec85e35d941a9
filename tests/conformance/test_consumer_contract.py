"""Consumer groups (:class:`~disklesslog.testing.contracts.ConsumerContract`) on
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

from disklesslog.testing.contracts import ConsumerContract


class TestSegments(Segments, ConsumerContract):
    pass


class TestMemory(Memory, ConsumerContract):
    pass


class TestFileObjects(FileObjects, ConsumerContract):
    pass


class TestMemoryObjectstore(MemoryObjectstore, ConsumerContract):
    pass


class TestFileObjectstore(FileObjectstore, ConsumerContract):
    pass


@pytest.mark.postgres
class TestFilePostgres(FilePostgres, ConsumerContract):
    pass


# The emulators answer in milliseconds, not microseconds: their full conformance runs
# belong to the whole suite (slow); tests/objects/test_clouds.py keeps a quick round
# trip on each in the fast one.
@pytest.mark.s3
@pytest.mark.slow
class TestS3(S3, ConsumerContract):
    pass


@pytest.mark.azure
@pytest.mark.slow
class TestAzure(Azure, ConsumerContract):
    pass


@pytest.mark.gcs
@pytest.mark.slow
class TestGcs(Gcs, ConsumerContract):
    pass
