"""Shared fixtures. The conformance suites are the contracts the package ships
(:mod:`disklesslog.testing.contracts`); the project runs them on its backends
(``backends.py``) and sequencers by subclassing them in ``tests/conformance``,
``tests/maintenance/test_compaction_contract.py`` and
``tests/sequencers/test_contract.py``. Here: the maintenance fixtures, on every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from backends import (
    open_file_objectstore,
    open_file_postgres,
    open_memory,
    open_s3,
    open_segments,
    remove_memory_log,
)

from disklesslog import AbstractLog
from disklesslog.testing.contracts import LogFactory


@dataclass
class Backend:
    """How to open one kind of log for the maintenance tests."""

    name: str
    open: Callable[[Path, dict[str, Any], pytest.FixtureRequest], AbstractLog]
    objects: bool = False  # the object-storage backend (one object + commit per flush)


def _maintenance_backends(*, fast_servers: bool) -> list[Any]:
    """Local segments; the object backend on ``memory://`` (memory sequencer), ``file://``
    (object-store sequencer) and ``file://`` with PostgreSQL; and the moto S3 server,
    marked slow (an HTTP round trip per request, and maintenance makes many) unless
    ``fast_servers``: the whole suite runs every test there, the default suite only the
    tests marked ``all_backends`` (one or two per operation)."""
    server = [] if fast_servers else [pytest.mark.slow]
    return [
        pytest.param(Backend("segments", open_segments), id="segments"),
        pytest.param(Backend("memory", open_memory, objects=True), id="memory"),
        pytest.param(
            Backend("file-objectstore", open_file_objectstore, objects=True), id="file-objectstore"
        ),
        pytest.param(
            Backend("file-postgres", open_file_postgres, objects=True),
            id="file-postgres",
            marks=pytest.mark.postgres,
        ),
        pytest.param(
            Backend("s3", open_s3, objects=True), id="s3", marks=[pytest.mark.s3, *server]
        ),
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


def _factory(backend: Backend, path: Path, request: pytest.FixtureRequest) -> Iterator[LogFactory]:
    factory = LogFactory(backend.open, path, request)
    yield factory
    factory.close_all()
    if backend.open is open_memory:
        remove_memory_log(path)


@pytest.fixture
def maintenance_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    """Opens logs of one maintenance backend (see :func:`_maintenance_backends`)."""
    yield from _factory(request.param, tmp_path, request)


@pytest.fixture
def object_maintenance_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[LogFactory]:
    """The object-storage backends of :func:`_maintenance_backends`: for the maintenance
    only object logs have (merging, garbage collection) and their compaction details."""
    yield from _factory(request.param, tmp_path, request)


# Spark first: a Spark test that also needs S3 joins the Spark worker (a second moto
# costs a second; a second JVM costs half a minute).
_SERVER_MARKS = ("spark", "s3", "azure", "gcs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), run every test of one emulator on one
    worker: each (moto, Azurite, fake-gcs-server, Spark's JVM) then starts once per run
    instead of once per worker. PostgreSQL's tests are many and spread: it starts per worker.

    Also marks ``slow`` the tests of a contract subclass that sets
    ``slow_unless_all_backends`` (a remote backend) unless the test is marked
    ``all_backends``: as :func:`_maintenance_backends` does for the maintenance tests.
    (This hook runs before ``-m`` deselects: conftest hooks come before pytest's own.)"""
    for item in items:
        slow_here = getattr(getattr(item, "cls", None), "slow_unless_all_backends", False)
        if slow_here and item.get_closest_marker("all_backends") is None:
            item.add_marker(pytest.mark.slow)
        for mark in _SERVER_MARKS:
            if item.get_closest_marker(mark) is not None:
                item.add_marker(pytest.mark.xdist_group(mark))
                break
