"""Damage to what the SQL sequencers store is reported, never read as wrong data.

Every row a later call trusts carries a checksum, and a stream's batch rows prove they
are complete (``disklesslog/sequencers/rows.py``), so a damaged or missing row raises
:class:`~disklesslog.errors.CorruptDataError` naming the database, the table and the
row. Two kinds of test:

* **Damaged SQLite files.** A real database (streams with producers, compaction gaps, a
  trim inside a batch, a deleted stream, consumer groups, a transaction, garbage) is
  damaged in hundreds of copies: a bit flipped, a run of bytes zeroed, the file cut
  short, at positions all over it. Each copy must either read exactly as the original
  (every stream, page, time lookup, group, garbage list) and accept the same next
  commit, or raise a typed error naming the file. Once with the check on open, once
  without it (as for files too large for it), so the rows' own checks are tested too.
* **Damaged rows, in SQLite and PostgreSQL**: a column changed, a row deleted, broken
  JSON, each by a direct ``UPDATE``/``DELETE``, then the call that trusts the row.
"""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import pytest

from disklesslog.errors import ConfigError, CorruptDataError, DisklessLogError, SequencerError
from disklesslog.sequencers import BatchLocation, BatchToCommit, Sequencer
from disklesslog.sequencers import sqlite as sqlite_module
from disklesslog.sequencers.rows import LAYOUTS, name_key, row_crc
from disklesslog.sequencers.sqlite import SqliteSequencer

NOW = 1_700_000_000.0
BIG = 1 << 40
STREAMS = ("a", "b", "c")
GROUPS = ("g1", "g2", "nobody")
TIMES = (0, 1000, 1055, 1075, 1385, 1390, 1391, 2005, 3039, 10_000)


def clock() -> float:
    return NOW


# ------------------------------------------------------------- the database


def populate(seq: Sequencer) -> None:
    """Everything a sequencer stores, through its API: three streams written by a named,
    an anonymous and no producer (40 commits), compaction that leaves gaps inside stream
    ``a`` and at its end, trims (one inside a batch), a stream created and deleted,
    consumer groups, a transaction, an orphan and garbage."""
    seq.create_stream("a", {"cleanup_policy": "compact", "compression": "zstd"})
    seq.create_stream("b", {})
    seq.create_stream("c", {"retention_ms": 5})
    named = seq.init_producer("writer")
    anonymous = seq.init_producer()
    for i in range(40):
        seq.commit(
            f"objects/{i:04d}",
            [
                BatchToCommit("a", 0, 100, 3, 3, 1000 + 10 * i, *named, 3 * i),
                BatchToCommit("b", 100, 50, 2, 2, 2000 + i, *anonymous, 2 * i),
                BatchToCommit("c", 150, 10, 1, 1, 3000 + i),
            ],
        )
    olds = seq.find_batches("a", 0, BIG).batches
    compacted = [  # offsets 15..29 become two batches with gaps around them
        BatchLocation(0, "objects/compacted-1", 0, 40, 16, 18, 1060),
        BatchLocation(0, "objects/compacted-1", 40, 40, 24, 26, 1080),
    ]
    assert seq.replace_batches("a", [b.batch_id for b in olds[5:10]], compacted)
    assert seq.replace_batches("a", [olds[-1].batch_id], [])  # a gap at the end
    seq.trim("b", 11)  # inside the batch of offsets 10..11
    seq.trim("c", 5)
    seq.create_stream("d", {})
    seq.commit("objects/d", [BatchToCommit("d", 0, 10, 1, 1, 1)])
    seq.delete_stream("d")
    seq.commit_offsets("g1", {"a": 7, "b": 12})
    seq.commit_offsets("g2", {"c": 30})
    seq.commit_transaction("txn-1", [("objects/staged-1", [BatchToCommit("b", 0, 30, 4, 4, 5000)])])
    seq.record_orphan("objects/orphan-1")
    assert seq.acquire_lease("held", "worker-1", 60_000) is not None
    released = seq.acquire_lease("released", "worker-2", 60_000)
    assert released is not None
    seq.release_lease(released)


