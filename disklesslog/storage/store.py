"""Objects in an fsspec filesystem, reached one way by everything that keeps them: the
object backend's data objects, a local log's tiered segments and the object-store
sequencer's entries and checkpoints.

:class:`ObjectStore` is what they share: where a key lives under a root, GETs (whole or
ranged), PUTs, conditional creates (:mod:`.conditional`), listings and deletes. Every
request is retried by :func:`disklesslog.retries.retrying`, one policy for all of them
(attempts with exponential backoff and jitter; the last failure raised as
:class:`~disklesslog.StorageError` whatever the client raised), and counted in its
owner's :class:`~disklesslog.metrics.Metrics` under the owner's prefix (``get_errors``
for the object backend, ``tier_get_errors`` for tiering). A missing object is an
answer, not a failure: it is never retried, and each operation says what it returns
for one. What keys mean (how they are named and checked, what a missing one means to
a reader) is the owner's business.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..errors import DisklessLogError
from ..forks import reset_after_fork
from ..metrics import Metrics
from ..retries import ATTEMPTS, DEADLINE, DELAY, retrying
from .atomic import replace_file
from .conditional import put_if_absent
from .filesystems import is_local

__all__ = ["DELETE_CONCURRENCY", "DELETE_WINDOW", "ObjectStore"]

T = TypeVar("T")

DELETE_CONCURRENCY = 16
"""Deletes in flight at once on object storage (:meth:`ObjectStore.delete`): at a
bucket's 20-50 ms per request, 300-800 objects a second instead of 20-50. (S3 does not
charge for DELETE requests; their round trips are what they cost.)"""

DELETE_WINDOW = 1024
"""Deletes :meth:`ObjectStore.delete` hands to its threads at a time."""


class ObjectStore:
    """The objects under ``root`` of an fsspec filesystem, named by keys relative to it
    (``<root>/<key>``); thread-safe as the filesystem is.

    ``url`` names the location in messages (``<protocol>://<root>`` if not given), and
    an object in it ``<url>/<key>`` (:meth:`name`). ``prefix`` starts every metric name
    (``"tier_"`` counts ``tier_get_errors``). ``attempts``, ``retry_delay`` and
    ``retry_deadline`` (seconds after a request's first attempt in which its retries
    must start) are the retry policy's (:func:`~disklesslog.retries.retrying`), read
    by every request; failures come out as the typed
    :class:`~disklesslog.StorageError` subclasses of :mod:`.failures`.
    """

    def __init__(
        self,
        fs: Any,
        root: str,
        metrics: Metrics,
        *,
        url: str | None = None,
        prefix: str = "",
        attempts: int = ATTEMPTS,
        retry_delay: float = DELAY,
        retry_deadline: float = DEADLINE,
    ) -> None:
        self._fs = fs
        self._forked = False  # in a fork child: an async filesystem is made anew on use
        self.root = root
        self.metrics = metrics
        self.prefix = prefix
        self.attempts = attempts
        self.retry_delay = retry_delay
        self.retry_deadline = retry_deadline
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.url = url or f"{protocol}://{root}"
        self._local = os.path.abspath(root) if is_local(fs) else None
        _LIVE.add(self)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem. In a child made by ``fork()``, an async one (s3fs,
        gcsfs, adlfs: fsspec refuses to use them after a fork, their event loop and
        connections being the parent's) is replaced on first use by a new instance
        with the same options."""
        if self._forked:
            self._forked = False
            if getattr(self._fs, "async_impl", False):
                self._fs = type(self._fs)(*self._fs.storage_args, **self._fs.storage_options)
        return self._fs

    def _after_fork(self) -> None:
        self._forked = True

    def path(self, key: str) -> str:
        """Where object ``key`` lives in the filesystem."""
        return f"{self.root}/{key}"

    def name(self, key: str) -> str:
        """How messages name object ``key``."""
        return f"{self.url}/{key}"

    def local_root(self) -> str | None:
        """The root as a local directory path, if this is the local filesystem."""
        return self._local

    def request(
        self, call: Callable[[], T], what: str, *, errors: str = "get", operation: str = ""
    ) -> T:
        """``call()``, a request that reads (GET, HEAD, LIST) or deletes, retried:
        failures count in ``<prefix><errors>_errors``, and the last one is raised as
        :class:`~disklesslog.StorageError` (``"{what} after N attempts: ..."``).
        ``FileNotFoundError`` propagates at once, for the caller to say what a missing
        object means (also when a component of its path is a file, as in a location
        opened at the path of a file: nothing is there either)."""

        def attempt() -> T:
            try:
                return call()
            except NotADirectoryError as exc:
                raise FileNotFoundError(exc.errno, exc.strerror, exc.filename) from exc

        return retrying(
            attempt,
            what,
            metrics=self.metrics,
            counter=f"{self.prefix}{errors}_errors",
            attempts=self.attempts,
            delay=self.retry_delay,
            final=(FileNotFoundError,),
            deadline=self.retry_deadline,
            url=self.url,
            operation=operation or errors,
        )

    # ----------------------------------------------------------------- reads

    def get(self, key: str) -> bytes | None:
        """A whole (small) object, or None if there is none: markers, metadata,
        sequencer entries, so its bytes are not counted as data read. (Not
        ``fs.exists``: fsspec's answers False when the request fails.)"""
        path = self.path(key)
        try:
            data = self.request(lambda: self.fs.cat_file(path), f"could not read {self.name(key)}")
        except FileNotFoundError:
            return None
        return bytes(data)

    def get_range(self, key: str, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of an object (fewer at its end, none past it), or None
        if there is no such object; timed as ``<prefix>get``, counted in
        ``<prefix>get_bytes``."""
        path = self.path(key)

        def attempt() -> bytes:
            started = time.monotonic()
            data = self.fs.cat_file(path, start=start, end=end)
            self.metrics.observe(f"{self.prefix}get", time.monotonic() - started)
            return bytes(data)

        try:
            data = self.request(attempt, f"could not read {self.name(key)}")
        except FileNotFoundError:
            return None
        self.metrics.add(f"{self.prefix}get_bytes", len(data))
        return data

    def listing(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every object under the folder ``prefix``, ``{key: fsspec info}`` (``size``,
        and the modification time under the client's own name): one LIST (paged by the
        client), past fsspec's listing cache so that what another process wrote is
        seen; empty if the folder does not exist. On a local disk, also the temporary
        files of writes in progress (or of a crash)."""
        folder = self.path(prefix)
        local = self._local
        if local is not None:  # one scandir per directory: a third of find's cost
            try:
                return self.request(
                    lambda: _local_listing(os.path.join(local, prefix), prefix),
                    f"could not list {self.url}/{prefix}",
                    operation="list",
                )
            except FileNotFoundError:
                return {}
        with contextlib.suppress(Exception):  # not every filesystem caches listings
            self.fs.invalidate_cache(folder)
        try:
            found = self.request(
                lambda: self.fs.find(folder, detail=True),
                f"could not list {self.url}/{prefix}",
                operation="list",
            )
        except FileNotFoundError:
            return {}
        base = str(self.fs._strip_protocol(folder)).lstrip("/") + "/"  # as listed
        listed: dict[str, dict[str, Any]] = {}
        for path, info in found.items():
            name = str(path).lstrip("/")
            if name.startswith(base) and info.get("type", "file") != "directory":
                listed[f"{prefix}/{name[len(base) :]}"] = info
        return listed

    def names(self, folder: str = "") -> list[str]:
        """The names directly under ``folder`` (under the root if none): objects and
        folders. One LIST (paged by the client), past fsspec's listing cache; none if
        the folder does not exist."""
        path = self.path(folder) if folder else self.root
        where = f"{self.url}/{folder}" if folder else self.url
        local = self._local
        if local is not None:  # names alone: fsspec's ls makes an info dict for each one
            directory = os.path.join(local, folder) if folder else local
            try:
                return self.request(
                    lambda: _local_names(directory), f"could not list {where}", operation="list"
                )
            except FileNotFoundError:
                return []
        with contextlib.suppress(Exception):  # not every filesystem caches listings
            self.fs.invalidate_cache(path)
        try:
            listed = self.request(
                lambda: self.fs.ls(path, detail=False), f"could not list {where}", operation="list"
            )
        except FileNotFoundError:
            return []
        return [str(name).rstrip("/").rsplit("/", 1)[-1] for name in listed]

    # ---------------------------------------------------------------- writes

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, retrying failures. Readers see the object whole
        or not at all (or, overwritten, the old bytes whole), so it is safe to retry:
        keys are written once, or overwritten with the same bytes again. Timed as
        ``<prefix>put``, counted in ``<prefix>put_bytes``."""
        path = self.path(key)

        def attempt() -> None:
            started = time.monotonic()
            self._write(path, data)
            self.metrics.observe(f"{self.prefix}put", time.monotonic() - started)

        retrying(
            attempt,
            f"could not store {self.name(key)}",
            metrics=self.metrics,
            counter=f"{self.prefix}put_errors",
            attempts=self.attempts,
            delay=self.retry_delay,
            deadline=self.retry_deadline,
            url=self.url,
            operation="put",
        )
        self.metrics.add(f"{self.prefix}put_bytes", len(data))

    def _write(self, path: str, data: bytes) -> None:
        """One PUT. Object stores make a PUT atomic; on a local (or network) disk the
        bytes go to a temporary file renamed into place, so nobody reads half an object."""
        if self._local is None:
            self.fs.pipe_file(path, data)
            return
        if self.fs.auto_mkdir:  # as fsspec's local files do before a write
            os.makedirs(os.path.dirname(path), exist_ok=True)
        replace_file(path, data, sync=False)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` holding ``data`` unless it exists (:func:`.put_if_absent`),
        retrying failures (counted in ``<prefix>put_errors``). True if this call
        created it; a retry that finds the object present reports False, as a lost
        race does, so a caller that must know reads it back. When every attempt failed,
        the :class:`~disklesslog.StorageError` says the object may or may not exist."""
        path = self.path(key)
        return retrying(
            lambda: put_if_absent(self.fs, path, data),
            f"could not create {self.name(key)} (it may or may not exist now)",
            metrics=self.metrics,
            counter=f"{self.prefix}put_errors",
            attempts=self.attempts,
            delay=self.retry_delay,
            deadline=self.retry_deadline,
            url=self.url,
            operation="create",
        )

    def sizes(self, keys: Iterable[str], prefix: str) -> dict[str, int]:
        """``{key: size in bytes}`` of those of ``keys`` (all under the folder
        ``prefix``) that exist. On a local disk, one ``stat`` each: cheaper than
        listing the folder when it holds many more files than ``keys``. Elsewhere, one
        LIST of the folder (paged by the client), as a HEAD per key would cost as
        many requests as the keys."""
        wanted = list(keys)
        if self._local is None:
            listed = self.listing(prefix)
            return {key: int(listed[key].get("size") or 0) for key in wanted if key in listed}

        def stat_all() -> dict[str, int]:
            found: dict[str, int] = {}
            for key in wanted:
                try:
                    found[key] = os.stat(self.path(key)).st_size
                except FileNotFoundError:
                    continue
            return found

        return self.request(
            stat_all, f"could not look up files under {self.url}/{prefix}", operation="list"
        )

    def delete(self, keys: Iterable[str]) -> int:
        """Delete objects, retrying failures (counted in ``<prefix>delete_errors``);
        returns how many existed as far as the store tells (counted in
        ``<prefix>deletes``; S3 answers a delete of a missing key as a success).
        Deleting is idempotent: an object already missing (deleted by someone else, or
        by an earlier attempt whose response was lost) is not an error.

        On object storage up to :data:`DELETE_CONCURRENCY` requests run at once: a
        delete is one request per object on every store, and one at a time a bucket's
        round trip (tens of milliseconds) would bound garbage collection and the
        sequencer's clean-up to a few dozen objects a second, less than one busy writer
        makes. A failure that lasts is raised after the other deletes have run."""
        keys = list(keys)
        if self._local is not None:  # the common case without the retry machinery
            return sum(self._delete_local(key) for key in keys)
        if len(keys) <= 1:
            return sum(self._delete_remote(key) for key in keys)
        deleted, failure = 0, None
        with ThreadPoolExecutor(
            max_workers=min(DELETE_CONCURRENCY, len(keys)),
            thread_name_prefix="disklesslog-delete",
        ) as pool:
            # A window at a time: garbage collection hands over 100,000s of keys at
            # once, and a future for each would hold memory for all of them.
            for start in range(0, len(keys), DELETE_WINDOW):
                window = keys[start : start + DELETE_WINDOW]
                for future in [pool.submit(self._delete_remote, key) for key in window]:
                    try:
                        deleted += future.result()
                    except DisklessLogError as exc:  # raised once every delete has run
                        failure = failure or exc
        if failure is not None:
            raise failure
        return deleted

    def _delete_local(self, key: str) -> int:
        try:
            os.remove(self.path(key))
        except FileNotFoundError:
            return 0
        except OSError:
            return self._delete_remote(key)  # retried, and raised as a StorageError
        self.metrics.add(f"{self.prefix}deletes")
        return 1

    def _delete_remote(self, key: str) -> int:
        try:
            self.request(
                functools.partial(self.fs.rm_file, self.path(key)),
                f"could not delete {self.name(key)}",
                errors="delete",
            )
        except FileNotFoundError:
            return 0
        self.metrics.add(f"{self.prefix}deletes")
        return 1


def _local_names(directory: str) -> list[str]:
    """:meth:`ObjectStore.names` of a local directory: ``os.listdir``, ten times faster
    than fsspec's ``ls``, which stats every entry (the clean-up after a sequencer
    checkpoint lists hundreds of thousands of entries). A file lists itself, as in
    fsspec (so that opening a log where a file is refuses it as not empty)."""
    try:
        return os.listdir(directory)
    except NotADirectoryError:
        return [os.path.basename(directory)]


def _local_listing(directory: str, prefix: str) -> dict[str, dict[str, Any]]:
    """:meth:`ObjectStore.listing` of a local directory: the files under it, at any
    depth, each ``{"name", "size", "type", "mtime"}`` as fsspec's local listing gives
    them. ``os.scandir`` reads each directory once and its entries carry what ``stat``
    gives, where fsspec's ``find`` builds a full ``info`` per file in Python (garbage
    collection lists every data object once a minute: 300,000 of them at a high
    commit rate). A file deleted while it is listed is not listed."""
    listed: dict[str, dict[str, Any]] = {}
    pending = [(directory, prefix)]
    while pending:
        path, key_prefix = pending.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                key = f"{key_prefix}/{entry.name}"
                try:
                    if entry.is_dir(follow_symlinks=False):  # no loops
                        pending.append((entry.path, key))
                        continue
                    if not entry.is_file():
                        continue
                    info = entry.stat()
                except FileNotFoundError:
                    continue
                listed[key] = {
                    "name": entry.path,
                    "size": info.st_size,
                    "type": "file",
                    "mtime": info.st_mtime,
                }
    return listed


_LIVE: weakref.WeakSet[ObjectStore] = reset_after_fork(lambda store: store._after_fork())
