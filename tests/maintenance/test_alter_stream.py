"""``Log.alter_stream``: maintenance settings change on an existing stream, for every
process that opens the log; settings that shape stored bytes stay fixed."""

from __future__ import annotations

import re

import pytest

from disklesslog import ConfigError, InvalidStreamName, StreamConfig, StreamNotFound
from disklesslog.api import AbstractLog
from disklesslog.config import ALTERABLE


def test_altered_retention_applies_everywhere(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory(segment_bytes=4096)
    with log.writer(linger_ms=60_000) as writer:
        for i in range(40):
            writer.append_batch("s", [b"x" * 200] * 5, timestamps=1_000 + i)
    assert not log.apply_retention(now_ms=10**9).changed  # kept forever by default
    config = log.alter_stream("s", retention_ms=60_000)
    assert config.retention_ms == 60_000 and config.segment_bytes == 4096
    other = maintenance_factory()  # another opening of the same log
    assert other.stream("s").config.retention_ms == 60_000
    assert other.apply_retention(now_ms=10**9).changed
    assert log.stream("s").start_offset > 0
    log.alter_stream("s", retention_bytes=10**6)
    assert other.stream("s").config.retention_ms == 60_000  # a second change keeps the first
    assert other.stream("s").config.retention_bytes == 10**6


@pytest.mark.all_backends
def test_only_maintenance_settings_may_change(maintenance_factory) -> None:  # type: ignore[no-untyped-def]
    log = maintenance_factory()
    log.create_stream("s")
    for fixed in ({"compression": "zstd"}, {"cleanup_policy": "compact"}, {"segment_bytes": 8192}):
        with pytest.raises(ConfigError, match="cannot change"):
            log.alter_stream("s", **fixed)
    with pytest.raises(ConfigError, match="unknown"):
        log.alter_stream("s", retention=5)
    with pytest.raises(ConfigError, match="nothing to alter"):
        log.alter_stream("s")
    with pytest.raises(ConfigError, match="retention_ms"):
        log.alter_stream("s", retention_ms=-9)
    with pytest.raises(ConfigError, match="local copies"):
        log.alter_stream("s", retention_ms=1_000, local_retention_ms=5_000)
    with pytest.raises(StreamNotFound):
        log.alter_stream("missing", retention_ms=1)
    with pytest.raises(InvalidStreamName):
        log.alter_stream("../x", retention_ms=1)
    assert log.stream("s").config.retention_ms == -1  # nothing changed


def test_alter_streams_docstring_names_exactly_the_alterable_settings() -> None:
    """``help(log.alter_stream)`` lists what may change; the list is ``config.ALTERABLE``,
    so the two cannot drift apart."""
    doc = AbstractLog.alter_stream.__doc__ or ""
    named = set(re.findall(r"``(\w+)``", doc))
    assert named & set(StreamConfig.__dataclass_fields__) == ALTERABLE