def snapshot(seq: Sequencer, *, ids: bool = True) -> dict[str, Any]:
    """Everything readers trust, read through the API: pages of a few batches from the
    start offset to the end, time lookups, groups, garbage and the list of objects."""
    out: dict[str, Any] = {"streams": seq.list_streams()}
    for name in STREAMS:
        info = seq.stream_info(name)
        pages = []
        offset = info.start_offset
        while offset < info.end_offset:
            page = seq.find_batches(name, offset, 150)
            batches = page.batches if ids else [replace(b, batch_id=0) for b in page.batches]
            pages.append((page.start_offset, page.end_offset, batches))
            if not page.batches:
                break
            offset = page.batches[-1].last_offset + 1
        times = [seq.offset_for_time(name, t) for t in TIMES]
        out[name] = (info, pages, times)
    out["groups"] = {group: seq.committed_offsets(group) for group in GROUPS}
    out["garbage"] = seq.objects_to_delete(0)
    out["objects"] = seq.list_objects()
    out["leases"] = [seq.read_lease(name) for name in ("held", "released")]
    return out


def next_write(seq: Sequencer) -> Any:
    """A commit of the writer after the damage (its producer state is checked) and a
    consumer group's commit."""
    producer = seq.init_producer("writer")
    results = seq.commit(
        "objects/next",
        [
            BatchToCommit("a", 0, 10, 3, 3, 9000, *producer, 0),
            BatchToCommit("c", 10, 10, 1, 1, 9001),
        ],
    )
    seq.commit_offsets("g2", {"a": 100})
    return results


# ------------------------------------------------------------ SQLite files


@dataclass(frozen=True)
class Golden:
    """The pristine database file and what reading and writing it gives."""

    data: bytes
    before: dict[str, Any]
    written: Any
    after: dict[str, Any]


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Golden:
    path = tmp_path_factory.mktemp("golden") / "meta.db"
    with SqliteSequencer(path, clock=clock) as seq:
        populate(seq)
    data = path.read_bytes()
    assert not Path(f"{path}-wal").exists()  # closing checkpointed everything
    with SqliteSequencer(path, clock=clock) as seq:
        before = snapshot(seq)
        written = next_write(seq)
        after = snapshot(seq, ids=False)
    return Golden(data, before, written, after)


def _outcome(path: Path, golden: Golden) -> str:
    """Open a (damaged) copy, read and write it: "intact" if everything matched the
    original, "refused" if a typed error named the file; anything else fails."""
    try:
        with SqliteSequencer(path, clock=clock) as seq:
            assert snapshot(seq) == golden.before, "damage was read as different data"
            assert next_write(seq) == golden.written, "damage changed a commit's answer"
            assert snapshot(seq, ids=False) == golden.after, "a commit on damage read back wrong"
    except DisklessLogError as exc:
        assert str(path) in str(exc), f"the error does not name the database: {exc!r}"
        return "refused"
    return "intact"


def _damaged(golden: Golden, directory: Path, edit: Callable[[bytearray], bytes]) -> Path:
    path = directory / f"{uuid.uuid4().hex}.db"
    path.write_bytes(edit(bytearray(golden.data)))
    return path


