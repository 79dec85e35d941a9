"""The shared object-storage backend: :class:`ObjectLog` and :class:`ObjectStream`.

Records live in immutable objects in any fsspec filesystem (S3, GCS, Azure, memory,
local or network disks); a :class:`~disklesslog.sequencers.Sequencer` orders them. Any
number of processes on any machines may append at once: each writer flushes one object
and one commit. There is no leader and no broker.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..api import (
    AbstractLog,
    Stream,
    StreamInfo,
    check_offset,
    check_read_arguments,
    check_timestamp,
)
from ..config import StreamConfig
from ..errors import (
    ConfigError,
    InvalidURL,
    OffsetOutOfRange,
    StreamNotFound,
)
from ..forks import fork_safe_lock
from ..leases import LeaseKeeper
from ..maintenance.auto import DEFAULT_INTERVAL_MS, STATUS_FILE, check_maintenance
from ..maintenance.report import MaintenanceReport, Progress
from ..maintenance.retention import Unit
from ..markers import MARKER, check_marker, marker_bytes
from ..metrics import Metrics
from ..names import validate_group_name, validate_stream_name
from ..projection import OFFSETS
from ..records import RecordBatch
from ..retries import DEADLINE_MS, deadline_seconds
from ..sequencers import Sequencer, open_sequencer
from ..sequencers.base import BatchLocation
from ..sequencers.common import out_of_range
from ..sequencers.objectstore import ObjectStoreSequencer
from ..storage.atomic import TEMPORARY_INFIX
from ..storage.cache import BlockCache, default_cache
from ..storage.filesystems import open_filesystem
from . import reader
from .compact import compact
from .gc import collect_garbage
from .merge import merge
from .storage import OBJECTS, SEQUENCER_DIR, ObjectStorage
from .transactions import ObjectStager, abort_transaction, commit_transaction
from .writer import DEFAULT_INFLIGHT, ObjectWriter

if TYPE_CHECKING:
    from ..sequencers.base import TransactionResult
    from ..transactions import StagedPart

__all__ = ["ObjectLog", "ObjectStream"]

KIND = "disklesslog-objects"
VERSION = 1
DEFAULT_LINGER_MS = 100
DEFAULT_MAX_OBJECT_BYTES = 8 << 20
APPEND_LINGER_MS = 0  # Stream.append: flush as soon as the previous flush is done
DEFAULT_PRODUCER_EXPIRATION_MS = 86_400_000
PAGE_BYTES = 64 << 20
"""Bytes of batches one page of :meth:`ObjectLog.live_batches` asks the sequencer for."""
FIRST_PAGE_BYTES = 64 << 10
"""The first page when retention judges a stream: about 500 batches of small flushes,
so a pass over a stream that drops little reads little."""
"""How long a producer's idempotence state outlives its last write (Kafka's
``producer.id.expiration.ms``, 1 day; ``docs/decisions/0012-producer-expiry.md``)."""
MIN_PRODUCER_EXPIRATION_MS = 1
MAX_PRODUCER_EXPIRATION_MS = 365 * 86_400_000
"""A year: beyond it the state a churn of writers leaves is no longer bounded in
practice, and no retry or zombie waits that long."""
SQLITE_NAME = "disklesslog-meta.db"
"""The SQLite sequencer's database in the directory of a ``file://`` log (the default)."""


