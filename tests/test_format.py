"""Unit tests of disklesslog.format: the batch encoder and decoder.

The decoder is the last line of defence against damaged bytes, so most tests here
craft batches by hand (header + valid CRC around a chosen body) to reach each
validation rule directly, and check that every rule raises the documented typed error.
"""

from __future__ import annotations

import os
import random
import struct
import tracemalloc
from typing import Any

import crc32c as crc32c_package
import msgpack
import pytest
import zstandard

from disklesslog import format as fmt
from disklesslog.errors import (
    ConfigError,
    CorruptDataError,
    DisklessLogError,
    IncompleteBatchError,
    InvalidRecordError,
    RecordTooLarge,
)
from disklesslog.format import (
    HEADER_SIZE,
    BatchHeader,
    EncodedBatch,
    batch_size,
    check_batch,
    check_record,
    compression_code,
    crc32c,
    decode_batch,
    decode_unless_dense,
    encode_batch,
    encode_record,
    now_ms,
)
from disklesslog.records import Record, RecordBatch, clip_offsets, limit_records

TS = 1_700_000_000_000
PREFIX = struct.Struct("<IBI")
TAIL = struct.Struct("<HIIqqqhiI")


# --------------------------------------------------------------------------- helpers


def decode(data: bytes, base: int = 0, **kwargs: Any) -> list[Record]:
    """Decode one batch at position 0 into records."""
    return decode_batch(data, 0, base, **kwargs)[1].to_pylist()


def craft(
    body: Any = None,
    *,
    raw: bytes | None = None,
    attributes: int = 0,
    count: int = 1,
    last: int | None = None,
    base_ts: int = TS,
    max_ts: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    body_size: int | None = None,
) -> bytes:
    """Build a batch by hand with a *valid* CRC around any body, so the structural
    checks behind the CRC can be reached."""
    stored = raw if raw is not None else msgpack.packb(body, use_bin_type=True)
    tail = TAIL.pack(
        attributes,
        count,
        count - 1 if last is None else last,
        base_ts,
        base_ts if max_ts is None else max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        len(stored) if body_size is None else body_size,
    )
    crc = crc32c_package.crc32c(tail + stored)
    return PREFIX.pack(len(tail) + len(stored) + 5, 1, crc) + tail + stored


def reseal(data: bytes) -> bytes:
    """Recompute the CRC of an edited batch, so only the edit itself is wrong."""
    return data[:5] + struct.pack("<I", crc32c_package.crc32c(data[9:])) + data[9:]


def header_of(data: bytes) -> BatchHeader:
    return check_batch(data, 0)


# --------------------------------------------------------------------------- basics


