"""What the log contracts ask of a backend: a way to open (and reopen) one log.

:class:`LogFixtures` is the base of :class:`~.log.LogContract`,
:class:`~.consumer.ConsumerContract`, :class:`~.transaction.TransactionContract` and
:class:`~.compaction.CompactionContract`. A backend's test class defines
:meth:`~LogFixtures.open_log` once; mixed into each contract, it runs all four. The
suites never name a backend: they get the fixtures ``log_factory`` (a
:class:`LogFactory`, which opens the test's log again on every call) and ``log`` (one
open log).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ...api import AbstractLog

__all__ = ["LogFactory", "LogFixtures", "LogOpener"]

LogOpener = Callable[[Path, dict[str, Any], pytest.FixtureRequest], AbstractLog]
"""``open_log(path, options, request)``: see :meth:`LogFixtures.open_log`."""


class LogFactory:
    """Opens (and reopens) the one log location of a test, with options for
    :func:`disklesslog.open`; closes every log it opened at the end of the test."""

    def __init__(self, open_log: LogOpener, path: Path, request: pytest.FixtureRequest) -> None:
        self.open_log = open_log
        """The suite's :meth:`LogFixtures.open_log`."""
        self.path = path
        """The test's fresh directory: the one location every call opens."""
        self.request = request
        """The test's pytest request, passed on to ``open_log``."""
        self.opened: list[AbstractLog] = []
        """Every log opened so far, closed by :meth:`close_all`."""

    def __call__(self, **options: Any) -> AbstractLog:
        """Open the test's log (again) with ``options``; the test may close it early."""
        log = self.open_log(self.path, dict(options), self.request)
        self.opened.append(log)
        return log

    def close_all(self) -> None:
        """Close every log this factory opened (closing twice is harmless), so that a
        failing test leaves no thread or file open for the next."""
        for log in self.opened:
            log.close()


class LogFixtures:
    """The fixtures every log contract runs on. A subclass defines :meth:`open_log`
    (and, if something outlives the test's directory, :meth:`remove_log`)."""

    named_producers: ClassVar[bool] = False
    """Whether the backend's ``writer()`` takes ``producer=`` (a named producer, fenced
    when another opens with its name), as the object backend's does."""

    def open_log(
        self, path: Path, options: dict[str, Any], request: pytest.FixtureRequest
    ) -> AbstractLog:
        """Open the log of the test whose fresh directory is ``path``, passing
        ``options`` (``disklesslog.open``'s) on. Called again with the same ``path``, it
        must open the same log: the suites reopen logs to check what persists.
        ``request`` reaches other fixtures (``request.getfixturevalue("s3_server")``)
        and registers cleanup (``request.addfinalizer``)."""
        raise NotImplementedError(f"{type(self).__name__} must define open_log()")

    def remove_log(self, path: Path) -> None:
        """Called once every log the test opened is closed: remove what outlives the
        test's directory ``path`` (objects in ``memory://``, a bucket). By default
        nothing does."""

    @pytest.fixture
    def log_factory(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
        """A :class:`LogFactory` on the test's fresh directory: for tests that reopen
        their log or open it with options. Closes every log it opened, then calls
        :meth:`remove_log`."""
        factory = LogFactory(self.open_log, tmp_path, request)
        yield factory
        factory.close_all()
        self.remove_log(tmp_path)

    @pytest.fixture
    def log(self, log_factory: LogFactory) -> AbstractLog:
        """The test's log, opened with default options."""
        return log_factory()
