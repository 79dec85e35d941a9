"""The SQLite sequencer's tables: their history as numbered migrations, and bringing a
file up to date (:func:`migrate`), inside the caller's write transaction.

A file records its version in ``meta``; a newer one is refused untouched, an older one
migrated step by step, the steps kept exactly as they were released. Step 3 adds the
row checksums and the columns that prove a stream's batches complete
(:mod:`~disklesslog.sequencers.rows`) and fills them for the rows already there; step 4
the checksummed count of the streams (``stream_count``), from the rows already there;
step 5 the ``leases`` table (empty) and the checksummed count of its rows
(``lease_count``, 0); step 6 the time of each producer's last use (``used_ms``) and of
each producer state's last write (in its JSON text), the migration's time for the rows
already there, so nothing counts as idle before a whole ``producer_expiration_ms`` has
passed since the upgrade.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence

from ..errors import SequencerError
from .common import ranges_from_json
from .rows import (
    STREAM_TABLES,
    StateCache,
    damaged_row,
    json_value,
    name_key,
    row_crc,
    tile_existing,
)

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate", "schema_version", "stored_version"]

SCHEMA_VERSION = 6
"""Version of the tables this code writes; a newer file is refused, an older migrated."""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE streams ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"  # never reused: no old row matches a new stream
        " name TEXT NOT NULL UNIQUE,"
        " config TEXT NOT NULL,"
        " start_offset INTEGER NOT NULL DEFAULT 0,"
        " end_offset INTEGER NOT NULL DEFAULT 0,"
        " max_timestamp INTEGER,"  # running max of committed batches (time index)
        " unindexed INTEGER NOT NULL DEFAULT 0)",  # batches since the last time-index entry
        "CREATE TABLE producers ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " name TEXT UNIQUE,"
        " epoch INTEGER NOT NULL)",
        "CREATE TABLE producer_streams ("
        " stream_id INTEGER NOT NULL,"
        " producer_id INTEGER NOT NULL,"
        " state TEXT NOT NULL,"  # ProducerStreamState.to_json()
        " PRIMARY KEY (stream_id, producer_id)) WITHOUT ROWID",
        "CREATE TABLE objects ("
        " id INTEGER PRIMARY KEY,"
        " key TEXT NOT NULL UNIQUE,"
        " live_batches INTEGER NOT NULL,"
        " dead_since REAL)",  # NULL while a live batch is in it
        "CREATE INDEX objects_dead ON objects (dead_since) WHERE dead_since IS NOT NULL",
        "CREATE TABLE batches ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"  # never reused: stale ids stay stale
        " stream_id INTEGER NOT NULL,"
        " object_id INTEGER NOT NULL,"
        " position INTEGER NOT NULL,"
        " size INTEGER NOT NULL,"
        " base_offset INTEGER NOT NULL,"
        " last_offset INTEGER NOT NULL,"
        " max_timestamp INTEGER NOT NULL)",
        "CREATE UNIQUE INDEX batches_by_offset ON batches (stream_id, last_offset)",
        "CREATE TABLE time_index ("
        " stream_id INTEGER NOT NULL,"
        " max_timestamp INTEGER NOT NULL,"
        " next_offset INTEGER NOT NULL,"
        " PRIMARY KEY (stream_id, max_timestamp)) WITHOUT ROWID",
        "CREATE TABLE group_offsets ("
        " group_name TEXT NOT NULL,"
        " stream TEXT NOT NULL,"
        " next_offset INTEGER NOT NULL,"
        " PRIMARY KEY (group_name, stream)) WITHOUT ROWID",
    ),
    2: (
        # Committed transaction ids (commit_transaction), oldest first by seq.
        "CREATE TABLE transactions ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " id TEXT NOT NULL UNIQUE,"
        " committed_at REAL NOT NULL,"
        " ranges TEXT NOT NULL)",  # {"stream": [first, end]}
        "CREATE INDEX transactions_by_time ON transactions (committed_at)",
    ),
    3: (
        # Row checksums (rows.LAYOUTS) and what proves a stream's batch rows complete;
        # _checksum_existing_rows fills them for the rows already there.
        "ALTER TABLE streams ADD COLUMN tail_gap INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE streams ADD COLUMN crc INTEGER",
        "ALTER TABLE streams ADD COLUMN name_key INTEGER",  # rows.name_key(name)
        "CREATE INDEX streams_by_name_key ON streams (name_key)",
        "ALTER TABLE producers ADD COLUMN crc INTEGER",
        "ALTER TABLE producer_streams ADD COLUMN crc INTEGER",
        "ALTER TABLE objects ADD COLUMN crc INTEGER",
        "ALTER TABLE batches ADD COLUMN gap INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE batches ADD COLUMN crc INTEGER",
        "ALTER TABLE time_index ADD COLUMN crc INTEGER",
        "ALTER TABLE group_offsets ADD COLUMN crc INTEGER",
        "ALTER TABLE transactions ADD COLUMN crc INTEGER",
        "CREATE TABLE groups ("  # per consumer group, how many group_offsets rows it has
        " group_name TEXT PRIMARY KEY,"
        " streams INTEGER NOT NULL,"
        " crc INTEGER) WITHOUT ROWID",
    ),
    4: (
        # How many streams rows there are (rows.check_stream_count): one row, always
        # there; _count_streams writes it from the streams already there.
        "CREATE TABLE stream_count ("
        " id INTEGER PRIMARY KEY CHECK (id = 0),"
        " streams INTEGER NOT NULL,"
        " crc INTEGER)",
    ),
    5: (
        # Leases (disklesslog.leases): one row per name, kept after a release so that
        # its token is never given out again. WITHOUT ROWID: the rows live in the
        # primary key's own tree, so no second index can lose one.
        "CREATE TABLE leases ("
        " name TEXT PRIMARY KEY,"
        " holder TEXT,"  # NULL once released
        " token INTEGER NOT NULL,"
        " serial INTEGER NOT NULL,"
        " duration_ms INTEGER NOT NULL,"
        " crc INTEGER) WITHOUT ROWID",
        # How many leases rows there are (rows.check_leases): one row, always there.
        "CREATE TABLE lease_count ("
        " id INTEGER PRIMARY KEY CHECK (id = 0),"
        " leases INTEGER NOT NULL,"
        " crc INTEGER)",
    ),
    6: (
        # Producer expiry: when each producer was last used (init_producer, or the last
        # write of a state of it dropped since), in ms; _time_producers fills it. A
        # state's last write is in its JSON text, which its crc covers already.
        "ALTER TABLE producers ADD COLUMN used_ms INTEGER NOT NULL DEFAULT 0",
    ),
}


def stored_version(db: sqlite3.Connection) -> int | None:
    """:data:`SCHEMA_VERSION` if the file records it, else None; changes nothing."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() is None:
        return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return None if row is None or row[0] != str(SCHEMA_VERSION) else SCHEMA_VERSION


