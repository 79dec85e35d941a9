"""Leases of the sequencers that several processes share (SQLite, the object-store
sequencer on local files): of processes racing for one lease, exactly one wins. The
rules run on every sequencer in the contract (``SequencerContract``)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from disklesslog.sequencers import Sequencer

SPAWN = multiprocessing.get_context("spawn")


def _open(kind: str, directory: str) -> Sequencer:
    if kind == "sqlite":
        from disklesslog.sequencers.sqlite import SqliteSequencer

        return SqliteSequencer(Path(directory) / "meta.db")
    import fsspec

    from disklesslog.sequencers.objectstore import ObjectStoreSequencer

    return ObjectStoreSequencer(fsspec.filesystem("file"), f"{directory}/sequencer")


def _race_worker(kind: str, directory: str, tag: int, barrier: Any, results: Any) -> None:
    """Take lease "leader" once every worker is ready; report the token won (0: refused)."""
    with _open(kind, directory) as seq:
        barrier.wait(timeout=60)
        lease = seq.acquire_lease("leader", f"worker-{tag}", 60_000)
        results.put((tag, 0 if lease is None else lease.token))


@pytest.mark.parametrize("kind", ["sqlite", "objectstore"])
def test_one_of_four_processes_wins_the_lease(tmp_path: Path, kind: str) -> None:
    _open(kind, str(tmp_path)).close()  # created before the race
    barrier = SPAWN.Barrier(4)
    results = SPAWN.Queue()
    workers = [
        SPAWN.Process(target=_race_worker, args=(kind, str(tmp_path), tag, barrier, results))
        for tag in range(4)
    ]
    for worker in workers:
        worker.start()
    outcomes = dict(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    winners = [tag for tag, token in outcomes.items() if token]
    assert len(winners) == 1 and outcomes[winners[0]] == 1, outcomes
    with _open(kind, str(tmp_path)) as seq:
        held = seq.lease_holder("leader")
        assert held is not None and (held.holder, held.token) == (f"worker-{winners[0]}", 1)
