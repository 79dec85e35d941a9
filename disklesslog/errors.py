"""One exception hierarchy, rooted at :class:`DisklessLogError`.

Every failure a caller can cause or must handle is a subclass with a message that says
what to do next. Where a builtin category fits, the error also derives from it
(``ValueError``, ``TypeError``, ``LookupError``), so generic handlers keep working.
A failed call leaves nothing visible: no half-written batch, no partial stream.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CorruptDataError",
    "DataLossError",
    "DisklessLogError",
    "ForkedError",
    "IncompleteBatchError",
    "InvalidRecordError",
    "InvalidStreamName",
    "InvalidURL",
    "LeaseLost",
    "LogClosedError",
    "MissingDependencyError",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "ProducerFenced",
    "RecordTooLarge",
    "SequencerConflict",
    "SequencerDamaged",
    "SequencerError",
    "StorageError",
    "StorageNotFound",
    "StoragePermissionError",
    "StorageThrottled",
    "StorageUnavailable",
    "StreamExistsError",
    "StreamNotFound",
    "TooManyOpenFiles",
    "TransactionError",
    "UnknownProducerId",
    "UnknownProducerState",
]


class DisklessLogError(Exception):
    """Base class of every error this library raises on purpose."""


class ConfigError(DisklessLogError, ValueError):
    """An option or configuration value is unknown or out of range."""


class InvalidURL(ConfigError):
    """A log URL cannot be opened: unknown scheme, malformed, or not a log."""


class MissingDependencyError(DisklessLogError, ImportError):
    """An optional dependency is not installed; the message names the extra to install,
    e.g. ``pip install 'disklesslog[s3]'``."""


class InvalidStreamName(DisklessLogError, ValueError):
    """A stream name breaks the naming rule (1-249 of ``[A-Za-z0-9._-]``, not ``.``/``..``)."""


class InvalidRecordError(DisklessLogError, TypeError):
    """A record field has the wrong type or shape (e.g. ``str`` where ``bytes`` belongs).

    Derives from ``TypeError`` because that is what the mistake is; nothing was written.
    """


class RecordTooLarge(DisklessLogError, ValueError):
    """A record or batch exceeds ``max_record_bytes`` / ``max_batch_bytes``; nothing was written."""


class StreamNotFound(DisklessLogError, LookupError):
    """The stream does not exist (it is created by its first append or ``create_stream``)."""


class StreamExistsError(DisklessLogError):
    """``create_stream`` found the stream already present with a setting fixed at
    creation that differs from the one asked for (the message names each)."""


class OffsetOutOfRange(DisklessLogError, LookupError):
    """An offset lies outside ``[start_offset, end_offset]`` of a stream.

    Below the start offset the records were trimmed; above the end offset they do not
    exist yet. ``start_offset``/``end_offset`` carry the valid range at the time of the call.
    """

    def __init__(self, message: str, *, start_offset: int, end_offset: int) -> None:
        super().__init__(message)
        self.start_offset = start_offset
        """The stream's first kept offset when the call was made: where to restart a
        read that fell behind retention."""
        self.end_offset = end_offset
        """The stream's end offset (the next offset to be written) when the call was
        made."""


class CorruptDataError(DisklessLogError):
    """Stored bytes failed validation (checksum, magic, length, structure).

    Reads never return data that failed its checksum; they raise this instead.
    ``source`` names the file or object and ``position`` the byte offset of the bad
    batch inside it, so ``disklesslog verify`` and operators can find it.
    """

    def __init__(self, reason: str, *, source: str | None = None, position: int | None = None):
        self.reason = reason
        """What failed validation (a checksum, a magic number, a length...)."""
        self.source = source
        """The file or object holding the bad bytes, when known."""
        self.position = position
        """The byte offset of the bad batch in :attr:`source`, when known."""
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = ""
        if self.source is not None:
            where = f" in {self.source}"
        if self.position is not None:
            where += f" at byte {self.position}"
        return f"corrupt data{where}: {self.reason}"

    def located(self, source: str, base_position: int) -> CorruptDataError:
        """Return a copy of this error placed in ``source``, its position shifted by a base."""
        position = None if self.position is None else base_position + self.position
        return type(self)(self.reason, source=source, position=position)


class IncompleteBatchError(CorruptDataError):
    """The input ends before the batch does.

    At the tail of an active segment this means "not fully written yet" (or torn by a
    crash) and scanners treat it as the end of the data; anywhere else it is corruption.
    """


class LogClosedError(DisklessLogError):
    """The log, stream or writer was used after ``close()``."""


class ForkedError(LogClosedError):
    """A writer or consumer made before ``fork()`` was used in the child process. Its
    buffered records, positions and thread are the parent's: the parent writes what
    was appended before the fork, and the child cannot tell what became of it (those
    futures hold this error in the child). Make a new one in the child; a log and its
    streams opened before the fork may be used there."""


class DataLossError(CorruptDataError):
    """Data that was acknowledged is gone: an object the sequencer says exists was
    deleted underneath (by hand, or a garbage collector run with too short a grace
    period), or a local segment lost records that were written and synced (storage
    lost them).

    ``lost``, when known, is the range ``(first, end)`` of offsets lost. A local stream
    refuses reads and appends until an operator accepts the loss with
    ``SegmentLog.repair(stream, accept_data_loss=True)``; the lost offsets are never
    handed out again (see ``docs/operations.md``).
    """

    def __init__(
        self,
        reason: str,
        *,
        source: str | None = None,
        position: int | None = None,
        lost: tuple[int, int] | None = None,
    ):
        self.lost = lost
        """The range ``(first, end)`` of the offsets lost, when known."""
        super().__init__(reason, source=source, position=position)

    def located(self, source: str, base_position: int) -> DataLossError:
        """Return a copy placed in ``source``, its position shifted by a base, keeping
        the ``lost`` range (what the operator's repair decision is about)."""
        position = None if self.position is None else base_position + self.position
        return type(self)(self.reason, source=source, position=position, lost=self.lost)


class StorageError(DisklessLogError, OSError):
    """A storage request (an object store's GET, PUT or LIST, or a local file's read or
    write) failed: nothing is known to be lost or damaged, and a failed write left
    nothing visible. The message names what was asked and the last failure (also
    chained as ``__cause__``). Also an ``OSError``, so code that handles I/O failures
    generally keeps working.

    The subclasses say why, for object storage: :class:`StorageNotFound`,
    :class:`StoragePermissionError`, :class:`StorageUnavailable` and
    :class:`StorageThrottled`. A plain ``StorageError`` is a failure of no known kind
    (an I/O error, a full disk, a client error this library does not recognise).

    ``url`` names the storage (or object) and ``operation`` the request (``get``,
    ``put``, ``create``, ``delete``, ``open``...) when known. ``retriable`` says whether
    trying again later may succeed: the library already retried those, up to its retry
    deadline (option ``retry_deadline_ms``), before raising."""

    retriable: bool = True
    """Whether the same request may succeed later (the class default; an error
    classified from a client's may say otherwise)."""

    def __init__(
        self,
        *args: object,
        url: str | None = None,
        operation: str | None = None,
        retriable: bool | None = None,
    ) -> None:
        super().__init__(*args)
        self.url = url
        """The storage (or object) the request was for, when known."""
        self.operation = operation
        """The request that failed (``get``, ``put``, ``create``, ``delete``,
        ``open``...), when known."""
        if retriable is not None:
            self.retriable = retriable


class StorageNotFound(StorageError):
    """The bucket (an Azure container, or the directory a log lives in) does not exist:
    no retry creates it. Create it, or fix the URL. (A missing *object* is not this: the
    call that needed it says what its absence means, e.g. :class:`DataLossError`.)"""

    retriable = False


class StoragePermissionError(StorageError):
    """The storage refused the request's credentials (HTTP 401/403, an expired or
    invalid key or token) or found none: no retry helps. Check the credentials in
    ``storage_options`` or the environment, and the bucket's permissions."""

    retriable = False


class StorageUnavailable(StorageError):
    """The storage could not be reached or failed to answer (connection refused or
    reset, a DNS failure, a timeout, an HTTP 5xx) on every attempt until the retry
    deadline: it is down or unreachable. Retry later; check the endpoint and network."""

    retriable = True


class StorageThrottled(StorageError):
    """The storage kept asking the client to slow down (HTTP 429, S3's 503 SlowDown,
    Azure's ServerBusy) until the retry deadline, despite the longer backoff this
    library gives throttled requests. Retry later, or spread the load (fewer concurrent
    writers, or writers that flush less often)."""

    retriable = True


class TooManyOpenFiles(StorageError):
    """The process (``EMFILE``) or the system (``ENFILE``) ran out of file descriptors.
    The call failed as any failed call does (nothing of it half done), and the log
    works again once descriptors are free.
    Lower ``max_open_streams`` (a local log holds two per open stream), close logs,
    readers and files you no longer need, or raise the limit (``ulimit -n``,
    ``resource.setrlimit(RLIMIT_NOFILE, ...)``)."""

    retriable = True


class SequencerError(DisklessLogError):
    """The sequencer refused or could not complete an operation; nothing was applied."""


class ProducerFenced(SequencerError):
    """A newer instance of this named producer was initialised elsewhere (its epoch is
    higher): this writer is a zombie and may not commit. Create a new writer."""


class OutOfOrderSequence(SequencerError):
    """A producer's batch skipped or repeated sequence numbers in a way that is neither
    the next batch nor a retry of records it committed recently: records would be lost
    or duplicated, so the whole commit was refused."""


class SequencerDamaged(CorruptDataError):
    """The object-store sequencer's stored state is damaged where this process needs it:
    an entry failed its checksum (or its structure, or names a history other than the
    one this process applied), or a checkpoint did and the entries that would replace it
    are gone. ``source`` names the damaged object. Nothing was skipped or applied in
    part: this process stopped before it, so it never answers differently from the
    others. Repair it as ``docs/operations.md`` ("Repairing the object-store
    sequencer") describes: usually a process that got past the damage writes a
    checkpoint (``ObjectStoreSequencer.write_checkpoint()``)."""


class UnknownProducerState(OutOfOrderSequence):
    """The sequencer holds no sequence numbers of this producer on ``stream``, yet the
    batch does not start at sequence 0: the stream was deleted and created again (by any
    process) after this producer last wrote to it, and the new stream knows nothing of
    it. Kafka's ``UNKNOWN_PRODUCER_ID``. Writers handle it themselves: they number the
    stream from 0 again and retry, since none of their records can be in the new
    stream. It reaches you only if the stream keeps being re-created under a writer:
    append again."""

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream
        """The stream the sequencer holds no state of this producer for."""


class UnknownProducerId(ProducerFenced):
    """The sequencer does not know this producer id: it was dropped after
    ``producer_expiration_ms`` without a write (or was never issued by this sequencer).
    Kafka's ``producer.id.expiration.ms``. Writers handle it themselves: they initialise
    their producer again (a named writer under the same name) and number every stream
    from 0, since the sequencer remembers nothing of the old id. It reaches you only if
    that keeps failing: append again. A ProducerFenced, because a caller that does not
    handle it may no longer commit under the old id."""


class LeaseLost(DisklessLogError):
    """The lease this call names is no longer held by its holder: another holder took it
    over after it expired (its fencing token is greater), or it was released. Stop doing
    what the lease guarded, and acquire it again if the work is still wanted."""


class SequencerConflict(SequencerError):
    """The object-store sequencer lost the race for its next log entry to other
    processes more times than its retry limit allows: nothing was applied. Retry the
    operation, or use fewer competing writers (or the PostgreSQL sequencer)."""


class TransactionError(DisklessLogError):
    """A two-phase commit cannot go on: its staged parts are malformed, belong to another
    log, are too old to commit safely, or an earlier attempt of the same transaction was
    interrupted in a way this call cannot finish. The message says what to do."""
