"""What only the SQLite sequencer promises: many processes, persistence, its schema and
URL. (Everything every sequencer promises is in ``test_contract.py``.)"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import random
import sqlite3
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from disklesslog.errors import CorruptDataError, InvalidURL, LogClosedError, SequencerError
from disklesslog.sequencers import (
    BatchToCommit,
    CommitResult,
    ProducerExpiry,
    open_sequencer,
    sqlite_schema,
)
from disklesslog.sequencers.memory import MemorySequencer, reset_memory_sequencers
from disklesslog.sequencers.rows import row_crc
from disklesslog.sequencers.sqlite import (
    TIME_INDEX_INTERVAL,
    SqliteSequencer,
    parse_sqlite_url,
)
from disklesslog.testing.contracts import FakeClock

SPAWN = multiprocessing.get_context("spawn")
STREAMS = ("s0", "s1", "s2")
WORKERS, COMMITS = 4, 150


def _barrier(directory: Path, worker: int) -> None:
    """Wait until every worker process is up, so their commits really interleave."""
    (directory / f"ready-{worker}").touch()
    deadline = time.monotonic() + 60
    while len(list(directory.glob("ready-*"))) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.005)


def commit_worker(
    path: str, worker: int
) -> tuple[float, float, list[tuple[str, list[CommitResult]]]]:
    """One process: commits of one batch per stream, shuffled, with random record
    counts; every seventh commit is sent twice (a retry) and must come back identical.
    ``position`` carries the commit number so the parent can check the order."""
    rng = random.Random(worker)
    seq = SqliteSequencer(path)
    producer = seq.init_producer(f"worker-{worker}")
    _barrier(Path(path).parent, worker)
    started = time.time()
    next_seq = dict.fromkeys(STREAMS, 0)
    done = []
    for n in range(COMMITS):
        batches = []
        for stream in rng.sample(STREAMS, len(STREAMS)):
            records = rng.randint(1, 3)
            batches.append(
                BatchToCommit(stream, n, 10, records, records, n, *producer, next_seq[stream])
            )
            next_seq[stream] += records
        key = f"w{worker}-{n:04d}"
        results = seq.commit(key, batches)
        if n % 7 == 0:
            assert seq.commit(key, batches) == [CommitResult(r.base_offset, True) for r in results]
        done.append((key, results))
    seq.close()
    return started, time.time(), done


def test_many_processes_commit_dense_ordered_offsets(tmp_path: Path) -> None:
    path = str(tmp_path / "meta.db")
    with SqliteSequencer(path) as seq:
        for stream in STREAMS:
            seq.create_stream(stream, {})
    with ProcessPoolExecutor(WORKERS, mp_context=SPAWN) as pool:
        runs = list(pool.map(commit_worker, [path] * WORKERS, range(WORKERS)))
    assert max(start for start, _, _ in runs) < min(end for _, end, _ in runs)  # overlapped
    answered = {
        (key, result.base_offset)
        for _, _, run in runs
        for key, results in run
        for result in results
    }
    with SqliteSequencer(path) as seq:
        stored = set()
        for stream in STREAMS:
            page = seq.find_batches(stream, 0, 1 << 40)
            assert len(page.batches) == WORKERS * COMMITS  # retries stored nothing
            expected_base = 0
            last_commit: dict[str, int] = {}
            for b in page.batches:
                assert b.base_offset == expected_base  # dense: no gap, no overlap
                expected_base = b.last_offset + 1
                worker = b.object_key.split("-")[0]
                assert b.position > last_commit.get(worker, -1)  # each producer in order
                last_commit[worker] = b.position
                stored.add((b.object_key, b.base_offset))
            assert page.end_offset == expected_base
        assert stored == answered  # every answered offset is where the batch is


def test_state_survives_reopening(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/deep/er/meta.db"
    with open_sequencer(url) as seq:
        seq.create_stream("a", {"compression": "zstd"})
        producer = seq.init_producer("w")
        first = [BatchToCommit("a", 0, 10, 3, 3, 5, *producer, 0)]
        seq.commit("o1", first)
        seq.commit("o2", [BatchToCommit("a", 0, 10, 2, 2, 9)])
        seq.trim("a", 3)
        seq.commit_offsets("g", {"a": 4})
        seq.record_orphan("lost")
    with open_sequencer(url) as seq:
        info = seq.stream_info("a")
        assert (info.start_offset, info.end_offset, info.config) == (3, 5, {"compression": "zstd"})
        assert [b.object_key for b in seq.find_batches("a", 3, 1000).batches] == ["o2"]
        assert seq.committed_offsets("g") == {"a": 4}
        assert sorted(seq.objects_to_delete(0)) == ["lost", "o1"]
        assert seq.offset_for_time("a", 6) == 3
        assert seq.init_producer("w") == (producer[0], producer[1] + 1)


def test_producer_state_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    with SqliteSequencer(path) as seq:
        seq.create_stream("a", {})
        producer = seq.init_producer()
        batch = BatchToCommit("a", 0, 10, 2, 2, 0, *producer, 0)
        seq.commit("o1", [batch])
    with SqliteSequencer(path) as seq:
        assert seq.commit("o1", [batch]) == [CommitResult(0, True)]


def test_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    SqliteSequencer(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.close()
    with pytest.raises(SequencerError, match="newer disklesslog"):
        SqliteSequencer(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta").fetchall() == [("99",)]
    db.close()


def _old_database(path: Path, version: int, config: str = '{"compression": "zstd"}') -> None:
    """A database as the release of schema ``version`` (1 or 2) left it: its tables (the
    migrations are history, kept as they were) and rows as it wrote them. Stream ``a``
    was trimmed to 3 and compacted: batches 3..5 and 8..9, no batch for 6..7 nor for
    10..11 before its end offset 12."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
        for step in range(1, version + 1):
            for statement in sqlite_schema.MIGRATIONS[step]:
                db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
        db.execute("INSERT INTO streams VALUES (1, 'a', ?, 3, 12, 40, 4)", (config,))
        db.execute("INSERT INTO streams VALUES (2, 'b', '{}', 0, 0, NULL, 0)")
        db.execute("INSERT INTO producers VALUES (1, 'w', 0)")
        db.execute("INSERT INTO producer_streams VALUES (1, 1, '[0, [[0, 2, 3]]]')")
        db.execute("INSERT INTO objects VALUES (1, 'o1', 0, 1700000000.0)")
        db.execute("INSERT INTO objects VALUES (2, 'o2', 2, NULL)")
        db.execute("INSERT INTO objects VALUES (3, 'lost', 0, 1700000000.0)")
        db.execute("INSERT INTO batches VALUES (2, 1, 2, 0, 10, 3, 5, 20)")
        db.execute("INSERT INTO batches VALUES (3, 1, 2, 10, 10, 8, 9, 40)")
        db.execute("INSERT INTO time_index VALUES (1, 20, 6)")
        db.execute("INSERT INTO group_offsets VALUES ('g', 'a', 4)")
        if version >= 2:
            db.execute("INSERT INTO transactions VALUES (1, 't1', 1700000000.0, '{\"a\": [3, 6]}')")


