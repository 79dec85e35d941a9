"""Option parsing, the streaming reader's planning rules and the Arrow columns, without a
JVM (fast: these run in the default suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

import disklesslog
from disklesslog import ConfigError
from disklesslog.objects.log import ObjectLog
from disklesslog.spark.options import LogOptions, parse_log_options, parse_read_options
from disklesslog.spark.read import split_range
from disklesslog.spark.schema import read_schema
from disklesslog.spark.stream import StreamReader, admit

SCHEMA = read_schema(False)


def test_every_read_option_parsed() -> None:
    options = parse_read_options(
        {
            "url": "/data/log",
            "streams": "a, b,a",
            "startingoffsets": '{"a": 5, "b": -2}',
            "endingoffsets": "latest",
            "maxrecordsperpartition": "1000",
            "maxrecordspertrigger": "50",
            "includeheaders": "TRUE",
            "failondataloss": "false",
            "sequencer": "sqlite:///tmp/meta.db",
            "backend": "objects",
        }
    )
    assert options.streams == ("a", "b")
    assert options.starting_offsets == {"a": 5, "b": -2}
    assert options.ending_offsets == "latest"
    assert options.max_records_per_partition == 1000
    assert options.max_records_per_trigger == 50
    assert options.include_headers is True
    assert options.fail_on_data_loss is False
    assert options.log == LogOptions("/data/log", "objects", "sqlite:///tmp/meta.db", {})


def test_defaults_and_pattern() -> None:
    options = parse_read_options({"path": "/data/log", "streamPattern": "ev.*"})
    assert options.log.url == "/data/log"
    assert options.starting_offsets is None  # batch: earliest, streaming: latest
    assert options.ending_offsets == "latest"
    assert options.include_headers is False
    assert options.fail_on_data_loss is True
    assert options.select(["ev", "events", "xevents", "e"]) == ["ev", "events"]


def test_storage_options_nest_and_override_json() -> None:
    log = parse_log_options(
        {
            "url": "s3://bucket/log",
            "storageOptions": '{"anon": false, "key": "K", "client_kwargs": {"region_name": "x"}}',
            "storage.key": "K2",
            "storage.client_kwargs.endpoint_url": "http://127.0.0.1:9000",
        }
    )
    assert log.storage_options == {
        "anon": False,
        "key": "K2",
        "client_kwargs": {"region_name": "x", "endpoint_url": "http://127.0.0.1:9000"},
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"streams": "a"}, "needs the log's URL"),
        ({"url": "/l"}, "exactly one of the options streams"),
        ({"url": "/l", "streams": "a", "streamPattern": "a"}, "exactly one of the options"),
        ({"url": "/l", "streams": "a/b"}, "invalid stream name"),
        ({"url": "/l", "streams": " , "}, "names no stream"),
        ({"url": "/l", "streamPattern": "("}, "not a valid regex"),
        ({"url": "/l", "streams": "a", "startingOffsets": "first"}, "startingOffsets must be"),
        ({"url": "/l", "streams": "a", "startingOffsets": '{"a": "1"}'}, "must be an integer"),
        ({"url": "/l", "streams": "a", "startingOffsets": '{"a": -3}'}, "must be an integer"),
        ({"url": "/l", "streams": "a", "endingOffsets": "earliest"}, "cannot be 'earliest'"),
        ({"url": "/l", "streams": "a", "endingOffsets": '{"a": -2}'}, "cannot use -2"),
        (
            {"url": "/l", "streams": "a", "startingOffsets": "latest", "startingTimestamp": "1"},
            "not both",
        ),
        ({"url": "/l", "streams": "a", "startingTimestamp": "yesterday"}, "milliseconds"),
        ({"url": "/l", "streams": "a", "maxRecordsPerPartition": "0"}, "positive integer"),
        ({"url": "/l", "streams": "a", "maxRecordsPerTrigger": "many"}, "positive integer"),
        ({"url": "/l", "streams": "a", "includeHeaders": "yes"}, "true or false"),
        ({"url": "/l", "streams": "a", "startingOfsets": "earliest"}, "unknown read option"),
        ({"url": "/l", "streams": "a", "storageOptions": "[1]"}, "must be a JSON object"),
        ({"url": "/l", "streams": "a", "storage.": "x"}, "needs a name after"),
        ({"url": "/l", "path": "/m", "streams": "a"}, "give the log's URL once"),
    ],
)
def test_bad_options_say_which(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_read_options(options)


def test_split_range_by_offsets() -> None:
    assert [(p.start, p.end) for p in split_range("s", 3, 10, 3)] == [(3, 6), (6, 9), (9, 10)]
    assert [(p.start, p.end) for p in split_range("s", 3, 10, None)] == [(3, 10)]
    assert split_range("s", 5, 5, 3) == []


def test_admission_shares_the_budget_by_backlog() -> None:
    begin = {"a": 0, "b": 10, "c": 5}
    latest = {"a": 90, "b": 20, "c": 5}
    ends = admit(begin, latest, 20)
    taken = {name: ends[name] - begin[name] for name in ends}
    assert taken == {"a": 18, "b": 2, "c": 0}
    assert admit(begin, latest, 1000) == latest
    # a tiny budget still lets streams advance, never past their end
    tiny = admit(begin, latest, 1)
    assert sum(tiny[n] - begin[n] for n in tiny) == 1
    assert all(begin[n] <= tiny[n] <= latest[n] for n in tiny)


def test_stream_reader_planning_without_spark(tmp_path: Path) -> None:
    """The calls Spark 4.0/4.1 make on the driver, made directly: the zero-argument
    ``latestOffset()``, new streams, and ``maxRecordsPerTrigger`` refused."""
    url = str(tmp_path / "log")
    with disklesslog.open(url, fsync="never") as log:
        log.stream("a").append_batch([b"x"] * 10)
        reader = StreamReader(parse_read_options({"url": url, "streamPattern": ".*"}), SCHEMA)
        try:
            assert reader.initialOffset() == {"a": 10}  # streaming default: latest
            log.stream("a").append_batch([b"x"] * 5)
            assert reader.latestOffset() == {"a": 15}
            log.stream("b").append_batch([b"y"] * 4)  # a new stream: from its earliest
            assert reader.latestOffset() == {"a": 15, "b": 4}
            parts = reader.partitions({"a": 10}, {"a": 15, "b": 4})
            assert [(p.stream, p.start, p.end) for p in parts] == [("a", 10, 15), ("b", 0, 4)]
        finally:
            reader.stop()
        limited = StreamReader(
            parse_read_options({"url": url, "streams": "a", "maxRecordsPerTrigger": "2"}), SCHEMA
        )
        try:
            with pytest.raises(ConfigError, match=r"needs Spark 4\.2"):
                limited.latestOffset()
        finally:
            limited.stop()


def test_stream_reader_admission_control_without_spark(tmp_path: Path) -> None:
    """The calls Spark 4.2+ make: ``latestOffset(start, limit)`` with admission control,
    and Trigger.AvailableNow."""
    streaming = pytest.importorskip("pyspark.sql.streaming.datasource", reason="Spark 4.2+")
    read_all, read_max = streaming.ReadAllAvailable, streaming.ReadMaxRows
    url = str(tmp_path / "log")
    with disklesslog.open(url, fsync="never") as log:
        log.stream("a").append_batch([b"x"] * 15)
        log.stream("b").append_batch([b"y"] * 4)
        reader = StreamReader(parse_read_options({"url": url, "streamPattern": ".*"}), SCHEMA)
        try:
            assert reader.latestOffset({"a": 10}, read_all()) == {"a": 15, "b": 4}
            assert reader.latestOffset({"a": 10}, read_max(3)) == {"a": 12, "b": 1}
            reader.prepareForTriggerAvailableNow()
            log.stream("a").append_batch([b"x"] * 5)
            log.stream("c").append_batch([b"z"])  # after the trigger: not read
            assert reader.latestOffset({"a": 15, "b": 4}, read_all()) == {"a": 15, "b": 4}
        finally:
            reader.stop()
        limited = StreamReader(
            parse_read_options({"url": url, "streams": "a", "maxRecordsPerTrigger": "2"}), SCHEMA
        )
        try:
            assert limited.getDefaultReadLimit() == read_max(2)
        finally:
            limited.stop()


def test_fixed_schema() -> None:
    options = parse_read_options({"url": "/l", "streams": "a"})
    with pytest.raises(ConfigError, match="fixed schema"):
        StreamReader(options, read_schema(True))


def test_log_options_open(tmp_path: Path) -> None:
    """Readers never create a log; storage options of a local log are its tier's (an
    error for a log without a tier)."""
    from disklesslog import InvalidURL

    with pytest.raises(InvalidURL, match="this does not create a log"):
        LogOptions(str(tmp_path / "missing")).open()
    disklesslog.open(tmp_path / "local").close()
    with pytest.raises(ConfigError, match="this log has no tier"):
        LogOptions(str(tmp_path / "local"), storage_options={"anon": "false"}).open()
    url = f"file://{tmp_path}/objects"
    with LogOptions(url, backend="objects").open(create=True) as log:
        log.stream("s").append(b"x")
    with LogOptions(url, backend="objects").open() as log:
        assert log.streams() == ["s"]


def test_to_arrow_builds_spark_columns() -> None:
    """Dense offsets (built from one iota) and offsets with compaction gaps, tombstones,
    missing keys, headers and the ms -> us timestamp cast, in Spark's exact schema."""
    from disklesslog import RecordBatch
    from disklesslog.spark.read import to_arrow
    from disklesslog.spark.schema import arrow_schema

    schema = arrow_schema(read_schema(True))
    dense = [
        RecordBatch(range(5, 7), (1000, 1001), (b"k", None), (b"v", None), ((("h", b"x"),), ())),
        RecordBatch(range(7, 8), (1002,), (b"k",), (b"w",), ((("h", None), ("h", b"y")),)),
    ]
    [out] = to_arrow(iter(dense), "s", schema)
    assert out.schema.equals(schema)
    assert out.column("offset").to_pylist() == [5, 6, 7]
    assert out.column("key").to_pylist() == [b"k", None, b"k"]
    assert out.column("value").to_pylist() == [b"v", None, b"w"]
    assert out.column("stream").to_pylist() == ["s"] * 3
    assert out.column("headers").to_pylist() == [
        [{"key": "h", "value": b"x"}],
        [],
        [{"key": "h", "value": None}, {"key": "h", "value": b"y"}],
    ]
    micros = out.column("timestamp").cast("int64").to_pylist()
    assert micros == [1_000_000, 1_001_000, 1_002_000]

    gaps = [*dense, RecordBatch((9, 12), (2000, 2000), (None, None), (b"a", b"b"), ((), ()))]
    [out] = to_arrow(iter(gaps), "s", arrow_schema(read_schema(False)))
    assert out.column("offset").to_pylist() == [5, 6, 7, 9, 12]
    assert out.column("timestamp").cast("int64").to_pylist()[-1] == 2_000_000


