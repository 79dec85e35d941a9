"""The SQLite sequencer: the embedded default for processes sharing one machine.

``sqlite:///abs/path/meta.db`` (the path is the URL's, as for ``file:///``; parent
directories are created). Options in the query string:

``synchronous=normal`` (default)
    The write-ahead log is not fsynced per commit. A commit survives a crash of the
    process, but a power loss or OS crash may forget the last commits (up to the last
    checkpoint); the database itself stays consistent. Writers whose commits are
    forgotten leave unreferenced objects behind (never deleted by GC) and readers that
    saw those offsets may see them reassigned to other batches.
``synchronous=full``
    The write-ahead log is fsynced by every commit: commits survive power loss, at the
    cost of one fsync (about a millisecond on an SSD) per commit.
``timeout=SECONDS`` (default 30)
    How long an operation waits for another process's write transaction before it
    raises :class:`~disklesslog.errors.SequencerError`.

Concurrency: WAL mode, so readers never block writers or each other. Every mutation is
one transaction begun with ``BEGIN IMMEDIATE``, which takes the write lock before the
first read: two writers can never read the same end offset (no lost update) and never
deadlock upgrading a read lock. Each thread has its own connection. Do not carry an
open sequencer across ``fork()``: the child opens fresh connections on first use and
never touches the inherited ones (closing them could break the parent's locks).

A commit is one transaction of about ten statements whatever its number of batches:
it loads the touched streams, producers and producer states with ``IN`` lists, plans
with the shared rules (:func:`~disklesslog.sequencers.memory.plan_commit`), then writes
with ``executemany``.

Indexes: ``find_batches`` is a range scan of ``batches (stream_id, last_offset)``.
``offset_for_time`` looks up a sparse time index (one entry per
:data:`TIME_INDEX_INTERVAL` batches: "no batch below offset O is later than T"), then
scans batches in offset order from there: O(log n + interval) while timestamps rise,
O(n) in the worst case (timestamps going far backwards, or the batches that set a late
timestamp trimmed away).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import sqlite3
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ..api import validate_group_name, validate_stream_name
from ..errors import (
    ConfigError,
    InvalidURL,
    LogClosedError,
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

__all__ = [
    "SCHEMA_VERSION",
    "SYNCHRONOUS_MODES",
    "TIME_INDEX_INTERVAL",
    "SqliteSequencer",
    "open_sqlite_sequencer",
    "parse_sqlite_url",
]

SCHEMA_VERSION = 2
"""Version of the tables this code writes; a newer file is refused, an older migrated."""

SYNCHRONOUS_MODES = ("normal", "full")

_WRITE = "BEGIN IMMEDIATE"
_LOCK_RETRY_FIRST = 0.0005  # seconds; retries of a held write lock grow to _LOCK_RETRY_MAX
_LOCK_RETRY_MAX = 0.005
_SNAPSHOT = "BEGIN"
_AUTOCHECKPOINT_PAGES = 8000
"""WAL pages between checkpoints (SQLite's default is 1000). A commit rewrites the same
hot pages (stream rows, each stream's index leaf), so a longer WAL checkpoints each of
them once for many commits: measured ~15-20% more commits/s, for a WAL of up to ~32 MB
and a checkpoint pause of tens of milliseconds every few thousand commits."""
_WAL_SIZE_LIMIT = 64 << 20  # bytes the WAL file is truncated back to after a checkpoint
_IN_CHUNK = 500  # "?" per IN list: well under SQLITE_MAX_VARIABLE_NUMBER (999 before 3.32)

_MIGRATIONS: dict[int, tuple[str, ...]] = {
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
}

_INSERT_BATCH = (
    "INSERT INTO batches (stream_id, object_id, position, size, base_offset, last_offset,"
    " max_timestamp) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_LOCATION = (
    "SELECT b.id, o.key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp"
    " FROM batches AS b JOIN objects AS o ON o.id = b.object_id"
)
_RELEASE = (
    "UPDATE objects SET live_batches = live_batches - ?,"
    " dead_since = CASE WHEN live_batches = ? THEN ? ELSE dead_since END WHERE id = ?"
)


# ------------------------------------------------------------------------------ URLs


def parse_sqlite_url(url: str) -> tuple[str, str, float]:
    """``(path, synchronous, timeout)`` of a ``sqlite:///abs/path.db?...`` URL."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidURL(
            f"a SQLite sequencer URL looks like sqlite:///abs/path/meta.db, not {url!r}"
        )
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        raise InvalidURL(f"not a sqlite:// URL: {url!r}")
    if parts.netloc:
        raise InvalidURL(
            f"sqlite URLs name a local file with three slashes (sqlite:///abs/path/meta.db), "
            f"not host {parts.netloc!r}"
        )
    if parts.fragment:
        raise InvalidURL(f"sqlite URL {url!r} has a #fragment; remove it")
    path = unquote(parts.path)
    if not path.startswith("/") or path.endswith("/"):
        raise InvalidURL(f"sqlite URL {url!r} must name a database file by absolute path")
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise InvalidURL(f"sqlite URL {url!r} has a malformed query string") from None
    options = dict(pairs)
    unknown = sorted(set(options) - {"synchronous", "timeout"})
    if unknown or len(options) != len(pairs):
        raise InvalidURL(
            f"sqlite URL options {unknown or 'repeated'} are not understood; known: "
            "synchronous=normal|full, timeout=SECONDS (each at most once)"
        )
    synchronous = options.get("synchronous", "normal").lower()
    if synchronous not in SYNCHRONOUS_MODES:
        raise InvalidURL(f"synchronous={synchronous!r} is unknown; use normal or full")
    return path, synchronous, _parse_timeout(options.get("timeout", "30"))


def _parse_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise InvalidURL(f"timeout={text!r} must be a number of seconds >= 0")
    return value


def open_sqlite_sequencer(url: str) -> SqliteSequencer:
    """Open (creating if needed) the sequencer database a ``sqlite:///`` URL names."""
    path, synchronous, timeout = parse_sqlite_url(url)
    return SqliteSequencer(path, synchronous=synchronous, timeout=timeout)


# --------------------------------------------------------------------- connections


class _Connection:
    """A thread's connection; a weak-referenceable holder, so :meth:`close` finds every
    open one while a finished thread's connection is still freed with its thread.

    ``lock`` is held for the whole of each transaction, and :meth:`SqliteSequencer.close`
    takes it before closing: closing a connection another thread is using crashes the
    process (SQLite frees memory that thread is still reading).
    """

    __slots__ = ("__weakref__", "closed", "db", "lock")

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.lock = threading.RLock()
        self.closed = False


_LIVE: weakref.WeakSet[SqliteSequencer] = weakref.WeakSet()
_INHERITED: list[_Connection] = []  # connections a fork child must neither use nor close


def _after_fork_in_child() -> None:
    for sequencer in list(_LIVE):
        sequencer._forget_connections()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _StateCache:
    """Decoded producer states with the JSON text each came from, by (stream id,
    producer id). A writer's next commit loads the text it stored itself, so this
    skips a JSON decode per batch. Always correct: an entry is used only when the
    stored text is identical (whoever wrote it), and a rolled-back entry simply misses."""

    LIMIT = 65536

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, int], tuple[str, ProducerStreamState]] = {}

    def decode(self, key: tuple[Any, int], text: str) -> ProducerStreamState:
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

    def _remember(self, key: tuple[Any, int], text: str, state: ProducerStreamState) -> None:
        if len(self._entries) >= self.LIMIT:
            self._entries.clear()  # crude but bounded; a miss only costs a decode
        self._entries[key] = (text, state)


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