def test_crc32c_is_castagnoli() -> None:
    """Known CRC-32C check values, and chaining, so nobody swaps in zlib.crc32."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283
    assert crc32c(memoryview(b"123456789")) == 0xE3069283


def test_header_constants() -> None:
    assert HEADER_SIZE == 53
    assert fmt.PREFIX_SIZE == 9
    assert fmt.TAIL.size == 44
    assert fmt.MAGIC == 1


def test_compression_code() -> None:
    assert compression_code("none") == 0
    assert compression_code("zstd") == 1
    assert compression_code(0) == 0
    assert compression_code(1) == 1
    for bad in ("gzip", "", 2, -1, None, 1.0):
        with pytest.raises(ConfigError, match="unknown compression"):
            compression_code(bad)  # type: ignore[arg-type]


def test_now_ms_is_wall_clock_milliseconds() -> None:
    import time

    assert abs(now_ms() - time.time() * 1000) < 5_000


def test_error_hierarchy() -> None:
    """Callers can catch builtin categories as well as the library's errors."""
    assert issubclass(InvalidRecordError, TypeError)
    assert issubclass(RecordTooLarge, ValueError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(IncompleteBatchError, CorruptDataError)
    for cls in (InvalidRecordError, RecordTooLarge, ConfigError, CorruptDataError):
        assert issubclass(cls, DisklessLogError)


# --------------------------------------------------------------------- round trips


def test_values_round_trip_including_none_empty_and_bytearray() -> None:
    values = [b"a", b"", None, bytearray(b"xy"), bytes(range(256)), b"\x00" * 1000]
    records = decode(encode_batch(values, timestamps=TS).data, base=10)
    assert [r.value for r in records] == [b"a", b"", None, b"xy", bytes(range(256)), b"\0" * 1000]
    assert all(type(r.value) in (bytes, type(None)) for r in records)
    assert [r.offset for r in records] == list(range(10, 16))
    assert [r.key for r in records] == [None] * 6
    assert [r.headers for r in records] == [()] * 6


def test_keys_round_trip() -> None:
    keys = [b"k", None, b"", bytearray(b"ba")]
    records = decode(encode_batch([b"1", b"2", b"3", b"4"], keys=keys, timestamps=TS).data)
    assert [r.key for r in records] == [b"k", None, b"", b"ba"]


def test_all_null_keys_are_stored_as_a_nil_column() -> None:
    with_nones = encode_batch([b"a", b"b"], keys=[None, None], timestamps=TS).data
    without = encode_batch([b"a", b"b"], timestamps=TS).data
    assert with_nones == without
    assert msgpack.unpackb(with_nones[HEADER_SIZE:])[2] is None


def test_headers_as_dicts_and_pairs_round_trip() -> None:
    headers = [
        {"a": b"1", "b": None},
        [("dup", b"x"), ("dup", b"y"), ("n", None)],
        None,
        {},
        [],
        (("é", b""),),
        [["list-pair", b"v"]],
    ]
    records = decode(encode_batch([b"v"] * 7, headers=headers, timestamps=TS).data)
    assert [r.headers for r in records] == [
        (("a", b"1"), ("b", None)),
        (("dup", b"x"), ("dup", b"y"), ("n", None)),
        (),
        (),
        (),
        (("é", b""),),
        (("list-pair", b"v"),),
    ]


def test_header_values_may_be_bytearray() -> None:
    (record,) = decode(encode_batch([b"v"], headers=[{"h": bytearray(b"z")}], timestamps=1).data)
    assert record.headers == (("h", b"z"),)
    assert type(record.headers[0][1]) is bytes


def test_empty_headers_everywhere_give_a_nil_column() -> None:
    data = encode_batch([b"a", b"b"], headers=[{}, None], timestamps=TS).data
    assert data == encode_batch([b"a", b"b"], timestamps=TS).data
    assert msgpack.unpackb(data[HEADER_SIZE:])[4] is None


def test_per_record_timestamps_round_trip() -> None:
    timestamps = [TS + 5, TS, TS + 100, 0, TS + 5]
    batch = encode_batch([b"x"] * 5, timestamps=timestamps)
    header = header_of(batch.data)
    assert header.base_timestamp == TS + 5  # the first record's, so the first delta is 0
    assert header.max_timestamp == TS + 100 == batch.max_timestamp
    assert [r.timestamp for r in decode(batch.data)] == timestamps
    assert msgpack.unpackb(batch.data[HEADER_SIZE:])[1][0] == 0


def test_uniform_timestamps_are_stored_once() -> None:
    per_record = encode_batch([b"x", b"y"], timestamps=[TS, TS]).data
    single = encode_batch([b"x", b"y"], timestamps=TS).data
    assert per_record == single
    assert msgpack.unpackb(single[HEADER_SIZE:])[1] is None
    assert [r.timestamp for r in decode(single)] == [TS, TS]


def test_timestamp_extremes() -> None:
    top = (1 << 63) - 1
    assert [r.timestamp for r in decode(encode_batch([b"a", b"b"], timestamps=[0, top]).data)] == [
        0,
        top,
    ]
    assert decode(encode_batch([b"a"], timestamps=top).data)[0].timestamp == top
    assert decode(encode_batch([b"a"], timestamps=0).data)[0].timestamp == 0


def test_default_timestamp_is_now() -> None:
    before = now_ms()
    batch = encode_batch([b"a", b"b"])
    record = encode_record(b"a")
    after = now_ms()
    assert before <= batch.max_timestamp <= after
    assert before <= record.max_timestamp <= after
    assert {r.timestamp for r in decode(batch.data)} == {batch.max_timestamp}


def test_producer_fields_round_trip() -> None:
    batch = encode_batch(
        [b"a", b"b"],
        timestamps=TS,
        producer_id=(1 << 63) - 1,
        producer_epoch=32767,
        base_sequence=(1 << 31) - 1,
    )
    header = header_of(batch.data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        (1 << 63) - 1,
        32767,
        (1 << 31) - 1,
    )
    default = header_of(encode_batch([b"a"], timestamps=TS).data)
    assert (default.producer_id, default.producer_epoch, default.base_sequence) == (-1, -1, -1)


def test_offset_deltas_with_gaps() -> None:
    batch = encode_batch([b"a", b"b", b"c"], timestamps=TS, offset_deltas=[0, 3, 7])
    assert batch.last_offset_delta == 7
    assert batch.span == 8
    assert batch.record_count == 3
    header, records = decode_batch(batch.data, 0, 100)
    assert header.last_offset_delta == 7 and header.span == 8
    assert list(records.offsets) == [100, 103, 107]


def test_offset_deltas_with_a_larger_last_offset_delta() -> None:
    """Compaction can drop the last record of a batch but must keep its span."""
    batch = encode_batch([b"a", b"b"], timestamps=TS, offset_deltas=[1, 4], last_offset_delta=9)
    assert batch.span == 10
    assert [r.offset for r in decode(batch.data, base=50)] == [51, 54]


def test_dense_offset_deltas_are_not_stored() -> None:
    explicit = encode_batch([b"a", b"b"], timestamps=TS, offset_deltas=[0, 1]).data
    assert explicit == encode_batch([b"a", b"b"], timestamps=TS).data
    assert msgpack.unpackb(explicit[HEADER_SIZE:])[0] is None
    assert isinstance(decode_batch(explicit, 0, 7)[1].offsets, range)


def test_last_offset_delta_without_offset_deltas() -> None:
    batch = encode_batch([b"a", b"b"], timestamps=TS, last_offset_delta=5)
    assert batch.span == 6
    assert msgpack.unpackb(batch.data[HEADER_SIZE:])[0] == [0, 1]
    assert [r.offset for r in decode(batch.data, base=3)] == [3, 4]


def test_zstd_compresses_and_round_trips() -> None:
    values = [b"the same words again and again " * 20 for _ in range(50)]
    keys = [b"key-%d" % i for i in range(50)]
    plain = encode_batch(values, keys=keys, timestamps=TS)
    packed = encode_batch(values, keys=keys, timestamps=TS, compression="zstd")
    header = header_of(packed.data)
    assert header.compression == 1 and header.attributes == 1
    assert len(packed.data) < len(plain.data) // 4
    assert header.body_size == len(plain.data) - HEADER_SIZE  # always the raw size
    assert zstandard.frame_content_size(packed.data[HEADER_SIZE:]) == header.body_size
    assert decode(packed.data) == decode(plain.data)
    assert encode_batch(values, keys=keys, timestamps=TS, compression=1).data == packed.data


def test_incompressible_data_is_stored_raw() -> None:
    rng = random.Random(7)
    values = [rng.randbytes(200) for _ in range(5)]
    data = encode_batch(values, timestamps=TS, compression="zstd").data
    header = header_of(data)
    assert header.compression == 0
    assert header.body_size == len(data) - HEADER_SIZE
    assert data == encode_batch(values, timestamps=TS).data
    assert [r.value for r in decode(data)] == values


def test_tiny_batches_stay_uncompressed() -> None:
    assert header_of(encode_record(b"x", timestamp=1, compression="zstd").data).compression == 0


def test_compression_none_by_name_and_code() -> None:
    by_name = encode_batch([b"a" * 100], timestamps=TS, compression="none").data
    assert by_name == encode_batch([b"a" * 100], timestamps=TS, compression=0).data
    assert header_of(by_name).compression == 0


@pytest.mark.parametrize("compression", ["gzip", "ZSTD", 2, 7, -1, None])
def test_unknown_compression_is_a_config_error(compression: Any) -> None:
    with pytest.raises(ConfigError, match="unknown compression"):
        encode_batch([b"x"], timestamps=TS, compression=compression)
    with pytest.raises(ConfigError, match="unknown compression"):
        encode_record(b"x", timestamp=TS, compression=compression)


def test_values_may_be_any_iterable() -> None:
    batch = encode_batch((v for v in [b"a", b"b"]), keys=iter([b"k", None]), timestamps=TS)
    assert [(r.key, r.value) for r in decode(batch.data)] == [(b"k", b"a"), (None, b"b")]


def test_encoded_batch_facts_match_the_header() -> None:
    batch = encode_batch([b"a", b"b", b"c"], timestamps=[3, 9, 1])
    assert isinstance(batch, EncodedBatch)
    header = header_of(batch.data)
    assert header.size == len(batch.data) == batch_size(batch.data)
    assert (batch.record_count, batch.last_offset_delta, batch.max_timestamp) == (3, 2, 9)
    assert (header.record_count, header.last_offset_delta, header.max_timestamp) == (3, 2, 9)


def test_random_batches_round_trip() -> None:
    rng = random.Random(1234)
    for _ in range(200):
        n = rng.randint(1, 20)
        values = [rng.choice([None, b"", rng.randbytes(rng.randint(0, 50))]) for _ in range(n)]
        keys = (
            [rng.choice([None, rng.randbytes(4)]) for _ in range(n)] if rng.random() < 0.5 else None
        )
        headers = (
            [rng.choice([None, {}, [("a", b"1"), ("a", None)], {"x": b"y" * 3}]) for _ in range(n)]
            if rng.random() < 0.5
            else None
        )
        timestamps = [rng.randint(0, 1 << 45) for _ in range(n)] if rng.random() < 0.5 else TS
        deltas = sorted(rng.sample(range(3 * n), n)) if rng.random() < 0.3 else None
        compression = rng.choice(["none", "zstd"])
        batch = encode_batch(
            values, keys, headers, timestamps, compression=compression, offset_deltas=deltas
        )
        base = rng.randint(0, 1 << 40)
        records = decode(batch.data, base=base)
        expected_headers = [
            tuple(h.items()) if isinstance(h, dict) else tuple(h or ())
            for h in (headers or [None] * n)
        ]
        expected_ts = timestamps if isinstance(timestamps, list) else [TS] * n
        expected_offsets = [base + d for d in (deltas or range(n))]
        assert [r.value for r in records] == values
        assert [r.key for r in records] == (keys or [None] * n)
        assert [r.headers for r in records] == expected_headers
        assert [r.timestamp for r in records] == expected_ts
        assert [r.offset for r in records] == expected_offsets


# ------------------------------------------------------------------- encode_record


@pytest.mark.parametrize(
    ("value", "key", "headers"),
    [
        (b"v", None, None),
        (b"v", b"k", None),
        (None, b"k", None),
        (b"", b"", None),
        (bytearray(b"ba"), bytearray(b"kk"), None),
        (b"v", None, {"a": b"1", "b": None}),
        (b"v", b"k", [("dup", b"1"), ("dup", b"2")]),
        (b"v", None, {}),
        (b"v", None, []),
        (b"word " * 100, b"k", {"h": b"x"}),
    ],
)
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_encode_record_matches_encode_batch(
    value: Any, key: Any, headers: Any, compression: str
) -> None:
    one = encode_record(value, key, headers, TS, compression=compression)
    many = encode_batch(
        [value],
        None if key is None else [key],
        None if headers is None else [headers],
        TS,
        compression=compression,
    )
    assert one == many
    assert one.data == encode_batch([value], [key], [headers], [TS], compression=compression).data
    (record,) = decode(one.data, base=5)
    assert record == (
        5,
        TS,
        None if key is None else bytes(key),
        None if value is None else bytes(value),
        tuple(headers.items()) if isinstance(headers, dict) else tuple(headers or ()),
    )


def test_check_record_returns_normalized_headers_size_and_timestamp() -> None:
    headers, size, ts = check_record(b"abc", b"k", {"é": b"12"}, 42)
    assert headers == (("é", b"12"),)
    assert size == 3 + 1 + 2 + 2  # the UTF-8 header key counts its bytes
    assert ts == 42
    assert check_record(b"x")[0] is None
    before = now_ms()
    assert before <= check_record(b"x")[2] <= now_ms()


# -------------------------------------------------------------------------- limits


def test_max_record_bytes_is_key_plus_value_plus_headers() -> None:
    """value 4 + key 3 + header key "ab" 2 + header value 1 = 10 bytes."""
    args: dict[str, Any] = {"keys": [b"key"], "headers": [{"ab": b"x"}], "timestamps": TS}
    encode_batch([b"valu"], max_record_bytes=10, **args)
    with pytest.raises(RecordTooLarge, match=r"record 0 is 10 bytes .* max_record_bytes=9"):
        encode_batch([b"valu"], max_record_bytes=9, **args)
    encode_record(b"valu", b"key", {"ab": b"x"}, TS, max_record_bytes=10)
    with pytest.raises(RecordTooLarge, match=r"record is 10 bytes .* max_record_bytes=9"):
        encode_record(b"valu", b"key", {"ab": b"x"}, TS, max_record_bytes=9)


def test_max_record_bytes_names_the_record_over_the_limit() -> None:
    """Column maxima from different records may exceed the limit; the exact check
    must still accept the batch when no single record does."""
    values = [b"x" * 8, b"", b"y" * 3]
    keys = [None, b"k" * 8, b"z" * 6]
    encode_batch(values, keys=keys, timestamps=TS, max_record_bytes=9)
    with pytest.raises(RecordTooLarge, match="record 2 is 9 bytes"):
        encode_batch(values, keys=keys, timestamps=TS, max_record_bytes=8)


def test_max_record_bytes_counts_utf8_header_keys() -> None:
    encode_record(b"", headers={"é": None}, timestamp=TS, max_record_bytes=2)
    with pytest.raises(RecordTooLarge):
        encode_record(b"", headers={"é": None}, timestamp=TS, max_record_bytes=1)


def test_max_batch_bytes_is_checked_before_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("the body was packed before the size check")

    monkeypatch.setattr(fmt.msgpack, "packb", refuse)
    with pytest.raises(RecordTooLarge, match=r"needs at least \d+ bytes, over max_batch_bytes"):
        encode_batch([b"x" * 600] * 2, timestamps=TS, max_batch_bytes=1024)


def test_max_batch_bytes_is_checked_after_packing_too() -> None:
    """msgpack overhead can push a batch over the limit its payload alone fits in."""
    values = [b""] * 100
    size = len(encode_batch(values, timestamps=TS).data)
    encode_batch(values, timestamps=TS, max_batch_bytes=size)
    with pytest.raises(RecordTooLarge, match=f"encodes to {size} bytes"):
        encode_batch(values, timestamps=TS, max_batch_bytes=size - 1)


def test_max_batch_bytes_applies_to_the_uncompressed_size() -> None:
    values = [b"a" * 1000] * 10
    size = len(encode_batch(values, timestamps=TS).data)
    packed = encode_batch(values, timestamps=TS, compression="zstd", max_batch_bytes=size)
    assert len(packed.data) < 200
    with pytest.raises(RecordTooLarge):
        encode_batch(values, timestamps=TS, compression="zstd", max_batch_bytes=size - 1)


@pytest.mark.parametrize("limit", [0, 53, -1, 1 << 31, 1 << 40])
def test_bad_max_batch_bytes_is_a_config_error(limit: int) -> None:
    with pytest.raises(ConfigError, match=r"max_batch_bytes must be an int in 54\.\."):
        encode_batch([b"x"], timestamps=TS, max_batch_bytes=limit)
    with pytest.raises(ConfigError, match=r"max_batch_bytes must be an int in 54\.\."):
        encode_record(b"x", timestamp=TS, max_batch_bytes=limit)


@pytest.mark.parametrize("limit", [0, -1, 1.5, "1"])
def test_bad_max_record_bytes_is_a_config_error(limit: object) -> None:
    with pytest.raises(ConfigError, match="max_record_bytes"):
        encode_batch([b"x"], timestamps=TS, max_record_bytes=limit)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_record_bytes"):
        encode_record(b"x", timestamp=TS, max_record_bytes=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "producer",
    [
        {"producer_id": -2},
        {"producer_id": 1 << 63},
        {"producer_epoch": 1 << 15},
        {"base_sequence": 1 << 31},
        {"base_sequence": 1.0},
    ],
)
def test_producer_fields_out_of_range(producer: dict) -> None:
    with pytest.raises(InvalidRecordError, match=next(iter(producer))):
        encode_batch([b"x"], timestamps=TS, **producer)


def test_offset_deltas_from_any_iterable_and_int_last_delta() -> None:
    from_iter = encode_batch([b"a", b"b"], timestamps=TS, offset_deltas=iter([0, 3]))
    from_list = encode_batch([b"a", b"b"], timestamps=TS, offset_deltas=[0, 3])
    assert from_iter == from_list
    with pytest.raises(InvalidRecordError, match="last_offset_delta"):
        encode_batch([b"a"], timestamps=TS, last_offset_delta=2.0)  # type: ignore[arg-type]


def test_smallest_and_largest_max_batch_bytes_are_accepted() -> None:
    with pytest.raises(RecordTooLarge):  # valid setting, but no batch is that small
        encode_batch([b"x"], timestamps=TS, max_batch_bytes=54)
    encode_batch([b"x"], timestamps=TS, max_batch_bytes=(1 << 31) - 1)


# --------------------------------------------------------------------- type errors


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("text", r"value must be bytes, bytearray or None, not str \(encode text first"),
        (5, "value must be bytes, bytearray or None, not int"),
        ([b"x"], "value must be bytes, bytearray or None, not list"),
        (True, "value must be bytes, bytearray or None, not bool"),
        (memoryview(b"x"), "not memoryview"),
        (1.5, "not float"),
    ],
)
def test_bad_value_types(value: Any, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch([b"ok", value], timestamps=TS)
    with pytest.raises(InvalidRecordError, match=message):
        encode_record(value, timestamp=TS)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("text", r"key must be bytes, bytearray or None, not str \(encode text first"),
        (7, "key must be bytes, bytearray or None, not int"),
    ],
)
def test_bad_key_types(key: Any, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch([b"a", b"b"], keys=[None, key], timestamps=TS)
    with pytest.raises(InvalidRecordError, match=message):
        encode_record(b"a", key, timestamp=TS)


@pytest.mark.parametrize(
    ("timestamp", "message"),
    [
        (True, "timestamp must be an int .* not bool"),
        (1.0, "timestamp must be an int .* not float"),
        ("1", "timestamp must be an int .* not str"),
        (-1, "outside 0..2"),
        (1 << 63, "outside 0..2"),
    ],
)
def test_bad_single_timestamps(timestamp: Any, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch([b"a"], timestamps=timestamp)
    with pytest.raises(InvalidRecordError, match=message):
        encode_record(b"a", timestamp=timestamp)


@pytest.mark.parametrize(
    ("timestamps", "message"),
    [
        ([1, True], "not bool"),
        ([1, 2.0], "not float"),
        ([1, -1], "within 0..2"),
        ([1, 1 << 63], "within 0..2"),
        ([1], "timestamps has 1 entries for 2 records"),
        ([1, 2, 3], "timestamps has 3 entries for 2 records"),
        (b"ab", "not bytes"),
    ],
)
def test_bad_timestamp_lists(timestamps: Any, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch([b"a", b"b"], timestamps=timestamps)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({b"bytes-key": b"v"}, "header key must be str, not bytes"),
        ({1: b"v"}, "header key must be str, not int"),
        ({"k": "text"}, "header 'k' value must be bytes or None, not str"),
        ({"k": 1}, "header 'k' value must be bytes or None, not int"),
        ([("k", b"v", b"extra")], "a header must be a .key, value. pair"),
        (["kv"], "a header must be a .key, value. pair"),
        (5, "headers must be a dict or a sequence of .key, value. pairs, not int"),
        ({"\ud800": b"v"}, "cannot be encoded as UTF-8"),
    ],
)
def test_bad_headers(headers: Any, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch([b"a"], headers=[headers], timestamps=TS)
    with pytest.raises(InvalidRecordError, match=message):
        encode_record(b"a", headers=headers, timestamp=TS)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": [b"k"]}, "keys has 1 entries for 2 records"),
        ({"headers": [None, None, None]}, "headers has 3 entries for 2 records"),
        ({"offset_deltas": [0]}, "offset_deltas has 1 entries for 2 records"),
        ({"keys": b"kk"}, "keys must be a sequence with one item per record"),
        ({"keys": "kk"}, "keys must be a sequence"),
        ({"keys": {b"a": b"b"}}, "keys must be a sequence"),
        ({"keys": 3}, "keys must be a sequence with one item per record, not int"),
        ({"headers": {"a": b"b"}}, "headers must be a sequence"),
    ],
)
def test_mismatched_or_wrong_columns(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch([b"a", b"b"], timestamps=TS, **kwargs)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([], "at least one record"),
        ((), "at least one record"),
        (None, "values must be a sequence"),
        (b"abc", "values must be a sequence"),
        ("abc", "values must be a sequence"),
        (7, "values must be a sequence with one item per record, not int"),
    ],
)
def test_empty_or_non_sequence_values(values: Any, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch(values, timestamps=TS)


@pytest.mark.parametrize(
    ("deltas", "last", "message"),
    [
        ([1, 1], None, "strictly increasing"),
        ([2, 1], 5, "strictly increasing"),
        ([-1, 1], None, "within 0..last_offset_delta"),
        ([0, 6], 5, "within 0..last_offset_delta"),
        ([0, 1 << 32], None, "within 0..last_offset_delta"),
        ([0, 1.0], None, "must be ints"),
        ([0, True], None, "must be ints"),
    ],
)
def test_bad_offset_deltas(deltas: list[Any], last: int | None, message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        encode_batch([b"a", b"b"], timestamps=TS, offset_deltas=deltas, last_offset_delta=last)


@pytest.mark.parametrize("last", [0, -1, 1 << 32])
def test_bad_last_offset_delta(last: int) -> None:
    with pytest.raises(InvalidRecordError, match="last_offset_delta must be in count-1"):
        encode_batch([b"a", b"b"], timestamps=TS, last_offset_delta=last)


def test_type_errors_are_raised_before_size_errors() -> None:
    """A wrong type is reported as such even when the batch is also too large."""
    with pytest.raises(InvalidRecordError):
        encode_batch([b"x" * 100, "text"], timestamps=TS, max_batch_bytes=60)


# ---------------------------------------------------------------- decoding: prefix


def test_bad_magic() -> None:
    data = bytearray(encode_record(b"x", timestamp=TS).data)
    for magic in (0, 2, 255):
        data[4] = magic
        with pytest.raises(CorruptDataError, match=f"bad magic byte {magic}"):
            decode_batch(bytes(data), 0, 0)


def test_every_bit_flip_is_detected() -> None:
    """A single flipped bit anywhere - prefix, header or body - never yields records."""
    for data in (
        encode_batch([b"hello", None], keys=[b"k", None], headers=[{"h": b"v"}, None]).data,
        encode_batch([b"abc" * 40] * 3, timestamps=[1, 2, 3], compression="zstd").data,
    ):
        for bit in range(len(data) * 8):
            damaged = bytearray(data)
            damaged[bit // 8] ^= 1 << (bit % 8)
            with pytest.raises(CorruptDataError):
                decode_batch(bytes(damaged), 0, 0)
            # The same flip inside a larger buffer (more bytes "available" after it).
            padded = b"\0" * 3 + bytes(damaged) + bytes(len(data) + 64)
            with pytest.raises(CorruptDataError):
                decode_batch(padded, 3, 0)


def test_every_truncation_is_incomplete() -> None:
    data = encode_batch([b"hello", b"world"], keys=[b"k", None], timestamps=[1, 2]).data
    for length in range(len(data)):
        with pytest.raises(IncompleteBatchError):
            decode_batch(data[:length], 0, 0)
        with pytest.raises(IncompleteBatchError):
            check_batch(data[:length], 0)
    assert decode(data)[1].value == b"world"


def test_truncation_error_says_how_much_is_missing() -> None:
    data = encode_record(b"x" * 10, timestamp=TS).data
    with pytest.raises(IncompleteBatchError, match=f"batch of {len(data)} bytes, only 60"):
        decode_batch(data[:60], 0, 0)
    with pytest.raises(IncompleteBatchError, match="need 9 bytes for a batch prefix, 4"):
        batch_size(data[:4])


def test_huge_length_fails_without_allocating() -> None:
    prefix = PREFIX.pack(0xFFFFFFFF, 1, 0) + bytes(100)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDataError, match=r"outside 53\.\.1048576") as info:
            decode_batch(prefix, 0, 0, max_batch_bytes=1 << 20)
        assert not isinstance(info.value, IncompleteBatchError)
        with pytest.raises(CorruptDataError, match="outside"):
            decode_batch(prefix, 0, 0, max_batch_bytes=(1 << 31) - 1)
        # A length within the limit but beyond the buffer: incomplete, still no allocation.
        near = PREFIX.pack((1 << 31) - 100, 1, 0) + bytes(100)
        with pytest.raises(IncompleteBatchError):
            decode_batch(near, 0, 0, max_batch_bytes=(1 << 31) - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024


def test_length_below_the_header_size() -> None:
    data = encode_record(b"x", timestamp=TS).data
    for length in (0, 1, 48):
        with pytest.raises(CorruptDataError, match="batch length"):
            batch_size(struct.pack("<I", length) + data[4:])


def test_length_bound_is_inclusive() -> None:
    data = encode_record(b"x", timestamp=TS).data
    assert decode(data, max_batch_bytes=len(data))[0].value == b"x"
    with pytest.raises(CorruptDataError, match=f"outside 53..{len(data) - 1}"):
        decode_batch(data, 0, 0, max_batch_bytes=len(data) - 1)


def test_checks_run_in_the_specified_order() -> None:
    """Short input before magic, magic before length, CRC before header fields."""
    bad_magic_huge = PREFIX.pack(0xFFFFFFFF, 9, 0) + bytes(60)
    with pytest.raises(IncompleteBatchError):
        decode_batch(bad_magic_huge[:8], 0, 0)
    with pytest.raises(CorruptDataError, match="magic"):
        decode_batch(bad_magic_huge, 0, 0)
    bad_attributes = bytearray(craft([None, None, None, [b"x"], None], attributes=7))
    bad_attributes[-1] ^= 1  # now the CRC is wrong as well
    with pytest.raises(CorruptDataError, match="CRC-32C mismatch"):
        decode_batch(bytes(bad_attributes), 0, 0)


def test_crc_mismatch_message_names_both_values() -> None:
    data = bytearray(encode_record(b"x", timestamp=TS).data)
    data[5] ^= 0xFF
    with pytest.raises(CorruptDataError, match=r"stored 0x[0-9a-f]{8}, computed 0x[0-9a-f]{8}"):
        check_batch(bytes(data), 0)


# ---------------------------------------------------------------- decoding: header

GOOD_BODY = [None, None, None, [b"x"], None]


@pytest.mark.parametrize("attributes", [2, 3, 7, 8, 0x10, 0x100, 0x8000, 0x8001])
def test_unknown_attributes(attributes: int) -> None:
    with pytest.raises(CorruptDataError, match="unknown attributes"):
        decode_batch(craft(GOOD_BODY, attributes=attributes), 0, 0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"count": 0, "last": 0}, "record count is 0"),
        ({"count": 3, "last": 1}, "last offset delta 1 < record count - 1"),
        ({"base_ts": -1, "max_ts": 5}, "timestamps out of order or negative"),
        ({"base_ts": 10, "max_ts": 9}, "timestamps out of order or negative"),
        ({"body_size": 1 << 20}, "over the batch limit"),
        ({"body_size": 3}, "header says 3"),
        ({"attributes": 1, "body_size": 3}, "compressed body larger"),
    ],
)
def test_bad_header_fields(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(CorruptDataError, match=message):
        decode_batch(craft(GOOD_BODY, **fields), 0, 0, max_batch_bytes=1 << 16)


def test_check_batch_returns_the_header() -> None:
    data = encode_batch(
        [b"a", b"b"],
        timestamps=[5, 3],
        producer_id=7,
        producer_epoch=2,
        base_sequence=11,
        last_offset_delta=4,
    ).data
    header = check_batch(data, 0)
    assert header == BatchHeader(len(data), 0, 2, 4, 5, 5, 7, 2, 11, len(data) - HEADER_SIZE)
    assert header.span == 5 and header.compression == 0
    assert decode_batch(data, 0, 0)[0] == header


def test_crafted_bodies_match_the_encoder() -> None:
    """The test helper builds the same bytes as the encoder, so crafted cases are real."""
    assert craft([None, None, None, [b"x"], None]) == encode_record(b"x", timestamp=TS).data


# ------------------------------------------------------------------ decoding: body

XY = [b"x", b"y"]
TWO = {"count": 2}
SPAN4 = {"count": 2, "last": 3}
MAX5 = {"count": 2, "max_ts": TS + 5}

BAD_BODIES: list[tuple[str, Any, dict[str, Any], str]] = [
    ("not an array", {"a": 1}, {}, "array of 5 columns"),
    ("an int", 5, {}, "array of 5 columns"),
    ("4 columns", [None, None, None, [b"x"]], {}, "array of 5 columns"),
    ("6 columns", [None, None, None, [b"x"], None, None], {}, "array of 5 columns"),
    ("nil values", [None, None, None, None, None], {}, "values column"),
    ("short values", [None, None, None, [b"x"], None], TWO, "values column"),
    ("long values", [None, None, None, XY, None], {}, "values column"),
    ("str value", [None, None, None, ["x"], None], {}, "values must be bin or nil"),
    ("int value", [None, None, None, [1], None], {}, "values must be bin or nil"),
    ("values map", [None, None, None, {b"x": b"y"}, None], {}, "values column"),
    ("short keys", [None, None, [b"k"], XY, None], TWO, "keys column"),
    ("str key", [None, None, ["k"], [b"x"], None], {}, "keys must be bin or nil"),
    ("keys int", [None, None, 5, [b"x"], None], {}, "keys column"),
    ("dense but spanning", [None, None, None, [b"x"], None], {"last": 3}, "dense offsets"),
    ("short deltas", [[0], None, None, XY, None], SPAN4, "wrong length"),
    ("float delta", [[0, 1.0], None, None, XY, None], TWO, "must be ints"),
    ("bool delta", [[0, True], None, None, XY, None], TWO, "must be ints"),
    ("negative delta", [[-1, 1], None, None, XY, None], TWO, "outside"),
    ("delta past span", [[0, 4], None, None, XY, None], SPAN4, "outside"),
    ("equal deltas", [[1, 1], None, None, XY, None], SPAN4, "increasing"),
    ("falling deltas", [[2, 1], None, None, XY, None], SPAN4, "increasing"),
    ("uniform ts but max differs", GOOD_BODY, {"max_ts": TS + 1}, "uniform timestamps"),
    ("short ts deltas", [None, [0], None, XY, None], TWO, "wrong length"),
    ("float ts delta", [None, [0, 0.5], None, XY, None], TWO, "must be ints"),
    ("ts below max", [None, [0, 4], None, XY, None], MAX5, "disagree"),
    ("ts above max", [None, [0, 6], None, XY, None], MAX5, "disagree"),
    ("negative ts", [None, [0, -TS - 1], None, XY, None], TWO, "disagree"),
    ("short headers", [None, None, None, XY, [None]], TWO, "headers column"),
    ("headers map", [None, None, None, [b"x"], {"a": b"b"}], {}, "headers column"),
    ("header not array", [None, None, None, [b"x"], [b"h"]], {}, "array or nil"),
    ("header triple", [None, None, None, [b"x"], [[["a", b"b", b"c"]]]], {}, "pair"),
    ("header bin key", [None, None, None, [b"x"], [[[b"a", b"b"]]]], {}, "pair"),
    ("header str value", [None, None, None, [b"x"], [[["a", "b"]]]], {}, "pair"),
    ("header int value", [None, None, None, [b"x"], [[["a", 1]]]], {}, "pair"),
    ("ext value", [None, None, None, [msgpack.ExtType(1, b"x")], None], {}, "bin or nil"),
]


@pytest.mark.parametrize(
    ("body", "fields", "message"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
def test_malformed_bodies_with_valid_crc(body: Any, fields: dict[str, Any], message: str) -> None:
    data = craft(body, **fields)
    check_batch(data, 0)  # the CRC and header are fine: only the body is wrong
    with pytest.raises(CorruptDataError, match=f"malformed body: .*{message}"):
        decode_batch(data, 0, 0)


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb(GOOD_BODY) + b"\xc0",  # trailing bytes
        msgpack.packb(GOOD_BODY)[:-1],  # truncated
        b"\xc1",  # the one never-used msgpack byte
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 G elements
        b"\x95\xc0\xc0\xc0\x91\xc6\xff\xff\xff\xff",  # a bin claiming 4 GiB
        b"\x91" * 5000 + b"\xc0",  # absurd nesting
        b"\x95\xc0\xc0\xc0\x91\xc4\x01x\x91\x91\x92\xa2\xff\xfe\xc0",  # header key not UTF-8
    ],
    ids=["trailing", "truncated", "reserved-byte", "huge-array", "huge-bin", "deep", "bad-utf8"],
)
def test_undecodable_msgpack(raw: bytes) -> None:
    with pytest.raises(CorruptDataError, match="undecodable body"):
        decode_batch(craft(raw=raw), 0, 0)


def test_uncanonical_but_valid_bodies_are_accepted() -> None:
    """Readers accept more than the encoder writes (docs/format.md, 1.3)."""
    cases = [
        # dense offsets written out, equal timestamps written out, empty header list
        ([[0, 1], [0, 0], None, [b"a", b"b"], [[], None]], {"count": 2}),
        # first timestamp delta not zero
        ([None, [5, 10], None, [b"a", b"b"], None], {"count": 2, "base_ts": 100, "max_ts": 110}),
        # negative timestamp deltas
        ([None, [0, -50], None, [b"a", b"b"], None], {"count": 2, "base_ts": 100}),
    ]
    got = [decode(craft(body, **fields)) for body, fields in cases]
    assert got[0] == [(0, TS, None, b"a", ()), (1, TS, None, b"b", ())]
    assert [r.timestamp for r in got[1]] == [105, 110]
    assert [r.timestamp for r in got[2]] == [100, 50]


def test_non_minimal_msgpack_ints_are_accepted() -> None:
    raw = b"\x95" + b"\x92\xcf" + (0).to_bytes(8, "big") + b"\xce" + (3).to_bytes(4, "big")
    raw += b"\xc0\xc0\x92\xc4\x01a\xc4\x01b\xc0"
    assert [r.offset for r in decode(craft(raw=raw, count=2, last=3), base=10)] == [10, 13]


# ------------------------------------------------------------------ decoding: zstd


def zstd_batch(body: bytes, stored: bytes, **fields: Any) -> bytes:
    return craft(raw=stored, attributes=1, body_size=len(body), **fields)


BODY = msgpack.packb([None, None, None, [b"z" * 200], None], use_bin_type=True)


def test_crafted_zstd_batch_decodes() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(BODY)
    assert decode(zstd_batch(BODY, frame))[0].value == b"z" * 200


def test_zstd_frame_content_size_mismatch() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(BODY)
    data = craft(raw=frame, attributes=1, body_size=len(BODY) + 1)
    with pytest.raises(CorruptDataError, match=f"declares {len(BODY)} bytes, header says"):
        decode_batch(data, 0, 0)


def test_zstd_frame_without_content_size() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(BODY)
    with pytest.raises(CorruptDataError, match="declares -1 bytes"):
        decode_batch(zstd_batch(BODY, frame), 0, 0)


def test_zstd_garbage() -> None:
    with pytest.raises(CorruptDataError, match="undecodable body"):
        decode_batch(zstd_batch(BODY, b"not a zstd frame at all"), 0, 0)


def test_zstd_damaged_frame_with_valid_crc() -> None:
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(BODY))
    frame[-3] ^= 0x55
    with pytest.raises(CorruptDataError):
        decode_batch(zstd_batch(BODY, bytes(frame)), 0, 0)


