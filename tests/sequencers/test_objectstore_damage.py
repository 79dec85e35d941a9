"""Damage to the object-store sequencer's entries and checkpoints is never skipped,
never applied in part, and never leaves replicas disagreeing in silence.

* The decoders, fuzzed: hundreds of damaged copies of real entries and checkpoints
  (bit flips, zeroed ranges, truncation, appended bytes, and well-formed msgpack of the
  wrong shape under a valid CRC) each decode to exactly the undamaged content or raise
  :class:`CorruptDataError` naming the object; the same damage in a stored log makes a
  fresh replica either reach the undamaged state or raise :class:`SequencerDamaged`
  naming it. Version 1 objects (no checksum) give typed errors too.
* The routes around damage: a damaged entry is passed only by an intact checkpoint
  that covers it (written by a process that applied it), a damaged checkpoint by an
  older one and the entries after it; each repair is logged; without a route every
  replica stops before the damage.
* Replicas: after damage each one either has the writer's state or raises, and the
  chain of digests stops a process that applied an entry later replaced.
* Transient storage failures of GETs and LISTs are retried.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import msgpack
import pytest
import zstandard

from disklesslog.errors import (
    CorruptDataError,
    DisklessLogError,
    SequencerDamaged,
    SequencerError,
    StorageError,
)
from disklesslog.sequencers import BatchLocation, BatchToCommit
from disklesslog.sequencers import objectstore_format as fmt
from disklesslog.sequencers.objectstore import ObjectStoreSequencer
from disklesslog.testing import FaultyMemoryFileSystem

SEED = 20240514


def open_local(root: Path, **options: Any) -> ObjectStoreSequencer:
    return ObjectStoreSequencer(fsspec.filesystem("file"), str(root), **options)


def batch(
    stream: str, span: int = 1, *, producer: tuple[int, int] | None = None, seq: int = -1
) -> BatchToCommit:
    pid, epoch = producer if producer is not None else (-1, -1)
    return BatchToCommit(stream, 0, 10, span, span, 1_700_000_000_000, pid, epoch, seq)


def entry_path(root: Path, number: int) -> Path:
    return root / "log" / f"{number:020d}"


def checkpoints(root: Path) -> list[Path]:
    return sorted((root / "checkpoints").iterdir()) if (root / "checkpoints").exists() else []


def every_operation(seq: ObjectStoreSequencer) -> None:
    """Entries holding every kind of operation, with producers, groups and garbage."""
    seq.create_stream("orders", {"retention_ms": 1000, "cleanup_policy": ["delete"]})
    seq.create_stream("events", {})
    lease = seq.acquire_lease("cleaner", "worker-1", 30_000)  # held at the checkpoint
    assert lease is not None
    named = seq.init_producer("app")
    anonymous = seq.init_producer()
    seq.commit("o-1", [batch("orders", 10, producer=named, seq=0), batch("events", 3)])
    seq.commit_many(
        [
            ("o-2", [batch("orders", 5, producer=named, seq=10)]),
            ("o-3", [batch("events", 2, producer=anonymous, seq=0)]),
        ]
    )
    seq.commit_transaction("txn-1", [("o-4", [batch("orders", 4)]), ("o-5", [batch("events")])])
    seq.trim("events", 2)
    seq.alter_stream("orders", {"retention_ms": 5000})
    ids = [b.batch_id for b in seq.find_batches("orders", 0, 1 << 30).batches[:2]]
    seq.replace_batches("orders", ids, [BatchLocation(0, "o-6.merged", 0, 20, 0, 14, 5)])
    seq.record_orphan("o-7")
    seq.commit_offsets("group-a", {"orders": 7, "events": 3})
    seq.create_stream("gone", {})
    seq.delete_stream("gone")
    seq.forget_objects(["o-7"])
    seq.release_lease(lease)
    assert seq.prune_leases(0) == ["cleaner"]


# ========================================================================= fuzzing


def damaged_copies(data: bytes, rng: random.Random, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` damaged copies of ``data``: bit flips (one or several), zeroed
    ranges, truncation, appended bytes, and a byte overwritten."""
    makers: list[Callable[[], tuple[str, bytes]]] = []

    def flip() -> tuple[str, bytes]:
        copy = bytearray(data)
        bits = rng.choice([1, 1, 1, 2, 3, 8])
        for _ in range(bits):
            at = rng.randrange(len(copy) * 8)
            copy[at // 8] ^= 1 << (at % 8)
        return f"{bits} bit flip(s)", bytes(copy)

    def zero() -> tuple[str, bytes]:
        start = rng.randrange(len(data))
        end = min(len(data), start + rng.choice([1, 4, 16, 256]))
        return f"zeroed {start}..{end}", data[:start] + bytes(end - start) + data[end:]

    def truncate() -> tuple[str, bytes]:
        keep = rng.randrange(len(data))
        return f"truncated to {keep}", data[:keep]

    def append() -> tuple[str, bytes]:
        extra = rng.choice([b"\x00", b"\xc0", rng.randbytes(rng.randrange(1, 64))])
        return f"{len(extra)} bytes appended", data + extra

    def overwrite() -> tuple[str, bytes]:
        at = rng.randrange(len(data))
        return f"byte {at} overwritten", data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]

    makers = [flip, flip, flip, zero, truncate, append, overwrite]
    for _ in range(count):
        yield rng.choice(makers)()


