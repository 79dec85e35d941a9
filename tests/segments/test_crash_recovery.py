"""Crash recovery for real: a child appending with fsync="always" is SIGKILLed at random
moments; after each kill, reopening must yield every acknowledged record exactly once,
in order, and never a corrupt one (SQLite's habit of testing crash recovery for real).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from workers import STREAM_CONFIG, matches, parse, run_and_kill

import disklesslog

MODES = ["append", "batch", "mixed", "writer", "large"]


def _run_and_kill(directory: Path, round_no: int, mode: str, rng: random.Random) -> list[tuple]:
    """Start a child appending to ``directory``, kill it after a random delay, and return
    the acknowledgements it printed: (offset, count, round, first_seq)."""
    args = ["crash", str(directory), str(round_no), mode, str(rng.randrange(1 << 30))]
    lines = run_and_kill(args, rng.uniform(0.005, 0.25))
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


def _crash_rounds(tmp_path: Path, rounds: int, seed: int, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "log"
    with disklesslog.open(directory) as log:
        log.create_stream("s", **STREAM_CONFIG)
    acked: list[tuple] = []
    total_acks = 0
    for round_no in range(rounds):
        mode = MODES[round_no % len(MODES)]
        new = _run_and_kill(directory, round_no, mode, rng)
        total_acks += len(new)
        acked.extend(new)
        _check(directory, acked)
    segments = list((directory / "streams" / "s").glob("*.log"))
    assert total_acks > rounds, "the children barely appended; the test proves little"
    assert len(segments) > 1, "no segment roll happened; use smaller segments"
    repairs = [r.getMessage() for r in caplog.records if "truncating" in r.getMessage()]
    print(
        f"{rounds} kills, {total_acks} acknowledged appends, {len(segments)} segments, "
        f"{len(repairs)} torn tails repaired"
    )


def test_sigkill_while_appending(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _crash_rounds(tmp_path, rounds=10, seed=1, caplog=caplog)


@pytest.mark.slow
def test_sigkill_while_appending_many_rounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _crash_rounds(tmp_path, rounds=150, seed=2, caplog=caplog)
