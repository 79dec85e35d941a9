"""Mechanics of the local backend: segment rolls, indexes, leftovers of interrupted
operations, fsync policies, the log directory's rules, and failed writes."""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

import disklesslog
from disklesslog import InvalidURL, Record, StorageError
from disklesslog.checksummed import decode_json
from disklesslog.segments import stream_store as store_module
from disklesslog.segments.layout import MARKER, STATE, StreamState, segment_name


def _stream_dir(root: Path, name: str = "s") -> Path:
    return root / "streams" / name


def _logs(root: Path, name: str = "s") -> list[Path]:
    return sorted(_stream_dir(root, name).glob("*.log"))


def _state(root: Path, name: str = "s") -> StreamState:
    state = StreamState.decode((_stream_dir(root, name) / STATE).read_bytes())
    assert state is not None
    return state


# ------------------------------------------------------------------------- segments


def test_segments_roll_by_size_and_are_named_by_base_offset(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024, index_interval_bytes=64)
        for i in range(300):
            stream.append(b"value-%03d" % i, timestamp=1_000 + i)
        files = _logs(tmp_path)
        assert len(files) > 5
        bases = [int(f.name[:20]) for f in files]
        assert files[0].name == segment_name(0, ".log") == "00000000000000000000.log"
        assert bases == sorted(bases)
        for path in files[:-1]:  # closed segments never exceed segment_bytes
            assert path.stat().st_size <= 1024
            assert path.with_suffix(".index").exists()
            assert path.with_suffix(".timeindex").stat().st_size >= 12
        expected = [Record(i, 1_000 + i, None, b"value-%03d" % i, ()) for i in range(300)]
        assert list(stream.read()) == expected
        for offset in range(0, 300, 7):  # every start goes through the index lookups
            assert list(stream.read(offset, offset + 3)) == expected[offset : offset + 3]
        for i in range(0, 300, 11):
            assert stream.offset_for_time(1_000 + i) == i
    with disklesslog.open(tmp_path, fsync="never") as log:  # and again after reopening
        assert list(log.stream("s").read()) == expected
        assert log.stream("s").offset_for_time(1_150) == 150


def test_segment_rolls_by_record_time_like_kafka(tmp_path: Path) -> None:
    """segment_ms compares the new records' timestamps with the segment's first batch,
    so back-filled old timestamps do not roll a segment per append."""
    hour = 3_600_000
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_ms=hour)
        stream.append(b"a", timestamp=0)
        stream.append(b"b", timestamp=hour)  # exactly segment_ms later: same segment
        assert len(_logs(tmp_path)) == 1
        stream.append(b"c", timestamp=hour + 1)
        assert len(_logs(tmp_path)) == 2
        for old in range(5):
            stream.append(b"old", timestamp=old)
        assert len(_logs(tmp_path)) == 2
        assert [r.value for r in stream.read()] == [b"a", b"b", b"c"] + [b"old"] * 5


def test_a_batch_larger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024)
        stream.append(b"small")
        stream.append_batch([b"x" * 100] * 50)
        stream.append(b"after")
        assert [f.stat().st_size > 1024 for f in _logs(tmp_path)] == [False, True, False]
        assert [r.value for r in stream.read()] == [b"small"] + [b"x" * 100] * 50 + [b"after"]


