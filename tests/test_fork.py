"""A log opened before ``fork()`` and used in the child (``disklesslog.forks``).

On every backend whose storage two processes share (local segments; the object backend
on ``file://`` with SQLite, with the object-store sequencer and with PostgreSQL; S3
through s3fs, whose async filesystem fsspec refuses to use after a fork): the parent
and the child append at once and nothing is lost or doubled; writers and consumers made
before the fork refuse in the child and the parent's buffered records are written once,
by the parent; a lock some thread of the parent held at the fork is not held by the
child; the child maintains under a holder name of its own.

Every child reports through its exit status and a file, and is killed if it does not
end in time: a hang fails the test at once rather than at the suite's timeout.
"""

from __future__ import annotations

import faulthandler
import fcntl
import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import (
    open_file_objects,
    open_file_objectstore,
    open_file_postgres,
    open_s3,
    open_segments,
)

import disklesslog
from disklesslog import AbstractLog, ForkedError, LogClosedError
from disklesslog.forks import ForkGate
from disklesslog.segments.layout import flocked

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()"),
    # fork() of a process with threads: what this module is about
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

Opener = Callable[[Path, dict[str, Any], pytest.FixtureRequest], AbstractLog]

SHARED: list[Any] = [
    pytest.param(open_segments, id="segments"),
    pytest.param(open_file_objects, id="file-objects"),
    pytest.param(open_file_objectstore, id="file-objectstore"),
    pytest.param(open_file_postgres, id="file-postgres", marks=pytest.mark.postgres),
    pytest.param(open_s3, id="s3", marks=(pytest.mark.s3, pytest.mark.slow)),
]
"""The backends whose storage another process sees (``memory://`` is per process)."""

CHILD_SECONDS = 120.0  # a loaded two-core machine runs these children slowly
RECORDS = 200
ROUNDS = 20


@pytest.fixture(params=SHARED)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., AbstractLog]:
    open_log: Opener = request.param

    def opened(**options: Any) -> AbstractLog:
        return open_log(tmp_path, dict(options), request)

    return opened


Fork = Callable[[Callable[[], None]], Callable[[], None]]


@pytest.fixture
def fork(tmp_path: Path) -> Iterator[Fork]:
    """``fork(child)`` runs ``child`` in a forked child and returns ``join``, which waits
    for it (killing it after :data:`CHILD_SECONDS`) and fails with the child's traceback
    if it failed. A child still alive when the test ends (it failed first) is killed."""
    children: list[int] = []

    def run(child: Callable[[], None]) -> Callable[[], None]:
        report = tmp_path / f"child-{time.monotonic_ns()}.txt"
        pid = os.fork()
        if pid == 0:  # the child: report through a file and the exit status only
            status = 1
            try:
                # A hang reports every thread's stack before the parent gives up.
                stacks = open(report.with_suffix(".stacks"), "w")  # noqa: SIM115
                faulthandler.dump_traceback_later(CHILD_SECONDS - 10, exit=True, file=stacks)
                child()
                status = 0
            except BaseException:
                report.write_text(traceback.format_exc())
            finally:
                os._exit(status)
        children.append(pid)

        def join() -> None:
            deadline = time.monotonic() + CHILD_SECONDS
            while True:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    children.remove(pid)
                    break
                if time.monotonic() > deadline:
                    pytest.fail(f"the child did not end within {CHILD_SECONDS} s (a hang)")
                time.sleep(0.01)
            if os.waitstatus_to_exitcode(code) != 0:
                text = report.read_text() if report.exists() else "(no report)"
                stacks = report.with_suffix(".stacks")
                if stacks.exists() and stacks.stat().st_size:
                    text += "\nstacks after a hang:\n" + stacks.read_text()
                pytest.fail(f"the child failed:\n{text}")

        return join

    yield run
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_parent_and_child_append_to_one_stream_at_once(
    opener: Callable[..., AbstractLog], tmp_path: Path, fork: Fork
) -> None:
    """Both processes append through the handles the parent opened: every record once,
    offsets contiguous, each process's records in its order (before the child got
    descriptors of its own, both appended under one shared lock and overwrote each
    other's records)."""
    log = opener()
    shared = log.stream("shared")
    shared.append(b"first")  # the parent's stream state exists before the fork

    def child() -> None:
        for i in range(RECORDS):
            shared.append(b"c%d" % i)
            log.stream("child-own").append(b"%d" % i)
        log.close()

    join = fork(child)
    for i in range(RECORDS):
        shared.append(b"p%d" % i)
    join()
    log.close()

    with opener() as again:
        records = list(again.stream("shared").read())
        assert [r.offset for r in records] == list(range(2 * RECORDS + 1))
        values = [r.value or b"" for r in records]
        assert values[0] == b"first"
        assert [v for v in values if v.startswith(b"p")] == [b"p%d" % i for i in range(RECORDS)]
        assert [v for v in values if v.startswith(b"c")] == [b"c%d" % i for i in range(RECORDS)]
        own = [r.value for r in again.stream("child-own").read()]
        assert own == [b"%d" % i for i in range(RECORDS)]


