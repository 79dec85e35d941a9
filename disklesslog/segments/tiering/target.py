"""Where a local log tiers its closed segments, and the object access tiering needs.

A log gets its tier the first time it is opened with ``tier_url=``: the URL is written
to ``<log>/tier.json`` (once, atomically), so every later open by any process reads
the tiered part without being told. Storage options (credentials) are never written:
they come from ``tier_storage_options=`` or the environment, per process.

The tier location holds ``disklesslog.json`` naming the log it belongs to (a random
id from ``tier.json``). Garbage collection deletes objects under the prefix that no
manifest of *this* log names, so two logs sharing a prefix would delete each other's
segments: a second log is refused instead.

Objects are written once under content-addressed keys (``docs/format.md`` 2.8), and a
write counts only when it is read back with the expected size and CRC-32C. Reads go
through the process-wide :class:`~disklesslog.storage.cache.BlockCache`, like the
object backend's, so a tiered segment is fetched at most once per process while hot;
its readers check what they get and confirm or discard it
(:mod:`~disklesslog.segments.tiering.reader`). Requests go through the storage layer
(:class:`~disklesslog.storage.store.ObjectStore`), so every one (GET, HEAD, LIST, PUT,
DELETE, the owner marker's conditional create) is retried with the object backend's
policy (:mod:`disklesslog.retries`): failures count in ``tier_put_errors``,
``tier_get_errors`` and ``tier_delete_errors``, the last one is raised as
:class:`~disklesslog.StorageError` whatever the client raised, a missing object that a
manifest lists is :class:`~disklesslog.DataLossError` at once, and a missing object
being deleted is success.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ...checksummed import encode_json
from ...errors import ConfigError, CorruptDataError, DataLossError, InvalidURL, StorageError
from ...forks import fork_safe_lock
from ...format import crc32c
from ...markers import MARKER, check_marker
from ...metrics import Metrics
from ...retries import DEADLINE, retrying
from ...storage.atomic import fsync_directory, replace_file
from ...storage.cache import default_cache
from ...storage.filesystems import is_memory, open_filesystem
from ...storage.store import ObjectStore
from ..layout import TMP, read_json

__all__ = ["CONFIG_FILE", "STREAMS_PREFIX", "Tier", "configure_tier", "persisted_tier_url"]

log = logging.getLogger("disklesslog")

CONFIG_FILE = "tier.json"
"""In the log directory: the tier URL and the log's id, written once."""
KIND = "disklesslog-tier"
VERSION = 1
"""Of the owner marker at the tier location."""
CONFIG_VERSION = 2
"""Of ``tier.json``: version 2 is version 1 with a checksum trailer (layout.encode_json)."""
STREAMS_PREFIX = "streams"
"""Folder (key prefix) of every tiered object under the tier URL."""
CHUNK = 8 << 20
"""Bytes per read and write when streaming a segment up or reading it back."""


# ------------------------------------------------------------ configuration


def _normalized(url: object) -> str:
    if not isinstance(url, str) or not url.strip():
        raise InvalidURL(
            f"tier_url must be a non-empty URL such as s3://bucket/prefix, not {url!r}"
        )
    if "://" not in url:
        raise InvalidURL(
            f"tier_url {url!r} is not a URL: give the object store and prefix, e.g. "
            "s3://bucket/prefix, gs://bucket/prefix, or file:///path for a directory"
        )
    return url.rstrip("/")


def persisted_tier_url(root: Path) -> tuple[str, str] | None:
    """``(tier URL, log id)`` from ``<root>/tier.json``, or ``None`` if never tiered."""
    path = root / CONFIG_FILE
    advice = "it names this log's tier: restore it, or remove it only if nothing was ever tiered"
    try:
        found = read_json(path, what="tier configuration")
    except CorruptDataError as exc:
        raise CorruptDataError(f"{exc.reason}; {advice}", source=str(path)) from None
    if found is None:
        return None
    content, checked = found
    try:
        version = content.get("version")
        if content.get("format") != KIND or version not in (1, CONFIG_VERSION):
            raise ValueError(f"not a version {CONFIG_VERSION} {KIND} file")
        if version == CONFIG_VERSION and not checked:
            raise ValueError("no checksum")
        url, log_id = content["url"], content["log_id"]
        if not isinstance(url, str) or not isinstance(log_id, str):
            raise ValueError("url and log_id must be strings")
    except (ValueError, KeyError, AttributeError) as exc:
        raise CorruptDataError(f"unreadable ({exc}); {advice}", source=str(path)) from None
    return _normalized(url), log_id


