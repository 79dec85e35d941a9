"""Two-phase commits: many processes *stage* records, one process *commits* them all.

The first phase runs wherever the data is (a Spark executor, a worker process): a
:class:`Stager` encodes records into batches and stores them without making them
visible (the object backend uploads write-once objects; the local backend writes
files under ``<log>/staged/``), and :meth:`Stager.finish` returns a small picklable
:class:`StagedPart` naming what it stored. The second phase runs in one place (the
Spark driver): :meth:`~disklesslog.AbstractLog.commit_transaction` makes every part
visible in one step keyed by a transaction id, and a repeat of the same id is answered
with the original offsets instead of storing anything twice; or
:meth:`~disklesslog.AbstractLog.abort_transaction` discards the parts.

Why a transaction id and not producer sequence numbers: the parts come from processes
that never talk to each other and may be re-run (a retried Spark task writes a new
part; a replayed micro-batch writes all of them again). Only the committer knows which
parts count, and only a name for the whole commit (Spark's query id and batch id) is
stable across such re-runs.

Staged data waits for its commit at most :data:`STAGED_MAX_AGE` (12 hours): older
parts are refused at commit, because garbage collection deletes staged data nobody
committed once it is :data:`STAGED_UNKNOWN_MIN_AGE` (24 hours) old.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .config import StreamConfig, require_keys
from .errors import (
    ConfigError,
    InvalidRecordError,
    LogClosedError,
    RecordTooLarge,
    TransactionError,
)
from .format import EncodedBatch, as_column, encode_batch
from .names import validate_stream_name
from .sequencers.base import BatchToCommit, TransactionResult

if TYPE_CHECKING:
    from .api import AbstractLog

__all__ = [
    "STAGED_MAX_AGE",
    "STAGED_UNKNOWN_MIN_AGE",
    "StagedObject",
    "StagedPart",
    "Stager",
    "TransactionResult",
    "check_parts",
]

STAGED_MAX_AGE = 12 * 3600.0
"""Seconds a staged object or file may wait for its commit; older ones are refused."""
STAGED_UNKNOWN_MIN_AGE = 2 * STAGED_MAX_AGE
"""Seconds after which garbage collection deletes staged data nobody committed (twice
:data:`STAGED_MAX_AGE`: a commit that accepted a part finishes long before)."""
DEFAULT_STAGED_OBJECT_BYTES = 8 << 20
"""A stager stores what it has once this much is buffered (one object per 8 MiB)."""
TARGET_BATCH_BYTES = 1 << 20
"""Payload a stager puts in one batch (at most half of the stream's max_batch_bytes)."""


@dataclass(frozen=True)
class StagedObject:
    """One stored object (or staged file) and the batches in it, as the sequencer will
    be told about them: ``key`` is the object key (object backend) or the file's path
    relative to the log (``staged/...``, local backend)."""

    key: str
    """The object key (object backend) or the staged file's path relative to the log."""
    batches: tuple[BatchToCommit, ...]
    """The batches stored in it, in order, with their positions and record counts."""

    @property
    def size(self) -> int:
        """Bytes of batches in the object."""
        return sum(b.size for b in self.batches)


@dataclass(frozen=True)
class StagedPart:
    """What one :class:`Stager` stored: small and picklable, so it travels to the
    committer (a Spark task's commit message). ``log_url`` guards against committing a
    part to another log."""

    log_url: str
    """The URL of the log the part was staged in: a commit to any other log refuses it."""
    objects: tuple[StagedObject, ...]
    """The objects (or staged files) the stager stored, in the order stored."""

    @property
    def records(self) -> int:
        """Records staged in the part, over all its streams (what a task reports)."""
        return sum(b.record_count for o in self.objects for b in o.batches)

    @property
    def size(self) -> int:
        """Bytes of batches the part stored (compressed, as stored)."""
        return sum(o.size for o in self.objects)


def check_parts(log_url: str, parts: Iterable[StagedPart]) -> list[StagedObject]:
    """The objects of ``parts`` in order, after checking each is a :class:`StagedPart`
    of this log and no object appears twice (that would count its records twice)."""
    if isinstance(parts, StagedPart):
        raise ConfigError("pass a list of StagedPart, not a single one")
    if isinstance(parts, str | bytes) or not isinstance(parts, Iterable):
        raise ConfigError(f"pass a list of StagedPart, not {type(parts).__name__}")
    objects: list[StagedObject] = []
    seen: set[str] = set()
    for part in parts:
        if not isinstance(part, StagedPart):
            raise ConfigError(f"a transaction commits StagedPart items, not {type(part).__name__}")
        if part.log_url != log_url:
            raise TransactionError(
                f"a part staged for {part.log_url} cannot be committed to {log_url}; open the "
                "log with the same URL in the stagers and the committer"
            )
        for obj in part.objects:
            if obj.key in seen:
                raise TransactionError(
                    f"staged object {obj.key} is in two parts: pass each part once"
                )
            seen.add(obj.key)
            objects.append(obj)
    return objects


def _columns(
    values: Iterable[bytes | None],
    keys: Iterable[bytes | None] | None,
    headers: Iterable[Any] | None,
    timestamps: int | Iterable[int] | None,
) -> tuple[
    Sequence[bytes | None],
    Sequence[bytes | None] | None,
    Sequence[Any] | None,
    int | Sequence[int] | None,
]:
    """A stager's columns as sequences of one length (it slices them into batches, so
    a column that is not a sequence, or one of another length, is refused here rather
    than cut short or taken apart)."""
    value_column = as_column(values, "values")
    columns: dict[str, Sequence[Any] | None] = {
        "keys": None if keys is None else as_column(keys, "keys"),
        "headers": None if headers is None else as_column(headers, "headers"),
    }
    if timestamps is None or isinstance(timestamps, int):
        stamps: int | Sequence[int] | None = timestamps
    else:
        stamps = columns["timestamps"] = as_column(timestamps, "timestamps")
    for name, column in columns.items():
        if column is not None and len(column) != len(value_column):
            raise InvalidRecordError(
                f"{name} has {len(column)} entries for {len(value_column)} records"
            )
    return value_column, columns["keys"], columns["headers"], stamps


class Stager(ABC):
    """Phase one of a two-phase commit: encodes records into batches and stores them,
    invisible, one object per ``max_object_bytes`` buffered; :meth:`finish` stores the
    rest and returns the :class:`StagedPart` to commit. Not thread-safe: one per task.

    Records are grouped per stream into batches of about 1 MiB as they arrive; an
    object holds the batches of every stream, sorted by stream, like a writer's flush.
    """

    def __init__(self, log: AbstractLog, *, max_object_bytes: int | None = None) -> None:
        size = DEFAULT_STAGED_OBJECT_BYTES if max_object_bytes is None else max_object_bytes
        if type(size) is not int or size < 1:
            raise ConfigError(f"max_object_bytes must be a positive int, not {size!r}")
        self._log = log
        self._max_object_bytes = size
        self._pending: list[tuple[str, EncodedBatch]] = []
        self._pending_bytes = 0
        self._staged: list[StagedObject] = []
        self._configs: dict[str, StreamConfig] = {}
        self._finished = False

    # ------------------------------------------------------------ backend hooks

    @abstractmethod
    def _config_for(self, stream: str) -> StreamConfig:
        """The stream's settings (its compression and limits), or the log's defaults for
        a stream that does not exist yet (the commit creates it)."""

    @abstractmethod
    def _store(self, data: bytes) -> str:
        """Store one staged object durably and return its key."""

    # ------------------------------------------------------------------ public

    def append_batch(
        self,
        stream: str,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Any] | None = None,
        timestamps: int | Sequence[int] | None = None,
    ) -> None:
        """Stage records of ``stream`` given as columns (as ``Stream.append_batch``).
        They become batches now; nothing is visible until the transaction commits."""
        if self._finished:
            raise LogClosedError("this stager has finished; start a new one")
        validate_stream_name(stream)
        values, keys, headers, timestamps = _columns(values, keys, headers, timestamps)
        if not values:
            return
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = self._config_for(stream)
        require_keys(config, stream, keys)
        limit = max(1, min(TARGET_BATCH_BYTES, config.max_batch_bytes // 2))
        # An estimate to cut the records into batches; encoding checks every field.
        payload = sum(len(v) for v in values if isinstance(v, bytes | bytearray))
        if keys is not None:
            payload += sum(len(k) for k in keys if isinstance(k, bytes | bytearray))
        pieces = max(1, math.ceil(payload / limit))
        step = math.ceil(len(values) / pieces)
        for start in range(0, len(values), step):
            self._encode(stream, config, values, keys, headers, timestamps, start, start + step)
        if self._pending_bytes >= self._max_object_bytes:
            self._flush()

    def finish(self) -> StagedPart:
        """Store what is buffered and return the part to commit (or to abort)."""
        if not self._finished:
            self._flush()
            self._finished = True
        return StagedPart(self._log.url, tuple(self._staged))

    def abort(self) -> None:
        """Give up: drop what is buffered and discard what was stored (see
        :meth:`~disklesslog.AbstractLog.abort_transaction`). For a task that fails, so
        its uploads are reclaimed without waiting for garbage collection's 24 hours."""
        self._pending = []
        self._pending_bytes = 0
        self._finished = True
        staged, self._staged = self._staged, []
        if staged:
            self._log.abort_transaction([StagedPart(self._log.url, tuple(staged))])

    # ---------------------------------------------------------------- internals

    def _encode(
        self,
        stream: str,
        config: StreamConfig,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Any] | None,
        timestamps: int | Sequence[int] | None,
        start: int,
        end: int,
    ) -> None:
        """Encode records ``start:end`` as one batch, halving the range while a batch
        would be too large (records of very uneven sizes)."""
        end = min(end, len(values))
        try:
            batch = encode_batch(
                values[start:end],
                None if keys is None else keys[start:end],
                None if headers is None else headers[start:end],
                timestamps
                if timestamps is None or isinstance(timestamps, int)
                else timestamps[start:end],
                compression=config.compression_code,
                max_record_bytes=config.max_record_bytes,
                max_batch_bytes=config.max_batch_bytes,
            )
        except RecordTooLarge:
            if end - start == 1:
                raise
            middle = (start + end) // 2
            self._encode(stream, config, values, keys, headers, timestamps, start, middle)
            self._encode(stream, config, values, keys, headers, timestamps, middle, end)
            return
        self._pending.append((stream, batch))
        self._pending_bytes += batch.size

    def _flush(self) -> None:
        if not self._pending:
            return
        ordered = sorted(self._pending, key=lambda item: item[0])  # stable: order kept
        parts: list[bytes | memoryview] = []
        batches: list[BatchToCommit] = []
        position = 0
        for stream, batch in ordered:
            batches.append(
                BatchToCommit(
                    stream=stream,
                    position=position,
                    size=batch.size,
                    span=batch.span,
                    record_count=batch.record_count,
                    max_timestamp=batch.max_timestamp,
                )
            )
            parts.append(batch.header)
            parts.append(batch.body)
            position += batch.size
        key = self._store(b"".join(parts))
        self._staged.append(StagedObject(key, tuple(batches)))
        self._pending = []
        self._pending_bytes = 0
