"""How storage requests are retried: one policy for every request the object backend,
tiering and the object-store sequencer make, reads, writes and deletes alike.

Two kinds of failure are retried, each its own way:

* **A request that fails** is first classified (:mod:`disklesslog.storage.failures`):
  a missing bucket or container (:class:`~disklesslog.StorageNotFound`) and refused or
  missing credentials (:class:`~disklesslog.StoragePermissionError`) can never succeed
  and are raised at once; an unreachable or failing storage
  (:class:`~disklesslog.StorageUnavailable`: connection refused or reset, DNS,
  timeouts, HTTP 5xx), a throttled request (:class:`~disklesslog.StorageThrottled`:
  HTTP 429, S3's 503 SlowDown) and failures of no known kind (clients raise transient
  errors of their own types) are made again (:func:`retrying`) after an exponential
  backoff with full jitter (:func:`backoff`), longer for throttled requests, and never
  shorter than the storage asked for in a ``Retry-After`` header, at most
  :data:`ATTEMPTS` times in all and never past the request's deadline
  (:data:`DEADLINE`, the ``retry_deadline_ms`` log option): no attempt
  starts that would begin after it. The last failure is raised, typed, naming what
  was asked. Retrying is safe for every request retried this way: GETs and LISTs
  change nothing, PUTs write write-once keys with the same bytes (or create a key
  only if it is absent, and a retry after a lost response finds it), and DELETEs are
  idempotent. A missing object is not a failure: its ``FileNotFoundError`` passes
  through at once, for the caller to say what it means (for a read usually
  :class:`~disklesslog.DataLossError`, for a delete success), and so do this
  library's own errors. Each failed attempt is logged at DEBUG on the
  ``disklesslog`` logger; a request that succeeded only after retries, or that gave
  up, at WARNING.
* **Bytes that arrive but fail their checksum** were damaged by the network, the
  storage or a cache on the way, or are damaged at rest; only fetching them again
  tells which. Readers and rewrites fetch them again straight from storage (past every
  cache) up to :data:`REFETCHES` times (:func:`refetched`), and report
  :class:`~disklesslog.CorruptDataError` only when that never gives bytes that pass,
  or storage returns the same bytes twice (the stored bytes are damaged: more fetches
  would only repeat them). A cure is logged as a warning (:func:`log_cured`):
  something between the storage and the reader is giving bad bytes, and an operator
  should know.

The deadline bounds this library's retries, not one attempt: a client that retries
inside a call (s3fs and botocore, gcsfs and azure-core all do, for up to tens of
seconds against an unreachable endpoint) spends its own time first. Configure the
client's retries and timeouts through ``storage_options`` to bound that too.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from .errors import (
    ConfigError,
    CorruptDataError,
    DisklessLogError,
    StorageNotFound,
    StorageThrottled,
)
from .metrics import Metrics
from .storage.failures import classify, retry_after, storage_error

__all__ = [
    "ATTEMPTS",
    "DEADLINE",
    "DELAY",
    "MAX_DELAY",
    "REFETCHES",
    "THROTTLED_FACTOR",
    "backoff",
    "damaged",
    "deadline_seconds",
    "log_cured",
    "refetched",
    "retrying",
]

log = logging.getLogger("disklesslog")

ATTEMPTS = 5
"""Attempts at one request before its failure is reported (the first one included)."""
DELAY = 0.05
"""Seconds of the first backoff's ceiling; each further retry's ceiling doubles."""
MAX_DELAY = 10.0
"""Seconds a backoff's ceiling never exceeds."""
THROTTLED_FACTOR = 10
"""How much longer a throttled request backs off: the storage asked for fewer
requests, and retrying as fast as after a dropped connection would keep it refusing."""
DEADLINE_MS = 30_000
"""The default of the ``retry_deadline_ms`` option of every log that reaches object
storage (an object log, and a local log's tier)."""
DEADLINE = DEADLINE_MS / 1000
"""Seconds after a request's first attempt in which its retries must start
(:data:`DEADLINE_MS` in seconds)."""
REFETCHES = 3
"""Fetches straight from storage of bytes that failed their checksum, at most."""