class ObjectLog(AbstractLog):
    """A log whose records live in shared objects, ordered by a sequencer."""

    def __init__(
        self,
        url: str,
        *,
        storage: ObjectStorage,
        sequencer: Sequencer,
        owns_sequencer: bool,
        cache: BlockCache | None,
        stream_defaults: StreamConfig,
        maintenance: str = "auto",
        maintenance_interval_ms: int = DEFAULT_INTERVAL_MS,
        producer_expiration_ms: int = DEFAULT_PRODUCER_EXPIRATION_MS,
    ) -> None:
        """A log over storage whose root :func:`open_object_log` has checked (and marked)
        and a sequencer it opened; use :func:`disklesslog.open`."""
        super().__init__(
            url, maintenance=maintenance, maintenance_interval_ms=maintenance_interval_ms
        )
        self._defaults = stream_defaults
        self.producer_expiration_ms = check_producer_expiration(producer_expiration_ms)
        """Producers idle this long are forgotten by :meth:`housekeeping`."""
        # What metrics() reports: the storage's counters, where the package's readers,
        # writers, stagers and maintenance count too (as ``log.storage.metrics``).
        self._metrics = storage.metrics
        self.storage = storage
        self.sequencer = sequencer
        self._owns_sequencer = owns_sequencer
        self._cache = cache
        # Blocks wait for confirm() only to go to a disk tier: without one, skip the call.
        self._confirms = cache is not None and cache.cache_dir is not None
        self._lock = fork_safe_lock()
        self._configs: dict[str, StreamConfig] = {}
        self._append_writer: ObjectWriter | None = None
        self._writers: weakref.WeakSet[ObjectWriter] = weakref.WeakSet()

    @property
    def stream_defaults(self) -> StreamConfig:
        return self._defaults

    # ----------------------------------------------------------------- streams

    def stream(self, name: str) -> ObjectStream:
        self.check_open()
        return ObjectStream(self, validate_stream_name(name))

    def create_stream(self, name: str, **config: Any) -> ObjectStream:
        """Create ``name`` in the sequencer, or return it if it exists with the same
        settings fixed at creation; the :data:`~disklesslog.config.ALTERABLE` ones are
        left as the stream has them (:meth:`AbstractLog.create_stream` has the rule)."""
        self.check_open()
        validate_stream_name(name)
        wanted = self._defaults.replace(**config)
        self.note_write()
        try:  # an existing stream is a read (creating is an entry on the object store)
            meta = self.sequencer.stream_info(name)
        except StreamNotFound:
            meta = self.sequencer.create_stream(name, wanted.to_dict())
        existing = StreamConfig.from_dict(meta.config).created_again(name, wanted)
        with self._lock:
            self._configs[name] = existing
        return ObjectStream(self, name)

    def streams(self) -> list[str]:
        self.check_open()
        return self.sequencer.list_streams()

    def alter_stream(self, name: str, **changes: Any) -> StreamConfig:
        """Change maintenance settings of ``name`` in the sequencer (see
        :data:`~disklesslog.config.ALTERABLE`); every process's maintenance reads them
        from there."""
        self.check_open()
        validate_stream_name(name)
        current = StreamConfig.from_dict(self.sequencer.stream_info(name).config)
        new = current.altered(**changes).to_dict()
        meta = self.sequencer.alter_stream(name, {key: new[key] for key in changes})
        config = StreamConfig.from_dict(meta.config)
        with self._lock:
            self._configs[name] = config
        return config

    def delete_stream(self, name: str) -> None:
        self.check_open()
        validate_stream_name(name)
        # A refusal the sequencer would judge costs the object-store sequencer an entry
        # (operations are judged on replay): a missing stream is found by a read first.
        self.sequencer.stream_info(name)
        self.sequencer.delete_stream(name)
        with self._lock:
            self._configs.pop(name, None)

    def stream_config(self, name: str, *, create: bool) -> StreamConfig | None:
        """A stream's config (cached: it is fixed for the stream's life), creating the
        stream with the defaults if asked; ``None`` if it does not exist.

        For the package's own modules: writers and stagers encode a stream's batches
        with its settings, and reads bound a batch's size by them, without a sequencer
        read per call."""
        config = self._configs.get(name)
        if config is not None:
            return config
        try:
            meta = self.sequencer.stream_info(name)
        except StreamNotFound:
            if not create:
                return None
            meta = self.sequencer.create_stream(name, self._defaults.to_dict())
        config = StreamConfig.from_dict(meta.config)
        with self._lock:
            self._configs[name] = config
        return config

    def current_config(self, name: str) -> StreamConfig:
        """A stream's config as the sequencer has it now (StreamNotFound if it does not
        exist): for decisions that must not act on a stream deleted and created again
        with other settings by another process since this one cached its config.

        For the package's own modules: compaction and merges judge a stream by its
        settings of now, and a writer refreshes them when its stream was recreated."""
        config = StreamConfig.from_dict(self.sequencer.stream_info(name).config)
        with self._lock:
            self._configs[name] = config
        return config

    def ensure_stream(self, name: str, config: StreamConfig | None) -> None:
        """Create ``name`` (with ``config`` or the defaults) unless it exists.

        For the package's own modules: a writer's first flush to a stream, and a
        transaction's commit, create the streams they write to that do not exist yet."""
        meta = self.sequencer.create_stream(name, (config or self._defaults).to_dict())
        with self._lock:
            self._configs[name] = StreamConfig.from_dict(meta.config)

    # ----------------------------------------------------------------- writers

    def writer(
        self,
        *,
        linger_ms: float | None = None,
        max_buffer_bytes: int | None = None,
        max_object_bytes: int | None = None,
        producer: str | None = None,
        max_inflight: int = DEFAULT_INFLIGHT,
    ) -> ObjectWriter:
        """A writer: buffers appends to any streams and flushes them as one object after
        ``linger_ms`` (100) or ``max_object_bytes`` (8 MiB).

        Up to ``max_inflight`` flushes (1..5, default 4) upload at once; commits follow
        in flush order, and flushes that wait together are committed together (one
        sequencer entry on the object-store sequencer). ``producer`` names an idempotent
        producer: opening a writer with the same name elsewhere fences this one (its
        next flush raises ProducerFenced). Retries are deduplicated, and zombies fenced,
        while the producer wrote within ``producer_expiration_ms``; a writer idle longer
        starts over as a new producer instance by itself (:class:`~disklesslog.UnknownProducerId`).
        """
        self.check_open()
        if max_buffer_bytes is not None and max_object_bytes is not None:
            raise ConfigError("give max_object_bytes or max_buffer_bytes, not both")
        size = max_object_bytes if max_object_bytes is not None else max_buffer_bytes
        w = ObjectWriter(
            self,
            linger_ms=DEFAULT_LINGER_MS if linger_ms is None else linger_ms,
            max_object_bytes=DEFAULT_MAX_OBJECT_BYTES if size is None else size,
            producer=producer,
            max_inflight=max_inflight,
        )
        self._writers.add(w)
        self.note_write()
        return w

    def writer_for_appends(self) -> ObjectWriter:
        """The writer behind ``Stream.append``: it flushes as soon as it can, so appends
        from many threads share objects and commits.

        For the package's own modules: :class:`ObjectStream` appends through it, and
        the log owns it (one per log, closed with the log)."""
        self.note_write()
        with self._lock:
            self.check_open()
            if self._append_writer is None or self._append_writer.closed:
                self._append_writer = ObjectWriter(
                    self,
                    linger_ms=APPEND_LINGER_MS,
                    max_object_bytes=DEFAULT_MAX_OBJECT_BYTES,
                    producer=None,
                )
            return self._append_writer

    # ------------------------------------------------------ two-phase commits

    def stager(self, *, max_object_bytes: int | None = None) -> ObjectStager:
        """A stager uploading ``….staged`` objects (see :mod:`disklesslog.objects.transactions`)."""
        self.check_open()
        self.note_write()
        return ObjectStager(self, max_object_bytes=max_object_bytes)

    def commit_transaction(
        self, transaction_id: str, parts: Iterable[StagedPart]
    ) -> TransactionResult:
        """All parts' objects in one :meth:`Sequencer.commit_transaction`: atomic across
        every object and stream, whatever the sequencer."""
        self.check_open()
        return commit_transaction(self, transaction_id, parts)

    def abort_transaction(self, parts: Iterable[StagedPart]) -> None:
        self.check_open()
        abort_transaction(self, parts)

    # ------------------------------------------------------------------ reads

    def live_batches(
        self, stream: str, start: int | None = None, *, first_page_bytes: int = PAGE_BYTES
    ) -> Iterator[BatchLocation]:
        """The live batches of ``stream`` in offset order, from the one holding ``start``
        (default: the start offset), page by page from the sequencer, up to the end
        offset of the first page (a snapshot). Pages hold :data:`PAGE_BYTES` of batches;
        a caller that may stop early asks for a smaller first one, and each page after
        it is twice as large, up to that.

        Without ``start`` the listing follows the start offset: if a trim (retention in
        another process) moves it past the next page, the listing goes on from the new
        start offset, since the batches below it are no longer live. With ``start``, such
        a trim raises OffsetOutOfRange as a read would."""
        sequencer = self.sequencer
        offset = sequencer.stream_info(stream).start_offset if start is None else start
        end: int | None = None
        page_bytes = min(first_page_bytes, PAGE_BYTES)
        while end is None or offset < end:
            try:
                page = sequencer.find_batches(stream, offset, page_bytes)
            except OffsetOutOfRange as exc:
                if start is not None or exc.start_offset <= offset:
                    raise
                offset = exc.start_offset
                continue
            end = page.end_offset if end is None else end
            if not page.batches:
                return
            for location in page.batches:
                if location.base_offset >= end:
                    return
                yield location
            offset = page.batches[-1].last_offset + 1
            page_bytes = min(2 * page_bytes, PAGE_BYTES)

    def fetch(self, key: str, start: int, end: int, *, refresh: bool = False) -> bytes:
        """Bytes ``[start, end)`` of an object, through the block cache, for a reader that
        checks them and then calls :meth:`confirm` or :meth:`discard`; ``refresh``
        fetches them again straight from storage (see :class:`BlockCache`)."""
        self._metrics.add("read_ranges")
        if self._cache is None:
            return self.storage.get_range(key, start, end)

        def get(range_start: int, range_end: int) -> bytes:
            return self.storage.get_range(key, range_start, range_end)

        return self._cache.read(
            f"{self.storage.url}/{key}",
            start,
            end,
            get,
            metrics=self._metrics,
            checked=True,
            refresh=refresh,
        )

    def confirm(self, key: str, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of an object passed their checks: the cache may keep
        the blocks holding them on disk."""
        if self._confirms and self._cache is not None:
            self._cache.confirm(f"{self.storage.url}/{key}", start, end)

    def discard(self, key: str, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of an object failed their checks: drop them from the
        cache."""
        if self._cache is not None:
            self._cache.invalidate(f"{self.storage.url}/{key}", start, end)

    def cache_object(self, key: str, data: bytes) -> None:
        """Insert an object this process just wrote into the cache (the hottest data)."""
        if self._cache is not None:
            self._cache.put_object(f"{self.storage.url}/{key}", data)

    def uncache_objects(self, sizes: Mapping[str, int]) -> None:
        """Objects (``key -> size``) were deleted from storage: drop them from the cache,
        which would otherwise keep them, deleted, until its bound evicts them."""
        if self._cache is not None:
            url = self.storage.url
            self._cache.forget_objects({f"{url}/{key}": size for key, size in sizes.items()})

    # ------------------------------------------------------------ maintenance

    def compact(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        now_ms: int | None = None,
        force: bool = False,
    ) -> MaintenanceReport:
        """Key compaction (:mod:`disklesslog.objects.compact`): per compacted stream, the
        batches below the active tail (the last ``segment_bytes``, or younger than
        ``segment_ms``) are rewritten into ``….compacted`` objects holding the latest
        record per key, swapped in atomically; offsets never change."""
        self.check_open()
        if now_ms is not None:
            check_timestamp(now_ms, "now_ms")
        return compact(self, stream, dry_run=dry_run, progress=progress, now_ms=now_ms, force=force)

    def merge(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        target_bytes: int | None = None,
        now_ms: int | None = None,
    ) -> MaintenanceReport:
        """Merging (:mod:`disklesslog.objects.merge`): a stream's batches in WAL objects
        are copied byte for byte into ``….merged`` objects of about ``target_bytes``
        (64 MiB), swapped in atomically, so its reads touch few large objects. A run
        smaller than a quarter of that waits until its oldest object is 10 minutes old
        (by ``now_ms``, default the clock)."""
        self.check_open()
        if now_ms is not None:
            check_timestamp(now_ms, "now_ms")
        return merge(
            self,
            stream,
            dry_run=dry_run,
            progress=progress,
            target_bytes=target_bytes,
            now_ms=now_ms,
        )

    def collect_garbage(
        self,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        grace_seconds: float | None = None,
        reconcile: bool = True,
    ) -> MaintenanceReport:
        """Garbage collection (:mod:`disklesslog.objects.gc`): deletes objects that have
        held no live batch for ``grace_seconds`` (default 60), then, with ``reconcile``,
        objects in storage the sequencer never knew (uploads whose commit never came)
        once they are older than that and at least 5 minutes old."""
        self.check_open()
        return collect_garbage(
            self,
            dry_run=dry_run,
            progress=progress,
            grace_seconds=grace_seconds,
            reconcile=reconcile,
        )

    # -------------------------------------------------------- consumer groups

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        self.check_open()
        validate_group_name(group)
        if not isinstance(offsets, Mapping):
            raise ConfigError("offsets must be a mapping of stream name to next offset")
        checked = {
            validate_stream_name(name): check_offset(offset, f"offset of {name!r}")
            for name, offset in offsets.items()
        }
        for name in checked:
            self.sequencer.stream_info(name)  # raises StreamNotFound
        self.sequencer.commit_offsets(group, checked)

    def committed_offsets(self, group: str) -> dict[str, int]:
        self.check_open()
        return self.sequencer.committed_offsets(validate_group_name(group))

    def groups(self) -> list[str]:
        self.check_open()
        return self.sequencer.list_groups()

    def lease_keeper(self) -> LeaseKeeper:
        """The sequencer's keeper: leases are sequencer state (``swap_lease``)."""
        return self.sequencer.lease_keeper()

    # -------------------------------------------------------------- lifecycle

    def metrics(self) -> dict[str, float]:
        """PUTs and GETs (counts, bytes, latency), cache hits and misses, commits and
        their latency, orphaned objects: what this log has cost since it was opened."""
        result = self._metrics.snapshot()
        result.setdefault("puts", 0)
        result.setdefault("gets", 0)
        result.setdefault("commits", 0)
        result.update(self.sequencer.metrics())
        result.update(self.maintenance_metrics())
        return dict(sorted(result.items()))

    def write_maintenance_status(self, data: bytes) -> None:
        """``<root>/maintenance.json``, one PUT."""
        self.storage.write_small(STATUS_FILE, data)

    def read_maintenance_status(self) -> bytes | None:
        return self.storage.read_small(STATUS_FILE)

    def housekeeping(self, *, dry_run: bool = False) -> MaintenanceReport:
        """The sequencer's :meth:`~disklesslog.sequencers.base.Sequencer.housekeeping`,
        then :meth:`~disklesslog.sequencers.base.Sequencer.expire_producers` of the
        producers idle for ``producer_expiration_ms``: the sequencer's producer state
        stays bounded by the producers that wrote within that window."""
        self.check_open()
        report = MaintenanceReport("housekeeping", dry_run=dry_run)
        report.actions += self.sequencer.housekeeping(dry_run=dry_run)
        expired = self.sequencer.expire_producers(self.producer_expiration_ms, dry_run=dry_run)
        report.actions += expired.lines()
        return report

    def close(self) -> None:
        if self._closed:
            return
        self.stop_maintenance()
        writers = list(self._writers)
        if self._append_writer is not None:
            writers.append(self._append_writer)
        for w in writers:
            with contextlib.suppress(Exception):
                w.close()
        with self._lock:
            self._closed = True
        if self._owns_sequencer:
            self.sequencer.close()


class ObjectStream(Stream):
    """A stream of an :class:`ObjectLog`."""

    _log: ObjectLog

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Any = None,
        timestamp: int | None = None,
    ) -> int:
        """Append one record; returns once its object is stored and committed."""
        writer = self._log.writer_for_appends()
        return writer.append(self._name, value, key, headers, timestamp).result()

    def append_batch(
        self,
        values: Iterable[bytes | None],
        *,
        keys: Iterable[bytes | None] | None = None,
        headers: Iterable[Any] | None = None,
        timestamps: int | Sequence[int] | None = None,
    ) -> list[int]:
        writer = self._log.writer_for_appends()
        future = writer.append_batch(
            self._name, values, keys=keys, headers=headers, timestamps=timestamps
        )
        return future.result()

    def read_batches(
        self, start: int | None = None, end: int | None = None, *, max_records: int | None = None
    ) -> Iterator[RecordBatch]:
        self._log.check_open()
        check_read_arguments(start, end, max_records)
        return reader.read_batches(self._log, self._name, start, end, max_records)

    def read_offsets(
        self, start: int | None = None, end: int | None = None
    ) -> Iterator[Sequence[int]]:
        self._log.check_open()
        check_read_arguments(start, end, None)
        return reader.read(self._log, self._name, start, end, OFFSETS)

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        self._log.check_open()
        check_timestamp(timestamp_ms, "timestamp_ms")
        return reader.offset_for_time(self._log, self._name, timestamp_ms)

    @property
    def start_offset(self) -> int:
        self._log.check_open()
        return self._log.sequencer.stream_info(self._name).start_offset

    @property
    def end_offset(self) -> int:
        self._log.check_open()
        return self._log.sequencer.stream_info(self._name).end_offset

    def trim(self, before_offset: int) -> None:
        self._log.check_open()
        check_offset(before_offset, "before_offset")
        # Judged by a read first: a trim of a missing stream, past the end or backwards
        # (a no-op) writes nothing, not even an entry of the object-store sequencer.
        meta = self._log.sequencer.stream_info(self._name)
        if before_offset > meta.end_offset:
            raise out_of_range(self._name, before_offset, meta.start_offset, meta.end_offset)
        if before_offset > meta.start_offset:
            self._log.sequencer.trim(self._name, before_offset)

    @property
    def config(self) -> StreamConfig:
        """The stream's settings, from the sequencer, without listing its batches as
        :meth:`info` does."""
        self._log.check_open()
        return self._log.current_config(self._name)

    def info(self) -> StreamInfo:
        self._log.check_open()
        meta = self._log.sequencer.stream_info(self._name)
        size = 0
        seen: set[str] = set()
        for location in self._log.live_batches(self._name):  # follows a moving start
            size += location.size
            seen.add(location.object_key)
        objects = len(seen)
        return StreamInfo(
            name=self._name,
            start_offset=meta.start_offset,
            end_offset=meta.end_offset,
            config=StreamConfig.from_dict(meta.config),
            size_bytes=size,
            details={
                "objects": objects,
                "sequencer": self._log.sequencer.url,
                "storage": self._log.storage.url,
            },
        )

    def retention_units(self) -> tuple[Iterator[Unit], int]:
        """The live batches, lazily, in pages that start small (:data:`FIRST_PAGE_BYTES`)
        and grow: retention by time reads only as far as what it drops."""
        self._log.check_open()
        units = (
            Unit(b.base_offset, b.last_offset + 1, b.size, b.max_timestamp)
            for b in self._log.live_batches(self._name, first_page_bytes=FIRST_PAGE_BYTES)
        )
        return units, 0

    def retention_unit_name(self, count: int) -> str:
        return "batch" if count == 1 else "batches"


