"""Where the object-store sequencer keeps its objects, and how it reaches them.

Under the sequencer's root, entry ``n`` is ``log/<n:020d>`` and the checkpoint of the
state as of entry ``n``, written at unix time ``ms``, is ``checkpoints/<n:020d>-<ms:013d>``.

Every call retries failures with the policy :meth:`ObjectStorage.put` uses for data
objects (:data:`ATTEMPTS` attempts, exponential backoff from :data:`RETRY_DELAY` with
jitter), GETs and LISTs as much as PUTs: a replica that gave up on the first GET that
timed out would fail to open a log that is perfectly readable. A missing object is an
answer, not a failure (a missing entry is the end of the log), so ``FileNotFoundError``
is never retried. Listings bypass fsspec's listing cache: a checkpoint another process
wrote must be seen, or a stale replica could take a deleted entry number for a free one.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import DisklessLogError
from ..retries import DEADLINE, retrying
from .conditional import is_local, put_if_absent

__all__ = ["ATTEMPTS", "RETRY_DELAY", "CheckpointName", "SequencerStorage"]

ATTEMPTS = 5
"""Attempts of every storage call before its failure is raised (as ``StorageError``)."""
RETRY_DELAY = 0.05
"""Seconds before the second attempt; doubled for each further one, times 0.5-1.5."""

_CHECKPOINT_NAME = re.compile(r"^(\d{20})-(\d{13})$")
_ENTRY_NAME = re.compile(r"^\d{20}$")

T = TypeVar("T")


@dataclass(frozen=True)
class CheckpointName:
    """A checkpoint as listed: the entry it holds the state as of, when it was written."""

    entry: int
    millis: int
    path: str


class SequencerStorage:
    """The entries and checkpoints under ``root`` of an fsspec filesystem."""

    def __init__(self, fs: Any, root: str, url: str, *, deadline: float = DEADLINE) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self.deadline = deadline

    def entry_path(self, number: int) -> str:
        return f"{self.root}/log/{number:020d}"

    def checkpoint_path(self, entry: int, millis: int) -> str:
        return f"{self.root}/checkpoints/{entry:020d}-{millis:013d}"

    # ------------------------------------------------------------------ reads

    def get(self, path: str) -> bytes | None:
        """An object's bytes, or None if it does not exist."""
        try:
            return self._retried(f"read {path}", lambda: bytes(self.fs.cat_file(path)))
        except FileNotFoundError:
            return None

    def get_entries(self, first: int, count: int) -> list[bytes | None]:
        """Entries ``first .. first + count - 1`` (None where missing), fetched with one
        call (s3fs, gcsfs and adlfs send its requests concurrently); any that failed are
        fetched again one by one, with retries."""
        if count == 1:
            return [self.get(self.entry_path(first))]
        paths = [self.entry_path(first + i) for i in range(count)]
        try:
            fetched = self.fs.cat(paths, on_error="return")
        except DisklessLogError:
            raise
        except Exception:  # the whole call failed: one GET each, retried
            fetched = {}
        found: list[bytes | None] = []
        for path in paths:
            got = fetched.get(path)
            if got is None:  # some filesystems key the answers by the stripped path
                got = fetched.get(self.fs._strip_protocol(path))
            if isinstance(got, FileNotFoundError):
                found.append(None)
            elif got is None or isinstance(got, BaseException):
                found.append(self.get(path))
            else:
                found.append(bytes(got))
        return found

    def checkpoints(self) -> list[CheckpointName]:
        """Every checkpoint, oldest first (by entry, then by time written)."""
        found = []
        for path in self._list(f"{self.root}/checkpoints"):
            match = _CHECKPOINT_NAME.match(path.rsplit("/", 1)[-1])
            if match:
                found.append(CheckpointName(int(match[1]), int(match[2]), path))
        return sorted(found, key=lambda c: (c.entry, c.millis))

    def entries(self) -> list[tuple[int, str]]:
        """``(number, path)`` of every entry present, in number order."""
        found = []
        for path in self._list(f"{self.root}/log"):
            name = path.rsplit("/", 1)[-1]
            if _ENTRY_NAME.match(name):
                found.append((int(name), path))
        return sorted(found)

    def _list(self, folder: str) -> list[str]:
        with contextlib.suppress(Exception):  # not every filesystem caches listings
            self.fs.invalidate_cache(folder)
        try:
            names = self._retried(f"list {folder}", lambda: self.fs.ls(folder, detail=False))
        except FileNotFoundError:
            return []
        return [str(name).rstrip("/") for name in names]

    # ----------------------------------------------------------------- writes

    def create(self, path: str, data: bytes) -> bool:
        """Put-if-absent (:func:`put_if_absent`), retried. A retry that finds the object
        present reports False, as a lost race does: the caller reads it back to learn
        whether an earlier attempt had created it. When every attempt failed, the
        ``StorageError`` says the object may or may not exist now."""
        return self._retried(
            f"create {path} (it may or may not exist now)",
            lambda: put_if_absent(self.fs, path, data),
        )

    def replace(self, path: str, data: bytes) -> None:
        """Overwrite an object whole, atomically: readers see the old bytes or the new,
        never a mix or nothing (a rename on local disks; a PUT elsewhere)."""

        def write() -> None:
            if is_local(self.fs):
                temporary = f"{path}.tmp-{secrets.token_hex(8)}"
                with open(temporary, "xb") as f:
                    f.write(data)
                os.replace(temporary, path)
            else:
                self.fs.pipe_file(path, data)

        self._retried(f"replace {path}", write)

    def delete(self, path: str) -> None:
        """Delete an object; a missing one is fine."""
        with contextlib.suppress(FileNotFoundError):
            self._retried(f"delete {path}", lambda: self.fs.rm_file(path))

    # ----------------------------------------------------------------- retries

    def _retried(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, retried on failure with the policy of :func:`retrying`;
        ``FileNotFoundError`` and our own errors are answers and pass at once. ``what``
        starts with the operation (``read``, ``list``, ``create``, ``replace``,
        ``delete``)."""
        return retrying(
            call,
            f"{self.url}: could not {what}",
            attempts=ATTEMPTS,
            delay=RETRY_DELAY,
            final=(FileNotFoundError,),
            deadline=self.deadline,
            url=self.url,
            operation=what.partition(" ")[0],
        )