@pytest.mark.parametrize("extra", [b"\0", b"garbage", "second-frame"])
def test_zstd_trailing_data_after_the_frame(extra: Any) -> None:
    compressor = zstandard.ZstdCompressor(write_content_size=True)
    frame = compressor.compress(BODY)
    tail = compressor.compress(b"x") if extra == "second-frame" else extra
    with pytest.raises(CorruptDataError, match="unused data"):
        decode_batch(zstd_batch(BODY, frame + tail), 0, 0)


def test_zstd_of_a_malformed_body() -> None:
    body = msgpack.packb([None, None, None, ["text"] * 50, None])
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(body)
    with pytest.raises(CorruptDataError, match="malformed body"):
        decode_batch(zstd_batch(body, frame), 0, 0)


def test_zstd_stored_size_equal_to_body_size_is_accepted() -> None:
    """The encoder never writes it (it keeps such a body raw), but the rule is `<=`."""
    noise = random.Random(3).randbytes(300)
    compressor = zstandard.ZstdCompressor(write_content_size=True)
    for extra in range(400):  # grow a compressible tail until frame and body sizes meet
        value = noise + b"a" * extra
        body = msgpack.packb([None, None, None, [value], None], use_bin_type=True)
        frame = compressor.compress(body)
        if len(frame) == len(body):
            break
    else:
        raise AssertionError("no body found whose zstd frame is exactly as large")
    data = zstd_batch(body, frame)
    assert check_batch(data, 0).compression == 1
    assert decode(data)[0].value == value


