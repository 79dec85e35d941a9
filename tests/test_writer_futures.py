"""The Writer's futures behave as concurrent.futures promises, although the records
of one batch share a condition (see disklesslog.writer._BatchFuture)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait

import pytest

import disklesslog
from disklesslog import writer as writer_module


def test_the_fast_futures_are_in_use() -> None:
    """If this fails, a Python release changed Future's internals: the writer has fallen
    back to plain futures (correct, slower); update _FUTURE_FIELDS."""
    assert writer_module._new_future is writer_module._BatchFuture


def test_futures_are_real_futures(disklesslog_log: disklesslog.Log) -> None:
    with disklesslog_log.writer(linger_ms=1) as writer:
        future = writer.append("s", b"x")
        assert isinstance(future, Future)
        assert future.result(timeout=5) == 0
        assert future.done() and not future.cancelled() and future.exception() is None


def test_waiters_on_one_batch_never_time_out_early(disklesslog_log: disklesslog.Log) -> None:
    """Many threads wait with a timeout on different records of one batch while it is
    resolved: each gets its own offset, none a spurious TimeoutError."""
    writer = disklesslog_log.writer(linger_ms=200)
    futures = [writer.append("s", b"%d" % i) for i in range(500)]
    # A slow callback on the first record holds the batch mid-resolution: waiters of
    # later records must not wake to an unresolved future meanwhile.
    futures[0].add_done_callback(lambda f: time.sleep(0.2))
    results: dict[int, object] = {}

    def wait_for(i: int) -> None:
        try:
            results[i] = futures[i].result(timeout=30)
        except Exception as exc:  # recorded and asserted below
            results[i] = exc

    threads = [threading.Thread(target=wait_for, args=(i,)) for i in range(0, 500, 25)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    assert results == {i: i for i in range(0, 500, 25)}


def test_cancel_is_refused_and_the_record_still_lands(disklesslog_log: disklesslog.Log) -> None:
    with disklesslog_log.writer(linger_ms=100) as writer:
        futures = [writer.append("s", b"%d" % i) for i in range(3)]
        assert futures[1].cancel() is False
    assert [f.result() for f in futures] == [0, 1, 2]
    assert disklesslog_log.stream("s").end_offset == 3


def test_callbacks_wait_and_as_completed(disklesslog_log: disklesslog.Log) -> None:
    seen: list[int] = []
    with disklesslog_log.writer(linger_ms=20) as writer:
        futures = [writer.append(f"s{i % 2}", b"v") for i in range(10)]
        futures[3].add_done_callback(lambda f: seen.append(f.result()))
        done, _ = wait(futures[:4], timeout=10, return_when=FIRST_COMPLETED)
        assert done
        completed = list(as_completed(futures, timeout=10))
        assert len(completed) == 10
    assert seen == [1]  # the fourth record is the second of stream s1
    futures[0].add_done_callback(lambda f: seen.append(-1))  # after resolution: runs now
    assert seen == [1, -1]


def test_failures_reach_every_future_of_the_batch(
    disklesslog_log: disklesslog.Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    from disklesslog.segments import stream_store as store_module

    def broken(self, batches):  # type: ignore[no-untyped-def]
        raise OSError("disk on fire")

    monkeypatch.setattr(store_module.StreamStore, "append", broken)
    writer = disklesslog_log.writer(linger_ms=10)
    futures = [writer.append("s", b"x") for _ in range(20)]
    for future in futures:
        with pytest.raises(OSError, match="disk on fire"):
            future.result(timeout=10)
    with pytest.raises(OSError):
        writer.close()


def test_slow_waiter_with_short_timeout_times_out_honestly(
    disklesslog_log: disklesslog.Log,
) -> None:
    with disklesslog_log.writer(linger_ms=500) as writer:
        future = writer.append("s", b"x")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            future.result(timeout=0.05)
        assert time.monotonic() - started >= 0.04
    assert future.result() == 0
