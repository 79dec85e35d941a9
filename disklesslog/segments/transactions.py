"""Two-phase commits on local logs: staged files, appended stream by stream, rolled forward.

::

    <log>/staged/<ns>-<hex>.staged        a stager's batches (sorted by stream), fsynced
    <log>/transactions/.lock              flock'ed while a transaction commits
    <log>/transactions/<h>.progress.json  which streams it appended so far (while committing)
    <log>/transactions/<h>.json           {"id", "committed_at", "ranges"} once committed

``<h>`` is the SHA-256 of the transaction id. Each stream has its own lock and files;
there is no log-wide commit point a reader consults, so a commit cannot become visible
in every stream at one instant. What it guarantees instead:

* **Per stream, all or nothing**: a stream's batches of the transaction are appended
  with one locked ``writev`` (:meth:`StreamStore.append`), contiguous.
* **Exactly once, rolled forward**: streams are appended in name order. Under each
  stream's lock, before writing, the offset its batches will get is noted in the
  progress file (fsynced); after the append, its range is. A commit interrupted by a
  crash is finished by the next commit of the same id: streams with a range are
  skipped; the stream that was being appended is checked at the noted offset (are the
  records there the staged ones?) and appended only if they are not.
* **What a crash mid-commit leaves**: until that retry, readers see the transaction's
  records in the streams before the interrupted one (in name order) and not in the
  others. The staged files stay until the commit finishes, so the retry has the data
  (an abort leaves the files an interrupted commit lists alone). A retry may bring new
  parts with the same records (a replayed Spark micro-batch): the streams already
  appended are skipped, the others appended from the new parts, and both sets of files
  are deleted at the end.

An abort deletes the staged files. Staged files of a committer that died without a
retry are deleted by :meth:`SegmentLog.collect_garbage` once ``STAGED_UNKNOWN_MIN_AGE``
(24 h) old. Transaction records are kept :data:`TRANSACTION_RETENTION_SECONDS` (7 days)
and at most :data:`TRACKED_TRANSACTIONS` (the newest), like the sequencers' ids.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import StreamConfig
from ..errors import CorruptDataError, OffsetOutOfRange, StreamNotFound, TransactionError
from ..format import HEADER_SIZE, EncodedBatch, check_batch, decode_batch
from ..sequencers.base import (
    TRACKED_TRANSACTIONS,
    TRANSACTION_RETENTION_SECONDS,
    TransactionResult,
)
from ..sequencers.common import check_transaction_id
from ..transactions import (
    STAGED_MAX_AGE,
    STAGED_UNKNOWN_MIN_AGE,
    StagedObject,
    StagedPart,
    Stager,
    check_parts,
)
from .layout import TMP, fsync_directory

if TYPE_CHECKING:
    from ..maintenance.report import MaintenanceReport
    from .log import SegmentLog
    from .store import StreamStore

__all__ = [
    "STAGED",
    "TRANSACTIONS",
    "SegmentStager",
    "abort_transaction",
    "collect_staged",
    "commit_transaction",
]

STAGED = "staged"
TRANSACTIONS = "transactions"
_SUFFIX = ".staged"


class SegmentStager(Stager):
    """Writes one ``staged/<ns>-<hex>.staged`` file per ``max_object_bytes`` of batches."""

    _log: SegmentLog

    def _config_for(self, stream: str) -> StreamConfig:
        try:
            return self._log._read_config(stream)
        except StreamNotFound:
            return self._log.stream_defaults

    def _store(self, data: bytes) -> str:
        directory = self._log.path / STAGED
        directory.mkdir(exist_ok=True)
        name = f"{time.time_ns():020d}-{secrets.token_hex(8)}{_SUFFIX}"
        _write_durably(directory / name, data, self._sync)
        return f"{STAGED}/{name}"

    @property
    def _sync(self) -> bool:
        return self._log._fsync != "never"


def commit_transaction(
    log: SegmentLog, transaction_id: str, parts: Iterable[StagedPart]
) -> TransactionResult:
    """See the module docstring."""
    txn = check_transaction_id(transaction_id)
    objects = check_parts(log.url, parts)
    sync = log._fsync != "never"
    for obj in objects:
        _staged_path(log, obj.key)  # refuses keys that are not staged files of this log
    directory = log.path / TRANSACTIONS
    directory.mkdir(exist_ok=True)
    name = hashlib.sha256(txn.encode()).hexdigest()
    record = directory / f"{name}.json"
    progress_path = directory / f"{name}.progress.json"
    with _flock(directory / ".lock"):  # commits of one log take turns (one machine)
        _forget_transactions(directory)
        if record.exists():
            done = json.loads(record.read_text())
            _delete_staged(log, objects)  # a replay's new files: never committed
            ranges = {s: (int(a), int(b)) for s, (a, b) in done["ranges"].items()}
            return TransactionResult(txn, ranges, duplicate=True)
        now_ns = time.time_ns()
        for obj in objects:
            born = int(Path(obj.key).name.split("-", 1)[0])
            if now_ns - born > STAGED_MAX_AGE * 1e9:
                raise TransactionError(
                    f"staged file {obj.key} is older than {STAGED_MAX_AGE / 3600:g} hours: "
                    "garbage collection may have deleted it. Stage the data again"
                )
        # The first attempt's notes: its staged files (kept for a retry, even from an
        # abort) and, per stream, the offset noted before its append or its range after.
        progress: dict[str, Any] = {"keys": [obj.key for obj in objects], "streams": {}}
        if progress_path.exists():
            progress = json.loads(progress_path.read_text())
        notes: dict[str, Any] = progress["streams"]

        def save() -> None:
            _write_durably(progress_path, json.dumps(progress).encode(), sync)

        per_stream = _batches_by_stream(log, objects)
        save()
        for stream in sorted(per_stream):
            note = notes.get(stream, {})
            if "range" in note:
                continue
            batches = per_stream[stream]
            span = sum(b.span for b in batches)
            if "base" in note and _landed(log, stream, note["base"], batches):
                notes[stream] = {"range": [note["base"], note["base"] + span]}
                save()
                continue

            def before(base: int, stream: str = stream) -> None:
                notes[stream] = {"base": base}
                save()

            def append(store: StreamStore, batches: list[EncodedBatch] = batches) -> list[int]:
                return store.append(batches, before=before)

            bases = log._with_store(stream, append, create=True)
            notes[stream] = {"range": [bases[0], bases[0] + span]}
            save()
        ranges = {s: (int(n["range"][0]), int(n["range"][1])) for s, n in sorted(notes.items())}
        body = {"id": txn, "committed_at": time.time(), "ranges": ranges}
        _write_durably(record, json.dumps(body).encode(), sync)
        with contextlib.suppress(FileNotFoundError):
            progress_path.unlink()
        _delete_staged(log, objects)
        _delete_keys(log, progress["keys"])  # a first attempt's parts, if they differed
        return TransactionResult(txn, ranges)


def abort_transaction(log: SegmentLog, parts: Iterable[StagedPart]) -> None:
    """Delete the parts' staged files: nothing of them was or will be visible. Files of a
    commit that was interrupted mid-way are kept (some streams may hold their records
    already): a retry of that transaction needs them to finish it."""
    objects = check_parts(log.url, parts)
    for obj in objects:
        _staged_path(log, obj.key)
    pending: set[str] = set()
    directory = log.path / TRANSACTIONS
    if directory.exists():
        with _flock(directory / ".lock"):
            for path in directory.glob("*.progress.json"):
                with contextlib.suppress(FileNotFoundError):
                    pending.update(json.loads(path.read_text())["keys"])
            _delete_staged(log, [obj for obj in objects if obj.key not in pending])
        return
    _delete_staged(log, objects)


def collect_staged(
    log: SegmentLog, report: MaintenanceReport, *, dry_run: bool, grace_seconds: float
) -> None:
    """Delete staged files older than ``max(grace_seconds, STAGED_UNKNOWN_MIN_AGE)``:
    parts whose committer died before committing or aborting them."""
    directory = log.path / STAGED
    if not directory.exists():
        return
    floor = max(grace_seconds, STAGED_UNKNOWN_MIN_AGE)
    now_ns = time.time_ns()
    deleted = 0
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        head = entry.name.split("-", 1)[0]
        if not (entry.name.endswith(_SUFFIX) and head.isdigit()):
            continue
        if now_ns - int(head) < floor * 1e9:
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
    keys, timestamps and headers at the offsets the append would have given them."""
    end = base + sum(b.span for b in batches)
    try:
        if log.stream(stream).end_offset < end:
            return False
        stored = list(log.stream(stream).read_batches(base, end))
    except (StreamNotFound, OffsetOutOfRange):  # deleted, or trimmed past it since
        return False
    got = [(r.timestamp, r.key, r.value, r.headers) for batch in stored for r in batch.records()]
    want = [
        (r.timestamp, r.key, r.value, r.headers)
        for b in batches
        for r in decode_batch(b.data, 0, base)[1].records()
    ]
    return got == want


