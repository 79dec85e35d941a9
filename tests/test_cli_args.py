"""The argparse types of ``disklesslog.cli.args``: what each accepts, the message of each
refusal, and that argparse turns a refusal into ``argument OPTION: MESSAGE`` and exit
code 2 for every option that uses the type."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any

import pytest

from disklesslog.cli import build_parser, main
from disklesslog.cli.args import (
    byte_size,
    from_position,
    key_separator,
    offset,
    positive,
    positive_seconds,
    seconds,
    setting,
    start_offset,
    storage_option,
)

NOT_A_SIZE = "(an integer, optionally with KiB, MiB or GiB)"


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (byte_size, "1024", 1024),
        (byte_size, "4KiB", 4096),
        (byte_size, " 4 kib ", 4096),
        (byte_size, "64MiB", 64 << 20),
        (byte_size, "1gib", 1 << 30),
        (byte_size, "2GIB", 2 << 30),
        (seconds, "0", 0.0),
        (seconds, "300", 300.0),
        (seconds, "0.25", 0.25),
        (seconds, "1e3", 1000.0),
        (seconds, "inf", float("inf")),
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
        (storage_option, "anon=true", ("anon", True)),
        (storage_option, "profile=dev", ("profile", "dev")),
        (storage_option, "empty=", ("empty", "")),
        (storage_option, 'kw={"a": 1}', ("kw", {"a": 1})),
        (setting, "retention_ms=86400000", ("retention_ms", 86400000)),
        (setting, "min_cleanable_dirty_ratio=0.3", ("min_cleanable_dirty_ratio", 0.3)),
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
        (seconds, "abc", "not a number: 'abc'"),
        (seconds, "5s", "not a number: '5s'"),
        (seconds, "", "not a number: ''"),
        (seconds, "-1", "must be 0 or more, not -1"),
        (seconds, "nan", "must be 0 or more, not nan"),
        (positive_seconds, "1m", "not a number: '1m'"),
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
        (from_position, "zz", "not an integer: 'zz'"),
        (from_position, "-1", "must be 0 or more, not -1"),
        (storage_option, "noeq", "expected KEY=VALUE, not 'noeq'"),
        (storage_option, "=1", "expected KEY=VALUE, not '=1'"),
        (setting, "retention_ms", "expected KEY=VALUE, not 'retention_ms'"),
        (setting, "=1", "expected KEY=VALUE, not '=1'"),
        (setting, "retention_ms=abc", "retention_ms: 'abc' is not a number"),
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
        ("maintain URL --grace 7d", "--grace", "not a number: '7d'"),
        ("consume URL s --follow --idle-timeout 0", "--idle-timeout", "must be more than 0, not 0"),
        ("consume URL s --idle-timeout 100ms", "--idle-timeout", "not a number: '100ms'"),
        ("consume URL s --from zz", "--from", "not an integer: 'zz'"),
        ("consume URL s --to -1", "--to", "must be 0 or more, not -1"),
        ("consume URL s --max x", "--max", "not an integer: 'x'"),
        ("produce URL s --batch-size 0", "--batch-size", "must be 1 or more"),
        ("produce URL s --key-sep ''", "--key-sep", "the key separator must not be empty"),
        ("repair URL s --start-offset x", "--start-offset", "not an offset: 'x'"),
        ("alter URL s retention_ms=abc", "KEY=VALUE", "retention_ms: 'abc' is not a number"),
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
