"""No silent loss: damage to any file of a local log is repaired or reported, never
skipped, and acknowledged offsets are never handed out again.

One test (or a family) per way storage can fail a file the backend trusts: a closed
segment cut short, an active segment that lost synced records, index files cut short
or flipped, the state record and its copy, every JSON file. Each says what the reader
must see instead of the silent wrong answer the damage used to give.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import (
    ConfigError,
    CorruptDataError,
    DataLossError,
    InvalidRecordError,
    OffsetOutOfRange,
    RecordTooLarge,
    StreamNotFound,
)
from disklesslog.segments.index import HEADER, OFFSET_ENTRY, TIME_ENTRY, SparseIndex
from disklesslog.segments.layout import (
    STATE,
    STATE_COPY,
    StreamState,
    decode_json,
    encode_json,
    segment_name,
)
from disklesslog.segments.segment import CHECK, iter_entries
from disklesslog.segments.stream_store import StreamStore
from disklesslog.segments.tiering.manifest import MANIFEST, Manifest


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """Damage is logged at WARNING/ERROR on purpose; keep test output readable."""
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def _dir(root: Path, name: str = "s") -> Path:
    return root / "streams" / name


def _logs(root: Path) -> list[Path]:
    return sorted(_dir(root).glob("*.log"))


def _offsets(stream: disklesslog.Stream, start: int | None = None) -> list[int]:
    return [offset for part in stream.read_offsets(start) for offset in part]


def _many_segments(root: Path, count: int = 60, **options: Any) -> None:
    """A stream of ``count`` records of 44 bytes, 9 to a 1 KiB segment, timestamps
    1000 + offset."""
    with disklesslog.open(root, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024, index_interval_bytes=64, **options)
        for i in range(count):
            stream.append(b"v%03d" % i + b"x" * 40, timestamp=1000 + i)


# ---------------------------------------------------- a closed segment cut short


def test_a_closed_segment_cut_short_fails_every_read_not_just_the_first(tmp_path: Path) -> None:
    """The first read rebuilds the segment's indexes and fails; that failure must not
    leave the cached segment shortened, so the next reads in the same process fail too
    instead of returning the records around the hole."""
    _many_segments(tmp_path)
    first = _logs(tmp_path)[0]
    data = first.read_bytes()
    first.write_bytes(data[: len(data) // 2])  # the index entries now point past its end
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.stream("s")
        for _ in range(3):
            with pytest.raises(CorruptDataError) as info:
                list(stream.read())
            assert info.value.source == str(first)
            with pytest.raises(CorruptDataError):
                _offsets(stream)
            with pytest.raises(CorruptDataError):
                _offsets(stream, 2)
        assert _offsets(stream, 9) == list(range(9, 60))  # the segments after it are fine


def test_a_closed_segment_cut_at_an_entry_boundary_is_reported(tmp_path: Path) -> None:
    _many_segments(tmp_path)
    first = _logs(tmp_path)[0]
    with open(first, "rb") as f:
        size = first.stat().st_size
        entries = iter_entries(f.fileno(), "", 0, size, 0, max_batch_bytes=1 << 20, mode=CHECK)
        last = [position for position, *_ in entries][-1]
    os.truncate(first, last)  # the last entry is gone, the others end where they should
    with disklesslog.open(tmp_path, fsync="never") as log:
        for _ in range(2):
            with pytest.raises(CorruptDataError, match=r"should reach|next one starts"):
                _offsets(log.stream("s"))


# ------------------------------------------------ acknowledged records lost from storage


def _acknowledged(root: Path, count: int = 16) -> tuple[Path, int]:
    """``count`` records appended, synced and acknowledged (fsync="always"); then
    storage loses the tail of the active segment: the last quarter of its bytes."""
    with disklesslog.open(root, fsync="always") as log:
        stream = log.create_stream("s")
        offsets = [stream.append(b"record-%d" % i, timestamp=1000 + i) for i in range(count)]
        assert offsets == list(range(count))
    active = _logs(root)[-1]
    data = active.read_bytes()
    active.write_bytes(data[: len(data) * 3 // 4])
    return active, len(data) * 3 // 4


def test_acknowledged_records_lost_by_storage_are_reported_not_reused(tmp_path: Path) -> None:
    active, size = _acknowledged(tmp_path)
    for _ in range(2):  # refused every time, and nothing is changed meanwhile
        with disklesslog.open(tmp_path, fsync="always") as log:
            stream = log.stream("s")
            with pytest.raises(DataLossError) as info:
                stream.append(b"new")
            assert info.value.source == str(active)
            assert info.value.lost == (12, 16)
            assert "12 to 15" in str(info.value) and "accept_data_loss" in str(info.value)
            with pytest.raises(DataLossError):
                list(stream.read())
        assert active.stat().st_size == size
        assert sorted(p.name for p in _dir(tmp_path).iterdir() if p.suffix == ".log") == [
            active.name
        ]


def test_an_accepted_loss_leaves_a_gap_that_is_never_reused(tmp_path: Path) -> None:
    _acknowledged(tmp_path)
    with disklesslog.open(tmp_path, fsync="always") as log:
        report = log.repair("s", accept_data_loss=True)
        assert any("offsets 12 to 15" in line for line in report.actions), report.actions
        stream = log.stream("s")
        assert stream.append(b"new", timestamp=2000) == 16
        assert [r.offset for r in stream.read()] == [*range(12), 16]
        assert _offsets(stream, 13) == [16]  # reads from inside the gap skip it
        assert stream.end_offset == 17
        assert stream.offset_for_time(1011) == 11
        assert stream.offset_for_time(1012) == 16
        assert log.repair("s").skipped == ["s: nothing to repair"]
    marker = _dir(tmp_path) / segment_name(12, ".lost")
    content, checked = decode_json(marker.read_bytes(), str(marker), what="marker")
    assert checked and (content["first"], content["end"]) == (12, 16)
    assert content["reason"] == "accepted by an operator"
    with disklesslog.open(tmp_path, fsync="always") as log:  # and after reopening
        stream = log.stream("s")
        assert stream.append(b"newer") == 17
        assert _offsets(stream) == [*range(12), 16, 17]
        assert stream.info().end_offset == 18


def test_accepting_a_loss_logs_the_loss_and_no_stale_copy_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Accepting a loss moves the state on, so its copy is behind by construction: the
    # repair rewrites it, with no warning that the copy was damaged.
    _acknowledged(tmp_path)
    with caplog.at_level(logging.WARNING, logger="disklesslog"), disklesslog.open(tmp_path) as log:
        log.repair("s", accept_data_loss=True)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert "offsets 12 to 15 were lost" in messages[0]


def test_an_accepted_loss_of_the_whole_active_segment(tmp_path: Path) -> None:
    """The active segment lost everything: it becomes the gap itself."""
    with disklesslog.open(tmp_path, fsync="always") as log:
        stream = log.create_stream("s", segment_bytes=1024)
        for i in range(30):
            stream.append(b"x" * 40, timestamp=1000 + i)
    active = _logs(tmp_path)[-1]
    base = int(active.name[:20])
    active.write_bytes(b"")
    with disklesslog.open(tmp_path, fsync="always") as log:
        with pytest.raises(DataLossError) as info:
            log.stream("s").end_offset  # noqa: B018 - opening the stream recovers it
        assert info.value.lost == (base, 30)
        log.repair("s", accept_data_loss=True)
        stream = log.stream("s")
        assert _offsets(stream) == list(range(base))
        assert stream.append(b"next") == 30
    assert (_dir(tmp_path) / segment_name(base, ".lost")).exists()


def test_a_damaged_loss_marker_is_reported(tmp_path: Path) -> None:
    _acknowledged(tmp_path)
    with disklesslog.open(tmp_path, fsync="always") as log:
        log.repair("s", accept_data_loss=True)
    marker = _dir(tmp_path) / segment_name(12, ".lost")
    marker.write_bytes(marker.read_bytes().replace(b'"end":16', b'"end":17'))
    with disklesslog.open(tmp_path, fsync="always") as log:
        with pytest.raises(CorruptDataError, match="CRC-32C") as info:
            _offsets(log.stream("s"))
        assert info.value.source == str(marker)
    marker.unlink()  # no marker: an empty closed segment is damage again
    with (
        disklesslog.open(tmp_path, fsync="always") as log,
        pytest.raises(CorruptDataError, match="empty"),
    ):
        _offsets(log.stream("s"))


def test_a_crash_while_accepting_a_loss_finds_the_loss_again(tmp_path: Path) -> None:
    """The new segments exist but the state record does not name them yet: recovery
    removes them as an interrupted roll's (and a marker beside the active segment),
    and the loss still needs accepting."""
    _acknowledged(tmp_path)
    directory = _dir(tmp_path)
    (directory / segment_name(12, ".log")).touch()
    (directory / segment_name(16, ".log")).touch()
    (directory / segment_name(12, ".lost")).write_bytes(
        encode_json({"version": 1, "first": 12, "end": 16})
    )
    (directory / segment_name(0, ".lost")).write_bytes(  # as if the gap began at 0
        encode_json({"version": 1, "first": 0, "end": 16})
    )
    with disklesslog.open(tmp_path, fsync="always") as log, pytest.raises(DataLossError):
        log.stream("s").append(b"new")
    assert sorted(p.name for p in directory.iterdir() if p.suffix in (".log", ".lost")) == [
        segment_name(0, ".log")
    ]


def test_under_fsync_never_an_os_crash_loss_is_accepted_without_reuse(tmp_path: Path) -> None:
    """The policy "never" accepts in advance that an OS crash loses recent appends;
    it does not accept giving their offsets to other records."""
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s")
        for i in range(10):
            stream.append(b"record-%d" % i)
    active = _logs(tmp_path)[-1]
    active.write_bytes(active.read_bytes()[:-20])  # the last entry did not reach the disk
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.stream("s")
        assert stream.append(b"after") == 10
        assert _offsets(stream) == [*range(9), 10]
    marker = _dir(tmp_path) / segment_name(9, ".lost")
    assert "never" in decode_json(marker.read_bytes(), str(marker), what="marker")[0]["reason"]


def test_a_recovery_point_written_under_never_does_not_excuse_a_later_policy(
    tmp_path: Path,
) -> None:
    """Opened with fsync="always" after records were acknowledged the same way, a loss
    is storage damage, whatever policy opens the log next."""
    _acknowledged(tmp_path)
    with disklesslog.open(tmp_path, fsync="never") as log, pytest.raises(DataLossError):
        log.stream("s").append(b"new")


def test_repair_arguments_are_checked(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path) as log:
        log.stream("s").append(b"x")
        with pytest.raises(ConfigError):
            log.repair("s", accept_data_loss="yes")  # type: ignore[arg-type]
        with pytest.raises(OffsetOutOfRange):
            log.repair("s", start_offset=-1)
        with pytest.raises(StreamNotFound):
            log.repair("missing", accept_data_loss=True)
        assert [r.value for r in log.stream("s").read()] == [b"x"]


# ------------------------------------------------------------------------ index files


def _time_entries(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    count = struct.unpack_from(HEADER.format, data)[1]
    return list(TIME_ENTRY.iter_unpack(data[HEADER.size : HEADER.size + count * TIME_ENTRY.size]))


def test_a_time_index_cut_short_does_not_skip_a_segment(tmp_path: Path) -> None:
    """A closed segment's max timestamp is its last .timeindex entry: an index missing
    its last entry still validated, and offset_for_time skipped the segment."""
    _many_segments(tmp_path)
    timeindex = sorted(_dir(tmp_path).glob("*.timeindex"))[0]
    assert _time_entries(timeindex)[-1] == (1008, 8)
    raw = timeindex.read_bytes()
    timeindex.write_bytes(raw[: -TIME_ENTRY.size])
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").offset_for_time(1008) == 8
    assert _time_entries(timeindex)[-1] == (1008, 8)  # rebuilt


def test_any_damage_to_a_time_index_gives_no_wrong_answer(tmp_path: Path) -> None:
    """Flip every bit position of a closed segment's .timeindex in turn (and cut it at
    every length): time lookups still give the right offset for every timestamp."""
    _many_segments(tmp_path, count=30, compression="none")
    timeindex = sorted(_dir(tmp_path).glob("*.timeindex"))[1]  # offsets 9..17
    original = timeindex.read_bytes()
    damages = [original[:cut] for cut in range(len(original))]
    damages += [
        original[:i] + bytes([original[i] ^ (1 << (i % 8))]) + original[i + 1 :]
        for i in range(len(original))
    ]
    for damaged in damages:
        timeindex.write_bytes(damaged)
        with disklesslog.open(tmp_path, fsync="never") as log:
            stream = log.stream("s")
            for ts in (1008, 1009, 1013, 1017, 1018):
                assert stream.offset_for_time(ts) == ts - 1000, damaged.hex()


def test_a_lost_time_index_of_the_active_segment_is_rebuilt(tmp_path: Path) -> None:
    """The active segment's .index survives but its .timeindex is gone: recovery must
    not take the max timestamp from the index entries it still has."""
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", index_interval_bytes=64)
        for i in range(10):
            stream.append(b"x" * 40, timestamp=5000 - i * 10 if i < 5 else 1000 + i)
    (_dir(tmp_path) / segment_name(0, ".timeindex")).unlink()
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").offset_for_time(4990) == 0
        assert log.stream("s").offset_for_time(4999) == 0
        assert log.stream("s").offset_for_time(5001) is None


def test_an_index_entry_a_crash_left_uncounted_is_not_sealed_in(tmp_path: Path) -> None:
    """An append writes the entry, then the header: a crash in between leaves an entry
    the header does not count. Recovery drops it, so the index the roll seals holds
    exactly what its header says (else every later load would rebuild it)."""
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024, index_interval_bytes=64)
        for i in range(4):
            stream.append(b"x" * 40, timestamp=1000 + i)
    index = _dir(tmp_path) / segment_name(0, ".index")
    with open(index, "ab") as f:
        f.write(struct.pack("<II", 999, 99999))
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("s").append(b"y" * 900, timestamp=2000)  # rolls before it is written
        assert len(_logs(tmp_path)) == 2
    closed = SparseIndex(index, OFFSET_ENTRY)
    assert closed.load(max_key=1 << 32, max_value=1 << 32)  # strict: exactly as counted
    assert closed.keys and 999 not in closed.keys


def test_version_1_index_files_are_rebuilt(tmp_path: Path) -> None:
    """Index files written before the header (entries only) carry no checksum: they are
    rebuilt on first use rather than trusted."""
    _many_segments(tmp_path, count=30)
    timeindex = sorted(_dir(tmp_path).glob("*.timeindex"))[0]
    entries = _time_entries(timeindex)
    # A version 1 file whose last entry was lost: it would have passed as valid.
    timeindex.write_bytes(b"".join(TIME_ENTRY.pack(*entry) for entry in entries[:-1]))
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").offset_for_time(entries[-1][0]) == entries[-1][1]
    assert _time_entries(timeindex) == entries


# ----------------------------------------------------- the state record and its copy


def _trimmed(root: Path) -> None:
    _many_segments(root)
    with disklesslog.open(root, fsync="never") as log:
        log.stream("s").trim(30)  # inside the segment starting at 27


def test_a_damaged_state_record_keeps_the_start_offset(tmp_path: Path) -> None:
    """Trimmed records (perhaps trimmed to delete them) must not come back."""
    _trimmed(tmp_path)
    (_dir(tmp_path) / STATE).write_bytes(b"garbage")
    with disklesslog.open(tmp_path, fsync="never") as log:
        stream = log.stream("s")
        assert stream.start_offset == 30
        assert _offsets(stream) == list(range(30, 60))
        assert stream.append(b"next") == 60
    assert StreamState.decode((_dir(tmp_path) / STATE).read_bytes()) is not None


def test_any_damage_to_the_state_record_keeps_the_start_offset(tmp_path: Path) -> None:
    """Every single-bit change of stream.state, in turn: the record fails its CRC and is
    restored from its copy, trimmed records stay trimmed."""
    _trimmed(tmp_path)
    path = _dir(tmp_path) / STATE
    original = path.read_bytes()
    for i in range(len(original)):
        path.write_bytes(original[:i] + bytes([original[i] ^ (1 << (i % 8))]) + original[i + 1 :])
        with disklesslog.open(tmp_path, fsync="never") as log:
            stream = log.stream("s")
            assert stream.start_offset == 30, i
            assert _offsets(stream) == list(range(30, 60)), i
        path.write_bytes(original)


def test_a_damaged_state_copy_is_repaired_from_the_record(tmp_path: Path) -> None:
    _trimmed(tmp_path)
    copy = _dir(tmp_path) / STATE_COPY
    copy.write_bytes(b"\0" * 48)
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").start_offset == 30
    repaired = StreamState.decode(copy.read_bytes())
    assert repaired is not None and repaired.start_offset == 30


def test_the_later_start_offset_of_record_and_copy_wins(tmp_path: Path) -> None:
    """Storage that lost the record's last write (an older, valid record) cannot undo
    a trim the copy saw."""
    _many_segments(tmp_path)
    state_path = _dir(tmp_path) / STATE
    before = state_path.read_bytes()
    with disklesslog.open(tmp_path, fsync="never") as log:
        log.stream("s").trim(30)
    state_path.write_bytes(before)
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").start_offset == 30


def test_both_copies_of_the_state_damaged_is_reported_then_repaired(tmp_path: Path) -> None:
    _trimmed(tmp_path)
    (_dir(tmp_path) / STATE).write_bytes(b"garbage")
    (_dir(tmp_path) / STATE_COPY).write_bytes(b"more garbage")
    with disklesslog.open(tmp_path, fsync="never") as log:
        with pytest.raises(CorruptDataError, match="start offset is lost") as info:
            log.stream("s").start_offset  # noqa: B018 - opening the stream recovers it
        assert info.value.source == str(_dir(tmp_path) / STATE)
        report = log.repair("s", start_offset=30)
        assert report.actions
        stream = log.stream("s")
        assert stream.start_offset == 30
        assert _offsets(stream) == list(range(30, 60))
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").start_offset == 30


def test_a_stream_of_version_1_gets_its_state_copy(tmp_path: Path) -> None:
    _trimmed(tmp_path)
    copy = _dir(tmp_path) / STATE_COPY
    copy.unlink()  # version 1 wrote none
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert log.stream("s").start_offset == 30
    written = StreamState.decode(copy.read_bytes())
    assert written is not None and written.start_offset == 30


# ------------------------------------------------------- a refused first append


@pytest.mark.parametrize(
    ("append", "error"),
    [
        (lambda s: s.append("text"), InvalidRecordError),
        (lambda s: s.append(b"x" * (2 << 20)), RecordTooLarge),
        (lambda s: s.append_batch([b"ok", 3]), InvalidRecordError),
        (lambda s: s.append_batch([b"x" * (2 << 20)]), RecordTooLarge),
    ],
    ids=["append-type", "append-size", "batch-type", "batch-size"],
)
def test_a_refused_first_append_does_not_create_the_stream(
    tmp_path: Path, append: Any, error: type[Exception]
) -> None:
    with disklesslog.open(tmp_path) as log:
        with pytest.raises(error):
            append(log.stream("new"))
        assert log.streams() == []
        assert not _dir(tmp_path, "new").exists()
        assert log.stream("new").append(b"fine") == 0  # and a valid one does


# ------------------------------------------------------------------------- JSON files


def _flip_digit(path: Path, old: bytes, new: bytes) -> None:
    raw = path.read_bytes()
    assert old in raw
    path.write_bytes(raw.replace(old, new, 1))


def test_a_changed_setting_in_stream_json_is_detected(tmp_path: Path) -> None:
    """A digit changed in stream.json still parses; a reader must not act on it (a
    smaller max_batch_bytes would call good batches corrupt, a larger one defeat the
    allocation bound)."""
    with disklesslog.open(tmp_path) as log:
        log.create_stream("s", max_batch_bytes=2 << 20).append(b"x")
    path = _dir(tmp_path) / "stream.json"
    _flip_digit(path, b"2097152", b"2097153")
    with disklesslog.open(tmp_path) as log:
        with pytest.raises(CorruptDataError, match="CRC-32C") as info:
            log.stream("s").append(b"y")
        assert info.value.source == str(path)


def test_version_1_stream_json_is_read(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path) as log:
        log.create_stream("s", segment_bytes=4096).append(b"x")
    path = _dir(tmp_path) / "stream.json"
    content, _ = decode_json(path.read_bytes(), str(path), what="config")
    path.write_text(json.dumps({**content, "version": 1}))  # as version 1 wrote it
    with disklesslog.open(tmp_path) as log:
        assert log.stream("s").info().config.segment_bytes == 4096
        log.alter_stream("s", retention_ms=1000)
    content, checked = decode_json(path.read_bytes(), str(path), what="config")
    assert checked and content["version"] == 2


def test_a_damaged_compaction_intent_is_reported(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path) as log:
        log.create_stream("s", cleanup_policy="compact").append(b"x", key=b"k")
    intent = _dir(tmp_path) / "cleaner.intent"
    good = encode_json({"version": 2, "checkpoint": 0, "replaced": [], "written": []})
    intent.write_bytes(good.replace(b'"checkpoint":0', b'"checkpoint":9'))
    with disklesslog.open(tmp_path) as log:
        with pytest.raises(CorruptDataError, match="intent") as info:
            log.stream("s").append(b"y", key=b"k")
        assert info.value.source == str(intent)


def test_a_damaged_tier_json_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "log" / "tier.json"
    with disklesslog.open(tmp_path / "log", tier_url=(tmp_path / "tier").as_uri()):
        pass
    raw = path.read_bytes()
    log_id = json.loads(raw[: raw.index(b"\n")])["log_id"].encode()
    path.write_bytes(raw.replace(log_id, log_id[::-1]))  # still a well-formed file
    with pytest.raises(CorruptDataError) as info:
        disklesslog.open(tmp_path / "log")
    assert info.value.source == str(path)


class _Crash(Exception):
    """Stands for the committing process dying."""


def _pending_commit(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A two-phase commit interrupted after its notes and parts were written."""
    with disklesslog.open(root, fsync="never") as log:
        log.stream("s").append(b"before")
        stager = log.stager()
        stager.append_batch("s", [b"staged"])
        part = stager.finish()
        with monkeypatch.context() as m:

            def crash(self: StreamStore, batches: Any, **kwargs: Any) -> list[int]:
                raise _Crash

            m.setattr(StreamStore, "append", crash)
            with pytest.raises(_Crash):
                log.commit_transaction("t1", [part])
    pending = root / "transactions" / "pending"
    (notes,) = pending.glob("*.json")
    (parts_file,) = pending.glob("*.parts")
    return notes, parts_file