def wrong_shapes(value: Any, *, fixed_maps: bool) -> Iterator[tuple[str, Any]]:
    """Copies of a decoded msgpack value, each with one part replaced by something no
    valid entry or checkpoint holds there: a leaf of another type (bytes where
    anything else belongs, a str where bytes belong), a container replaced by bytes,
    an item appended to an array, and (``fixed_maps``: every map has fixed fields, as
    in checkpoints) a key of a map removed."""

    def walk(node: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], str]]:
        yield path, "replace"
        if isinstance(node, list):
            yield path, "append"
            for i, item in enumerate(node):
                yield from walk(item, (*path, i))
        elif isinstance(node, dict):
            for key, item in node.items():
                if fixed_maps and key not in ("transactions", "leases", "lease_floor"):
                    # those are absent in checkpoints written before them
                    yield (*path, key), "remove"
                yield from walk(item, (*path, key))

    for path, how in walk(value, ()):
        copy = _deep_copy(value)
        if how == "remove":
            parent = _at(copy, path[:-1])
            del parent[path[-1]]
            yield f"{path} removed", copy
            continue
        target = _at(copy, path)
        if how == "append":
            target.append(b"\xff")
            yield f"{path} + item", copy
            continue
        replacement = "x" if isinstance(target, bytes) else b"\xff"
        if not path:
            yield "replaced whole", replacement
            continue
        _at(copy, path[:-1])[path[-1]] = replacement
        yield f"{path} replaced", copy


