"""The buffering :class:`Writer`: appends to many streams, flushed as batches in the background.

The machinery is shared by both backends: per-stream buffers, a linger timer, a byte
bound with back-pressure, one flusher thread, and futures resolved with offsets. A flush
is taken from the buffers, encoded (:meth:`Writer._prepare`) and handed to the backend
(:meth:`Writer._dispatch`). A synchronous backend supplies :meth:`Writer._write`, which
stores one flush before returning: the local backend appends each stream's batches to
its segments. A pipelined backend overrides ``_dispatch`` and settles the flush later
with :meth:`Writer._finish`: the object backend uploads while earlier flushes commit.
Backends that number their batches (idempotent producers) supply
:meth:`Writer._producer_fields`.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from concurrent.futures import Future

# The states of Future's private protocol, which _BatchFuture (below) sets itself.
from concurrent.futures._base import FINISHED as _FINISHED
from concurrent.futures._base import PENDING as _PENDING
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from .config import StreamConfig, require_keys
from .errors import ConfigError, DisklessLogError, ForkedError, LogClosedError
from .forks import reset_after_fork
from .format import (
    HEADER_SIZE,
    EncodedBatch,
    PreparedBatch,
    as_column,
    check_record,
    prepare_batch,
)
from .names import validate_stream_name

__all__ = ["Writer"]

_FUTURE_FIELDS = {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}


class _BatchFuture(Future[int]):
    """A record's future whose condition is shared by every record of its batch.

    A plain :class:`~concurrent.futures.Future` builds a Condition and an RLock per
    instance: most of a buffering writer's per-record cost, and garbage-collector work.
    Sharing one per batch is safe because the writer resolves a batch's futures
    together while holding that condition, so no waiter wakes to an unresolved future
    (``Future.result(timeout)`` waits only once). A buffered record cannot be
    cancelled: ``cancel()`` returns False, as for a future that is already running.
    """

    def __init__(self, condition: threading.Condition) -> None:
        # Future.__init__ would build the per-instance condition this class avoids.
        self._condition = condition
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    def cancel(self) -> bool:
        return False

    def share(self, condition: threading.Condition) -> None:
        """Wait on ``condition`` from now on (the batch's new one, in a fork child)."""
        self._condition = condition


def _settle_batch(
    condition: threading.Condition,
    futures: Sequence[Future[int]],
    *,
    first_offset: int | None = None,
    error: BaseException | None = None,
) -> None:
    """Resolve every future of one batch: offsets from ``first_offset`` up, or ``error``.

    With :class:`_BatchFuture` the states are set while the batch's shared condition is
    held, with one ``notify_all`` for the whole batch (``set_result`` would notify per
    future: most of a flush's cost); done-callbacks then run after the condition is
    released. Plain futures are resolved one by one.
    """
    if _new_future is not _BatchFuture:
        for offset, future in enumerate(futures, first_offset or 0):
            if error is None:
                future.set_result(offset)
            else:
                future.set_exception(error)
        return
    with condition:
        for offset, future in enumerate(futures, first_offset or 0):
            if error is None:
                future._result = offset
            else:
                future._exception = error
            future._state = _FINISHED
            for waiter in future._waiters:
                if error is None:
                    waiter.add_result(future)
                else:
                    waiter.add_exception(future)
        condition.notify_all()
    for future in futures:
        if future._done_callbacks:  # type: ignore[attr-defined]
            future._invoke_callbacks()  # type: ignore[attr-defined]


def _plain_future(condition: threading.Condition) -> Future[int]:
    return Future()


# _BatchFuture relies on Future's private attributes; if a Python release changes
# them, use plain futures (slower, equally correct).
_new_future = _BatchFuture if set(vars(Future())) == _FUTURE_FIELDS else _plain_future

_LIVE: weakref.WeakSet[Writer] = reset_after_fork(lambda writer: writer._forked())

_RECORD_OVERHEAD = 32  # msgpack framing per record, bounded generously
_BATCH_MARGIN = HEADER_SIZE + 64
_MAX_KEPT_ERRORS = 100  # errors remembered for flush()/close() between two calls


def _owned(items: Iterable[Any], field: str) -> Sequence[Any]:
    """A column the writer keeps until its flush encodes it: never the caller's list
    itself, so a caller reusing or changing its list after ``append_batch`` returns
    cannot change what is written (a tuple cannot change; a generator is copied anyway)."""
    column = as_column(items, field)
    return list(column) if column is items and isinstance(column, list) else column


@dataclass
class _Loose:
    """Single records buffered for one stream, as columns: they become one batch."""

    values: list[Any] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)
    headers: list[Any] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    futures: list[Future[int]] = field(default_factory=list)
    condition: threading.Condition = field(default_factory=threading.Condition)
    size: int = 0

    @property
    def record_count(self) -> int:
        return len(self.values)


