"""Local logs when one operating-system call fails at one chosen point.

``test_os_faults.py`` fails calls at random; each test here fails one ``os`` call at the
point a fix is about, and checks the rule that fix keeps: a call that raises leaves
nothing visible (an append is taken back, also when cutting it off fails too), a state
change is the old state or the new one, a descriptor is never closed twice, a failed
read is a failure and not an answer, and background threads live through failures.
"""

from __future__ import annotations

import errno
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import StorageError
from disklesslog.segments import transactions
from disklesslog.segments.index import OFFSET_ENTRY, SparseIndex
from disklesslog.segments.layout import STATE, STATE_COPY, StreamState, segment_name
from disklesslog.segments.segment import CHECK, iter_entries
from disklesslog.segments.stream_store import StreamStore


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """Failures are logged at WARNING/ERROR on purpose; keep test output readable."""
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def fail(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    when: Callable[..., bool] = lambda *args: True,
    *,
    times: int = 1,
    code: int = errno.EIO,
) -> list[tuple[Any, ...]]:
    """Make ``os.<name>`` fail ``times`` times, at the calls for which ``when(*args)``
    holds; returns the arguments of the calls it failed (a test checks it hit). ``close``
    closes the descriptor first, as ``close(2)`` does when it reports an error."""
    real = getattr(os, name)
    hits: list[tuple[Any, ...]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(hits) < times and when(*args):
            hits.append(args)
            if name == "close":
                real(*args, **kwargs)
            raise OSError(code, f"injected {os.strerror(code)} in os.{name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, call)
    return hits


def named(suffix: str) -> Callable[..., bool]:
    """A ``when`` for calls whose first argument is a path ending in ``suffix``."""
    return lambda path, *rest: str(path).endswith(suffix)


def fd_of(suffix: str) -> Callable[..., bool]:
    """A ``when`` for calls whose first argument is a descriptor of a file named ``…suffix``."""

    def when(fd: object, *rest: object) -> bool:
        try:
            return isinstance(fd, int) and os.readlink(f"/proc/self/fd/{fd}").endswith(suffix)
        except OSError:
            return False

    return when


def writing(path: str) -> Callable[..., bool]:
    """A ``when`` for ``os.open`` of ``path`` to write without creating (the cut and the
    mark of a failed append)."""
    return lambda p, flags, *rest: str(p) == path and flags == os.O_WRONLY


def store_of(log: disklesslog.Log, name: str = "s") -> StreamStore:
    store: StreamStore = log._stores[name]  # type: ignore[attr-defined]
    return store


def values(stream: disklesslog.Stream) -> list[bytes | None]:
    return [r.value for r in stream.read()]


def active_log(root: Path, name: str = "s") -> Path:
    return max((root / "streams" / name).glob("*.log"))


def reopened(root: Path, **options: Any) -> list[bytes | None]:
    with disklesslog.open(root, **options) as log:
        return values(log.stream("s"))


# ------------------------------------------------------------ failed appends


def test_an_append_whose_fdatasync_fails_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="always") as log:
        stream = log.stream("s")
        stream.append(b"a")
        size = active_log(root).stat().st_size
        hits = fail(monkeypatch, "fdatasync")
        with pytest.raises(StorageError) as caught:
            stream.append_batch([b"b", b"c"])
        assert hits and caught.value.errno == errno.EIO
        assert active_log(root).stat().st_size == size
        assert values(stream) == [b"a"]
        assert stream.append(b"d") == 1
    assert reopened(root) == [b"a", b"d"]


def test_an_append_whose_index_entry_fails_is_taken_back_with_its_index_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index entry is written after the batch; when writing it fails, the batch
    goes, and no index entry is left pointing at what comes after instead."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="never", index_interval_bytes=64) as log:
        stream = log.stream("s")
        stream.append(b"a" * 100)
        hits = fail(monkeypatch, "close", fd_of(".index"))
        with pytest.raises(StorageError):
            stream.append(b"b" * 100)
        assert hits
        assert values(stream) == [b"a" * 100]
        assert stream.append(b"c" * 20) == 1
        assert stream.append(b"d" * 100) == 2
    assert reopened(root) == [b"a" * 100, b"c" * 20, b"d" * 100]
    _check_index(active_log(root))


def _check_index(path: Path) -> None:
    """Every entry of the segment's ``.index`` names an entry of the ``.log`` exactly."""
    index = SparseIndex(path.with_suffix(".index"), OFFSET_ENTRY)
    assert index.load(max_key=2**32 - 1, max_value=2**32 - 1)
    base = int(path.stem)
    fd = os.open(path, os.O_RDONLY)
    try:
        entries = {
            (b - base, pos)
            for pos, b, _, _ in iter_entries(
                fd, str(path), 0, path.stat().st_size, base, max_batch_bytes=1 << 20, mode=CHECK
            )
        }
    finally:
        os.close(fd)
    assert set(zip(index.keys, index.values)) <= entries


def test_a_failed_append_that_cannot_be_cut_off_is_marked_corrupt_for_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fdatasync fails, then ftruncate: the entry's base offset is overwritten, so even
    another process (here a second log object) cuts it rather than read it."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="always") as log:
        stream = log.stream("s")
        stream.append(b"a")
        hits = [fail(monkeypatch, "fdatasync"), fail(monkeypatch, "ftruncate")]
        with pytest.raises(StorageError):
            stream.append_batch([b"b", b"c"])
        assert all(hits)
        with disklesslog.open(root, fsync="always") as other:
            assert values(other.stream("s")) == [b"a"]
            assert other.stream("s").append(b"x") == 1
        assert values(stream) == [b"a", b"x"]
    assert reopened(root) == [b"a", b"x"]


def test_a_failed_append_that_cannot_be_cut_nor_marked_is_cut_by_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut, then the mark fail: the next call on the stream, even a read, cuts the
    bytes before anything else; it fails (and so does every call after it) until the
    cut succeeds."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="always") as log:
        stream = log.stream("s")
        stream.append(b"a")
        size = active_log(root).stat().st_size
        path = str(active_log(root))
        hits = fail(monkeypatch, "fdatasync")
        cuts = fail(monkeypatch, "ftruncate", times=3)
        marks = fail(monkeypatch, "open", writing(path))
        with pytest.raises(StorageError):
            stream.append_batch([b"b", b"c"])
        assert hits and marks and len(cuts) == 1
        assert active_log(root).stat().st_size > size  # there, complete, and not marked
        for _ in range(2):
            with pytest.raises(StorageError):
                values(stream)
        assert len(cuts) == 3
        assert values(stream) == [b"a"]
        assert active_log(root).stat().st_size == size
        assert stream.append(b"d") == 1
    assert reopened(root) == [b"a", b"d"]


def test_a_pending_cut_is_made_when_the_log_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="always") as log:
        stream = log.stream("s")
        stream.append(b"a")
        path = str(active_log(root))
        hits = [
            fail(monkeypatch, "fdatasync"),
            fail(monkeypatch, "ftruncate"),
            fail(monkeypatch, "open", writing(path)),
        ]
        with pytest.raises(StorageError):
            stream.append(b"b")
        assert all(hits)
    assert reopened(root) == [b"a"]


