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
    "UnknownProducerState",
    "Writer",
    "__version__",
    "open",
    "register_backend",
    "validate_stream_name",
]


def open(url: str | os.PathLike[str], **options: Any) -> AbstractLog:
    """Open (creating if needed) the log at ``url`` and return it.

    ``url`` is a directory path or ``file://`` URL for the local segment-file backend.
    Options: ``fsync`` (``"always"``, ``"interval"`` - the default - or ``"never"``),
    ``fsync_interval_ms``, ``create`` (default True), ``backend``, ``tier_url`` and
    ``tier_storage_options`` (local logs: see :meth:`Log.tier`), and any
    :class:`StreamConfig` field as the default for new streams. Unknown options raise
    :class:`ConfigError`. Use the log as a context manager or call ``close()``.
    """
    return open_log(url, **options)
