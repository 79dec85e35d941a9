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

**Schema.** Tables are created by numbered migrations (:data:`SCHEMA_VERSION`) applied
on open, each recorded in a ``schema_version`` table, all in one transaction under an
advisory lock (``pg_advisory_xact_lock``) keyed by the schema name: processes opening
together wait for one another instead of racing ``CREATE``, and a failed migration
leaves nothing behind. A schema written by a newer disklesslog is refused untouched; a
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
extent and its first batches together, and continues through a server-side cursor of
the same statement when a page needs more than :data:`_FIRST_PAGE_ROWS` batches.

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
import json
import math
import operator
import os
import random
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from ..api import validate_group_name, validate_stream_name
from ..errors import (
    ConfigError,
    InvalidURL,
    LogClosedError,
    MissingDependencyError,
    SequencerError,
    StreamNotFound,
)
from .base import (
    NO_PRODUCER,
    BatchLocation,
    BatchPage,
    BatchToCommit,
    CommitResult,
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
    check_keys,
    check_new_batches,
    check_object_key,
    check_offsets,
    check_old_ids,
    check_position,
    check_transaction,
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

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "PostgresOptions",
    "PostgresSequencer",
    "open_postgres_sequencer",
    "parse_postgres_url",
    "validate_schema_name",
]

SCHEMA_VERSION = 2
"""Version of the tables this code writes; a newer schema is refused, an older migrated."""

DEFAULT_SCHEMA = "disklesslog"

_SCHEMES = ("postgresql", "postgres")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_OWN_OPTIONS = ("schema", "pool_size", "timeout")
_DEFAULT_CONNECT_TIMEOUT = "10"  # seconds; libpq's default is to wait forever

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

# --------------------------------------------------------------------------- schema

_MIGRATIONS: dict[int, tuple[str, tuple[str, ...]]] = {
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
}

_CREATE_VERSION_TABLE = (
    "CREATE TABLE {s}.schema_version ("
    " version integer PRIMARY KEY,"
    " description text NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
)
_ADVISORY_LOCK_PREFIX = "disklesslog.sequencer.schema:"

_LOCATION = "b.id, o.key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp"
_UPSERT_OBJECT = (
    " ON CONFLICT (key) DO UPDATE SET live_batches = o.live_batches + excluded.live_batches,"
    " dead_since = CASE WHEN excluded.live_batches > 0 THEN NULL ELSE o.dead_since END"
)


