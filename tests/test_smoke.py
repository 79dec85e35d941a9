"""The plugin's fixtures work and the package imports cleanly."""

from __future__ import annotations

import disklesslog


def test_plugin_fixture_gives_a_working_log(disklesslog_log: disklesslog.Log) -> None:
    assert disklesslog_log.stream("s").append(b"x") == 0
    assert [r.value for r in disklesslog_log.stream("s").read()] == [b"x"]


def test_plugin_open_reopens_the_same_directory(disklesslog_open) -> None:
    first = disklesslog_open()
    first.stream("s").append(b"kept")
    first.close()
    assert [r.value for r in disklesslog_open().stream("s").read()] == [b"kept"]
