"""The object-store primitives disklesslog relies on, checked on each real fsspec client
(s3fs, adlfs, gcsfs) against a local emulator (moto, Azurite, fake-gcs-server).

The conformance suites show that logs work on these stores; these tests pin down the
individual client behaviours underneath, so that a client or emulator upgrade that
breaks one says which: put-if-absent (the object-store sequencer's commit), ranged
reads (every record read), missing keys (data-loss detection, idempotent deletion),
and a log round trip read back without the cache.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

import disklesslog
from disklesslog import DataLossError, ProducerFenced
from disklesslog.metrics import Metrics
from disklesslog.objects.storage import ObjectStorage
from disklesslog.sequencers.objectstore import ObjectStoreSequencer
from disklesslog.storage.conditional import put_if_absent
from disklesslog.testing import create_bucket
from disklesslog.testing.servers.azurite import azure_storage_options
from disklesslog.testing.servers.gcs import gcs_storage_options  # before gcsfs: see its docstring
from disklesslog.testing.servers.s3 import s3_storage_options


@dataclass(frozen=True)
class Cloud:
    protocol: str
    server_fixture: str
    storage_options: Callable[[str], dict[str, Any]]


CLOUDS = [
    pytest.param(Cloud("s3", "s3_server", s3_storage_options), id="s3", marks=pytest.mark.s3),
    pytest.param(
        Cloud("az", "azure_server", azure_storage_options), id="azure", marks=pytest.mark.azure
    ),
    pytest.param(Cloud("gs", "gcs_server", gcs_storage_options), id="gcs", marks=pytest.mark.gcs),
]


@dataclass
class Bucket:
    """A fresh bucket (container) on one emulator, and the client that reaches it."""

    protocol: str
    name: str
    fs: Any
    storage_options: dict[str, Any]

    def path(self, key: str) -> str:
        return f"{self.name}/{key}"

    def url(self, key: str) -> str:
        return f"{self.protocol}://{self.name}/{key}"


@pytest.fixture(params=CLOUDS)
def bucket(request: pytest.FixtureRequest) -> Bucket:
    cloud: Cloud = request.param
    options = cloud.storage_options(request.getfixturevalue(cloud.server_fixture))
    name = create_bucket(cloud.protocol, options)
    return Bucket(cloud.protocol, name, fsspec.filesystem(cloud.protocol, **options), options)


# ---------------------------------------------------------------- put-if-absent


def test_put_if_absent_succeeds_once_and_keeps_the_first_content(bucket: Bucket) -> None:
    path = bucket.path("commits/00000000000000000001")
    bucket.fs.pipe_file(path, b"first", mode="create")
    with pytest.raises(FileExistsError):
        bucket.fs.pipe_file(path, b"second", mode="create")
    assert bucket.fs.cat_file(path) == b"first"
    bucket.fs.pipe_file(path, b"overwritten")  # the default mode still overwrites
    assert bucket.fs.cat_file(path) == b"overwritten"


def test_put_if_absent_race_has_exactly_one_winner(bucket: Bucket) -> None:
    """Writers racing for the same commit slot: the store, not the client, decides. Many
    rounds: an emulator that checks and then writes lets two win now and then (moto's
    own server does; the suite's makes its conditional PUTs atomic, as S3's are)."""
    for slot in range(ROUNDS):
        path = bucket.path(f"commits/{slot:020d}")
        winners, losers, errors = _race_for(bucket, path, writers=8)
        assert not errors
        assert len(winners) == 1, (slot, winners)
        assert len(losers) == 7
        assert bucket.fs.cat_file(path) == f"writer {winners[0]}".encode()


ROUNDS = 50


def _race_for(
    bucket: Bucket, path: str, *, writers: int
) -> tuple[list[int], list[int], list[BaseException]]:
    """``writers`` threads create ``path`` at once: (winners, losers, errors)."""
    start = threading.Barrier(writers)
    winners: list[int] = []
    losers: list[int] = []
    errors: list[BaseException] = []

    def race(writer: int) -> None:
        start.wait()
        try:
            bucket.fs.pipe_file(path, f"writer {writer}".encode(), mode="create")
        except FileExistsError:
            losers.append(writer)
        except BaseException as exc:
            errors.append(exc)
        else:
            winners.append(writer)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return winners, losers, errors


# ---------------------------------------------------------------- ranged reads


def test_ranged_reads(bucket: Bucket) -> None:
    # start/end by keyword: s3fs's cat_file takes version_id as its second positional.
    data = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes: past one read block
    size = len(data)
    path = bucket.path("objects/ranged")
    bucket.fs.pipe_file(path, data)
    for start, end in [(0, 10), (100, 200), (65_530, 65_550), (size - 4, size), (0, size)]:
        assert bucket.fs.cat_file(path, start=start, end=end) == data[start:end], (start, end)
    assert bucket.fs.cat_file(path, start=size - 4, end=size + 100) == b"tail"  # short at the end
    assert bucket.fs.cat_file(path, start=1000) == data[1000:]
    assert bucket.fs.cat_file(path) == data


# ---------------------------------------------------------------- missing keys


def test_a_missing_key_raises_file_not_found(bucket: Bucket) -> None:
    missing = bucket.path("objects/never-written")
    with pytest.raises(FileNotFoundError):
        bucket.fs.cat_file(missing)
    with pytest.raises(FileNotFoundError):
        bucket.fs.cat_file(missing, start=0, end=10)
    assert not bucket.fs.exists(missing)


def test_storage_layer_on_missing_objects(bucket: Bucket) -> None:
    """A read of a vanished object is data loss; deleting one is fine (GC is retried)."""
    root = bucket.path("log")
    storage = ObjectStorage(bucket.fs, root, Metrics())
    key = storage.new_key()
    storage.put(key, b"0123456789")
    assert storage.get_range(key, 2, 5) == b"234"
    storage.delete([key])
    with pytest.raises(DataLossError):
        storage.get_range(key, 0, 4)
    storage.delete([key])  # already gone: no error


def test_many_deletes_at_once_through_the_client(bucket: Bucket) -> None:
    """Deletes run in several threads at once (one request per object on every store),
    each through the client's own event loop; missing keys among them are fine."""
    storage = ObjectStorage(bucket.fs, bucket.path("log"), Metrics())
    keys = [storage.new_key() for _ in range(40)]
    for key in keys:
        storage.put(key, b"x")
    # S3 answers a DELETE of a missing key as it answers any other: counted too.
    counted = 41 if bucket.protocol == "s3" else 40
    assert storage.delete([*keys, "objects/never-written"]) == counted
    assert storage.listing("objects") == {}
    assert storage.metrics.snapshot()["deletes"] == counted


