"""A write-ahead log a crash left behind is checked before SQLite replays it.

SQLite replays a ``-wal`` up to its first bad frame and forgets the transactions after
it, in silence. The logs here are real: written by the sequencer, then copied while it
has them open (what a crash leaves, as a process killed with SIGKILL shows), then
damaged. SQLite itself is the oracle of what it would replay (``PRAGMA
wal_checkpoint`` on a copy reports the frames it took); the sequencer must refuse a log
whose damage hides committed transactions, and open one whose last transaction was
merely torn.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from disklesslog.errors import CorruptDataError
from disklesslog.sequencers import BatchToCommit
from disklesslog.sequencers.sqlite import SqliteSequencer
from disklesslog.sequencers.sqlite_wal import frame_checksums, scan_wal

SPAWN = multiprocessing.get_context("spawn")
PAGE = 4096
FRAME = 24 + PAGE
COMMITS = 30


def frame_at(index: int) -> int:
    return 32 + index * FRAME


def wal_of(db: Path) -> Path:
    return Path(f"{db}-wal")


def commit_all(seq: SqliteSequencer, commits: int) -> list[int]:
    """``commits`` commits of one batch of 5 records; the end offset after each."""
    seq.create_stream("s", {})
    ends = []
    for i in range(commits):
        [result] = seq.commit(f"objects/{i:04d}", [BatchToCommit("s", 0, 100, 5, 5, 1000 + i)])
        ends.append(result.base_offset + 5)
    return ends


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[Path, list[int]]:
    """A database and the write-ahead log a crash leaves (copied while the sequencer
    has them open), and the end offset acknowledged after each commit."""
    live = tmp_path / "live" / "meta.db"
    seq = SqliteSequencer(live)
    ends = commit_all(seq, COMMITS)
    image = tmp_path / "crash"
    image.mkdir()
    shutil.copy(live, image / "meta.db")
    shutil.copy(wal_of(live), wal_of(image / "meta.db"))
    seq.close()
    return image / "meta.db", ends


def copy_of(db: Path, name: str) -> Path:
    """A copy of the database and its log in a directory of its own."""
    target = db.parent.parent / name
    target.mkdir()
    shutil.copy(db, target / db.name)
    shutil.copy(wal_of(db), wal_of(target / db.name))
    return target / db.name


def sqlite_replays(db: Path) -> tuple[int, int | None]:
    """What SQLite itself does with the log (on a copy): the frames it replays, and the
    stream's end offset it then reads (None: no such stream, or no tables at all)."""
    copy = copy_of(db, f"oracle-{time.monotonic_ns()}")
    conn = sqlite3.connect(copy)
    try:
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        try:
            row = conn.execute("SELECT end_offset FROM streams WHERE name = 's'").fetchone()
        except sqlite3.DatabaseError:
            row = None
    finally:
        conn.close()
    return frames, (None if row is None else row[0])


def frames_of(db: Path) -> list[tuple[int, int]]:
    """``(page number, commit size)`` of every whole frame of the log."""
    data = wal_of(db).read_bytes()
    count = (len(data) - 32) // FRAME
    return [struct.unpack_from(">2I", data, frame_at(i)) for i in range(count)]


def commit_frames(db: Path) -> list[int]:
    return [i for i, (_, commit) in enumerate(frames_of(db)) if commit]


def damage(db: Path, position: int, change: Callable[[bytearray], None]) -> None:
    data = bytearray(wal_of(db).read_bytes())
    view = data[position:]
    change(view)
    data[position:] = view
    wal_of(db).write_bytes(bytes(data))


def flip(bit: int = 0) -> Callable[[bytearray], None]:
    def change(view: bytearray) -> None:
        view[bit // 8] ^= 1 << (bit % 8)

    return change


def zero(count: int) -> Callable[[bytearray], None]:
    def change(view: bytearray) -> None:
        view[:count] = bytes(count)

    return change


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if not p.name.endswith("-lock")
    }


# ------------------------------------------------------------ the scan itself


