"""Two-phase commits on local logs: staged files, appended stream by stream, shown at once.

::

    <log>/staged/<ns>-<hex>.staged          a stager's batches (sorted by stream), fsynced
    <log>/transactions/.lock                flock'ed while a transaction commits
    <log>/transactions/pending/<h>.parts    the parts of a commit in progress (written once)
    <log>/transactions/pending/<h>.json     its notes: per stream, the offset its batches
                                            will get (before the append) or got (after)
    <log>/transactions/<h>.json             {"id", "committed_at", "ranges"} once committed

``<h>`` is the SHA-256 of the transaction id. The JSON files are checksummed
(``layout.encode_json``): a damaged one is :class:`CorruptDataError` naming it, since a
reader cannot guess what it holds back. Each stream has its own lock and files,
so a commit appends stream by stream (in name order, each stream's batches with one
locked ``writev``). What makes the commit all or nothing anyway is the notes file,
which readers consult:

* **Held back until the commit point** (Kafka's last stable offset). Under a stream's
  lock, before its batches are written, the offset they will get is noted in the notes
  file (written whole, by rename). A reader takes the stream's end offset first and
  reads the notes files after; a stream with a note is read only up to the noted
  offset. The commit point is the unlink of the notes file, after every stream is
  appended and the transaction record is written: from then on every stream shows the
  transaction's records, and before it none does. (The same holds back records other
  writers append after the noted offset meanwhile: a commit keeps them waiting, as an
  open Kafka transaction does.)
* **Rolled forward after a crash.** The parts file and the staged files are durable
  before any stream is touched, so an interrupted commit can always be finished:
  :func:`recover` does it when a log is opened and by garbage collection, and every
  commit finishes interrupted ones first. Streams noted with a range are skipped; the
  stream that was being appended is checked at the noted offset (are the records there
  the staged ones?) and appended only if they are not. A retry of the same id after
  that finds the record and stores nothing.
* **A commit that cannot be finished** (its staged file was deleted by hand or is
  corrupt) keeps its streams held back at the noted offsets and is retried at every
  chance, with a warning naming it. Deleting its notes file releases the hold, with
  what it appended so far visible: the operator's decision, see docs/operations.md.

An abort deletes the staged files (except those of a commit in progress, which its
roll-forward needs). Staged files of a committer that died without a retry are deleted
by :meth:`SegmentLog.collect_garbage` once ``STAGED_UNKNOWN_MIN_AGE`` (24 h) old.
Transaction records are kept :data:`TRANSACTION_RETENTION_SECONDS` (7 days) and at
most :data:`TRACKED_TRANSACTIONS` (the newest), like the sequencers' ids.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..checksummed import decode_json, encode_json
from ..config import StreamConfig
from ..errors import (
    CorruptDataError,
    DisklessLogError,
    OffsetOutOfRange,
    StreamNotFound,
    TransactionError,
)
from ..format import HEADER_SIZE, EncodedBatch, check_batch, decode_batch
from ..oserrors import typed_os_errors
from ..sequencers.base import (
    TRACKED_TRANSACTIONS,
    TRANSACTION_RETENTION_SECONDS,
    BatchToCommit,
    TransactionResult,
)
from ..sequencers.common import check_transaction_id
from ..storage.atomic import fsync_directory
from ..transactions import (
    STAGED_MAX_AGE,
    STAGED_UNKNOWN_MIN_AGE,
    StagedObject,
    StagedPart,
    Stager,
    check_parts,
)
from . import reader
from .layout import close_lock, flocked, open_lock, write_durably

if TYPE_CHECKING:
    from ..maintenance.report import MaintenanceReport
    from .log import SegmentLog
    from .stream_store import StreamStore

__all__ = [
    "PENDING",
    "STAGED",
    "TRANSACTIONS",
    "SegmentStager",
    "abort_transaction",
    "collect_staged",
    "commit_transaction",
    "held_offset",
    "pending_directory",
    "pending_transactions",
    "recover",
]

logger = logging.getLogger("disklesslog")
T = TypeVar("T")

STAGED = "staged"
TRANSACTIONS = "transactions"
PENDING = "pending"
_SUFFIX = ".staged"
_NOTES = ".json"
_PARTS = ".parts"


@typed_os_errors(also=("_config_for", "_store"))
class SegmentStager(Stager):
    """Writes one ``staged/<ns>-<hex>.staged`` file per ``max_object_bytes`` of batches."""

    _log: SegmentLog

    def _config_for(self, stream: str) -> StreamConfig:
        try:
            return self._log.read_config(stream)
        except StreamNotFound:
            return self._log.stream_defaults

    def _store(self, data: bytes) -> str:
        directory = self._log.path / STAGED
        directory.mkdir(exist_ok=True)
        name = f"{time.time_ns():020d}-{secrets.token_hex(8)}{_SUFFIX}"
        write_durably(self._log.path, directory / name, data, sync=self._sync)
        return f"{STAGED}/{name}"

    @property
    def _sync(self) -> bool:
        return self._log.durable


# ----------------------------------------------------------------- committing


def commit_transaction(
    log: SegmentLog, transaction_id: str, parts: Iterable[StagedPart]
) -> TransactionResult:
    """See the module docstring."""
    txn = check_transaction_id(transaction_id)
    objects = check_parts(log.url, parts)
    for obj in objects:
        _staged_path(log, obj.key)  # refuses keys that are not staged files of this log
    directory = log.path / TRANSACTIONS
    directory.mkdir(exist_ok=True)
    name = _digest(txn)
    with flocked(directory / ".lock"):  # commits of one log take turns (one machine)
        _forget_transactions(directory)
        finished = _finish_interrupted(log, current=name)
        done = _load_record(directory / f"{name}.json")
        if done is not None:
            _delete_staged(log, objects)  # a retry's new files: never committed
            return TransactionResult(txn, done, duplicate=name not in finished)
        now_ns = time.time_ns()
        for obj in objects:
            born = int(Path(obj.key).name.split("-", 1)[0])
            if now_ns - born > STAGED_MAX_AGE * 1e9:
                raise TransactionError(
                    f"staged file {obj.key} is older than {STAGED_MAX_AGE / 3600:g} hours: "
                    "garbage collection may have deleted it. Stage the data again"
                )
        per_stream = _batches_by_stream(log, objects)  # checked before anything is noted
        sync = log.durable
        pending = directory / PENDING
        pending.mkdir(exist_ok=True)
        if sync:
            fsync_directory(directory)
        write_durably(log.path, pending / f"{name}{_PARTS}", _dump_parts(objects), sync=sync)
        notes: dict[str, Any] = {"id": txn, "streams": {}}
        write_durably(log.path, pending / f"{name}{_NOTES}", _dump(notes), sync=sync)
        try:
            return _apply(log, name, notes, objects, per_stream)
        except BaseException as exc:
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(
                    f"transaction {txn!r} began committing before this error: readers see "
                    "none of it until it is finished, which the next commit (a retry of "
                    "the same id returns its offsets), open or gc of this log does"
                )
            raise


def _apply(
    log: SegmentLog,
    name: str,
    notes: dict[str, Any],
    objects: list[StagedObject],
    per_stream: dict[str, list[EncodedBatch]],
) -> TransactionResult:
    """Append what the notes do not show appended yet, write the record, then unlink
    the notes file (the commit point) and the rest. Runs under the transactions lock."""
    directory = log.path / TRANSACTIONS
    notes_path = directory / PENDING / f"{name}{_NOTES}"
    sync = log.durable
    streams: dict[str, Any] = notes["streams"]

    def save(durable: bool) -> None:
        write_durably(log.path, notes_path, _dump(notes), sync=sync and durable)

    for stream in sorted(per_stream):
        note = streams.get(stream, {})
        if "range" in note:
            continue
        batches = per_stream[stream]
        span = sum(b.span for b in batches)
        if "base" in note and _landed(log, stream, note["base"], batches):
            streams[stream] = {"range": [note["base"], note["base"] + span]}
            save(durable=False)
            continue

        def before(base: int, stream: str = stream) -> None:
            streams[stream] = {"base": base}
            save(durable=True)  # on disk and seen by readers before the stream changes

        def append(store: StreamStore, batches: list[EncodedBatch] = batches) -> list[int]:
            return store.append(batches, before=before)

        bases = log.with_store(stream, append, create=True)
        streams[stream] = {"range": [bases[0], bases[0] + span]}
        save(durable=False)  # a shortcut for a roll-forward, which can also check _landed
    ranges = {s: (int(n["range"][0]), int(n["range"][1])) for s, n in sorted(streams.items())}
    body = {"id": notes["id"], "committed_at": time.time(), "ranges": ranges}
    write_durably(log.path, directory / f"{name}.json", _dump(body), sync=sync)
    notes_path.unlink()  # the commit point: every stream shows the records from now on
    if sync:
        fsync_directory(notes_path.parent)
    _forget_pending(log, name, objects)
    return TransactionResult(notes["id"], ranges)


def recover(log: SegmentLog) -> None:
    """Finish the commits of this log whose committer died, unless a commit is running
    (its committer finishes them first). For a log being opened, and for gc."""
    directory = log.path / TRANSACTIONS
    try:
        with os.scandir(directory / PENDING) as entries:
            if next(entries, None) is None:
                return
        fd = open_lock(directory / ".lock")
    except FileNotFoundError:
        return
    except OSError as exc:  # a reader without write access: the next committer finishes
        _warn(log, f"cannot finish interrupted transactions ({exc})")
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        _finish_interrupted(log, current=None)
    finally:
        close_lock(fd)  # releases the lock


def _finish_interrupted(log: SegmentLog, *, current: str | None) -> set[str]:
    """Roll forward every commit left pending (the caller holds the lock, so their
    committers are gone); return the names finished. A commit that cannot be finished
    is logged and left holding its streams back, unless it is ``current`` (the id
    being committed again), whose error is the caller's."""
    pending = log.path / TRANSACTIONS / PENDING
    finished: set[str] = set()
    try:
        names = sorted(os.listdir(pending))
    except FileNotFoundError:
        return finished
    for entry in names:
        name, _, suffix = entry.partition(".")
        if f".{suffix}" == _PARTS and f"{name}{_NOTES}" not in names:
            # Written by a committer that died before it noted anything (or after its
            # commit point): nothing of it is visible; its retry starts afresh.
            done = _load_record(log.path / TRANSACTIONS / f"{name}.json") is not None
            _forget_pending(log, name, _load_parts(pending / entry) if done else [])
            continue
        if f".{suffix}" != _NOTES:
            continue
        try:
            notes, _ = _load_notes(pending / entry)
            objects = _load_parts(pending / f"{name}{_PARTS}")
            _apply(log, name, notes, objects, _batches_by_stream(log, objects))
        except (DisklessLogError, OSError, ValueError, KeyError) as exc:
            if name == current:
                raise
            _warn(
                log,
                f"an interrupted commit ({pending / entry}) cannot be finished: {exc}. Its "
                "streams stay held back at the offsets it noted; see docs/operations.md",
            )
            continue
        finished.add(name)
    return finished


