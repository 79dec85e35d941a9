"""Leases: a named, time-limited right to do something alone, with a fencing token.

A lease is what automatic maintenance and consumer groups elect a single worker with.
Every backend keeps, per lease name, one :class:`LeaseRecord` (holder, fencing token,
change counter, duration) and offers two primitives (:class:`LeaseStore`): read it, and
replace it only if its change counter is still the one read (compare-and-swap).
:class:`LeaseKeeper` builds ``acquire``/``renew``/``release``/``holder`` on them, the
same way for every backend, so the rules below hold everywhere.

Clocks are never compared across processes (decision record 0010). Durations are
measured by each process's own monotonic clock:

* the **holder** counts its lease valid until ``duration_ms`` minus a safety margin
  (:data:`SAFETY_MARGIN`) after it *sent* the acquire or renew
  (:attr:`Lease.expires_at_ms`);
* a **contender** may take the lease over only after it has seen the same record
  (holder, token, change counter) unchanged for the lease's full ``duration_ms`` by its
  own clock, counted from when it first *received* that record. A renew changes the
  counter, so the contender starts counting again.

Since the contender receives the record after the holder sent the request that wrote
it, the contender's wait ends after the holder's validity, provided the two clocks run
at rates within the safety margin of each other. A process that has just started must
therefore watch a held lease for a full duration before it can take it over, even if
the holder died long ago: the price of needing no synchronised clocks. A holder paused
past its validity (a GC pause, a stopped VM) can still act late: the **fencing token**,
greater on every change of holder, lets the resource it guards refuse the old holder.

Records of leases nobody uses any more can be removed (:meth:`LeaseKeeper.prune`): a
store keeps a **token floor**, the greatest token *and serial* of any record it
removed, and a name with no record gets a first token and serial above it, so a name
taken again after its record was removed gets a token greater than any it had, and no
serial it had (a compare-and-swap from a serial read before the removal cannot match
the new record).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import ConfigError, CorruptDataError, LeaseLost
from .forks import fork_safe_lock
from .names import validate_lease_name

__all__ = [
    "MAX_DURATION_MS",
    "MAX_HOLDER_LENGTH",
    "SAFETY_MARGIN",
    "Lease",
    "LeaseKeeper",
    "LeaseRecord",
    "LeaseStore",
    "check_duration",
    "check_holder",
    "check_lease",
    "check_lease_record",
    "check_lease_serial",
    "check_prune_age",
    "raised_floor",
    "starts_above_floor",
]

SAFETY_MARGIN = 0.1
"""Fraction of a lease's duration its holder gives up at the end: it counts the lease
valid for ``duration_ms * (1 - SAFETY_MARGIN)``. Covers clocks whose rates differ by up
to 10% (real ones differ by parts per million) and the time between checking validity
and acting on it, for leases of seconds or more."""

MAX_DURATION_MS = 7 * 24 * 3600 * 1000
"""Longest lease duration accepted (a week): longer ones would only make a dead
holder's lease unavailable for longer."""

MAX_HOLDER_LENGTH = 255
"""Longest holder name, in characters."""


@dataclass(frozen=True)
class Lease:
    """A lease as one process knows it.

    ``token`` is the fencing token: it grows on every change of holder and is never
    given out twice for one name, even after a release. ``expires_at_ms`` is a time on
    this process's monotonic clock (milliseconds, as :func:`time.monotonic` times 1000):
    for a lease this process acquired or renewed, when it must stop counting on it (the
    safety margin already taken off); for a lease :meth:`LeaseKeeper.holder` reports of
    another holder, the earliest time this process could take it over if it is not
    renewed. Compare it with this process's clock only, never another's.
    """

    name: str
    holder: str
    token: int
    duration_ms: int
    expires_at_ms: float


@dataclass(frozen=True)
class LeaseRecord:
    """What a backend stores for one lease name.

    ``holder`` is ``None`` once released (the record stays, so the token is never
    reused). ``serial`` counts the changes of the record (acquire, renew, release; 1
    for the first): a compare-and-swap names the serial it read. ``duration_ms`` is the
    duration its holder asked for: a contender waits that long.
    """

    holder: str | None
    token: int
    serial: int
    duration_ms: int


