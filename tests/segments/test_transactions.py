"""Two-phase commits on local logs: readers see a commit in every stream or in none;
one interrupted mid-way holds its streams back until it is rolled forward (by the next
commit, the next open of the log, or gc), exactly once, whichever step it stopped at.
The real-crash version is test_transaction_crash.py."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog.segments import transactions
from disklesslog.segments.stream_store import StreamStore
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


def _crash_in_append_of(stream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = StreamStore.append

    def crash(self: StreamStore, batches: Any, **kwargs: Any) -> list[int]:
        if self.name == stream:
            raise Crash
        return real(self, batches, **kwargs)

    monkeypatch.setattr(StreamStore, "append", crash)


def _interrupt_commit(
    log: disklesslog.Log, txn: str, part: StagedPart, stream: str, mp: pytest.MonkeyPatch
) -> None:
    """Commit ``part`` as ``txn``, "crashing" as the commit reaches ``stream``."""
    with mp.context() as m:
        _crash_in_append_of(stream, m)
        with pytest.raises(Crash):
            log.commit_transaction(txn, [part])


def test_an_interrupted_commit_shows_nothing_and_is_finished_by_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        _interrupt_commit(log, "t", part, "b", monkeypatch)
        # a's records are in its files, but held back: no stream shows the commit.
        assert _contents(log) == {"a": [], "b": []}
        a = log.stream("a")
        assert a.end_offset == 0 and list(a.read_batches(0)) == []
        assert a.offset_for_time(0) is None
        info = a.info()
        assert info.end_offset == 0
        assert info.details["pending_transactions"] == {"t": 0}
        assert info.details["unstable_end_offset"] == 2
        # Other writers' records behind a held offset wait too (Kafka's LSO).
        assert a.append(b"later") == 2 and a.end_offset == 0
    with disklesslog.open(str(tmp_path / "log")) as log:  # opening rolls it forward
        assert _contents(log) == {**EXPECTED, "a": [b"a1", b"a2", b"later"]}
        assert "pending_transactions" not in log.stream("a").info().details
        again = log.commit_transaction("t", [part])
        assert again.duplicate and again.ranges == {"a": (0, 2), "b": (0, 1), "c": (0, 3)}
        assert not list((tmp_path / "log" / "staged").iterdir())  # cleaned up


def test_a_retry_of_the_same_id_finishes_it_and_says_it_stored_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        _interrupt_commit(log, "t", part, "c", monkeypatch)
        assert _contents(log) == {"a": [], "b": [], "c": []}
        retry = _part(log)  # a replayed Spark micro-batch stages its records anew
        result = log.commit_transaction("t", [retry])
        assert not result.duplicate
        assert _contents(log) == EXPECTED
        assert log.commit_transaction("t", [retry]).duplicate
        assert not list((tmp_path / "log" / "staged").iterdir())  # both attempts' files


def test_any_commit_finishes_an_interrupted_one_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        _interrupt_commit(log, "t1", part, "b", monkeypatch)
        stager = log.stager()
        stager.append_batch("b", [b"b2"])
        assert log.commit_transaction("t2", [stager.finish()]).ranges == {"b": (1, 2)}
        assert _contents(log) == {**EXPECTED, "b": [b"b1", b"b2"]}


def test_a_crash_after_an_append_before_its_note_is_not_appended_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        log.stream("b").append(b"earlier")
        part = _part(log)
        real = transactions.write_durably

        def crash_after_b(root: Path, path: Path, data: bytes, *, sync: bool) -> None:
            if path.parent.name == "pending" and b'"b":{"range"' in data:
                raise Crash  # b's records are in; the note saying so is not
            real(root, path, data, sync=sync)

        with monkeypatch.context() as m:
            m.setattr(transactions, "write_durably", crash_after_b)
            with pytest.raises(Crash):
                log.commit_transaction("t", [part])
        assert _contents(log) == {"a": [], "b": [b"earlier"]}
        result = log.commit_transaction("t", [part])
        assert result.ranges == {"a": (0, 2), "b": (1, 2), "c": (0, 3)}
        assert _contents(log) == {**EXPECTED, "b": [b"earlier", b"b1"]}


def test_a_noted_append_that_did_not_happen_is_done_by_the_roll_forward(
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

        with monkeypatch.context() as m:
            m.setattr(StreamStore, "append", note_then_crash)
            with pytest.raises(Crash):
                log.commit_transaction("t", [part])
        log.stream("c").append(b"other writer")  # lands where c's batches were to go
        assert log.stream("c").end_offset == 0  # held back behind the noted offset
    with disklesslog.open(str(tmp_path / "log")) as log:
        assert _contents(log) == {**EXPECTED, "c": [b"other writer", b"c1", b"c2", b"c3"]}


def test_a_crash_after_the_record_before_the_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        real = Path.unlink

        def crash_at_commit_point(self: Path, *args: Any, **kwargs: Any) -> None:
            if self.parent.name == "pending" and self.suffix == ".json":
                raise Crash
            real(self, *args, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(Path, "unlink", crash_at_commit_point)
            with pytest.raises(Crash):
                log.commit_transaction("t", [part])
        assert _contents(log) == {"a": [], "b": [], "c": []}  # before the commit point
    with disklesslog.open(str(tmp_path / "log")) as log:
        assert _contents(log) == EXPECTED  # not appended a second time
        assert not (tmp_path / "log" / "transactions" / "pending").exists()
        assert not list((tmp_path / "log" / "staged").iterdir())


def test_a_commit_that_cannot_be_finished_holds_back_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        _interrupt_commit(log, "t", part, "b", monkeypatch)
    for obj in part.objects:  # deleted by hand: the roll-forward has nothing to append
        (tmp_path / "log" / obj.key).unlink()
    with caplog.at_level(logging.WARNING), disklesslog.open(str(tmp_path / "log")) as log:
        assert "cannot be finished" in caplog.text and "docs/operations.md" in caplog.text
        assert _contents(log) == {"a": [], "b": []}
        # Other transactions still commit; the held streams stay held.
        stager = log.stager()
        stager.append_batch("d", [b"d1"])
        log.commit_transaction("t2", [stager.finish()])
        assert _contents(log)["d"] == [b"d1"] and _contents(log)["a"] == []
        with pytest.raises(disklesslog.TransactionError, match="is gone"):
            log.commit_transaction("t", [part])  # its own retry says why
        # The operator's way out: delete the notes file; what was appended shows.
        for notes in (tmp_path / "log" / "transactions" / "pending").glob("*.json"):
            notes.unlink()
        assert _contents(log)["a"] == [b"a1", b"a2"]


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


def test_an_abort_and_gc_keep_the_files_of_an_interrupted_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark aborts a job whose commit failed half-way: the roll-forward still needs
    the files, however old they get before it runs."""
    with disklesslog.open(str(tmp_path / "log")) as log:
        part = _part(log)
        other = _part(log)
        _interrupt_commit(log, "t", part, "c", monkeypatch)
        with monkeypatch.context() as m:
            log.abort_transaction([part, other])  # "other" was never committed: it goes
            staged = {p.name for p in (tmp_path / "log" / "staged").iterdir()}
            assert staged == {obj.key.split("/")[1] for obj in part.objects}
            m.setattr(transactions, "STAGED_UNKNOWN_MIN_AGE", 0.0)
            m.setattr(transactions, "recover", lambda log: None)  # gc's roll-forward off
            log.collect_garbage(grace_seconds=0)
            assert {p.name for p in (tmp_path / "log" / "staged").iterdir()} == staged
        log.collect_garbage(grace_seconds=0)  # gc rolls interrupted commits forward
        assert _contents(log) == EXPECTED


