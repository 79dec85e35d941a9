"""The object backend's objects: how they are named, on top of the storage layer's
:class:`~disklesslog.storage.store.ObjectStore` (which retries every request, translates
every client error into a typed one and counts requests).

Objects are immutable and written once under unique, time-sortable names
(:meth:`ObjectStorage.new_key`): nothing is ever overwritten, so a reader holding an old
batch location can always finish, and an upload retried after a lost response writes
the same bytes again.

A key also says what its object is, so maintenance needs no state of its own to tell
(``docs/format.md`` section 3): ``objects/<ns>-<hex>`` is a WAL object written by a
writer (batches of many streams), ``objects/<ns>-<hex>.merged`` one stream's batches
copied together by merging, ``objects/<ns>-<hex>.compacted`` one stream's batches
rewritten by key compaction, ``objects/<ns>-<hex>.staged`` batches of many streams
staged for a two-phase commit (:mod:`disklesslog.transactions`). ``<ns>`` is the
writer's clock when it named the object; garbage collection judges the age of objects
the sequencer never knew by it.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from ..errors import ConfigError, CorruptDataError, DataLossError
from ..metrics import Metrics
from ..retries import ATTEMPTS, DEADLINE, DELAY
from ..storage.store import ObjectStore

__all__ = [
    "COMPACTED",
    "KINDS",
    "MERGED",
    "OBJECTS",
    "SEQUENCER_DIR",
    "STAGED",
    "WAL",
    "ObjectStorage",
    "key_kind",
    "key_time_ns",
]

OBJECTS = "objects"
"""Folder (key prefix) of every data object under the log's root."""
WAL = ""
"""Kind of the objects writers flush: batches of many streams, in commit order."""
MERGED = "merged"
"""Kind of the objects merging writes: one stream's batches, copied byte for byte."""
COMPACTED = "compacted"
"""Kind of the objects key compaction writes: one stream's surviving records."""
STAGED = "staged"
"""Kind of the objects stagers upload for a two-phase commit: laid out like WAL objects
(and merged like them once committed), but they may wait hours for their commit, so
garbage collection gives them longer before it takes them for failed uploads."""
KINDS = (WAL, MERGED, COMPACTED, STAGED)
_KEY = re.compile(r"objects/(\d{20})-[0-9a-f]{16}(?:\.(merged|compacted|staged))?")
_DATED = re.compile(r"objects/(\d{20})-")
SEQUENCER_DIR = "_sequencer"
"""Folder of the object-store sequencer's entries and checkpoints under the log's root."""