def _forget_pending(log: SegmentLog, name: str, objects: list[StagedObject]) -> None:
    """Clean up after a commit point: the parts file, the pending directory if that
    leaves it empty (readers then pay one failed access()), then the staged files."""
    pending = log.path / TRANSACTIONS / PENDING
    with contextlib.suppress(FileNotFoundError):
        (pending / f"{name}{_PARTS}").unlink()
    with contextlib.suppress(OSError):  # not empty: another commit is pending
        pending.rmdir()
    _delete_staged(log, objects)


def abort_transaction(log: SegmentLog, parts: Iterable[StagedPart]) -> None:
    """Delete the parts' staged files: nothing of them was or will be visible. Files of a
    commit in progress or interrupted are kept: its roll-forward needs them."""
    objects = check_parts(log.url, parts)
    for obj in objects:
        _staged_path(log, obj.key)
    directory = log.path / TRANSACTIONS
    if not directory.exists():
        _delete_staged(log, objects)
        return
    with flocked(directory / ".lock"):
        pending = _pending_keys(log)
        _delete_staged(log, [obj for obj in objects if obj.key not in pending])


# ----------------------------------------------------------------- readers


def pending_directory(root: Path) -> str:
    """Where the notes of commits in progress are: a directory that exists only while
    one is (or was interrupted), so the check readers make costs one failed access()."""
    return str(root / TRANSACTIONS / PENDING)


