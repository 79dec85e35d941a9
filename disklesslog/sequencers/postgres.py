"""The PostgreSQL sequencer: many machines, high commit rates, one shared server.

``postgresql://user@host:5432/dbname?schema=NAME`` (``postgres://`` works too). The URL
is libpq's: every query option it knows (``sslmode``, ``connect_timeout``,
``application_name``, ...) goes to the driver, and the password may come from the URL,
``PGPASSWORD`` or ``~/.pgpass``. Options of the sequencer itself:

``schema=NAME`` (default ``disklesslog``)
    The PostgreSQL schema holding the sequencer's tables, created on first open: several
    logs can share one database, one schema each. ``NAME`` is 1-63 of ``[a-z0-9_]``,
    starting with a letter or ``_`` and not with ``pg_``: no quoting surprises, no
    clash with PostgreSQL's own schemas.
``pool_size=N`` (default 10)
    Most connections this process keeps to the server (a thread holds one per call).
``timeout=SECONDS`` (default 30)
    How long a call waits for a pooled connection, and for a row lock held by another
    transaction (PostgreSQL's ``lock_timeout``), before it raises
    :class:`~disklesslog.errors.SequencerError`. ``connect_timeout`` defaults to 10 s.

**Schema** (:mod:`~disklesslog.sequencers.postgres_schema`). Tables are created by
numbered migrations (:data:`SCHEMA_VERSION`) applied on open, each recorded in a
``schema_version`` table, all in one transaction under an advisory lock
(``pg_advisory_xact_lock``) keyed by the schema name: processes opening together wait
for one another instead of racing ``CREATE``, and a failed migration leaves nothing
behind. A schema written by a newer disklesslog is refused untouched; a
schema holding tables that are not a sequencer's is refused too. Identifiers are quoted
with :class:`psycopg.sql.Identifier`; every value is a query parameter.

**Commits.** One transaction at READ COMMITTED, four round trips whatever the number of
batches: ``BEGIN``; one statement that locks the touched stream rows ``FOR UPDATE`` in
name order and the producers' rows ``FOR SHARE`` in id order and returns them with the
producer states; one statement of data-modifying CTEs that upserts the object row,
inserts every batch row, moves the streams' end offsets and stores producer states and
time-index entries, all from array parameters (``unnest``); ``COMMIT``. Between the two
statements the same pure function every sequencer calls
(:func:`~disklesslog.sequencers.common.plan_commit`) assigns offsets and decides
idempotence and fencing, on state read with the locks held: two commits on one stream
are serialised by its row lock, so each sees the other's end offset and producer
states. (Locked rows are always their latest version; the states, read by the same
statement from its snapshot, are current unless a stream row changed while the
statement waited for its lock, which it checks; then the states are read again by a
statement of their own, a fifth round trip that only contended commits pay.) The
producer rows' share lock makes :meth:`PostgresSequencer.init_producer` (which updates
that row) wait for commits in flight and them for it: no commit of a fenced epoch lands
after the new epoch was handed out. Any rejection raises before anything is written,
and the transaction is rolled back. Arrays go as text literals, and ``BEGIN``/``COMMIT``
straight through libpq: the client's CPU is half of a commit's cost (measured; see
:func:`_ints` and :func:`_command`).

**No deadlocks.** Every transaction that takes several locks takes stream rows first, in
one statement sorted by name, then object rows sorted by id. Should PostgreSQL still
report a deadlock (SQLSTATE 40P01, e.g. two retries of one object key racing a trim)
or a serialization failure (40001, not expected at READ COMMITTED), the whole call is
retried with jittered, bounded backoff; it always re-reads the state it decides on.

**Reads** are one statement each (one snapshot): ``find_batches`` reads the stream's
row and its first batches together, and continues through a server-side cursor of
the same statement when a page needs more than :data:`_FIRST_PAGE_ROWS` batches.

**Damage** (schema versions 3, 4 and 7): every row a later call trusts carries a
CRC-32C of its columns, a stream's batch rows prove themselves complete, and the streams
rows are counted per range of name keys (``stream_count``, a row locked by creates and
deletes of names in its range, never by commits), checked before a stream is said not
to exist or created (:mod:`~disklesslog.sequencers.rows`); a mismatch is a
:class:`~disklesslog.errors.CorruptDataError` naming the server, schema, table and row,
as are PostgreSQL's own reports of damaged pages (SQLSTATE XX001, XX002). The commit
keeps its four round trips: the object's row is inserted, or (a retried commit) locked
by a no-op upsert and returned, then verified and counted by a fifth.

**Connections** come from a :class:`psycopg_pool.ConnectionPool` (thread-safe, at most
``pool_size``). A connection found dead is replaced and the call retried when nothing
can have been applied; if the connection dies while ``COMMIT`` is in flight the outcome
is unknown and :class:`~disklesslog.errors.SequencerError` says so (a writer's retry of
the same producer batches is answered with their original offsets). A process forked
after opening leaves the parent's connections alone and opens its own pool on first use.

Needs the ``postgres`` extra: ``pip install 'disklesslog[postgres]'``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import os
import random
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import (
    ConfigError,
    CorruptDataError,
    InvalidURL,
    LogClosedError,
    MissingDependencyError,
    SequencerError,
    StreamNotFound,
)
from ..forks import reset_after_fork
from ..leases import (
    LeaseRecord,
    check_lease_record,
    check_lease_serial,
    raised_floor,
    starts_above_floor,
)
from ..names import validate_group_name, validate_lease_name, validate_stream_name
from .base import (
    NO_PRODUCER,
    BatchLocation,
    BatchPage,
    BatchToCommit,
    CommitResult,
    ProducerExpiry,
    Sequencer,
    StreamMeta,
    TransactionResult,
)
from .common import (
    TIME_INDEX_INTERVAL,
    TRACKED_TRANSACTIONS,
    Clock,
    CommitPlan,
    StreamCursor,
    already_known,
    check_batches,
    check_expiry_age,
    check_keys,
    check_new_batches,
    check_object_key,
    check_offsets,
    check_old_ids,
    check_position,
    check_transaction,
    clock_ms,
    config_copy,
    merged_config,
    not_contiguous,
    out_of_range,
    plan_commit,
    ranges_from_json,
    ranges_to_json,
    time_index_repair,
    transaction_cutoff,
    transaction_ranges,
)
from .producers import ProducerStreamState
from .rows import (
    FLOOR_ROW,
    StateCache,
    StreamRow,
    Tiling,
    check_garbage,
    check_leases,
    check_stream_count,
    damaged_row,
    greatest,
    json_value,
    lease_floor,
    name_key,
    new_stream_row,
    row_crc,
    row_crcs,
    stream_count,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq, sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(
        f"postgresql:// sequencers need psycopg 3 and psycopg-pool ({exc}): "
        "pip install 'disklesslog[postgres]'"
    ) from None

from .postgres_schema import (
    SCHEMA_VERSION,
    STREAM_COUNT_BUCKETS,
    apply_migrations,
    bucket_keys,
    name_bucket,
)

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "PostgresOptions",
    "PostgresSequencer",
    "open_postgres_sequencer",
    "parse_postgres_url",
    "validate_schema_name",
]

DEFAULT_SCHEMA = "disklesslog"

_SCHEMES = ("postgresql", "postgres")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_OWN_OPTIONS = ("schema", "pool_size", "timeout")
_DEFAULT_CONNECT_TIMEOUT = "10"  # seconds; libpq's default is to wait forever

_DAMAGE_STATES = ("XX001", "XX002")  # data_corrupted, index_corrupted
_RETRY_FIRST = 0.002  # seconds; deadlock/serialization retries back off up to _RETRY_MAX
_RETRY_MAX = 0.1
_RETRY_ATTEMPTS = 10
_RECONNECT_ATTEMPTS = 3  # calls retried on a dead pooled connection (nothing applied)
_FIRST_PAGE_ROWS = 128
"""Batches find_batches reads in its first statement; a page that needs more continues
through a server-side cursor of one statement (the same snapshot). Readers asking for
a few MiB of batches of tens of KiB are answered in one round trip."""
_CURSOR_ROWS = 1024  # rows per FETCH of that cursor

T = TypeVar("T")
Connection = psycopg.Connection[Any]

_STREAM_COLUMNS = (
    "id, name, config, start_offset, end_offset, max_timestamp, unindexed, tail_gap, crc"
)
_BATCH_COLUMNS = (  # what a batch's checksum covers (its object by key), its id, its object's id
    "b.id, (SELECT o.key FROM {s}.objects AS o WHERE o.id = b.object_id), b.position, b.size,"
    " b.base_offset, b.last_offset, b.max_timestamp, b.gap, b.crc, b.object_id"
)
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class _Queries:
    """Every statement, as a template naming the schema ``{s}``; :meth:`render` quotes
    the schema once per sequencer (values are always ``%s`` parameters)."""

    stream_row: str = (  # the stream, and any whose name_key is its name's (rows.name_key)
        f"SELECT {_STREAM_COLUMNS} FROM {{s}}.streams WHERE name = %s OR name_key = %s"
    )
    # Every row of stream_count (kind 0: its id, then streams and crc where a stream's
    # start_offset and crc are) and every stream with its name_key (kind 1), one snapshot.
    all_streams: str = (
        'SELECT 0 AS kind, id, NULL::text COLLATE "C" AS name, NULL::text, streams,'
        " NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, crc, NULL::bigint"
        " FROM {s}.stream_count"
        " UNION ALL SELECT 1, id, name, config, start_offset, end_offset, max_timestamp,"
        " unindexed, tail_gap, crc, name_key FROM {s}.streams ORDER BY kind, name"
    )
    # What one row of stream_count records and the streams rows of its range of name
    # keys (through their index), in one snapshot; the row missing: NULLs.
    count_streams: str = (
        "SELECT c.streams, c.crc, (SELECT count(*) FROM {s}.streams"
        " WHERE name_key >= %(low)s AND name_key < %(high)s) FROM (SELECT 1) AS q"
        " LEFT JOIN {s}.stream_count AS c ON c.id = %(bucket)s"
    )
    # Taken by creates and deletes only, after the stream's own row (delete) or its
    # absence (create): never by a commit, so appends do not wait on it. Creates and
    # deletes of names in different ranges do not wait on one another either.
    lock_stream_count: str = "SELECT streams, crc FROM {s}.stream_count WHERE id = %s FOR UPDATE"
    put_stream_count: str = "UPDATE {s}.stream_count SET streams = %s, crc = %s WHERE id = %s"
    lock_stream: str = f"SELECT {_STREAM_COLUMNS} FROM {{s}}.streams WHERE name = %s FOR UPDATE"
    insert_stream: str = (
        "INSERT INTO {s}.streams (name, config, name_key) VALUES (%s, %s, %s)"
        " ON CONFLICT (name) DO NOTHING RETURNING id"
    )
    stream_crc: str = "UPDATE {s}.streams SET crc = %s WHERE id = %s"
    put_stream: str = (
        "UPDATE {s}.streams SET config = %s, start_offset = %s, end_offset = %s,"
        " max_timestamp = %s, unindexed = %s, tail_gap = %s, crc = %s WHERE id = %s"
    )
    delete_stream: str = (
        "WITH p AS (DELETE FROM {s}.producer_streams WHERE stream_id = %(id)s),"
        " t AS (DELETE FROM {s}.time_index WHERE stream_id = %(id)s)"
        " DELETE FROM {s}.streams WHERE id = %(id)s"
    )
    # The batch rows below an offset, deleted and returned (with their objects' keys,
    # to verify them) in offset order.
    delete_batches_below: str = (
        "WITH b AS (DELETE FROM {s}.batches WHERE stream_id = %s AND last_offset < %s"
        " RETURNING *) SELECT " + _BATCH_COLUMNS + " FROM b ORDER BY b.last_offset"
    )
    find_producer: str = (
        "SELECT id, name, epoch, used_ms, crc FROM {s}.producers WHERE name = %s FOR UPDATE"
    )
    insert_producer: str = (
        "INSERT INTO {s}.producers (name, epoch, used_ms) VALUES (%s, 0, %s)"
        " ON CONFLICT (name) DO NOTHING RETURNING id"
    )
    put_producer: str = "UPDATE {s}.producers SET epoch = %s, used_ms = %s, crc = %s WHERE id = %s"
    # Producer expiry (expire_producers): every state and producer, verified in Python;
    # the producers to change locked in id order (as commits take them) before any
    # state row is deleted; a state deleted only if it is still the text read (a commit
    # that wrote it meanwhile keeps it), a producer only if no state of it is left.
    all_states: str = "SELECT stream_id, producer_id, state, crc FROM {s}.producer_streams"
    states_of_stream: str = (
        "SELECT stream_id, producer_id, state, crc FROM {s}.producer_streams WHERE stream_id = %s"
    )
    all_producers: str = "SELECT id, name, epoch, used_ms, crc FROM {s}.producers"
    lock_producers: str = (
        "SELECT id, name, epoch, used_ms, crc FROM {s}.producers"
        " WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE"
    )
    delete_states: str = (
        "DELETE FROM {s}.producer_streams AS ps"
        " USING unnest(%s::bigint[], %s::bigint[], %s::text[]) AS d(stream_id, producer_id, state)"
        " WHERE ps.stream_id = d.stream_id AND ps.producer_id = d.producer_id"
        " AND ps.state = d.state RETURNING ps.producer_id, ps.state"
    )
    producers_with_state: str = (
        "SELECT DISTINCT producer_id FROM {s}.producer_streams"
        " WHERE producer_id = ANY(%s::bigint[])"
    )
    delete_producers: str = "DELETE FROM {s}.producers WHERE id = ANY(%s::bigint[])"
    # Commit: the locks and everything the rules decide on, in one statement. Streams
    # are locked in name order (rows are sorted before they are locked), producers
    # after them in id order. A locked row is the latest version, but the producer
    # states come from the statement's snapshot, taken before any lock wait: they are
    # current only if no stream row changed since that snapshot (every change of a
    # stream's producer states also updates its row), which "fresh" tells by
    # comparing the locked row's xmin with the snapshot's. Otherwise load_states runs
    # as a statement of its own, after the locks. Rows of the three kinds share
    # columns: (kind, id, text, number, crc, then the rest of a stream's row; a
    # producer's used_ms where a stream's start_offset is).
    lock_for_commit: str = (
        "WITH s AS (SELECT id, name, config, start_offset, end_offset, max_timestamp, unindexed,"
        " tail_gap, crc, xmin AS version FROM {s}.streams WHERE name = ANY(%(names)s::text[])"
        " ORDER BY name FOR UPDATE),"
        " p AS (SELECT id, name, epoch, used_ms, crc FROM {s}.producers"
        " WHERE id = ANY(%(producers)s::bigint[]) ORDER BY id FOR SHARE)"
        " SELECT 0 AS kind, s.id, s.name, s.end_offset, s.crc, s.config, s.start_offset,"
        " s.max_timestamp, s.unindexed, s.tail_gap,"
        " (SELECT v.xmin = s.version FROM {s}.streams AS v WHERE v.id = s.id) AS fresh"
        " FROM s"
        " UNION ALL SELECT 1, id, name, epoch, crc, NULL, used_ms, NULL, NULL, NULL, NULL FROM p"
        " UNION ALL SELECT 2, ps.stream_id, ps.state, ps.producer_id, ps.crc, NULL, NULL, NULL,"
        " NULL, NULL, NULL"
        " FROM s CROSS JOIN LATERAL (SELECT * FROM {s}.producer_streams AS ps"
        " WHERE ps.stream_id = s.id AND ps.producer_id = ANY(%(producers)s::bigint[])"
        " OFFSET 0) AS ps"  # OFFSET 0: not flattened, so looked up by key per stream
    )
    load_states: str = (
        "SELECT stream_id, producer_id, state, crc FROM {s}.producer_streams"
        " WHERE stream_id = ANY(%s::bigint[]) AND producer_id = ANY(%s::bigint[])"
    )
    # The object's row is inserted, or (a retried commit) locked by a no-op update and
    # returned as it was, for the caller to verify and count the batches in.
    write_commit: str = (
        "WITH obj AS (INSERT INTO {s}.objects AS o (key, live_batches, dead_since, crc)"
        " VALUES (%(key)s, %(live)s, %(dead)s, %(crc)s)"
        " ON CONFLICT (key) DO UPDATE SET key = excluded.key"
        " RETURNING o.id, o.live_batches, o.dead_since, o.crc, o.xmax = 0 AS inserted),"
        " ins AS (INSERT INTO {s}.batches (stream_id, object_id, position, size, base_offset,"
        " last_offset, max_timestamp, gap, crc) SELECT b.stream_id, obj.id, b.position, b.size,"
        " b.base_offset, b.last_offset, b.max_timestamp, b.gap, b.crc FROM obj,"
        " unnest(%(b_stream)s::bigint[], %(b_position)s::bigint[], %(b_size)s::bigint[],"
        " %(b_base)s::bigint[], %(b_last)s::bigint[], %(b_ts)s::bigint[], %(b_gap)s::bigint[],"
        " %(b_crc)s::bigint[]) AS b(stream_id, position, size, base_offset, last_offset,"
        " max_timestamp, gap, crc)),"
        " ext AS (UPDATE {s}.streams AS s SET end_offset = m.end_offset,"
        " max_timestamp = m.max_timestamp, unindexed = m.unindexed, tail_gap = 0, crc = m.crc"
        " FROM unnest(%(s_id)s::bigint[], %(s_end)s::bigint[], %(s_ts)s::bigint[],"
        " %(s_unindexed)s::bigint[], %(s_crc)s::bigint[])"
        " AS m(id, end_offset, max_timestamp, unindexed, crc) WHERE s.id = m.id),"
        " st AS (INSERT INTO {s}.producer_streams (stream_id, producer_id, state, crc)"
        " SELECT * FROM unnest(%(p_stream)s::bigint[], %(p_id)s::bigint[], %(p_state)s::text[],"
        " %(p_crc)s::bigint[])"
        " ON CONFLICT (stream_id, producer_id) DO UPDATE SET state = excluded.state,"
        " crc = excluded.crc),"
        " ti AS (INSERT INTO {s}.time_index (stream_id, max_timestamp, next_offset, crc)"
        " SELECT * FROM unnest(%(t_stream)s::bigint[], %(t_ts)s::bigint[],"
        " %(t_next)s::bigint[], %(t_crc)s::bigint[])"
        " ON CONFLICT (stream_id, max_timestamp) DO UPDATE SET next_offset = excluded.next_offset,"
        " crc = excluded.crc)"
        " SELECT id, live_batches, dead_since, crc, inserted FROM obj"
    )
    put_object: str = (
        "UPDATE {s}.objects SET live_batches = %s, dead_since = %s, crc = %s WHERE id = %s"
    )
    record_orphans: str = (
        "INSERT INTO {s}.objects (key, live_batches, dead_since, crc)"
        " SELECT k, 0, %s, c FROM unnest(%s::text[], %s::bigint[]) AS a(k, c) ORDER BY k"
        " ON CONFLICT (key) DO NOTHING"
    )
    # Transactions: the id's row is inserted first, so a second commit of the same id
    # waits on the unique index until the first ends, then finds the row (or, if the
    # first rolled back, inserts it). Expired ids go first, by age; by count last.
    forget_old_transactions: str = "DELETE FROM {s}.transactions WHERE committed_at < %s"
    claim_transaction: str = (
        "INSERT INTO {s}.transactions (id, committed_at, ranges) VALUES (%s, %s, '')"
        " ON CONFLICT (id) DO NOTHING RETURNING seq"
    )
    known_objects: str = "SELECT key FROM {s}.objects WHERE key = ANY(%s::text[])"
    transaction_ranges: str = (
        "SELECT id, committed_at, ranges, crc FROM {s}.transactions WHERE id = %s"
    )
    finish_transaction: str = "UPDATE {s}.transactions SET ranges = %s, crc = %s WHERE seq = %s"
    forget_transactions_beyond: str = "DELETE FROM {s}.transactions WHERE seq <= %s - %s"
    # Reads: the stream's row and its batches in one statement, one snapshot. The
    # stream's config (for its checksum) comes with the first row only.
    find_batches: str = (
        "SELECT s.id, s.name, CASE WHEN coalesce(b.rn, 1) = 1 THEN s.config END,"
        " s.start_offset, s.end_offset, s.max_timestamp, s.unindexed, s.tail_gap, s.crc, "
        + _BATCH_COLUMNS
        + " FROM {s}.streams AS s LEFT JOIN LATERAL (SELECT b.*, row_number() OVER"
        " (ORDER BY b.last_offset) AS rn FROM {s}.batches AS b WHERE b.stream_id = s.id"
        " AND b.last_offset >= %(offset)s ORDER BY b.last_offset LIMIT %(limit)s) AS b ON true"
        " WHERE s.name = %(name)s ORDER BY b.last_offset"
    )
    # The stream, the time-index entry below the timestamp, and every batch from where
    # that entry lets the scan start up to the first batch as late as the timestamp:
    # all verified, so none of them can move the answer unnoticed.
    offset_for_time: str = (
        "WITH s AS (SELECT " + _STREAM_COLUMNS + " FROM {s}.streams WHERE name = %(name)s),"
        " t AS (SELECT t.max_timestamp, t.next_offset, t.crc FROM {s}.time_index AS t, s"
        " WHERE t.stream_id = s.id AND t.max_timestamp < %(ts)s"
        " ORDER BY t.max_timestamp DESC LIMIT 1),"
        " lo AS (SELECT greatest(s.start_offset, (SELECT next_offset FROM t)) AS lower FROM s"
        " WHERE s.max_timestamp >= %(ts)s),"
        " hit AS (SELECT b.last_offset FROM {s}.batches AS b, s, lo WHERE b.stream_id = s.id"
        " AND b.last_offset >= lo.lower AND b.max_timestamp >= %(ts)s"
        " ORDER BY b.last_offset LIMIT 1)"
        " SELECT s.*, t.max_timestamp, t.next_offset, t.crc, "
        + _BATCH_COLUMNS
        + " FROM s LEFT JOIN t ON true LEFT JOIN LATERAL (SELECT b.* FROM {s}.batches AS b, lo"
        " WHERE b.stream_id = s.id AND b.last_offset >= lo.lower AND b.last_offset <="
        f" coalesce((SELECT last_offset FROM hit), {_INT64_MAX}) ORDER BY b.last_offset) AS b"
        " ON true ORDER BY b.last_offset"
    )
    delete_time_index_below: str = (
        "DELETE FROM {s}.time_index WHERE stream_id = %s AND next_offset <= %s"
    )
    # Objects: locked in id order before their counts change (no deadlock between two
    # trims or replacements releasing the same objects), and verified.
    lock_objects: str = (
        "SELECT id, key, live_batches, dead_since, crc FROM {s}.objects WHERE id = ANY(%s)"
        " ORDER BY id FOR UPDATE"
    )
    lock_objects_by_key: str = (
        "SELECT id, key, live_batches, dead_since, crc FROM {s}.objects"
        " WHERE key = ANY(%s::text[]) ORDER BY id FOR UPDATE"
    )
    put_objects: str = (
        "UPDATE {s}.objects AS o SET live_batches = r.n, dead_since = r.dead, crc = r.crc"
        " FROM unnest(%s::bigint[], %s::bigint[], %s::double precision[], %s::bigint[])"
        " AS r(id, n, dead, crc) WHERE o.id = r.id"
    )
    insert_objects: str = (
        "INSERT INTO {s}.objects (key, live_batches, dead_since, crc)"
        " SELECT * FROM unnest(%s::text[], %s::bigint[], %s::double precision[], %s::bigint[])"
        " ORDER BY 1 ON CONFLICT (key) DO NOTHING RETURNING key, id"
    )
    load_batches: str = (
        "SELECT " + _BATCH_COLUMNS + " FROM {s}.batches AS b"
        " WHERE b.stream_id = %s AND b.id = ANY(%s) ORDER BY b.base_offset"
    )
    next_batch: str = (
        "SELECT " + _BATCH_COLUMNS + " FROM {s}.batches AS b"
        " WHERE b.stream_id = %s AND b.last_offset > %s ORDER BY b.last_offset LIMIT 1"
    )
    put_gap: str = "UPDATE {s}.batches SET gap = %s, crc = %s WHERE id = %s"
    count_between: str = (
        "SELECT count(*) FROM {s}.batches WHERE stream_id = %s AND last_offset BETWEEN %s AND %s"
    )
    delete_batches: str = "DELETE FROM {s}.batches WHERE id = ANY(%s)"
    insert_batches: str = (
        "INSERT INTO {s}.batches (stream_id, object_id, position, size, base_offset,"
        " last_offset, max_timestamp, gap, crc) SELECT %s, * FROM unnest(%s::bigint[],"
        " %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[],"
        " %s::bigint[])"
    )
    time_index_below: str = (
        "SELECT max_timestamp, next_offset FROM {s}.time_index WHERE stream_id = %s"
        " AND max_timestamp < %s ORDER BY max_timestamp DESC"
    )
    delete_time_index: str = (
        "DELETE FROM {s}.time_index WHERE stream_id = %s AND max_timestamp = ANY(%s::bigint[])"
    )
    # Garbage through the index of dead objects, each row with what one scan of the
    # whole table counts (the same snapshot): rows due, and rows without a live batch
    # nor a time of death.
    objects_to_delete: str = (
        "WITH n AS (SELECT count(*) FILTER (WHERE dead_since <= %(cutoff)s) AS due,"
        " count(*) FILTER (WHERE live_batches = 0 AND dead_since IS NULL) AS undated"
        " FROM {s}.objects)"
        " SELECT n.due, n.undated, o.id, o.key, o.live_batches, o.dead_since, o.crc FROM n"
        " LEFT JOIN (SELECT * FROM {s}.objects WHERE dead_since IS NOT NULL"
        " AND dead_since <= %(cutoff)s) AS o ON true ORDER BY o.dead_since, o.key"
    )
    forget_objects: str = (
        "DELETE FROM {s}.objects WHERE key = ANY(%s) AND live_batches = 0"
        " RETURNING id, key, live_batches, dead_since, crc"
    )
    # Every object with the number of batch rows, in one snapshot.
    list_objects: str = (
        "SELECT n.batches, o.id, o.key, o.live_batches, o.dead_since, o.crc"
        " FROM (SELECT count(*) AS batches FROM {s}.batches) AS n"
        ' LEFT JOIN {s}.objects AS o ON true ORDER BY o.key COLLATE "C"'
    )
    # Leases: the row locked while a swap compares its serial; a first swap locks
    # lease_count and inserts it (of two at once, the one whose insert conflicts finds
    # it taken). lease_count and the rows' count come in one snapshot.
    lease_count: str = (  # with no lease, one row of NULL lease columns
        "SELECT c.leases, c.crc, l.name, l.holder, l.token, l.serial, l.duration_ms, l.crc"
        " FROM (SELECT 1) AS q LEFT JOIN {s}.lease_count AS c ON c.id = 0"
        " LEFT JOIN {s}.leases AS l ON true"
    )
    lock_lease_count: str = "SELECT leases, crc FROM {s}.lease_count WHERE id = 0 FOR UPDATE"
    all_leases: str = "SELECT name, holder, token, serial, duration_ms, crc FROM {s}.leases"
    put_lease_count: str = "UPDATE {s}.lease_count SET leases = %s, crc = %s WHERE id = 0"
    lease_row: str = (
        "SELECT holder, token, serial, duration_ms, crc FROM {s}.leases WHERE name = %s"
    )
    lock_lease: str = (
        "SELECT holder, token, serial, duration_ms, crc FROM {s}.leases WHERE name = %s FOR UPDATE"
    )
    insert_lease: str = (
        "INSERT INTO {s}.leases (name, holder, token, serial, duration_ms, crc)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING 1"
    )
    put_lease: str = (
        "UPDATE {s}.leases SET holder = %s, token = %s, serial = %s, duration_ms = %s, crc = %s"
        " WHERE name = %s"
    )
    # A drop locks the row, then lease_count (the order of a first swap), raises the
    # floor row and deletes the row.
    put_floor: str = (
        "INSERT INTO {s}.leases (name, holder, token, serial, duration_ms, crc)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET"
        " token = EXCLUDED.token, serial = EXCLUDED.serial, crc = EXCLUDED.crc"
    )
    delete_lease: str = "DELETE FROM {s}.leases WHERE name = %s"
    # Consumer groups: a group's row in groups counts its offset rows; it is locked
    # before any of them changes.
    claim_group: str = (
        "INSERT INTO {s}.groups (group_name, streams, crc) VALUES (%s, 0, %s)"
        " ON CONFLICT (group_name) DO NOTHING"
    )
    lock_group: str = "SELECT streams, crc FROM {s}.groups WHERE group_name = %s FOR UPDATE"
    lock_groups_of_stream: str = (
        "SELECT g.group_name FROM {s}.groups AS g WHERE EXISTS (SELECT 1 FROM"
        " {s}.group_offsets AS o WHERE o.group_name = g.group_name AND o.stream = %s)"
        " ORDER BY g.group_name FOR UPDATE"
    )
    put_group: str = "UPDATE {s}.groups SET streams = %s, crc = %s WHERE group_name = %s"
    drop_group: str = "DELETE FROM {s}.groups WHERE group_name = %s"
    known_offsets: str = (
        "SELECT stream FROM {s}.group_offsets WHERE group_name = %s AND stream = ANY(%s::text[])"
    )
    commit_offsets: str = (
        "INSERT INTO {s}.group_offsets (group_name, stream, next_offset, crc)"
        " SELECT %s, n, o, c FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS g(n, o, c)"
        " ORDER BY n ON CONFLICT (group_name, stream) DO UPDATE"
        " SET next_offset = excluded.next_offset, crc = excluded.crc"
    )
    delete_offsets_of_stream: str = (
        "DELETE FROM {s}.group_offsets WHERE stream = %s RETURNING group_name"
    )
    list_groups: str = "SELECT group_name, streams, crc FROM {s}.groups ORDER BY group_name"
    committed_offsets: str = (
        "SELECT g.streams, g.crc, o.stream, o.next_offset, o.crc"
        " FROM (SELECT %s::text AS name) AS q"
        " LEFT JOIN {s}.groups AS g ON g.group_name = q.name"
        " LEFT JOIN {s}.group_offsets AS o ON o.group_name = q.name"
    )

    def render(self, schema: str, conn: Connection) -> _Queries:
        """The statements of ``schema``, its name quoted by psycopg."""
        name = sql.Identifier(schema)
        return _Queries(
            **{
                f.name: sql.SQL(getattr(self, f.name)).format(s=name).as_string(conn)
                for f in fields(self)
            }
        )


_QUERIES = _Queries()

# ------------------------------------------------------------------------------ URLs


@dataclass(frozen=True)
class PostgresOptions:
    """A parsed ``postgresql://`` URL: what libpq gets, and the sequencer's own options.
    ``display_url`` is the URL with any password masked, safe to log and show."""

    conninfo: str
    schema: str
    pool_size: int
    timeout: float
    display_url: str


def validate_schema_name(name: object) -> str:
    """Return ``name`` if it is a schema name the sequencer accepts, else raise
    :class:`~disklesslog.errors.InvalidURL`. Strict on purpose: 1-63 of ``[a-z0-9_]``,
    not starting with a digit or ``pg_`` (reserved by PostgreSQL), so the name means the
    same quoted or not and never needs escaping in logs or ``psql``."""
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name) or name.startswith("pg_"):
        raise InvalidURL(
            f"invalid schema name {name!r}: use 1-63 characters of lowercase letters, digits "
            "and '_', starting with a letter or '_' and not with 'pg_'"
        )
    return name


def parse_postgres_url(url: str) -> PostgresOptions:
    """Split a ``postgresql://`` URL into libpq's connection string and the sequencer's
    options (``schema``, ``pool_size``, ``timeout``); raises InvalidURL."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidURL(
            f"a PostgreSQL sequencer URL looks like postgresql://user@host:5432/dbname, not {url!r}"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise InvalidURL(f"not a postgresql:// URL: {url!r}")
    if parts.fragment:
        raise InvalidURL(f"PostgreSQL URL {_mask(url)!r} has a #fragment; remove it")
    # The query string is split by hand, not with parse_qsl: libpq does not read '+' as
    # a space, so options meant for libpq are passed on exactly as written.
    own: dict[str, str] = {}
    rest: list[str] = []
    for pair in parts.query.split("&") if parts.query else ():
        raw_key, equals, raw_value = pair.partition("=")
        key = unquote(raw_key)
        if key not in _OWN_OPTIONS:
            rest.append(pair)
        elif not equals or key in own:
            raise InvalidURL(
                f"PostgreSQL URL {_mask(url)!r}: give each of {', '.join(_OWN_OPTIONS)} "
                "at most once, as name=value"
            )
        else:
            own[key] = unquote(raw_value)
    schema = validate_schema_name(own.get("schema", DEFAULT_SCHEMA))
    pool_size = _parse_int(own.get("pool_size", "10"), "pool_size", 1, 1000)
    timeout = _parse_seconds(own.get("timeout", "30"), "timeout")
    if not any(unquote(pair.partition("=")[0]) == "connect_timeout" for pair in rest):
        rest.append(f"connect_timeout={_DEFAULT_CONNECT_TIMEOUT}")
    # libpq knows both schemes, in lower case only.
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, "&".join(rest), ""))
    try:
        conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise InvalidURL(f"PostgreSQL URL {_mask(url)!r}: {str(exc).strip()}") from None
    return PostgresOptions(conninfo, schema, pool_size, timeout, _mask(url))


