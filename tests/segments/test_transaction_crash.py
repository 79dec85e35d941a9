"""Two-phase commits on local logs under real crashes: a child committing transactions
across four streams is SIGKILLed at random moments while a reader process watches.
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

import pytest
from workers import TXN_STREAMS, run_and_kill, txn_value

import disklesslog

WORKERS = Path(__file__).with_name("workers.py")


def _run_and_kill(directory: Path, rng: random.Random) -> list[int]:
    """Start a committing child, kill it after a random delay, return the transactions
    it acknowledged."""
    lines = run_and_kill(
        ["txn", str(directory), str(rng.randrange(1 << 30))], rng.uniform(0.02, 0.3)
    )
    return [int(line.split()[1]) for line in lines]


def _check(directory: Path, acked: list[int]) -> int:
    """Every stream holds transactions 0..n-1 in order, each exactly once (its 1-3
    records contiguous), with every acknowledged one among them."""
    counts = []
    with disklesslog.open(directory, fsync="always") as log:
        assert not (directory / "transactions" / "pending").exists() or not any(
            p.suffix == ".json" for p in (directory / "transactions" / "pending").iterdir()
        ), "opening the log did not finish the interrupted commit"
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
    committed = 0
    try:
        for _ in range(rounds):
            acked.extend(_run_and_kill(directory, rng))
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
    assert committed > rounds, "the children barely committed; the test proves little"
    print(
        f"{rounds} kills, {committed} transactions, {len(acked)} acknowledged; the reader "
        f"read {passes} times, {held} of them with a commit holding records back"
    )


def test_sigkill_while_committing(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, rounds=3, seed=11)


@pytest.mark.slow
def test_sigkill_while_committing_many_rounds(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, rounds=25, seed=12)