@dataclass
class _Whole:
    """One ``append_batch`` call: a validated batch that is never split or merged."""

    prepared: PreparedBatch
    future: Future[list[int]]
    size: int

    @property
    def record_count(self) -> int:
        return self.prepared.record_count


_Part = _Loose | _Whole


@dataclass(eq=False)
class Flush:
    """One flush on its way to storage: each stream's encoded batches (``work``), the
    buffered parts whose futures they settle (``parts``, aligned with ``work``), the
    buffer bytes it holds (``freed`` when it finishes) and how many appends it completes
    (``target``: flush() callers wait for the appends accepted before theirs).

    For the package's own modules: a backend's writer overrides the hooks that take it
    (:meth:`Writer._prepare`, :meth:`Writer._dispatch`), as the object writer does to
    number and upload each flush as one object."""

    work: list[tuple[str, list[EncodedBatch]]]
    parts: list[list[_Part]]
    freed: int
    target: int
    done: bool = False


@dataclass
class StreamBuffer:
    """One stream's buffered appends, in the order accepted, and the config they are
    encoded with.

    For the package's own modules: :meth:`Writer._prepare`, which a backend's writer
    overrides (the object writer, to note its producer before a flush is encoded), takes
    the buffers a flush empties."""

    config: StreamConfig
    parts: list[_Part] = field(default_factory=list)

    def open_part(self, size: int) -> _Loose:
        """The loose part a record of ``size`` bytes joins (a new one if the last part is
        a whole batch or would outgrow ``max_batch_bytes``)."""
        last = self.parts[-1] if self.parts else None
        if (
            isinstance(last, _Loose)
            and last.size + size <= self.config.max_batch_bytes - _BATCH_MARGIN
        ):
            return last
        part = _Loose()
        self.parts.append(part)
        return part