def test_a_pending_cut_spares_what_another_process_appended_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torn failed append that could be neither cut nor marked: another process's
    append truncates the torn entry itself and appends in its place. This process's
    cut must then leave that record alone (it is not the failed append's header)."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="never") as log, disklesslog.open(root) as other:
        stream = log.stream("s")
        stream.append(b"a")
        assert values(other.stream("s")) == [b"a"]
        path = str(active_log(root))
        real_writev = os.writev

        def torn(fd: int, parts: list[bytes]) -> int:
            return int(real_writev(fd, [b"".join(parts)[:30]]))  # a short write

        monkeypatch.setattr(os, "writev", torn)
        hits = [
            fail(monkeypatch, "ftruncate"),
            fail(monkeypatch, "open", writing(path)),
        ]
        with pytest.raises(StorageError):
            stream.append(b"b" * 100)
        assert all(hits)
        monkeypatch.setattr(os, "writev", real_writev)
        assert other.stream("s").append(b"x") == 1
        assert values(stream) == [b"a", b"x"]
    assert reopened(root) == [b"a", b"x"]


@pytest.mark.parametrize("cut_fails", [False, True])
def test_a_writer_flush_beyond_segment_bytes_is_all_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut_fails: bool
) -> None:
    """A flush of several batches larger than ``segment_bytes`` fills several segments,
    one write each. The second write fails: the first segment's share was left visible,
    though every future of the flush failed. Now the rolls are taken back and the first
    segment cut (``cut_fails``: by the next call, when cutting it fails at once)."""
    root = tmp_path / "log"
    options = {"segment_bytes": 1024, "max_batch_bytes": 1024, "max_record_bytes": 900}
    with disklesslog.open(root, fsync="never", **options) as log:
        stream = log.stream("s")
        stream.append(b"first")
        first = str(active_log(root))
        writes = 0
        real_writev = os.writev

        def second_fails(fd: int, parts: list[bytes]) -> int:
            nonlocal writes
            writes += 1
            if writes == 2:
                raise OSError(errno.ENOSPC, "injected")
            return int(real_writev(fd, parts))

        monkeypatch.setattr(os, "writev", second_fails)
        if cut_fails:  # the open to cut, then the one to mark the entry corrupt
            opens = fail(monkeypatch, "open", writing(first), times=2)
        writer = log.writer(linger_ms=60_000)
        futures = [writer.append("s", b"%03d" % i + b"x" * 300) for i in range(8)]
        with pytest.raises(StorageError):
            writer.close()
        assert writes == 2
        assert all(f.exception() is not None for f in futures)
        if cut_fails:
            assert len(opens) == 2
        assert values(stream) == [b"first"]
        assert stream.append(b"next") == 1
    assert reopened(root) == [b"first", b"next"]
    assert [p.name for p in (root / "streams" / "s").glob("*.log")] == [Path(first).name]


