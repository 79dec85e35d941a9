"""disklesslog: durable, ordered, append-only streams - Kafka's log without a broker.

>>> import disklesslog
>>> with disklesslog.open("/tmp/mylog") as log:           # doctest: +SKIP
...     offset = log.stream("events").append(b"hello")
...     [r.value for r in log.stream("events").read()]
"""

from __future__ import annotations

import os
from typing import Any

from . import objects as _objects  # noqa: F401 - registers the object-storage backend
from . import segments as _segments  # noqa: F401 - registers the local backend
from .api import AbstractLog, Stream, StreamInfo, validate_stream_name
from .config import StreamConfig
from .consumer import Consumer
from .errors import (
    ConfigError,
    CorruptDataError,
    DataLossError,
    DisklessLogError,
    ForkedError,
    IncompleteBatchError,
    InvalidRecordError,
    InvalidStreamName,
    InvalidURL,
    LeaseLost,
    LogClosedError,
    MissingDependencyError,
    OffsetOutOfRange,
    OutOfOrderSequence,
    ProducerFenced,
    RecordTooLarge,
    SequencerConflict,
    SequencerDamaged,
    SequencerError,
    StorageError,
    StorageNotFound,
    StoragePermissionError,
    StorageThrottled,
    StorageUnavailable,
    StreamExistsError,
    StreamNotFound,
    TooManyOpenFiles,
    TransactionError,
    UnknownProducerId,
    UnknownProducerState,
)
from .leases import Lease
from .records import Record, RecordBatch
from .urls import open_log, register_backend
from .writer import Writer

__version__ = "0.1.0"

Log = AbstractLog
"""The type :func:`open` returns, whatever the backend."""

__all__ = [
    "AbstractLog",
    "ConfigError",
    "Consumer",
    "CorruptDataError",
    "DataLossError",
    "DisklessLogError",
    "ForkedError",
    "IncompleteBatchError",
    "InvalidRecordError",
    "InvalidStreamName",
    "InvalidURL",
    "Lease",
    "LeaseLost",
    "Log",
    "LogClosedError",
    "MissingDependencyError",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "ProducerFenced",
    "Record",
    "RecordBatch",
    "RecordTooLarge",
    "SequencerConflict",
    "SequencerDamaged",
    "SequencerError",
    "StorageError",
    "StorageNotFound",
    "StoragePermissionError",
    "StorageThrottled",
    "StorageUnavailable",
    "Stream",
    "StreamConfig",
    "StreamExistsError",
    "StreamInfo",
    "StreamNotFound",
    "TooManyOpenFiles",
    "TransactionError",
    "UnknownProducerId",
    "UnknownProducerState",
    "Writer",
    "__version__",
    "open",
    "register_backend",
    "validate_stream_name",
]