def _deep_copy(value: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sequencer whose entries hold every operation, with one checkpoint (entry 10)."""
    root = tmp_path_factory.mktemp("written") / "sequencer"
    every_operation(open_local(root, checkpoint_every=10))
    return root


def test_fuzzed_entries_decode_whole_or_raise_naming_the_entry(written: Path) -> None:
    rng = random.Random(SEED)
    outcomes = {"identical": 0, "damage": 0}
    entries = sorted((written / "log").iterdir())
    assert len(entries) >= 15
    for path in entries:
        data = path.read_bytes()
        number = int(path.name)
        intact = fmt.decode_entry(data, number, str(path))
        for how, damaged in damaged_copies(data, rng, 40):
            try:
                decoded = fmt.decode_entry(damaged, number, str(path))
            except CorruptDataError as exc:
                assert exc.source == str(path), how
                outcomes["damage"] += 1
                continue
            assert damaged == data, f"{path.name}: {how} decoded to {decoded}"
            assert decoded == intact
            outcomes["identical"] += 1
    assert outcomes["damage"] >= 500


def test_entries_of_the_wrong_shape_under_a_valid_crc_are_damage(written: Path) -> None:
    """What only a buggy or hostile writer produces (the CRC holds) is refused whole,
    before any of its operations is applied."""
    tried = 0
    for path in sorted((written / "log").iterdir()):
        data = path.read_bytes()
        number = int(path.name)
        body = msgpack.unpackb(data[fmt.ENTRY_HEADER :], raw=False, strict_map_key=False)
        previous = data[22:38]
        for how, wrong in wrong_shapes(body, fixed_maps=False):
            if isinstance(wrong, list) and len(wrong) == 3 and isinstance(wrong[2], list):
                names = [op[0] for op in wrong[2] if isinstance(op, list) and op]
                if any(isinstance(n, str) and n not in fmt.OPERATIONS for n in names):
                    continue  # a newer release's operation: SequencerError, tested elsewhere
            stored = fmt.encode_entry(number, previous, msgpack.packb(wrong, use_bin_type=True))
            with pytest.raises(CorruptDataError) as caught:
                fmt.decode_entry(stored, number, str(path))
            assert caught.value.source == str(path), how
            tried += 1
    assert tried >= 250


def test_fuzzed_checkpoints_decode_whole_or_raise_naming_the_checkpoint(written: Path) -> None:
    rng = random.Random(SEED + 1)
    [path] = checkpoints(written)
    data = path.read_bytes()
    entry = int(path.name[:20])
    intact = fmt.decode_checkpoint(data, entry, str(path))
    damaged_seen = 0
    for how, damaged in damaged_copies(data, rng, 400):
        try:
            decoded = fmt.decode_checkpoint(damaged, entry, str(path))
        except CorruptDataError as exc:
            assert exc.source == str(path), how
            damaged_seen += 1
            continue
        assert damaged == data, f"{how} decoded"
        assert decoded == intact
    assert damaged_seen >= 350


def test_checkpoints_of_the_wrong_shape_under_a_valid_crc_are_damage(written: Path) -> None:
    [path] = checkpoints(written)
    data = path.read_bytes()
    entry = int(path.name[:20])
    frame = data[fmt.CHECKPOINT_HEADER :]
    content = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(frame), raw=False)
    tried = 0
    for how, wrong in wrong_shapes(content, fixed_maps=True):
        body = msgpack.packb(wrong, use_bin_type=True)
        stored = _checkpoint_with_body(entry, body)
        with pytest.raises(CorruptDataError) as caught:
            fmt.decode_checkpoint(stored, entry, str(path))
        assert caught.value.source == str(path), how
        tried += 1
    assert tried >= 150


def test_a_streams_rows_of_the_wrong_shape_are_damage_when_the_stream_is_first_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process opening a log checks each stream's rows of the checkpoint when it first
    uses the stream (a wide log opens without checking the streams it never touches).
    Rows of the wrong shape under a valid CRC are then CorruptDataError naming the
    checkpoint and the stream, every time; the other streams work; verify() names the
    checkpoint at once; and no checkpoint is ever written from those rows."""
    root = tmp_path / "sequencer"
    seq = open_local(root, checkpoint_every=5)
    seq.create_stream("good", {})
    seq.create_stream("bad", {})
    for i in range(3):
        seq.commit(f"o-{i}", [batch("good", 2), batch("bad", 3)])
    seq.close()
    [path] = checkpoints(root)
    entry = int(path.name[:20])
    frame = path.read_bytes()[fmt.CHECKPOINT_HEADER :]
    content = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(frame), raw=False)
    [bad] = [row for row in content["state"]["streams"] if row[1] == "bad"]
    bad[7][0][2] = "not a position"  # a batch row's position
    path.write_bytes(_checkpoint_with_body(entry, msgpack.packb(content, use_bin_type=True)))

    fresh = open_local(root, checkpoint_every=5)
    assert [b.base_offset for b in fresh.find_batches("good", 0, 100).batches] == [0, 2, 4]
    for _ in range(2):
        with pytest.raises(CorruptDataError) as caught:
            fresh.find_batches("bad", 0, 100)
        assert caught.value.source == str(path)
        assert "stream 'bad'" in caught.value.reason
    with pytest.raises(CorruptDataError):
        fresh.snapshot()
    with caplog.at_level(logging.ERROR, logger="disklesslog"):
        for i in range(5):  # entries 6..10: entry 10 is due a checkpoint
            fresh.commit(f"p-{i}", [batch("good")])
    assert checkpoints(root) == [path]
    assert "no checkpoint of entry 10 written" in caplog.text
    assert [exc.source for exc in fresh.verify()] == [str(path)]
    fresh.close()


def _checkpoint_with_body(entry: int, body: bytes) -> bytes:
    """A version 2 checkpoint around any msgpack body, with a valid CRC."""
    import struct

    import crc32c

    frame = zstandard.ZstdCompressor(write_checksum=True).compress(body)
    fields = struct.pack("<QQ", len(frame), entry)
    crc = crc32c.crc32c(fields + frame)
    return fmt.CHECKPOINT_MAGIC + struct.pack("<I", crc) + fields + frame