@pytest.mark.parametrize("close_fails", [False, True])
def test_a_flush_beyond_segment_bytes_is_taken_back_when_restoring_the_state_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, close_fails: bool
) -> None:
    """As above, and writing the state record back fails too: the rolls stayed, so the
    first segment's share and the segments after it were read as records. Now the next
    call on the stream takes the flush back first; and if that fails as well, while the
    log closes (``close_fails``), a log opened again in this process does."""
    root = tmp_path / "log"
    options = {"segment_bytes": 1024, "max_batch_bytes": 1024, "max_record_bytes": 900}
    with disklesslog.open(root, fsync="never", **options) as log:
        stream = log.stream("s")
        stream.append(b"first")
        first = Path(active_log(root)).name
        state_fd = store_of(log)._lock_fd
        failed: list[int] = []
        real_writev = os.writev

        def second_fails(fd: int, parts: list[bytes]) -> int:
            if len(failed) < 2:
                failed.append(fd)
            if len(failed) == 2:
                raise OSError(errno.ENOSPC, "injected")
            return int(real_writev(fd, parts))

        monkeypatch.setattr(os, "writev", second_fails)
        restores = fail(
            monkeypatch, "pwrite", lambda fd, *rest: len(failed) == 2 and fd == state_fd
        )
        writer = log.writer(linger_ms=60_000)
        for i in range(8):
            writer.append("s", b"%03d" % i + b"x" * 300)
        with pytest.raises(StorageError):
            writer.close()
        monkeypatch.setattr(os, "writev", real_writev)
        assert restores
        if close_fails:  # the state record cannot even be read when the log closes
            reads = fail(monkeypatch, "pread", lambda fd, *rest: fd == state_fd)
            with pytest.raises(StorageError):
                log.close()
            assert reads
        else:
            assert values(stream) == [b"first"]
            assert stream.append(b"next") == 1
    expected = [b"first"] if close_fails else [b"first", b"next"]
    assert reopened(root, **options) == expected
    assert [p.name for p in (root / "streams" / "s").glob("*.log")] == [first]


