"""The local segment-file backend: :class:`SegmentLog` and :class:`SegmentStream`.

A log is a directory; each stream a sub-directory of segment files (see
:mod:`~disklesslog.segments.layout`). Several processes may open the same log and
append to the same stream at once. Durability follows the ``fsync`` policy:

``"always"``
    every append is fsynced before it returns: survives process crashes, OS crashes
    and power loss. Costs a disk flush per append (or per batch: batch your appends).
``"interval"`` (default)
    appends are written to the OS before they return (they survive a crash of the
    process) and a background thread fsyncs every ``fsync_interval_ms`` (1000): an OS
    crash or power loss loses at most about that much recently appended data.
``"never"``
    written to the OS only: survives process crashes; after an OS crash or power loss
    recent data may be lost. Reads still never return bytes that fail their checksum.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import resource
import shutil
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from ..api import (
    AbstractLog,
    Stream,
    StreamInfo,
    check_offset,
    check_read_arguments,
    check_timestamp,
)
from ..checksummed import encode_json
from ..config import StreamConfig, require_keys
from ..errors import (
    ConfigError,
    CorruptDataError,
    OffsetOutOfRange,
    StreamNotFound,
)
from ..forks import fork_safe_lock, renewed_event, reset_after_fork
from ..format import EncodedBatch, as_column, encode_batch_borrowed, encode_record
from ..leases import LeaseKeeper
from ..maintenance.auto import DEFAULT_INTERVAL_MS, STATUS_FILE
from ..maintenance.compaction import DEFAULT_MAX_KEYS, require_compacted
from ..maintenance.grace import resolve_grace
from ..maintenance.report import MaintenanceReport, Progress
from ..maintenance.retention import Unit
from ..metrics import Metrics
from ..names import validate_group_name, validate_stream_name
from ..oserrors import typed_os_errors
from ..projection import COLUMNS, OFFSETS, Part, Projection
from ..records import RecordBatch, limit_records
from ..retries import DEADLINE_MS, deadline_seconds
from ..sequencers.base import TransactionResult
from ..storage.atomic import fsync_directory
from ..transactions import StagedPart
from ..writer import Writer
from . import groups, reader, transactions
from .compact import compact_stream
from .layout import (
    CONFIG,
    LOG_SUFFIX,
    STATE,
    STATE_COPY,
    STREAMS,
    TMP,
    StreamState,
    check_log_directory,
    clean_staging,
    read_json,
    segment_name,
    write_durably,
    write_json,
)
from .leases import lease_keeper
from .stream_store import FSYNC_POLICIES, Repair, StreamGone, StreamStore, flag_deleted
from .tiering import operations as tiering
from .tiering.manifest import Manifest, ManifestCache
from .tiering.reader import TieredReader, local_units, make_view
from .tiering.target import CONFIG_FILE as TIER_CONFIG
from .tiering.target import Tier, check_tier, configure_tier
from .transactions import SegmentStager
from .writer import SegmentWriter

__all__ = ["MAX_OPEN_STREAMS", "SegmentLog", "SegmentStream", "default_max_open_streams"]

log = logging.getLogger("disklesslog")

T = TypeVar("T")

_CONFIG_VERSION = 2
"""``stream.json`` version 2 is version 1's content with a checksum (layout.encode_json)."""
_GONE_RETRIES = 20
DEFAULT_LINGER_MS = 5
DEFAULT_MAX_BUFFER_BYTES = 8 << 20
TIER_RECHECK_SECONDS = 1.0
"""How often a log opened without a tier looks whether another process gave it one."""
MAX_OPEN_STREAMS = 1_000_000
"""The largest ``max_open_streams`` accepted (two descriptors each)."""
_MIN_DEFAULT_OPEN_STREAMS = 16