def schema_version(db: sqlite3.Connection, path: str) -> int:
    """0 for an empty file; refuses a database that is not a sequencer's."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" not in tables:
        if tables - {"sqlite_sequence"}:
            raise SequencerError(
                f"{path} is a SQLite database but not a disklesslog sequencer's (no meta "
                "table); point the URL at a new file"
            )
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
        return 0
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    try:
        return 0 if row is None else int(row[0])
    except (TypeError, ValueError):
        raise damaged_row(path, "meta", "'schema_version'", f"it holds {row[0]!r}") from None


def migrate(db: sqlite3.Connection, path: str, version: int, now_ms: int) -> None:
    """Bring a file of ``version`` (0: empty) to :data:`SCHEMA_VERSION` at ``now_ms``
    (the sequencer's clock); refuses a newer one untouched."""
    if version > SCHEMA_VERSION:
        raise SequencerError(
            f"{path} has sequencer schema version {version}, written by a newer "
            f"disklesslog; this version reads up to {SCHEMA_VERSION}. Upgrade "
            "disklesslog (the file was not changed)"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[target]:
            db.execute(statement)
        if target == 3 and version:
            _checksum_existing_rows(db, path)
        if target == 4:
            _count_streams(db, path)
        if target == 5:
            db.execute(
                "INSERT INTO lease_count (id, leases, crc) VALUES (0, 0, ?)", (row_crc((0,)),)
            )
        if target == 6 and version:
            _time_producers(db, path, now_ms)
    if version < SCHEMA_VERSION:
        db.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )


def _checksum_existing_rows(db: sqlite3.Connection, path: str) -> None:
    """Schema version 3 on a database written before it: the checksum of every row, each
    batch's ``gap``, each stream's ``tail_gap`` and each consumer group's row count,
    from the rows as they are (after an integrity check). Values that cannot be right
    (JSON that does not parse, overlapping batches) refuse the migration: the file is
    left as it was."""
    streams = db.execute(
        "SELECT id, name, config, start_offset, end_offset, max_timestamp, unindexed FROM streams"
    ).fetchall()
    for _, name, config, *_ in streams:
        json_value(config, dict, path, "streams", f"{name!r}")
    extents = {row[0]: (row[1], row[3], row[4]) for row in streams}
    batches = db.execute(
        "SELECT b.id, b.stream_id, b.base_offset, b.last_offset, o.key, b.position, b.size,"
        " b.max_timestamp FROM batches AS b LEFT JOIN objects AS o ON o.id = b.object_id"
        " ORDER BY b.stream_id, b.last_offset"
    ).fetchall()
    gaps, tails = tile_existing(path, extents, [row[:4] for row in batches])
    updates = []
    for (gap, batch_id), (_, stream_id, base, last, key, position, size, ts) in zip(gaps, batches):
        if key is None:
            raise damaged_row(path, "batches", f"id {batch_id}", "its object is missing")
        values = (stream_id, key, position, size, base, last, ts, gap)
        updates.append((gap, row_crc(values), batch_id))
    db.executemany("UPDATE batches SET gap = ?, crc = ? WHERE id = ?", updates)
    db.executemany(
        "UPDATE streams SET tail_gap = ?, crc = ?, name_key = ? WHERE id = ?",
        [
            (tails[row[0]], row_crc((*row, tails[row[0]])), name_key(row[1]), row[0])
            for row in streams
        ],
    )
    _checksum_rows(db, "producers", ("id", "name", "epoch"), ("id",))
    _checksum_rows(db, "objects", ("key", "live_batches", "dead_since"), ("id",))
    _checksum_rows(
        db,
        "time_index",
        ("stream_id", "max_timestamp", "next_offset"),
        ("stream_id", "max_timestamp"),
    )
    _checksum_rows(
        db, "group_offsets", ("group_name", "stream", "next_offset"), ("group_name", "stream")
    )
    states = StateCache(path)
    for stream_id, producer_id, text in db.execute(
        "SELECT stream_id, producer_id, state FROM producer_streams"
    ).fetchall():
        states.load(stream_id, producer_id, text, row_crc((stream_id, producer_id, text)))
    _checksum_rows(
        db, "producer_streams", ("stream_id", "producer_id", "state"), ("stream_id", "producer_id")
    )
    for txn, _, ranges in db.execute(
        "SELECT id, committed_at, ranges FROM transactions"
    ).fetchall():
        try:
            ranges_from_json(ranges)
        except (ValueError, TypeError, AttributeError):
            raise damaged_row(path, "transactions", f"{txn!r}", "its ranges do not parse") from None
    _checksum_rows(db, "transactions", ("id", "committed_at", "ranges"), ("seq",))
    counts = db.execute(
        "SELECT group_name, count(*) FROM group_offsets GROUP BY group_name"
    ).fetchall()
    db.executemany(
        "INSERT INTO groups (group_name, streams, crc) VALUES (?, ?, ?)",
        [(group, n, row_crc((group, n))) for group, n in counts],
    )


def _count_streams(db: sqlite3.Connection, path: str) -> None:
    """Schema version 4: the ``stream_count`` row, counting the streams there are (none
    in a new file). A batch, producer-state or time-index row of a stream id that no
    streams row has is a stream already lost: the migration is refused, the file left
    as it was, rather than the loss blessed by the count."""
    for table in STREAM_TABLES:
        orphan = db.execute(
            f"SELECT stream_id FROM {table} WHERE stream_id NOT IN (SELECT id FROM streams) LIMIT 1"
        ).fetchone()
        if orphan is not None:
            raise damaged_row(
                path, "streams", f"id {orphan[0]}", f"it is missing, yet {table} has rows of it"
            )
    (count,) = db.execute("SELECT count(*) FROM streams").fetchone()
    db.execute(
        "INSERT INTO stream_count (id, streams, crc) VALUES (0, ?, ?)", (count, row_crc((count,)))
    )


def _time_producers(db: sqlite3.Connection, path: str, now_ms: int) -> None:
    """Schema version 6 on a database written before it: every producer's last use and
    every producer state's last write become ``now_ms``, each row verified first under
    its old checksum (a damaged one refuses the migration, the file left as it was)."""
    for producer_id, name, epoch, crc in db.execute(
        "SELECT id, name, epoch, crc FROM producers"
    ).fetchall():
        if row_crc((producer_id, name, epoch)) != crc:
            raise damaged_row(path, "producers", f"id {producer_id}")
    db.execute("UPDATE producers SET used_ms = ?", (now_ms,))
    _checksum_rows(db, "producers", ("id", "name", "epoch", "used_ms"), ("id",))
    states = StateCache(path)
    updates = []
    for stream_id, producer_id, text, crc in db.execute(
        "SELECT stream_id, producer_id, state, crc FROM producer_streams"
    ).fetchall():
        state = states.load(stream_id, producer_id, text, crc)
        timed = dataclasses.replace(state, written_ms=now_ms).to_json()
        updates.append((timed, row_crc((stream_id, producer_id, timed)), stream_id, producer_id))
    db.executemany(
        "UPDATE producer_streams SET state = ?, crc = ? WHERE stream_id = ? AND producer_id = ?",
        updates,
    )


def _checksum_rows(
    db: sqlite3.Connection, table: str, columns: Sequence[str], keys: Sequence[str]
) -> None:
    """Fill ``crc`` of every row of ``table`` from ``columns``; ``keys`` find the row
    (names are this module's, never input)."""
    n = len(keys)
    rows = db.execute(f"SELECT {', '.join(keys)}, {', '.join(columns)} FROM {table}").fetchall()
    where = " AND ".join(f"{key} = ?" for key in keys)
    db.executemany(
        f"UPDATE {table} SET crc = ? WHERE {where}",
        [(row_crc(row[n:]), *row[:n]) for row in rows],
    )
