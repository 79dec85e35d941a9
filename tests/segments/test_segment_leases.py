"""Leases of local logs (``leases/<name>.json``): the file as docs/format.md specifies
it, one winner among processes, damage reported and never overwritten. The rules
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
            "version": 1,
            "lease": "compaction.a",
            "holder": "host-1:42",
            "token": 1,
            "serial": 1,
            "duration_ms": 30_000,
        }
        log.renew_lease(lease)
        log.release_lease(lease)
        assert _spec_json(path.read_bytes()) == {
            "version": 1,
            "lease": "compaction.a",
            "holder": None,
            "token": 1,
            "serial": 3,
            "duration_ms": 30_000,
        }
    assert sorted(p.name for p in (tmp_path / "leases").iterdir()) == [
        "compaction.a.json",
        "compaction.a.lock",
    ]
    assert not [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("compaction")]


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{not json",
        b'{"version": 1, "lease": "m", "holder": "a", "token": 1, "serial": 1, '
        b'"duration_ms": 1000}\n',  # no checksum
        "flip",  # a changed digit still parses: only the checksum catches it
        {"version": 2},
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
