"""The backend-independent API: :class:`AbstractLog` and :class:`Stream`.

An application codes against these two classes and chooses a storage backend by URL
only (KIP-1183's idea of one log layer over interchangeable storage). Behaviour that
follows from the abstract operations (reading records from batches, tailing, single
appends, argument checking) is implemented once here; backends supply the storage.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .config import StreamConfig
from .errors import (
    ConfigError,
    LogClosedError,
    OffsetOutOfRange,
    StreamNotFound,
)
from .format import MAX_OFFSET, MAX_TIMESTAMP
from .leases import Lease, LeaseKeeper
from .maintenance.auto import (
    DEFAULT_INTERVAL_MS,
    LEASE_NAME,
    STATUS_FILE,
    Maintainer,
    MaintenanceStatus,
    check_maintenance,
    decode_status,
)
from .maintenance.report import MaintenanceReport, Progress
from .maintenance.retention import Unit, apply_retention
from .names import validate_group_name, validate_stream_name
from .records import Record, RecordBatch

if TYPE_CHECKING:
    from .consumer import Consumer
    from .sequencers.base import TransactionResult
    from .transactions import StagedPart, Stager
    from .writer import Writer

__all__ = [
    "AbstractLog",
    "Stream",
    "StreamInfo",
    "check_offset",
    "check_read_arguments",
    "check_seconds",
    "check_timestamp",
    "finite_number",
    "validate_group_name",
    "validate_stream_name",
]


def check_offset(value: object, what: str) -> int:
    """Return ``value`` if it is an int offset in ``0..MAX_OFFSET`` (2**63-1), else raise:
    :class:`ConfigError` for another type (``bool`` included), :class:`OffsetOutOfRange`
    for an int no stream can hold. The latter is raised before any stream is looked at,
    so it carries no stream's range (``start_offset=0, end_offset=-1``).

    Every public call taking an offset checks it here, before a backend sees it: both
    backends then refuse the same values the same way, and no storage layer (a SQL
    column, a 64-bit file field) meets an integer it cannot hold."""
    if type(value) is not int:
        raise ConfigError(f"{what} must be an int offset, not {type(value).__name__}")
    if value < 0:
        raise OffsetOutOfRange(
            f"{what}={value} is negative; offsets start at 0", start_offset=0, end_offset=-1
        )
    if value > MAX_OFFSET:
        raise OffsetOutOfRange(
            f"{what}={value} is above 2**63-1, the largest offset a stream can hold",
            start_offset=0,
            end_offset=-1,
        )
    return value


def check_timestamp(value: object, what: str) -> int:
    """Return ``value`` if it is an int timestamp in ms within ``0..MAX_TIMESTAMP``
    (2**63-1, what a record can carry), else raise :class:`ConfigError`."""
    if type(value) is not int:
        raise ConfigError(f"{what} must be an int (ms since the epoch), not {type(value).__name__}")
    if not 0 <= value <= MAX_TIMESTAMP:
        raise ConfigError(f"{what}={value} is outside 0..2**63-1 (ms since the epoch)")
    return value


def finite_number(value: object) -> float | None:
    """``value`` as a float if it is a finite int or float (not ``bool``), else ``None``:
    also for an int too large for a float, which ``math.isfinite`` would raise on."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_seconds(value: object, what: str, *, zero: bool = False, forever: bool = False) -> float:
    """Return ``value`` as a float if it is a number of seconds > 0 (>= 0 with ``zero``),
    finite unless ``forever`` (a timeout may be ``math.inf``, an interval never); else
    raise :class:`ConfigError`. ``bool``, NaN and ints too large for a float are refused."""
    seconds = finite_number(value)
    if seconds is None and forever and value == math.inf and not isinstance(value, bool):
        seconds = math.inf
    if seconds is None:
        kind = "a number of seconds (or math.inf)" if forever else "a finite number of seconds"
        raise ConfigError(f"{what} must be {kind}, not {value!r}")
    if seconds < 0 or (seconds == 0 and not zero):
        raise ConfigError(f"{what} must be {'>= 0' if zero else 'positive'}, not {value!r}")
    return seconds


