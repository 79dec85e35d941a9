"""Two-phase commits (stage, then commit or abort) on every backend and sequencer.

Stagers stand in for Spark tasks: each stages its records and returns a part; the
committer commits every part under one transaction id. The guarantees: nothing is
visible before the commit, everything after it, a repeated commit stores nothing, an
abort leaves nothing, and staged data nobody commits is collected as garbage.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

import disklesslog
from disklesslog import ConfigError, InvalidStreamName, TransactionError
from disklesslog.transactions import StagedObject, StagedPart

from .fixtures import LogFixtures

__all__ = ["TransactionContract"]


def _stage(log: disklesslog.Log, rows: dict[str, list[bytes]], **options: int) -> StagedPart:
    stager = log.stager(**options)
    for stream, values in rows.items():
        stager.append_batch(stream, values, keys=[b"k" + v for v in values], timestamps=1_000)
    return stager.finish()


def _values(log: disklesslog.Log, stream: str) -> list[bytes | None]:
    return [r.value for r in log.stream(stream).read()] if stream in log.streams() else []


def _staged_count(log: disklesslog.Log) -> int:
    """Staged objects (object logs) or staged files (local logs) still stored."""
    storage = getattr(log, "storage", None)
    if storage is None:
        return len(list(Path(log.url, "staged").glob("*.staged")))
    return sum(1 for key in storage.list_objects() if key.endswith(".staged"))


class TransactionContract(LogFixtures):
    """Two-phase commits: stage, then commit or abort."""

    def test_staged_records_appear_only_at_the_commit(self, log: disklesslog.Log) -> None:
        log.stream("a").append(b"before")
        parts = [
            _stage(log, {"a": [b"1", b"2"], "b": [b"x"]}),
            _stage(log, {"b": [b"y", b"z"], "a": [b"3"]}),
        ]
        assert _values(log, "a") == [b"before"] and _values(log, "b") == []
        parts = pickle.loads(pickle.dumps(parts))  # they travel to the committer
        result = log.commit_transaction("job-1", parts)
        assert not result.duplicate
        assert result.ranges == {"a": (1, 4), "b": (0, 3)}
        assert _values(log, "a") == [b"before", b"1", b"2", b"3"]
        assert _values(log, "b") == [b"x", b"y", b"z"]
        assert [r.key for r in log.stream("b").read()] == [b"kx", b"ky", b"kz"]

    def test_a_repeated_commit_stores_nothing(self, log: disklesslog.Log) -> None:
        first = log.commit_transaction("q:1", [_stage(log, {"a": [b"1", b"2"]})])
        # A replayed micro-batch re-runs its tasks: new parts, same transaction id.
        again = log.commit_transaction("q:1", [_stage(log, {"a": [b"1", b"2"]})])
        assert again.duplicate and again.ranges == first.ranges == {"a": (0, 2)}
        assert _values(log, "a") == [b"1", b"2"]

    def test_an_abort_leaves_nothing_visible(self, log: disklesslog.Log) -> None:
        log.stream("a").append(b"kept")
        part = _stage(log, {"a": [b"1"], "new": [b"2"]})
        log.abort_transaction([part])
        assert _values(log, "a") == [b"kept"]
        assert "new" not in log.streams()
        with pytest.raises(TransactionError):  # aborted parts can never be committed
            log.commit_transaction("late", [part])
        assert _values(log, "a") == [b"kept"]

    def test_orphans_of_an_abort_and_of_a_crash_are_collected(
        self, log: disklesslog.Log, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        aborted = _stage(log, {"a": [b"1"]})
        log.abort_transaction([aborted])
        _stage(log, {"a": [b"2"]})  # the committer "crashed": never committed nor aborted
        kept = _stage(log, {"a": [b"3"]})
        log.commit_transaction("t", [kept])
        monkeypatch.setattr("disklesslog.objects.gc.UNKNOWN_MIN_AGE", 0)
        monkeypatch.setattr("disklesslog.objects.gc.STAGED_UNKNOWN_MIN_AGE", 0)
        monkeypatch.setattr("disklesslog.segments.transactions.STAGED_UNKNOWN_MIN_AGE", 0)
        time.sleep(0.01)
        log.collect_garbage(grace_seconds=0)
        assert _values(log, "a") == [b"3"]  # the committed data is intact
        # Left: the committed object (object logs); local logs copied it into the stream.
        assert _staged_count(log) == (0 if getattr(log, "storage", None) is None else 1)

    def test_many_objects_per_part_and_large_batches(self, log: disklesslog.Log) -> None:
        values = [bytes([i % 256]) * 1000 for i in range(3000)]  # ~3 MB: several batches
        part = _stage(log, {"big": values, "small": [b"s"]}, max_object_bytes=1 << 20)
        assert len(part.objects) >= 2
        assert part.records == 3001
        result = log.commit_transaction("big", [part])
        assert result.ranges == {"big": (0, 3000), "small": (0, 1)}
        assert _values(log, "big") == values

    def test_an_empty_transaction_commits_nothing(self, log: disklesslog.Log) -> None:
        empty = log.stager().finish()
        assert empty.objects == () and empty.records == 0
        assert log.commit_transaction("nothing", [empty]).ranges == {}
        assert log.commit_transaction("nothing", []).duplicate

    def test_bad_input_is_refused(self, log: disklesslog.Log) -> None:
        part = _stage(log, {"a": [b"1"]})
        with pytest.raises(ConfigError):
            log.commit_transaction("", [part])
        with pytest.raises(ConfigError):
            log.commit_transaction("t", part)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            log.commit_transaction("t", ["not a part"])  # type: ignore[list-item]
        with pytest.raises(TransactionError, match="cannot be committed to"):
            log.commit_transaction("t", [StagedPart("elsewhere://x", part.objects)])
        with pytest.raises(TransactionError, match="two parts"):
            log.commit_transaction("t", [part, part])
        forged = StagedPart(log.url, (StagedObject("objects/not-staged", part.objects[0].batches),))
        with pytest.raises(TransactionError):
            log.commit_transaction("t", [forged])
        stager = log.stager()
        with pytest.raises(InvalidStreamName):
            stager.append_batch("bad/name", [b"x"])
        assert _values(log, "a") == []  # nothing of the refused commits
        assert log.commit_transaction("t", [part]).ranges == {"a": (0, 1)}

    def test_a_finished_stager_refuses_more_records(self, log: disklesslog.Log) -> None:
        stager = log.stager()
        stager.append_batch("a", [b"1"])
        part = stager.finish()
        assert stager.finish() == part
        with pytest.raises(disklesslog.LogClosedError):
            stager.append_batch("a", [b"2"])
