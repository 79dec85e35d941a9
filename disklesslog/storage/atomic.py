"""Replacing a local file whole, atomically: :func:`replace_file`.

Every file disklesslog replaces on a local disk (a log's marker and JSON records, a
stream's manifest, a tier object on ``file://``, an object of an object log on
``file://``, a block of the read cache's disk tier) is written to a temporary file on
the same filesystem and renamed over its name. ``rename(2)`` replaces a name in one
step, so readers, other processes and a process after a crash see the old content or
the new one, never a torn one. With ``sync``, the bytes are made durable before the
rename and the rename after it, so a crash never brings back the old content once the
call returned.

Temporary names are part of the contract: code that cleans up after crashed writers or
tells a log's own entries from foreign ones recognises them. By default a temporary is
``<path>.tmp-<16 hex digits>`` beside its file (:data:`TEMPORARY_INFIX`); callers whose
cleanup looks elsewhere name their own. A failed replacement removes its temporary; only
a crash (or a failing ``unlink``) leaves one behind, for that cleanup to find.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable

__all__ = ["TEMPORARY_INFIX", "fsync_directory", "replace_file"]

TEMPORARY_INFIX = ".tmp-"
"""What separates a file's name from the random part of its default temporary name."""


def replace_file(
    path: str | os.PathLike[str],
    data: bytes | Iterable[bytes],
    *,
    sync: bool,
    temporary: str | os.PathLike[str] | None = None,
    mode: int = 0o666,
) -> None:
    """Replace ``path`` whole with ``data`` (bytes, or chunks written in turn as the
    iterable yields them), through a temporary file and a rename.

    ``sync`` fsyncs the temporary before the rename and ``path``'s directory after it.
    ``temporary`` is where the bytes go first (on ``path``'s filesystem); by default
    ``<path>.tmp-<16 hex digits>``, a unique name created exclusively (``O_EXCL``). A
    caller's own name is truncated if it exists: its scheme may repeat a name a crashed
    process left behind. ``mode`` is the temporary's permission bits (before the umask),
    which the file keeps. A failure before the rename raises the ``OSError`` (or
    whatever the iterable raised) after removing the temporary, and leaves ``path`` as it
    was; a failing directory fsync after the rename raises with the new content in place.
    """
    flags = os.O_WRONLY | os.O_CREAT
    if temporary is None:
        temporary = f"{os.fspath(path)}{TEMPORARY_INFIX}{secrets.token_hex(8)}"
        flags |= os.O_EXCL
    else:
        flags |= os.O_TRUNC
    fd = os.open(temporary, flags, mode)
    try:
        try:
            for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                _write_all(fd, chunk, temporary)
            if sync:
                os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):  # the write failed; the close cannot matter
                os.close(fd)
            raise
        os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):  # else a leftover for the caller's cleanup
            os.unlink(temporary)
        raise
    if sync:
        fsync_directory(os.path.dirname(os.path.abspath(path)))


def _write_all(
    fd: int, chunk: bytes | bytearray | memoryview, temporary: str | os.PathLike[str]
) -> None:
    """Write all of ``chunk``: ``write(2)`` may write less (at most about 2 GiB a call)."""
    view = memoryview(chunk)
    while view:
        written = os.write(fd, view)
        if not written:
            raise OSError(f"short write to {os.fspath(temporary)}")
        view = view[written:]


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (new, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        with contextlib.suppress(OSError):  # opened to fsync, which succeeded or raised
            os.close(fd)