# ------------------------------------------------------------- decoding: position


def test_decode_at_a_position_inside_a_larger_buffer() -> None:
    first = encode_batch([b"a", b"b"], timestamps=TS).data
    second = encode_batch([b"c"], keys=[b"k"], timestamps=TS + 1, compression="zstd").data
    buf = bytearray(b"junk" + first + second + b"trailing junk")
    pos = 4
    assert batch_size(buf, pos) == len(first)
    header, batch = decode_batch(buf, pos, 0)
    assert [r.value for r in batch] == [b"a", b"b"]
    pos += header.size
    _, batch = decode_batch(memoryview(bytes(buf)), pos, header.span)
    assert batch.to_pylist() == [(2, TS + 1, b"k", b"c", ())]


def test_errors_report_the_batch_position() -> None:
    data = bytearray(encode_record(b"x", timestamp=TS).data)
    data[-1] ^= 1
    with pytest.raises(CorruptDataError, match="at byte 17") as info:
        decode_batch(b"\0" * 17 + bytes(data), 17, 0)
    assert info.value.position == 17
    assert info.value.reason.startswith("CRC-32C mismatch")


def test_decoded_values_do_not_alias_the_buffer() -> None:
    buf = bytearray(encode_batch([b"abc"], timestamps=TS).data)
    _, batch = decode_batch(buf, 0, 0)
    buf[:] = bytes(len(buf))
    assert batch.values == (b"abc",)