def _columns(path: Path, table: str) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_database_is_migrated_with_checksums(tmp_path: Path, version: int) -> None:
    """Schema version 3 adds the row checksums and the columns that prove a stream's
    batches complete, filled in for every row already there; the old rows read as they
    did, and every later write and read checks them."""
    path = tmp_path / "meta.db"
    _old_database(path, version)
    with SqliteSequencer(path, clock=lambda: 1_700_000_100.0) as seq:
        info = seq.stream_info("a")
        assert (info.start_offset, info.end_offset, info.config) == (3, 12, {"compression": "zstd"})
        page = seq.find_batches("a", 3, 1 << 40)
        assert [(b.batch_id, b.object_key, b.base_offset, b.last_offset) for b in page.batches] == [
            (2, "o2", 3, 5),
            (3, "o2", 8, 9),
        ]
        assert [b.base_offset for b in seq.find_batches("a", 6, 1 << 40).batches] == [8]
        assert seq.find_batches("a", 10, 1 << 40).batches == []  # the gap at the end
        assert seq.offset_for_time("a", 30) == 8
        assert seq.committed_offsets("g") == {"a": 4}
        assert seq.objects_to_delete(0) == ["lost", "o1"]
        assert seq.list_objects() == ["lost", "o1", "o2"]
        assert seq.commit("o3", [BatchToCommit("a", 0, 10, 2, 2, 50, 1, 0, 0)]) == [
            CommitResult(3, duplicate=True)  # the producer state came through
        ]
        assert seq.commit("o3", [BatchToCommit("a", 0, 10, 2, 2, 50, 1, 0, 3)]) == [
            CommitResult(12)
        ]
        assert [b.base_offset for b in seq.find_batches("a", 10, 1 << 40).batches] == [12]
        if version >= 2:
            assert seq.commit_transaction("t1", []).ranges == {"a": (3, 6)}
        else:
            assert seq.commit_transaction("t1", []).ranges == {}
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM meta").fetchall() == [("6",)]
        assert db.execute("SELECT * FROM stream_count").fetchall() == [(0, 2, row_crc((2,)))]
        for table in ("streams", "producers", "producer_streams", "objects", "batches"):
            assert db.execute(f"SELECT count(*) FROM {table} WHERE crc IS NULL").fetchone() == (0,)
        assert db.execute("SELECT id, gap FROM batches ORDER BY id").fetchall() == [
            (2, 0),
            (3, 2),
            (4, 2),
        ]


