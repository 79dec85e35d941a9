"""Names and small files of a local log directory (see ``docs/format.md``, "Local logs").

::

    <log>/disklesslog.json              marks the directory as a log (format + version)
    <log>/streams/<name>/stream.json    the stream's StreamConfig, written once
    <log>/streams/<name>/stream.state   48-byte state record; also the stream's lock file
    <log>/streams/<name>/stream.state.copy   its copy, rewritten when the segments or the
                                        start offset change (so one damaged file cannot
                                        lose the start offset)
    <log>/streams/<name>/<20 digits>.log / .index / .timeindex   one segment
    <log>/streams/<name>/<20 digits>.lost   an accepted loss: that (empty) segment's
                                        offsets were lost, and an operator accepted it
    <log>/streams/<name>/cleaner.*      key compaction: lock, checkpoint, intent, staging
    <log>/tmp/                          staging for atomic stream creation and deletion
    <log>/groups/                       reserved for consumer-group offsets

Stream names are validated before they get here, so ``streams/<name>`` never leaves
the log directory.

Every small file the backend trusts later carries a CRC-32C: the state record (and its
copy) and the cleaner checkpoint in their own binary layouts, the JSON files (marker,
``stream.json``, consumer groups, the compaction intent, ``tier.json``, transaction
files, ``.lost`` markers) in one trailer line written and checked by
:func:`~disklesslog.checksummed.encode_json` / ``decode_json`` (``docs/format.md`` 2.10).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checksummed import decode_json, encode_json
from ..errors import CorruptDataError, InvalidURL
from ..format import crc32c
from ..markers import MARKER, check_marker
from ..storage.atomic import replace_file

log = logging.getLogger("disklesslog")

KIND = "disklesslog-segments"
VERSION = 2
"""Version 2 added checksums to every small file (and ``.lost`` markers, the state
record's copy); version 1 directories are read, and upgraded when first opened."""
READABLE_VERSIONS = (1, 2)
STREAMS = "streams"
TMP = "tmp"
CONFIG = "stream.json"
STATE = "stream.state"
STATE_COPY = "stream.state.copy"
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
LOST_SUFFIX = ".lost"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX)
"""A segment's files, in the order a compaction swap renames them into place."""
SEGMENT_FILES = (*SEGMENT_SUFFIXES, LOST_SUFFIX)
"""Every file that goes when a segment is deleted."""
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
FLAG_UNSYNCED = 4
"""The recovery point was moved without syncing the data before it (fsync "never"): an
active segment found shorter than it lost what that policy may lose in an OS crash,
rather than data storage had made durable (``docs/format.md`` 2.6)."""


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


def read_state_copy(stream_dir: Path) -> tuple[StreamState | None, bool]:
    """The state record's copy, and whether the file exists (a missing copy is a stream
    written by version 1; an existing one that does not decode is damaged)."""
    try:
        raw = (stream_dir / STATE_COPY).read_bytes()
    except FileNotFoundError:
        return None, False
    return StreamState.decode(raw), True


def write_state_copy(stream_dir: Path, state: StreamState, *, sync: bool) -> None:
    """Overwrite the copy of the state record in place (48 bytes, one ``pwrite``: a torn
    write fails its CRC and is repaired from ``stream.state`` by recovery)."""
    fd = os.open(stream_dir / STATE_COPY, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, state.encode(), 0)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------- checksummed JSON


def read_json(path: Path, *, what: str) -> tuple[Any, bool] | None:
    """:func:`decode_json` of the file at ``path``; ``None`` if there is none (also when
    a component of ``path`` is a file: then there is no log there at all)."""
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return decode_json(raw, str(path), what=what)


# ------------------------------------------------------------------- the marker


def write_marker(root: Path) -> None:
    (root / STREAMS).mkdir(parents=True, exist_ok=True)
    (root / TMP).mkdir(exist_ok=True)
    marker = root / MARKER
    if not marker.exists():
        tmp = root / TMP / f"{MARKER}.{os.getpid()}.{threading.get_ident()}"
        replace_file(
            marker, encode_json({"format": KIND, "version": VERSION}), sync=False, temporary=tmp
        )


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
            raise InvalidURL(
                f"{root} is not a log: it {what} (check the path; this does not create a log)"
            )
        root.mkdir(parents=True, exist_ok=True)
        write_marker(root)
    _check_marker(root, marker)
    (root / STREAMS).mkdir(exist_ok=True)
    (root / TMP).mkdir(exist_ok=True)


