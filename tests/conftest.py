"""Shared fixtures. ``log_factory`` runs the conformance suites against every backend:
local segments; the object backend on ``memory://`` (memory sequencer) and ``file://``
(SQLite), both also with the object-store sequencer; ``file://`` with PostgreSQL
(marked ``postgres``); and on S3, Azure and GCS through real server processes and the
real fsspec clients (moto, Azurite, fake-gcs-server; marked ``s3``, ``azure``, ``gcs``
and ``slow``), sequenced by the object-store sequencer in the bucket, the default for
remote storage."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import AbstractLog
from disklesslog.testing import create_bucket, s3_storage_options
from disklesslog.testing.servers.azurite import azure_storage_options

# Imported before anything imports gcsfs: sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, without
# which every bucket access on the GCS emulator stalls 60 s on a gRPC probe.
from disklesslog.testing.servers.gcs import gcs_storage_options


@dataclass
class Backend:
    """How to open one kind of log for the conformance suites."""

    name: str
    open: Callable[[Path, dict[str, Any], pytest.FixtureRequest], AbstractLog]
    objects: bool = False  # the object-storage backend (one object + commit per flush)


def _segments(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    options.setdefault("fsync", "never")
    return disklesslog.open(path / "log", **options)


def _memory_url(path: Path) -> str:
    # One name per test (derived from its tmp_path), so reopening sees the same log and
    # the memory sequencer registry shares its state, while tests stay apart.
    return f"memory://conformance-{path.name}-{_token(path)}/log"


def _memory(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    return disklesslog.open(_memory_url(path), **options)


def _file_objects(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    return disklesslog.open(f"file://{path}/objects-log", backend="objects", **options)


def _memory_objectstore(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    return disklesslog.open(_memory_url(path), sequencer="objectstore://", **options)


def _file_objectstore(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    return disklesslog.open(
        f"file://{path}/objects-log", backend="objects", sequencer="objectstore://", **options
    )


def _file_postgres(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    """file:// objects sequenced by PostgreSQL, in a schema of the test's own (one name
    per test directory, so reopening finds the same one), dropped after the test."""
    from disklesslog.testing.servers.postgres import drop_schema

    server = request.getfixturevalue("postgres_server")
    schema = f"t_{_token(path)}"
    if schema not in _SCHEMAS:
        _SCHEMAS.add(schema)
        request.addfinalizer(lambda: drop_schema(server, schema))
    return disklesslog.open(
        f"file://{path}/objects-log",
        backend="objects",
        sequencer=f"{server}?schema={schema}",
        **options,
    )


_SCHEMAS: set[str] = set()


def _s3(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    import s3fs

    endpoint = request.getfixturevalue("s3_server")
    storage_options = s3_storage_options(endpoint)
    bucket = f"conformance-{_token(path)}"
    fs = s3fs.S3FileSystem(**storage_options)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    return disklesslog.open(f"s3://{bucket}/log", storage_options=storage_options, **options)


def _azure(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    storage_options = azure_storage_options(request.getfixturevalue("azure_server"))
    return _cloud_log("az", storage_options, path, options)


def _gcs(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    storage_options = gcs_storage_options(request.getfixturevalue("gcs_server"))
    return _cloud_log("gs", storage_options, path, options)


def _cloud_log(
    protocol: str, storage_options: dict[str, Any], path: Path, options: dict[str, Any]
) -> AbstractLog:
    """A log in the test's own bucket (reopening finds the same one), sequenced by the
    default for remote storage: the object-store sequencer inside the log."""
    bucket = create_bucket(protocol, storage_options, f"conformance-{_token(path)}")
    return disklesslog.open(
        f"{protocol}://{bucket}/log", storage_options=storage_options, **options
    )


_TOKENS: dict[Path, str] = {}


def _token(path: Path) -> str:
    return _TOKENS.setdefault(path, uuid.uuid4().hex[:12])


def _slow(mark: pytest.MarkDecorator) -> list[pytest.MarkDecorator]:
    return [mark, pytest.mark.slow]


BACKENDS = [
    pytest.param(Backend("segments", _segments), id="segments"),
    pytest.param(Backend("memory", _memory, objects=True), id="memory"),
    pytest.param(Backend("file-objects", _file_objects, objects=True), id="file-objects"),
    pytest.param(
        Backend("memory-objectstore", _memory_objectstore, objects=True), id="memory-objectstore"
    ),
    pytest.param(
        Backend("file-objectstore", _file_objectstore, objects=True), id="file-objectstore"
    ),
    pytest.param(
        Backend("file-postgres", _file_postgres, objects=True),
        id="file-postgres",
        marks=pytest.mark.postgres,
    ),
    # The emulators answer in milliseconds, not microseconds: their full conformance runs
    # belong to the whole suite (slow); tests/objects/test_clouds.py keeps a quick round
    # trip on each in the fast one.
    pytest.param(Backend("s3", _s3, objects=True), id="s3", marks=_slow(pytest.mark.s3)),
    pytest.param(
        Backend("azure", _azure, objects=True), id="azure", marks=_slow(pytest.mark.azure)
    ),
    pytest.param(Backend("gcs", _gcs, objects=True), id="gcs", marks=_slow(pytest.mark.gcs)),
]


class LogFactory:
    """Opens (and reopens) one log location of one backend; closes them all at the end."""

    def __init__(self, backend: Backend, path: Path, request: pytest.FixtureRequest) -> None:
        self.backend = backend
        self.path = path
        self.request = request
        self.opened: list[AbstractLog] = []

    def __call__(self, **options: Any) -> AbstractLog:
        log = self.backend.open(self.path, dict(options), self.request)
        self.opened.append(log)
        return log

    def close_all(self) -> None:
        for log in self.opened:
            log.close()
        if self.backend.open in (_memory, _memory_objectstore):
            # memory:// is process-wide: free the objects
            import fsspec

            fs, root = fsspec.core.url_to_fs(_memory_url(self.path))
            if fs.exists(root):
                fs.rm(root, recursive=True)


@pytest.fixture(params=BACKENDS)
def log_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    factory = LogFactory(request.param, tmp_path, request)
    yield factory
    factory.close_all()


@pytest.fixture
def log(log_factory: LogFactory) -> AbstractLog:
    return log_factory()


def _maintenance_backends(*, fast_servers: bool) -> list[Any]:
    """Local segments; the object backend on ``memory://`` (memory sequencer), ``file://``
    (object-store sequencer) and ``file://`` with PostgreSQL; and the moto S3 server,
    marked slow (an HTTP round trip per request, and maintenance makes many) unless
    ``fast_servers``: the whole suite runs every test there, the default suite only the
    tests marked ``all_backends`` (one or two per operation)."""
    server = [] if fast_servers else [pytest.mark.slow]
    return [
        pytest.param(Backend("segments", _segments), id="segments"),
        pytest.param(Backend("memory", _memory, objects=True), id="memory"),
        pytest.param(
            Backend("file-objectstore", _file_objectstore, objects=True), id="file-objectstore"
        ),
        pytest.param(
            Backend("file-postgres", _file_postgres, objects=True),
            id="file-postgres",
            marks=pytest.mark.postgres,
        ),
        pytest.param(Backend("s3", _s3, objects=True), id="s3", marks=[pytest.mark.s3, *server]),
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the maintenance fixtures: every backend, S3 runs marked slow unless
    the test is marked ``all_backends``."""
    fast = metafunc.definition.get_closest_marker("all_backends") is not None
    backends = _maintenance_backends(fast_servers=fast)
    if "maintenance_factory" in metafunc.fixturenames:
        metafunc.parametrize("maintenance_factory", backends, indirect=True)
    if "object_maintenance_factory" in metafunc.fixturenames:
        objects = [p for p in backends if p.values[0].objects]
        metafunc.parametrize("object_maintenance_factory", objects, indirect=True)


@pytest.fixture
def maintenance_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    """Opens logs of one maintenance backend (see :func:`_maintenance_backends`)."""
    factory = LogFactory(request.param, tmp_path, request)
    yield factory
    factory.close_all()


@pytest.fixture
def object_maintenance_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[LogFactory]:
    """The object-storage backends of :func:`_maintenance_backends`: for the maintenance
    only object logs have (merging, garbage collection) and their compaction details."""
    factory = LogFactory(request.param, tmp_path, request)
    yield factory
    factory.close_all()


# Spark first: a Spark test that also needs S3 joins the Spark worker (a second moto
# costs a second; a second JVM costs half a minute).
_SERVER_MARKS = ("spark", "s3", "azure", "gcs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), run every test of one emulator on one
    worker: each (moto, Azurite, fake-gcs-server, Spark's JVM) then starts once per run
    instead of once per worker. PostgreSQL's tests are many and spread: it starts per worker."""
    for item in items:
        for mark in _SERVER_MARKS:
            if item.get_closest_marker(mark) is not None:
                item.add_marker(pytest.mark.xdist_group(mark))
                break