def test_offsets_to_arrow_builds_offset_and_stream_columns() -> None:
    """Offsets alone make the ``offset`` and ``stream`` columns: dense runs stay a first
    offset and a count until a gap (or a tuple from a batch with gaps) appears."""
    import pyarrow as pa

    from disklesslog.spark.read import offsets_to_arrow
    from disklesslog.spark.schema import arrow_schema

    schema = arrow_schema(read_schema(columns=("offset", "stream")))
    cases = [
        ([range(5, 7), range(7, 10)], [5, 6, 7, 8, 9]),
        ([range(5, 7), (8, 11), range(12, 14)], [5, 6, 8, 11, 12, 13]),
        ([range(2), range(4, 5)], [0, 1, 4]),
        ([(3, 9)], [3, 9]),
    ]
    for parts, expected in cases:
        [out] = offsets_to_arrow(iter(parts), "s", schema)
        assert out.schema.equals(schema)
        assert out.column("offset").to_pylist() == expected
        assert out.column("stream").to_pylist() == ["s"] * len(expected)
    assert list(offsets_to_arrow(iter([]), "s", schema)) == []
    with pytest.raises(ValueError, match="offsets give only"):
        offsets_to_arrow(iter([range(3)]), "s", arrow_schema(read_schema(False)))
    assert pa.types.is_int64(schema.field("offset").type)


