"""Merging and key compaction while storage misbehaves (issue 14, "no silent loss"):
their source reads go straight to storage, and a batch whose bytes were damaged on the
way is fetched again (alone, up to the reader's limit), logged and counted, so the pass
completes with the stored bytes; bytes that storage returns damaged twice are reported
as damage naming the object, and nothing is swapped in. On ``faulty-memory://``."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from object_support import as_objects, rows, write

import disklesslog
from disklesslog import CorruptDataError
from disklesslog.objects.storage import COMPACTED, MERGED, key_kind
from disklesslog.sequencers.memory import MemorySequencer
from disklesslog.testing import FaultyMemoryFileSystem

LATER = int(time.time() * 1000) + 3_600_000  # every small run has waited
NOW = 50_000_000


@pytest.fixture
def faulty() -> Iterator[type[FaultyMemoryFileSystem]]:
    FaultyMemoryFileSystem.reset()
    yield FaultyMemoryFileSystem
    FaultyMemoryFileSystem.reset()


def _open(**options: Any) -> disklesslog.Log:
    """A log on faulty-memory:// whose sequencer is in memory (no faults in its state)."""
    url = f"faulty-memory://rewrite-faults-{uuid.uuid4().hex[:12]}/log"
    return disklesslog.open(url, sequencer=MemorySequencer(), cache=None, **options)


def _filled(**options: Any) -> disklesslog.Log:
    """Stream ``s``: 300 keyed records in batches of 10, in three WAL objects."""
    log = _open(**options)
    items = [(b"k%02d" % (i % 40), b"v%04d-" % i + b"." * 50, NOW - 20_000 + i) for i in range(300)]
    write(log, "s", items, per_batch=10, flushes=3)
    return log


def test_a_bit_flipped_on_the_way_does_not_fail_a_merge(
    faulty: type[FaultyMemoryFileSystem], caplog: pytest.LogCaptureFixture
) -> None:
    with _filled() as log:
        before = rows(log, "s")
        faulty.corrupt_gets = 1  # the first source GET: a batch in its middle fails its CRC
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            report = log.merge("s", target_bytes=1 << 20, now_ms=LATER)
        assert faulty.corrupt_gets == 0
        assert report.objects_written == 1
        assert {key_kind(b.object_key) for b in as_objects(log).live_batches("s")} == {MERGED}
        assert rows(log, "s") == before
        assert log.metrics()["refetches"] == 1
        assert "fetched again straight from storage (1 time(s)), the bytes passed" in caplog.text


def test_a_bit_flipped_on_the_way_does_not_fail_a_compaction(
    faulty: type[FaultyMemoryFileSystem], caplog: pytest.LogCaptureFixture
) -> None:
    with _filled(cleanup_policy="compact", segment_bytes=1024) as log:
        before = rows(log, "s")
        faulty.corrupt_gets = 1
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            report = log.compact(now_ms=NOW, force=True)
        assert faulty.corrupt_gets == 0
        assert report.records_removed > 0
        assert any(key_kind(b.object_key) == COMPACTED for b in as_objects(log).live_batches("s"))
        latest = {key: offset for offset, _, key, _ in before}
        kept = rows(log, "s")
        assert {row[0] for row in kept} >= set(latest.values())
        assert all(row in before for row in kept)
        assert log.metrics()["refetches"] == 1
        assert "the bytes passed" in caplog.text


def test_bytes_damaged_in_storage_fail_the_pass_after_one_more_get(
    faulty: type[FaultyMemoryFileSystem],
) -> None:
    with _filled() as log:
        objects = as_objects(log)
        victim = list(objects.live_batches("s"))[12]
        path = objects.storage.path(victim.object_key)
        data = bytearray(objects.storage.fs.cat_file(path))
        data[victim.position + victim.size - 3] ^= 0xFF  # inside the body: the CRC catches it
        objects.storage.fs.pipe_file(path, bytes(data))
        before = list(objects.live_batches("s"))
        gets = faulty.gets
        with pytest.raises(CorruptDataError, match="same bytes twice") as caught:
            log.merge("s", target_bytes=1 << 20, now_ms=LATER)
        assert caught.value.source == f"object {victim.object_key}"
        assert caught.value.position == victim.position
        assert log.metrics()["refetches"] == 1
        # One GET per WAL object up to the victim's (the second), then the batch alone once.
        assert faulty.gets - gets == 3
        assert list(objects.live_batches("s")) == before


def test_bytes_failing_on_every_get_are_reported_after_the_limit(
    faulty: type[FaultyMemoryFileSystem], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _filled() as log:
        objects = as_objects(log)
        storage = objects.storage
        victim = list(objects.live_batches("s"))[12]
        get_range = storage.get_range
        served = [0]

        def damaging(key: str, start: int, end: int) -> bytes:
            """Each GET of the victim damages another byte of it: never twice the same."""
            data = bytearray(get_range(key, start, end))
            if key == victim.object_key and start <= victim.position < end:
                served[0] += 1
                data[victim.position - start + victim.size - served[0]] ^= 0xFF
            return bytes(data)

        monkeypatch.setattr(storage, "get_range", damaging)
        with pytest.raises(CorruptDataError, match="failed on each of 3 fetches"):
            log.merge("s", target_bytes=1 << 20, now_ms=LATER)
        assert served[0] == 4
        assert log.metrics()["refetches"] == 3
