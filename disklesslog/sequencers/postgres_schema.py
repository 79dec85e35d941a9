"""The PostgreSQL sequencer's tables: their history as numbered migrations, and bringing
a schema up to date (:func:`apply_migrations`) inside the caller's transaction.

Each applied step is recorded in ``schema_version``, all in one transaction under an
advisory lock keyed by the schema name, so processes opening together take turns and a
failed migration leaves nothing. A schema written by a newer disklesslog is refused
untouched, one holding tables that are not a sequencer's too. Step 3 adds the row
checksums and the columns that prove a stream's batches complete
(:mod:`~disklesslog.sequencers.rows`) and fills them for the rows already there; step 4
the checksummed count of the streams (``stream_count``), from the rows already there;
step 5 the ``leases`` table (empty) and the checksummed count of its rows
(``lease_count``, 0); step 6 the time of each producer's last use (``used_ms``) and of
each producer state's last write (in its JSON text), the migration's time for the rows
already there; step 7 splits ``stream_count`` into one row per range of name keys
(:func:`name_bucket`), so that a lookup that finds no stream counts the streams of its
range, not all of them: PostgreSQL's ``count(*)`` visits every row, and creating n
streams cost O(n²).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..errors import SequencerError
from .common import ranges_from_json
from .rows import (
    LAYOUTS,
    STREAM_TABLES,
    StateCache,
    check_stream_count,
    damaged_row,
    json_value,
    name_key,
    new_stream_row,
    row_crc,
    tile_existing,
)

__all__ = [
    "CREATE_VERSION_TABLE",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "STREAM_COUNT_BUCKETS",
    "apply_migrations",
    "bucket_keys",
    "name_bucket",
]

Connection = psycopg.Connection[Any]

SCHEMA_VERSION = 7
"""Version of the tables this code writes; a newer schema is refused, an older migrated."""

_BUCKET_BITS = 12
STREAM_COUNT_BUCKETS = 1 << _BUCKET_BITS
"""Rows of ``stream_count`` since schema version 7: row ``b`` counts the streams whose
name key (:func:`~disklesslog.sequencers.rows.name_key`, 32 bits) has ``b`` as its top
12 bits. A lookup that finds no stream counts one range through the name-key index:
about 25 rows with 100,000 streams."""
_BUCKET_SHIFT = 32 - _BUCKET_BITS


def name_bucket(key: int) -> int:
    """The ``stream_count`` row counting the stream whose name key is ``key``."""
    return key >> _BUCKET_SHIFT


def bucket_keys(bucket: int) -> tuple[int, int]:
    """The name keys row ``bucket`` of ``stream_count`` counts: ``[low, high)``."""
    return bucket << _BUCKET_SHIFT, (bucket + 1) << _BUCKET_SHIFT


MIGRATIONS: dict[int, tuple[str, tuple[str, ...]]] = {
    1: (
        "streams, producers, objects, batches, time index, consumer-group offsets",
        (
            # fillfactor: every commit rewrites its stream and producer-state rows; room
            # on the page keeps those updates HOT (no index writes, pruned in place).
            "CREATE TABLE {s}.streams ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"  # never reused
            ' name text COLLATE "C" NOT NULL UNIQUE,'  # C: sorts like Python, locks in order
            " config text NOT NULL,"  # JSON text: jsonb would refuse \\u0000 in values
            " start_offset bigint NOT NULL DEFAULT 0,"
            " end_offset bigint NOT NULL DEFAULT 0,"
            " max_timestamp bigint,"  # running max of committed batches (time index)
            " unindexed bigint NOT NULL DEFAULT 0"  # batches since the last time-index entry
            ") WITH (fillfactor = 50)",
            "CREATE TABLE {s}.producers ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            ' name text COLLATE "C" UNIQUE,'  # NULL for anonymous producers
            " epoch bigint NOT NULL)",
            "CREATE TABLE {s}.producer_streams ("
            " stream_id bigint NOT NULL,"
            " producer_id bigint NOT NULL,"
            " state text NOT NULL,"  # ProducerStreamState.to_json()
            " PRIMARY KEY (stream_id, producer_id)"
            ") WITH (fillfactor = 50)",
            "CREATE TABLE {s}.objects ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            ' key text COLLATE "C" NOT NULL UNIQUE,'
            " live_batches bigint NOT NULL,"
            " dead_since double precision)",  # NULL while a live batch is in it
            "CREATE INDEX objects_dead ON {s}.objects (dead_since) WHERE dead_since IS NOT NULL",
            "CREATE TABLE {s}.batches ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"  # stale ids stay stale
            " stream_id bigint NOT NULL,"
            " object_id bigint NOT NULL,"
            " position bigint NOT NULL,"
            " size bigint NOT NULL,"
            " base_offset bigint NOT NULL,"
            " last_offset bigint NOT NULL,"
            " max_timestamp bigint NOT NULL)",
            "CREATE UNIQUE INDEX batches_by_offset ON {s}.batches (stream_id, last_offset)",
            "CREATE TABLE {s}.time_index ("
            " stream_id bigint NOT NULL,"
            " max_timestamp bigint NOT NULL,"
            " next_offset bigint NOT NULL,"
            " PRIMARY KEY (stream_id, max_timestamp))",
            "CREATE TABLE {s}.group_offsets ("
            ' group_name text COLLATE "C" NOT NULL,'
            ' stream text COLLATE "C" NOT NULL,'
            " next_offset bigint NOT NULL,"
            " PRIMARY KEY (group_name, stream))",
        ),
    ),
    2: (
        "committed transaction ids (commit_transaction)",
        (
            "CREATE TABLE {s}.transactions ("
            " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"  # commit order
            ' id text COLLATE "C" NOT NULL UNIQUE,'
            " committed_at double precision NOT NULL,"
            " ranges text NOT NULL)",  # JSON {"stream": [first, end]}
            "CREATE INDEX transactions_by_time ON {s}.transactions (committed_at)",
        ),
    ),
    3: (
        "row checksums; batch gaps and stream tail gaps; consumer-group row counts",
        (
            # rows.LAYOUTS says what each crc covers; _checksum_existing_rows fills them.
            "ALTER TABLE {s}.streams ADD COLUMN tail_gap bigint NOT NULL DEFAULT 0,"
            " ADD COLUMN crc bigint, ADD COLUMN name_key bigint",  # rows.name_key(name)
            "CREATE INDEX streams_by_name_key ON {s}.streams (name_key)",
            "ALTER TABLE {s}.producers ADD COLUMN crc bigint",
            "ALTER TABLE {s}.producer_streams ADD COLUMN crc bigint",
            "ALTER TABLE {s}.objects ADD COLUMN crc bigint",
            "ALTER TABLE {s}.batches ADD COLUMN gap bigint NOT NULL DEFAULT 0,"
            " ADD COLUMN crc bigint",
            "ALTER TABLE {s}.time_index ADD COLUMN crc bigint",
            "ALTER TABLE {s}.group_offsets ADD COLUMN crc bigint",
            "ALTER TABLE {s}.transactions ADD COLUMN crc bigint",
            "CREATE TABLE {s}.groups ("
            ' group_name text COLLATE "C" PRIMARY KEY,'
            " streams bigint NOT NULL,"  # how many group_offsets rows the group has
            " crc bigint)",
        ),
    ),
    4: (
        "the number of streams, checked before a stream is said not to exist or created",
        (
            # One row, always there (rows.check_stream_count); _count_streams fills it.
            "CREATE TABLE {s}.stream_count ("
            " id integer PRIMARY KEY CHECK (id = 0),"
            " streams bigint NOT NULL,"
            " crc bigint)",
        ),
    ),
    5: (
        "leases: holder, fencing token and change counter per name",
        (
            # One row per name, kept after a release so its token is never reused.
            "CREATE TABLE {s}.leases ("
            ' name text COLLATE "C" PRIMARY KEY,'
            " holder text,"  # NULL once released
            " token bigint NOT NULL,"
            " serial bigint NOT NULL,"
            " duration_ms bigint NOT NULL,"
            " crc bigint)",
            # How many leases rows there are (rows.check_leases): one row, always there.
            "CREATE TABLE {s}.lease_count ("
            " id integer PRIMARY KEY CHECK (id = 0),"
            " leases bigint NOT NULL,"
            " crc bigint)",
        ),
    ),
    6: (
        "producer expiry: when each producer was last used",
        (
            # ms of init_producer or of the last write of a state of it dropped since;
            # a state's last write is in its JSON text. _time_producers fills them.
            "ALTER TABLE {s}.producers ADD COLUMN used_ms bigint NOT NULL DEFAULT 0",
        ),
    ),
    7: (
        "the number of streams per range of name keys: a lookup that finds none counts one",
        (
            # Row b counts the streams whose name_key >> 20 is b (name_bucket);
            # _count_streams_by_bucket fills all 4096 and checks them against row 0's total.
            "ALTER TABLE {s}.stream_count DROP CONSTRAINT stream_count_id_check,"
            " ADD CONSTRAINT stream_count_id_check"
            f" CHECK (id >= 0 AND id < {STREAM_COUNT_BUCKETS})",
        ),
    ),
}

CREATE_VERSION_TABLE = (
    "CREATE TABLE {s}.schema_version ("
    " version integer PRIMARY KEY,"
    " description text NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
)
_ADVISORY_LOCK_PREFIX = "disklesslog.sequencer.schema:"


def apply_migrations(conn: Connection, schema: str, database: str, now_ms: int) -> None:
    """Bring ``schema`` to :data:`SCHEMA_VERSION` inside the caller's transaction, at
    ``now_ms`` (the sequencer's clock: the time step 6 gives the rows already there).

    The advisory lock (released by the transaction's end) makes concurrent openers of
    one schema take turns: the first creates, the others find it done. Checks use the
    catalogs with parameters; only the quoted identifier is formatted into SQL."""
    name = sql.Identifier(schema)

    def run(template: str, params: Sequence[Any] = ()) -> Any:
        return conn.execute(sql.SQL(template).format(s=name), params)

    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_ADVISORY_LOCK_PREFIX + schema,)
    )
    if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
        run("CREATE SCHEMA {s}")
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (schema,),
        )
    }
    if "schema_version" not in tables:
        if tables:
            raise SequencerError(
                f"schema {schema!r} already holds tables that are not a disklesslog "
                f"sequencer's ({', '.join(sorted(tables)[:5])}); choose another ?schema="
            )
        run(CREATE_VERSION_TABLE)
    row = run("SELECT coalesce(max(version), 0) FROM {s}.schema_version").fetchone()
    version = int(row[0])
    if version > SCHEMA_VERSION:
        raise SequencerError(
            f"schema {schema!r} has sequencer schema version {version}, written by a newer "
            f"disklesslog; this version reads up to {SCHEMA_VERSION}. Upgrade disklesslog "
            "(the schema was not changed)"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        description, statements = MIGRATIONS[target]
        for statement in statements:
            run(statement)
        if target == 3 and version:
            _checksum_existing_rows(conn, schema, database)
        if target == 4:
            _count_streams(conn, schema, database)
        if target == 5:
            run("INSERT INTO {s}.lease_count (id, leases, crc) VALUES (0, 0, %s)", (row_crc((0,)),))
        if target == 6 and version:
            _time_producers(conn, schema, database, now_ms)
        if target == 7:
            _count_streams_by_bucket(conn, schema, database)
        run(
            "INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
            (target, description),
        )


def _checksum_existing_rows(conn: Connection, schema: str, database: str) -> None:
    """Schema version 3 on a schema written before it: the checksum of every row, each
    batch's ``gap``, each stream's ``tail_gap`` and each consumer group's row count,
    from the rows as they are. Values that cannot be right (JSON that does not parse,
    overlapping batches) refuse the migration, which then changes nothing."""
    run, update = _statements(conn, schema)

    streams = run(
        "SELECT id, name, config, start_offset, end_offset, max_timestamp, unindexed"
        " FROM {s}.streams"
    )
    for row in streams:
        json_value(row[2], dict, database, "streams", f"{row[1]!r}")
    batches = run(
        "SELECT b.id, b.stream_id, b.base_offset, b.last_offset, o.key, b.position, b.size,"
        " b.max_timestamp FROM {s}.batches AS b LEFT JOIN {s}.objects AS o"
        " ON o.id = b.object_id ORDER BY b.stream_id, b.last_offset"
    )
    extents = {row[0]: (row[1], row[3], row[4]) for row in streams}
    gaps, tails = tile_existing(database, extents, [b[:4] for b in batches])
    updates = []
    for (gap, batch_id), (_, stream_id, base, last, key, position, size, ts) in zip(gaps, batches):
        if key is None:
            raise damaged_row(database, "batches", f"id {batch_id}", "its object is missing")
        values = (stream_id, key, position, size, base, last, ts, gap)
        updates.append((gap, row_crc(values), batch_id))
    update("UPDATE {s}.batches SET gap = %s, crc = %s WHERE id = %s", updates)
    update(
        "UPDATE {s}.streams SET tail_gap = %s, crc = %s, name_key = %s WHERE id = %s",
        [
            (tails[row[0]], row_crc((*row, tails[row[0]])), name_key(row[1]), row[0])
            for row in streams
        ],
    )
    states = StateCache(database)
    for stream_id, producer_id, text in run(
        "SELECT stream_id, producer_id, state FROM {s}.producer_streams"
    ):
        states.load(stream_id, producer_id, text, row_crc((stream_id, producer_id, text)))
    for txn, _, ranges in run("SELECT id, committed_at, ranges FROM {s}.transactions"):
        try:
            ranges_from_json(ranges)
        except (ValueError, TypeError, AttributeError):
            raise damaged_row(
                database, "transactions", f"{txn!r}", "its ranges do not parse"
            ) from None
    for table, keys, columns in (  # names are this module's, never input
        ("producers", ("id",), ("id", "name", "epoch")),
        ("producer_streams", ("stream_id", "producer_id"), ("stream_id", "producer_id", "state")),
        ("objects", ("id",), ("key", "live_batches", "dead_since")),
        (
            "time_index",
            ("stream_id", "max_timestamp"),
            ("stream_id", "max_timestamp", "next_offset"),
        ),
        ("group_offsets", ("group_name", "stream"), ("group_name", "stream", "next_offset")),
        ("transactions", ("seq",), ("id", "committed_at", "ranges")),
    ):
        n = len(keys)
        rows = run(f"SELECT {', '.join(keys)}, {', '.join(columns)} FROM {{s}}.{table}")
        where = " AND ".join(f"{key} = %s" for key in keys)
        update(
            f"UPDATE {{s}}.{table} SET crc = %s WHERE {where}",
            [(row_crc(row[n:]), *row[:n]) for row in rows],
        )
    counts = run("SELECT group_name, count(*) FROM {s}.group_offsets GROUP BY group_name")
    update(
        "INSERT INTO {s}.groups (group_name, streams, crc) VALUES (%s, %s, %s)",
        [(group, count, row_crc((group, count))) for group, count in counts],
    )


def _time_producers(conn: Connection, schema: str, database: str, now_ms: int) -> None:
    """Schema version 6 on a schema written before it: every producer's last use and
    every producer state's last write become ``now_ms``, each row verified first under
    its old checksum (a damaged one refuses the migration, which changes nothing)."""
    run, update = _statements(conn, schema)

    producers = []
    for producer_id, producer_name, epoch, crc in run(
        "SELECT id, name, epoch, crc FROM {s}.producers"
    ):
        if row_crc((producer_id, producer_name, epoch)) != crc:
            raise damaged_row(database, "producers", f"id {producer_id}")
        values = (producer_id, producer_name, epoch, now_ms)
        producers.append((now_ms, row_crc(values), producer_id))
    update("UPDATE {s}.producers SET used_ms = %s, crc = %s WHERE id = %s", producers)
    states = StateCache(database)
    timed = []
    for stream_id, producer_id, text, crc in run(
        "SELECT stream_id, producer_id, state, crc FROM {s}.producer_streams"
    ):
        state = states.load(stream_id, producer_id, text, crc)
        new = dataclasses.replace(state, written_ms=now_ms).to_json()
        timed.append((new, row_crc((stream_id, producer_id, new)), stream_id, producer_id))
    update(
        "UPDATE {s}.producer_streams SET state = %s, crc = %s"
        " WHERE stream_id = %s AND producer_id = %s",
        timed,
    )


def _count_streams(conn: Connection, schema: str, database: str) -> None:
    """Schema version 4: the ``stream_count`` row, counting the streams there are (none
    in a new schema). A batch, producer-state or time-index row of a stream id that no
    streams row has is a stream already lost: the migration is refused (and changes
    nothing), rather than the loss blessed by the count."""
    name = sql.Identifier(schema)
    for table in STREAM_TABLES:  # names are this module's, never input
        orphan = conn.execute(
            sql.SQL(
                "SELECT t.stream_id FROM {s}.{t} AS t WHERE NOT EXISTS"
                " (SELECT 1 FROM {s}.streams AS s WHERE s.id = t.stream_id) LIMIT 1"
            ).format(s=name, t=sql.Identifier(table))
        ).fetchone()
        if orphan is not None:
            raise damaged_row(
                database, "streams", f"id {orphan[0]}", f"it is missing, yet {table} has rows of it"
            )
    row = conn.execute(sql.SQL("SELECT count(*) FROM {s}.streams").format(s=name)).fetchone()
    count = 0 if row is None else int(row[0])
    insert = "INSERT INTO {s}.stream_count (id, streams, crc) VALUES (0, %s, %s)"
    conn.execute(sql.SQL(insert).format(s=name), (count, row_crc((count,))))


def _count_streams_by_bucket(conn: Connection, schema: str, database: str) -> None:
    """Schema version 7: ``stream_count``'s one row (the total, id 0) becomes one row per
    :func:`name_bucket`, all of them written (a row that is not there is damage). Every
    streams row is verified first, its ``name_key`` too (the per-range count goes by
    it), and the rows must be as many as the total says: a damaged row, or a stream
    already lost, refuses the migration (which changes nothing) rather than being
    blessed by the new counts."""
    run, update = _statements(conn, schema)
    total = next(iter(run("SELECT streams, crc FROM {s}.stream_count WHERE id = 0")), None)
    counts = [0] * STREAM_COUNT_BUCKETS
    rows = run(f"SELECT {', '.join(LAYOUTS['streams'])}, crc, name_key FROM {{s}}.streams")
    for *columns, crc, key in rows:
        values = new_stream_row(columns)
        where = f"{values.name!r} (id {values.id})"
        if row_crc(values) != crc:
            raise damaged_row(database, "streams", where)
        if key != name_key(values.name):
            raise damaged_row(database, "streams", where, "its name_key is not its name's")
        counts[name_bucket(key)] += 1
    check_stream_count(database, total, len(rows))
    run("DELETE FROM {s}.stream_count")
    update(
        "INSERT INTO {s}.stream_count (id, streams, crc) VALUES (%s, %s, %s)",
        [(bucket, count, row_crc((count,))) for bucket, count in enumerate(counts)],
    )


def _statements(
    conn: Connection, schema: str
) -> tuple[Callable[..., list[tuple[Any, ...]]], Callable[[str, Sequence[Sequence[Any]]], None]]:
    """What a migration step runs on ``schema``: ``run(template, params)`` (the rows it
    returns, if any) and ``update(template, rows)`` (one statement, many rows); ``{s}``
    in a template names the schema."""
    name = sql.Identifier(schema)

    def run(template: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cursor = conn.execute(sql.SQL(template).format(s=name), params)
        return cursor.fetchall() if cursor.description else []

    def update(template: str, rows: Sequence[Sequence[Any]]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(sql.SQL(template).format(s=name), rows)

    return run, update