LOCAL_ONLY_OPTIONS = frozenset(
    {"tier_url", "tier_storage_options", "fsync", "fsync_interval_ms", "max_open_streams"}
)
"""Options of the segments backend that make no sense here: refused by name rather than
with a generic "unknown option"."""


def open_object_log(url: str, location: str, options: dict[str, Any]) -> ObjectLog:
    """The ``objects`` backend factory (see :func:`disklesslog.open`).

    Everything is checked before anything is created, so a refused open leaves nothing
    behind: the options first (an unknown one, a bad ``cache=`` or ``storage_options=``),
    then the location (another kind of log, a foreign non-empty directory or prefix, a
    missing log with ``create=False``). Only then is the sequencer opened (the SQLite
    database of a ``file://`` log is created here) and a new log's marker written, last:
    a crash before it leaves only entries of our own, which the next open accepts.
    """
    local_only = sorted(LOCAL_ONLY_OPTIONS.intersection(options))
    if local_only:
        raise ConfigError(
            f"option(s) {', '.join(local_only)} apply to local (segment-file) logs only: a log "
            "on object storage is already on it, and its durability is the store's"
        )
    options = dict(options)
    sequencer_option = options.pop("sequencer", None)
    storage_options = options.pop("storage_options", None)
    cache = _cache_for(options.pop("cache", "default"))
    create = options.pop("create", True)
    retry_deadline = deadline_seconds(options.pop("retry_deadline_ms", DEADLINE_MS))
    maintenance = check_maintenance(
        options.pop("maintenance", "auto"),
        options.pop("maintenance_interval_ms", DEFAULT_INTERVAL_MS),
    )
    producer_expiration_ms = check_producer_expiration(
        options.pop("producer_expiration_ms", DEFAULT_PRODUCER_EXPIRATION_MS)
    )
    if type(create) is not bool:
        raise ConfigError(f"create must be True or False, not {create!r}")
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ConfigError(
            f"storage_options must be a mapping of fsspec options, not {storage_options!r}"
        )
    if sequencer_option is not None and not isinstance(sequencer_option, str | Sequencer):
        raise ConfigError(
            f"sequencer must be a URL or a Sequencer instance, not {sequencer_option!r}"
        )
    defaults = StreamConfig.from_dict(options)  # any other option is a stream default
    # ``location`` is the path of a file URL (``file:///abs``, ``file:/abs``: parsed and
    # unquoted as the segments backend does), and any other URL as given.
    fs, root = open_filesystem(location, storage_options)
    storage = ObjectStorage(fs, root, Metrics(), retry_deadline=retry_deadline)
    marked = _check_root(storage, url, create=create)
    sequencer, owned = _sequencer_for(storage, sequencer_option, storage_options, marked)
    try:
        if not marked:
            storage.write_small(MARKER, marker_bytes(KIND, VERSION))
    except BaseException:
        if owned:
            sequencer.close()
        raise
    return ObjectLog(
        url,
        storage=storage,
        sequencer=sequencer,
        owns_sequencer=owned,
        cache=cache,
        stream_defaults=defaults,
        maintenance=maintenance[0],
        maintenance_interval_ms=maintenance[1],
        producer_expiration_ms=producer_expiration_ms,
    )