@pytest.mark.parametrize(
    ("config", "edit"),
    [
        ("{broken", None),
        ('["a list"]', None),
        ('{"compression": "zstd"}', "UPDATE batches SET base_offset = 2 WHERE id = 3"),
        ('{"compression": "zstd"}', "UPDATE batches SET stream_id = 7 WHERE id = 3"),
        ('{"compression": "zstd"}', "UPDATE batches SET object_id = 9 WHERE id = 3"),
        ('{"compression": "zstd"}', "UPDATE producer_streams SET state = '[0, '"),
        ('{"compression": "zstd"}', "UPDATE transactions SET ranges = 'x'"),
    ],
)
def test_an_old_database_that_is_damaged_is_not_migrated(
    tmp_path: Path, config: str, edit: str | None
) -> None:
    """A migration checksums rows as they are, so it first refuses what cannot be right
    (JSON that does not parse, batches overlapping or without a stream or object):
    CorruptDataError naming the file, and the file stays at its version."""
    path = tmp_path / "meta.db"
    _old_database(path, 2, config)
    if edit is not None:
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute(edit)
    with pytest.raises(CorruptDataError) as caught:
        SqliteSequencer(path)
    assert caught.value.source is not None and str(path) in caught.value.source
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM meta").fetchall() == [("2",)]
    assert "crc" not in _columns(path, "streams")


def _version_3_database(path: Path) -> None:
    """A database as the release of schema version 3 left it (version 4 only adds
    ``stream_count``, version 5 ``leases`` and ``lease_count``, version 6 producers'
    ``used_ms``): streams ``a`` (one batch) and ``b``."""
    with SqliteSequencer(path) as seq:
        seq.create_stream("a", {})
        seq.create_stream("b", {})
        seq.commit("o1", [BatchToCommit("a", 0, 10, 2, 2, 5)])
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE stream_count")
        db.execute("DROP TABLE leases")
        db.execute("DROP TABLE lease_count")
        db.execute("ALTER TABLE producers DROP COLUMN used_ms")  # version 6's (no producers)
        db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def test_a_version_3_database_gets_its_streams_counted(tmp_path: Path) -> None:
    """Schema version 4 counts the streams already there; creates and deletes keep
    the count."""
    path = tmp_path / "meta.db"
    _version_3_database(path)
    with SqliteSequencer(path) as seq:
        assert seq.list_streams() == ["a", "b"]
        seq.create_stream("c", {})
        seq.delete_stream("b")
        assert seq.commit("o2", [BatchToCommit("a", 0, 10, 1, 1, 6)]) == [CommitResult(2)]
        assert seq.acquire_lease("m", "w", 1_000) is not None  # version 5 made its table
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM meta").fetchall() == [("6",)]
        assert db.execute("SELECT * FROM stream_count").fetchall() == [(0, 2, row_crc((2,)))]


def _version_5_database(path: Path, clock: FakeClock) -> tuple[int, int]:
    """A database as the release of schema version 5 left it (version 6 adds each
    producer's ``used_ms`` and each state's last write to its JSON text): stream ``a``
    with two records of named producer ``w``, whose ``(id, epoch)`` is returned."""
    with SqliteSequencer(path, clock=clock) as seq:
        seq.create_stream("a", {})
        producer = seq.init_producer("w")
        seq.commit("o1", [BatchToCommit("a", 0, 10, 2, 2, 5, *producer, 0)])
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for stream_id, producer_id, state in db.execute(
            "SELECT stream_id, producer_id, state FROM producer_streams"
        ).fetchall():
            old = json.dumps(json.loads(state)[:2])
            db.execute(
                "UPDATE producer_streams SET state = ?, crc = ? WHERE stream_id = ?"
                " AND producer_id = ?",
                (old, row_crc((stream_id, producer_id, old)), stream_id, producer_id),
            )
        db.execute("ALTER TABLE producers DROP COLUMN used_ms")
        for row in db.execute("SELECT id, name, epoch FROM producers").fetchall():
            db.execute("UPDATE producers SET crc = ? WHERE id = ?", (row_crc(row), row[0]))
        db.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    return producer


