"""Consumer-group offsets of local logs (``groups/<group>.json``): concurrent commits
from several processes and threads keep each other's streams; damage is reported."""

from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import CorruptDataError
from disklesslog.checksummed import decode_json

SPAWN = multiprocessing.get_context("spawn")
COMMITS = 150


def _commit_worker(directory: str, tag: int, barrier: Any) -> None:
    """Commit offsets 1..COMMITS of this worker's stream, checking after each commit that
    it reads back and that the other workers' offsets never go backwards."""
    with disklesslog.open(directory, fsync="never") as log:
        mine = f"s{tag}"
        barrier.wait(timeout=60)
        last_seen: dict[str, int] = {}
        for offset in range(1, COMMITS + 1):
            log.commit_offsets("g", {mine: offset})
            seen = log.committed_offsets("g")
            assert seen[mine] == offset, (mine, offset, seen)
            for stream, value in seen.items():
                assert value >= last_seen.get(stream, 0), (stream, value, last_seen)
            last_seen = seen


def test_four_processes_commit_to_one_group(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        for tag in range(4):
            log.stream(f"s{tag}").append_batch([b"x"] * (COMMITS + 1))
    barrier = SPAWN.Barrier(4)
    workers = [
        SPAWN.Process(target=_commit_worker, args=(str(tmp_path), tag, barrier)) for tag in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    with disklesslog.open(tmp_path) as log:
        assert log.committed_offsets("g") == {f"s{tag}": COMMITS for tag in range(4)}
    assert not [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("group-")]


def test_threads_commit_to_one_group(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        names = [f"t{i}" for i in range(6)]
        for name in names:
            log.stream(name).append(b"x")

        def commit_many(name: str) -> None:
            for offset in range(100):
                log.commit_offsets("g", {name: offset})

        threads = [threading.Thread(target=commit_many, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert log.committed_offsets("g") == dict.fromkeys(names, 99)


def test_group_file_layout_and_fsync(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="always") as log:
        log.stream("b").append(b"x")
        log.stream("a").append(b"x")
        log.commit_offsets("my.group", {"b": 1, "a": 0})
    path = tmp_path / "groups" / "my.group.json"
    content, checked = decode_json(path.read_bytes(), str(path), what="group")
    assert checked
    assert content == {"version": 2, "group": "my.group", "offsets": {"a": 0, "b": 1}}
    with disklesslog.open(tmp_path, create=False) as log:
        assert log.committed_offsets("my.group") == {"a": 0, "b": 1}


def test_version_1_group_files_are_read(tmp_path: Path) -> None:
    """Files written before checksums (version 1, plain JSON) are read as before, and
    replaced by checksummed ones on the next commit."""
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("s").append(b"x")
        log.stream("t").append(b"x")
        path = tmp_path / "groups" / "g.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"version": 1, "group": "g", "offsets": {"s": 1}}))
        assert log.committed_offsets("g") == {"s": 1}
        log.commit_offsets("g", {"t": 1})
        assert decode_json(path.read_bytes(), str(path), what="group")[1]
        assert log.committed_offsets("g") == {"s": 1, "t": 1}


def test_damaged_offset_in_a_group_file_is_detected(tmp_path: Path) -> None:
    """A changed digit still parses as JSON: only the checksum catches it."""
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("s").append(b"x")
        log.commit_offsets("g", {"s": 12345})
        path = tmp_path / "groups" / "g.json"
        raw = path.read_bytes()
        path.write_bytes(raw.replace(b"12345", b"12346"))
        with pytest.raises(CorruptDataError, match="CRC-32C") as info:
            log.committed_offsets("g")
        assert info.value.source == str(path)


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{not json",
        b"\x00\x01\x02",
        b"[]",
        b'{"version": 2, "group": "g", "offsets": {}}',
        b'{"version": 1, "group": "other", "offsets": {"s": 1}}',
        b'{"version": 1, "group": "g", "offsets": [1]}',
        b'{"version": 1, "group": "g", "offsets": {"s": -1}}',
        b'{"version": 1, "group": "g", "offsets": {"s": "3"}}',
        b'{"version": 1, "group": "g", "offsets": {"s": 1.5}}',
    ],
)
def test_corrupt_group_file_is_reported(tmp_path: Path, damage: bytes) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("s").append(b"x")
        log.commit_offsets("g", {"s": 1})
        path = tmp_path / "groups" / "g.json"
        path.write_bytes(damage)
        with pytest.raises(CorruptDataError) as info:
            log.committed_offsets("g")
        assert info.value.source == str(path)
        assert str(path) in str(info.value)
        with pytest.raises(CorruptDataError):
            log.commit_offsets("g", {"s": 1})  # never overwrites what it cannot read
        with pytest.raises(CorruptDataError):
            log.consumer("g", ["s"])
        assert path.read_bytes() == damage
        assert log.committed_offsets("other") == {}  # other groups are unaffected


def test_a_group_file_of_another_group_is_reported_in_plain_words(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("s").append(b"x")
        path = tmp_path / "groups" / "g.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"version": 1, "group": "other", "offsets": {"s": 1}}))
        with pytest.raises(CorruptDataError) as info:
            log.committed_offsets("g")
        assert "does not hold the offsets of group 'g'" in str(info.value)
