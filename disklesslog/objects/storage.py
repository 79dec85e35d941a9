"""Object storage through fsspec: write-once puts, ranged gets, listing, deletes, all
retried.

Everything the object backend stores, reads, lists and deletes goes through
:class:`ObjectStorage`, so retries (of every request alike, :mod:`disklesslog.retries`),
error translation (whatever a client raises becomes a typed error) and the request
counters live in one place. Objects are immutable and written once under unique,
time-sortable names (:meth:`ObjectStorage.new_key`): nothing is ever overwritten, so a
reader holding an old batch location can always finish, and an upload retried after a
lost response writes the same bytes again.

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
import functools
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import fsspec

from ..errors import (
    ConfigError,
    CorruptDataError,
    DataLossError,
    InvalidURL,
    MissingDependencyError,
)
from ..metrics import Metrics
from ..retries import ATTEMPTS, DEADLINE, DELAY, retrying
from ..storage.failures import storage_error

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
T = TypeVar("T")
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
    except Exception as exc:  # a client that checks its credentials or endpoint at once
        raise storage_error(exc, f"cannot open {url}", url=url, operation="open") from exc
    return fs, str(root).rstrip("/")


class ObjectStorage:
    """The objects of one log: ``<root>/objects/<key>`` in an fsspec filesystem.

    Every request is retried on failure (:mod:`disklesslog.retries`: ``put_attempts``
    attempts with exponential backoff and jitter from ``retry_delay``, none starting
    later than ``retry_deadline`` seconds after the first), PUTs, GETs, LISTs and
    DELETEs alike; failures count in ``put_errors``, ``get_errors`` (GETs and LISTs)
    and ``delete_errors``, and the last one is raised as a
    :class:`~disklesslog.StorageError` saying what kind it is, whatever the client
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
        self.fs = fs
        self.root = root
        self.metrics = metrics
        self.put_attempts = put_attempts
        self.retry_delay = retry_delay
        self.retry_deadline = retry_deadline
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.url = f"{protocol}://{root}"
        self._local = os.path.abspath(root) if protocol in ("file", "local") else None

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
        last attempt the failure is raised as :class:`~disklesslog.StorageError` (an
        ``OSError``, chained to the client's)."""
        path = self.path(key)

        def attempt() -> None:
            started = time.monotonic()
            self._write(path, data)
            self.metrics.observe("put", time.monotonic() - started)

        retrying(
            attempt,
            f"could not store object {key} in {self.url}",
            metrics=self.metrics,
            counter="put_errors",
            attempts=self.put_attempts,
            delay=self.retry_delay,
            deadline=self.retry_deadline,
            url=self.url,
        )
        self.metrics.add("put_bytes", len(data))

    def _request(self, call: Callable[[], T], what: str, counter: str) -> T:
        """A request that reads (GET, LIST) or deletes, retried like a PUT (failures count
        in ``counter``); ``FileNotFoundError`` propagates at once, for the caller to say
        what a missing object means (also when a component of its path is a file, as
        in a log opened at the path of a file: nothing is there either)."""

        def attempt() -> T:
            try:
                return call()
            except NotADirectoryError as exc:
                raise FileNotFoundError(exc.errno, exc.strerror, exc.filename) from exc

        return retrying(
            attempt,
            what,
            metrics=self.metrics,
            counter=counter,
            attempts=self.put_attempts,
            delay=self.retry_delay,
            final=(FileNotFoundError,),
            deadline=self.retry_deadline,
            url=self.url,
        )

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
        """Bytes ``[start, end)`` of an object (fewer at its end), retrying failed GETs.
        A missing object is :class:`DataLossError` at once (the sequencer still points
        at it: no retry brings it back)."""
        path = self.path(key)

        def attempt() -> bytes:
            started = time.monotonic()
            data = self.fs.cat_file(path, start=start, end=end)
            self.metrics.observe("get", time.monotonic() - started)
            return bytes(data)

        try:
            data = self._request(
                attempt, f"could not read object {key} from {self.url}", "get_errors"
            )
        except FileNotFoundError:
            raise DataLossError(
                f"object {key} is missing from {self.url} although the sequencer still "
                "references it (deleted by hand, or garbage collection ran with too "
                "short a grace period)",
                source=path,
            ) from None
        self.metrics.add("get_bytes", len(data))
        return data

    def delete(self, keys: list[str]) -> None:
        """Delete objects, retrying failures like any request (counted in
        ``delete_errors``; the last one raised as :class:`~disklesslog.StorageError`).
        Deleting is idempotent: an object already missing (deleted by another collector,
        or by an earlier attempt whose response was lost) counts as deleted."""
        for key in keys:
            path = self.path(key)
            try:
                self._request(
                    functools.partial(self.fs.rm_file, path),
                    f"could not delete object {key} from {self.url}",
                    "delete_errors",
                )
            except FileNotFoundError:
                continue
            self.metrics.add("deletes")

    def list_objects(self) -> dict[str, int]:
        """Every file under the data folder, ``{key: size in bytes}``: objects, and on a
        local disk the temporary files of uploads in progress (or of a crash). One
        LIST (paged by the client); garbage collection's reconcile pass uses it."""
        folder = self.path(OBJECTS)
        try:
            found = self._request(
                lambda: self.fs.find(folder, detail=True), f"could not list {folder}", "get_errors"
            )
        except FileNotFoundError:
            return {}
        prefix = folder.lstrip("/") + "/"
        listed: dict[str, int] = {}
        for path, info in found.items():
            name = str(path).lstrip("/")
            if name.startswith(prefix) and info.get("type", "file") != "directory":
                listed[f"{OBJECTS}/{name[len(prefix) :]}"] = int(info.get("size") or 0)
        return listed

    def list_root(self) -> list[str]:
        """Names directly under the root (one LIST, retried; none if the root does not
        exist): what :func:`disklesslog.open` checks before it adopts a location."""
        try:
            listed = self._request(
                lambda: self.fs.ls(self.root, detail=False),
                f"could not list {self.url}",
                "get_errors",
            )
        except FileNotFoundError:
            return []
        return [str(path).rstrip("/").rsplit("/", 1)[-1] for path in listed]

    def read_small(self, name: str) -> bytes | None:
        """A small metadata file at the root (e.g. the log marker), or None if there is
        none. (Not ``fs.exists``: fsspec's answers False when the request fails.)"""
        path = self.path(name)
        try:
            data = self._request(
                lambda: self.fs.cat_file(path), f"could not read {path}", "get_errors"
            )
        except FileNotFoundError:
            return None
        return bytes(data)

    def write_small(self, name: str, data: bytes) -> None:
        self.put(name, data)

    def local_root(self) -> str | None:
        """The root as a local directory path, if this is the local filesystem."""
        return self._local


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
