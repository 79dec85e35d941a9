"""Automatic maintenance: one process per log runs retention, compaction, merging,
tiering, garbage collection and sequencer housekeeping in the background.

A log opened with ``maintenance="auto"`` (the default) takes part once it first writes
(an append, a writer, a stager, a created stream): a process that only reads never
maintains. Its :class:`Maintainer` thread waits one interval (Kafka's brokers also
wait before their first retention check, so a short-lived process does nothing), then
every ``maintenance_interval_ms``:

1. takes or renews the log's ``maintenance`` lease (:mod:`disklesslog.leases`), so
   that of all the processes writing the log, one maintains at a time. The lease is
   for economy, not safety: every operation is already safe to run from several
   processes at once, so a paused holder that acts after losing its lease wastes
   work but breaks nothing. Its duration is three intervals (at least five
   seconds); a holder that dies is replaced by another writer after about that long
   and one more interval.
2. runs a **pass**: first, when a minute has passed since they last ran, the log-wide
   steps: garbage collection, the sequencer's housekeeping, and pruning lease records
   unused for a day. Then the per-stream operations (retention; compaction of
   compacted streams; merging; tiering) stream by stream, round-robin from where the
   last pass stopped, until the pass has used its time budget (a quarter of the
   interval, at most :data:`MAX_BUDGET_MS`); the first stream of a pass always runs.
   Every step is a call that takes the same locks appends take only for its short
   swaps.
3. waits for the next pass: one interval when the pass finished its round over the
   streams; when the budget ran out first, the log is *behind* (a busy log gives its
   maintenance more to do per interval than a budget holds) and the next pass comes
   after as long as this one took (:data:`CATCH_UP_SHARE`), until a round completes.
   So the budget bounds the share of a core a pass takes while the log keeps up, and
   a log that writes faster than that gets up to half a core rather than a backlog of
   expired records and garbage that grows for as long as the load lasts (which is what
   a fixed budget gave: a log of 1,000 one-object flushes a second out-wrote it, and
   garbage collection, which waited for complete rounds, ran ever more rarely).

Errors are logged, counted in :meth:`Maintainer.status` and :meth:`~disklesslog.Log.metrics`,
and the step is tried again in the next pass; nothing is ever raised into an append.
Closing the log stops the thread after the step it is in, and releases the lease, so
another writer takes over at once. ``maintenance="off"`` never starts a thread: the
explicit calls (``log.maintain()``, the CLI) remain for cron jobs and one-off runs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..checksummed import decode_json, encode_json
from ..errors import (
    ConfigError,
    CorruptDataError,
    DisklessLogError,
    LeaseLost,
    LogClosedError,
    StreamNotFound,
)
from ..forks import renewed_event, reset_after_fork
from ..leases import MAX_DURATION_MS, Lease
from .report import COUNTERS, MaintenanceReport

if TYPE_CHECKING:
    from ..api import AbstractLog

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "LEASE_NAME",
    "MAX_BUDGET_MS",
    "MAX_INTERVAL_MS",
    "MIN_INTERVAL_MS",
    "MODES",
    "OPERATIONS",
    "RECONCILE_EVERY_MS",
    "Maintainer",
    "MaintenanceStatus",
    "OperationStatus",
    "check_maintenance",
    "decode_status",
    "encode_status",
]

log = logging.getLogger(__name__)

MODES = ("auto", "off")
"""Values of the ``maintenance`` option."""

DEFAULT_INTERVAL_MS = 60_000
"""Time between passes: Kafka checks retention every 5 minutes and its cleaner backs off
15 seconds when idle; a minute keeps WAL objects and expired records from piling up
while costing an idle log one lease renewal a minute."""

MIN_INTERVAL_MS = 10
MAX_INTERVAL_MS = 24 * 3600 * 1000
LEASE_INTERVALS = 3
"""The maintenance lease lasts this many intervals (at least :data:`MIN_LEASE_MS`):
renewed every pass and within passes, it survives a pass that runs late; a dead
holder's is taken over after about this long plus an interval."""