def held_offset(pending: str, stream: str) -> int | None:
    """The lowest offset of ``stream`` that a commit in progress noted, or None: a
    reader shows the stream only below it. ``pending`` is :func:`pending_directory`.
    Call it *after* taking the stream's end offset (a note is written before its
    append, and unlinked only at the commit point, so an end offset that includes the
    append is always met by the note)."""
    if not os.access(pending, os.F_OK):  # the hot path: no exception, one syscall
        return None
    try:
        names = os.listdir(pending)
    except FileNotFoundError:
        return None
    held = None
    for entry in names:
        if not entry.endswith(_NOTES):
            continue
        try:
            _, streams = _load_notes(Path(pending, entry))
        except FileNotFoundError:  # its commit point passed meanwhile
            continue
        base = streams.get(stream)
        if base is not None:
            held = base if held is None else min(held, base)
    return held


def pending_transactions(root: Path) -> list[dict[str, Any]]:
    """The commits in progress or interrupted: ``{"id", "streams", "since"}`` each,
    ``streams`` mapping a stream to the offset it is held back at."""
    pending = root / TRANSACTIONS / PENDING
    found = []
    try:
        names = sorted(os.listdir(pending))
    except FileNotFoundError:
        return []
    for entry in names:
        if not entry.endswith(_NOTES):
            continue
        with contextlib.suppress(FileNotFoundError):  # its commit point passed meanwhile
            path = pending / entry
            notes, held = _load_notes(path)
            since = path.stat().st_ctime
            found.append({"id": notes["id"], "streams": held, "since": since})
    return found


