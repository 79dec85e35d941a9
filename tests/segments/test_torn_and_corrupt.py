"""Torn tails are repaired on reopen; corruption anywhere else is reported, never returned.

A crash can leave the active segment ending in part of an entry, or in garbage (zeros
after power loss). Recovery truncates what follows the recovery point. Damage *before*
the recovery point is not a crash artefact: it is kept, and reads raise
:class:`CorruptDataError` naming the file and position.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import CorruptDataError, Record
from disklesslog.segments.layout import STATE, StreamState
from disklesslog.segments.segment import CHECK, iter_entries


def _build(directory: Path, *, compression: str = "none") -> list[Record]:
    """A closed log with one stream of several batches in one segment; its records."""
    with disklesslog.open(directory, fsync="never") as log:
        stream = log.create_stream("s", compression=compression, index_interval_bytes=64)
        stream.append_batch([b"first-%d" % i for i in range(5)], keys=[b"k"] * 5)
        for i in range(4):
            stream.append(b"single-%d" % i, headers={"n": b"%d" % i})
        stream.append_batch([b"last-%d" % i * 3 for i in range(6)], timestamps=list(range(6)))
        return list(stream.read())


def _segment(directory: Path) -> Path:
    (path,) = (directory / "streams" / "s").glob("*.log")
    return path


def _entry_starts(path: Path) -> list[int]:
    with open(path, "rb") as f:
        fd = f.fileno()
        size = path.stat().st_size
        return [
            pos
            for pos, *_ in iter_entries(
                fd, str(path), 0, size, 0, max_batch_bytes=1 << 24, mode=CHECK
            )
        ]


def _set_recovery_point(directory: Path, position: int, offset: int) -> None:
    """Pretend the last clean state was written with the recovery point here (as after
    a crash that happened later)."""
    path = directory / "streams" / "s" / STATE
    state = StreamState.decode(path.read_bytes())
    assert state is not None
    new = replace(state, recovery_position=position, recovery_offset=offset).encode()
    _overwrite(path, 0, new, length=len(new))


def _overwrite(path: Path, position: int, data: bytes, *, length: int | None = None) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)
        if length is not None:
            f.truncate(length)


def _reopen_and_read(directory: Path) -> tuple[list[Record], int]:
    with disklesslog.open(directory, fsync="never") as log:
        stream = log.stream("s")
        records = list(stream.read())
        end = stream.end_offset
        stream.append(b"after-recovery")  # the repaired stream takes appends again
        assert next(iter(stream.read(end))).value == b"after-recovery"
    return records, end


@pytest.mark.parametrize("crash_state", [False, True], ids=["clean-state", "crash-state"])
def test_torn_last_entry_at_every_byte(tmp_path: Path, crash_state: bool) -> None:
    """Cut the file at every byte inside its last entry: reopening recovers the records
    before it, whatever the state record says. Where the state says the entry was
    there (clean-state: an OS crash lost it under fsync="never", the policy of this
    log), its offsets are lost, never given to the next append; where it was written
    after the recovery point (crash-state), it was never verified and is cut."""
    records = _build(tmp_path)
    stream_dir = tmp_path / "streams" / "s"
    saved = {p: p.read_bytes() for p in stream_dir.iterdir()}
    segment = _segment(tmp_path)
    starts = _entry_starts(segment)
    last_start, size = starts[-1], len(saved[segment])
    survivors = [r for r in records if not r.value.startswith(b"last-")]
    for cut in range(last_start, size):
        for path in stream_dir.iterdir():
            if path not in saved:
                path.unlink()
        for path, content in saved.items():
            _overwrite(path, 0, content, length=len(content))
        with open(segment, "r+b") as f:
            f.truncate(cut)
        if crash_state:
            _set_recovery_point(tmp_path, last_start, len(survivors))
        got, end = _reopen_and_read(tmp_path)
        assert got == survivors, f"cut at byte {cut}"
        assert end == (len(survivors) if crash_state else len(records))


@pytest.mark.parametrize(
    "garbage",
    [b"\x00" * 4096, b"\xff" * 37, bytes(range(256)) * 3, b"\x01"],
    ids=["zeros", "ones", "pattern", "one-byte"],
)
def test_garbage_after_the_last_entry_is_truncated(tmp_path: Path, garbage: bytes) -> None:
    records = _build(tmp_path)
    segment = _segment(tmp_path)
    clean_size = segment.stat().st_size
    _set_recovery_point(tmp_path, clean_size, len(records))
    with open(segment, "ab") as f:
        f.write(garbage)
    got, end = _reopen_and_read(tmp_path)
    assert got == records
    assert end == len(records)


def test_corrupt_entry_after_the_recovery_point_is_cut_with_what_follows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Recovery truncates at the first bad entry after the recovery point (LevelDB's and
    Kafka's rule): later entries are lost with it, and the log says so."""
    records = _build(tmp_path)
    segment = _segment(tmp_path)
    starts = _entry_starts(segment)
    data = bytearray(segment.read_bytes())
    data[starts[2] + 40] ^= 0x10  # inside the third entry's header
    segment.write_bytes(bytes(data))
    _set_recovery_point(tmp_path, starts[1], 5)  # verified up to the second entry
    with caplog.at_level(logging.WARNING, logger="disklesslog"):
        got, _ = _reopen_and_read(tmp_path)
    assert got == records[:6]  # first batch (5 records) + the first single append
    assert any("truncating" in r.getMessage() for r in caplog.records)