@pytest.mark.parametrize("which", ["notes", "parts"])
def test_damaged_transaction_files_are_reported(
    tmp_path: Path, which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes, parts = _pending_commit(tmp_path, monkeypatch)
    path = notes if which == "notes" else parts
    raw = path.read_bytes()
    digit = b"1" if raw[-2:-1] == b"0" else b"0"
    path.write_bytes(raw[:-2] + digit + b"\n")  # its checksum no longer matches
    with disklesslog.open(tmp_path, fsync="never") as log:  # the roll-forward cannot run
        stream = log.stream("s")
        if which == "notes":  # readers consult the notes: they must not guess
            with pytest.raises(CorruptDataError) as info:
                list(stream.read())
            assert info.value.source == str(path)
            with pytest.raises(CorruptDataError):
                stream.info()
        else:  # the commit stays held back, visibly
            assert [r.value for r in stream.read()] == [b"before"]
            with pytest.raises(CorruptDataError) as info:
                log.abort_transaction([])  # must know what pending commits need: it cannot
            assert info.value.source == str(path)


def test_a_damaged_transaction_record_is_reported(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        stager = log.stager()
        stager.append_batch("s", [b"staged"])
        log.commit_transaction("t1", [stager.finish()])
    (record,) = (tmp_path / "transactions").glob("*.json")
    _flip_digit(record, b'"s":[0,1]', b'"s":[0,2]')
    with disklesslog.open(tmp_path, fsync="never") as log:
        with pytest.raises(CorruptDataError) as info:
            log.commit_transaction("t1", [])  # a retry consults the record
        assert info.value.source == str(record)


def test_every_bit_flip_in_every_json_file_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each JSON file the backend writes, with each of its bits flipped in turn, reads
    as CorruptDataError: body or trailer, a change never passes for the original."""
    root = tmp_path / "log"
    _pending_commit(root, monkeypatch)  # notes and parts files
    with disklesslog.open(root, fsync="always", tier_url=(tmp_path / "tier").as_uri()) as log:
        log.stream("s").append(b"x")
        log.commit_offsets("g", {"s": 1})
        other = log.stager()
        other.append_batch("t", [b"y"])
        log.commit_transaction("t2", [other.finish()])  # finishes t1 first: a record
    _acknowledged(tmp_path / "lossy")
    with disklesslog.open(tmp_path / "lossy", fsync="always") as log:
        log.repair("s", accept_data_loss=True)
    files = [
        root / "disklesslog.json",
        _dir(root) / "stream.json",
        root / "groups" / "g.json",
        root / "tier.json",
        *(root / "transactions").glob("*.json"),
        _dir(tmp_path / "lossy") / segment_name(12, ".lost"),
    ]
    intent = encode_json({"version": 2, "checkpoint": 5, "replaced": [], "written": []})
    raws = [(str(path), path.read_bytes()) for path in files] + [("intent", intent)]
    assert len(raws) == 8
    for source, raw in raws:
        decode_json(raw, source, what="file")  # the original reads
        for bit in range(len(raw) * 8):
            damaged = bytearray(raw)
            damaged[bit // 8] ^= 1 << (bit % 8)
            with pytest.raises(CorruptDataError):
                decode_json(bytes(damaged), source, what="file")


def test_every_bit_flip_in_a_tier_manifest_is_caught(tmp_path: Path) -> None:
    """tier.manifest has its own header and CRC-32C (format 2.9): a flipped bit is
    CorruptDataError naming it, for decoding and for reads that need it."""
    root = tmp_path / "log"
    with disklesslog.open(
        root, fsync="never", tier_url=(tmp_path / "tier").as_uri(), local_retention_bytes=1
    ) as log:
        stream = log.create_stream("s", segment_bytes=1024)
        for i in range(60):
            stream.append(b"x" * 40, timestamp=1000 + i)
        log.tier(now_ms=10**13)
        assert stream.info().details["local_start_offset"] > 0
    path = _dir(root) / MANIFEST
    raw = path.read_bytes()
    Manifest.decode(raw, str(path))
    for bit in range(len(raw) * 8):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptDataError):
            Manifest.decode(bytes(damaged), str(path))
    path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with disklesslog.open(root, fsync="never") as log:
        with pytest.raises(CorruptDataError) as info:
            _offsets(log.stream("s"), 0)
        assert info.value.source == str(path)


def test_a_stream_damaged_beyond_recovery_can_still_be_deleted(tmp_path: Path) -> None:
    """Deleting is the other way to give damaged records up: it must not need the
    stream to open."""
    _acknowledged(tmp_path)
    with disklesslog.open(tmp_path / "other", fsync="never") as log:
        log.stream("s").append(b"x")
    (_dir(tmp_path / "other") / STATE).write_bytes(b"garbage")
    (_dir(tmp_path / "other") / STATE_COPY).unlink()
    for root in (tmp_path, tmp_path / "other"):
        with disklesslog.open(root) as log:
            with pytest.raises(CorruptDataError):
                log.stream("s").end_offset  # noqa: B018 - opening the stream recovers it
            log.delete_stream("s")
            assert log.streams() == []
            assert log.stream("s").append(b"new") == 0  # a new stream of the same name


def test_a_damaged_group_file_does_not_stop_a_stream_deletion(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path) as log:
        log.stream("s").append(b"x")
        log.commit_offsets("g", {"s": 1})
        group = tmp_path / "groups" / "g.json"
        group.write_bytes(group.read_bytes().replace(b'"s": 1', b'"s": 7'))
        with pytest.raises(CorruptDataError) as info:
            log.delete_stream("s")
        assert info.value.source == str(group)
        assert log.streams() == []
