"""Automatic maintenance beyond the contract: processes that share the maintenance lease
(one maintains at a time; SIGKILL hands it over), appends that never wait for a step,
closing during a step, and options refused before anything is created.

``tests/conformance/test_maintenance_contract.py`` runs the contract on every backend."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

import disklesslog
from disklesslog import ConfigError
from disklesslog.maintenance import MaintenanceReport, auto
from disklesslog.maintenance.auto import MIN_LEASE_MS
from disklesslog.sequencers.objectstore import ObjectStoreSequencer

WORKER = Path(__file__).with_name("auto_workers.py")
INTERVAL_MS = 100

LOGS = {
    "segments": lambda path: (str(path / "log"), {"fsync": "never"}),
    "objects-sqlite": lambda path: (f"file://{path}/log", {"backend": "objects"}),
}


def _samples(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


def _maintain_until(
    log: disklesslog.AbstractLog, interval_ms: int, condition: Any, what: str
) -> dict[str, float]:
    """Run a maintainer of ``log`` until ``condition()`` holds (30 s at most), stop it,
    and return its metrics."""
    maintainer = auto.Maintainer(log, interval_ms)
    maintainer.start()
    try:
        _wait_for(condition, 30, what)
    finally:
        maintainer.stop()
    return maintainer.metrics()


@pytest.mark.parametrize("kind", sorted(LOGS))
def test_two_writer_processes_one_maintainer_and_sigkill_hands_over(
    tmp_path: Path, kind: str
) -> None:
    url, options = LOGS[kind](tmp_path)
    options["maintenance_interval_ms"] = INTERVAL_MS
    disklesslog.open(url, **options, maintenance="off").close()  # created once, up front
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent)}
    children = [
        subprocess.Popen([sys.executable, str(WORKER), url, json.dumps(options), str(out)], env=env)
        for out in outs
    ]
    try:
        _wait_for(
            lambda: any(s["passes"] for out in outs for s in _samples(out)),
            60,
            "one of the writers maintains",
        )
        time.sleep(1.0)  # both keep writing; the other must stay out
        first = [any(s["maintaining"] for s in _samples(out)) for out in outs]
        assert first.count(True) == 1, first
        holder_no = first.index(True)
        other_no = 1 - holder_no
        token = max(s["token"] for s in _samples(outs[holder_no]) if s["token"])
        killed_at = time.time()
        children[holder_no].send_signal(signal.SIGKILL)
        children[holder_no].wait()
        # The dead holder never releases: the other waits out the lease by its own clock.
        limit = (MIN_LEASE_MS + 2 * 3 * INTERVAL_MS) / 1000 + 20
        _wait_for(
            lambda: any(s["passes"] for s in _samples(outs[other_no])),
            limit,
            "the survivor takes maintenance over and runs a pass",
        )
    finally:
        for child in children:
            child.kill()
            child.wait()
    dead, survivor = _samples(outs[holder_no]), _samples(outs[other_no])
    # The lease history: one maintainer at a time, the survivor only after the kill,
    # with a greater fencing token, and the dead one held a single token throughout.
    assert {s["token"] for s in dead if s["maintaining"]} == {token}
    taken = [s for s in survivor if s["maintaining"]]
    assert taken and min(s["t"] for s in taken) > killed_at
    assert {s["token"] for s in taken} == {token + 1}
    assert not any(s["maintaining"] for s in survivor if s["t"] < killed_at)
    assert max(s["passes"] for s in survivor) >= 1


def test_appends_never_wait_for_a_maintenance_step(tmp_path: Path) -> None:
    """A step that takes long (here: blocked) holds nothing an append waits on, and
    closing waits for that step, then stops."""
    log = disklesslog.open(tmp_path / "log", fsync="never", maintenance_interval_ms=INTERVAL_MS)
    inside, release = threading.Event(), threading.Event()
    real = log.apply_retention

    def slow(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        release.wait(30)
        return real(*args, **kwargs)

    log.apply_retention = slow  # type: ignore[method-assign]
    stream = log.stream("s")
    stream.append(b"first")
    assert inside.wait(30), "maintenance never started its step"
    latencies = []
    for i in range(500):
        started = time.perf_counter()
        stream.append(b"%d" % i)
        latencies.append(time.perf_counter() - started)
    assert max(latencies) < 1.0  # microseconds each, in practice
    assert stream.end_offset == 501
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive(), "close must let the running step finish"
    release.set()
    closer.join(30)
    assert not closer.is_alive() and log.closed
    assert not [t for t in threading.enumerate() if t.name.startswith("disklesslog-maint")]


@pytest.mark.parametrize(
    "options",
    [
        {"maintenance": "on"},
        {"maintenance": None},
        {"maintenance_interval_ms": -5},
        {"maintenance_interval_ms": 10**12},
        {"maintenance_interval_ms": True},
    ],
)
@pytest.mark.parametrize("kind", sorted(LOGS))
def test_bad_options_create_nothing(tmp_path: Path, kind: str, options: dict[str, Any]) -> None:
    url, base = LOGS[kind](tmp_path)
    with pytest.raises(ConfigError, match="maintenance"):
        disklesslog.open(url, **base, **options)
    assert not (tmp_path / "log").exists()


def test_a_misspelt_option_is_named() -> None:
    with pytest.raises(ConfigError, match="did you mean 'maintenance_interval_ms'"):
        disklesslog.open("memory://misspelt/log", maintenance_intervals_ms=100)


def test_maintain_runs_the_sequencers_housekeeping(tmp_path: Path) -> None:
    """The object-store sequencer deletes superseded entries and checkpoints in
    housekeeping, which maintain() and automatic maintenance run."""
    url = f"file://{tmp_path}/log"
    fs = fsspec.filesystem("file")
    sequencer = ObjectStoreSequencer(
        fs, str(tmp_path / "sequencer"), checkpoint_every=10, entry_retention_seconds=0.5
    )
    with (
        sequencer,
        disklesslog.open(url, backend="objects", sequencer=sequencer, maintenance="off") as log,
    ):
        for i in range(50):
            log.stream("s").append(b"%d" % i)
        before = len(list((tmp_path / "sequencer").rglob("*")))
        time.sleep(0.6)  # the last checkpoint (of entry 50) is past the retention now
        report = log.maintain()
        after = len(list((tmp_path / "sequencer").rglob("*")))
    assert any("superseded sequencer entries" in line for line in report.actions), report
    assert after < before


def test_a_forked_child_runs_its_own_maintenance(tmp_path: Path) -> None:
    """A child forked from a maintaining process holds none of its leases and no thread,
    until it writes itself; then it maintains under a holder name of its own, so it
    does not take the parent's lease for its own while the parent holds it (under the
    parent's name it would renew it, and both would maintain at once)."""
    log = disklesslog.open(tmp_path / "log", fsync="never", maintenance_interval_ms=INTERVAL_MS)
    log.stream("s").append(b"parent")
    _wait_for(lambda: log.maintenance_status().maintaining, 30, "the parent maintains")
    parent = log.maintenance_status().holder
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        status = 1
        try:
            before = log.maintenance_status()
            log.stream("s").append(b"child")
            after = log.maintenance_status()
            time.sleep(5 * INTERVAL_MS / 1000)  # passes the child would run, were it holding
            later = log.maintenance_status()
            log.close()
            if (
                not before.running
                and not before.maintaining
                and after.running
                and not later.maintaining
                and later.holder == parent
            ):
                status = 0
        finally:
            os._exit(status)
    _, code = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(code) == 0
    assert log.maintenance_status().maintaining  # the child's close released nothing of ours
    log.close()