# ---------------------------------------------------------------- a log


@pytest.mark.parametrize("sequencer_kind", ["objectstore", "sqlite"])
def test_log_round_trip(bucket: Bucket, tmp_path: Path, sequencer_kind: str) -> None:
    """Append, reopen, read back; with the default object-store sequencer (in the bucket)
    and with SQLite beside it."""
    url = bucket.url("log")
    sequencer = None if sequencer_kind == "objectstore" else f"sqlite://{tmp_path}/meta.db"
    with disklesslog.open(url, storage_options=bucket.storage_options, sequencer=sequencer) as log:
        writer = log.writer(linger_ms=5)
        futures = [
            writer.append(stream, f"{stream}-{n}".encode(), key=f"k{n}".encode())
            for n in range(50)
            for stream in ("orders", "payments")
        ]
        writer.close()
        assert sorted(f.result() for f in futures) == sorted(list(range(50)) * 2)
    assert bucket.fs.ls(bucket.path("log/objects"))  # the records really are in the store

    options = {"storage_options": bucket.storage_options, "sequencer": sequencer}
    with disklesslog.open(url, create=False, cache=None, **options) as log:  # ranged GETs
        assert sorted(log.streams()) == ["orders", "payments"]
        for stream in ("orders", "payments"):
            records = list(log.stream(stream).read())
            assert [r.offset for r in records] == list(range(50))
            assert [r.value for r in records] == [f"{stream}-{n}".encode() for n in range(50)]
            assert [r.key for r in records] == [f"k{n}".encode() for n in range(50)]
    if sequencer is None:
        assert bucket.fs.ls(bucket.path("log/_sequencer/log"))  # entries in the bucket


def test_objectstore_sequencer_put_if_absent(bucket: Bucket) -> None:
    """The object-store sequencer's one primitive, through this client."""
    path = bucket.path("seq/log/00000000000000000001")
    assert put_if_absent(bucket.fs, path, b"first")
    assert not put_if_absent(bucket.fs, path, b"second")
    assert bucket.fs.cat_file(path) == b"first"


def test_fencing_between_two_machines(bucket: Bucket) -> None:
    """Two handles of one log are two replicas of its object-store sequencer, as on two
    machines: a named producer started on the second fences the first, whose records
    never become visible and whose object is recorded for garbage collection."""
    url = bucket.url("fenced")
    options = bucket.storage_options
    with disklesslog.open(url, storage_options=options) as first:
        assert isinstance(first.sequencer, ObjectStoreSequencer)  # type: ignore[attr-defined]
        zombie = first.writer(producer="ingest", linger_ms=0)
        assert zombie.append("s", b"a").result() == 0
        with disklesslog.open(url, storage_options=options) as second:
            with second.writer(producer="ingest", linger_ms=0) as successor:
                assert successor.append("s", b"b").result() == 1
            with pytest.raises(ProducerFenced):
                zombie.append("s", b"zombie").result()
            orphans = second.sequencer.objects_to_delete(0)  # type: ignore[attr-defined]
            assert len(orphans) == 1
            assert bucket.fs.exists(bucket.path(f"fenced/{orphans[0]}"))
    with disklesslog.open(url, storage_options=options, create=False, cache=None) as log:
        assert [r.value for r in log.stream("s").read()] == [b"a", b"b"]


# ---------------------------------------------------------------- missing clients


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [
        ("az://container/log", "adlfs", "azure"),
        ("abfs://container/log", "adlfs", "azure"),
        ("gs://bucket/log", "gcsfs", "gcs"),
        ("gcs://bucket/log", "gcsfs", "gcs"),
        ("s3://bucket/log", "s3fs", "s3"),
    ],
)
def test_a_missing_client_library_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, url: str, module: str, extra: str
) -> None:
    """As if the client were not installed: fsspec's own import of it fails."""
    registry = importlib.import_module("fsspec.registry")
    monkeypatch.setitem(sys.modules, module, None)  # `import adlfs` raises ImportError
    for protocol, spec in registry.known_implementations.items():
        if spec["class"].startswith(f"{module}."):
            monkeypatch.delitem(registry._registry, protocol, raising=False)
    with pytest.raises(disklesslog.MissingDependencyError, match=rf"disklesslog\[{extra}\]"):
        disklesslog.open(url, sequencer="memory://")