def check_read_arguments(start: object, end: object, max_records: object) -> None:
    """Raise the typed error for bad ``read``/``read_batches`` arguments (every backend)."""
    if start is not None:
        check_offset(start, "start")
    if end is not None:
        check_offset(end, "end")
    if max_records is not None and (type(max_records) is not int or max_records < 0):
        raise ConfigError("max_records must be a non-negative int or None")


@dataclass(frozen=True)
class StreamInfo:
    """A snapshot of a stream's extent and settings."""

    name: str
    """The stream's name."""
    start_offset: int
    """The first offset still kept: records below it were trimmed by retention or
    :meth:`Stream.trim`."""
    end_offset: int
    """The offset the next record will get (the high watermark); equal to
    ``start_offset`` when no records are kept."""
    config: StreamConfig
    """The stream's settings."""
    size_bytes: int
    """Bytes the stream's records occupy in storage (segment files, or its share of
    objects), compressed as stored; tiered copies of a local stream included."""
    details: dict[str, Any] = field(default_factory=dict)
    """Backend-specific facts (for the local backend: its segments)."""


class Stream(ABC):
    """One ordered, append-only sequence of records with dense offsets from 0.

    Handles are cheap and thread-safe; get them from :meth:`AbstractLog.stream`.
    """

    def __init__(self, log: AbstractLog, name: str) -> None:
        self._log = log
        self._name = name

    @property
    def name(self) -> str:
        """The stream's name within its log (validated when the handle was made)."""
        return self._name

    @property
    def log(self) -> AbstractLog:
        """The log this handle belongs to: closing it makes the handle's calls raise
        :class:`~disklesslog.LogClosedError`."""
        return self._log

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r} of {self._log.url}>"

    # ----------------------------------------------------------------- appending

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Any = None,
        timestamp: int | None = None,
    ) -> int:
        """Append one record and return its offset once it is durable.

        ``value=None`` is a tombstone. ``headers`` is a dict or a sequence of
        ``(str, bytes | None)`` pairs. ``timestamp`` defaults to now (ms).
        """
        return self.append_batch(
            [value],
            keys=None if key is None else [key],
            headers=None if headers is None else [headers],
            timestamps=timestamp,
        )[0]

    @abstractmethod
    def append_batch(
        self,
        values: Iterable[bytes | None],
        *,
        keys: Iterable[bytes | None] | None = None,
        headers: Iterable[Any] | None = None,
        timestamps: int | Sequence[int] | None = None,
    ) -> list[int]:
        """Append records atomically (all or none) and return their offsets.

        Records are given as columns: ``values`` plus optional parallel ``keys`` and
        ``headers``; ``timestamps`` is one int for all, one per record, or ``None`` (now).
        """

    # ------------------------------------------------------------------- reading

    @abstractmethod
    def read_batches(
        self, start: int | None = None, end: int | None = None, *, max_records: int | None = None
    ) -> Iterator[RecordBatch]:
        """Yield records from ``start`` (default: the start offset) up to ``end`` or the
        end offset at call time, as column batches, in offset order.

        The bulk interface: no Python object per record. Raises
        :class:`~disklesslog.OffsetOutOfRange` when ``start`` is below the start offset
        or above the end offset, and :class:`~disklesslog.CorruptDataError` instead of
        returning bytes that fail their checksum.
        """

    def read_offsets(
        self, start: int | None = None, end: int | None = None
    ) -> Iterator[Sequence[int]]:
        """Yield the offsets of the records from ``start`` up to ``end`` (defaults and
        errors as for :meth:`read_batches`), batch by batch: what ``read_batches`` would
        yield as ``batch.offsets``, often a ``range``.

        For counting records and finding compaction gaps without decoding them: a batch
        whose offsets are dense is checksummed but not decoded, since its header says
        which offsets it holds. Corrupt data still raises
        :class:`~disklesslog.CorruptDataError`. Summing ``len()`` of what it yields
        counts the records in the range.
        """
        return map(attrgetter("offsets"), self.read_batches(start, end))

    def read(
        self, start: int | None = None, end: int | None = None, *, max_records: int | None = None
    ) -> Iterator[Record]:
        """Yield :class:`Record` objects; arguments as for :meth:`read_batches`.

        Argument errors raise at the call, not at the first ``next()``.
        """
        batches = self.read_batches(start, end, max_records=max_records)
        return chain.from_iterable(map(RecordBatch.records, batches))

    def follow(
        self,
        start: int | None = None,
        *,
        poll_interval: float = 0.1,
        idle_timeout: float | None = None,
    ) -> Iterator[Record]:
        """Yield records from ``start`` (default: the end offset, i.e. only new records)
        as they are appended, forever or until ``idle_timeout`` seconds pass without one.

        Polls the end offset, backing off from 1 ms up to ``poll_interval`` while idle.
        Waits for the stream to be created if it does not exist yet. Argument errors
        raise at the call, not at the first ``next()``.
        """
        if start is not None:
            check_offset(start, "start")
        interval = check_seconds(poll_interval, "poll_interval")
        idle = (
            None if idle_timeout is None else check_seconds(idle_timeout, "idle_timeout", zero=True)
        )
        return self._follow(start, interval, idle)

    def _follow(
        self, start: int | None, poll_interval: float, idle_timeout: float | None
    ) -> Iterator[Record]:
        position = start
        delay = min(0.001, poll_interval)
        idle_since = time.monotonic()
        while True:
            if position is None:
                position = self._end_offset_or_none()
            progressed = False
            if position is not None:
                try:
                    batches = self.read_batches(position)
                except StreamNotFound:
                    batches = iter(())  # not created yet: keep waiting
                for batch in batches:
                    yield from batch.records()
                    position = batch.offsets[-1] + 1
                    progressed = True
            if progressed:
                delay = min(0.001, poll_interval)
                idle_since = time.monotonic()
                continue
            if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                return
            time.sleep(delay)
            delay = min(delay * 2, poll_interval)

    def _end_offset_or_none(self) -> int | None:
        """The end offset, or ``None`` while the stream does not exist."""
        try:
            return self.end_offset
        except StreamNotFound:
            return None

    @abstractmethod
    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp_ms``, judged batch by
        batch by their max timestamp as Kafka does; ``None`` when no record is that late."""

    # --------------------------------------------------------------------- extent

    @property
    @abstractmethod
    def start_offset(self) -> int:
        """The first offset still kept (moves forward with :meth:`trim`)."""

    @property
    @abstractmethod
    def end_offset(self) -> int:
        """The high watermark: the offset the next record will get."""

    @abstractmethod
    def trim(self, before_offset: int) -> None:
        """Drop records below ``before_offset`` (moves the start offset; never past the end)."""

    @abstractmethod
    def info(self) -> StreamInfo:
        """Extent, size and configuration of the stream."""

    @property
    def config(self) -> StreamConfig:
        """The stream's settings as they are now: as created, with any change
        :meth:`AbstractLog.alter_stream` made since (``info().config``)."""
        return self.info().config

    # ------------------------------------------------------ maintenance hooks
    # For the package's own modules: the one retention rule
    # (:func:`disklesslog.maintenance.retention.apply_retention`) runs on every backend
    # through these three, each backend saying what its units are and how it trims.

    @abstractmethod
    def retention_units(self) -> tuple[Iterable[Unit], int]:
        """What retention judges: the pieces it may drop whole, oldest first (closed
        segments, tiered segments, batches), and the bytes after them that always stay
        (the active segment). The pieces may come lazily: retention by time alone stops
        reading at the first piece that stays, so a backend with many (an object log's
        batches) should not list them all up front. For the package's own modules
        (retention)."""

    def retention_unit_name(self, count: int) -> str:
        """What :meth:`retention_units` returns, for reports ("segments", "batches").
        For the package's own modules (retention's report)."""
        return "unit" if count == 1 else "units"

    def trim_for_retention(self, before: int) -> MaintenanceReport:
        """Trim for retention; returns what was deleted from storage at once (object
        logs delete later: trimmed batches become garbage for the collector). For the
        package's own modules (retention, whose report counts what it freed)."""
        self.trim(before)
        return MaintenanceReport("retention")


