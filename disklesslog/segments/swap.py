"""Replacing closed segments atomically: how key compaction puts rewritten segments in
place, and how recovery finishes or undoes a replacement a crash interrupted.

The files (``docs/format.md`` 2.7), all in the stream's directory:

``cleaner.lock``
    ``flock``-ed (non-blocking) by the one process compacting the stream.
``cleaner.staging/``
    new segments (``.log``, ``.index``, ``.timeindex``) written and synced before the swap.
``cleaner.intent``
    the commit point: which segments are replaced, and the inode of every staged file.
``cleaner.checkpoint``
    the offset up to which the stream was compacted (Kafka's cleaner-offset-checkpoint).

The swap runs under the stream lock: write the intent, rename the staged files over
the old ones (each ``.log`` before its indexes), unlink the replaced segments that no
new one took the place of, sync the directory, move the checkpoint, remove the
intent. :func:`finish` does all but the first and last step and is idempotent, so
recovery runs the same code: with an intent present it completes the swap (a staged
file already renamed is recognised by its inode in place), without one the staging
directory is a draft and is deleted. Inodes make "already renamed" and "lost"
distinguishable, which a name alone cannot.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..checksummed import decode_json, encode_json
from ..errors import CorruptDataError
from ..format import crc32c
from ..storage.atomic import fsync_directory
from .layout import (
    CHECKPOINT,
    CLEANER_LOCK,
    INTENT,
    LOST_SUFFIX,
    SEGMENT_SUFFIXES,
    STAGING,
    close_lock,
    open_lock,
    segment_name,
)

__all__ = [
    "CRASH_ENV",
    "Intent",
    "Replaced",
    "Staged",
    "cleaner_lock",
    "clear_staging",
    "crash_point",
    "discard_draft",
    "drop_staging",
    "finish",
    "read_checkpoint",
    "read_intent",
    "remove_intent",
    "write_checkpoint",
    "write_intent",
]

log = logging.getLogger("disklesslog")

CRASH_ENV = "DISKLESSLOG_CRASH_AT"
"""Names a step of the swap at which the process exits at once (``os._exit``): the
crash tests run a compaction in a child process with it set, once for every step."""
_CRASH_EXIT = 77
_INTENT_VERSION = 2
"""Version 2 is version 1 with a checksum trailer (layout.encode_json)."""
_CHECKPOINT = struct.Struct("<4sIQ")  # magic, crc of the offset, offset
_CHECKPOINT_MAGIC = b"DLCK"


def crash_point(step: str) -> None:
    """Exit the process here if :data:`CRASH_ENV` names ``step`` (crash tests only)."""
    if os.environ.get(CRASH_ENV) == step:
        os._exit(_CRASH_EXIT)


@dataclass(frozen=True)
class Replaced:
    """A segment a swap removes: its base offset and the ``.log`` it was read from."""

    base: int
    inode: int
    size: int


@dataclass(frozen=True)
class Staged:
    """A new segment in the staging directory: base offset, ``.log`` size, and the
    inodes of its ``.log``, ``.index`` and ``.timeindex`` (in that order)."""

    base: int
    size: int
    inodes: tuple[int, int, int]


@dataclass(frozen=True)
class Intent:
    """What one swap does: put ``written`` in place, remove ``replaced``, and move the
    checkpoint to ``checkpoint``. A written segment takes the name of the replaced one
    with the same base (the first of the segments it was made from)."""

    checkpoint: int
    replaced: tuple[Replaced, ...]
    written: tuple[Staged, ...]

    def encode(self) -> bytes:
        body = {
            "version": _INTENT_VERSION,
            "checkpoint": self.checkpoint,
            "replaced": [[r.base, r.inode, r.size] for r in self.replaced],
            "written": [[w.base, w.size, *w.inodes] for w in self.written],
        }
        return encode_json(body)

    @classmethod
    def decode(cls, raw: bytes, source: str) -> Intent:
        try:
            body, checked = decode_json(raw, source, what="compaction intent")
            if body["version"] not in (1, _INTENT_VERSION):
                raise ValueError(f"version {body['version']!r}")
            if body["version"] == _INTENT_VERSION and not checked:
                raise ValueError("no checksum")
            return cls(
                int(body["checkpoint"]),
                tuple(Replaced(int(b), int(i), int(s)) for b, i, s in body["replaced"]),
                tuple(
                    Staged(int(b), int(s), (int(x), int(y), int(z)))
                    for b, s, x, y, z in body["written"]
                ),
            )
        except (CorruptDataError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptDataError(
                f"unreadable compaction intent ({exc}); the swap it records cannot be "
                "finished: restore the stream directory from a backup",
                source=source,
            ) from None


# ------------------------------------------------------------------ the cleaner lock


@contextlib.contextmanager
def cleaner_lock(directory: Path, *, create: bool = True) -> Iterator[bool]:
    """Try to become the stream's one compactor: yields whether the lock was taken.

    A non-blocking ``flock`` of ``cleaner.lock``, held for the whole pass. Another
    open file description holding it, in this process or another, means a compactor
    is at work (or a recovery is deciding about its staging directory). Without
    ``create`` (a dry run, which writes nothing) a missing lock file means no
    compactor ever ran: the lock is taken without one.
    """
    try:
        fd = open_lock(directory / CLEANER_LOCK, create=create)
    except FileNotFoundError:
        if create or not directory.exists():
            raise
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        close_lock(fd)


def clear_staging(directory: Path) -> Path:
    """An empty staging directory (the caller holds the cleaner lock and no intent is
    pending, so what is there is a draft of a crashed pass)."""
    staging = directory / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def drop_staging(directory: Path) -> None:
    """After a pass (cleaner lock held) or a recovered swap (stream lock held, so no
    compactor can be staging): remove the staging directory, unless an intent still
    needs it (a swap that failed after its commit point, left for recovery)."""
    if not (directory / INTENT).exists():
        shutil.rmtree(directory / STAGING, ignore_errors=True)


def discard_draft(directory: Path) -> None:
    """Recovery without an intent: delete the staging directory a crashed compactor
    left, unless a live compactor holds the cleaner lock (its draft is in progress)."""
    staging = directory / STAGING
    if not staging.exists():
        return
    with cleaner_lock(directory) as mine:
        if mine:
            log.warning("removing %s, left by an interrupted compaction", staging)
            shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------- small atomic files


def _replace_file(directory: Path, name: str, data: bytes, *, sync: bool) -> None:
    """Write ``name`` in ``directory`` atomically: a draft in the staging directory,
    synced, renamed into place, and the directory synced."""
    staging = directory / STAGING
    staging.mkdir(exist_ok=True)
    draft = staging / name
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(draft, directory / name)
    if sync:
        fsync_directory(directory)


def read_checkpoint(directory: Path) -> int:
    """The offset below which the stream is compacted (0 if it never was, or if the
    checkpoint is unreadable: then everything counts as dirty, which is only slower)."""
    try:
        raw = (directory / CHECKPOINT).read_bytes()
    except FileNotFoundError:
        return 0
    if len(raw) == _CHECKPOINT.size:
        magic, crc, offset = _CHECKPOINT.unpack(raw)
        if magic == _CHECKPOINT_MAGIC and crc == crc32c(raw[8:]):
            return int(offset)
    log.warning("%s is unreadable; compacting as if for the first time", directory / CHECKPOINT)
    return 0


def write_checkpoint(directory: Path, offset: int, *, sync: bool) -> None:
    tail = struct.pack("<Q", offset)
    raw = _CHECKPOINT.pack(_CHECKPOINT_MAGIC, crc32c(tail), offset)
    _replace_file(directory, CHECKPOINT, raw, sync=sync)


def write_intent(directory: Path, intent: Intent, *, sync: bool) -> None:
    """The commit point: once this returns the swap happens, if need be by recovery."""
    _replace_file(directory, INTENT, intent.encode(), sync=sync)


def read_intent(directory: Path) -> Intent | None:
    path = directory / INTENT
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return Intent.decode(raw, str(path))


def remove_intent(directory: Path, *, sync: bool) -> None:
    """The end of a swap (or of its roll-back): its staging directory is then a
    leftover for :func:`drop_staging`."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / INTENT)
    if sync:
        fsync_directory(directory)


