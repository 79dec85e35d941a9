"""Tiering's storage requests while the tier misbehaves (issue 14, "no silent loss"):
every request is retried with the object backend's policy, and what escapes
``disklesslog.open``, ``Log.tier`` and ``Log.collect_garbage`` is typed. Deletes are
idempotent (a missing object is deleted already); the owner marker's conditional
create survives a failed or lost response. Failures are injected into
``faulty-memory://`` both as ``ConnectionError`` and as a client error that is not an
``OSError``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

import disklesslog
from disklesslog import StorageError
from disklesslog.segments.tiering import manifest as manifests
from disklesslog.testing import FaultyMemoryFileSystem

NOW = 10_000_000


class ClientError(Exception):
    """Stands in for a client library's error that is not an OSError."""


@pytest.fixture(params=[ConnectionError, ClientError])
def faulty(request: pytest.FixtureRequest) -> Iterator[type[FaultyMemoryFileSystem]]:
    FaultyMemoryFileSystem.reset()
    FaultyMemoryFileSystem.fault = request.param
    yield FaultyMemoryFileSystem
    FaultyMemoryFileSystem.reset()


def _url() -> str:
    return f"faulty-memory://tier-storage-faults-{uuid.uuid4().hex[:12]}/tier"


def _open(path: Path, url: str) -> disklesslog.Log:
    return disklesslog.open(
        path,
        fsync="never",
        tier_url=url,
        local_retention_bytes=2048,
        retention_ms=2_000,
        segment_bytes=2048,
    )


def _stored(url: str) -> set[str]:
    fs, root = fsspec.core.url_to_fs(url)
    prefix = str(root).rstrip("/") + "/streams/"
    return {path for path in fs.find(prefix) if path.startswith(prefix)}


def _with_garbage(path: Path, url: str) -> tuple[disklesslog.Log, list[tuple[int, bytes]]]:
    """A log whose retention dropped tiered segments: their objects are garbage."""
    log = _open(path, url)
    stream = log.stream("s")
    for first in range(0, 240, 3):
        stream.append_batch(
            [b"%06d-" % i + b"." * 90 for i in range(first, first + 3)],
            timestamps=1_000 + 10 * first,
        )
    log.tier(now_ms=NOW)
    log.apply_retention(now_ms=4_000)
    manifest = manifests.load(path / "streams" / "s")
    assert manifest is not None and manifest.garbage
    return log, [(r.offset, r.value) for r in stream.read()]


def test_collect_garbage_retries_failed_deletes(
    tmp_path: Path, faulty: type[FaultyMemoryFileSystem]
) -> None:
    url = _url()
    log, rows = _with_garbage(tmp_path / "log", url)
    with log:
        stored = _stored(url)
        faulty.failing_deletes = 3
        report = log.collect_garbage(grace_seconds=0)
        assert report.objects_deleted > 0
        assert len(_stored(url)) == len(stored) - report.objects_deleted
        assert log.metrics()["tier_delete_errors"] == 3
        assert [(r.offset, r.value) for r in log.stream("s").read()] == rows


def test_collect_garbage_raises_a_storage_error_and_the_next_run_finishes(
    tmp_path: Path, faulty: type[FaultyMemoryFileSystem]
) -> None:
    url = _url()
    log, rows = _with_garbage(tmp_path / "log", url)
    with log:
        stored = _stored(url)
        faulty.failing_deletes = 99
        with pytest.raises(StorageError, match="could not delete") as caught:
            log.collect_garbage(grace_seconds=0)
        assert isinstance(caught.value.__cause__, faulty.fault)
        faulty.failing_deletes = 0
        report = log.collect_garbage(grace_seconds=0)
        assert report.objects_deleted > 0
        assert len(_stored(url)) == len(stored) - report.objects_deleted
        assert not manifests.load(tmp_path / "log" / "streams" / "s").garbage  # type: ignore[union-attr]
        assert [(r.offset, r.value) for r in log.stream("s").read()] == rows


@pytest.mark.parametrize("how", ["failing_puts", "lost_puts"])
def test_the_owner_marker_survives_a_failed_or_lost_put(
    tmp_path: Path, faulty: type[FaultyMemoryFileSystem], how: str
) -> None:
    url = _url()
    setattr(faulty, how, 1)
    with _open(tmp_path / "log", url) as log:
        assert getattr(faulty, how) == 0
        log.stream("s").append(b"x")
        assert log.metrics()["tier_put_errors"] == 1
    with _open(tmp_path / "log", url) as log:  # the marker names this log
        assert [r.value for r in log.stream("s").read()] == [b"x"]


def test_an_owner_marker_that_cannot_be_stored_is_a_storage_error(
    tmp_path: Path, faulty: type[FaultyMemoryFileSystem]
) -> None:
    url = _url()
    faulty.failing_puts = 99
    with pytest.raises(StorageError, match=r"disklesslog\.json") as caught:
        _open(tmp_path / "log", url)
    assert isinstance(caught.value.__cause__, faulty.fault)
    faulty.failing_puts = 0
    with _open(tmp_path / "log", url) as log:  # the tier is recorded: claimed when used
        for _ in range(5):
            log.stream("s").append(b"." * 1000)
        assert log.tier(now_ms=NOW).objects_written > 0
