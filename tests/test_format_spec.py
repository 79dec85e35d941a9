"""docs/format.md is complete: a reader written from it alone agrees with the code.

The first half of this file is an independent reference reader built only from the
specification - the byte tables are even parsed out of the Markdown - using struct,
msgpack, zstandard and crc32c directly and nothing from ``disklesslog``. The tests then
encode many varied (and many damaged) batches with ``disklesslog.format`` and check
that both readers accept the same batches and return the same records, walk real
segment files written by the library, and parse their ``stream.state`` record.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import pytest
import zstandard

DOC = Path(__file__).resolve().parents[1] / "docs" / "format.md"
SPEC = DOC.read_text(encoding="utf-8")

# =========================================================================== the spec

_TYPES = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i16": "h", "i32": "i", "i64": "q"}


@dataclass(frozen=True)
class Table:
    """A byte table of the spec: field names and the struct format they add up to."""

    names: tuple[str, ...]
    fmt: str

    @property
    def size(self) -> int:
        return struct.calcsize(self.fmt)


def section(heading: str) -> str:
    """The text of one section of the spec, up to the next heading."""
    start = SPEC.index(heading + "\n")
    following = re.search(r"^#{2,3} ", SPEC[start + len(heading) :], re.MULTILINE)
    end = start + len(heading) + following.start() if following else len(SPEC)
    return SPEC[start:end]


def tables(heading: str) -> list[Table]:
    """The fixed-size byte tables of a section, as struct formats (rows whose size is an
    expression, like the variable-length body, end a table's fixed part)."""
    found: list[Table] = []
    for block in re.split(r"\n\s*\n", section(heading)):
        rows = [line for line in block.splitlines() if re.match(r"\| \d+ \|", line)]
        names: list[str] = []
        fmt = "<"
        expected_offset = 0
        for row in rows:
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            offset, size, kind, name = int(cells[0]), cells[1], cells[2], cells[3].strip("`")
            if not size.isdigit():
                break
            assert offset == expected_offset, f"{heading}: {name} is at {offset}"
            code = _TYPES.get(kind, f"{size}s" if kind == "bytes" else None)
            assert code is not None, f"{heading}: unknown type {kind}"
            assert struct.calcsize("<" + code) == int(size), f"{heading}: {name} size"
            names.append(name)
            fmt += code
            expected_offset += int(size)
        if names:
            found.append(Table(tuple(names), fmt))
    return found


BATCH = tables("### 1.1 Header")[0]
PREFIX = Table(BATCH.names[:3], "<" + BATCH.fmt[1:4])  # length, magic, crc
TAIL = Table(BATCH.names[3:], "<" + BATCH.fmt[4:])  # covered by the CRC
HEADER_SIZE = BATCH.size
ENTRY = tables("### 2.3 Segment entries")[0]
INDEX_HEADER, OFFSET_INDEX, TIME_INDEX = tables("### 2.4 Index files")
STATE = tables("### 2.5 The stream state record: `stream.state`")[0]
CHECKPOINT = tables("### 2.7 Key compaction: checkpoint, staging, intent and the swap")[0]


class SpecCorrupt(Exception):
    """The spec says these bytes are corrupt."""


class SpecIncomplete(SpecCorrupt):
    """The input ends before the batch does."""


@dataclass(frozen=True)
class SpecHeader:
    size: int
    fields: dict[str, int]

    def __getattr__(self, name: str) -> int:
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None


def spec_header(buf: bytes, pos: int, max_batch_bytes: int, *, crc: bool = True) -> SpecHeader:
    """Steps 1-6 of section 1.6 (step 5, the CRC, can be skipped: "peeking")."""
    available = len(buf) - pos
    if available < PREFIX.size:
        raise SpecIncomplete("prefix")
    length, magic, stored_crc = struct.unpack_from(PREFIX.fmt, buf, pos)
    if magic != 1:
        raise SpecCorrupt("magic")
    if length < HEADER_SIZE - 4 or length + 4 > max_batch_bytes:
        raise SpecCorrupt("length")
    size = length + 4
    if available < size:
        raise SpecIncomplete("batch")
    if crc and crc32c.crc32c(buf[pos + PREFIX.size : pos + size]) != stored_crc:
        raise SpecCorrupt("crc")
    fields = dict(zip(TAIL.names, struct.unpack_from(TAIL.fmt, buf, pos + PREFIX.size)))
    n, codec, stored = fields["record_count"], fields["attributes"] & 0x7, size - HEADER_SIZE
    if fields["attributes"] & ~0x7 or codec not in (0, 1):
        raise SpecCorrupt("attributes")
    if n < 1:
        raise SpecCorrupt("record_count")
    if fields["last_offset_delta"] < n - 1:
        raise SpecCorrupt("last_offset_delta")
    if fields["max_timestamp"] < fields["base_timestamp"] or fields["base_timestamp"] < 0:
        raise SpecCorrupt("timestamps")
    if fields["body_size"] > max_batch_bytes - HEADER_SIZE:
        raise SpecCorrupt("body_size")
    if (codec == 0 and stored != fields["body_size"]) or (
        codec == 1 and stored > fields["body_size"]
    ):
        raise SpecCorrupt("stored size")
    return SpecHeader(size, fields)


def _is_int(x: Any) -> bool:
    return type(x) is int


def _is_bin(x: Any) -> bool:
    return x is None or type(x) is bytes


def spec_decode(
    buf: bytes, pos: int, base_offset: int, max_batch_bytes: int = 16 << 20
) -> tuple[SpecHeader, list[tuple[Any, ...]]]:
    """All of section 1.6, and the records as plain tuples (section 1.3)."""
    h = spec_header(buf, pos, max_batch_bytes)
    stored = bytes(buf[pos + HEADER_SIZE : pos + h.size])
    try:
        if h.attributes & 0x7 == 1:
            if zstandard.get_frame_parameters(stored).content_size != h.body_size:
                raise SpecCorrupt("frame content size")
            body = zstandard.ZstdDecompressor().decompress(
                stored, max_output_size=h.body_size, allow_extra_data=False
            )
            if len(body) != h.body_size:
                raise SpecCorrupt("decompressed size")
        else:
            body = stored
        columns = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except SpecCorrupt:
        raise
    except Exception as exc:  # the spec: any failure to decode is corruption
        raise SpecCorrupt(f"body: {exc!r}") from None
    n = h.record_count

    def column(value: Any) -> list[Any]:
        if type(value) is not list or len(value) != n:
            raise SpecCorrupt("column shape")
        return value

    if type(columns) is not list or len(columns) != 5:
        raise SpecCorrupt("top level")
    offset_deltas, ts_deltas, keys, values, headers = columns
    values = column(values)
    if not all(map(_is_bin, values)):
        raise SpecCorrupt("values")
    if keys is not None and not all(map(_is_bin, column(keys))):
        raise SpecCorrupt("keys")
    if offset_deltas is None:
        if h.last_offset_delta != n - 1:
            raise SpecCorrupt("dense offsets")
        offset_deltas = list(range(n))
    else:
        offset_deltas = column(offset_deltas)
        if not all(map(_is_int, offset_deltas)):
            raise SpecCorrupt("offset delta type")
        if offset_deltas[0] < 0 or offset_deltas[-1] > h.last_offset_delta:
            raise SpecCorrupt("offset delta range")
        if any(b <= a for a, b in itertools.pairwise(offset_deltas)):
            raise SpecCorrupt("offset delta order")
    if ts_deltas is None:
        if h.max_timestamp != h.base_timestamp:
            raise SpecCorrupt("uniform timestamps")
        timestamps = [h.base_timestamp] * n
    else:
        if not all(map(_is_int, column(ts_deltas))):
            raise SpecCorrupt("timestamp delta type")
        timestamps = [h.base_timestamp + d for d in ts_deltas]
        if max(timestamps) != h.max_timestamp or min(timestamps) < 0:
            raise SpecCorrupt("timestamps")
    record_headers: list[tuple[tuple[str, bytes | None], ...]] = []
    for item in [None] * n if headers is None else column(headers):
        if item is None:
            record_headers.append(())
            continue
        if type(item) is not list:
            raise SpecCorrupt("record headers")
        for pair in item:
            if type(pair) is not list or len(pair) != 2:
                raise SpecCorrupt("header pair")
            if type(pair[0]) is not str or not _is_bin(pair[1]):
                raise SpecCorrupt("header types")
        record_headers.append(tuple((k, v) for k, v in item))
    records = [
        (
            base_offset + offset_deltas[i],
            timestamps[i],
            None if keys is None else keys[i],
            values[i],
            record_headers[i],
        )
        for i in range(n)
    ]
    return h, records


def spec_state(raw: bytes) -> dict[str, Any]:
    """A ``stream.state`` record per section 2.5."""
    assert len(raw) == STATE.size == 48
    fields = dict(zip(STATE.names, struct.unpack(STATE.fmt, raw)))
    assert fields["magic"] == b"DLST"
    assert fields["crc"] == crc32c.crc32c(raw[8:])
    return fields


@dataclass
class SpecEntry:
    position: int
    base: int
    size: int
    header: SpecHeader
    records: list[tuple[Any, ...]]


def spec_walk(log_file: Path, base: int, max_batch_bytes: int) -> list[SpecEntry]:
    """Every entry of a segment per section 2.3, checking the contiguity chain."""
    data = log_file.read_bytes()
    pos, expected, entries = 0, base, []
    while pos < len(data):
        (entry_base,) = struct.unpack_from(ENTRY.fmt, data, pos)
        assert entry_base == expected, f"{log_file.name}@{pos}: chain broken"
        header, records = spec_decode(data, pos + ENTRY.size, entry_base, max_batch_bytes)
        entries.append(SpecEntry(pos, entry_base, ENTRY.size + header.size, header, records))
        pos += ENTRY.size + header.size
        expected = entry_base + header.last_offset_delta + 1
    return entries


def spec_indexes(
    entries: list[SpecEntry], base: int, interval: int, *, sealed: bool
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The .index and .timeindex entries section 2.4 prescribes for these entries."""
    index: list[tuple[int, int]] = []
    timeindex: list[tuple[int, int]] = []
    running_max = -1
    for entry in entries:
        running_max = max(running_max, entry.header.max_timestamp)
        last = index[-1][1] if index else 0
        if entry.position - last >= interval:
            index.append((entry.base - base, entry.position))
            if not timeindex or running_max > timeindex[-1][0]:
                timeindex.append((running_max, entry.base - base))
    if sealed and entries and (not timeindex or running_max > timeindex[-1][0]):
        timeindex.append((running_max, entries[-1].base - base))
    return index, timeindex


def read_index(path: Path, table: Table, *, closed: bool = True) -> list[tuple[int, ...]]:
    """The entries of an index file per section 2.4, checking its header (a missing
    file holds none)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    header = dict(zip(INDEX_HEADER.names, struct.unpack_from(INDEX_HEADER.fmt, data)))
    assert header["magic"] == (b"DLXO" if table is OFFSET_INDEX else b"DLXT")
    assert header["header_crc"] == crc32c.crc32c(data[:12])
    end = INDEX_HEADER.size + header["count"] * table.size
    assert len(data) == end if closed else len(data) in (end, end + table.size)
    entries = data[INDEX_HEADER.size : end]
    assert header["entries_crc"] == crc32c.crc32c(entries)
    return list(struct.iter_unpack(table.fmt, entries))


def spec_json(raw: bytes) -> Any:
    """A checksummed JSON file per section 2.10 (the trailer required)."""
    trailer = re.fullmatch(rb"(.*\n)#crc32c:([0-9a-f]{8})\n", raw, re.DOTALL)
    assert trailer is not None, "no trailer line"
    body, crc = trailer.groups()
    assert int(crc, 16) == crc32c.crc32c(body)
    return json.loads(body)


# ========================================================================== the tests

import disklesslog  # noqa: E402 - the code under test comes after the spec reader
from disklesslog import format as fmt  # noqa: E402
from disklesslog.errors import CorruptDataError, IncompleteBatchError  # noqa: E402

TS = 1_700_000_000_000


def reference(data: bytes, pos: int, base: int, limit: int = 16 << 20) -> Any:
    """The code's verdict: the records as plain tuples, or the error class."""
    try:
        return [tuple(r) for r in fmt.decode_batch(data, pos, base, max_batch_bytes=limit)[1]]
    except IncompleteBatchError:
        return SpecIncomplete
    except CorruptDataError:
        return SpecCorrupt


def specified(data: bytes, pos: int, base: int, limit: int = 16 << 20) -> Any:
    """The spec's verdict, in the same shape."""
    try:
        return spec_decode(data, pos, base, limit)[1]
    except SpecIncomplete:
        return SpecIncomplete
    except SpecCorrupt:
        return SpecCorrupt


def test_tables_in_the_spec_match_the_code() -> None:
    """The byte tables are parsed from the Markdown; they must describe the real structs."""
    assert PREFIX.fmt == "<" + fmt.PREFIX.format.lstrip("<")
    assert TAIL.fmt == "<" + fmt.TAIL.format.lstrip("<")
    assert HEADER_SIZE == fmt.HEADER_SIZE == 53
    assert TAIL.names == fmt.BatchHeader._fields[1:]
    assert ENTRY.fmt == "<Q" and ENTRY.names == ("base_offset",)
    assert OFFSET_INDEX.fmt == "<II" and OFFSET_INDEX.size == 8
    assert TIME_INDEX.fmt == "<qI" and TIME_INDEX.size == 12
    assert STATE.fmt == "<4sIQQQQII" and STATE.size == 48
    assert STATE.names == (
        "magic",
        "crc",
        "generation",
        "start_offset",
        "active_segment",
        "recovery_offset",
        "recovery_position",
        "flags",
    )


def test_crc32c_check_values_from_the_spec() -> None:
    for text, value in [('b"123456789"', 0xE3069283), ('b""', 0), ("bytes(32)", 0x8A9136AA)]:
        assert f"crc32c({text}) == {value:#010X}".replace("0X", "0x") in SPEC
        assert crc32c.crc32c(eval(text)) == value  # the literal exactly as the spec writes it
        assert fmt.crc32c(eval(text)) == value


def _hex_block(after: str) -> bytes:
    """The hex dump in the first code block after ``after``."""
    text = SPEC[SPEC.index(after) :]
    block = text[text.index("```") + 3 :]
    block = block[: block.index("```")]
    lines = re.findall(r"^[0-9a-f]{4}: ((?:[0-9a-f]{2} ?)+)$", block, re.MULTILINE)
    return bytes.fromhex("".join(lines))


def test_worked_example_bytes_are_what_the_encoder_writes() -> None:
    documented = _hex_block("give this 82-byte batch")
    encoded = fmt.encode_batch(
        [b"hello", None],
        keys=[b"k1", None],
        headers=[{"h": b"v"}, None],
        timestamps=[1700000000000, 1700000000005],
    ).data
    assert documented == encoded
    assert len(documented) == 82
    assert struct.unpack_from("<I", documented, 5)[0] == 0x91AB9325 == crc32c.crc32c(documented[9:])
    header, records = spec_decode(documented, 0, 100)
    assert records == [
        (100, 1700000000000, b"k1", b"hello", (("h", b"v"),)),
        (101, 1700000000005, None, None, ()),
    ]
    assert header.body_size == 29 and header.last_offset_delta == 1
    assert 100 + header.last_offset_delta + 1 == 102


def test_smallest_example_from_the_spec() -> None:
    data = fmt.encode_record(b"hi", timestamp=1700000000000).data
    assert len(data) == 63
    assert data[HEADER_SIZE:] == bytes.fromhex("95 c0 c0 c0 91 c4 02 68 69 c0")
    assert "`95 c0 c0 c0 91 c4 02 68 69 c0`" in SPEC
    header, records = spec_decode(data, 0, 0)
    assert (header.size - 4, header.record_count, header.body_size) == (59, 1, 10)
    assert records == [(0, 1700000000000, None, b"hi", ())]


def _random_batch(rng: random.Random) -> tuple[bytes, dict[str, Any]]:
    """A batch exercising a random mix of the format's features."""
    n = rng.choice([1, 1, 2, 3, 7, 40, 300])
    blob = rng.choice([b"", b"abc" * rng.randint(1, 30), rng.randbytes(rng.randint(1, 80))])
    values = [rng.choice([None, b"", blob, bytearray(blob[:5])]) for _ in range(n)]
    keys = None
    if rng.random() < 0.6:
        keys = [rng.choice([None, b"", b"key-%d" % rng.randint(0, 9)]) for _ in range(n)]
    headers = None
    if rng.random() < 0.5:
        options = [None, {}, {"trace": b"x" * 5}, [("a", b"1"), ("a", None), ("é", b"")]]
        headers = [rng.choice(options) for _ in range(n)]
    timestamps: Any = rng.choice(
        [None, TS, 0, (1 << 63) - 1, [rng.randint(0, 1 << 50) for _ in range(n)]]
    )
    kwargs: dict[str, Any] = {
        "compression": rng.choice(["none", "zstd", 0, 1]),
        "producer_id": rng.choice([-1, rng.randint(0, 1 << 62)]),
        "producer_epoch": rng.choice([-1, rng.randint(0, 32767)]),
        "base_sequence": rng.choice([-1, rng.randint(0, 1 << 30)]),
    }
    shape = rng.random()
    if shape < 0.2:
        kwargs["offset_deltas"] = sorted(rng.sample(range(n * 3), n))
        if rng.random() < 0.5:
            kwargs["last_offset_delta"] = kwargs["offset_deltas"][-1] + rng.randint(0, 9)
    elif shape < 0.3:
        kwargs["last_offset_delta"] = n - 1 + rng.randint(1, 100)
    data = fmt.encode_batch(values, keys, headers, timestamps, **kwargs).data
    return data, kwargs


def test_spec_reader_agrees_with_the_code_on_varied_batches() -> None:
    rng = random.Random(20240601)
    compressed = gapped = 0
    for _ in range(400):
        data, kwargs = _random_batch(rng)
        base = rng.choice([0, 1, rng.randint(0, 1 << 62)])
        ref_header, ref_batch = fmt.decode_batch(data, 0, base)
        spec_head, spec_records = spec_decode(data, 0, base)
        assert spec_records == [tuple(r) for r in ref_batch]
        assert spec_head.size == ref_header.size == len(data)
        assert spec_head.fields == {name: getattr(ref_header, name) for name in TAIL.names}
        for name in ("producer_id", "producer_epoch", "base_sequence"):
            assert spec_head.fields[name] == kwargs[name]
        compressed += spec_head.attributes == 1
        gapped += spec_head.last_offset_delta != spec_head.record_count - 1
    assert compressed > 50 and gapped > 50  # the mix really covered both


def test_spec_reader_agrees_inside_a_larger_buffer() -> None:
    rng = random.Random(5)
    batches = [_random_batch(rng)[0] for _ in range(30)]
    buf = b"\xff" * 7 + b"".join(batches) + b"\0" * 5
    pos, base = 7, 1000
    for data in batches:
        _, ref_batch = fmt.decode_batch(buf, pos, base)
        header, records = spec_decode(buf, pos, base)
        assert records == [tuple(r) for r in ref_batch]
        pos += header.size
        base += header.last_offset_delta + 1
        assert header.size == len(data)
    assert specified(buf, pos, base) is SpecIncomplete  # the 5 trailing zero bytes


def test_spec_reader_agrees_on_truncations_and_bit_flips() -> None:
    rng = random.Random(11)
    for _ in range(8):
        data, _ = _random_batch(rng)
        for length in rng.sample(range(len(data)), min(len(data), 40)):
            assert reference(data[:length], 0, 0) is specified(data[:length], 0, 0)
            assert specified(data[:length], 0, 0) is SpecIncomplete
        for bit in rng.sample(range(len(data) * 8), min(len(data) * 8, 200)):
            damaged = bytearray(data)
            damaged[bit // 8] ^= 1 << (bit % 8)
            verdict = specified(bytes(damaged), 0, 0)
            assert verdict in (SpecCorrupt, SpecIncomplete)
            assert reference(bytes(damaged), 0, 0) is verdict


def _reseal(prefix_and_tail: bytearray, stored: bytes) -> bytes:
    """Give edited bytes a valid CRC (and length), so the checks behind the CRC decide."""
    struct.pack_into("<I", prefix_and_tail, 0, len(prefix_and_tail) - 4 + len(stored))
    crc = crc32c.crc32c(bytes(prefix_and_tail[9:]) + stored)
    struct.pack_into("<I", prefix_and_tail, 5, crc)
    return bytes(prefix_and_tail) + stored


_JUNK: list[Any] = [None, 0, -1, 1 << 40, True, 1.5, "s", b"b", [], [None], {"k": 1}, [[1, 2]]]


def _mutate_columns(columns: list[Any], rng: random.Random) -> list[Any]:
    """A structural edit of a decoded body: the kind of damage a CRC cannot see
    (a buggy or hostile writer)."""
    columns = [list(c) if isinstance(c, list) else c for c in columns]
    choice = rng.randrange(8)
    i = rng.randrange(5)
    if choice == 0:
        columns[i] = rng.choice(_JUNK)
    elif choice == 1 and isinstance(columns[i], list) and columns[i]:
        columns[i][rng.randrange(len(columns[i]))] = rng.choice(_JUNK)
    elif choice == 2 and isinstance(columns[i], list) and columns[i]:
        del columns[i][rng.randrange(len(columns[i]))]
    elif choice == 3 and isinstance(columns[i], list):
        columns[i].append(rng.choice(_JUNK))
    elif choice == 4:
        columns.append(None) if rng.random() < 0.5 else columns.pop()
    elif choice == 5 and isinstance(columns[0], list) and columns[0]:
        j = rng.randrange(len(columns[0]))
        columns[0][j] += rng.choice([-2, -1, 1, 2])
    elif choice == 6 and isinstance(columns[1], list) and columns[1]:
        j = rng.randrange(len(columns[1]))
        columns[1][j] += rng.choice([-(TS + 5), -1, 1, 3])
    elif choice == 7 and isinstance(columns[4], list):
        record = rng.randrange(len(columns[4]))
        columns[4][record] = rng.choice(
            [[["k", b"v"]], [["k", "v"]], [[b"k", b"v"]], [["k"]], ["kv"], [], None]
        )
    return columns


def test_spec_reader_agrees_on_crafted_malformed_batches() -> None:
    """Bodies and headers edited *behind* a valid CRC: both readers must accept exactly
    the same batches and return the same records."""
    rng = random.Random(99)
    outcomes = {"accepted": 0, "rejected": 0}
    for _ in range(1500):
        data, _ = _random_batch(rng)
        head = bytearray(data[:HEADER_SIZE])
        body = data[HEADER_SIZE:]
        compressed = head[9] & 0x7 == 1
        if compressed:
            body = zstandard.ZstdDecompressor().decompress(body)
        what = rng.random()
        if what < 0.6:
            columns = msgpack.unpackb(body, raw=False)
            body = msgpack.packb(_mutate_columns(columns, rng), use_bin_type=True)
        elif what < 0.8:
            edited = bytearray(body)
            edited[rng.randrange(len(edited))] = rng.randrange(256)
            body = bytes(edited)
        else:  # a header field instead
            name = rng.choice(["record_count", "last_offset_delta", "base_timestamp"])
            name = rng.choice([name, "max_timestamp", "attributes"])
            offset = 9 + struct.calcsize("<" + TAIL.fmt[1 : 1 + TAIL.names.index(name)])
            code = TAIL.fmt[1 + TAIL.names.index(name)]
            (value,) = struct.unpack_from("<" + code, head, offset)
            limit = (1 << (8 * struct.calcsize(code) - (code.islower()))) - 1
            struct.pack_into(
                "<" + code, head, offset, min(limit, max(0, value + rng.randint(-2, 2)))
            )
        struct.pack_into("<I", head, 49, len(body))
        stored = body
        if compressed:
            stored = zstandard.ZstdCompressor(write_content_size=True).compress(body)
        crafted = _reseal(head, stored)
        verdict = specified(crafted, 0, 42)
        assert reference(crafted, 0, 42) == verdict, crafted.hex()
        outcomes["rejected" if verdict is SpecCorrupt else "accepted"] += 1
    assert outcomes["accepted"] > 100 and outcomes["rejected"] > 300


def test_spec_reader_agrees_on_the_batch_limit() -> None:
    data = fmt.encode_batch([b"x" * 100], timestamps=TS).data
    for limit in (HEADER_SIZE, len(data) - 1, len(data), len(data) + 1):
        assert reference(data, 0, 0, limit) == specified(data, 0, 0, limit)
    assert specified(data, 0, 0, len(data) - 1) is SpecCorrupt
    huge = struct.pack("<IBI", 0xFFFFFFFF, 1, 0) + bytes(64)
    assert specified(huge, 0, 0, 1 << 20) is SpecCorrupt
    assert reference(huge, 0, 0, 1 << 20) is SpecCorrupt


# ------------------------------------------------------------------------ local logs


def _config(stream_dir: Path) -> dict[str, Any]:
    content = spec_json((stream_dir / "stream.json").read_bytes())
    assert content["version"] == 2
    config = content["config"]
    assert set(config) == {
        "compression",
        "max_record_bytes",
        "max_batch_bytes",
        "segment_bytes",
        "segment_ms",
        "index_interval_bytes",
        "cleanup_policy",
        "retention_ms",
        "retention_bytes",
        "delete_retention_ms",
        "min_cleanable_dirty_ratio",
        "local_retention_ms",
        "local_retention_bytes",
    }
    for name in config:  # every field is named in section 2.1
        assert f"`{name}`" in section("### 2.1 Directory layout"), name
    return dict(config)


def _segments(stream_dir: Path) -> list[int]:
    """Segment bases from the file names (section 2.1), checking every name."""
    bases = []
    for path in stream_dir.iterdir():
        names = ("stream.json", "stream.state", "stream.state.copy", "cleaner.lock")
        if path.name in (*names, "cleaner.checkpoint"):
            continue
        match = re.fullmatch(r"(\d{20})\.(log|index|timeindex|lost)", path.name)
        assert match, f"unexpected file {path.name}"
        if match.group(2) == "log":
            bases.append(int(match.group(1)))
    return sorted(bases)


def _walk_stream(stream_dir: Path) -> tuple[list[int], list[list[SpecEntry]], dict[str, Any]]:
    """All segments of a stream by the spec, checking contiguity across segments."""
    config = _config(stream_dir)
    bases = _segments(stream_dir)
    state = spec_state((stream_dir / "stream.state").read_bytes())
    copy = spec_state((stream_dir / "stream.state.copy").read_bytes())
    assert (copy["start_offset"], copy["active_segment"]) == (
        state["start_offset"],
        state["active_segment"],
    )
    assert state["active_segment"] == bases[-1]
    walked = []
    for base, next_base in zip(bases, [*bases[1:], None]):
        entries = spec_walk(stream_dir / f"{base:020d}.log", base, config["max_batch_bytes"])
        if next_base is not None:  # a closed segment ends where the next one starts
            compacted = "compact" in config["cleanup_policy"]
            lost = stream_dir / f"{base:020d}.lost"
            if not entries and lost.exists():  # an accepted loss (2.11)
                marker = spec_json(lost.read_bytes())
                assert (marker["first"], marker["end"]) == (base, next_base)
            else:
                assert entries or compacted, "closed segments are empty only when compacted"
            if entries:
                last = entries[-1]
                assert last.base + last.header.last_offset_delta + 1 == next_base
        walked.append(entries)
    return bases, walked, state


def _append_mix(stream: Any, rng: random.Random, count: int, ts: int) -> list[tuple[Any, ...]]:
    """Append ``count`` varied batches; return the records they should read back as."""
    expected = []
    for _ in range(count):
        n = rng.randint(1, 6)
        values = [
            rng.choice([None, b"", b"v" * rng.randint(1, 120), rng.randbytes(30)]) for _ in range(n)
        ]
        keys = [rng.choice([None, b"k%d" % rng.randint(0, 3)]) for _ in range(n)]
        headers = [rng.choice([None, {"h": b"1"}, [("d", None), ("d", b"")]]) for _ in range(n)]
        ts += rng.randint(0, 3_000)
        timestamps = [ts + rng.randint(-50, 50) for _ in range(n)]
        offsets = stream.append_batch(values, keys=keys, headers=headers, timestamps=timestamps)
        for offset, value, key, hdrs, t in zip(offsets, values, keys, headers, timestamps):
            pairs = tuple(hdrs.items()) if isinstance(hdrs, dict) else tuple(hdrs or ())
            expected.append((offset, t, key, value, pairs))
    return expected


def test_segment_files_decode_by_the_spec(tmp_path: Path) -> None:
    rng = random.Random(3)
    root = tmp_path / "log"
    options = {
        "segment_bytes": 2048,
        "segment_ms": 20_000,
        "index_interval_bytes": 200,
        "compression": "zstd",
    }
    with disklesslog.open(root, **options) as log:
        expected = _append_mix(log.stream("s"), rng, 80, TS)

    raw_marker = (root / "disklesslog.json").read_bytes()
    assert spec_json(raw_marker) == {"format": "disklesslog-segments", "version": 2}
    assert f"`{raw_marker.decode().replace(chr(10), chr(92) + 'n')}`" in SPEC  # 2.10's example
    stream_dir = root / "streams" / "s"
    config = _config(stream_dir)
    assert {k: config[k] for k in options} == options

    bases, walked, state = _walk_stream(stream_dir)
    assert len(bases) > 3 and bases[0] == 0
    records = [r for entries in walked for e in entries for r in e.records]
    assert records == expected

    # The roll rule of 2.2, replayed over the entries as they were appended.
    predicted, size, first_ts, end = [0], 0, -1, 0
    for entry in (e for entries in walked for e in entries):
        max_ts = entry.header.max_timestamp
        if size and (
            size + entry.size > config["segment_bytes"] or max_ts - first_ts > config["segment_ms"]
        ):
            predicted.append(end)
            size = 0
        if size == 0:
            first_ts = max_ts
        size += entry.size
        end = entry.base + entry.header.last_offset_delta + 1
    assert predicted == bases

    # The index rule of 2.4: closed segments are sealed, the active one is not.
    for base, entries in zip(bases, walked):
        sealed = base != bases[-1]
        index, timeindex = spec_indexes(
            entries, base, config["index_interval_bytes"], sealed=sealed
        )
        index_file, time_file = (stream_dir / f"{base:020d}.{x}" for x in ("index", "timeindex"))
        assert read_index(index_file, OFFSET_INDEX, closed=sealed) == index
        assert read_index(time_file, TIME_INDEX, closed=sealed) == timeindex
        if sealed:  # the last time-index entry is the segment's max timestamp
            assert timeindex[-1][0] == max(e.header.max_timestamp for e in entries)

    # The state record of 2.5 after a clean close.
    active_size = (stream_dir / f"{bases[-1]:020d}.log").stat().st_size
    last = walked[-1][-1]
    assert state["start_offset"] == 0
    assert state["flags"] == 0  # fsync "interval": the recovery point was synced (bit 2 clear)
    assert state["recovery_position"] == active_size
    assert state["recovery_offset"] == last.base + last.header.last_offset_delta + 1
    assert state["recovery_offset"] == expected[-1][0] + 1


def test_compacted_segments_decode_by_the_spec(tmp_path: Path) -> None:
    """After compaction (section 2.7) segments still decode and chain by 2.3 (some
    sparse, one empty), their indexes follow 2.4, the checkpoint parses by its table,
    and the records are the latest of each key below the checkpoint."""
    root = tmp_path / "log"
    options = {"cleanup_policy": "compact", "segment_bytes": 2048, "index_interval_bytes": 200}
    gone = [(b"gone", b"x" * 100)] * 40  # whole segments, all superseded
    big = [(b"b%02d" % i, b"z" * 100) for i in range(18)]  # one batch: its own segment
    rest = [(b"k%d" % (i % 7), b"v%d" % i + b"y" * (i % 90)) for i in range(200)]
    rest += [(b"gone", None)] + [(b"k%d" % i, b"last") for i in range(7)]
    rows = gone + big + rest
    with disklesslog.open(root, fsync="never", **options) as log:
        stream = log.stream("s")
        for part in (
            [gone[i : i + 8] for i in range(0, 40, 8)]
            + [big]
            + [rest[i : i + 8] for i in range(0, len(rest), 8)]
        ):
            stream.append_batch([v for _, v in part], keys=[k for k, _ in part], timestamps=TS)
        stream.append_batch([b"tail" * 500], keys=[b"tail"], timestamps=TS)  # rolls first
        assert log.compact(now_ms=TS).changed
        expected = [tuple(r) for r in stream.read()]
    stream_dir = root / "streams" / "s"
    bases, walked, state = _walk_stream(stream_dir)
    assert state["flags"] == 4  # fsync "never" wrote the recovery point (2.5, bit 2)
    assert [r for entries in walked for e in entries for r in e.records] == expected
    raw = (stream_dir / "cleaner.checkpoint").read_bytes()
    checkpoint = dict(zip(CHECKPOINT.names, struct.unpack(CHECKPOINT.fmt, raw)))
    assert checkpoint["magic"] == b"DLCK" and checkpoint["crc"] == crc32c.crc32c(raw[8:])
    assert checkpoint["offset"] == bases[-1] == len(rows)
    below = [(offset, key, value) for offset, _, key, value, _ in expected if offset < len(rows)]
    latest = {key: offset for offset, (key, _) in enumerate(rows)}
    assert below == [(o, k, v) for o, (k, v) in enumerate(rows) if latest[k] == o]
    assert [] in walked[:-1], "the superseded segments became one empty segment"
    assert any(e.header.record_count < e.header.last_offset_delta + 1 for w in walked for e in w)
    for base, entries in zip(bases[:-1], walked):  # closed: indexes by the rule, sealed
        index, timeindex = spec_indexes(entries, base, 200, sealed=True)
        assert read_index(stream_dir / f"{base:020d}.index", OFFSET_INDEX) == index
        assert read_index(stream_dir / f"{base:020d}.timeindex", TIME_INDEX) == timeindex


def test_new_stream_state_is_all_zero(tmp_path: Path) -> None:
    with disklesslog.open(tmp_path / "log") as log:
        log.create_stream("fresh")
    stream_dir = tmp_path / "log" / "streams" / "fresh"
    raw = (stream_dir / "stream.state").read_bytes()
    assert raw == b"DLST" + struct.pack("<I", 0x595FB7DD) + bytes(40)
    assert "44 4c 53 54 dd b7 5f 59 00 00 ... 00" in SPEC
    assert spec_state(raw)["generation"] == 0
    assert (stream_dir / "stream.state.copy").read_bytes() == raw  # 2.5: its copy
    assert (stream_dir / "00000000000000000000.log").read_bytes() == b""
    assert _segments(stream_dir) == [0]


def test_state_after_trim_and_roll(tmp_path: Path) -> None:
    rng = random.Random(8)
    with disklesslog.open(tmp_path / "log", segment_bytes=1024) as log:
        stream = log.stream("s")
        expected = _append_mix(stream, rng, 40, TS)
        stream_dir = tmp_path / "log" / "streams" / "s"
        bases_before = _segments(stream_dir)
        generation = spec_state((stream_dir / "stream.state").read_bytes())["generation"]
        cut = bases_before[2] + 1  # inside the third segment
        stream.trim(cut)
        state = spec_state((stream_dir / "stream.state").read_bytes())
        assert state["start_offset"] == cut
        assert state["generation"] != generation
        copy = spec_state((stream_dir / "stream.state.copy").read_bytes())
        assert copy["start_offset"] == cut  # 2.5: a trim writes the copy too
        bases_after = _segments(stream_dir)
        # Every segment wholly below the start offset is gone; the one holding it stays.
        assert bases_after == bases_before[2:]
        _, walked, _ = _walk_stream(stream_dir)
        records = [r for entries in walked for e in entries for r in e.records]
        assert records == [r for r in expected if r[0] >= bases_before[2]]
        visible = [tuple(r) for r in stream.read()]
        assert visible == [r for r in expected if r[0] >= cut]


def test_recovery_truncates_a_torn_tail(tmp_path: Path) -> None:
    rng = random.Random(21)
    root = tmp_path / "log"
    with disklesslog.open(root) as log:
        expected = _append_mix(log.stream("s"), rng, 10, TS)
    stream_dir = root / "streams" / "s"
    bases, walked, state = _walk_stream(stream_dir)
    active = stream_dir / f"{bases[-1]:020d}.log"
    good_size = active.stat().st_size
    torn = struct.pack("<Q", expected[-1][0] + 1) + fmt.encode_record(b"torn", timestamp=TS).data
    with open(active, "ab") as f:
        f.write(torn[:30])  # a crash in the middle of writing an entry

    with disklesslog.open(root) as log:
        stream = log.stream("s")
        assert [tuple(r) for r in stream.read()] == expected
        assert active.stat().st_size == good_size
        offset = stream.append(b"after", timestamp=TS)
    assert offset == expected[-1][0] + 1
    _, walked, state = _walk_stream(stream_dir)
    assert walked[-1][-1].records[0][3] == b"after"
    assert state["recovery_position"] == active.stat().st_size


def test_damage_before_the_recovery_point_is_reported_not_truncated(tmp_path: Path) -> None:
    rng = random.Random(22)
    root = tmp_path / "log"
    with disklesslog.open(root) as log:
        _append_mix(log.stream("s"), rng, 10, TS)
    stream_dir = root / "streams" / "s"
    bases, walked, state = _walk_stream(stream_dir)
    active = stream_dir / f"{bases[-1]:020d}.log"
    size = active.stat().st_size
    assert state["recovery_position"] == size
    victim = walked[-1][len(walked[-1]) // 2]
    data = bytearray(active.read_bytes())
    data[victim.position + victim.size - 1] ^= 0x01  # the last body byte: only the CRC sees it
    active.write_bytes(bytes(data))
    with pytest.raises(SpecCorrupt):
        spec_walk(active, bases[-1], 16 << 20)

    with disklesslog.open(root) as log:
        stream = log.stream("s")
        with pytest.raises(CorruptDataError) as info:
            list(stream.read())
        assert info.value.source is not None and info.value.source.endswith(active.name)
    assert active.stat().st_size == size  # nothing was cut


def test_an_accepted_loss_decodes_by_the_spec(tmp_path: Path) -> None:
    """Section 2.11: storage lost the tail of the active segment after records were
    acknowledged; once the loss is accepted, the stream walks by 2.3 with the lost
    offsets an empty segment named by its marker, and the state (2.5) names the new
    active segment at the old recovery offset."""
    rng = random.Random(23)
    root = tmp_path / "log"
    with disklesslog.open(root, fsync="always") as log:
        expected = _append_mix(log.stream("s"), rng, 10, TS)
    stream_dir = root / "streams" / "s"
    bases, walked, state = _walk_stream(stream_dir)
    assert state["flags"] & 4 == 0  # synced: a loss is damage, not the policy's
    recovery_offset = state["recovery_offset"]
    keep = walked[-1][len(walked[-1]) // 2]
    with open(stream_dir / f"{bases[-1]:020d}.log", "r+b") as f:
        f.truncate(keep.position + 3)  # storage lost the rest, and part of this entry
    with disklesslog.open(root, fsync="always") as log:
        with pytest.raises(disklesslog.DataLossError):
            log.stream("s").append(b"x")
        log.repair("s", accept_data_loss=True)
        assert log.stream("s").append(b"after", timestamp=TS) == recovery_offset
    bases, walked, state = _walk_stream(stream_dir)
    assert bases[-2:] == [keep.base, recovery_offset]
    assert walked[-2] == []  # the gap: an empty segment covering the lost offsets
    assert state["active_segment"] == recovery_offset
    records = [r for entries in walked for e in entries for r in e.records]
    assert records == [r for r in expected if r[0] < keep.base] + [
        (recovery_offset, TS, None, b"after", ())
    ]


@pytest.mark.parametrize(
    "edit",
    ["trailing-byte", "second-frame", "no-content-size", "wrong-content-size", "not-zstd"],
)
def test_spec_reader_agrees_on_zstd_edge_cases(edit: str) -> None:
    """Section 1.4: exactly one frame, declaring exactly ``body_size``."""
    body = msgpack.packb([None, None, None, [b"abc" * 100], None], use_bin_type=True)
    compressor = zstandard.ZstdCompressor(write_content_size=edit != "no-content-size")
    stored = compressor.compress(body)
    if edit == "trailing-byte":
        stored += b"\0"
    elif edit == "second-frame":
        stored += compressor.compress(b"")
    elif edit == "wrong-content-size":
        stored = zstandard.ZstdCompressor(write_content_size=True).compress(body + b"\xc0")
    elif edit == "not-zstd":
        stored = b"\x28\xb5\x2f\xfe" + stored[4:]
    head = bytearray(struct.pack("<IBI", 0, 1, 0))
    head += struct.pack(TAIL.fmt, 1, 1, 0, TS, TS, -1, -1, -1, len(body))
    crafted = _reseal(head, stored)
    assert specified(crafted, 0, 0) is SpecCorrupt
    assert reference(crafted, 0, 0) is SpecCorrupt
    good = _reseal(bytearray(head), compressor.compress(body))
    if edit != "no-content-size":
        assert specified(good, 0, 0) == reference(good, 0, 0) == [(0, TS, None, b"abc" * 100, ())]


# ================================= section 3.1: the object-store sequencer's objects

SEQUENCER = "### 3.1 The object-store sequencer: entries and checkpoints"
SEQ_ENTRY, SEQ_CHECKPOINT = tables(SEQUENCER)


def _spec_magic(kind: str) -> bytes:
    """The magic of ``kind`` (e.g. "Entry, version 2"), as the spec's heading names it."""
    return re.search(rf"\*\*{kind}\*\* \(`(\w+)`", section(SEQUENCER))[1].encode()  # type: ignore[index]


def _spec_rows(first_column: str) -> list[str]:
    """The first cells of the spec's table whose header starts with ``first_column``."""
    text = section(SEQUENCER)
    block = text[text.index(f"| {first_column} |") :].split("\n\n", 1)[0]
    return [line.split("|")[1].strip() for line in block.splitlines()[2:]]


SPEC_OPERATIONS = [name.strip("`") for name in _spec_rows("operation")]
SPEC_STATE_KEYS = [
    key.strip("` ") for row in _spec_rows("key") for key in row.split(",")
]  # "`a`, `b`" rows list several keys


def spec_digest(previous: bytes, stored: bytes) -> bytes:
    """The chain digest after a version 2 entry, as section 3.1 defines it."""
    import hashlib

    return hashlib.blake2b(previous + stored, digest_size=16).digest()


def spec_entry(data: bytes, number: int) -> tuple[list[Any], bytes | None]:
    """Steps 1-5 of "Reading an entry": ``([entry_id, timestamp, operations],
    previous)`` (previous is None for version 1). Types of operations' arguments are the
    code's business (tested elsewhere); this checks the bytes and the outer shape."""
    if data.startswith(_spec_magic("Entry, version 2")):
        if len(data) < SEQ_ENTRY.size:
            raise SpecCorrupt("short")
        fields = dict(zip(SEQ_ENTRY.names, struct.unpack_from(SEQ_ENTRY.fmt, data)))
        if len(data) != SEQ_ENTRY.size + fields["length"]:
            raise SpecCorrupt("length")
        if crc32c.crc32c(data[10:]) != fields["crc"]:
            raise SpecCorrupt("crc")
        if fields["number"] != number:
            raise SpecCorrupt("number")
        body, previous = data[SEQ_ENTRY.size :], fields["previous"]
    elif data.startswith(_spec_magic("Entry, version 1")):
        body, previous = data[6:], None
    else:
        raise SpecCorrupt("magic")
    try:
        content = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise SpecCorrupt(f"body: {exc!r}") from None
    if type(content) is not list or len(content) != 3:
        raise SpecCorrupt("shape")
    entry_id, stamp, operations = content
    if type(entry_id) is not bytes or len(entry_id) != 16 or type(stamp) is not float:
        raise SpecCorrupt("id or timestamp")
    if type(operations) is not list or not all(
        type(op) is list and op and op[0] in SPEC_OPERATIONS for op in operations
    ):
        raise SpecCorrupt("operations")
    return content, previous


def spec_checkpoint(data: bytes, entry: int) -> dict[str, Any]:
    """ "Reading a checkpoint", every version: its map (version 1's gets the chain of
    16 zero bytes the spec gives it). Versions 3 and 2 share the header."""
    shared_header = (_spec_magic("Checkpoint, version 3"), _spec_magic("Checkpoint, version 2"))
    if data.startswith(shared_header):
        if len(data) < SEQ_CHECKPOINT.size:
            raise SpecCorrupt("short")
        fields = dict(zip(SEQ_CHECKPOINT.names, struct.unpack_from(SEQ_CHECKPOINT.fmt, data)))
        if len(data) != SEQ_CHECKPOINT.size + fields["length"]:
            raise SpecCorrupt("length")
        if crc32c.crc32c(data[10:]) != fields["crc"] or fields["entry"] != entry:
            raise SpecCorrupt("crc or entry")
        frame = data[SEQ_CHECKPOINT.size :]
    elif data.startswith(_spec_magic("Checkpoint, version 1")):
        frame = data[6:]
    else:
        raise SpecCorrupt("magic")
    try:
        content = msgpack.unpackb(
            zstandard.ZstdDecompressor().decompress(frame, allow_extra_data=False), raw=False
        )
    except Exception as exc:
        raise SpecCorrupt(f"frame: {exc!r}") from None
    if type(content) is not dict or set(SPEC_STATE_KEYS) - {"transactions"} - set(
        content.get("state", {})
    ):
        raise SpecCorrupt("map")
    content.setdefault("chain", bytes(16))
    return content


def _sequencer_log(root: Path) -> Any:
    """A sequencer log holding every operation and several checkpoints."""
    import fsspec

    from disklesslog.sequencers import BatchLocation, BatchToCommit, ProducerExpiry
    from disklesslog.sequencers.objectstore import ObjectStoreSequencer

    seq = ObjectStoreSequencer(fsspec.filesystem("file"), str(root), checkpoint_every=4)
    seq.create_stream("a", {"retention_ms": 10})
    producer = seq.init_producer("p")
    seq.init_producer()
    for i in range(6):
        seq.commit(f"o{i}", [BatchToCommit("a", 0, 9, 2, 2, TS + i, *producer, 2 * i)])
    seq.commit_transaction("t", [("o-t", [BatchToCommit("a", 0, 9, 1, 1, TS)])])
    first = seq.find_batches("a", 0, 1 << 20).batches[0]
    seq.replace_batches("a", [first.batch_id], [BatchLocation(0, "m", 0, 9, 0, 1, TS)])
    seq.trim("a", 2)
    seq.alter_stream("a", {"retention_ms": 20})
    seq.commit_offsets("g", {"a": 3})
    seq.record_orphan("x")
    seq.forget_objects(["x"])
    seq.create_stream("b", {})
    seq.delete_stream("b")
    seq.init_producer("idle")
    time.sleep(0.002)  # every producer and state above is older than a millisecond
    assert seq.expire_producers(1) == ProducerExpiry(states=1, producers=3)
    lease = seq.acquire_lease("l", "w", 1_000)
    assert lease is not None
    seq.release_lease(lease)
    seq.acquire_lease("l", "v", 1_000)
    pruned = seq.acquire_lease("p", "w", 1_000)
    assert pruned is not None
    seq.release_lease(pruned)
    assert seq.prune_leases(0) == ["p"]
    return seq


def test_sequencer_tables_in_the_spec_match_the_code() -> None:
    from disklesslog.sequencers import objectstore_format as seqfmt

    assert SEQ_ENTRY.fmt == "<6sIIQ16s" and SEQ_ENTRY.size == seqfmt.ENTRY_HEADER == 38
    assert SEQ_ENTRY.names == ("magic", "crc", "length", "number", "previous")
    assert SEQ_CHECKPOINT.fmt == "<6sIQQ" and SEQ_CHECKPOINT.size == seqfmt.CHECKPOINT_HEADER
    assert SEQ_CHECKPOINT.names == ("magic", "crc", "length", "entry")
    assert _spec_magic("Entry, version 2") == seqfmt.ENTRY_MAGIC
    assert _spec_magic("Entry, version 1") == seqfmt.ENTRY_MAGIC_V1
    assert _spec_magic("Checkpoint, version 3") == seqfmt.CHECKPOINT_MAGIC
    assert _spec_magic("Checkpoint, version 2") == seqfmt.CHECKPOINT_MAGIC_V2
    assert _spec_magic("Checkpoint, version 1") == seqfmt.CHECKPOINT_MAGIC_V1
    assert sorted(SPEC_OPERATIONS) == sorted(seqfmt.OPERATIONS)


def test_sequencer_objects_decode_by_the_spec(tmp_path: Path) -> None:
    """Every entry the library wrote reads by the spec, names the chain digest the spec
    computes, and decodes to what the code decodes; every checkpoint holds the spec's
    digest as of its entry and the state the code holds at its tail."""
    from disklesslog.sequencers import objectstore_format as seqfmt

    root = tmp_path / "sequencer"
    seq = _sequencer_log(root)
    digests = {0: bytes(16)}
    for path in sorted((root / "log").iterdir()):
        number, data = int(path.name), path.read_bytes()
        (entry_id, stamp, operations), previous = spec_entry(data, number)
        assert previous == digests[number - 1]
        digests[number] = spec_digest(previous, data)
        code = seqfmt.decode_entry(data, number, str(path))
        assert (code.entry_id, code.timestamp, code.previous) == (entry_id, stamp, previous)
        assert [op[0] for op in code.ops] == [op[0] for op in operations]
    checkpoints = sorted((root / "checkpoints").iterdir())
    assert len(checkpoints) >= 3
    for path in checkpoints:
        entry = int(path.name[:20])
        content = spec_checkpoint(path.read_bytes(), entry)
        assert content["chain"] == digests[entry]
        assert content == dict(
            zip(["state", "recent", "chain"], _code_checkpoint(path, entry), strict=True)
        )
    assert seq.tail == len(digests) - 1
    assert set(seq.snapshot()) == set(SPEC_STATE_KEYS)


def _code_checkpoint(path: Path, entry: int) -> tuple[Any, ...]:
    from disklesslog.sequencers import objectstore_format as seqfmt

    decoded = seqfmt.decode_checkpoint(path.read_bytes(), entry, str(path))
    return decoded.state, decoded.recent, decoded.chain


def test_spec_reader_agrees_on_damaged_sequencer_objects(tmp_path: Path) -> None:
    """Damage the CRC covers: both readers refuse every damaged copy."""
    from disklesslog.errors import CorruptDataError
    from disklesslog.sequencers import objectstore_format as seqfmt

    root = tmp_path / "sequencer"
    _sequencer_log(root)
    rng = random.Random(31)
    objects = [(p, int(p.name), True) for p in sorted((root / "log").iterdir())]
    objects += [(p, int(p.name[:20]), False) for p in sorted((root / "checkpoints").iterdir())]
    for path, number, is_entry in objects:
        data = path.read_bytes()
        for _ in range(20):
            damaged = bytearray(data)
            if rng.random() < 0.5:
                at = rng.randrange(len(data) * 8)
                damaged[at // 8] ^= 1 << (at % 8)
            else:
                damaged = damaged[: rng.randrange(len(data))]
            spec = spec_entry if is_entry else spec_checkpoint
            code = seqfmt.decode_entry if is_entry else seqfmt.decode_checkpoint
            with pytest.raises(SpecCorrupt):
                spec(bytes(damaged), number)  # type: ignore[operator]
            with pytest.raises(CorruptDataError):
                code(bytes(damaged), number, str(path))  # type: ignore[operator]