def _persist(root: Path, url: str, *, sync: bool) -> tuple[str, str]:
    """Write ``tier.json`` unless it exists (``link(2)`` refuses to replace it, so of
    racing processes one wins); returns what is there now."""
    content = {
        "format": KIND,
        "version": CONFIG_VERSION,
        "url": url,
        "log_id": secrets.token_hex(16),
    }
    temporary = root / TMP / f"{CONFIG_FILE}.{secrets.token_hex(8)}"
    temporary.write_bytes(encode_json(content))
    try:
        if sync:
            with open(temporary, "rb") as f:
                os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temporary, root / CONFIG_FILE)
            if sync:
                fsync_directory(root)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    found = persisted_tier_url(root)
    if found is None:
        raise OSError(f"{root / CONFIG_FILE} vanished right after it was written")
    return found


def configure_tier(
    root: Path,
    tier_url: str | None,
    storage_options: Mapping[str, Any] | None,
    metrics: Metrics,
    *,
    sync: bool,
    retry_deadline: float = DEADLINE,
) -> Tier | None:
    """The tier of the log at ``root``: the persisted one, or ``tier_url`` persisted now.

    A ``tier_url`` other than the persisted one is a :class:`ConfigError` (a log's
    tiered segments cannot move by reopening it elsewhere).
    """
    tier = check_tier(
        root, tier_url, storage_options, metrics, sync=sync, retry_deadline=retry_deadline
    )
    if tier is None or tier.log_id:  # none, or the persisted one
        return tier
    tier.check_owner(None)  # as does a location that belongs to another log
    url, log_id = _persist(root, tier.url, sync=sync)
    if url != tier.url:
        raise ConfigError(f"another process configured this log to tier to {url} just now")
    tier.log_id = log_id
    tier.check_owner(log_id, claim=True)
    return tier