def open(url: str | os.PathLike[str], **options: Any) -> AbstractLog:
    """Open (creating if needed) the log at ``url`` and return it.

    Use the log as a context manager or call ``close()``: closing flushes and releases
    its files, threads and connections.

    **Where the log is.** A directory path or ``file://`` URL opens local segment files
    (the ``segments`` backend); ``s3://``, ``gs://``, ``az://``, ``memory://`` and any
    other protocol fsspec knows open a log on object storage (the ``objects`` backend).
    The extras ``s3``, ``gcs`` and ``azure`` install the cloud clients.

    **Options of every log:**

    * ``backend``: the backend by name (``"segments"`` or ``"objects"``) instead of the one
      the URL's scheme picks; ``backend="objects"`` keeps an object log in a local directory
      (``file://``). Default: chosen by the scheme.
    * ``create``: ``True`` (the default) creates a missing log; ``False`` raises
      :class:`InvalidURL` instead, for tools that must not create one by mistake.
    * ``maintenance``: ``"auto"`` (the default): once this process writes the log, it
      takes part in the log's automatic maintenance (retention, compaction, merging,
      tiering, garbage collection, sequencer housekeeping), which one writing process
      at a time runs in the background (docs/operations.md, section 8); ``"off"``:
      never (run ``log.maintain()`` yourself).
    * ``maintenance_interval_ms``: milliseconds between maintenance passes, 10..86400000;
      default 60000.

    **Options of local logs** (paths and ``file://`` URLs):

    * ``fsync``: when appends reach the disk: ``"always"`` (fsync before each append
      returns; survives power loss), ``"interval"`` (the default: written to the OS at once,
      fsynced in the background every ``fsync_interval_ms``; a process crash loses nothing,
      an OS crash at most that much) or ``"never"`` (left to the OS).
    * ``fsync_interval_ms``: milliseconds between background fsyncs with
      ``fsync="interval"``, 1..3600000; default 1000.
    * ``cleaner_max_keys``: keys one key-compaction pass maps at most (Kafka's dedupe
      buffer, counted in keys), bounding its memory; a larger dirty range is compacted over
      several passes. Default 4000000.
    * ``tier_url``: an object-storage URL (``s3://bucket/prefix``) to copy closed segments
      to, so local disk keeps only the recent ones (see :meth:`Log.tier` and the
      ``local_retention_*`` stream settings). Default: no tier.
    * ``tier_storage_options``: fsspec options (credentials, endpoint) for ``tier_url``.
      Default: none.
    * ``max_open_streams``: how many streams keep their files (two descriptors each) open
      at once; a log may hold any number of streams, and one not used lately is parked
      and reopened cheaply on its next use. Default: a quarter of ``ulimit -n`` (at least
      16), leaving the rest to the application.
    * ``retry_deadline_ms``: as for object-storage logs, for the requests to ``tier_url``.

    **Options of object-storage logs:**

    * ``storage_options``: a mapping of fsspec options for the storage (``{"profile":
      "prod"}``, ``{"endpoint_url": ...}``). Default: none (the environment's credentials).
    * ``sequencer``: who assigns offsets: a URL (``"postgresql://user@host/db?schema=app"``,
      ``"sqlite:///path/meta.db"``, ``"memory://"``, ``"objectstore://"`` or
      ``"objectstore+s3://bucket/elsewhere"``) or a ``Sequencer`` instance (not closed with
      the log). Default: ``memory://`` logs sequence in memory, ``file://`` logs in a SQLite
      database in the log's directory, and every other storage in the object-store sequencer
      inside the log (``<url>/_sequencer``), which needs no server. docs/sequencers.md
      describes each and its URL parameters.
    * ``cache``: the block cache reads go through: a ``BlockCache``, or ``None`` for no
      cache. Default: the process-wide cache (256 MiB in memory, 4 MiB blocks).
    * ``retry_deadline_ms``: how long, in milliseconds, a failing storage request (and an
      object-store sequencer's) is retried with backoff before :class:`StorageError` is
      raised. Default 30000.
    * ``producer_expiration_ms``: how long, in milliseconds, the sequencer remembers a
      producer (a writer) after its last write, as Kafka's ``producer.id.expiration.ms``:
      retries are deduplicated and a named producer's zombies fenced within this window;
      the log's housekeeping forgets idle producers so their state stays bounded, and a
      writer idle for longer carries on as a new producer. 1..31536000000; default
      86400000 (1 day). docs/operations.md, section 8.

    **Stream settings.** Any :class:`StreamConfig` field is also accepted, as the
    default for streams this log creates (an existing stream keeps its own):
    ``compression`` (``"none"``), ``max_record_bytes`` (1 MiB), ``max_batch_bytes``
    (16 MiB), ``segment_bytes`` (256 MiB), ``segment_ms`` (7 days),
    ``index_interval_bytes`` (4096), ``cleanup_policy`` (``"delete"``),
    ``retention_ms`` and ``retention_bytes`` (-1: unlimited), ``delete_retention_ms``
    (1 day), ``min_cleanable_dirty_ratio`` (0.5), ``local_retention_ms`` and
    ``local_retention_bytes`` (-2: as retention). :class:`StreamConfig` says what each
    means.

    Every option is checked before anything is created. An unknown name raises
    :class:`ConfigError` listing the valid log options and stream settings, with the
    closest match; an option of the other kind of log (``sequencer=`` on a path,
    ``fsync=`` on object storage) says which kind takes it.
    """
    return open_log(url, **options)