T = TypeVar("T")


def backoff(attempt: int, delay: float = DELAY, *, throttled: bool = False) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first): "full jitter",
    a random time between 0 and ``delay * 2**(attempt-1)`` (times
    :data:`THROTTLED_FACTOR` when ``throttled``, at most :data:`MAX_DELAY`), so that
    clients failing together spread their retries instead of retrying together."""
    ceiling = delay * (THROTTLED_FACTOR if throttled else 1) * 2 ** (attempt - 1)
    return random.uniform(0, min(ceiling, MAX_DELAY))


def deadline_seconds(option: object, name: str = "retry_deadline_ms") -> float:
    """The retry deadline in seconds from an option in milliseconds (a positive int);
    anything else is a :class:`ConfigError`."""
    if type(option) is not int or option <= 0:
        raise ConfigError(f"{name} must be a positive int (milliseconds), not {option!r}")
    return option / 1000


def retrying(
    call: Callable[[], T],
    what: str,
    *,
    metrics: Metrics | None = None,
    counter: str = "",
    attempts: int = ATTEMPTS,
    delay: float = DELAY,
    final: tuple[type[Exception], ...] = (),
    deadline: float = DEADLINE,
    url: str | None = None,
    operation: str | None = None,
) -> T:
    """``call()``, made again after a retriable failure (see the module's docstring)
    while fewer than ``attempts`` were made and the next would start within
    ``deadline`` seconds of the first. This library's errors, a ``FileNotFoundError``
    of a read (the object is missing) and exceptions of the types in ``final``
    propagate unchanged at once, unless they show a missing bucket (then
    :class:`~disklesslog.StorageNotFound`). Every other failure adds 1 to
    ``metrics[counter]``; a failure that cannot succeed is raised at once as its
    :class:`~disklesslog.StorageError` subclass, and the last retriable one as
    ``"{what} after N attempts: {failure} [...]"``, chained to it.

    ``url`` names the storage in the error; ``operation`` the request (``get``,
    ``put``, ``create``, ``delete``...), by default the ``counter``'s name without
    its ``tier_`` prefix and ``_errors`` suffix (``put_errors`` counts PUTs)."""
    operation = operation or counter.removeprefix("tier_").removesuffix("_errors") or "request"
    started = time.monotonic()
    attempt = 0
    last: Exception | None = None
    while True:
        attempt += 1
        try:
            result = call()
        except DisklessLogError:
            raise
        except Exception as exc:
            kind = classify(exc, operation)
            if kind is None or (isinstance(exc, final) and kind[0] is not StorageNotFound):
                raise  # an answer for the caller (the object is missing)
            error_class, retriable = kind
            if metrics is not None:
                metrics.add(counter)
            last = exc
            wait = backoff(attempt, delay, throttled=issubclass(error_class, StorageThrottled))
            asked = retry_after(exc) if retriable else None
            if asked is not None:
                wait = max(wait, asked)
            elapsed = time.monotonic() - started
            if not retriable or attempt >= attempts or elapsed + wait > deadline:
                failure = storage_error(exc, what, url=url, operation=operation, attempts=attempt)
                if retriable:
                    log.warning("%s (gave up after %.2f s)", failure, elapsed)
                raise failure from exc
            log.debug(
                "%s: attempt %d failed (%s: %s); retrying in %.3f s",
                what,
                attempt,
                type(exc).__name__,
                exc,
                wait,
            )
            time.sleep(wait)
        else:
            if last is not None:
                log.warning(
                    "storage request succeeded at attempt %d after %.2f s of retries; "
                    "the attempts before failed (%s: %s)",
                    attempt,
                    time.monotonic() - started,
                    what,
                    last,
                )
            return result


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
