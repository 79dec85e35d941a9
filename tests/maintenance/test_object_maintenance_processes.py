"""Object-log maintenance across processes (multiprocessing spawn), on file:// with the
object-store sequencer (and, under ``-m slow``, PostgreSQL): writers, readers and
maintainers (compaction, merging, retention, garbage collection with a short grace) at
once; and maintainers killed with SIGKILL inside their runs (before a swap, while
deleting, while uploading, anywhere), each time finished by the next run.

What must hold: no reader ever fails or sees a wrong record; every acknowledged record
is there unless retention or compaction was meant to drop it (compaction keeps each
key's latest); nothing is duplicated; no object is deleted while it is referenced; and
whatever a killed maintainer left behind is collected.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import kill_points
import pytest
from kill_points import Forked
from maintenance_workers import (
    EVENTS,
    KEYED,
    PLAIN,
    STREAMS,
    Acked,
    key_of,
    maintain,
    maintain_for,
    read_for,
    write_for,
)
from object_support import as_objects, referenced, stored

import disklesslog
from disklesslog.objects import compact as compact_module
from disklesslog.objects import gc as gc_module
from disklesslog.objects import merge as merge_module

SPAWN = multiprocessing.get_context("spawn")
SEQUENCER = "objectstore://"
GRACE = 0.5  # seconds: far shorter than any real deployment's, to delete while reads run


def _open(path: Path, sequencer: str = SEQUENCER) -> disklesslog.Log:
    """The tests' log, automatic maintenance off: they run maintenance themselves, and
    the kill rounds copy the log file by file while it is open, which a background pass
    (the first one a minute after the first write, so only in a slow run) would make an
    inconsistent copy: a sequencer referencing an object merged after the objects were
    copied."""
    return disklesslog.open(
        f"file://{path}/log", backend="objects", sequencer=sequencer, maintenance="off"
    )


def _create_streams(log: disklesslog.Log) -> None:
    log.create_stream(KEYED, cleanup_policy="compact", segment_bytes=4096)
    log.create_stream(EVENTS, retention_bytes=30_000)
    log.create_stream(PLAIN)


def _check(log: disklesslog.Log, acked: list[Acked]) -> None:
    """Every stream holds what it must: plain everything, events everything from its
    start offset, keyed at least each key's latest and nothing that was not written."""
    by_stream: dict[str, dict[int, tuple[bytes | None, bytes]]] = {s: {} for s in STREAMS}
    for stream, offset, key, value in acked:
        assert offset not in by_stream[stream], f"{stream}: offset {offset} acknowledged twice"
        by_stream[stream][offset] = (key, value)
    found = {s: [(r.offset, r.key, r.value) for r in log.stream(s).read()] for s in STREAMS}
    for stream in STREAMS:
        offsets = [offset for offset, _, _ in found[stream]]
        assert offsets == sorted(set(offsets)), f"{stream}: offsets out of order or repeated"
        for offset, key, value in found[stream]:
            assert by_stream[stream].get(offset) == (key, value), f"{stream}: {offset} wrong"
    plain = by_stream[PLAIN]
    assert [o for o, _, _ in found[PLAIN]] == sorted(plain), "plain: a record was lost"
    start = log.stream(EVENTS).start_offset
    assert [o for o, _, _ in found[EVENTS]] == sorted(o for o in by_stream[EVENTS] if o >= start)
    latest: dict[bytes, int] = {}
    for offset, (key, _) in sorted(by_stream[KEYED].items()):
        assert key is not None
        latest[key] = offset
    present = {offset for offset, _, _ in found[KEYED]}
    assert set(latest.values()) <= present, "keyed: the latest record of a key was lost"
    assert all(key_of(value or b"") == key for _, key, value in found[KEYED])


def _referenced_objects_exist(log: disklesslog.Log) -> None:
    missing = referenced(log) - stored(log)
    assert not missing, f"referenced objects were deleted: {sorted(missing)[:3]}"