def _delete_staged(log: SegmentLog, objects: list[StagedObject]) -> None:
    _delete_keys(log, [obj.key for obj in objects])


def _delete_keys(log: SegmentLog, keys: Iterable[str]) -> None:
    for key in keys:
        with contextlib.suppress(FileNotFoundError):
            _staged_path(log, key).unlink()


def _forget_transactions(directory: Path) -> None:
    """Delete transaction records past either bound (age, count), under the lock."""
    records = []
    cutoff = time.time() - TRANSACTION_RETENTION_SECONDS
    for entry in os.scandir(directory):
        if entry.name.endswith(".json") and not entry.name.endswith(".progress.json"):
            with contextlib.suppress(FileNotFoundError):
                records.append((entry.stat().st_mtime, entry.path))
    records.sort()
    excess = len(records) - TRACKED_TRANSACTIONS
    for i, (mtime, path) in enumerate(records):
        if i < excess or mtime < cutoff:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes, sync: bool) -> None:
    """Write ``path`` whole through a temporary file and a rename (readers and a retry
    after a crash see the old or the new content, never a torn one)."""
    draft = path.parent.parent / TMP / f"{path.name}.{uuid.uuid4().hex}.tmp"  # <log>/tmp
    try:
        with open(draft, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(draft, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(draft)
    if sync:
        fsync_directory(path.parent)
