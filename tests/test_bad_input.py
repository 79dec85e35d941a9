"""Bad input at every public entry point is refused with a typed error (a
``DisklessLogError`` subclass) and leaves nothing behind: no file or directory (in the
log, next to it, or in the working directory), no SQLite database, no stream, no record,
no committed offset, nothing in the ``memory://`` filesystem.

The first part is issue 14's list, each case by name; the second a table of several
hundred bad inputs across ``open()``, ``Log``, ``Stream``, ``Writer``, ``Consumer``,
``Stager`` and the command line, each run on every local backend and sequencer kind
(segments; objects on ``memory://`` and on ``file://`` with SQLite and with the
object-store sequencer).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

import disklesslog
from disklesslog import (
    ConfigError,
    DisklessLogError,
    InvalidRecordError,
    InvalidStreamName,
    InvalidURL,
    OffsetOutOfRange,
    StreamNotFound,
    TransactionError,
)
from disklesslog.cli import main
from disklesslog.format import MAX_OFFSET
from disklesslog.transactions import StagedPart

# ------------------------------------------------------------------ what "nothing" is


def _tree(path: Path) -> dict[str, int]:
    """Every file and directory under ``path``: its relative path and size (directories
    -1). A SQLite database counts by its presence alone, and its ``-wal``/``-shm``
    files not at all: SQLite checkpoints and removes them when a connection closes (a
    writer thread's, at any moment), and a transaction that changes nothing may grow
    the WAL. What the database holds is compared through the log instead (streams,
    records, committed offsets)."""
    found: dict[str, int] = {}
    if not path.exists():
        return found
    for root, dirs, files in os.walk(path):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), path)] = -1
        for name in files:
            if name.endswith(("-shm", "-wal", "-journal")):
                continue
            full = os.path.join(root, name)
            size = 0 if name.endswith(".db") else os.path.getsize(full)
            found[os.path.relpath(full, path)] = size
    return found


def _memory_files() -> dict[str, int]:
    """Everything in the process's ``memory://`` filesystem (directories as -1)."""
    fs = fsspec.filesystem("memory")
    found = {path: len(data.getvalue()) for path, data in fs.store.items()}
    found.update(dict.fromkeys(fs.pseudo_dirs, -1))
    return found


@dataclass
class Place:
    """Where an open may create things: a fresh directory that is also the working
    directory, and the memory filesystem."""

    root: Path

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        return _tree(self.root), _memory_files()


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Place:
    root = tmp_path / "place"
    root.mkdir()
    monkeypatch.chdir(root)
    return Place(root)


def _refused(
    place: Place, call: Callable[[], Any], error: type[BaseException] = DisklessLogError
) -> DisklessLogError:
    """Run ``call``; it must raise ``error`` (a DisklessLogError) and change nothing."""
    before = place.snapshot()
    with pytest.raises(error) as info:
        result = call()
        if isinstance(result, disklesslog.AbstractLog):
            result.close()
    assert isinstance(info.value, DisklessLogError), repr(info.value)
    assert _changes(before, place.snapshot()) == [], "a refused call left something behind"
    return info.value


def _changes(
    before: tuple[dict[str, int], ...], after: tuple[dict[str, int], ...]
) -> list[tuple[str, int | None, int | None]]:
    """What differs between two snapshots of file trees: (path, size before, after)."""
    return sorted(
        (path, old.get(path), new.get(path))
        for old, new in zip(before, after)
        for path in old.keys() | new.keys()
        if old.get(path) != new.get(path)
    )


# ============================================================ issue 14's list, by name


def test_append_batch_refuses_none_numbers_dicts_and_sets_on_every_backend(
    place: Place,
) -> None:
    """``append_batch(None)``/``(5)`` raised a raw TypeError, and a dict or a set was
    accepted (a dict's keys were written), on the stream and on writers."""
    for log in (
        disklesslog.open(place.root / "seg", fsync="never"),
        disklesslog.open(f"memory://bad-{uuid.uuid4().hex}/log"),
        disklesslog.open(f"file://{place.root}/objects", backend="objects"),
    ):
        with log:
            _append_batch_refuses_what_is_no_column(place, log)


def _append_batch_refuses_what_is_no_column(place: Place, log: disklesslog.Log) -> None:
    stream = log.stream("s")
    stream.append(b"kept")
    with log.writer() as writer:
        for values in (None, 5, {b"a": b"b"}, {b"a"}, frozenset({b"a"}), b"ab", "ab"):
            _refused(place, lambda v=values: stream.append_batch(v), InvalidRecordError)
            _refused(place, lambda v=values: writer.append_batch("s", v), InvalidRecordError)
        for keys in ({b"k": b"v"}, {b"k"}, 5, b"k"):
            _refused(place, lambda k=keys: stream.append_batch([b"x"], keys=k), InvalidRecordError)
            _refused(
                place,
                lambda k=keys: writer.append_batch("s", [b"x"], keys=k),
                InvalidRecordError,
            )
        _refused(
            place, lambda: writer.append_batch("s", [b"x"], timestamps=1.5), InvalidRecordError
        )
    assert [r.value for r in stream.read()] == [b"kept"]
    # Ordered iterables other than lists stay welcome.
    assert stream.append_batch(v for v in (b"g0", b"g1")) == [1, 2]
    assert stream.append_batch((b"t",), keys=iter([b"k"])) == [3]


@pytest.mark.parametrize(
    "options",
    [
        {"sequncer": "sqlite"},  # misspelt
        {"cache": 5},
        {"cache": "big"},
        {"compression": "lz4"},
        {"storage_options": "k=v"},
        {"storage_options": 5},
        {"sequencer": 5},
        {"create": "no"},
        {"create": 1},
        {"max_inflight": 3},  # a writer option, not a log's
    ],
    ids=repr,
)
def test_a_refused_object_log_open_leaves_no_sqlite_files(place: Place, options: dict) -> None:
    _refused(
        place,
        lambda: disklesslog.open(f"file://{place.root}/log", backend="objects", **options),
        ConfigError,
    )


def test_a_segments_log_opened_as_objects_is_refused_before_anything_is_created(
    place: Place,
) -> None:
    """The SQLite database used to be created inside the segments log first."""
    disklesslog.open(place.root / "log", fsync="never").close()
    for url in (str(place.root / "log"), f"file://{place.root}/log"):
        error = _refused(place, lambda u=url: disklesslog.open(u, backend="objects"), InvalidURL)
        assert "another kind" in str(error)
    assert sorted(os.listdir(place.root / "log")) == ["disklesslog.json", "streams", "tmp"]


def test_an_object_log_adopts_no_foreign_directory(place: Place) -> None:
    foreign = place.root / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    error = _refused(
        place, lambda: disklesslog.open(f"file://{foreign}", backend="objects"), InvalidURL
    )
    assert "cat.jpg" in str(error)
    fs = fsspec.filesystem("memory")
    prefix = f"/foreign-{uuid.uuid4().hex}"
    fs.pipe(f"{prefix}/data.csv", b"a,b")
    _refused(place, lambda: disklesslog.open(f"memory://{prefix}"), InvalidURL)
    fs.rm(prefix, recursive=True)


def test_an_object_log_whose_creator_stopped_before_its_marker_opens() -> None:
    """A new log's marker is written last: what an interrupted creation leaves (our own
    entries, the sequencer's database) is a log being created, not a foreign place."""
    url = f"memory://half-{uuid.uuid4().hex}/log"
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe(f"{root}/_sequencer/entries/0", b"")
    fs.pipe(f"{root}/objects/0-0", b"")
    with disklesslog.open(url, sequencer="objectstore://") as log:
        assert log.streams() == []
    fs.rm(root, recursive=True)


def test_an_object_log_whose_marker_is_being_written_elsewhere_opens(tmp_path: Path) -> None:
    """Another process writing the marker by rename leaves ``disklesslog.json.tmp-<hex>``
    for a moment, and its SQLite sequencer's lock file is there from the start: a process
    opening the log then sees a log being created (CI saw four processes opening one new
    log refuse it as foreign)."""
    root = tmp_path / "log"
    root.mkdir()
    (root / "disklesslog.json.tmp-0123456789abcdef").write_bytes(b"{")
    (root / "disklesslog-meta.db-lock").write_bytes(b"")  # the sequencer's presence lock
    with disklesslog.open(f"file://{root}", backend="objects") as log:
        assert log.streams() == []
    stray = tmp_path / "other"
    stray.mkdir()
    (stray / "notes.txt.tmp-0123456789abcdef").write_bytes(b"x")
    with pytest.raises(InvalidURL, match=r"notes\.txt\.tmp"):
        disklesslog.open(f"file://{stray}", backend="objects")


@pytest.mark.parametrize(
    "url",
    [
        "{root}/a\x00b",
        "file://{root}/a\x00b",
        "file://{root}/a%00b",
        "memory://nul\x00/log",
        "s3://bucket\x00/log",
    ],
)
def test_a_nul_in_a_path_or_url_is_an_invalid_url(place: Place, url: str) -> None:
    _refused(place, lambda: disklesslog.open(url.format(root=place.root)), InvalidURL)


def test_file_colon_slash_names_the_absolute_path(place: Place, tmp_path: Path) -> None:
    """``file:/abs/path`` (RFC 8089's short form) used to create ``./file:/abs/path``."""
    target = tmp_path / "elsewhere" / "log"
    for backend in ("segments", "objects"):
        with disklesslog.open(f"file:{target}-{backend}", backend=backend) as log:
            log.stream("s").append(b"x")
        assert (target.parent / f"log-{backend}" / "disklesslog.json").exists()
    assert os.listdir(place.root) == []  # nothing under the working directory


@pytest.mark.parametrize("url", ["file:relative/log", "file:log", "s3:bucket/log", "memory:x"])
def test_a_url_without_its_slashes_is_refused_not_made_a_directory(place: Place, url: str) -> None:
    _refused(place, lambda: disklesslog.open(url), InvalidURL)


@pytest.mark.parametrize("create", ["no", "yes", 0, 1, None, [True]])
def test_create_must_be_a_bool(place: Place, create: Any) -> None:
    for options in ({}, {"backend": "objects"}):
        _refused(
            place,
            lambda o=options: disklesslog.open(place.root / "log", create=create, **o),
            ConfigError,
        )


def test_writer_producer_must_be_a_name(place: Place) -> None:
    with disklesslog.open(f"memory://bad-{uuid.uuid4().hex}/log") as log:
        for producer in (5, b"name", "", ["p"]):
            _refused(place, lambda p=producer: log.writer(producer=p), ConfigError)


@pytest.mark.parametrize("grace", [1e308, float("inf"), float("nan"), 2**2000, -1, "5", True])
def test_collect_garbage_refuses_a_grace_it_cannot_compute_with(place: Place, grace: Any) -> None:
    for log in (
        disklesslog.open(place.root / "seg", fsync="never"),
        disklesslog.open(f"file://{place.root}/objects", backend="objects"),
    ):
        with log:
            _refused(place, lambda lg=log: lg.collect_garbage(grace_seconds=grace), ConfigError)
            _refused(place, lambda lg=log: lg.maintain(grace_seconds=grace), ConfigError)


def test_offsets_and_timestamps_beyond_64_bits_are_refused_before_any_backend(
    place: Place,
) -> None:
    """``offset_for_time(2**63)`` and ``commit_offsets(..., 2**63)`` overflowed SQLite;
    ``trim(2**64)`` and ``commit_offsets(..., 2**64)`` the object-store sequencer."""
    for log in (
        disklesslog.open(place.root / "seg", fsync="never"),
        disklesslog.open(f"file://{place.root}/objects", backend="objects"),
        disklesslog.open(
            f"file://{place.root}/objectstore", backend="objects", sequencer="objectstore://"
        ),
        disklesslog.open(f"memory://bad-{uuid.uuid4().hex}/log"),
    ):
        with log:
            _beyond_64_bits_is_refused(place, log)


def _beyond_64_bits_is_refused(place: Place, log: disklesslog.Log) -> None:
    stream = log.stream("s")
    stream.append(b"x")
    for timestamp in (2**63, 2**64, -1):
        _refused(place, lambda t=timestamp: stream.offset_for_time(t), ConfigError)
    for offset in (2**63, 2**64):
        _refused(place, lambda o=offset: stream.trim(o), OffsetOutOfRange)
        _refused(place, lambda o=offset: log.commit_offsets("g", {"s": o}), OffsetOutOfRange)
        _refused(place, lambda o=offset: list(stream.read(o)), OffsetOutOfRange)
    assert stream.offset_for_time(2**63 - 1) is None
    log.commit_offsets("g", {"s": MAX_OFFSET})  # the largest offset is an offset
    assert log.committed_offsets("g") == {"s": MAX_OFFSET}


# ============================================================ the table, every backend


@dataclass
class Opened:
    """A seeded log of one backend: stream ``s`` (three keyed records), compacted
    stream ``c``, group ``g`` at offset 1 of ``s``."""

    backend: str
    log: disklesslog.Log
    where: Path | None  # the local directory holding the log's files, if any
    memory_root: str | None

    @property
    def objects(self) -> bool:
        return self.backend != "segments"

    def snapshot(self) -> Any:
        log = self.log
        streams = log.streams()
        contents = {
            name: (
                log.stream(name).start_offset,
                [(r.offset, r.key, r.value) for r in log.stream(name).read()],
            )
            for name in streams
        }
        files = _tree(self.where) if self.where is not None else {}
        memory = {}
        if self.memory_root is not None:
            memory = {p: s for p, s in _memory_files().items() if p.startswith(self.memory_root)}
        return streams, contents, log.committed_offsets("g"), files, memory


LOG_BACKENDS = ["segments", "memory", "file-objects", "file-objectstore"]


def _seeded(backend: str, directory: Path) -> Opened:
    memory_root = None
    if backend == "segments":
        log = disklesslog.open(directory / "log", fsync="never")
    elif backend == "memory":
        memory_root = f"/bad-{uuid.uuid4().hex}"
        log = disklesslog.open(f"memory://{memory_root}/log")
    elif backend == "file-objects":
        log = disklesslog.open(f"file://{directory}/log", backend="objects")
    else:
        log = disklesslog.open(
            f"file://{directory}/log", backend="objects", sequencer="objectstore://"
        )
    log.stream("s").append_batch([b"a", b"b", b"c"], keys=[b"1", b"2", b"3"], timestamps=100)
    log.create_stream("c", cleanup_policy="compact").append(b"v", key=b"k")
    log.commit_offsets("g", {"s": 1})
    return Opened(backend, log, directory, memory_root)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Opened]]:
    """One seeded log per backend for the whole table, opened on first use (each case
    checks it is unchanged afterwards, so they can share it)."""
    logs: dict[str, Opened] = {}

    def get(backend: str) -> Opened:
        if backend not in logs:
            logs[backend] = _seeded(backend, tmp_path_factory.mktemp(f"bad-{backend}"))
        return logs[backend]

    yield get
    for opened in logs.values():
        opened.log.close()
        if opened.memory_root is not None:
            fsspec.filesystem("memory").rm(opened.memory_root, recursive=True)