# -------------------------------------------------------------------- RecordBatch


def gapped_batch() -> RecordBatch:
    data = encode_batch(
        [b"a", b"b", b"c", b"d"],
        keys=[b"1", None, b"3", None],
        timestamps=[10, 20, 30, 40],
        offset_deltas=[0, 2, 5, 6],
    ).data
    return decode_batch(data, 0, 100)[1]


def dense_batch() -> RecordBatch:
    return decode_batch(encode_batch([b"a", b"b", b"c", b"d"], timestamps=TS).data, 0, 100)[1]


def test_record_batch_columns() -> None:
    batch = gapped_batch()
    assert len(batch) == 4
    assert batch.offsets == (100, 102, 105, 106)
    assert batch.timestamps == (10, 20, 30, 40)
    assert batch.keys == (b"1", None, b"3", None)
    assert batch.values == (b"a", b"b", b"c", b"d")
    assert batch.headers == ((), (), (), ())
    assert dense_batch().offsets == range(100, 104)
    assert "100..106" in repr(batch)


def test_record_batch_records_and_to_pylist() -> None:
    batch = gapped_batch()
    records = batch.to_pylist()
    assert records == list(batch.records()) == list(batch)
    assert records[1] == Record(102, 20, None, b"b", ())
    assert all(type(r) is Record for r in records)


