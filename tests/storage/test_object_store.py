"""The storage layer's :class:`ObjectStore` on its own, on ``memory://`` and ``file://``:
what a missing object is to each operation, ranged reads at and past an object's end,
conditional creates that lose a race, idempotent deletes, listings, and retries counted
under the owner's prefix. (Its users are tested through the backends: tests/objects,
tests/maintenance/test_tier_*.py, tests/sequencers/test_objectstore*.py.)"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from disklesslog import StorageError
from disklesslog.metrics import Metrics
from disklesslog.storage import store as store_module
from disklesslog.storage.filesystems import open_filesystem
from disklesslog.storage.store import DELETE_CONCURRENCY, ObjectStore
from disklesslog.testing import FaultyMemoryFileSystem

DATA = bytes(range(100))


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "memory":
        url = f"memory://object-store-{uuid.uuid4().hex[:12]}"
    else:
        url = f"file://{tmp_path / 'store'}"
    fs, root = open_filesystem(url, None)
    return ObjectStore(fs, root, Metrics(), prefix="test_", retry_delay=0)


@pytest.fixture
def faulty() -> Iterator[ObjectStore]:
    FaultyMemoryFileSystem.reset()
    fs = FaultyMemoryFileSystem()
    yield ObjectStore(fs, f"/object-store-{uuid.uuid4().hex[:12]}", Metrics(), retry_delay=0)
    FaultyMemoryFileSystem.reset()


def counters(store: ObjectStore) -> dict[str, float]:
    return store.metrics.snapshot()


def test_a_missing_object_is_an_answer_never_a_failure(store: ObjectStore) -> None:
    assert store.get("a/missing") is None
    assert store.get_range("a/missing", 0, 10) is None
    assert store.delete(["a/missing"]) == 0
    assert store.listing("a") == {}
    assert store.names("a") == []
    assert store.names() == []  # not even the root exists yet
    assert not any(name.endswith("_errors") for name in counters(store))


def test_put_then_get_whole_and_ranged_up_to_and_past_the_end(store: ObjectStore) -> None:
    store.put("objects/x", DATA)
    assert store.get("objects/x") == DATA
    assert store.get_range("objects/x", 10, 20) == DATA[10:20]
    assert store.get_range("objects/x", 90, 200) == DATA[90:]  # fewer at the end
    assert store.get_range("objects/x", 100, 110) == b""  # none past it
    found = counters(store)
    assert found["test_puts"] == 1 and found["test_put_bytes"] == len(DATA)
    assert found["test_gets"] == 3 and found["test_get_bytes"] == 10 + 10
    assert "test_get_errors" not in found


def test_put_overwrites_whole_and_leaves_no_temporary_file(store: ObjectStore) -> None:
    store.put("log/1", b"old")
    store.put("log/1", b"new bytes")
    assert store.get("log/1") == b"new bytes"
    assert list(store.listing("log")) == ["log/1"]
    if store.local_root() is not None:
        assert store.local_root() == store.root  # opened by URL: an absolute path
        assert [p.name for p in Path(store.root, "log").iterdir()] == ["1"]


def test_put_if_absent_keeps_the_first_and_tells_the_loser(store: ObjectStore) -> None:
    assert store.put_if_absent("log/1", b"first") is True
    assert store.put_if_absent("log/1", b"second") is False
    assert store.get("log/1") == b"first"


def test_put_if_absent_race_has_exactly_one_winner(store: ObjectStore) -> None:
    start = threading.Barrier(8)
    won: list[int] = []

    def race(i: int) -> None:
        start.wait()
        if store.put_if_absent("log/7", str(i).encode()):
            won.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert store.get("log/7") == str(won[0]).encode()


def test_delete_is_idempotent_and_counts_what_existed(store: ObjectStore) -> None:
    store.put("objects/a", b"a")
    store.put("objects/b", b"b")
    assert store.delete(["objects/a", "objects/b", "objects/never"]) == 2
    assert store.delete(["objects/a"]) == 0
    assert store.get("objects/a") is None
    assert counters(store)["test_deletes"] == 2


def test_listing_is_recursive_with_sizes_and_names_are_one_level(store: ObjectStore) -> None:
    store.put("streams/s/1.log", DATA)
    store.put("streams/s/1.index", b"xy")
    store.put("streams/t/2.log", b"z")
    store.put("marker", b"m")
    listed = store.listing("streams")
    assert sorted(listed) == ["streams/s/1.index", "streams/s/1.log", "streams/t/2.log"]
    assert int(listed["streams/s/1.log"]["size"]) == len(DATA)
    assert sorted(store.names("streams")) == ["s", "t"]
    assert sorted(store.names()) == ["marker", "streams"]


def test_a_path_through_a_file_is_missing_on_a_local_disk(tmp_path: Path) -> None:
    fs, root = open_filesystem(f"file://{tmp_path}", None)
    store = ObjectStore(fs, root, Metrics(), retry_delay=0)
    store.put("a", b"a file, not a folder")
    assert store.get("a/b") is None
    assert store.get_range("a/b", 0, 1) is None
    assert store.delete(["a/b"]) == 0
    assert "get_errors" not in counters(store)


def test_failed_requests_are_retried_and_counted(faulty: ObjectStore) -> None:
    FaultyMemoryFileSystem.failing_puts = 2
    faulty.put("objects/a", DATA)
    FaultyMemoryFileSystem.failing_gets = 2
    assert faulty.get_range("objects/a", 0, 10) == DATA[:10]
    FaultyMemoryFileSystem.failing_deletes = 1
    assert faulty.delete(["objects/a"]) == 1
    found = counters(faulty)
    assert (found["put_errors"], found["get_errors"], found["delete_errors"]) == (2, 2, 1)


def test_the_last_failure_is_a_storage_error_naming_the_object(faulty: ObjectStore) -> None:
    FaultyMemoryFileSystem.failing_gets = 99
    with pytest.raises(StorageError, match=r"could not read .*/objects/a after 5 attempts"):
        faulty.get("objects/a")
    assert counters(faulty)["get_errors"] == 5


def test_a_create_whose_response_was_lost_is_reported_as_lost(faulty: ObjectStore) -> None:
    """The retry finds the object its first attempt created: False, as for a lost race
    (the caller reads it back to learn whose it is)."""
    FaultyMemoryFileSystem.lost_puts = 1
    assert faulty.put_if_absent("log/1", b"mine") is False
    assert faulty.get("log/1") == b"mine"
    assert counters(faulty)["put_errors"] == 1
    FaultyMemoryFileSystem.failing_puts = 99
    with pytest.raises(StorageError, match="may or may not exist now"):
        faulty.put_if_absent("log/2", b"never")


def test_a_local_listing_is_the_filesystems_own_faster(tmp_path: Path) -> None:
    """On a local disk the listing reads directories itself (``os.scandir``): the same
    keys, sizes and modification times as fsspec's ``find``, at any depth; a folder
    that does not exist, or is a file, lists nothing."""
    fs, root = open_filesystem(f"file://{tmp_path / 'store'}", None)
    store = ObjectStore(fs, root, Metrics(), retry_delay=0)
    for key, data in [
        ("objects/a", DATA),
        ("objects/x/b", b"b"),
        ("objects/x/y/c", b""),
        ("d", b""),
    ]:
        store.put(key, data)
    listed = store.listing("objects")
    theirs = fs.find(f"{root}/objects", detail=True)
    assert sorted(listed) == ["objects/a", "objects/x/b", "objects/x/y/c"]
    assert sorted(info["name"] for info in listed.values()) == sorted(theirs)
    for info in listed.values():
        assert info["size"] == theirs[info["name"]]["size"]
        assert info["mtime"] == theirs[info["name"]]["mtime"]
        assert info["type"] == "file"
    assert store.listing("nothing") == {}
    assert store.listing("d") == {}


def test_local_names_are_the_filesystems_own(tmp_path: Path) -> None:
    """On a local disk the names under a folder come from ``os.listdir`` (fsspec's ``ls``
    stats every entry): the same names as fsspec's, objects and folders; a folder that
    does not exist has none, and a file lists itself, as in fsspec (an object log's open
    refuses a file for not being empty)."""
    fs, root = open_filesystem(f"file://{tmp_path / 'store'}", None)
    store = ObjectStore(fs, root, Metrics(), retry_delay=0)
    for key in ("log/00000000000000000001", "log/00000000000000000002", "log/sub/x", "f"):
        store.put(key, b"")
    for folder, path in (("log", f"{root}/log"), ("", root)):
        theirs = [name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(path, detail=False)]
        assert sorted(store.names(folder)) == sorted(theirs)
    assert sorted(store.names("log")) == ["00000000000000000001", "00000000000000000002", "sub"]
    assert store.names("nothing") == []
    assert store.names("f") == [name.rsplit("/", 1)[-1] for name in fs.ls(f"{root}/f")] == ["f"]


def test_a_local_delete_that_fails_is_retried_then_a_storage_error(tmp_path: Path) -> None:
    """Deletes on a local disk skip the retry machinery while they succeed (a busy log's
    garbage collection deletes hundreds of thousands of objects); one that fails for
    any reason but absence still goes through it and fails as a StorageError."""
    fs, root = open_filesystem(f"file://{tmp_path / 'store'}", None)
    store = ObjectStore(fs, root, Metrics(), retry_delay=0)
    store.put("objects/folder/inside", b"x")
    store.put("objects/a", b"a")
    with pytest.raises(StorageError, match="objects/folder"):
        store.delete(["objects/a", "objects/folder"])
    assert store.get("objects/a") is None  # deleted before the failure
    assert store.get("objects/folder/inside") == b"x"
    assert counters(store)["deletes"] == 1


def test_deletes_on_object_storage_run_several_at_once(
    faulty: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One request per object on every store: one at a time, a bucket's round trip
    bounded garbage collection to a few dozen objects a second."""
    keys = [f"objects/{i:03d}" for i in range(64)]
    for key in keys:
        faulty.put(key, DATA)
    rm_file = faulty.fs.rm_file
    lock = threading.Lock()
    in_flight = [0, 0]  # now, most at once

    def slow(path: str) -> None:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])
        time.sleep(0.02)  # a bucket's round trip
        rm_file(path)
        with lock:
            in_flight[0] -= 1

    monkeypatch.setattr(faulty.fs, "rm_file", slow)
    assert faulty.delete([*keys, "objects/never-there"]) == 64
    assert faulty.listing("objects") == {}
    assert in_flight[1] == DELETE_CONCURRENCY
    assert counters(faulty)["deletes"] == 64


def test_a_delete_that_keeps_failing_does_not_stop_the_others(
    faulty: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nor the later windows of keys (here 8 keys each; the failing one is in the first)."""
    monkeypatch.setattr(store_module, "DELETE_WINDOW", 8)
    keys = [f"objects/{i:03d}" for i in range(40)]
    for key in keys:
        faulty.put(key, DATA)
    original = FaultyMemoryFileSystem.rm_file

    def failing(self: FaultyMemoryFileSystem, path: str) -> None:
        if path.endswith("/objects/007"):
            raise FaultyMemoryFileSystem.fault(f"injected DELETE failure for {path}")
        original(self, path)

    FaultyMemoryFileSystem.rm_file = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(StorageError, match=r"could not delete .*/objects/007 after 5"):
            faulty.delete(keys)
    finally:
        FaultyMemoryFileSystem.rm_file = original  # type: ignore[method-assign]
    assert sorted(faulty.listing("objects")) == ["objects/007"]
    assert counters(faulty)["delete_errors"] == 5
