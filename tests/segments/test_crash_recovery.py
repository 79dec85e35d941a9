"""Crash recovery for real: a child appending with fsync="always" is SIGKILLed; after
each kill, reopening must yield every acknowledged record exactly once, in order, and
never a corrupt one (SQLite's habit of testing crash recovery for real).

Every other round the kill comes at a random moment; in the others the child tears one
of its writes by construction (tests/kill_points.py: the append at a chosen ``writev``
writes part of its entry, as a kill inside the system call would, and waits for the
SIGKILL), so a torn tail is certain, and recovery must cut exactly that part.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path

import kill_points
import pytest
from workers import STREAM_CONFIG, matches, parse, run_and_kill

import disklesslog

MODES = ["append", "batch", "mixed", "writer", "large"]


def _run_and_kill(
    directory: Path, round_no: int, mode: str, rng: random.Random, tear: Path | None
) -> list[tuple]:
    """Start a child appending to ``directory``, kill it after a random delay (or, with
    ``tear``, once it has torn a write, reporting to that file), and return the
    acknowledgements it printed: (offset, count, round, first_seq)."""
    args = ["crash", str(directory), str(round_no), mode, str(rng.randrange(1 << 30))]
    if tear is None:
        lines = run_and_kill(args, rng.uniform(0.005, 0.25))
    else:
        tear.unlink(missing_ok=True)
        # Ten appends at least come first (two of the large ones: each writes megabytes).
        args += [str(tear), str(rng.randint(3, 8) if mode == "large" else rng.randint(11, 40))]
        lines = run_and_kill(args, 60, until=lambda: kill_points.read(tear).torn is not None)
    return [tuple(int(x) for x in line.split()[1:]) for line in lines]


def _check(directory: Path, acked: list[tuple]) -> int:
    """Every acknowledged record is present once at its offset; each round's records are
    a gap-free prefix of what it appended; nothing fails its checksum."""
    with disklesslog.open(directory, fsync="always") as log:
        records = list(log.stream("s").read())
        assert log.stream("s").end_offset == len(records)
    assert [r.offset for r in records] == list(range(len(records)))
    values = [r.value for r in records]
    assert len(set(values)) == len(values), "a record appears twice"
    next_seq: dict[int, int] = {}
    for v in values:
        round_no, seq = parse(v)
        assert seq == next_seq.get(round_no, 0), f"round {round_no}: gap or reorder at {seq}"
        next_seq[round_no] = seq + 1
        assert matches(v, round_no, seq)
    for offset, count, round_no, seq in acked:
        for i in range(count):
            assert matches(values[offset + i], round_no, seq + i), "acknowledged record lost"
    return len(records)


def _repairs(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The bytes of each torn tail recovery cut, as its warnings say."""
    found = [re.search(r"truncating (\d+) bytes", r.getMessage()) for r in caplog.records]
    return [int(match[1]) for match in found if match]


def _crash_rounds(tmp_path: Path, rounds: int, seed: int, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "log"
    with disklesslog.open(directory) as log:
        log.create_stream("s", **STREAM_CONFIG)
    acked: list[tuple] = []
    total_acks = torn_rounds = repaired = 0
    for round_no in range(rounds):
        mode = MODES[round_no % len(MODES)]
        # A writer flush may write several entries at once: a cut could fall between them.
        tear = tmp_path / "kill-points" if round_no % 2 and mode != "writer" else None
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="disklesslog"):
            new = _run_and_kill(directory, round_no, mode, rng, tear)
            total_acks += len(new)
            acked.extend(new)
            _check(directory, acked)
        repaired += len(_repairs(caplog))
        if tear is not None:
            torn = kill_points.read(tear).torn
            assert torn is not None and 0 < torn[0] < torn[1], torn
            assert _repairs(caplog) == [torn[0]], f"{mode}: tore {torn}, cut {_repairs(caplog)}"
            torn_rounds += 1
    segments = list((directory / "streams" / "s").glob("*.log"))
    # By construction (not by the machine's speed): torn rounds acknowledged ten or two.
    assert total_acks > rounds, "the children barely appended; the test proves little"
    assert len(segments) > 1, "no segment roll happened; use smaller segments"
    assert torn_rounds >= rounds // 3 and repaired >= torn_rounds, (torn_rounds, repaired)
    print(
        f"{rounds} kills, {total_acks} acknowledged appends, {len(segments)} segments, "
        f"{repaired} torn tails repaired ({torn_rounds} torn by construction)"
    )


def test_sigkill_while_appending(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _crash_rounds(tmp_path, rounds=10, seed=1, caplog=caplog)


@pytest.mark.slow
def test_sigkill_while_appending_many_rounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _crash_rounds(tmp_path, rounds=150, seed=2, caplog=caplog)


PAGE = 4096


@pytest.mark.parametrize("lost", ["middle", "last"])
def test_a_page_lost_after_the_recovery_point_is_cut_by_its_checksum(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, lost: str
) -> None:
    """After a power cut, a file can be as long as it was, with a page inside it that
    never reached the disk (zeros). Only the checksum tells such an entry from a good
    one: its length and framing are intact. A process that crashed after appending
    ``b``, ``c`` and ``d`` past its recovery point (after ``a``) has a page of ``c`` or
    of ``d`` zeroed: recovery must cut from that entry on and keep what precedes it,
    and the stream takes appends again. (The bit-flip test in test_torn_and_corrupt.py
    damages a header; this damages a body.)"""
    directory = tmp_path / "log"
    values = {name: name.encode() * (3 * PAGE) for name in "abcd"}  # each holds a whole page
    with disklesslog.open(directory, fsync="always") as log:
        log.create_stream("s").append(values["a"])
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: appends, then crashes before any sync
        code = 0
        try:
            log = disklesslog.open(directory, fsync="interval", fsync_interval_ms=3_600_000)
            for name in "bcd":
                log.stream("s").append(values[name])
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    (segment,) = (directory / "streams" / "s").glob("*.log")
    data = bytearray(segment.read_bytes())
    damaged = "c" if lost == "middle" else "d"
    start = data.index(values[damaged])
    page = start + PAGE - start % PAGE  # the first whole page inside the value
    data[page : page + PAGE] = bytes(PAGE)
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="disklesslog"), disklesslog.open(directory) as log:
        kept = [r.value for r in log.stream("s").read()]
        assert log.stream("s").append(b"after") == len(kept)
    expected = [values[name] for name in "ab"] + ([values["c"]] if lost == "last" else [])
    assert kept == expected
    (cut,) = _repairs(caplog)  # the damaged entry, with whatever followed it
    assert len(data) - start < cut < len(data) - start + 100, (cut, len(data) - start)