def test_a_version_5_database_gets_producer_times(tmp_path: Path) -> None:
    """Schema version 6 gives every producer and producer state of a version 5 file the
    migration's time, under checksums: the state still deduplicates, nothing expires
    before a whole window has passed since the upgrade, and then it does."""
    path, clock = tmp_path / "meta.db", FakeClock()
    producer = _version_5_database(path, clock)
    clock.advance(3600)
    with SqliteSequencer(path, clock=clock) as seq:
        retry = seq.commit("o1", [BatchToCommit("a", 0, 10, 2, 2, 5, *producer, 0)])
        assert retry == [CommitResult(0, duplicate=True)]
        assert seq.expire_producers(60_000) == ProducerExpiry()
        clock.advance(61)
        assert seq.expire_producers(60_000) == ProducerExpiry(states=1, producers=1)
        again = seq.init_producer("w")
        assert again[0] > producer[0] and again[1] == 0  # the id is not issued again
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM meta").fetchall() == [("6",)]
        rows = db.execute("SELECT id, name, epoch, used_ms, crc FROM producers").fetchall()
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(again[0], "w", 0, 1_700_003_661_000)]
        assert row_crc(rows[0][:4]) == rows[0][4]


def test_a_damaged_version_5_producer_is_not_migrated(tmp_path: Path) -> None:
    """Version 6 rewrites every producer row's checksum, so it verifies the old one
    first: a damaged row refuses the migration and the file stays at version 5."""
    path, clock = tmp_path / "meta.db", FakeClock()
    _version_5_database(path, clock)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE producers SET epoch = 7")
    with pytest.raises(CorruptDataError, match="producers"):
        SqliteSequencer(path, clock=clock)
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM meta").fetchall() == [("5",)]
    assert "used_ms" not in _columns(path, "producers")


@pytest.mark.parametrize("table", ["batches", "producer_streams", "time_index"])
def test_a_version_3_database_with_a_lost_stream_is_not_migrated(
    tmp_path: Path, table: str
) -> None:
    """A stream whose row is already gone when version 4 would count the streams still
    has rows elsewhere: counting what is there would bless the loss, so the migration
    is refused (CorruptDataError naming the file and table) and the file stays at
    version 3."""
    path = tmp_path / "meta.db"
    _version_3_database(path)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        (stream_id,) = db.execute("SELECT id FROM streams WHERE name = 'b'").fetchone()
        if table == "producer_streams":
            db.execute(
                "INSERT INTO producer_streams VALUES (?, 1, '[0, [[0, 2, 3]]]', 0)", (stream_id,)
            )
        elif table == "time_index":
            db.execute("INSERT INTO time_index VALUES (?, 5, 2, 0)", (stream_id,))
        else:
            stream_id = db.execute("SELECT id FROM streams WHERE name = 'a'").fetchone()[0]
        db.execute("DELETE FROM streams WHERE id = ?", (stream_id,))
    with pytest.raises(CorruptDataError) as caught:
        SqliteSequencer(path)
    assert caught.value.source == f"{path} table streams row id {stream_id}"
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM meta").fetchall() == [("3",)]
        found = db.execute("SELECT name FROM sqlite_master WHERE name = 'stream_count'")
        assert found.fetchall() == []


def test_a_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER)")
    db.close()
    with pytest.raises(SequencerError, match="not a disklesslog sequencer"):
        SqliteSequencer(path)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/meta.db",
        "sqlite:///",
        "sqlite:///dir/",
        "sqlite:///x.db?synchronous=off",
        "sqlite:///x.db?timeout=soon",
        "sqlite:///x.db?timeout=-1",
        "sqlite:///x.db?timeout=nan",
        "sqlite:///x.db?cache=big",
        "sqlite:///x.db?timeout=1&timeout=2",
        "sqlite:///x.db?timeout",
        "sqlite:///x.db#part",
        "postgresql:///x.db",
        "meta.db",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidURL):
        parse_sqlite_url(url)


def test_url_options_are_parsed() -> None:
    assert parse_sqlite_url("sqlite:///var/a%20b/meta.db") == ("/var/a b/meta.db", "normal", 30.0)
    assert parse_sqlite_url("SQLITE:///m.db?synchronous=FULL&timeout=2.5") == (
        "/m.db",
        "full",
        2.5,
    )


