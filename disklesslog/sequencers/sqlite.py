"""The SQLite sequencer: the embedded default for processes sharing one machine.

``sqlite:///abs/path/meta.db`` (the path is the URL's, as for ``file:///``; parent
directories are created). Options in the query string:

``synchronous=normal`` (default)
    The write-ahead log is not fsynced per commit (only when it is checkpointed). A
    commit survives a crash of the process, but a power loss or OS crash may forget the
    last commits, acknowledged ones included: their offsets are handed out again, and
    readers that saw them may see them reassigned to other batches. The trade the rest
    of a ``file://`` log makes by default (its objects are not fsynced either). Where
    the loss leaves later commits behind it in the log, opening refuses instead
    (:mod:`~disklesslog.sequencers.sqlite_wal`).
``synchronous=full``
    The write-ahead log is fsynced by every commit: commits survive power loss, at the
    cost of one fsync (about a millisecond on an SSD) per commit; a power loss can only
    tear the last transaction, never acknowledged.
``timeout=SECONDS`` (default 30)
    How long an operation waits for another process's write transaction before it
    raises :class:`~disklesslog.errors.SequencerError`.

Concurrency: WAL mode, so readers never block writers or each other. Every mutation is
one transaction begun with ``BEGIN IMMEDIATE``, which takes the write lock before the
first read: two writers can never read the same end offset (no lost update) and never
deadlock upgrading a read lock. Each thread has its own connection, closed when the
thread ends or the sequencer closes. Do not carry an open sequencer across ``fork()``:
the child opens fresh connections on first use and never touches the inherited ones
(closing them could break the parent's locks).

Files: a clean close of the last connection leaves the database as one file (SQLite
copies its ``-wal`` into it and deletes ``-wal`` and ``-shm``); a ``-wal`` left by a
process that died is checked before SQLite replays it, by an opener that knows itself
alone through the ``<database>-lock`` file
(:mod:`~disklesslog.sequencers.sqlite_files`). While running, committers keep the
``-wal`` from growing past :data:`_WAL_SIZE_LIMIT` (:meth:`SqliteSequencer._bound_wal`).
With ``existing=True`` (a ``file://`` log whose marker exists) a database that is
missing, empty or without tables is a :class:`~disklesslog.errors.DataLossError`,
never a new one.

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

Damage (schema versions 3 and 4): every row a later call trusts carries a CRC-32C of
its columns, a stream's batch rows prove themselves complete, and the streams rows are
counted (``stream_count``), checked before a stream is said not to exist or created
(:mod:`~disklesslog.sequencers.rows`); a mismatch is a
:class:`~disklesslog.errors.CorruptDataError` naming the file, table and row. SQLite's
own reports of a damaged file ("database disk image is malformed", "file is not a
database") become the same error naming the file. Opening checks the file's structure
while that is cheap: ``PRAGMA integrity_check`` (b-trees, and every index against its
table) up to :data:`INTEGRITY_CHECK_MAX_BYTES`, ``PRAGMA quick_check`` (b-trees only)
up to :data:`QUICK_CHECK_MAX_BYTES`, nothing beyond (run
:meth:`SqliteSequencer.check_integrity` instead); the full check also runs before a
schema migration (:mod:`~disklesslog.sequencers.sqlite_schema`), whatever the size.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
import sqlite3
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ..errors import (
    ConfigError,
    CorruptDataError,
    DataLossError,
    DisklessLogError,
    InvalidURL,
    LogClosedError,
    SequencerError,
    StreamNotFound,
)
from ..forks import ForkGate, reset_after_fork
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
from .sqlite_files import Presence, open_presence
from .sqlite_schema import SCHEMA_VERSION, migrate, schema_version, stored_version

__all__ = [
    "INTEGRITY_CHECK_MAX_BYTES",
    "QUICK_CHECK_MAX_BYTES",
    "SCHEMA_VERSION",
    "SYNCHRONOUS_MODES",
    "TIME_INDEX_INTERVAL",
    "SqliteSequencer",
    "open_sqlite_sequencer",
    "parse_sqlite_url",
]

SYNCHRONOUS_MODES = ("normal", "full")

log = logging.getLogger(__name__)

INTEGRITY_CHECK_MAX_BYTES = 8 << 20
"""Opening a database file up to this size runs ``PRAGMA integrity_check``: every page,
and every index entry against its table (a damaged index makes lookups miss rows that
exist). It reads about 40 MB/s on a slow shared core, so at most ~0.2 s."""
QUICK_CHECK_MAX_BYTES = 64 << 20
"""Up to this size, opening runs ``PRAGMA quick_check`` (pages and b-trees, not index
contents; about 190 MB/s, so at most ~0.35 s); larger files are not checked on open."""

_PRODUCER = "SELECT id, name, epoch, used_ms, crc FROM producers"
"""A producers row as :meth:`SqliteSequencer._producer` verifies it."""
_WRITE = "BEGIN IMMEDIATE"
_LOCK_RETRY_FIRST = 0.0005  # seconds; retries of a held write lock grow to _LOCK_RETRY_MAX
_LOCK_RETRY_MAX = 0.005
_SNAPSHOT = "BEGIN"
_AUTOCHECKPOINT_PAGES = 8000
"""WAL pages between checkpoints (SQLite's default is 1000). A commit rewrites the same
hot pages (stream rows, each stream's index leaf), so a longer WAL checkpoints each of
them once for many commits: measured ~15-20% more commits/s, for a WAL of up to ~32 MB
and a checkpoint pause of tens of milliseconds every few thousand commits."""
_WAL_SIZE_LIMIT = 64 << 20
"""Bytes the WAL file is cut back to when it starts over, and the size past which
committers make it start over (:meth:`SqliteSequencer._bound_wal`)."""
_WAL_CHECK_EVERY = 16  # write transactions between looks at the WAL's size (a stat: ~2 us)
_RESTART_WAIT = 0.25  # seconds committers try to have it start over, at most
_RESTART_PAUSES = (0.1, 5.0)
"""Seconds before a committer whose try waited in vain tries again: the first pause,
doubled after each try in vain up to the second."""
_IN_CHUNK = 500  # "?" per IN list: well under SQLITE_MAX_VARIABLE_NUMBER (999 before 3.32)
_DAMAGE_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (primary result codes)
_ERRORS = (sqlite3.Error, UnicodeDecodeError)
_DAMAGE = (CorruptDataError, DataLossError)
"""What a check of the database raises, possibly in the middle of a query."""
"""What a call into ``sqlite3`` raises: its own errors, and UnicodeDecodeError when damaged
text reaches Python, even inside SQLite's error message ("malformed database schema
(...)" quoting the damaged bytes)."""
_DAMAGE_TEXTS = (  # SQLite's words for a damaged file, or a schema not as this code wrote it
    "malformed",
    "not a database",
    "Could not decode",
    "no such table",
    "no such column",
    "has no column named",
)

_STREAM = (
    "SELECT id, name, config, start_offset, end_offset, max_timestamp, unindexed, tail_gap, crc"
    " FROM streams"
)
_STREAM_COUNT = "SELECT streams, crc FROM stream_count WHERE id = 0"
_PUT_STREAM_COUNT = "UPDATE stream_count SET streams = ?, crc = ? WHERE id = 0"
_PUT_EXTENT = (
    "UPDATE streams SET end_offset = ?, max_timestamp = ?, unindexed = ?, tail_gap = 0, crc = ?"
    " WHERE id = ?"
)
_PUT_STREAM = (
    "UPDATE streams SET config = ?, start_offset = ?, end_offset = ?, max_timestamp = ?,"
    " unindexed = ?, tail_gap = ?, crc = ? WHERE id = ?"
)
_INSERT_BATCH = (
    "INSERT INTO batches (stream_id, object_id, position, size, base_offset, last_offset,"
    " max_timestamp, gap, crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_BATCH = (  # what a batch's checksum covers, its id and its object's id
    "SELECT b.id, o.key, b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp,"
    " b.gap, b.crc, b.object_id FROM batches AS b JOIN objects AS o ON o.id = b.object_id"
)
_INSERT_OBJECT = (
    "INSERT OR IGNORE INTO objects (key, live_batches, dead_since, crc) VALUES (?, ?, ?, ?)"
)
_OBJECT = "SELECT id, key, live_batches, dead_since, crc FROM objects"
_PUT_OBJECT = "UPDATE objects SET live_batches = ?, dead_since = ?, crc = ? WHERE id = ?"
_PUT_TIME_INDEX = (
    "INSERT OR REPLACE INTO time_index (stream_id, max_timestamp, next_offset, crc)"
    " VALUES (?, ?, ?, ?)"
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


class _Database(sqlite3.Connection):
    """A connection that can be weakly referenced, so that its place in the
    sequencer's :class:`~disklesslog.sequencers.sqlite_files.Presence` ends when the
    object is gone: SQLite keeps a closed connection open (files, mapped ``-shm``) while
    a statement of it is alive, and a statement lives as long as a cursor holding it."""

    __slots__ = ("__weakref__",)


class _Connection:
    """A thread's connection; a weak-referenceable holder, so
    :meth:`SqliteSequencer.close` finds every open one, and a finished thread's
    connection is closed with its thread (a finalizer: the connection refers to itself
    through its statement cache, so merely dropping it would leave it open, files and
    all, until a garbage collection).

    ``lock`` is held for the whole of each transaction, and :meth:`SqliteSequencer.close`
    takes it before closing: closing a connection another thread is using crashes the
    process (SQLite frees memory that thread is still reading).
    """

    __slots__ = ("__weakref__", "_close_db", "db", "lock")

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db: sqlite3.Connection | None = db  # None once closed
        self.lock = threading.RLock()
        self._close_db = weakref.finalize(self, _close_connection, db, os.getpid())
        self._close_db.atexit = False

    def close(self) -> None:
        """Close the connection (once) and let go of it, so that it is gone as soon as
        no cursor holds it any more."""
        self.db = None
        self._close_db()


def _close_connection(db: sqlite3.Connection, pid: int) -> None:
    """Close a holder's connection, unless this is a fork child: there it is inherited,
    kept referenced and never used nor closed (closing it could break the parent's
    locks)."""
    if os.getpid() != pid:
        _INHERITED.append(db)
        return
    with _FORK_GATE.held(), contextlib.suppress(*_ERRORS):
        db.close()


_LIVE: weakref.WeakSet[SqliteSequencer] = reset_after_fork(
    lambda sequencer: sequencer._forget_connections()
)
_INHERITED: list[object] = []  # connections a fork child must neither use nor close
_FORK_GATE = ForkGate()
"""Every use of SQLite (transactions, opening and closing connections), which
``fork()`` waits for. SQLite keeps state per process that a child cannot reset: one
table of the locks its connections hold on a database file (and on its ``-shm``),
shared by every connection to it, and mutexes its calls take with the GIL released. A
child made while a thread held the write lock would inherit an entry saying so, though
the lock itself (a POSIX lock, the parent's) is not the child's, and every write of its
own would find the database busy until its timeout; one made while a thread held one of
those mutexes would wait for it for ever."""


def _is_busy(exc: Exception) -> bool:
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
        existing: bool = False,
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise ConfigError(f"synchronous={synchronous!r} is unknown; use normal or full")
        if not (isinstance(timeout, (int, float)) and timeout >= 0):
            raise ConfigError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.synchronous = synchronous
        self.timeout = float(timeout)
        self._clock = clock
        if clock is not time.time:  # an injected clock measures leases too
            self.lease_clock = clock
        self._existing = existing
        query = "" if synchronous == "normal" else f"?synchronous={synchronous}"
        if self.timeout != 30.0:
            query += ("&" if query else "?") + f"timeout={self.timeout:g}"
        self.url = "sqlite://" + quote(self.path) + query
        self._lock = threading.Lock()
        self._local = threading.local()
        self._connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._closed = False
        self._presence: Presence | None = None
        self._wal = self.path + "-wal"
        self._restart_after = 0.0  # monotonic time before which _bound_wal does not try
        self._restart_pause = _RESTART_PAUSES[0]
        self._writes = 0  # write transactions (not exact across threads: a pacer only)
        self._states = StateCache(self.path)
        self._damage: str | None = None  # what the first integrity check after damage found
        parent = os.path.dirname(self.path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise SequencerError(f"cannot create the directory of {self.path}: {exc}") from exc
        if existing and not os.path.exists(self.path):
            raise self._lost("is missing")
        size = _file_size(self.path)
        if existing and size == 0 and _file_size(self.path + "-wal") == 0:
            raise self._lost("is empty")  # before SQLite writes a header into it
        if 0 < size < 512:  # SQLite would take a file this short for a new, empty one
            raise CorruptDataError(
                f"the file holds {size} bytes, fewer than any SQLite database: it was cut "
                "short, or is not a database",
                source=self.path,
            )
        self._presence = open_presence(self.path, self.timeout)
        _LIVE.add(self)
        try:
            self._prepare_schema()
        except BaseException:
            self.close()
            raise

    def _lost(self, what: str) -> DataLossError:
        """The error for a database that must exist (``existing``) but is missing or
        empty: a new one would hand out the log's offsets from 0 again."""
        return DataLossError(
            f"the sequencer database {what}, but the log it belongs to exists: the "
            "location of every batch, and which offsets were handed out, went with it. "
            "Nothing was created; restore it from a backup (see 'A damaged sequencer "
            "database' in docs/operations.md)",
            source=self.path,
        )

    def __repr__(self) -> str:
        return f"SqliteSequencer({self.url})"

    # ------------------------------------------------------------ connections

    def _holder(self) -> _Connection:
        holder: _Connection | None = getattr(self._local, "connection", None)
        if holder is None:
            holder = self._connect()
        return holder

    def _connect(self) -> _Connection:
        with _FORK_GATE.held():
            db = self._open_db(
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # close() may run in another thread
                cached_statements=256,
            )
            holder = _Connection(db)
            try:
                # Both values come from SYNCHRONOUS_MODES: no user text reaches the SQL.
                db.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
                db.execute(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT_PAGES}")
                db.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
            except _ERRORS as exc:
                holder.close()
                raise self._error(exc) from exc
        with self._lock:
            if self._closed:
                holder.close()
                raise LogClosedError(f"{self!r} was closed")
            self._connections.add(holder)
        self._local.connection = holder
        return holder

    def _open_db(self, **options: Any) -> sqlite3.Connection:
        """A new connection, counted in the sequencer's presence until it is gone."""
        presence = self._presence
        if self._closed or presence is None or not presence.enter():
            raise LogClosedError(f"{self!r} was closed")
        try:
            db = sqlite3.connect(self.path, timeout=self.timeout, factory=_Database, **options)
        except BaseException as exc:
            presence.leave()
            if isinstance(exc, _ERRORS):
                raise self._error(exc) from exc
            raise
        weakref.finalize(db, presence.leave).atexit = False
        return db

    def _forget_connections(self) -> None:
        """In a fork child: keep the inherited connections referenced, unused, unclosed
        (and so the lock on the database shared with the parent)."""
        _INHERITED.extend(self._connections)
        self._connections = weakref.WeakSet()
        self._local = threading.local()
        self._lock = threading.Lock()
        if self._presence is not None:
            self._presence.after_fork()

    def close(self) -> None:
        """Close every thread's connection, each once its current transaction (if any)
        has finished; later calls raise LogClosedError. Idempotent, and safe while other
        threads are still using the sequencer. When the last connection to the database
        (in any process) closes, SQLite copies the write-ahead log into the database and
        deletes the ``-wal`` and ``-shm`` files."""
        with self._lock:
            self._closed = True
            holders = list(self._connections)
            self._connections = weakref.WeakSet()
            presence, self._presence = self._presence, None
        for holder in holders:
            with holder.lock:
                holder.close()
        _LIVE.discard(self)
        if presence is not None:
            presence.leave()

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """One transaction: ``BEGIN IMMEDIATE`` for mutations (write lock up front),
        plain ``BEGIN`` for multi-statement reads (one consistent snapshot). Any
        exception rolls back, so nothing of a failed call is applied, and retires the
        connection (:meth:`_retire`)."""
        holder = self._holder()
        with holder.lock:
            db = holder.db
            if db is None or self._closed:
                raise LogClosedError(f"{self!r} was closed")
            if begin != _WRITE:
                _FORK_GATE.enter()
            try:
                self._begin(db, begin)  # a write returns inside _FORK_GATE
            except BaseException:
                if begin != _WRITE:
                    _FORK_GATE.leave()
                raise
            try:
                try:
                    yield db
                except BaseException as exc:
                    self._rollback(db)
                    if not isinstance(exc, DisklessLogError) or isinstance(exc, _DAMAGE):
                        self._retire(holder)
                    if isinstance(exc, _ERRORS):
                        raise self._error(exc) from exc
                    if isinstance(exc, OverflowError):  # an int SQLite cannot bind
                        raise ConfigError(
                            f"a number does not fit SQLite's 64-bit integers ({exc}); "
                            "nothing was applied"
                        ) from None
                    raise
                try:
                    db.execute("COMMIT")
                except _ERRORS as exc:
                    self._rollback(db)
                    self._retire(holder)
                    raise self._error(exc) from exc
                if begin == _WRITE:
                    self._writes += 1
                    if (
                        not self._writes % _WAL_CHECK_EVERY
                        and _file_size(self._wal) > _WAL_SIZE_LIMIT
                    ):
                        self._bound_wal(db)
            finally:
                _FORK_GATE.leave()

    def _bound_wal(self, db: sqlite3.Connection) -> None:
        """Have the write-ahead log start over, as its automatic checkpoints cannot
        while it is in use. They copy it into the database, but only a writer that finds
        it all copied and no reader in it reuses it from the beginning, and with other
        writers and readers always at work that moment never came: the log grew to
        gigabytes in seconds (docs/sequencers.md). ``PRAGMA wal_checkpoint(RESTART)``
        takes the write lock, copies the rest, and waits for the readers still in the
        log (new ones read the database file), so the next commit starts it over (and
        cuts the file back to :data:`_WAL_SIZE_LIMIT`). Every committer that finds the
        log past that size tries, for up to :data:`_RESTART_WAIT` until one has done it,
        so the others keep off the write lock meanwhile. A try can wait in vain (readers
        arriving as fast as they leave hold on to the log): then it pauses, longer after
        each failure (:data:`_RESTART_PAUSES`), so that such readers cost writers little.
        The commit already succeeded: a failure here is logged, never raised."""
        now = time.monotonic()
        if now < self._restart_after:
            return
        deadline = now + _RESTART_WAIT
        delay = _LOCK_RETRY_FIRST
        try:
            while True:
                wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
                db.execute(f"PRAGMA busy_timeout = {wait_ms}")
                busy, frames, _ = db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                if not busy:
                    self._restart_pause = _RESTART_PAUSES[0]
                    return
                if frames != -1 or time.monotonic() >= deadline:  # it ran and waited in vain
                    self._pause_restarts()
                    return
                time.sleep(delay)  # another connection holds the checkpoint lock
                delay = min(delay * 2, _LOCK_RETRY_MAX)
        except _ERRORS as exc:
            log.warning("%s: could not checkpoint the write-ahead log: %s", self._wal, exc)
            self._pause_restarts()
        finally:
            with contextlib.suppress(*_ERRORS):
                db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    def _pause_restarts(self) -> None:
        self._restart_after = time.monotonic() + self._restart_pause
        self._restart_pause = min(self._restart_pause * 2, _RESTART_PAUSES[1])

    def _begin(self, db: sqlite3.Connection, begin: str) -> None:
        """Start a transaction. Writers wait for the write lock with short, jittered
        retries rather than SQLite's busy handler, whose sleeps grow to 100 ms: with it, a
        waiting process keeps losing the lock to processes that never sleep.

        A write transaction starts inside :data:`_FORK_GATE` (each try enters it, a
        failed try leaves it, so a fork never waits for another process's write) and its
        caller leaves it when the transaction ends; a read is inside it all along."""
        if begin != _WRITE:
            try:
                db.execute(begin)
            except _ERRORS as exc:
                raise self._error(exc) from exc
            return
        try:
            db.execute("PRAGMA busy_timeout = 0")
            deadline = time.monotonic() + self.timeout
            delay = _LOCK_RETRY_FIRST
            while True:
                _FORK_GATE.enter()
                try:
                    db.execute(_WRITE)
                except BaseException as exc:
                    _FORK_GATE.leave()
                    busy = isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)
                    if busy and time.monotonic() < deadline:
                        time.sleep(delay * (0.5 + random.random()))
                        delay = min(delay * 1.5, _LOCK_RETRY_MAX)
                        continue
                    raise
                return
        except _ERRORS as exc:
            raise self._error(exc) from exc
        finally:
            with contextlib.suppress(*_ERRORS):
                db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    def _retire(self, holder: _Connection) -> None:
        """Close the connection of a transaction that failed in a way that can stop a
        query half-way (damage: a row failing its check, a page SQLite cannot decode;
        or any exception not ours); this thread's next call opens a new one. Such a
        failure leaves its statement unfinished, held by a cursor that the exception's
        traceback refers to for as long as the caller keeps the exception, and SQLite
        keeps that connection's snapshot even after ``ROLLBACK``: every later read on it
        would miss what was committed since, in silence (an append acknowledged, then
        not found by the read right after it). Closing is the only way to let go of
        statements Python does not expose. Refusals (a stream not found, a fenced
        producer) are raised after their queries are done, and keep the connection."""
        if getattr(self._local, "connection", None) is holder:
            self._local.connection = None
        with self._lock:
            self._connections.discard(holder)
        holder.close()

    @staticmethod
    def _rollback(db: sqlite3.Connection) -> None:
        with contextlib.suppress(*_ERRORS):
            if db.in_transaction:
                db.execute("ROLLBACK")

    def _error(self, exc: Exception) -> Exception:
        if self._closed:
            return LogClosedError(f"{self!r} was closed")
        text = str(exc)
        if "locked" in text or "busy" in text:
            return SequencerError(
                f"the sequencer database {self.path} is locked by another writer (waited up "
                f"to {self.timeout:g} s); nothing was applied. Retry, or raise ?timeout= in "
                "the URL"
            )
        code = getattr(exc, "sqlite_errorcode", None)
        if (
            isinstance(exc, UnicodeDecodeError)
            or (isinstance(code, int) and code & 0xFF in _DAMAGE_CODES)
            or any(t in text for t in _DAMAGE_TEXTS)
        ):
            return CorruptDataError(
                f"SQLite reports: {text}{self._damage_found()}; nothing was applied. See 'A "
                "damaged sequencer database' in docs/operations.md",
                source=self.path,
            )
        return SequencerError(f"sequencer database {self.path}: {text}; nothing was applied")

    def _damage_found(self) -> str:
        """What ``PRAGMA quick_check`` says of the file, once per sequencer (on the first
        damage SQLite reports: later reports would only repeat it), on a connection of
        its own so no transaction of this thread is disturbed."""
        if self._damage is None:
            self._damage = ""
            try:
                with _FORK_GATE.held(), contextlib.closing(self._open_db()) as db:
                    found = [str(row[0]) for row in db.execute("PRAGMA quick_check(5)")]
                if found != ["ok"]:
                    self._damage = "; PRAGMA quick_check found: " + " | ".join(found)
            except (*_ERRORS, DisklessLogError) as exc:
                self._damage = f"; PRAGMA quick_check failed: {exc}"
        return self._damage

    def check_integrity(self, *, full: bool = True) -> None:
        """Run ``PRAGMA integrity_check`` (``full``: b-trees and every index against its
        table) or ``quick_check`` (b-trees only) over the whole file, whatever its size,
        and raise CorruptDataError naming the file with SQLite's findings if it is
        damaged. Linear in the file size: a few hundred milliseconds per 10 MB."""
        with self._transaction(_SNAPSHOT) as db:
            self._check_file(db, "integrity_check" if full else "quick_check")

    def _check_file(self, db: sqlite3.Connection, pragma: str) -> None:
        """``PRAGMA integrity_check`` or ``quick_check``: CorruptDataError naming the file
        with SQLite's first findings, also when the damage stops the check itself."""
        try:
            found = [str(row[0]) for row in db.execute(f"PRAGMA {pragma}(10)")]
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            if isinstance(exc, sqlite3.Error) and _is_busy(exc):
                raise
            found = [f"the check stopped: {exc}"]
        if found != ["ok"]:
            raise CorruptDataError(
                f"PRAGMA {pragma} found: {' | '.join(found)}. See 'A damaged sequencer "
                "database' in docs/operations.md",
                source=self.path,
            )

    # ----------------------------------------------------------------- schema

    def _prepare_schema(self) -> None:
        """Check an up-to-date file as far as that is cheap (in a read transaction, so
        other processes keep writing), or create or migrate the tables under the write
        lock (an old file is fully checked first: a migration rewrites every row)."""
        mode = self._switch_to_wal()
        if str(mode).lower() != "wal":
            raise SequencerError(
                f"{self.path}: SQLite could not switch to WAL mode (got {mode!r}); the "
                "sequencer needs a local file system that supports shared memory"
            )
        with self._transaction(_SNAPSHOT) as db:
            if stored_version(db) == SCHEMA_VERSION:
                size = _file_size(self.path)
                if size <= INTEGRITY_CHECK_MAX_BYTES:
                    self._check_file(db, "integrity_check")
                elif size <= QUICK_CHECK_MAX_BYTES:
                    self._check_file(db, "quick_check")
                return
        with self._transaction(_WRITE) as db:
            version = schema_version(db, self.path)
            if version == 0 and self._existing:
                raise self._lost("holds no tables")  # rolls back: nothing is created
            if 0 < version < SCHEMA_VERSION:
                self._check_file(db, "integrity_check")
            migrate(db, self.path, version, clock_ms(self._clock))

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
                    db = holder.db
                    if db is None:
                        raise LogClosedError(f"{self!r} was closed")
                    with _FORK_GATE.held():
                        return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
                except sqlite3.OperationalError as exc:
                    if _is_busy(exc) and time.monotonic() < deadline:
                        time.sleep(delay)
                        delay = min(delay * 2, 0.1)
                        continue
                    raise self._error(exc) from exc
                except _ERRORS as exc:
                    raise self._error(exc) from exc

    # ---------------------------------------------------------------- streams

    def create_stream(self, name: str, config: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        _, text = config_copy(config)
        with self._transaction(_WRITE) as db:
            row = self._find_stream(db, name)  # a lost stream is damage, not created anew
            if row is None:
                cursor = db.execute(
                    "INSERT INTO streams (name, config, name_key) VALUES (?, ?, ?)",
                    (name, text, name_key(name)),
                )
                row = StreamRow(_rowid(cursor), name, text, 0, 0, None, 0, 0)
                db.execute("UPDATE streams SET crc = ? WHERE id = ?", (row_crc(row), row.id))
                self._count_streams(db, +1)
            return self._meta(row)

    def alter_stream(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        validate_stream_name(name)
        config_copy(changes)  # checked before anything changes
        with self._transaction(_WRITE) as db:
            row = self._stream_row(db, name)  # StreamNotFound
            self._meta(row)  # the stored config parses
            row = row._replace(config=merged_config(row.config, changes))
            self._put_stream(db, row)
            return self._meta(row)

    def delete_stream(self, name: str) -> None:
        now = float(self._clock())
        with self._transaction(_WRITE) as db:
            row = self._stream_row(db, name)
            olds = self._batches(db, row, "b.stream_id = ? ORDER BY b.last_offset", (row.id,))
            gone = db.execute("DELETE FROM batches WHERE stream_id = ?", (row.id,)).rowcount
            self._released(db, row, olds, gone, now)
            self._keep_use(
                db,
                db.execute(
                    "SELECT stream_id, producer_id, state, crc FROM producer_streams"
                    " WHERE stream_id = ?",
                    (row.id,),
                ).fetchall(),
            )
            for table in ("producer_streams", "time_index"):
                db.execute(f"DELETE FROM {table} WHERE stream_id = ?", (row.id,))
            groups = [
                r[0]
                for r in db.execute(
                    "SELECT group_name FROM group_offsets WHERE stream = ?", (name,)
                )
            ]
            db.execute("DELETE FROM group_offsets WHERE stream = ?", (name,))
            for group in groups:
                self._count_group(db, group, -1)
            db.execute("DELETE FROM streams WHERE id = ?", (row.id,))
            self._count_streams(db, -1)

    def list_streams(self) -> list[str]:
        with self._transaction(_SNAPSHOT) as db:
            names = [self._verified(row).name for row in db.execute(_STREAM + " ORDER BY name")]
            check_stream_count(self.path, db.execute(_STREAM_COUNT).fetchone(), len(names))
            return names

    def stream_info(self, name: str) -> StreamMeta:
        with self._transaction(_SNAPSHOT) as db:
            return self._meta(self._stream_row(db, name))

    def _meta(self, row: StreamRow) -> StreamMeta:
        config = json_value(row.config, dict, self.path, "streams", f"{row.name!r}")
        return StreamMeta(row.name, row.start_offset, row.end_offset, config)

    def _stream_row(self, db: sqlite3.Connection, name: str) -> StreamRow:
        """The verified row of ``name``; StreamNotFound."""
        row = self._find_stream(db, name)
        if row is None:
            validate_stream_name(name)
            raise StreamNotFound(f"stream {name!r} does not exist")
        return row

    def _find_stream(self, db: sqlite3.Connection, name: str) -> StreamRow | None:
        """The verified row of ``name``, or None. Before saying a stream does not exist,
        the rows with the name's ``name_key`` are verified, and the streams rows counted
        against ``stream_count``: a damaged name, a damaged entry of the name index, or
        a lost row must not make a stream vanish or let a second one of that name be
        created (from offset 0, handing its offsets out again)."""
        row = db.execute(_STREAM + " WHERE name = ?", (name,)).fetchone()
        if row is not None:
            return self._verified(row)
        for found in db.execute(_STREAM + " WHERE name_key = ?", (name_key(name),)):
            if self._verified(found).name == name:
                raise damaged_row(
                    self.path, "streams", f"{name!r}", "the index of stream names misses it"
                )
        (found,) = db.execute("SELECT count(*) FROM streams").fetchone()
        check_stream_count(self.path, db.execute(_STREAM_COUNT).fetchone(), found)
        return None

    def _count_streams(self, db: sqlite3.Connection, change: int) -> None:
        """Move the number of streams ``stream_count`` keeps by ``change``, in the
        transaction that creates or deletes the stream."""
        count = stream_count(self.path, db.execute(_STREAM_COUNT).fetchone()) + change
        db.execute(_PUT_STREAM_COUNT, (count, row_crc((count,))))

    def _verified(self, row: Sequence[Any]) -> StreamRow:
        """A ``_STREAM`` row, its checksum verified."""
        values = new_stream_row(row[:8])
        if row_crc(values) != row[8]:
            raise damaged_row(self.path, "streams", f"{values.name!r} (id {values.id})")
        return values

    def _put_stream(self, db: sqlite3.Connection, row: StreamRow) -> None:
        db.execute(_PUT_STREAM, (*row[2:], row_crc(row), row.id))

    # -------------------------------------------------------------- producers

    def init_producer(self, name: str | None = None) -> tuple[int, int]:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"a producer name must be a non-empty str or None, not {name!r}")
        now_ms = clock_ms(self._clock)
        with self._transaction(_WRITE) as db:
            if name is not None:
                found = db.execute(_PRODUCER + " WHERE name = ?", (name,)).fetchone()
                if found is not None:
                    producer_id, epoch = self._producer(found)
                    self._put_producer(db, producer_id, name, epoch + 1, max(now_ms, found[3]))
                    return producer_id, epoch + 1
            # AUTOINCREMENT: an id is never issued again, even after its row is dropped
            cursor = db.execute(
                "INSERT INTO producers (name, epoch, used_ms) VALUES (?, 0, ?)", (name, now_ms)
            )
            producer_id = _rowid(cursor)
            self._put_producer(db, producer_id, name, 0, now_ms)
            return producer_id, 0

    def _producer(self, row: Sequence[Any]) -> tuple[int, int]:
        """``(id, epoch)`` of a verified ``(id, name, epoch, used_ms, crc)`` producers row."""
        if row_crc(row[:4]) != row[4]:
            raise damaged_row(self.path, "producers", f"id {row[0]}")
        return row[0], row[2]

    @staticmethod
    def _put_producer(
        db: sqlite3.Connection, producer_id: int, name: str | None, epoch: int, used_ms: int
    ) -> None:
        db.execute(
            "UPDATE producers SET epoch = ?, used_ms = ?, crc = ? WHERE id = ?",
            (epoch, used_ms, row_crc((producer_id, name, epoch, used_ms)), producer_id),
        )

    def expire_producers(self, older_than_ms: int, *, dry_run: bool = False) -> ProducerExpiry:
        """Reads every producer and producer-state row (verified) in one transaction and
        deletes the idle ones by key: a maintenance pass's cost, once a minute at most,
        over a state that expiry itself keeps bounded."""
        check_expiry_age(older_than_ms)
        cutoff = clock_ms(self._clock) - older_than_ms
        with self._transaction(_SNAPSHOT if dry_run else _WRITE) as db:
            old: list[tuple[Any, int, str, int]] = []
            left: set[int] = set()
            written: dict[int, int] = {}
            for row in db.execute(
                "SELECT stream_id, producer_id, state, crc FROM producer_streams"
            ).fetchall():
                state = self._states.load(*row)
                if state.written_ms < cutoff:
                    old.append(row)
                    written[row[1]] = max(written.get(row[1], 0), state.written_ms)
                else:
                    left.add(row[1])
            doomed: list[int] = []
            for found in db.execute(_PRODUCER).fetchall():
                producer_id, _ = self._producer(found)
                if producer_id not in left and max(found[3], written.get(producer_id, 0)) < cutoff:
                    doomed.append(producer_id)
            if not dry_run:
                self._keep_use(db, old)
                db.executemany(
                    "DELETE FROM producer_streams WHERE stream_id = ? AND producer_id = ?",
                    [row[:2] for row in old],
                )
                db.executemany("DELETE FROM producers WHERE id = ?", [(p,) for p in doomed])
        return ProducerExpiry(states=len(old), producers=len(doomed))

    def _keep_use(self, db: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> None:
        """Producer-state rows ``(stream_id, producer_id, state, crc)`` about to be
        deleted (their stream deleted, or expired): their producers' ``used_ms`` keeps
        their last writes, so a producer is never taken for idle while it wrote within
        the window (a commit writes only the state row, not the producer's)."""
        latest: dict[int, int] = {}
        for stream_id, producer_id, text, crc in rows:
            state = self._states.load(stream_id, producer_id, text, crc)
            latest[producer_id] = max(latest.get(producer_id, 0), state.written_ms)
        for chunk in _chunks(sorted(latest)):
            for found in db.execute(
                _PRODUCER + f" WHERE id IN ({_marks(len(chunk))})", chunk
            ).fetchall():
                producer_id, epoch = self._producer(found)
                if latest[producer_id] > found[3]:
                    self._put_producer(db, producer_id, found[1], epoch, latest[producer_id])

    # ---------------------------------------------------------------- commits

    def commit(self, object_key: str, batches: Sequence[BatchToCommit]) -> list[CommitResult]:
        check_object_key(object_key)
        batches = check_batches(batches)
        now = float(self._clock())
        with self._transaction(_WRITE) as db:
            plan, streams = self._plan(db, batches)
            self._write_plan(db, [(object_key, plan.accepted)], plan, streams, now)
        return plan.results

    def _plan(
        self, db: sqlite3.Connection, batches: Sequence[BatchToCommit]
    ) -> tuple[CommitPlan, list[tuple[StreamRow, StreamCursor]]]:
        """Load what the commit's batches touch (every row verified), then judge them
        with the shared rules. Returns the plan and each touched stream's row with the
        cursor the plan moved."""
        names = list(dict.fromkeys(b.stream for b in batches))
        streams: list[tuple[StreamRow, StreamCursor]] = []
        cursors: dict[str, StreamCursor] = {}
        for chunk in _chunks(names):
            found = db.execute(_STREAM + f" WHERE name IN ({_marks(len(chunk))})", chunk).fetchall()
            rows = [new_stream_row(r[:8]) for r in found]
            for row, stored, crc in zip(rows, found, row_crcs(rows)):  # one C loop of CRCs
                if crc != stored[8]:
                    raise damaged_row(self.path, "streams", f"{row.name!r} (id {row.id})")
                cursor = StreamCursor(row.id, row.end_offset, row.max_timestamp, row.unindexed)
                cursors[row.name] = cursor
                streams.append((row, cursor))
        for name in names:
            if name not in cursors:
                self._find_stream(db, name)  # damage, rather than StreamNotFound
        touched: dict[int, set[int]] = {}  # producer id -> stream ids
        for b in batches:
            c = cursors.get(b.stream)
            if b.producer_id != NO_PRODUCER and c is not None:
                touched.setdefault(b.producer_id, set()).add(c.key)  # type: ignore[arg-type]
        epochs = self._load_epochs(db, list(touched))
        states = self._load_states(db, touched)
        plan = plan_commit(
            batches, cursors, epochs, states, TIME_INDEX_INTERVAL, clock_ms(self._clock)
        )
        return plan, streams

    def _load_epochs(self, db: sqlite3.Connection, producer_ids: list[int]) -> dict[int, int]:
        epochs: dict[int, int] = {}
        for chunk in _chunks(producer_ids):
            rows = db.execute(_PRODUCER + f" WHERE id IN ({_marks(len(chunk))})", chunk)
            epochs.update(self._producer(row) for row in rows)
        return epochs

    def _load_states(
        self, db: sqlite3.Connection, touched: Mapping[int, set[int]]
    ) -> dict[tuple[Any, int], ProducerStreamState]:
        states: dict[tuple[Any, int], ProducerStreamState] = {}
        for producer_id, stream_ids in touched.items():
            for chunk in _chunks(sorted(stream_ids)):
                rows = db.execute(
                    "SELECT stream_id, state, crc FROM producer_streams WHERE producer_id = ?"
                    f" AND stream_id IN ({_marks(len(chunk))})",
                    (producer_id, *chunk),
                )
                for stream_id, text, crc in rows:
                    states[(stream_id, producer_id)] = self._states.load(
                        stream_id, producer_id, text, crc
                    )
        return states

    def _write_plan(
        self,
        db: sqlite3.Connection,
        parts: Sequence[tuple[str, Sequence[tuple[StreamCursor, BatchToCommit, int]]]],
        plan: CommitPlan,
        streams: Sequence[tuple[StreamRow, StreamCursor]],
        now: float,
    ) -> None:
        """Store a plan: each object's accepted batches (``parts``), then the streams'
        extents, producer states and time-index entries once. A stream's first new
        batch takes over its ``tail_gap`` as its ``gap``."""
        gaps: dict[Any, int] = {row.id: row.tail_gap for row, _ in streams if row.tail_gap}
        for object_key, accepted in parts:
            object_id = self._acquire(db, object_key, len(accepted), now)
            values = [
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
            db.executemany(
                _INSERT_BATCH,
                [(v[0], object_id, *v[2:], crc) for v, crc in zip(values, row_crcs(values))],
            )
        if plan.accepted:
            moved = [
                (*row[:4], c.end, c.max_timestamp, c.unindexed, 0) for row, c in streams if c.dirty
            ]
            db.executemany(
                _PUT_EXTENT, [(*new[4:7], crc, new[0]) for new, crc in zip(moved, row_crcs(moved))]
            )
        if plan.states:
            db.executemany(
                "INSERT OR REPLACE INTO producer_streams (stream_id, producer_id, state, crc)"
                " VALUES (?, ?, ?, ?)",
                self._states.store(plan.states),
            )
        if plan.time_index:
            entries = [(c.key, ts, offset) for c, ts, offset in plan.time_index]
            db.executemany(
                _PUT_TIME_INDEX, [(*e, crc) for e, crc in zip(entries, row_crcs(entries))]
            )

    def commit_transaction(
        self, transaction_id: str, objects: Sequence[tuple[str, Sequence[BatchToCommit]]]
    ) -> TransactionResult:
        """One ``BEGIN IMMEDIATE`` transaction: forget expired ids, look the id up, and
        either answer the original ranges (recording unknown objects as orphans) or plan
        and store every object's batches and the id."""
        txn, checked, flat = check_transaction(transaction_id, objects)
        now = float(self._clock())
        with self._transaction(_WRITE) as db:
            db.execute(
                "DELETE FROM transactions WHERE committed_at < ?", (transaction_cutoff(now),)
            )
            row = db.execute(
                "SELECT id, committed_at, ranges, crc FROM transactions WHERE id = ?", (txn,)
            ).fetchone()
            if row is not None:
                ranges = self._ranges(row)
                db.executemany(_INSERT_OBJECT, [_orphan(key, now) for key, _ in checked])
                return TransactionResult(txn, ranges, duplicate=True)
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
            plan, streams = self._plan(db, flat)
            parts = []
            start = 0
            for key, batches in checked:  # no producers: one accepted entry per batch
                parts.append((key, plan.accepted[start : start + len(batches)]))
                start += len(batches)
            self._write_plan(db, parts, plan, streams, now)
            ranges = transaction_ranges(plan)
            text = ranges_to_json(ranges)
            db.execute(
                "INSERT INTO transactions (id, committed_at, ranges, crc) VALUES (?, ?, ?, ?)",
                (txn, now, text, row_crc((txn, now, text))),
            )
            db.execute(
                "DELETE FROM transactions WHERE seq <= (SELECT max(seq) FROM transactions) - ?",
                (TRACKED_TRANSACTIONS,),
            )
        return TransactionResult(txn, ranges)

    def _ranges(self, row: Sequence[Any]) -> dict[str, tuple[int, int]]:
        """The ranges of a verified ``(id, committed_at, ranges, crc)`` transactions row."""
        where = f"{row[0]!r}"
        if row_crc(row[:3]) != row[3]:
            raise damaged_row(self.path, "transactions", where)
        try:
            return ranges_from_json(row[2])
        except (ValueError, TypeError, AttributeError):
            raise damaged_row(self.path, "transactions", where, "its ranges do not parse") from None

    def record_orphan(self, object_key: str) -> None:
        check_object_key(object_key)
        now = float(self._clock())
        with self._transaction(_WRITE) as db:
            db.execute(_INSERT_OBJECT, _orphan(object_key, now))

    # ------------------------------------------------------------------ reads

    def find_batches(self, stream: str, offset: int, max_bytes: int) -> BatchPage:
        check_position(offset, "offset")
        check_position(max_bytes, "max_bytes")
        with self._transaction(_SNAPSHOT) as db:
            row = self._stream_row(db, stream)
            start, end = row.start_offset, row.end_offset
            if not start <= offset <= end:
                raise out_of_range(stream, offset, start, end)
            found: list[BatchLocation] = []
            if offset == end:
                return BatchPage(found, start, end)
            tiling = Tiling(self.path, stream, offset)
            cursor = db.execute(
                _BATCH + " WHERE b.stream_id = ? AND b.last_offset >= ? ORDER BY b.last_offset",
                (row.id, offset),
            )
            total = 0
            for location in self._locations(row, cursor, tiling):
                if found and total + location.size > max_bytes:
                    break
                found.append(location)
                total += location.size
            else:
                tiling.finish(end, row.tail_gap)
            cursor.close()  # a finished statement lets COMMIT end the snapshot
            return BatchPage(found, start, end)

    def _locations(
        self, stream: StreamRow, rows: Iterable[Sequence[Any]], tiling: Tiling | None
    ) -> Iterator[BatchLocation]:
        """Verified locations of ``_BATCH`` rows of ``stream``, in the order read, each
        checked to follow the one before (``tiling``)."""
        for batch_id, key, position, size, base, last, max_ts, gap, crc, _ in rows:
            if row_crc((stream.id, key, position, size, base, last, max_ts, gap)) != crc:
                raise damaged_row(
                    self.path, "batches", f"(stream {stream.name!r}, last_offset {last})"
                )
            if tiling is not None:
                tiling.add(base, last, gap)
            yield BatchLocation(batch_id, key, position, size, base, last, max_ts)

    def offset_for_time(self, stream: str, timestamp: int) -> int | None:
        check_position(timestamp, "timestamp")  # any int: timestamps may be negative
        with self._transaction(_SNAPSHOT) as db:
            row = self._stream_row(db, stream)
            if row.max_timestamp is None or row.max_timestamp < timestamp:
                return None  # the running maximum of every batch ever stored
            entry = db.execute(
                "SELECT max_timestamp, next_offset, crc FROM time_index WHERE stream_id = ?"
                " AND max_timestamp < ? ORDER BY max_timestamp DESC LIMIT 1",
                (row.id, timestamp),
            ).fetchone()
            lower = row.start_offset
            if entry is not None:
                if row_crc((row.id, entry[0], entry[1])) != entry[2]:
                    raise damaged_row(
                        self.path, "time_index", f"(stream {stream!r}, max_timestamp {entry[0]})"
                    )
                lower = max(lower, entry[1])
            if lower >= row.end_offset:
                return None
            # Every batch from ``lower`` up to the answer is read and verified: one
            # missing or damaged would move the answer.
            tiling = Tiling(self.path, stream, lower)
            cursor = db.execute(
                _BATCH + " WHERE b.stream_id = ? AND b.last_offset >= ? ORDER BY b.last_offset",
                (row.id, lower),
            )
            for location in self._locations(row, cursor, tiling):
                if location.max_timestamp >= timestamp:
                    cursor.close()
                    return max(location.base_offset, row.start_offset)
            tiling.finish(row.end_offset, row.tail_gap)
            return None

    # ------------------------------------------------------------ maintenance

    def trim(self, stream: str, before: int) -> None:
        check_position(before, "before")
        now = float(self._clock())
        with self._transaction(_WRITE) as db:
            row = self._stream_row(db, stream)
            if before > row.end_offset:
                raise out_of_range(stream, before, row.start_offset, row.end_offset)
            if before <= row.start_offset:
                return
            olds = self._batches(
                db,
                row,
                "b.stream_id = ? AND b.last_offset < ? ORDER BY b.last_offset",
                (row.id, before),
            )
            gone = db.execute(
                "DELETE FROM batches WHERE stream_id = ? AND last_offset < ?", (row.id, before)
            ).rowcount
            self._released(db, row, olds, gone, now)
            db.execute(
                "DELETE FROM time_index WHERE stream_id = ? AND next_offset <= ?",
                (row.id, before),
            )
            self._put_stream(db, row._replace(start_offset=before))

    def _batches(
        self, db: sqlite3.Connection, stream: StreamRow, where: str, params: Sequence[Any]
    ) -> list[tuple[int, BatchLocation]]:
        """``(object id, location)`` of the batches of ``stream`` a trim or delete is
        about to drop, verified and checked to tile from the start offset: an object's
        live count must only go down for batches that really were in it."""
        rows = db.execute(_BATCH + " WHERE " + where, params).fetchall()
        tiling = Tiling(self.path, stream.name, stream.start_offset)
        locations = self._locations(stream, rows, tiling)
        return [(row[9], location) for row, location in zip(rows, locations)]

    def _released(
        self,
        db: sqlite3.Connection,
        stream: StreamRow,
        olds: Sequence[tuple[int, BatchLocation]],
        deleted: int,
        now: float,
    ) -> None:
        """Uncount the dropped batches ``olds`` in their objects, once the DELETE that
        dropped them removed exactly as many rows (else one was hidden from the read)."""
        if deleted != len(olds):
            raise damaged_row(
                self.path,
                "batches",
                f"stream {stream.name!r}",
                f"{deleted} batch rows were dropped where {len(olds)} were read",
            )
        self._release(db, Counter(object_id for object_id, _ in olds).items(), now)

    def replace_batches(
        self, stream: str, old_batch_ids: Sequence[int], new_batches: Sequence[BatchLocation]
    ) -> bool:
        ids = check_old_ids(old_batch_ids)
        news = list(new_batches)
        now = float(self._clock())
        with self._transaction(_WRITE) as db:
            row = self._stream_row(db, stream)
            olds = self._load_batches(db, row, ids)
            if len(olds) != len(ids):
                return False
            first, last = olds[0][1], olds[-1][1]
            (between,) = db.execute(
                "SELECT count(*) FROM batches WHERE stream_id = ? AND last_offset BETWEEN ? AND ?",
                (row.id, first.last_offset, last.last_offset),
            ).fetchone()
            if between != len(olds):
                raise not_contiguous(stream)
            old_locations = [loc for _, loc, _ in olds]
            check_new_batches(stream, old_locations, news)
            for b in news:
                for value in (b.position, b.size, b.base_offset, b.last_offset, b.max_timestamp):
                    check_position(value, "a replacement batch's numbers")
            # The offsets the old batches held (with the gap before the first) are now
            # the new batches' and their gaps; what is left over joins the gap of the
            # next batch, or the stream's tail.
            tiling = Tiling(self.path, stream, first.base_offset - olds[0][2])
            for _, loc, gap in olds:
                tiling.add(loc.base_offset, loc.last_offset, gap)
            claim = first.base_offset - olds[0][2]
            gaps = []
            for b in news:
                gaps.append(b.base_offset - claim)
                claim = b.last_offset + 1
            leftover = last.last_offset + 1 - claim
            following = db.execute(
                _BATCH + " WHERE b.stream_id = ? AND b.last_offset > ? ORDER BY b.last_offset"
                " LIMIT 1",
                (row.id, last.last_offset),
            ).fetchone()
            if following is None:
                tiling.finish(row.end_offset, row.tail_gap)
            else:
                list(self._locations(row, [following], tiling))  # verified, and it follows
                if leftover:
                    values = (row.id, *following[1:7], following[7] + leftover)
                    db.execute(
                        "UPDATE batches SET gap = ?, crc = ? WHERE id = ?",
                        (values[7], row_crc(values), following[0]),
                    )
            for chunk in _chunks(ids):
                db.execute(f"DELETE FROM batches WHERE id IN ({_marks(len(chunk))})", chunk)
            self._release(db, Counter(object_id for object_id, _, _ in olds).items(), now)
            self._insert_replacements(db, row.id, news, gaps, now)
            new_max = _repair_time_index(db, row.id, news)
            self._put_stream(
                db,
                row._replace(
                    max_timestamp=greatest(row.max_timestamp, new_max),
                    tail_gap=row.tail_gap + (leftover if following is None else 0),
                ),
            )
            return True

    def _load_batches(
        self, db: sqlite3.Connection, stream: StreamRow, ids: Sequence[int]
    ) -> list[tuple[int, BatchLocation, int]]:
        """``(object_id, location, gap)`` of the live batches of ``stream`` among ``ids``,
        verified, in offset order."""
        found: list[tuple[int, BatchLocation, int]] = []
        for chunk in _chunks(ids):
            rows = db.execute(
                _BATCH + f" WHERE b.stream_id = ? AND b.id IN ({_marks(len(chunk))})",
                (stream.id, *chunk),
            ).fetchall()
            locations = self._locations(stream, rows, None)
            found.extend((row[9], loc, row[7]) for row, loc in zip(rows, locations))
        found.sort(key=lambda item: item[1].base_offset)
        return found

    def _insert_replacements(
        self,
        db: sqlite3.Connection,
        stream_id: int,
        news: Sequence[BatchLocation],
        gaps: Sequence[int],
        now: float,
    ) -> None:
        per_object = Counter(b.object_key for b in news)
        object_ids = {key: self._acquire(db, key, n, now) for key, n in per_object.items()}
        rows = []
        for b, gap in zip(news, gaps):
            values = (
                stream_id,
                b.object_key,
                b.position,
                b.size,
                b.base_offset,
                b.last_offset,
                b.max_timestamp,
                gap,
            )
            rows.append((stream_id, object_ids[b.object_key], *values[2:], row_crc(values)))
        db.executemany(_INSERT_BATCH, rows)

    # -------------------------------------------------------------- objects

    def _acquire(self, db: sqlite3.Connection, key: str, batches: int, now: float) -> int:
        """Id of object ``key``, created if new, counting ``batches`` more live batches in
        it (a new object without any is dead from the start: all its batches were
        duplicates, so nothing will ever read it). A known object's row is verified
        before its count changes."""
        dead = None if batches else now
        cursor = db.execute(_INSERT_OBJECT, (key, batches, dead, row_crc((key, batches, dead))))
        if cursor.rowcount == 1:
            return _rowid(cursor)
        object_id, _, live, _ = self._object(
            db.execute(_OBJECT + " WHERE key = ?", (key,)).fetchone(), key
        )
        if batches:
            values = (key, live + batches, None)
            db.execute(_PUT_OBJECT, (*values[1:], row_crc(values), object_id))
        return object_id

    def _release(
        self, db: sqlite3.Connection, counts: Iterable[tuple[int, int]], now: float
    ) -> None:
        """Uncount live batches per object; objects left with none are dead from ``now``."""
        pairs = dict(counts)
        updates = []
        ids = list(pairs)
        for chunk in _chunks(ids):
            for found in db.execute(_OBJECT + f" WHERE id IN ({_marks(len(chunk))})", chunk):
                object_id, key, live, dead_since = self._object(found, f"id {found[0]}")
                n = pairs.pop(object_id)
                if live < n:
                    raise damaged_row(
                        self.path,
                        "objects",
                        f"{key!r}",
                        f"it counts {live} live batches, but {n} of them are being dropped",
                    )
                values = (key, live - n, now if live == n else dead_since)
                updates.append((*values[1:], row_crc(values), object_id))
        if pairs:
            raise damaged_row(
                self.path, "objects", f"id {next(iter(pairs))}", "a live batch's object is missing"
            )
        db.executemany(_PUT_OBJECT, updates)

    def _object(self, row: Sequence[Any] | None, what: str) -> tuple[int, str, int, float | None]:
        """``(id, key, live_batches, dead_since)`` of a verified ``_OBJECT`` row."""
        if row is None or row_crc(row[1:4]) != row[4]:
            raise damaged_row(self.path, "objects", what if row is None else f"{row[1]!r}")
        return row[0], row[1], row[2], row[3]

    def objects_to_delete(self, grace_seconds: float) -> list[str]:
        """Read through the index of dead objects, every row verified, then checked
        against one scan of the table in C (a damaged index or ``dead_since`` must not
        hide garbage forever)."""
        cutoff = self._clock() - grace_seconds
        with self._transaction(_SNAPSHOT) as db:
            rows = db.execute(
                _OBJECT + " WHERE dead_since IS NOT NULL AND dead_since <= ?"
                " ORDER BY dead_since, key",
                (cutoff,),
            )
            keys = []
            for found in rows:
                _, key, live, _ = self._object(found, "")
                if live:
                    raise damaged_row(
                        self.path,
                        "objects",
                        f"{key!r}",
                        f"it is dead but counts {live} live batches",
                    )
                keys.append(key)
            due, undated = db.execute(
                "SELECT coalesce(sum(dead_since IS NOT NULL AND dead_since <= ?), 0),"
                " coalesce(sum(live_batches = 0 AND dead_since IS NULL), 0)"
                " FROM objects NOT INDEXED",
                (cutoff,),
            ).fetchone()
            check_garbage(self.path, len(keys), due, undated)
            return keys

    def forget_objects(self, object_keys: Sequence[str]) -> None:
        keys = [check_object_key(key) for key in check_keys(object_keys)]
        with self._transaction(_WRITE) as db:
            for chunk in _chunks(keys):
                found = db.execute(
                    _OBJECT + f" WHERE key IN ({_marks(len(chunk))}) AND live_batches = 0", chunk
                ).fetchall()
                for row in found:
                    self._object(row, "")
                db.executemany(
                    "DELETE FROM objects WHERE id = ? AND live_batches = 0",
                    [(row[0],) for row in found],
                )

    def list_objects(self) -> list[str]:
        """Every object row verified, and their live batches counted against the batch
        rows: the reconcile pass deletes what is not listed here, so a row lost from
        ``objects`` must be an error, not an object deleted from storage."""
        with self._transaction(_SNAPSHOT) as db:
            keys = []
            live = 0
            for found in db.execute(_OBJECT + " ORDER BY key"):
                _, key, count, _ = self._object(found, "")
                keys.append(key)
                live += count
            (batches,) = db.execute("SELECT count(*) FROM batches").fetchone()
            if batches != live:
                raise damaged_row(
                    self.path,
                    "objects",
                    "(all)",
                    f"the objects count {live} live batches but there are {batches} batch rows",
                )
            return keys

    # -------------------------------------------------------- consumer groups

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        checked = check_offsets(group, offsets)
        for name, offset in checked.items():
            check_position(offset, f"offset of {name!r}")
        if not checked:
            return
        with self._transaction(_WRITE) as db:
            names = list(checked)
            known = {
                row[0]
                for chunk in _chunks(names)
                for row in db.execute(
                    "SELECT stream FROM group_offsets WHERE group_name = ?"
                    f" AND stream IN ({_marks(len(chunk))})",
                    (group, *chunk),
                )
            }
            db.executemany(
                "INSERT OR REPLACE INTO group_offsets (group_name, stream, next_offset, crc)"
                " VALUES (?, ?, ?, ?)",
                [
                    (group, name, offset, row_crc((group, name, offset)))
                    for name, offset in checked.items()
                ],
            )
            self._count_group(db, group, len(set(names) - known))

    def _count_group(self, db: sqlite3.Connection, group: str, change: int) -> int:
        """Move the number of offset rows ``groups`` keeps for ``group`` by ``change``
        (the row goes when it reaches 0); returns the number before the change."""
        row = db.execute(
            "SELECT streams, crc FROM groups WHERE group_name = ?", (group,)
        ).fetchone()
        count = 0 if row is None else self._group_count(group, row)
        if change:
            if count + change > 0:
                db.execute(
                    "INSERT OR REPLACE INTO groups (group_name, streams, crc) VALUES (?, ?, ?)",
                    (group, count + change, row_crc((group, count + change))),
                )
            else:
                db.execute("DELETE FROM groups WHERE group_name = ?", (group,))
        return count

    def _group_count(self, group: str, row: Sequence[Any]) -> int:
        if row_crc((group, row[0])) != row[1]:
            raise damaged_row(self.path, "groups", f"{group!r}")
        return int(row[0])

    def committed_offsets(self, group: str) -> dict[str, int]:
        validate_group_name(group)
        with self._transaction(_SNAPSHOT) as db:
            offsets = {}
            for name, offset, crc in db.execute(
                "SELECT stream, next_offset, crc FROM group_offsets WHERE group_name = ?", (group,)
            ):
                if row_crc((group, name, offset)) != crc:
                    raise damaged_row(self.path, "group_offsets", f"({group!r}, {name!r})")
                offsets[name] = offset
            count = self._count_group(db, group, 0)
            if count != len(offsets):
                raise damaged_row(
                    self.path,
                    "group_offsets",
                    f"group {group!r}",
                    f"the group has {len(offsets)} offset rows but counts {count}",
                )
            return offsets

    def list_groups(self) -> list[str]:
        # A group's row in ``groups`` exists while it has offset rows (see _count_group).
        with self._transaction(_SNAPSHOT) as db:
            rows = db.execute("SELECT group_name, streams, crc FROM groups ORDER BY group_name")
            return [group for group, *row in rows if self._group_count(group, row) > 0]

    # ------------------------------------------------------------------ leases

    def read_lease(self, name: str) -> LeaseRecord | None:
        validate_lease_name(name)
        with self._transaction(_SNAPSHOT) as db:
            return self._lease(db, name)

    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        """One ``BEGIN IMMEDIATE`` transaction: the serial compared and the row written
        under the write lock, so of two processes swapping from one serial one wins. A
        first record also moves ``lease_count``."""
        validate_lease_name(name)
        check_lease_record(serial, record)
        with self._transaction(_WRITE) as db:
            current = self._lease(db, name)
            if (0 if current is None else current.serial) != serial:
                return False
            if current is None:
                count, (floor, _), _ = self._lease_rows(db)
                if not starts_above_floor(record, floor):
                    return False
                self._put_lease_count(db, count + 1)
            self._put_lease(db, name, record)
            return True

    def drop_lease(self, name: str, serial: int) -> bool:
        """One ``BEGIN IMMEDIATE`` transaction: the row deleted and the token floor (the
        row named ``''``, written by the first drop) raised to its token and serial."""
        validate_lease_name(name)
        check_lease_serial(serial)
        with self._transaction(_WRITE) as db:
            current = self._lease(db, name)
            if current is None or current.serial != serial:
                return False
            count, (floor, floor_serial), _ = self._lease_rows(db)
            raised = LeaseRecord(None, raised_floor(floor, current), floor_serial + 1, 1)
            self._put_lease(db, FLOOR_ROW, raised)
            db.execute("DELETE FROM leases WHERE name = ?", (name,))
            if floor_serial:  # else the floor's new row takes the dropped one's place
                self._put_lease_count(db, count - 1)
            return True

    def lease_names(self) -> list[str]:
        with self._transaction(_SNAPSHOT) as db:
            return self._lease_rows(db)[2]

    def lease_floor(self) -> int:
        with self._transaction(_SNAPSHOT) as db:
            return self._lease_rows(db)[1][0]

    def _lease(self, db: sqlite3.Connection, name: str) -> LeaseRecord | None:
        """The verified record, or None once the rows are proven complete."""
        row = db.execute(
            "SELECT holder, token, serial, duration_ms, crc FROM leases WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            self._lease_rows(db)
            return None
        if row_crc((name, *row[:4])) != row[4]:
            raise damaged_row(self.path, "leases", f"{name!r}")
        return LeaseRecord(*row[:4])

    def _lease_rows(self, db: sqlite3.Connection) -> tuple[int, tuple[int, int], list[str]]:
        """:func:`check_leases` (every row verified and counted), :func:`lease_floor`
        and the lease names, sorted."""
        row = db.execute("SELECT leases, crc FROM lease_count WHERE id = 0").fetchone()
        rows = db.execute(
            "SELECT name, holder, token, serial, duration_ms, crc FROM leases"
        ).fetchall()
        names = sorted(name for name, *_ in rows if name != FLOOR_ROW)
        return check_leases(self.path, row, rows), lease_floor(rows), names

    def _put_lease_count(self, db: sqlite3.Connection, count: int) -> None:
        db.execute(
            "UPDATE lease_count SET leases = ?, crc = ? WHERE id = 0", (count, row_crc((count,)))
        )

    def _put_lease(self, db: sqlite3.Connection, name: str, record: LeaseRecord) -> None:
        values = (name, record.holder, record.token, record.serial, record.duration_ms)
        db.execute(
            "INSERT OR REPLACE INTO leases (name, holder, token, serial, duration_ms, crc)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (*values, row_crc(values)),
        )


# ----------------------------------------------------------------------- helpers


def _rowid(cursor: sqlite3.Cursor) -> int:
    """The id SQLite gave the row an INSERT just added."""
    if cursor.lastrowid is None:  # pragma: no cover - every INSERT here adds a row
        raise SequencerError("SQLite returned no id for a new row")
    return cursor.lastrowid


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _orphan(key: str, now: float) -> tuple[str, int, float, int]:
    """``_INSERT_OBJECT`` parameters of an object without live batches, dead from ``now``."""
    return (key, 0, now, row_crc((key, 0, now)))


def _repair_time_index(
    db: sqlite3.Connection, stream_id: int, news: Sequence[BatchLocation]
) -> int | None:
    """See :func:`~disklesslog.sequencers.common.time_index_repair`: walks down from the
    highest new timestamp and stops at the first entry at or below the first new offset.
    Returns the highest new timestamp (the stream's maximum must rise to it)."""
    repair = time_index_repair(news)
    if repair is None:
        return None
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
    return new_max
