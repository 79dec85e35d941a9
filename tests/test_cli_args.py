"""The argparse types of ``disklesslog.cli.args``: what each accepts, the message of each
refusal, and that argparse turns a refusal into ``argument OPTION: MESSAGE`` and exit
code 2 for every option that uses the type."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from disklesslog.cli import build_parser, main
from disklesslog.cli.args import (
    FromEnd,
    byte_size,
    duration_ms,
    from_position,
    key_separator,
    offset,
    positive,
    positive_seconds,
    seconds,
    setting,
    size,
    start_offset,
    storage_option,
    timestamp_ms,
)

NOT_A_SIZE = "(an integer, optionally with KiB, MiB, GiB or TiB)"
NOT_A_DURATION = "(a number, optionally with ms, s, m, h, d or w)"
NOT_A_POSITION = "(an offset N, -N for N before the end, 'start' or 'end')"
NOT_A_TIME = "(ISO 8601 such as 2024-05-01T12:00:00Z, or milliseconds since the epoch)"


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (byte_size, "1024", 1024),
        (byte_size, "4KiB", 4096),
        (byte_size, " 4 kib ", 4096),
        (byte_size, "64MiB", 64 << 20),
        (byte_size, "1gib", 1 << 30),
        (byte_size, "2GIB", 2 << 30),
        (byte_size, "1TiB", 1 << 40),
        (size, "8KiB", 8192),
        (size, "100", 100),
        (size, "-1", -1),
        (size, "-2", -2),
        (duration_ms, "500ms", 500),
        (duration_ms, "30s", 30_000),
        (duration_ms, "1.5s", 1500),
        (duration_ms, "5m", 300_000),
        (duration_ms, "12h", 43_200_000),
        (duration_ms, "7d", 604_800_000),
        (duration_ms, "2w", 1_209_600_000),
        (duration_ms, " 7 D ", 604_800_000),
        (duration_ms, "86400000", 86_400_000),
        (duration_ms, "-1", -1),
        (duration_ms, "-2", -2),
        (timestamp_ms, "0", 0),
        (timestamp_ms, "1714564800000", 1_714_564_800_000),
        (timestamp_ms, "2024-05-01T12:00:00Z", 1_714_564_800_000),
        (timestamp_ms, "2024-05-01T14:00:00+02:00", 1_714_564_800_000),
        (timestamp_ms, "2024-05-01T12:00:00.250+00:00", 1_714_564_800_250),
        (seconds, "0", 0.0),
        (seconds, "300", 300.0),
        (seconds, "0.25", 0.25),
        (seconds, "1e3", 1000.0),
        (seconds, "inf", float("inf")),
        (seconds, "5s", 5.0),
        (seconds, "500ms", 0.5),
        (seconds, "5m", 300.0),
        (seconds, "7d", 604_800.0),
        (positive_seconds, "100ms", 0.1),
        (positive_seconds, "1m", 60.0),
        (positive_seconds, "0.1", 0.1),
        (positive_seconds, "30", 30.0),
        (offset, "0", 0),
        (offset, "17", 17),
        (start_offset, "0", 0),
        (start_offset, "12", 12),
        (positive, "1", 1),
        (positive, "1000", 1000),
        (from_position, "start", "start"),
        (from_position, "end", "end"),
        (from_position, "5", 5),
        (from_position, "-5", FromEnd(5)),
        (from_position, "-0", FromEnd(0)),
        (storage_option, "anon=true", ("anon", True)),
        (storage_option, "profile=dev", ("profile", "dev")),
        (storage_option, "empty=", ("empty", "")),
        (storage_option, 'kw={"a": 1}', ("kw", {"a": 1})),
        (setting, "retention_ms=86400000", ("retention_ms", 86400000)),
        (setting, "min_cleanable_dirty_ratio=0.3", ("min_cleanable_dirty_ratio", 0.3)),
        (setting, "min_cleanable_dirty_ratio=1", ("min_cleanable_dirty_ratio", 1)),
        (setting, "retention_bytes=8KiB", ("retention_bytes", 8192)),
        (setting, "retention_bytes=-1", ("retention_bytes", -1)),
        (setting, "local_retention_bytes=-2", ("local_retention_bytes", -2)),
        (setting, "segment_bytes=1MiB", ("segment_bytes", 1 << 20)),
        (setting, "retention_ms=7d", ("retention_ms", 604_800_000)),
        (setting, "delete_retention_ms=12h", ("delete_retention_ms", 43_200_000)),
        (setting, "segment_ms=30s", ("segment_ms", 30_000)),
        (setting, "local_retention_ms=500ms", ("local_retention_ms", 500)),
        (setting, "retention.ms=1d", ("retention_ms", 86_400_000)),
        (setting, "compression=zstd", ("compression", "zstd")),
        (setting, 'compression="zstd"', ("compression", "zstd")),
        (setting, "cleanup_policy=compact,delete", ("cleanup_policy", "compact,delete")),
        (setting, "cleanup.policy=compact", ("cleanup_policy", "compact")),
        (setting, "no_such_setting=3", ("no_such_setting", 3)),
        (key_separator, ":", b":"),
        (key_separator, "\t|", b"\t|"),
    ],
)
def test_accepted_inputs(parse: Callable[[str], Any], text: str, value: Any) -> None:
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (byte_size, "5MB", f"not a size: '5MB' {NOT_A_SIZE}"),
        (byte_size, "1GB", f"not a size: '1GB' {NOT_A_SIZE}"),
        (byte_size, "1.5MiB", f"not a size: '1.5MiB' {NOT_A_SIZE}"),
        (byte_size, "KiB", f"not a size: 'KiB' {NOT_A_SIZE}"),
        (byte_size, "", f"not a size: '' {NOT_A_SIZE}"),
        (byte_size, "5", "must be at least 1024 bytes, not 5"),
        (byte_size, "1023", "must be at least 1024 bytes, not 1023"),
        (byte_size, "0KiB", "must be at least 1024 bytes, not 0KiB"),
        (byte_size, "-4096", "must be at least 1024 bytes, not -4096"),
        (byte_size, "8KB", f"not a size: '8KB' {NOT_A_SIZE}"),
        (size, "8 kb", f"not a size: '8 kb' {NOT_A_SIZE}"),
        (size, "lots", f"not a size: 'lots' {NOT_A_SIZE}"),
        (seconds, "abc", f"not a duration: 'abc' {NOT_A_DURATION}"),
        (seconds, "5x", f"not a duration: '5x' {NOT_A_DURATION}"),
        (seconds, "-5s", f"not a duration: '-5s' {NOT_A_DURATION}"),
        (seconds, "5 days", f"not a duration: '5 days' {NOT_A_DURATION}"),
        (seconds, "", f"not a duration: '' {NOT_A_DURATION}"),
        (duration_ms, "0.5ms", "not a whole number of milliseconds: '0.5ms'"),
        (duration_ms, "1.5", "not a whole number of milliseconds: '1.5'"),
        (duration_ms, "inf", "not a whole number of milliseconds: 'inf'"),
        (duration_ms, "7days", f"not a duration: '7days' {NOT_A_DURATION}"),
        (timestamp_ms, "yesterday", f"not a time: 'yesterday' {NOT_A_TIME}"),
        (timestamp_ms, "2024-13-01", f"not a time: '2024-13-01' {NOT_A_TIME}"),
        (timestamp_ms, "-5", f"not a time: '-5' {NOT_A_TIME}"),
        (timestamp_ms, "\u00b2", f"not a time: '\u00b2' {NOT_A_TIME}"),
        (timestamp_ms, "1969-12-31T00:00:00Z", "must not be before 1970, not 1969-12-31T00:00:00Z"),
        (seconds, "-1", "must be 0 or more, not -1"),
        (seconds, "nan", "must be 0 or more, not nan"),
        (positive_seconds, "1y", f"not a duration: '1y' {NOT_A_DURATION}"),
        (positive_seconds, "0s", "must be more than 0, not 0s"),
        (positive_seconds, "0", "must be more than 0, not 0"),
        (positive_seconds, "-0.5", "must be more than 0, not -0.5"),
        (positive_seconds, "nan", "must be more than 0, not nan"),
        (offset, "abc", "not an integer: 'abc'"),
        (offset, "1.5", "not an integer: '1.5'"),
        (offset, "-1", "must be 0 or more, not -1"),
        (start_offset, "x", "not an offset: 'x'"),
        (start_offset, "-3", "must be 0 or more, not -3"),
        (positive, "0", "must be 1 or more"),
        (positive, "q", "not an integer: 'q'"),
        (positive, "-2", "must be 0 or more, not -2"),
        (from_position, "zz", f"not an offset: 'zz' {NOT_A_POSITION}"),
        (from_position, "-x", f"not an offset: '-x' {NOT_A_POSITION}"),
        (from_position, "--1", f"not an offset: '--1' {NOT_A_POSITION}"),
        (from_position, "-+1", f"not an offset: '-+1' {NOT_A_POSITION}"),
        (storage_option, "noeq", "expected KEY=VALUE, not 'noeq'"),
        (storage_option, "=1", "expected KEY=VALUE, not '=1'"),
        (setting, "retention_ms", "expected KEY=VALUE, not 'retention_ms'"),
        (setting, "=1", "expected KEY=VALUE, not '=1'"),
        (setting, "retention_ms=abc", f"retention_ms: not a duration: 'abc' {NOT_A_DURATION}"),
        (setting, "retention_bytes=8KB", f"retention_bytes: not a size: '8KB' {NOT_A_SIZE}"),
        (setting, "retention.bytes=1.5MiB", f"retention_bytes: not a size: '1.5MiB' {NOT_A_SIZE}"),
        (
            setting,
            "segment_ms=0.5ms",
            "segment_ms: not a whole number of milliseconds: '0.5ms'",
        ),
        (
            setting,
            "min_cleanable_dirty_ratio=half",
            "min_cleanable_dirty_ratio: 'half' is not a number",
        ),
        (
            setting,
            "min_cleanable_dirty_ratio=true",
            "min_cleanable_dirty_ratio: 'true' is not a number",
        ),
        (key_separator, "", "the key separator must not be empty"),
    ],
)
def test_refused_inputs(parse: Callable[[str], Any], text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("command_line", "argument", "message"),
    [
        ("merge URL --target-bytes 5MB", "--target-bytes", f"not a size: '5MB' {NOT_A_SIZE}"),
        ("merge URL --target-bytes 512", "--target-bytes", "must be at least 1024 bytes, not 512"),
        ("gc URL --grace -1", "--grace", "must be 0 or more, not -1"),
        ("maintain URL --grace 7x", "--grace", f"not a duration: '7x' {NOT_A_DURATION}"),
        ("consume URL s --follow --idle-timeout 0", "--idle-timeout", "must be more than 0, not 0"),
        (
            "consume URL s --follow --idle-timeout 5x",
            "--idle-timeout",
            f"not a duration: '5x' {NOT_A_DURATION}",
        ),
        ("consume URL s --from zz", "--from", f"not an offset: 'zz' {NOT_A_POSITION}"),
        ("consume URL s --from-time soon", "--from-time", f"not a time: 'soon' {NOT_A_TIME}"),
        ("consume URL s --to -1", "--to", "must be 0 or more, not -1"),
        ("consume URL s --max x", "--max", "not an integer: 'x'"),
        ("produce URL s --batch-size 0", "--batch-size", "must be 1 or more"),
        ("produce URL s --key-sep ''", "--key-sep", "the key separator must not be empty"),
        ("repair URL s --start-offset x", "--start-offset", "not an offset: 'x'"),
        (
            "alter URL s retention_ms=abc",
            "KEY=VALUE",
            f"retention_ms: not a duration: 'abc' {NOT_A_DURATION}",
        ),
        (
            "alter URL s retention_bytes=8KB",
            "KEY=VALUE",
            f"retention_bytes: not a size: '8KB' {NOT_A_SIZE}",
        ),
        (
            "create URL s --config retention_ms=forever",
            "--config",
            f"retention_ms: not a duration: 'forever' {NOT_A_DURATION}",
        ),
        ("trim URL s --before -1", "--before", "must be 0 or more, not -1"),
        (
            "groups URL reset g --to time soon",
            "--to",
            f"not a time: 'soon' {NOT_A_TIME}",
        ),
        ("streams URL --storage-option noeq", "--storage-option", "expected KEY=VALUE, not 'noeq'"),
        (
            "describe URL --tier-storage-option a",
            "--tier-storage-option",
            "expected KEY=VALUE, not 'a'",
        ),
    ],
)
def test_argparse_reports_a_refusal_as_a_usage_error(
    command_line: str, argument: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = shlex.split(command_line)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    last = captured.err.strip().splitlines()[-1]
    assert last == f"disklesslog {argv[0]}: error: argument {argument}: {message}"


def test_parsed_values_reach_the_commands() -> None:
    parser = build_parser()
    merge = parser.parse_args(["merge", "URL", "--target-bytes", "64MiB"])
    assert merge.target_bytes == 64 << 20
    gc = parser.parse_args(["gc", "URL", "--grace", "0.5"])
    assert gc.grace == 0.5
    consume = parser.parse_args(["consume", "URL", "s", "--follow", "--idle-timeout", "2"])
    assert consume.idle_timeout == 2.0
    repair = parser.parse_args(["repair", "URL", "s", "--start-offset", "7"])
    assert repair.start_offset == 7
    maintain = parser.parse_args(["maintain", "URL", "--grace", "5m"])
    assert maintain.grace == 300.0
    follow = parser.parse_args(["consume", "URL", "s", "--follow", "--idle-timeout", "500ms"])
    assert follow.idle_timeout == 0.5
    alter = parser.parse_args(["alter", "URL", "s", "retention_bytes=8KiB", "retention_ms=7d"])
    assert dict(alter.settings) == {"retention_bytes": 8192, "retention_ms": 604_800_000}
    create = parser.parse_args(
        ["create", "URL", "s", "--config", "retention.bytes=1MiB", "--config", "segment_ms=1h"]
    )
    assert dict(create.config) == {"retention_bytes": 1 << 20, "segment_ms": 3_600_000}
    back = parser.parse_args(["consume", "URL", "s", "--from", "-10"])
    assert back.start == FromEnd(10)
    since = parser.parse_args(["consume", "URL", "s", "--from-time", "2024-05-01T12:00:00Z"])
    assert since.from_time == 1_714_564_800_000


def test_naive_times_are_local_time() -> None:
    """An ISO 8601 time without a UTC offset is local time, as in Kafka's tools."""
    local = datetime(2024, 5, 1, 12, 0)
    assert timestamp_ms("2024-05-01T12:00:00") == round(local.timestamp() * 1000)
    assert timestamp_ms("2024-05-01") == round(datetime(2024, 5, 1).timestamp() * 1000)