def _collect_everything(log: disklesslog.Log) -> None:
    """A last collection with no grace and no floor for unknown objects (safe here: no
    other process is left), after which storage holds exactly the referenced objects."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gc_module, "UNKNOWN_MIN_AGE", 0)
        log.collect_garbage(grace_seconds=0)
    assert stored(log) == referenced(log), "leftovers were not collected"


def _run_together(tmp_path: Path, seconds: float, sequencer: str = SEQUENCER) -> None:
    url = f"file://{tmp_path}/log"
    with _open(tmp_path, sequencer) as log:
        _create_streams(log)
    gate = tmp_path / "gate"
    gate.mkdir()
    together = (str(gate), 5)
    with ProcessPoolExecutor(5, mp_context=SPAWN) as pool:
        writers = [pool.submit(write_for, url, sequencer, w, seconds, *together) for w in range(2)]
        reader = pool.submit(read_for, url, sequencer, seconds + 1, *together)
        maintainers = [
            pool.submit(maintain_for, url, sequencer, seconds + 1, GRACE, *together)
            for _ in range(2)
        ]
        acked = [entry for w in writers for entry in w.result(timeout=300)]
        reads, problems = reader.result(timeout=300)
        done = [m.result(timeout=300) for m in maintainers]
    assert not problems, "\n".join(problems)
    for _, failures in done:
        assert not failures, "\n".join(failures)
    totals = {name: sum(counts.get(name, 0) for counts, _ in done) for name in done[0][0]}
    assert reads > 0 and len(acked) > 300
    assert totals["passes"] >= 2 and totals["objects_written"] > 0, totals
    assert totals["records_removed"] > 0 and totals["objects_deleted"] > 0, totals
    with _open(tmp_path, sequencer) as log:
        _check(log, acked)
        _referenced_objects_exist(log)
        maintain(log, 0)
        _check(log, acked)
        _collect_everything(log)
        _check(log, acked)


def test_writers_readers_and_maintainers_in_processes(tmp_path: Path) -> None:
    _run_together(tmp_path, seconds=2)


@pytest.mark.slow
def test_writers_readers_and_maintainers_in_processes_for_longer(tmp_path: Path) -> None:
    _run_together(tmp_path, seconds=40)


@pytest.mark.slow
@pytest.mark.postgres
def test_writers_readers_and_maintainers_sequenced_by_postgres(
    tmp_path: Path, postgres_server: str
) -> None:
    from disklesslog.testing.servers.postgres import drop_schema

    schema = f"t_{uuid.uuid4().hex}"
    try:
        _run_together(tmp_path, seconds=20, sequencer=f"{postgres_server}?schema={schema}")
    finally:
        drop_schema(postgres_server, schema)


def _maintain_armed(path: Path, report: Path, stop_at: int | None) -> Forked:
    """One maintenance run (no grace) in a forked maintainer that counts its file calls,
    marks its uploads, swaps and deletions, and stops at call ``stop_at``
    (``kill_points``)."""
    report.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            with _open(path) as log:
                kill_points.arm(report, stop_at)
                for module in (compact_module, merge_module):  # each imported them
                    kill_points.marking(module, "upload", "swap")
                kill_points.marking(gc_module, "_delete")
                maintain(log, 0, target_bytes=2048)
            kill_points.finish()
        except BaseException as exc:
            kill_points.finish(exc)
            code = 1
        os._exit(code)
    return Forked(pid)


KILL_WINDOWS = ["swap", "_delete", "upload", "anywhere"]
"""Where the rounds of :func:`_kill_rounds` kill, in turn: just before a swap (its
upload done), inside a garbage collection's deletions, inside an upload, anywhere."""


def _kill_rounds(tmp_path: Path, rounds: int) -> None:
    """Write, then run maintenance in a forked maintainer and SIGKILL it inside the run,
    ``rounds`` times; the next run must finish what it left. The kill lands at a file
    call drawn from a window of the run (``KILL_WINDOWS``), by construction
    (tests/kill_points.py): a calibration run on a copy of the log counts the run's
    calls and where its uploads, swaps and deletions made them."""
    rng = random.Random(2024)
    acked: list[Acked] = []
    unknown_before: set[str] = set()
    report = tmp_path / "kill-points"
    with _open(tmp_path) as log:
        objects = as_objects(log)
        _create_streams(log)
        for round_no in range(rounds):
            with log.writer(linger_ms=60_000) as writer:  # new work for the maintainer
                for flush in range(6):
                    pending = []
                    for i in range(30):
                        key = b"k%02d" % rng.randrange(20)
                        tag = b"r%d-%d-%d" % (round_no, flush, i)
                        for stream, k, value in (
                            (KEYED, key, key + b"@" + tag + b"." * 60),
                            (PLAIN, None, tag + b"." * 60),
                        ):
                            pending.append((stream, k, value, writer.append(stream, value, key=k)))
                    writer.flush()
                    acked += [(s, f.result(), k, v) for s, k, v, f in pending]
            copy = tmp_path / "copy"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(tmp_path / "log", copy / "log")
            child = _maintain_armed(copy, report, None)
            calibration = kill_points.wait(report, child)
            assert child.join() == 0 and calibration.finished, calibration
            window = KILL_WINDOWS[round_no % len(KILL_WINDOWS)]
            if window == "anywhere":
                stop_at = rng.randint(1, calibration.calls)
            else:
                spans = calibration.spans(window)
                assert spans, f"the run never made a file call in {window}: {calibration}"
                first, last = rng.choice(spans)
                stop_at = first if window == "swap" else rng.randint(first, last)
            child = _maintain_armed(tmp_path, report, stop_at)
            stopped = kill_points.wait(report, child)
            status = child.kill()
            assert stopped.stopped_at == stop_at, stopped
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
            unknown = stored(log) - set(objects.sequencer.list_objects())
            garbage = objects.sequencer.objects_to_delete(0)
            if window == "swap":  # uploaded, never swapped in: the sequencer never knew it
                assert unknown - unknown_before, f"call {stop_at}: no upload left unknown"
            if window == "_delete":  # deleted (or not yet), not yet forgotten
                assert garbage, f"call {stop_at}: no garbage left"
            unknown_before = unknown
            maintain(log, 0)  # the next run completes whatever was cut short
            _check(log, acked)
            _referenced_objects_exist(log)
        _collect_everything(log)
        _check(log, acked)


def test_maintenance_killed_at_random_points(tmp_path: Path) -> None:
    _kill_rounds(tmp_path, rounds=6)


@pytest.mark.slow
def test_maintenance_killed_at_random_points_many_times(tmp_path: Path) -> None:
    _kill_rounds(tmp_path, rounds=60)
