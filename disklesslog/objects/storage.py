"""Object storage through fsspec: write-once puts with retries, ranged gets, listing.

Everything the object backend stores goes through :class:`ObjectStorage`, so retries,
error translation and the PUT/GET counters live in one place. Objects are immutable
and written once under unique, time-sortable names (:meth:`ObjectStorage.new_key`):
nothing is ever overwritten, so a reader holding an old batch location can always
finish, and an upload retried after a lost response writes the same bytes again.

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

import contextlib
import os
import random
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

import fsspec

from ..errors import (
    ConfigError,
    DataLossError,
    DisklessLogError,
    InvalidURL,
    MissingDependencyError,
)
from ..metrics import Metrics

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
    "open_filesystem",
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

_EXTRAS = {
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "az": ("azure", "adlfs"),
    "abfs": ("azure", "adlfs"),
    "abfss": ("azure", "adlfs"),
}


def open_filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """``(fsspec filesystem, root path)`` for a URL; ``storage_options`` go to fsspec
    untouched. A missing client library raises an error naming the extra to install."""
    options = dict(storage_options or {})
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    if protocol == "file":
        options.setdefault("auto_mkdir", True)
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        extra, package = _EXTRAS.get(protocol, (None, None))
        if extra is None:
            raise MissingDependencyError(
                f"{protocol}:// needs a library that is not installed: {exc}"
            ) from None
        raise MissingDependencyError(
            f"{protocol}:// logs need {package}: pip install 'disklesslog[{extra}]'"
        ) from None
    except ValueError as exc:
        raise InvalidURL(f"cannot open {url!r}: {exc}") from None
    except TypeError as exc:  # an option the filesystem does not take
        raise ConfigError(f"storage_options rejected by {protocol}:// : {exc}") from None
    return fs, str(root).rstrip("/")


class ObjectStorage:
    """The objects of one log: ``<root>/objects/<key>`` in an fsspec filesystem."""

    def __init__(
        self,
        fs: Any,
        root: str,
        metrics: Metrics,
        *,
        put_attempts: int = 5,
        retry_delay: float = 0.05,
    ) -> None:
        if type(put_attempts) is not int or put_attempts < 1:
            raise ConfigError("put_attempts must be an int >= 1")
        self.fs = fs
        self.root = root
        self.metrics = metrics
        self.put_attempts = put_attempts
        self.retry_delay = retry_delay
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.url = f"{protocol}://{root}"
        self._local = os.path.abspath(root) if protocol in ("file", "local") else None

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    @staticmethod
    def new_key(kind: str = WAL, *, time_ns: int | None = None) -> str:
        """A fresh, write-once object key: time-sortable (this machine's clock in ns, or
        ``time_ns``), then random, then the object's ``kind`` (see :data:`KINDS`)."""
        if kind not in KINDS:
            raise ConfigError(f"unknown object kind {kind!r}; known: {list(KINDS)}")
        stamp = time.time_ns() if time_ns is None else time_ns
        suffix = f".{kind}" if kind else ""
        return f"{OBJECTS}/{stamp:020d}-{secrets.token_hex(8)}{suffix}"

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, retrying failures with exponential backoff and
        jitter. Safe to retry: the key is unique and the bytes are the same. After the
        last attempt the failure is raised as :class:`OSError` (chained to the client's)."""
        path = self.path(key)
        for attempt in range(1, self.put_attempts + 1):
            started = time.monotonic()
            try:
                self._write(path, data)
            except DisklessLogError:
                raise
            except Exception as exc:
                # Clients raise their own transient errors (gcsfs's HttpError, Azure's
                # ServiceRequestError are not OSErrors); retrying any failure is safe here
                # (a unique key, the same bytes), and the last one is reported as OSError.
                self.metrics.add("put_errors")
                if attempt == self.put_attempts:
                    raise OSError(
                        f"could not store object {key} in {self.url} after {attempt} "
                        f"attempts: {exc}"
                    ) from exc
                time.sleep(self.retry_delay * 2 ** (attempt - 1) * (0.5 + random.random()))
                continue
            self.metrics.observe("put", time.monotonic() - started)
            self.metrics.add("put_bytes", len(data))
            return

    def _write(self, path: str, data: bytes) -> None:
        """One PUT. Object stores make a PUT atomic; on a local (or network) disk the
        bytes go to a temporary file renamed into place, so nobody reads half an object."""
        if self._local is None:
            self.fs.pipe_file(path, data)
            return
        temporary = f"{path}.tmp-{secrets.token_hex(8)}"
        try:
            self.fs.pipe_file(temporary, data)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object (fewer at its end). A missing object is
        :class:`DataLossError`: the sequencer still points at it."""
        started = time.monotonic()
        try:
            data = self.fs.cat_file(self.path(key), start=start, end=end)
        except FileNotFoundError:
            raise DataLossError(
                f"object {key} is missing from {self.url} although the sequencer still "
                "references it (deleted by hand, or garbage collection ran with too "
                "short a grace period)",
                source=self.path(key),
            ) from None
        self.metrics.observe("get", time.monotonic() - started)
        self.metrics.add("get_bytes", len(data))
        return bytes(data)

    def delete(self, keys: list[str]) -> None:
        """Delete objects; already missing ones are fine (deletion is idempotent)."""
        for key in keys:
            try:
                self.fs.rm_file(self.path(key))
            except FileNotFoundError:
                continue
            self.metrics.add("deletes")

    def list_objects(self) -> dict[str, int]:
        """Every file under the data folder, ``{key: size in bytes}``: objects, and on a
        local disk the temporary files of uploads in progress (or of a crash). One
        LIST (paged by the client); garbage collection's reconcile pass uses it."""
        folder = self.path(OBJECTS)
        try:
            found = self.fs.find(folder, detail=True)
        except FileNotFoundError:
            return {}
        prefix = folder.lstrip("/") + "/"
        listed: dict[str, int] = {}
        for path, info in found.items():
            name = str(path).lstrip("/")
            if name.startswith(prefix) and info.get("type", "file") != "directory":
                listed[f"{OBJECTS}/{name[len(prefix) :]}"] = int(info.get("size") or 0)
        return listed

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def read_small(self, name: str) -> bytes:
        """A small metadata file at the root (e.g. the log marker)."""
        return bytes(self.fs.cat_file(self.path(name)))

    def write_small(self, name: str, data: bytes) -> None:
        self.put(name, data)

    def local_root(self) -> str | None:
        """The root as a local directory path, if this is the local filesystem."""
        return self._local


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
