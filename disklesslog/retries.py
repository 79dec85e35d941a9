"""How storage requests are retried: one policy for every request the object backend and
tiering make, reads, writes and deletes alike.

Two kinds of failure are retried, each its own way:

* **A request that fails** (a connection reset, a timeout, a throttled or failed
  request: whatever the client raises, ``OSError`` or not) is made again after an
  exponential backoff with jitter, :data:`ATTEMPTS` times in all (:func:`retrying`);
  the last failure is raised as :class:`~disklesslog.StorageError` naming what was
  asked. Retrying is safe for every request retried this way: GETs and LISTs change
  nothing, PUTs write write-once keys with the same bytes (or create a key only if it
  is absent, and a retry after a lost response finds it), and DELETEs are idempotent.
  A missing object is not transient: its ``FileNotFoundError`` passes through at once,
  for the caller to say what it means (for a read usually
  :class:`~disklesslog.DataLossError`, for a delete success), and so do this library's
  own errors.
* **Bytes that arrive but fail their checksum** were damaged by the network, the
  storage or a cache on the way, or are damaged at rest; only fetching them again
  tells which. Readers and rewrites fetch them again straight from storage (past every
  cache) up to :data:`REFETCHES` times (:func:`refetched`), and report
  :class:`~disklesslog.CorruptDataError` only when that never gives bytes that pass,
  or storage returns the same bytes twice (the stored bytes are damaged: more fetches
  would only repeat them). A cure is logged as a warning (:func:`log_cured`):
  something between the storage and the reader is giving bad bytes, and an operator
  should know.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from .errors import CorruptDataError, DisklessLogError, StorageError
from .metrics import Metrics

__all__ = [
    "ATTEMPTS",
    "DELAY",
    "REFETCHES",
    "damaged",
    "log_cured",
    "pause",
    "refetched",
    "retrying",
]

log = logging.getLogger("disklesslog")

ATTEMPTS = 5
"""Attempts at one request before its failure is reported (the first one included)."""
DELAY = 0.05
"""Seconds before the first retry; each further retry waits twice as long, with jitter."""
REFETCHES = 3
"""Fetches straight from storage of bytes that failed their checksum, at most."""

T = TypeVar("T")


def pause(attempt: int, delay: float = DELAY) -> None:
    """Sleep before retry number ``attempt`` (1 for the first): ``delay * 2**(attempt-1)``,
    times a random factor in [0.5, 1.5) so that clients failing together do not retry
    together."""
    time.sleep(delay * 2 ** (attempt - 1) * (0.5 + random.random()))


def retrying(
    call: Callable[[], T],
    what: str,
    *,
    metrics: Metrics,
    counter: str,
    attempts: int = ATTEMPTS,
    delay: float = DELAY,
    final: tuple[type[Exception], ...] = (),
) -> T:
    """``call()``, made again after any failure but this library's errors and those of
    the types in ``final``, which propagate at once (reads pass ``FileNotFoundError``:
    a missing object stays missing). Each failure adds 1 to ``metrics[counter]``. After
    ``attempts`` failures, raises :class:`StorageError` ``"{what} after N attempts:
    {last failure}"``, chained to that failure.

    Clients raise their own transient errors (gcsfs's ``HttpError`` and Azure's
    ``ServiceRequestError`` are not ``OSError``), so every other exception counts."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except DisklessLogError:
            raise
        except final:
            raise
        except Exception as exc:
            metrics.add(counter)
            if attempt == attempts:
                raise StorageError(f"{what} after {attempt} attempts: {exc}") from exc
            pause(attempt, delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def log_cured(failure: CorruptDataError, refetches: int) -> None:
    """Warn that bytes which failed their check (``failure``, the last failure) passed
    it when fetched again ``refetches`` times: nothing was lost, but the network, the
    storage or a cache gave bad bytes, and an operator should know."""
    log.warning(
        "%s; fetched again straight from storage (%d time(s)), the bytes passed: the "
        "network, the storage or the block cache returned damaged bytes (nothing was lost)",
        failure,
        refetches,
    )


def refetched(
    fetch: Callable[[], bytes],
    check: Callable[[bytes], T],
    failure: CorruptDataError,
    *,
    metrics: Metrics,
    counter: str,
    previous: bytes | None = None,
) -> T:
    """What ``check`` makes of bytes that failed it (with ``failure``), fetched again
    straight from storage by ``fetch``: at most :data:`REFETCHES` times, each counted in
    ``metrics[counter]``. Bytes that pass are a cure, logged (:func:`log_cured`).

    Raises :class:`CorruptDataError` (the last failure, and the verdict) when every fetch
    fails, or as soon as one returns the same bytes as the fetch before it: storage
    holds them damaged, and more fetches would only repeat them. ``previous`` is the
    first fetch's bytes when they came straight from storage too (not from a cache,
    which may hold bytes damaged on an earlier way). Whatever ``fetch`` raises
    propagates (a missing object is not damage to retry)."""
    for attempt in range(1, REFETCHES + 1):
        metrics.add(counter)
        data = fetch()
        try:
            value = check(data)
        except CorruptDataError as exc:
            failure = exc
            if data == previous:
                raise damaged(failure, attempt, same=True) from None
            previous = data
            continue
        log_cured(failure, attempt)
        return value
    raise damaged(failure, REFETCHES, same=False)


def damaged(failure: CorruptDataError, fetches: int, *, same: bool) -> CorruptDataError:
    """The error reporting bytes as damaged once ``fetches`` fetches straight from storage
    did not cure ``failure`` (the last one): ``same`` when storage returned the same
    bytes twice."""
    if same:
        verdict = "storage returned the same bytes twice: the stored object is damaged"
    else:
        verdict = f"failed on each of {fetches} fetches straight from storage"
    return CorruptDataError(
        f"{failure.reason} ({verdict})", source=failure.source, position=failure.position
    )
