"""The object-store sequencer beyond the shared contract: replicas that converge, races
for entry numbers, lost responses, group commit, checkpoints and their clean-up.

The contract itself (``test_contract.py``) runs it on local files and in memory, and
checks after every test that a fresh replica replays to the same state."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import msgpack
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import disklesslog
from disklesslog.errors import (
    ConfigError,
    CorruptDataError,
    InvalidURL,
    LogClosedError,
    ProducerFenced,
    SequencerConflict,
    SequencerDamaged,
    SequencerError,
    StorageError,
    StreamNotFound,
    UnknownProducerId,
)
from disklesslog.sequencers import (
    BatchToCommit,
    ProducerExpiry,
    objectstore_format,
    open_sequencer,
)
from disklesslog.sequencers import objectstore as objectstore_module
from disklesslog.sequencers.objectstore import ObjectStoreSequencer
from disklesslog.storage import store as store_module
from disklesslog.storage.conditional import put_if_absent
from disklesslog.testing import FaultyMemoryFileSystem


def batch(
    stream: str, span: int = 1, *, producer: tuple[int, int] | None = None, seq: int = -1
) -> BatchToCommit:
    pid, epoch = producer if producer is not None else (-1, -1)
    return BatchToCommit(stream, 0, 10, span, span, 0, pid, epoch, seq)


@pytest.fixture
def local_root(tmp_path: Path) -> str:
    return str(tmp_path / "sequencer")


def open_local(root: str, **options: Any) -> ObjectStoreSequencer:
    return ObjectStoreSequencer(fsspec.filesystem("file"), root, **options)


@pytest.fixture
def faulty() -> Iterator[tuple[Any, str]]:
    FaultyMemoryFileSystem.reset()
    fs = FaultyMemoryFileSystem()
    root = f"/objectstore-{uuid.uuid4().hex}"
    yield fs, root
    FaultyMemoryFileSystem.reset()
    if fs.exists(root):
        fs.rm(root, recursive=True)


# ------------------------------------------------------------------ put-if-absent


def test_put_if_absent_local_creates_once(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "a" / "entry")
    assert put_if_absent(fs, path, b"first")
    assert not put_if_absent(fs, path, b"second")
    assert Path(path).read_bytes() == b"first"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["entry"]  # no temporaries


def _race_for(path: str, token: bytes, wins: Any) -> None:
    if put_if_absent(fsspec.filesystem("file"), path, token * 10_000):
        wins.put(token)


def test_put_if_absent_local_one_winner_among_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        path = str(tmp_path / f"entry-{round_}")
        wins = ctx.Queue()
        procs = [
            ctx.Process(target=_race_for, args=(path, bytes([65 + i]), wins)) for i in range(6)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        winners = []
        while not wins.empty():
            winners.append(wins.get())
        assert len(winners) == 1
        assert Path(path).read_bytes() == winners[0] * 10_000  # whole, never mixed


def test_put_if_absent_memory_threads() -> None:
    fs = fsspec.filesystem("memory")
    path = f"/race-{uuid.uuid4().hex}/entry"
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        barrier.wait()
        if put_if_absent(fs, path, str(i).encode()):
            wins.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert fs.cat_file(path) == str(wins[0]).encode()
    fs.rm(path.rsplit("/", 1)[0], recursive=True)


# ---------------------------------------------------------------------- replicas


def test_two_replicas_see_each_others_operations(local_root: str) -> None:
    a, b = open_local(local_root), open_local(local_root)
    a.create_stream("s", {})
    assert b.list_streams() == ["s"]
    assert b.commit("o1", [batch("s", 3)])[0].base_offset == 0
    assert a.commit("o2", [batch("s", 2)])[0].base_offset == 3  # a catches up first
    assert a.stream_info("s").end_offset == b.stream_info("s").end_offset == 5
    assert a.snapshot() == b.snapshot()


def test_named_producer_fenced_across_replicas(local_root: str) -> None:
    a, b = open_local(local_root), open_local(local_root)
    a.create_stream("s", {})
    old = a.init_producer("app")
    new = b.init_producer("app")
    assert new == (old[0], old[1] + 1)
    with pytest.raises(ProducerFenced):
        a.commit("zombie", [batch("s", producer=old, seq=0)])
    assert b.stream_info("s").end_offset == 0
    assert b.commit("ok", [batch("s", producer=new, seq=0)])[0].base_offset == 0


def test_replicas_racing_from_threads_stay_dense(local_root: str) -> None:
    seed = open_local(local_root)
    seed.create_stream("s", {})
    replicas = [open_local(local_root) for _ in range(4)]
    got: list[int] = []
    lock = threading.Lock()

    def work(seq: ObjectStoreSequencer) -> None:
        pid = seq.init_producer()
        for i in range(25):
            base = seq.commit(f"o-{uuid.uuid4().hex}", [batch("s", 2, producer=pid, seq=2 * i)])
            with lock:
                got.append(base[0].base_offset)

    threads = [threading.Thread(target=work, args=(r,)) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(0, 200, 2))
    snapshots = [r.snapshot() for r in replicas]
    assert all(s == snapshots[0] for s in snapshots)


def test_group_commit_writes_fewer_entries_than_operations(local_root: str) -> None:
    seq = open_local(local_root)
    seq.create_stream("s", {})
    barrier = threading.Barrier(8)
    results: list[int] = []

    def work() -> None:
        barrier.wait()
        for _ in range(20):
            results.append(seq.commit(f"o-{uuid.uuid4().hex}", [batch("s")])[0].base_offset)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(160))
    entries = len(list(Path(local_root, "log").iterdir()))
    assert entries == seq.tail
    assert seq.tail < 1 + 160  # grouped: fewer entries than operations


def test_commit_many_is_one_entry(local_root: str) -> None:
    """A writer's waiting flushes cost one entry (one PUT), however many there are."""
    seq = open_local(local_root)
    seq.create_stream("s", {})
    p = seq.init_producer()
    before = seq.tail
    outcomes = seq.commit_many(
        [(f"o{i}", [batch("s", 2, producer=p, seq=2 * i)]) for i in range(6)]
        + [("bad", [batch("missing")])]
    )
    assert seq.tail == before + 1
    assert [o[0].base_offset for o in outcomes[:6]] == [0, 2, 4, 6, 8, 10]  # type: ignore[index]
    assert isinstance(outcomes[6], StreamNotFound)
    assert open_local(local_root).stream_info("s").end_offset == 12  # what a replica replays