@dataclass(frozen=True)
class _Queries:
    """Every statement, as a template naming the schema ``{s}``; :meth:`render` quotes
    the schema once per sequencer (values are always ``%s`` parameters)."""

    stream_row: str = "SELECT id, start_offset, end_offset, config FROM {s}.streams WHERE name = %s"
    lock_stream: str = (
        "SELECT id, start_offset, end_offset FROM {s}.streams WHERE name = %s FOR UPDATE"
    )
    list_streams: str = "SELECT name FROM {s}.streams ORDER BY name"
    create_stream: str = (
        "INSERT INTO {s}.streams (name, config) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
        " RETURNING id, start_offset, end_offset, config"
    )
    lock_stream_config: str = "SELECT config FROM {s}.streams WHERE name = %s FOR UPDATE"
    alter_stream: str = (
        "UPDATE {s}.streams SET config = %s WHERE name = %s"
        " RETURNING id, start_offset, end_offset, config"
    )
    delete_stream: str = (
        "WITH p AS (DELETE FROM {s}.producer_streams WHERE stream_id = %(id)s),"
        " t AS (DELETE FROM {s}.time_index WHERE stream_id = %(id)s),"
        " g AS (DELETE FROM {s}.group_offsets WHERE stream = %(name)s)"
        " DELETE FROM {s}.streams WHERE id = %(id)s"
    )
    delete_batches_below: str = (
        "WITH gone AS (DELETE FROM {s}.batches WHERE stream_id = %s AND last_offset < %s"
        " RETURNING object_id) SELECT object_id, count(*) FROM gone GROUP BY object_id"
    )
    init_producer: str = (
        "INSERT INTO {s}.producers AS p (name, epoch) VALUES (%s, 0)"
        " ON CONFLICT (name) DO UPDATE SET epoch = p.epoch + 1 RETURNING id, epoch"
    )
    # Commit: the locks and everything the rules decide on, in one statement. Streams
    # are locked in name order (rows are sorted before they are locked), producers
    # after them in id order. A locked row is the latest version, but the producer
    # states come from the statement's snapshot, taken before any lock wait: they are
    # current only if no stream row changed since that snapshot (every change of a
    # stream's producer states also updates its row), which "fresh" tells by
    # comparing the locked row's xmin with the snapshot's. Otherwise load_states runs
    # as a statement of its own, after the locks.
    lock_for_commit: str = (
        "WITH s AS (SELECT id, name, end_offset, max_timestamp, unindexed, xmin AS version"
        " FROM {s}.streams WHERE name = ANY(%(names)s::text[]) ORDER BY name FOR UPDATE),"
        " p AS (SELECT id, epoch FROM {s}.producers WHERE id = ANY(%(producers)s::bigint[])"
        " ORDER BY id FOR SHARE)"
        " SELECT 0 AS kind, s.id, s.name, s.end_offset, s.max_timestamp, s.unindexed,"
        " (SELECT v.xmin = s.version FROM {s}.streams AS v WHERE v.id = s.id) AS fresh"
        " FROM s"
        " UNION ALL SELECT 1, id, NULL, epoch, NULL, NULL, NULL FROM p"
        " UNION ALL SELECT 2, ps.stream_id, ps.state, ps.producer_id, NULL, NULL, NULL"
        " FROM s CROSS JOIN LATERAL (SELECT * FROM {s}.producer_streams AS ps"
        " WHERE ps.stream_id = s.id AND ps.producer_id = ANY(%(producers)s::bigint[])"
        " OFFSET 0) AS ps"  # OFFSET 0: not flattened, so looked up by key per stream
    )
    load_states: str = (
        "SELECT stream_id, producer_id, state FROM {s}.producer_streams"
        " WHERE stream_id = ANY(%s::bigint[]) AND producer_id = ANY(%s::bigint[])"
    )
    write_commit: str = (
        "WITH obj AS (INSERT INTO {s}.objects AS o (key, live_batches, dead_since)"
        " VALUES (%(key)s, %(live)s,"
        " CASE WHEN %(live)s > 0 THEN NULL ELSE %(now)s::double precision END)"
        + _UPSERT_OBJECT
        + " RETURNING id),"
        " ins AS (INSERT INTO {s}.batches (stream_id, object_id, position, size, base_offset,"
        " last_offset, max_timestamp) SELECT b.stream_id, obj.id, b.position, b.size,"
        " b.base_offset, b.last_offset, b.max_timestamp FROM obj, unnest(%(b_stream)s::bigint[],"
        " %(b_position)s::bigint[], %(b_size)s::bigint[], %(b_base)s::bigint[],"
        " %(b_last)s::bigint[], %(b_ts)s::bigint[]) AS b(stream_id, position, size,"
        " base_offset, last_offset, max_timestamp)),"
        " ext AS (UPDATE {s}.streams AS s SET end_offset = m.end_offset,"
        " max_timestamp = m.max_timestamp, unindexed = m.unindexed"
        " FROM unnest(%(s_id)s::bigint[], %(s_end)s::bigint[], %(s_ts)s::bigint[],"
        " %(s_unindexed)s::bigint[]) AS m(id, end_offset, max_timestamp, unindexed)"
        " WHERE s.id = m.id),"
        " st AS (INSERT INTO {s}.producer_streams (stream_id, producer_id, state)"
        " SELECT * FROM unnest(%(p_stream)s::bigint[], %(p_id)s::bigint[], %(p_state)s::text[])"
        " ON CONFLICT (stream_id, producer_id) DO UPDATE SET state = excluded.state),"
        " ti AS (INSERT INTO {s}.time_index (stream_id, max_timestamp, next_offset)"
        " SELECT * FROM unnest(%(t_stream)s::bigint[], %(t_ts)s::bigint[],"
        " %(t_next)s::bigint[])"
        " ON CONFLICT (stream_id, max_timestamp) DO UPDATE SET next_offset = excluded.next_offset)"
        " SELECT id FROM obj"
    )
    record_orphan: str = (
        "INSERT INTO {s}.objects (key, live_batches, dead_since) VALUES (%s, 0, %s)"
        " ON CONFLICT (key) DO NOTHING"
    )
    record_orphans: str = (
        "INSERT INTO {s}.objects (key, live_batches, dead_since)"
        " SELECT k, 0, %s FROM unnest(%s::text[]) AS a(k) ORDER BY k"
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
    transaction_ranges: str = "SELECT ranges FROM {s}.transactions WHERE id = %s"
    finish_transaction: str = "UPDATE {s}.transactions SET ranges = %s WHERE seq = %s"
    forget_transactions_beyond: str = "DELETE FROM {s}.transactions WHERE seq <= %s - %s"
    # Reads: the stream's extent and its batches in one statement, one snapshot.
    find_batches: str = (
        "SELECT s.start_offset, s.end_offset, b.id,"
        " (SELECT o.key FROM {s}.objects AS o WHERE o.id = b.object_id),"  # by primary key
        " b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp"
        " FROM {s}.streams AS s"
        " LEFT JOIN LATERAL (SELECT * FROM {s}.batches AS b WHERE b.stream_id = s.id"
        " AND b.last_offset >= %(offset)s ORDER BY b.last_offset LIMIT %(limit)s) AS b ON true"
        " WHERE s.name = %(name)s ORDER BY b.last_offset"
    )
    offset_for_time: str = (
        "SELECT s.start_offset, (SELECT b.base_offset FROM {s}.batches AS b"
        " WHERE b.stream_id = s.id AND b.max_timestamp >= %(ts)s AND b.last_offset >="
        " greatest(s.start_offset, (SELECT t.next_offset FROM {s}.time_index AS t"
        " WHERE t.stream_id = s.id AND t.max_timestamp < %(ts)s"
        " ORDER BY t.max_timestamp DESC LIMIT 1))"
        " ORDER BY b.last_offset LIMIT 1)"
        " FROM {s}.streams AS s WHERE s.name = %(name)s"
    )
    trim_rest: str = (
        "WITH t AS (DELETE FROM {s}.time_index WHERE stream_id = %(id)s"
        " AND next_offset <= %(before)s)"
        " UPDATE {s}.streams SET start_offset = %(before)s WHERE id = %(id)s"
    )
    # Objects: locked in id order before their counts change (no deadlock between two
    # trims or replacements releasing the same objects).
    lock_objects: str = "SELECT id FROM {s}.objects WHERE id = ANY(%s) ORDER BY id FOR UPDATE"
    release_objects: str = (
        "UPDATE {s}.objects AS o SET live_batches = o.live_batches - r.n,"
        " dead_since = CASE WHEN o.live_batches = r.n THEN %s ELSE o.dead_since END"
        " FROM unnest(%s::bigint[], %s::bigint[]) AS r(id, n) WHERE o.id = r.id"
    )
    acquire_objects: str = (
        "INSERT INTO {s}.objects AS o (key, live_batches, dead_since)"
        " SELECT k, n, NULL FROM unnest(%s::text[], %s::bigint[]) AS a(k, n) ORDER BY k"
        + _UPSERT_OBJECT
        + " RETURNING key, id"
    )
    load_batches: str = (
        "SELECT b.object_id, " + _LOCATION + " FROM {s}.batches AS b"
        " JOIN {s}.objects AS o ON o.id = b.object_id"
        " WHERE b.stream_id = %s AND b.id = ANY(%s) ORDER BY b.base_offset"
    )
    count_between: str = (
        "SELECT count(*) FROM {s}.batches WHERE stream_id = %s AND last_offset BETWEEN %s AND %s"
    )
    delete_batches: str = "DELETE FROM {s}.batches WHERE id = ANY(%s)"
    insert_batches: str = (
        "INSERT INTO {s}.batches (stream_id, object_id, position, size, base_offset,"
        " last_offset, max_timestamp) SELECT %s, * FROM unnest(%s::bigint[], %s::bigint[],"
        " %s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[])"
    )
    time_index_below: str = (
        "SELECT max_timestamp, next_offset FROM {s}.time_index WHERE stream_id = %s"
        " AND max_timestamp < %s ORDER BY max_timestamp DESC"
    )
    repair_time_index: str = (
        "WITH d AS (DELETE FROM {s}.time_index WHERE stream_id = %(id)s"
        " AND max_timestamp = ANY(%(stale)s::bigint[]))"
        " UPDATE {s}.streams SET max_timestamp = greatest(max_timestamp, %(ts)s)"
        " WHERE id = %(id)s"
    )
    objects_to_delete: str = (
        "SELECT key FROM {s}.objects WHERE dead_since IS NOT NULL AND dead_since <= %s"
        " ORDER BY dead_since, key"
    )
    forget_objects: str = "DELETE FROM {s}.objects WHERE key = ANY(%s) AND live_batches = 0"
    list_objects: str = 'SELECT key FROM {s}.objects ORDER BY key COLLATE "C"'
    commit_offsets: str = (
        "INSERT INTO {s}.group_offsets (group_name, stream, next_offset)"
        " SELECT %s, n, o FROM unnest(%s::text[], %s::bigint[]) AS g(n, o) ORDER BY n"
        " ON CONFLICT (group_name, stream) DO UPDATE SET next_offset = excluded.next_offset"
    )
    committed_offsets: str = (
        "SELECT stream, next_offset FROM {s}.group_offsets WHERE group_name = %s"
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

_LIVE: weakref.WeakSet[PostgresSequencer] = weakref.WeakSet()
_INHERITED: list[Any] = []  # pools a fork child must neither use nor close


def _after_fork_in_child() -> None:
    for sequencer in list(_LIVE):
        sequencer._forget_pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


class _StateCache:
    """Decoded producer states with the JSON text each came from, by (stream id,
    producer id). A writer's next commit loads the text it stored itself, so this
    skips a JSON decode per batch. Always correct: an entry is used only when the
    stored text is identical (whoever wrote it); a rolled-back entry simply misses.
    Thread-safe enough: each operation is one dict access under the GIL."""

    LIMIT = 65536

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], tuple[str, ProducerStreamState]] = {}

    def decode(self, key: tuple[int, int], text: str) -> ProducerStreamState:
        hit = self._entries.get(key)
        if hit is not None and hit[0] == text:
            return hit[1]
        state = ProducerStreamState.from_json(text)
        self._remember(key, text, state)
        return state

    def encode(self, key: tuple[Any, int], state: ProducerStreamState) -> str:
        text = state.to_json()
        self._remember(key, text, state)
        return text

    def _remember(self, key: tuple[int, int], text: str, state: ProducerStreamState) -> None:
        if len(self._entries) >= self.LIMIT:
            self._entries.clear()  # crude but bounded; a miss only costs a decode
        self._entries[key] = (text, state)


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
        self._closed = False
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._states = _StateCache()
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
                    _apply_migrations(conn, self.schema)
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
        if isinstance(exc, psycopg.DataError):
            return ConfigError(f"PostgreSQL refused a value: {detail}; nothing was applied")
        return SequencerError(f"PostgreSQL sequencer {self.url}: {detail}; nothing was applied")

    # ---------------------------------------------------------------- streams

    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _, text = config_copy(config)

        def work(conn: Connection) -> StreamMeta:
            while True:  # until inserted or found: a concurrent delete may remove it
                row = conn.execute(self._q.create_stream, (name, text)).fetchone()
                if row is None:
                    row = conn.execute(self._q.stream_row, (name,)).fetchone()
                if row is not None:
                    return StreamMeta(name, row[1], row[2], json.loads(row[3]))

        return self._call(work)

    def alter_stream(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        config_copy(changes)  # checked before anything changes

        def work(conn: Connection) -> StreamMeta:
            stored = conn.execute(self._q.lock_stream_config, (name,)).fetchone()
            if stored is None:
                raise StreamNotFound(f"stream {name!r} does not exist")
            text = merged_config(stored[0], changes)
            row = conn.execute(self._q.alter_stream, (text, name)).fetchone()
            assert row is not None  # locked above
            return StreamMeta(name, row[1], row[2], json.loads(row[3]))

        return self._call(work, transaction=True)

    def delete_stream(self, name: str) -> None:
        validate_stream_name(name)
        now = self._clock()

        def work(conn: Connection) -> None:
            stream_id = self._lock_stream(conn, name)[0]
            counts = conn.execute(self._q.delete_batches_below, (stream_id, 1 << 62)).fetchall()
            self._release(conn, counts, now)
            conn.execute(self._q.delete_stream, {"id": stream_id, "name": name})

        self._call(work, transaction=True)

    def list_streams(self) -> list[str]:
        return self._call(
            lambda conn: [row[0] for row in conn.execute(self._q.list_streams).fetchall()]
        )

    def stream_info(self, name: str) -> StreamMeta:
        validate_stream_name(name)
        row = self._call(lambda conn: conn.execute(self._q.stream_row, (name,)).fetchone())
        if row is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        return StreamMeta(name, row[1], row[2], json.loads(row[3]))

    def _lock_stream(self, conn: Connection, name: str) -> tuple[int, int, int]:
        """``(id, start_offset, end_offset)`` of ``name``, its row locked until the end
        of the transaction; StreamNotFound."""
        row = conn.execute(self._q.lock_stream, (name,)).fetchone()
        if row is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        return row[0], row[1], row[2]

    # -------------------------------------------------------------- producers

    def init_producer(self, name: str | None = None) -> tuple[int, int]:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"a producer name must be a non-empty str or None, not {name!r}")
        if name is not None:
            _check_text(name, "producer name")

        def work(conn: Connection) -> tuple[int, int]:
            row = conn.execute(self._q.init_producer, (name,)).fetchone()
            if row is None:  # INSERT ... ON CONFLICT DO UPDATE RETURNING always has a row
                raise SequencerError(f"PostgreSQL sequencer {self.url}: no producer row")
            return int(row[0]), int(row[1])

        return self._call(work)

    # ---------------------------------------------------------------- commits

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        _check_text(check_object_key(object_key), "object key")
        batches = check_batches(batches)

        def work(conn: Connection) -> list[CommitResult]:
            now = self._clock()
            cur = conn.cursor()
            plan, cursors = self._plan(cur, batches)
            cur.execute(
                self._q.write_commit,
                self._write_params(object_key, plan.accepted, plan, cursors, now),
            )
            return plan.results

        return self._call(work, transaction=True)

    def _write_params(
        self,
        object_key: str,
        accepted: Sequence[tuple[StreamCursor, BatchToCommit, int]],
        plan: CommitPlan | None,
        cursors: Sequence[StreamCursor],
        now: float,
    ) -> dict[str, Any]:
        """Parameters of ``write_commit`` for one object's accepted batches; with
        ``plan``, also the streams' new extents, producer states and time-index entries
        (a transaction passes them with its last object only)."""
        moved = [c for c in cursors if c.dirty] if plan is not None else []
        times = (
            {(c.key, ts): offset for c, ts, offset in plan.time_index}  # last wins
            if plan is not None
            else {}
        )
        states = plan.states if plan is not None else {}
        return {
            "key": object_key,
            "live": len(accepted),
            "now": now,
            "b_stream": _ints([c.key for c, _, _ in accepted]),
            "b_position": _ints([b.position for _, b, _ in accepted]),
            "b_size": _ints([b.size for _, b, _ in accepted]),
            "b_base": _ints([base for _, _, base in accepted]),
            "b_last": _ints([base + b.span - 1 for _, b, base in accepted]),
            "b_ts": _ints([b.max_timestamp for _, b, _ in accepted]),
            "s_id": _ints([c.key for c in moved]),
            "s_end": _ints([c.end for c in moved]),
            "s_ts": _ints([c.max_timestamp for c in moved]),
            "s_unindexed": _ints([c.unindexed for c in moved]),
            "p_stream": _ints([key[0] for key in states]),
            "p_id": _ints([key[1] for key in states]),
            "p_state": _texts([self._states.encode(key, state) for key, state in states.items()]),
            "t_stream": _ints([key[0] for key in times]),
            "t_ts": _ints([key[1] for key in times]),
            "t_next": _ints(times.values()),
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
            now = self._clock()
            cur = conn.cursor()
            cur.execute(self._q.forget_old_transactions, (transaction_cutoff(now),))
            claimed = cur.execute(self._q.claim_transaction, (txn, now)).fetchone()
            if claimed is None:
                row = cur.execute(self._q.transaction_ranges, (txn,)).fetchone()
                if row is None:  # expired between the two statements: no answer to give
                    raise SequencerError(f"transaction {txn!r} changed under this call; retry")
                cur.execute(self._q.record_orphans, (now, _texts([k for k, _ in checked])))
                return TransactionResult(txn, ranges_from_json(row[0]), duplicate=True)
            keys = _texts([key for key, _ in checked])
            known_keys = [row[0] for row in cur.execute(self._q.known_objects, (keys,))]
            if known_keys:
                raise already_known(txn, known_keys)
            plan, cursors = self._plan(cur, flat)
            start = 0
            for i, (key, batches) in enumerate(checked):  # no producers: one entry per batch
                last = i == len(checked) - 1
                accepted = plan.accepted[start : start + len(batches)]
                start += len(batches)
                params = self._write_params(key, accepted, plan if last else None, cursors, now)
                cur.execute(self._q.write_commit, params)
            ranges = transaction_ranges(plan)
            cur.execute(self._q.finish_transaction, (ranges_to_json(ranges), claimed[0]))
            cur.execute(self._q.forget_transactions_beyond, (claimed[0], TRACKED_TRANSACTIONS))
            return TransactionResult(txn, ranges)

        return self._call(work, transaction=True)

    def _plan(
        self, cur: psycopg.Cursor[Any], batches: Sequence[BatchToCommit]
    ) -> tuple[CommitPlan, list[StreamCursor]]:
        """Lock and load what the commit's batches touch, then judge them with the
        shared rules. Names PostgreSQL cannot store (NUL) cannot name a stream: left
        out, they are reported as unknown streams."""
        names = [n for n in dict.fromkeys(b.stream for b in batches) if "\x00" not in n]
        producer_ids = sorted({b.producer_id for b in batches if b.producer_id != NO_PRODUCER})
        streams: dict[str, StreamCursor] = {}
        epochs: dict[int, int] = {}
        texts: list[tuple[int, int, str]] = []
        fresh = True
        params = {"names": _texts(names), "producers": _ints(producer_ids)}
        for kind, key, text, value, max_ts, unindexed, current in cur.execute(
            self._q.lock_for_commit, params
        ).fetchall():
            if kind == 0:
                streams[text] = StreamCursor(key, value, max_ts, unindexed)
                fresh = fresh and bool(current)
            elif kind == 1:
                epochs[key] = value
            else:
                texts.append((key, value, text))
        if not fresh and producer_ids:  # a commit landed while we waited for a lock
            stream_ids = _ints(c.key for c in streams.values())
            texts = cur.execute(self._q.load_states, (stream_ids, params["producers"])).fetchall()
        states: dict[tuple[Any, int], ProducerStreamState] = {}
        for stream_id, producer_id, text in texts:
            key = (stream_id, producer_id)
            states[key] = self._states.decode(key, text)
        plan = plan_commit(batches, streams, epochs, states, TIME_INDEX_INTERVAL)
        return plan, list(streams.values())

    def record_orphan(self, object_key: str) -> None:
        _check_text(check_object_key(object_key), "object key")
        now = self._clock()
        self._call(lambda conn: conn.execute(self._q.record_orphan, (object_key, now)))

    # ------------------------------------------------------------------ reads

    def find_batches(self, stream: str, offset: int, max_bytes: int) -> BatchPage:
        check_position(offset, "offset")
        check_position(max_bytes, "max_bytes")
        validate_stream_name(stream)
        params = {"name": stream, "offset": offset, "limit": _FIRST_PAGE_ROWS}
        rows = self._call(lambda conn: conn.execute(self._q.find_batches, params).fetchall())
        if not rows:
            raise StreamNotFound(f"stream {stream!r} does not exist")
        start, end = rows[0][0], rows[0][1]
        if not start <= offset <= end:
            raise out_of_range(stream, offset, start, end)
        found: list[BatchLocation] = []
        if rows[0][2] is None:
            return BatchPage(found, start, end)
        if _take(found, (row[2:] for row in rows), max_bytes) or len(rows) < _FIRST_PAGE_ROWS:
            return BatchPage(found, start, end)
        return self._find_more(params, max_bytes)

    def _find_more(self, params: dict[str, Any], max_bytes: int) -> BatchPage:
        """The same statement without a limit, read through a server-side cursor: one
        snapshot, fetched in chunks until the page is full."""
        params = {**params, "limit": None}

        def work(conn: Connection) -> BatchPage:
            found: list[BatchLocation] = []
            with conn.cursor(name="disklesslog_find_batches") as cur:
                cur.itersize = _CURSOR_ROWS
                cur.execute(self._q.find_batches, params)
                start = end = -1

                def locations() -> Iterable[tuple[Any, ...]]:
                    nonlocal start, end
                    for row in cur:
                        start, end = row[0], row[1]
                        if row[2] is not None:
                            yield row[2:]

                _take(found, locations(), max_bytes)
            return BatchPage(found, start, end)

        page = self._call(work, transaction=True)
        if page.start_offset < 0:  # deleted since the first look
            raise StreamNotFound(f"stream {params['name']!r} does not exist")
        offset = params["offset"]
        if not page.start_offset <= offset <= page.end_offset:
            raise out_of_range(params["name"], offset, page.start_offset, page.end_offset)
        return page

    def offset_for_time(self, stream: str, timestamp: int) -> int | None:
        check_position(timestamp, "timestamp")  # any int: timestamps may be negative
        validate_stream_name(stream)
        params = {"name": stream, "ts": timestamp}
        row = self._call(lambda conn: conn.execute(self._q.offset_for_time, params).fetchone())
        if row is None:
            raise StreamNotFound(f"stream {stream!r} does not exist")
        start, base = row
        return None if base is None else max(int(base), start)

    # ------------------------------------------------------------ maintenance

    def trim(self, stream: str, before: int) -> None:
        check_position(before, "before")
        validate_stream_name(stream)
        now = self._clock()

        def work(conn: Connection) -> None:
            stream_id, start, end = self._lock_stream(conn, stream)
            if before > end:
                raise out_of_range(stream, before, start, end)
            if before <= start:
                return
            counts = conn.execute(self._q.delete_batches_below, (stream_id, before)).fetchall()
            self._release(conn, counts, now)
            conn.execute(self._q.trim_rest, {"id": stream_id, "before": before})

        self._call(work, transaction=True)

    def replace_batches(
        self, stream: str, old_batch_ids: Sequence[int], new_batches: Sequence[BatchLocation]
    ) -> bool:
        ids = check_old_ids(old_batch_ids)
        news = list(new_batches)
        validate_stream_name(stream)
        now = self._clock()

        def work(conn: Connection) -> bool:
            stream_id = self._lock_stream(conn, stream)[0]
            rows = conn.execute(self._q.load_batches, (stream_id, ids)).fetchall()
            if len(rows) != len(ids):
                return False
            olds = [BatchLocation(*row[1:]) for row in rows]
            row = conn.execute(
                self._q.count_between, (stream_id, olds[0].last_offset, olds[-1].last_offset)
            ).fetchone()
            if row is None or row[0] != len(olds):
                raise not_contiguous(stream)
            check_new_batches(stream, olds, news)
            for b in news:
                _check_text(b.object_key, "object key")
            conn.execute(self._q.delete_batches, (ids,))
            self._release(conn, Counter(row[0] for row in rows).items(), now)
            self._insert_replacements(conn, stream_id, news)
            self._repair_time_index(conn, stream_id, news)
            return True

        return self._call(work, transaction=True)

    def objects_to_delete(self, grace_seconds: float) -> list[str]:
        cutoff = self._clock() - grace_seconds
        rows = self._call(
            lambda conn: conn.execute(self._q.objects_to_delete, (cutoff,)).fetchall()
        )
        return [row[0] for row in rows]

    def forget_objects(self, object_keys: Sequence[str]) -> None:
        keys = [key for key in check_keys(object_keys) if "\x00" not in key]  # never stored
        if keys:
            self._call(lambda conn: conn.execute(self._q.forget_objects, (keys,)))

    def list_objects(self) -> list[str]:
        rows = self._call(lambda conn: conn.execute(self._q.list_objects).fetchall())
        return [row[0] for row in rows]

    def _release(self, conn: Connection, counts: Iterable[tuple[int, int]], now: float) -> None:
        """Uncount live batches per object; objects left with none are dead from ``now``.
        Their rows are locked in id order first (see the module docstring)."""
        pairs = sorted(counts)
        if not pairs:
            return
        ids = [object_id for object_id, _ in pairs]
        conn.execute(self._q.lock_objects, (ids,))
        conn.execute(self._q.release_objects, (now, ids, [n for _, n in pairs]))

    def _insert_replacements(
        self, conn: Connection, stream_id: int, news: Sequence[BatchLocation]
    ) -> None:
        if not news:
            return
        per_object = sorted(Counter(b.object_key for b in news).items())
        object_ids = dict(
            conn.execute(
                self._q.acquire_objects,
                ([key for key, _ in per_object], [n for _, n in per_object]),
            ).fetchall()
        )
        conn.execute(
            self._q.insert_batches,
            (
                stream_id,
                [object_ids[b.object_key] for b in news],
                [b.position for b in news],
                [b.size for b in news],
                [b.base_offset for b in news],
                [b.last_offset for b in news],
                [b.max_timestamp for b in news],
            ),
        )

    def _repair_time_index(
        self, conn: Connection, stream_id: int, news: Sequence[BatchLocation]
    ) -> None:
        """See :func:`~disklesslog.sequencers.common.time_index_repair`: walks down from
        the highest new timestamp and stops at the first entry at or below the first
        new offset."""
        repair = time_index_repair(news)
        if repair is None:
            return
        new_max, low = repair
        stale: list[int] = []
        with conn.cursor() as cur:
            for ts, next_offset in cur.execute(self._q.time_index_below, (stream_id, new_max)):
                if next_offset <= low:
                    break
                stale.append(ts)
        conn.execute(self._q.repair_time_index, {"id": stream_id, "stale": stale, "ts": new_max})

    # -------------------------------------------------------- consumer groups

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        checked = check_offsets(group, offsets)
        if not checked:
            return
        names, values = list(checked), list(checked.values())
        self._call(lambda conn: conn.execute(self._q.commit_offsets, (group, names, values)))

    def committed_offsets(self, group: str) -> dict[str, int]:
        validate_group_name(group)
        rows = self._call(lambda conn: conn.execute(self._q.committed_offsets, (group,)).fetchall())
        return dict(rows)


# ----------------------------------------------------------------------- helpers


def _take(found: list[BatchLocation], rows: Iterable[Sequence[Any]], max_bytes: int) -> bool:
    """Append batch rows to ``found`` until their sizes reach ``max_bytes`` (at least one
    batch); True once the page is full."""
    total = sum(b.size for b in found)
    for row in rows:
        if found and total + row[3] > max_bytes:
            return True
        found.append(BatchLocation(*row))
        total += row[3]
    return False


def _apply_migrations(conn: Connection, schema: str) -> None:
    """Bring ``schema`` to :data:`SCHEMA_VERSION` inside the caller's transaction.

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
        run(_CREATE_VERSION_TABLE)
    row = run("SELECT coalesce(max(version), 0) FROM {s}.schema_version").fetchone()
    version = int(row[0])
    if version > SCHEMA_VERSION:
        raise SequencerError(
            f"schema {schema!r} has sequencer schema version {version}, written by a newer "
            f"disklesslog; this version reads up to {SCHEMA_VERSION}. Upgrade disklesslog "
            "(the schema was not changed)"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        description, statements = _MIGRATIONS[target]
        for statement in statements:
            run(statement)
        run(
            "INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
            (target, description),
        )