def test_automatic_maintenance_runs_the_housekeeping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Superseded object-store sequencer entries go without any call (the log-wide steps
    made to run every round, not at most once a minute)."""
    monkeypatch.setattr(auto, "LOG_WIDE_EVERY_MS", 0)
    fs = fsspec.filesystem("file")
    sequencer = ObjectStoreSequencer(
        fs, str(tmp_path / "sequencer"), checkpoint_every=10, entry_retention_seconds=0.5
    )
    with (
        sequencer,
        disklesslog.open(
            f"file://{tmp_path}/log",
            backend="objects",
            sequencer=sequencer,
            maintenance_interval_ms=INTERVAL_MS,
        ) as log,
    ):
        for i in range(50):
            log.stream("s").append(b"%d" % i)

        def deleted() -> bool:
            changed = log.maintenance_status().operations["housekeeping"].last_changed
            return changed is not None and "superseded sequencer entries" in changed

        _wait_for(deleted, 30, "housekeeping deleted superseded entries")


def test_automatic_maintenance_expires_idle_producers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's producer idle past ``producer_expiration_ms`` is forgotten without
    any call (the log-wide steps made to run every round), and the writer goes on
    appending after it: offsets continue, nothing twice, nothing missing."""
    monkeypatch.setattr(auto, "LOG_WIDE_EVERY_MS", 0)
    with (
        disklesslog.open(
            f"file://{tmp_path}/log",
            backend="objects",
            maintenance_interval_ms=INTERVAL_MS,
            producer_expiration_ms=50,
        ) as log,
        log.writer(linger_ms=0, producer="app") as writer,
    ):
        first = writer.producer
        assert [writer.append("s", b"%d" % i).result() for i in range(3)] == [0, 1, 2]

        def expired() -> bool:
            changed = log.maintenance_status().operations["housekeeping"].last_changed
            return changed is not None and "idle producers" in changed

        _wait_for(expired, 30, "housekeeping expired the idle producer")
        assert [writer.append("s", b"%d" % i).result() for i in range(3, 6)] == [3, 4, 5]
        assert writer.producer[0] != first[0]
        assert [(r.offset, r.value) for r in log.stream("s").read()] == [
            (i, b"%d" % i) for i in range(6)
        ]