def test_a_pending_cut_is_made_by_the_log_opened_again_after_closing_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut and the mark of a failed append fail, then so does closing the log:
    the cut is owed by the process, not by the closed log, so opening the log again
    makes it before reading anything (the bytes are a complete, valid entry)."""
    root = tmp_path / "log"
    log = disklesslog.open(root, fsync="never")
    stream = log.stream("s")
    stream.append(b"a")
    path = str(active_log(root))
    state_fd = store_of(log)._lock_fd
    real_writev = os.writev
    written: list[int] = []

    def then_fails(fd: int, parts: list[bytes]) -> int:
        written.append(int(real_writev(fd, parts)))
        raise OSError(errno.EIO, "injected")  # after writing it all

    monkeypatch.setattr(os, "writev", then_fails)
    hits = [
        fail(monkeypatch, "ftruncate"),
        fail(monkeypatch, "open", writing(path)),
    ]
    with pytest.raises(StorageError):
        stream.append(b"b")
    monkeypatch.setattr(os, "writev", real_writev)
    assert written and all(hits)
    reads = fail(monkeypatch, "pread", lambda fd, *rest: fd == state_fd)
    with pytest.raises(StorageError):
        log.close()
    assert reads
    with disklesslog.open(root, fsync="never") as again:
        assert values(again.stream("s")) == [b"a"]
        assert again.stream("s").append(b"c") == 1
    assert reopened(root) == [b"a", b"c"]


# -------------------------------------------------------------- rolls and trims


def _fill(stream: disklesslog.Stream, count: int, acked: list[bytes]) -> None:
    """Append ``count`` records of 100 bytes (a few to a 1 KiB segment) to ``acked``
    one by one, stopping at the first that fails."""
    for i in range(len(acked), len(acked) + count):
        value = b"%04d" % i + b"x" * 96
        stream.append(value)
        acked.append(value)


def test_a_roll_whose_state_copy_fails_leaves_appends_where_reads_find_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state record already names the new segment when writing its copy fails:
    appends must go to that segment, not on into the old one (which closed at its end
    offset: records there were lost, or failed reads as an empty segment)."""
    root = tmp_path / "log"
    options: dict[str, Any] = {"fsync": "always", "segment_bytes": 1024}
    with disklesslog.open(root, **options) as log:
        stream = log.stream("s")
        acked: list[bytes] = []
        _fill(stream, 3, acked)
        hits = fail(monkeypatch, "open", named(STATE_COPY))
        with pytest.raises(StorageError):
            stream.append(b"x" * 600)  # does not fit: rolls
        assert hits
        for value in (b"small", b"ones", b"fit"):  # in the old segment: they went there
            stream.append(value)
            acked.append(value)
        _fill(stream, 20, acked)
        assert values(stream) == acked
    assert reopened(root, **options) == acked


def test_a_close_that_fails_in_a_roll_closes_no_descriptor_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close(2) of the old active segment fails (it is closed anyway): the store must
    not keep that number, where the next ``open`` may put another file, and write the
    next records into it."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="never", segment_bytes=1024) as log:
        stream = log.stream("s")
        acked: list[bytes] = []
        _fill(stream, 3, acked)
        old = store_of(log)._active_fd
        hits = fail(monkeypatch, "close", lambda fd: fd == old)
        with pytest.raises(StorageError):
            _fill(stream, 20, acked)  # until the roll's close fails
        assert hits
        assert store_of(log)._active_fd != old
        _fill(stream, 20, acked)
        assert values(stream) == acked
    assert reopened(root) == acked


def test_a_trim_whose_state_copy_fails_rewrites_the_copy_at_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trim is in the state record but not in its copy: the next call repairs the
    copy, so losing the state record later cannot bring the trimmed records back."""
    root = tmp_path / "log"
    options: dict[str, Any] = {"fsync": "always", "segment_bytes": 1024}
    with disklesslog.open(root, **options) as log:
        stream = log.stream("s")
        acked: list[bytes] = []
        _fill(stream, 30, acked)
        hits = fail(monkeypatch, "open", named(STATE_COPY))
        with pytest.raises(StorageError):
            stream.trim(20)
        assert hits
        assert stream.start_offset == 20  # the record decided: the trim happened
    (root / "streams" / "s" / STATE).write_bytes(b"\0" * 48)  # bit rot, later
    with disklesslog.open(root, **options) as log:
        assert values(log.stream("s")) == acked[20:]


def test_a_trim_that_fails_deleting_a_segment_leaves_no_orphan_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment's ``.log`` goes last, so a failure leaves a segment recovery sees (and
    removes whole), never index files beside no ``.log``."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="never", segment_bytes=1024) as log:
        stream = log.stream("s")
        acked: list[bytes] = []
        _fill(stream, 30, acked)
        hits = fail(monkeypatch, "unlink", named(segment_name(0, ".timeindex")))
        with pytest.raises(StorageError):
            stream.trim(20)
        assert hits
        assert values(stream) == acked[20:]
    assert reopened(root) == acked[20:]
    files = [p.name for p in (root / "streams" / "s").iterdir() if p.name[0].isdigit()]
    assert {name[:20] for name in files} == {name[:20] for name in files if name.endswith(".log")}
    assert segment_name(0, ".log") not in files


def test_a_short_write_of_the_state_record_fails_the_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pwrite`` of the 48-byte record writes 20 bytes: that is an error (the append
    is taken back), not a torn record left behind as if written."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="always") as log:
        stream = log.stream("s")
        stream.append(b"a")
        real_pwrite = os.pwrite
        state_fd = store_of(log)._lock_fd
        torn: list[int] = []

        def short(fd: int, data: bytes, position: int) -> int:
            if fd == state_fd and not torn:
                torn.append(fd)
                return int(real_pwrite(fd, data[:20], position))
            return int(real_pwrite(fd, data, position))

        monkeypatch.setattr(os, "pwrite", short)
        with pytest.raises(StorageError):
            stream.append(b"b")
        assert torn
        assert values(stream) == [b"a"]
        assert stream.append(b"c") == 1
    assert reopened(root) == [b"a", b"c"]
    state = StreamState.decode((root / "streams" / "s" / STATE).read_bytes())
    assert state is not None and state.recovery_offset == 2


# ------------------------------------------------------------------ threads


def _synced_to(root: Path) -> int:
    state = StreamState.decode((root / "streams" / "s" / STATE).read_bytes())
    assert state is not None
    return state.recovery_offset


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the fsync-interval thread never synced"
        time.sleep(0.01)


def test_the_fsync_thread_lives_through_any_failure_and_logs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync that raises a DisklessLogError (recovery found damage, say) killed the
    thread, and with it syncing for every stream of the log, silently."""
    logging.disable(logging.NOTSET)
    real_sync = StreamStore.sync
    failures = [disklesslog.CorruptDataError("injected damage"), OSError(errno.EIO, "injected")]

    def sync(store: StreamStore) -> None:
        if failures:
            raise failures.pop(0)
        real_sync(store)

    monkeypatch.setattr(StreamStore, "sync", sync)
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="interval", fsync_interval_ms=10) as log:
        log.stream("s").append(b"a")
        _wait_for(lambda: _synced_to(root) == 1)
        assert not failures
    errors = [r for r in caplog.records if "syncing its appends to disk failed" in r.message]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    assert any("syncing to disk works again" in r.message for r in caplog.records)