def check_producer_expiration(value: object) -> int:
    """``producer_expiration_ms`` if valid, else :class:`ConfigError` (before anything
    is created)."""
    if (
        type(value) is not int
        or not MIN_PRODUCER_EXPIRATION_MS <= value <= MAX_PRODUCER_EXPIRATION_MS
    ):
        raise ConfigError(
            f"producer_expiration_ms must be an int of milliseconds in "
            f"{MIN_PRODUCER_EXPIRATION_MS}..{MAX_PRODUCER_EXPIRATION_MS}, not {value!r}"
        )
    return value


def _cache_for(option: Any) -> BlockCache | None:
    if isinstance(option, str) and option == "default":
        return default_cache()
    if option is None or isinstance(option, BlockCache):
        return option
    raise ConfigError(f"cache must be a BlockCache, None (no cache) or omitted, not {option!r}")


OWN_ENTRIES = frozenset(
    {
        MARKER,
        OBJECTS,
        SEQUENCER_DIR,
        *(SQLITE_NAME + end for end in ("", "-wal", "-shm", "-journal", "-lock")),
    }
)
"""What an object log's root may hold before its marker is written (all of it ours: a
log being created by another process, or one whose creator crashed before the marker):
anything else makes the location foreign. A write-by-rename temporary of one of these
(``disklesslog.json.tmp-<hex>`` while another process writes the marker on local
files) is ours too: see :func:`_is_own`."""


