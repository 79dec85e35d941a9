"""Every storage request of the object backend is retried, and what escapes a public
call is typed (issue 14, "no silent loss"): deletes of garbage collection (idempotent:
a missing object is deleted already), its listing, and the marker read at open, which
must never take a failed request for a missing marker. Failures are injected into
``faulty-memory://`` both as ``ConnectionError`` and as a client error that is not an
``OSError`` (botocore's ``ClientError``, gcsfs's ``HttpError``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import disklesslog
from disklesslog import InvalidURL, StorageError
from disklesslog.metrics import Metrics
from disklesslog.objects.log import ObjectLog
from disklesslog.objects.storage import ObjectStorage
from disklesslog.sequencers.memory import MemorySequencer
from disklesslog.testing import FaultyMemoryFileSystem


class ClientError(Exception):
    """Stands in for a client library's error that is not an OSError."""


@pytest.fixture(params=[ConnectionError, ClientError])
def faulty(request: pytest.FixtureRequest) -> Iterator[type[FaultyMemoryFileSystem]]:
    FaultyMemoryFileSystem.reset()
    FaultyMemoryFileSystem.fault = request.param
    yield FaultyMemoryFileSystem
    FaultyMemoryFileSystem.reset()


def _url() -> str:
    return f"faulty-memory://storage-faults-{uuid.uuid4().hex[:12]}/log"


def _storage() -> ObjectStorage:
    fs = FaultyMemoryFileSystem()
    return ObjectStorage(fs, f"/storage-faults-{uuid.uuid4().hex[:12]}", Metrics(), retry_delay=0)


def _fast(log: disklesslog.Log) -> ObjectLog:
    assert isinstance(log, ObjectLog)
    log.storage.retry_delay = 0
    return log


# ------------------------------------------------------------------- deletes


def test_a_failed_delete_is_retried(faulty: type[FaultyMemoryFileSystem]) -> None:
    storage = _storage()
    for key in ("objects/a", "objects/b"):
        storage.put(key, b"data")
    faulty.failing_deletes = 4
    storage.delete(["objects/a", "objects/b", "objects/never-there"])
    assert storage.list_objects() == {}
    metrics = storage.metrics.snapshot()
    assert metrics["delete_errors"] == 4
    assert metrics["deletes"] == 2


def test_a_delete_that_keeps_failing_is_a_storage_error(
    faulty: type[FaultyMemoryFileSystem],
) -> None:
    storage = _storage()
    storage.put("objects/a", b"data")
    faulty.failing_deletes = 5
    with pytest.raises(StorageError, match=r"could not delete object objects/a .*5 attempts"):
        storage.delete(["objects/a"])
    assert isinstance(storage.fs.cat_file(storage.path("objects/a")), bytes)  # still there


def test_a_delete_whose_response_was_lost_is_done(
    faulty: type[FaultyMemoryFileSystem], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = _storage()
    storage.put("objects/a", b"data")
    rm_file = storage.fs.rm_file
    lost = [1]

    def losing(path: str) -> None:
        rm_file(path)
        if lost[0]:
            lost[0] -= 1
            raise faulty.fault("the response was lost")

    monkeypatch.setattr(storage.fs, "rm_file", losing)
    storage.delete(["objects/a"])  # the retry finds it gone: deleted, not an error
    assert storage.list_objects() == {}
    assert storage.metrics.snapshot()["delete_errors"] == 1


# ------------------------------------------------------- garbage collection


def _with_garbage() -> tuple[disklesslog.Log, set[str]]:
    """A log whose stream was deleted: its objects are garbage (grace 0)."""
    log = _fast(disklesslog.open(_url(), sequencer=MemorySequencer(), cache=None))
    for i in range(3):
        log.stream("doomed").append(b"%d" % i)
    log.stream("kept").append(b"kept")
    doomed = {b.object_key for b in _fast(log).live_batches("doomed")}
    log.delete_stream("doomed")
    return log, doomed


def test_collect_garbage_retries_failed_deletes(faulty: type[FaultyMemoryFileSystem]) -> None:
    log, doomed = _with_garbage()
    with log:
        faulty.failing_deletes = 3
        report = log.collect_garbage(grace_seconds=0)
        assert report.objects_deleted == len(doomed)
        assert not doomed & set(_fast(log).storage.list_objects())
        assert log.metrics()["delete_errors"] == 3
        assert [r.value for r in log.stream("kept").read()] == [b"kept"]


@pytest.mark.parametrize("what", ["failing_deletes", "failing_lists"])
def test_collect_garbage_raises_a_storage_error_and_the_next_run_finishes(
    faulty: type[FaultyMemoryFileSystem], what: str
) -> None:
    log, doomed = _with_garbage()
    with log:
        setattr(faulty, what, 99)
        with pytest.raises(StorageError) as caught:
            log.collect_garbage(grace_seconds=0)
        assert isinstance(caught.value.__cause__, faulty.fault)
        setattr(faulty, what, 0)
        log.collect_garbage(grace_seconds=0)
        assert not doomed & set(_fast(log).storage.list_objects())
        assert [r.value for r in log.stream("kept").read()] == [b"kept"]


# ----------------------------------------------------------------- the marker


def _open(url: str, **options: Any) -> disklesslog.Log:
    return disklesslog.open(url, sequencer=MemorySequencer(), cache=None, **options)


def test_opening_while_lookups_fail_finds_the_marker(faulty: type[FaultyMemoryFileSystem]) -> None:
    """fsspec's ``exists`` answers False when its request fails: a log must not be taken
    for "not a log" (nor get its marker written again) because of a failed lookup."""
    url = _url()
    _open(url).close()
    faulty.failing_infos = 99
    faulty.failing_gets = 2
    with _open(url, create=False) as log:
        assert log.streams() == []
    assert faulty.failing_gets == 0


def test_a_failed_lookup_never_overwrites_another_kind_of_marker(
    faulty: type[FaultyMemoryFileSystem],
) -> None:
    url = _url()
    fs = FaultyMemoryFileSystem()
    marker = url.removeprefix("faulty-memory://") + "/disklesslog.json"
    other = b'{"format": "disklesslog-tier", "version": 1, "log_id": "x"}\n'
    fs.pipe_file(marker, other)
    faulty.failing_infos = 99
    with pytest.raises(InvalidURL, match="another kind"):
        _open(url)
    assert fs.cat_file(marker) == other


def test_opening_while_the_marker_cannot_be_read_is_a_storage_error(
    faulty: type[FaultyMemoryFileSystem],
) -> None:
    url = _url()
    _open(url).close()
    faulty.failing_gets = 99
    with pytest.raises(StorageError, match=r"disklesslog\.json") as caught:
        _open(url)
    assert isinstance(caught.value.__cause__, faulty.fault)