def collect_staged(
    log: SegmentLog, report: MaintenanceReport, *, dry_run: bool, grace_seconds: float
) -> None:
    """Delete staged files older than ``max(grace_seconds, STAGED_UNKNOWN_MIN_AGE)``:
    parts whose committer died before committing or aborting them (not those of an
    interrupted commit, which its roll-forward needs)."""
    directory = log.path / STAGED
    if not directory.exists():
        return
    if not dry_run:
        recover(log)
    floor = max(grace_seconds, STAGED_UNKNOWN_MIN_AGE)
    now_ns = time.time_ns()
    keep = _pending_keys(log)
    deleted = 0
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        head = entry.name.split("-", 1)[0]
        if not (entry.name.endswith(_SUFFIX) and head.isdigit()):
            continue
        if now_ns - int(head) < floor * 1e9 or f"{STAGED}/{entry.name}" in keep:
            continue
        try:
            size = entry.stat().st_size
            if not dry_run:
                os.unlink(entry.path)
        except FileNotFoundError:
            continue  # committed or aborted meanwhile
        deleted += 1
        report.add(objects_deleted=1, bytes_deleted=size)
    if deleted:
        report.actions.append(
            f"{deleted:,} staged file(s) never committed deleted (older than {floor:g} s)"
        )


# ----------------------------------------------------------------------- helpers


def _warn(log: SegmentLog, message: str) -> None:
    logger.warning("%s: %s", log.url, message)


def _held_at(note: dict[str, Any]) -> int:
    """The offset a stream's note holds readers back at: where its records start."""
    return int(note["range"][0] if "range" in note else note["base"])


def _digest(transaction_id: str) -> str:
    return hashlib.sha256(transaction_id.encode()).hexdigest()


def _dump(body: Any) -> bytes:
    """A transaction file's bytes: checksummed JSON (``docs/format.md`` 2.10)."""
    return encode_json(body)


def _load(path: Path, what: str, parse: Callable[[Any], T]) -> T:
    """``parse`` of the JSON in a transaction file (checked against its checksum; files
    of version 1 have none). Anything malformed is :class:`CorruptDataError` naming
    the file; a missing file is ``FileNotFoundError``, for the caller to judge."""
    content, _ = decode_json(path.read_bytes(), str(path), what=what)
    try:
        return parse(content)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CorruptDataError(f"malformed {what} ({exc!r})", source=str(path)) from None