class LeaseStore(Protocol):
    """The primitives a backend provides; each is atomic."""

    def read_lease(self, name: str) -> LeaseRecord | None:
        """The stored record of ``name``, or ``None`` if it has none (never acquired, or
        pruned). A damaged or lost record raises :class:`~disklesslog.CorruptDataError`."""
        ...

    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        """Store ``record`` for ``name`` if its stored serial is still ``serial`` (0: no
        record yet, and then only if :func:`starts_above_floor`), atomically; False
        (nothing changed) if another change came first."""
        ...

    def drop_lease(self, name: str, serial: int) -> bool:
        """Remove the record of ``name`` if its serial is still ``serial``, raising the
        token floor (:func:`raised_floor`) in the same atomic step; False (nothing
        changed) otherwise."""
        ...

    def lease_names(self) -> list[str]:
        """The names that have a record, sorted."""
        ...

    def lease_floor(self) -> int:
        """The token floor: the greatest token or serial of a removed record (0: none
        removed)."""
        ...


def check_holder(holder: object) -> str:
    """Return ``holder`` if it is a valid holder name, else raise :class:`ConfigError`.
    Printable only: no NUL (which PostgreSQL text refuses) nor line breaks in logs."""
    if (
        not isinstance(holder, str)
        or not 0 < len(holder) <= MAX_HOLDER_LENGTH
        or not holder.isprintable()
    ):
        raise ConfigError(
            f"a lease holder must be a str of 1-{MAX_HOLDER_LENGTH} printable characters, "
            f"not {holder!r}"
        )
    try:
        holder.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"a lease holder must be valid Unicode text, not {holder!r}") from None
    return holder


def check_duration(duration_ms: object) -> int:
    """Return ``duration_ms`` if it is a valid lease duration, else raise ConfigError."""
    if type(duration_ms) is not int or not 0 < duration_ms <= MAX_DURATION_MS:
        raise ConfigError(
            f"a lease duration must be an int of milliseconds from 1 to {MAX_DURATION_MS}, "
            f"not {duration_ms!r}"
        )
    return duration_ms


def check_lease(lease: object) -> Lease:
    """Return ``lease`` if it is a :class:`Lease` with valid fields, else ConfigError."""
    if not isinstance(lease, Lease):
        raise ConfigError(f"expected a Lease (from acquire), not {type(lease).__name__}")
    validate_lease_name(lease.name)
    check_holder(lease.holder)
    check_duration(lease.duration_ms)
    if type(lease.token) is not int or lease.token < 1:
        raise ConfigError(f"a lease token is an int >= 1, not {lease.token!r}")
    return lease


def check_prune_age(older_than_ms: object) -> int:
    """Return ``older_than_ms`` if it is a valid age for :meth:`LeaseKeeper.prune`, else
    raise ConfigError."""
    if type(older_than_ms) is not int or older_than_ms < 0:
        raise ConfigError(
            f"a lease prune age must be an int of milliseconds >= 0, not {older_than_ms!r}"
        )
    return older_than_ms


def starts_above_floor(record: LeaseRecord, floor: int) -> bool:
    """Whether ``record`` may be a name's first record under token floor ``floor``: its
    token above every token, and its serial above every serial, of a removed record.
    Every store checks it in the atomic step that stores a first record."""
    return record.token > floor and record.serial > floor


def raised_floor(floor: int, removed: LeaseRecord) -> int:
    """The token floor once ``removed`` is removed: above its token and its serial."""
    return max(floor, removed.token, removed.serial)


def check_lease_serial(serial: object) -> int:
    """Return ``serial`` if it is a serial a stored record can have (what a drop
    compares), else raise ConfigError."""
    if type(serial) is not int or not 0 < serial < 1 << 63:
        raise ConfigError(f"a lease serial is an int from 1 to 2^63-1, not {serial!r}")
    return serial


