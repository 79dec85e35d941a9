"""pytest plugin: fixtures that give tests a fresh log.

Installed as the ``disklesslog`` pytest plugin (an entry point), so any project that
depends on disklesslog can use these fixtures without importing anything:

``disklesslog_log``
    a local log in a fresh temporary directory (``fsync="never"``: tests need no
    power-loss durability), closed after the test.
``disklesslog_open``
    a factory ``open(**options) -> Log`` that opens (and re-opens) one temporary log
    directory; every log it opened is closed after the test. For tests of reopening.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import disklesslog

from .api import AbstractLog

__all__ = ["disklesslog_log", "disklesslog_open"]


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