def test_automatic_maintenance_prunes_released_leases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auto, "LOG_WIDE_EVERY_MS", 0)
    monkeypatch.setattr(auto, "LEASE_PRUNE_AFTER_MS", 1)
    with disklesslog.open(
        tmp_path / "log", fsync="never", maintenance_interval_ms=INTERVAL_MS
    ) as log:
        lease = log.acquire_lease("job", "worker-1", 60_000)
        assert lease is not None
        log.release_lease(lease)
        log.stream("s").append(b"x")

        def pruned() -> bool:
            changed = log.maintenance_status().operations["leases"].last_changed
            return changed == "pruned the records of released leases job"

        _wait_for(pruned, 30, "the released lease's record is pruned")
        again = log.acquire_lease("job", "worker-2", 60_000)
        assert again is not None and again.token > lease.token
        assert log.maintenance_status().holder is not None  # its own lease stays


def test_the_pause_after_a_pass_is_the_interval_unless_the_log_is_behind(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path / "log", fsync="never", maintenance="off") as log:
        maintainer = auto.Maintainer(log, 4000)
        assert maintainer.budget_ms == 1000
        assert maintainer.pause_after(False, 0.2) == 4.0
        assert maintainer.pause_after(False, 30.0) == 4.0
        # Behind: as long as the pass took (half the thread's time), never over the interval.
        assert maintainer.pause_after(True, 1.2) == pytest.approx(1.2)
        assert maintainer.pause_after(True, 9.0) == 4.0


