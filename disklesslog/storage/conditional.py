"""Put-if-absent: the one storage primitive the object-store sequencer is built on.

Object stores make "create this key only if nobody has" atomic and fsspec asks for it
with ``fs.pipe_file(path, data, mode="create")``: s3fs (>= 2024.12) sends
``If-None-Match: *``, gcsfs ``ifGenerationMatch=0``, adlfs ``overwrite=False``, and a
lost race raises :class:`FileExistsError`. fsspec's generic fallback is an ``exists``
check followed by a write, which two processes can both pass, so the filesystems
without a native conditional write get one here:

* local files (also a shared NFS mount): the bytes go to a private temporary file that
  is then hard-linked to the final name. ``link(2)`` fails if the name exists, and the
  name appears with its whole content or not at all, so a crash never leaves a
  half-written entry under a real name (which ``O_EXCL`` alone would).
* fsspec's memory filesystem (one process): an exists check and the write under one
  process-wide lock.

Every other protocol uses ``mode="create"`` and trusts the filesystem to honour it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any

from ..errors import SequencerError
from ..forks import fork_safe_lock
from .filesystems import is_local, is_memory

__all__ = ["put_if_absent"]

_MEMORY_LOCK = fork_safe_lock()


def put_if_absent(fs: Any, path: str, data: bytes) -> bool:
    """Store ``data`` at ``path`` unless something is already there.

    Returns True if this call created the object, False if it existed (whatever its
    content; nothing was changed). Other failures (network, permissions) raise, and
    then the caller cannot know whether the object was created: it must read it back.
    """
    if is_local(fs):
        return _link_into_place(path, data)
    if is_memory(fs):
        with _MEMORY_LOCK:
            if fs.exists(path):
                return False
            fs.pipe_file(path, data)
            return True
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    return True


def _link_into_place(path: str, data: bytes) -> bool:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp-{secrets.token_hex(8)}"
    with open(temporary, "xb") as f:
        f.write(data)
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    except OSError as exc:
        raise SequencerError(
            f"cannot create {path} atomically: hard links failed ({exc}); the object-store "
            "sequencer needs a filesystem with link(2) (local disks and NFS have it)"
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return True