def test_a_stored_damaged_entry_stops_every_fresh_replica_naming_it(
    written: Path, tmp_path: Path
) -> None:
    """The same damage in a stored log: a fresh replica reaches the undamaged state
    (the damage lies below the checkpoint it loads) or raises SequencerDamaged naming
    the entry; never a raw exception, never another state."""
    rng = random.Random(SEED + 2)
    expected = open_local(written).snapshot()
    [checkpoint] = checkpoints(written)
    covered = int(checkpoint.name[:20])
    outcomes = {"stopped": 0, "same": 0}
    entries = sorted((written / "log").iterdir())
    for case in range(120):
        root = tmp_path / f"case-{case}"
        shutil.copytree(written, root)
        victim = rng.choice(entries)
        how, damaged = next(damaged_copies(victim.read_bytes(), rng, 1))
        (root / "log" / victim.name).write_bytes(damaged)
        try:
            state = open_local(root).snapshot()
        except SequencerDamaged as exc:
            assert exc.source == str(root / "log" / victim.name), how
            assert int(victim.name) > covered, how
            outcomes["stopped"] += 1
        else:
            assert state == expected, how
            outcomes["same"] += 1
        shutil.rmtree(root)
    assert outcomes["stopped"] >= 20 and outcomes["same"] >= 20


