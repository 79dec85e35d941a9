"""Key compaction (:class:`~disklesslog.testing.contracts.CompactionContract`) on the
maintenance backends: local segments; the object backend on ``memory://`` (memory
sequencer), ``file://`` (object-store sequencer) and ``file://`` with PostgreSQL; and
the moto S3 server."""

from __future__ import annotations

import pytest
from backends import S3, FileObjectstore, FilePostgres, Memory, Segments

from disklesslog.testing.contracts import CompactionContract


class TestSegments(Segments, CompactionContract):
    pass


class TestMemory(Memory, CompactionContract):
    pass


class TestFileObjectstore(FileObjectstore, CompactionContract):
    pass


@pytest.mark.postgres
class TestFilePostgres(FilePostgres, CompactionContract):
    pass


@pytest.mark.s3
class TestS3(S3, CompactionContract):
    """An HTTP round trip per request, and compaction makes many: the default suite runs
    only the tests marked ``all_backends`` here, the whole suite all of them."""

    slow_unless_all_backends = True