def default_max_open_streams() -> int:
    """The default ``max_open_streams``: a quarter of the process's soft limit on open
    descriptors (``RLIMIT_NOFILE``, ``ulimit -n``), at least 16.

    An open stream holds two descriptors (its state file, which is also its lock, and
    its active segment), so a quarter of the limit in streams takes half the
    descriptors and leaves the other half to the application and to what the log opens
    briefly: one segment file per read in progress, index files, files of maintenance
    and two-phase commits. Under the common ``ulimit -n 1024`` that is 256 streams; an
    unlimited limit counts as 2**20."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        soft = 1 << 20
    return max(_MIN_DEFAULT_OPEN_STREAMS, soft // 4)


@typed_os_errors(
    internal=(
        "durable",
        "manifest",
        "may_have_tiered_streams",
        "read_config",
        "store_if_open",
        "stream_dir",
        "tiered_reader",
        "with_store",
    )
)
class SegmentLog(AbstractLog):
    """A log of streams stored as segment files in a local directory.

    ``cleaner_max_keys`` bounds the keys one compaction pass maps (Kafka's dedupe
    buffer, counted in keys): a stream with more keys in its dirty segments is
    compacted over several passes. ``retry_deadline_ms`` bounds the retries of the
    tier's requests (``tier_url=``), as it does every request of an object log.

    ``max_open_streams`` bounds the streams that hold their two descriptors open at
    once (default: :func:`default_max_open_streams`). The log uses any number of
    streams: one not used lately is *parked* (its descriptors closed, what this process
    knows of its files kept), and its next use reopens two files and catches up with
    what other processes appended meanwhile, without a recovery scan. A stream in use
    (an append, a snapshot, a maintenance or commit step) is never parked, so the bound
    may be passed while more streams than it are in use at once.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        url: str | None = None,
        fsync: str = "interval",
        fsync_interval_ms: int = 1000,
        create: bool = True,
        cleaner_max_keys: int = DEFAULT_MAX_KEYS,
        max_open_streams: int | None = None,
        tier_url: str | None = None,
        tier_storage_options: Mapping[str, Any] | None = None,
        retry_deadline_ms: int = DEADLINE_MS,
        maintenance: str = "auto",
        maintenance_interval_ms: int = DEFAULT_INTERVAL_MS,
        **stream_defaults: Any,
    ) -> None:
        root = Path(path).absolute()
        super().__init__(
            url or str(root),
            maintenance=maintenance,
            maintenance_interval_ms=maintenance_interval_ms,
        )
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync={fsync!r} is unknown; choose one of {list(FSYNC_POLICIES)}")
        if type(fsync_interval_ms) is not int or not 1 <= fsync_interval_ms <= 3_600_000:
            raise ConfigError("fsync_interval_ms must be an int in 1..3600000")
        if type(cleaner_max_keys) is not int or cleaner_max_keys < 1:
            raise ConfigError(f"cleaner_max_keys must be a positive int, not {cleaner_max_keys!r}")
        if max_open_streams is None:
            max_open_streams = default_max_open_streams()
        elif type(max_open_streams) is not int or not 1 <= max_open_streams <= MAX_OPEN_STREAMS:
            raise ConfigError(
                f"max_open_streams must be an int in 1..{MAX_OPEN_STREAMS} (streams holding "
                f"their files open at once; None for a quarter of ulimit -n), not "
                f"{max_open_streams!r}"
            )
        self._cleaner_max_keys = cleaner_max_keys
        self._max_open = max_open_streams
        self._defaults = StreamConfig.from_dict(stream_defaults)
        retry_deadline = deadline_seconds(retry_deadline_ms)
        check_tier(  # creates nothing
            root,
            tier_url,
            tier_storage_options,
            Metrics(),
            sync=False,
            retry_deadline=retry_deadline,
        )
        check_log_directory(root, create=create)
        clean_staging(root)
        self.path = root
        self._fsync = fsync
        self._stores: dict[str, StreamStore] = {}
        # The stores holding descriptors, least recently opened first (lock held).
        self._open: OrderedDict[StreamStore, None] = OrderedDict()
        self._lock = fork_safe_lock()
        self._metrics = Metrics()
        self._retired = [0, 0, 0]  # append counters of stores already closed
        self._writers: weakref.WeakSet[Writer] = weakref.WeakSet()
        # Tiering (tier_url=): the tier is configured now if this log has one; a log
        # another process starts tiering later gets it when a stream shows a manifest.
        self._manifests = ManifestCache()
        self._tier_options = tier_storage_options
        self._retry_deadline = retry_deadline
        self._tier_recheck = 0.0  # monotonic time to look for tier.json again
        tier = configure_tier(
            root,
            tier_url,
            tier_storage_options,
            self._metrics,
            sync=fsync != "never",
            retry_deadline=retry_deadline,
        )
        self._tiered = None if tier is None else TieredReader(tier, self._manifests)
        self._stop = threading.Event()
        self._sync_interval = fsync_interval_ms / 1000.0
        self._syncer: threading.Thread | None = None
        self._syncer_wanted = False  # a fork child starts its own (_start_syncer_in_child)
        if fsync == "interval":
            self._start_syncer()
        _LIVE.add(self)
        self._held = functools.partial(
            transactions.held_offset, transactions.pending_directory(root)
        )
        try:
            transactions.recover(self)  # commits whose committer died: finished now
        except BaseException:
            with contextlib.suppress(Exception):  # the caller never gets this log to close
                self.close()
            raise

    @property
    def max_open_streams(self) -> int:
        """How many streams hold their descriptors open at most (two each), unless more
        are in use at once (see the class)."""
        return self._max_open

    @property
    def stream_defaults(self) -> StreamConfig:
        """The configuration new streams get unless ``create_stream`` says otherwise."""
        return self._defaults

    # ------------------------------------------------------------- streams

    def stream(self, name: str) -> SegmentStream:
        self.check_open()
        return SegmentStream(self, validate_stream_name(name))

    def create_stream(self, name: str, **config: Any) -> SegmentStream:
        """Create ``name`` (its directory, built aside and renamed into place), or
        return it if it exists with the same settings fixed at creation; the
        :data:`~disklesslog.config.ALTERABLE` ones are left as the stream has them
        (:meth:`AbstractLog.create_stream` has the rule)."""
        self.check_open()
        validate_stream_name(name)
        wanted = self._defaults.replace(**config)
        self.note_write()
        directory = self.stream_dir(name)
        if not directory.exists():
            self._create_directory(name, wanted)
        self.read_config(name).created_again(name, wanted)
        return SegmentStream(self, name)

    def streams(self) -> list[str]:
        self.check_open()
        names = []
        for entry in os.scandir(self.path / STREAMS):
            if entry.is_dir() and _exists(os.path.join(entry.path, CONFIG)):
                with contextlib.suppress(Exception):
                    names.append(validate_stream_name(entry.name))
        return sorted(names)

    def delete_stream(self, name: str) -> None:
        self.check_open()
        validate_stream_name(name)
        directory = self.stream_dir(name)
        sync = self._fsync != "never"
        try:
            store = self._store(name, create=False)
        except StreamNotFound:
            raise StreamNotFound(f"stream {name!r} does not exist in {self.url}") from None
        except CorruptDataError:  # damaged beyond recovery: deleting it is still allowed
            if not flag_deleted(directory, sync=sync):
                raise StreamNotFound(f"stream {name!r} does not exist in {self.url}") from None
        else:
            store.mark_deleted()
            self._forget(name, store)
        damaged_group: CorruptDataError | None = None
        try:
            groups.forget_stream(self.path, name, sync=sync)
        except CorruptDataError as exc:  # the stream goes anyway; the caller hears of it
            damaged_group = exc
        graveyard = self.path / TMP / f"deleted-{uuid.uuid4().hex}"
        try:
            os.rename(directory, graveyard)
        except FileNotFoundError:
            return  # deleted concurrently
        shutil.rmtree(graveyard, ignore_errors=True)
        if sync:
            fsync_directory(self.path / STREAMS)
        if damaged_group is not None:
            raise damaged_group

    def commit_offsets(self, group: str, offsets: Mapping[str, int]) -> None:
        """Store ``group``'s next offset to read for each stream in ``offsets``, merged
        with the group's other streams (in ``groups/<group>.json``).

        Every stream must exist (:class:`~disklesslog.StreamNotFound` otherwise, as
        Kafka refuses offsets of unknown topics); an offset may lie anywhere from 0 up,
        as in Kafka: a consumer resets a position that is out of range when it reads.
        Nothing is stored unless every entry is valid. Several processes may commit to
        one group at once; each commit is atomic and none loses another's streams.
        """
        self.check_open()
        validate_group_name(group)
        if not isinstance(offsets, Mapping):
            raise ConfigError(
                f"offsets must be a mapping of stream name to offset, not {type(offsets).__name__}"
            )
        checked = {
            validate_stream_name(name): check_offset(offset, f"offset of stream {name!r}")
            for name, offset in offsets.items()
        }
        for name in checked:
            if not (self.stream_dir(name) / CONFIG).exists():
                raise StreamNotFound(
                    f"cannot commit an offset of stream {name!r}: it does not exist in {self.url}"
                )
        if checked:
            groups.commit_offsets(self.path, group, checked, sync=self._fsync != "never")

    def committed_offsets(self, group: str) -> dict[str, int]:
        """The offsets ``group`` committed, by stream (``{}`` for a new group)."""
        self.check_open()
        return groups.committed_offsets(self.path, validate_group_name(group))

    def groups(self) -> list[str]:
        """The groups with a committed offset (a file in ``groups/`` that holds one)."""
        self.check_open()
        return groups.list_groups(self.path)

    def lease_keeper(self) -> LeaseKeeper:
        """Leases in ``leases/<name>.json`` (:mod:`~disklesslog.segments.leases`)."""
        return lease_keeper(self.path)

    # ---------------------------------------------------------- maintenance

    def repair(
        self, stream: str, *, accept_data_loss: bool = False, start_offset: int | None = None
    ) -> MaintenanceReport:
        """Recover ``stream`` past damage that recovery refuses to decide about alone
        (``docs/operations.md``, "Damage and repair"); it runs now, in this process.

        ``accept_data_loss=True``: the active segment lost records that were
        acknowledged (reads and appends raise :class:`~disklesslog.DataLossError`
        naming the file and the offsets). What is left stays; the lost offsets become
        a gap that reads skip (an empty segment with a ``.lost`` marker recording the
        decision), and appends go on after it: those offsets are never handed out again.

        ``start_offset=N``: ``stream.state`` and its copy are both unreadable
        (:class:`~disklesslog.CorruptDataError` says so): the stream starts at ``N``
        (at least its oldest segment's base). Records below it stay invisible.

        Without either, or with nothing to repair, this is the recovery any open runs.
        The report's ``actions`` say what was repaired.
        """
        self.check_open()
        validate_stream_name(stream)
        if type(accept_data_loss) is not bool:
            raise ConfigError(f"accept_data_loss must be a bool, not {accept_data_loss!r}")
        if start_offset is not None:
            check_offset(start_offset, "start_offset")
        report = MaintenanceReport("repair", streams=1)
        with self._lock:
            old = self._stores.pop(stream, None)
            if old is not None:
                self._retire(old)
                self._open.pop(old, None)
        if old is not None:
            old.close()
        config = self.read_config(stream)
        try:
            store = StreamStore(
                self.stream_dir(stream),
                stream,
                config,
                self._fsync,
                self._metrics,
                hold=self._held,
                repair=Repair(accept_data_loss, start_offset),
                on_open=self._opened,
            )
        except StreamGone:
            raise StreamNotFound(f"stream {stream!r} does not exist in {self.url}") from None
        report.actions.extend(store.repairs)
        if not store.repairs:
            report.skipped.append(f"{stream}: nothing to repair")
        with self._lock:
            kept = not self._closed and self._stores.setdefault(stream, store) is store
            if kept:
                self._open[store] = None
                self._park_unused()
        if not kept:
            store.close()
        return report

    def compact(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        now_ms: int | None = None,
        force: bool = False,
    ) -> MaintenanceReport:
        """Key compaction of the closed segments of compacted streams (``stream``, or
        every stream whose ``cleanup_policy`` includes ``compact``): one cleaner pass
        each (:mod:`disklesslog.segments.compact`), safe alongside appends, reads,
        trims and compactions in other processes. Damaged data stops the pass of its
        stream: :class:`CorruptDataError` for a named stream, a skipped line otherwise."""
        self.check_open()
        report = MaintenanceReport("compaction", dry_run=dry_run)
        now = int(time.time() * 1000) if now_ms is None else check_timestamp(now_ms, "now_ms")
        if stream is not None:
            require_compacted(stream, self.read_config(validate_stream_name(stream)))
        names = [stream] if stream is not None else self.streams()
        for name in names:
            try:
                config = self.read_config(name)
            except StreamNotFound:
                if stream is not None:
                    raise
                continue  # deleted since it was listed
            if not config.compacted:
                continue
            report.streams += 1
            compact = functools.partial(
                compact_stream,
                now_ms=now,
                force=force,
                dry_run=dry_run,
                progress=progress,
                max_keys=self._cleaner_max_keys,
                config=config,
            )
            try:
                report.merge(self.with_store(name, compact, create=False))
            except StreamNotFound:
                if stream is not None:
                    raise
                report.skipped.append(f"{name}: deleted during the pass")
            except CorruptDataError as exc:
                if stream is not None:
                    raise
                # Kafka's cleaner marks such a partition uncleanable and goes on.
                report.skipped.append(f"{name}: not compacted: {exc} (see disklesslog verify)")
        return report

    # -------------------------------------------------------------- writers

    def writer(
        self, *, linger_ms: float | None = None, max_buffer_bytes: int | None = None
    ) -> SegmentWriter:
        self.check_open()
        w = SegmentWriter(
            self,
            linger_ms=DEFAULT_LINGER_MS if linger_ms is None else linger_ms,
            max_buffer_bytes=DEFAULT_MAX_BUFFER_BYTES
            if max_buffer_bytes is None
            else max_buffer_bytes,
        )
        self._writers.add(w)
        self.note_write()
        return w

    # ----------------------------------------------------- two-phase commits

    def stager(self, *, max_object_bytes: int | None = None) -> SegmentStager:
        """A stager writing files under ``staged/`` (see
        :mod:`disklesslog.segments.transactions`); its process must see this directory
        (the same machine, or a shared file system)."""
        self.check_open()
        self.note_write()
        return SegmentStager(self, max_object_bytes=max_object_bytes)

    def commit_transaction(
        self, transaction_id: str, parts: Iterable[StagedPart]
    ) -> TransactionResult:
        """Appends every part's batches stream by stream (name order), each stream's all
        at once, holding them back from readers until every stream has them: all or
        nothing, exactly once, and rolled forward after a crash by the next commit or
        open of this log (see :mod:`disklesslog.segments.transactions`)."""
        self.check_open()
        return transactions.commit_transaction(self, transaction_id, parts)

    def abort_transaction(self, parts: Iterable[StagedPart]) -> None:
        self.check_open()
        transactions.abort_transaction(self, parts)

    # ---------------------------------------------------------------- tiering

    @property
    def tier_url(self) -> str | None:
        """Where this log tiers closed segments (``tier_url=``, persisted in the log)."""
        tiered = self.tiered_reader(required=False)
        return None if tiered is None else tiered.tier.url

    def tier(
        self,
        stream: str | None = None,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        now_ms: int | None = None,
    ) -> MaintenanceReport:
        """Copy closed segments to the tier (``tier_url=``) and delete local copies past
        ``local_retention_ms``/``local_retention_bytes``; reads fall through to the tier.
        See :mod:`disklesslog.segments.tiering.operations`."""
        self.check_open()
        names = [validate_stream_name(stream)] if stream is not None else None
        now = int(time.time() * 1000) if now_ms is None else check_timestamp(now_ms, "now_ms")
        report = MaintenanceReport("tiering", dry_run=dry_run)
        tiered = self.tiered_reader(required=False)
        if tiered is None:
            report.skipped.append(
                "no tier_url: open the log with tier_url='s3://bucket/prefix' (or any "
                "fsspec URL) once to tier it"
            )
            return report
        tiered.tier.check_owner(tiered.tier.log_id, claim=True)
        names = self.streams() if names is None else names
        tally = tiering.Tally(progress)
        for name in names:
            report.streams += 1
            report.merge(
                tiering.tier_stream(self, tiered, name, dry_run=dry_run, now_ms=now, tally=tally)
            )
        tally.report()
        return report

    def collect_garbage(
        self,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
        grace_seconds: float | None = None,
        reconcile: bool = True,
    ) -> MaintenanceReport:
        """Delete tiered objects that left their streams (retention, trims) once they have
        been garbage for ``grace_seconds`` (default 60), and, with ``reconcile``, objects
        under the tier prefix that no manifest names (failed uploads, deleted streams)
        once they are that old. Local segments need no collection: they are deleted when
        trimmed.
        Staged files of two-phase commits nobody committed or aborted go once
        ``STAGED_UNKNOWN_MIN_AGE`` (24 h) old."""
        self.check_open()
        tiered = self.tiered_reader(required=False)
        if tiered is None:
            report = MaintenanceReport("gc", dry_run=dry_run)
            report.skipped.append("no tier_url: local segments need no garbage collection")
        else:
            tiered.tier.check_owner(tiered.tier.log_id, claim=True)
            report = tiering.collect_garbage(
                self,
                tiered.tier,
                dry_run=dry_run,
                progress=progress,
                grace_seconds=grace_seconds,
                reconcile=reconcile,
            )
        transactions.collect_staged(
            self,
            report,
            dry_run=dry_run,
            grace_seconds=resolve_grace(grace_seconds),
        )
        return report

    def may_have_tiered_streams(self, *, now: bool = False) -> bool:
        """Whether this log has a tier, cheaply: a log opened without one looks for
        ``tier.json`` (another process may start tiering it) at most once a second,
        or ``now``, so logs that never tier pay nothing on their read path.

        For the package's own modules: a stream asks it before each read, extent or
        retention call, to take the tiered path only in a log that may have one."""
        if self._tiered is not None:
            return True
        clock = time.monotonic()
        if not now and clock < self._tier_recheck:
            return False
        self._tier_recheck = clock + TIER_RECHECK_SECONDS
        return _exists(self.path / TIER_CONFIG)

    def tiered_reader(self, *, required: bool = True) -> TieredReader | None:
        """The log's tier reads; configured on first need if another process started
        tiering this log after it was opened here. ``required``: a stream has a
        manifest, so a missing tier is an error, not "not tiered".

        For the package's own modules: a stream with tiered segments reads, sizes and
        describes them through it; the log configures it once and owns it."""
        tiered = self._tiered
        if tiered is None:
            tier: Tier | None = configure_tier(
                self.path,
                None,
                self._tier_options,
                self._metrics,
                sync=self._fsync != "never",
                retry_deadline=self._retry_deadline,
            )
            if tier is None:
                if required:
                    raise ConfigError(
                        f"{self.path} has tiered segments but no tier.json naming their "
                        "tier: restore that file"
                    )
                return None
            with self._lock:
                if self._tiered is None:
                    self._tiered = TieredReader(tier, self._manifests)
                tiered = self._tiered
        return tiered

    # ---------------------------------------------------------------- close

    def close(self) -> None:
        if self._closed:
            return
        self.stop_maintenance()
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.close()
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
        with self._lock:
            self._closed = True
            stores, self._stores = list(self._stores.values()), {}
            self._open.clear()
            for store in stores:
                self._retire(store)
        failed: list[Exception] = []
        for store in stores:  # every store releases its files, whatever the others met
            try:
                store.close()
            except Exception as exc:  # damage found while syncing: reported after
                failed.append(exc)
        if failed:
            raise failed[0]

    def metrics(self) -> dict[str, float]:
        """Appended batches, records and bytes; read batches; fsyncs, segment rolls and
        torn tails truncated by recovery, since this log was opened."""
        with self._lock:
            batches, records, written = self._retired
            for store in self._stores.values():
                batches += store.appended_batches
                records += store.appended_records
                written += store.appended_bytes
        result = self._metrics.snapshot()
        result.update(appended_batches=batches, appended_records=records, appended_bytes=written)
        result.update(self.maintenance_metrics())
        return dict(sorted(result.items()))

    def write_maintenance_status(self, data: bytes) -> None:
        """``<log>/maintenance.json``, replaced whole (not fsynced: it only informs)."""
        write_durably(self.path, self.path / STATUS_FILE, data, sync=False)

    def read_maintenance_status(self) -> bytes | None:
        try:
            return (self.path / STATUS_FILE).read_bytes()
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------ internals

    def stream_dir(self, name: str) -> Path:
        """The directory of stream ``name`` (which may not exist).

        For the package's own modules: tiering finds a stream's manifest there."""
        return self.path / STREAMS / name

    @property
    def durable(self) -> bool:
        """Whether the fsync policy syncs at all (anything but ``"never"``).

        For the package's own modules: two-phase commits write their staged files,
        notes and records as durably as the log's appends."""
        return self._fsync != "never"

    def store_if_open(self, name: str) -> StreamStore | None:
        """The stream's store if this log has it open, else ``None``: one dict read, no
        lock (the hot path of an append; :meth:`with_store` does the rest).

        For the package's own modules: :meth:`SegmentStream.append` appends to an open
        store directly; the log alone opens, retires and closes its stores."""
        return self._stores.get(name)

    def manifest(self, directory: Path) -> Manifest | None:
        """The tier manifest of the stream in ``directory``, ``None`` if nothing of it is
        tiered: one ``stat``, re-read only when the file was replaced.

        For the package's own modules: a stream takes the tiered path for its reads,
        extent and description only when it has a manifest, read through the cache
        this log's tiered reads share."""
        return self._manifests.get(directory)

    def read_config(self, name: str) -> StreamConfig:
        """The stream's ``stream.json``, read afresh (:class:`StreamNotFound` if the
        stream does not exist, :class:`CorruptDataError` if the file is damaged).

        For the package's own modules: stagers and writers encode a stream's batches
        with its settings, and tiering applies its maintenance settings, which any
        process may alter at any time (so this reads the file every time)."""
        path = self.stream_dir(name) / CONFIG
        found = read_json(path, what="stream config")
        if found is None:
            raise StreamNotFound(f"stream {name!r} does not exist in {self.url}")
        content, checked = found
        version = content.get("version") if isinstance(content, dict) else None
        if version not in (1, _CONFIG_VERSION) or not isinstance(content, dict):
            raise CorruptDataError("unknown stream config version", source=str(path))
        if version == _CONFIG_VERSION and not checked:
            raise CorruptDataError("stream config has no checksum", source=str(path))
        try:
            return StreamConfig.from_dict(content.get("config", {}))
        except ConfigError as exc:
            raise CorruptDataError(f"invalid stream config: {exc}", source=str(path)) from None

    def alter_stream(self, name: str, **changes: Any) -> StreamConfig:
        """Change maintenance settings of ``name`` (see :data:`~disklesslog.config.ALTERABLE`):
        ``stream.json`` is replaced atomically under the stream's lock, and maintenance
        in every process reads it afresh."""
        self.check_open()
        validate_stream_name(name)

        def alter(store: StreamStore) -> StreamConfig:
            with store.locked():
                new = self.read_config(name).altered(**changes)
                self._write_config(self.stream_dir(name), new, replace=True)
            return new

        return self.with_store(name, alter, create=False)

    def _write_config(self, directory: Path, config: StreamConfig, *, replace: bool) -> None:
        """Write ``stream.json``, checksummed (by :func:`write_json` when it replaces one,
        so readers see the old or the new file, never a torn one)."""
        content = {"version": _CONFIG_VERSION, "config": config.to_dict()}
        target = directory / CONFIG
        if not replace:
            target.write_bytes(encode_json(content, indent=1))
            return
        write_json(self.path, target, content, sync=self._fsync != "never", indent=1)

    def _create_directory(self, name: str, config: StreamConfig) -> None:
        """Create a stream atomically: build it in ``tmp/`` and rename it into place.

        Of several processes creating the same stream at once, one rename wins; the
        others find the stream existing and use it.
        """
        staging = self.path / TMP / f"create-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            self._write_config(staging, config, replace=False)
            (staging / STATE).write_bytes(StreamState().encode())
            (staging / STATE_COPY).write_bytes(StreamState().encode())
            (staging / segment_name(0, LOG_SUFFIX)).touch()
            if self._fsync != "never":
                for child in staging.iterdir():
                    with open(child, "rb+") as f:
                        os.fsync(f.fileno())
                fsync_directory(staging)
            try:
                os.rename(staging, self.stream_dir(name))
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return
            if self._fsync != "never":
                fsync_directory(self.path / STREAMS)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _store(
        self,
        name: str,
        *,
        create: bool,
        check: Callable[[StreamConfig], object] | None = None,
    ) -> StreamStore:
        """The stream's store, opened on first use. With ``create`` a missing stream is
        created with the defaults, after ``check(defaults)`` (a first append checks its
        records, so one that is refused leaves no stream behind)."""
        store = self._stores.get(name)  # the hot path: a dict read is atomic
        if store is not None:
            return store
        self.check_open()
        if not self.stream_dir(name).exists():
            if not create:
                raise StreamNotFound(f"stream {name!r} does not exist in {self.url}")
            if check is not None:
                check(self._defaults)
            self._create_directory(name, self._defaults)
        config = self.read_config(name)
        store = StreamStore(
            self.stream_dir(name),
            name,
            config,
            self._fsync,
            self._metrics,
            hold=self._held,
            on_open=self._opened,
        )
        with self._lock:
            if self._closed:
                store.close()
                self.check_open()
            existing = self._stores.setdefault(name, store)
            if existing is store:
                self._open[store] = None
                self._park_unused()
                self._start_syncer_in_child()
        if existing is not store:
            store.close()
        return existing

    def _opened(self, store: StreamStore) -> None:
        """A parked store opened its files again (called by it, its mutex held): count it
        and park others if the log holds too many open."""
        with self._lock:
            if self._stores.get(store.name) is store:
                # Opening is not a use that earns a second chance: a store used once
                # since it was parked is the first to go again, so appends round-robin
                # over more streams than the bound park one store each, not a sweep
                # over every open store each time the hand comes round.
                store.used = False
                self._open[store] = None
                if len(self._open) > self._max_open:
                    self._park_unused(keep=store)
                self._start_syncer_in_child()

    def _park_unused(self, *, keep: StreamStore | None = None) -> None:
        """Park stores until at most ``max_open_streams`` hold descriptors (lock held).

        The clock algorithm over the open stores, oldest opened first: one used since
        the hand last passed (not counting the call that reopened it: see
        :meth:`_opened`) gets a second chance (moved to the back, its mark cleared);
        one in use (pins, another thread inside it, or ``keep``: the store opening its
        files again, inside its own call) is skipped. Two rounds at most;
        if every store is in use the bound is passed until they are not."""
        opened, stores = self._open, self._stores
        excess = len(opened) - self._max_open
        turns = 2 * len(opened)
        while excess > 0 and turns > 0:
            turns -= 1
            store = next(iter(opened))
            if store.parked or stores.get(store.name) is not store:
                del opened[store]  # parked or forgotten by another path
                excess -= 1
            elif store.used or store.pins or store is keep:
                store.used = False
                opened.move_to_end(store)
            elif store.park():
                del opened[store]
                excess -= 1
            else:
                opened.move_to_end(store)

    def _forget(self, name: str, store: StreamStore) -> None:
        with self._lock:
            if self._stores.get(name) is store:
                del self._stores[name]
                self._retire(store)
            self._open.pop(store, None)
        store.close()

    def _retire(self, store: StreamStore) -> None:
        """Keep a closing store's append counters in the log's totals (lock held)."""
        self._retired[0] += store.appended_batches
        self._retired[1] += store.appended_records
        self._retired[2] += store.appended_bytes

    def with_store(
        self,
        name: str,
        action: Callable[[StreamStore], T],
        *,
        create: bool,
        check: Callable[[StreamConfig], object] | None = None,
    ) -> T:
        """Run ``action`` on the stream's store, reopening it if the stream was deleted
        and (for writes) recreated under us (``check``: see :meth:`_store`).

        For the package's own modules: the streams, writers, two-phase commits and
        tiering act on a stream's files only through it, so each survives a concurrent
        delete (and re-create) of the stream, and the log keeps owning its stores."""
        for attempt in range(_GONE_RETRIES):
            try:
                store = self._store(name, create=create, check=check)
            except StreamGone:
                time.sleep(0.001 * attempt)
                continue
            with self._lock:
                store.pins += 1  # in use: never parked meanwhile
            try:
                return action(store)
            except StreamGone:
                self._forget(name, store)
                time.sleep(0.001 * attempt)
            finally:
                with self._lock:
                    store.pins -= 1
        raise StreamNotFound(f"stream {name!r} was deleted while in use")

    def _start_syncer(self) -> None:
        self._syncer = threading.Thread(
            target=self._sync_loop,
            args=(self._sync_interval,),
            name=f"disklesslog-fsync {self.path}",
            daemon=True,
        )
        self._syncer.start()

    def _start_syncer_in_child(self) -> None:
        """In a fork child, when a store first holds descriptors of the child's own
        (lock held): start the fsync thread of ``fsync="interval"``, the parent's not
        being in the child. Off the append path: every store the child inherited is
        parked, so its first use reopens it."""
        if self._syncer_wanted and not self._closed:
            self._syncer_wanted = False
            self._start_syncer()

    def _forked(self) -> None:
        """In a fork child (:mod:`disklesslog.forks`): the stores park themselves, so
        none holds descriptors; the fsync thread is the parent's, and the child's starts
        when a store opens (:meth:`_start_syncer_in_child`)."""
        self._open.clear()
        self._stop = renewed_event(self._stop)
        if self._syncer is not None:
            self._syncer = None
            self._syncer_wanted = True

    def _sync_loop(self, interval: float) -> None:
        """The fsync-interval thread. A stream whose sync fails is retried every interval
        (its recovery point moves only once one succeeds); the failure is logged when it
        starts and when it ends, and never stops the thread."""
        failing: set[str] = set()
        while not self._stop.wait(interval):
            with self._lock:
                stores = list(self._stores.items())
            for name, store in stores:
                try:
                    store.sync()
                except StreamGone:
                    continue
                except Exception as exc:
                    if name not in failing:
                        log.error(
                            "stream %r: syncing its appends to disk failed (%s); they are "
                            "not durable against an OS crash until a later sync succeeds",
                            name,
                            exc,
                        )
                    failing.add(name)
                else:
                    if name in failing:
                        failing.discard(name)
                        log.warning("stream %r: syncing to disk works again", name)