def _load_notes(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """A notes file's content, and the offset it holds each of its streams back at."""

    def parse(notes: Any) -> tuple[dict[str, Any], dict[str, int]]:
        held = {str(s): _held_at(n) for s, n in notes["streams"].items()}
        if not isinstance(notes["id"], str):
            raise TypeError("the id is not a string")
        return notes, held

    return _load(path, "transaction notes file", parse)


def _dump_parts(objects: list[StagedObject]) -> bytes:
    return _dump(
        [
            {
                "key": obj.key,
                "batches": [
                    [b.stream, b.position, b.size, b.span, b.record_count, b.max_timestamp]
                    for b in obj.batches
                ],
            }
            for obj in objects
        ]
    )


def _load_parts(path: Path) -> list[StagedObject]:
    def parse(parts: Any) -> list[StagedObject]:
        return [
            StagedObject(
                str(obj["key"]),
                tuple(
                    BatchToCommit(
                        stream=str(s),
                        position=int(p),
                        size=int(n),
                        span=int(span),
                        record_count=int(count),
                        max_timestamp=int(ts),
                    )
                    for s, p, n, span, count, ts in obj["batches"]
                ),
            )
            for obj in parts
        ]

    return _load(path, "transaction parts file", parse)


def _pending_keys(log: SegmentLog) -> set[str]:
    """Staged keys the parts files of pending commits name (call under the lock)."""
    keys: set[str] = set()
    pending = log.path / TRANSACTIONS / PENDING
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(pending):
            if entry.endswith(_PARTS):
                with contextlib.suppress(FileNotFoundError):
                    keys.update(obj.key for obj in _load_parts(pending / entry))
    return keys


def _load_record(path: Path) -> dict[str, tuple[int, int]] | None:
    def parse(done: Any) -> dict[str, tuple[int, int]]:
        return {str(s): (int(a), int(b)) for s, (a, b) in done["ranges"].items()}

    try:
        return _load(path, "transaction record", parse)
    except FileNotFoundError:
        return None


def _staged_path(log: SegmentLog, key: str) -> Path:
    folder, _, name = key.partition("/")
    if folder != STAGED or "/" in name or not name.endswith(_SUFFIX) or name.startswith("."):
        raise TransactionError(f"{key!r} is not a staged file of {log.url}")
    return log.path / STAGED / name


def _batches_by_stream(
    log: SegmentLog, objects: list[StagedObject]
) -> dict[str, list[EncodedBatch]]:
    """Every stream's staged batches, in transaction order, read back and checked (CRC)."""
    per_stream: dict[str, list[EncodedBatch]] = {}
    for obj in objects:
        path = _staged_path(log, obj.key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise TransactionError(
                f"staged file {obj.key} is gone: the part was aborted or collected, or the "
                "transaction committed under another id. Stage the data again"
            ) from None
        for b in obj.batches:
            try:
                header = check_batch(data, b.position)
            except CorruptDataError as exc:
                raise CorruptDataError(str(exc), source=str(path), position=b.position) from None
            if header.size != b.size or header.record_count != b.record_count:
                raise TransactionError(f"{obj.key} does not match its part's description")
            end = b.position + b.size
            batch = EncodedBatch(
                bytes(data[b.position : b.position + HEADER_SIZE]),
                bytes(data[b.position + HEADER_SIZE : end]),
                header.record_count,
                header.last_offset_delta,
                header.max_timestamp,
            )
            per_stream.setdefault(b.stream, []).append(batch)
    return per_stream


def _landed(log: SegmentLog, stream: str, base: int, batches: list[EncodedBatch]) -> bool:
    """Whether the records at ``base`` of ``stream`` are these staged batches' (the
    append a crash interrupted did happen). Compared record by record: same values,
    keys, timestamps and headers at the offsets the append would have given them. Reads
    the stream raw: the commit's own note holds those offsets back from readers."""
    end = base + sum(b.span for b in batches)

    def stored(store: StreamStore) -> list[Any]:
        if store.snapshot(raw=True).end_offset < end:
            return []
        batches = reader.read_batches(store, base, end, None, raw=True)
        return [(r.timestamp, r.key, r.value, r.headers) for b in batches for r in b.records()]

    try:
        got = log.with_store(stream, stored, create=False)
    except (StreamNotFound, OffsetOutOfRange):  # deleted, or trimmed past it since
        return False
    want = [
        (r.timestamp, r.key, r.value, r.headers)
        for b in batches
        for r in decode_batch(b.data, 0, base)[1].records()
    ]
    return got == want


def _delete_staged(log: SegmentLog, objects: list[StagedObject]) -> None:
    for obj in objects:
        with contextlib.suppress(FileNotFoundError):
            _staged_path(log, obj.key).unlink()


def _forget_transactions(directory: Path) -> None:
    """Delete transaction records past either bound (age, count), under the lock."""
    records = []
    cutoff = time.time() - TRANSACTION_RETENTION_SECONDS
    for entry in os.scandir(directory):
        if entry.name.endswith(".json") and entry.is_file():
            with contextlib.suppress(FileNotFoundError):
                records.append((entry.stat().st_mtime, entry.path))
    records.sort()
    excess = len(records) - TRACKED_TRANSACTIONS
    for i, (mtime, path) in enumerate(records):
        if i < excess or mtime < cutoff:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
