"""What only the PostgreSQL sequencer promises: its URL and schema option, versioned
migrations that tolerate concurrent opens, parameterised SQL, deadlock-free concurrent
commits from threads and processes, its connection pool, and clear errors when the
server is missing. (Everything every sequencer promises is in ``test_contract.py``.)

One PostgreSQL server runs per session (the ``postgres_server`` fixture); every test
works in schemas of its own, dropped afterwards."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from disklesslog.errors import (
    ConfigError,
    CorruptDataError,
    InvalidURL,
    LogClosedError,
    ProducerFenced,
    SequencerError,
    StreamNotFound,
    UnknownProducerId,
    UnknownProducerState,
)
from disklesslog.sequencers import BatchToCommit, CommitResult, ProducerExpiry, open_sequencer
from disklesslog.sequencers import postgres as pg_module
from disklesslog.sequencers import postgres_schema as pg_schema
from disklesslog.sequencers.postgres import (
    SCHEMA_VERSION,
    PostgresSequencer,
    parse_postgres_url,
    validate_schema_name,
)
from disklesslog.sequencers.rows import name_key, row_crc
from disklesslog.testing.contracts import FakeClock
from disklesslog.testing.servers.postgres import drop_schema

pytestmark = pytest.mark.postgres

SPAWN = multiprocessing.get_context("spawn")
STREAMS = tuple(f"s{i}" for i in range(6))
BIG = 1 << 40


@pytest.fixture
def new_schema(postgres_server: str) -> Iterator[Callable[[], str]]:
    """A factory of fresh schema names, all dropped after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(f"t_{uuid.uuid4().hex}")
        return made[-1]

    yield make
    for schema in made:
        drop_schema(postgres_server, schema)


@pytest.fixture
def schema_url(postgres_server: str, new_schema: Callable[[], str]) -> str:
    return f"{postgres_server}?schema={new_schema()}"


def _sql(url: str, query: str, params: tuple[Any, ...] = (), schema: str = "") -> list[Any]:
    """Run one statement on its own connection (``{s}`` is the quoted schema)."""
    with psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True) as conn:
        cursor = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params)
        return cursor.fetchall() if cursor.description else []


def _schema_of(url: str) -> str:
    return url.split("schema=")[1].split("&", maxsplit=1)[0]


# ------------------------------------------------------------------------ URLs


def test_url_options_are_split_from_libpq_options() -> None:
    options = parse_postgres_url(
        "postgresql://u:s3cret@db.example:5433/logs?schema=app_1&sslmode=disable"
        "&timeout=2.5&pool_size=3&application_name=a+b%20c"
    )
    assert (options.schema, options.pool_size, options.timeout) == ("app_1", 3, 2.5)
    assert options.conninfo == (
        "postgresql://u:s3cret@db.example:5433/logs?sslmode=disable"
        "&application_name=a+b%20c&connect_timeout=10"  # libpq's options as written
    )
    assert "s3cret" not in options.display_url and "u:***@db.example" in options.display_url
    defaults = parse_postgres_url("POSTGRES://h/d?connect_timeout=3")
    assert (defaults.schema, defaults.pool_size, defaults.timeout) == ("disklesslog", 10, 30.0)
    assert defaults.conninfo == "postgresql://h/d?connect_timeout=3"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h/d?schema=Upper",
        "postgresql://h/d?schema=",
        "postgresql://h/d?schema=1st",
        "postgresql://h/d?schema=pg_catalog",
        "postgresql://h/d?schema=a-b",
        'postgresql://h/d?schema=a"b',
        "postgresql://h/d?schema=a%3Bdrop",
        "postgresql://h/d?schema=" + "x" * 64,
        "postgresql://h/d?schema=%C3%A9",
        "postgresql://h/d?schema=a&schema=b",
        "postgresql://h/d?schema",
        "postgresql://h/d?pool_size=0",
        "postgresql://h/d?pool_size=many",
        "postgresql://h/d?timeout=-1",
        "postgresql://h/d?timeout=0",
        "postgresql://h/d?timeout=nan",
        "postgresql://h/d?not_a_libpq_option=1",
        "postgresql://h/d#part",
        "mysql://h/d",
        "h/d",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidURL):
        parse_postgres_url(url)


@pytest.mark.parametrize("name", ["disklesslog", "_x", "a1_b2", "x" * 63])
def test_good_schema_names(name: str) -> None:
    assert validate_schema_name(name) == name


def test_bad_schema_names_never_reach_the_server(postgres_server: str) -> None:
    with pytest.raises(InvalidURL, match="invalid schema name"):
        open_sequencer(f"{postgres_server}?schema=x%22%3B%20DROP%20SCHEMA%20public%20--")
    assert _sql(postgres_server, "SELECT 1 FROM pg_namespace WHERE nspname = 'public'") == [(1,)]


def test_open_sequencer_knows_both_schemes(postgres_server: str, new_schema: Any) -> None:
    schema = new_schema()
    rest = postgres_server.split("://", 1)[1]
    for scheme in ("postgresql", "postgres", "POSTGRESQL"):
        with open_sequencer(f"{scheme}://{rest}?schema={schema}") as seq:
            assert isinstance(seq, PostgresSequencer)
            assert seq.schema == schema


def test_the_password_is_masked(postgres_server: str) -> None:
    port = postgres_server.rsplit(":", 1)[1].split("/", maxsplit=1)[0]
    # trust authentication ignores the password: the URL still opens
    with PostgresSequencer(f"postgresql://app:hunter2@127.0.0.1:{port}/postgres") as seq:
        assert "hunter2" not in seq.url and "hunter2" not in repr(seq)
        assert "app:***@" in seq.url


# ------------------------------------------------------------------ migrations


def _versions(url: str) -> list[tuple[int, str]]:
    return _sql(
        url,
        "SELECT version, description FROM {s}.schema_version ORDER BY version",
        schema=_schema_of(url),
    )


def test_open_creates_the_schema_once(schema_url: str) -> None:
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
    with PostgresSequencer(schema_url) as seq:
        assert seq.list_streams() == ["a"]
    versions = _versions(schema_url)
    assert [v for v, _ in versions] == list(range(1, SCHEMA_VERSION + 1))


