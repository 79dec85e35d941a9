"""Per-process state of one local stream: its lock, state record, segments and active file.

Several processes may append to one stream. They serialise on ``flock`` of the
stream's state file and agree through that file's 48-byte record (see
:class:`~disklesslog.segments.layout.StreamState`). The append path costs five system
calls: lock, read the state record, find the active file's size, write the entry,
unlock. A changed state record or size means another process wrote; this process then
catches up by scanning only the new bytes.

Readers never take the lock on the normal path: they see complete entries only (a
short entry at the tail is "not yet written"), and escalate to the lock only when the
tail looks damaged, because only a lock holder may decide that bytes are garbage left
by a crash and truncate them.

Key compaction replaces closed segment files under the lock (:mod:`.swap`). A
lock-free reader therefore lists the directory only while no swap is under way, and
checks afterwards that the state record did not change while it looked; on compacted
streams a cached :class:`Segment` is reused only while its file has the same inode.

A store holds two descriptors (the state file, which is also the lock, and the active
segment). A process with many streams *parks* the stores it has not used lately
(:meth:`StreamStore.park`): their descriptors are closed and their view of the files is
kept, so the next call reopens the two files and goes on as after any other pause,
catching up with what other processes did meanwhile: no recovery scan, no sync. The
view is trusted again only if the files are the ones it was built from
(:meth:`StreamStore._reopen`); otherwise the stream was deleted (and perhaps created anew) and
the store is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import random
import threading
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from ..config import StreamConfig
from ..errors import (
    CorruptDataError,
    DataLossError,
    IncompleteBatchError,
    LogClosedError,
    OffsetOutOfRange,
)
from ..forks import reset_after_fork
from ..format import TAIL, EncodedBatch
from ..metrics import Metrics
from ..storage.atomic import fsync_directory
from . import loss, swap
from .layout import (
    CONFIG,
    FLAG_DELETED,
    FLAG_SWAPPING,
    FLAG_UNSYNCED,
    INTENT,
    LOG_SUFFIX,
    LOST_SUFFIX,
    SEGMENT_FILES,
    STATE,
    STATE_COPY,
    STATE_SIZE,
    StreamState,
    close_lock,
    close_quietly,
    list_segments,
    open_lock,
    read_state_copy,
    segment_name,
    write_state_copy,
)
from .segment import (
    CHECK,
    ENTRY_PREFIX,
    ENTRY_PREFIX_SIZE,
    NO_TIMESTAMP,
    PEEK,
    Segment,
)

__all__ = ["FSYNC_POLICIES", "Repair", "Snapshot", "StreamGone", "StreamStore", "flag_deleted"]

log = logging.getLogger("disklesslog")

FSYNC_POLICIES = ("always", "interval", "never")
_U32_MAX = (1 << 32) - 1
_MAX_TS = (1 << 63) - 1
_IOV_CHUNK = 512  # iovecs per writev, well under IOV_MAX (1024 on Linux)
_POISON = b"\xff" * ENTRY_PREFIX_SIZE
"""Written over the base offset of a failed append's first entry when the append cannot
be cut off: no offset is 2**64 - 1, so the entry breaks the chain of base offsets, and a
corrupt entry after the recovery point is a leftover that recovery cuts."""


class StreamGone(Exception):
    """Internal: the stream was deleted (by this or another process) under this store."""


class _NeedsLock(Exception):
    """Internal: an unlocked refresh met something only a lock holder may repair."""


class Repair(NamedTuple):
    """What an operator allows one recovery to do that recovery never does on its own
    (``SegmentLog.repair``): accept the loss of acknowledged records, or take the start
    offset from the operator when the state record and its copy are both unreadable."""

    accept_data_loss: bool = False
    start_offset: int | None = None


class _Cut(NamedTuple):
    """The bytes of a failed append that could not be cut off at once (``ftruncate``
    failed too): from byte ``position`` (at most to ``end``) of segment ``base``, the
    first entry's batch header being ``header``. Recovery cuts them before anything else
    happens, if they are still the last thing in the file (:meth:`StreamStore._apply_cut`)."""

    base: int
    position: int
    end: int
    header: bytes


class _Unroll(NamedTuple):
    """A failed append spread over segments whose state record could not be written
    back at once (:meth:`StreamStore._unroll`): ``restore`` (the record from before the
    append, with a new generation) is written back, and then ``cut`` made, if the record
    still names one of the append's segments, that segment is at most as long as the
    append may have left it (``bounds``: base and size), and the start offset is still
    ``start_offset``; otherwise another process built on the append's records since."""

    restore: bytes
    start_offset: int
    bounds: tuple[tuple[int, int], ...]
    cut: _Cut | None


_PENDING: dict[str, _Cut | _Unroll] = {}
"""What this process owes to take failed appends back, by stream directory (absolute
path). Kept here rather than on the store: it outlives a store that failed to make it
(its log was closed, and closing failed too), so a log this process opens again at the
same path makes it before anything else."""


def _forked_process() -> None:
    """In a fork child: what this process owed to take failed appends back is the
    parent's debt (it pays it at its next lock; paying it here too could cut what the
    parent wrote meanwhile, were the checks that guard a cut ever wrong)."""
    _PENDING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_process)


class Snapshot(NamedTuple):
    """A consistent view for one read: extent plus each segment and the byte end to read."""

    start_offset: int
    end_offset: int
    segments: list[tuple[Segment, int]]