def _is_own(name: str) -> bool:
    """Whether ``name`` is one of :data:`OWN_ENTRIES` or a temporary file of one."""
    base, sep, tail = name.partition(TEMPORARY_INFIX)
    if sep and tail:
        return base in OWN_ENTRIES
    return name in OWN_ENTRIES


def _check_root(storage: ObjectStorage, url: str, *, create: bool) -> bool:
    """Whether the root already holds an object log's marker (checked: another kind of
    log or a newer version is an :class:`InvalidURL`). A root without one must be
    missing or hold only :data:`OWN_ENTRIES`, and ``create`` must allow a new log: a
    non-empty directory or prefix of other data is never adopted, as for local logs."""
    raw = storage.read_small(MARKER)  # one retried GET: a failure never passes for "none"
    if raw is not None:
        check_marker(raw, kind=KIND, version=VERSION, where=url)
        return True
    foreign = sorted(name for name in storage.list_root() if not _is_own(name))
    if foreign:
        raise InvalidURL(
            f"{url} is not empty and not a disklesslog log (it holds {foreign[0]!r}, and no "
            f"{MARKER}); open an empty or new location instead"
        )
    if not create:
        raise InvalidURL(
            f"{url} is not a log: it has no {MARKER} (check the URL; this does not create a log)"
        )
    return False


