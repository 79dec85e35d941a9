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


def test_a_drop_reaches_every_replica_and_checkpoints_keep_the_floor(tmp_path: Path) -> None:
    """Object-store sequencer: ``drop_lease`` is an entry every replica applies (the
    floor moves everywhere), and the floor survives in checkpoints (``lease_floor``)."""
    import fsspec

    from disklesslog.sequencers.objectstore import ObjectStoreSequencer
    from disklesslog.sequencers.objectstore_format import decode_checkpoint

    fs, root = fsspec.filesystem("file"), f"{tmp_path}/sequencer"
    with (
        ObjectStoreSequencer(fs, root, checkpoint_every=2) as first,
        ObjectStoreSequencer(fs, root, checkpoint_every=2) as second,
    ):
        for holder in ("a", "b", "c"):
            lease = first.acquire_lease("m", holder, 1_000)
            assert lease is not None
            first.release_lease(lease)
        assert first.prune_leases(0) == ["m"]
        assert (second.lease_names(), second.lease_floor()) == ([], 6)  # token 3, serial 6
        written = Path(first.write_checkpoint())
        again = second.acquire_lease("m", "d", 1_000)
        assert again is not None and again.token == 7
    entry = int(written.name[:20])
    state = decode_checkpoint(written.read_bytes(), entry, str(written)).state
    assert (state["leases"], state["lease_floor"]) == ([], 6)
    for path in (tmp_path / "sequencer" / "log").iterdir():  # only the checkpoint is left
        if int(path.name) <= entry:
            path.unlink()
    with ObjectStoreSequencer(fs, root) as reopened:
        assert reopened.lease_floor() == 6
        assert reopened.read_lease("m") is not None
        assert reopened.acquire_lease("n", "a", 1_000).token == 7  # type: ignore[union-attr]
