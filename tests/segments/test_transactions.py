"""Two-phase commits on local logs: a commit interrupted mid-way is rolled forward by a
retry of the same transaction id, exactly once, whichever step it stopped at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog.segments import transactions
from disklesslog.segments.store import StreamStore
from disklesslog.transactions import StagedPart


class Crash(Exception):
    """Stands for the process dying at this point."""


def _part(log: disklesslog.Log) -> StagedPart:
    stager = log.stager()
    stager.append_batch("a", [b"a1", b"a2"], timestamps=5)
    stager.append_batch("b", [b"b1"], timestamps=5)
    stager.append_batch("c", [b"c1", b"c2", b"c3"], timestamps=5)
    return stager.finish()


def _contents(log: disklesslog.Log) -> dict[str, list[bytes | None]]:
    return {s: [r.value for r in log.stream(s).read()] for s in log.streams()}


EXPECTED = {"a": [b"a1", b"a2"], "b": [b"b1"], "c": [b"c1", b"c2", b"c3"]}


def test_a_crash_before_a_stream_is_appended_is_finished_by_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        real = StreamStore.append

        def crash_on_b(self: StreamStore, batches: Any, **kwargs: Any) -> list[int]:
            if self.name == "b":
                raise Crash
            return real(self, batches, **kwargs)

        monkeypatch.setattr(StreamStore, "append", crash_on_b)
        with pytest.raises(Crash):
            log.commit_transaction("t", [part])
        # What a crash mid-commit leaves: the streams before the interrupted one (which
        # was created, empty).
        assert _contents(log) == {"a": [b"a1", b"a2"], "b": []}
        monkeypatch.setattr(StreamStore, "append", real)
    with disklesslog.open(str(tmp_path / "log")) as log:  # a new process retries
        result = log.commit_transaction("t", [part])
        assert result.ranges == {"a": (0, 2), "b": (0, 1), "c": (0, 3)}
        assert _contents(log) == EXPECTED
        assert log.commit_transaction("t", [part]).duplicate
        assert not list((tmp_path / "log" / "staged").iterdir())  # cleaned up


def test_a_crash_after_an_append_before_its_note_is_not_appended_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        log.stream("b").append(b"earlier")
        part = _part(log)
        real = transactions._write_durably

        def crash_after_b(path: Path, data: bytes, sync: bool) -> None:
            if path.name.endswith(".progress.json") and b'"b": {"range"' in data:
                raise Crash  # b's records are in; the note saying so is not
            real(path, data, sync)

        monkeypatch.setattr(transactions, "_write_durably", crash_after_b)
        with pytest.raises(Crash):
            log.commit_transaction("t", [part])
        monkeypatch.setattr(transactions, "_write_durably", real)
        result = log.commit_transaction("t", [part])
        assert result.ranges == {"a": (0, 2), "b": (1, 2), "c": (0, 3)}
        assert _contents(log) == {**EXPECTED, "b": [b"earlier", b"b1"]}


def test_a_noted_append_that_did_not_happen_is_done_by_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        real = StreamStore.append

        def note_then_crash(self: StreamStore, batches: Any, **kwargs: Any) -> list[int]:
            if self.name == "c":
                kwargs["before"](self.snapshot().end_offset)  # noted, never written
                raise Crash
            return real(self, batches, **kwargs)

        monkeypatch.setattr(StreamStore, "append", note_then_crash)
        with pytest.raises(Crash):
            log.commit_transaction("t", [part])
        monkeypatch.setattr(StreamStore, "append", real)
        log.stream("c").append(b"other writer")  # lands where c's batches were to go
        result = log.commit_transaction("t", [part])
        assert result.ranges["c"] == (1, 4)
        assert _contents(log) == {**EXPECTED, "c": [b"other writer", b"c1", b"c2", b"c3"]}


def test_transaction_records_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transactions, "TRACKED_TRANSACTIONS", 2)
    with disklesslog.open(str(tmp_path / "log")) as log:
        for i in range(4):
            stager = log.stager()
            stager.append_batch("a", [b"%d" % i])
            log.commit_transaction(f"t{i}", [stager.finish()])
        records = list((tmp_path / "log" / "transactions").glob("*.json"))
        assert len(records) <= 3  # the bound, plus the newest before its next prune
        assert log.commit_transaction("t3", []).duplicate


def test_an_abort_keeps_the_files_of_an_interrupted_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark aborts a job whose commit failed half-way: the retry still finishes it."""
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        other = _part(log)
        real = StreamStore.append

        def crash_on_c(self: StreamStore, batches: Any, **kwargs: Any) -> list[int]:
            if self.name == "c":
                raise Crash
            return real(self, batches, **kwargs)

        monkeypatch.setattr(StreamStore, "append", crash_on_c)
        with pytest.raises(Crash):
            log.commit_transaction("t", [part])
        monkeypatch.setattr(StreamStore, "append", real)
        log.abort_transaction([part, other])  # "other" was never committed: it goes
        staged = {p.name for p in (tmp_path / "log" / "staged").iterdir()}
        assert staged == {obj.key.split("/")[1] for obj in part.objects}
        log.commit_transaction("t", [part])
        assert _contents(log) == EXPECTED
