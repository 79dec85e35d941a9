"""The backends the project runs the shipped log contracts on
(:mod:`disklesslog.testing.contracts`): local segments; the object backend on
``memory://`` (memory sequencer) and ``file://`` (SQLite), both also with the
object-store sequencer; ``file://`` with PostgreSQL; and S3, Azure and GCS through real
server processes and the real fsspec clients (moto, Azurite, fake-gcs-server),
sequenced by the object-store sequencer in the bucket, the default for remote storage.

Each backend is a mixin that gives a contract its ``open_log``; :func:`test_classes`
makes a test module's ``(Backend, Contract)`` subclass for every backend, with the
backend's marks. The openers are functions too, for the maintenance fixtures of
``conftest.py``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest

import disklesslog
from disklesslog import AbstractLog
from disklesslog.testing import create_bucket, s3_storage_options
from disklesslog.testing.servers.azurite import azure_storage_options

# Imported before anything imports gcsfs: sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, without
# which every bucket access on the GCS emulator stalls 60 s on a gRPC probe.
from disklesslog.testing.servers.gcs import gcs_storage_options


def open_segments(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    options.setdefault("fsync", "never")
    return disklesslog.open(path / "log", **options)


def memory_url(path: Path) -> str:
    # One name per test (derived from its tmp_path), so reopening sees the same log and
    # the memory sequencer registry shares its state, while tests stay apart.
    return f"memory://conformance-{path.name}-{token(path)}/log"


def open_memory(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    return disklesslog.open(memory_url(path), **options)


def open_file_objects(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    return disklesslog.open(f"file://{path}/objects-log", backend="objects", **options)


def open_memory_objectstore(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    return disklesslog.open(memory_url(path), sequencer="objectstore://", **options)


def open_file_objectstore(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    return disklesslog.open(
        f"file://{path}/objects-log", backend="objects", sequencer="objectstore://", **options
    )


def open_file_postgres(
    path: Path, options: dict[str, Any], request: pytest.FixtureRequest
) -> AbstractLog:
    """file:// objects sequenced by PostgreSQL, in a schema of the test's own (one name
    per test directory, so reopening finds the same one), dropped after the test."""
    from disklesslog.testing.servers.postgres import drop_schema

    server = request.getfixturevalue("postgres_server")
    schema = f"t_{token(path)}"
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


def open_s3(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    import s3fs

    endpoint = request.getfixturevalue("s3_server")
    storage_options = s3_storage_options(endpoint)
    bucket = f"conformance-{token(path)}"
    fs = s3fs.S3FileSystem(**storage_options)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    return disklesslog.open(f"s3://{bucket}/log", storage_options=storage_options, **options)


def open_azure(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    storage_options = azure_storage_options(request.getfixturevalue("azure_server"))
    return _cloud_log("az", storage_options, path, options)


def open_gcs(path: Path, options: dict[str, Any], request: pytest.FixtureRequest) -> AbstractLog:
    storage_options = gcs_storage_options(request.getfixturevalue("gcs_server"))
    return _cloud_log("gs", storage_options, path, options)


def _cloud_log(
    protocol: str, storage_options: dict[str, Any], path: Path, options: dict[str, Any]
) -> AbstractLog:
    """A log in the test's own bucket (reopening finds the same one), sequenced by the
    default for remote storage: the object-store sequencer inside the log."""
    bucket = create_bucket(protocol, storage_options, f"conformance-{token(path)}")
    return disklesslog.open(
        f"{protocol}://{bucket}/log", storage_options=storage_options, **options
    )


_TOKENS: dict[Path, str] = {}


def token(path: Path) -> str:
    return _TOKENS.setdefault(path, uuid.uuid4().hex[:12])


def remove_memory_log(path: Path) -> None:
    """memory:// is process-wide: free the objects of the test's log once it is closed."""
    fs, root = fsspec.core.url_to_fs(memory_url(path))
    if fs.exists(root):
        fs.rm(root, recursive=True)


# ------------------------------------------------------------- contract mixins


class Segments:
    """Local segment files."""

    open_log = staticmethod(open_segments)


class Memory:
    """The object backend on ``memory://``, sequenced in memory."""

    named_producers = True
    open_log = staticmethod(open_memory)
    remove_log = staticmethod(remove_memory_log)


class FileObjects:
    """The object backend on ``file://``, sequenced by SQLite."""

    named_producers = True
    open_log = staticmethod(open_file_objects)


class MemoryObjectstore:
    """The object backend on ``memory://``, sequenced by the object-store sequencer."""

    named_producers = True
    open_log = staticmethod(open_memory_objectstore)
    remove_log = staticmethod(remove_memory_log)


class FileObjectstore:
    """The object backend on ``file://``, sequenced by the object-store sequencer."""

    named_producers = True
    open_log = staticmethod(open_file_objectstore)


class FilePostgres:
    """The object backend on ``file://``, sequenced by PostgreSQL (mark ``postgres``)."""

    named_producers = True
    open_log = staticmethod(open_file_postgres)


class S3:
    """The object backend on moto's S3 server through s3fs (mark ``s3``)."""

    named_producers = True
    open_log = staticmethod(open_s3)


class Azure:
    """The object backend on Azurite through adlfs (mark ``azure``)."""

    named_producers = True
    open_log = staticmethod(open_azure)


class Gcs:
    """The object backend on fake-gcs-server through gcsfs (mark ``gcs``)."""

    named_producers = True
    open_log = staticmethod(open_gcs)


# The emulators answer in milliseconds, not microseconds: their full conformance runs
# belong to the whole suite (slow); tests/objects/test_clouds.py keeps a quick round
# trip on each in the fast one.
BACKENDS: tuple[tuple[type, tuple[pytest.MarkDecorator, ...]], ...] = (
    (Segments, ()),
    (Memory, ()),
    (FileObjects, ()),
    (MemoryObjectstore, ()),
    (FileObjectstore, ()),
    (FilePostgres, (pytest.mark.postgres,)),
    (S3, (pytest.mark.s3, pytest.mark.slow)),
    (Azure, (pytest.mark.azure, pytest.mark.slow)),
    (Gcs, (pytest.mark.gcs, pytest.mark.slow)),
)
"""Every backend mixin, with the marks its test classes carry."""


def test_classes(contract: type, module: str) -> dict[str, type]:
    """``Test<Backend>`` classes running ``contract`` on every backend of
    :data:`BACKENDS`, for a test module to put in its namespace (``globals().update``),
    where pytest collects them; ``module`` is that module's ``__name__``."""
    made: dict[str, type] = {}
    for backend, marks in BACKENDS:
        name = f"Test{backend.__name__}"
        cls: type = type(name, (backend, contract), {"__module__": module})
        for mark in marks:
            cls = mark(cls)
        made[name] = cls
    return made


test_classes.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test