def reference_checksum(data: bytes, seed: tuple[int, int], big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum as its format specifies it, one pair of words at a time."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    s0, s1 = seed
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


@pytest.mark.parametrize("page_size", [512, 4096, 65536])
@pytest.mark.parametrize("big_endian", [False, True])
def test_frame_checksums_follow_the_format(page_size: int, big_endian: bool) -> None:
    rng = random.Random(page_size)
    n = 5
    size = 24 + page_size
    data = rng.randbytes(n * size)
    seeds = [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(n)]
    expected = [
        reference_checksum(
            data[i * size : i * size + 8] + data[i * size + 24 : (i + 1) * size],
            seeds[i],
            big_endian,
        )
        for i in range(n)
    ]
    assert frame_checksums(data, n, size, seeds, big_endian) == expected


def test_an_intact_log_is_replayed_whole(crashed: tuple[Path, list[int]]) -> None:
    db, ends = crashed
    scan = scan_wal(str(wal_of(db)))
    assert (scan.first_bad, scan.lost_commits) == (None, 0)
    assert scan.frames == scan.replayed == len(frames_of(db))
    assert sqlite_replays(db) == (scan.replayed, ends[-1])
    with SqliteSequencer(db) as seq:
        assert seq.stream_info("s").end_offset == ends[-1]
    assert not wal_of(db).exists()  # the last close copied it into the database


def test_the_scan_replays_what_sqlite_replays(crashed: tuple[Path, list[int]]) -> None:
    """Hundreds of damaged copies: the scan's idea of what SQLite replays is SQLite's."""
    db, _ = crashed
    size = wal_of(db).stat().st_size
    rng = random.Random(14)
    for n in range(60):
        copy = copy_of(db, f"copy-{n}")
        position = rng.randrange(size)
        if n % 3 == 0:
            damage(copy, position, zero(rng.randint(1, 200)))
        elif n % 3 == 1:
            damage(copy, position, flip(rng.randrange(8)))
        else:
            os.truncate(wal_of(copy), position)
        scan = scan_wal(str(wal_of(copy)))
        assert scan.replayed == sqlite_replays(copy)[0], (n, position)


# ------------------------------------------------- damage that hides commits


def middle_commit(db: Path) -> int:
    commits = commit_frames(db)
    return commits[len(commits) // 2]


DAMAGES: dict[str, Callable[[Path], tuple[int, Callable[[bytearray], None]]]] = {
    # where (a byte offset), and what: each hits one frame between commits
    "page bit": lambda db: (frame_at(middle_commit(db) - 1) + 24 + 1000, flip(3)),
    "page number": lambda db: (frame_at(middle_commit(db) - 1), flip(5)),
    "salt": lambda db: (frame_at(middle_commit(db) - 1) + 12, flip(0)),
    "stored checksum": lambda db: (frame_at(middle_commit(db) - 1) + 20, flip(7)),
    "zeroed frame": lambda db: (frame_at(middle_commit(db) - 1), zero(FRAME)),
    "commit frame": lambda db: (frame_at(middle_commit(db)) + 24 + 7, flip(1)),
    "first frame": lambda db: (frame_at(0) + 24 + 50, flip(2)),
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_damage_followed_by_commits_is_refused(crashed: tuple[Path, list[int]], kind: str) -> None:
    db, ends = crashed
    position, change = DAMAGES[kind](db)
    damage(db, position, change)
    replayed, end = sqlite_replays(db)
    assert end is None or end < ends[-1]  # SQLite alone would forget acknowledged commits
    before = digest(db.parent)
    with pytest.raises(CorruptDataError, match="transactions committed after it") as caught:
        SqliteSequencer(db)
    assert caught.value.source == str(wal_of(db))
    first_bad = (position - 32) // FRAME
    assert caught.value.position == frame_at(first_bad)
    assert replayed <= first_bad
    assert digest(db.parent) == before  # left as found, for an operator


@pytest.mark.parametrize(
    "change",
    [
        lambda data: data.__setitem__(slice(16, 17), bytes([data[16] ^ 1])),  # salt-1
        lambda data: data.__setitem__(slice(0, 4), b"\0\0\0\0"),  # the magic number
        lambda data: data.__setitem__(slice(8, 12), struct.pack(">I", 1000)),  # page size
    ],
    ids=["salt", "magic", "page size"],
)
def test_a_damaged_header_is_refused(
    crashed: tuple[Path, list[int]], change: Callable[[bytearray], None]
) -> None:
    """SQLite ignores a log whose header is invalid: every commit in it would be lost."""
    db, _ = crashed
    damage(db, 0, change)
    assert sqlite_replays(db)[0] == 0
    with pytest.raises(CorruptDataError, match="header is invalid") as caught:
        SqliteSequencer(db)
    assert (caught.value.source, caught.value.position) == (str(wal_of(db)), 0)


# --------------------------------------------------- a torn last transaction


@pytest.mark.parametrize("cut", ["inside the commit frame", "inside an earlier frame"])
def test_a_log_cut_short_loses_only_the_torn_transaction(
    crashed: tuple[Path, list[int]], cut: str
) -> None:
    db, ends = crashed
    commits = commit_frames(db)
    last, previous = commits[-1], commits[-2]
    assert last - previous > 1  # the last transaction has several frames
    frame = last if cut == "inside the commit frame" else previous + 1
    os.truncate(wal_of(db), frame_at(frame) + 100)
    with SqliteSequencer(db) as seq:
        assert seq.stream_info("s").end_offset == ends[-2]


def test_damage_in_the_last_commit_frame_is_a_torn_write(
    crashed: tuple[Path, list[int]],
) -> None:
    """Nothing committed after it: as after a crash while the last commit was being
    written (that commit was never acknowledged), SQLite drops it, and so do we."""
    db, ends = crashed
    damage(db, frame_at(commit_frames(db)[-1]) + 24 + 9, flip(4))
    with SqliteSequencer(db) as seq:
        assert seq.stream_info("s").end_offset == ends[-2]


def test_damage_before_the_last_commit_frame_is_refused(
    crashed: tuple[Path, list[int]],
) -> None:
    """The last transaction's commit frame is intact after the damage: it was complete,
    so acknowledged (a crash leaves a transaction's frames cut short, in the order they
    were written)."""
    db, ends = crashed
    damage(db, frame_at(commit_frames(db)[-1] - 1) + 24 + 9, flip(4))
    assert sqlite_replays(db)[1] == ends[-2]
    with pytest.raises(CorruptDataError, match="1 transactions committed after it"):
        SqliteSequencer(db)


def test_frames_of_a_rolled_back_transaction_are_not_commits(tmp_path: Path) -> None:
    """A large transaction spills pages into the log before it commits; rolled back,
    those frames stay after the next, shorter commit, with the log's salts. They must
    not pass for commits lost to damage."""
    live = tmp_path / "live.db"
    seq = SqliteSequencer(live)
    ends = commit_all(seq, 5)
    raw = sqlite3.connect(live, isolation_level=None)
    raw.execute("PRAGMA cache_size = 5")
    raw.execute("BEGIN IMMEDIATE")
    raw.executemany("INSERT INTO meta VALUES (?, ?)", [(f"k{i}", "x" * 3000) for i in range(200)])
    raw.execute("ROLLBACK")
    raw.close()
    [after] = seq.commit("objects/after", [BatchToCommit("s", 0, 100, 5, 5, 2000)])
    image = tmp_path / "image"
    image.mkdir()
    shutil.copy(live, image / "meta.db")
    shutil.copy(wal_of(live), wal_of(image / "meta.db"))
    seq.close()
    db = image / "meta.db"
    scan = scan_wal(str(wal_of(db)))
    assert scan.frames > scan.replayed + 100  # the rolled-back frames are there
    assert (scan.replayed, scan.lost_commits) == (sqlite_replays(db)[0], 0)
    with SqliteSequencer(db) as seq:
        assert seq.stream_info("s").end_offset == after.base_offset + 5 > ends[-1]


# ---------------------------------------------- big-endian checksums


def to_big_endian(db: Path) -> None:
    """Rewrite the log with big-endian checksums (magic 0x377f0683), as a big-endian
    machine writes it: SQLite reads either."""
    data = bytearray(wal_of(db).read_bytes())
    data[0:4] = struct.pack(">I", 0x377F0683)
    seed = reference_checksum(bytes(data[:24]), (0, 0), True)
    data[24:32] = struct.pack(">2I", *seed)
    for i in range((len(data) - 32) // FRAME):
        start = frame_at(i)
        covered = bytes(data[start : start + 8] + data[start + 24 : start + FRAME])
        seed = reference_checksum(covered, seed, True)
        data[start + 16 : start + 24] = struct.pack(">2I", *seed)
    wal_of(db).write_bytes(bytes(data))


def test_big_endian_checksums(crashed: tuple[Path, list[int]]) -> None:
    db, ends = crashed
    to_big_endian(db)
    damaged = copy_of(db, "damaged")
    scan = scan_wal(str(wal_of(db)))
    assert scan.replayed == scan.frames == sqlite_replays(db)[0]
    with SqliteSequencer(db) as seq:
        assert seq.stream_info("s").end_offset == ends[-1]
    damage(damaged, frame_at(middle_commit(damaged) - 1) + 24 + 2000, flip(6))
    with pytest.raises(CorruptDataError, match="transactions committed after it"):
        SqliteSequencer(damaged)


# ---------------------------------------------------- a process killed


def commit_and_die(path: str, commits: int) -> None:
    """Commit, then die as a crash does: SIGKILL, nothing closed or flushed."""
    seq = SqliteSequencer(path)
    commit_all(seq, commits)
    os.kill(os.getpid(), signal.SIGKILL)


def killed_writer(directory: Path) -> Path:
    db = directory / "meta.db"
    child = SPAWN.Process(target=commit_and_die, args=(str(db), COMMITS))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert wal_of(db).stat().st_size > 0 and Path(f"{db}-shm").exists()
    return db


def test_a_killed_writers_log_is_checked_and_replayed(tmp_path: Path) -> None:
    db = killed_writer(tmp_path / "intact")
    damaged = killed_writer(tmp_path / "damaged")
    os.truncate(f"{db}-shm", 100)  # a -shm left behind, cut short: SQLite rebuilds it
    with SqliteSequencer(db) as seq:
        assert seq.stream_info("s").end_offset == 5 * COMMITS  # every acknowledged commit
    assert not wal_of(db).exists() and not Path(f"{db}-shm").exists()
    damage(damaged, frame_at(middle_commit(damaged) - 1) + 24 + 300, flip(5))
    with pytest.raises(CorruptDataError, match="transactions committed after it"):
        SqliteSequencer(damaged)
