"""Automatic maintenance, the same contract on every backend.

A log that writes maintains itself (retention without any call), one maintainer at a
time per log (the ``maintenance`` lease), readers and ``maintenance="off"`` never
maintain, closing stops the thread and frees the lease at once, and a failing step is
logged, counted and retried while appends go on untouched. The tests run with a short
``maintenance_interval_ms`` and poll for what they wait for, so they finish as soon as
the log has done it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import disklesslog
from disklesslog import ConfigError, StorageError
from disklesslog.maintenance import LEASE_NAME

from .fixtures import LogFactory, LogFixtures

__all__ = ["MaintenanceContract"]

INTERVAL_MS = 100
OLD = 1_000_000  # ms since the epoch: records this old are past any retention here
SETTINGS: dict[str, Any] = {
    "maintenance_interval_ms": INTERVAL_MS,
    "retention_ms": 60_000,
    "segment_bytes": 1024,
}
OLD_BATCHES = 8
PER_BATCH = 5


def _write_old_and_new(log: disklesslog.Log, name: str = "s") -> int:
    """``OLD_BATCHES`` batches of records long past retention (each about a local
    segment), then one of now; returns the offset of the first new record."""
    stream = log.stream(name)
    for _ in range(OLD_BATCHES):
        stream.append_batch([b"o" * 150] * PER_BATCH, timestamps=OLD)
    return stream.append_batch([b"new"] * PER_BATCH)[0]


def _eventually(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(INTERVAL_MS / 1000 / 4)


class MaintenanceContract(LogFixtures):
    """Automatic maintenance (``maintenance="auto"``, the default) on the backend of
    :meth:`~.fixtures.LogFixtures.open_log`."""

    PATIENCE_S = 30.0
    """How long a test waits for maintenance to do something (passes on emulated
    object storage take far longer than the interval)."""

    def test_retention_happens_without_any_call(self, log_factory: LogFactory) -> None:
        log = log_factory(**SETTINGS)
        first_new = _write_old_and_new(log)
        stream = log.stream("s")
        _eventually(lambda: stream.start_offset > 0, self.PATIENCE_S, "retention ran by itself")
        _eventually(lambda: log.maintenance_status().passes > 0, self.PATIENCE_S, "its pass ended")
        # Everything of now is kept; what went is what retention_ms no longer keeps.
        assert stream.start_offset <= first_new
        assert [r.value for r in stream.read(first_new)] == [b"new"] * PER_BATCH
        assert all(r.timestamp == OLD for r in stream.read(stream.start_offset, first_new))
        status = log.maintenance_status()
        assert (status.mode, status.running, status.maintaining) == ("auto", True, True)
        assert status.holder is not None and status.token is not None
        retention = status.operations["retention"]
        assert retention.runs >= 1 and retention.errors == 0
        assert retention.last_run_ms is not None and retention.last_changed is not None
        assert retention.totals["records_removed"] == stream.start_offset
        # What it stored for other processes: who, and what the operations did.
        other = log_factory(maintenance="off")

        def stored_removal() -> bool:
            stored = other.last_maintenance()  # stored just after the pass's end
            if stored is None:
                return False
            assert stored.holder == status.holder and stored.last_pass_ms is not None
            return stored.operations["retention"].totals.get("records_removed", 0) > 0

        _eventually(stored_removal, self.PATIENCE_S, "the pass's status is stored")
        # A complete round (one stream here) is followed by the log-wide steps.
        assert log.maintenance_status().operations["gc"].runs >= 1
        metrics = log.metrics()
        assert metrics["maintenance_passes"] >= 1
        assert metrics["maintenance_retention_records_removed"] == stream.start_offset
        assert metrics["maintenance_cpu_seconds"] >= 0

    def test_off_never_maintains(self, log_factory: LogFactory) -> None:
        log = log_factory(**SETTINGS, maintenance="off")
        _write_old_and_new(log)
        time.sleep(5 * INTERVAL_MS / 1000)
        assert log.stream("s").start_offset == 0
        status = log.maintenance_status()
        assert (status.mode, status.running, status.maintaining) == ("off", False, False)
        assert status.holder is None and log.lease_holder(LEASE_NAME) is None
        assert not [name for name in log.metrics() if name.startswith("maintenance_")]
        assert log.last_maintenance() is None
        # The explicit call still works.
        assert log.apply_retention("s").records_removed > 0

    def test_a_reader_never_maintains(self, log_factory: LogFactory) -> None:
        writer = log_factory(**SETTINGS, maintenance="off")
        first_new = _write_old_and_new(writer)
        writer.close()
        reader = log_factory(**SETTINGS)  # "auto", but it only reads
        assert reader.stream("s").end_offset == first_new + PER_BATCH
        assert len(list(reader.stream("s").read())) == first_new + PER_BATCH
        time.sleep(5 * INTERVAL_MS / 1000)
        assert reader.stream("s").start_offset == 0
        assert not reader.maintenance_status().running
        assert reader.lease_holder(LEASE_NAME) is None

    def test_one_maintainer_at_a_time_and_close_hands_over(self, log_factory: LogFactory) -> None:
        first, second = log_factory(**SETTINGS), log_factory(**SETTINGS)
        first.stream("a").append(b"x")
        second.stream("b").append(b"y")
        logs = (first, second)
        _eventually(
            lambda: any(log.maintenance_status().passes for log in logs),
            self.PATIENCE_S,
            "one of two writers maintains",
        )
        for _ in range(10):  # one holder; the other keeps out
            time.sleep(INTERVAL_MS / 1000)
            maintaining = [log.maintenance_status().maintaining for log in logs]
            assert maintaining.count(True) <= 1, maintaining
        holder, other = logs if logs[0].maintenance_status().passes else logs[::-1]
        assert other.maintenance_status().passes == 0
        token = holder.maintenance_status().token
        assert token is not None
        started = time.monotonic()
        holder.close()  # stops its thread and releases the lease: taken over at once
        assert time.monotonic() - started < self.PATIENCE_S
        _eventually(
            lambda: other.maintenance_status().maintaining,
            self.PATIENCE_S,
            "the other writer takes maintenance over after a close",
        )
        taken = other.maintenance_status().token
        assert taken is not None and taken > token

    def test_a_failing_step_is_retried_and_never_reaches_appends(
        self, log_factory: LogFactory, caplog: pytest.LogCaptureFixture, monkeypatch: Any
    ) -> None:
        log = log_factory(**SETTINGS)
        real = log.apply_retention
        failures = [3]
        lock = threading.Lock()

        def failing(*args: Any, **kwargs: Any) -> Any:
            with lock:
                if failures[0]:
                    failures[0] -= 1
                    raise StorageError("injected: the store is down")
            return real(*args, **kwargs)

        monkeypatch.setattr(log, "apply_retention", failing)
        caplog.set_level(logging.WARNING, logger="disklesslog.maintenance.auto")
        first_new = _write_old_and_new(log)
        stream = log.stream("s")
        appended = 0
        deadline = time.monotonic() + self.PATIENCE_S
        while stream.start_offset == 0:  # appends go on through the failures
            assert time.monotonic() < deadline, "retention never succeeded after failing"
            stream.append(b"more")
            appended += 1
            time.sleep(INTERVAL_MS / 1000 / 4)
        assert failures == [0]
        retention = log.maintenance_status().operations["retention"]
        assert retention.errors == 3
        assert retention.last_error == "StorageError: injected: the store is down"
        assert "maintenance (retention) failed" in caplog.text
        assert stream.end_offset == first_new + PER_BATCH + appended

    def test_bad_maintenance_options_are_refused(self, log_factory: LogFactory) -> None:
        for options in (
            {"maintenance": "sometimes"},
            {"maintenance": True},
            {"maintenance_interval_ms": 0},
            {"maintenance_interval_ms": 1.5},
            {"maintenance_interval_ms": "60s"},
        ):
            with pytest.raises(ConfigError):
                log_factory(**options)
