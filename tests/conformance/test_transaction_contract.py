"""Two-phase commits (:class:`~disklesslog.testing.contracts.TransactionContract`) on
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

from disklesslog.testing.contracts import TransactionContract


class TestSegments(Segments, TransactionContract):
    pass


class TestMemory(Memory, TransactionContract):
    pass


class TestFileObjects(FileObjects, TransactionContract):
    pass


class TestMemoryObjectstore(MemoryObjectstore, TransactionContract):
    pass


class TestFileObjectstore(FileObjectstore, TransactionContract):
    pass


@pytest.mark.postgres
class TestFilePostgres(FilePostgres, TransactionContract):
    pass


# The emulators answer in milliseconds, not microseconds: their full conformance runs
# belong to the whole suite (slow); tests/objects/test_clouds.py keeps a quick round
# trip on each in the fast one.
@pytest.mark.s3
@pytest.mark.slow
class TestS3(S3, TransactionContract):
    pass


@pytest.mark.azure
@pytest.mark.slow
class TestAzure(Azure, TransactionContract):
    pass


@pytest.mark.gcs
@pytest.mark.slow
class TestGcs(Gcs, TransactionContract):
    pass
