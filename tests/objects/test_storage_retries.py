"""Storage retries see through the clients' own error types: gcsfs's HttpError and Azure's
ServiceRequestError are not OSErrors, yet a transient one must be retried like any other
(a write-once key and the same bytes make every PUT retry safe; GETs change nothing).
The last failure is a StorageError (also an OSError); a missing object is not retried."""

from __future__ import annotations

import uuid
from typing import Any

import fsspec
import pytest

from disklesslog import DataLossError, DisklessLogError, StorageError
from disklesslog.metrics import Metrics
from disklesslog.objects.storage import ObjectStorage
from disklesslog.sequencers.base import BatchToCommit
from disklesslog.sequencers.objectstore import ObjectStoreSequencer


class ClientError(Exception):
    """Stands in for a client library's transient error that is not an OSError."""


class Flaky:
    """Wraps a memory filesystem; its next ``failures`` PUTs and ``get_failures`` GETs
    raise ClientError."""

    def __init__(self, failures: int, get_failures: int = 0) -> None:
        self.fs = fsspec.filesystem("memory")
        self.failures = failures
        self.get_failures = get_failures
        self.gets = 0
        self.protocol = "flaky"

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        self.gets += 1
        if self.get_failures:
            self.get_failures -= 1
            raise ClientError("503 Slow Down")
        return bytes(self.fs.cat_file(path, start=start, end=end))

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite", **kw: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise ClientError("503 Service Unavailable")
        if mode == "create" and self.fs.exists(path):
            raise FileExistsError(path)
        self.fs.pipe_file(path, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


def test_object_put_retries_a_client_error() -> None:
    fs = Flaky(failures=2)
    storage = ObjectStorage(fs, f"/flaky-{uuid.uuid4().hex}", Metrics(), retry_delay=0.001)
    storage.put("objects/a", b"data")
    assert fs.fs.cat_file(f"{storage.root}/objects/a") == b"data"
    assert storage.metrics.snapshot()["put_errors"] == 2


def test_object_put_gives_up_with_an_oserror_naming_the_cause() -> None:
    storage = ObjectStorage(
        Flaky(failures=99), f"/flaky-{uuid.uuid4().hex}", Metrics(), retry_delay=0.001
    )
    with pytest.raises(OSError, match=r"objects/a .*after 5 attempts: 503") as caught:
        storage.put("objects/a", b"data")
    assert isinstance(caught.value, StorageError)
    assert isinstance(caught.value, DisklessLogError)
    assert isinstance(caught.value.__cause__, ClientError)


def test_object_get_retries_a_client_error() -> None:
    fs = Flaky(failures=0)
    storage = ObjectStorage(fs, f"/flaky-{uuid.uuid4().hex}", Metrics(), retry_delay=0.001)
    storage.put("objects/a", b"0123456789")
    fs.get_failures = 4
    assert storage.get_range("objects/a", 2, 5) == b"234"
    assert storage.metrics.snapshot()["get_errors"] == 4
    fs.get_failures = 5
    with pytest.raises(StorageError, match=r"could not read object objects/a .*503"):
        storage.get_range("objects/a", 2, 5)
    fs.get_failures = 2
    assert storage.read_small("objects/a") == b"0123456789"


def test_a_missing_object_is_data_loss_without_retries() -> None:
    fs = Flaky(failures=0)
    storage = ObjectStorage(fs, f"/flaky-{uuid.uuid4().hex}", Metrics(), retry_delay=0.001)
    with pytest.raises(DataLossError, match="objects/gone"):
        storage.get_range("objects/gone", 0, 10)
    assert fs.gets == 1
    assert "get_errors" not in storage.metrics.snapshot()


def test_sequencer_entry_put_retries_a_client_error() -> None:
    fs = Flaky(failures=0)
    root = f"/flaky-{uuid.uuid4().hex}"
    seq = ObjectStoreSequencer(fs, root)
    seq.create_stream("s", {})
    fs.failures = 2
    result = seq.commit("o", [BatchToCommit("s", 0, 10, 1, 1, 0)])
    assert result[0].base_offset == 0
    assert ObjectStoreSequencer(fs, root).stream_info("s").end_offset == 1
