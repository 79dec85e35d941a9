"""The Log/Stream contract: what every backend's logs and streams do.

Each test gets ``log_factory`` (opens and reopens one log location of one backend) or
``log`` (one open log), from the subclass's ``open_log`` (:class:`~.fixtures.LogFixtures`);
nothing here names a backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

import disklesslog
from disklesslog import (
    ConfigError,
    InvalidRecordError,
    InvalidStreamName,
    LogClosedError,
    OffsetOutOfRange,
    Record,
    RecordTooLarge,
    StreamExistsError,
    StreamNotFound,
)

from .fixtures import LogFactory, LogFixtures
from .leases import LeaseContract

__all__ = ["LogContract"]


def _offsets(records: Iterable[Record]) -> list[int]:
    return [r.offset for r in records]


# Trims at the edges of storage units (local segments, object batches): one batch of
# BATCH records per unit, so every batch boundary is also a segment boundary.
BATCH, UNITS = 5, 8
UNIT_CONFIG = {"segment_bytes": 1024}  # the smallest allowed: a second batch would not fit
END = BATCH * UNITS
BOUNDARIES = {
    "first-offset-of-a-unit": BATCH,
    "last-offset-of-the-first-unit": BATCH - 1,
    "last-offset-of-a-unit": 2 * BATCH - 1,
    "last-offset-of-the-last-closed-unit": END - BATCH - 1,
    "first-offset-of-the-active-unit": END - BATCH,
    "last-offset-of-the-active-unit": END - 1,
}


def _units(log: disklesslog.Log) -> disklesslog.Stream:
    """Stream "u": UNITS batches of BATCH records, one per storage unit; record ``i`` has
    value ``v<i>`` and timestamp ``1000 * (i // BATCH) + i % BATCH``."""
    stream = log.create_stream("u", **UNIT_CONFIG)
    for unit in range(UNITS):
        first = unit * BATCH
        stream.append_batch(
            [b"v%d-" % i + b"." * 120 for i in range(first, first + BATCH)],
            timestamps=[1000 * unit + i for i in range(BATCH)],
        )
    segments = stream.info().details.get("segments")
    if segments is not None:  # a backend of segment files: check the premise
        assert [s["base_offset"] for s in segments] == list(range(0, END, BATCH)), segments
    return stream


def _assert_starts_at(stream: disklesslog.Stream, start: int, end: int) -> None:
    """Every way of reading ``stream`` agrees that it holds exactly ``[start, end)``."""
    assert (stream.start_offset, stream.end_offset) == (start, end)
    expected = list(range(start, end))
    records = list(stream.read())
    assert _offsets(records) == expected
    assert [r.value[: r.value.index(b"-")] for r in records] == [b"v%d" % i for i in expected]  # type: ignore[index, union-attr]
    assert [o for part in stream.read_offsets() for o in part] == expected
    assert [o for batch in stream.read_batches() for o in batch.offsets] == expected
    assert _offsets(stream.read(start, start + 1)) == expected[:1]
    assert stream.info().start_offset == start
    if start:
        with pytest.raises(OffsetOutOfRange) as info:
            stream.read(start - 1)
        assert (info.value.start_offset, info.value.end_offset) == (start, end)
    if start < END:  # time lookups over the records _units wrote
        assert stream.offset_for_time(0) == start
        unit = start // BATCH  # the first record of the unit after the start's, by time
        assert stream.offset_for_time(1000 * (unit + 1)) == (
            (unit + 1) * BATCH if unit + 1 < UNITS else None if end == END else END
        )


class LogContract(LogFixtures, LeaseContract):
    """The Log/Stream contract: appends, reads, streams, trims, durability, follow,
    writers, concurrency and leases, through the public API only."""

    LEASE_MS = 2_000  # real time passes: the expiry test waits this long

    @pytest.fixture
    def lease_owner(self, log: disklesslog.Log) -> disklesslog.Log:
        return log

    @pytest.fixture
    def wait(self) -> Callable[[float], None]:
        return time.sleep

    def test_lease_tokens_never_go_backwards_across_reopen(self, log_factory: LogFactory) -> None:
        first = log_factory()
        lease = first.acquire_lease("m", "a", self.LEASE_MS)
        assert lease is not None
        first.release_lease(lease)
        first.close()
        again = log_factory()
        assert again.lease_holder("m") is None
        taken = again.acquire_lease("m", "b", self.LEASE_MS)
        assert taken is not None and taken.token == lease.token + 1
        again.close()
        third = log_factory()
        held = third.lease_holder("m")
        assert held is not None and (held.holder, held.token) == ("b", taken.token)
        assert third.acquire_lease("m", "c", self.LEASE_MS) is None
        with pytest.raises(LogClosedError):
            again.acquire_lease("m", "b", self.LEASE_MS)

    # ----------------------------------------------------------------------- append

    def test_offsets_are_dense_from_zero(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        assert [stream.append(b"v%d" % i) for i in range(5)] == [0, 1, 2, 3, 4]
        assert stream.append_batch([b"a", b"b", b"c"]) == [5, 6, 7]
        assert stream.start_offset == 0
        assert stream.end_offset == 8

    def test_records_keep_every_field(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        stream.append(b"v0", key=b"k0", headers={"trace": b"t0", "empty": None}, timestamp=1_000)
        stream.append(None, key=b"k1", timestamp=2_000)  # a tombstone
        stream.append(b"", headers=[("dup", b"1"), ("dup", b"2")], timestamp=3_000)
        records = list(stream.read())
        assert records == [
            Record(0, 1_000, b"k0", b"v0", (("trace", b"t0"), ("empty", None))),
            Record(1, 2_000, b"k1", None, ()),
            Record(2, 3_000, None, b"", (("dup", b"1"), ("dup", b"2"))),
        ]
        first = records[0]
        assert (first.offset, first.timestamp, first.key, first.value) == (0, 1_000, b"k0", b"v0")
        offset, _timestamp, _key, value, _headers = first  # unpacks like a tuple
        assert (offset, value) == (0, b"v0")
        with pytest.raises(AttributeError):
            first.value = b"changed"  # type: ignore[misc]

    def test_append_batch_columns(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        offsets = stream.append_batch(
            [b"a", b"b", None],
            keys=[b"1", None, b"3"],
            headers=[None, {"h": b"x"}, [("h", b"y")]],
            timestamps=[10, 30, 20],
        )
        assert offsets == [0, 1, 2]
        assert list(stream.read()) == [
            Record(0, 10, b"1", b"a", ()),
            Record(1, 30, None, b"b", (("h", b"x"),)),
            Record(2, 20, b"3", None, (("h", b"y"),)),
        ]

    def test_default_timestamp_is_now_in_ms(self, log: disklesslog.Log) -> None:
        before = time.time_ns() // 1_000_000
        log.stream("s").append(b"x")
        log.stream("s").append_batch([b"y", b"z"])
        after = time.time_ns() // 1_000_000
        assert all(before <= r.timestamp <= after for r in log.stream("s").read())

    def test_bytearray_values_read_back_as_bytes(self, log: disklesslog.Log) -> None:
        log.stream("s").append(bytearray(b"ba"), key=bytearray(b"k"))  # type: ignore[arg-type]
        (record,) = log.stream("s").read()
        assert (type(record.value), record.value, record.key) == (bytes, b"ba", b"k")

    def test_compressed_stream_round_trips(self, log: disklesslog.Log) -> None:
        stream = log.create_stream("z", compression="zstd")
        values = [b"repetitive " * 50 + b"%d" % i for i in range(200)]
        stream.append_batch(values)
        stream.append(b"single " * 100)
        assert [r.value for r in stream.read()] == [*values, b"single " * 100]

    def test_large_batches_and_records(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        big = bytes(range(256)) * 4096  # 1 MiB minus nothing: exactly the default record limit
        assert len(big) == 1 << 20
        stream.append(big)
        stream.append_batch([b"x" * 1000] * 10_000)
        records = list(stream.read())
        assert records[0].value == big
        assert len(records) == 10_001

    # ------------------------------------------------------------- bad input: nothing written

    @pytest.mark.parametrize(
        "name", ["", ".", "..", "../x", "a/b", "/abs", "x" * 250, "tab\t", "é", "a b", "a\\b"]
    )
    def test_invalid_stream_names_are_rejected(self, log: disklesslog.Log, name: str) -> None:
        with pytest.raises(InvalidStreamName):
            log.stream(name)
        with pytest.raises(InvalidStreamName):
            log.create_stream(name)
        with pytest.raises(InvalidStreamName), log.writer() as writer:
            writer.append(name, b"x")
        assert log.streams() == []

    def test_non_string_stream_name(self, log: disklesslog.Log) -> None:
        with pytest.raises(InvalidStreamName, match="str"):
            log.stream(b"bytes")  # type: ignore[arg-type]

    def test_longest_valid_name_works(self, log: disklesslog.Log) -> None:
        name = "a" * 249
        log.stream(name).append(b"x")
        assert log.streams() == [name]

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"value": "text"}, InvalidRecordError),
            ({"value": 5}, InvalidRecordError),
            ({"value": b"v", "key": "text"}, InvalidRecordError),
            ({"value": b"v", "headers": {"h": "text"}}, InvalidRecordError),
            ({"value": b"v", "headers": {1: b"x"}}, InvalidRecordError),
            ({"value": b"v", "timestamp": 1.5}, InvalidRecordError),
            ({"value": b"v", "timestamp": -1}, InvalidRecordError),
            ({"value": b"v", "timestamp": True}, InvalidRecordError),
            ({"value": b"x" * (1 << 20) + b"!"}, RecordTooLarge),
            ({"value": b"x" * (1 << 19), "key": b"k" * (1 << 19) + b"!"}, RecordTooLarge),
        ],
    )
    def test_bad_records_raise_typed_errors_and_write_nothing(
        self, log: disklesslog.Log, kwargs: dict[str, Any], error: type[Exception]
    ) -> None:
        stream = log.stream("s")
        stream.append(b"before")
        with pytest.raises(error) as info:
            stream.append(**kwargs)
        assert str(info.value)  # a message that says what is wrong
        with pytest.raises(error):
            stream.append_batch(
                [b"ok", kwargs["value"]],
                keys=[None, kwargs.get("key")],
                headers=[None, kwargs.get("headers")],
                timestamps=[1, kwargs["timestamp"]] if "timestamp" in kwargs else None,
            )
        assert [r.value for r in stream.read()] == [b"before"]

    def test_str_value_error_says_to_encode(self, log: disklesslog.Log) -> None:
        with pytest.raises(InvalidRecordError, match=r"encode"):
            log.stream("s").append("text")  # type: ignore[arg-type]
        with pytest.raises(TypeError):  # also a TypeError, for generic handlers
            log.stream("s").append("text")  # type: ignore[arg-type]

    def test_append_batch_is_all_or_nothing(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        with pytest.raises(InvalidRecordError):
            stream.append_batch([b"a", b"b", "c", b"d"])  # type: ignore[list-item]
        with pytest.raises(InvalidRecordError):
            stream.append_batch([b"a", b"b"], keys=[b"k"])  # wrong length
        with pytest.raises(InvalidRecordError):
            stream.append_batch([])
        with pytest.raises(RecordTooLarge):
            stream.append_batch([b"x" * 1000] * 20_000)  # 20 MB > max_batch_bytes (16 MiB)
        assert stream.append_batch([b"ok"]) == [0]
        assert [r.value for r in stream.read()] == [b"ok"]

    def test_per_stream_limits(self, log: disklesslog.Log) -> None:
        stream = log.create_stream("small", max_record_bytes=100, max_batch_bytes=4096)
        stream.append(b"x" * 100)
        with pytest.raises(RecordTooLarge, match="max_record_bytes=100"):
            stream.append(b"x" * 101)
        with pytest.raises(RecordTooLarge, match="max_batch_bytes"):
            stream.append_batch([b"x" * 100] * 50)
        assert stream.end_offset == 1

    @pytest.mark.parametrize(
        "config",
        [
            {"compression": "lz4"},
            {"max_record_bytes": 0},
            {"max_record_bytes": "big"},
            {"segment_bytes": -5},
            {"index_interval_bytes": 1},
            {"no_such_option": 1},
        ],
    )
    def test_bad_stream_config(self, log: disklesslog.Log, config: dict[str, Any]) -> None:
        with pytest.raises(ConfigError):
            log.create_stream("s", **config)
        assert log.streams() == []

    def test_bad_open_options(self, log_factory: LogFactory) -> None:
        with pytest.raises(ConfigError):
            log_factory(no_such_option=True)

    # --------------------------------------------------------------------------- read

    @pytest.fixture
    def ten(self, log: disklesslog.Log) -> disklesslog.Stream:
        stream = log.stream("ten")
        stream.append_batch([b"%d" % i for i in range(5)], timestamps=[100, 110, 120, 130, 140])
        for i in range(5, 10):
            stream.append(b"%d" % i, timestamp=100 + 10 * i)
        return stream

    def test_read_ranges(self, ten: disklesslog.Stream) -> None:
        assert _offsets(ten.read()) == list(range(10))
        assert _offsets(ten.read(3)) == list(range(3, 10))
        assert _offsets(ten.read(3, 7)) == [3, 4, 5, 6]
        assert _offsets(ten.read(2, 100)) == list(range(2, 10))  # end is clipped
        assert _offsets(ten.read(4, 4)) == []
        assert _offsets(ten.read(6, 2)) == []
        assert _offsets(ten.read(10)) == []  # at the end: nothing yet, not an error
        assert _offsets(ten.read(max_records=3)) == [0, 1, 2]
        assert _offsets(ten.read(3, max_records=4)) == [3, 4, 5, 6]
        assert _offsets(ten.read(max_records=0)) == []
        assert [r.value for r in ten.read(8)] == [b"8", b"9"]

    def test_read_beyond_end_or_negative(self, ten: disklesslog.Stream) -> None:
        with pytest.raises(OffsetOutOfRange) as info:
            list(ten.read(11))
        assert (info.value.start_offset, info.value.end_offset) == (0, 10)
        with pytest.raises(OffsetOutOfRange):
            ten.read(-1)
        with pytest.raises(ConfigError):
            ten.read("3")  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            ten.read(max_records=-1)

    def test_read_batches_match_read(self, ten: disklesslog.Stream) -> None:
        batches = list(ten.read_batches(2, 8))
        assert sum(len(b) for b in batches) == 6
        flat = [record for batch in batches for record in batch.records()]
        assert flat == list(ten.read(2, 8))
        for batch in batches:
            assert (
                len(batch.offsets) == len(batch.values) == len(batch.keys) == len(batch.timestamps)
            )
            assert list(batch.offsets) == sorted(batch.offsets)

    def test_read_offsets_match_read_batches(self, ten: disklesslog.Stream) -> None:
        """``read_offsets`` yields, batch by batch, exactly the offsets ``read_batches``
        does, and checks its arguments the same way; so does the base class's default
        (what a third-party backend inherits)."""
        for start, end in [(None, None), (0, 10), (2, 8), (3, None), (4, 5), (6, 2), (10, None)]:
            expected = [list(b.offsets) for b in ten.read_batches(start, end)]
            assert [list(part) for part in ten.read_offsets(start, end)] == expected
            default = disklesslog.Stream.read_offsets(ten, start, end)
            assert [list(part) for part in default] == expected
        assert sum(map(len, ten.read_offsets())) == 10
        # Dense batches need no decoding: their offsets come back as ranges.
        assert all(type(part) is range for part in ten.read_offsets(1))
        with pytest.raises(OffsetOutOfRange) as info:
            ten.read_offsets(11)  # raised at the call, as read_batches does
        assert (info.value.start_offset, info.value.end_offset) == (0, 10)
        with pytest.raises(OffsetOutOfRange):
            ten.read_offsets(-1)
        with pytest.raises(ConfigError):
            ten.read_offsets(0, "5")  # type: ignore[arg-type]

    def test_read_offsets_sees_what_read_sees_after_trim(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        for i in range(6):
            stream.append_batch([b"%d" % i] * 5)
        stream.trim(12)
        assert [o for part in stream.read_offsets() for o in part] == list(range(12, 30))
        with pytest.raises(OffsetOutOfRange):
            list(stream.read_offsets(3))
        assert list(log.stream("s").read_offsets(30)) == []

    def test_read_is_a_snapshot(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        stream.append_batch([b"a", b"b"])
        reader = stream.read()
        assert next(reader).value == b"a"
        stream.append(b"c")  # lands after the read started
        assert [r.value for r in reader] == [b"b"]
        assert [r.value for r in stream.read()] == [b"a", b"b", b"c"]

    def test_offset_for_time(self, ten: disklesslog.Stream) -> None:
        assert ten.offset_for_time(0) == 0
        assert ten.offset_for_time(100) == 0
        assert ten.offset_for_time(101) == 1
        assert ten.offset_for_time(135) == 4
        assert ten.offset_for_time(150) == 5
        assert ten.offset_for_time(190) == 9
        assert ten.offset_for_time(191) is None
        with pytest.raises(ConfigError):
            ten.offset_for_time(1.5)  # type: ignore[arg-type]

    def test_offset_for_time_with_unordered_timestamps(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")
        stream.append_batch([b"a", b"b", b"c"], timestamps=[500, 100, 300])
        stream.append(b"d", timestamp=200)
        # Kafka's rule: the first batch whose max timestamp is >= t, then the first record in it.
        assert stream.offset_for_time(250) == 0
        assert stream.offset_for_time(400) == 0
        assert stream.offset_for_time(501) is None

    def test_empty_and_missing_streams(self, log: disklesslog.Log) -> None:
        missing = log.stream("missing")
        with pytest.raises(StreamNotFound):
            missing.end_offset  # noqa: B018
        with pytest.raises(StreamNotFound):
            list(missing.read())
        with pytest.raises(StreamNotFound):
            missing.trim(0)
        assert "missing" not in log
        empty = log.create_stream("empty")
        assert (empty.start_offset, empty.end_offset) == (0, 0)
        assert list(empty.read()) == []
        assert empty.offset_for_time(0) is None
        assert "empty" in log

    # ---------------------------------------------------------------- stream management

    def test_create_stream_is_idempotent_for_the_same_config(self, log: disklesslog.Log) -> None:
        log.create_stream("s", compression="zstd")
        log.create_stream("s", compression="zstd").append(b"x")
        with pytest.raises(StreamExistsError) as refused:
            log.create_stream("s", compression="none", retention_ms=60_000)
        assert str(refused.value).startswith(
            "stream 's' already exists with compression='zstd' (create_stream asked for "
            "'none'); this setting is fixed when a stream is created"
        )
        assert "retention_ms=" not in str(refused.value)  # alterable: never a conflict
        assert log.stream("s").config.compression == "zstd"

    def test_create_stream_again_keeps_altered_settings(self, log_factory: LogFactory) -> None:
        """Startup code creates its streams on every run, with the settings it was
        written with; maintenance settings altered since are the stream's to keep, so a
        rerun neither fails nor undoes them."""
        first = log_factory()
        created = first.create_stream("s", compression="zstd", retention_ms=60_000)
        created.append(b"x")
        altered = first.alter_stream("s", retention_ms=120_000, retention_bytes=1 << 20)
        again = first.create_stream("s", compression="zstd", retention_ms=60_000)
        assert again.config == altered
        assert (again.config.retention_ms, again.config.retention_bytes) == (120_000, 1 << 20)
        rerun = log_factory().create_stream("s", compression="zstd", retention_ms=60_000)
        assert rerun.config == altered
        assert [r.value for r in rerun.read()] == [b"x"]

    def test_create_stream_names_a_differing_fixed_setting(self, log: disklesslog.Log) -> None:
        """A setting fixed at creation that differs is a mistake the error spells out:
        the setting, the stream's value and the requested one; nothing changes."""
        log.create_stream("s", compression="zstd", cleanup_policy="compact")
        log.alter_stream("s", retention_ms=120_000)
        with pytest.raises(StreamExistsError) as caught:
            log.create_stream("s", compression="none", cleanup_policy="compact", retention_ms=1)
        message = str(caught.value)
        assert "compression='zstd'" in message and "'none'" in message, message
        assert "retention_ms=" not in message, message  # alterable: not a difference
        with pytest.raises(StreamExistsError) as caught:
            log.create_stream("s", segment_bytes=1 << 20)
        message = str(caught.value)
        for words in ("compression='zstd'", "cleanup_policy='compact'", "segment_bytes="):
            assert words in message, message
        kept = log.stream("s").config
        assert (kept.compression, kept.cleanup_policy, kept.retention_ms) == (
            "zstd",
            "compact",
            120_000,
        )

    def test_concurrent_create_stream_makes_one_stream(self, log_factory: LogFactory) -> None:
        """Two processes starting at once, with maintenance settings that differ (one
        runs newer startup code): one stream, which both get, with the winner's settings."""
        logs = [log_factory(), log_factory()]
        barrier = threading.Barrier(len(logs))
        streams: list[disklesslog.Stream] = []
        failures: list[BaseException] = []

        def create(log: disklesslog.Log, retention_ms: int) -> None:
            barrier.wait()
            try:
                streams.append(
                    log.create_stream("s", compression="zstd", retention_ms=retention_ms)
                )
            except BaseException as exc:  # reported below, in the test's thread
                failures.append(exc)

        threads = [
            threading.Thread(target=create, args=(log, 1000 * (i + 1)))
            for i, log in enumerate(logs)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert [log.streams() for log in logs] == [["s"], ["s"]]
        assert streams[0].config == streams[1].config
        assert streams[0].config.retention_ms in (1000, 2000)
        assert sorted(stream.append(b"x") for stream in streams) == [0, 1]

    def test_streams_lists_sorted(self, log: disklesslog.Log) -> None:
        for name in ["b", "a", "c.d", "A_1-x"]:
            log.stream(name).append(b"x")
        assert log.streams() == sorted(["b", "a", "c.d", "A_1-x"])

    def test_delete_stream(self, log: disklesslog.Log) -> None:
        log.stream("gone").append_batch([b"1", b"2"])
        log.stream("kept").append(b"k")
        log.delete_stream("gone")
        assert log.streams() == ["kept"]
        with pytest.raises(StreamNotFound):
            list(log.stream("gone").read())
        with pytest.raises(StreamNotFound):
            log.delete_stream("gone")
        assert log.stream("gone").append(b"new") == 0  # recreated from offset 0
        assert [r.value for r in log.stream("gone").read()] == [b"new"]

    def test_deleted_stream_is_gone_for_another_log_handle(self, log_factory: LogFactory) -> None:
        first, second = log_factory(), log_factory()
        first.stream("s").append_batch([b"1", b"2"])
        assert second.stream("s").end_offset == 2
        first.delete_stream("s")
        with pytest.raises(StreamNotFound):
            second.stream("s").end_offset  # noqa: B018
        assert second.stream("s").append(b"again") == 0

    def test_appends_go_on_after_another_handle_recreates_the_stream(
        self, log_factory: LogFactory
    ) -> None:
        """Another process deletes a stream and creates it again: this log's appends (single
        ones and every writer's) land in the new stream, after whatever the other process
        put there, instead of being refused for the old stream's numbering forever."""
        first, second = log_factory(), log_factory()
        anonymous = first.writer(linger_ms=0)
        # Object logs' writers are idempotent producers, anonymous or named.
        named_option: dict[str, Any] = {"producer": "named"} if self.named_producers else {}
        named = first.writer(linger_ms=0, **named_option)
        first.stream("s").append_batch([b"1", b"2"])
        assert anonymous.append("s", b"3").result() == 2
        assert named.append("s", b"4").result() == 3
        second.delete_stream("s")
        second.create_stream("s")
        assert second.stream("s").append(b"theirs") == 0
        assert first.stream("s").append(b"a") == 1
        assert anonymous.append("s", b"b").result() == 2
        assert named.append("s", b"c").result() == 3
        assert first.stream("s").append_batch([b"d", b"e"]) == [4, 5]
        second.delete_stream("s")  # again, and nothing written before this log's appends
        second.create_stream("s")
        assert named.append("s", b"f").result() == 0
        assert anonymous.append("s", b"g").result() == 1
        assert first.stream("s").append(b"h") == 2
        anonymous.close()
        named.close()
        assert [r.value for r in second.stream("s").read()] == [b"f", b"g", b"h"]
        assert [r.value for r in first.stream("s").read()] == [b"f", b"g", b"h"]

    # ---------------------------------------------------------------------------- trim

    def test_trim(self, ten: disklesslog.Stream) -> None:
        ten.trim(3)
        assert ten.start_offset == 3
        assert _offsets(ten.read()) == list(range(3, 10))
        with pytest.raises(OffsetOutOfRange) as info:
            ten.read(2)
        assert info.value.start_offset == 3
        ten.trim(1)  # backwards: no-op
        assert ten.start_offset == 3
        with pytest.raises(OffsetOutOfRange):
            ten.trim(11)
        ten.trim(10)
        assert (ten.start_offset, ten.end_offset) == (10, 10)
        assert list(ten.read()) == []
        assert ten.append(b"next") == 10
        assert _offsets(ten.read()) == [10]
        assert ten.offset_for_time(0) == 10

    def test_trim_persists(self, log_factory: LogFactory) -> None:
        log = log_factory()
        log.stream("s").append_batch([b"%d" % i for i in range(20)])
        log.stream("s").trim(7)
        log.close()
        again = log_factory()
        assert again.stream("s").start_offset == 7
        assert _offsets(again.stream("s").read()) == list(range(7, 20))

    @pytest.mark.parametrize("at", list(BOUNDARIES))
    def test_trim_at_the_edges_of_storage_units(self, log_factory: LogFactory, at: str) -> None:
        """A trim to the first or the last offset of a segment (or batch) keeps the unit
        that holds the new start, and only units wholly below it go: after the trim, after
        reopening, and after appending more."""
        before = BOUNDARIES[at]
        log = log_factory()
        stream = _units(log)
        stream.trim(before)
        _assert_starts_at(stream, before, END)
        log.close()
        again = log_factory()
        stream = again.stream("u")
        _assert_starts_at(stream, before, END)
        assert stream.append_batch([b"v%d-" % END, b"v%d-" % (END + 1)]) == [END, END + 1]
        _assert_starts_at(stream, before, END + 2)

    def test_successive_trims_across_unit_edges(self, log_factory: LogFactory) -> None:
        """Trims that walk over units edge by edge (last offset of one, first of the next),
        then to the last offset and the end, each checked at once, and after reopening at
        the last offset of a unit and at the end."""
        log = log_factory()
        _units(log)
        edges = [o for unit in range(1, 4) for o in (unit * BATCH - 1, unit * BATCH)]
        for before in [0, 1, *edges, END - 1, END]:
            log.stream("u").trim(before)
            _assert_starts_at(log.stream("u"), before, END)
            if before in (3 * BATCH - 1, END):
                log.close()
                log = log_factory()
                _assert_starts_at(log.stream("u"), before, END)
        assert log.stream("u").append(b"v%d-" % END) == END
        _assert_starts_at(log.stream("u"), END, END + 1)

    # ------------------------------------------------------------------- durability

    def test_reopen_keeps_everything(self, log_factory: LogFactory) -> None:
        log = log_factory()
        stream = log.stream("s")
        stream.append_batch([b"%d" % i for i in range(100)], keys=[b"k"] * 100)
        stream.append(b"last", headers={"h": b"v"})
        expected = list(stream.read())
        log.close()
        again = log_factory()
        assert list(again.stream("s").read()) == expected
        assert again.stream("s").append(b"more") == 101

    def test_closed_log_refuses_work(self, log_factory: LogFactory) -> None:
        log = log_factory()
        stream = log.stream("s")
        stream.append(b"x")
        log.close()
        log.close()  # idempotent
        assert log.closed
        for action in (
            lambda: log.stream("s"),
            lambda: stream.append(b"y"),
            lambda: list(stream.read()),
            log.streams,
            log.writer,
        ):
            with pytest.raises(LogClosedError):
                action()

    def test_log_is_a_context_manager(self, log_factory: LogFactory) -> None:
        with log_factory() as log:
            log.stream("s").append(b"x")
        assert log.closed

    # --------------------------------------------------------------------------- follow

    def test_follow_tails_new_records(self, log: disklesslog.Log) -> None:
        """Default start is the end offset: only records appended after following began."""
        stream = log.stream("s")
        stream.append(b"old")
        seen: list[bytes] = []
        done = threading.Event()

        def consume() -> None:
            for record in stream.follow(poll_interval=0.01, idle_timeout=10.0):
                seen.append(record.value)  # type: ignore[arg-type]
                if len(seen) == 3:
                    break
            done.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        n = 0
        while not done.wait(0.01) and n < 2000:  # keep appending until it has seen three
            stream.append(b"n%04d" % n)
            n += 1
        consumer.join(10)
        assert len(seen) == 3 and b"old" not in seen
        first = int(seen[0][1:])
        assert seen == [b"n%04d" % i for i in range(first, first + 3)]

    def test_follow_from_an_offset_and_idle_timeout(self, ten: disklesslog.Stream) -> None:
        started = time.monotonic()
        assert _offsets(ten.follow(7, poll_interval=0.01, idle_timeout=0.1)) == [7, 8, 9]
        assert time.monotonic() - started < 5

    def test_follow_waits_for_the_stream_to_exist(self, log: disklesslog.Log) -> None:
        seen: list[bytes] = []
        consumer = threading.Thread(
            target=lambda: seen.extend(
                r.value  # type: ignore[misc]
                for r in log.stream("later").follow(0, poll_interval=0.01, idle_timeout=1.0)
            )
        )
        consumer.start()
        time.sleep(0.05)
        log.stream("later").append(b"first")
        consumer.join(10)
        assert seen == [b"first"]

    def test_follow_rejects_bad_poll_interval(self, ten: disklesslog.Stream) -> None:
        with pytest.raises(ConfigError):
            next(ten.follow(poll_interval=0))

    # --------------------------------------------------------------------------- writer

    def test_writer_futures_resolve_to_offsets(self, log: disklesslog.Log) -> None:
        with log.writer(linger_ms=1) as writer:
            futures = [writer.append(f"s{i % 3}", b"%d" % i, key=b"k") for i in range(30)]
            writer.flush()
            assert all(f.done() for f in futures)
        by_stream: dict[str, list[int]] = {}
        for i, future in enumerate(futures):
            by_stream.setdefault(f"s{i % 3}", []).append(future.result())
        assert by_stream == {name: list(range(10)) for name in ("s0", "s1", "s2")}
        for name in ("s0", "s1", "s2"):
            values = [r.value for r in log.stream(name).read()]
            assert values == [b"%d" % i for i in range(30) if f"s{i % 3}" == name]

    def test_writer_keeps_order_and_all_fields(self, log: disklesslog.Log) -> None:
        with log.writer(linger_ms=50) as writer:
            for i in range(1000):
                writer.append(
                    "s",
                    b"%d" % i,
                    key=b"k%d" % (i % 7),
                    headers={"i": b"%d" % i},
                    timestamp=1_000 + i,
                )
        records = list(log.stream("s").read())
        assert [r.offset for r in records] == list(range(1000))
        assert records[999] == Record(999, 1_999, b"k5", b"999", (("i", b"999"),))

    def test_writer_append_batch_keeps_what_it_was_given(self, log: disklesslog.Log) -> None:
        """A writer encodes at its flush: a caller reusing its lists after ``append_batch``
        returns must not change what is written."""
        values, keys = [b"v0", b"v1"], [b"k0", b"k1"]
        with log.writer(linger_ms=60_000) as writer:
            future = writer.append_batch("s", values, keys=keys)
            values[:] = [b"changed", b"changed"]
            keys.clear()
            writer.flush()
        assert future.result() == [0, 1]
        assert [(r.key, r.value) for r in log.stream("s").read()] == [
            (b"k0", b"v0"),
            (b"k1", b"v1"),
        ]

    def test_writer_flushes_on_buffer_size(self, log: disklesslog.Log) -> None:
        with log.writer(linger_ms=60_000, max_buffer_bytes=64 * 1024) as writer:
            futures = [writer.append("s", b"x" * 1000) for _ in range(200)]
            futures[100].result(timeout=10)  # flushed long before the linger expired
        assert log.stream("s").end_offset == 200

    def test_writer_splits_batches_at_max_batch_bytes(self, log: disklesslog.Log) -> None:
        log.create_stream("small", max_batch_bytes=8192, max_record_bytes=1000)
        with log.writer(linger_ms=60_000) as writer:
            futures = [writer.append("small", b"y" * 1000) for _ in range(50)]
        assert [f.result() for f in futures] == list(range(50))
        assert len(list(log.stream("small").read_batches())) > 1

    def test_writer_rejects_bad_input_at_append(self, log: disklesslog.Log) -> None:
        with log.writer() as writer:
            with pytest.raises(InvalidRecordError):
                writer.append("s", "text")  # type: ignore[arg-type]
            with pytest.raises(RecordTooLarge):
                writer.append("s", b"x" * (2 << 20))
            with pytest.raises(InvalidStreamName):
                writer.append("../s", b"x")
            good = writer.append("s", b"ok")
        assert good.result() == 0
        assert [r.value for r in log.stream("s").read()] == [b"ok"]

    @pytest.mark.parametrize("options", [{"linger_ms": -1}, {"max_buffer_bytes": 10}])
    def test_writer_bad_options(self, log: disklesslog.Log, options: dict[str, Any]) -> None:
        with pytest.raises(ConfigError):
            log.writer(**options)

    def test_writer_after_close(self, log: disklesslog.Log) -> None:
        writer = log.writer()
        future = writer.append("s", b"x")
        writer.close()
        assert future.result() == 0
        with pytest.raises(LogClosedError):
            writer.append("s", b"y")
        writer.close()  # idempotent

    def test_log_close_closes_its_writers(self, log_factory: LogFactory) -> None:
        log = log_factory()
        writer = log.writer(linger_ms=60_000)
        future = writer.append("s", b"x")
        log.close()
        assert future.result(timeout=5) == 0
        assert writer.closed

    def test_writer_from_many_threads(self, log: disklesslog.Log) -> None:
        with log.writer(linger_ms=2) as writer:

            def produce(tag: int) -> None:
                for i in range(500):
                    writer.append("s", b"%d:%d" % (tag, i))

            threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        values = [r.value for r in log.stream("s").read()]
        assert len(values) == len(set(values)) == 2000
        for tag in range(4):
            mine = [v for v in values if v.startswith(b"%d:" % tag)]  # type: ignore[union-attr]
            assert mine == [b"%d:%d" % (tag, i) for i in range(500)]

    # ---------------------------------------------------------------------- concurrency

    def test_threads_appending_to_one_stream(self, log: disklesslog.Log) -> None:
        stream = log.stream("s")

        def produce(tag: int) -> None:
            for i in range(300):
                if i % 3:
                    stream.append(b"%d:%d" % (tag, i))
                else:
                    stream.append_batch([b"%d:%d" % (tag, i)])

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        records = list(stream.read())
        assert [r.offset for r in records] == list(range(1200))
        values = [r.value for r in records]
        assert len(set(values)) == 1200
        for tag in range(4):
            assert [v for v in values if v.startswith(b"%d:" % tag)] == [  # type: ignore[union-attr]
                b"%d:%d" % (tag, i) for i in range(300)
            ]

    def test_readers_during_appends_see_prefixes(self, log: disklesslog.Log) -> None:
        stream = log.create_stream("s")
        stop = threading.Event()
        problems: list[str] = []

        def read_loop() -> None:
            while not stop.is_set():
                values = [r.value for r in stream.read()]
                if values != [b"%d" % i for i in range(len(values))]:
                    problems.append(f"not a prefix: {values[:5]}...")

        readers = [threading.Thread(target=read_loop) for _ in range(2)]
        for reader in readers:
            reader.start()
        for i in range(0, 2000, 10):
            stream.append_batch([b"%d" % j for j in range(i, i + 10)])
        stop.set()
        for reader in readers:
            reader.join()
        assert problems == []
        assert stream.end_offset == 2000
