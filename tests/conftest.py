"""Shared fixtures. ``log_factory`` runs conformance tests against every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import AbstractLog


@dataclass
class Backend:
    """How to open one kind of log for the conformance suites."""

    name: str
    open: Callable[[Path, dict[str, Any]], AbstractLog]
    multi_stream_atomic: bool = False  # does one writer flush commit all streams at once?


def _segments(path: Path, options: dict[str, Any]) -> AbstractLog:
    options.setdefault("fsync", "never")
    return disklesslog.open(path / "log", **options)


BACKENDS = [Backend("segments", _segments)]


class LogFactory:
    """Opens (and reopens) one log location of one backend; closes them all at the end."""

    def __init__(self, backend: Backend, path: Path) -> None:
        self.backend = backend
        self.path = path
        self.opened: list[AbstractLog] = []

    def __call__(self, **options: Any) -> AbstractLog:
        log = self.backend.open(self.path, dict(options))
        self.opened.append(log)
        return log

    def close_all(self) -> None:
        for log in self.opened:
            log.close()


@pytest.fixture(params=BACKENDS, ids=lambda b: b.name)
def log_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    factory = LogFactory(request.param, tmp_path)
    yield factory
    factory.close_all()


@pytest.fixture
def log(log_factory: LogFactory) -> AbstractLog:
    return log_factory()