@pytest.mark.parametrize("make", [gapped_batch, dense_batch])
def test_record_batch_between(make: Any) -> None:
    batch = make()
    offsets = list(batch.offsets)
    for start in range(95, 112):
        for end in range(start, 112):
            part = batch.between(start, end)
            expected = [r for r in batch.to_pylist() if start <= r.offset < end]
            assert part.to_pylist() == expected, (start, end)
            assert list(part.offsets) == [o for o in offsets if start <= o < end]
    assert batch.between(0, 1000) is batch


@pytest.mark.parametrize("make", [gapped_batch, dense_batch])
def test_clip_offsets_agrees_with_between(make: Any) -> None:
    offsets = make().offsets
    for start in range(95, 112):
        for end in range(start, 112):
            clipped = clip_offsets(offsets, start, end)
            assert list(clipped) == list(make().between(start, end).offsets), (start, end)
            assert type(clipped) is type(offsets)  # a range stays a range


def test_limit_records_cuts_and_stops_pulling() -> None:
    pulled: list[int] = []

    def batches() -> Any:
        for base in (0, 10, 20, 30):
            pulled.append(base)
            yield RecordBatch(range(base, base + 10), [1] * 10, [None] * 10, [b""] * 10, [()] * 10)

    got = list(limit_records(batches(), 15))
    assert [list(b.offsets) for b in got] == [list(range(10)), list(range(10, 15))]
    assert pulled == [0, 10]  # nothing read past the limit
    assert list(limit_records(batches(), 0)) == []
    assert sum(map(len, limit_records(batches(), None))) == 40