def test_writer_groups_larger_than_a_segment_still_land(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.create_stream("s", segment_bytes=4096, max_batch_bytes=2048, max_record_bytes=1000)
        with log.writer(linger_ms=60_000) as writer:
            futures = [writer.append("s", b"%04d" % i + b"." * 500) for i in range(100)]
        assert [f.result() for f in futures] == list(range(100))
        assert [r.value[:4] for r in log.stream("s").read()] == [b"%04d" % i for i in range(100)]


def test_trim_deletes_closed_segments_only(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024)
        stream.append_batch([b"v"] * 10)
        for _ in range(40):
            stream.append(b"y" * 50)
        before = _logs(tmp_path)
        second_base = int(before[1].name[:20])
        stream.trim(second_base + 1)  # inside the second segment: the first goes
        assert _logs(tmp_path) == before[1:]
        assert stream.start_offset == second_base + 1
        stream.trim(stream.end_offset)  # everything: the active segment is rolled away
        assert len(_logs(tmp_path)) == 1
        assert list(stream.read()) == []
        assert stream.append(b"z") == 50


@pytest.mark.parametrize("edge", ["first", "last"])
def test_a_trim_at_a_segment_edge_deletes_exactly_the_segments_below(
    tmp_path: Path, edge: str
) -> None:
    """Trimming to the first or the last offset of each segment in turn keeps the segment
    that holds the new start and deletes every file of those before it, also on
    reopening (whose recovery removes what a crashed trim left). The conformance suite
    checks what reads see; this checks the files: nothing trimmed lingers."""
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024)
        for i in range(6):  # one batch per segment: a second would not fit
            stream.append_batch([b"%d" % (5 * i + j) + b"." * 150 for j in range(5)])
        bases = [int(path.name[:20]) for path in _logs(tmp_path)]
        assert bases == [0, 5, 10, 15, 20, 25]
    for i, base in enumerate(bases):
        before = base if edge == "first" else base + 4
        with disklesslog.open(tmp_path, fsync="never") as log:
            log.stream("s").trim(before)
            assert [int(path.name[:20]) for path in _logs(tmp_path)] == bases[i:]
        names = [path.name for path in _stream_dir(tmp_path).iterdir()]
        below = [name for name in names if name[:20].isdigit() and int(name[:20]) < base]
        assert below == [], f"files of trimmed segments left: {below}"
        with disklesslog.open(tmp_path, fsync="never") as log:
            assert [int(path.name[:20]) for path in _logs(tmp_path)] == bases[i:]
            assert next(iter(log.stream("s").read())).offset == before


def test_missing_or_damaged_closed_indexes_are_rebuilt(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024, index_interval_bytes=64)
        for i in range(100):
            stream.append(b"%03d" % i, timestamp=i)
        expected = list(stream.read())
    closed = _logs(tmp_path)[:-1]
    closed[0].with_suffix(".index").unlink()
    closed[1].with_suffix(".timeindex").write_bytes(b"\xff" * 25)
    closed[2].with_suffix(".index").write_bytes(b"\x09\x00\x00\x00\x00\x00\x00\x00" * 3)
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert list(log.stream("s").read()) == expected
        assert list(log.stream("s").read(50, 53)) == expected[50:53]
        assert log.stream("s").offset_for_time(42) == 42
    assert closed[0].with_suffix(".index").stat().st_size > 0  # written back


# ----------------------------------------------------------- interrupted operations


