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
    by SQLite in the test's temporary directory. Needs the ``dev`` extra (``moto[server]``,
    ``s3fs``); tests using it should be marked ``s3``.
``s3_server``
    the endpoint URL of that moto server (session-scoped), for tests of their own.
``disklesslog_open``
    a factory ``open(**options) -> Log`` that opens and reopens one temporary local
    log; every log it opened is closed after the test.
``disklesslog_log``
    the same as ``local_log``.

:class:`FaultyMemoryFileSystem` (protocol ``faulty-memory://``) is an in-memory fsspec
filesystem that adds latency to PUTs and GETs and fails a given number of them: for
testing retries, lost responses and latency without a network.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import disklesslog

from .api import AbstractLog

__all__ = [
    "FaultyMemoryFileSystem",
    "disklesslog_log",
    "disklesslog_open",
    "local_log",
    "memory_log",
    "moto_s3_server",
    "s3_log",
    "s3_server",
    "s3_storage_options",
]

S3_CREDENTIALS = {"key": "testing", "secret": "testing"}


class FaultyMemoryFileSystem(MemoryFileSystem):  # type: ignore[misc]
    """fsspec's memory filesystem with injected PUT/GET latency and failures.

    Settings are class attributes shared by every instance (fsspec caches instances),
    e.g. ``FaultyMemoryFileSystem.put_delay = 0.05`` or ``.failing_puts = 2`` (the
    next two PUTs raise ``ConnectionError``), or ``.lost_puts = 1`` (the next PUT is
    stored, then raises ``ConnectionError``: a response lost on the way back);
    :meth:`reset` restores them. Counts of PUTs and GETs are kept in ``puts``/``gets``.
    """

    protocol = ("faulty-memory",)
    put_delay = 0.0
    get_delay = 0.0
    failing_puts = 0
    lost_puts = 0
    failing_gets = 0
    puts = 0
    gets = 0

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith("faulty-memory://"):
            path = path[len("faulty-memory://") :]
        return super()._strip_protocol(path)

    @classmethod
    def reset(cls) -> None:
        cls.put_delay = cls.get_delay = 0.0
        cls.failing_puts = cls.lost_puts = cls.failing_gets = cls.puts = cls.gets = 0

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        type(self).puts += 1
        if self.put_delay:
            time.sleep(self.put_delay)
        if type(self).failing_puts > 0:
            type(self).failing_puts -= 1
            raise ConnectionError(f"injected PUT failure for {path}")
        super().pipe_file(path, value, mode=mode, **kwargs)
        if type(self).lost_puts > 0:
            type(self).lost_puts -= 1
            raise ConnectionError(f"injected lost response of the PUT of {path}")

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> Any:
        type(self).gets += 1
        if self.get_delay:
            time.sleep(self.get_delay)
        if type(self).failing_gets > 0:
            type(self).failing_gets -= 1
            raise ConnectionError(f"injected GET failure for {path}")
        return super().cat_file(path, start=start, end=end, **kw)


fsspec.register_implementation("faulty-memory", FaultyMemoryFileSystem, clobber=True)


def s3_storage_options(endpoint: str) -> dict[str, Any]:
    """fsspec/s3fs options that reach the test S3 server at ``endpoint``."""
    return {**S3_CREDENTIALS, "client_kwargs": {"endpoint_url": endpoint}}


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
    from .sequencers.memory import MemorySequencer  # noqa: PLC0415 - plugin stays light

    url = f"memory://disklesslog-test-{uuid.uuid4().hex}/log"
    log = disklesslog.open(url, sequencer=MemorySequencer())
    yield log
    log.close()
    _remove_memory_files(url)


def _remove_memory_files(url: str) -> None:
    import fsspec  # noqa: PLC0415

    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


@contextlib.contextmanager
def moto_s3_server(start_timeout: float = 30.0) -> Iterator[str]:
    """Run moto's S3 server as a process on a free port of 127.0.0.1; yield its endpoint
    URL; stop the process however the block is left. (Needs ``moto[server]``.)"""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A moto S3 server process on a free port of 127.0.0.1, for the whole session."""
    try:
        import moto.server  # noqa: F401, PLC0415
    except ImportError:
        pytest.fail("the s3 fixtures need moto[server] and s3fs: pip install 'disklesslog[dev]'")
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_log(s3_server: str, tmp_path: Path) -> Iterator[AbstractLog]:
    import s3fs  # noqa: PLC0415 - only for tests that ask for S3

    options = s3_storage_options(s3_server)
    bucket = f"disklesslog-{uuid.uuid4().hex[:16]}"
    s3fs.S3FileSystem(**options).mkdir(bucket)
    log = disklesslog.open(
        f"s3://{bucket}/log",
        storage_options=options,
        sequencer=f"sqlite://{tmp_path}/meta.db",
    )
    yield log
    log.close()