def test_a_writer_made_before_the_fork_is_the_parents(
    opener: Callable[..., AbstractLog], tmp_path: Path, fork: Fork
) -> None:
    """In the child the parent's writer refuses (ForkedError, a LogClosedError) and the
    futures of what it had buffered hold ForkedError; the parent writes those records,
    once; a writer the child makes works."""
    log = opener()
    writer = log.writer(linger_ms=3_600_000)
    buffered = writer.append("w", b"buffered before the fork")

    def child() -> None:
        error = buffered.exception(timeout=5)
        assert isinstance(error, ForkedError), error
        with pytest.raises(ForkedError, match="before it forked"):
            writer.append("w", b"from the child")
        assert isinstance(ForkedError("x"), LogClosedError)
        writer.close()  # closes nothing of the parent's
        with log.writer(linger_ms=0) as own:
            assert own.append("w", b"child's own writer").result(timeout=30) >= 0
        log.close()

    join = fork(child)
    join()
    writer.flush()
    assert buffered.result(timeout=30) >= 0
    writer.close()
    values = sorted(r.value or b"" for r in log.stream("w").read())
    assert values == [b"buffered before the fork", b"child's own writer"]
    log.close()


def test_a_consumer_made_before_the_fork_is_the_parents(
    opener: Callable[..., AbstractLog], tmp_path: Path, fork: Fork
) -> None:
    """In the child the parent's consumer refuses, and closing it commits nothing; the
    parent's consumer goes on from where it was."""
    log = opener()
    log.stream("c").append_batch([b"a", b"b", b"c"])
    consumer = log.consumer("g", ["c"], auto_commit_interval_ms=1)
    assert [r.value for _, r in consumer.poll(max_records=1)] == [b"a"]
    committed = log.committed_offsets("g")  # {} or {"c": 0}: as auto-commit found it

    def child() -> None:
        with pytest.raises(ForkedError, match="before it forked"):
            consumer.poll()
        with pytest.raises(ForkedError):
            consumer.commit()
        consumer.close()
        assert log.committed_offsets("g") == committed
        log.close()

    join = fork(child)
    join()
    assert [r.value for _, r in consumer.poll(max_records=5)] == [b"b", b"c"]
    consumer.close()
    assert log.committed_offsets("g") == {"c": 3}
    log.close()


def test_a_lock_held_at_the_fork_is_not_held_by_the_child(tmp_path: Path, fork: Fork) -> None:
    """A thread of the parent holds a lock file's flock when the process forks (as a
    maintenance pass renewing its lease does). The child waits only until the parent
    releases it, and the parent takes it again while the child still lives (the
    child's copy of the descriptor held it, for both, until the child ended)."""
    log = disklesslog.open(tmp_path / "log", fsync="never", maintenance="off")
    lease_lock = tmp_path / "log" / "leases" / ".lock"
    lease_lock.parent.mkdir(exist_ok=True)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with flocked(lease_lock):
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    child_done = tmp_path / "child-took-the-lease"

    def child() -> None:
        lease = log.acquire_lease("child", "child-holder", 60_000)
        assert lease is not None
        child_done.touch()
        time.sleep(3)  # alive while the parent takes the lock again
        log.close()

    join = fork(child)
    time.sleep(0.2)
    release.set()
    holder.join()
    started = time.monotonic()
    while not child_done.exists():
        assert time.monotonic() - started < 20, "the child never got the lock"
        time.sleep(0.01)
    fd = os.open(lease_lock, os.O_RDWR)
    try:  # the lock is free for the parent while the child lives
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() - started < 2.5, "the parent waits for the child"
                time.sleep(0.01)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    assert log.acquire_lease("parent", "parent-holder", 60_000) is not None
    join()
    log.close()