@typed_os_errors(iterators=("read_batches", "read_offsets"))
class SegmentStream(Stream):
    """A stream of a :class:`SegmentLog`."""

    _log: SegmentLog

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Any = None,
        timestamp: int | None = None,
    ) -> int:
        self._log.note_write()
        store = self._log.store_if_open(self._name)
        if store is not None:  # the hot path; a new or deleted stream takes the slow one
            try:
                return _append_record(value, key, headers, timestamp, store)
            except StreamGone:
                pass
        append = functools.partial(_append_record, value, key, headers, timestamp)
        check = functools.partial(_encode_record, value, key, headers, timestamp, self._name)
        return self._log.with_store(self._name, append, create=True, check=check)

    def append_batch(
        self,
        values: Iterable[bytes | None],
        *,
        keys: Iterable[bytes | None] | None = None,
        headers: Iterable[Any] | None = None,
        timestamps: int | Sequence[int] | None = None,
    ) -> list[int]:
        # Columns are walked once per attempt (an attempt is retried if the stream is
        # deleted meanwhile), so one-shot iterables become lists first.
        values = as_column(values, "values")
        keys = None if keys is None else as_column(keys, "keys")
        headers = None if headers is None else as_column(headers, "headers")

        def encoded(config: StreamConfig) -> AbstractContextManager[EncodedBatch]:
            require_keys(config, self._name, keys)
            return encode_batch_borrowed(
                values,
                keys,
                headers,
                timestamps,
                compression=config.compression_code,
                max_record_bytes=config.max_record_bytes,
                max_batch_bytes=config.max_batch_bytes,
            )

        def append_all(store: StreamStore) -> list[int]:
            with encoded(store.config) as batch:
                base = store.append([batch])[0]
            return list(range(base, base + batch.record_count))

        def check(config: StreamConfig) -> None:
            with encoded(config):
                pass

        self._log.note_write()
        return self._log.with_store(self._name, append_all, create=True, check=check)

    # A stream with a manifest (tier.manifest) has tiered segments: its reads, extent
    # and trims go through segments.tiering.reader/tiering, the others take the local path
    # unchanged (one stat of the manifest file decides).

    def _tier_reads(self, store: StreamStore, *, now: bool = False) -> TieredReader | None:
        log = self._log
        if not log.may_have_tiered_streams(now=now):
            return None
        if log.manifest(store.directory) is None:
            return None
        return log.tiered_reader()

    def read_batches(
        self, start: int | None = None, end: int | None = None, *, max_records: int | None = None
    ) -> Iterator[RecordBatch]:
        check_read_arguments(start, end, max_records)
        return limit_records(self._read(start, end, COLUMNS), max_records)

    def read_offsets(
        self, start: int | None = None, end: int | None = None
    ) -> Iterator[Sequence[int]]:
        check_read_arguments(start, end, None)
        return self._read(start, end, OFFSETS)

    def _read(
        self, start: int | None, end: int | None, projection: Projection[Part]
    ) -> Iterator[Part]:
        def read(store: StreamStore) -> Iterator[Part]:
            tiered = self._tier_reads(store)
            if tiered is None:
                try:
                    return reader.read(store, start, end, projection)
                except OffsetOutOfRange:
                    # Below the local start: tiered by a process that began tiering
                    # this log after it was opened here, within the last second?
                    tiered = self._tier_reads(store, now=True)
                    if tiered is None:
                        raise
            return tiered.read(store, start, end, projection)

        return self._log.with_store(self._name, read, create=False)

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        check_timestamp(timestamp_ms, "timestamp_ms")

        def find(store: StreamStore) -> int | None:
            tiered = self._tier_reads(store)
            if tiered is None:
                return reader.offset_for_time(store, timestamp_ms)
            return tiered.offset_for_time(store, timestamp_ms)

        return self._log.with_store(self._name, find, create=False)

    @property
    def start_offset(self) -> int:
        def start(store: StreamStore) -> int:
            tiered = self._tier_reads(store)
            if tiered is None:
                return store.snapshot().start_offset
            return tiered.view(store).start_offset

        return self._log.with_store(self._name, start, create=False)

    @property
    def end_offset(self) -> int:
        return self._log.with_store(self._name, lambda s: s.snapshot().end_offset, create=False)

    def trim(self, before_offset: int) -> None:
        check_offset(before_offset, "before_offset")
        self._log.with_store(
            self._name, lambda s: tiering.trim_stream(s, before_offset), create=False
        )

    def info(self) -> StreamInfo:
        def describe(store: StreamStore) -> StreamInfo:
            snap = store.snapshot()
            last = len(snap.segments) - 1
            segments = [
                {
                    "base_offset": seg.base,
                    "end_offset": snap.end_offset if i == last else seg.end_offset,
                    "bytes": size,
                    "file": seg.log_path.name,
                }
                for i, (seg, size) in enumerate(snap.segments)
            ]
            size_bytes = sum(size for _, size in snap.segments)
            details: dict[str, Any] = {"segments": segments, "directory": str(store.directory)}
            start = snap.start_offset
            held = {
                txn["id"]: txn["streams"][self._name]
                for txn in transactions.pending_transactions(self._log.path)
                if self._name in txn["streams"]
            }
            if held:  # a commit in progress or interrupted holds the tail back
                details["pending_transactions"] = held
                details["unstable_end_offset"] = store.snapshot(raw=True).end_offset
            manifest = self._log.manifest(store.directory)
            if manifest is not None:
                tiered = self._log.tiered_reader()
                view = make_view(snap, manifest)
                start = view.start_offset
                size_bytes += sum(seg.size for seg in view.tiered)
                details["local_start_offset"] = snap.start_offset
                details["tier_url"] = tiered.tier.url if tiered is not None else None
                details["tiered"] = [
                    {
                        "base_offset": seg.base_offset,
                        "end_offset": seg.end_offset,
                        "bytes": seg.size,
                        "state": seg.state,
                        "max_timestamp": seg.max_timestamp,
                        "object": seg.log.key,
                    }
                    for seg in manifest.segments
                ]
                details["tiered_garbage_objects"] = len(manifest.garbage)
            return StreamInfo(
                name=self._name,
                start_offset=start,
                end_offset=snap.end_offset,
                config=self._log.read_config(self._name),  # maintenance settings may change
                size_bytes=size_bytes,
                details=details,
            )

        return self._log.with_store(self._name, describe, create=False)

    def retention_units(self) -> tuple[list[Unit], int]:
        def units(store: StreamStore) -> tuple[list[Unit], int]:
            tiered = self._tier_reads(store)
            if tiered is None:
                return local_units(store, store.snapshot())
            return tiered.retention_units(store)

        return self._log.with_store(self._name, units, create=False)

    def retention_unit_name(self, count: int) -> str:
        return "segment" if count == 1 else "segments"

    def trim_for_retention(self, before: int) -> MaintenanceReport:
        report = MaintenanceReport("retention")

        def trim(store: StreamStore) -> None:
            snap = store.snapshot()
            for seg, size in snap.segments[:-1]:
                if snap.start_offset < seg.end_offset <= before:
                    report.add(segments_deleted=1, bytes_deleted=size)
            gone = tiering.trim_stream(store, before)
            if gone:  # their objects are deleted by collect_garbage after the grace period
                report.actions.append(
                    f"{self._name}: {len(gone)} tiered segment{'s' if len(gone) != 1 else ''} "
                    "left the stream (objects deleted by gc after the grace period)"
                )

        self._log.with_store(self._name, trim, create=False)
        return report


def _exists(path: str | Path) -> bool:
    """Whether ``path`` exists; unlike ``os.path.exists``, a failed ``stat`` (an I/O
    error) raises rather than answering "no"."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _encode_record(
    value: bytes | None,
    key: bytes | None,
    headers: Any,
    timestamp: int | None,
    stream: str,
    config: StreamConfig,
) -> EncodedBatch:
    if key is None and config.compacted:
        require_keys(config, stream, None)
    return encode_record(
        value,
        key,
        headers,
        timestamp,
        compression=config.compression_code,
        max_record_bytes=config.max_record_bytes,
        max_batch_bytes=config.max_batch_bytes,
    )


def _append_record(
    value: bytes | None, key: bytes | None, headers: Any, timestamp: int | None, store: StreamStore
) -> int:
    batch = _encode_record(value, key, headers, timestamp, store.name, store.config)
    return store.append([batch])[0]


_LIVE: weakref.WeakSet[SegmentLog] = reset_after_fork(lambda log: log._forked())