def test_a_log_behind_catches_up_and_collects_garbage_mid_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-stream steps slower than a pass's budget: a round over the streams takes several
    passes, and they come back to back (not an interval apart), while the log-wide steps
    still run when due although no round has ended (a busy log's garbage must not wait
    for its rounds)."""
    monkeypatch.setattr(auto, "LOG_WIDE_EVERY_MS", 0)
    with disklesslog.open(tmp_path / "log", fsync="never", maintenance="off") as log:
        for i in range(10):
            log.stream(f"s-{i}").append(b"x")
        steps: list[tuple[float, str]] = []
        real_retention = log.apply_retention

        def slow_retention(stream: str | None = None, **kwargs: Any) -> MaintenanceReport:
            time.sleep(0.25)
            steps.append((time.monotonic(), f"retention {stream}"))
            return real_retention(stream, **kwargs)

        def gc(**kwargs: Any) -> MaintenanceReport:
            steps.append((time.monotonic(), "gc"))
            return MaintenanceReport("gc")

        monkeypatch.setattr(log, "apply_retention", slow_retention)
        monkeypatch.setattr(log, "collect_garbage", gc)
        # A 2 s interval, so a 500 ms budget: ten streams of 250 ms take several passes.
        metrics = _maintain_until(
            log, 2000, lambda: sum(name == "gc" for _, name in steps) >= 5, "five passes"
        )
    # Every pass collects first, then runs streams until its budget is used.
    passes: list[tuple[float, list[tuple[float, str]]]] = []
    for at, name in steps:
        if name == "gc":
            passes.append((at, []))
        else:
            passes[-1][1].append((at, name))
    # Each ran out of its budget after one to three streams: none ended a round, and
    # garbage collection ran in every one all the same.
    assert all(1 <= len(streams) <= 3 for _, streams in passes[:4]), passes
    # The passes came back to back: the next one began after about as long as the
    # pass took (so about twice its length after it began), not an interval (2 s) later.
    for (start, streams), (next_start, _) in itertools.pairwise(passes[:5]):
        length = streams[-1][0] - start
        assert next_start - start < 2 * length + 0.6, (length, next_start - start)
    done = [name for _, streams in passes for _, name in streams]
    assert done == [f"retention s-{i}" for i in range(10)][: len(done)]  # round-robin
    assert metrics["maintenance_behind_passes"] >= 4


def test_a_budget_used_up_before_the_first_stream_still_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing the streams takes longer than the whole budget (slow storage, a loaded
    machine): every pass still maintains one stream, round-robin, and a pass that did
    so with streams left counts as behind."""
    with disklesslog.open(tmp_path / "log", fsync="never", maintenance="off") as log:
        for i in range(3):
            log.stream(f"s-{i}").append(b"x")
        ran: list[str | None] = []
        real_streams, real_retention = log.streams, log.apply_retention

        def slow_streams() -> list[str]:
            time.sleep(0.05)  # the budget of a 100 ms interval is 25 ms
            return real_streams()

        def retention(stream: str | None = None, **kwargs: Any) -> MaintenanceReport:
            ran.append(stream)
            return real_retention(stream, **kwargs)

        monkeypatch.setattr(log, "streams", slow_streams)
        monkeypatch.setattr(log, "apply_retention", retention)
        metrics = _maintain_until(log, 100, lambda: len(ran) >= 6, "six streams maintained")
    assert ran[:6] == ["s-0", "s-1", "s-2"] * 2
    assert metrics["maintenance_behind_passes"] >= 2


def test_garbage_collection_reconciles_at_most_every_few_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first collection reconciles (lists storage for what nothing ever named), the
    next ones within RECONCILE_EVERY_MS do not; a reconciling run that failed is tried
    again in the next pass instead of waiting out the interval."""
    monkeypatch.setattr(auto, "LOG_WIDE_EVERY_MS", 0)
    with disklesslog.open(tmp_path / "log", fsync="never", maintenance="off") as log:
        log.stream("s").append(b"x")
        calls: list[bool] = []

        def gc(**kwargs: Any) -> MaintenanceReport:
            calls.append(kwargs["reconcile"])
            if len(calls) == 1:
                raise OSError("the listing failed")
            if len(calls) == 3:
                monkeypatch.setattr(auto, "RECONCILE_EVERY_MS", 0)  # due from now on
            return MaintenanceReport("gc")

        monkeypatch.setattr(log, "collect_garbage", gc)
        metrics = _maintain_until(log, 20, lambda: len(calls) >= 5, "five collections")
    assert calls[:5] == [True, True, False, True, True], calls
    assert metrics["maintenance_gc_errors"] == 1


def test_reconcile_interval_is_the_age_unknown_objects_must_reach() -> None:
    """Reconciling more often than an unknown object may be deleted finds nothing new
    to delete; less often would keep failed uploads longer than necessary."""
    from disklesslog.objects.gc import UNKNOWN_MIN_AGE

    assert auto.RECONCILE_EVERY_MS == UNKNOWN_MIN_AGE * 1000