class Writer(ABC):
    """Buffers appends across streams and writes them in batches from one background thread.

    ``append`` validates the record at once (typed errors raise at the call site) and
    returns a :class:`concurrent.futures.Future` that resolves to the record's offset
    when its batch is durable; ``append_batch`` does the same for a group of records
    that stays one batch. A flush happens ``linger_ms`` after the first buffered
    record, when ``max_buffer_bytes`` are buffered, or on :meth:`flush`/:meth:`close`.
    While ``max_held_bytes`` (default: twice ``max_buffer_bytes``) are buffered or being
    written, appends block (bounded memory).
    Records of one stream keep their append order. Thread-safe; a context manager.
    """

    def __init__(
        self,
        *,
        linger_ms: float,
        max_buffer_bytes: int,
        name: str,
        max_held_bytes: int | None = None,
    ) -> None:
        self.check_options(linger_ms, max_buffer_bytes)
        self._linger = linger_ms / 1000.0
        self._max_buffer_bytes = max_buffer_bytes
        self._max_held_bytes = max_held_bytes or 2 * max_buffer_bytes
        # Appends take the bare lock (a C-level ``with``); the condition around it is
        # only for waiting (flush, back-pressure, the flusher's timer) and notifying.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._buffers: dict[str, StreamBuffer] = {}
        self._configs: dict[str, StreamConfig] = {}  # fixed for a stream's life
        self._buffered_bytes = 0  # in the buffers: a flush is due at max_buffer_bytes
        self._held_bytes = 0  # buffered + being written: appends wait at max_held_bytes
        self._oldest: float | None = None
        self._accepted = 0
        self._completed = 0
        self._flush_wanted = False
        self._inflight: collections.deque[Flush] = collections.deque()
        """Dispatched flushes not yet finished, oldest first: appends count as completed
        in flush order, even if a pipelined backend finishes flushes out of order."""
        self._closed = False
        self._errors: list[BaseException] = []
        self._fatal: BaseException | None = None
        """Set by a backend when no later append can succeed (a fenced producer):
        appends then raise it at once instead of waiting for a flush to fail."""
        self._forked_from: int | None = None  # in a fork child: the parent's pid
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    @staticmethod
    def check_options(linger_ms: object, max_buffer_bytes: object) -> None:
        """Raise :class:`ConfigError` for options no writer takes: for a backend that
        must check them before it registers anything (an idempotent producer)."""
        if (
            isinstance(linger_ms, bool)
            or not isinstance(linger_ms, int | float)
            or not 0 <= linger_ms <= 3_600_000
        ):
            raise ConfigError(f"linger_ms must be a number in 0..3600000, not {linger_ms!r}")
        if type(max_buffer_bytes) is not int or not 1024 <= max_buffer_bytes <= 1 << 40:
            raise ConfigError(f"max_buffer_bytes must be an int >= 1024, not {max_buffer_bytes!r}")

    # ------------------------------------------------------------ backend hooks

    @abstractmethod
    def _config_for(self, stream: str) -> StreamConfig:
        """Configuration of ``stream`` (existing, or the defaults it will be created with)."""

    def _write(
        self, batches: list[tuple[str, list[EncodedBatch]]]
    ) -> list[list[int] | BaseException]:
        """Store one flush (a synchronous backend); return per stream the base offset of
        each batch, or the error that kept that stream's batches from being stored."""
        raise NotImplementedError(f"{type(self).__name__} must implement _write or _dispatch")

    def _dispatch(self, flush: Flush) -> None:
        """Hand an encoded flush to storage, from the flusher thread. The default stores
        it with :meth:`_write` and finishes it at once; a pipelined backend starts the
        work, returns, and calls :meth:`_finish` when the flush's fate is known."""
        results: list[list[int] | BaseException] = []
        if flush.work:
            try:
                results = self._write(flush.work)
            except Exception as exc:  # delivered through the futures
                results = [exc] * len(flush.work)
        self._finish(flush, results)

    def _drain(self) -> None:  # noqa: B027 - an optional hook
        """Called by the flusher thread when the writer closes, after its last dispatch:
        a pipelined backend waits here until every flush has finished."""

    def _producer_fields(self, stream: str, record_count: int) -> tuple[int, int, int]:
        """``(producer_id, producer_epoch, base_sequence)`` for the next batch of ``stream``
        (called in flush order, from the flusher thread). Default: no producer."""
        return -1, -1, -1

    # ----------------------------------------------------------------- public

    def append(
        self,
        stream: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Any = None,
        timestamp: int | None = None,
    ) -> Future[int]:
        """Buffer one record for ``stream``; the future resolves to its offset.

        Arguments as for :meth:`Stream.append`. The record is checked now
        (:class:`~disklesslog.InvalidRecordError` and :class:`~disklesslog.RecordTooLarge`
        raise here, nothing buffered); the future resolves once its batch is durable, or
        holds the error that failed the flush. Blocks while the writer holds its limit
        of unwritten bytes (back-pressure)."""
        config = self._stream_config(stream)
        if key is None and config.compacted:
            require_keys(config, stream, None)
        normalized, size, timestamp = check_record(
            value, key, headers, timestamp, max_record_bytes=config.max_record_bytes
        )
        size += _RECORD_OVERHEAD
        with self._lock:
            buffer = self._admit(stream, config, size)
            part = buffer.open_part(size)
            part.values.append(value)
            part.keys.append(key)
            part.headers.append(normalized)
            part.timestamps.append(timestamp)
            future = _new_future(part.condition)
            part.futures.append(future)
            part.size += size
            self._accepted += 1
            self._wake()
        return future

    def append_batch(
        self,
        stream: str,
        values: Iterable[bytes | None],
        *,
        keys: Iterable[bytes | None] | None = None,
        headers: Iterable[Any] | None = None,
        timestamps: int | Sequence[int] | None = None,
    ) -> Future[list[int]]:
        """Buffer records (as columns, like ``Stream.append_batch``) that are written as
        one batch, all or none; the future resolves to their offsets."""
        config = self._stream_config(stream)
        key_list = None if keys is None else _owned(keys, "keys")
        require_keys(config, stream, key_list)
        prepared = prepare_batch(
            _owned(values, "values"),
            key_list,
            None if headers is None else as_column(headers, "headers"),
            timestamps
            if timestamps is None or isinstance(timestamps, int)
            else as_column(timestamps, "timestamps"),
            max_record_bytes=config.max_record_bytes,
            max_batch_bytes=config.max_batch_bytes,
        )
        future: Future[list[int]] = Future()
        size = sum(len(v) for v in prepared.columns[3] if v) + prepared.record_count * 8
        with self._lock:
            buffer = self._admit(stream, config, size)
            buffer.parts.append(_Whole(prepared, future, size))
            self._accepted += 1
            self._wake()
        return future

    def flush(self) -> None:
        """Write everything appended so far and wait for it.

        Raises the first error any of those records met (each failed record's future
        holds its own error too); records that succeeded stay written.
        """
        with self._cond:
            target = self._accepted
            self._flush_wanted = True
            self._cond.notify_all()
            while self._completed < target:
                if not self._thread.is_alive():
                    raise LogClosedError("the writer's flusher thread has stopped")
                self._cond.wait(0.5)
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Flush, stop the background thread and refuse further appends. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        with self._cond:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: later appends raise
        :class:`~disklesslog.LogClosedError` (records appended before it were flushed)."""
        return self._closed

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ buffering

    def _stream_config(self, stream: str) -> StreamConfig:
        config = self._configs.get(stream) if type(stream) is str else None
        if config is None:  # first record for this stream: check the name once
            config = self._configs[stream] = self._config_for(validate_stream_name(stream))
        return config

    def _admit(self, stream: str, config: StreamConfig, size: int) -> StreamBuffer:
        """Wait for room (back-pressure) and account for ``size`` bytes (lock held)."""
        if self._closed:
            raise self._closed_error()
        if self._fatal is not None:
            raise self._fatal
        while self._held_bytes >= self._max_held_bytes and not self._closed:
            self._cond.wait()
        if self._closed:
            raise self._closed_error()
        buffer = self._buffers.get(stream)
        if buffer is None:
            buffer = self._buffers[stream] = StreamBuffer(config)
        self._buffered_bytes += size
        self._held_bytes += size
        return buffer

    def _closed_error(self) -> LogClosedError:
        if self._forked_from is not None:
            return ForkedError(
                f"this writer was made by process {self._forked_from} before it forked; "
                "make a writer in this process (log.writer())"
            )
        return LogClosedError("the writer is closed")

    def _forked(self) -> None:
        """In a fork child (:mod:`disklesslog.forks`): the writer is the parent's. Its
        thread is gone and its buffered and in-flight records are the parent's to write:
        here it is closed, those records' futures hold :class:`ForkedError` (this
        process cannot tell what became of them) and later appends raise it."""
        self._forked_from = os.getppid()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        parts = [part for buffer in self._buffers.values() for part in buffer.parts]
        parts += [part for flush in self._inflight for group in flush.parts for part in group]
        self._buffers = {}
        self._inflight.clear()
        self._buffered_bytes = self._held_bytes = 0
        self._oldest = None
        self._completed = self._accepted
        self._closed = True
        self._errors = []
        error = self._closed_error()
        for part in parts:  # a thread of the parent may have held a part's condition
            if isinstance(part, _Loose):
                part.condition = threading.Condition()
                for future in part.futures:
                    if isinstance(future, _BatchFuture):
                        future.share(part.condition)
        self._fail(parts, error)

    def _wake(self) -> None:
        """Start the linger clock on the first buffered record, or flush when full."""
        if self._oldest is None:
            self._oldest = time.monotonic()
            self._cond.notify_all()
        elif self._buffered_bytes >= self._max_buffer_bytes:
            self._cond.notify_all()

    # --------------------------------------------------------- flusher thread

    def _due(self) -> bool:
        if not self._room():
            return False
        if self._flush_wanted or self._closed or self._buffered_bytes >= self._max_buffer_bytes:
            return bool(self._buffers)
        return self._oldest is not None and time.monotonic() - self._oldest >= self._linger

    def _room(self) -> bool:
        """Whether a flush can be dispatched now (called with the writer's lock held). A
        pipelined backend says no while its pipeline is full; it must notify the writer's
        condition when room appears (:meth:`_finish` does). Until then records gather in
        the buffers, so the next flush is larger rather than the pipeline longer."""
        return True

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._due():
                        if self._closed and not self._buffers:
                            return
                        if self._flush_wanted and not self._buffers and not self._inflight:
                            self._flush_wanted = False
                            self._completed = self._accepted
                            self._cond.notify_all()
                        timeout = None
                        if self._oldest is not None and self._room():
                            timeout = max(0.0, self._linger - (time.monotonic() - self._oldest))
                        self._cond.wait(timeout)
                    taken, self._buffers = self._buffers, {}
                    self._buffered_bytes = 0
                    self._oldest = None
                    target = self._accepted
                flush = self._prepare(taken, target)
                with self._cond:
                    self._inflight.append(flush)
                self._dispatch(flush)
                with self._cond:
                    if not self._buffers:
                        self._flush_wanted = False
        finally:
            self._drain()

    def _prepare(self, taken: dict[str, StreamBuffer], target: int) -> Flush:
        """Encode every stream's buffered parts into batches (in flush order, so producer
        numbering follows it). A stream whose records fail to encode fails at once."""
        work: list[tuple[str, list[EncodedBatch]]] = []
        parts_of: list[list[_Part]] = []
        freed = 0
        for stream, buffer in taken.items():
            parts = buffer.parts
            freed += sum(part.size for part in parts)
            try:
                encoded = [self._encode(stream, part, buffer.config) for part in parts]
            except Exception as exc:  # delivered through the futures
                self._fail(parts, exc)
                continue
            work.append((stream, encoded))
            parts_of.append(parts)
        return Flush(work, parts_of, freed, target)

    def _finish(self, flush: Flush, results: Sequence[list[int] | BaseException]) -> None:
        """Settle a flush: per stream (aligned with ``flush.work``) the base offset of each
        batch, or the error that kept them from being stored. Releases its buffer bytes;
        appends count as completed once every earlier flush has finished too."""
        for parts, result in zip(flush.parts, results):
            if isinstance(result, BaseException):
                self._fail(parts, result)
            else:
                self._resolve(parts, result)
        with self._cond:
            self._held_bytes -= flush.freed
            flush.done = True
            while self._inflight and self._inflight[0].done:
                self._completed = self._inflight.popleft().target
            self._cond.notify_all()

    def _encode(self, stream: str, part: _Part, config: StreamConfig) -> EncodedBatch:
        producer_id, epoch, sequence = self._producer_fields(stream, part.record_count)
        if isinstance(part, _Whole):
            prepared = part.prepared
        else:
            prepared = prepare_batch(
                part.values,
                keys=part.keys,
                headers=part.headers,
                timestamps=part.timestamps,
                max_record_bytes=config.max_record_bytes,
                max_batch_bytes=config.max_batch_bytes,
            )
        return prepared.encode(
            compression=config.compression_code,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
        )

    @staticmethod
    def _resolve(parts: Sequence[_Part], bases: list[int]) -> None:
        for part, base in zip(parts, bases):
            if isinstance(part, _Whole):
                part.future.set_result(list(range(base, base + part.record_count)))
            else:
                _settle_batch(part.condition, part.futures, first_offset=base)

    def _fail(self, parts: Sequence[_Part], exc: BaseException) -> None:
        if not isinstance(exc, DisklessLogError | OSError):
            exc = DisklessLogError(f"write failed: {exc!r}")
        with self._cond:
            if len(self._errors) < _MAX_KEPT_ERRORS:
                self._errors.append(exc)
        for part in parts:
            if isinstance(part, _Whole):
                part.future.set_exception(exc)
            else:
                _settle_batch(part.condition, part.futures, error=exc)