@functools.lru_cache(maxsize=64)
def _marks(count: int) -> str:
    return ",".join("?" * count)


def _chunks(values: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for i in range(0, len(values), _IN_CHUNK):
        yield values[i : i + _IN_CHUNK]


class SqliteSequencer(Sequencer):
    """A sequencer in one SQLite database file, safe for many threads and processes.

    ``clock`` (seconds since the epoch) stamps when objects stop holding live batches;
    tests inject one. See the module docstring for the options and the costs.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "normal",
        timeout: float = 30.0,
        clock: Clock = time.time,
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise ConfigError(f"synchronous={synchronous!r} is unknown; use normal or full")
        if not (isinstance(timeout, (int, float)) and timeout >= 0):
            raise ConfigError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.synchronous = synchronous
        self.timeout = float(timeout)
        self._clock = clock
        query = "" if synchronous == "normal" else f"?synchronous={synchronous}"
        if self.timeout != 30.0:
            query += ("&" if query else "?") + f"timeout={self.timeout:g}"
        self.url = "sqlite://" + quote(self.path) + query
        self._lock = threading.Lock()
        self._local = threading.local()
        self._connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._closed = False
        self._states = _StateCache()
        parent = os.path.dirname(self.path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise SequencerError(f"cannot create the directory of {self.path}: {exc}") from exc
        _LIVE.add(self)
        try:
            self._prepare_schema()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"SqliteSequencer({self.url})"

    # ------------------------------------------------------------ connections

    def _holder(self) -> _Connection:
        holder: _Connection | None = getattr(self._local, "connection", None)
        if holder is None:
            holder = self._connect()
        return holder

    def _connect(self) -> _Connection:
        if self._closed:
            raise LogClosedError(f"{self!r} was closed")
        try:
            db = sqlite3.connect(
                self.path,
                timeout=self.timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # close() may run in another thread
                cached_statements=256,
            )
            # Both values come from SYNCHRONOUS_MODES: no user text reaches the SQL.
            db.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            db.execute(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT_PAGES}")
            db.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        holder = _Connection(db)
        with self._lock:
            if self._closed:
                db.close()
                raise LogClosedError(f"{self!r} was closed")
            self._connections.add(holder)
        self._local.connection = holder
        return holder

    def _forget_connections(self) -> None:
        """In a fork child: keep the inherited connections referenced, unused, unclosed."""
        _INHERITED.extend(self._connections)
        self._connections = weakref.WeakSet()
        self._local = threading.local()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close every thread's connection, each once its current transaction (if any)
        has finished; later calls raise LogClosedError. Idempotent, and safe while other
        threads are still using the sequencer."""
        with self._lock:
            self._closed = True
            holders = list(self._connections)
            self._connections = weakref.WeakSet()
        for holder in holders:
            with holder.lock:
                holder.closed = True
                with contextlib.suppress(sqlite3.Error):
                    holder.db.close()
        _LIVE.discard(self)

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """One transaction: ``BEGIN IMMEDIATE`` for mutations (write lock up front),
        plain ``BEGIN`` for multi-statement reads (one consistent snapshot). Any
        exception rolls back, so nothing of a failed call is applied."""
        holder = self._holder()
        with holder.lock:
            if holder.closed or self._closed:
                raise LogClosedError(f"{self!r} was closed")
            db = holder.db
            self._begin(db, begin)
            try:
                yield db
            except BaseException as exc:
                self._rollback(db)
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc) from exc
                raise
            try:
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(db)
                raise self._error(exc) from exc

    def _begin(self, db: sqlite3.Connection, begin: str) -> None:
        """Start a transaction. Writers wait for the write lock with short, jittered
        retries rather than SQLite's busy handler, whose sleeps grow to 100 ms: with it, a
        waiting process keeps losing the lock to processes that never sleep."""
        if begin != _WRITE:
            try:
                db.execute(begin)
            except sqlite3.Error as exc:
                raise self._error(exc) from exc
            return
        db.execute("PRAGMA busy_timeout = 0")
        try:
            deadline = time.monotonic() + self.timeout
            delay = _LOCK_RETRY_FIRST
            while True:
                try:
                    db.execute(_WRITE)
                    return
                except sqlite3.OperationalError as exc:
                    if _is_busy(exc) and time.monotonic() < deadline:
                        time.sleep(delay * (0.5 + random.random()))
                        delay = min(delay * 1.5, _LOCK_RETRY_MAX)
                        continue
                    raise self._error(exc) from exc
        finally:
            db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    @staticmethod
    def _rollback(db: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.Error):
            if db.in_transaction:
                db.execute("ROLLBACK")

    def _error(self, exc: sqlite3.Error) -> Exception:
        if self._closed:
            return LogClosedError(f"{self!r} was closed")
        text = str(exc)
        if "locked" in text or "busy" in text:
            return SequencerError(
                f"the sequencer database {self.path} is locked by another writer (waited up "
                f"to {self.timeout:g} s); nothing was applied. Retry, or raise ?timeout= in "
                "the URL"
            )
        return SequencerError(f"sequencer database {self.path}: {text}; nothing was applied")

    # ----------------------------------------------------------------- schema

    def _prepare_schema(self) -> None:
        mode = self._switch_to_wal()
        if str(mode).lower() != "wal":
            raise SequencerError(
                f"{self.path}: SQLite could not switch to WAL mode (got {mode!r}); the "
                "sequencer needs a local file system that supports shared memory"
            )
        with self._transaction(_WRITE) as db:
            version = _schema_version(db, self.path)
            if version > SCHEMA_VERSION:
                raise SequencerError(
                    f"{self.path} has sequencer schema version {version}, written by a newer "
                    f"disklesslog; this version reads up to {SCHEMA_VERSION}. Upgrade "
                    "disklesslog (the file was not changed)"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target]:
                    db.execute(statement)
            if version < SCHEMA_VERSION:
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )

    def _switch_to_wal(self) -> str:
        """``PRAGMA journal_mode = WAL``, retried: it needs an exclusive lock, and SQLite
        answers "busy" at once instead of waiting when processes open a new database
        together (the busy timeout does not apply to this switch)."""
        holder = self._holder()
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        with holder.lock:
            while True:
                try:
                    return str(holder.db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
                except sqlite3.OperationalError as exc:
                    if _is_busy(exc) and time.monotonic() < deadline:
                        time.sleep(delay)
                        delay = min(delay * 2, 0.1)
                        continue
                    raise self._error(exc) from exc
                except sqlite3.Error as exc:
                    raise self._error(exc) from exc

    # ---------------------------------------------------------------- streams

    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _, text = config_copy(config)
        with self._transaction(_WRITE) as db:
            db.execute("INSERT OR IGNORE INTO streams (name, config) VALUES (?, ?)", (name, text))
            return _meta(name, self._stream_row(db, name))

    def alter_stream(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        config_copy(changes)  # checked before anything changes
        with self._transaction(_WRITE) as db:
            stored = self._stream_row(db, name)[3]  # StreamNotFound
            text = merged_config(stored, changes)
            db.execute("UPDATE streams SET config = ? WHERE name = ?", (text, name))
            return _meta(name, self._stream_row(db, name))

    def delete_stream(self, name: str) -> None:
        now = self._clock()
        with self._transaction(_WRITE) as db:
            stream_id = self._stream_row(db, name)[0]
            counts = db.execute(
                "SELECT object_id, count(*) FROM batches WHERE stream_id = ? GROUP BY object_id",
                (stream_id,),
            ).fetchall()
            db.execute("DELETE FROM batches WHERE stream_id = ?", (stream_id,))
            _release(db, counts, now)
            for table in ("producer_streams", "time_index"):
                db.execute(f"DELETE FROM {table} WHERE stream_id = ?", (stream_id,))
            db.execute("DELETE FROM group_offsets WHERE stream = ?", (name,))
            db.execute("DELETE FROM streams WHERE id = ?", (stream_id,))

    def list_streams(self) -> list[str]:
        with self._transaction(_SNAPSHOT) as db:
            return [row[0] for row in db.execute("SELECT name FROM streams ORDER BY name")]

    def stream_info(self, name: str) -> StreamMeta:
        with self._transaction(_SNAPSHOT) as db:
            return _meta(name, self._stream_row(db, name))

    def _stream_row(self, db: sqlite3.Connection, name: str) -> tuple[Any, ...]:
        """``(id, start_offset, end_offset, config, max_timestamp)``; StreamNotFound."""
        row = db.execute(
            "SELECT id, start_offset, end_offset, config, max_timestamp FROM streams "
            "WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            validate_stream_name(name)
            raise StreamNotFound(f"stream {name!r} does not exist")
        return tuple(row)

    # -------------------------------------------------------------- producers

    def init_producer(self, name: str | None = None) -> tuple[int, int]:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"a producer name must be a non-empty str or None, not {name!r}")
        with self._transaction(_WRITE) as db:
            if name is not None:
                row = db.execute("SELECT id, epoch FROM producers WHERE name = ?", (name,))
                found = row.fetchone()
                if found is not None:
                    db.execute(
                        "UPDATE producers SET epoch = ? WHERE id = ?", (found[1] + 1, found[0])
                    )
                    return found[0], found[1] + 1
            cursor = db.execute("INSERT INTO producers (name, epoch) VALUES (?, 0)", (name,))
            return cast(int, cursor.lastrowid), 0

    # ---------------------------------------------------------------- commits

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        check_object_key(object_key)
        batches = check_batches(batches)
        now = self._clock()
        with self._transaction(_WRITE) as db:
            plan, cursors = _plan(db, batches, self._states)
            self._write_plan(db, [(object_key, plan.accepted)], plan, cursors, now)
        return plan.results

    def _write_plan(
        self,
        db: sqlite3.Connection,
        parts: Sequence[tuple[str, Sequence[tuple[StreamCursor, BatchToCommit, int]]]],
        plan: CommitPlan,
        cursors: Sequence[StreamCursor],
        now: float,
    ) -> None:
        """Store a plan: each object's accepted batches (``parts``), then the streams'
        extents, producer states and time-index entries once."""
        for object_key, accepted in parts:
            object_id = _acquire(db, object_key, len(accepted), now)
            db.executemany(
                _INSERT_BATCH,
                [
                    (c.key, object_id, b.position, b.size, base, base + b.span - 1, b.max_timestamp)
                    for c, b, base in accepted
                ],
            )
        if plan.accepted:
            db.executemany(
                "UPDATE streams SET end_offset = ?, max_timestamp = ?, unindexed = ? WHERE id = ?",
                [(c.end, c.max_timestamp, c.unindexed, c.key) for c in cursors if c.dirty],
            )
        if plan.states:
            db.executemany(
                "INSERT OR REPLACE INTO producer_streams (stream_id, producer_id, state) "
                "VALUES (?, ?, ?)",
                [
                    (sid, pid, self._states.encode((sid, pid), state))
                    for (sid, pid), state in plan.states.items()
                ],
            )
        if plan.time_index:
            db.executemany(
                "INSERT OR REPLACE INTO time_index (stream_id, max_timestamp, next_offset) "
                "VALUES (?, ?, ?)",
                [(c.key, ts, offset) for c, ts, offset in plan.time_index],
            )

    def commit_transaction(
        self, transaction_id: str, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> TransactionResult:
        """One ``BEGIN IMMEDIATE`` transaction: forget expired ids, look the id up, and
        either answer the original ranges (recording unknown objects as orphans) or plan
        and store every object's batches and the id."""
        txn, checked, flat = check_transaction(transaction_id, objects)
        now = self._clock()
        with self._transaction(_WRITE) as db:
            db.execute(
                "DELETE FROM transactions WHERE committed_at < ?", (transaction_cutoff(now),)
            )
            row = db.execute("SELECT ranges FROM transactions WHERE id = ?", (txn,)).fetchone()
            if row is not None:
                db.executemany(
                    "INSERT OR IGNORE INTO objects (key, live_batches, dead_since) "
                    "VALUES (?, 0, ?)",
                    [(key, now) for key, _ in checked],
                )
                return TransactionResult(txn, ranges_from_json(row[0]), duplicate=True)
            keys = [key for key, _ in checked]
            known_keys = [
                row[0]
                for chunk in _chunks(keys)
                for row in db.execute(
                    f"SELECT key FROM objects WHERE key IN ({_marks(len(chunk))})", chunk
                )
            ]
            if known_keys:
                raise already_known(txn, known_keys)
            plan, cursors = _plan(db, flat, self._states)
            parts = []
            start = 0
            for key, batches in checked:  # no producers: one accepted entry per batch
                parts.append((key, plan.accepted[start : start + len(batches)]))
                start += len(batches)
            self._write_plan(db, parts, plan, cursors, now)
            ranges = transaction_ranges(plan)
            db.execute(
                "INSERT INTO transactions (id, committed_at, ranges) VALUES (?, ?, ?)",
                (txn, now, ranges_to_json(ranges)),
            )
            db.execute(
                "DELETE FROM transactions WHERE seq <= (SELECT max(seq) FROM transactions) - ?",
                (TRACKED_TRANSACTIONS,),
            )
        return TransactionResult(txn, ranges)

    def record_orphan(self, object_key: str) -> None:
        check_object_key(object_key)
        now = self._clock()
        with self._transaction(_WRITE) as db:
            db.execute(
                "INSERT OR IGNORE INTO objects (key, live_batches, dead_since) VALUES (?, 0, ?)",
                (object_key, now),
            )

    # ------------------------------------------------------------------ reads

    def find_batches(self, stream: str, offset: int, max_bytes: int) -> BatchPage:
        check_position(offset, "offset")
        check_position(max_bytes, "max_bytes")
        with self._transaction(_SNAPSHOT) as db:
            stream_id, start, end = self._stream_row(db, stream)[:3]
            if not start <= offset <= end:
                raise out_of_range(stream, offset, start, end)
            found: list[BatchLocation] = []
            if offset == end:
                return BatchPage(found, start, end)
            cursor = db.execute(
                _SELECT_LOCATION + " WHERE b.stream_id = ? AND b.last_offset >= ?"
                " ORDER BY b.last_offset",
                (stream_id, offset),
            )
            total = 0
            for row in cursor:
                if found and total + row[3] > max_bytes:
                    break
                found.append(BatchLocation(*row))
                total += row[3]
            cursor.close()  # a finished statement lets COMMIT end the snapshot
            return BatchPage(found, start, end)

    def offset_for_time(self, stream: str, timestamp: int) -> int | None:
        check_position(timestamp, "timestamp")  # any int: timestamps may be negative
        with self._transaction(_SNAPSHOT) as db:
            stream_id, start = self._stream_row(db, stream)[:2]
            entry = db.execute(
                "SELECT next_offset FROM time_index WHERE stream_id = ? AND max_timestamp < ?"
                " ORDER BY max_timestamp DESC LIMIT 1",
                (stream_id, timestamp),
            ).fetchone()
            lower = start if entry is None else max(start, entry[0])
            row = db.execute(
                "SELECT base_offset FROM batches WHERE stream_id = ? AND last_offset >= ?"
                " AND max_timestamp >= ? ORDER BY last_offset LIMIT 1",
                (stream_id, lower, timestamp),
            ).fetchone()
            return None if row is None else max(int(row[0]), start)

    # ------------------------------------------------------------ maintenance

    def trim(self, stream: str, before: int) -> None:
        check_position(before, "before")
        now = self._clock()
        with self._transaction(_WRITE) as db:
            stream_id, start, end = self._stream_row(db, stream)[:3]
            if before > end:
                raise out_of_range(stream, before, start, end)
            if before <= start:
                return
            counts = db.execute(
                "SELECT object_id, count(*) FROM batches WHERE stream_id = ? AND last_offset < ?"
                " GROUP BY object_id",
                (stream_id, before),
            ).fetchall()
            db.execute(
                "DELETE FROM batches WHERE stream_id = ? AND last_offset < ?", (stream_id, before)
            )
            _release(db, counts, now)
            db.execute(
                "DELETE FROM time_index WHERE stream_id = ? AND next_offset <= ?",
                (stream_id, before),
            )
            db.execute("UPDATE streams SET start_offset = ? WHERE id = ?", (before, stream_id))

    def replace_batches(
        self, stream: str, old_batch_ids: Sequence[int], new_batches: Sequence[BatchLocation]
    ) -> bool:
        ids = check_old_ids(old_batch_ids)
        news = list(new_batches)
        now = self._clock()
        with self._transaction(_WRITE) as db:
            stream_id = self._stream_row(db, stream)[0]
            olds = _load_batches(db, stream_id, ids)
            if len(olds) != len(ids):
                return False
            (between,) = db.execute(
                "SELECT count(*) FROM batches WHERE stream_id = ? AND last_offset BETWEEN ? AND ?",
                (stream_id, olds[0][1].last_offset, olds[-1][1].last_offset),
            ).fetchone()
            if between != len(olds):
                raise not_contiguous(stream)
            old_locations = [loc for _, loc in olds]
            check_new_batches(stream, old_locations, news)
            for chunk in _chunks(ids):
                db.execute(f"DELETE FROM batches WHERE id IN ({_marks(len(chunk))})", chunk)
            _release(db, Counter(object_id for object_id, _ in olds).items(), now)
            _insert_replacements(db, stream_id, news, now)
            _repair_time_index(db, stream_id, news)
            return True

    def objects_to_delete(self, grace_seconds: float) -> list[str]:
        cutoff = self._clock() - grace_seconds
        with self._transaction(_SNAPSHOT) as db:
            rows = db.execute(
                "SELECT key FROM objects WHERE dead_since IS NOT NULL AND dead_since <= ?"
                " ORDER BY dead_since, key",
                (cutoff,),
            )
            return [row[0] for row in rows]

    def forget_objects(self, object_keys: Sequence[str]) -> None:
        keys = [(key,) for key in check_keys(object_keys)]
        with self._transaction(_WRITE) as db:
            db.executemany("DELETE FROM objects WHERE key = ? AND live_batches = 0", keys)

    def list_objects(self) -> list[str]:
        with self._transaction(_SNAPSHOT) as db:
            return [row[0] for row in db.execute("SELECT key FROM objects ORDER BY key")]

    # -------------------------------------------------------- consumer groups

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        checked = check_offsets(group, offsets)
        with self._transaction(_WRITE) as db:
            db.executemany(
                "INSERT OR REPLACE INTO group_offsets (group_name, stream, next_offset)"
                " VALUES (?, ?, ?)",
                [(group, name, offset) for name, offset in checked.items()],
            )

    def committed_offsets(self, group: str) -> dict[str, int]:
        validate_group_name(group)
        with self._transaction(_SNAPSHOT) as db:
            rows = db.execute(
                "SELECT stream, next_offset FROM group_offsets WHERE group_name = ?", (group,)
            )
            return dict(rows)


# ----------------------------------------------------------------------- helpers


def _schema_version(db: sqlite3.Connection, path: str) -> int:
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
    return 0 if row is None else int(row[0])


def _meta(name: str, row: tuple[Any, ...]) -> StreamMeta:
    return StreamMeta(name, row[1], row[2], json.loads(row[3]))


def _plan(
    db: sqlite3.Connection, batches: Sequence[BatchToCommit], cache: _StateCache
) -> tuple[CommitPlan, list[StreamCursor]]:
    """Load what the commit's batches touch, then judge them with the shared rules."""
    names = list(dict.fromkeys(b.stream for b in batches))
    streams: dict[str, StreamCursor] = {}
    for chunk in _chunks(names):
        for stream_id, name, end, max_ts, unindexed in db.execute(
            "SELECT id, name, end_offset, max_timestamp, unindexed FROM streams"
            f" WHERE name IN ({_marks(len(chunk))})",
            chunk,
        ):
            streams[name] = StreamCursor(stream_id, end, max_ts, unindexed)
    touched: dict[int, set[int]] = {}  # producer id -> stream ids
    for b in batches:
        cursor = streams.get(b.stream)
        if b.producer_id != NO_PRODUCER and cursor is not None:
            touched.setdefault(b.producer_id, set()).add(cursor.key)  # type: ignore[arg-type]
    epochs = _load_epochs(db, list(touched))
    states = _load_states(db, touched, cache)
    plan = plan_commit(batches, streams, epochs, states, TIME_INDEX_INTERVAL)
    return plan, list(streams.values())


def _load_epochs(db: sqlite3.Connection, producer_ids: list[int]) -> dict[int, int]:
    epochs: dict[int, int] = {}
    for chunk in _chunks(producer_ids):
        rows = db.execute(
            f"SELECT id, epoch FROM producers WHERE id IN ({_marks(len(chunk))})", chunk
        )
        epochs.update(rows)
    return epochs


def _load_states(
    db: sqlite3.Connection, touched: Mapping[int, set[int]], cache: _StateCache
) -> dict[tuple[Any, int], ProducerStreamState]:
    states: dict[tuple[Any, int], ProducerStreamState] = {}
    for producer_id, stream_ids in touched.items():
        for chunk in _chunks(sorted(stream_ids)):
            rows = db.execute(
                "SELECT stream_id, state FROM producer_streams WHERE producer_id = ?"
                f" AND stream_id IN ({_marks(len(chunk))})",
                (producer_id, *chunk),
            )
            for stream_id, text in rows:
                states[(stream_id, producer_id)] = cache.decode((stream_id, producer_id), text)
    return states


def _acquire(db: sqlite3.Connection, key: str, batches: int, now: float) -> int:
    """Id of object ``key``, created if new, counting ``batches`` more live batches in
    it (a new object without any is dead from the start: all its batches were
    duplicates, so nothing will ever read it)."""
    cursor = db.execute(
        "INSERT OR IGNORE INTO objects (key, live_batches, dead_since) VALUES (?, ?, ?)",
        (key, batches, None if batches else now),
    )
    if cursor.rowcount == 1 and cursor.lastrowid is not None:
        return cursor.lastrowid
    (object_id,) = db.execute("SELECT id FROM objects WHERE key = ?", (key,)).fetchone()
    if batches:
        db.execute(
            "UPDATE objects SET live_batches = live_batches + ?, dead_since = NULL WHERE id = ?",
            (batches, object_id),
        )
    return int(object_id)


def _release(db: sqlite3.Connection, counts: Iterable[tuple[int, int]], now: float) -> None:
    """Uncount live batches per object; objects left with none are dead from ``now``."""
    db.executemany(_RELEASE, [(n, n, now, object_id) for object_id, n in counts])


def _load_batches(
    db: sqlite3.Connection, stream_id: int, ids: Sequence[int]
) -> list[tuple[int, BatchLocation]]:
    """``(object_id, location)`` of the live batches of ``stream_id`` among ``ids``,
    in offset order."""
    found: list[tuple[int, BatchLocation]] = []
    for chunk in _chunks(ids):
        rows = db.execute(
            "SELECT b.object_id, b.id, o.key, b.position, b.size, b.base_offset, b.last_offset,"
            " b.max_timestamp FROM batches AS b JOIN objects AS o ON o.id = b.object_id"
            f" WHERE b.stream_id = ? AND b.id IN ({_marks(len(chunk))})",
            (stream_id, *chunk),
        )
        found.extend((row[0], BatchLocation(*row[1:])) for row in rows)
    found.sort(key=lambda item: item[1].base_offset)
    return found


def _insert_replacements(
    db: sqlite3.Connection, stream_id: int, news: Sequence[BatchLocation], now: float
) -> None:
    per_object = Counter(b.object_key for b in news)
    object_ids = {key: _acquire(db, key, n, now) for key, n in per_object.items()}
    db.executemany(
        _INSERT_BATCH,
        [
            (
                stream_id,
                object_ids[b.object_key],
                b.position,
                b.size,
                b.base_offset,
                b.last_offset,
                b.max_timestamp,
            )
            for b in news
        ],
    )


def _repair_time_index(
    db: sqlite3.Connection, stream_id: int, news: Sequence[BatchLocation]
) -> None:
    """See :func:`~disklesslog.sequencers.memory.time_index_repair`: walks down from the
    highest new timestamp and stops at the first entry at or below the first new offset."""
    repair = time_index_repair(news)
    if repair is None:
        return
    new_max, low = repair
    rows = db.execute(
        "SELECT max_timestamp, next_offset FROM time_index WHERE stream_id = ?"
        " AND max_timestamp < ? ORDER BY max_timestamp DESC",
        (stream_id, new_max),
    )
    stale = []
    for ts, next_offset in rows:
        if next_offset <= low:
            break
        stale.append((stream_id, ts))
    rows.close()
    db.executemany("DELETE FROM time_index WHERE stream_id = ? AND max_timestamp = ?", stale)
    db.execute(
        "UPDATE streams SET max_timestamp = max(coalesce(max_timestamp, ?), ?) WHERE id = ?",
        (new_max, new_max, stream_id),
    )
