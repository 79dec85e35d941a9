"""Where the object-store sequencer keeps its objects, and how it reaches them.

Under the sequencer's root, entry ``n`` is ``log/<n:020d>`` and the checkpoint of the
state as of entry ``n``, written at unix time ``ms``, is ``checkpoints/<n:020d>-<ms:013d>``.

Every request goes through the storage layer
(:class:`~disklesslog.storage.store.ObjectStore`), so it is retried with the policy of
every other request to storage (:mod:`disklesslog.retries`), GETs and LISTs as much as
PUTs: a replica that gave up on the first GET that timed out would fail to open a log
that is perfectly readable. A missing object is an answer, not a failure (a missing
entry is the end of the log), so it is never retried. Listings bypass fsspec's listing
cache: a checkpoint another process wrote must be seen, or a stale replica could take a
deleted entry number for a free one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import DisklessLogError
from ..metrics import Metrics
from ..retries import DEADLINE
from ..storage.store import ObjectStore

__all__ = ["CheckpointName", "SequencerStorage"]

_CHECKPOINT_NAME = re.compile(r"^(\d{20})-(\d{13})$")
_ENTRY_NAME = re.compile(r"^\d{20}$")
_LOG = "log"
_CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class CheckpointName:
    """A checkpoint as listed: the entry it holds the state as of, when it was written."""

    entry: int
    millis: int
    path: str


class SequencerStorage:
    """The entries and checkpoints under ``root`` of an fsspec filesystem, named by
    their paths (``<root>/<key>``: what the sequencer's messages and reports show).
    The sequencer reports no metrics, so the requests' counters stay in ``store``."""

    def __init__(self, fs: Any, root: str, url: str, *, deadline: float = DEADLINE) -> None:
        self.root = root.rstrip("/")
        self.store = ObjectStore(fs, self.root, Metrics(), url=url, retry_deadline=deadline)

    def entry_path(self, number: int) -> str:
        return self.store.path(f"{_LOG}/{number:020d}")

    def checkpoint_path(self, entry: int, millis: int) -> str:
        return self.store.path(f"{_CHECKPOINTS}/{entry:020d}-{millis:013d}")

    def _key(self, path: str) -> str:
        """The key of a path this class made (every one is ``<root>/<key>``)."""
        return path[len(self.root) + 1 :]

    # ------------------------------------------------------------------ reads

    def get(self, path: str) -> bytes | None:
        """An object's bytes, or None if it does not exist."""
        return self.store.get(self._key(path))

    def get_entries(self, first: int, count: int) -> list[bytes | None]:
        """Entries ``first .. first + count - 1`` (None where missing), fetched with one
        call (s3fs, gcsfs and adlfs send its requests concurrently); any that failed are
        fetched again one by one, with retries."""
        paths = [self.entry_path(first + i) for i in range(count)]
        if self.store.local_root() is not None:
            # One open() each: a process opening a busy log reads thousands of entries,
            # and fsspec's cat cost more than the reads (a path normalised thrice).
            return [self._read_local(path) for path in paths]
        if count == 1:
            return [self.get(paths[0])]
        fs = self.store.fs
        try:
            fetched = fs.cat(paths, on_error="return")
        except DisklessLogError:
            raise
        except Exception:  # the whole call failed: one GET each, retried
            fetched = {}
        found: list[bytes | None] = []
        for path in paths:
            got = fetched.get(path)
            if got is None:  # some filesystems key the answers by the stripped path
                # fsspec's own normalisation, which cat() applied (it has no public name)
                got = fetched.get(fs._strip_protocol(path))
            if isinstance(got, FileNotFoundError):
                found.append(None)
            elif got is None or isinstance(got, BaseException):
                found.append(self.get(path))
            else:
                found.append(bytes(got))
        return found

    def _read_local(self, path: str) -> bytes | None:
        """A local file's bytes, None if it does not exist; any other failure is
        retried the usual way (:meth:`get`), and raised as a StorageError if it lasts."""
        try:
            with open(path, "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None
        except OSError:
            return self.get(path)

    def checkpoints(self) -> list[CheckpointName]:
        """Every checkpoint, oldest first (by entry, then by time written)."""
        found = []
        for name in self.store.names(_CHECKPOINTS):
            match = _CHECKPOINT_NAME.match(name)
            if match:
                path = self.store.path(f"{_CHECKPOINTS}/{name}")
                found.append(CheckpointName(int(match[1]), int(match[2]), path))
        return sorted(found, key=lambda c: (c.entry, c.millis))

    def entries(self) -> list[tuple[int, str]]:
        """``(number, path)`` of every entry present, in number order."""
        return [(number, self.entry_path(number)) for number in self.entry_numbers()]

    def entry_numbers(self) -> list[int]:
        """The number of every entry present, in order, without a path for each: the
        clean-up after a checkpoint lists a busy log's entries (hundreds of thousands)
        to delete those below it."""
        return sorted(int(name) for name in self.store.names(_LOG) if _ENTRY_NAME.match(name))

    # ----------------------------------------------------------------- writes

    def create(self, path: str, data: bytes) -> bool:
        """Put-if-absent, retried (:meth:`ObjectStore.put_if_absent`): False if the
        object existed, also when an earlier attempt whose response was lost had
        created it, so the caller reads it back to learn whether that was its own. When
        every attempt failed, the ``StorageError`` says the object may or may not exist
        now."""
        return self.store.put_if_absent(self._key(path), data)

    def replace(self, path: str, data: bytes) -> None:
        """Overwrite an object whole, atomically: readers see the old bytes or the new,
        never a mix or nothing (a rename on local disks; a PUT elsewhere)."""
        self.store.put(self._key(path), data)

    def delete(self, paths: list[str]) -> None:
        """Delete objects (several at once on object storage); a missing one is fine."""
        self.store.delete([self._key(path) for path in paths])