class ObjectStorage(ObjectStore):
    """The objects of one log: ``<root>/objects/<key>`` in an fsspec filesystem, and the
    small files at its root.

    Every request is retried (:class:`~disklesslog.storage.store.ObjectStore`:
    ``put_attempts`` attempts with exponential backoff and jitter from
    ``retry_delay``, none starting later than ``retry_deadline`` seconds after the
    first), PUTs, GETs, LISTs and DELETEs alike; failures count in ``put_errors``,
    ``get_errors`` (GETs and LISTs) and ``delete_errors``, and the last one is raised as
    a :class:`~disklesslog.StorageError` saying what kind it is, whatever the client
    raised (one that cannot succeed, such as a missing bucket, at once).
    """

    def __init__(
        self,
        fs: Any,
        root: str,
        metrics: Metrics,
        *,
        put_attempts: int = ATTEMPTS,
        retry_delay: float = DELAY,
        retry_deadline: float = DEADLINE,
    ) -> None:
        if type(put_attempts) is not int or put_attempts < 1:
            raise ConfigError("put_attempts must be an int >= 1")
        super().__init__(
            fs,
            root,
            metrics,
            attempts=put_attempts,
            retry_delay=retry_delay,
            retry_deadline=retry_deadline,
        )

    def path(self, key: str) -> str:
        """Where object ``key`` lives. Keys come from the sequencer, whose metadata may
        be damaged: one that could not have been made here (a NUL or another control
        character, an absolute path, ``.`` or ``..`` parts, a lone surrogate) is
        :class:`~disklesslog.CorruptDataError` naming it, never a request for it (on
        ``file://``, ``..`` would leave the log's directory)."""
        if not isinstance(key, str) or _SAFE_KEY.fullmatch(key) is None:
            raise CorruptDataError(
                f"object key {key!r} is not one this library makes ({_key_problem(key)}): "
                "the metadata naming it is damaged",
                source=self.url,
            )
        return super().path(key)

    def name(self, key: str) -> str:
        """How messages name object ``key``: by its key, which is what the sequencer
        and the log's metrics show."""
        return f"object {key} in {self.url}"

    @staticmethod
    def new_key(kind: str = WAL, *, time_ns: int | None = None) -> str:
        """A fresh, write-once object key: time-sortable (this machine's clock in ns, or
        ``time_ns``), then random, then the object's ``kind`` (see :data:`KINDS`)."""
        if kind not in KINDS:
            raise ConfigError(f"unknown object kind {kind!r}; known: {list(KINDS)}")
        stamp = time.time_ns() if time_ns is None else time_ns
        suffix = f".{kind}" if kind else ""
        return f"{OBJECTS}/{stamp:020d}-{secrets.token_hex(8)}{suffix}"

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object (fewer at its end), retrying failed GETs.
        A missing object is :class:`DataLossError` at once (the sequencer still points
        at it: no retry brings it back)."""
        data = super().get_range(key, start, end)
        if data is None:
            raise DataLossError(
                f"object {key} is missing from {self.url} although the sequencer still "
                "references it (deleted by hand, or garbage collection ran with too "
                "short a grace period)",
                source=self.path(key),
            )
        return data

    def list_objects(self) -> dict[str, int]:
        """Every file under the data folder, ``{key: size in bytes}``: objects, and on a
        local disk the temporary files of uploads in progress (or of a crash). One
        LIST (paged by the client); garbage collection's reconcile pass uses it."""
        return {key: int(info.get("size") or 0) for key, info in self.listing(OBJECTS).items()}

    def list_root(self) -> list[str]:
        """Names directly under the root (one LIST, retried; none if the root does not
        exist): what :func:`disklesslog.open` checks before it adopts a location."""
        return self.names()

    def read_small(self, name: str) -> bytes | None:
        """A small metadata file at the root (e.g. the log marker), or None if there is
        none."""
        return self.get(name)

    def write_small(self, name: str, data: bytes) -> None:
        self.put(name, data)


_PART = r"(?!\.\.?(?:/|\Z))[^\x00-\x1f\x7f/\ud800-\udfff]+"
_SAFE_KEY = re.compile(f"{_PART}(?:/{_PART})*")
"""A key :meth:`ObjectStorage.path` accepts: named parts (not ``.`` or ``..``) joined by
single slashes, no control characters or lone surrogates."""


def _key_problem(key: object) -> str:
    """Why :meth:`ObjectStorage.path` refused a key, in words."""
    if not isinstance(key, str):
        return f"it is a {type(key).__name__}, not a str"
    if not key:
        return "it is empty"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        return "it holds a control character"
    if any(0xD800 <= ord(c) <= 0xDFFF for c in key):
        return "it holds a lone surrogate"
    return "it is not a relative path of named parts"


def key_kind(key: str) -> str | None:
    """The kind (:data:`WAL`, :data:`MERGED`, :data:`COMPACTED`) a key names, or
    ``None`` for a key this library did not make."""
    match = _KEY.fullmatch(key)
    return None if match is None else match[2] or WAL


def key_time_ns(key: str) -> int | None:
    """When the object was named (ns since the epoch, the writer's clock), from the key
    or from the key a temporary upload file belongs to; ``None`` if the name has no
    time (not ours: garbage collection leaves it alone)."""
    match = _DATED.match(key)
    return None if match is None else int(match[1])