def test_columns_option_picks_and_orders_columns() -> None:
    """``columns`` names a subset in the order wanted; the schema, the Arrow batches and
    their contents follow it; bad lists are refused with the valid names."""
    from disklesslog import RecordBatch
    from disklesslog.spark.read import to_arrow
    from disklesslog.spark.schema import arrow_schema

    options = parse_read_options({"url": "/l", "streams": "a", "columns": " value , offset"})
    assert options.columns == ("value", "offset") and not options.include_headers
    schema = read_schema(columns=options.columns)
    assert schema.fieldNames() == ["value", "offset"]
    with_headers = parse_read_options(
        {"url": "/l", "streams": "a", "columns": "headers,key", "includeHeaders": "true"}
    )
    assert with_headers.include_headers
    batches = [RecordBatch(range(3, 5), (1, 2), (b"k", None), (b"v", b"w"), ((), ()))]
    [out] = to_arrow(iter(batches), "s", arrow_schema(schema))
    assert out.schema.names == ["value", "offset"]
    assert out.column("value").to_pylist() == [b"v", b"w"]
    assert out.column("offset").to_pylist() == [3, 4]
    for bad, message in [
        ("value,topic", "'topic'"),
        ("value,,key", "an empty column"),
        ("key,key", "twice"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_read_options({"url": "/l", "streams": "a", "columns": bad})
    with pytest.raises(ConfigError, match="omit headers"):
        parse_read_options(
            {"url": "/l", "streams": "a", "columns": "key", "includeHeaders": "true"}
        )


def test_retry_deadline_reaches_the_log(tmp_path: Path) -> None:
    """``retryDeadlineMs`` is the log's ``retry_deadline_ms``: parsed on the driver (a bad
    value names the option) and given to the log every executor opens."""
    options = parse_log_options({"url": f"memory://{tmp_path.name}/log", "retrydeadlinems": "250"})
    assert options.retry_deadline_ms == 250
    with options.open(create=True) as log:
        assert isinstance(log, ObjectLog)
        assert log.storage.retry_deadline == 0.25
    assert parse_log_options({"url": "/data/log"}).retry_deadline_ms is None
    for bad in ("0", "-5", "soon"):
        with pytest.raises(ConfigError, match="retryDeadlineMs"):
            parse_log_options({"url": "/data/log", "retryDeadlineMs": bad})
