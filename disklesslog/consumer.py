"""Consumer groups: read several streams as one and resume where the group left off.

A :class:`Consumer` (from :meth:`disklesslog.Log.consumer`) works on any backend: it
reads with :meth:`Stream.read_batches` and stores its positions with
:meth:`AbstractLog.commit_offsets`, Kafka's consumer-group offsets without a broker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import repeat
from types import TracebackType
from typing import TYPE_CHECKING

from .api import check_seconds
from .errors import ConfigError, ForkedError, LogClosedError, OffsetOutOfRange, StreamNotFound
from .forks import reset_after_fork
from .records import Record, RecordBatch

if TYPE_CHECKING:
    from .api import AbstractLog, Stream

__all__ = ["Consumer"]

_log = logging.getLogger(__name__)

RESETS = ("earliest", "latest")
ITER_FETCH_RECORDS = 1000
"""Records an iteration fetches at a time (handed out one by one)."""


class Consumer:
    """Reads the records of several streams and remembers, per consumer ``group``, how
    far it got, so that the group's next consumer resumes there::

        with log.consumer("billing", ["orders", "refunds"]) as consumer:
            for stream, record in consumer:   # waits for new records, forever
                handle(stream, record)        # positions auto-committed every 5 s

    **Positions.** For each stream the consumer starts at the group's committed offset;
    a stream the group never committed starts at ``reset``: ``"earliest"`` (its start
    offset) or ``"latest"`` (its end offset: only new records). A committed offset
    below the start offset (the records were trimmed meanwhile) moves to the start
    offset, and one above the end offset (the stream was recreated) to ``reset``, with
    a warning, as Kafka's ``auto.offset.reset`` does (records already read ahead, the
    rest of a batch, may still be handed out after a trim). A stream that does not exist
    yet is waited for, without holding up the others, and read from offset 0 once it
    appears.

    **Delivery is at least once.** A record counts as consumed once it is handed out
    (returned by :meth:`poll` or yielded by iteration); :meth:`commit` stores, for every
    stream, the offset after the last record handed out. Commit *after* processing:
    then a crash loses nothing, and the records handed out since the last commit are
    delivered again to the group's next consumer (so make processing idempotent).
    Auto-commit (every ``auto_commit_interval_ms``; ``None`` disables it) keeps that
    rule: it runs at the start of :meth:`poll` (committing what earlier polls returned)
    and, when iterating, before the next record is handed out (once your loop body has
    finished with the previous one) - provided you finish processing a record before
    asking for more (no hand-off to other threads).

    **Closing.** :meth:`close` commits when auto-commit is enabled (Kafka's rule; pass
    ``commit=`` to decide) and makes further calls raise :class:`LogClosedError`.
    Leaving a ``with`` block by an exception closes *without* committing, so the record
    whose processing failed is delivered again. The consumer does not close its log.

    **Groups.** A group is meant for one consumer at a time, or for several consumers of
    disjoint streams (commits merge per stream): there is no partition assignment or
    rebalancing, so two consumers of one stream in one group would both read every
    record. Consumers in different groups are independent.

    **Options.** ``reset`` as above; ``auto_commit_interval_ms`` (default 5000, ``None``
    to commit only by :meth:`commit`); ``poll_interval``, the longest pause between looks
    for new records while waiting (seconds, default 0.1); ``idle_timeout``, seconds
    without a record after which iteration ends (default ``None``: never).

    A consumer is used from one thread; :meth:`close` may be called from another to end
    a waiting :meth:`poll` or iteration (that commit counts the record being processed
    at that moment as done - close from the consuming thread to be strict).
    """

    def __init__(
        self,
        log: AbstractLog,
        group: str,
        streams: Iterable[str],
        *,
        reset: str = "earliest",
        auto_commit_interval_ms: float | None = 5000,
        poll_interval: float = 0.1,
        idle_timeout: float | None = None,
    ) -> None:
        if isinstance(streams, (str, bytes)):
            raise ConfigError(f"streams must be a list of stream names, not one: use [{streams!r}]")
        if not isinstance(streams, Iterable):
            raise ConfigError(f"streams must be a list of stream names, not {streams!r}")
        if not isinstance(reset, str) or reset not in RESETS:
            raise ConfigError(f"reset={reset!r} is unknown; choose 'earliest' or 'latest'")
        auto_commit = _optional_seconds(auto_commit_interval_ms, "auto_commit_interval_ms")
        self._poll_interval = check_seconds(poll_interval, "poll_interval")
        self._idle_timeout = _optional_seconds(
            idle_timeout, "idle_timeout", zero=True, forever=True
        )
        # The log validates names: stream() the stream names, committed_offsets() the group.
        self._handles: dict[str, Stream] = {}
        for name in streams:
            handle = log.stream(name)  # a name first: anything else cannot be a dict key
            self._handles.setdefault(name, handle)
        if not self._handles:
            raise ConfigError("a consumer needs at least one stream")
        committed = log.committed_offsets(group)
        self._log = log
        self._group = group
        self._reset = reset
        self._names = list(self._handles)
        self._index = {name: i for i, name in enumerate(self._names)}
        self._next = 0  # index of the stream the next fetch starts with (round robin)
        self._missing: set[str] = set()  # streams that did not exist when last looked at
        self._committed = {n: committed[n] for n in self._names if n in committed}
        self._fetch_pos = {n: self._initial_position(n, committed.get(n)) for n in self._names}
        self._pending: deque[tuple[str, Record]] = deque()  # fetched, not handed out yet
        self._tails: dict[str, tuple[RecordBatch, int]] = {}  # batch read in part, next index
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closed = False
        self._forked_from: int | None = None  # in a fork child: the parent's pid
        self._auto_commit_s = None if auto_commit is None else auto_commit / 1000.0
        self._next_auto_commit = (
            float("inf") if auto_commit is None else time.monotonic() + auto_commit / 1000.0
        )
        _LIVE.add(self)

    # ---------------------------------------------------------------- facts

    @property
    def group(self) -> str:
        """The consumer group whose committed positions this consumer resumes from and
        commits to."""
        return self._group

    @property
    def streams(self) -> list[str]:
        """The streams this consumer reads, in the order given (duplicates dropped)."""
        return list(self._names)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: polling, iterating and committing then
        raise :class:`~disklesslog.LogClosedError`."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Consumer group {self._group!r} of {self._names} on {self._log.url} ({state})>"

    def positions(self) -> dict[str, int]:
        """For every stream, the offset after the last record handed out (the next one
        this consumer hands out): what :meth:`commit` would store."""
        positions = dict(self._fetch_pos)
        seen: set[str] = set()
        for name, record in self._pending:
            if name not in seen:
                seen.add(name)
                positions[name] = record.offset
        return positions

    def committed(self) -> dict[str, int]:
        """The offsets the group has committed for this consumer's streams (by any process)."""
        stored = self._log.committed_offsets(self._group)
        return {name: stored[name] for name in self._names if name in stored}

    # -------------------------------------------------------------- reading

    def poll(self, max_records: int = 1000, timeout: float = 0.0) -> list[tuple[str, Record]]:
        """Up to ``max_records`` new ``(stream, record)`` pairs, in offset order per stream.

        Streams take turns, so a busy stream does not starve the others. When nothing is
        available, waits up to ``timeout`` seconds for a record (checking after 1 ms,
        then backing off to ``poll_interval``) and returns ``[]`` if none came. Runs a
        due auto-commit first, which covers the records earlier polls returned.
        """
        if type(max_records) is not int or max_records < 1:
            raise ConfigError("max_records must be a positive int")
        wait = check_seconds(timeout, "timeout", zero=True, forever=True)
        deadline = time.monotonic() + wait
        delay = min(0.001, self._poll_interval)
        while True:
            with self._lock:
                self._check_open()
                self._auto_commit_if_due()
                if self._pending:
                    return [
                        self._pending.popleft() for _ in range(min(max_records, len(self._pending)))
                    ]
                records = self._fetch(max_records)
            if records:
                return records
            left = deadline - time.monotonic()
            if left <= 0 or self._closing.wait(min(delay, left)):
                return []
            delay = min(delay * 2, self._poll_interval)

    def __iter__(self) -> Iterator[tuple[str, Record]]:
        """Yield ``(stream, record)`` pairs as they arrive, forever, or until
        :meth:`close` or ``idle_timeout`` seconds without a record."""
        self._check_open()
        return self._iterate()

    def _iterate(self) -> Iterator[tuple[str, Record]]:
        pending = self._pending
        idle_since = time.monotonic()
        delay = min(0.001, self._poll_interval)
        while not self._closed:
            if pending:
                if time.monotonic() >= self._next_auto_commit:
                    with self._lock:
                        if self._closed:
                            return
                        self._auto_commit_if_due()  # the records yielded so far are done
                yield pending.popleft()
                continue
            with self._lock:
                if self._closed:
                    return
                self._auto_commit_if_due()
                pending.extend(self._fetch(ITER_FETCH_RECORDS))
            now = time.monotonic()
            if pending:
                idle_since = now
                delay = min(0.001, self._poll_interval)
                continue
            wait = delay
            if self._idle_timeout is not None:
                left = self._idle_timeout - (now - idle_since)
                if left <= 0:
                    return
                wait = min(wait, left)
            if self._closing.wait(wait):
                return
            delay = min(delay * 2, self._poll_interval)

    def seek(self, stream: str, offset: int) -> None:
        """Hand out ``stream``'s records from ``offset`` next (forwards or backwards).

        ``offset`` must lie in the stream's ``[start_offset, end_offset]``
        (:class:`OffsetOutOfRange` otherwise); the stream must exist. Takes effect for
        :meth:`commit` too.
        """
        self._check_open()
        if stream not in self._handles:
            raise ConfigError(f"{stream!r} is not one of this consumer's streams {self._names}")
        if type(offset) is not int:
            raise ConfigError(f"offset must be an int, not {type(offset).__name__}")
        start, end = self._handles[stream].start_offset, self._handles[stream].end_offset
        if not start <= offset <= end:
            raise OffsetOutOfRange(
                f"cannot seek {stream!r} to {offset}: choose an offset in {start}..{end}",
                start_offset=start,
                end_offset=end,
            )
        with self._lock:
            self._check_open()
            kept = [item for item in self._pending if item[0] != stream]
            self._pending.clear()
            self._pending.extend(kept)
            self._tails.pop(stream, None)
            self._fetch_pos[stream] = offset
            self._missing.discard(stream)

    # ----------------------------------------------------------- committing

    def commit(self) -> dict[str, int]:
        """Store :meth:`positions` as the group's offsets, for every stream that exists,
        and return what was stored. Call it after processing the records handed out."""
        with self._lock:
            self._check_open()
            return self._commit(changed_only=False)

    def close(self, *, commit: bool | None = None) -> None:
        """Stop: commit (by default only when auto-commit is enabled, as Kafka does), end
        any waiting poll or iteration, and make further calls raise
        :class:`LogClosedError`. Idempotent. The log stays open."""
        if self._closed:
            return
        self._closing.set()
        with self._lock:
            if self._closed:
                return
            try:
                if self._auto_commit_s is not None if commit is None else commit:
                    if self._log.closed:
                        _log.warning(
                            "consumer group %r: its log %s was closed first; positions %s "
                            "were not committed",
                            self._group,
                            self._log.url,
                            self.positions(),
                        )
                    else:
                        self._commit(changed_only=True)
            finally:
                self._closed = True
                self._pending.clear()
                self._tails.clear()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(commit=None if exc_type is None else False)

    # ------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._forked_from is not None:
            raise ForkedError(
                f"this consumer of group {self._group!r} was made by process "
                f"{self._forked_from} before it forked; make a consumer in this process"
            )
        if self._closed:
            raise LogClosedError(f"consumer of group {self._group!r} is closed")

    def _forked(self) -> None:
        """In a fork child (:mod:`disklesslog.forks`): the consumer is the parent's. Two
        processes handing out the same records from one position, and committing it,
        would each process what the other does: here it is closed without committing,
        and every call raises :class:`ForkedError`."""
        self._forked_from = os.getppid()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closing.set()
        self._closed = True
        self._pending.clear()
        self._tails.clear()

    def _initial_position(self, name: str, committed: int | None) -> int:
        handle = self._handles[name]
        try:
            start, end = handle.start_offset, handle.end_offset
        except StreamNotFound:
            self._missing.add(name)
            return 0 if committed is None else committed
        if committed is None:
            return start if self._reset == "earliest" else end
        return self._in_range(name, committed, start, end)

    def _in_range(self, name: str, position: int, start: int, end: int) -> int:
        """``position`` moved into ``[start, end]`` as Kafka's auto.offset.reset does."""
        if position < start:
            _log.warning(
                "consumer group %r: offset %d of stream %r was trimmed (the stream starts "
                "at %d); records %d..%d are lost to this group, resuming at %d",
                self._group,
                position,
                name,
                start,
                position,
                start - 1,
                start,
            )
            return start
        if position > end:
            moved = start if self._reset == "earliest" else end
            _log.warning(
                "consumer group %r: offset %d of stream %r is past its end offset %d (was "
                "the stream recreated?); resetting to %s offset %d",
                self._group,
                position,
                name,
                end,
                self._reset,
                moved,
            )
            return moved
        return position

    def _fetch(self, limit: int) -> list[tuple[str, Record]]:
        """Read up to ``limit`` records, streams taking turns: each pass gives every
        stream that still has records an equal share of what is left (lock held)."""
        names = self._names
        first = self._next
        active = names[first:] + names[:first]
        out: list[tuple[str, Record]] = []
        remaining = limit
        last_served = -1
        while remaining > 0 and active:
            share = max(1, remaining // len(active))
            more = []
            for name in active:
                if remaining <= 0:
                    break
                wanted = min(share, remaining)
                got = self._read(name, wanted, out)
                remaining -= got
                if got:
                    last_served = self._index[name]
                if got == wanted:
                    more.append(name)
            active = more
        if last_served >= 0:
            self._next = (last_served + 1) % len(names)
        return out

    def _read(self, name: str, limit: int, out: list[tuple[str, Record]]) -> int:
        """Append up to ``limit`` records of ``name`` to ``out``; return how many.

        Reads lazily and keeps the unread tail of the last batch for the next fetch, so
        small polls do not decode a large batch again for every slice of it.
        """
        count = 0
        tail = self._tails.pop(name, None)
        if tail is not None:
            count = self._take(name, tail[0], tail[1], limit, out)
            if count == limit:
                return count
        for _attempt in range(2):
            position = self._fetch_pos[name]
            try:
                batches = self._handles[name].read_batches(position)
                try:
                    for batch in batches:
                        if len(batch):
                            count += self._take(name, batch, 0, limit - count, out)
                            if count == limit:
                                break
                finally:
                    close = getattr(batches, "close", None)
                    if close is not None:
                        close()  # release what a lazy read holds open
            except StreamNotFound:
                self._missing.add(name)
                break
            except OffsetOutOfRange as exc:
                self._missing.discard(name)
                if count:
                    break  # keep what was read; the next fetch sees the new range
                self._fetch_pos[name] = self._in_range(
                    name, position, exc.start_offset, exc.end_offset
                )
                continue
            self._missing.discard(name)
            break
        return count

    def _take(
        self, name: str, batch: RecordBatch, index: int, limit: int, out: list[tuple[str, Record]]
    ) -> int:
        """Append up to ``limit`` records of ``batch`` from ``index`` to ``out``, advance
        the stream's position past them and keep the rest as its tail; return how many."""
        end = min(len(batch), index + limit)
        if index or end < len(batch):
            part = RecordBatch(
                batch.offsets[index:end],
                batch.timestamps[index:end],
                batch.keys[index:end],
                batch.values[index:end],
                batch.headers[index:end],
            )
        else:
            part = batch
        out.extend(zip(repeat(name), part.records()))
        self._fetch_pos[name] = batch.offsets[end - 1] + 1
        if end < len(batch):
            self._tails[name] = (batch, end)
        return end - index

    def _auto_commit_if_due(self) -> None:
        """Commit changed positions if the auto-commit interval has passed (lock held)."""
        if self._auto_commit_s is None:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self._auto_commit_s
        self._commit(changed_only=True)

    def _commit(self, *, changed_only: bool) -> dict[str, int]:
        """Commit positions of existing streams (only those that changed since this
        consumer last committed, if ``changed_only``) and return them (lock held)."""
        offsets = {
            name: position
            for name, position in self.positions().items()
            if name not in self._missing
            and not (changed_only and self._committed.get(name) == position)
        }
        if not offsets:
            return {}
        try:
            self._log.commit_offsets(self._group, offsets)
        except StreamNotFound:  # one was deleted since we last looked: commit the rest
            existing = set(self._log.streams())
            self._missing.update(name for name in offsets if name not in existing)
            offsets = {name: pos for name, pos in offsets.items() if name in existing}
            if offsets:
                self._log.commit_offsets(self._group, offsets)
        self._committed.update(offsets)
        return offsets


def _optional_seconds(value: object, what: str, **rule: bool) -> float | None:
    """``None``, or ``value`` checked by :func:`~disklesslog.api.check_seconds`."""
    return None if value is None else check_seconds(value, what, **rule)


_LIVE: weakref.WeakSet[Consumer] = reset_after_fork(lambda consumer: consumer._forked())