@pytest.mark.parametrize(
    "option, pragma", [("", 1), ("?synchronous=normal", 1), ("?synchronous=full", 2)]
)
def test_synchronous_option_reaches_every_connection(
    tmp_path: Path, option: str, pragma: int
) -> None:
    with open_sequencer(f"sqlite://{tmp_path}/m.db{option}") as seq:
        assert isinstance(seq, SqliteSequencer)
        seen: list[int] = []
        worker = threading.Thread(
            target=lambda: seen.append(seq._holder().db.execute("PRAGMA synchronous").fetchone()[0])
        )
        worker.start()
        worker.join()
        assert seen == [pragma]
        assert seq._holder().db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_url_reopens_the_same_database(tmp_path: Path) -> None:
    with SqliteSequencer(tmp_path / "odd name%.db", synchronous="full", timeout=3) as seq:
        seq.create_stream("a", {})
        url = seq.url
    assert "synchronous=full" in url and "timeout=3" in url
    with open_sequencer(url) as again:
        assert again.list_streams() == ["a"]


def test_a_held_write_lock_times_out_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with SqliteSequencer(path, timeout=0.05) as seq:
        seq.create_stream("a", {})
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(SequencerError, match="locked"):
            seq.commit("o1", [BatchToCommit("a", 0, 10, 1, 1, 0)])
        assert time.monotonic() - started < 5
        assert seq.stream_info("a").end_offset == 0  # readers are not blocked (WAL)
        blocker.execute("ROLLBACK")
        blocker.close()
        assert seq.commit("o1", [BatchToCommit("a", 0, 10, 1, 1, 0)]) == [CommitResult(0)]


def test_use_after_close_raises(tmp_path: Path) -> None:
    seq = SqliteSequencer(tmp_path / "m.db")
    seq.close()
    with pytest.raises(LogClosedError):
        seq.list_streams()


def test_time_index_is_sparse(tmp_path: Path) -> None:
    with SqliteSequencer(tmp_path / "m.db") as seq:
        seq.create_stream("a", {})
        seq.commit("o", [BatchToCommit("a", 0, 1, 1, 1, t) for t in range(4 * TIME_INDEX_INTERVAL)])
        rows = (
            seq._holder().db.execute("SELECT max_timestamp, next_offset FROM time_index").fetchall()
        )
        assert rows == [
            (i * TIME_INDEX_INTERVAL - 1, i * TIME_INDEX_INTERVAL) for i in (1, 2, 3, 4)
        ]
        assert seq.offset_for_time("a", 40) == 40


def test_open_sequencer_memory_urls_share_state_by_name() -> None:
    reset_memory_sequencers()
    first = open_sequencer("memory://shared")
    assert isinstance(first, MemorySequencer)
    assert open_sequencer("memory://shared") is first
    assert open_sequencer("MEMORY://shared") is first
    assert open_sequencer("memory://other") is not first
    assert open_sequencer("memory://") is open_sequencer("memory://")
    first.create_stream("a", {})
    first.close()  # a shared instance outlives any one user
    assert open_sequencer(first.url).list_streams() == ["a"]
    assert MemorySequencer().list_streams() == []  # a private one
    reset_memory_sequencers()
    assert open_sequencer("memory://shared").list_streams() == []


def test_open_sequencer_rejects_unknown_schemes() -> None:
    with pytest.raises(InvalidURL, match="memory://"):
        open_sequencer("etcd://x")


def test_close_while_other_threads_commit_and_read(tmp_path: Path) -> None:
    """Closing must wait for transactions in flight: closing a connection another thread
    is using crashes the process. The others then get LogClosedError, nothing worse."""
    import threading

    from disklesslog import LogClosedError
    from disklesslog.sequencers.base import BatchToCommit

    for round_no in range(5):
        seq = open_sequencer(f"sqlite://{tmp_path}/close-{round_no}.db")
        seq.create_stream("s", {})
        outcomes: list[str] = []
        busy = threading.Semaphore(0)  # released by each thread once it is under way

        def work(n: int, seq=seq, outcomes=outcomes, busy=busy) -> None:
            try:
                pid, epoch = seq.init_producer(None)
                for i in range(10_000):
                    if n % 2:
                        seq.find_batches("s", 0, 1 << 20)
                    else:
                        batch = BatchToCommit("s", 0, 10, 1, 1, 1, pid, epoch, i)
                        seq.commit(f"objects/{n}-{i}", [batch])
                    if i == 10:
                        busy.release()
            except LogClosedError:
                outcomes.append("closed")

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for _ in threads:  # close while every thread is in the middle of its work
            assert busy.acquire(timeout=30)
        seq.close()
        for thread in threads:
            thread.join(30)
        assert outcomes == ["closed"] * 4
