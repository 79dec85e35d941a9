"""Producer expiry seen from an object log: ``producer_expiration_ms`` is checked before
anything is created, housekeeping (``log.housekeeping()``, ``log.maintain()``) forgets
producers idle that long and says so, and a writer idle past the window keeps appending
(its producer initialised again, every stream numbered from 0) without an error, a
duplicate or a gap."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

import disklesslog
from disklesslog import ConfigError, ProducerFenced, UnknownProducerId
from disklesslog.objects.log import MAX_PRODUCER_EXPIRATION_MS
from disklesslog.objects.writer import RESTARTS
from disklesslog.sequencers.base import BatchToCommit, CommitResult
from disklesslog.sequencers.memory import MemorySequencer
from disklesslog.testing.contracts import FakeClock

EXPIRED = "expired 2 idle producer stream states and 1 idle producers"


def _open(sequencer: MemorySequencer) -> disklesslog.Log:
    return disklesslog.open(
        f"memory://expiry-{uuid.uuid4().hex}/log",
        sequencer=sequencer,
        maintenance="off",
        producer_expiration_ms=1_000,
    )


def _values(log: disklesslog.Log, stream: str) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in log.stream(stream).read()]


@pytest.mark.parametrize("name", [None, "app"])
@pytest.mark.parametrize("run", ["housekeeping", "maintain"])
def test_a_writer_idle_past_the_window_keeps_appending(name: str | None, run: str) -> None:
    clock = FakeClock()
    with _open(MemorySequencer(clock=clock)) as log, log.writer(producer=name) as writer:
        first = [writer.append(s, b"%d" % i) for i in range(3) for s in ("a", "b")]
        writer.flush()
        before = writer.producer
        clock.advance(2)
        report = log.housekeeping() if run == "housekeeping" else log.maintain()
        assert any(line.endswith(EXPIRED) for line in report.actions)  # maintain: prefixed
        later = [writer.append(s, b"%d" % i) for i in range(3, 6) for s in ("a", "b")]
        writer.flush()
        assert writer.producer[0] != before[0]  # initialised again: a new id, epoch 0
        assert writer.producer[1] == 0
        assert [f.result() for f in [*first, *later]] == [i for i in range(6) for _ in "ab"]
        for stream in ("a", "b"):
            assert _values(log, stream) == [(i, b"%d" % i) for i in range(6)]
        assert log.housekeeping().actions == []  # the new producer wrote just now


def test_a_dry_run_says_what_would_expire_and_changes_nothing() -> None:
    clock = FakeClock()
    with _open(MemorySequencer(clock=clock)) as log, log.writer() as writer:
        writer.append("a", b"x")
        writer.append("b", b"y")
        writer.flush()
        clock.advance(2)
        assert EXPIRED in log.housekeeping(dry_run=True).actions
        assert EXPIRED in log.housekeeping(dry_run=True).actions
        assert EXPIRED in log.housekeeping().actions


def test_log_append_keeps_working_across_expiry() -> None:
    clock = FakeClock()
    with _open(MemorySequencer(clock=clock)) as log:
        stream = log.stream("s")
        assert [stream.append(b"%d" % i) for i in range(3)] == [0, 1, 2]
        clock.advance(2)
        assert log.housekeeping().actions == [
            "expired 1 idle producer stream states and 1 idle producers"
        ]
        assert [stream.append(b"%d" % i) for i in range(3, 5)] == [3, 4]
        assert _values(log, "s") == [(i, b"%d" % i) for i in range(5)]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1d", True, None, MAX_PRODUCER_EXPIRATION_MS + 1])
def test_bad_expiration_values_are_refused_before_anything_is_created(
    tmp_path: Path, bad: object
) -> None:
    where = tmp_path / "log"
    with pytest.raises(ConfigError, match="producer_expiration_ms"):
        disklesslog.open(f"file://{where}", backend="objects", producer_expiration_ms=bad)
    assert not where.exists()


def test_small_and_large_windows_are_taken(tmp_path: Path) -> None:
    for value in (1, 1_000, MAX_PRODUCER_EXPIRATION_MS):
        with disklesslog.open(
            f"memory://expiry-{uuid.uuid4().hex}/log", producer_expiration_ms=value
        ) as log:
            assert log.producer_expiration_ms == value  # type: ignore[attr-defined]


def test_a_local_log_refuses_the_option_as_an_object_log_one(tmp_path: Path) -> None:
    """Local logs have no producers: the option is refused as any other option of
    object-storage logs is, naming the kind of log that takes it, and nothing is made."""
    where = tmp_path / "local"
    with pytest.raises(ConfigError, match="producer_expiration_ms") as caught:
        disklesslog.open(where, producer_expiration_ms=1_000)
    assert "objects" in str(caught.value)
    assert not where.exists()


class _Forgetful(MemorySequencer):
    """Forgets every producer before each commit (as if each waited out the window)."""

    commits = 0

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        self.commits += 1
        self._producers.clear()
        return super().commit(object_key, batches)


def test_a_producer_forgotten_over_and_over_fails_the_flush_at_last() -> None:
    """Initialising again is bounded per flush: a flush refused every time fails with
    the sequencer's UnknownProducerId (a ProducerFenced: the writer stops) instead of
    looping."""
    sequencer = _Forgetful()
    with _open(sequencer) as log:
        writer = log.writer(linger_ms=0)
        first = writer.producer
        future = writer.append("s", b"x")
        with pytest.raises(UnknownProducerId):
            future.result(timeout=10)
        assert sequencer.commits == 1 + RESTARTS
        assert writer.producer[0] == first[0] + RESTARTS  # initialised again each time
        with pytest.raises(ProducerFenced):
            writer.append("s", b"y").result(timeout=10)
        assert log.stream("s").end_offset == 0
        with contextlib.suppress(ProducerFenced):
            writer.close()