def _positions(size: int, count: int, seed: int) -> list[int]:
    """Every 4th byte of the 100-byte file header, then ``count`` positions spread over
    the file (one in each of ``count`` equal slices, at random within it)."""
    rng = random.Random(seed)
    header = list(range(0, 100, 4))
    return header + [i * size // count + rng.randrange(max(1, size // count)) for i in range(count)]


def _flip(position: int, bit: int) -> Callable[[bytearray], bytes]:
    def edit(data: bytearray) -> bytes:
        data[position] ^= 1 << bit
        return bytes(data)

    return edit


def _zero(position: int, length: int) -> Callable[[bytearray], bytes]:
    def edit(data: bytearray) -> bytes:
        data[position : position + length] = bytes(len(data[position : position + length]))
        return bytes(data)

    return edit


def _cut(position: int) -> Callable[[bytearray], bytes]:
    """The file cut short at ``position`` (not at 0: an empty file is what a new
    database is, and SQLite cannot tell the two apart; docs/operations.md)."""
    return lambda data: bytes(data[: max(1, position)])


@pytest.fixture(params=["checked on open", "not checked on open"])
def open_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """With the structural check of opening, and without it (as for a file larger than
    its limits): then the rows' checksums and tiling must catch everything alone."""
    if request.param == "not checked on open":
        monkeypatch.setattr(sqlite_module, "INTEGRITY_CHECK_MAX_BYTES", -1)
        monkeypatch.setattr(sqlite_module, "QUICK_CHECK_MAX_BYTES", -1)
    return str(request.param)


def _fuzz(golden: Golden, directory: Path, damage: str, count: int, seed: int) -> dict[str, int]:
    """``count`` damaged copies (and the header's bytes), each read and written: how
    many read intact, how many were refused."""
    size = len(golden.data)
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    for position in _positions(size, count, seed):
        if damage == "flip":
            edit = _flip(position, rng.randrange(8))
        elif damage == "zero":
            edit = _zero(position, rng.choice([1, 8, 64]))
        else:
            edit = _cut(position)
        path = _damaged(golden, directory, edit)
        try:
            result = _outcome(path, golden)
        except AssertionError as exc:
            raise AssertionError(f"{damage} at byte {position} of {size}: {exc}") from exc
        outcomes[result] = outcomes.get(result, 0) + 1
        path.unlink()
    return outcomes


@pytest.mark.parametrize("damage", ["flip", "zero", "cut"])
def test_damaged_sqlite_files_read_intact_or_are_refused(
    golden: Golden, tmp_path: Path, open_check: str, damage: str
) -> None:
    outcomes = _fuzz(golden, tmp_path, damage, 100, seed=len(damage))
    assert outcomes.get("refused", 0) > 10, outcomes  # the damage was noticed, often


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flip", "zero", "cut"])
def test_damaged_sqlite_files_at_many_more_positions(
    golden: Golden, tmp_path: Path, open_check: str, damage: str
) -> None:
    outcomes = _fuzz(golden, tmp_path, damage, 1500, seed=100 + len(damage))
    assert outcomes.get("refused", 0) > 150, outcomes


def test_a_zeroed_page_is_refused_page_by_page(golden: Golden, tmp_path: Path) -> None:
    """Every page of the file zeroed in turn (what a lost write of a whole page looks
    like), with no check on open: each copy reads intact or is refused."""
    page_size = int.from_bytes(golden.data[16:18], "big")
    pages = len(golden.data) // page_size
    assert pages > 5
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite_module, "INTEGRITY_CHECK_MAX_BYTES", -1)
        patch.setattr(sqlite_module, "QUICK_CHECK_MAX_BYTES", -1)
        refused = 0
        for page in range(1, pages):  # page 0 holds the header: covered above
            path = _damaged(golden, tmp_path, _zero(page * page_size, page_size))
            refused += _outcome(path, golden) == "refused"
    assert refused >= pages // 2


@pytest.mark.parametrize(
    ("original", "damaged"),
    [
        (b"CREATE TABLE streams", b"CREATE TABLE str\xacams"),  # not UTF-8, even in errors
        (b"tail_gap INTEGER", b"tail_gaq INTEGER"),  # still SQL: the column is gone
    ],
)
def test_a_damaged_schema_is_refused_by_name(
    golden: Golden, tmp_path: Path, original: bytes, damaged: bytes
) -> None:
    """The schema SQLite keeps as text on the first page, damaged: text that is not
    UTF-8 (which made ``sqlite3`` raise UnicodeDecodeError from SQLite's own error
    message), or a column renamed: CorruptDataError naming the file."""
    assert golden.data.count(original) == 1
    path = tmp_path / "meta.db"
    path.write_bytes(golden.data.replace(original, damaged))
    with pytest.raises(CorruptDataError) as caught, SqliteSequencer(path, clock=clock) as seq:
        snapshot(seq)
    assert caught.value.source == str(path)


def test_a_file_that_is_not_a_database_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    path.write_bytes(b"certainly not SQLite" * 100)
    with pytest.raises(CorruptDataError) as caught:
        SqliteSequencer(path)
    assert caught.value.source == str(path)