MIN_LEASE_MS = 5_000
"""The shortest maintenance lease, whatever the interval: a pass on slow storage may
outlast a short interval several times over, and the lease must outlast it."""

MAX_BUDGET_MS = 10_000
"""Most time one pass spends on per-stream steps before it yields to the next pass."""

LOG_WIDE_EVERY_MS = 60_000
"""The log-wide steps (garbage collection, housekeeping) run at most this often, however
short the interval: garbage waits out a grace of minutes and superseded sequencer
entries a retention of minutes, so collecting more often finds nothing new, while each
run lists the whole data prefix. They are due by time alone, not after a complete
round over the streams: a busy log's rounds span several passes, and garbage must not
wait for them. They run first in a pass, so they collect what earlier passes released
(what the same pass releases is still within its grace)."""

RECONCILE_EVERY_MS = 300_000
"""Garbage collection's reconcile pass (listing storage for what the log's metadata
never named: uploads whose commit never came) runs at most this often, the
five-minute age such an object must reach before it may be deleted: reconciling more
often deletes nothing sooner. The listing, and the sequencer's verified list of every
object it knows, cost what the log holds: once a minute on a log of 250,000 objects
they were a quarter of its maintenance."""

CATCH_UP_SHARE = 0.5
"""The share of its time the maintenance thread works while the log is behind (a pass
ran out of budget before its round over the streams ended): the next pass starts after
as long as the last one took, instead of a whole interval. Kafka's log cleaner likewise
works without pausing while logs are dirty, and backs off only when it finds nothing."""

OPERATIONS = ("retention", "compaction", "merge", "tiering", "gc", "housekeeping", "leases")
"""What a pass runs, in order: the first four per stream, the last three log-wide."""

LEASE_PRUNE_AFTER_MS = 24 * 3600 * 1000
"""Lease records released or expired, and unchanged for this long as the maintaining
process has seen them, are pruned (:meth:`~disklesslog.Log.prune_leases`): the lease
state stays bounded by the names in use, and a name taken again gets a greater token."""

LEASE_NAME = "maintenance"

STATUS_FILE = "maintenance.json"
"""Where a log keeps the status of its last maintenance pass, at its root: checksummed
JSON (``docs/format.md`` 2.10 and 3), written by the maintaining process after each
pass, read by ``describe`` in any process."""
STATUS_VERSION = 1


def check_maintenance(mode: object, interval_ms: object) -> tuple[str, int]:
    """Return ``(mode, interval_ms)`` if valid, else raise :class:`ConfigError`."""
    if mode not in MODES or not isinstance(mode, str):
        raise ConfigError(f"maintenance={mode!r} is unknown; choose one of {list(MODES)}")
    if type(interval_ms) is not int or not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
        raise ConfigError(
            f"maintenance_interval_ms must be an int of milliseconds in "
            f"{MIN_INTERVAL_MS}..{MAX_INTERVAL_MS}, not {interval_ms!r}"
        )
    return mode, interval_ms


@dataclass
class OperationStatus:
    """What one operation did in this process's automatic maintenance."""

    runs: int = 0
    """Times it ran (per stream for the per-stream operations)."""
    errors: int = 0
    """Runs that failed (logged; retried in the next pass)."""
    last_run_ms: int | None = None
    """When it last finished, in milliseconds since the epoch."""
    last_error: str | None = None
    """The last failure's message."""
    last_changed: str | None = None
    """The last thing it changed (a line of its report), if it ever changed anything."""
    totals: dict[str, int] = field(default_factory=dict)
    """Its report's non-zero counters, added up over every run."""