@dataclass(frozen=True)
class Case:
    """One bad call on a seeded log; ``error`` is what it must raise (a
    DisklessLogError subclass); ``objects_only`` for options only object logs have.
    ``uses`` names a tool the call is made on (``writer``, ``stager``, ``consumer``),
    made before the log is looked at: making it is not the refused call."""

    name: str
    call: Callable[[Opened, Any], Any]
    error: type[DisklessLogError] = DisklessLogError
    objects_only: bool = False
    uses: str | None = None


NOT_NAMES: list[Any] = [None, 5, 1.5, b"s", ["s"], {"s": 1}, object()]
BAD_NAMES = ["", ".", "..", "a/b", "../s", "x" * 250, "a\x00b", "é", "a b", "s\n"]
NAMES = [*NOT_NAMES, *BAD_NAMES]
BAD_OFFSETS: list[Any] = [-1, 2**63, 2**64, -(2**70), 1.0, "1", True, [1], b"1"]
BAD_TIMESTAMPS: list[Any] = [-1, 2**63, 2**64, 1.5, "100", True, None, [100]]
BAD_VALUE_COLUMNS: list[Any] = [
    None,
    5,
    1.5,
    b"ab",
    "ab",
    bytearray(b"ab"),
    {b"a": b"b"},
    {b"a"},
    frozenset({b"a"}),
    [],
    [1],
    ["text"],
    [b"x", 2],
    [[b"x"]],
    [memoryview(b"x")],
]
BAD_KEY_COLUMNS: list[Any] = [
    5,
    b"k",
    "k",
    {b"k": b"v"},
    {b"k"},
    [1],
    ["k"],
    [b"k", b"k2"],  # one key too many
    [],
]
BAD_HEADER_COLUMNS: list[Any] = [
    5,
    "h",
    {"h": b"x"},
    [5],
    [{"h": "text"}],
    [{1: b"x"}],
    [[("h",)]],
    [[("h", b"x", b"y")]],
    [{"h": 5}],
    [None, None],  # one entry too many
]
BAD_TIMESTAMP_COLUMNS: list[Any] = [
    1.5,
    "100",
    [100, 200],  # one too many
    [-1],
    [2**63],
    [1.5],
    True,
    {100},
    b"1",
]
BAD_SINGLE_VALUES: list[Any] = [5, 1.5, "text", [b"x"], {"v": b"x"}, object()]
BAD_SINGLE_KEYS: list[Any] = [5, "text", [b"k"], {b"k"}]
BAD_SINGLE_HEADERS: list[Any] = [5, "h", {"h": "text"}, {1: b"x"}, [("h",)], [5], {"h": 5}]
BAD_MAX_RECORDS: list[Any] = [-1, 1.5, "5", True]
BAD_SECONDS: list[Any] = [0, -1, float("nan"), float("inf"), "1", True, 2**2000]
BAD_CONFIGS: list[dict[str, Any]] = [
    {"compression": "lz4"},
    {"compression": 5},
    {"max_record_bytes": 0},
    {"max_record_bytes": "big"},
    {"max_record_bytes": 2**64},
    {"max_batch_bytes": 10},
    {"max_batch_bytes": 2**40},
    {"segment_bytes": -5},
    {"segment_bytes": 1.5},
    {"index_interval_bytes": 1},
    {"retention_ms": "forever"},
    {"retention_ms": -5},
    {"retention_bytes": 1.5},
    {"cleanup_policy": "nope"},
    {"cleanup_policy": 5},
    {"min_cleanable_dirty_ratio": 2},
    {"delete_retention_ms": -2},
    {"no_such_option": 1},
]


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(
        name: str, call: Callable[[Opened, Any], Any], error: Any = DisklessLogError, **kw: Any
    ) -> None:
        cases.append(Case(name, call, error, **kw))

    # Names of streams and groups, wherever one is taken.
    for i, name in enumerate(NAMES):
        add(f"stream-name-{i}", lambda o, t, n=name: o.log.stream(n), InvalidStreamName)
        add(f"create-name-{i}", lambda o, t, n=name: o.log.create_stream(n), InvalidStreamName)
        add(f"delete-name-{i}", lambda o, t, n=name: o.log.delete_stream(n), InvalidStreamName)
        add(f"alter-name-{i}", lambda o, t, n=name: o.log.alter_stream(n, retention_ms=1))
        add(f"groups-name-{i}", lambda o, t, n=name: o.log.committed_offsets(n), InvalidStreamName)
        add(
            f"commit-group-{i}",
            lambda o, t, n=name: o.log.commit_offsets(n, {"s": 1}),
            InvalidStreamName,
        )
        add(f"writer-stream-{i}", lambda o, t, n=name: t.append(n, b"x"), uses="writer")
        add(
            f"writer-batch-stream-{i}",
            lambda o, t, n=name: t.append_batch(n, [b"x"]),
            uses="writer",
        )
        add(f"stager-stream-{i}", lambda o, t, n=name: t.append_batch(n, [b"x"]), uses="stager")
        add(f"consumer-group-{i}", lambda o, t, n=name: o.log.consumer(n, ["s"]))
        add(f"consumer-stream-{i}", lambda o, t, n=name: o.log.consumer("g", [n]))
        if name is not None:  # None: every stream
            add(f"retention-stream-{i}", lambda o, t, n=name: o.log.apply_retention(n))
            add(f"compact-stream-{i}", lambda o, t, n=name: o.log.compact(n))
            add(f"merge-stream-{i}", lambda o, t, n=name: o.log.merge(n))
            add(f"tier-stream-{i}", lambda o, t, n=name: o.log.tier(n))
            add(f"maintain-stream-{i}", lambda o, t, n=name: o.log.maintain(n))
        try:
            offsets = {name: 1}
        except TypeError:
            continue  # not even a dict key
        add(f"commit-stream-{i}", lambda o, t, x=offsets: o.log.commit_offsets("g", x))

    # Stream settings.
    for config in BAD_CONFIGS:
        key = "-".join(f"{k}={v!r}" for k, v in config.items())
        add(
            f"create-config-{key}",
            lambda o, t, c=config: o.log.create_stream("n", **c),
            ConfigError,
        )
    for changes in [
        {"compression": "zstd"},  # fixed at creation
        {"max_record_bytes": 10},
        {"retention_ms": "x"},
        {"retention_bytes": -7},
        {"min_cleanable_dirty_ratio": -1},
        {"no_such_option": 1},
    ]:
        key = "-".join(f"{k}={v!r}" for k, v in changes.items())
        add(f"alter-{key}", lambda o, t, c=changes: o.log.alter_stream("s", **c), ConfigError)
    add(
        "alter-missing-stream",
        lambda o, t: o.log.alter_stream("missing", retention_ms=1),
        StreamNotFound,
    )
    add("delete-missing-stream", lambda o, t: o.log.delete_stream("missing"), StreamNotFound)
    add(
        "commit-missing-stream",
        lambda o, t: o.log.commit_offsets("g", {"missing": 1}),
        StreamNotFound,
    )
    add("create-existing-other-config", lambda o, t: o.log.create_stream("s", compression="zstd"))

    # Appends: columns of append_batch (stream, writer, stager), single records.
    for i, values in enumerate(BAD_VALUE_COLUMNS):
        add(f"append-batch-values-{i}", lambda o, t, v=values: o.log.stream("s").append_batch(v))
        add(
            f"writer-batch-values-{i}",
            lambda o, t, v=values: t.append_batch("s", v),
            uses="writer",
        )
        if values != []:  # a stager takes [] as "nothing to stage" (an empty partition)
            add(
                f"stager-values-{i}",
                lambda o, t, v=values: t.append_batch("s", v),
                uses="stager",
            )
        add(
            f"new-stream-values-{i}",
            lambda o, t, v=values, n=f"fresh-{i}": o.log.stream(n).append_batch(v),
        )
    for i, keys in enumerate(BAD_KEY_COLUMNS):
        add(
            f"append-batch-keys-{i}",
            lambda o, t, k=keys: o.log.stream("s").append_batch([b"x"], keys=k),
        )
        add(
            f"writer-batch-keys-{i}",
            lambda o, t, k=keys: t.append_batch("s", [b"x"], keys=k),
            uses="writer",
        )
        add(
            f"stager-keys-{i}",
            lambda o, t, k=keys: t.append_batch("s", [b"x"], keys=k),
            uses="stager",
        )
    for i, headers in enumerate(BAD_HEADER_COLUMNS):
        add(
            f"append-batch-headers-{i}",
            lambda o, t, h=headers: o.log.stream("s").append_batch([b"x"], headers=h),
        )
        add(
            f"writer-batch-headers-{i}",
            lambda o, t, h=headers: t.append_batch("s", [b"x"], headers=h),
            uses="writer",
        )
        add(
            f"stager-headers-{i}",
            lambda o, t, h=headers: t.append_batch("s", [b"x"], headers=h),
            uses="stager",
        )
    for i, timestamps in enumerate(BAD_TIMESTAMP_COLUMNS):
        add(
            f"append-batch-timestamps-{i}",
            lambda o, t, x=timestamps: o.log.stream("s").append_batch([b"x"], timestamps=x),
        )
        add(
            f"writer-batch-timestamps-{i}",
            lambda o, t, x=timestamps: t.append_batch("s", [b"x"], timestamps=x),
            uses="writer",
        )
        add(
            f"stager-timestamps-{i}",
            lambda o, t, x=timestamps: t.append_batch("s", [b"x"], timestamps=x),
            uses="stager",
        )
    for i, value in enumerate(BAD_SINGLE_VALUES):
        add(
            f"append-value-{i}",
            lambda o, t, v=value: o.log.stream("s").append(v),
            InvalidRecordError,
        )
        add(
            f"writer-value-{i}",
            lambda o, t, v=value: t.append("s", v),
            InvalidRecordError,
            uses="writer",
        )
    for i, key in enumerate(BAD_SINGLE_KEYS):
        add(
            f"append-key-{i}",
            lambda o, t, k=key: o.log.stream("s").append(b"x", key=k),
            InvalidRecordError,
        )
        add(
            f"writer-key-{i}",
            lambda o, t, k=key: t.append("s", b"x", key=k),
            InvalidRecordError,
            uses="writer",
        )
    for i, headers in enumerate(BAD_SINGLE_HEADERS):
        add(
            f"append-headers-{i}",
            lambda o, t, h=headers: o.log.stream("s").append(b"x", headers=h),
            InvalidRecordError,
        )
        add(
            f"writer-headers-{i}",
            lambda o, t, h=headers: t.append("s", b"x", headers=h),
            InvalidRecordError,
            uses="writer",
        )
    for i, timestamp in enumerate(BAD_TIMESTAMPS):
        if timestamp is None:
            continue  # None is "now"
        add(
            f"append-timestamp-{i}",
            lambda o, t, x=timestamp: o.log.stream("s").append(b"x", timestamp=x),
            InvalidRecordError,
        )
        add(
            f"writer-timestamp-{i}",
            lambda o, t, x=timestamp: t.append("s", b"x", timestamp=x),
            InvalidRecordError,
            uses="writer",
        )
    add("compacted-no-key", lambda o, t: o.log.stream("c").append(b"x"), InvalidRecordError)
    add(
        "compacted-batch-no-keys",
        lambda o, t: o.log.stream("c").append_batch([b"x"]),
        InvalidRecordError,
    )
    add(
        "compacted-batch-a-missing-key",
        lambda o, t: o.log.stream("c").append_batch([b"x", b"y"], keys=[b"k", None]),
        InvalidRecordError,
    )
    add("record-too-large", lambda o, t: o.log.stream("s").append(b"x" * ((1 << 20) + 1)))

    # Reads, time lookups, trims, committed offsets.
    for i, offset in enumerate(BAD_OFFSETS):
        add(f"read-start-{i}", lambda o, t, x=offset: o.log.stream("s").read(x))
        add(f"read-end-{i}", lambda o, t, x=offset: o.log.stream("s").read(0, x))
        add(f"read-batches-start-{i}", lambda o, t, x=offset: o.log.stream("s").read_batches(x))
        add(f"read-offsets-end-{i}", lambda o, t, x=offset: o.log.stream("s").read_offsets(0, x))
        add(f"follow-start-{i}", lambda o, t, x=offset: o.log.stream("s").follow(x))
        add(f"trim-{i}", lambda o, t, x=offset: o.log.stream("s").trim(x))
        add(f"commit-offset-{i}", lambda o, t, x=offset: o.log.commit_offsets("g", {"s": x}))
        add(f"seek-{i}", lambda o, t, x=offset: t.seek("s", x), uses="consumer")
    for i, timestamp in enumerate(BAD_TIMESTAMPS):
        add(
            f"offset-for-time-{i}",
            lambda o, t, x=timestamp: o.log.stream("s").offset_for_time(x),
            ConfigError,
        )
    for i, value in enumerate(BAD_MAX_RECORDS):
        add(
            f"read-max-records-{i}",
            lambda o, t, v=value: o.log.stream("s").read(max_records=v),
            ConfigError,
        )
    for i, seconds in enumerate(BAD_SECONDS):
        add(
            f"follow-poll-{i}",
            lambda o, t, x=seconds: o.log.stream("s").follow(poll_interval=x),
            ConfigError,
        )
        add(
            f"consumer-poll-interval-{i}",
            lambda o, t, x=seconds: o.log.consumer("g", ["s"], poll_interval=x),
            ConfigError,
        )
        if seconds not in (0, float("inf")):  # timeouts: 0 returns at once, inf waits
            add(
                f"follow-idle-{i}",
                lambda o, t, x=seconds: o.log.stream("s").follow(idle_timeout=x),
                ConfigError,
            )
            add(
                f"consumer-poll-timeout-{i}",
                lambda o, t, x=seconds: t.poll(timeout=x),
                ConfigError,
                uses="consumer",
            )
    add("trim-past-end", lambda o, t: o.log.stream("s").trim(4), OffsetOutOfRange)
    add("read-past-end", lambda o, t: o.log.stream("s").read(4), OffsetOutOfRange)
    add("trim-missing", lambda o, t: o.log.stream("missing").trim(0), StreamNotFound)
    add("read-missing", lambda o, t: list(o.log.stream("missing").read()), StreamNotFound)
    add("offsets-not-a-mapping", lambda o, t: o.log.commit_offsets("g", [("s", 1)]), ConfigError)
    add("offsets-a-str", lambda o, t: o.log.commit_offsets("g", "s"), ConfigError)

    # Consumers.
    for streams in ("s", b"s", [], None, 5):
        add(f"consumer-streams-{streams!r}", lambda o, t, s=streams: o.log.consumer("g", s))
    for reset in ("newest", None, 5, ["earliest"]):
        add(
            f"consumer-reset-{reset!r}",
            lambda o, t, r=reset: o.log.consumer("g", ["s"], reset=r),
            ConfigError,
        )
    for interval in (-1, "5", float("nan"), 2**2000):
        add(
            f"consumer-auto-commit-{interval!r}",
            lambda o, t, i=interval: o.log.consumer("g", ["s"], auto_commit_interval_ms=i),
            ConfigError,
        )
    for value in (0, -1, 1.5, "10", True):
        add(
            f"consumer-max-records-{value!r}",
            lambda o, t, v=value: t.poll(max_records=v),
            ConfigError,
            uses="consumer",
        )
    add("consumer-seek-other-stream", lambda o, t: t.seek("c", 0), ConfigError, uses="consumer")
    add("consumer-seek-past-end", lambda o, t: t.seek("s", 4), OffsetOutOfRange, uses="consumer")

    # Writers.
    for value in (-1, 3_600_001, "5", float("nan"), [1], True):
        add(
            f"writer-linger-{value!r}", lambda o, t, v=value: o.log.writer(linger_ms=v), ConfigError
        )
    for value in (0, 1023, 2**41, 1.5, "big", True):
        add(
            f"writer-buffer-{value!r}",
            lambda o, t, v=value: o.log.writer(max_buffer_bytes=v),
            ConfigError,
        )
    for value in (5, b"p", "", ["p"], True):
        add(
            f"writer-producer-{value!r}",
            lambda o, t, v=value: o.log.writer(producer=v),
            ConfigError,
            objects_only=True,
        )
    for value in (0, 6, 1.5, "2", True):
        add(
            f"writer-inflight-{value!r}",
            lambda o, t, v=value: o.log.writer(max_inflight=v),
            ConfigError,
            objects_only=True,
        )
    for value in (0, 1.5, "big"):
        add(
            f"writer-object-bytes-{value!r}",
            lambda o, t, v=value: o.log.writer(max_object_bytes=v),
            ConfigError,
            objects_only=True,
        )
    add(
        "writer-both-sizes",
        lambda o, t: o.log.writer(max_object_bytes=1 << 20, max_buffer_bytes=1 << 20),
        ConfigError,
        objects_only=True,
    )

    # Maintenance.
    for i, now in enumerate([-1, 1.5, "now", 2**64, True]):
        add(f"retention-now-{i}", lambda o, t, n=now: o.log.apply_retention(now_ms=n), ConfigError)
        add(f"compact-now-{i}", lambda o, t, n=now: o.log.compact(now_ms=n), ConfigError)
        add(f"maintain-now-{i}", lambda o, t, n=now: o.log.maintain(now_ms=n), ConfigError)
        add(f"merge-now-{i}", lambda o, t, n=now: o.log.merge(now_ms=n), ConfigError)
        add(f"tier-now-{i}", lambda o, t, n=now: o.log.tier(now_ms=n), ConfigError)
    for i, target in enumerate([0, -1, 1.5, "big", 2**70, True]):
        add(
            f"merge-target-{i}",
            lambda o, t, x=target: o.log.merge(target_bytes=x),
            ConfigError,
            objects_only=True,
        )
    for i, grace in enumerate([-1, 1e308, float("inf"), float("nan"), 2**2000, "300", True]):
        add(
            f"gc-grace-{i}",
            lambda o, t, g=grace: o.log.collect_garbage(grace_seconds=g),
            ConfigError,
        )
        add(
            f"maintain-grace-{i}",
            lambda o, t, g=grace: o.log.maintain(grace_seconds=g),
            ConfigError,
        )
    add("compact-not-compacted", lambda o, t: o.log.compact("s"), ConfigError)
    add("compact-missing", lambda o, t: o.log.compact("missing"), StreamNotFound)

    # Two-phase commits.
    for i, value in enumerate([0, -1, 1.5, "big", True]):
        add(f"stager-size-{i}", lambda o, t, v=value: o.log.stager(max_object_bytes=v), ConfigError)
    for i, txn in enumerate([None, 5, "", "x" * 1025, "a\x00b", b"id"]):
        add(f"txn-id-{i}", lambda o, t, x=txn: o.log.commit_transaction(x, []))
    for i, parts in enumerate([None, 5, "parts", [5], [None], [("url", ())]]):
        add(f"txn-parts-{i}", lambda o, t, p=parts: o.log.commit_transaction("t", p))
        add(f"abort-parts-{i}", lambda o, t, p=parts: o.log.abort_transaction(p))
    add(
        "txn-foreign-part",
        lambda o, t: o.log.commit_transaction("t", [StagedPart("file:///elsewhere", ())]),
        TransactionError,
    )
    return cases