def test_a_child_syncs_its_own_appends(tmp_path: Path, fork: Fork) -> None:
    """fsync="interval": the parent's fsync thread is not in the child; the child's
    first use of a stream starts one of its own."""
    log = disklesslog.open(tmp_path / "log", fsync="interval", fsync_interval_ms=10)
    log.stream("s").append(b"parent")

    def child() -> None:
        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith("disklesslog-fsync")], names
        log.stream("s").append(b"child")
        names = [t.name for t in threading.enumerate()]
        assert [n for n in names if n.startswith("disklesslog-fsync")], names
        log.close()

    fork(child)()
    assert [r.value for r in log.stream("s").read()] == [b"parent", b"child"]
    log.close()


@pytest.mark.parametrize("open_log", SHARED[:4])
def test_forks_at_random_moments_of_a_busy_parent(
    open_log: Opener, tmp_path: Path, request: pytest.FixtureRequest, fork: Fork
) -> None:
    """The parent appends from a thread and maintains every 20 ms (passes, lease
    renewals, compaction and retention taking their locks) while it forks again and
    again at random moments; every child appends and closes within its time, and in
    the end every record is there once."""
    rng = random.Random(request.node.name)
    log = open_log(tmp_path, {"maintenance_interval_ms": 20}, request)
    log.create_stream("busy", retention_ms=3_600_000)
    stop = threading.Event()
    appended: list[int] = []

    def append() -> None:
        # A breath between appends: on a loaded machine a thread appending back to
        # back can hold SQLite's write lock nearly all the time (it has no queue), and
        # the child's writes then wait for their turn up to the sequencer's timeout;
        # this test is about the moment of the fork, not about that. Appends still
        # run hundreds a second.
        while not stop.wait(0.001):
            appended.append(log.stream("busy").append(b"parent"))

    appender = threading.Thread(target=append)
    appender.start()
    try:
        for round_ in range(ROUNDS):
            time.sleep(rng.uniform(0, 0.05))

            def child(round_: int = round_) -> None:
                stream = log.stream("busy")
                for i in range(5):
                    stream.append(b"child %d %d" % (round_, i))
                log.close()

            fork(child)()
    finally:
        stop.set()
        appender.join()
    values = [r.value for r in log.stream("busy").read()]
    assert values.count(b"parent") == len(appended)
    assert sorted(v for v in values if v != b"parent") == sorted(
        b"child %d %d" % (r, i) for r in range(ROUNDS) for i in range(5)
    )
    assert [r.offset for r in log.stream("busy").read()] == list(range(len(values)))
    log.close()


def test_a_fork_waits_for_the_sections_of_a_gate(fork: Fork) -> None:
    """``ForkGate``: a fork waits for a section running in another thread, and that
    section may enter the gate again (nested) while the fork waits, without a deadlock."""
    gate = ForkGate()
    entered, nested = threading.Event(), threading.Event()

    def section() -> None:
        with gate.held():
            entered.set()
            time.sleep(0.3)
            with gate.held():  # the fork is waiting by now
                nested.set()
            time.sleep(0.1)

    worker = threading.Thread(target=section)
    worker.start()
    assert entered.wait(10)
    started = time.monotonic()
    join = fork(lambda: None)  # returns in the parent once the section ended
    waited = time.monotonic() - started
    join()
    worker.join()
    assert nested.is_set()
    assert waited >= 0.3, waited
    with gate.held():  # free again after the fork
        pass
