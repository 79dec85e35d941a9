"""Two-phase commits on local logs under real crashes: a child committing transactions
across four streams is SIGKILLed while a reader process watches, every other time at a
random moment, the others at a random file call of a commit's appends (tests/kill_points.py).
The reader must never see a transaction in one stream and not in a later one (the
commit is all or nothing to readers); after each kill, opening the log finishes the
interrupted commit, so every stream holds the same transactions, each exactly once,
every acknowledged one included."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import kill_points
import pytest
from workers import TXN_STREAMS, run_and_kill, txn_value

import disklesslog

WORKERS = Path(__file__).with_name("workers.py")


def _run_and_kill(directory: Path, rng: random.Random, armed: Path | None) -> list[int]:
    """Start a committing child, kill it after a random delay (or, with ``armed``, at a
    random file call inside a commit, reported to that file), return the transactions
    it acknowledged."""
    args = ["txn", str(directory), str(rng.randrange(1 << 30))]
    if armed is None:
        lines = run_and_kill(args, rng.uniform(0.02, 0.3))
    else:
        armed.unlink(missing_ok=True)
        # A commit's appends make a few dozen file calls: the kill comes some commits in.
        args += [str(armed), str(rng.randint(200, 300))]
        lines = run_and_kill(args, 60, until=lambda: kill_points.read(armed).stopped_at is not None)
    return [int(line.split()[1]) for line in lines]


def _interrupted_commit(directory: Path) -> bool:
    """Whether a commit left its notes, to be finished by the next open."""
    pending = directory / "transactions" / "pending"
    return pending.exists() and any(p.suffix == ".json" for p in pending.iterdir())


def _check(directory: Path, acked: list[int]) -> int:
    """Every stream holds transactions 0..n-1 in order, each exactly once (its 1-3
    records contiguous), with every acknowledged one among them."""
    counts = []
    with disklesslog.open(directory, fsync="always") as log:
        assert not _interrupted_commit(directory), "opening the log did not finish the commit"
        for name in TXN_STREAMS:
            values = [r.value for r in log.stream(name).read()]
            order = list(dict.fromkeys(values))  # distinct, in first-seen order
            assert order == [txn_value(k) for k in range(len(order))], name
            runs = sum(1 for i, v in enumerate(values) if i == 0 or values[i - 1] != v)
            assert runs == len(order), f"{name}: a transaction's records are split or repeated"
            counts.append(len(order))
    assert len(set(counts)) == 1, f"streams disagree on the transactions: {counts}"
    assert all(k < counts[0] for k in acked), "an acknowledged transaction was lost"
    return counts[0]


def _crash_rounds(tmp_path: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "log"
    with disklesslog.open(directory) as log:
        for name in TXN_STREAMS:
            log.create_stream(name)
    reader = subprocess.Popen(
        [sys.executable, str(WORKERS), "txn-reader", str(directory), "3600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    acked: list[int] = []
    committed = interrupted = 0
    try:
        for round_no in range(rounds):
            armed = tmp_path / "kill-points" if round_no % 2 else None
            acked.extend(_run_and_kill(directory, rng, armed))
            interrupted += armed is not None and _interrupted_commit(directory)
            committed = _check(directory, acked)
            if reader.poll() is not None:  # it found a breach (or crashed)
                break
    finally:
        if reader.poll() is None:
            reader.send_signal(signal.SIGTERM)
        out, _ = reader.communicate()
    assert "breach" not in out, out
    assert reader.returncode == 0 and out.startswith("passes"), f"the reader stopped: {out}"
    passes, held = int(out.split()[1]), int(out.split()[3])
    assert passes > rounds, f"the reader barely read ({passes} passes); the test proves little"
    # By construction (not by the machine's speed): each armed round committed twice.
    assert committed >= 2 * (rounds // 2), "the children barely committed; the test proves little"
    armed_rounds = rounds // 2
    assert interrupted >= max(1, armed_rounds // 2), f"{interrupted} of {armed_rounds} commits"
    print(
        f"{rounds} kills, {committed} transactions, {len(acked)} acknowledged; the reader "
        f"read {passes} times, {held} of them with a commit holding records back"
    )


def test_sigkill_while_committing(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, rounds=4, seed=11)


@pytest.mark.slow
def test_sigkill_while_committing_many_rounds(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, rounds=25, seed=12)
