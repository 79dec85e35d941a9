"""Leases of the sequencers that several processes share (SQLite, the object-store
sequencer on local files): of processes racing for one lease, exactly one wins. The
rules run on every sequencer in the contract (``SequencerContract``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lease_races import race

from disklesslog.sequencers import Sequencer


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
    winner = race(_race_worker, kind, str(tmp_path))
    with _open(kind, str(tmp_path)) as seq:
        held = seq.lease_holder("leader")
        assert held is not None and (held.holder, held.token) == (f"worker-{winner}", 1)