def test_decode_unless_dense() -> None:
    dense = encode_batch([b"a", b"b", b"c"], timestamps=TS).data
    header, batch = decode_unless_dense(dense, 0, 7)
    assert header.dense and batch is None and header.span == 3
    gapped = encode_batch([b"a", b"b"], timestamps=TS, offset_deltas=[1, 4], last_offset_delta=9)
    header, batch = decode_unless_dense(gapped.data, 0, 50)
    assert not header.dense and batch is not None and list(batch.offsets) == [51, 54]
    # The checksum is verified whether or not the body is decoded.
    flipped = bytearray(dense)
    flipped[-1] ^= 0x01
    with pytest.raises(CorruptDataError, match="CRC-32C"):
        decode_unless_dense(bytes(flipped), 0, 7)


def test_record_batch_head() -> None:
    batch = gapped_batch()
    assert batch.head(4) is batch
    assert batch.head(10) is batch
    assert [r.offset for r in batch.head(2)] == [100, 102]
    assert len(batch.head(0)) == 0
    assert repr(batch.head(0)) == "RecordBatch(<empty>)"
    assert dense_batch().head(3).offsets == range(100, 103)


def test_empty_record_batch() -> None:
    empty = RecordBatch((), (), (), (), ())
    assert len(empty) == 0
    assert empty.to_pylist() == []
    assert empty.between(0, 10) is empty