def check_tier(
    root: Path,
    tier_url: str | None,
    storage_options: Mapping[str, Any] | None,
    metrics: Metrics,
    *,
    sync: bool,
    retry_deadline: float = DEADLINE,
) -> Tier | None:
    """What :func:`configure_tier` checks before it writes anything, and may run before
    the log directory exists (an open refused for its tier options leaves nothing
    behind): the options, the persisted tier against ``tier_url``, the URL (its client
    connects) and that it lies outside the log. Returns the persisted tier, a new one
    not yet persisted (no ``log_id``), or ``None``."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ConfigError(
            f"tier_storage_options must be a mapping of fsspec options, not {storage_options!r}"
        )
    wanted = None if tier_url is None else _normalized(tier_url)
    persisted = persisted_tier_url(root)
    if persisted is None and wanted is None and storage_options:
        raise ConfigError(
            "tier_storage_options were given but this log has no tier: pass tier_url too"
        )
    if persisted is not None and wanted is not None and wanted != persisted[0]:
        raise ConfigError(
            f"this log tiers to {persisted[0]} (recorded in {root / CONFIG_FILE}), not "
            f"{wanted}: its tiered segments cannot move; open it without tier_url or with "
            "that URL"
        )
    if persisted is not None:
        return Tier(
            persisted[0],
            persisted[1],
            storage_options,
            metrics,
            sync=sync,
            retry_deadline=retry_deadline,
        )
    if wanted is None:
        return None
    tier = Tier(wanted, "", storage_options, metrics, sync=sync, retry_deadline=retry_deadline)
    tier.connect()  # a bad URL or a missing client fails here, before anything is written
    if tier.local_path is not None:
        inside = Path(tier.local_path).resolve()
        log_root = root.resolve()
        if inside == log_root or log_root in inside.parents or inside in log_root.parents:
            raise InvalidURL(
                f"tier_url {wanted} overlaps the log directory {root}: tier to a directory "
                "outside it (or to object storage)"
            )
    return tier


# --------------------------------------------------------------- the tier


class Tier:
    """The object storage of one log's tiered segments (thread-safe)."""

    def __init__(
        self,
        url: str,
        log_id: str,
        storage_options: Mapping[str, Any] | None,
        metrics: Metrics,
        *,
        sync: bool = True,
        retry_deadline: float = DEADLINE,
    ) -> None:
        self.url = url
        self.sync = sync
        """Whether objects written to a local directory are fsynced (the log's policy)."""
        self.retry_deadline = retry_deadline
        """Seconds in which a failed request's retries must start (the log's
        ``retry_deadline_ms`` option)."""
        self.log_id = log_id
        self.metrics = metrics
        self._storage_options = storage_options
        self._lock = fork_safe_lock()
        self._objects: ObjectStore | None = None
        self._owner_checked = False

    def __repr__(self) -> str:
        return f"Tier({self.url!r})"

    def connect(self) -> ObjectStore:
        """The tier's objects, their filesystem client opened on first use: a bad URL
        raises :class:`InvalidURL`, a missing client library
        :class:`MissingDependencyError`. (A process opening a tiered log needs no client
        until it reads a tiered segment or runs tiering.)"""
        with self._lock:
            if self._objects is None:
                fs, root = open_filesystem(self.url, self._storage_options)
                self._objects = ObjectStore(
                    fs,
                    root,
                    self.metrics,
                    url=self.url,
                    prefix="tier_",
                    retry_deadline=self.retry_deadline,
                )
            return self._objects

    @property
    def objects(self) -> ObjectStore:
        """The tier's objects (:meth:`connect`)."""
        return self._objects or self.connect()

    @property
    def local_path(self) -> str | None:
        """The tier's root as a local directory, if it is one."""
        return self.objects.local_root()

    def object_url(self, key: str) -> str:
        """How messages and the block cache name an object."""
        return f"{self.url}/{key}"

    # ------------------------------------------------------------ ownership

    def check_owner(self, log_id: str | None, *, claim: bool = False) -> None:
        """Refuse a tier location that belongs to another log or holds something else
        (``log_id=None``: refuse any claimed location); with ``claim``, mark an
        unclaimed one as this log's. Checked once per process."""
        if self._owner_checked:
            return
        raw = self.objects.get(MARKER)
        if raw is None:
            if not (claim and log_id):
                return
            data = json.dumps({"format": KIND, "version": VERSION, "log_id": log_id}) + "\n"
            # A retry after a lost response finds the marker there: it is then read
            # back and checked like anyone else's, and found to be this log's.
            if self.objects.put_if_absent(MARKER, data.encode()):
                self._owner_checked = True
                return
            raw = self.objects.get(MARKER)
            if raw is None:
                raise StorageError(f"{self.object_url(MARKER)} exists and then does not: retry")
        check_marker(raw, kind=KIND, version=VERSION, where=self.url)
        owner = json.loads(raw).get("log_id")
        if owner != log_id:
            raise ConfigError(
                f"{self.url} holds the tiered segments of another log (id {owner}); "
                "give every log a tier prefix of its own"
            )
        self._owner_checked = True

    # ---------------------------------------------------------------- writes

    def store(
        self,
        key: str,
        data: bytes | int,
        size: int,
        crc: int,
        progress: Callable[[int], None] | None = None,
    ) -> bool:
        """Make ``key`` hold ``size`` bytes with CRC-32C ``crc``: ``data`` itself, or the
        file open as descriptor ``data`` (streamed, never read whole into memory).

        An object already there with that size and checksum is adopted (a crashed or
        concurrent run uploaded it): returns False. Otherwise uploads, retrying with
        backoff, and returns True once the object reads back right (else raises
        :class:`~disklesslog.StorageError`). Keys are content addressed, so rewriting one
        writes the same bytes.
        """
        if self.checksum(key, size) == (size, crc):
            return False
        reported = 0  # bytes told to progress: a retry reports only what goes beyond

        def sent(count: int, total: list[int]) -> None:
            nonlocal reported
            total[0] += count
            if progress is not None and total[0] > reported:
                progress(total[0] - reported)
                reported = total[0]

        def attempt() -> None:
            self._upload(key, data, size, functools.partial(sent, total=[0]))
            found = self.checksum(key, size)
            if found != (size, crc):
                raise OSError(
                    f"{self.object_url(key)} reads back as {found} (size, crc32c), "
                    f"expected {(size, crc)}"
                )

        retrying(
            attempt,
            f"could not store {self.object_url(key)}",
            metrics=self.metrics,
            counter="tier_put_errors",
            attempts=self.objects.attempts,
            delay=self.objects.retry_delay,
            deadline=self.objects.retry_deadline,
            url=self.url,
        )
        self.metrics.add("tier_puts")
        self.metrics.add("tier_put_bytes", size)
        return True

    def _upload(
        self, key: str, data: bytes | int, size: int, progress: Callable[[int], None]
    ) -> None:
        """One attempt at writing an object. On object stores a PUT (or a multipart
        upload, completed only on success) is atomic; on a local or network disk the
        bytes go to a temporary file that is synced and renamed into place; fsspec's
        memory files are visible while written, so they get the whole bytes at once."""
        objects = self.objects
        path = objects.path(key)
        if objects.local_root() is not None:
            self._write_local(path, data, size, progress, sync=self.sync)
        elif isinstance(data, bytes) or is_memory(objects.fs):
            whole = data if isinstance(data, bytes) else _pread_all(data, size)
            objects.fs.pipe_file(path, whole)
            progress(len(whole))
        else:
            out = objects.fs.open(path, "wb")
            try:
                for chunk in _chunks(data, size):
                    out.write(chunk)
                    progress(len(chunk))
            except BaseException:
                with contextlib.suppress(Exception):
                    out.discard()  # abort a multipart upload instead of completing it
                out.closed = True  # and never complete it later (close() would)
                raise
            out.close()

    @staticmethod
    def _write_local(
        path: str, data: bytes | int, size: int, progress: Callable[[int], None], *, sync: bool
    ) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        chunks = [data] if isinstance(data, bytes) else _chunks(data, size)
        replace_file(path, _reporting(chunks, progress), sync=sync)

    def checksum(self, key: str, expected_size: int) -> tuple[int, int] | None:
        """``(size, crc32c)`` of the object as stored, read back in full (requests
        retried); ``None`` if it is missing. An object of another size is not read (its
        CRC is then 0)."""
        objects = self.objects
        path = objects.path(key)
        what = f"could not read back {self.object_url(key)}"
        with contextlib.suppress(Exception):
            objects.fs.invalidate_cache(path)
        crc, position = 0, 0
        try:
            size = int(objects.request(functools.partial(objects.fs.info, path), what)["size"])
            if size != expected_size:
                return size, 0
            while position < size:
                get = functools.partial(
                    objects.fs.cat_file, path, start=position, end=min(size, position + CHUNK)
                )
                chunk = bytes(objects.request(get, what))
                if not chunk:
                    break
                crc = crc32c(chunk, crc)
                position += len(chunk)
        except FileNotFoundError:
            return None
        return position, crc

    def delete(self, keys: list[str], sizes: Mapping[str, int] | None = None) -> int:
        """Delete objects, retrying failures (counted in ``tier_delete_errors``); returns
        how many existed. Deleting is idempotent: a missing object (deleted by another
        run, or by an earlier attempt whose response was lost) is not an error. Their
        blocks leave this process's block cache too, memory and disk, rather than wait
        for their turn to be evicted (``sizes``: key -> bytes, so every block is
        found; without it, only each object's first block)."""
        count = self.objects.delete(keys)
        known = sizes or {}
        default_cache().forget_objects({self.object_url(k): known.get(k, 0) for k in keys})
        return count

    def list_objects(self) -> list[tuple[str, float | None]]:
        """``(key, modified time in seconds or None)`` of every object under
        ``streams/``: what garbage collection reconciles against the manifests."""
        listed = self.objects.listing(STREAMS_PREFIX)
        return sorted((key, _modified(info)) for key, info in listed.items())

    # ----------------------------------------------------------------- reads

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object, retrying failed GETs; a missing one is
        :class:`DataLossError` at once."""
        data = self.objects.get_range(key, start, end)
        if data is None:
            raise DataLossError(
                f"tiered object {self.object_url(key)} is missing although the stream's "
                "manifest lists it (deleted by hand, or garbage collection ran with too "
                "short a grace period); the records in it are lost",
                source=self.object_url(key),
            )
        return data

    def read(self, key: str, start: int, end: int, *, refresh: bool = False) -> bytes:
        """Bytes ``[start, end)`` of an immutable tiered object through the block cache,
        for a reader that checks them and then calls :meth:`confirm` or :meth:`discard`;
        ``refresh`` fetches them again straight from storage."""

        def fetch(range_start: int, range_end: int) -> bytes:
            return self.get_range(key, range_start, range_end)

        return default_cache().read(
            self.object_url(key),
            start,
            end,
            fetch,
            metrics=self.metrics,
            checked=True,
            refresh=refresh,
        )

    def confirm(self, key: str, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of a tiered object passed their checks: the cache may
        keep the blocks holding them on disk."""
        default_cache().confirm(self.object_url(key), start, end)

    def discard(self, key: str, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of a tiered object failed their checks: drop them from
        the cache."""
        default_cache().invalidate(self.object_url(key), start, end)


def _chunks(fd: int, size: int) -> Iterator[bytes]:
    """The first ``size`` bytes of an open file, ``CHUNK`` at a time."""
    position = 0
    while position < size:
        chunk = os.pread(fd, min(CHUNK, size - position), position)
        if not chunk:
            raise OSError(f"the file ends at byte {position}, expected {size} bytes")
        yield chunk
        position += len(chunk)


def _reporting(chunks: Iterable[bytes], progress: Callable[[int], None]) -> Iterator[bytes]:
    """``chunks``, passing each one's size to ``progress`` once it was written (when
    the writer asks for the next)."""
    for chunk in chunks:
        yield chunk
        progress(len(chunk))


def _pread_all(fd: int, size: int) -> bytes:
    return b"".join(_chunks(fd, size))


def _modified(info: Mapping[str, Any]) -> float | None:
    """An fsspec listing entry's modification time in seconds, whatever the client
    calls it (``LastModified`` s3fs, ``updated`` gcsfs, ``last_modified`` adlfs,
    ``mtime`` local, ``created`` memory)."""
    for name in ("LastModified", "last_modified", "updated", "mtime", "modified", "created"):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None
