"""Checking SQLite's write-ahead log (the ``-wal`` file) before SQLite replays it.

SQLite replays a write-ahead log left by a crash up to the first frame that fails its
checksum and treats everything after it as never written: right after a power loss
that is the last transaction, torn. If the frame was damaged instead, the transactions
committed after it are dropped in silence, and with them offsets that were
acknowledged (handed out again by the next commits), and garbage collection would then
delete their objects as never committed. Worse, a checkpoint may already have copied
some of those later frames into the database file, which SQLite would then read mixed
with older pages from the frames before the damage. So the sequencer checks a
write-ahead log that a crash left behind (:func:`check_wal`) before SQLite touches it.

The format is SQLite's, public (https://www.sqlite.org/fileformat2.html#walformat):
a 32-byte header (big-endian: magic ``0x377f0682`` or ``0x377f0683``, format version
3007000, page size, checkpoint sequence, salt-1, salt-2, checksum-1, checksum-2 over
the first 24 bytes), then frames of a 24-byte header (page number, for a commit frame
the database size in pages after the commit else 0, salt-1, salt-2, checksum-1,
checksum-2) and one page. The checksums are cumulative: a frame's covers the first 8
bytes of its header and its page, starting from the previous frame's (the first
frame's from the header's), summed as 32-bit words, little-endian words under the
magic ending in 2, big-endian under the one ending in 3. A frame belongs to the log
only if its salts equal the header's; SQLite replays frames while each belongs and
its checksum holds, and keeps them up to the last commit frame among them.

Each frame's checksum can also be checked from the checksum *stored* in the frame
before it, so damage is localized: a frame after the first bad one that belongs and
checks against its predecessor was written by SQLite, in this generation of the log,
after the bad one. If one of those is a commit frame, the transaction it ends was
complete when the bad frame was already written, so it was acknowledged: the log is
refused. A crash never leaves that: a process dies with the frames it wrote in the
order it wrote them, cut short, so only the last transaction can be incomplete, and
it was never acknowledged; a bad tail with no commit frame after it is that torn
transaction, and is accepted, as SQLite accepts it. (A power loss under
``synchronous=normal`` can leave a hole with commits after it: acknowledged commits
lost, refused all the same. Under ``synchronous=full`` the only false alarm would be
a power loss that wrote the last transaction's commit frame but not an earlier frame
of it: reported, never silent.) Frames left from an older generation of the log carry
other salts, and frames of a transaction rolled back after spilling into the log are
never commit frames: neither counts.

Checking is linear in the size of the log and done in Python, 1,024 frames at a
time: the checksums of a batch of frames are computed together, each frame in a
64-bit lane of one large integer, so the Python loop runs once per pair of words of a
page rather than once per pair per frame (about 0.1 s for a log of 8,000 pages of
4 KiB on one slow core; see docs/sequencers.md).
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import CorruptDataError

__all__ = ["WAL_FORMAT_VERSION", "WalScan", "check_wal", "frame_checksums", "scan_wal"]

log = logging.getLogger(__name__)

WAL_FORMAT_VERSION = 3007000
_MAGIC_LE = 0x377F0682  # checksum words little-endian
_MAGIC_BE = 0x377F0683  # checksum words big-endian
_HEADER = struct.Struct(">8I")
_FRAME_HEADER = struct.Struct(">6I")
_HEADER_SIZE = 32
_FRAME_HEADER_SIZE = 24
_PAGE_SIZES = tuple(1 << n for n in range(9, 17))  # 512 .. 65536
_CHUNK_FRAMES = 1024


@dataclass(frozen=True)
class WalScan:
    """What a write-ahead log holds, as SQLite would replay it and beyond.

    ``frames``: whole frames in the file (a partial last frame is a torn write, ignored
    as SQLite ignores it). ``replayed``: how many of them SQLite replays (up to the last
    commit frame before the first bad frame). ``first_bad``: index (from 0) of the first
    frame that does not belong or fails its checksum, None if none does, -1 if the
    header itself is invalid (SQLite then replays nothing). ``lost_commits``: commit
    frames after the first bad one (after the header, if that is invalid) that belong
    and check against their predecessor: transactions SQLite would drop.
    """

    path: str
    page_size: int | None
    frames: int
    replayed: int
    first_bad: int | None
    lost_commits: int

    @property
    def damaged(self) -> bool:
        return self.lost_commits > 0

    def position(self, frame: int) -> int:
        """Byte offset of frame ``frame`` (-1: the header) in the file."""
        if frame < 0 or self.page_size is None:
            return 0
        return _HEADER_SIZE + frame * (_FRAME_HEADER_SIZE + self.page_size)


def check_wal(path: str, *, page_size: int | None = None) -> WalScan:
    """Scan the write-ahead log at ``path`` (see :func:`scan_wal`) and raise
    :class:`~disklesslog.errors.CorruptDataError` naming it if SQLite would drop
    committed transactions; the files are left as they are. A torn last transaction is
    logged, not refused."""
    scan = scan_wal(path, page_size=page_size)
    if scan.damaged:
        where = (
            "the header is invalid"
            if scan.first_bad == -1
            else f"frame {scan.first_bad} is damaged"
        )
        raise CorruptDataError(
            f"{where}, and {scan.lost_commits} transactions committed after it follow: "
            "SQLite would stop replaying the write-ahead log there and forget them "
            "(acknowledged commits, whose offsets would be handed out again). Nothing was "
            "changed; see 'A damaged sequencer database' in docs/operations.md",
            source=path,
            position=scan.position(scan.first_bad if scan.first_bad is not None else 0),
        )
    if scan.first_bad is not None and scan.frames > scan.replayed:
        log.info(
            "%s: %d frames after the last commit belong to a transaction a crash cut "
            "short; SQLite discards them",
            path,
            scan.frames - scan.replayed,
        )
    return scan


def scan_wal(path: str, *, page_size: int | None = None) -> WalScan:
    """Read the write-ahead log at ``path`` and say what SQLite would replay and what it
    would drop. ``page_size`` (the database's) is used when the header is invalid."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = f.read(_HEADER_SIZE)
        if len(header) < _HEADER_SIZE:
            return WalScan(path, page_size, 0, 0, None, 0)
        magic, version, wal_page_size, _, salt1, salt2, ck1, ck2 = _HEADER.unpack(header)
        big_endian = magic == _MAGIC_BE
        valid = (
            magic in (_MAGIC_LE, _MAGIC_BE)
            and version == WAL_FORMAT_VERSION
            and wal_page_size in _PAGE_SIZES
            and frame_checksums(header[:24], 1, 24, [(0, 0)], big_endian, words=6)[0] == (ck1, ck2)
        )
        if valid:
            frames = _frames(f, size, wal_page_size, big_endian, (salt1, salt2), (ck1, ck2))
            return _summary(path, wal_page_size, frames)
        # SQLite replays nothing of a log whose header is invalid: every frame that
        # checks against its predecessor and commits is lost. Without a trustworthy
        # header, try each plausible page size and word order, and keep the worst.
        sizes = (
            (wal_page_size,)
            if wal_page_size in _PAGE_SIZES
            else (page_size,)
            if page_size in _PAGE_SIZES
            else _PAGE_SIZES
        )
        orders = (big_endian,) if magic in (_MAGIC_LE, _MAGIC_BE) else (False, True)
        worst = WalScan(path, None, 0, 0, -1, 0)
        for size_guess in sizes:
            for order in orders:
                f.seek(_HEADER_SIZE)
                frames = _frames(f, size, size_guess, order, None, (ck1, ck2))
                lost = sum(1 for ok, commit in frames if ok and commit)
                if worst.page_size is None or lost > worst.lost_commits:
                    worst = WalScan(path, size_guess, len(frames), 0, -1, lost)
        return worst


def _summary(path: str, page_size: int, frames: list[tuple[bool, bool]]) -> WalScan:
    first_bad = next((i for i, (ok, _) in enumerate(frames) if not ok), None)
    end = len(frames) if first_bad is None else first_bad
    replayed = next((i + 1 for i in range(end - 1, -1, -1) if frames[i][1]), 0)
    lost = 0 if first_bad is None else sum(1 for ok, commit in frames[first_bad:] if ok and commit)
    return WalScan(path, page_size, len(frames), replayed, first_bad, lost)


def _frames(
    f: BinaryIO,
    size: int,
    page_size: int,
    big_endian: bool,
    salts: tuple[int, int] | None,
    seed: tuple[int, int],
) -> list[tuple[bool, bool]]:
    """``(checks, is a commit frame)`` of every whole frame read from ``f`` (a binary
    file positioned after the header). A frame checks if its salts are ``salts`` (the
    first frame's when None), its page number is not 0, and its checksum follows from
    the one stored in the frame before it (``seed`` for the first frame)."""
    frame_size = _FRAME_HEADER_SIZE + page_size
    count = max(0, (size - _HEADER_SIZE) // frame_size)
    out: list[tuple[bool, bool]] = []
    previous = seed
    read = f.read
    while len(out) < count:
        n = min(_CHUNK_FRAMES, count - len(out))
        chunk = read(n * frame_size)
        n = len(chunk) // frame_size  # the file may have shrunk meanwhile
        if n == 0:
            break
        headers = [_FRAME_HEADER.unpack_from(chunk, i * frame_size) for i in range(n)]
        if salts is None:
            salts = (headers[0][2], headers[0][3])
        seeds = [previous] + [(h[4], h[5]) for h in headers[:-1]]
        sums = frame_checksums(chunk, n, frame_size, seeds, big_endian)
        for (page, commit, s1, s2, c1, c2), computed in zip(headers, sums):
            ok = page != 0 and (s1, s2) == salts and computed == (c1, c2)
            out.append((ok, commit != 0))
        previous = (headers[-1][4], headers[-1][5])
    return out


def frame_checksums(
    data: bytes,
    n: int,
    frame_size: int,
    seeds: list[tuple[int, int]],
    big_endian: bool,
    *,
    words: int | None = None,
) -> list[tuple[int, int]]:
    """SQLite's WAL checksum of each of ``n`` frames laid end to end in ``data`` (each
    ``frame_size`` bytes), frame ``i`` starting from ``seeds[i]``: over the first 8
    bytes of its header and its page (or, with ``words``, over its first ``words``
    32-bit words: the log header's checksum).

    The checksum runs over pairs of words ``(a, b)``: ``s0 += a + s1; s1 += b + s0``
    modulo 2**32. All frames advance together: word ``k`` of every frame is gathered
    into one integer, frame ``i`` in bits ``64 i`` to ``64 i + 63`` (a strided copy per
    byte of the word, in C), so one addition advances every frame; a sum of three
    32-bit words never carries out of its 64-bit lane, and the mask keeps each lane's
    low 32 bits."""
    if words is None:
        offsets = [0, 4, *range(_FRAME_HEADER_SIZE, frame_size, 4)]
    else:
        offsets = list(range(0, 4 * words, 4))
    order = (3, 2, 1, 0) if big_endian else (0, 1, 2, 3)
    lanes = struct.Struct(f"<{n}Q")
    mask = int.from_bytes(b"\xff\xff\xff\xff\0\0\0\0" * n, "little")
    s0 = int.from_bytes(lanes.pack(*(s[0] for s in seeds)), "little")
    s1 = int.from_bytes(lanes.pack(*(s[1] for s in seeds)), "little")
    span = n * frame_size
    gathered = bytearray(8 * n)
    columns = []
    for offset in offsets:
        for lane_byte, word_byte in enumerate(order):
            start = offset + word_byte
            gathered[lane_byte::8] = data[start:span:frame_size]
        columns.append(int.from_bytes(gathered, "little"))
    pairs = iter(columns)
    for a, b in zip(pairs, pairs):
        s0 = (s0 + a + s1) & mask
        s1 = (s1 + b + s0) & mask
    first = lanes.unpack(s0.to_bytes(8 * n, "little"))
    second = lanes.unpack(s1.to_bytes(8 * n, "little"))
    return list(zip(first, second))
