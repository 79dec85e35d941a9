"""The SQLite sequencer's files: every connection closed, nothing left behind by a clean
close, the lock that tells an opener it is alone, and a lost database never taken for
a new one.
"""

from __future__ import annotations

import fcntl
import gc
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import disklesslog
from disklesslog.errors import CorruptDataError, DataLossError, InvalidURL, SequencerError
from disklesslog.sequencers import BatchToCommit, sqlite_files
from disklesslog.sequencers import sqlite as sqlite_module
from disklesslog.sequencers.sqlite import SqliteSequencer

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")


def leftovers(db: Path) -> list[str]:
    """SQLite's files beside the database."""
    return sorted(p.name for p in db.parent.iterdir() if p.name.endswith(("-wal", "-shm")))


def open_files(db: Path, suffix: str) -> int:
    """How many files this process has open on the database's ``suffix`` file."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == f"{db}{suffix}":
            count += 1
    return count


def alone(db: Path) -> bool:
    """Whether an opener now would find no sequencer with the database open."""
    fd = os.open(f"{db}-lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def commit_in_threads(seq: SqliteSequencer, threads: int) -> None:
    def work(n: int) -> None:
        for i in range(20):
            seq.commit(f"objects/{n}-{i}", [BatchToCommit("s", 0, 10, 1, 1, i)])

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


# ------------------------------------------------------------ a clean close


def test_a_clean_close_leaves_the_database_alone(tmp_path: Path) -> None:
    """Connections of threads that finished are closed with them, and close() closes
    the rest: the last close copies the write-ahead log into the database and deletes
    it. (A connection left open kept the whole database in a -wal that was never
    checkpointed.)"""
    db = tmp_path / "meta.db"
    seq = SqliteSequencer(db)
    seq.create_stream("s", {})
    commit_in_threads(seq, 4)
    assert open_files(db, "-wal") == 1  # the main thread's connection's
    seq.close()
    assert leftovers(db) == [] and open_files(db, "") == 0 and alone(db)
    alone_copy = tmp_path / "copy" / "meta.db"
    alone_copy.parent.mkdir()
    shutil.copy(db, alone_copy)  # the database file by itself holds every commit
    with SqliteSequencer(alone_copy) as seq:
        assert seq.stream_info("s").end_offset == 80


def test_the_last_of_two_sequencers_to_close_checkpoints(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    first, second = SqliteSequencer(db), SqliteSequencer(db)
    first.create_stream("s", {})
    commit_in_threads(second, 2)
    first.close()
    assert leftovers(db) == ["meta.db-shm", "meta.db-wal"] and not alone(db)
    second.close()
    assert leftovers(db) == [] and alone(db)


def test_an_object_log_closes_its_database(tmp_path: Path) -> None:
    """The report that found this: appends (from the writer's thread), close, damage the
    -shm that was left behind, open again: the process died of SIGBUS, SQLite still
    mapping the old -shm for a connection that was never closed."""
    script = textwrap.dedent(
        f"""
        import os, disklesslog
        url = "file://{tmp_path}/log"
        with disklesslog.open(url, backend="objects") as log:
            log.create_stream("a").append(b"x")
        shm = "{tmp_path}/log/disklesslog-meta.db-shm"
        assert not os.path.exists(shm), "a -shm was left behind"
        with open(shm, "wb") as f:  # as a crash leaves it, cut short
            f.write(bytes(100))
        with disklesslog.open(url, backend="objects") as log:
            log.stream("a").append(b"y")
            assert [r.value for r in log.stream("a").read()] == [b"x", b"y"]
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_cursor_kept_alive_keeps_the_database_held(tmp_path: Path) -> None:
    """SQLite keeps a connection whose statement is still referenced open after close()
    (an exception's traceback holding a cursor, say): the lock stays until it is gone."""
    db = tmp_path / "meta.db"
    seq = SqliteSequencer(db)
    seq.create_stream("s", {})
    seq.commit("objects/1", [BatchToCommit("s", 0, 10, 1, 1, 1)])
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE batches SET size = 11")  # its checksum fails: read mid-cursor
    raw.close()
    with pytest.raises(CorruptDataError) as caught:
        seq.find_batches("s", 0, 100)
    seq.close()
    assert not alone(db)
    del caught
    gc.collect()
    assert alone(db) and leftovers(db) == []


# ----------------------------------------------------------- who is alone


def test_only_an_opener_alone_checks_the_write_ahead_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    real = sqlite_files.check_wal
    monkeypatch.setattr(sqlite_files, "check_wal", lambda path, **kw: checked.append(path))
    db = tmp_path / "meta.db"
    with SqliteSequencer(db) as first:
        first.create_stream("s", {})
        with SqliteSequencer(db):  # another has it open: nothing to check
            pass
        assert checked == []
        image = tmp_path / "image"
        image.mkdir()
        for name in ("meta.db", "meta.db-wal", "meta.db-shm"):
            shutil.copy(tmp_path / name, image / name)  # what a crash leaves
    with SqliteSequencer(db):  # after a clean close: no log left to check
        pass
    assert checked == []
    monkeypatch.setattr(sqlite_files, "check_wal", real)
    with SqliteSequencer(image / "meta.db") as seq:
        assert seq.list_streams() == ["s"]


def test_an_opener_waits_for_one_checking_the_log(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    SqliteSequencer(db).close()
    fd = os.open(f"{db}-lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as an opener alone holds it while it checks
    try:
        started = time.monotonic()
        with pytest.raises(SequencerError, match="stayed locked"):
            SqliteSequencer(db, timeout=0.2)
        assert time.monotonic() - started >= 0.2
        threading.Timer(0.1, os.close, args=(fd,)).start()
        with SqliteSequencer(db, timeout=10) as seq:
            assert seq.list_streams() == []
    finally:
        with pytest.raises(OSError):
            os.close(fd)


def _commit_in_child(seq: SqliteSequencer) -> None:
    seq.commit("objects/child", [BatchToCommit("s", 0, 10, 1, 1, 1)])


def test_a_fork_child_shares_the_lock_and_commits(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    seq = SqliteSequencer(db)
    seq.create_stream("s", {})
    seq.commit("objects/parent", [BatchToCommit("s", 0, 10, 1, 1, 1)])
    child = FORK.Process(target=_commit_in_child, args=(seq,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    [result] = seq.commit("objects/parent-2", [BatchToCommit("s", 0, 10, 1, 1, 1)])
    assert result.base_offset == 2  # the child's commit took offset 1
    seq.close()
    assert alone(db)


# ------------------------------------------------------ a lost database


def object_log(tmp_path: Path) -> tuple[str, Path]:
    url = f"file://{tmp_path}/log"
    with disklesslog.open(url, backend="objects") as log:
        log.create_stream("a").append_batch([b"1", b"2", b"3"])
    return url, tmp_path / "log" / "disklesslog-meta.db"


@pytest.mark.parametrize("how", ["deleted", "cut to nothing"])
def test_a_lost_database_is_never_taken_for_a_new_one(tmp_path: Path, how: str) -> None:
    """The log's marker says it exists: an empty sequencer would hand out its offsets
    from 0 again."""
    url, db = object_log(tmp_path)
    if how == "deleted":
        db.unlink()
    else:
        os.truncate(db, 0)
    with pytest.raises(DataLossError, match="Nothing was created") as caught:
        disklesslog.open(url, backend="objects")
    assert caught.value.source == str(db)
    assert (db.exists(), db.exists() and db.stat().st_size) == (how != "deleted", 0)


def test_a_database_whose_tables_were_only_in_the_lost_log_is_refused(
    tmp_path: Path,
) -> None:
    """A new database keeps its tables in its -wal until the first checkpoint (its file
    holds only SQLite's header): a crash image of it opens, and without the -wal it
    holds no tables."""
    url = f"file://{tmp_path}/log"
    log = disklesslog.open(url, backend="objects")
    log.create_stream("a").append(b"1")
    shutil.copytree(tmp_path / "log", tmp_path / "crash")
    shutil.copytree(tmp_path / "log", tmp_path / "lost")
    log.close()
    assert (tmp_path / "crash" / "disklesslog-meta.db").stat().st_size == 4096
    with disklesslog.open(f"file://{tmp_path}/crash", backend="objects") as crashed:
        assert crashed.stream("a").end_offset == 1
    (tmp_path / "lost" / "disklesslog-meta.db-wal").unlink()
    with pytest.raises(DataLossError, match="holds no tables"):
        disklesslog.open(f"file://{tmp_path}/lost", backend="objects")


def test_another_kind_of_log_is_refused_before_a_database_is_made(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path / "segments"):
        pass
    with pytest.raises(InvalidURL, match="another kind"):
        disklesslog.open(f"file://{tmp_path}/segments", backend="objects")
    assert not (tmp_path / "segments" / "disklesslog-meta.db").exists()


def _open_and_append(url: str, worker: int) -> int:
    with disklesslog.open(url, backend="objects") as log:
        return log.stream("a").append(b"%d" % worker)


def test_processes_creating_one_log_together_never_see_it_lost(tmp_path: Path) -> None:
    """Creation order: the sequencer's tables, then the marker. Whoever sees the marker
    sees the tables."""
    for round_no in range(3):
        url = f"file://{tmp_path}/log-{round_no}"
        with SPAWN.Pool(4) as pool:
            offsets = pool.starmap(_open_and_append, [(url, n) for n in range(4)])
        assert sorted(offsets) == [0, 1, 2, 3]


# ------------------------------------------------ a bounded write-ahead log


def test_the_write_ahead_log_stays_bounded_while_readers_never_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers whose transactions always overlap keep SQLite's automatic checkpoints
    from starting the log over: it grew without end. (Sizes scaled down 64-fold, and
    so the pauses after a try in vain: at the same commit rate, a 0.1 s pause grows the
    log by 64 times the scaled limit.)"""
    monkeypatch.setattr(sqlite_module, "_AUTOCHECKPOINT_PAGES", 125)
    monkeypatch.setattr(sqlite_module, "_WAL_SIZE_LIMIT", 1 << 20)
    monkeypatch.setattr(sqlite_module, "_RESTART_PAUSES", (0.1 / 64, 5.0 / 64))
    db = tmp_path / "meta.db"
    seq = SqliteSequencer(db)
    for k in range(10):
        seq.create_stream(f"s{k}", {})
    stop = threading.Event()

    def read() -> None:  # two connections taking turns, so one always has a snapshot
        readers = [sqlite3.connect(db, isolation_level=None) for _ in range(2)]
        readers[0].execute("BEGIN")
        readers[0].execute("SELECT count(*) FROM batches").fetchone()
        turn = 0
        while not stop.is_set():
            other = readers[1 - turn]
            other.execute("BEGIN")
            other.execute("SELECT count(*) FROM batches").fetchone()
            readers[turn].execute("COMMIT")
            turn = 1 - turn
            time.sleep(0.0005)
        readers[turn].execute("COMMIT")
        for reader in readers:
            reader.close()

    reader = threading.Thread(target=read)
    reader.start()
    largest = 0
    try:
        for i in range(1000):
            batches = [BatchToCommit(f"s{k}", 0, 10, 1, 1, i) for k in range(10)]
            seq.commit(f"objects/{i}", batches)
            largest = max(largest, Path(f"{db}-wal").stat().st_size)
    finally:
        stop.set()
        reader.join()
        seq.close()
    assert largest < 8 << 20, largest  # it reached 50 MB