CASES = _cases()


@contextlib.contextmanager
def _tool(o: Opened, kind: str | None) -> Iterator[Any]:
    """The writer, stager or consumer a case uses (closed after it, nothing flushed)."""
    if kind is None:
        yield None
    elif kind == "writer":
        with o.log.writer() as writer:
            yield writer
    elif kind == "stager":
        stager = o.log.stager()
        try:
            yield stager
        finally:
            stager.abort()
    else:
        with o.log.consumer("g", ["s"], auto_commit_interval_ms=None) as consumer:
            yield consumer


def _params() -> Iterator[Any]:
    for backend in LOG_BACKENDS:
        for case in CASES:
            if case.objects_only and backend == "segments":
                continue
            yield pytest.param(backend, case, id=f"{backend}-{case.name}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    """An empty working directory for the whole table (a fresh one per case would cost
    more than most cases): each case checks it is still empty afterwards."""
    root = tmp_path_factory.mktemp("workdir")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        yield Place(root)


@pytest.mark.parametrize(("backend", "case"), list(_params()))
def test_bad_input_is_refused_and_leaves_nothing(
    seeded: Callable[[str], Opened], backend: str, case: Case, workdir: Place
) -> None:
    opened = seeded(backend)
    with _tool(opened, case.uses) as tool:
        before = opened.snapshot()
        cwd_before = workdir.snapshot()
        with pytest.raises(DisklessLogError) as info:
            result = case.call(opened, tool)
            if isinstance(result, Iterator):
                next(result, None)  # a refused read must raise at the call, not here
                pytest.fail(f"{case.name}: accepted (returned an iterator)")
            close = getattr(result, "close", None)
            if callable(close):
                close()
        assert isinstance(info.value, case.error), repr(info.value)
        assert opened.snapshot() == before, f"{case.name} changed the log"
        assert _changes(cwd_before, workdir.snapshot()) == [], f"{case.name} left something"


# ============================================================ open(): every option


def _foreign(root: Path) -> str:
    (root / "photos").mkdir(exist_ok=True)
    (root / "photos" / "cat.jpg").write_bytes(b"meow")
    return str(root / "photos")


def _a_file(root: Path) -> str:
    (root / "notes.txt").write_bytes(b"not a log")
    return str(root / "notes.txt")


def _segments_log(root: Path) -> str:
    disklesslog.open(root / "seglog", fsync="never").close()
    return str(root / "seglog")


def _objects_log(root: Path) -> str:
    disklesslog.open(f"file://{root}/objlog", backend="objects").close()
    return str(root / "objlog")


OPEN_URLS: list[tuple[str, Any, type[DisklessLogError]]] = [
    ("none", None, InvalidURL),
    ("int", 5, InvalidURL),
    ("bytes", b"/tmp/log", InvalidURL),
    ("empty", "", InvalidURL),
    ("blank", "   ", InvalidURL),
    ("nul", "{root}/a\x00b", InvalidURL),
    ("file-host", "file://otherhost/{root}/log", InvalidURL),
    ("file-query", "file://{root}/log?x=1", InvalidURL),
    ("file-fragment", "file://{root}/log#x", InvalidURL),
    ("file-no-path", "file://", InvalidURL),
    ("file-relative", "file:log", InvalidURL),
    ("s3-without-slashes", "s3:bucket/log", InvalidURL),
    ("unknown-scheme", "nope://bucket/log", InvalidURL),
    ("unknown-backend", ("{root}/log", {"backend": "nope"}), InvalidURL),
    ("backend-int", ("{root}/log", {"backend": 5}), InvalidURL),
    ("backend-list", ("{root}/log", {"backend": ["segments"]}), InvalidURL),
    ("segments-on-memory", ("memory://x/log", {"backend": "segments"}), InvalidURL),
]
"""Bad URLs: ``(name, url or (url, options), error)``, ``{root}`` the test's place."""

BAD_OPTIONS: list[tuple[str, dict[str, Any], type[DisklessLogError]]] = [
    ("create-str", {"create": "no"}, ConfigError),
    ("create-int", {"create": 0}, ConfigError),
    ("create-none", {"create": None}, ConfigError),
    ("unknown-option", {"no_such_option": 1}, ConfigError),
    ("misspelt-sequencer", {"sequncer": "x"}, ConfigError),
    *[
        (f"stream-default-{'-'.join(map(str, c))}", c, ConfigError)
        for c in BAD_CONFIGS
        if "no_such_option" not in c
    ],
]
"""Options every backend refuses."""

SEGMENTS_OPTIONS: list[tuple[str, dict[str, Any], type[DisklessLogError]]] = [
    ("fsync-unknown", {"fsync": "sometimes"}, ConfigError),
    ("fsync-int", {"fsync": 5}, ConfigError),
    ("fsync-interval-zero", {"fsync_interval_ms": 0}, ConfigError),
    ("fsync-interval-float", {"fsync_interval_ms": 1.5}, ConfigError),
    ("fsync-interval-str", {"fsync_interval_ms": "1000"}, ConfigError),
    ("fsync-interval-huge", {"fsync_interval_ms": 3_600_001}, ConfigError),
    ("fsync-interval-bool", {"fsync_interval_ms": True}, ConfigError),
    ("max-open-streams-zero", {"max_open_streams": 0}, ConfigError),
    ("max-open-streams-str", {"max_open_streams": "64"}, ConfigError),
    ("cleaner-max-keys-zero", {"cleaner_max_keys": 0}, ConfigError),
    ("cleaner-max-keys-str", {"cleaner_max_keys": "many"}, ConfigError),
    ("tier-url-int", {"tier_url": 5}, InvalidURL),
    ("tier-url-empty", {"tier_url": ""}, InvalidURL),
    ("tier-url-path", {"tier_url": "relative/dir"}, InvalidURL),
    ("tier-url-unknown", {"tier_url": "nope://bucket/x"}, InvalidURL),
    ("tier-url-inside", {"tier_url": "file://{root}/log/tier"}, InvalidURL),
    (
        "tier-options-str",
        {"tier_url": "memory://tier-x", "tier_storage_options": "k=v"},
        ConfigError,
    ),
    ("tier-options-int", {"tier_url": "memory://tier-x", "tier_storage_options": 5}, ConfigError),
    ("tier-options-alone", {"tier_storage_options": {"anon": True}}, ConfigError),
    ("sequencer-on-segments", {"sequencer": "memory://x"}, ConfigError),
    ("storage-options-on-segments", {"storage_options": {}}, ConfigError),
    ("cache-on-segments", {"cache": None}, ConfigError),
]
"""Options of local logs, and object-log options given to one."""

OBJECTS_OPTIONS: list[tuple[str, dict[str, Any], type[DisklessLogError]]] = [
    ("storage-options-str", {"storage_options": "k=v"}, ConfigError),
    ("storage-options-int", {"storage_options": 5}, ConfigError),
    ("storage-options-list", {"storage_options": [("k", "v")]}, ConfigError),
    ("sequencer-int", {"sequencer": 5}, ConfigError),
    ("sequencer-unknown", {"sequencer": "nope://x"}, InvalidURL),
    ("sequencer-objectstore-unknown", {"sequencer": "objectstore+nope://x"}, InvalidURL),
    ("cache-int", {"cache": 5}, ConfigError),
    ("cache-str", {"cache": "big"}, ConfigError),
    ("cache-true", {"cache": True}, ConfigError),
    ("fsync-on-objects", {"fsync": "always"}, ConfigError),
    ("fsync-interval-on-objects", {"fsync_interval_ms": 10}, ConfigError),
    ("max-open-streams-on-objects", {"max_open_streams": 64}, ConfigError),
    ("tier-url-on-objects", {"tier_url": "memory://t"}, ConfigError),
    ("writer-option-on-objects", {"max_inflight": 2}, ConfigError),
]
"""Options of object logs, and local-log options given to one."""


def _open_params() -> Iterator[Any]:
    where = {
        "segments": ("{root}/log", {"fsync": "never"}),
        "file-objects": ("file://{root}/log", {"backend": "objects"}),
        "memory": ("memory://{memory}/log", {}),
    }
    for name, url, error in OPEN_URLS:
        yield pytest.param(url, {}, error, id=f"url-{name}")
    for backend, (url, base) in where.items():
        for name, options, error in BAD_OPTIONS:
            yield pytest.param((url, {**base, **options}), {}, error, id=f"{backend}-{name}")
        for name, options, error in OBJECTS_OPTIONS if backend != "segments" else SEGMENTS_OPTIONS:
            yield pytest.param((url, {**base, **options}), {}, error, id=f"{backend}-{name}")
        if backend != "memory":
            for name, make in [("foreign-dir", _foreign), ("a-file", _a_file)]:
                yield pytest.param(make, base, InvalidURL, id=f"{backend}-{name}")
            yield pytest.param(
                (url, {**base, "create": False}), {}, InvalidURL, id=f"{backend}-missing"
            )
    yield pytest.param(_segments_log, {"backend": "objects"}, InvalidURL, id="segments-as-objects")
    yield pytest.param(_objects_log, {"fsync": "never"}, InvalidURL, id="objects-as-segments")
    yield pytest.param(
        ("memory://{memory}/log", {"create": False}), {}, InvalidURL, id="memory-missing"
    )


@pytest.mark.parametrize(("url", "options", "error"), list(_open_params()))
def test_a_refused_open_leaves_nothing_behind(
    place: Place, url: Any, options: dict[str, Any], error: type[DisklessLogError]
) -> None:
    """Every option and URL of ``open`` is checked before anything is created: the place
    (also the working directory) and the memory filesystem look as before."""
    memory = f"open-{uuid.uuid4().hex}"
    if callable(url):  # a location prepared first (not part of the refused call)
        url = url(place.root)
    elif isinstance(url, tuple):
        url, options = url
    if isinstance(url, str):
        url = url.format(root=place.root, memory=memory)
    options = {
        key: value.format(root=place.root) if isinstance(value, str) else value
        for key, value in options.items()
    }
    _refused(place, lambda: disklesslog.open(url, **options), error)


# ============================================================ the command line


CLI_CASES: list[tuple[str, list[str]]] = [
    ("streams-missing-log", ["streams", "{root}/missing"]),
    ("describe-missing-log", ["describe", "{root}/missing"]),
    ("consume-missing-log", ["consume", "{root}/missing", "s"]),
    ("verify-missing-log", ["verify", "{root}/missing"]),
    ("compact-missing-log", ["compact", "{root}/missing"]),
    ("gc-missing-log", ["gc", "{root}/missing"]),
    ("produce-bad-stream", ["produce", "{root}/new", "a/b"]),
    ("produce-nul-stream", ["produce", "{root}/new", "a\x00b"]),
    ("produce-bad-url", ["produce", "file:relative", "s"]),
    ("produce-unknown-backend", ["produce", "{root}/new", "s", "--backend", "nope"]),
    ("produce-bad-batch-size", ["produce", "{root}/new", "s", "--batch-size", "0"]),
    ("produce-bad-option", ["produce", "{root}/new", "s", "--storage-option", "novalue"]),
    ("consume-bad-stream", ["consume", "{root}/log", "a/b"]),
    ("consume-bad-from", ["consume", "{root}/log", "s", "--from", "-x"]),
    ("consume-bad-from-time", ["consume", "{root}/log", "s", "--from-time", "soon"]),
    ("consume-bad-group", ["consume", "{root}/log", "s", "--group", "a/b"]),
    ("create-bad-setting", ["create", "{root}/new", "s", "--config", "retention_bytes=8KB"]),
    ("create-bad-value", ["create", "{root}/new", "s", "--config", "compression=lz9"]),
    ("create-bad-name", ["create", "{root}/new", "a/b"]),
    ("delete-missing-stream", ["delete", "{root}/log", "missing"]),
    ("trim-past-end", ["trim", "{root}/log", "s", "--before", "99"]),
    (
        "groups-reset-past-end",
        ["groups", "{root}/log", "reset", "g", "--to", "offset", "99", "--stream", "s"],
    ),
    ("groups-reset-no-streams", ["groups", "{root}/log", "reset", "g", "--to", "latest"]),
    ("groups-describe-unknown", ["groups", "{root}/log", "describe", "g"]),
    ("consume-huge-from", ["consume", "{root}/log", "s", "--from", str(2**64)]),
    ("consume-past-end", ["consume", "{root}/log", "s", "--from", "99"]),
    ("consume-bad-idle", ["consume", "{root}/log", "s", "--follow", "--idle-timeout", "-1"]),
    ("describe-missing-stream", ["describe", "{root}/log", "missing"]),
    ("alter-fixed-setting", ["alter", "{root}/log", "s", "compression=zstd"]),
    ("alter-bad-value", ["alter", "{root}/log", "s", "retention_ms=-5"]),
    ("alter-not-json", ["alter", "{root}/log", "s", "retention_ms=soon"]),
    ("gc-huge-grace", ["gc", "{root}/log", "--grace", "1e308"]),
    ("gc-nan-grace", ["gc", "{root}/log", "--grace", "nan"]),
    ("compact-not-compacted", ["compact", "{root}/log", "--stream", "s"]),
    ("unknown-command", ["explode", "{root}/log"]),
]
"""``(name, argv)`` of commands that must fail: exit code 1 for a refusal (one line on
stderr) or 2 for a usage error (argparse), never a traceback."""


@pytest.mark.parametrize("argv", [pytest.param(a, id=n) for n, a in CLI_CASES])
def test_the_command_line_refuses_bad_arguments_and_leaves_nothing(
    place: Place,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with disklesslog.open(place.root / "log", fsync="never") as log:
        log.stream("s").append(b"x")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"line\n")))
    before = place.snapshot()
    assert main([arg.format(root=place.root) for arg in argv]) in (1, 2)
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert error.startswith(("disklesslog: error:", "usage:"))
    assert _changes(before, place.snapshot()) == []