def _sequencer_for(
    storage: ObjectStorage,
    option: Any,
    storage_options: Mapping[str, Any] | None,
    marked: bool,
) -> tuple[Sequencer, bool]:
    """The sequencer a log uses, and whether the log owns (and closes) it.

    Defaults: the memory sequencer for ``memory://``, SQLite in the log directory for
    local files (one machine), and for everything else the object-store sequencer
    inside the log (``<root>/_sequencer``), which needs no server. ``"objectstore://"``
    asks for the latter on any storage; ``objectstore+PROTOCOL://path`` puts it
    elsewhere (with this log's storage options if the protocol is the same).
    ``marked``: the log's marker exists (:func:`_check_root`), so the default SQLite
    database must too.
    """
    if isinstance(option, Sequencer):
        return option, False
    protocol = storage.url.split("://", 1)[0]
    if option in ("objectstore", "objectstore://"):
        return _objectstore(
            storage.fs, f"{storage.root}/{SEQUENCER_DIR}", storage.retry_deadline
        ), True
    if isinstance(option, str):
        family, plus, rest = option.partition("+")
        if family.lower() == "objectstore" and plus:
            same = rest.split("://", 1)[0].lower() == protocol
            fs, root = open_filesystem(rest, storage_options if same else None)
            return _objectstore(fs, root, storage.retry_deadline, url=option), True
        return open_sequencer(option), True
    if protocol == "memory":
        return open_sequencer(f"memory://{storage.root}"), True
    local = storage.local_root()
    if local is not None:
        return _local_sqlite(local, existing=marked), True
    return _objectstore(storage.fs, f"{storage.root}/{SEQUENCER_DIR}", storage.retry_deadline), True


def _local_sqlite(local: str, *, existing: bool) -> Sequencer:
    """The SQLite sequencer in a ``file://`` log's directory. A new log's sequencer
    creates its tables before :class:`ObjectLog` writes the marker, so once the marker
    exists (``existing``) the database must hold them: missing or empty, it was lost
    (DataLossError), and a new one would hand out the log's offsets from 0 again."""
    # Imported here, as the sequencer registry does: logs elsewhere never need sqlite3,
    # which some Python builds lack.
    from ..sequencers.sqlite import SqliteSequencer  # noqa: PLC0415

    return SqliteSequencer(f"{local}/{SQLITE_NAME}", existing=existing)


def _objectstore(fs: Any, root: str, retry_deadline: float, url: str | None = None) -> Sequencer:
    """The object-store sequencer at ``root`` of ``fs``, retrying its requests within
    the log's retry deadline (the ``retry_deadline_ms`` option, in seconds)."""
    return ObjectStoreSequencer(fs, root, url=url, retry_deadline=retry_deadline)