def test_damage_sqlite_meets_while_reading_names_the_file(
    golden: Golden, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Damage no check on open looked for (as in a file beyond their limits): SQLite's
    own "malformed" becomes a CorruptDataError naming the file, with what
    ``quick_check`` found; :meth:`SqliteSequencer.check_integrity` finds damage on
    demand."""
    monkeypatch.setattr(sqlite_module, "INTEGRITY_CHECK_MAX_BYTES", -1)
    monkeypatch.setattr(sqlite_module, "QUICK_CHECK_MAX_BYTES", -1)
    page_size = int.from_bytes(golden.data[16:18], "big")
    path = tmp_path / "all-but-the-first-page.db"
    path.write_bytes(golden.data[:page_size] + b"\xff" * (len(golden.data) - page_size))
    with (
        pytest.raises(CorruptDataError, match="quick_check found") as caught,
        SqliteSequencer(path, clock=clock) as seq,
    ):
        seq.stream_info("a")
    assert caught.value.source == str(path)
    path = tmp_path / "the-last-page.db"
    path.write_bytes(golden.data[:-page_size] + b"\xff" * page_size)
    with SqliteSequencer(path, clock=clock) as seq:
        with pytest.raises(CorruptDataError, match="integrity_check found") as caught:
            seq.check_integrity()
        assert caught.value.source == str(path)


def test_a_read_that_met_damage_leaves_no_stale_snapshot(tmp_path: Path) -> None:
    """A read that fails in the middle of a query leaves its statement unfinished, held
    by the exception's traceback while the caller keeps the error (a logger, a retry
    loop); SQLite kept that connection's snapshot even after ROLLBACK, so this thread
    then missed every later commit in silence: the fault suite saw an append
    acknowledged and the read right after it find nothing."""
    path = tmp_path / "meta.db"
    with SqliteSequencer(path, clock=clock) as seq:
        seq.create_stream("a", {})
        seq.create_stream("b", {})
        for i in range(4):
            seq.commit(f"objects/{i}", [BatchToCommit("a", 0, 10, 1, 1, 1000 + i)])
        seq.commit("objects/b", [BatchToCommit("b", 0, 10, 1, 1, 1000)])
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE batches SET crc = crc + 1 WHERE base_offset = 1")
        with pytest.raises(CorruptDataError, match="table batches") as caught:
            seq.find_batches("a", 0, BIG)
        kept = caught.value  # the caller keeps the error, and so its traceback
        committed = threading.Thread(
            target=seq.commit, args=("objects/b2", [BatchToCommit("b", 0, 10, 1, 1, 2000)])
        )
        committed.start()
        committed.join()
        assert seq.stream_info("b").end_offset == 2
        assert [b.base_offset for b in seq.find_batches("b", 0, BIG).batches] == [0, 1]
        assert kept.source == str(path) + " table batches row (stream 'a', last_offset 1)"


# ------------------------------------------------------------- damaged rows


@dataclass
class Database:
    """A sequencer's database and a way around the sequencer into it: ``run`` executes
    one statement (``{t}`` before a table's name, ``%s`` for parameters)."""

    name: str
    open: Callable[[], Sequencer]
    run: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
    where: str  # what the errors name: the file, or the server and schema


def _sqlite_database(path: Path) -> Database:
    def run(query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            return db.execute(query.replace("{t}", "").replace("%s", "?"), params).fetchall()

    return Database("sqlite", lambda: SqliteSequencer(path, clock=clock), run, str(path))


def _postgres_database(url: str, schema: str) -> Database:
    import psycopg
    from psycopg import sql

    from disklesslog.sequencers.postgres import PostgresSequencer

    def run(query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        statement = sql.SQL(query.replace("{t}", "{s}.")).format(s=sql.Identifier(schema))
        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    return Database(
        "postgres",
        lambda: PostgresSequencer(f"{url}?schema={schema}", clock=clock),
        run,
        schema,
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A populated sequencer database (:func:`populate`), closed."""
    if request.param == "sqlite":
        found = _sqlite_database(tmp_path / "meta.db")
    else:
        from disklesslog.testing.servers.postgres import drop_schema

        url = request.getfixturevalue("postgres_server")
        schema = f"t_{uuid.uuid4().hex}"
        request.addfinalizer(lambda: drop_schema(url, schema))
        found = _postgres_database(url, schema)
    with found.open() as seq:
        populate(seq)
    yield found


def _expect_damage(database: Database, table: str, call: Callable[[Sequencer], Any]) -> None:
    with database.open() as seq, pytest.raises(CorruptDataError) as caught:
        call(seq)
    source = caught.value.source or ""
    assert database.where in source and f"table {table} " in source, source


def _first_batch_id(database: Database, stream: str, after: int = -1) -> int:
    rows = database.run(
        "SELECT b.id FROM {t}batches AS b JOIN {t}streams AS s ON s.id = b.stream_id"
        " WHERE s.name = %s AND b.last_offset > %s ORDER BY b.last_offset LIMIT 1",
        (stream, after),
    )
    return int(rows[0][0])


def _read_all(seq: Sequencer, stream: str) -> None:
    info = seq.stream_info(stream)
    seq.find_batches(stream, info.start_offset, BIG)


DAMAGES: dict[str, tuple[str, tuple[Any, ...], str, Callable[[Sequencer], Any]]] = {
    # name: (statement, parameters, the table named, the call that trusts the row)
    "a stream's end offset": (
        "UPDATE {t}streams SET end_offset = end_offset + 1 WHERE name = 'a'",
        (),
        "streams",
        lambda seq: seq.stream_info("a"),
    ),
    "a stream's start offset, seen by a commit": (
        "UPDATE {t}streams SET start_offset = 0 WHERE name = 'b'",
        (),
        "streams",
        lambda seq: seq.stream_info("b"),
    ),
    "a stream's end offset, seen by a commit": (
        "UPDATE {t}streams SET end_offset = 5 WHERE name = 'c'",
        (),
        "streams",
        lambda seq: seq.commit("objects/x", [BatchToCommit("c", 0, 1, 1, 1, 1)]),
    ),
    "a stream's config": (
        "UPDATE {t}streams SET config = %s WHERE name = 'c'",
        ('{"retention_ms": 6}',),
        "streams",
        lambda seq: seq.stream_info("c"),
    ),
    "a stream's name": (
        "UPDATE {t}streams SET name = 'z' WHERE name = 'c'",
        (),
        "streams",
        lambda seq: seq.stream_info("c"),
    ),
    "a batch's position": (
        "UPDATE {t}batches SET position = position + 1 WHERE id = %s",
        ("batch of b",),
        "batches",
        lambda seq: _read_all(seq, "b"),
    ),
    "a batch's object": (
        "UPDATE {t}batches SET object_id = (SELECT id FROM {t}objects WHERE key = %s)"
        " WHERE id = %s",
        ("objects/orphan-1", "batch of b"),
        "batches",
        lambda seq: _read_all(seq, "b"),
    ),
    "a batch's max timestamp": (
        "UPDATE {t}batches SET max_timestamp = 0 WHERE id = %s",
        ("batch of a",),
        "batches",
        lambda seq: seq.offset_for_time("a", 1000),
    ),
    "a batch row in the middle": (
        "DELETE FROM {t}batches WHERE id = %s",
        ("batch of c after 20",),
        "batches",
        lambda seq: _read_all(seq, "c"),
    ),
    "a batch row in the middle, seen by a time lookup": (
        "DELETE FROM {t}batches WHERE id = %s",
        ("batch of c after 20",),
        "batches",
        lambda seq: seq.offset_for_time("c", 3030),
    ),
    "the last batch row": (
        "DELETE FROM {t}batches WHERE id = %s",
        ("batch of c after 38",),
        "batches",
        lambda seq: seq.find_batches("c", 30, BIG),
    ),
    "a batch row, seen by a trim": (
        "DELETE FROM {t}batches WHERE id = %s",
        ("batch of c after 20",),
        "batches",
        lambda seq: seq.trim("c", 30),
    ),
    "an object's live count": (
        "UPDATE {t}objects SET live_batches = 1 WHERE key = 'objects/0007'",
        (),
        "objects",
        lambda seq: seq.list_objects(),
    ),
    "an object marked dead while live": (
        "UPDATE {t}objects SET dead_since = 1 WHERE key = 'objects/0007'",
        (),
        "objects",
        lambda seq: seq.objects_to_delete(0),
    ),
    "a dead object's time of death": (
        "UPDATE {t}objects SET dead_since = NULL WHERE key = 'objects/orphan-1'",
        (),
        "objects",
        lambda seq: seq.objects_to_delete(0),
    ),
    "an object row": (
        "DELETE FROM {t}objects WHERE key = 'objects/0007'",
        (),
        "objects",
        lambda seq: seq.list_objects(),
    ),
    "a producer's epoch": (
        "UPDATE {t}producers SET epoch = epoch + 1 WHERE name = 'writer'",
        (),
        "producers",
        lambda seq: seq.init_producer("writer"),
    ),
    "a producer state": (
        "UPDATE {t}producer_streams SET state = '[0, [[0, 2, 0]]]'",
        (),
        "producer_streams",
        lambda seq: seq.commit("objects/x", [BatchToCommit("a", 0, 1, 3, 3, 1, 1, 0, 120)]),
    ),
    "a producer's last use, seen by expiry": (
        "UPDATE {t}producers SET used_ms = used_ms - 1 WHERE name = 'writer'",
        (),
        "producers",
        lambda seq: seq.expire_producers(0),
    ),
    "a producer state's last write, seen by expiry": (
        "UPDATE {t}producer_streams SET state = rtrim(state, ']') || '9]'",
        (),
        "producer_streams",
        lambda seq: seq.expire_producers(0),
    ),
    "a time-index entry": (
        "UPDATE {t}time_index SET next_offset = next_offset + 3",
        (),
        "time_index",
        lambda seq: seq.offset_for_time("a", 1385),
    ),
    "a consumer group's offset": (
        "UPDATE {t}group_offsets SET next_offset = 8 WHERE stream = 'a'",
        (),
        "group_offsets",
        lambda seq: seq.committed_offsets("g1"),
    ),
    "a consumer group's offset row": (
        "DELETE FROM {t}group_offsets WHERE stream = 'a'",
        (),
        "group_offsets",
        lambda seq: seq.committed_offsets("g1"),
    ),
    "a consumer group's count, seen by a listing": (
        "UPDATE {t}groups SET streams = streams + 1",
        (),
        "groups",
        lambda seq: seq.list_groups(),
    ),
    "the number of streams": (
        "UPDATE {t}stream_count SET streams = streams + 1",
        (),
        "stream_count",
        lambda seq: seq.list_streams(),
    ),
    "the number of streams, seen by a create": (
        "UPDATE {t}stream_count SET streams = streams - 1",
        (),
        "stream_count",
        lambda seq: seq.create_stream("new", {}),
    ),
    "the row of the number of streams": (
        "DELETE FROM {t}stream_count",
        (),
        "stream_count",
        lambda seq: seq.stream_info("new"),
    ),
    "a transaction's ranges": (
        "UPDATE {t}transactions SET ranges = %s",
        ('{"b": [80, 85]}',),
        "transactions",
        lambda seq: seq.commit_transaction("txn-1", []),
    ),
}


def _parameters(database: Database, params: tuple[Any, ...]) -> tuple[Any, ...]:
    """Placeholders of :data:`DAMAGES` resolved: ``"batch of S [after N]"`` is the id of
    the first batch of stream S (ending after offset N)."""
    out = []
    for value in params:
        if isinstance(value, str) and value.startswith("batch of "):
            words = value.split()
            out.append(_first_batch_id(database, words[2], int(words[4]) if len(words) > 3 else -1))
        else:
            out.append(value)
    return tuple(out)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_row_is_reported_by_what_trusts_it(database: Database, damage: str) -> None:
    """A column changed or a row deleted behind the sequencer's back: the call that
    trusts the row raises CorruptDataError naming the database and the table; never
    wrong data, a raw exception, or StreamNotFound for a stream that exists."""
    statement, params, table, call = DAMAGES[damage]
    database.run(statement, _parameters(database, params))
    _expect_damage(database, table, call)


LOST_STREAM_CALLS: dict[str, Callable[[Sequencer], Any]] = {
    "list_streams": lambda seq: seq.list_streams(),
    "stream_info": lambda seq: seq.stream_info("c"),
    "create_stream": lambda seq: seq.create_stream("c", {"retention_ms": 5}),
    "commit": lambda seq: seq.commit("objects/x", [BatchToCommit("c", 0, 1, 1, 1, 1)]),
    "find_batches": lambda seq: seq.find_batches("c", 0, BIG),
    "offset_for_time": lambda seq: seq.offset_for_time("c", 0),
    "trim": lambda seq: seq.trim("c", 10),
    "alter_stream": lambda seq: seq.alter_stream("c", {"retention_ms": 6}),
    "delete_stream": lambda seq: seq.delete_stream("c"),
}


@pytest.mark.parametrize("call", list(LOST_STREAM_CALLS))
def test_a_deleted_stream_row_is_damage_not_a_missing_stream(database: Database, call: str) -> None:
    """A stream's row lost (a damaged page, a bad restore, a stray DELETE), which no
    checksum can see: the stream used to vanish from ``list_streams``, every call on it
    raised StreamNotFound, and ``create_stream`` (which an object log's next append
    calls) created it anew at offset 0, handing its acknowledged offsets out again,
    with its batches, producer states and time index left behind. The streams are
    counted (``stream_count``), so each call raises CorruptDataError naming the
    database and the table, and nothing is created."""
    database.run("DELETE FROM {t}streams WHERE name = 'c'", ())
    _expect_damage(database, "streams", LOST_STREAM_CALLS[call])
    names = database.run("SELECT name FROM {t}streams ORDER BY name", ())
    assert names == [("a",), ("b",)]
    batches = database.run("SELECT count(*) FROM {t}batches WHERE base_offset = 0", ())
    assert batches == [(1,)]  # only stream a's first: no new batch at offset 0


def test_streams_created_and_deleted_keep_their_count(database: Database) -> None:
    """``stream_count`` follows every create and delete (a create of a stream that exists
    counts nothing), and its checksum is the spec's."""
    with database.open() as seq:
        for name in ("x", "y", "x"):
            seq.create_stream(name, {})
        seq.delete_stream("y")
        assert seq.list_streams() == ["a", "b", "c", "x"]
    rows = database.run("SELECT id, streams, crc FROM {t}stream_count", ())
    assert all(crc == row_crc((count,)) for _, count, crc in rows)
    if database.name == "sqlite":  # one row counts every stream
        assert [row[:2] for row in rows] == [(0, 4)]
    else:  # one row per range of name keys, every one there
        from disklesslog.sequencers.postgres_schema import STREAM_COUNT_BUCKETS, name_bucket

        assert sorted(row[0] for row in rows) == list(range(STREAM_COUNT_BUCKETS))
        ranges = Counter(name_bucket(name_key(name)) for name in ("a", "b", "c", "x"))
        assert {bucket: count for bucket, count, _ in rows if count} == ranges


@pytest.mark.parametrize("checksum", ["stale", "matching"])
def test_a_broken_json_config_is_a_typed_error(database: Database, checksum: str) -> None:
    """The issue's case: broken JSON in a stream's config raised ``JSONDecodeError``.
    With the row's checksum stale (damage) or matching (a row a migration checksummed
    as it found it), reading the config is a CorruptDataError naming the stream."""
    database.run("UPDATE {t}streams SET config = %s WHERE name = 'a'", ('{"broken',))
    if checksum == "matching":
        (row,) = database.run(
            "SELECT id, name, config, start_offset, end_offset, max_timestamp, unindexed,"
            " tail_gap FROM {t}streams WHERE name = 'a'",
            (),
        )
        database.run("UPDATE {t}streams SET crc = %s WHERE name = 'a'", (row_crc(row),))
    _expect_damage(database, "streams", lambda seq: seq.stream_info("a"))
    _expect_damage(database, "streams", lambda seq: seq.alter_stream("a", {"retention_ms": 1}))


def test_arguments_sql_cannot_store_are_config_errors(database: Database) -> None:
    """Issue item 7: ``offset_for_time(2**63)`` and ``commit_offsets(..., 2**63)`` raised
    OverflowError from the driver. Every number beyond 64 bits and an object key that is
    not a str: ConfigError; a float where an int is stored: a malformed batch
    (SequencerError); and nothing changes."""
    with database.open() as seq:
        before = snapshot(seq)
        for call in (
            lambda: seq.offset_for_time("a", 1 << 63),
            lambda: seq.offset_for_time("a", -(1 << 63) - 1),
            lambda: seq.commit_offsets("g1", {"a": 1 << 63}),
            lambda: seq.commit("objects/x", [BatchToCommit("a", 1 << 63, 1, 1, 1, 1)]),
            lambda: seq.commit("objects/x", [BatchToCommit("a", 0, 1, 1, 1, 1 << 63)]),
            lambda: seq.commit("objects/x", [BatchToCommit("a", 0, 1, 1 << 63, 1, 1)]),
            lambda: seq.commit_transaction(
                "t", [("objects/y", [BatchToCommit("a", 0, 1, 1, 1, 1 << 64)])]
            ),
            lambda: seq.forget_objects([1]),  # type: ignore[list-item]
        ):
            with pytest.raises(ConfigError):
                call()
        # A float where an int belongs is a malformed batch, as on every sequencer.
        with pytest.raises(SequencerError):
            seq.commit("objects/x", [BatchToCommit("a", 0, 1, 1, 1, 1.5)])  # type: ignore[arg-type]
        assert seq.offset_for_time("a", (1 << 63) - 1) is None
        assert snapshot(seq) == before


# -------------------------------------------------------------------- the spec


def test_row_checksums_follow_the_spec(golden: Golden, tmp_path: Path) -> None:
    """docs/sequencers.md lists the values each table's checksum covers exactly as
    ``rows.LAYOUTS`` does, and a checksum computed from the spec alone (one msgpack
    array, CRC-32C) matches every row of a real database."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "sequencers.md").read_text("utf-8")
    section = doc[doc.index("### The checksum") : doc.index("### Complete streams")]
    specified = {}
    for line in section.splitlines():
        found = re.match(r"\| `(\w+)` \| (.+?) \| .+ \|$", line)
        if found:
            names = re.findall(r"`(\w+)`", found[2])
            specified[found[1]] = tuple(
                "object_key" if n == "key" and found[1] == "batches" else n for n in names
            )
    assert specified == LAYOUTS
    path = tmp_path / "meta.db"
    path.write_bytes(golden.data)
    checked = 0
    with contextlib.closing(sqlite3.connect(path)) as db:
        for table, columns in LAYOUTS.items():
            names = ", ".join("o.key" if c == "object_key" else f"t.{c}" for c in columns)
            join = " JOIN objects AS o ON o.id = t.object_id" if table == "batches" else ""
            for *values, crc in db.execute(f"SELECT {names}, t.crc FROM {table} AS t{join}"):
                assert crc32c.crc32c(msgpack.packb(values)) == crc, (table, values)
                checked += 1
    assert checked > 100  # every table, with more than one row in most


def test_pruning_raises_the_token_floor_row_whose_loss_is_damage(database: Database) -> None:
    """A drop deletes a lease's row and raises the token floor (the row named ``''``) in
    one transaction: the name taken again starts above every token it had. The floor
    row is checksummed and counted in ``lease_count`` like the others, so losing it
    (which would let pruned names start again at 1) is damage."""
    with database.open() as seq:
        assert seq.prune_leases(0) == ["released"]  # "held" is held
        assert (seq.lease_names(), seq.lease_floor()) == (["held"], 2)  # token 1, serial 2
        again = seq.acquire_lease("released", "worker-3", 60_000)
        assert again is not None and again.token == 3
        seq.release_lease(again)
        assert seq.prune_leases(0) == ["released"]
    floor = ("", None, 4, 2, 1)  # above token 3 and serial 4
    assert database.run(
        "SELECT name, holder, token, serial, duration_ms, crc FROM {t}leases WHERE name = ''", ()
    ) == [(*floor, row_crc(floor))]
    assert database.run("SELECT leases FROM {t}lease_count", ()) == [(2,)]  # held, floor
    database.run("DELETE FROM {t}leases WHERE name = ''", ())
    _expect_damage(database, "leases", lambda seq: seq.acquire_lease("released", "w", 1_000))
    _expect_damage(database, "leases", lambda seq: seq.lease_names())