@dataclass
class MaintenanceStatus:
    """Automatic maintenance as this process sees it (:meth:`AbstractLog.maintenance_status`)."""

    mode: str
    """``"auto"`` or ``"off"``."""
    interval_ms: int
    running: bool
    """Whether this process's maintenance thread runs (it starts at the first write)."""
    maintaining: bool
    """Whether this process holds the maintenance lease now."""
    holder: str | None
    """Who holds the maintenance lease as far as this process can tell (``host:pid:id``)."""
    token: int | None = None
    """The fencing token of the lease this process holds (``None`` if it holds none):
    it grows on every change of maintainer."""
    passes: int = 0
    """Passes this process ran as the holder."""
    last_pass_ms: int | None = None
    """When its last pass ended, in milliseconds since the epoch."""
    operations: dict[str, OperationStatus] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _holder_name() -> str:
    """This process's name as the maintenance lease's holder: host, pid and a random
    part (a pid may be used again)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Stopped(Exception):
    """The log is closing: the pass ends where it is."""


class Maintainer:
    """The automatic maintenance of one open log (see the module)."""

    def __init__(
        self,
        log: AbstractLog,
        interval_ms: int,
        *,
        housekeeping: Callable[[], MaintenanceReport] | None = None,
    ) -> None:
        self._log = log
        self.interval_ms = interval_ms
        self.budget_ms = min(MAX_BUDGET_MS, interval_ms // 4)
        self.lease_ms = min(MAX_DURATION_MS, max(MIN_LEASE_MS, LEASE_INTERVALS * interval_ms))
        self.holder = _holder_name()
        self._housekeeping = housekeeping
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease: Lease | None = None
        self._cursor: str | None = None  # the last stream a pass finished
        self._log_wide_at = float("-inf")  # monotonic time of the last log-wide steps
        self._reconciled_at = float("-inf")  # ... and of the last reconciling collection
        self._passes = 0
        self._behind_passes = 0
        self._last_pass_ms: int | None = None
        self._operations = {name: OperationStatus() for name in OPERATIONS}
        self._inapplicable: set[str] = set()  # operations this kind of log has not
        self._cpu_seconds = 0.0
        self._pass_seconds = 0.0
        self.started = False
        """Whether :meth:`start` was called in this process (a plain attribute: the
        append path reads it; a forked child starts its own thread at its first write)."""
        _LIVE.add(self)

    def _forked(self) -> None:
        """In a forked child: no thread runs and no lease is held here, and the child is
        a holder of its own (under the parent's name it would renew the parent's lease
        as if it held it too, and both would maintain at once)."""
        self._lock = threading.Lock()
        self._stop = renewed_event(self._stop)
        self._thread = None
        self._lease = None
        self.started = False
        self.holder = _holder_name()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        with self._lock:
            if self.started or self._stop.is_set():
                return
            self.started = True
            self._thread = threading.Thread(
                target=self._run, name=f"disklesslog-maintenance {self._log.url}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread after its current step and release the lease. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join()

    def status(self, holder: str | None) -> MaintenanceStatus:
        with self._lock:
            lease = self._lease
            return MaintenanceStatus(
                mode="auto",
                interval_ms=self.interval_ms,
                running=self.started and not self._stop.is_set(),
                maintaining=lease is not None and lease.expires_at_ms > _now_ms(),
                holder=holder,
                token=None if lease is None else lease.token,
                passes=self._passes,
                last_pass_ms=self._last_pass_ms,
                operations={
                    name: dataclasses.replace(op, totals=dict(op.totals))
                    for name, op in self._operations.items()
                    if name not in self._inapplicable
                },
            )

    def metrics(self) -> dict[str, float]:
        """``maintenance_*`` entries for :meth:`AbstractLog.metrics`."""
        with self._lock:
            result: dict[str, float] = {
                "maintenance_passes": self._passes,
                "maintenance_behind_passes": self._behind_passes,
                "maintenance_holding": float(self._lease is not None),
                "maintenance_cpu_seconds": self._cpu_seconds,
                "maintenance_pass_seconds": self._pass_seconds,
            }
            for name, op in self._operations.items():
                if name in self._inapplicable:
                    continue
                result[f"maintenance_{name}_runs"] = op.runs
                result[f"maintenance_{name}_errors"] = op.errors
                if op.last_run_ms is not None:
                    result[f"maintenance_{name}_last_run_ms"] = op.last_run_ms
                for counter, value in op.totals.items():
                    result[f"maintenance_{name}_{counter}"] = value
        return result

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        wait = self.interval_ms / 1000
        try:
            while not self._stop.wait(wait):
                wait = self.interval_ms / 1000
                try:
                    if self._hold_lease():
                        wait = self.pause_after(*self._pass())
                except _Stopped:
                    break
                except LogClosedError:
                    break
                except Exception:  # a pass never dies for good: logged, tried again
                    log.warning("%s: a maintenance pass failed", self._log.url, exc_info=True)
        finally:
            self._give_up_lease()

    def pause_after(self, behind: bool, pass_seconds: float) -> float:
        """Seconds between a pass that took ``pass_seconds`` and the next: the interval,
        or while the log is ``behind`` what keeps the thread's share of its time at
        :data:`CATCH_UP_SHARE` (never longer than the interval)."""
        interval = self.interval_ms / 1000
        if not behind:
            return interval
        return min(interval, pass_seconds * (1 - CATCH_UP_SHARE) / CATCH_UP_SHARE)

    def _hold_lease(self) -> bool:
        """Take or renew the lease; whether this process may maintain now."""
        lease = self._lease
        try:
            if lease is not None:
                lease = self._log.renew_lease(lease)
            else:
                lease = self._log.acquire_lease(LEASE_NAME, self.holder, self.lease_ms)
                if lease is not None:
                    log.info(
                        "%s: this process (%s) maintains the log now (token %d)",
                        self._log.url,
                        self.holder,
                        lease.token,
                    )
        except LeaseLost:
            log.info("%s: another process took the maintenance lease over", self._log.url)
            lease = None
        with self._lock:
            self._lease = lease
        return lease is not None

    def _give_up_lease(self) -> None:
        with self._lock:
            lease, self._lease = self._lease, None
        if lease is not None:
            try:
                self._log.lease_keeper().release(lease)
            except DisklessLogError:
                log.warning(
                    "%s: could not release the maintenance lease (another writer takes it "
                    "over when it expires)",
                    self._log.url,
                    exc_info=True,
                )

    def _pass(self) -> tuple[bool, float]:
        """The log-wide steps when due, then per-stream steps until the budget is used.
        Returns whether the round over the streams is unfinished (the log is behind),
        and the pass's wall time."""
        started, cpu = time.monotonic(), time.thread_time()
        if started - self._log_wide_at >= LOG_WIDE_EVERY_MS / 1000 and self._renew_if_due():
            self._log_wide_at = started
            reconcile = started - self._reconciled_at >= RECONCILE_EVERY_MS / 1000
            collect = functools.partial(self._log.collect_garbage, reconcile=reconcile)
            if self._step("gc", collect) and reconcile:
                self._reconciled_at = started
            if self._housekeeping is not None and self._renew_if_due():
                self._step("housekeeping", self._housekeeping)
            if self._renew_if_due():
                self._step("leases", self._prune_leases)
        # The budget is the per-stream steps': the log-wide ones are bounded by what they
        # find, and must not starve the streams of a log whose garbage takes long.
        deadline = time.monotonic() + self.budget_ms / 1000
        names = sorted(self._log.streams())
        after = [name for name in names if self._cursor is None or name > self._cursor]
        behind = False
        for done, name in enumerate(after):
            # The first stream of a pass always runs: a budget that listing the streams
            # or renewing the lease used up (slow storage, a loaded machine) must not
            # starve the streams, nor count the log as behind with nothing done.
            if (done and time.monotonic() >= deadline) or not self._renew_if_due():
                behind = bool(done)
                break
            self._stream_steps(name)
            self._cursor = name
        if not behind:
            self._cursor = None
        took = time.monotonic() - started
        with self._lock:
            self._passes += 1
            self._behind_passes += behind
            self._last_pass_ms = int(time.time() * 1000)
            self._cpu_seconds += time.thread_time() - cpu
            self._pass_seconds += took
        self._store_status()
        return behind, took

    def _store_status(self) -> None:
        """Leave the status where ``describe`` finds it; a failure only leaves it stale."""
        try:
            self._log.write_maintenance_status(encode_status(self.status(self.holder)))
        except Exception:
            log.warning("%s: could not store the maintenance status", self._log.url, exc_info=True)

    def _prune_leases(self) -> MaintenanceReport:
        report = MaintenanceReport("leases")
        pruned = self._log.prune_leases(LEASE_PRUNE_AFTER_MS)
        if pruned:
            report.actions.append(f"pruned the records of released leases {', '.join(pruned)}")
        return report

    def _stream_steps(self, name: str) -> None:
        log_ = self._log
        self._step("retention", lambda: log_.apply_retention(name))
        try:
            compacted = log_.stream(name).config.compacted
        except DisklessLogError:  # deleted meanwhile, or unreadable: the steps say which
            compacted = False
        if compacted:
            self._step("compaction", lambda: log_.compact(name))
        self._step("merge", lambda: log_.merge(name))
        self._step("tiering", lambda: log_.tier(name))

    def _renew_if_due(self) -> bool:
        """Renew the lease once a third of it has passed, so a long pass keeps it; False
        if it was taken over (the other process goes on from here)."""
        lease = self._lease
        if lease is None:
            return False
        if lease.expires_at_ms - _now_ms() < self.lease_ms * 2 / 3:
            return self._hold_lease()
        return True

    def _step(self, operation: str, run: Callable[[], MaintenanceReport]) -> bool:
        """Run one operation, count it, log what it changed; whether it ran without an
        error (errors are logged and counted, never raised: the next pass retries)."""
        if self._stop.is_set():
            raise _Stopped
        if operation in self._inapplicable:
            return True
        try:
            report = run()
        except LogClosedError:
            raise
        except StreamNotFound:  # deleted since the pass listed it: nothing to maintain
            return True
        except Exception as exc:
            log.warning("%s: maintenance (%s) failed", self._log.url, operation, exc_info=True)
            with self._lock:
                op = self._operations[operation]
                op.runs += 1
                op.errors += 1
                op.last_run_ms = int(time.time() * 1000)
                op.last_error = f"{type(exc).__name__}: {exc}"
            return False
        if report.actions:
            log.info(
                "%s: maintenance (%s): %s", self._log.url, operation, "; ".join(report.actions)
            )
        with self._lock:
            if not report.applicable:
                self._inapplicable.add(operation)
                return True
            op = self._operations[operation]
            op.runs += 1
            op.last_run_ms = int(time.time() * 1000)
            if report.actions:
                op.last_changed = report.actions[-1]
            for counter in COUNTERS:
                value = getattr(report, counter)
                if value and counter != "streams":
                    op.totals[counter] = op.totals.get(counter, 0) + value
        return True


