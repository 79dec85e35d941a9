"""The compaction rules both backends share: which records survive, and how survivors
tile the rewritten offsets; checked against a plain reference model."""

from __future__ import annotations

import itertools
import random

import pytest

import disklesslog
from disklesslog.format import decode_batch
from disklesslog.maintenance.compaction import (
    KeyMap,
    dirty_ratio,
    encode_piece,
    payload_bytes,
    retile,
    survivors,
)
from disklesslog.records import RecordBatch


def batch(
    first: int, keys: list[bytes | None], values: list[bytes | None], ts: list[int]
) -> RecordBatch:
    n = len(keys)
    return RecordBatch(range(first, first + n), ts, keys, values, [()] * n)


def model(records: list[tuple[int, bytes | None, bytes | None, int]], horizon: int) -> list[int]:
    """Offsets a compaction keeps: the last record per key, without old tombstones."""
    last = {}
    for offset, key, _, _ in records:
        last[key] = offset
    return [
        offset
        for offset, key, value, ts in records
        if (key is None or last[key] == offset) and not (value is None and ts < horizon)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_survivors_match_the_reference_model(seed: int) -> None:
    rng = random.Random(seed)
    records = []
    for offset in range(rng.randint(1, 400)):
        key = rng.choice([b"a", b"b", b"c", b"d", b"e", None]) if rng.random() < 0.95 else None
        value = None if rng.random() < 0.2 else b"v%d" % offset
        records.append((offset, key, value, rng.randint(0, 1000)))
    batches, at = [], 0
    while at < len(records):
        size = rng.randint(1, 30)
        part = records[at : at + size]
        batches.append(batch(at, [r[1] for r in part], [r[2] for r in part], [r[3] for r in part]))
        at += size
    key_map = KeyMap()
    for b in batches:
        key_map.add(b)
    horizon = 500
    kept = [s for s in (survivors(b, key_map, horizon) for b in batches) if s is not None]
    assert [o for s in kept for o in s.offsets] == model(records, horizon)
    pieces = retile(0, len(records), kept, target_bytes=rng.choice([64, 1000, 1 << 20]))
    if not kept:
        assert pieces == []
        return
    assert pieces[0].base == 0 and pieces[-1].end == len(records)
    assert all(a.end == b.base for a, b in itertools.pairwise(pieces))  # they tile the range
    assert [o for p in pieces for o in p.records.offsets] == model(records, horizon)
    for piece in pieces:  # every piece encodes, and decodes to its records at its offsets
        encoded = encode_piece(piece, disklesslog.StreamConfig())
        assert encoded.span == piece.span
        _header, decoded = decode_batch(encoded.header + encoded.body, 0, piece.base)
        assert list(decoded.offsets) == list(piece.records.offsets)
        assert list(decoded.values) == list(piece.records.values)
        assert list(decoded.keys) == list(piece.records.keys)
        assert list(decoded.timestamps) == list(piece.records.timestamps)


def test_a_batch_that_keeps_everything_is_returned_as_is() -> None:
    b = batch(0, [b"a", b"b"], [b"1", b"2"], [5, 6])
    key_map = KeyMap()
    key_map.add(b)
    assert survivors(b, key_map, 0) is b
    assert not key_map.supersedes(b)


def test_tombstones_stay_until_the_horizon() -> None:
    b = batch(0, [b"a", b"b"], [None, None], [100, 900])
    key_map = KeyMap()
    key_map.add(b)
    kept = survivors(b, key_map, 500)
    assert kept is not None and list(kept.offsets) == [1]
    assert survivors(b, key_map, 1000) is None


def test_keys_the_map_does_not_know_survive() -> None:
    """Records of the clean part whose keys were not written again stay."""
    key_map = KeyMap()
    key_map.add(batch(10, [b"x"], [b"new"], [0]))
    old = batch(0, [b"x", b"y"], [b"old", b"keep"], [0, 0])
    kept = survivors(old, key_map, 0)
    assert kept is not None and list(kept.values) == [b"keep"]


def test_key_map_tracks_how_far_it_reached_and_when_it_is_full() -> None:
    key_map = KeyMap(max_keys=3)
    key_map.add(batch(0, [b"a", b"b"], [b"1", b"2"], [0, 0]))
    assert (key_map.reached, key_map.full) == (2, False)
    key_map.add(batch(2, [b"c", None], [b"3", b"4"], [0, 0]))
    assert (len(key_map), key_map.reached, key_map.full) == (3, 4, True)


def test_dirty_ratio() -> None:
    assert dirty_ratio(0, 0) == 0.0
    assert dirty_ratio(0, 10) == 1.0
    assert dirty_ratio(30, 10) == 0.25


def test_pieces_count_headers_toward_their_size() -> None:
    """Records with small values but large headers still make batches within the
    target size (headers count like keys and values)."""
    n = 40
    headers = [(("h", b"x" * 500),)] * n
    records = RecordBatch(range(n), [0] * n, [b"k%d" % i for i in range(n)], [b"v"] * n, headers)
    pieces = retile(0, n, [records], target_bytes=2048)
    assert len(pieces) >= n * 500 // 2048
    assert all(payload_bytes(p.records) <= 2048 or len(p.records) == 1 for p in pieces)
    assert [o for p in pieces for o in p.records.offsets] == list(range(n))
    assert payload_bytes(records) > n * 500