def _check_marker(root: Path, marker: Path) -> None:
    """Check the marker names a log this version reads; upgrade a version 1 log to
    version 2 (the first open by this version), so older versions refuse it from then
    on instead of misreading its checksummed files."""
    try:
        content, checked = decode_json(marker.read_bytes(), str(marker), what="log marker")
    except CorruptDataError as exc:
        raise InvalidURL(f"{marker} is unreadable: {exc.reason}") from None
    found = content.get("version") if isinstance(content, dict) else None
    version = found if found in READABLE_VERSIONS else VERSION
    check_marker(json.dumps(content).encode(), kind=KIND, version=version, where=str(root))
    if version < VERSION:
        log.warning("%s: upgrading the log from version %d to %d", root, version, VERSION)
        write_durably(root, marker, encode_json({"format": KIND, "version": VERSION}), sync=True)
    elif not checked:
        raise InvalidURL(f"{marker} has no checksum, which version {VERSION} requires")


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


def close_quietly(fd: int) -> None:
    """Close a descriptor whose close cannot lose anything: one opened to read or to
    lock, a duplicate, or one dropped because something else failed. ``close(2)``
    releases the descriptor even when it reports an error, so there is nothing to retry
    (and closing the number again could close another thread's new descriptor)."""
    with contextlib.suppress(OSError):
        os.close(fd)


def write_durably(root: Path, path: Path, data: bytes, *, sync: bool) -> None:
    """Replace ``path`` whole with ``data`` through a draft in ``root``'s ``tmp/`` and a
    rename: readers, and a process after a crash, see the old or the new content, never
    a torn one (drafts a crash leaves are cleaned when the log is opened)."""
    draft = root / TMP / f"{path.name}.{uuid.uuid4().hex}.tmp"
    replace_file(path, data, sync=sync, temporary=draft)


def write_json(
    root: Path, path: Path, content: Any, *, sync: bool, indent: int | None = None
) -> None:
    """Replace ``path`` with ``content`` as checksummed JSON (:func:`encode_json`), by
    :func:`write_durably`: every JSON file the backend replaces goes through here."""
    write_durably(root, path, encode_json(content, indent=indent), sync=sync)


# ------------------------------------------------------------------ lock files
#
# A flock belongs to an open file description, and a child made by fork() gets a copy
# of every descriptor: a lock the parent releases by closing its descriptor stays held
# by the child's copy for as long as the child lives, and the parent's next wait for it
# (or the child's own, through a new descriptor) never ends. So the descriptors that
# hold such locks are known here, and a child closes its copies at once. The registry's
# lock is held across fork(), so that no descriptor is between open and registration,
# or between deregistration and close, when the child is made.

_LOCK_FDS: set[int] = set()
_LOCK_FDS_LOCK = threading.Lock()


def open_lock(path: Path, *, create: bool = True) -> int:
    """A descriptor of ``path`` (created if missing, with ``create``) whose close
    releases the ``flock`` taken through it; close it with :func:`close_lock`. A fork
    child closes its copy (see above)."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    with _LOCK_FDS_LOCK:
        fd = os.open(path, flags, 0o644)
        _LOCK_FDS.add(fd)
    return fd


def close_lock(fd: int) -> None:
    """Close a descriptor from :func:`open_lock`, releasing its lock."""
    with _LOCK_FDS_LOCK:
        _LOCK_FDS.discard(fd)
        close_quietly(fd)


def _close_inherited_locks() -> None:
    """In a fork child: close the copies of the parent's lock descriptors. Closing a
    copy never releases the parent's lock: that needs every copy closed, or an unlock."""
    for fd in _LOCK_FDS:
        close_quietly(fd)
    _LOCK_FDS.clear()
    _LOCK_FDS_LOCK.release()  # taken by this thread before the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_LOCK_FDS_LOCK.acquire,
        after_in_parent=_LOCK_FDS_LOCK.release,
        after_in_child=_close_inherited_locks,
    )


@contextlib.contextmanager
def flocked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` of ``lock_path`` (created if missing). flock conflicts
    between separate open()s, so threads of one process take turns too."""
    fd = open_lock(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        close_lock(fd)  # releases the lock