def test_a_stored_damaged_checkpoint_is_passed_by_replay_or_stops_naming_it(
    written: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While the entries it covers are there, a damaged checkpoint costs a longer
    replay (logged); once they were deleted, opening stops naming the checkpoint."""
    rng = random.Random(SEED + 3)
    expected = open_local(written).snapshot()
    [checkpoint] = checkpoints(written)
    covered = int(checkpoint.name[:20])
    for case, (how, damaged) in enumerate(damaged_copies(checkpoint.read_bytes(), rng, 60)):
        root = tmp_path / f"case-{case}"
        shutil.copytree(written, root)
        stored = root / "checkpoints" / checkpoint.name
        stored.write_bytes(damaged)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            assert open_local(root).snapshot() == expected, how
        if damaged != checkpoint.read_bytes():
            assert "is damaged" in caplog.text and checkpoint.name in caplog.text
        for number in range(1, covered + 1):  # as the clean-up after it would
            entry_path(root, number).unlink()
        if damaged != checkpoint.read_bytes():
            with pytest.raises(SequencerDamaged) as caught:
                open_local(root)
            assert caught.value.source == str(stored), how
        shutil.rmtree(root)


def test_version_1_objects_damaged_give_typed_errors(tmp_path: Path) -> None:
    """A log written before checksums: damage may go unseen (there is no checksum), but
    decoding never raises anything but a typed error."""
    rng = random.Random(SEED + 4)
    root = tmp_path / "v1"
    seq = open_local(root, checkpoint_every=10)
    every_operation(seq)
    entries = []
    for path in sorted((root / "log").iterdir()):
        body = msgpack.unpackb(path.read_bytes()[fmt.ENTRY_HEADER :], raw=False)
        entries.append((path, fmt.ENTRY_MAGIC_V1 + msgpack.packb(body, use_bin_type=True)))
    [checkpoint] = checkpoints(root)
    content = msgpack.unpackb(
        zstandard.ZstdDecompressor().decompress(checkpoint.read_bytes()[fmt.CHECKPOINT_HEADER :]),
        raw=False,
    )
    del content["chain"]
    content["entry"] = int(checkpoint.name[:20])
    state = content["state"]  # version 1 had no times of producer state
    state["producers"] = [row[:2] for row in state["producers"]]
    state["streams"] = [[*row[:9], [p[:3] for p in row[9]]] for row in state["streams"]]
    old_checkpoint = fmt.CHECKPOINT_MAGIC_V1 + zstandard.ZstdCompressor().compress(
        msgpack.packb(content, use_bin_type=True)
    )
    caught = 0
    for path, data in entries:
        fmt.decode_entry(data, int(path.name), "x")  # the intact one decodes
        for _how, damaged in damaged_copies(data, rng, 25):
            try:
                fmt.decode_entry(damaged, int(path.name), "x")
            except (CorruptDataError, SequencerError):
                caught += 1
    assert caught > 25 * len(entries) // 2  # most damage is still caught by the structure
    fmt.decode_checkpoint(old_checkpoint, content["entry"], "x")
    caught = 0
    for _how, damaged in damaged_copies(old_checkpoint, rng, 300):
        try:
            fmt.decode_checkpoint(damaged, content["entry"], "x")
        except CorruptDataError:
            caught += 1
    assert caught > 150
    # Stored: a fresh replica of a damaged version 1 log answers or raises typed errors.
    caught = 0
    for case in range(60):
        copy = tmp_path / f"case-{case}"
        (copy / "log").mkdir(parents=True)
        victim = rng.randrange(len(entries))
        for i, (path, data) in enumerate(entries):
            stored = next(damaged_copies(data, rng, 1))[1] if i == victim else data
            (copy / "log" / path.name).write_bytes(stored)
        try:
            open_local(copy).snapshot()
        except DisklessLogError:
            caught += 1
    assert caught > 0  # and no other exception at all


# ========================================================== the reproduction


def test_one_flipped_bit_in_a_commit_never_drops_acknowledged_records(tmp_path: Path) -> None:
    """The campaign's case: one bit of the stream name in the entry of an acknowledged
    commit of 10 records. Before checksums a fresh replica refused the commit on replay
    (records gone, the producer's later commits out of order) while the writer kept
    them. Now the fresh replica stops naming the entry, the writer goes on, and once
    the writer writes a checkpoint every replica has its state."""
    root = tmp_path / "sequencer"
    writer = open_local(root)
    writer.create_stream("orders", {})
    producer = writer.init_producer("app")
    acknowledged = writer.commit("o-1", [batch("orders", 10, producer=producer, seq=0)])
    assert acknowledged[0].base_offset == 0
    damaged_path = entry_path(root, writer.tail)
    data = bytearray(damaged_path.read_bytes())
    data[data.index(b"orders") + 2] ^= 0x01  # "orders" -> "orders" with one bit changed
    damaged_path.write_bytes(bytes(data))

    with pytest.raises(SequencerDamaged) as caught:
        open_local(root)
    assert caught.value.source == str(damaged_path)
    assert isinstance(caught.value, CorruptDataError)

    # The writer still has the commit and goes on with the producer's next records.
    assert (
        writer.commit("o-2", [batch("orders", 5, producer=producer, seq=10)])[0].base_offset == 10
    )
    writer.write_checkpoint()
    reader = open_local(root)
    assert reader.stream_info("orders").end_offset == 15
    assert reader.snapshot() == writer.snapshot()
    assert (
        reader.commit("o-3", [batch("orders", 1, producer=producer, seq=15)])[0].base_offset == 15
    )
    assert writer.stream_info("orders").end_offset == 16


# =============================================================== replicas agree


def _replica_outcome(seq: ObjectStoreSequencer) -> dict[str, Any] | SequencerDamaged:
    try:
        return seq.snapshot()
    except SequencerDamaged as exc:
        return exc


def test_after_damage_every_replica_has_the_writers_state_or_raises(tmp_path: Path) -> None:
    """Four kinds of replica around one damaged entry: the writer (applied it from its
    own bytes), a reader that read it before the damage, a reader stopped before it,
    and a fresh one. Damage in many places of the entry, each time: every replica
    answers with the writer's state or raises SequencerDamaged, before and after the
    writer goes on, and all agree again after the writer's checkpoint."""
    rng = random.Random(SEED + 5)
    for case in range(25):
        root = tmp_path / f"case-{case}"
        writer = open_local(root)
        writer.create_stream("s", {})
        producer = writer.init_producer("w")
        behind = open_local(root)  # stops before the damaged entry
        writer.commit("o-0", [batch("s", 3, producer=producer, seq=0)])
        victim = writer.tail + 1
        writer.commit("o-1", [batch("s", 10, producer=producer, seq=3), batch("s", 2)])
        ahead = open_local(root)  # read the entry intact
        path = entry_path(root, victim)
        original = path.read_bytes()
        how, damaged = next(damaged_copies(original, rng, 1))
        if damaged == original:
            continue
        path.write_bytes(damaged)
        writer.commit("o-2", [batch("s", 1, producer=producer, seq=13)])  # the writer goes on
        truth = writer.snapshot()
        with pytest.raises(SequencerDamaged) as caught:
            open_local(root)
        assert caught.value.source == str(path), how
        for replica in (ahead, behind):
            outcome = _replica_outcome(replica)
            assert outcome == truth or (
                isinstance(outcome, SequencerDamaged) and outcome.source == str(path)
            ), how
        assert ahead.snapshot() == truth
        writer.write_checkpoint()
        for replica in [ahead, behind, open_local(root)]:
            assert replica.snapshot() == writer.snapshot()


def test_a_process_that_applied_a_replaced_entry_stops_instead_of_diverging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last resort for a damaged last entry nobody has: discard it. A process that
    did apply the original (left running, against the procedure) must not go on with
    another history: the next entry written by the others names a chain digest it does
    not have, so it stops; and entries it writes stop the others."""
    root = tmp_path / "sequencer"
    writer = open_local(root)
    writer.create_stream("s", {})
    writer.commit("o-1", [batch("s", 4)])
    number = writer.tail
    path = entry_path(root, number)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))

    with pytest.raises(SequencerDamaged):
        open_local(root)
    operator = open_local(root, repair=True)  # stops before the damage, and says so
    assert operator.tail == number - 1
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        operator.discard_entry(number, "its writer's machine died; no copy exists")
    assert "discarded damaged entry" in caplog.text
    assert operator.tail == number
    assert operator.stream_info("s").end_offset == 0  # the commit is lost
    assert open_local(root).snapshot() == operator.snapshot()

    operator.commit("o-2", [batch("s", 1)])
    with pytest.raises(SequencerDamaged, match="another history"):
        writer.stream_info("s")  # the writer applied the original entry
    restarted = open_local(root)  # restarted, a process follows the log as it is
    assert restarted.snapshot() == operator.snapshot()


# ========================================================== routes and clean-up


def test_clean_up_keeps_the_entries_a_damaged_checkpoint_would_supersede(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The clean-up reads back the checkpoint it deletes entries for: a damaged one
    supersedes nothing (an older intact one does), so the route around it stays."""
    clock = Clock()
    root = tmp_path / "sequencer"
    seq = open_local(root, clock=clock, checkpoint_every=5, entry_retention_seconds=60)
    seq.create_stream("s", {})
    for i in range(11):
        seq.commit(f"o{i}", [batch("s")])
    newest = checkpoints(root)[-1]  # entry 10
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x10
    newest.write_bytes(bytes(data))
    clock.now += 61
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        deleted = seq.delete_superseded()
    assert "is damaged" in caplog.text
    assert deleted == 5  # entries 1..5, superseded by the intact checkpoint 5
    assert [p.name[:20] for p in checkpoints(root)] == [f"{5:020d}", f"{10:020d}"]
    assert open_local(root).snapshot() == seq.snapshot()  # checkpoint 5 + entries 6..12


def test_a_damaged_entry_read_intact_the_second_time_is_applied(
    faulty: tuple[Any, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Damage seen once may have happened in transit: the entry is read again before it
    is called damaged."""
    fs, root = faulty
    writer = ObjectStoreSequencer(fs, root)
    writer.create_stream("s", {})
    writer.commit("o1", [batch("s", 2)])
    path = f"{root}/log/{2:020d}"
    real = fs.cat_file
    flipped: list[str] = []

    def once_damaged(p: str, *args: Any, **kwargs: Any) -> bytes:
        data = bytes(real(p, *args, **kwargs))
        if p.endswith(path) and not flipped:
            flipped.append(p)
            return data[:-1] + bytes([data[-1] ^ 1])
        return data

    monkeypatch.setattr(fs, "cat_file", once_damaged)
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        reader = ObjectStoreSequencer(fs, root)
    assert flipped and "then intact" in caplog.text
    assert reader.snapshot() == writer.snapshot()


@pytest.fixture
def faulty() -> Iterator[tuple[Any, str]]:
    FaultyMemoryFileSystem.reset()
    fs = FaultyMemoryFileSystem()
    root = f"/damage-{random.Random().randrange(1 << 60):x}"
    yield fs, root
    FaultyMemoryFileSystem.reset()
    if fs.exists(root):
        fs.rm(root, recursive=True)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


# ====================================================================== retries


def test_opening_retries_failed_gets(faulty: tuple[Any, str]) -> None:
    """Replaying (one GET at a time, then several per call) survives failed GETs."""
    fs, root = faulty
    writer = ObjectStoreSequencer(fs, root, checkpoint_every=1000)
    writer.create_stream("s", {})
    for i in range(40):
        writer.commit(f"o{i}", [batch("s")])
    for failures in (1, 4):
        FaultyMemoryFileSystem.failing_gets = failures
        reader = ObjectStoreSequencer(fs, root, checkpoint_every=1000)
        assert FaultyMemoryFileSystem.failing_gets == 0
        assert reader.snapshot() == writer.snapshot()


def test_loading_a_checkpoint_retries_failed_lists_and_gets(
    faulty: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, root = faulty
    writer = ObjectStoreSequencer(fs, root, checkpoint_every=5)
    writer.create_stream("s", {})
    for i in range(12):
        writer.commit(f"o{i}", [batch("s")])
    real_ls = fs.ls
    failures = {"ls": 3}

    def flaky_ls(path: str, *args: Any, **kwargs: Any) -> Any:
        if failures["ls"]:
            failures["ls"] -= 1
            raise ConnectionError(f"injected LIST failure for {path}")
        return real_ls(path, *args, **kwargs)

    monkeypatch.setattr(fs, "ls", flaky_ls)
    FaultyMemoryFileSystem.failing_gets = 1  # the checkpoint's GET
    FaultyMemoryFileSystem.gets = 0
    reader = ObjectStoreSequencer(fs, root, checkpoint_every=5)
    assert failures["ls"] == 0 and FaultyMemoryFileSystem.failing_gets == 0
    assert reader.snapshot() == writer.snapshot()
    assert FaultyMemoryFileSystem.gets <= 1 + 1 + 3 + 8  # the checkpoint twice, 11..13, misses


def test_a_get_that_keeps_failing_is_a_storage_error_and_changes_nothing(
    faulty: tuple[Any, str],
) -> None:
    fs, root = faulty
    writer = ObjectStoreSequencer(fs, root)
    writer.create_stream("s", {})
    FaultyMemoryFileSystem.failing_gets = 100
    with pytest.raises(StorageError, match="after 5 attempts"):
        ObjectStoreSequencer(fs, root)
    FaultyMemoryFileSystem.failing_gets = 0
    assert ObjectStoreSequencer(fs, root).snapshot() == writer.snapshot()


# ============================================================== repair tools


def test_verify_names_every_damaged_object(tmp_path: Path) -> None:
    root = tmp_path / "sequencer"
    seq = open_local(root, checkpoint_every=5)
    seq.create_stream("s", {})
    for i in range(11):
        seq.commit(f"o{i}", [batch("s")])
    assert seq.verify() == []
    damaged = [entry_path(root, 3), entry_path(root, 8), checkpoints(root)[0]]
    for path in damaged:
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x04
        path.write_bytes(bytes(data))
    # entry 12 copied from another log's history: intact alone, but it does not follow 11
    other = open_local(tmp_path / "other")
    other.create_stream("t", {})
    for i in range(11):
        other.commit(f"x{i}", [batch("t")])
    entry_path(root, 12).write_bytes(entry_path(tmp_path / "other", 12).read_bytes())
    found = {error.source: error.reason for error in seq.verify()}
    assert set(found) == {str(p) for p in damaged} | {str(entry_path(root, 12))}
    assert "another history" in found[str(entry_path(root, 12))]
    # With the entries before checkpoint 10 gone, entry 11 is checked against it.
    for number in range(1, 11):
        entry_path(root, number).unlink()
    entry_path(root, 11).write_bytes(entry_path(tmp_path / "other", 11).read_bytes())
    found = {error.source: error.reason for error in seq.verify()}
    assert "another history" in found[str(entry_path(root, 11))]


def test_discard_entry_refuses_what_it_must_not_touch(tmp_path: Path) -> None:
    root = tmp_path / "sequencer"
    seq = open_local(root, checkpoint_every=1000)
    seq.create_stream("s", {})
    seq.commit("o1", [batch("s")])
    seq.commit("o2", [batch("s")])
    with pytest.raises(SequencerError, match="intact"):
        seq.discard_entry(2, "no reason")
    path = entry_path(root, 2)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(SequencerError, match="entries after 2"):
        open_local(root, repair=True).discard_entry(2, "its writer is gone")
    with pytest.raises(SequencerError, match="does not exist"):
        seq.discard_entry(9, "no reason")
    with pytest.raises(DisklessLogError):
        seq.discard_entry(0, "no reason")
    with pytest.raises(DisklessLogError):
        seq.discard_entry(3, "")
    entry_path(root, 3).unlink()  # entry 3 deleted by hand; entry 4 follows a gap
    seq.commit("o3", [batch("s")])
    with pytest.raises(SequencerError, match="entries after 2"):
        open_local(root, repair=True).discard_entry(2, "its writer is gone")


def test_a_replica_that_failed_to_apply_an_entry_whole_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure that is not a verdict (a bug) halfway through an entry: the replica
    may hold part of it, so it refuses every later call instead of answering."""
    from disklesslog.sequencers import objectstore

    root = tmp_path / "sequencer"
    writer = open_local(root)
    writer.create_stream("s", {})
    reader = open_local(root)
    writer.commit_many([("o1", [batch("s")]), ("o2", [batch("s")])])

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setitem(objectstore._OPS, "commit", broken)
    with pytest.raises(SequencerError, match="could not be applied whole"):
        reader.list_streams()
    monkeypatch.undo()
    with pytest.raises(SequencerError, match="no longer trusted"):
        reader.list_streams()
    assert open_local(root).snapshot() == writer.snapshot()


# ======================================================================= in a log


def test_a_log_reports_the_damage_and_a_checkpoint_from_the_writer_repairs_it(
    tmp_path: Path,
) -> None:
    """What a user sees: another process's log refuses to read past the damaged entry
    (a typed error naming it) while the writer's log still reads everything; the writer
    writes a checkpoint and every log reads the same records again."""
    import disklesslog

    url = f"file://{tmp_path}/log"
    options: dict[str, Any] = {"backend": "objects", "sequencer": "objectstore://"}
    with disklesslog.open(url, **options) as writer_log:
        stream = writer_log.stream("orders")
        stream.append_batch([f"record {i}".encode() for i in range(10)])
        sequencer = writer_log.sequencer  # type: ignore[attr-defined]
        damaged = tmp_path / "log" / "_sequencer" / "log" / f"{sequencer.tail:020d}"
        data = bytearray(damaged.read_bytes())
        data[data.index(b"orders")] ^= 0x20
        damaged.write_bytes(bytes(data))
        with pytest.raises(SequencerDamaged) as caught, disklesslog.open(url, **options) as other:
            list(other.stream("orders").read())
        assert caught.value.source == str(damaged)
        assert len(list(stream.read())) == 10
        sequencer.write_checkpoint()
        with disklesslog.open(url, **options) as other:
            assert [r.value for r in other.stream("orders").read()] == [
                f"record {i}".encode() for i in range(10)
            ]


@pytest.mark.s3
def test_a_stale_replica_lists_checkpoints_other_processes_wrote(s3_server: str) -> None:
    """s3fs caches listings per filesystem instance: a replica that had not looked for a
    while, listing the checkpoints through its cache, missed the newer ones, took the
    first entry deleted under it for the end of the log and wrote there: two
    histories. Listings now bypass the cache."""
    import s3fs

    from disklesslog.testing import create_bucket, s3_storage_options

    options = s3_storage_options(s3_server)
    root = f"{create_bucket('s3', options)}/sequencer"
    clock = Clock()

    def replica() -> ObjectStoreSequencer:  # its own filesystem instance, as a process has
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        return ObjectStoreSequencer(
            fs, root, clock=clock, checkpoint_every=5, entry_retention_seconds=60
        )

    busy = replica()
    busy.create_stream("s", {})
    for i in range(5):
        busy.commit(f"o{i}", [batch("s")])
    idle = replica()  # loads checkpoint 5: its filesystem has listed the checkpoints
    for i in range(5, 16):
        busy.commit(f"o{i}", [batch("s")])
    clock.now += 61
    busy.commit("late", [batch("s")])
    assert busy.delete_superseded() > 0  # entries up to 15 are gone
    idle._confirmed = -float("inf")  # it has not looked for longer than the window
    assert idle.commit("idle", [batch("s")])[0].base_offset == 17
    assert replica().snapshot() == idle.snapshot() == busy.snapshot()


def test_a_checkpoint_that_vanishes_while_it_is_loaded_is_looked_up_again(
    faulty: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that vanishes between the listing and its GET was superseded (and
    the entries it covers deleted): list again. One that keeps vanishing is an error,
    never an empty log (its entries are gone: replaying them would find nothing)."""
    from disklesslog.sequencers.objectstore_storage import SequencerStorage

    fs, root = faulty
    writer = ObjectStoreSequencer(fs, root, checkpoint_every=5)
    writer.create_stream("s", {})
    for i in range(11):
        writer.commit(f"o{i}", [batch("s")])
    for number in range(1, 11):  # as the clean-up after checkpoint 10 does
        fs.rm_file(f"{root}/log/{number:020d}")
    real_get = SequencerStorage.get
    vanishing = {"times": 1}

    def get(self: SequencerStorage, path: str) -> bytes | None:
        if "/checkpoints/" in path and vanishing["times"]:
            vanishing["times"] -= 1
            return None
        return real_get(self, path)

    monkeypatch.setattr(SequencerStorage, "get", get)
    assert ObjectStoreSequencer(fs, root).snapshot() == writer.snapshot()
    vanishing["times"] = 1000
    with pytest.raises(SequencerError, match="vanished"):
        ObjectStoreSequencer(fs, root)
