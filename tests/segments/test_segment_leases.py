"""Leases of local logs (``leases/<name>.json`` and the index ``leases.json``): the files
as docs/format.md specifies them, one winner among processes, damage (a lost file
among it) reported and never overwritten, logs of earlier releases read. The rules
themselves run on every backend in the log contract (``LeaseContract``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import crc32c
import pytest
from lease_races import race

import disklesslog
from disklesslog import CorruptDataError


def _race_worker(directory: str, tag: int, barrier: Any, results: Any) -> None:
    """Try to take lease "leader" once, after every worker is ready; report the token
    won (0: refused)."""
    with disklesslog.open(directory, fsync="never") as log:
        barrier.wait(timeout=60)
        lease = log.acquire_lease("leader", f"worker-{tag}", 60_000)
        results.put((tag, 0 if lease is None else lease.token))


@pytest.mark.parametrize("round_no", range(3))
def test_one_of_four_processes_wins_the_lease(tmp_path: Path, round_no: int) -> None:
    disklesslog.open(tmp_path, fsync="never").close()
    winner = race(_race_worker, str(tmp_path))
    with disklesslog.open(tmp_path) as log:
        held = log.lease_holder("leader")
        assert held is not None and (held.holder, held.token) == (f"worker-{winner}", 1)


def _spec_json(raw: bytes) -> Any:
    """A checksummed JSON file read by docs/format.md section 2.10 alone."""
    body, trailer = raw[:-17], raw[-17:]
    assert trailer == b"#crc32c:%08x\n" % crc32c.crc32c(body)
    return json.loads(body)


def test_lease_file_layout(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path, fsync="never") as log:
        lease = log.acquire_lease("compaction.a", "host-1:42", 30_000)
        assert lease is not None
        path = tmp_path / "leases" / "compaction.a.json"
        assert _spec_json(path.read_bytes()) == {
            "version": 2,
            "lease": "compaction.a",
            "holder": "host-1:42",
            "token": 1,
            "serial": 1,
            "duration_ms": 30_000,
        }
        index = tmp_path / "leases.json"
        assert _spec_json(index.read_bytes()) == {
            "version": 1,
            "names": ["compaction.a"],
            "token_floor": 0,
        }
        log.renew_lease(lease)
        log.release_lease(lease)
        assert _spec_json(path.read_bytes()) == {
            "version": 2,
            "lease": "compaction.a",
            "holder": None,
            "token": 1,
            "serial": 3,
            "duration_ms": 30_000,
        }
        assert log.prune_leases(0) == ["compaction.a"]
    # above the pruned file's token (1) and serial (3)
    assert _spec_json(index.read_bytes()) == {"version": 1, "names": [], "token_floor": 3}
    assert sorted(p.name for p in (tmp_path / "leases").iterdir()) == [".lock"]
    assert not [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("compaction")]


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{not json",
        b'{"version": 1, "lease": "m", "holder": "a", "token": 1, "serial": 1, '
        b'"duration_ms": 1000}\n',  # no checksum
        "flip",  # a changed digit still parses: only the checksum catches it
        {"version": 3},
        {"version": True},
        {"lease": "other"},
        {"holder": 7},
        {"token": 0},
        {"serial": "2"},
        {"duration_ms": 1.5},
    ],
)
def test_damaged_lease_file_is_reported_and_kept(tmp_path: Path, damage: Any) -> None:
    from disklesslog.checksummed import encode_json

    with disklesslog.open(tmp_path, fsync="never") as log:
        lease = log.acquire_lease("m", "a", 12_345)
        assert lease is not None
        path = tmp_path / "leases" / "m.json"
        raw = path.read_bytes()
        if damage == "flip":
            damage = raw.replace(b"12345", b"12346")
        elif isinstance(damage, dict):
            content = {**_spec_json(raw), **damage}
            damage = encode_json(content)
        path.write_bytes(damage)
        for call in (
            lambda: log.lease_holder("m"),
            lambda: log.acquire_lease("m", "b", 1_000),
            lambda: log.renew_lease(lease),
            lambda: log.release_lease(lease),
        ):
            with pytest.raises(CorruptDataError) as info:
                call()
            assert info.value.source == str(path)
        assert path.read_bytes() == damage  # never overwritten
        assert log.acquire_lease("other", "b", 1_000) is not None  # other leases unaffected


def _two_leases(root: Path) -> disklesslog.Log:
    """A log holding lease "m" (released, token 2) and lease "n" (held, token 1)."""
    log = disklesslog.open(root, fsync="never")
    first = log.acquire_lease("m", "a", 60_000)
    assert first is not None
    log.release_lease(first)
    second = log.acquire_lease("m", "b", 60_000)
    assert second is not None and second.token == 2
    log.release_lease(second)
    assert log.acquire_lease("n", "a", 60_000) is not None
    return log


def test_deleted_lease_file_is_reported_not_given_out_again(tmp_path: Path) -> None:
    log = _two_leases(tmp_path)
    path = tmp_path / "leases" / "m.json"
    path.unlink()
    for call in (
        lambda: log.lease_holder("m"),
        lambda: log.acquire_lease("m", "c", 1_000),  # would hand token 1 out again
    ):
        with pytest.raises(CorruptDataError) as info:
            call()
        assert info.value.source == str(path)
        assert "missing" in info.value.reason
    assert not path.exists()
    assert log.lease_holder("n") is not None  # the other lease reads on
    assert log.lease_keeper().verify()[1][0].source == str(path)
    log.close()


def test_deleted_lease_index_is_reported(tmp_path: Path) -> None:
    log = _two_leases(tmp_path)
    index = tmp_path / "leases.json"
    index.unlink()
    with pytest.raises(CorruptDataError) as info:
        log.acquire_lease("other", "a", 1_000)
    assert info.value.source == str(index)
    assert not index.exists()
    count, damage = log.lease_keeper().verify()
    assert (count, [exc.source for exc in damage]) == (0, [str(index)])
    log.close()


def test_damaged_lease_index_is_reported_and_kept(tmp_path: Path) -> None:
    log = _two_leases(tmp_path)
    index = tmp_path / "leases.json"
    damage = index.read_bytes().replace(b'"m"', b'"x"')
    index.write_bytes(damage)
    with pytest.raises(CorruptDataError) as info:
        log.acquire_lease("other", "a", 1_000)
    assert info.value.source == str(index)
    assert index.read_bytes() == damage
    log.close()


def _version_1_file(root: Path, name: str, holder: str | None, token: int) -> None:
    """A lease file as releases before the index wrote it (and no index)."""
    from disklesslog.checksummed import encode_json

    (root / "leases").mkdir(exist_ok=True)
    content = {
        "version": 1,
        "lease": name,
        "holder": holder,
        "token": token,
        "serial": 4,
        "duration_ms": 60_000,
    }
    (root / "leases" / f"{name}.json").write_bytes(encode_json(content))
    (root / "leases" / f"{name}.lock").touch()


def test_lease_files_of_a_release_before_the_index_are_read_and_adopted(tmp_path: Path) -> None:
    disklesslog.open(tmp_path, fsync="never").close()
    _version_1_file(tmp_path, "old", None, 7)
    _version_1_file(tmp_path, "held", "a", 3)
    with disklesslog.open(tmp_path, fsync="never") as log:
        held = log.lease_holder("held")
        assert held is not None and (held.holder, held.token) == ("a", 3)
        assert log.lease_holder("never") is None  # no index: nothing is missing
        assert log.acquire_lease("new", "a", 1_000).token == 1  # type: ignore[union-attr]
        assert _spec_json((tmp_path / "leases.json").read_bytes())["names"] == [
            "held",
            "new",
            "old",
        ]
        taken = log.acquire_lease("old", "b", 1_000)
        assert taken is not None and taken.token == 8
        assert _spec_json((tmp_path / "leases" / "old.json").read_bytes())["version"] == 2
        log.release_lease(taken)
        assert log.prune_leases(0) == ["old"]  # "new" and "held" are held
        assert not (tmp_path / "leases" / "old.lock").exists()  # the old release's lock too
        (tmp_path / "leases" / "held.json").unlink()  # listed now: its loss is damage
        with pytest.raises(CorruptDataError):
            log.lease_holder("held")


def test_lease_file_not_yet_listed_is_adopted(tmp_path: Path) -> None:
    """A crash between writing a new lease's file and listing it leaves a file the
    index does not list: it is a lease like any other, listed at the next change."""
    log = _two_leases(tmp_path)
    index = tmp_path / "leases.json"
    from disklesslog.checksummed import encode_json

    index.write_bytes(encode_json({"version": 1, "names": ["m"], "token_floor": 0}))
    held = log.lease_holder("n")
    assert held is not None and held.token == 1
    assert log.lease_keeper().verify() == (2, [])
    assert log.acquire_lease("p", "a", 1_000) is not None
    assert _spec_json(index.read_bytes())["names"] == ["m", "n", "p"]
    log.close()


def test_pruned_name_starts_above_the_token_floor(tmp_path: Path) -> None:
    log = _two_leases(tmp_path)
    assert log.prune_leases(0) == ["m"]
    assert not (tmp_path / "leases" / "m.json").exists()
    assert log.lease_holder("m") is None  # pruned: not listed, no file, no damage
    again = log.acquire_lease("m", "a", 1_000)  # m had token 2, serial 4
    assert again is not None and again.token == 5
    log.close()
    with disklesslog.open(tmp_path, fsync="never") as reopened:  # the floor is stored
        assert reopened.acquire_lease("fresh", "a", 1_000).token == 5  # type: ignore[union-attr]


def test_a_swap_from_a_serial_read_before_pruning_misses_the_new_file(tmp_path: Path) -> None:
    """The sequencers' contract test of the same name, on the files: the floor in
    ``leases.json`` covers the pruned file's token and serial."""
    from disklesslog.leases import LeaseRecord
    from disklesslog.segments.leases import LeaseFiles

    disklesslog.open(tmp_path, fsync="never").close()
    files = LeaseFiles(tmp_path)
    assert files.swap_lease("m", 0, LeaseRecord("a", 1, 1, 1_000))
    assert files.swap_lease("m", 1, LeaseRecord(None, 1, 2, 1_000))
    assert not files.drop_lease("m", 1)
    assert files.drop_lease("m", 2)
    assert (files.lease_names(), files.lease_floor()) == ([], 2)
    assert not files.swap_lease("m", 0, LeaseRecord("b", 3, 1, 1_000))  # serial 1 again
    assert files.swap_lease("m", 0, LeaseRecord("b", 3, 3, 1_000))
    assert files.swap_lease("m", 3, LeaseRecord(None, 3, 4, 1_000))
    assert not files.swap_lease("m", 2, LeaseRecord("c", 2, 3, 1_000))  # read before the drop
    assert not files.drop_lease("m", 2)
    assert files.read_lease("m") == LeaseRecord(None, 3, 4, 1_000)