# ----------------------------------------------------------------------- the swap


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return 0


def finish(directory: Path, intent: Intent, *, sync: bool) -> bool:
    """Carry out ``intent`` (the caller holds the stream lock); idempotent.

    Each staged file still in the staging directory (its inode as recorded) is renamed
    into place, a ``.log`` before its indexes; one already in place is left alone.
    Then the replaced segments no new one took the name of are unlinked, the directory
    synced and the checkpoint moved. Returns ``False`` without changing anything when
    the swap cannot have started and a staged ``.log`` is missing (rolled back: the
    caller removes the intent); raises :class:`CorruptDataError` when it started and
    cannot be completed.
    """
    staging = directory / STAGING
    missing = []
    started = False
    for new in intent.written:
        name = segment_name(new.base, SEGMENT_SUFFIXES[0])
        if _inode(directory / name) == new.inodes[0]:
            started = True
        elif _inode(staging / name) != new.inodes[0]:
            missing.append(name)
    if missing:
        intact = all(
            _inode(directory / segment_name(old.base, SEGMENT_SUFFIXES[0])) == old.inode
            for old in intent.replaced
        )
        if started or not intact:
            raise CorruptDataError(
                f"an interrupted compaction swap cannot be completed: staged segment "
                f"{missing[0]} is gone from {staging}; restore the stream directory from "
                "a backup",
                source=str(directory / INTENT),
            )
        log.error(
            "%s: staged segment %s is missing; rolling the compaction swap back",
            directory,
            missing[0],
        )
        return False
    renamed = 0
    for new in intent.written:
        for suffix, inode in zip(SEGMENT_SUFFIXES, new.inodes):
            name = segment_name(new.base, suffix)
            if _inode(staging / name) == inode:
                os.rename(staging / name, directory / name)
                renamed += 1
                if renamed == 1:
                    crash_point("renamed-first")
            elif _inode(directory / name) != inode:
                # A staged index lost after its .log was placed: drop the old index
                # in its place, the new .log gets its indexes rebuilt when first read.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)
    crash_point("renamed")
    kept = {new.base for new in intent.written}
    for old in intent.replaced:
        if old.base not in kept:
            for suffix in SEGMENT_SUFFIXES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / segment_name(old.base, suffix))
        with contextlib.suppress(FileNotFoundError):  # the new segment holds no gap of its own
            os.unlink(directory / segment_name(old.base, LOST_SUFFIX))
    if sync:
        fsync_directory(directory)
    crash_point("unlinked")
    if read_checkpoint(directory) < intent.checkpoint:
        write_checkpoint(directory, intent.checkpoint, sync=sync)
    crash_point("checkpointed")
    return True