def test_a_rejected_operation_in_a_group_does_not_reject_the_others(local_root: str) -> None:
    seq = open_local(local_root)
    seq.create_stream("s", {})
    errors: list[BaseException] = []
    offsets: list[int] = []
    barrier = threading.Barrier(6)

    def good() -> None:
        barrier.wait()
        offsets.append(seq.commit(f"o-{uuid.uuid4().hex}", [batch("s")])[0].base_offset)

    def bad() -> None:
        barrier.wait()
        try:
            seq.commit("o-bad", [batch("missing")])
        except StreamNotFound as exc:
            errors.append(exc)

    threads = [threading.Thread(target=good) for _ in range(5)] + [threading.Thread(target=bad)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(offsets) == [0, 1, 2, 3, 4]
    assert len(errors) == 1


# ------------------------------------------------------------- lost responses


def test_lost_response_is_applied_once(faulty: tuple[Any, str]) -> None:
    fs, root = faulty
    seq = ObjectStoreSequencer(fs, root)
    seq.create_stream("s", {})
    FaultyMemoryFileSystem.lost_puts = 1  # the commit's entry lands, its response is lost
    result = seq.commit("o1", [batch("s", 4)])  # anonymous: no producer dedup to lean on
    assert result[0].base_offset == 0
    assert seq.stream_info("s").end_offset == 4
    fresh = ObjectStoreSequencer(fs, root)
    assert fresh.stream_info("s").end_offset == 4
    assert fresh.tail == seq.tail == 2


def test_failed_puts_are_retried(faulty: tuple[Any, str]) -> None:
    fs, root = faulty
    seq = ObjectStoreSequencer(fs, root)
    seq.create_stream("s", {})
    FaultyMemoryFileSystem.failing_puts = 2
    assert seq.commit("o1", [batch("s")])[0].base_offset == 0
    assert seq.tail == 2


def test_unknown_outcome_after_retries_raises_storage_error(faulty: tuple[Any, str]) -> None:
    fs, root = faulty
    seq = ObjectStoreSequencer(fs, root)
    seq.create_stream("s", {})
    FaultyMemoryFileSystem.failing_puts = 100
    with pytest.raises(StorageError, match="may or may not"):
        seq.commit("o1", [batch("s")])
    FaultyMemoryFileSystem.failing_puts = 0
    assert seq.stream_info("s").end_offset == 0


def _v1_entry(ops: list[Any], entry_id: bytes | None = None) -> bytes:
    """An entry as releases before format version 2 wrote it: magic, then msgpack."""
    body = [entry_id or uuid.uuid4().bytes, 1_700_000_000.0, ops]
    return objectstore_format.ENTRY_MAGIC_V1 + msgpack.packb(body, use_bin_type=True)


def test_version_1_entries_are_read_and_a_repeated_one_applied_once(local_root: str) -> None:
    """A log written by an earlier release opens; its repeated entry (a delayed retry
    under another number, same entry id) is ignored by every replica alike."""
    log_dir = Path(local_root, "log")
    log_dir.mkdir(parents=True)
    commit = _v1_entry([["commit", "o1", [["s", 0, 10, 3, 3, 0, -1, -1, -1]]]])
    (log_dir / f"{1:020d}").write_bytes(_v1_entry([["create_stream", "s", "{}"]]))
    (log_dir / f"{2:020d}").write_bytes(commit)
    (log_dir / f"{3:020d}").write_bytes(commit)
    fresh = open_local(local_root)
    assert fresh.tail == 3
    assert fresh.stream_info("s").end_offset == 3
    assert fresh.commit("o2", [batch("s")])[0].base_offset == 3  # a version 2 entry follows
    assert (log_dir / f"{4:020d}").read_bytes().startswith(objectstore_format.ENTRY_MAGIC)
    assert open_local(local_root).snapshot() == fresh.snapshot()


def test_an_entry_copied_under_another_number_is_damage(local_root: str) -> None:
    """Version 2 entries hold their own number: the same bytes under another name are
    reported, not applied (nor skipped as a repeat)."""
    seq = open_local(local_root)
    seq.create_stream("s", {})
    seq.commit("o1", [batch("s", 3)])
    log_dir = Path(local_root, "log")
    (log_dir / f"{3:020d}").write_bytes((log_dir / f"{2:020d}").read_bytes())
    with pytest.raises(SequencerDamaged, match="holds entry 2, not 3") as caught:
        open_local(local_root)
    assert caught.value.source is not None and caught.value.source.endswith(f"{3:020d}")


def test_conflict_after_max_attempts_applies_nothing(
    local_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seq = open_local(local_root, max_attempts=3)
    seq.create_stream("s", {})
    monkeypatch.setattr(store_module, "put_if_absent", lambda fs, path, data: False)
    with pytest.raises(SequencerConflict, match="3 times"):
        seq.commit("o1", [batch("s")])
    monkeypatch.undo()
    assert seq.stream_info("s").end_offset == 0
    assert open_local(local_root).tail == 1


def test_corrupt_entry_is_reported(local_root: str) -> None:
    seq = open_local(local_root)
    seq.create_stream("s", {})
    Path(local_root, "log", f"{2:020d}").write_bytes(b"garbage")
    with pytest.raises(CorruptDataError, match="not a disklesslog sequencer entry"):
        seq.list_streams()


# ----------------------------------------------------------------- checkpoints


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_checkpoints_bound_replay(faulty: tuple[Any, str]) -> None:
    fs, root = faulty
    seq = ObjectStoreSequencer(fs, root, checkpoint_every=10)
    seq.create_stream("s", {})
    for i in range(34):
        seq.commit(f"o{i}", [batch("s")])
    assert seq.tail == 35
    assert [p.rsplit("/", 1)[-1][:20] for p in fs.ls(f"{root}/checkpoints", detail=False)] == [
        f"{n:020d}" for n in (10, 20, 30)
    ]
    FaultyMemoryFileSystem.gets = 0
    fresh = ObjectStoreSequencer(fs, root, checkpoint_every=10)
    assert fresh.snapshot() == seq.snapshot()
    # the checkpoint, entries 31..35, one miss (36), and the bulk fetches' misses
    assert FaultyMemoryFileSystem.gets <= 1 + 5 + 1 + 8


def test_superseded_entries_are_deleted_after_retention(local_root: str) -> None:
    clock = Clock()
    seq = open_local(local_root, clock=clock, checkpoint_every=5, entry_retention_seconds=60)
    seq.create_stream("s", {})
    for i in range(9):
        seq.commit(f"o{i}", [batch("s")])
    assert seq.delete_superseded() == 0  # checkpoints are younger than the retention
    clock.now += 61
    for i in range(9, 11):  # entry 11 is still < the 15th: only the clean-up below
        seq.commit(f"o{i}", [batch("s")])
    deleted = seq.delete_superseded()
    # checkpoint 10 is the newest older than 60 s: entries 1..10 and checkpoint 5 go
    assert deleted == 10 + 1
    assert sorted(p.name for p in Path(local_root, "log").iterdir()) == [
        f"{n:020d}" for n in (11, 12)
    ]
    fresh = open_local(local_root)
    assert fresh.stream_info("s").end_offset == 11
    assert fresh.snapshot() == seq.snapshot()


def test_clean_up_deletes_entries_below_the_checkpoint_and_nothing_else(local_root: str) -> None:
    """The clean-up lists the entries' numbers (names only, no path per entry: a busy
    log has hundreds of thousands) and deletes those the checkpoint supersedes; other
    names in the folder (a temporary file of a write, anything else) stay."""
    clock = Clock()
    seq = open_local(local_root, clock=clock, checkpoint_every=5, entry_retention_seconds=60)
    seq.create_stream("s", {})
    strays = ["00000000000000000003.tmp", "0000000000000000000004", "notes"]
    for name in strays:
        Path(local_root, "log", name).write_bytes(b"")
    for i in range(9):
        seq.commit(f"o{i}", [batch("s")])
    clock.now += 61
    for i in range(9, 11):
        seq.commit(f"o{i}", [batch("s")])
    assert seq.delete_superseded() == 10 + 1
    assert sorted(p.name for p in Path(local_root, "log").iterdir()) == sorted(
        [f"{n:020d}" for n in (11, 12)] + strays
    )


def _checkpoint_entries(root: str) -> list[int]:
    return sorted(int(p.name[:20]) for p in Path(root, "checkpoints").iterdir())


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_checkpoints_between_the_superseding_one_and_the_newest_two_go_at_once(
    local_root: str,
) -> None:
    """Within the retention, only the newest two checkpoints stay, and the oldest one,
    to age past it (no entry is deleted yet, so the others are no route); after it, the
    superseding one, the oldest younger than the retention and the newest two."""
    clock = Clock()
    seq = open_local(local_root, clock=clock, checkpoint_every=5, entry_retention_seconds=60)
    seq.create_stream("s", {})
    for i in range(24):
        seq.commit(f"o{i}", [batch("s")])
    assert _checkpoint_entries(local_root) == [5, 10, 15, 20, 25]
    assert seq.delete_superseded() == 2  # checkpoints 10 and 15; no entry
    assert _checkpoint_entries(local_root) == [5, 20, 25]
    assert len(list(Path(local_root, "log").iterdir())) == 25
    clock.now += 61
    for i in range(24, 34):
        seq.commit(f"o{i}", [batch("s")])
    assert _checkpoint_entries(local_root) == [5, 20, 25, 30, 35]
    # checkpoint 25 is the newest older than 60 s: entries 1..25, checkpoints 5 and 20 go
    assert seq.delete_superseded() == 25 + 2
    assert _checkpoint_entries(local_root) == [25, 30, 35]
    assert open_local(local_root).snapshot() == seq.snapshot()


def test_entries_keep_going_however_often_checkpoints_are_written(local_root: str) -> None:
    """At a high commit rate many checkpoints are written within the retention (here one
    every 20-40 s against 600 s) and clean-ups come more often than it (every 150 s, a
    quarter of it, as a writer's do): the oldest checkpoint younger than the retention
    is kept to age past it, so entries keep being deleted and the checkpoints stay
    few. The one left to age is chosen when the one before it supersedes entries, so
    the entries kept span one to about two retention periods."""
    clock = Clock()
    seq = open_local(local_root, clock=clock, checkpoint_every=5, entry_retention_seconds=600)
    seq.create_stream("s", {})
    written = {seq.tail: clock.now}  # entry -> when
    for step in range(120):  # 1,200 s: 10 commits every 10 s, a clean-up every 150 s
        for i in range(10):
            seq.commit(f"o{step}-{i}", [batch("s")])
            written[seq.tail] = clock.now
        if step % 15 == 14:
            seq.delete_superseded()
            kept = _checkpoint_entries(local_root)
            assert len(kept) <= objectstore_module.NEWEST_CHECKPOINTS_KEPT + 2
        clock.now += 10
    oldest = min(int(p.name) for p in Path(local_root, "log").iterdir())
    assert clock.now - written[oldest] <= 2 * 600
    assert open_local(local_root).snapshot() == seq.snapshot()


def test_with_the_newest_two_checkpoints_damaged_the_entries_are_the_route(
    local_root: str,
) -> None:
    clock = Clock()
    seq = open_local(local_root, clock=clock, checkpoint_every=5, entry_retention_seconds=60)
    seq.create_stream("s", {})
    for i in range(24):
        seq.commit(f"o{i}", [batch("s")])
    seq.delete_superseded()
    for path in Path(local_root, "checkpoints").iterdir():
        _damage(path)  # 20 and 25: every checkpoint left
    assert seq.delete_superseded() == 0  # none supersedes anything; both are the newest
    fresh = open_local(local_root)  # from entry 1, as before any checkpoint
    assert fresh.snapshot() == seq.snapshot()
    assert fresh.stream_info("s").end_offset == 24


def test_stale_replica_reloads_checkpoint_instead_of_reusing_deleted_numbers(
    local_root: str,
) -> None:
    clock = Clock()
    idle = open_local(local_root, clock=clock, checkpoint_every=5, entry_retention_seconds=60)
    idle.create_stream("s", {})
    busy = open_local(local_root, clock=clock, checkpoint_every=5, entry_retention_seconds=60)
    for i in range(12):
        busy.commit(f"o{i}", [batch("s")])
    clock.now += 61
    busy.commit("late", [batch("s")])
    assert busy.delete_superseded() > 0  # entry 2 (idle's next number) is gone
    idle._confirmed = -float("inf")  # as if it had not looked for longer than the window
    assert idle.commit("idle", [batch("s")])[0].base_offset == 13
    assert open_local(local_root).snapshot() == idle.snapshot()


def test_readers_never_write(faulty: tuple[Any, str]) -> None:
    fs, root = faulty
    writer = ObjectStoreSequencer(fs, root, checkpoint_every=3)
    writer.create_stream("s", {})
    for i in range(7):
        writer.commit(f"o{i}", [batch("s")])
    FaultyMemoryFileSystem.puts = 0
    reader = ObjectStoreSequencer(fs, root, checkpoint_every=3)
    reader.find_batches("s", 0, 1 << 20)
    reader.stream_info("s")
    reader.list_streams()
    reader.committed_offsets("g")
    reader.objects_to_delete(0)
    assert FaultyMemoryFileSystem.puts == 0


# ------------------------------------------------------------------ opening


def test_options_are_checked(local_root: str) -> None:
    with pytest.raises(ConfigError):
        open_local(local_root, checkpoint_every=0)
    with pytest.raises(ConfigError):
        open_local(local_root, entry_retention_seconds=0)
    with pytest.raises(ConfigError):
        open_local(local_root, max_attempts=0)


def test_url(tmp_path: Path) -> None:
    seq = open_sequencer(f"objectstore+file://{tmp_path}/seq")
    assert isinstance(seq, ObjectStoreSequencer)
    seq.create_stream("s", {})
    assert open_sequencer(f"objectstore+file://{tmp_path}/seq").list_streams() == ["s"]
    for bad in ("objectstore://x", "objectstore+://x"):
        with pytest.raises(InvalidURL):
            open_sequencer(bad)


def test_closed(local_root: str) -> None:
    seq = open_local(local_root)
    seq.close()
    with pytest.raises(LogClosedError):
        seq.list_streams()
    with pytest.raises(LogClosedError):
        seq.create_stream("s", {})


def test_log_default_and_explicit(tmp_path: Path) -> None:
    log = disklesslog.open(f"file://{tmp_path}/log", backend="objects", sequencer="objectstore://")
    try:
        assert isinstance(log.sequencer, ObjectStoreSequencer)  # type: ignore[attr-defined]
        log.stream("s").append(b"x")
    finally:
        log.close()
    assert (tmp_path / "log" / "_sequencer" / "log").is_dir()
    url = f"objectstore+file://{tmp_path}/elsewhere"
    log = disklesslog.open(f"file://{tmp_path}/log2", backend="objects", sequencer=url)
    try:
        assert log.sequencer.url == url  # type: ignore[attr-defined]
    finally:
        log.close()


@pytest.mark.s3
def test_remote_log_defaults_to_objectstore(s3_server: str) -> None:
    import s3fs

    from disklesslog.testing import s3_storage_options

    options = s3_storage_options(s3_server)
    bucket = f"os-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**options).mkdir(bucket)
    log = disklesslog.open(f"s3://{bucket}/log", storage_options=options)
    try:
        assert isinstance(log.sequencer, ObjectStoreSequencer)  # type: ignore[attr-defined]
        log.stream("s").append_batch([b"a", b"b"])
    finally:
        log.close()
    log = disklesslog.open(f"s3://{bucket}/log", storage_options=options)
    try:
        assert [r.value for r in log.stream("s").read()] == [b"a", b"b"]
    finally:
        log.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_entry_from_a_newer_version_stops_replay(local_root: str, version: int) -> None:
    seq = open_local(local_root)
    seq.create_stream("s", {})
    ops = [["rename_stream", "s", "t"]]
    if version == 1:
        entry = _v1_entry(ops)
    else:
        body = objectstore_format.entry_body(b"x" * 16, 0.0, ops)
        entry = objectstore_format.encode_entry(2, seq._replica.chain, body)
    Path(local_root, "log", f"{2:020d}").write_bytes(entry)
    with pytest.raises(SequencerError, match=r"rename_stream.*upgrade"):
        open_local(local_root)
    with pytest.raises(SequencerError, match=r"rename_stream.*upgrade"):
        seq.list_streams()
    assert seq.tail == 1  # not applied, not skipped


def test_checkpoints_spread_out_as_the_state_grows(local_root: str) -> None:
    """A checkpoint writes the whole state: as it grows, checkpoints come further apart
    (bounded cost per entry), never further than the state's size warrants."""
    seq = open_local(local_root, checkpoint_every=2)
    seq.create_stream("s", {})
    for i in range(120):
        seq.commit(f"o{i}", [batch("s") for _ in range(10)])  # 10 live batches per entry
    names = sorted(p.name for p in Path(local_root, "checkpoints").iterdir())
    entries = [int(name[:20]) for name in names]
    gaps = [b - a for a, b in itertools.pairwise(entries)]
    assert gaps[:3] == [2, 2, 2]  # a small state: every checkpoint_every entries
    assert max(gaps) > 2  # spread out later...
    state = seq.snapshot()
    rows = sum(len(row[7]) for row in state["streams"]) + len(state["objects"]) + 1
    assert rows == 1200 + 120 + 1  # live batches, objects, the stream
    per_entry = objectstore_module.CHECKPOINT_ROWS_PER_ENTRY
    assert max(gaps) <= 2 * max(1, rows // (per_entry * 2))  # ...within the bound
    assert open_local(local_root).snapshot() == seq.snapshot()


def test_dead_objects_awaiting_collection_spread_checkpoints_out_too(local_root: str) -> None:
    """Objects count towards a checkpoint's cost like batches: a state whose batches
    are trimmed away but whose objects wait for garbage collection (its grace period)
    still grows, and checkpoints come further apart with it."""
    seq = open_local(local_root, checkpoint_every=2)
    seq.create_stream("s", {})
    for i in range(400):
        seq.commit(f"o{i}", [batch("s")])
        seq.trim("s", i + 1)  # retention: nothing stays live, every object stays dead
    state = seq.snapshot()
    assert [row[7] for row in state["streams"]] == [[]] and len(state["objects"]) == 400
    entries = [int(p.name[:20]) for p in sorted(Path(local_root, "checkpoints").iterdir())]
    gaps = [b - a for a, b in itertools.pairwise(entries)]
    assert gaps[0] == 2 and max(gaps) >= 8


# ------------------------------------------------------------------ producer expiry


def test_replicas_agree_after_an_expiry_entry(local_root: str) -> None:
    """Expiry is one entry that every replica applies with the entry's own time: two
    handles, and a replica opened afresh from a checkpoint and the entries after it,
    hold the same producer state; a pass that finds nothing writes no entry."""
    clock = Clock()
    a = open_local(local_root, clock=clock, checkpoint_every=3)
    b = open_local(local_root, clock=clock, checkpoint_every=3)
    a.create_stream("s", {})
    old, kept = a.init_producer("old"), a.init_producer()
    a.commit("o1", [batch("s", producer=old, seq=0)])
    clock.now += 100
    b.commit("o2", [batch("s", producer=kept, seq=0)])
    tail = b.tail
    assert b.expire_producers(60_000, dry_run=True) == ProducerExpiry(1, 1)
    assert b.tail == tail  # a dry run writes nothing
    assert b.expire_producers(60_000).producers == 1
    assert b.tail == tail + 1
    assert a.expire_producers(60_000) == ProducerExpiry()
    assert b.tail == tail + 1  # nothing left to drop: no entry
    with pytest.raises(UnknownProducerId):
        a.commit("o3", [batch("s", producer=old, seq=1)])
    assert a.snapshot() == b.snapshot()
    assert open_local(local_root).snapshot() == a.snapshot()
    names = [row[0] for row in a.snapshot()["producer_names"]]
    assert names == []


def _version_2_checkpoint(
    entry: int, state: dict[str, Any], recent: list[bytes], chain: bytes
) -> bytes:
    """``state`` (a current snapshot) as a version 2 checkpoint had it: producer rows
    without times."""
    import struct

    import crc32c
    import zstandard

    state = dict(state)
    state["producers"] = [row[:2] for row in state["producers"]]
    state["streams"] = [[*row[:9], [p[:3] for p in row[9]]] for row in state["streams"]]
    body = msgpack.packb({"state": state, "recent": recent, "chain": chain}, use_bin_type=True)
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(body)
    fields = struct.pack("<QQ", len(frame), entry)
    crc = crc32c.crc32c(fields + frame)
    return objectstore_format.CHECKPOINT_MAGIC_V2 + struct.pack("<I", crc) + fields + frame


def test_a_version_2_checkpoint_gives_producer_state_its_own_time(local_root: str) -> None:
    """A checkpoint written before producer state had times still loads; its producers
    and states get the checkpoint's time, so none expires before the window has passed
    since it was written."""
    clock = Clock()
    writer = open_local(local_root, clock=clock)
    writer.create_stream("s", {})
    p = writer.init_producer()
    writer.commit("o1", [batch("s", producer=p, seq=0)])
    clock.now += 500
    path = writer.write_checkpoint()
    replica = writer._replica
    data = _version_2_checkpoint(
        replica.tail, replica.state.snapshot(), list(replica.recent), replica.chain
    )
    Path(path).write_bytes(data)
    stamp = int(Path(path).name.split("-")[1])
    assert stamp == int(clock.now * 1000)
    loaded = open_local(local_root, clock=clock)
    state = loaded.snapshot()
    assert state["producers"] == [[p[0], 0, stamp]]
    assert state["streams"][0][9] == [[p[0], 0, [[0, 0, 0]], stamp]]
    assert loaded.expire_producers(400_000) == ProducerExpiry()
    clock.now += 401
    assert loaded.expire_producers(400_000) == ProducerExpiry(1, 1)
    assert loaded.verify() == []


class _GatedDeletes(MemoryFileSystem):
    """A memory filesystem whose deletes wait for ``gate`` (and say they started)."""

    gate = threading.Event()
    deleting = threading.Event()

    def rm_file(self, path: str) -> None:
        type(self).deleting.set()
        type(self).gate.wait(10)
        super().rm_file(path)


def _superseding_clean_up_started(root: str, clock: Clock) -> ObjectStoreSequencer:
    """A sequencer whose first checkpoint started a clean-up with 11 objects to delete
    (checkpoint 5 and entries 1..10, superseded by checkpoint 10), held at the first."""
    _GatedDeletes.gate.clear()
    _GatedDeletes.deleting.clear()
    first = ObjectStoreSequencer(
        _GatedDeletes(), root, clock=clock, checkpoint_every=5, entry_retention_seconds=60
    )
    first.create_stream("s", {})
    for i in range(10):  # entries 2..11; checkpoints 5 and 10 (their clean-up: nothing)
        first.commit(f"o{i}", [batch("s")])
    first.close()
    assert not _GatedDeletes.deleting.is_set()
    clock.now += 61
    seq = ObjectStoreSequencer(
        _GatedDeletes(), root, clock=clock, checkpoint_every=5, entry_retention_seconds=60
    )
    started = time.monotonic()
    for i in range(10, 14):  # entries 12..15: checkpoint 15, and its clean-up
        seq.commit(f"o{i}", [batch("s")])
    assert time.monotonic() - started < 5  # not held by the clean-up
    assert _GatedDeletes.deleting.wait(10)
    return seq


def test_commits_do_not_wait_for_the_clean_up_their_checkpoint_starts(clock_root: str) -> None:
    """Deleting what a checkpoint supersedes (on a busy log, a retention period's
    entries at once) runs in a thread of its own: commits go on meanwhile, and
    ``delete_superseded()`` waits for it before deciding what is left."""
    clock = Clock()
    seq = _superseding_clean_up_started(clock_root, clock)
    started = time.monotonic()
    for i in range(14, 20):  # entries 16..21, checkpoint 20 (no second clean-up yet)
        seq.commit(f"o{i}", [batch("s")])
    assert time.monotonic() - started < 5  # the clean-up is still held at its first delete
    assert not _GatedDeletes.gate.is_set()
    _GatedDeletes.gate.set()
    assert seq.delete_superseded() == 0  # the clean-up did it all
    fs = _GatedDeletes()
    entries = sorted(int(p.rsplit("/", 1)[-1]) for p in fs.ls(f"{clock_root}/log", detail=False))
    assert entries == list(range(11, 22))
    assert ObjectStoreSequencer(fs, clock_root).snapshot() == seq.snapshot()
    seq.close()


def test_closing_stops_the_clean_up_after_the_chunk_it_is_deleting(
    clock_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clean-up deletes in chunks (several objects at once on object storage) and
    looks between them whether the sequencer was closed; here a chunk is one object."""
    monkeypatch.setattr(objectstore_module, "DELETE_CHUNK", 1)
    clock = Clock()
    seq = _superseding_clean_up_started(clock_root, clock)
    closing = threading.Thread(target=seq.close)
    closing.start()
    time.sleep(0.05)
    assert closing.is_alive()  # close() waits for the delete in progress
    _GatedDeletes.gate.set()
    closing.join(10)
    assert not closing.is_alive()
    again = ObjectStoreSequencer(
        _GatedDeletes(), clock_root, clock=clock, checkpoint_every=5, entry_retention_seconds=60
    )
    assert again.delete_superseded() == 10  # the rest: 11 less the one deleted
    again.close()


@pytest.fixture
def clock_root() -> Iterator[str]:
    root = f"/gated-{uuid.uuid4().hex}"
    yield root
    fs = _GatedDeletes()
    _GatedDeletes.gate.set()
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_a_checkpoint_leaves_the_garbage_collector_as_it_found_it(local_root: str) -> None:
    """Snapshots are taken with Python's cyclic collector paused (its full collections
    would walk the whole replica for every few hundred thousand rows); it is restored."""
    for enabled in (True, False):
        if not enabled:
            gc.disable()
        try:
            seq = open_local(f"{local_root}-{enabled}", checkpoint_every=2)
            seq.create_stream("s", {})
            seq.commit("o", [batch("s")])  # entry 2: a checkpoint
            assert Path(f"{local_root}-{enabled}", "checkpoints").exists()
            assert gc.isenabled() is enabled
            seq.close()
        finally:
            gc.enable()


# ------------------------------------------------------------- contention


def _lose_first_try(
    seq: ObjectStoreSequencer, other: ObjectStoreSequencer, queue: int
) -> list[threading.Thread]:
    """Make ``seq``'s next try lose: another replica takes the number first, and
    ``queue`` more commits of ``seq``'s own threads (returned, started then) are queued
    behind the leader before it learns it lost."""
    real = seq._storage.create
    calls = 0
    threads: list[threading.Thread] = []

    def create(path: str, data: bytes) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            other.create_stream(f"other-{uuid.uuid4().hex[:6]}", {})
            for _ in range(queue):
                thread = threading.Thread(
                    target=seq.commit, args=(f"o-{uuid.uuid4().hex}", [batch("s")])
                )
                thread.start()
                threads.append(thread)
            deadline = time.monotonic() + 10
            while len(seq._queue) < queue:
                assert time.monotonic() < deadline
                time.sleep(0.001)
        return real(path, data)

    seq._storage.create = create  # type: ignore[method-assign]
    return threads


def test_a_writer_that_lost_a_race_takes_in_what_queued_meanwhile(local_root: str) -> None:
    """After a lost race the next try carries the operations queued meanwhile: one
    entry for all of them, not one each after the race is won."""
    seq = open_local(local_root)
    seq.create_stream("s", {})
    other = open_local(local_root)
    before = seq.tail
    threads = _lose_first_try(seq, other, queue=5)
    first = seq.commit("o-first", [batch("s")])[0].base_offset
    for thread in threads:
        thread.join(timeout=10)
    assert first == 0
    assert seq.stream_info("s").end_offset == 6
    assert seq.tail == before + 2  # the other replica's entry, then one with all six
    metrics = seq.metrics()
    assert metrics["sequencer_races_lost"] == 1
    assert metrics["sequencer_entries_written"] == 2  # the stream's, then the six
    assert metrics["sequencer_commits"] == 7
    assert metrics["sequencer_backlog"] == 0
    assert open_local(local_root).stream_info("s").end_offset == 6


def test_a_saturated_sequencer_says_so(
    local_root: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from disklesslog.sequencers.objectstore_pacing import Pacing

    monkeypatch.setattr(Pacing, "saturation", lambda self, tail: f"saturated at {tail}")
    seq = open_local(local_root)
    with caplog.at_level("WARNING", logger="disklesslog.sequencers.objectstore"):
        seq.create_stream("s", {})
    assert [r.getMessage() for r in caplog.records] == [f"{seq.url}: saturated at {seq.tail}"]


def test_an_object_log_reports_its_sequencers_races(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/log"
    with disklesslog.open(url, backend="objects", sequencer="objectstore://") as log:
        log.stream("s").append(b"x")
        metrics = log.metrics()
    assert metrics["sequencer_entries_written"] >= 2  # the stream, then the record
    assert metrics["sequencer_races_lost"] == 0
    assert "sequencer_backlog" in metrics