def test_state_survives_reopening(schema_url: str) -> None:
    with open_sequencer(schema_url) as seq:
        seq.create_stream("a", {"compression": "zstd"})
        producer = seq.init_producer("w")
        first = [BatchToCommit("a", 0, 10, 3, 3, 5, *producer, 0)]
        seq.commit("o1", first)
        seq.commit("o2", [BatchToCommit("a", 0, 10, 2, 2, 9)])
        seq.trim("a", 3)
        seq.commit_offsets("g", {"a": 4})
        seq.record_orphan("lost")
    with open_sequencer(schema_url) as seq:
        info = seq.stream_info("a")
        assert (info.start_offset, info.end_offset, info.config) == (3, 5, {"compression": "zstd"})
        assert [b.object_key for b in seq.find_batches("a", 3, 1000).batches] == ["o2"]
        assert seq.committed_offsets("g") == {"a": 4}
        assert sorted(seq.objects_to_delete(0)) == ["lost", "o1"]
        assert seq.offset_for_time("a", 6) == 3
        assert seq.commit("o1", first) == [CommitResult(0, True)]  # producer state kept
        assert seq.init_producer("w") == (producer[0], producer[1] + 1)


def test_concurrent_opens_from_threads_migrate_once(schema_url: str) -> None:
    barrier = threading.Barrier(8)
    opened: list[PostgresSequencer] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        barrier.wait()
        try:
            opened.append(PostgresSequencer(schema_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for seq in opened:
        seq.create_stream("a", {})
        seq.close()
    assert errors == [] and len(opened) == 8
    assert len(_versions(schema_url)) == SCHEMA_VERSION


def open_and_list(url: str) -> list[str]:
    """A process that opens the sequencer (racing the others) and lists its streams."""
    with PostgresSequencer(url) as seq:
        return seq.list_streams()


def test_concurrent_opens_from_processes_migrate_once(schema_url: str) -> None:
    with ProcessPoolExecutor(4, mp_context=SPAWN) as pool:
        assert list(pool.map(open_and_list, [schema_url] * 4)) == [[]] * 4
    assert len(_versions(schema_url)) == SCHEMA_VERSION


def test_a_newer_schema_is_refused_untouched(schema_url: str) -> None:
    PostgresSequencer(schema_url).close()
    schema = _schema_of(schema_url)
    _sql(
        schema_url,
        "INSERT INTO {s}.schema_version (version, description) VALUES (99, 'from the future')",
        schema=schema,
    )
    before = _versions(schema_url)
    with pytest.raises(SequencerError, match="newer disklesslog"):
        PostgresSequencer(schema_url)
    assert _versions(schema_url) == before


def test_a_new_migration_step_is_applied_on_open(
    schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
    step = SCHEMA_VERSION + 1
    migrations = {
        **pg_schema.MIGRATIONS,
        step: ("a test step", ("ALTER TABLE {s}.streams ADD COLUMN note text",)),
    }
    monkeypatch.setattr(pg_schema, "MIGRATIONS", migrations)
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", step)
    with PostgresSequencer(schema_url) as seq:
        assert seq.list_streams() == ["a"]
    with PostgresSequencer(schema_url) as seq:  # applied once, not again
        seq.create_stream("b", {})
    assert _versions(schema_url)[-1] == (step, "a test step")
    assert len(_versions(schema_url)) == step
    notes = _sql(schema_url, "SELECT note FROM {s}.streams", schema=_schema_of(schema_url))
    assert notes == [(None,), (None,)]


def test_a_failed_migration_leaves_nothing(
    schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {1: ("broken", (*pg_schema.MIGRATIONS[1][1], "THIS IS NOT SQL"))}
    monkeypatch.setattr(pg_schema, "MIGRATIONS", broken)
    with pytest.raises(SequencerError, match="could not prepare the sequencer schema"):
        PostgresSequencer(schema_url)
    schema = _schema_of(schema_url)
    assert _sql(schema_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []


def _old_schema(url: str, version: int, config: str = '{"compression": "zstd"}') -> None:
    """A schema as the release of ``version`` (1 or 2) left it: its migrations (history,
    kept as they were) and rows as it wrote them. Stream ``a`` was trimmed to 3 and
    compacted: batches 3..5 and 8..9, no batch for 6..7 nor for 10..11 before its end
    offset 12."""
    schema = _schema_of(url)
    statements: list[tuple[str, tuple[Any, ...]]] = [
        ("CREATE SCHEMA {s}", ()),
        (pg_schema.CREATE_VERSION_TABLE, ()),
    ]
    for step in range(1, version + 1):
        description, ddl = pg_schema.MIGRATIONS[step]
        statements += [(statement, ()) for statement in ddl]
        statements.append(
            (
                "INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
                (step, description),
            )
        )
    always = "OVERRIDING SYSTEM VALUE VALUES"
    statements += [
        (f"INSERT INTO {{s}}.streams {always} (1, 'a', %s, 3, 12, 40, 4)", (config,)),
        (f"INSERT INTO {{s}}.streams {always} (2, 'b', %s, 0, 0, NULL, 0)", ("{}",)),
        (f"INSERT INTO {{s}}.producers {always} (1, 'w', 0)", ()),
        ("INSERT INTO {s}.producer_streams VALUES (1, 1, '[0, [[0, 2, 3]]]')", ()),
        (f"INSERT INTO {{s}}.objects {always} (1, 'o1', 0, 1700000000.0)", ()),
        (f"INSERT INTO {{s}}.objects {always} (2, 'o2', 2, NULL)", ()),
        (f"INSERT INTO {{s}}.objects {always} (3, 'lost', 0, 1700000000.0)", ()),
        (f"INSERT INTO {{s}}.batches {always} (2, 1, 2, 0, 10, 3, 5, 20)", ()),
        (f"INSERT INTO {{s}}.batches {always} (3, 1, 2, 10, 10, 8, 9, 40)", ()),
        ("INSERT INTO {s}.time_index VALUES (1, 20, 6)", ()),
        ("INSERT INTO {s}.group_offsets VALUES ('g', 'a', 4)", ()),
    ]
    if version >= 2:
        statements.append(
            (
                f"INSERT INTO {{s}}.transactions {always} (1, 't1', 1700000000.0, %s)",
                ('{"a": [3, 6]}',),
            )
        )
    for table in ("streams", "producers", "objects", "batches"):
        statements.append(
            (
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), 10)",
                (f"{schema}.{table}",),
            )
        )
    for statement, params in statements:
        _sql(url, statement, params, schema=schema)


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_schema_is_migrated_with_checksums(schema_url: str, version: int) -> None:
    """Schema version 3 adds the row checksums and the columns that prove a stream's
    batches complete, filled in for every row already there; the old rows read as they
    did, and every later write and read checks them."""
    _old_schema(schema_url, version)
    with PostgresSequencer(schema_url, clock=lambda: 1_700_000_100.0) as seq:
        info = seq.stream_info("a")
        assert (info.start_offset, info.end_offset, info.config) == (3, 12, {"compression": "zstd"})
        page = seq.find_batches("a", 3, BIG)
        assert [(b.batch_id, b.object_key, b.base_offset, b.last_offset) for b in page.batches] == [
            (2, "o2", 3, 5),
            (3, "o2", 8, 9),
        ]
        assert [b.base_offset for b in seq.find_batches("a", 6, BIG).batches] == [8]
        assert seq.find_batches("a", 10, BIG).batches == []  # the gap at the end
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
        assert [b.base_offset for b in seq.find_batches("a", 10, BIG).batches] == [12]
        expected = {"a": (3, 6)} if version >= 2 else {}
        assert seq.commit_transaction("t1", []).ranges == expected
    assert [v for v, _ in _versions(schema_url)] == [1, 2, 3, 4, 5, 6, 7]
    schema = _schema_of(schema_url)
    assert _stream_counts(schema_url) == _ranges_of("a", "b")
    for table in ("streams", "producers", "producer_streams", "objects", "batches", "groups"):
        nulls = _sql(
            schema_url, f"SELECT count(*) FROM {{s}}.{table} WHERE crc IS NULL", schema=schema
        )
        assert nulls == [(0,)], table
    gaps = _sql(schema_url, "SELECT id, gap FROM {s}.batches ORDER BY id", schema=schema)
    assert gaps == [(2, 0), (3, 2), (11, 2)]


@pytest.mark.parametrize(
    ("config", "edit"),
    [
        ("{broken", None),
        ('["a list"]', None),
        ('{"compression": "zstd"}', "UPDATE {s}.batches SET base_offset = 2 WHERE id = 3"),
        ('{"compression": "zstd"}', "UPDATE {s}.batches SET stream_id = 7 WHERE id = 3"),
        ('{"compression": "zstd"}', "UPDATE {s}.batches SET object_id = 9 WHERE id = 3"),
        ('{"compression": "zstd"}', "UPDATE {s}.producer_streams SET state = '[0, '"),
        ('{"compression": "zstd"}', "UPDATE {s}.transactions SET ranges = 'x'"),
    ],
)
def test_an_old_schema_that_is_damaged_is_not_migrated(
    schema_url: str, config: str, edit: str | None
) -> None:
    """A migration checksums rows as they are, so it first refuses what cannot be right
    (JSON that does not parse, batches overlapping or without a stream or object):
    CorruptDataError naming the schema, which stays at its version."""
    _old_schema(schema_url, 2, config)
    schema = _schema_of(schema_url)
    if edit is not None:
        _sql(schema_url, edit, schema=schema)
    with pytest.raises(CorruptDataError) as caught:
        PostgresSequencer(schema_url)
    assert caught.value.source is not None and schema in caught.value.source
    assert [v for v, _ in _versions(schema_url)] == [1, 2]
    columns = _sql(
        schema_url,
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
        " AND table_name = 'streams'",
        (schema,),
    )
    assert ("crc",) not in columns


def _version_3_schema(url: str) -> None:
    """A schema as the release of version 3 left it (version 4 only adds
    ``stream_count``, version 5 ``leases`` and ``lease_count``, version 6 producers'
    ``used_ms``): streams ``a`` (one batch) and ``b``, no producer."""
    with PostgresSequencer(url) as seq:
        seq.create_stream("a", {})
        seq.create_stream("b", {})
        seq.commit("o1", [BatchToCommit("a", 0, 10, 2, 2, 5)])
    schema = _schema_of(url)
    _sql(url, "DROP TABLE {s}.stream_count", schema=schema)
    _sql(url, "DROP TABLE {s}.leases", schema=schema)
    _sql(url, "DROP TABLE {s}.lease_count", schema=schema)
    _sql(url, "ALTER TABLE {s}.producers DROP COLUMN used_ms", schema=schema)
    _sql(url, "DELETE FROM {s}.schema_version WHERE version >= 4", schema=schema)


def _version_5_schema(url: str, clock: FakeClock) -> tuple[int, int]:
    """A schema as the release of version 5 left it (version 6 adds each producer's
    ``used_ms`` and each state's last write to its JSON text): stream ``a`` with two
    records of named producer ``w``, whose ``(id, epoch)`` is returned."""
    with PostgresSequencer(url, clock=clock) as seq:
        seq.create_stream("a", {})
        producer = seq.init_producer("w")
        seq.commit("o1", [BatchToCommit("a", 0, 10, 2, 2, 5, *producer, 0)])
    schema = _schema_of(url)
    for stream_id, producer_id, state in _sql(
        url, "SELECT stream_id, producer_id, state FROM {s}.producer_streams", schema=schema
    ):
        old = json.dumps(json.loads(state)[:2])
        _sql(
            url,
            "UPDATE {s}.producer_streams SET state = %s, crc = %s",
            (old, row_crc((stream_id, producer_id, old))),
            schema=schema,
        )
    _sql(url, "ALTER TABLE {s}.producers DROP COLUMN used_ms", schema=schema)
    for row in _sql(url, "SELECT id, name, epoch FROM {s}.producers", schema=schema):
        _sql(url, "UPDATE {s}.producers SET crc = %s", (row_crc(row),), schema=schema)
    _count_streams_in_one_row(url)
    _sql(url, "DELETE FROM {s}.schema_version WHERE version >= 6", schema=schema)
    return producer


def test_a_version_5_schema_gets_producer_times(schema_url: str) -> None:
    """Schema version 6 gives every producer and producer state of a version 5 schema
    the migration's time, under checksums: the state still deduplicates, nothing
    expires before a whole window has passed since the upgrade, and then it does."""
    clock = FakeClock()
    producer = _version_5_schema(schema_url, clock)
    clock.advance(3600)
    with PostgresSequencer(schema_url, clock=clock) as seq:
        retry = seq.commit("o1", [BatchToCommit("a", 0, 10, 2, 2, 5, *producer, 0)])
        assert retry == [CommitResult(0, duplicate=True)]
        assert seq.expire_producers(60_000) == ProducerExpiry()
        clock.advance(61)
        assert seq.expire_producers(60_000) == ProducerExpiry(states=1, producers=1)
        again = seq.init_producer("w")
        assert again[0] > producer[0] and again[1] == 0  # the id is not issued again
    assert [v for v, _ in _versions(schema_url)] == [1, 2, 3, 4, 5, 6, 7]
    rows = _sql(
        schema_url,
        "SELECT id, name, epoch, used_ms, crc FROM {s}.producers",
        schema=_schema_of(schema_url),
    )
    assert [r[:4] for r in rows] == [(again[0], "w", 0, 1_700_003_661_000)]
    assert row_crc(rows[0][:4]) == rows[0][4]


def test_a_damaged_version_5_producer_is_not_migrated(schema_url: str) -> None:
    clock = FakeClock()
    _version_5_schema(schema_url, clock)
    _sql(schema_url, "UPDATE {s}.producers SET epoch = 7", schema=_schema_of(schema_url))
    with pytest.raises(CorruptDataError, match="producers"):
        PostgresSequencer(schema_url, clock=clock)
    assert [v for v, _ in _versions(schema_url)] == [1, 2, 3, 4, 5]


def test_a_version_3_schema_gets_its_streams_counted(schema_url: str) -> None:
    """Schema version 4 counts the streams already there; creates and deletes keep
    the count."""
    _version_3_schema(schema_url)
    with PostgresSequencer(schema_url) as seq:
        assert seq.list_streams() == ["a", "b"]
        seq.create_stream("c", {})
        seq.delete_stream("b")
        assert seq.commit("o2", [BatchToCommit("a", 0, 10, 1, 1, 6)]) == [CommitResult(2)]
        assert seq.acquire_lease("m", "w", 1_000) is not None  # version 5 made its table
    assert [v for v, _ in _versions(schema_url)] == [1, 2, 3, 4, 5, 6, 7]
    assert _stream_counts(schema_url) == _ranges_of("a", "c")


def test_a_version_3_schema_with_a_lost_stream_is_not_migrated(schema_url: str) -> None:
    """A stream whose row is already gone when version 4 would count the streams still
    has batch rows: counting what is there would bless the loss, so the migration is
    refused (CorruptDataError naming the schema and table) and nothing changes."""
    _version_3_schema(schema_url)
    schema = _schema_of(schema_url)
    (stream_id,) = _sql(schema_url, "SELECT id FROM {s}.streams WHERE name = 'a'", schema=schema)[0]
    _sql(schema_url, "DELETE FROM {s}.streams WHERE name = 'a'", schema=schema)
    with pytest.raises(CorruptDataError) as caught:
        PostgresSequencer(schema_url)
    source = caught.value.source or ""
    assert schema in source and source.endswith(f"table streams row id {stream_id}"), source
    assert [v for v, _ in _versions(schema_url)] == [1, 2, 3]
    tables = _sql(
        schema_url,
        "SELECT 1 FROM information_schema.tables WHERE table_schema = %s"
        " AND table_name = 'stream_count'",
        (schema,),
    )
    assert tables == []


def _stream_counts(url: str) -> dict[int, int]:
    """The ranges of name keys ``stream_count`` counts streams in (schema version 7),
    each with its count; every one of its rows checked for being there, once, with the
    spec's checksum."""
    rows = _sql(url, "SELECT id, streams, crc FROM {s}.stream_count", schema=_schema_of(url))
    assert sorted(r[0] for r in rows) == list(range(pg_schema.STREAM_COUNT_BUCKETS))
    assert all(crc == row_crc((count,)) for _, count, crc in rows)
    return {bucket: count for bucket, count, _ in rows if count}


def _ranges_of(*names: str) -> dict[int, int]:
    """What :func:`_stream_counts` gives for the streams ``names``."""
    counts: dict[int, int] = {}
    for name in names:
        bucket = pg_schema.name_bucket(name_key(name))
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts


def _in_other_ranges(name: str, count: int) -> list[str]:
    """``count`` stream names whose name keys are in ranges other than ``name``'s."""
    taken = pg_schema.name_bucket(name_key(name))
    found = (f"other-{i}" for i in range(10_000))
    return [n for n in found if pg_schema.name_bucket(name_key(n)) != taken][:count]


def _version_6_schema(url: str, names: tuple[str, ...]) -> None:
    """A schema as the release of version 6 left it (version 7 splits ``stream_count``'s
    one row into one per range of name keys): the streams ``names``, counted in one
    row of id 0 that the table allows alone, and ``gone`` created and deleted."""
    with PostgresSequencer(url) as seq:
        for name in (*names, "gone"):
            seq.create_stream(name, {})
        seq.commit("o1", [BatchToCommit(names[0], 0, 10, 2, 2, 5)])
        seq.delete_stream("gone")
    _count_streams_in_one_row(url)
    _sql(url, "DELETE FROM {s}.schema_version WHERE version >= 7", schema=_schema_of(url))


def _count_streams_in_one_row(url: str) -> None:
    """``stream_count`` as schema versions 4 to 6 have it: one row, id 0, counting every
    stream, the only id the table allows."""
    schema = _schema_of(url)
    ((total,),) = _sql(url, "SELECT count(*) FROM {s}.streams", schema=schema)
    _sql(url, "DELETE FROM {s}.stream_count", schema=schema)
    _sql(
        url,
        "ALTER TABLE {s}.stream_count DROP CONSTRAINT stream_count_id_check,"
        " ADD CONSTRAINT stream_count_id_check CHECK (id = 0)",
        schema=schema,
    )
    _sql(
        url,
        "INSERT INTO {s}.stream_count (id, streams, crc) VALUES (0, %s, %s)",
        (total, row_crc((total,))),
        schema=schema,
    )


def test_a_version_6_schema_gets_its_streams_counted_by_range(schema_url: str) -> None:
    """Schema version 7 counts the streams of a version 6 schema per range of name
    keys, from the rows there; creates and deletes keep the ranges' counts, and the
    old single row's id is no longer the only one the table allows."""
    names = ("a", "b", *_in_other_ranges("a", 3))
    _version_6_schema(schema_url, names)
    with PostgresSequencer(schema_url) as seq:
        assert seq.list_streams() == sorted(names)
        assert seq.find_batches("a", 0, BIG).batches[0].last_offset == 1
        seq.create_stream("c", {})
        seq.delete_stream("b")
        with pytest.raises(StreamNotFound):
            seq.stream_info("gone")
    assert [v for v, _ in _versions(schema_url)] == [1, 2, 3, 4, 5, 6, 7]
    assert _stream_counts(schema_url) == _ranges_of("a", "c", *names[2:])


@pytest.mark.parametrize(
    ("edit", "table"),
    [
        ("DELETE FROM {s}.streams WHERE name = 'b'", "streams"),
        (f"UPDATE {{s}}.stream_count SET streams = 4, crc = {row_crc((4,))}", "streams"),
        ("UPDATE {s}.stream_count SET crc = crc + 1", "stream_count"),
        ("DELETE FROM {s}.stream_count", "stream_count"),
        ("UPDATE {s}.streams SET name_key = name_key + 1 WHERE name = 'b'", "streams"),
        ("UPDATE {s}.streams SET end_offset = 7 WHERE name = 'b'", "streams"),
    ],
)
def test_a_damaged_version_6_schema_is_not_counted_by_range(
    schema_url: str, edit: str, table: str
) -> None:
    """What version 7 counts must be right first: a lost stream, a count or checksum
    that does not match the rows, a damaged name key or stream row refuse the
    migration (CorruptDataError naming the schema and table) and change nothing."""
    _version_6_schema(schema_url, ("a", "b", "c"))
    schema = _schema_of(schema_url)
    before = _sql(schema_url, "SELECT * FROM {s}.stream_count", schema=schema)
    _sql(schema_url, edit, schema=schema)
    after_edit = _sql(schema_url, "SELECT * FROM {s}.stream_count", schema=schema)
    with pytest.raises(CorruptDataError) as caught:
        PostgresSequencer(schema_url)
    source = caught.value.source or ""
    assert schema in source and f"table {table} " in source, source
    assert [v for v, _ in _versions(schema_url)] == [1, 2, 3, 4, 5, 6]
    assert _sql(schema_url, "SELECT * FROM {s}.stream_count", schema=schema) == after_edit
    assert len(before) == 1


def test_a_lookup_that_finds_no_stream_counts_its_range(schema_url: str) -> None:
    """A stream's row lost: every call on it, and a listing, report the damage (as
    with one count for all streams), while streams whose names are in other ranges of
    name keys are created and found as usual: a lookup that misses counts the streams
    of its own range only, not the whole table."""
    others = _in_other_ranges("lost", 2)
    with PostgresSequencer(schema_url) as seq:
        for name in ("lost", others[0]):
            seq.create_stream(name, {})
    _sql(schema_url, "DELETE FROM {s}.streams WHERE name = 'lost'", schema=_schema_of(schema_url))
    with PostgresSequencer(schema_url) as seq:
        for call in (
            lambda: seq.stream_info("lost"),
            lambda: seq.create_stream("lost", {}),
            seq.list_streams,
        ):
            with pytest.raises(CorruptDataError, match="table streams"):
                call()
        assert seq.create_stream(others[1], {}).end_offset == 0
        assert seq.stream_info(others[0]).name == others[0]
    assert _sql(
        schema_url,
        "SELECT count(*) FROM {s}.streams WHERE name = 'lost'",
        schema=_schema_of(schema_url),
    ) == [(0,)]


def test_a_foreign_schema_is_refused(postgres_server: str, new_schema: Any) -> None:
    schema = new_schema()
    _sql(postgres_server, "CREATE SCHEMA {s}", schema=schema)
    _sql(postgres_server, "CREATE TABLE {s}.customers (id int)", schema=schema)
    with pytest.raises(SequencerError, match="not a disklesslog sequencer"):
        PostgresSequencer(f"{postgres_server}?schema={schema}")


# --------------------------------------------------------------- parameterisation

HOSTILE = [
    "'; DROP TABLE streams; --",
    'x" OR "1"="1',
    "%s %(name)s {s} {} $1 ?",
    "back\\slash\ttab\nnewline",
    "ünïcödé ✓ 日本",
    "\u0000 in JSON is escaped",
]


def test_hostile_values_are_stored_verbatim(schema_url: str) -> None:
    with PostgresSequencer(schema_url) as seq:
        config = {value: value for value in HOSTILE} | {"nested": {"list": HOSTILE}}
        assert seq.create_stream("a-b.c_d", config).config == config
        assert seq.stream_info("a-b.c_d").config == config
        ids = {}
        for name in HOSTILE[:-1]:
            ids[name] = seq.init_producer(name)
            assert seq.init_producer(name) == (ids[name][0], ids[name][1] + 1)
        assert len({pid for pid, _ in ids.values()}) == len(ids)
        keys = [f"objects/{value}" for value in HOSTILE[:-1]]
        for n, key in enumerate(keys):
            seq.commit(key, [BatchToCommit("a-b.c_d", n, 1, 1, 1, n)])
        found = seq.find_batches("a-b.c_d", 0, BIG).batches
        assert [b.object_key for b in found] == keys
        seq.commit_offsets("group.-_", {"a-b.c_d": 3})
        assert seq.committed_offsets("group.-_") == {"a-b.c_d": 3}
        seq.trim("a-b.c_d", len(keys))
        assert sorted(seq.objects_to_delete(0)) == sorted(keys)
        seq.forget_objects(keys)
        assert seq.objects_to_delete(0) == []
        assert seq.list_streams() == ["a-b.c_d"]  # every table is still there


def test_nul_characters_are_refused_with_a_typed_error(schema_url: str) -> None:
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
        with pytest.raises(ConfigError, match="NUL"):
            seq.init_producer("a\x00b")
        with pytest.raises(ConfigError, match="NUL"):
            seq.commit("key\x00", [BatchToCommit("a", 0, 1, 1, 1, 0)])
        with pytest.raises(ConfigError, match="NUL"):
            seq.record_orphan("key\x00")
        seq.forget_objects(["key\x00"])  # nothing of that name can exist
        assert seq.stream_info("a").end_offset == 0


def test_numbers_beyond_64_bits_are_refused(schema_url: str) -> None:
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
        with pytest.raises(ConfigError):
            seq.commit("o", [BatchToCommit("a", 1 << 70, 1, 1, 1, 0)])
        with pytest.raises(ConfigError):
            seq.offset_for_time("a", 1 << 70)
        assert seq.stream_info("a").end_offset == 0


# ------------------------------------------------------------------ concurrency


Run = list[tuple[str, list[str], list[CommitResult]]]
"""Per commit: its object key, the streams of its batches, and the answer."""


def commit_run(seq: PostgresSequencer, worker: int, commits: int) -> Run:
    """Commits of one batch on each of a random 2-4 of :data:`STREAMS`, in a random order
    (so concurrent commits touch overlapping streams in different orders), random record
    counts; every fifth commit is sent twice and must come back as duplicates.
    ``position`` carries the commit number so the check can see each producer's order."""
    rng = random.Random(worker)
    producer = seq.init_producer(f"worker-{worker}")
    next_seq = dict.fromkeys(STREAMS, 0)
    done = []
    for n in range(commits):
        batches = []
        for stream in rng.sample(STREAMS, rng.randint(2, 4)):
            records = rng.randint(1, 3)
            batches.append(
                BatchToCommit(stream, n, 10, records, records, n, *producer, next_seq[stream])
            )
            next_seq[stream] += records
        key = f"w{worker}-{n:04d}"
        results = seq.commit(key, batches)
        if n % 5 == 0:
            assert seq.commit(key, batches) == [CommitResult(r.base_offset, True) for r in results]
        done.append((key, [b.stream for b in batches], results))
    return done


def _check_dense(seq: PostgresSequencer, runs: list[Run]) -> None:
    """Every stream's batches tile its offsets (no gap, no overlap), each producer's
    batches are in its commit order, and every answered offset is where its batch is."""
    answered = [
        (key, stream, result.base_offset)
        for run in runs
        for key, streams, results in run
        for stream, result in zip(streams, results)
    ]
    stored = []
    for stream in STREAMS:
        page = seq.find_batches(stream, 0, BIG)
        expected_base = 0
        last_commit: dict[str, int] = {}
        for b in page.batches:
            assert b.base_offset == expected_base
            expected_base = b.last_offset + 1
            worker = b.object_key.split("-")[0]
            assert b.position > last_commit.get(worker, -1)
            last_commit[worker] = b.position
            stored.append((b.object_key, stream, b.base_offset))
        assert page.end_offset == expected_base
    assert sorted(stored) == sorted(answered)  # retries stored nothing twice


def test_concurrent_commits_from_threads(schema_url: str) -> None:
    threads, commits = 8, 60
    with PostgresSequencer(schema_url) as seq:
        for stream in STREAMS:
            seq.create_stream(stream, {})
        runs: dict[int, Run] = {}
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads)

        def work(worker: int) -> None:
            barrier.wait()
            try:
                runs[worker] = commit_run(seq, worker, commits)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert errors == []
        assert len(runs) == threads
        _check_dense(seq, list(runs.values()))


def expiring_run(seq: PostgresSequencer, worker: int, commits: int) -> tuple[Run, set[int]]:
    """:func:`commit_run` (without resends) as a writer runs it while its producer state
    may expire under it: a stream whose state is gone is numbered from 0 again, a
    producer that is gone is initialised again under its name, and the commit is sent
    again (nothing of a refused commit is stored). Returns the run and every producer
    id the worker was given."""
    rng = random.Random(worker)
    producer = seq.init_producer(f"worker-{worker}")
    ids = {producer[0]}
    next_seq = dict.fromkeys(STREAMS, 0)
    done: Run = []
    for n in range(commits):
        plan = [(s, rng.randint(1, 3)) for s in rng.sample(STREAMS, rng.randint(2, 4))]
        key = f"w{worker}-{n:04d}"
        for _ in range(50):
            batches = [
                BatchToCommit(stream, n, 10, records, records, n, *producer, next_seq[stream])
                for stream, records in plan
            ]
            try:
                results = seq.commit(key, batches)
            except UnknownProducerState as exc:
                next_seq[exc.stream] = 0
                continue
            except UnknownProducerId:
                producer = seq.init_producer(f"worker-{worker}")
                ids.add(producer[0])
                next_seq = dict.fromkeys(STREAMS, 0)
                continue
            break
        else:
            raise AssertionError(f"{key}: refused 50 times")
        assert not any(r.duplicate for r in results)
        for stream, records in plan:
            next_seq[stream] += records
        done.append((key, [stream for stream, _ in plan], results))
    return done, ids


def test_producer_expiry_racing_concurrent_commits_loses_and_repeats_nothing(
    schema_url: str,
) -> None:
    """Expiry with a 1 ms window, over and over, while 6 threads commit with named
    producers: every commit is either refused whole (and sent again by its writer) or
    stored once; the streams stay dense; no producer id is issued twice; expiry really
    removed states meanwhile; and every producer ever issued is dropped exactly once
    (during the race or by a last pass), every row verifying when read."""
    threads, commits = 6, 40
    with PostgresSequencer(schema_url) as seq:
        for stream in STREAMS:
            seq.create_stream(stream, {})
        outcomes: dict[int, tuple[Run, set[int]]] = {}
        errors: list[BaseException] = []
        expired = [ProducerExpiry()]
        running = threading.Event()
        running.set()

        def expire() -> None:
            try:
                while running.is_set():
                    got = seq.expire_producers(1)
                    expired[0] = ProducerExpiry(
                        expired[0].states + got.states, expired[0].producers + got.producers
                    )
            except BaseException as exc:
                errors.append(exc)

        def work(worker: int) -> None:
            try:
                outcomes[worker] = expiring_run(seq, worker, commits)
            except BaseException as exc:
                errors.append(exc)

        expirer = threading.Thread(target=expire)
        expirer.start()
        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        running.clear()
        expirer.join(60)
        assert errors == []
        assert len(outcomes) == threads
        assert expired[0].states > 0  # states expired while their producers committed
        _check_dense(seq, [run for run, _ in outcomes.values()])
        issued = [pid for _, ids in outcomes.values() for pid in ids]
        assert len(issued) == len(set(issued))
        time.sleep(0.01)
        rest = seq.expire_producers(1)  # reads and verifies every row left, then drops it
        assert expired[0].producers + rest.producers == len(issued)
        assert seq.expire_producers(0, dry_run=True) == ProducerExpiry()


def _barrier(directory: Path, worker: int, workers: int) -> None:
    """Wait until every worker process is up, so their commits really interleave."""
    (directory / f"ready-{worker}").touch()
    deadline = time.monotonic() + 60
    while len(list(directory.glob("ready-*"))) < workers and time.monotonic() < deadline:
        time.sleep(0.005)


def commit_process(
    url: str, directory: str, worker: int, workers: int, commits: int
) -> tuple[float, float, Run]:
    with PostgresSequencer(url) as seq:
        seq.list_streams()  # connected before the start line
        _barrier(Path(directory), worker, workers)
        started = time.time()
        done = commit_run(seq, worker, commits)
        return started, time.time(), done


def test_concurrent_commits_from_processes(schema_url: str, tmp_path: Path) -> None:
    workers, commits = 4, 100
    with PostgresSequencer(schema_url) as seq:
        for stream in STREAMS:
            seq.create_stream(stream, {})
        with ProcessPoolExecutor(workers, mp_context=SPAWN) as pool:
            outcomes = list(
                pool.map(
                    commit_process,
                    [schema_url] * workers,
                    [str(tmp_path)] * workers,
                    range(workers),
                    [workers] * workers,
                    [commits] * workers,
                )
            )
        assert max(s for s, _, _ in outcomes) < min(e for _, e, _ in outcomes)  # overlapped
        _check_dense(seq, [run for _, _, run in outcomes])


def _zombie(
    seq: PostgresSequencer, producer: tuple[int, int], stream: str, stopped: list[BaseException]
) -> None:
    """Commit as ``producer`` until an error (fenced, expected) stops it; keep the error."""
    n = 0
    while True:
        try:
            seq.commit(
                f"{stream}-{uuid.uuid4().hex}", [BatchToCommit(stream, 0, 1, 1, 1, 0, *producer, n)]
            )
        except BaseException as exc:
            stopped.append(exc)
            return
        n += 1


def test_a_fenced_producer_cannot_commit_after_the_new_epoch(schema_url: str) -> None:
    """Commits share-lock their producer's row and init_producer updates it, so each
    waits for the other: every commit of the old epoch that succeeds is committed
    before the new epoch is handed out, none after (the end offsets read right after
    init_producer returns are final). Three zombies race it, five times."""
    with PostgresSequencer(schema_url) as seq:
        streams = ["z0", "z1", "z2"]
        for stream in streams:
            seq.create_stream(stream, {})
        for _ in range(5):
            old = seq.init_producer("w")
            stopped: list[BaseException] = []
            threads = [
                threading.Thread(target=_zombie, args=(seq, old, stream, stopped))
                for stream in streams
            ]
            for thread in threads:
                thread.start()
            time.sleep(0.02)
            new = seq.init_producer("w")
            ends = [seq.stream_info(stream).end_offset for stream in streams]
            for thread in threads:
                thread.join(30)
            assert new == (old[0], old[1] + 1)
            assert [type(exc) for exc in stopped] == [ProducerFenced] * 3
            assert [seq.stream_info(stream).end_offset for stream in streams] == ends


# ------------------------------------------------------------------- find_batches


def test_pages_longer_than_the_first_statement(schema_url: str) -> None:
    rows = pg_module._FIRST_PAGE_ROWS
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
        seq.commit("o", [BatchToCommit("a", 10 * i, 10, 2, 2, i) for i in range(3 * rows)])
        everything = seq.find_batches("a", 0, BIG)
        assert [b.base_offset for b in everything.batches] == list(range(0, 6 * rows, 2))
        assert (everything.start_offset, everything.end_offset) == (0, 6 * rows)
        for start, max_bytes, count in [(1, 10 * rows, rows), (4, 10 * rows + 9, rows), (5, 15, 1)]:
            page = seq.find_batches("a", start, max_bytes)
            assert len(page.batches) == count
            assert page.batches[0].base_offset == start - start % 2
        page = seq.find_batches("a", 2, 10 * (rows + 5))
        assert [b.base_offset for b in page.batches] == list(range(2, 2 + 2 * (rows + 5), 2))
        seq.trim("a", 4 * rows)
        assert len(seq.find_batches("a", 4 * rows, BIG).batches) == rows


def test_time_index_is_sparse(schema_url: str) -> None:
    interval = pg_module.TIME_INDEX_INTERVAL
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
        seq.commit("o", [BatchToCommit("a", 0, 1, 1, 1, t) for t in range(4 * interval)])
        rows = _sql(
            schema_url,
            "SELECT max_timestamp, next_offset FROM {s}.time_index ORDER BY 1",
            schema=_schema_of(schema_url),
        )
        assert rows == [(i * interval - 1, i * interval) for i in (1, 2, 3, 4)]
        assert seq.offset_for_time("a", 40) == 40
        # Two entries of one running maximum in one commit: one row, the later offset.
        seq.commit("p", [BatchToCommit("a", 0, 1, 1, 1, 7) for _ in range(2 * interval)])
        rows = _sql(
            schema_url,
            "SELECT max_timestamp, next_offset FROM {s}.time_index ORDER BY 1",
            schema=_schema_of(schema_url),
        )
        assert rows[-1] == (4 * interval - 1, 6 * interval)
        assert seq.offset_for_time("a", 8) == 8


# ------------------------------------------------------------------ connections


def _backends(url: str, application: str) -> int:
    rows = _sql(
        url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application,)
    )
    return int(rows[0][0])


def test_close_closes_the_pool(schema_url: str) -> None:
    application = f"dl_{uuid.uuid4().hex[:12]}"
    seq = PostgresSequencer(f"{schema_url}&application_name={application}&pool_size=4")
    seq.create_stream("a", {})
    barrier = threading.Barrier(4)

    def busy() -> None:
        barrier.wait()
        for _ in range(20):
            seq.stream_info("a")

    threads = [threading.Thread(target=busy) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= _backends(schema_url, application) <= 4
    seq.close()
    seq.close()
    deadline = time.monotonic() + 10
    while _backends(schema_url, application) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _backends(schema_url, application) == 0
    with pytest.raises(LogClosedError):
        seq.list_streams()


def test_close_while_other_threads_commit_and_read(schema_url: str) -> None:
    seq = PostgresSequencer(schema_url)
    seq.create_stream("s", {})
    outcomes: list[str] = []

    def work(n: int) -> None:
        pid, epoch = seq.init_producer(None)
        try:
            for i in range(100_000):
                if n % 2:
                    seq.find_batches("s", 0, 1 << 20)
                else:
                    seq.commit(
                        f"objects/{n}-{i}", [BatchToCommit("s", 0, 10, 1, 1, 1, pid, epoch, i)]
                    )
        except LogClosedError:
            outcomes.append("closed")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    seq.close()
    for thread in threads:
        thread.join(30)
    assert outcomes == ["closed"] * 4


def test_a_missing_server_is_reported_quickly(postgres_server: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there
    url = f"postgresql://app@127.0.0.1:{port}/postgres?connect_timeout=2"
    started = time.monotonic()
    with pytest.raises(SequencerError, match="cannot connect to PostgreSQL at"):
        open_sequencer(url)
    assert time.monotonic() - started < 5


def test_an_unknown_database_is_reported(postgres_server: str) -> None:
    url = postgres_server.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(SequencerError, match="no_such_database"):
        PostgresSequencer(url)


def test_dropped_connections_are_replaced(schema_url: str) -> None:
    application = f"dl_{uuid.uuid4().hex[:12]}"
    with PostgresSequencer(f"{schema_url}&application_name={application}") as seq:
        seq.create_stream("a", {})
        for round_no in range(3):
            killed = _sql(
                schema_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (application,),
            )
            assert killed and all(ok for (ok,) in killed)
            # Nothing was in flight: the call runs again on a new connection.
            assert seq.commit(f"o{round_no}", [BatchToCommit("a", 0, 1, 1, 1, 0)]) == [
                CommitResult(round_no)
            ]
        assert seq.stream_info("a").end_offset == 3


def test_a_held_row_lock_times_out_cleanly(schema_url: str) -> None:
    schema = _schema_of(schema_url)
    with PostgresSequencer(f"{schema_url}&timeout=0.3") as seq:
        seq.create_stream("a", {})
        with psycopg.connect(schema_url.split("?", maxsplit=1)[0]) as blocker:
            blocker.execute(
                sql.SQL("SELECT * FROM {}.streams WHERE name = 'a' FOR UPDATE").format(
                    sql.Identifier(schema)
                )
            )
            started = time.monotonic()
            with pytest.raises(SequencerError, match="row lock"):
                seq.commit("o1", [BatchToCommit("a", 0, 10, 1, 1, 0)])
            assert time.monotonic() - started < 5
            assert seq.stream_info("a").end_offset == 0  # readers are not blocked
            blocker.rollback()
        assert seq.commit("o1", [BatchToCommit("a", 0, 10, 1, 1, 0)]) == [CommitResult(0)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() of a threaded process
def test_a_forked_child_uses_its_own_connections(schema_url: str) -> None:
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                result = seq.commit("child", [BatchToCommit("a", 0, 1, 1, 1, 0)])
                code = 0 if result == [CommitResult(0)] else 2
            finally:
                os.write(write, bytes([code]))
                os._exit(code)
        os.close(write)
        assert os.read(read, 1) == b"\x00"
        os.close(read)
        assert os.waitpid(pid, 0)[1] == 0
        # The parent's pooled connections were left alone and still work.
        assert seq.commit("parent", [BatchToCommit("a", 0, 1, 1, 1, 0)]) == [CommitResult(1)]
        assert [b.object_key for b in seq.find_batches("a", 0, BIG).batches] == ["child", "parent"]


def test_deadlocks_and_serialization_failures_are_retried(
    schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
        real = PostgresSequencer._attempt
        failures = [psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure]

        def flaky(self: PostgresSequencer, *args: Any) -> Any:
            if failures:
                raise failures.pop(0)("injected")
            return real(self, *args)

        monkeypatch.setattr(PostgresSequencer, "_attempt", flaky)
        assert seq.commit("o1", [BatchToCommit("a", 0, 1, 1, 1, 0)]) == [CommitResult(0)]
        assert failures == []

        monkeypatch.setattr(pg_module, "_RETRY_ATTEMPTS", 3)
        failures.extend([psycopg.errors.DeadlockDetected] * 3)
        with pytest.raises(SequencerError, match="gave up after 3 conflicting"):
            seq.commit("o2", [BatchToCommit("a", 0, 1, 1, 1, 0)])
        assert seq.stream_info("a").end_offset == 1


def test_a_connection_lost_during_commit_is_reported_as_unknown(
    schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PostgresSequencer(schema_url) as seq:
        seq.create_stream("a", {})
        real = pg_module._command

        def dying(conn: psycopg.Connection[Any], command: bytes) -> None:
            if command == b"COMMIT":  # the server goes away as the COMMIT is sent
                with contextlib.suppress(psycopg.OperationalError):
                    conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            real(conn, command)

        monkeypatch.setattr(pg_module, "_command", dying)
        with pytest.raises(SequencerError, match="may or may not have been applied"):
            seq.commit("o1", [BatchToCommit("a", 0, 1, 1, 1, 0)])
        monkeypatch.setattr(pg_module, "_command", real)
        assert seq.stream_info("a").end_offset == 0  # here it was not: the server rolled back
        assert seq.commit("o1", [BatchToCommit("a", 0, 1, 1, 1, 0)]) == [CommitResult(0)]