def test_a_sync_that_cannot_duplicate_the_descriptor_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dup`` failing (EMFILE) lost the note that the stream had unsynced appends."""
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="interval", fsync_interval_ms=10) as log:
        hits = fail(monkeypatch, "dup", code=errno.EMFILE)
        log.stream("s").append(b"a")
        _wait_for(lambda: _synced_to(root) == 1)
        assert hits


def test_a_log_whose_open_fails_late_leaves_no_thread_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "log"
    disklesslog.open(root).close()

    def recover(log: object) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(transactions, "recover", recover)
    with pytest.raises(StorageError):
        disklesslog.open(root, fsync="interval")
    threads = [t for t in threading.enumerate() if t.name == f"disklesslog-fsync {root}"]
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)


# ------------------------------------------- failures are failures, not answers


def test_a_failed_stat_fails_listing_streams_rather_than_leaving_one_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(tmp_path / "log") as log:
        log.stream("s").append(b"a")
        hits = fail(monkeypatch, "stat", named("stream.json"))
        with pytest.raises(StorageError):
            log.streams()
        assert hits
        assert log.streams() == ["s"]


def test_a_writer_append_that_cannot_read_the_stream_config_raises_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(tmp_path / "log") as log:
        log.stream("s").append(b"a")
        real = pathlib.Path.read_bytes

        def read_bytes(path: pathlib.Path) -> bytes:
            if path.name == "stream.json":
                raise OSError(errno.EIO, "injected")
            return real(path)

        monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
        with log.writer() as writer, pytest.raises(StorageError):
            writer.append("s", b"b")


def test_a_group_commit_is_not_reported_failed_after_it_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the group's lock file fails, or removing a draft that a successful
    rename already consumed would: the offsets are committed, so the call succeeds."""
    with disklesslog.open(tmp_path / "log") as log:
        log.stream("s").append(b"a")
        closes = fail(monkeypatch, "close", fd_of("g.lock"))
        unlinks = fail(monkeypatch, "unlink")
        log.commit_offsets("g", {"s": 1})
        assert closes and not unlinks
        assert log.committed_offsets("g") == {"s": 1}


def test_a_read_whose_last_close_fails_returns_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment was read to its end through a read-only descriptor: nothing can be
    lost by a failing close(2) of it."""
    with disklesslog.open(tmp_path / "log") as log:
        stream = log.stream("s")
        stream.append(b"a")
        active = store_of(log)._active_fd
        hits = fail(monkeypatch, "close", lambda fd: fd != active and fd_of(".log")(fd))
        assert values(stream) == [b"a"]
        assert hits
