"""Two-phase commits on object logs: staged uploads, one sequencer step to commit them.

A stager uploads ``….staged`` objects laid out like a writer's WAL objects (batches of
many streams, sorted by stream) and tells nobody. The commit hands every part's objects
to :meth:`Sequencer.commit_transaction`, which assigns offsets to all of them in one
atomic step and remembers the transaction id; an abort records the objects as orphans,
so garbage collection deletes them after its grace period. A staged object nobody
commits or aborts (the committer died) is deleted by garbage collection's reconcile
pass once it is ``STAGED_UNKNOWN_MIN_AGE`` (24 h) old; a commit refuses objects older
than ``STAGED_MAX_AGE`` (12 h), so it never refers to one that may be gone.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..config import StreamConfig
from ..errors import DisklessLogError, SequencerConflict, TransactionError
from ..sequencers.base import TransactionResult
from ..sequencers.common import check_transaction_id
from ..transactions import STAGED_MAX_AGE, StagedPart, Stager, check_parts
from .storage import STAGED, key_kind, key_time_ns

if TYPE_CHECKING:
    from .log import ObjectLog

__all__ = ["ObjectStager", "abort_transaction", "commit_transaction"]

COMMIT_ATTEMPTS = 5
"""Tries of a transaction's commit whose outcome is unknown (a lost connection): safe to
repeat, because the sequencer recognises the transaction id."""
_RETRY_DELAY = 0.05


class ObjectStager(Stager):
    """Uploads one ``….staged`` object per ``max_object_bytes`` of batches."""

    _log: ObjectLog

    def _config_for(self, stream: str) -> StreamConfig:
        return self._log.stream_config(stream, create=False) or self._log.stream_defaults

    def _store(self, data: bytes) -> str:
        key = self._log.storage.new_key(STAGED)
        self._log.storage.put(key, data)
        self._log.storage.metrics.add("staged_objects")
        return key


def commit_transaction(
    log: ObjectLog, transaction_id: str, parts: Iterable[StagedPart]
) -> TransactionResult:
    """See :meth:`AbstractLog.commit_transaction`: one ``commit_transaction`` of the
    sequencer, retried while its outcome is unknown."""
    txn = check_transaction_id(transaction_id)
    objects = check_parts(log.url, parts)
    now_ns = time.time_ns()
    for obj in objects:
        born = key_time_ns(obj.key)
        if key_kind(obj.key) != STAGED or born is None:
            raise TransactionError(f"{obj.key} is not a staged object of {log.url}")
        if now_ns - born > STAGED_MAX_AGE * 1e9:
            raise TransactionError(
                f"staged object {obj.key} is older than {STAGED_MAX_AGE / 3600:g} hours: "
                "garbage collection may have deleted it. Stage the data again"
            )
    for stream in sorted({b.stream for obj in objects for b in obj.batches}):
        if log.stream_config(stream, create=False) is None:
            log.ensure_stream(stream, None)
    pairs = [(obj.key, list(obj.batches)) for obj in objects]
    error: BaseException | None = None
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        started = time.monotonic()
        try:
            result = log.sequencer.commit_transaction(txn, pairs)
        except SequencerConflict as exc:  # nothing was applied: try again
            error = exc
        except DisklessLogError:
            raise
        except Exception as exc:  # outcome unknown: the id makes a retry safe
            error = exc
        else:
            log.storage.metrics.observe("commit", time.monotonic() - started)
            log.storage.metrics.add("committed_transactions")
            return result
        log.storage.metrics.add("commit_errors")
        time.sleep(_RETRY_DELAY * 2 ** (attempt - 1) * (0.5 + random.random()))
    raise TransactionError(
        f"transaction {txn!r} could not be committed in {COMMIT_ATTEMPTS} attempts "
        f"({error!r}); it may or may not be visible: commit it again with the same id "
        "to find out (a repeat is answered with the original offsets)"
    ) from error


def abort_transaction(log: ObjectLog, parts: Iterable[StagedPart]) -> None:
    """See :meth:`AbstractLog.abort_transaction`: every staged object becomes an orphan
    (an object a commit already made live stays: ``record_orphan`` never deletes one)."""
    for obj in check_parts(log.url, parts):
        log.sequencer.record_orphan(obj.key)
        log.storage.metrics.add("orphaned_objects")