class StreamStore:
    """One stream's files as this process sees them. Thread-safe."""

    def __init__(
        self,
        directory: Path,
        name: str,
        config: StreamConfig,
        fsync: str,
        metrics: Metrics,
        *,
        hold: Callable[[str], int | None] | None = None,
        repair: Repair | None = None,
        on_open: Callable[[StreamStore], None] | None = None,
    ) -> None:
        self.name = name
        # Told when a parked store opens its files again (the log counts open stores).
        self._on_open = on_open
        self._parked = False
        # Which files the view belongs to (see _reopen): the state file's device, inode
        # and change time when first parked or last reopened, stream.json's when the
        # store opened.
        self._state_id: tuple[int, int, int] | None = None
        self._config_id: tuple[int, int, int] | None = None
        self.used = True
        """Set by every call; the log clears it to find stores not used lately."""
        self.pins = 0
        """Calls in progress through the log (changed under the log's lock): a store
        with pins is never parked."""
        self._repair = repair
        self.repairs: list[str] = []
        """What the recovery run with ``repair`` did, one line each."""
        # The lowest offset a two-phase commit in progress holds back from readers (see
        # segments/transactions.py), asked after the end offset is read.
        self._hold = hold
        self.metrics = metrics
        # Append counters, updated under the mutex (cheaper than Metrics on this path).
        self.appended_batches = 0
        self.appended_records = 0
        self.appended_bytes = 0
        self.directory = directory
        self.config = config
        self._fsync = fsync
        self._mutex = threading.RLock()
        self._closed = False
        self._unsynced = False
        # A failure left this process's view and the files apart (an append taken back,
        # a roll or trim cut short): the next call runs recovery first (see _refresh).
        self._broken = False
        self._key = os.path.abspath(directory)  # in _PENDING
        self._segments: list[Segment] = []
        self._active_fd = -1
        self._state = StreamState()
        self._state_raw = b""
        self._lock_held = False  # _locked() is reentrant (see there)
        self._state_path = os.path.join(directory, STATE)
        try:
            self._lock_fd = os.open(self._state_path, os.O_RDWR)
        except FileNotFoundError:
            raise StreamGone(name) from None
        try:
            self._config_id = _identity(os.stat(directory / CONFIG))
            with self._mutex, self._locked():
                self._recover()
        except BaseException:
            self._close_fds()
            raise
        self._repair = None  # allowed once, for the recovery it was given to
        _LIVE.add(self)

    # --------------------------------------------------------------- helpers

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this stream's lock (this process's mutex and the file lock), for a change
        that appends, trims and compactions in any process must not interleave with."""
        with self._mutex:
            self._attach()
            with self._locked():
                yield

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Reentrant, so that trim() may run inside locked() (tiering moves the manifest
        # and the start offset under one hold). Every caller holds the mutex, so the
        # flag is only ever seen by the thread that set it.
        if self._lock_held:
            yield
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self._lock_held = True
        try:
            yield
        finally:
            self._lock_held = False
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @property
    def durable(self) -> bool:
        """Whether the fsync policy syncs at all (anything but ``"never"``)."""
        return self._fsync != "never"

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"stream {self.name!r} is closed")

    # ---------------------------------------------------------------- parking

    def park(self) -> bool:
        """Close this store's descriptors if nothing uses it now; whether it did.

        Never waits: a store another thread is in (an append, a read's snapshot, a
        sync), whose lock is held, or that has pins, is left open. The view of the
        files stays; unsynced appends stay unsynced (the fsync thread and
        :meth:`close` sync a parked store through descriptors of their own)."""
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            if self._closed or self._parked or self._lock_held or self.pins:
                return False
            self._release()
            self._parked = True
            return True
        finally:
            self._mutex.release()

    def _forked(self) -> None:
        """In a fork child (:mod:`disklesslog.forks`): the descriptors are copies of the
        parent's, and one open file description holds one ``flock`` for both processes,
        so through them the child would append while the parent holds the stream lock
        (both writing at the same offset). The copies are closed (which releases
        nothing of the parent's) and the store parked: its next use opens descriptors
        of the child's own. A thread of the parent may have been changing the view when
        the fork came, so the view is rebuilt from the files under the lock first, as
        after a failure of this process's own."""
        self._mutex = threading.RLock()
        self._lock_held = False
        self.pins = 0
        if self._closed:
            return
        if self._state_id is None and self._lock_fd >= 0:
            try:
                self._state_id = _identity(os.fstat(self._lock_fd))
            except OSError:
                self._state_id = (0, 0, 0)  # reopening then finds the stream gone
        # A parked store holds descriptors too while a thread syncs or closes it.
        for fd in (self._active_fd, self._lock_fd):
            if fd >= 0:
                close_quietly(fd)
        self._active_fd = self._lock_fd = -1
        self._parked = True
        self._broken = True

    @property
    def parked(self) -> bool:
        """Whether the store's descriptors are closed until its next use."""
        return self._parked

    def _attach(self) -> None:
        """Before a call uses the files (mutex held): mark the store used and reopen a
        parked one, telling the log (which may park others)."""
        self.used = True
        if not self._parked:
            return
        self._check_open()
        self._reopen()
        self._parked = False
        if self._on_open is not None:
            self._on_open(self)

    @contextlib.contextmanager
    def _descriptors(self) -> Iterator[None]:
        """The files open for one call of the store's own (mutex held): a sync or a close
        of a parked store opens them for the call alone and stays parked."""
        if not self._parked:
            yield
            return
        self._reopen()
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        """Close the descriptors (mutex held, lock not held), first recording which
        state file the view belongs to unless the last reopen did. A failed close loses
        nothing: the lock is not held, and appends not synced yet are synced through
        the file's next descriptor, whose first sync reports a write-back error no
        descriptor has reported."""
        if self._state_id is None:
            try:
                self._state_id = _identity(os.fstat(self._lock_fd))
            except OSError:
                self._state_id = (0, 0, 0)  # reopening then finds the stream gone
        fds = self._active_fd, self._lock_fd
        self._active_fd = self._lock_fd = -1
        for fd in fds:
            if fd >= 0:
                try:  # noqa: SIM105 (a suppress() per close costs as much as the close)
                    os.close(fd)
                except OSError:
                    pass

    def _reopen(self) -> None:
        """Open the state and active files of a parked store again (mutex held).

        :class:`StreamGone` if they are not the files the view was built from: the
        state file is another inode, or it was written since the store was last
        reopened (or first parked) and ``stream.json`` is not the one the store opened
        with (a stream deleted and
        created again has new files of both; the same inode numbers for both, the new
        ``stream.json`` made within the old one's clock tick, is what it would take to
        look the same). ``alter_stream`` replaces ``stream.json`` too, so after one the
        store may be found gone and opened afresh: slower, never wrong.

        If the state record changed meanwhile (another process appended, rolled,
        trimmed...), the next refresh catches up as it would after any pause; if the
        active file itself went (trimmed away by another process), the next call runs
        recovery under the lock, which rebuilds the view from the files."""
        try:
            lock_fd = os.open(self._state_path, os.O_RDWR)
        except FileNotFoundError:
            raise StreamGone(self.name) from None
        active_fd = -1
        try:
            stat = os.fstat(lock_fd)
            state = stat.st_dev, stat.st_ino, stat.st_ctime_ns
            unchanged = state == self._state_id
            if not unchanged:
                self._check_files(state)
            self._state_id = state
            active = self._segments[-1]
            try:  # noqa: SIM105 (a suppress() costs as much as the open: the hot path)
                active_fd = os.open(active.log_path, os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                pass
            # The state record is untouched since the store was parked: nothing rolled,
            # trimmed, swapped or truncated, so this is the file the view knows.
            if not unchanged and active_fd >= 0 and os.fstat(active_fd).st_ino != active.inode:
                close_quietly(active_fd)
                active_fd = -1
        except BaseException:
            close_quietly(lock_fd)
            if active_fd >= 0:
                close_quietly(active_fd)
            raise
        self._lock_fd, self._active_fd = lock_fd, active_fd
        if active_fd < 0:
            self._broken = True

    def _check_files(self, state: tuple[int, int, int]) -> None:
        """:class:`StreamGone` unless the state file (``state``: device, inode, change
        time), written since the store was last reopened, and ``stream.json`` are still
        the files the store opened with (see :meth:`_reopen`)."""
        known = self._state_id
        if known is None or state[:2] != known[:2]:
            raise StreamGone(self.name)
        if _identity(os.stat(self.directory / CONFIG)) != self._config_id:
            raise StreamGone(self.name)

    def _write_state(self, state: StreamState, *, sync: bool = False, copy: bool = False) -> None:
        """Write the state record; with ``copy`` (the start offset or the active segment
        changed) then its copy too, so damage to either file cannot lose them."""
        raw = state.encode()
        if os.pwrite(self._lock_fd, raw, 0) != len(raw):
            raise OSError(f"short write to {self.directory / STATE}")
        if sync:
            os.fsync(self._lock_fd)
        self._state, self._state_raw = state, raw
        if copy:
            write_state_copy(self.directory, state, sync=sync)

    def _recovered(self) -> StreamState:
        """The state with the recovery point moved to the end of the active segment."""
        active = self._segments[-1]
        return self._recovery_moved(self._state, active.size, active.end_offset)

    def _recovery_moved(self, state: StreamState, position: int, offset: int) -> StreamState:
        """``state`` with the recovery point at ``position``/``offset`` (the data before
        it synced, unless the policy is "never", which the flag records)."""
        flags = state.flags | FLAG_UNSYNCED if not self.durable else state.flags & ~FLAG_UNSYNCED
        return replace(state, recovery_position=position, recovery_offset=offset, flags=flags)

    def _new_segment(self, base: int) -> Segment:
        return Segment(
            self.directory,
            base,
            self.config.index_interval_bytes,
            compacted=self.config.compacted,
        )

    def _remove_segment_files(self, base: int) -> None:
        # The .log goes last: a failure leaves it, so recovery (which lists .log files)
        # finds the segment and removes it again with everything beside it.
        for suffix in reversed(SEGMENT_FILES):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / segment_name(base, suffix))

    def _close_fds(self) -> None:
        for fd in (self._active_fd, getattr(self, "_lock_fd", -1)):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._active_fd = -1
        self._lock_fd = -1

    # --------------------------------------------------------------- recovery

    def _recover(self) -> None:
        """Bring the stream to a consistent state after any crash (caller holds the lock).

        Deletes leftovers of a crashed roll (segments newer than the active one) or
        trim (closed segments below the start offset), verifies the active segment from
        the recovery point, truncates a torn or corrupt tail, and records the new
        recovery point. Also what this process runs after a failure of its own left its
        view and the files apart (``_broken``): a failure is treated as a crash, except
        that the bytes of a failed append that could not be cut then are cut first.
        Until a recovery completes, every call on the stream runs it again.
        """
        pending = _PENDING.get(self._key)
        if pending is not None:
            if isinstance(pending, _Unroll):
                self._apply_unroll(pending)
            else:
                self._apply_cut(pending)
            if _PENDING.get(self._key) is pending:
                del _PENDING[self._key]
        raw = os.pread(self._lock_fd, STATE_SIZE, 0)
        copy, copy_exists = read_state_copy(self.directory)
        state = self._agreed_state(StreamState.decode(raw), copy, copy_exists)
        if state.deleted:
            raise StreamGone(self.name)
        state = self._recover_swap(state)
        bases = list_segments(self.directory)
        for base in bases:
            if base > state.active_segment:
                log.warning(
                    "removing segment %d of %r left by an interrupted roll", base, self.name
                )
                self._remove_segment_files(base)
        bases = [base for base in bases if base <= state.active_segment]
        if not bases or bases[-1] != state.active_segment:
            bases.append(state.active_segment)
        for base, next_base in itertools.pairwise(bases):
            if next_base <= state.start_offset:  # left by an interrupted trim
                self._remove_segment_files(base)
        # A marker beside the active segment is a leftover of accepting a loss that a
        # crash cut short (format 2.11): it describes no gap, so it must not linger.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / segment_name(state.active_segment, LOST_SUFFIX))
        closed = self._closed_segments(bases, state, locked=True)
        before_loss = state
        try:
            segment, fd, truncated = self._open_active(state, recovering=True, locked=True)
        except DataLossError as exc:
            unsynced = bool(state.flags & FLAG_UNSYNCED)
            if not unsynced and (self._repair is None or not self._repair.accept_data_loss):
                raise
            state = self._accept_loss(state, exc, by_policy=unsynced)
            closed = self._closed_segments(list_segments(self.directory), state, locked=True)
            segment, fd, truncated = self._open_active(state, recovering=True, locked=True)
        self._install(state, raw, closed, segment, fd)
        self._sync_data()
        new = replace(self._recovered(), generation=state.generation + int(truncated))
        stale = copy is None or (copy.start_offset, copy.active_segment) != (
            new.start_offset,
            new.active_segment,
        )
        # An accepted loss moves the state on: a copy that matched the state before it
        # is behind by construction, not damaged, and is rewritten without a warning.
        expected = copy is not None and (copy.start_offset, copy.active_segment) == (
            before_loss.start_offset,
            before_loss.active_segment,
        )
        if stale and copy_exists and not (state is not before_loss and expected):
            log.warning(
                "stream %r: rewriting %s, which was damaged or behind", self.name, STATE_COPY
            )
        self._write_state(new, sync=self._fsync != "never", copy=stale)
        self._broken = False

    def _agreed_state(
        self, state: StreamState | None, copy: StreamState | None, copy_exists: bool
    ) -> StreamState:
        """The state recovery starts from, given the record and its copy.

        The record decides, but the start offset is the later of the two (trims only
        move it forward, and a trim writes the record before the copy). An unreadable
        record is restored from the copy; if both are unreadable the start offset is
        lost, and rather than guess (the oldest segment's base would bring back records
        a user trimmed, perhaps to delete them) this is :class:`CorruptDataError`, until
        an operator names the start offset (:class:`Repair`).
        """
        path = self.directory / STATE
        if state is not None:
            if copy is not None and copy.start_offset > state.start_offset:
                log.warning(
                    "stream %r: %s has start offset %d, %s %d: taking the later",
                    self.name,
                    STATE_COPY,
                    copy.start_offset,
                    STATE,
                    state.start_offset,
                )
                return replace(state, start_offset=copy.start_offset)
            return state
        bases = list_segments(self.directory)
        if copy is not None:
            log.warning(
                "stream %r: %s is unreadable; restoring it from %s", self.name, STATE, STATE_COPY
            )
            start = copy.start_offset
        elif self._repair is not None and self._repair.start_offset is not None:
            start = self._repair.start_offset
            self.repairs.append(
                f"{self.name}: {STATE} and {STATE_COPY} were unreadable; start offset set to "
                f"{start} as given"
            )
            log.warning("stream %r: %s", self.name, self.repairs[-1])
        else:
            lowest = f"the oldest segment starts at {bases[0]}" if bases else "it has no segments"
            damage = "is unreadable" if copy_exists else "is missing"
            raise CorruptDataError(
                f"the stream's state record is unreadable and its copy ({STATE_COPY}) "
                f"{damage}: the start offset is lost ({lowest}; records below the start "
                "offset were trimmed and must not come back). If you know it, repair with "
                f"SegmentLog.repair({self.name!r}, start_offset=N); see docs/operations.md",
                source=str(path),
            ) from None
        # Never delete files on the word of a copy: the newest segment stays the active
        # one, with the copy's recovery point only if the copy names it.
        active = bases[-1] if bases else (copy.active_segment if copy is not None else 0)
        state = StreamState(
            generation=random.getrandbits(62),
            start_offset=max(start, bases[0]) if bases else start,
            active_segment=active,
            recovery_offset=active,
        )
        if copy is not None and copy.active_segment == active:
            state = replace(
                state,
                recovery_offset=copy.recovery_offset,
                recovery_position=copy.recovery_position,
                flags=copy.flags & FLAG_UNSYNCED,
            )
        return state

    def _accept_loss(
        self, state: StreamState, exc: DataLossError, *, by_policy: bool
    ) -> StreamState:
        """Make the offsets ``exc`` says are lost an accepted gap (lock held): they are
        never handed out again. The active segment keeps its verified entries and is
        closed; the lost offsets become an empty closed segment with a ``.lost`` marker
        (``docs/format.md`` 2.11); appends go on in a new active segment after them.

        Accepted by an operator (:class:`Repair`), or ``by_policy``: the recovery point
        was written under fsync "never", whose data an OS crash may lose.

        Until the state record names the new active segment nothing is decided: a crash
        before leaves newer segment files, which recovery removes as an interrupted
        roll's, and finds the loss again.
        """
        if exc.lost is None or exc.position is None:
            raise exc  # not a loss this store found: nothing to accept
        first, end = exc.lost
        reason = loss.BY_POLICY if by_policy else loss.BY_OPERATOR
        name = segment_name(state.active_segment, LOG_SUFFIX)
        loss.make_gap(
            self.directory,
            state.active_segment,
            exc.position,
            first,
            end,
            reason,
            sync=self._fsync != "never",
        )
        state = replace(
            state,
            generation=state.generation + 1,
            active_segment=end,
            recovery_position=0,
            recovery_offset=end,
        )
        self._write_state(state, sync=self._fsync != "never", copy=True)
        self.repairs.append(
            f"{self.name}: offsets {first} to {end - 1} were lost from {name} ({reason}); "
            f"reads skip them, appends go on at offset {end}"
        )
        log.error("stream %r: %s", self.name, self.repairs[-1])
        return state

    def _recover_swap(self, state: StreamState) -> StreamState:
        """Finish a compaction swap a crash interrupted (its intent is present), or
        delete the draft of a crashed compactor (no intent); returns the state with
        the swapping flag cleared and a new generation if a swap was finished."""
        sync = self._fsync != "never"
        intent = swap.read_intent(self.directory)
        if intent is None:
            swap.discard_draft(self.directory)
            if not state.swapping:
                return state
        else:
            log.warning("stream %r: finishing an interrupted compaction swap", self.name)
            if not swap.finish(self.directory, intent, sync=sync):
                log.warning("stream %r: rolled the compaction swap back", self.name)
            swap.remove_intent(self.directory, sync=sync)
            swap.drop_staging(self.directory)
        return replace(state, generation=state.generation + 1, flags=state.flags & ~FLAG_SWAPPING)

    def _install(
        self, state: StreamState, raw: bytes, closed: list[Segment], active: Segment, fd: int
    ) -> None:
        """Switch this process's view to a new segment list, active file and state, all
        at once (so a failure while building them leaves the old view intact)."""
        old, self._active_fd = self._active_fd, fd
        self._segments = [*closed, active]
        self._state, self._state_raw = state, raw
        if old >= 0 and old != fd:
            os.close(old)  # gone even if this fails: never closed again

    def _closed_segments(
        self, bases: list[int], state: StreamState, *, locked: bool, verify: bool = False
    ) -> list[Segment]:
        """Segment objects for every segment but the last (active) one of ``bases``,
        skipping those wholly below the start offset. Each ends where the next starts.

        Known segments are reused; on a compacted stream (or with ``verify``) only
        while their file is still the same (inode and size), since compaction renames
        new files over old ones. A segment that vanishes meanwhile was trimmed (or
        merged away) by another process after this one read the state; without the
        lock that means "look again, with the lock".
        """
        known = {seg.base: seg for seg in self._segments[:-1]}
        check = verify or self.config.compacted
        segments = []
        for base, next_base in itertools.pairwise(bases):
            if next_base <= state.start_offset:
                continue
            seg = known.get(base)
            if seg is not None and check and _file_identity(seg.log_path) != (seg.inode, seg.size):
                seg = None
            if seg is None:
                seg = self._new_segment(base)
                try:
                    stat = os.stat(seg.log_path)
                except FileNotFoundError:
                    if locked:
                        raise
                    raise _NeedsLock from None
                seg.size, seg.inode = stat.st_size, stat.st_ino
            seg.end_offset = next_base
            segments.append(seg)
        return segments

    @staticmethod
    def _recovery_point(state: StreamState, base: int) -> tuple[int, int]:
        """(byte position, offset) up to which segment ``base`` was verified already."""
        if state.active_segment == base:
            return state.recovery_position, state.recovery_offset
        return 0, base

    def _open_active(
        self, state: StreamState, *, recovering: bool, locked: bool
    ) -> tuple[Segment, int, bool]:
        """Open ``state``'s active segment and learn its extent, without changing this
        store. Returns the segment, its open file, and whether a bad tail was truncated.

        ``recovering`` (on open, lock held) distrusts index entries after the recovery
        point and rewrites them; otherwise the index files are trusted, because live
        writers add entries only after complete batch entries.
        """
        seg = self._new_segment(state.active_segment)
        fd = os.open(seg.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            seg.inode = os.fstat(fd).st_ino
            size = os.lseek(fd, 0, os.SEEK_END)
            rp, rp_offset = self._recovery_point(state, seg.base)
            if rp > size:
                self._check_loss(seg, fd, size, rp, rp_offset)
                rp, rp_offset = 0, seg.base
            trusted = rp if recovering else size
            self._load_active_indexes(seg, size, trusted, rewrite=locked)
            if seg.size:
                seg.first_timestamp = _first_max_timestamp(fd)
            truncated = self._advance(
                seg, fd, size, rp, rp_offset, locked=locked, write_index=recovering
            )
        except BaseException:
            close_quietly(fd)
            raise
        return seg, fd, truncated

    def _check_loss(self, seg: Segment, fd: int, size: int, rp: int, rp_offset: int) -> None:
        """The active file is shorter than its recovery point: bytes that were verified
        (and synced, unless the policy is "never") are gone. If the entries it still
        holds end before the recovery point's offset, acknowledged records were lost:
        :class:`DataLossError` naming the file and the offsets, and nothing changed, for
        an operator to accept (``SegmentLog.repair``). Never truncate and go on: the
        next append would get an offset already acknowledged for another record."""
        scan = self._new_segment(seg.base)
        with contextlib.suppress(CorruptDataError):
            scan.walk(
                fd, size, mode=CHECK, max_batch_bytes=self.config.max_batch_bytes, index=False
            )
        if scan.end_offset < rp_offset:
            raise DataLossError(
                f"the file is {size} bytes, shorter than its recovery point ({rp} bytes, "
                f"offset {rp_offset}): storage lost data that was written and synced. "
                f"Offsets {scan.end_offset} to {rp_offset - 1} were acknowledged and are "
                f"gone. Reads and appends of stream {self.name!r} fail until an operator "
                f"accepts the loss with SegmentLog.repair({self.name!r}, "
                "accept_data_loss=True) (docs/operations.md); the lost offsets are never "
                "used again",
                source=str(seg.log_path),
                position=scan.size,
                lost=(scan.end_offset, rp_offset),
            )
        log.warning(
            "stream %r: %s is shorter (%d bytes) than its recovery point (%d) but holds "
            "its offsets; verifying all of it",
            self.name,
            seg.log_path.name,
            size,
            rp,
        )

    def _load_active_indexes(self, seg: Segment, size: int, trusted: int, *, rewrite: bool) -> None:
        """Load the active segment's indexes, keep the entries before byte ``trusted``, and
        position ``seg`` at the last kept entry (where scanning resumes).

        Entries past ``size`` belong to appends this process has not seen yet; they are
        left for a later refresh. ``rewrite`` (lock held) brings the files in line:
        dropped entries are cut and inconsistent files rebuilt; without the lock, an
        inconsistent file escalates.
        """
        index_ok = seg.index.load(max_key=_U32_MAX, max_value=size, strict=False)
        time_ok = seg.timeindex.load(max_key=_MAX_TS, max_value=_U32_MAX, strict=False)
        # The first .index entry always brings a .timeindex entry (2.4): an index with
        # entries beside an empty or missing time index lost it, and the max timestamp.
        if seg.index.keys and not seg.timeindex.keys:
            time_ok = False
        if not (index_ok and time_ok):
            if not rewrite:
                raise _NeedsLock
            log.warning("stream %r: rebuilding the indexes of %s", self.name, seg.log_path.name)
            keep = 0
        else:  # an entry *at* the trusted point describes an entry not verified yet
            keep = bisect_left(seg.index.values, trusted)
        pos, rel = (seg.index.values[keep - 1], seg.index.keys[keep - 1]) if keep else (0, 0)
        time_keep = bisect_right(seg.timeindex.values, rel) if keep else 0
        # Rewritten too when something follows the counted entries (a crash between an
        # entry and its header): sealed as is, that would make the closed index invalid.
        if rewrite and (keep < len(seg.index) or not index_ok or not seg.index.tidy):
            seg.index.truncate(keep)
        if rewrite and (time_keep < len(seg.timeindex) or not time_ok or not seg.timeindex.tidy):
            seg.timeindex.truncate(time_keep)
        seg.size, seg.end_offset = pos, seg.base + rel
        seg.max_timestamp = seg.timeindex.keys[time_keep - 1] if time_keep else NO_TIMESTAMP

    def _advance(
        self,
        seg: Segment,
        fd: int,
        size: int,
        rp: int,
        rp_offset: int,
        *,
        locked: bool,
        write_index: bool,
    ) -> bool:
        """Account for the entries from ``seg.size`` to byte ``size``; True if it truncated.

        Entries before the recovery point (``rp``, where offset ``rp_offset`` starts)
        were verified already: they are only peeked (no checksum), and never truncated;
        damage there is logged and left for reads to report as :class:`CorruptDataError`.
        Entries after it are checksummed. At a torn or corrupt one, a lock holder
        truncates the file (a crash left it); an unlocked reader stops at a short entry
        (still being written) and escalates a corrupt one with :class:`_NeedsLock`.
        """
        source = str(seg.log_path)
        max_batch_bytes = self.config.max_batch_bytes
        if seg.size < rp <= size:
            try:
                seg.walk(fd, rp, mode=PEEK, max_batch_bytes=max_batch_bytes, index=write_index)
                if seg.end_offset != rp_offset:
                    raise CorruptDataError(
                        f"entries reach offset {seg.end_offset}, the recovery point says "
                        f"{rp_offset}",
                        source=source,
                        position=rp,
                    )
            except CorruptDataError as exc:
                log.error("stream %r: %s; reads of the damaged records will fail", self.name, exc)
                seg.size, seg.end_offset, seg.max_timestamp = rp, rp_offset, _MAX_TS
        try:
            seg.walk(fd, size, mode=CHECK, max_batch_bytes=max_batch_bytes, index=write_index)
        except CorruptDataError as exc:
            if not locked:
                if isinstance(exc, IncompleteBatchError):
                    return False
                raise _NeedsLock from None
            log.warning(
                "stream %r: truncating %d bytes after the last complete entry of %s (%s)",
                self.name,
                size - seg.size,
                seg.log_path.name,
                exc.reason,
            )
            os.ftruncate(fd, seg.size)
            self.metrics.add("truncated_tails")
            return True
        return False

    def _delete_closed_below(self, start_offset: int) -> None:
        """Delete closed segments whose every offset is below ``start_offset``."""
        while len(self._segments) > 1 and self._segments[0].end_offset <= start_offset:
            seg = self._segments.pop(0)
            self._remove_segment_files(seg.base)

    # ------------------------------------------------------------ catching up

    def _refresh(self, *, locked: bool) -> None:
        """Catch up with what other processes did since this one last looked (after a
        failure of this process's own, recover: see :meth:`_recover`)."""
        if self._broken:
            if not locked:
                raise _NeedsLock
            self._recover()
            return
        raw = os.pread(self._lock_fd, STATE_SIZE, 0)
        if raw != self._state_raw:
            state = StreamState.decode(raw)
            if state is None:
                if not locked:
                    raise _NeedsLock
                self._recover()
                return
            if state.deleted:
                raise StreamGone(self.name)
            if state.swapping:  # a compaction swap, under way or crashed
                if not locked:
                    raise _NeedsLock
                self._recover()
                return
            if state.generation != self._state.generation:
                self._reload(state, raw, locked=locked)
                return
            self._state, self._state_raw = state, raw
        size = os.lseek(self._active_fd, 0, os.SEEK_END)
        active = self._segments[-1]
        if size == active.size:
            return
        if size < active.size:  # cut by another process's recovery: look again
            seg, fd, _ = self._open_active(self._state, recovering=False, locked=locked)
            self._install(self._state, self._state_raw, self._segments[:-1], seg, fd)
            return
        rp, rp_offset = self._recovery_point(self._state, active.base)
        self._advance(
            active, self._active_fd, size, rp, rp_offset, locked=locked, write_index=False
        )
        rel_end = active.end_offset - active.base - 1
        active.index.refresh(max_key=rel_end, max_value=active.size - 1)
        active.timeindex.refresh(max_key=_MAX_TS, max_value=rel_end)

    def _reload(
        self, state: StreamState, raw: bytes, *, locked: bool, verify: bool = False
    ) -> None:
        """Re-list the segments after a roll, trim, truncation or compaction swap by
        another process (``verify``: check every known segment's file is unchanged).

        Without the lock the listing is trusted only if the state record read before
        it is still there after it: any change (a roll, trim or swap that began
        meanwhile) sends the caller to the lock.
        """
        bases = [base for base in list_segments(self.directory) if base <= state.active_segment]
        if not bases or bases[-1] != state.active_segment:  # only recovery may repair this
            if not locked:
                raise _NeedsLock
            self._recover()
            return
        closed = self._closed_segments(bases, state, locked=locked, verify=verify)
        active, fd, _ = self._open_active(state, recovering=False, locked=locked)
        try:
            if not locked and os.pread(self._lock_fd, STATE_SIZE, 0) != raw:
                raise _NeedsLock
        except BaseException:
            close_quietly(fd)
            raise
        self._install(state, raw, closed, active, fd)

    def _refresh_unlocked(self) -> None:
        try:
            self._refresh(locked=False)
        except _NeedsLock:
            with self._locked():
                self._refresh(locked=True)

    # ---------------------------------------------------------------- writing

    def append(
        self, batches: list[EncodedBatch], *, before: Callable[[int], None] | None = None
    ) -> list[int]:
        """Append encoded batches atomically; return their base offsets.

        The batches go into one segment with one ``writev``; only a group larger than
        ``segment_bytes`` is placed across segments, as appending its batches one by one
        would place them, one ``writev`` per segment. A failure after any byte was
        written takes the whole append back (:meth:`_take_back`, :meth:`_unroll`), so
        either all of it becomes visible or none. Durable per the fsync policy when
        this returns. ``before(offset)`` is called under the stream's lock with the
        offset the first batch will get, before anything is written: a two-phase commit
        notes it to find out after a crash whether this append happened.
        """
        with self._mutex:
            if self._closed:
                self._check_open()
            self._attach()
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                self._refresh(locked=True)
                if before is not None:
                    before(self._segments[-1].end_offset)
                if len(batches) == 1:
                    bases = [self._write_one(batches[0])]
                else:
                    total = sum(ENTRY_PREFIX_SIZE + batch.size for batch in batches)
                    if total <= self.config.segment_bytes:
                        active = self._make_room(total, batches[-1].max_timestamp)
                        bases = self._write_group(active, batches, total)
                    else:
                        bases = self._write_runs(batches)
                self.appended_batches += len(batches)
                for batch in batches:
                    self.appended_records += batch.record_count
                    self.appended_bytes += ENTRY_PREFIX_SIZE + batch.size
                return bases
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _make_room(self, total: int, max_timestamp: int) -> Segment:
        """The active segment, after rolling it if ``total`` more bytes would not fit.

        Kafka's rule: roll when the segment would outgrow segment_bytes, or when the new
        records are segment_ms newer than the segment's first batch.
        """
        active = self._segments[-1]
        if active.size and (
            active.size + total > self.config.segment_bytes
            or max_timestamp - active.first_timestamp > self.config.segment_ms
        ):
            self._roll()
            active = self._segments[-1]
        return active

    def _write_one(self, batch: EncodedBatch) -> int:
        """Write one batch at the end of the active segment; its base offset."""
        header, body = batch.header, batch.body
        total = ENTRY_PREFIX_SIZE + len(header) + len(body)
        active = self._make_room(total, batch.max_timestamp)
        start, base = active.size, active.end_offset
        self._write_all(active, [ENTRY_PREFIX.pack(base), header, body], total, start)
        try:
            active.note_entry(start, base, batch.last_offset_delta + 1, batch.max_timestamp, total)
            self._made_durable()
        except BaseException:
            self._take_back(active, start, total, header, noted=True)
            raise
        return base

    def _write_group(self, active: Segment, batches: list[EncodedBatch], total: int) -> list[int]:
        """Write ``batches`` (``total`` bytes with prefixes) at the end of the active
        segment with one ``writev``: all or nothing."""
        start, base = active.size, active.end_offset
        bases = []
        parts: list[bytes | memoryview] = []
        for batch in batches:
            bases.append(base)
            parts.append(ENTRY_PREFIX.pack(base))
            parts.append(batch.header)
            parts.append(batch.body)
            base += batch.span
        self._write_all(active, parts, total, start)
        try:
            pos = start
            for batch, batch_base in zip(batches, bases):
                size = ENTRY_PREFIX_SIZE + batch.size
                active.note_entry(pos, batch_base, batch.span, batch.max_timestamp, size)
                pos += size
            self._made_durable()
        except BaseException:
            self._take_back(active, start, total, batches[0].header, noted=True)
            raise
        return bases

    def _write_runs(self, batches: list[EncodedBatch]) -> list[int]:
        """Write a group too large for one segment: in runs (:func:`_runs`), the first
        at the end of the active segment, each later one after a roll. A failure in a
        later run or roll takes back the runs before it too (:meth:`_unroll`)."""
        first = self._segments[-1]
        state, start, offset = self._state, first.size, first.end_offset
        runs = _runs(batches, first.size, first.first_timestamp, self.config)
        bases: list[int] = []
        bounds: dict[int, int] = {}  # each segment the group reaches: the most it may fill
        reached = 0
        try:
            for reached, run in enumerate(runs):
                if reached:
                    bounds[self._segments[-1].end_offset] = 0  # the roll's new segment
                    self._roll()
                active = self._segments[-1]
                total = sum(ENTRY_PREFIX_SIZE + batch.size for batch in run)
                bounds[active.base] = active.size + total
                if run:
                    bases += self._write_group(active, run, total)
        except BaseException:
            if reached:
                self._unroll(state, first, start, offset, batches[0].header, bounds)
            raise
        return bases

    def _write_all(
        self, active: Segment, parts: list[bytes | memoryview], total: int, start: int
    ) -> None:
        """Write ``parts`` at the end of the active file, or take them back."""
        try:
            if len(parts) <= _IOV_CHUNK:
                written = os.writev(self._active_fd, parts)
            else:
                written = 0
                for i in range(0, len(parts), _IOV_CHUNK):
                    written += os.writev(self._active_fd, parts[i : i + _IOV_CHUNK])
            if written != total:
                raise OSError(f"short write to {active.log_path}: {written} of {total} bytes")
        except BaseException:
            self._take_back(active, start, total, parts[1], noted=False)
            raise

    def _made_durable(self) -> None:
        """After the entries are written and noted: what the fsync policy asks before an
        append returns (``"always"``: the data synced and the recovery point past it)."""
        if self._fsync == "always":
            _fdatasync(self._active_fd)
            self._write_state(self._recovered())
        else:
            self._unsynced = True

    def _take_back(
        self, active: Segment, start: int, total: int, header: bytes | memoryview, *, noted: bool
    ) -> None:
        """Undo a failed append whose bytes (up to ``total`` of them, the first entry's
        batch header being ``header``) went to the active file from byte ``start``:
        its caller is told it failed, so nothing of it may ever be read.

        The file is cut back to ``start``. If the append got as far as noting its
        entries (``noted``: this process's view of the segment, index files, perhaps
        the state record), the next call on the stream runs recovery first, which
        rebuilds all of that from the files.

        If even the cut fails, the first entry's base offset is overwritten with
        :data:`_POISON`: an entry that breaks the chain after the recovery point is what
        recovery cuts, in this process or any other, after a crash too. If that fails
        as well, this process's next recovery cuts the bytes first
        (:meth:`_apply_cut`). Either way every call on the stream here runs recovery
        until one succeeds, so nothing is appended after them or reads them here.
        """
        if noted:
            self._broken = True
        try:
            os.ftruncate(self._active_fd, start)
        except OSError as exc:
            self._cut_later(_Cut(active.base, start, start + total, bytes(header)), exc)

    def _cut_later(self, cut: _Cut, failure: OSError) -> None:
        """Cutting a failed append off failed: mark its first entry corrupt, and have
        this process's next recovery cut it (:meth:`_take_back`)."""
        self._broken = True
        _PENDING[self._key] = cut
        path = self.directory / segment_name(cut.base, LOG_SUFFIX)
        marked = _poison(path, cut.position)
        log.error(
            "stream %r: could not cut a failed append off %s at byte %d (%s); %s",
            self.name,
            path.name,
            cut.position,
            failure,
            "its first entry is marked corrupt, so recovery cuts it"
            if marked
            else "this process cuts it at its next call on the stream (other processes "
            "may read it meanwhile, and it stays if this process ends first)",
        )

    def _unroll(
        self,
        state: StreamState,
        first: Segment,
        start: int,
        offset: int,
        header: bytes | memoryview,
        bounds: dict[int, int],
    ) -> None:
        """Take back a group that failed after it rolled past ``first`` (the active
        segment when it began, then ``start`` bytes long and ending at ``offset``;
        ``state`` the record then; ``header`` the group's first batch header; ``bounds``
        the segments it reached, each with the most bytes it may have left there).

        ``state`` is written back with a new generation: ``first`` is the active segment
        again, and the segments after it are leftovers of an interrupted roll, which
        recovery (run next, the store is broken) removes. Then ``first`` is cut back to
        ``start``, or marked to be (:meth:`_cut_later`). If the state record cannot be
        written back, this process's next recovery does both first (:class:`_Unroll`).
        """
        self._broken = True
        cut = _Cut(first.base, start, first.size, bytes(header)) if first.size > start else None
        restore = replace(state, generation=random.getrandbits(62)).encode()
        try:
            self._restore_state(restore)
        except OSError as exc:
            _PENDING[self._key] = _Unroll(restore, state.start_offset, tuple(bounds.items()), cut)
            log.error(
                "stream %r: could not take back a failed append that rolled past segment %d "
                "(%s); this process does at its next call on the stream (other processes "
                "may read its records from offset %d meanwhile, and they stay if this "
                "process ends first)",
                self.name,
                first.base,
                exc,
                offset,
            )
            return
        if cut is None:  # the group began in a new segment
            return
        try:
            fd = os.open(first.log_path, os.O_WRONLY)
            try:
                os.ftruncate(fd, start)
            finally:
                close_quietly(fd)
        except OSError as exc:
            self._cut_later(cut, exc)

    def _restore_state(self, raw: bytes) -> None:
        """Write back the state record ``raw`` of before a failed append (lock held)."""
        if os.pwrite(self._lock_fd, raw, 0) != len(raw):
            raise OSError(f"short write to {self.directory / STATE}")
        if self.durable:
            with contextlib.suppress(OSError):  # recovery syncs the record again
                os.fsync(self._lock_fd)

    def _apply_unroll(self, unroll: _Unroll) -> None:
        """Take back a failed append spread over segments that :meth:`_unroll` could not
        (lock held, before recovery), if nothing was built on it since (see
        :class:`_Unroll`); if something was, its records stay, logged as the error it is."""
        state = StreamState.decode(os.pread(self._lock_fd, STATE_SIZE, 0))
        bound = None if state is None else dict(unroll.bounds).get(state.active_segment)
        if (
            state is None
            or bound is None
            or state.deleted
            or state.start_offset != unroll.start_offset
            or _file_identity(self.directory / segment_name(state.active_segment, LOG_SUFFIX))[1]
            > bound
        ):
            log.error(
                "stream %r: the records of a failed append stay: the stream changed before "
                "they could be taken back",
                self.name,
            )
            return
        self._restore_state(unroll.restore)
        if unroll.cut is not None:
            self._apply_cut(unroll.cut)

    def _apply_cut(self, cut: _Cut) -> None:
        """Cut a failed append's bytes that :meth:`_take_back` could not cut (lock held,
        before recovery). Only while they are still the last thing in the active
        segment: the state record names the same active segment, its batch header is
        at the position, and the file ends at most where the append did. Another
        process's recovery may have cut them meanwhile (a torn entry) and appended
        after: then there is nothing of this append left to cut. If another process
        appended after them instead (it took them for records: they were complete),
        cutting would take its acknowledged records too: they stay, and this is logged
        as the error it is."""
        state = StreamState.decode(os.pread(self._lock_fd, STATE_SIZE, 0))
        if state is None or state.active_segment != cut.base:
            return
        path = self.directory / segment_name(cut.base, LOG_SUFFIX)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            at = cut.position + ENTRY_PREFIX_SIZE
            if size <= cut.position or os.pread(fd, len(cut.header), at) != cut.header:
                return
            if size > cut.end:
                log.error(
                    "stream %r: the records of a failed append at byte %d of %s stay: "
                    "another process appended after them before they could be cut",
                    self.name,
                    cut.position,
                    path.name,
                )
                return
            os.ftruncate(fd, cut.position)
        finally:
            close_quietly(fd)
        log.warning(
            "stream %r: cut a failed append off %s at byte %d", self.name, path.name, cut.position
        )

    def _roll(self) -> None:
        """Close the active segment and start a new one at its end offset (lock held).

        A failure before the state record names the new segment leaves the old one
        active (a new file is a leftover recovery removes); one after it leaves the new
        one active. Either way this process's view is rebuilt by recovery on the next
        call."""
        self.metrics.add("segment_rolls")
        old = self._segments[-1]
        durable = self._fsync != "never"
        new_base = old.end_offset
        fd = -1
        try:
            old.seal()
            if durable:
                _fdatasync(self._active_fd)
                old.index.fsync()
                old.timeindex.fsync()
            self._remove_segment_files(new_base)  # a leftover of an earlier interrupted roll
            fd = os.open(
                self.directory / segment_name(new_base, LOG_SUFFIX),
                os.O_RDWR | os.O_APPEND | os.O_CREAT,
                0o644,
            )
            new = self._new_segment(new_base)
            new.inode = os.fstat(fd).st_ino
            if durable:
                fsync_directory(self.directory)
            # The state names the new active segment only once its file exists; a crash
            # in between leaves a file newer than the active one, which recovery removes.
            self._write_state(
                replace(
                    self._state,
                    generation=self._state.generation + 1,
                    active_segment=new_base,
                    recovery_position=0,
                    recovery_offset=new_base,
                ),
                sync=durable,
                copy=True,
            )
        except BaseException:
            self._broken = True
            if fd >= 0:
                close_quietly(fd)
            raise
        old_fd, self._active_fd = self._active_fd, fd
        old.indexes_loaded = True
        self._segments.append(new)
        os.close(old_fd)  # gone even if this fails: never closed again

    def trim(self, before: int) -> None:
        """Move the start offset to ``before`` and delete segments wholly below it.

        The state record (then its copy) is the commit point. A trim that fails may
        have taken effect or not, as after a crash; recovery resolves which from the
        two files, and the start offset never moves back once a trim returned."""
        with self._mutex:
            self._check_open()
            self._attach()
            with self._locked():
                self._refresh(locked=True)
                end = self._active.end_offset
                if before > end:
                    raise OffsetOutOfRange(
                        f"cannot trim {self.name!r} before {before}: its end offset is {end}",
                        start_offset=self._state.start_offset,
                        end_offset=end,
                    )
                if before <= self._state.start_offset:
                    return
                try:
                    if before == end and self._active.size:
                        self._roll()  # so the old active segment can go too
                    self._write_state(
                        replace(
                            self._state, generation=self._state.generation + 1, start_offset=before
                        ),
                        sync=self._fsync != "never",
                        copy=True,
                    )
                    self._delete_closed_below(before)
                except BaseException:
                    self._broken = True
                    raise

    def mark_deleted(self) -> None:
        """Flag the stream deleted so every process drops it (the caller removes the files)."""
        with self._mutex:
            self._attach()
            with self._locked():
                self._write_state(
                    replace(
                        self._state,
                        generation=self._state.generation + 1,
                        flags=self._state.flags | FLAG_DELETED,
                    ),
                    sync=self._fsync != "never",
                )
                self._closed = True

    # ------------------------------------------------------------- durability

    def _sync_data(self) -> None:
        if self._fsync != "never" and self._active_fd >= 0:
            _fdatasync(self._active_fd)
            self.metrics.add("fsyncs")
        self._unsynced = False

    def sync(self) -> None:
        """Make written data durable and advance the recovery point (the interval policy).

        The fsync runs without holding the lock, so appends continue meanwhile; that of
        a parked store (not in use) runs under it, through descriptors opened for it.
        """
        with self._mutex:
            if self._closed or not self._unsynced:
                return
            if self._parked:
                with self._descriptors(), self._locked():
                    self._sync_locked()
                return
            if self._broken:  # recovery syncs the active segment and moves the point
                with self._locked():
                    self._refresh(locked=True)
                return
            fd = os.dup(self._active_fd)
            self._unsynced = False
            base, size, end = self._active.base, self._active.size, self._active.end_offset
        try:
            if self._fsync != "never":
                _fdatasync(fd)
                self.metrics.add("fsyncs")
        except BaseException:
            self._unsynced = True
            raise
        finally:
            close_quietly(fd)  # a duplicate: the file stays open
        with self._mutex:
            if self._closed:
                return
            with self._descriptors(), self._locked():  # parked meanwhile?
                self._refresh(locked=True)
                state = self._state
                if state.active_segment == base and state.recovery_position < size:
                    self._write_state(self._recovery_moved(state, size, end))

    def _sync_locked(self) -> None:
        """Sync this process's appends and move the recovery point past them (lock held)."""
        self._refresh(locked=True)  # recovers first if a failure left it to
        if self._unsynced:
            self._sync_data()
            if self._state.recovery_position < self._active.size:
                self._write_state(self._recovered())

    def close(self) -> None:
        """Sync, record the recovery point and release the files. Idempotent."""
        with self._mutex:
            if self._closed:
                self._close_fds()
                return
            try:
                if self._unsynced or self._broken:
                    with self._descriptors(), self._locked():
                        self._sync_locked()
            except StreamGone:
                pass
            finally:
                self._closed = True
                self._close_fds()

    # ---------------------------------------------------------------- reading

    def snapshot(self, *, fresh: bool = False, raw: bool = False) -> Snapshot:
        """The current extent and segments, after catching up with other processes.

        ``fresh`` (for a reader that found a segment file replaced or gone) re-lists
        the directory under the lock and checks every known segment's file. The end
        offset is the stable one: records a two-phase commit in progress appended (and
        any after them) are left out, with the segments that start at or past it,
        unless ``raw`` (for the commit itself, which checks what it appended).
        """
        with self._mutex:
            self._check_open()
            self._attach()
            if fresh:
                with self._locked():
                    self._refresh(locked=True)
                    self._reload(self._state, self._state_raw, locked=True, verify=True)
            else:
                self._refresh_unlocked()
            segments = [(seg, seg.size) for seg in self._segments]
            start, end = self._state.start_offset, self._active.end_offset
        held = None if raw or self._hold is None else self._hold(self.name)
        if held is not None and held < end:
            end = max(held, start)
            segments = segments[:1] + [s for s in segments[1:] if s[0].base < end]
        return Snapshot(start, end, segments)

    def ensure_indexes(self, seg: Segment) -> None:
        """Load a closed segment's indexes; a rebuild runs under the stream lock."""
        seg.ensure_indexes(self.config.max_batch_bytes, self._exclusive)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._mutex:
            self._attach()
            with self._locked():
                yield

    # ------------------------------------------------------------- compaction

    def recover_swap(self) -> None:
        """Finish (or roll back) a compaction swap a crashed process left, now rather
        than at the next open: a compactor calls this before its pass."""
        with self._mutex:
            self._check_open()
            self._attach()
            with self._locked():
                if self._state.swapping or (self.directory / INTENT).exists():
                    self._recover()
                else:
                    self._refresh(locked=True)

    def replace_segments(self, intent: swap.Intent) -> bool:
        """Swap staged compacted segments in for closed ones (``docs/format.md`` 2.7).

        Under the stream lock: check every segment ``intent`` replaces is still the
        file the compactor read (retention may have deleted it meanwhile: then return
        ``False`` and change nothing); write the intent (the commit point); flag the
        state record so lock-free readers wait; rename, unlink, sync, move the
        checkpoint (:func:`swap.finish`); clear the flag with a new generation, so
        every process re-lists the segments; remove the intent. Also ``False`` if a
        staged file vanished before anything was renamed (the swap is rolled back).
        """
        sync = self._fsync != "never"
        with self._mutex:
            self._check_open()
            self._attach()
            with self._locked():
                self._refresh(locked=True)
                active = self._state.active_segment
                for old in intent.replaced:
                    path = self.directory / segment_name(old.base, LOG_SUFFIX)
                    if old.base >= active or _file_identity(path) != (old.inode, old.size):
                        return False
                swap.write_intent(self.directory, intent, sync=sync)
                swap.crash_point("intent")
                try:
                    state = self._state
                    self._write_state(
                        replace(
                            state,
                            generation=state.generation + 1,
                            flags=state.flags | FLAG_SWAPPING,
                        )
                    )
                    swap.crash_point("flagged")
                    done = swap.finish(self.directory, intent, sync=sync)
                    state = self._state
                    self._write_state(
                        replace(
                            state,
                            generation=state.generation + 1,
                            flags=state.flags & ~FLAG_SWAPPING,
                        ),
                        sync=sync,
                    )
                    swap.crash_point("state")
                    swap.remove_intent(self.directory, sync=sync)
                    swap.crash_point("intent-removed")
                    self._reload(self._state, self._state_raw, locked=True)
                except BaseException:
                    # Whatever happened, the intent decides: the next look at the state
                    # record (here or in any process) recovers, finishing the swap.
                    self._state_raw = b""
                    raise
                return done


_LIVE: weakref.WeakSet[StreamStore] = reset_after_fork(lambda store: store._forked())


def flag_deleted(directory: Path, *, sync: bool) -> bool:
    """Flag a stream deleted that cannot be opened (its recovery fails on damage), so
    that every process drops it before its directory goes: a fresh state record with
    only the deleted flag, under the stream lock. False if the stream is gone."""
    try:
        fd = open_lock(directory / STATE, create=False)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        deleted = StreamState(generation=random.getrandbits(62), flags=FLAG_DELETED)
        os.pwrite(fd, deleted.encode(), 0)
        if sync:
            os.fsync(fd)
    finally:
        close_lock(fd)
    return True


def _poison(path: Path, position: int) -> bool:
    """Overwrite the base offset of the entry at ``position`` with :data:`_POISON`;
    whether that worked. Through a descriptor of its own: the active one appends."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        return os.pwrite(fd, _POISON, position) == len(_POISON)
    except OSError:
        return False
    finally:
        close_quietly(fd)


def _runs(
    batches: list[EncodedBatch], size: int, first_timestamp: int, config: StreamConfig
) -> list[list[EncodedBatch]]:
    """``batches`` as appending them one by one would place them: in runs, each filling
    one segment by the roll rule of :meth:`StreamStore._make_room`. The first run goes
    to the active segment (``size`` bytes, its first batch's max timestamp
    ``first_timestamp``) and is empty if not even the first batch fits there; each
    later one goes to a new segment."""
    runs: list[list[EncodedBatch]] = [[]]
    for batch in batches:
        entry = ENTRY_PREFIX_SIZE + batch.size
        if size and (
            size + entry > config.segment_bytes
            or batch.max_timestamp - first_timestamp > config.segment_ms
        ):
            runs.append([])
            size = 0
        if not size:
            first_timestamp = batch.max_timestamp
        runs[-1].append(batch)
        size += entry
    return runs


def _identity(stat: os.stat_result) -> tuple[int, int, int]:
    """Device, inode and change time of a file: which file it is, and whether it was
    written (a write moves the change time)."""
    return stat.st_dev, stat.st_ino, stat.st_ctime_ns


def _fdatasync(fd: int) -> None:
    """``fdatasync(2)``, or ``fsync(2)`` where the platform has no ``os.fdatasync``
    (macOS). Looked up at each call, like every other ``os`` function here, so that
    tests can make it fail."""
    getattr(os, "fdatasync", os.fsync)(fd)


def _file_identity(path: Path) -> tuple[int, int]:
    """``(inode, size)`` of a file, ``(0, -1)`` if there is none."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return 0, -1
    return stat.st_ino, stat.st_size


def _first_max_timestamp(fd: int) -> int:
    """Max timestamp of a segment's first batch (drives the ``segment_ms`` roll)."""
    data = os.pread(fd, ENTRY_PREFIX_SIZE + 9 + TAIL.size, 0)
    if len(data) < ENTRY_PREFIX_SIZE + 9 + TAIL.size:
        return NO_TIMESTAMP
    return int(TAIL.unpack_from(data, ENTRY_PREFIX_SIZE + 9)[4])