_LIVE: weakref.WeakSet[Maintainer] = reset_after_fork(lambda maintainer: maintainer._forked())


def encode_status(status: MaintenanceStatus) -> bytes:
    """The bytes of :data:`STATUS_FILE`: checksummed JSON (``docs/format.md`` 2.10)."""
    return encode_json({"version": STATUS_VERSION, "status": status.to_dict()})


def decode_status(raw: bytes, source: str) -> MaintenanceStatus:
    """The status a maintaining process stored (:data:`STATUS_FILE`); damage, or a
    document of another version, is :class:`~disklesslog.CorruptDataError` naming
    ``source``."""
    content, checked = decode_json(raw, source, what="maintenance status")
    body = content.get("status") if isinstance(content, dict) else None
    if not checked or content.get("version") != STATUS_VERSION or not isinstance(body, dict):
        raise CorruptDataError(
            f"not a version {STATUS_VERSION} maintenance status with its checksum", source=source
        )
    try:
        operations = {
            name: OperationStatus(**fields) for name, fields in body.pop("operations").items()
        }
        return MaintenanceStatus(**body, operations=operations)
    except (TypeError, KeyError, AttributeError) as exc:
        raise CorruptDataError(
            f"maintenance status lacks its fields: {exc}", source=source
        ) from None


def _now_ms() -> float:
    """This process's monotonic clock in milliseconds: what lease expiries are on."""
    return time.monotonic() * 1000