def test_readers_never_see_a_commit_in_one_stream_and_not_in_a_later_one(
    tmp_path: Path,
) -> None:
    """Commits append streams in name order; a reader reading them in that order must
    see counts that never decrease (a half-visible commit would show a dip)."""
    streams = [f"s{i}" for i in range(6)]
    with disklesslog.open(str(tmp_path / "log"), fsync="never") as log:
        for name in streams:
            log.create_stream(name)
        stop = threading.Event()
        errors: list[BaseException] = []

        def commit() -> None:
            try:
                for k in range(80):
                    stager = log.stager()
                    for name in streams:
                        stager.append_batch(name, [b"%d" % k])
                    log.commit_transaction(f"t{k}", [stager.finish()])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                stop.set()

        committer = threading.Thread(target=commit)
        committer.start()
        passes = 0
        with disklesslog.open(str(tmp_path / "log"), fsync="never") as reader:
            while not stop.is_set():
                seen = [reader.stream(name).end_offset for name in streams]
                assert seen == sorted(seen), f"a commit is half visible: {seen}"
                passes += 1
                time.sleep(0.0002)  # let the committer have the GIL too
        committer.join()
        assert not errors, errors
        assert passes > 10
        assert [log.stream(name).end_offset for name in streams] == [80] * 6
        assert not (tmp_path / "log" / "transactions" / "pending").exists()