def _parse_int(text: str, what: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise InvalidURL(f"{what}={text!r} must be an integer from {low} to {high}")
    return value


def _parse_seconds(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidURL(f"{what}={text!r} must be a number of seconds > 0")
    return value


def _mask(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def open_postgres_sequencer(url: str) -> PostgresSequencer:
    """Open (creating or migrating the schema if needed) the sequencer a
    ``postgresql://`` URL names."""
    return PostgresSequencer(url)


# --------------------------------------------------------------------- connections

_LIVE: weakref.WeakSet[PostgresSequencer] = reset_after_fork(
    lambda sequencer: sequencer._forget_pool()
)
_INHERITED: list[Any] = []  # pools a fork child must neither use nor close


class _Attempt:
    """What one try of a call got to: whether ``COMMIT`` was sent (after which a lost
    connection leaves the outcome unknown) and whether its connection died."""

    __slots__ = ("committing", "lost")

    def __init__(self) -> None:
        self.committing = False
        self.lost = False


def _configure(timeout: float) -> Callable[[Connection], None]:
    """Set up each new pooled connection: every Python int is sent as ``bigint`` (one
    prepared statement per query, whatever the values' sizes); row locks are waited for
    at most ``timeout``; prepared statements always use their generic plan. The
    statements are small OLTP lookups by key whose best plan does not depend on the
    values, and PostgreSQL otherwise keeps re-planning some of them per call (custom
    plans, ~0.2-0.4 ms each, measured on the commit path)."""

    def configure(conn: Connection) -> None:
        conn.adapters.register_dumper(int, Int8Dumper)
        conn.adapters.register_dumper(int, Int8BinaryDumper)
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false),"
            " set_config('plan_cache_mode', 'force_generic_plan', false)",
            (f"{max(1, int(timeout * 1000))}ms",),
        )

    return configure


def _command(conn: Connection, command: bytes) -> None:
    """Run BEGIN, COMMIT or ROLLBACK straight through libpq (``PQexec``, which releases
    the GIL): half the client CPU of ``cursor.execute``, whose prepared-statement and
    result machinery such commands do not need (measured ~50 us less per commit).
    Errors are raised as psycopg raises them."""
    result = conn.pgconn.exec_(command)
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
    if command == b"COMMIT" and result.command_status != b"COMMIT":
        # The server answers COMMIT of a failed transaction with ROLLBACK, not an error.
        raise psycopg.DatabaseError("the transaction failed and was rolled back")


def _ints(values: Iterable[Any]) -> str:
    """A ``bigint[]`` literal for an ``%s::bigint[]`` parameter. psycopg dumps a list
    element by element in Python; one join in C costs a fraction of that (measured:
    the commit statement's parameters went from ~150 to ~30 us). ``operator.index``
    refuses anything but ints, so the literal can only hold integers."""
    return "{" + ",".join(map(str, map(operator.index, values))) + "}"


def _texts(values: Sequence[str]) -> str:
    """A ``text[]`` literal for an ``%s::text[]`` parameter, every element quoted (so
    ``NULL`` is a string) with backslashes and double quotes escaped: the array syntax's
    own quoting, right for any text (NUL aside, which PostgreSQL text cannot hold)."""
    if not values:
        return "{}"
    return '{"' + '","'.join(v.replace("\\", "\\\\").replace('"', '\\"') for v in values) + '"}'


def _tail_gaps(streams: Sequence[tuple[StreamRow, StreamCursor]]) -> dict[Any, int]:
    """Stream id -> ``tail_gap`` of the streams a commit touches that have one: the
    ``gap`` each one's first new batch takes over."""
    return {row.id: row.tail_gap for row, _ in streams if row.tail_gap}


def _check_text(value: str, what: str) -> str:
    """PostgreSQL text cannot hold NUL: refuse it up front with a typed error."""
    if "\x00" in value:
        raise ConfigError(f"{what} {value!r} contains a NUL character, which PostgreSQL refuses")
    return value


# ------------------------------------------------------------------------ sequencer


class PostgresSequencer(Sequencer):
    """A sequencer in a PostgreSQL schema, safe for many threads, processes and machines.

    ``url`` is described in the module docstring; ``clock`` (seconds since the epoch)
    stamps when objects stop holding live batches, and tests inject one.
    """

    def __init__(self, url: str, *, clock: Clock = time.time) -> None:
        options = parse_postgres_url(url)
        self.url = options.display_url
        self.schema = options.schema
        self.pool_size = options.pool_size
        self.timeout = options.timeout
        self._options = options
        self._clock = clock
        if clock is not time.time:  # an injected clock measures leases too
            self.lease_clock = clock
        self._closed = False
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._where = f"PostgreSQL {self.url} schema {self.schema}"
        self._states = StateCache(self._where)
        self._q = self._migrate()
        self._pool = self._new_pool()
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"PostgresSequencer({self.url}, schema={self.schema})"

    # ------------------------------------------------------------ connections

    def _connect_error(self, exc: BaseException) -> SequencerError:
        detail = str(exc).strip() or type(exc).__name__
        return SequencerError(
            f"cannot connect to PostgreSQL at {self.url}: {detail}. Is the server running and "
            "reachable, and are the user, password and database right?"
        )

    def _migrate(self) -> _Queries:
        """Create or upgrade the schema in one transaction under an advisory lock; returns
        the statements rendered for it. Opening is where a wrong URL shows, so the first
        connection is a plain one: its error (refused, unknown host, bad password) is
        reported as it is, at once, instead of a pool timeout later."""
        try:
            conn = psycopg.connect(self._options.conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise self._connect_error(exc) from None
        try:
            with conn:
                with conn.transaction():
                    apply_migrations(conn, self.schema, self._where, clock_ms(self._clock))
                return _QUERIES.render(self.schema, conn)
        except psycopg.Error as exc:
            raise SequencerError(
                f"could not prepare the sequencer schema {self.schema!r} at {self.url}: "
                f"{exc}".strip()
            ) from exc

    def _new_pool(self) -> ConnectionPool[Connection]:
        pool: ConnectionPool[Connection] = ConnectionPool(
            self._options.conninfo,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True},
            configure=_configure(self.timeout),
            timeout=self.timeout,
            name=f"disklesslog-{self.schema}",
            num_workers=2,  # threads that open connections in the background
            open=False,
        )
        pool.open(wait=False)
        return pool

    def _forget_pool(self) -> None:
        """In a fork child: keep the parent's pool referenced, unused and unclosed (its
        sockets are the parent's), and open a new one on first use."""
        _INHERITED.append(self._pool)
        self._lock = threading.Lock()
        self._pid = -1

    def _child_pool(self) -> None:
        with self._lock:
            if self._pid != os.getpid():
                if self._closed:
                    raise LogClosedError(f"{self!r} was closed")
                self._pool = self._new_pool()
                self._pid = os.getpid()

    def close(self) -> None:
        """Close the pool: idle connections at once, busy ones as their calls finish;
        later calls raise LogClosedError. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool = self._pool if self._pid == os.getpid() else None
        if pool is not None:
            pool.close()
        _LIVE.discard(self)

    def _call(self, work: Callable[[Connection], T], *, transaction: bool = False) -> T:
        """Run ``work`` on a pooled connection, in one transaction if asked (else each
        statement commits by itself: single-statement reads and writes). Retries
        deadlocks and serialization failures with jittered backoff, and dead pooled
        connections when nothing can have been applied; maps driver errors to ours."""
        if self._pid != os.getpid():
            self._child_pool()
        delay = _RETRY_FIRST
        deadline = time.monotonic() + self.timeout
        conflicts = reconnects = 0
        while True:
            attempt = _Attempt()
            try:
                return self._attempt(work, transaction, attempt)
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                conflicts += 1
                if conflicts >= _RETRY_ATTEMPTS or time.monotonic() + delay > deadline:
                    raise SequencerError(
                        f"PostgreSQL sequencer {self.url}: gave up after {conflicts} "
                        f"conflicting transactions ({exc.sqlstate}); nothing was applied. "
                        "Retry later"
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, _RETRY_MAX)
            except (PoolClosed, PoolTimeout) as exc:
                if self._closed:
                    raise LogClosedError(f"{self!r} was closed") from None
                if isinstance(exc, PoolClosed):
                    raise SequencerError(f"{self!r}: its connection pool was closed") from exc
                raise SequencerError(
                    f"no connection to PostgreSQL at {self.url} within {self.timeout:g} s: "
                    f"the server is unreachable or all {self.pool_size} pooled connections "
                    "are busy; nothing was applied. Check the server, or raise ?timeout= or "
                    "?pool_size= in the URL"
                ) from exc
            except psycopg.Error as exc:
                if self._closed:
                    raise LogClosedError(f"{self!r} was closed") from None
                if attempt.lost and not attempt.committing and reconnects < _RECONNECT_ATTEMPTS:
                    reconnects += 1
                    self._pool.check()  # drop every other dead connection too
                    continue
                raise self._error(exc, attempt) from exc
            except OverflowError as exc:
                raise ConfigError(
                    f"a number does not fit PostgreSQL's 64-bit integers ({exc})"
                ) from None

    def _attempt(self, work: Callable[[Connection], T], transaction: bool, at: _Attempt) -> T:
        with self._pool.connection() as conn:
            try:
                if not transaction:
                    return work(conn)
                _command(conn, b"BEGIN")
                try:
                    result = work(conn)
                except BaseException:
                    if not conn.broken and conn.info.transaction_status:
                        with contextlib.suppress(psycopg.Error):
                            _command(conn, b"ROLLBACK")
                    raise
                at.committing = True
                _command(conn, b"COMMIT")
                return result
            except psycopg.Error:
                at.lost = conn.broken or conn.closed
                raise

    def _error(self, exc: psycopg.Error, attempt: _Attempt) -> Exception:
        detail = str(exc).strip() or type(exc).__name__
        if attempt.lost:
            if attempt.committing:
                return SequencerError(
                    f"lost the connection to PostgreSQL at {self.url} while committing "
                    f"({detail}): the change may or may not have been applied. Check, or "
                    "retry it (a writer's retried commit is answered with its original offsets)"
                )
            return SequencerError(
                f"lost the connection to PostgreSQL at {self.url} ({detail}); nothing was "
                "applied. Check the server and retry"
            )
        if isinstance(exc, pg_errors.LockNotAvailable):
            return SequencerError(
                f"PostgreSQL sequencer {self.url}: waited more than {self.timeout:g} s for a "
                "row lock held by another transaction; nothing was applied. Retry, or raise "
                "?timeout= in the URL"
            )
        if exc.sqlstate in _DAMAGE_STATES:
            return CorruptDataError(
                f"PostgreSQL reports: {detail}; nothing was applied. See 'A damaged "
                "sequencer database' in docs/operations.md",
                source=self._where,
            )
        if isinstance(exc, psycopg.DataError):
            return ConfigError(f"PostgreSQL refused a value: {detail}; nothing was applied")
        return SequencerError(f"PostgreSQL sequencer {self.url}: {detail}; nothing was applied")

    # ---------------------------------------------------------------- streams

    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _check_text(name, "stream name")
        _, text = config_copy(config)

        def work(conn: Connection) -> StreamMeta:
            while True:  # until inserted or found: a concurrent delete may remove it
                row = self._find_stream(conn, name)  # a lost stream is damage, not created
                if row is not None:
                    return self._meta(row)
                key = name_key(name)
                count = self._lock_stream_count(conn, name_bucket(key))
                inserted = conn.execute(self._q.insert_stream, (name, text, key)).fetchone()
                if inserted is not None:
                    row = StreamRow(inserted[0], name, text, 0, 0, None, 0, 0)
                    conn.execute(self._q.stream_crc, (row_crc(row), row.id))
                    self._put_stream_count(conn, name_bucket(key), count + 1)
                    return self._meta(row)

        return self._call(work, transaction=True)

    def alter_stream(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        config_copy(changes)  # checked before anything changes

        def work(conn: Connection) -> StreamMeta:
            row = self._lock_stream(conn, name)
            self._meta(row)  # the stored config parses
            row = row._replace(config=merged_config(row.config, changes))
            self._put_stream(conn, row)
            return self._meta(row)

        return self._call(work, transaction=True)

    def delete_stream(self, name: str) -> None:
        validate_stream_name(name)
        now = float(self._clock())

        def work(conn: Connection) -> None:
            row = self._lock_stream(conn, name)
            self._drop_batches(conn, row, _INT64_MAX, now)
            locked = [r[0] for r in conn.execute(self._q.lock_groups_of_stream, (name,))]
            gone = [r[0] for r in conn.execute(self._q.delete_offsets_of_stream, (name,))]
            for group in sorted(set(locked) | set(gone)):
                self._count_group(conn, group, -gone.count(group))
            # the stream row is locked: no commit changes its producer states meanwhile
            states = conn.execute(self._q.states_of_stream, (row.id,)).fetchall()
            for state in states:
                self._states.load(*state)  # verified before its time is trusted
            self._keep_use(conn, self._last_writes(states), set())
            conn.execute(self._q.delete_stream, {"id": row.id})
            bucket = name_bucket(name_key(name))
            self._put_stream_count(conn, bucket, self._lock_stream_count(conn, bucket) - 1)

        self._call(work, transaction=True)

    def list_streams(self) -> list[str]:
        """Every stream's name, each row verified and the rows of every range of name
        keys as many as its ``stream_count`` row records (a lost row, or a damaged
        ``name_key``, shows as a range one short)."""
        rows = self._call(lambda conn: conn.execute(self._q.all_streams).fetchall())
        recorded = {row[1]: (row[4], row[9]) for row in rows if row[0] == 0}
        found = [0] * STREAM_COUNT_BUCKETS  # the table's CHECK keeps ids in range
        names = []
        for row in rows:
            if row[0] == 0:
                continue
            stream = self._verified(row[1:10])
            key = row[10]
            if not 0 <= (key if isinstance(key, int) else -1) < 1 << 32:
                where = f"{stream.name!r} (id {stream.id})"
                raise damaged_row(self._where, "streams", where, "its name_key is damaged")
            found[name_bucket(key)] += 1
            names.append(stream.name)
        for bucket, count in enumerate(found):
            check_stream_count(self._where, recorded.get(bucket), count, bucket)
        return names

    def stream_info(self, name: str) -> StreamMeta:
        validate_stream_name(name)
        row = self._call(lambda conn: self._find_stream(conn, name))
        if row is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        return self._meta(row)

    def _meta(self, row: StreamRow) -> StreamMeta:
        config = json_value(row.config, dict, self._where, "streams", f"{row.name!r}")
        return StreamMeta(row.name, row.start_offset, row.end_offset, config)

    def _find_stream(self, conn: Connection, name: str) -> StreamRow | None:
        """The verified row of ``name``, or None. The rows with the name's ``name_key``
        come with it, in the same statement (one snapshot), and are verified too: a
        damaged name must not make a stream vanish, or let a second one of that name be
        created. (A damaged name index is harmless here: the key's index finds the row.)
        Before None, the streams rows of the name's range of name keys are counted
        against its ``stream_count`` row (one more statement, one snapshot, through the
        name-key index): a lost row must not make a stream vanish either, nor let it be
        created anew from offset 0."""
        found = None
        key = name_key(name)
        if "\x00" not in name:  # else never stored
            for row in conn.execute(self._q.stream_row, (name, key)).fetchall():
                verified = self._verified(row)
                if verified.name == name:
                    found = verified
        if found is None:
            bucket = name_bucket(key)
            low, high = bucket_keys(bucket)
            params = {"low": low, "high": high, "bucket": bucket}
            (counted,) = conn.execute(self._q.count_streams, params).fetchall()  # one row
            check_stream_count(self._where, counted, counted[2], bucket)
        return found

    def _lock_stream_count(self, conn: Connection, bucket: int) -> int:
        """The number of streams row ``bucket`` of ``stream_count`` records, the row
        locked until the end of the transaction (creates and deletes of names in its
        range take turns on it) and verified."""
        row = conn.execute(self._q.lock_stream_count, (bucket,)).fetchone()
        return stream_count(self._where, row, bucket)

    def _put_stream_count(self, conn: Connection, bucket: int, count: int) -> None:
        conn.execute(self._q.put_stream_count, (count, row_crc((count,)), bucket))

    def _verified(self, row: Sequence[Any]) -> StreamRow:
        """A streams row (:data:`_STREAM_COLUMNS`), its checksum verified unless this
        process saw it exactly as it is."""
        values = new_stream_row(row[:8])
        if row_crc(values) != row[8]:
            raise damaged_row(self._where, "streams", f"{values.name!r} (id {values.id})")
        return values

    def _lock_stream(self, conn: Connection, name: str) -> StreamRow:
        """The verified row of ``name``, locked until the end of the transaction;
        StreamNotFound."""
        row = conn.execute(self._q.lock_stream, (name,)).fetchone()
        if row is None:
            self._find_stream(conn, name)  # damage, rather than StreamNotFound
            raise StreamNotFound(f"stream {name!r} does not exist")
        return self._verified(row)

    def _put_stream(self, conn: Connection, row: StreamRow) -> None:
        conn.execute(self._q.put_stream, (*row[2:], row_crc(row), row.id))

    # -------------------------------------------------------------- producers

    def init_producer(self, name: str | None = None) -> tuple[int, int]:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"a producer name must be a non-empty str or None, not {name!r}")
        if name is not None:
            _check_text(name, "producer name")

        def work(conn: Connection) -> tuple[int, int]:
            now_ms = clock_ms(self._clock)
            while True:  # until found or inserted: a concurrent init may insert it first
                if name is not None:
                    row = conn.execute(self._q.find_producer, (name,)).fetchone()
                    if row is not None:
                        producer_id, epoch = self._producer(row)
                        used_ms = max(now_ms, int(row[3]))
                        self._put_producer(conn, producer_id, name, epoch + 1, used_ms)
                        return producer_id, epoch + 1
                # an identity column: an id is never issued again, even once dropped
                inserted = conn.execute(self._q.insert_producer, (name, now_ms)).fetchone()
                if inserted is not None:
                    producer_id = int(inserted[0])
                    self._put_producer(conn, producer_id, name, 0, now_ms)
                    return producer_id, 0

        return self._call(work, transaction=True)

    def _producer(self, row: Sequence[Any]) -> tuple[int, int]:
        """``(id, epoch)`` of a verified ``(id, name, epoch, used_ms, crc)`` producers row."""
        if row_crc(row[:4]) != row[4]:
            raise damaged_row(self._where, "producers", f"id {row[0]}")
        return int(row[0]), int(row[2])

    def _put_producer(
        self, conn: Connection, producer_id: int, name: str | None, epoch: int, used_ms: int
    ) -> None:
        crc = row_crc((producer_id, name, epoch, used_ms))
        conn.execute(self._q.put_producer, (epoch, used_ms, crc, producer_id))

    def expire_producers(self, older_than_ms: int, *, dry_run: bool = False) -> ProducerExpiry:
        """One transaction: every state and producer row read and verified (a maintenance
        pass's cost, once a minute at most, over a state expiry keeps bounded), then the
        producers concerned locked in id order, as commits lock them, before states go.
        A state a commit rewrote meanwhile, and a producer that has a state again, stay."""
        check_expiry_age(older_than_ms)

        def work(conn: Connection) -> ProducerExpiry:
            cutoff = clock_ms(self._clock) - older_than_ms
            old: list[tuple[int, int, str]] = []
            left: set[int] = set()
            for stream_id, producer_id, text, crc in conn.execute(self._q.all_states).fetchall():
                state = self._states.load(stream_id, producer_id, text, crc)
                if state.written_ms < cutoff:
                    old.append((stream_id, producer_id, text))
                else:
                    left.add(producer_id)
            written = self._last_writes(old)
            candidates = []
            for row in conn.execute(self._q.all_producers).fetchall():
                producer_id, _ = self._producer(row)
                if producer_id not in left and max(row[3], written.get(producer_id, 0)) < cutoff:
                    candidates.append(producer_id)
            if dry_run:
                return ProducerExpiry(states=len(old), producers=len(candidates))
            locked = self._lock_producers(conn, set(written) | set(candidates))
            gone = conn.execute(
                self._q.delete_states,
                ([s for s, _, _ in old], [p for _, p, _ in old], [t for _, _, t in old]),
            ).fetchall()
            latest = self._last_writes([(0, p, t) for p, t in gone])
            kept = {
                int(r[0])
                for r in conn.execute(self._q.producers_with_state, (candidates,)).fetchall()
            }
            doomed = [
                p
                for p in candidates
                if p in locked and p not in kept and max(locked[p][3], latest.get(p, 0)) < cutoff
            ]
            self._keep_use(conn, latest, set(doomed), locked)
            if doomed:
                conn.execute(self._q.delete_producers, (doomed,))
            return ProducerExpiry(states=len(gone), producers=len(doomed))

        return self._call(work, transaction=True)

    @staticmethod
    def _last_writes(states: Sequence[Sequence[Any]]) -> dict[int, int]:
        """Per producer, the latest write of ``(stream_id, producer_id, state, ...)`` rows
        (verified or just read back from a verified text)."""
        latest: dict[int, int] = {}
        for row in states:
            written = ProducerStreamState.from_json(row[2]).written_ms
            latest[int(row[1])] = max(latest.get(int(row[1]), 0), written)
        return latest

    def _lock_producers(self, conn: Connection, ids: set[int]) -> dict[int, Sequence[Any]]:
        """The producers rows of ``ids`` still there, locked in id order and verified."""
        rows = conn.execute(self._q.lock_producers, (sorted(ids),)).fetchall()
        return {self._producer(row)[0]: row for row in rows}

    def _keep_use(
        self,
        conn: Connection,
        latest: Mapping[int, int],
        doomed: set[int],
        locked: Mapping[int, Sequence[Any]] | None = None,
    ) -> None:
        """States going (their stream deleted, or expired) with these last writes per
        producer: each producer's ``used_ms`` keeps them, so a producer is never taken
        for idle while it wrote within the window (commits write only the state rows,
        never the producer's). ``doomed`` producers are being dropped anyway."""
        if locked is None:
            locked = self._lock_producers(conn, set(latest))
        for producer_id, written in latest.items():
            row = locked.get(producer_id)
            if row is not None and producer_id not in doomed and written > row[3]:
                self._put_producer(conn, producer_id, row[1], int(row[2]), written)

    # ---------------------------------------------------------------- commits

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        _check_text(check_object_key(object_key), "object key")
        batches = check_batches(batches)

        def work(conn: Connection) -> list[CommitResult]:
            now = float(self._clock())
            cur = conn.cursor()
            plan, streams = self._plan(cur, batches)
            gaps = _tail_gaps(streams)
            self._write(cur, object_key, plan.accepted, plan, streams, gaps, now)
            return plan.results

        return self._call(work, transaction=True)

    def _write(
        self,
        cur: psycopg.Cursor[Any],
        object_key: str,
        accepted: Sequence[tuple[StreamCursor, BatchToCommit, int]],
        plan: CommitPlan | None,
        streams: Sequence[tuple[StreamRow, StreamCursor]],
        gaps: dict[Any, int],
        now: float,
    ) -> None:
        """Store one object's accepted batches with ``write_commit``; with ``plan``, also
        the streams' new extents, producer states and time-index entries (a transaction
        passes them with its last object only). An object known already (a retried
        commit) is verified, then counts its new batches."""
        live = len(accepted)
        row = cur.execute(
            self._q.write_commit,
            self._write_params(object_key, accepted, plan, streams, gaps, now),
        ).fetchone()
        if row is None:  # pragma: no cover - INSERT ... ON CONFLICT DO UPDATE returns a row
            raise SequencerError(f"PostgreSQL sequencer {self.url}: no object row")
        object_id, count, dead_since, crc, inserted = row
        if not inserted:
            if row_crc((object_key, count, dead_since)) != crc:
                raise damaged_row(self._where, "objects", f"{object_key!r}")
            if live:
                values = (object_key, count + live, None)
                cur.execute(self._q.put_object, (*values[1:], row_crc(values), object_id))

    def _write_params(
        self,
        object_key: str,
        accepted: Sequence[tuple[StreamCursor, BatchToCommit, int]],
        plan: CommitPlan | None,
        streams: Sequence[tuple[StreamRow, StreamCursor]],
        gaps: dict[Any, int],
        now: float,
    ) -> dict[str, Any]:
        """Parameters of ``write_commit``. Each row's checksum is computed here; a
        stream's first new batch takes over its ``tail_gap`` as its ``gap``, so the gaps
        are consumed (``gaps``: stream id -> tail gap) as the objects of a
        transaction are written, in order."""
        batches = [
            (
                c.key,
                object_key,
                b.position,
                b.size,
                base,
                base + b.span - 1,
                b.max_timestamp,
                gaps.pop(c.key, 0) if gaps else 0,
            )
            for c, b, base in accepted
        ]
        moved: list[tuple[Any, ...]] = []
        states: list[tuple[Any, int, str, int]] = []
        times: dict[tuple[Any, int], int] = {}
        if plan is not None:
            moved = [
                (*row[:4], c.end, c.max_timestamp, c.unindexed, 0) for row, c in streams if c.dirty
            ]
            states = self._states.store(plan.states)
            times = {(c.key, ts): offset for c, ts, offset in plan.time_index}  # last wins
        moved_crcs = list(row_crcs(moved))
        entries = [(key[0], key[1], offset) for key, offset in times.items()]
        dead = None if accepted else now
        return {
            "key": object_key,
            "live": len(accepted),
            "dead": dead,
            "crc": row_crc((object_key, len(accepted), dead)),
            "b_stream": _ints([b[0] for b in batches]),
            "b_position": _ints([b[2] for b in batches]),
            "b_size": _ints([b[3] for b in batches]),
            "b_base": _ints([b[4] for b in batches]),
            "b_last": _ints([b[5] for b in batches]),
            "b_ts": _ints([b[6] for b in batches]),
            "b_gap": _ints([b[7] for b in batches]),
            "b_crc": _ints(row_crcs(batches)),
            "s_id": _ints([m[0] for m in moved]),
            "s_end": _ints([m[4] for m in moved]),
            "s_ts": _ints([m[5] for m in moved]),
            "s_unindexed": _ints([m[6] for m in moved]),
            "s_crc": _ints(moved_crcs),
            "p_stream": _ints([s[0] for s in states]),
            "p_id": _ints([s[1] for s in states]),
            "p_state": _texts([s[2] for s in states]),
            "p_crc": _ints([s[3] for s in states]),
            "t_stream": _ints([e[0] for e in entries]),
            "t_ts": _ints([e[1] for e in entries]),
            "t_next": _ints([e[2] for e in entries]),
            "t_crc": _ints(row_crcs(entries)),
        }

    def commit_transaction(
        self, transaction_id: str, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> TransactionResult:
        """One SQL transaction: forget expired ids, claim the id's row (a concurrent
        commit of the same id waits here, before any stream lock), then lock the streams
        in name order as :meth:`commit` does and write every object's batches, one
        statement per object; the stream extents go with the last one."""
        txn, checked, flat = check_transaction(transaction_id, objects)
        for key, _ in checked:
            _check_text(key, "object key")

        def work(conn: Connection) -> TransactionResult:
            now = float(self._clock())
            cur = conn.cursor()
            cur.execute(self._q.forget_old_transactions, (transaction_cutoff(now),))
            claimed = cur.execute(self._q.claim_transaction, (txn, now)).fetchone()
            if claimed is None:
                row = cur.execute(self._q.transaction_ranges, (txn,)).fetchone()
                if row is None:  # expired between the two statements: no answer to give
                    raise SequencerError(f"transaction {txn!r} changed under this call; retry")
                ranges = self._ranges(row)
                keys = [k for k, _ in checked]
                orphans = (now, _texts(keys), _ints(row_crcs([(k, 0, now) for k in keys])))
                cur.execute(self._q.record_orphans, orphans)
                return TransactionResult(txn, ranges, duplicate=True)
            given = _texts([key for key, _ in checked])
            known_keys = [row[0] for row in cur.execute(self._q.known_objects, (given,))]
            if known_keys:
                raise already_known(txn, known_keys)
            plan, streams = self._plan(cur, flat)
            gaps = _tail_gaps(streams)
            start = 0
            for i, (key, batches) in enumerate(checked):  # no producers: one entry per batch
                last = i == len(checked) - 1
                accepted = plan.accepted[start : start + len(batches)]
                start += len(batches)
                self._write(cur, key, accepted, plan if last else None, streams, gaps, now)
            ranges = transaction_ranges(plan)
            text = ranges_to_json(ranges)
            cur.execute(self._q.finish_transaction, (text, row_crc((txn, now, text)), claimed[0]))
            cur.execute(self._q.forget_transactions_beyond, (claimed[0], TRACKED_TRANSACTIONS))
            return TransactionResult(txn, ranges)

        return self._call(work, transaction=True)

    def _ranges(self, row: Sequence[Any]) -> dict[str, tuple[int, int]]:
        """The ranges of a verified ``(id, committed_at, ranges, crc)`` transactions row."""
        where = f"{row[0]!r}"
        if row_crc(row[:3]) != row[3]:
            raise damaged_row(self._where, "transactions", where)
        try:
            return ranges_from_json(row[2])
        except (ValueError, TypeError, AttributeError):
            raise damaged_row(
                self._where, "transactions", where, "its ranges do not parse"
            ) from None

    def _plan(
        self, cur: psycopg.Cursor[Any], batches: Sequence[BatchToCommit]
    ) -> tuple[CommitPlan, list[tuple[StreamRow, StreamCursor]]]:
        """Lock and load what the commit's batches touch (every row verified), then judge
        them with the shared rules. Names PostgreSQL cannot store (NUL) cannot name a
        stream: left out, they are reported as unknown streams."""
        names = [n for n in dict.fromkeys(b.stream for b in batches) if "\x00" not in n]
        producer_ids = sorted({b.producer_id for b in batches if b.producer_id != NO_PRODUCER})
        streams: list[tuple[StreamRow, StreamCursor]] = []
        cursors: dict[str, StreamCursor] = {}
        epochs: dict[int, int] = {}
        texts: list[tuple[int, int, str, int]] = []
        fresh = True
        params = {"names": _texts(names), "producers": _ints(producer_ids)}
        for kind, key, text, value, crc, *rest in cur.execute(
            self._q.lock_for_commit, params
        ).fetchall():
            if kind == 0:
                config, start, max_ts, unindexed, tail_gap, current = rest
                row = self._verified(
                    (key, text, config, start, value, max_ts, unindexed, tail_gap, crc)
                )
                cursor = StreamCursor(row.id, row.end_offset, row.max_timestamp, row.unindexed)
                cursors[row.name] = cursor
                streams.append((row, cursor))
                fresh = fresh and bool(current)
            elif kind == 1:
                epochs.update([self._producer((key, text, value, rest[1], crc))])
            else:
                texts.append((key, value, text, crc))
        for name in names:
            if name not in cursors:
                self._find_stream(cur.connection, name)  # damage, rather than StreamNotFound
        if not fresh and producer_ids:  # a commit landed while we waited for a lock
            stream_ids = _ints(c.key for c in cursors.values())
            texts = cur.execute(self._q.load_states, (stream_ids, params["producers"])).fetchall()
        states: dict[tuple[Any, int], ProducerStreamState] = {}
        for stream_id, producer_id, text, crc in texts:
            states[(stream_id, producer_id)] = self._states.load(stream_id, producer_id, text, crc)
        plan = plan_commit(
            batches, cursors, epochs, states, TIME_INDEX_INTERVAL, clock_ms(self._clock)
        )
        return plan, streams

    def record_orphan(self, object_key: str) -> None:
        _check_text(check_object_key(object_key), "object key")
        now = float(self._clock())
        params = (now, _texts([object_key]), _ints([row_crc((object_key, 0, now))]))
        self._call(lambda conn: conn.execute(self._q.record_orphans, params))

    # ------------------------------------------------------------------ reads

    def find_batches(self, stream: str, offset: int, max_bytes: int) -> BatchPage:
        check_position(offset, "offset")
        check_position(max_bytes, "max_bytes")
        validate_stream_name(stream)
        params = {
            "name": stream,
            "offset": check_position(offset, "offset"),
            "limit": _FIRST_PAGE_ROWS,
        }

        def work(conn: Connection) -> BatchPage | None:
            rows = conn.execute(self._q.find_batches, params).fetchall()
            if not rows:
                self._find_stream(conn, stream)  # damage, rather than StreamNotFound
                raise StreamNotFound(f"stream {stream!r} does not exist")
            row = self._verified(rows[0][:9])
            if not row.start_offset <= offset <= row.end_offset:
                raise out_of_range(stream, offset, row.start_offset, row.end_offset)
            found: list[BatchLocation] = []
            if rows[0][9] is None:  # no batch from the offset on
                if offset < row.end_offset:
                    Tiling(self._where, stream, offset).finish(row.end_offset, row.tail_gap)
                return BatchPage(found, row.start_offset, row.end_offset)
            tiling = Tiling(self._where, stream, offset)
            full = self._take(row, found, (r[9:] for r in rows), max_bytes, tiling)
            if full:
                return BatchPage(found, row.start_offset, row.end_offset)
            if len(rows) < _FIRST_PAGE_ROWS:
                tiling.finish(row.end_offset, row.tail_gap)
                return BatchPage(found, row.start_offset, row.end_offset)
            return None  # more than the first statement read: continue with a cursor

        page = self._call(work)
        return page if page is not None else self._find_more(params, max_bytes)

    def _find_more(self, params: dict[str, Any], max_bytes: int) -> BatchPage:
        """The same statement without a limit, read through a server-side cursor: one
        snapshot, fetched in chunks until the page is full."""
        params = {**params, "limit": None}
        stream, offset = params["name"], params["offset"]

        def work(conn: Connection) -> BatchPage:
            found: list[BatchLocation] = []
            with conn.cursor(name="disklesslog_find_batches") as cur:
                cur.itersize = _CURSOR_ROWS
                cur.execute(self._q.find_batches, params)
                first = cur.fetchone()
                if first is None:
                    raise StreamNotFound(f"stream {stream!r} does not exist")  # deleted since
                row = self._verified(first[:9])
                if not row.start_offset <= offset <= row.end_offset:
                    raise out_of_range(stream, offset, row.start_offset, row.end_offset)
                tiling = Tiling(self._where, stream, offset)
                rows = itertools.chain([first], cur)
                if not self._take(row, found, (r[9:] for r in rows), max_bytes, tiling):
                    tiling.finish(row.end_offset, row.tail_gap)
            return BatchPage(found, row.start_offset, row.end_offset)

        return self._call(work, transaction=True)

    def _take(
        self,
        stream: StreamRow,
        found: list[BatchLocation],
        rows: Iterable[Sequence[Any]],
        max_bytes: int,
        tiling: Tiling,
    ) -> bool:
        """Append verified locations of ``_BATCH_COLUMNS`` rows to ``found`` until their
        sizes reach ``max_bytes`` (at least one batch); True once the page is full."""
        total = sum(b.size for b in found)
        for location in self._locations(stream, rows, tiling):
            if found and total + location.size > max_bytes:
                return True
            found.append(location)
            total += location.size
        return False

    def _locations(
        self, stream: StreamRow, rows: Iterable[Sequence[Any]], tiling: Tiling | None
    ) -> Iterator[BatchLocation]:
        """Verified locations of ``_BATCH_COLUMNS`` rows of ``stream``, in the order read,
        each checked to follow the one before (``tiling``)."""
        for batch_id, key, position, size, base, last, max_ts, gap, crc, _ in rows:
            if row_crc((stream.id, key, position, size, base, last, max_ts, gap)) != crc:
                raise damaged_row(
                    self._where, "batches", f"(stream {stream.name!r}, last_offset {last})"
                )
            if tiling is not None:
                tiling.add(base, last, gap)
            yield BatchLocation(batch_id, key, position, size, base, last, max_ts)

    def offset_for_time(self, stream: str, timestamp: int) -> int | None:
        check_position(timestamp, "timestamp")  # any int: timestamps may be negative
        validate_stream_name(stream)
        params = {"name": stream, "ts": timestamp}

        def work(conn: Connection) -> int | None:
            rows = conn.execute(self._q.offset_for_time, params).fetchall()
            if not rows:
                self._find_stream(conn, stream)  # damage, rather than StreamNotFound
                raise StreamNotFound(f"stream {stream!r} does not exist")
            row = self._verified(rows[0][:9])
            if row.max_timestamp is None or row.max_timestamp < timestamp:
                return None  # the running maximum of every batch ever stored
            lower = row.start_offset
            entry_ts, entry_next, entry_crc = rows[0][9:12]
            if entry_ts is not None:
                if row_crc((row.id, entry_ts, entry_next)) != entry_crc:
                    raise damaged_row(
                        self._where, "time_index", f"(stream {stream!r}, max_timestamp {entry_ts})"
                    )
                lower = max(lower, entry_next)
            if lower >= row.end_offset:
                return None
            tiling = Tiling(self._where, stream, lower)
            batches = (r[12:] for r in rows if r[12] is not None)
            for location in self._locations(row, batches, tiling):
                if location.max_timestamp >= timestamp:
                    return max(location.base_offset, row.start_offset)
            tiling.finish(row.end_offset, row.tail_gap)
            return None

        return self._call(work)

    # ------------------------------------------------------------ maintenance

    def trim(self, stream: str, before: int) -> None:
        check_position(before, "before")
        validate_stream_name(stream)
        now = float(self._clock())

        def work(conn: Connection) -> None:
            row = self._lock_stream(conn, stream)
            if before > row.end_offset:
                raise out_of_range(stream, before, row.start_offset, row.end_offset)
            if before <= row.start_offset:
                return
            self._drop_batches(conn, row, before, now)
            conn.execute(self._q.delete_time_index_below, (row.id, before))
            self._put_stream(conn, row._replace(start_offset=before))

        self._call(work, transaction=True)

    def _drop_batches(self, conn: Connection, stream: StreamRow, before: int, now: float) -> None:
        """Delete the batches of ``stream`` below ``before``, verified and checked to tile
        from the start offset (an object's live count must only go down for batches
        that really were in it), and uncount them in their objects."""
        rows = conn.execute(self._q.delete_batches_below, (stream.id, before)).fetchall()
        tiling = Tiling(self._where, stream.name, stream.start_offset)
        for _ in self._locations(stream, rows, tiling):
            pass
        self._release(conn, Counter(row[9] for row in rows).items(), now)

    def replace_batches(
        self, stream: str, old_batch_ids: Sequence[int], new_batches: Sequence[BatchLocation]
    ) -> bool:
        ids = check_old_ids(old_batch_ids)
        news = list(new_batches)
        validate_stream_name(stream)
        now = float(self._clock())

        def work(conn: Connection) -> bool:
            row = self._lock_stream(conn, stream)
            loaded = conn.execute(self._q.load_batches, (row.id, ids)).fetchall()
            if len(loaded) != len(ids):
                return False
            olds = list(self._locations(row, loaded, None))
            first, last = olds[0], olds[-1]
            counted = conn.execute(
                self._q.count_between, (row.id, first.last_offset, last.last_offset)
            ).fetchone()
            if counted is None or counted[0] != len(olds):
                raise not_contiguous(stream)
            check_new_batches(stream, olds, news)
            for b in news:
                _check_text(b.object_key, "object key")
                for value in (b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp):
                    check_position(value, "a replacement batch's numbers")
            # The offsets the old batches held (with the gap before the first) are now
            # the new batches' and their gaps; what is left over joins the gap of the
            # next batch, or the stream's tail.
            claim = first.base_offset - loaded[0][7]
            tiling = Tiling(self._where, stream, claim)
            for old, loaded_row in zip(olds, loaded):
                tiling.add(old.base_offset, old.last_offset, loaded_row[7])
            gaps = []
            for b in news:
                gaps.append(b.base_offset - claim)
                claim = b.last_offset + 1
            leftover = last.last_offset + 1 - claim
            following = conn.execute(self._q.next_batch, (row.id, last.last_offset)).fetchone()
            if following is None:
                tiling.finish(row.end_offset, row.tail_gap)
            else:
                list(self._locations(row, [following], tiling))  # verified, and it follows
                if leftover:
                    values = (row.id, *following[1:7], following[7] + leftover)
                    conn.execute(self._q.put_gap, (values[7], row_crc(values), following[0]))
            conn.execute(self._q.delete_batches, (ids,))
            self._release(conn, Counter(r[9] for r in loaded).items(), now)
            self._insert_replacements(conn, row.id, news, gaps, now)
            new_max = self._repair_time_index(conn, row.id, news)
            self._put_stream(
                conn,
                row._replace(
                    max_timestamp=greatest(row.max_timestamp, new_max),
                    tail_gap=row.tail_gap + (leftover if following is None else 0),
                ),
            )
            return True

        return self._call(work, transaction=True)

    def objects_to_delete(self, grace_seconds: float) -> list[str]:
        """Read through the index of dead objects, every row verified, then checked
        against one scan of the table (a damaged index or ``dead_since`` must not hide
        garbage forever)."""
        cutoff = self._clock() - grace_seconds
        rows = self._call(
            lambda conn: conn.execute(self._q.objects_to_delete, {"cutoff": cutoff}).fetchall()
        )
        keys = []
        for row in rows:
            if row[2] is None:  # no garbage: the counts alone
                continue
            _, key, live, _ = self._object(row[2:])
            if live:
                raise damaged_row(
                    self._where, "objects", f"{key!r}", f"it is dead but counts {live} live batches"
                )
            keys.append(key)
        check_garbage(self._where, len(keys), rows[0][0], rows[0][1])
        return keys

    def forget_objects(self, object_keys: Sequence[str]) -> None:
        keys = [  # a key with NUL was never stored
            key for key in map(check_object_key, check_keys(object_keys)) if "\x00" not in key
        ]

        def work(conn: Connection) -> None:
            for row in conn.execute(self._q.forget_objects, (keys,)).fetchall():
                self._object(row)  # a damaged row is reported, and the DELETE undone

        if keys:
            self._call(work, transaction=True)

    def list_objects(self) -> list[str]:
        """Every object row verified, and their live batches counted against the batch
        rows: the reconcile pass deletes what is not listed here, so a row lost from
        ``objects`` must be an error, not an object deleted from storage."""
        rows = self._call(lambda conn: conn.execute(self._q.list_objects).fetchall())
        keys = []
        live = 0
        for row in rows:
            if row[1] is not None:
                _, key, count, _ = self._object(row[1:])
                keys.append(key)
                live += count
        batches = rows[0][0] if rows else 0
        if batches != live:
            raise damaged_row(
                self._where,
                "objects",
                "(all)",
                f"the objects count {live} live batches but there are {batches} batch rows",
            )
        return keys

    def _object(self, row: Sequence[Any]) -> tuple[int, str, int, float | None]:
        """``(id, key, live_batches, dead_since)`` of a verified objects row."""
        if row_crc(row[1:4]) != row[4]:
            raise damaged_row(self._where, "objects", f"{row[1]!r}")
        return row[0], row[1], row[2], row[3]

    def _release(self, conn: Connection, counts: Iterable[tuple[int, int]], now: float) -> None:
        """Uncount live batches per object; objects left with none are dead from ``now``.
        Their rows are locked in id order first (see the module docstring) and verified."""
        pairs = dict(counts)
        if not pairs:
            return
        updates = []
        for row in conn.execute(self._q.lock_objects, (sorted(pairs),)).fetchall():
            object_id, key, live, dead_since = self._object(row)
            n = pairs.pop(object_id)
            if live < n:
                raise damaged_row(
                    self._where,
                    "objects",
                    f"{key!r}",
                    f"it counts {live} live batches, but {n} of them are being dropped",
                )
            updates.append((object_id, key, live - n, now if live == n else dead_since))
        if pairs:
            raise damaged_row(
                self._where,
                "objects",
                f"id {next(iter(pairs))}",
                "a live batch's object is missing",
            )
        self._put_objects(conn, updates)

    def _put_objects(
        self, conn: Connection, rows: Sequence[tuple[int, str, int, float | None]]
    ) -> None:
        """Store ``(id, key, live_batches, dead_since)`` of objects, with their checksums."""
        conn.execute(
            self._q.put_objects,
            (
                [r[0] for r in rows],
                [r[2] for r in rows],
                [r[3] for r in rows],
                [row_crc(r[1:]) for r in rows],
            ),
        )

    def _insert_replacements(
        self,
        conn: Connection,
        stream_id: int,
        news: Sequence[BatchLocation],
        gaps: Sequence[int],
        now: float,
    ) -> None:
        if not news:
            return
        per_object = Counter(b.object_key for b in news)
        object_ids: dict[str, int] = {}
        while len(object_ids) < len(per_object):  # a key inserted meanwhile: lock it too
            keys = sorted(set(per_object) - set(object_ids))
            known = []
            for row in conn.execute(self._q.lock_objects_by_key, (_texts(keys),)).fetchall():
                object_id, key, live, _ = self._object(row)
                object_ids[key] = object_id
                known.append((object_id, key, live + per_object[key], None))
            self._put_objects(conn, known)
            new = [key for key in keys if key not in object_ids]
            if new:
                inserted = conn.execute(
                    self._q.insert_objects,
                    (
                        _texts(new),
                        [per_object[k] for k in new],
                        [None] * len(new),
                        [row_crc((k, per_object[k], None)) for k in new],
                    ),
                ).fetchall()
                object_ids.update(inserted)
        rows = [
            (
                stream_id,
                b.object_key,
                b.position,
                b.size,
                b.base_offset,
                b.last_offset,
                b.max_timestamp,
                gap,
            )
            for b, gap in zip(news, gaps)
        ]
        conn.execute(
            self._q.insert_batches,
            (
                stream_id,
                [object_ids[r[1]] for r in rows],
                *([r[i] for r in rows] for i in range(2, 8)),
                list(row_crcs(rows)),
            ),
        )

    def _repair_time_index(
        self, conn: Connection, stream_id: int, news: Sequence[BatchLocation]
    ) -> int | None:
        """See :func:`~disklesslog.sequencers.common.time_index_repair`: walks down from
        the highest new timestamp and stops at the first entry at or below the first
        new offset. Returns the highest new timestamp (the stream's maximum rises to it)."""
        repair = time_index_repair(news)
        if repair is None:
            return None
        new_max, low = repair
        stale: list[int] = []
        with conn.cursor() as cur:
            for ts, next_offset in cur.execute(self._q.time_index_below, (stream_id, new_max)):
                if next_offset <= low:
                    break
                stale.append(ts)
        conn.execute(self._q.delete_time_index, (stream_id, stale))
        return new_max

    # -------------------------------------------------------- consumer groups

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        checked = check_offsets(group, offsets)
        for name, offset in checked.items():
            check_position(offset, f"offset of {name!r}")
        if not checked:
            return
        _check_text(group, "group name")
        names, values = list(checked), list(checked.values())

        def work(conn: Connection) -> None:
            conn.execute(self._q.claim_group, (group, row_crc((group, 0))))
            known = {row[0] for row in conn.execute(self._q.known_offsets, (group, _texts(names)))}
            self._count_group(conn, group, len(set(names) - known))
            crcs = [row_crc((group, n, o)) for n, o in zip(names, values)]
            conn.execute(self._q.commit_offsets, (group, _texts(names), values, crcs))

        self._call(work, transaction=True)

    def _count_group(self, conn: Connection, group: str, change: int) -> None:
        """Move the number of offset rows ``groups`` keeps for ``group`` by ``change``,
        its row locked and verified (it goes when the number reaches 0)."""
        row = conn.execute(self._q.lock_group, (group,)).fetchone()
        count = 0 if row is None else self._group_count(group, row)
        if not change:
            return
        if count + change > 0:
            conn.execute(
                self._q.put_group, (count + change, row_crc((group, count + change)), group)
            )
        elif row is not None:
            conn.execute(self._q.drop_group, (group,))

    def _group_count(self, group: str, row: Sequence[Any]) -> int:
        if row_crc((group, row[0])) != row[1]:
            raise damaged_row(self._where, "groups", f"{group!r}")
        return int(row[0])

    # ------------------------------------------------------------------ leases

    def read_lease(self, name: str) -> LeaseRecord | None:
        validate_lease_name(name)

        def work(conn: Connection) -> LeaseRecord | None:
            row = conn.execute(self._q.lease_row, (name,)).fetchone()
            if row is not None:
                return self._lease(name, row)
            self._lease_rows(conn)
            return None

        return self._call(work)

    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        """One transaction: the row locked (``FOR UPDATE``) while its serial is compared,
        so of two processes swapping from one serial one wins. A first record locks
        ``lease_count`` and moves it."""
        validate_lease_name(name)
        r = check_lease_record(serial, record)
        values = (r.holder, r.token, r.serial, r.duration_ms)
        crc = row_crc((name, *values))

        def work(conn: Connection) -> bool:
            row = conn.execute(self._q.lock_lease, (name,)).fetchone()
            if row is not None:
                if self._lease(name, row).serial != serial:
                    return False
                conn.execute(self._q.put_lease, (*values, crc, name))
                return True
            if serial:
                return False
            counted = conn.execute(self._q.lock_lease_count).fetchone()
            leases = conn.execute(self._q.all_leases).fetchall()
            count = check_leases(self._where, counted, leases)
            if not starts_above_floor(r, lease_floor(leases)[0]):
                return False
            if conn.execute(self._q.insert_lease, (name, *values, crc)).fetchone() is None:
                return False  # inserted by another process since this one looked
            conn.execute(self._q.put_lease_count, (count + 1, row_crc((count + 1,))))
            return True

        return self._call(work, transaction=True)

    def drop_lease(self, name: str, serial: int) -> bool:
        """One transaction: the row locked and compared, ``lease_count`` locked, the
        token floor (the row named ``''``, written by the first drop) raised to the
        row's token and serial and the row deleted."""
        validate_lease_name(name)
        check_lease_serial(serial)

        def work(conn: Connection) -> bool:
            row = conn.execute(self._q.lock_lease, (name,)).fetchone()
            if row is None:
                return False
            current = self._lease(name, row)
            if current.serial != serial:
                return False
            counted = conn.execute(self._q.lock_lease_count).fetchone()
            leases = conn.execute(self._q.all_leases).fetchall()
            count = check_leases(self._where, counted, leases)
            floor, floor_serial = lease_floor(leases)
            values = (FLOOR_ROW, None, raised_floor(floor, current), floor_serial + 1, 1)
            conn.execute(self._q.put_floor, (*values, row_crc(values)))
            conn.execute(self._q.delete_lease, (name,))
            if floor_serial:  # else the floor's new row takes the dropped one's place
                conn.execute(self._q.put_lease_count, (count - 1, row_crc((count - 1,))))
            return True

        return self._call(work, transaction=True)

    def lease_names(self) -> list[str]:
        leases = self._call(self._lease_rows)
        return sorted(name for name, *_ in leases if name != FLOOR_ROW)

    def lease_floor(self) -> int:
        return self._call(lambda conn: lease_floor(self._lease_rows(conn))[0])

    def _lease_rows(self, conn: Connection) -> list[Sequence[Any]]:
        """Every ``leases`` row, checked against ``lease_count`` in one snapshot."""
        rows = conn.execute(self._q.lease_count).fetchall()
        leases = [r[2:] for r in rows if r[2] is not None]
        check_leases(self._where, rows[0][:2], leases)
        return leases

    def _lease(self, name: str, row: Sequence[Any]) -> LeaseRecord:
        if row_crc((name, *row[:4])) != row[4]:
            raise damaged_row(self._where, "leases", f"{name!r}")
        return LeaseRecord(*row[:4])

    def committed_offsets(self, group: str) -> dict[str, int]:
        validate_group_name(group)
        if "\x00" in group:
            return {}
        rows = self._call(lambda conn: conn.execute(self._q.committed_offsets, (group,)).fetchall())
        count = 0 if rows[0][0] is None else self._group_count(group, rows[0])
        offsets: dict[str, int] = {}
        for _, _, name, offset, crc in rows:
            if name is None:
                continue
            if row_crc((group, name, offset)) != crc:
                raise damaged_row(self._where, "group_offsets", f"({group!r}, {name!r})")
            offsets[name] = offset
        if count != len(offsets):
            raise damaged_row(
                self._where,
                "group_offsets",
                f"group {group!r}",
                f"the group has {len(offsets)} offset rows but counts {count}",
            )
        return offsets

    def list_groups(self) -> list[str]:
        # A group's row in ``groups`` exists while it has offset rows (see _count_group).
        rows = self._call(lambda conn: conn.execute(self._q.list_groups).fetchall())
        return sorted(group for group, *row in rows if self._group_count(group, row) > 0)