def _all_records(stream: disklesslog.Stream) -> list[Any]:
    return list(stream.read())


def _all_offsets(stream: disklesslog.Stream) -> list[Any]:
    return [offset for part in stream.read_offsets() for offset in part]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_bit_flips_anywhere_in_a_segment_are_detected(tmp_path: Path, compression: str) -> None:
    """Flip one bit in every byte of a closed segment in turn: reading the stream raises
    CorruptDataError (naming the file) and never returns a record that differs; nor does
    reading its offsets alone, which decodes no dense batch."""
    records = _build(tmp_path, compression=compression)
    stream_dir = tmp_path / "streams" / "s"
    saved = {p: p.read_bytes() for p in stream_dir.iterdir()}
    segment = _segment(tmp_path)
    original = saved[segment]
    undetected = []
    for position in range(len(original)):
        _overwrite(segment, position, bytes([original[position] ^ (1 << (position % 8))]))
        logging.disable(logging.ERROR)
        try:
            with disklesslog.open(tmp_path, fsync="never") as log:
                reads = [(_all_records, records), (_all_offsets, [r.offset for r in records])]
                for read, expected in reads:
                    try:
                        got = read(log.stream("s"))
                        undetected.append(position)
                        assert got == expected, f"flip at byte {position} returned {got}"
                    except CorruptDataError as exc:
                        assert exc.source is not None and exc.source.endswith(segment.name)
                        assert exc.position is not None
        finally:
            logging.disable(logging.NOTSET)
            for path, content in saved.items():  # in place: truncating to 0 is slow on ext4
                _overwrite(path, 0, content, length=len(content))
    assert undetected == [], f"flips at bytes {undetected[:10]} went unnoticed"


def test_damaged_index_does_not_fail_reads(tmp_path: Path) -> None:
    """Indexes are hints: entries pointing into the middle of an entry are survived."""
    records = _build(tmp_path)
    index = next((tmp_path / "streams" / "s").glob("*.index"))
    assert index.stat().st_size >= 8
    index.write_bytes(b"\x02\x00\x00\x00\x05\x00\x00\x00" + index.read_bytes()[8:])
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert list(log.stream("s").read()) == records
        assert list(log.stream("s").read(7)) == records[7:]


def test_unreadable_state_record_is_rebuilt_from_the_files(tmp_path: Path) -> None:
    records = _build(tmp_path)
    (tmp_path / "streams" / "s" / STATE).write_bytes(b"garbage")
    with disklesslog.open(tmp_path, fsync="never") as log:
        assert list(log.stream("s").read()) == records
        assert log.stream("s").append(b"next") == len(records)