def check_lease_record(serial: object, record: object) -> LeaseRecord:
    """Refuse (ConfigError) a compare-and-swap whose values no keeper would write: a
    backend checks them before anything is stored."""
    if type(serial) is not int or serial < 0 or not isinstance(record, LeaseRecord):
        raise ConfigError(f"a lease swap takes a serial >= 0 and a LeaseRecord, not {serial!r}")
    if record.holder is not None:
        check_holder(record.holder)
    check_duration(record.duration_ms)
    for value in (record.token, record.serial):
        if type(value) is not int or not 0 < value < 1 << 63:
            raise ConfigError(f"lease tokens and serials are ints from 1 to 2^63-1: {record}")
    if serial and record.serial != serial + 1:
        raise ConfigError(f"a lease swap from serial {serial} writes serial {serial + 1}: {record}")
    return record


class LeaseKeeper:
    """``acquire``/``renew``/``release``/``holder`` over a :class:`LeaseStore`, with
    this process's observations of other holders' records. Thread-safe.

    ``clock`` is monotonic seconds (tests inject a fake one). One keeper per open
    sequencer or log: its observations are what lets it take over an expired lease.
    """

    def __init__(self, store: LeaseStore, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._lock = fork_safe_lock()
        # name -> (holder, token, serial) of the record last seen, and when first seen
        self._seen: dict[str, tuple[tuple[str | None, int, int], float]] = {}

    def acquire(self, name: str, holder: str, duration_ms: int) -> Lease | None:
        """Take lease ``name`` for ``holder`` for ``duration_ms`` if it is free (never
        taken, released, or seen unchanged for its full duration) or already
        ``holder``'s (then this renews it, same token); ``None`` if another holder has
        it. A new holder's token is the previous one + 1 (for the first, the token
        floor + 1: 1 in a store that never pruned a lease)."""
        validate_lease_name(name)
        check_holder(holder)
        check_duration(duration_ms)
        while True:
            sent = self._clock()
            current = self._read(name)
            if current is None:
                floor = self._store.lease_floor()
                new = LeaseRecord(holder, floor + 1, floor + 1, duration_ms)
            elif current.holder == holder:
                new = LeaseRecord(holder, current.token, current.serial + 1, duration_ms)
            elif current.holder is None or self._expired(name, current):
                new = LeaseRecord(holder, current.token + 1, current.serial + 1, duration_ms)
            else:
                return None
            if self._swap(name, 0 if current is None else current.serial, new):
                return _held(name, new, sent)

    def renew(self, lease: Lease) -> Lease:
        """Extend ``lease`` by its duration from now. Raises :class:`LeaseLost` if the
        lease has another holder or token (it expired and was taken over) or was
        released. A lease that expired but nobody took over is renewed."""
        check_lease(lease)
        while True:
            sent = self._clock()
            current = self._read(lease.name)
            if current is None or (current.holder, current.token) != (lease.holder, lease.token):
                raise LeaseLost(_lost(lease, current))
            new = LeaseRecord(lease.holder, lease.token, current.serial + 1, lease.duration_ms)
            if self._swap(lease.name, current.serial, new):
                return _held(lease.name, new, sent)

    def release(self, lease: Lease) -> None:
        """Give ``lease`` up, so another holder can take it at once (with a greater
        token). Idempotent: releasing a lease that was released or taken over changes
        nothing."""
        check_lease(lease)
        while True:
            current = self._read(lease.name)
            if current is None or (current.holder, current.token) != (lease.holder, lease.token):
                return
            new = LeaseRecord(None, current.token, current.serial + 1, current.duration_ms)
            if self._swap(lease.name, current.serial, new):
                return

    def holder(self, name: str) -> Lease | None:
        """Who holds lease ``name`` as far as this process can tell: ``None`` if it is
        free, released, or seen unchanged for its full duration (expired). A holder's
        ``expires_at_ms`` is when this process could take it over, by its own clock."""
        validate_lease_name(name)
        current = self._read(name)
        if current is None or current.holder is None or self._expired(name, current):
            return None
        with self._lock:
            seen = self._seen.get(name)
        first_seen = self._clock() if seen is None else seen[1]  # pruned meanwhile: from now
        return Lease(
            name,
            current.holder,
            current.token,
            current.duration_ms,
            first_seen * 1000 + current.duration_ms,
        )

    def prune(self, older_than_ms: int) -> list[str]:
        """Remove the records of the leases this process has seen unchanged for
        ``older_than_ms``, and which are released or expired (seen unchanged for their
        duration too): a held lease is never removed. Returns the names removed,
        sorted. A name acquired again starts above the token floor, which the removal
        raised to its token and serial, so its tokens still only grow; a holder that renews a
        removed lease gets :class:`LeaseLost`. Like a takeover, this counts on this
        process's observations: right after it starts, it removes nothing held-looking
        until it has watched the record long enough."""
        check_prune_age(older_than_ms)
        pruned = []
        for name in self._store.lease_names():
            current = self._read(name)
            if current is None:
                continue
            wait = (
                older_than_ms if current.holder is None else max(older_than_ms, current.duration_ms)
            )
            if self._unchanged_ms(name, current) < wait:
                continue
            if self._store.drop_lease(name, current.serial):
                with self._lock:
                    self._seen.pop(name, None)
                pruned.append(name)
        return pruned

    def verify(self) -> tuple[int, list[CorruptDataError]]:
        """Read every lease record: how many there are and the damage found (each
        error's ``source`` names the file, object or row). Changes nothing."""
        try:
            names = self._store.lease_names()
        except CorruptDataError as exc:
            return 0, [exc]
        found = []
        for name in names:
            try:
                self._store.read_lease(name)
            except CorruptDataError as exc:
                found.append(exc)
        return len(names), found

    def _read(self, name: str) -> LeaseRecord | None:
        """The stored record, noting when this process first saw it."""
        record = self._store.read_lease(name)
        if record is not None:
            self._note(name, record)
        return record

    def _swap(self, name: str, serial: int, record: LeaseRecord) -> bool:
        if not self._store.swap_lease(name, serial, record):
            return False
        self._note(name, record)  # seen from now on (after it was written)
        return True

    def _note(self, name: str, record: LeaseRecord) -> None:
        key = (record.holder, record.token, record.serial)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(name)
            if seen is None or seen[0] != key:
                self._seen[name] = (key, now)

    def _expired(self, name: str, record: LeaseRecord) -> bool:
        """Whether this process has seen ``record`` unchanged for its full duration."""
        return self._unchanged_ms(name, record) >= record.duration_ms

    def _unchanged_ms(self, name: str, record: LeaseRecord) -> float:
        """How long this process has seen ``record`` unchanged (-1: it has not, or
        another thread pruned it since it was read)."""
        with self._lock:
            seen = self._seen.get(name)
        if seen is None or seen[0] != (record.holder, record.token, record.serial):
            return -1
        return (self._clock() - seen[1]) * 1000


def _held(name: str, record: LeaseRecord, sent: float) -> Lease:
    """The lease the caller now holds, valid until the safety margin before its
    duration from when the request was sent."""
    assert record.holder is not None
    valid_ms = record.duration_ms * (1 - SAFETY_MARGIN)
    return Lease(name, record.holder, record.token, record.duration_ms, sent * 1000 + valid_ms)


def _lost(lease: Lease, current: LeaseRecord | None) -> str:
    if current is None or current.token < lease.token:
        what = "the store holds no such lease (it was pruned, or never granted this token)"
    elif current.holder is None:
        what = f"it was released (its token is now {current.token})"
    else:
        what = f"{current.holder!r} holds it with token {current.token}"
    return (
        f"lease {lease.name!r} (token {lease.token}) is no longer held by {lease.holder!r}: "
        f"{what}; stop the work it guards and acquire it again"
    )
