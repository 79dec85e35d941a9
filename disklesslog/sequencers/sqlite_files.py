"""Who has an SQLite sequencer's database open, and the crash check of its ``-wal``.

SQLite keeps two files beside a database in WAL mode: ``-wal``, the write-ahead log
(committed transactions not yet copied into the database), and ``-shm``, an index of it
in shared memory that every connection maps. A clean close of the last connection
copies the log into the database and deletes both, so a ``-wal`` left behind means a
process died with the database open. SQLite replays such a log only up to its first
bad frame, in silence; :mod:`~disklesslog.sequencers.sqlite_wal` checks it first, and
this module makes sure it is checked only when no connection to the database exists,
before SQLite reads it.

Every sequencer holds a shared ``flock`` on ``<database>-lock`` from before its first
connection until the last of its connections is gone (:class:`Presence`). A sequencer
that can take that lock exclusively knows that no other sequencer, in any process, has
the database open: it checks a ``-wal`` left behind, then downgrades to a shared lock
and lets SQLite open the files (:func:`open_presence`). Nothing else is touched: SQLite
rebuilds a ``-shm`` left behind itself when it finds no other connection using it (its
own lock inside the file says so), which also covers programs outside disklesslog, such
as the ``sqlite3`` shell, that do not take this lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time

from ..errors import SequencerError
from .sqlite_wal import check_wal

__all__ = ["LOCK_SUFFIX", "Presence", "open_presence"]

LOCK_SUFFIX = "-lock"
_POLL_FIRST = 0.001  # seconds between tries for the shared lock, growing to _POLL_MAX
_POLL_MAX = 0.05


class Presence:
    """A sequencer's shared lock on ``<database>-lock``, counted: the sequencer is one
    user and each of its connections another, and the lock file is closed (releasing
    the lock) when the count reaches 0, so it outlives a connection that SQLite keeps
    open after ``close()`` (a cursor still referenced keeps it open until it is gone).

    A fork child shares the lock with its parent (one open file description): it never
    unlocks explicitly, so the lock stays until both have closed their copy, and a child
    keeps its inherited connections, and so its count, forever."""

    __slots__ = ("_fd", "_mutex", "_users")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._users = 1
        self._mutex = threading.Lock()

    def enter(self) -> bool:
        """Count one more user; False (nothing counted) once the lock is gone."""
        with self._mutex:
            if self._users == 0:
                return False
            self._users += 1
            return True

    def leave(self) -> None:
        """Count one user less; the last one closes the lock file."""
        with self._mutex:
            self._users -= 1
            if self._users == 0:
                with contextlib.suppress(OSError):
                    os.close(self._fd)

    def after_fork(self) -> None:
        """In a fork child: the mutex may have been held by a thread that is gone."""
        self._mutex = threading.Lock()


def open_presence(path: str, timeout: float) -> Presence:
    """Take the shared lock of the database at ``path``, first checking a ``-wal`` left
    behind if no one else has the database open
    (:func:`~disklesslog.sequencers.sqlite_wal.check_wal`: CorruptDataError naming it if
    SQLite would drop committed transactions, with nothing changed). Waits up to
    ``timeout`` seconds while another opener checks it."""
    lock_path = path + LOCK_SUFFIX
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise SequencerError(f"cannot open the lock file {lock_path}: {exc}") from exc
    try:
        if _try_lock(fd, fcntl.LOCK_EX):
            _prepare_alone(path)
            # Not atomic: another opener may take the exclusive lock in between; it
            # then checks the same files, before either opens the database.
            fcntl.flock(fd, fcntl.LOCK_SH)
        else:
            _wait_for_shared(fd, lock_path, timeout)
    except BaseException:
        os.close(fd)
        raise
    return Presence(fd)


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_for_shared(fd: int, lock_path: str, timeout: float) -> None:
    """Poll for the shared lock: held exclusively only while an opener alone checks
    the write-ahead log."""
    deadline = time.monotonic() + timeout
    delay = _POLL_FIRST
    while not _try_lock(fd, fcntl.LOCK_SH):
        if time.monotonic() >= deadline:
            raise SequencerError(
                f"{lock_path} stayed locked for {timeout:g} s by a process checking the "
                "sequencer database; retry, or raise ?timeout= in the URL"
            )
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)


def _prepare_alone(path: str) -> None:
    """No sequencer has the database open: check a ``-wal`` left behind."""
    wal = path + "-wal"
    try:
        if os.path.getsize(wal) == 0:
            return
        check_wal(wal, page_size=_page_size(path))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SequencerError(f"cannot read {wal}: {exc}") from exc


def _page_size(path: str) -> int | None:
    """The page size a database file's header records, None if it has none."""
    try:
        with open(path, "rb") as f:
            header = f.read(18)
    except OSError:
        return None
    if len(header) < 18 or not header.startswith(b"SQLite format 3\0"):
        return None
    size = int.from_bytes(header[16:18], "big")
    return 65536 if size == 1 else size
