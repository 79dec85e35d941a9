"""Names and small files of a local log directory (see ``docs/format.md``, "Local logs").

::

    <log>/disklesslog.json              marks the directory as a log (format + version)
    <log>/streams/<name>/stream.json    the stream's StreamConfig, written once
    <log>/streams/<name>/stream.state   48-byte state record; also the stream's lock file
    <log>/streams/<name>/<20 digits>.log / .index / .timeindex   one segment
    <log>/streams/<name>/cleaner.*      key compaction: lock, checkpoint, intent, staging
    <log>/tmp/                          staging for atomic stream creation and deletion
    <log>/groups/                       reserved for consumer-group offsets

Stream names are validated before they get here, so ``streams/<name>`` never leaves
the log directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidURL
from ..format import crc32c
from ..markers import MARKER, check_marker, marker_bytes

KIND = "disklesslog-segments"
VERSION = 1
STREAMS = "streams"
TMP = "tmp"
CONFIG = "stream.json"
STATE = "stream.state"
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX)
"""A segment's files, in the order a compaction swap renames them into place."""
CLEANER_LOCK = "cleaner.lock"
CHECKPOINT = "cleaner.checkpoint"
INTENT = "cleaner.intent"
STAGING = "cleaner.staging"
_DIGITS = 20

_STATE = struct.Struct(
    "<4sIQQQQII"
)  # magic, crc, generation, start, active, rec. offset, rec. position, flags
STATE_SIZE = _STATE.size  # 48
_STATE_MAGIC = b"DLST"
FLAG_DELETED = 1
FLAG_SWAPPING = 2
"""A compaction swap is replacing closed segments: lock-free readers wait for the lock."""


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:0{_DIGITS}d}{suffix}"


def parse_segment_name(filename: str) -> int | None:
    """Base offset of a ``.log`` file name, or ``None`` if it is not one."""
    if len(filename) == _DIGITS + len(LOG_SUFFIX) and filename.endswith(LOG_SUFFIX):
        digits = filename[:_DIGITS]
        if digits.isascii() and digits.isdigit():
            return int(digits)
    return None


def list_segments(stream_dir: Path) -> list[int]:
    """Base offsets of the ``.log`` files in a stream directory, ascending."""
    bases = (parse_segment_name(entry) for entry in os.listdir(stream_dir))
    return sorted(base for base in bases if base is not None)


@dataclass(frozen=True)
class StreamState:
    """What every process appending to or reading a stream must agree on.

    ``generation`` changes whenever the set of segments or the start offset changes,
    or a compaction swap replaces segment files, telling other processes to re-list
    the directory; ``flags`` has :data:`FLAG_SWAPPING` while a swap is under way (a
    lock-free reader must not list the directory then). ``active_segment`` names the
    segment appends go to; a newer file is a leftover of a crashed roll. The recovery
    point is a byte position in the active segment and the offset of the entry that
    starts there: every entry before it was verified (and synced, unless the fsync
    policy is "never"). Recovery verifies, and may truncate, only what follows it.
    """

    generation: int = 0
    start_offset: int = 0
    active_segment: int = 0
    recovery_offset: int = 0
    recovery_position: int = 0
    flags: int = 0

    @property
    def deleted(self) -> bool:
        return bool(self.flags & FLAG_DELETED)

    @property
    def swapping(self) -> bool:
        return bool(self.flags & FLAG_SWAPPING)

    def encode(self) -> bytes:
        body = _STATE.pack(
            _STATE_MAGIC,
            0,
            self.generation,
            self.start_offset,
            self.active_segment,
            self.recovery_offset,
            self.recovery_position,
            self.flags,
        )
        crc = crc32c(memoryview(body)[8:])
        return body[:4] + struct.pack("<I", crc) + body[8:]

    @classmethod
    def decode(cls, raw: bytes) -> StreamState | None:
        """The state in ``raw``, or ``None`` if it is missing, short or fails its CRC."""
        if len(raw) != STATE_SIZE:
            return None
        magic, crc, generation, start, active, rec_offset, rec_pos, flags = _STATE.unpack(raw)
        if magic != _STATE_MAGIC or crc != crc32c(memoryview(raw)[8:]):
            return None
        return cls(generation, start, active, rec_offset, rec_pos, flags)


def write_marker(root: Path) -> None:
    (root / STREAMS).mkdir(parents=True, exist_ok=True)
    (root / TMP).mkdir(exist_ok=True)
    marker = root / MARKER
    if not marker.exists():
        tmp = root / TMP / f"{MARKER}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_bytes(marker_bytes(KIND, VERSION))
        os.replace(tmp, marker)


def check_log_directory(root: Path, *, create: bool) -> None:
    """Make sure ``root`` is a local log, creating one in a new or empty directory.

    Several processes may open a new log at once: a directory holding only our own
    entries (``streams/``, ``tmp/``, the marker) is a log being created, and every
    opener finishes creating it (each step is idempotent) before checking the marker.
    """
    if root.exists() and not root.is_dir():
        raise InvalidURL(f"{root} is a file, not a log directory")
    marker = root / MARKER
    if not marker.exists():
        if root.exists():
            foreign = sorted(e.name for e in root.iterdir() if e.name not in (STREAMS, TMP, MARKER))
            if foreign:
                raise InvalidURL(
                    f"{root} is a non-empty directory that is not a disklesslog log "
                    f"(it holds {foreign[0]!r}); open an empty or new directory instead"
                )
        if not create:
            what = "is an empty directory" if root.exists() else "does not exist"
            raise InvalidURL(f"{root} is not a log: it {what} (opened with create=False)")
        root.mkdir(parents=True, exist_ok=True)
        write_marker(root)
    check_marker(marker.read_bytes(), kind=KIND, version=VERSION, where=str(root))
    (root / STREAMS).mkdir(exist_ok=True)
    (root / TMP).mkdir(exist_ok=True)


STAGING_GRACE_SECONDS = 3600
"""Staging entries in ``tmp/`` older than this are leftovers of a crashed process."""


def clean_staging(root: Path) -> None:
    """Remove what crashed processes left in ``tmp/``: half-deleted streams at once,
    half-created ones (and marker drafts) once they are an hour old, since another
    process may be creating a stream right now."""
    now = time.time()
    for entry in os.scandir(root / TMP):
        try:
            stale = now - entry.stat(follow_symlinks=False).st_mtime > STAGING_GRACE_SECONDS
        except FileNotFoundError:
            continue
        if entry.name.startswith("deleted-") or stale:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def fsync_directory(path: Path) -> None:
    """Make a directory's entries (new, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(root: Path, path: Path, data: bytes, *, sync: bool) -> None:
    """Replace ``path`` whole with ``data`` through a draft in ``root``'s ``tmp/`` and a
    rename: readers, and a process after a crash, see the old or the new content, never
    a torn one (drafts a crash leaves are cleaned when the log is opened)."""
    draft = root / TMP / f"{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(draft, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(draft, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(draft)
    if sync:
        fsync_directory(path.parent)


@contextlib.contextmanager
def flocked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` of ``lock_path`` (created if missing). flock conflicts
    between separate open()s, so threads of one process take turns too."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