def test_leftover_of_an_interrupted_roll_is_removed(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("s").append_batch([b"a", b"b"])
    leftover = _stream_dir(tmp_path) / segment_name(2, ".log")
    leftover.write_bytes(b"")  # created by a roll whose state update never happened
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").append(b"c") == 2
        assert [r.value for r in log.stream("s").read()] == [b"a", b"b", b"c"]
    assert len(_logs(tmp_path)) == 1  # the leftover is gone; appends went to segment 0


def test_leftover_of_an_interrupted_trim_is_removed(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024)
        for _ in range(40):
            stream.append(b"y" * 50)
    files = _logs(tmp_path)
    third = int(files[2].name[:20])
    path = _stream_dir(tmp_path) / STATE
    path.write_bytes(replace(_state(tmp_path), start_offset=third).encode())  # then crashed
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").start_offset == third
        assert [r.offset for r in log.stream("s").read()] == list(range(third, 40))
    assert _logs(tmp_path) == files[2:]


# ---------------------------------------------------------------------- durability


def test_fsync_policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def counting_fdatasync(fd: int) -> None:
        calls.append(fd)
        os.fsync(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    for policy, expect_per_append in (("always", True), ("never", False)):
        calls.clear()
        with disklesslog.open(tmp_path / policy, fsync=policy) as log:
            stream = log.stream("s")
            stream.append(b"x")
            synced_after_first = len(calls)
            for _ in range(9):
                stream.append(b"x")
            if expect_per_append:
                assert len(calls) >= 10
                assert (
                    _state(tmp_path / policy).recovery_position
                    == _logs(tmp_path / policy)[0].stat().st_size
                )  # the recovery point follows every append
            else:
                assert len(calls) == synced_after_first == 0
        if policy == "never":
            assert calls == []  # not even at close


def test_interval_policy_syncs_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", calls.append)
    with disklesslog.open(tmp_path, fsync="interval", fsync_interval_ms=20) as log:
        stream = log.stream("s")
        stream.append_batch([b"x"] * 10)
        opened_calls = len(calls)
        size = _logs(tmp_path)[0].stat().st_size
        deadline = time.monotonic() + 5
        while _state(tmp_path).recovery_position != size and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) > opened_calls  # the background thread synced
        assert _state(tmp_path).recovery_position == size
        assert _state(tmp_path).recovery_offset == 10


@pytest.mark.parametrize(
    "options",
    [{"fsync": "sometimes"}, {"fsync_interval_ms": 0}, {"fsync_interval_ms": 1.5}],
)
def test_bad_durability_options(tmp_path: Path, options: dict) -> None:
    with pytest.raises(disklesslog.ConfigError):
        disklesslog.open(tmp_path, **options)


# ------------------------------------------------------------------ failed writes


def test_failed_write_leaves_nothing_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.stream("s")
        stream.append(b"before")
        size = _logs(tmp_path)[0].stat().st_size
        real_writev = os.writev

        def half_then_enospc(fd: int, buffers: list[bytes]) -> int:
            os.write(fd, bytes(buffers[0])[:5])  # part of the entry reaches the file...
            raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

        monkeypatch.setattr(store_module.os, "writev", half_then_enospc)
        with pytest.raises(StorageError, match="No space"):
            stream.append(b"lost")
        with pytest.raises(StorageError):
            stream.append_batch([b"lost"] * 3)
        monkeypatch.setattr(store_module.os, "writev", lambda fd, b: real_writev(fd, b) - 1)
        with pytest.raises(StorageError, match="short write"):
            stream.append(b"short")
        monkeypatch.setattr(store_module.os, "writev", real_writev)
        assert _logs(tmp_path)[0].stat().st_size == size  # truncated back every time
        assert stream.append(b"after") == 1
        assert [r.value for r in stream.read()] == [b"before", b"after"]


def test_writer_reports_failures_per_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("bad").append(b"exists")
        real_append = store_module.StreamStore.append

        def failing(self, batches):  # type: ignore[no-untyped-def]
            if self.name == "bad":
                raise OSError(errno.EIO, "I/O error")
            return real_append(self, batches)

        monkeypatch.setattr(store_module.StreamStore, "append", failing)
        writer = log.writer(linger_ms=60_000)
        good = [writer.append("good", b"%d" % i) for i in range(5)]
        bad = [writer.append("bad", b"%d" % i) for i in range(5)]
        with pytest.raises(StorageError, match="I/O error"):
            writer.flush()
        assert [f.result() for f in good] == list(range(5))
        assert all(isinstance(f.exception(), StorageError) for f in bad)
        monkeypatch.setattr(store_module.StreamStore, "append", real_append)
        later = writer.append("bad", b"later")
        writer.flush()
        assert later.result() == 1
        writer.close()
        assert [r.value for r in log.stream("bad").read()] == [b"exists", b"later"]


# ------------------------------------------------------------- the log directory


def test_marker_and_layout(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path / "new") as log:
        log.stream("s").append(b"x")
    marker = tmp_path / "new" / MARKER
    content, checked = decode_json(marker.read_bytes(), str(marker), what="marker")
    assert checked
    assert content == {"format": "disklesslog-segments", "version": 2}
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [MARKER, "streams", "tmp"]


def test_a_version_1_log_is_upgraded_when_opened(tmp_path: Path) -> None:
    """A log written before checksums opens, and is marked version 2 so that older
    versions, which would misread its checksummed files, refuse it from then on."""
    with disklesslog.open(tmp_path / "old") as log:
        log.stream("s").append(b"x")
    marker = tmp_path / "old" / MARKER
    marker.write_text('{"format": "disklesslog-segments", "version": 1}\n')
    with disklesslog.open(tmp_path / "old") as log:
        assert [r.value for r in log.stream("s").read()] == [b"x"]
    content, checked = decode_json(marker.read_bytes(), str(marker), what="marker")
    assert checked and content["version"] == 2


@pytest.mark.parametrize(
    "damage",
    [
        b'{"format": "disklesslog-segments", "version": 2}\n',  # version 2 needs its checksum
        b'{"format": "disklesslog-segments", "version": 3}\n#crc32c:00000000\n',
        b"\x00" * 20,
    ],
)
def test_a_damaged_marker_is_refused(tmp_path: Path, damage: bytes) -> None:
    with disklesslog.open(tmp_path / "log"):
        pass
    (tmp_path / "log" / MARKER).write_bytes(damage)
    with pytest.raises(InvalidURL, match=r"disklesslog\.json|version"):
        disklesslog.open(tmp_path / "log")


def test_an_empty_existing_directory_becomes_a_log(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with disklesslog.open(tmp_path / "empty") as log:
        assert log.streams() == []
    assert (tmp_path / "empty" / MARKER).exists()


def test_foreign_directories_and_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(InvalidURL, match="not a disklesslog log"):
        disklesslog.open(tmp_path / "foreign")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidURL, match="file"):
        disklesslog.open(tmp_path / "file")
    assert sorted(p.name for p in (tmp_path / "foreign").iterdir()) == ["notes.txt"]


def test_other_formats_and_versions_are_refused(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path / "log"):
        pass
    marker = tmp_path / "log" / MARKER
    marker.write_text(json.dumps({"format": "disklesslog-segments", "version": 99}))
    with pytest.raises(InvalidURL, match="version 99"):
        disklesslog.open(tmp_path / "log")
    marker.write_text(json.dumps({"format": "something-else", "version": 1}))
    with pytest.raises(InvalidURL, match="another kind"):
        disklesslog.open(tmp_path / "log")
    marker.write_text("{not json")
    with pytest.raises(InvalidURL, match="unreadable"):
        disklesslog.open(tmp_path / "log")


def test_staging_leftovers_are_cleaned_on_open(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path):
        pass
    staging = tmp_path / "tmp"
    (staging / "deleted-abc").mkdir()
    (staging / "deleted-abc" / "00000000000000000000.log").write_bytes(b"x")
    (staging / "create-old").mkdir()
    (staging / "create-new").mkdir()
    an_hour_ago = time.time() - 3700
    os.utime(staging / "create-old", (an_hour_ago, an_hour_ago))
    with disklesslog.open(tmp_path):
        pass
    assert sorted(p.name for p in staging.iterdir()) == ["create-new"]  # may be in use


def test_create_false_never_creates(tmp_path: Path) -> None:
    with pytest.raises(InvalidURL, match="does not exist"):
        disklesslog.open(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


def test_stream_names_never_escape_the_log(tmp_path: Path) -> None:
    names = [".hidden", "-", "_", "a..b", "...", "x" * 249, "CON", "tmp", "streams"]
    with disklesslog.open(tmp_path / "log") as log:
        for name in names:
            log.stream(name).append(b"x")
        assert log.streams() == sorted(names)
    outside = sorted(p.name for p in tmp_path.iterdir())
    assert outside == ["log"]
    inside = sorted(p.name for p in (tmp_path / "log" / "streams").iterdir())
    assert inside == sorted(names)


# ----------------------------------------------------------------------------- URLs


def test_urls_and_paths(tmp_path: Path) -> None:
    with disklesslog.open(f"file://{tmp_path}/a") as log:
        log.stream("s").append(b"x")
        assert log.url == f"file://{tmp_path}/a"
    with disklesslog.open(tmp_path / "a") as log:  # a PathLike
        assert [r.value for r in log.stream("s").read()] == [b"x"]
    with disklesslog.open(str(tmp_path / "a")) as log:
        assert log.streams() == ["s"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nosuch://bucket/x", "no backend opens nosuch://"),
        ("file://otherhost/x", "not host"),
        ("file://", "no path"),
        ("", "non-empty"),
        ("   ", "non-empty"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidURL, match=message):
        disklesslog.open(url)


def test_non_string_url() -> None:
    with pytest.raises(InvalidURL):
        disklesslog.open(42)  # type: ignore[arg-type]


def test_unknown_backend_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidURL, match="unknown backend"):
        disklesslog.open(tmp_path, backend="nope")


def test_damaged_index_of_a_segment_another_handle_rolled_to(tmp_path: Path) -> None:
    """A handle catching up after another handle's roll finds the new active segment's
    index damaged: appends and reads still work (the lock holder rebuilds it)."""
    with (
        disklesslog.open(tmp_path, fsync="never") as first,
        disklesslog.open(tmp_path, fsync="never") as second,
    ):
        a = first.create_stream("s", segment_bytes=1024, index_interval_bytes=64)
        b = second.stream("s")
        a.append(b"x")
        assert b.end_offset == 1  # the second handle has the stream open
        for _ in range(30):
            a.append(b"y" * 60)  # rolls
        active = _logs(tmp_path)[-1]
        active.with_suffix(".index").write_bytes(b"\xff" * 20)  # not 8-byte entries, bad
        assert b.append(b"z") == 31
        assert [r.value for r in b.read()][-2:] == [b"y" * 60, b"z"]
        assert [r.value for r in a.read(30)] == [b"y" * 60, b"z"]


def test_index_entries_past_what_a_reader_saw_are_not_damage(tmp_path: Path) -> None:
    """A reader measures the file, then loads the index; a writer may add entries in
    between. Those are left for the next refresh, not treated as an inconsistent file."""
    from disklesslog.segments.index import OFFSET_ENTRY, SparseIndex

    path = tmp_path / "x.index"
    writer = SparseIndex(path, OFFSET_ENTRY)
    writer.append(1, 100)
    writer.append(5, 900)
    index = SparseIndex(path, OFFSET_ENTRY)
    assert index.load(max_key=10, max_value=500, strict=False)
    assert list(index.keys) == [1]
    assert not index.load(max_key=10, max_value=500)  # strict: a closed segment's index
    assert index.load(max_key=10, max_value=500, strict=False)
    assert index.refresh(max_key=10, max_value=1000)
    assert list(index.keys) == [1, 5]


def test_a_failed_reload_leaves_the_view_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catching up with another handle's roll fails once (say an I/O error): the next
    call catches up properly instead of working on a half-switched view."""
    with (
        disklesslog.open(tmp_path, fsync="never") as first,
        disklesslog.open(tmp_path, fsync="never") as second,
    ):
        a = first.create_stream("s", segment_bytes=1024)
        b = second.stream("s")
        a.append(b"x")
        assert b.end_offset == 1
        for _ in range(30):
            a.append(b"y" * 60)  # rolls: b must reload
        real = store_module.StreamStore._open_active
        calls = {"n": 0}

        def flaky(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(errno.EIO, "transient I/O error")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(store_module.StreamStore, "_open_active", flaky)
        with pytest.raises(OSError, match="transient"):
            b.end_offset  # noqa: B018
        assert b.end_offset == 31
        assert b.append(b"z") == 31
        assert [r.value for r in a.read(29)] == [b"y" * 60, b"y" * 60, b"z"]