class AbstractLog(ABC):
    """A named set of streams at one URL. Open with :func:`disklesslog.open`.

    Thread-safe. Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        *,
        maintenance: str = "auto",
        maintenance_interval_ms: int = DEFAULT_INTERVAL_MS,
    ) -> None:
        """``maintenance``/``maintenance_interval_ms``: see :func:`disklesslog.open` and
        :mod:`disklesslog.maintenance.auto`; checked here, before a backend creates
        anything."""
        mode, interval_ms = check_maintenance(maintenance, maintenance_interval_ms)
        self._url = url
        self._closed = False
        self._maintenance_mode = mode
        self._maintenance_interval_ms = interval_ms
        self._maintainer = (
            Maintainer(self, interval_ms, housekeeping=self.housekeeping)
            if mode == "auto"
            else None
        )

    @property
    def url(self) -> str:
        """The URL (or path) the log was opened with: what error messages and the CLI
        name it by."""
        return self._url

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: every later call on the log, its streams
        and writers raises :class:`~disklesslog.LogClosedError`."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self._url} ({state})>"

    def __enter__(self) -> AbstractLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def check_open(self) -> None:
        """Raise :class:`~disklesslog.LogClosedError` once the log is closed.

        For the package's own modules: a stream handle may still be used after its log
        was closed, so a backend's stream calls check their log first, as the log's own
        calls do.
        """
        if self._closed:
            raise LogClosedError(f"{self._url} is closed")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.streams()

    @abstractmethod
    def stream(self, name: str) -> Stream:
        """A handle for stream ``name`` (validated; created by its first append)."""

    @abstractmethod
    def create_stream(self, name: str, **config: Any) -> Stream:
        """Create ``name`` with :class:`StreamConfig` options and return its handle.

        Idempotent, so startup code may create its streams on every run: a stream that
        exists is returned as it is when its settings fixed at creation match those
        asked for. Settings ``alter_stream`` may change
        (:data:`~disklesslog.config.ALTERABLE`) are not compared: the stream keeps its
        own, maybe altered since, and the handle's ``config`` shows them. A differing
        fixed setting raises :class:`~disklesslog.StreamExistsError` naming the setting,
        the stream's value and the requested one; nothing changes."""

    @abstractmethod
    def streams(self) -> list[str]:
        """Names of all streams, sorted."""

    @abstractmethod
    def alter_stream(self, name: str, **changes: Any) -> StreamConfig:
        """Change maintenance settings of an existing stream (``retention_ms``,
        ``retention_bytes``, ``delete_retention_ms``, ``min_cleanable_dirty_ratio``,
        ``local_retention_ms``, ``local_retention_bytes``) and return its new config.
        Other settings are fixed at creation (ConfigError names them)."""

    @abstractmethod
    def delete_stream(self, name: str) -> None:
        """Delete a stream and all its records."""

    @abstractmethod
    def writer(
        self, *, linger_ms: float | None = None, max_buffer_bytes: int | None = None
    ) -> Writer:
        """A buffering writer: ``append(stream, ...)`` returns a future; batches flush after
        ``linger_ms`` or once ``max_buffer_bytes`` are buffered.

        Many small appends become few large writes, which is what makes throughput
        (one fsync per flush locally, one object and one sequencer commit per flush on
        object storage). Defaults: local logs 5 ms and 8 MiB; object logs 100 ms and
        8 MiB per object, where the writer takes more options (``producer``,
        ``max_inflight``: see ``ObjectLog.writer``). Close it, or use it as a context
        manager, to flush what is left."""

    # ----------------------------------------------------- two-phase commits

    @abstractmethod
    def stager(self, *, max_object_bytes: int | None = None) -> Stager:
        """Phase one of a two-phase commit, for any process: a
        :class:`~disklesslog.transactions.Stager` whose ``append_batch(stream, ...)``
        stores records without making them visible and whose ``finish()`` returns a
        picklable :class:`~disklesslog.transactions.StagedPart` for the committer."""

    @abstractmethod
    def commit_transaction(
        self, transaction_id: str, parts: Iterable[StagedPart]
    ) -> TransactionResult:
        """Phase two: make every staged part visible in one step, keyed by
        ``transaction_id`` (a stable name for this commit, e.g. a Spark query id and
        batch id). Streams that do not exist are created with the log's defaults.

        Committing an id again is answered with the original offsets
        (``duplicate=True``) and stores nothing; the parts given this time are
        discarded. Returns :class:`~disklesslog.sequencers.TransactionResult`: per
        stream, the ``(first, end)`` offsets the transaction's records hold. Raises
        :class:`~disklesslog.TransactionError` for parts of another log or too old to
        commit. Readers see the transaction in every stream or in none, on both
        backends (object logs: one sequencer step; local logs: streams appended one by
        one but held back until the commit point, see
        :mod:`disklesslog.segments.transactions`)."""

    @abstractmethod
    def abort_transaction(self, parts: Iterable[StagedPart]) -> None:
        """Discard staged parts that will never be committed: nothing of them becomes
        visible, and their storage is reclaimed (object logs: recorded as orphans for
        :meth:`collect_garbage`; local logs: their files are deleted)."""

    # ------------------------------------------------------- consumer groups

    @abstractmethod
    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        """Store consumer group ``group``'s positions: for each stream, the next offset
        to read (Kafka's convention). Merged with the group's other streams."""

    @abstractmethod
    def committed_offsets(self, group: str) -> dict[str, int]:
        """The positions ``group`` committed, by stream ({} for a new group)."""

    @abstractmethod
    def groups(self) -> list[str]:
        """Names of the consumer groups holding a committed position in some stream,
        sorted (a group whose every stream was deleted is no longer listed): what
        Kafka's ``kafka-consumer-groups.sh --list`` shows, for tools and operators."""

    # ---------------------------------------------------------------- leases

    @abstractmethod
    def lease_keeper(self) -> LeaseKeeper:
        """The keeper of this log's leases (for the package's own modules; users call
        the ``*_lease`` methods): a local log's keeps them in ``leases/``, an object
        log's in its sequencer."""

    def acquire_lease(self, name: str, holder: str, duration_ms: int) -> Lease | None:
        """Take lease ``name`` for ``holder`` for ``duration_ms`` milliseconds, or renew
        it if ``holder`` has it; ``None`` while another holder has it.

        A lease elects one worker among processes (automatic maintenance, a consumer
        group's leader). The lease is free once released, or once this process has seen
        it unchanged for its full duration by its own clock (clocks of different
        machines are never compared; docs/decisions/0010-leases.md). A new holder gets
        a greater fencing ``token``; pass it to what the lease guards so it can refuse
        an older holder. Count on the lease only until ``expires_at_ms`` (this process's
        ``time.monotonic() * 1000``), and renew it well before (e.g. every third of its
        duration). Holder names must be unique per worker (a host and process id)."""
        self.check_open()
        return self.lease_keeper().acquire(name, holder, duration_ms)

    def renew_lease(self, lease: Lease) -> Lease:
        """Extend ``lease`` by its duration from now; the new :class:`~disklesslog.Lease`
        has a later ``expires_at_ms``. Raises :class:`~disklesslog.LeaseLost` if it was
        released or taken over by another holder."""
        self.check_open()
        return self.lease_keeper().renew(lease)

    def release_lease(self, lease: Lease) -> None:
        """Give ``lease`` up so another holder can take it at once. Idempotent; a lease
        already taken over is left to its new holder."""
        self.check_open()
        self.lease_keeper().release(lease)

    def lease_holder(self, name: str) -> Lease | None:
        """Who holds lease ``name`` as far as this process can tell (``None``: free or
        expired); ``expires_at_ms`` is the earliest this process could take it over."""
        self.check_open()
        return self.lease_keeper().holder(name)

    def prune_leases(self, older_than_ms: int) -> list[str]:
        """Remove the records of leases that are released, or expired, and that this
        process has seen unchanged for ``older_than_ms`` milliseconds; returns their
        names, sorted. A held lease is never removed. A removed name acquired again
        gets a token greater than any it had (the log keeps a token floor), so what the
        lease fenced stays fenced; a holder renewing a removed lease gets
        :class:`~disklesslog.LeaseLost`. Keeps the lease state bounded by the names in
        use (automatic maintenance calls it)."""
        self.check_open()
        return self.lease_keeper().prune(older_than_ms)

    def consumer(
        self,
        group: str,
        streams: Iterable[str],
        *,
        reset: str = "earliest",
        auto_commit_interval_ms: float | None = 5000,
        poll_interval: float = 0.1,
        idle_timeout: float | None = None,
    ) -> Consumer:
        """An iterator over the records of several streams that resumes where ``group``
        committed. See :class:`disklesslog.consumer.Consumer`."""
        from .consumer import Consumer  # noqa: PLC0415 - consumer.py builds on this module

        return Consumer(
            self,
            group,
            streams,
            reset=reset,
            auto_commit_interval_ms=auto_commit_interval_ms,
            poll_interval=poll_interval,
            idle_timeout=idle_timeout,
        )

    # ------------------------------------------------------------ maintenance
    #
    # Every operation is an explicit call that any process may make at any time while
    # others read and write: each is idempotent, and resumable after a crash mid-way.
    # ``stream`` limits it to one stream; ``dry_run`` reports what it would do and
    # changes nothing; ``progress(task, done, total)`` hears about long runs.

    def apply_retention(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        now_ms: int | None = None,
    ) -> MaintenanceReport:
        """Delete records that ``retention_ms``/``retention_bytes`` no longer keep (streams
        whose ``cleanup_policy`` includes ``delete``): whole segments or batches from the
        oldest, never a local stream's active segment. ``now_ms`` replaces the clock."""
        self.check_open()
        if stream is not None:
            validate_stream_name(stream)
        if now_ms is not None:
            check_timestamp(now_ms, "now_ms")
        return apply_retention(self, stream, dry_run=dry_run, progress=progress, now_ms=now_ms)

    def compact(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        now_ms: int | None = None,
        force: bool = False,
    ) -> MaintenanceReport:
        """Key compaction of streams whose ``cleanup_policy`` includes ``compact``: keep
        the latest record per key (offsets unchanged; reads skip the gaps), drop
        tombstones older than ``delete_retention_ms``, never touch the active tail. A
        stream is compacted when its dirty ratio (bytes written since the last pass over
        all compactable bytes) reaches ``min_cleanable_dirty_ratio``, or with ``force``.
        A ``stream`` named here must be compacted (ConfigError otherwise)."""
        return self._not_applicable("compaction", dry_run, stream, now_ms)

    def merge(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        target_bytes: int | None = None,
        now_ms: int | None = None,
    ) -> MaintenanceReport:
        """Object logs: rewrite the batches of small combined (WAL) objects into
        per-stream objects of about ``target_bytes`` (64 MiB), so a stream's reads touch
        few large objects."""
        return self._not_applicable("merge", dry_run, stream, now_ms)

    def tier(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        now_ms: int | None = None,
    ) -> MaintenanceReport:
        """Local logs opened with ``tier_url=``: copy closed segments to object storage and
        delete local copies past ``local_retention_ms``/``local_retention_bytes``."""
        return self._not_applicable("tiering", dry_run, stream, now_ms)

    def collect_garbage(
        self,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        grace_seconds: float | None = None,
        reconcile: bool = True,
    ) -> MaintenanceReport:
        """Delete stored data nothing refers to any more, once it has been unreferenced
        for ``grace_seconds`` (default 60: readers holding old locations finish first).

        ``reconcile`` also lists storage for what nothing ever referenced (uploads whose
        commit never came, a tier's failed copies) and deletes it once old enough. That
        listing costs what the log holds rather than what it collects: automatic
        maintenance reconciles at most every 5 minutes, and ``reconcile=False``
        collects only the garbage the log's metadata names."""
        from .maintenance.grace import resolve_grace  # noqa: PLC0415 - grace.py imports api

        resolve_grace(grace_seconds)
        return self._not_applicable("gc", dry_run)

    def repair(
        self, stream: str, *, accept_data_loss: bool = False, start_offset: int | None = None
    ) -> MaintenanceReport:
        """Take ``stream`` past damage that the log refuses to decide about alone, with
        the operator's explicit decision (``docs/operations.md``, "Damage and repair").

        On a local log, ``accept_data_loss=True`` accepts that storage lost records that
        were acknowledged (reads and appends raise :class:`~disklesslog.DataLossError`
        naming the file and the offsets): their offsets become a gap that is never
        handed out again. ``start_offset=N`` restarts a stream whose state record and
        its copy are both unreadable at ``N``. Without either, it runs the recovery an
        open runs and reports what it repaired.

        Object logs keep no state of their own to repair: their metadata is the
        sequencer's, repaired there (``docs/operations.md``, "Repairing the object-store
        sequencer" and "A damaged sequencer database"); for them this reports that it
        does not apply.
        """
        if type(accept_data_loss) is not bool:
            raise ConfigError(f"accept_data_loss must be a bool, not {accept_data_loss!r}")
        if start_offset is not None:
            check_offset(start_offset, "start_offset")
        return self._not_applicable("repair", False, stream)

    def maintain(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        now_ms: int | None = None,
        grace_seconds: float | None = None,
    ) -> MaintenanceReport:
        """Run every maintenance operation that applies to this log, in order: retention,
        compaction, merging, tiering, garbage collection (log-wide, with
        ``grace_seconds``) and the sequencer's housekeeping. Returns their reports added
        up. Automatic maintenance (``maintenance="auto"``) runs the same steps in the
        background; this is for cron jobs, tools and logs opened with
        ``maintenance="off"``."""
        from .maintenance.grace import resolve_grace  # noqa: PLC0415 - grace.py imports api

        self.check_open()
        # Every argument is checked before the first step changes anything.
        if stream is not None:
            validate_stream_name(stream)
        if now_ms is not None:
            check_timestamp(now_ms, "now_ms")
        resolve_grace(grace_seconds)
        report = MaintenanceReport("maintain", dry_run=dry_run)
        retention = self.apply_retention(stream, dry_run=dry_run, progress=progress, now_ms=now_ms)
        config = None if stream is None else self.stream(stream).config
        if config is None or config.compacted:
            compaction = self.compact(stream, dry_run=dry_run, progress=progress, now_ms=now_ms)
        else:  # compact() refuses a named stream it does not apply to; maintain skips it
            compaction = MaintenanceReport("compaction", dry_run=dry_run)
            compaction.skipped.append(f"{stream}: cleanup_policy={config.cleanup_policy!r}")
        steps: list[MaintenanceReport] = [
            retention,
            compaction,
            self.merge(stream, dry_run=dry_run, progress=progress),
            self.tier(stream, dry_run=dry_run, progress=progress, now_ms=now_ms),
            self.collect_garbage(dry_run=dry_run, progress=progress, grace_seconds=grace_seconds),
            self.housekeeping(dry_run=dry_run),
        ]
        for step in steps:
            report.merge(step)
        report.streams = max(step.streams for step in steps)
        return report

    def _not_applicable(
        self, operation: str, dry_run: bool, stream: object = None, now_ms: object = None
    ) -> MaintenanceReport:
        """A report saying the operation does not apply; its arguments are still checked,
        so a bad one is refused on every backend alike."""
        self.check_open()
        if stream is not None:
            validate_stream_name(stream)
        if now_ms is not None:
            check_timestamp(now_ms, "now_ms")
        report = MaintenanceReport(operation, dry_run=dry_run, applicable=False)
        report.skipped.append(f"not applicable to {type(self).__name__} logs")
        return report

    def housekeeping(self, *, dry_run: bool = False) -> MaintenanceReport:
        """The sequencer's own upkeep (object logs): e.g. the object-store sequencer
        deletes entries and checkpoints a newer checkpoint superseded. Local logs have
        none."""
        return self._not_applicable("housekeeping", dry_run)

    # ------------------------------------------------------ automatic maintenance

    def note_write(self) -> None:
        """Start this process's automatic maintenance, if it is on and not started.

        For the package's own modules: a backend calls it on every write (an append, a
        new writer or stager, a created stream), so that a process that only reads never
        maintains; after the first, it costs two attribute reads."""
        maintainer = self._maintainer
        if maintainer is not None and not maintainer.started:
            maintainer.start()

    def stop_maintenance(self) -> None:
        """Stop this process's automatic maintenance after its current step and give the
        maintenance lease up, so another writer takes over at once.

        For the package's own modules: a backend's :meth:`close` calls it first, while
        the log can still run the step; idempotent."""
        if self._maintainer is not None:
            self._maintainer.stop()

    def maintenance_status(self) -> MaintenanceStatus:
        """Automatic maintenance as this process sees it: whether it is on, whether this
        process maintains now, who holds the maintenance lease (any process), and, for
        this process's passes, when each operation last ran and what it did."""
        self.check_open()
        lease = self.lease_holder(LEASE_NAME)
        holder = None if lease is None else lease.holder
        if self._maintainer is None:
            return MaintenanceStatus(
                mode=self._maintenance_mode,
                interval_ms=self._maintenance_interval_ms,
                running=False,
                maintaining=False,
                holder=holder,
            )
        return self._maintainer.status(holder)

    def last_maintenance(self) -> MaintenanceStatus | None:
        """The status the process that maintains this log (any process) stored after its
        last pass: who it was, when each operation last ran and what it did; ``None`` if
        no pass has run yet (or the backend keeps none). A damaged document raises
        :class:`~disklesslog.CorruptDataError` (the next pass replaces it)."""
        self.check_open()
        raw = self.read_maintenance_status()
        return None if raw is None else decode_status(raw, f"{self._url}/{STATUS_FILE}")

    def write_maintenance_status(self, data: bytes) -> None:
        """Replace the stored maintenance status with ``data`` (checksummed JSON).

        For the package's own modules: the backend keeps it at the log's root; a
        backend that keeps none ignores it (the default)."""
        del data

    def read_maintenance_status(self) -> bytes | None:
        """The stored maintenance status, ``None`` if there is none (the default).

        For the package's own modules: :meth:`last_maintenance` decodes it."""
        return None

    def maintenance_metrics(self) -> dict[str, float]:
        """The ``maintenance_*`` entries of :meth:`metrics` (none with ``maintenance="off"``).

        For the package's own modules: each backend's :meth:`metrics` adds them."""
        return {} if self._maintainer is None else self._maintainer.metrics()

    # ---------------------------------------------------------------- metrics

    @abstractmethod
    def metrics(self) -> dict[str, float]:
        """Counters and latency percentiles of this log since it was opened: what the
        store costs (writes, reads, bytes, cache hits, commits...)."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release everything; idempotent."""