# ------------------------------------------------------------------------- Record


def test_record_is_an_immutable_tuple() -> None:
    record = Record(1, 2, b"k", b"v", (("h", None),))
    assert isinstance(record, tuple)
    assert record == (1, 2, b"k", b"v", (("h", None),))
    offset, timestamp, key, value, headers = record
    assert (offset, timestamp, key, value, headers) == (1, 2, b"k", b"v", (("h", None),))
    assert Record._fields == ("offset", "timestamp", "key", "value", "headers")
    assert Record(0, 0, None, None).headers == ()
    with pytest.raises(AttributeError):
        record.value = b"other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        record[3] = b"other"  # type: ignore[index]
    assert hash(record) == hash((1, 2, b"k", b"v", (("h", None),)))


def test_decoded_records_are_hashable_and_comparable() -> None:
    records = decode(encode_batch([b"a", b"a"], headers=[{"x": b"1"}, None], timestamps=TS).data)
    assert len(set(records)) == 2
    assert records[0] < records[1]


def test_os_urandom_values_round_trip_through_zstd() -> None:
    """Mixed compressible and random values in one zstd batch."""
    values = [os.urandom(64), b"\0" * 4096, os.urandom(1), b""]
    data = encode_batch(values, timestamps=TS, compression="zstd").data
    assert header_of(data).compression == 1
    assert [r.value for r in decode(data)] == values


# ------------------------------------------------------------ borrowed encoding


def test_borrowed_batch_has_the_same_bytes_and_dies_with_the_block() -> None:
    from disklesslog.format import encode_batch_borrowed

    values = [b"v%d" % i for i in range(100)]
    owned = encode_batch(values, keys=[b"k"] * 100, timestamps=TS)
    with encode_batch_borrowed(values, keys=[b"k"] * 100, timestamps=TS) as borrowed:
        assert borrowed.data == owned.data
        assert isinstance(borrowed.body, memoryview)
        body = borrowed.body
    with pytest.raises(ValueError, match="released"):
        bytes(body)


def test_borrowed_batches_nest_and_survive_errors() -> None:
    from disklesslog.format import encode_batch_borrowed

    with encode_batch_borrowed([b"outer"], timestamps=TS) as outer:
        with encode_batch_borrowed([b"inner"], timestamps=TS) as inner:
            assert inner.data == encode_batch([b"inner"], timestamps=TS).data
        assert outer.data == encode_batch([b"outer"], timestamps=TS).data
    with pytest.raises(RuntimeError), encode_batch_borrowed([b"x"], timestamps=TS):
        raise RuntimeError("the caller failed mid-write")
    with pytest.raises(InvalidRecordError), encode_batch_borrowed(["text"], timestamps=TS):
        pass
    with encode_batch_borrowed([b"after"], timestamps=TS) as again:  # the packer is reusable
        assert again.data == encode_batch([b"after"], timestamps=TS).data


def test_borrowed_zstd_batch_owns_its_compressed_body() -> None:
    from disklesslog.format import encode_batch_borrowed

    values = [b"abc" * 100] * 50
    with encode_batch_borrowed(values, timestamps=TS, compression="zstd") as batch:
        data = batch.data
    assert data == encode_batch(values, timestamps=TS, compression="zstd").data
    assert decode(data) == decode(encode_batch(values, timestamps=TS).data)
