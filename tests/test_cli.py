"""The ``disklesslog`` command: every subcommand in-process through ``main([...])``, and
the installed console script / ``python -m disklesslog`` as real subprocesses (tailing,
signals, broken pipes)."""

from __future__ import annotations

import base64
import io
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import disklesslog
from disklesslog import StreamConfig
from disklesslog.cli import main

PYTHON_M = [sys.executable, "-m", "disklesslog"]
CONSOLE_SCRIPT = Path(sys.executable).with_name("disklesslog")


# ------------------------------------------------------------------------------ helpers


def feed(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    """Make ``data`` the standard input of the next ``main`` call."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def records(path: Path, stream: str) -> list[disklesslog.Record]:
    with disklesslog.open(path, create=False) as log:
        return list(log.stream(stream).read())


def batch_sizes(path: Path, stream: str) -> list[int]:
    with disklesslog.open(path, create=False) as log:
        return [len(batch) for batch in log.stream(stream).read_batches()]


def make_log(path: Path, **streams: list[bytes]) -> Path:
    with disklesslog.open(path, fsync="never") as log:
        for name, values in streams.items():
            log.stream(name).append_batch(values)
    return path


def assert_one_line_error(err: str, *needles: str) -> None:
    """A user mistake prints exactly one ``disklesslog: error:`` line, never a traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("disklesslog: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, err)


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


# ---------------------------------------------------------------------- version, usage


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"disklesslog {disklesslog.__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus", "x"],
        ["consume", "x", "s", "--from", "-x"],
        ["consume", "x", "s", "--from", "1", "--from-time", "0"],
        ["consume", "x", "s", "--max", "many"],
        ["consume", "x", "s", "--format", "xml"],
        ["consume", "x", "s", "--idle-timeout", "1"],
        ["produce", "x", "s", "--key-sep", ""],
        ["produce", "x", "s", "--batch-size", "0"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "usage: disklesslog" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------ streams


def test_streams_lists_one_name_per_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = make_log(tmp_path / "log", zeta=[b"z"], alpha=[b"a"], mid=[b"m"])
    assert main(["streams", str(log)]) == 0
    assert capsys.readouterr().out == "alpha\nmid\nzeta\n"


def test_streams_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = make_log(tmp_path / "log", zeta=[b"z"], alpha=[b"a"])
    assert main(["streams", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"streams": ["alpha", "zeta"]}
    disklesslog.open(tmp_path / "empty").close()
    assert main(["streams", str(tmp_path / "empty"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"streams": []}


def test_streams_of_an_empty_log_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disklesslog.open(tmp_path / "log").close()
    assert main(["streams", f"file://{tmp_path / 'log'}"]) == 0
    assert capsys.readouterr().out == ""


# ----------------------------------------------------------------------------- describe


def test_describe_text_shows_extent_config_and_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = make_log(tmp_path / "log", events=[b"x" * 10] * 7)
    assert main(["describe", str(log), "events"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "stream:       events" in lines
    assert "start offset: 0" in lines
    assert "end offset:   7" in lines
    assert "records:      7" in lines
    assert any(line.split()[:2] == ["compression", "none"] for line in lines)
    assert "segments:     1" in lines
    header = next(line for line in lines if "base offset" in line)
    assert header.split() == ["base", "offset", "end", "offset", "bytes", "file"]
    row = lines[lines.index(header) + 1].split()
    size = (log / "streams" / "events" / "00000000000000000000.log").stat().st_size
    assert row == ["0", "7", str(size), "00000000000000000000.log"]
    assert f"bytes:        {size}" in lines


def test_describe_json_after_trim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    with disklesslog.open(path, fsync="never") as log:
        stream = log.create_stream("s", segment_bytes=1024)
        for i in range(30):
            stream.append_batch([b"%02d" % i * 20] * 3)
        stream.trim(45)
    assert main(["describe", str(path), "s", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["stream"] == "s"
    assert info["end_offset"] == 90
    assert 0 < info["start_offset"] <= 45
    assert info["records"] == info["end_offset"] - info["start_offset"]
    assert info["config"] == StreamConfig(segment_bytes=1024).to_dict()
    segments = info["segments"]
    assert len(segments) > 1
    assert segments[-1]["end_offset"] == 90
    assert info["bytes"] == sum(seg["bytes"] for seg in segments)
    for seg in segments:
        assert seg["file"] == f"{seg['base_offset']:020d}.log"
        assert seg["bytes"] == (path / "streams" / "s" / seg["file"]).stat().st_size
    assert info["details"]["directory"] == str(path / "streams" / "s")


# ------------------------------------------------------------------------------ produce


def test_produce_one_record_per_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "new" / "log"  # produce creates the log
    feed(monkeypatch, b"one\ntwo\n\nthree")  # an empty line is an empty record
    assert main(["produce", str(path), "s"]) == 0
    assert [(r.offset, r.key, r.value) for r in records(path, "s")] == [
        (0, None, b"one"),
        (1, None, b"two"),
        (2, None, b""),
        (3, None, b"three"),
    ]
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "disklesslog: wrote 4 records to 's' (offsets 0..3)"


def test_produce_appends_after_existing_records_and_reports_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_log(tmp_path / "log", s=[b"old"] * 5)
    feed(monkeypatch, b"a\nb\n")
    assert main(["produce", str(path), "s"]) == 0
    assert "wrote 2 records to 's' (offsets 5..6)" in capsys.readouterr().err
    feed(monkeypatch, b"")
    assert main(["produce", str(path), "s"]) == 0
    assert capsys.readouterr().err.strip() == "disklesslog: wrote 0 records to 's'"
    assert [r.value for r in records(path, "s")] == [b"old"] * 5 + [b"a", b"b"]


def test_produce_key_sep_splits_at_the_first_separator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed(monkeypatch, b"k1=v1\nk2=v=2\n=v3\nk4=\n")
    assert main(["produce", str(tmp_path / "log"), "s", "--key-sep", "="]) == 0
    assert [(r.key, r.value) for r in records(tmp_path / "log", "s")] == [
        (b"k1", b"v1"),
        (b"k2", b"v=2"),
        (b"", b"v3"),
        (b"k4", b""),
    ]


def test_produce_multi_byte_key_sep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    feed(monkeypatch, b'user-1::{"a": 1}\n')
    assert main(["produce", str(tmp_path / "log"), "s", "--key-sep", "::"]) == 0
    assert [(r.key, r.value) for r in records(tmp_path / "log", "s")] == [(b"user-1", b'{"a": 1}')]


def test_produce_line_without_key_sep_stops_before_its_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    feed(monkeypatch, b"a:1\nb:2\nc:3\nno separator\ne:5\n")
    argv = ["produce", str(path), "s", "--key-sep", ":", "--batch-size", "2"]
    assert main(argv) == 1
    # Lines 1-2 formed a complete chunk and were written; line 3's chunk was not.
    assert [(r.key, r.value) for r in records(path, "s")] == [(b"a", b"1"), (b"b", b"2")]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "disklesslog: wrote 2 records to 's' (offsets 0..1)"
    assert_one_line_error(err[1], "line 4", "':'", "nothing from line 3 on was written")


def test_produce_writes_a_full_chunk_before_reading_the_next_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The bad line comes right after a complete chunk: that chunk is written (the
    # example of docs/cli.md), and so is a live feed's line before the next one arrives.
    path = tmp_path / "log"
    feed(monkeypatch, b"a:1\nb:2\nno separator\n")
    argv = ["produce", str(path), "s", "--key-sep", ":", "--batch-size", "2"]
    assert main(argv) == 1
    assert [(r.key, r.value) for r in records(path, "s")] == [(b"a", b"1"), (b"b", b"2")]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "disklesslog: wrote 2 records to 's' (offsets 0..1)"
    assert_one_line_error(err[1], "line 3", "nothing from line 3 on was written")

    class LiveFeed:
        """Input arriving a line at a time: each read first notes what the log holds."""

        def __init__(self) -> None:
            self.lines = [b"x\n", b"y\n"]
            self.seen: list[list[bytes | None]] = []

        def read1(self, size: int) -> bytes:
            if self.lines != [b"x\n", b"y\n"]:  # the stream exists after the first line
                self.seen.append([r.value for r in records(path, "live")])
            return self.lines.pop(0) if self.lines else b""

    live = LiveFeed()
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=live, isatty=lambda: False))
    assert main(["produce", str(path), "live", "--batch-size", "1"]) == 0
    assert live.seen == [[b"x"], [b"x", b"y"]]


def test_produce_writes_atomic_chunks_not_one_append_per_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed(monkeypatch, b"".join(b"%d\n" % i for i in range(2500)))
    assert main(["produce", str(tmp_path / "a"), "s"]) == 0
    assert batch_sizes(tmp_path / "a", "s") == [1000, 1000, 500]
    feed(monkeypatch, b"1\n2\n3\n4\n5\n")
    assert main(["produce", str(tmp_path / "b"), "s", "--batch-size", "2"]) == 0
    assert batch_sizes(tmp_path / "b", "s") == [2, 2, 1]
    assert [r.value for r in records(tmp_path / "b", "s")] == [b"1", b"2", b"3", b"4", b"5"]


def test_produce_chunks_stay_under_the_streams_max_batch_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    with disklesslog.open(path) as log:
        log.create_stream("s", max_batch_bytes=4096, max_record_bytes=1000)
    lines = [bytes([65 + i % 26]) * 900 for i in range(20)]
    feed(monkeypatch, b"\n".join(lines) + b"\n")
    assert main(["produce", str(path), "s"]) == 0
    sizes = batch_sizes(path, "s")
    assert sum(sizes) == 20
    assert max(sizes) <= 2  # ~1 KiB records under a 2 KiB chunk budget
    assert [r.value for r in records(path, "s")] == lines


def test_produce_oversize_record_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    with disklesslog.open(path) as log:
        log.create_stream("s", max_record_bytes=100)
    feed(monkeypatch, b"small\n" + b"x" * 500 + b"\nafter\n")
    assert main(["produce", str(path), "s"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "disklesslog: wrote 0 records to 's'"
    assert_one_line_error(err[1], "lines 1..", "max_record_bytes")
    assert records(path, "s") == []  # the chunk is atomic: "small" was not written either


def test_produce_interrupted_keeps_complete_chunks_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class TypedThenCtrlC:
        """A terminal where three lines are typed, then Ctrl-C is pressed."""

        def __init__(self) -> None:
            self.typed = [b"a\n", b"b\n", b"c\n"]

        def read1(self, size: int) -> bytes:
            if self.typed:
                return self.typed.pop(0)
            raise KeyboardInterrupt

    stdin = SimpleNamespace(buffer=TypedThenCtrlC(), isatty=lambda: True)
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["produce", str(tmp_path / "log"), "s", "--batch-size", "2"]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "disklesslog: reading one record per line; end with Ctrl-D",  # stdin is a terminal
        "disklesslog: wrote 2 records to 's' (offsets 0..1)",
    ]
    assert [r.value for r in records(tmp_path / "log", "s")] == [b"a", b"b"]


def test_produce_and_consume_raw_are_binary_safe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    lines = [b"\xff\xfe\x00binary", b"crlf kept\r", b"caf\xc3\xa9", b"\x80", b"", b"\t \x1b[0m"]
    feed(monkeypatch, b"\n".join(lines) + b"\n")
    path = tmp_path / "log"
    assert main(["produce", str(path), "s"]) == 0
    assert [r.value for r in records(path, "s")] == lines
    capsysbinary.readouterr()
    assert main(["consume", str(path), "s", "--format", "raw"]) == 0
    assert capsysbinary.readouterr().out == b"\n".join(lines) + b"\n"


def test_produce_binary_keys_with_key_sep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    feed(monkeypatch, b"\xff\x01|\x00\xfe\n")
    assert main(["produce", str(tmp_path / "log"), "s", "--key-sep", "|"]) == 0
    capsys.readouterr()
    assert main(["consume", str(tmp_path / "log"), "s"]) == 0
    (obj,) = json_lines(capsys.readouterr().out)
    assert "key" not in obj and "value" not in obj
    assert base64.b64decode(obj["key_base64"]) == b"\xff\x01"
    assert base64.b64decode(obj["value_base64"]) == b"\x00\xfe"


# ------------------------------------------------------------------------------ consume


@pytest.fixture
def mixed_log(tmp_path: Path) -> Path:
    """Records of every shape: keyed text, no key, tombstone, binary, headers."""
    path = tmp_path / "log"
    with disklesslog.open(path, fsync="never") as log:
        s = log.stream("s")
        s.append(b"hello", key=b"k", timestamp=1_700_000_000_000)
        s.append(b"no key", timestamp=1_700_000_000_001)
        s.append(None, key=b"k", timestamp=1_700_000_000_002)
        s.append(b"\xff\x00", key=b"\xc3", timestamp=1_700_000_000_003)
        s.append(
            "ünïcode ✓".encode(),
            headers=[("trace", b"abc"), ("raw", b"\xfe"), ("none", None)],
            timestamp=1_700_000_000_004,
        )
    return path


def test_consume_json_encodes_every_record_shape(
    mixed_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["consume", str(mixed_log), "s", "--format", "json"]) == 0
    objs = json_lines(capsys.readouterr().out)
    assert [next(iter(obj)) for obj in objs] == ["stream"] * 5  # the stream leads each line
    assert objs == [
        {
            "stream": "s",
            "offset": 0,
            "timestamp": 1_700_000_000_000,
            "key": "k",
            "value": "hello",
            "headers": [],
        },
        {
            "stream": "s",
            "offset": 1,
            "timestamp": 1_700_000_000_001,
            "key": None,
            "value": "no key",
            "headers": [],
        },
        {
            "stream": "s",
            "offset": 2,
            "timestamp": 1_700_000_000_002,
            "key": "k",
            "value": None,
            "headers": [],
        },
        {
            "stream": "s",
            "offset": 3,
            "timestamp": 1_700_000_000_003,
            "key_base64": base64.b64encode(b"\xc3").decode(),
            "value_base64": base64.b64encode(b"\xff\x00").decode(),
            "headers": [],
        },
        {
            "stream": "s",
            "offset": 4,
            "timestamp": 1_700_000_000_004,
            "key": None,
            "value": "ünïcode ✓",
            "headers": [
                {"key": "trace", "value": "abc"},
                {"key": "raw", "value_base64": base64.b64encode(b"\xfe").decode()},
                {"key": "none", "value": None},
            ],
        },
    ]


def test_consume_defaults_to_json(mixed_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["consume", str(mixed_log), "s", "--max", "1"]) == 0
    assert json_lines(capsys.readouterr().out)[0]["value"] == "hello"


def test_consume_raw_prints_tombstones_as_empty_lines(
    mixed_log: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["consume", str(mixed_log), "s", "--format", "raw", "--to", "3"]) == 0
    assert capsysbinary.readouterr().out == b"hello\nno key\n\n"


def test_consume_from_to_max(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = str(make_log(tmp_path / "log", s=[b"%d" % i for i in range(10)]))

    def offsets(*options: str) -> list[int]:
        assert main(["consume", log, "s", *options]) == 0
        return [obj["offset"] for obj in json_lines(capsys.readouterr().out)]

    assert offsets() == list(range(10))
    assert offsets("--from", "3", "--to", "7") == [3, 4, 5, 6]
    assert offsets("--from", "3", "--max", "2") == [3, 4]
    assert offsets("--to", "2") == [0, 1]
    assert offsets("--max", "0") == []
    assert offsets("--from", "start", "--max", "1") == [0]
    assert offsets("--from", "end") == []
    assert offsets("--from", "10") == []  # the end offset itself is a valid, empty start


def test_consume_starts_at_the_start_offset_after_trim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    with disklesslog.open(path, fsync="never") as log:
        s = log.create_stream("s", segment_bytes=1024)
        for i in range(20):
            s.append_batch([b"%d" % i] * 10)
        s.trim(150)
        start = s.start_offset
    assert main(["consume", str(path), "s", "--format", "raw", "--max", "1"]) == 0
    assert start > 0
    assert capsys.readouterr().out == f"{start // 10}\n"


def test_consume_follow_stops_at_max_to_and_idle_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(make_log(tmp_path / "log", s=[b"a", b"b", b"c", b"d"]))
    follow = ["consume", log, "s", "--follow", "--format", "raw"]
    assert main([*follow, "--from", "1", "--max", "2"]) == 0
    assert capsys.readouterr().out == "b\nc\n"
    assert main([*follow, "--to", "3"]) == 0
    assert capsys.readouterr().out == "a\nb\nc\n"
    assert main([*follow, "--from", "2", "--to", "2"]) == 0
    assert capsys.readouterr().out == ""
    started = time.monotonic()
    assert main([*follow, "--from", "end", "--idle-timeout", "0.3"]) == 0
    assert 0.25 <= time.monotonic() - started < 5
    assert capsys.readouterr().out == ""


def test_consume_follow_waits_for_new_records_and_for_the_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disklesslog.open(tmp_path / "log").close()  # the log exists, the stream not yet

    def produce_later() -> None:
        time.sleep(0.3)
        with disklesslog.open(tmp_path / "log", fsync="never") as log:
            log.stream("late").append(b"first")
            time.sleep(0.2)
            log.stream("late").append(b"second")

    producer = threading.Thread(target=produce_later)
    producer.start()
    try:
        argv = ["consume", str(tmp_path / "log"), "late", "--follow", "--max", "2"]
        assert main([*argv, "--idle-timeout", "10"]) == 0
    finally:
        producer.join()
    assert [obj["value"] for obj in json_lines(capsys.readouterr().out)] == ["first", "second"]


def test_consume_follow_gives_up_on_a_missing_stream_after_idle_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disklesslog.open(tmp_path / "log").close()
    argv = ["consume", str(tmp_path / "log"), "never", "--follow", "--idle-timeout", "0.2"]
    assert main(argv) == 0
    assert capsys.readouterr().out == ""


def test_consume_from_minus_n_starts_n_offsets_before_each_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(make_log(tmp_path / "log", a=[b"a%d" % i for i in range(10)], b=[b"b0", b"b1"]))

    def values(*argv: str) -> list[str]:
        assert main(["consume", log, *argv]) == 0
        return [obj["value"] for obj in json_lines(capsys.readouterr().out)]

    assert values("a", "--from", "-3") == ["a7", "a8", "a9"]
    assert values("a", "b", "--from", "-3") == ["a7", "a8", "a9", "b0", "b1"]  # b has 2
    assert values("a", "--from", "-0") == []
    assert values("a", "--from", "-3", "--max", "1") == ["a7"]
    with disklesslog.open(log, fsync="never") as opened:
        opened.stream("a").trim(8)
    assert values("a", "--from", "-5") == ["a8", "a9"]  # never before the start offset


def test_consume_from_minus_n_with_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(make_log(tmp_path / "log", a=[b"%d" % i for i in range(10)]))
    argv = ["consume", log, "a", "--follow", "--from", "-2", "--format", "raw"]
    assert main([*argv, "--idle-timeout", "0.2"]) == 0
    assert capsys.readouterr().out == "8\n9\n"


def test_consume_from_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    with disklesslog.open(path, fsync="never") as log:
        for i, ts in enumerate([1_714_564_700_000, 1_714_564_800_000, 1_714_564_900_000]):
            log.stream("a").append(b"a%d" % i, timestamp=ts)
            log.stream("b").append(b"b%d" % i, timestamp=ts + 50_000)

    def values(*argv: str) -> list[str]:
        assert main(["consume", str(path), *argv, "--format", "raw"]) == 0
        return capsys.readouterr().out.splitlines()

    assert values("a", "--from-time", "2024-05-01T12:00:00Z") == ["a1", "a2"]
    assert values("a", "--from-time", "2024-05-01T14:00:00+02:00") == ["a1", "a2"]
    assert values("a", "--from-time", "1714564800001") == ["a2"]
    assert values("a", "--from-time", "0") == ["a0", "a1", "a2"]
    assert values("a", "--from-time", "2030-01-01") == []  # nothing that late: the end
    assert values("a", "b", "--from-time", "2024-05-01T12:00:00Z") == [
        "a\ta1",
        "a\ta2",
        "b\tb1",
        "b\tb2",
    ]


def test_consume_several_streams_names_each_record_s_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(make_log(tmp_path / "log", a=[b"1", b"2"], b=[b"x\ty"], c=[b"3"]))
    assert main(["consume", log, "b", "a", "b"]) == 0  # a repeated stream is read once
    objs = json_lines(capsys.readouterr().out)
    assert [(o["stream"], o["offset"], o["value"]) for o in objs] == [
        ("b", 0, "x\ty"),
        ("a", 0, "1"),
        ("a", 1, "2"),
    ]
    assert main(["consume", log, "a", "b", "--format", "raw", "--max", "3"]) == 0
    assert capsys.readouterr().out == "a\t1\na\t2\nb\tx\ty\n"  # split at the first tab
    assert main(["consume", log, "a", "--format", "raw"]) == 0
    assert capsys.readouterr().out == "1\n2\n"  # one stream: values only
    assert main(["consume", log, "a", "nope"]) == 1
    assert_one_line_error(capsys.readouterr().err, "'nope'")


def test_consume_several_streams_follow_takes_turns_and_waits_for_missing_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = make_log(tmp_path / "log", a=[b"a0"], b=[b"b0"])

    def produce_later() -> None:
        time.sleep(0.3)
        with disklesslog.open(log, fsync="never") as opened:
            opened.stream("late").append(b"l0")
            opened.stream("a").append(b"a1")

    producer = threading.Thread(target=produce_later)
    producer.start()
    try:
        argv = ["consume", str(log), "a", "b", "late", "--follow", "--max", "4"]
        assert main([*argv, "--idle-timeout", "10"]) == 0
    finally:
        producer.join()
    got = [(o["stream"], o["value"]) for o in json_lines(capsys.readouterr().out)]
    assert got[:2] == [("a", "a0"), ("b", "b0")]
    assert sorted(got[2:]) == [("a", "a1"), ("late", "l0")]


def test_consume_with_a_group_resumes_and_commits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_log(tmp_path / "log", a=[b"a%d" % i for i in range(5)], b=[b"b0", b"b1"])
    log = str(path)

    def values(*argv: str) -> list[str]:
        assert main(["consume", log, *argv, "--format", "raw"]) == 0
        return capsys.readouterr().out.splitlines()

    def committed() -> dict[str, int]:
        with disklesslog.open(path, create=False) as opened:
            return opened.committed_offsets("g")

    assert values("a", "--group", "g", "--max", "2") == ["a0", "a1"]
    assert committed() == {"a": 2}
    assert values("a", "b", "--group", "g", "--max", "4") == ["a\ta2", "a\ta3", "a\ta4", "b\tb0"]
    assert committed() == {"a": 5, "b": 1}
    assert values("a", "b", "--group", "g") == ["b\tb1"]
    assert values("a", "b", "--group", "g") == []
    assert committed() == {"a": 5, "b": 2}
    # --from applies to streams the group has no position in; a committed one wins
    with disklesslog.open(path, fsync="never") as opened:
        opened.stream("c").append_batch([b"c0", b"c1", b"c2"])
        opened.stream("a").append(b"a5")
    assert values("a", "c", "--group", "g", "--from", "-1") == ["a\ta5", "c\tc2"]
    assert committed() == {"a": 6, "b": 2, "c": 3}
    assert values("a", "--group", "other") == ["a0", "a1", "a2", "a3", "a4", "a5"]  # independent
    assert main(["consume", log, "a", "--group", "bad/name"]) == 1
    assert_one_line_error(capsys.readouterr().err, "invalid consumer group name")


def test_consume_with_a_group_moves_a_trimmed_position_to_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = make_log(tmp_path / "log", a=[b"%d" % i for i in range(6)])
    with disklesslog.open(path, fsync="never") as log:
        log.commit_offsets("g", {"a": 1})
        log.stream("a").trim(4)
    assert main(["consume", str(path), "a", "--group", "g", "--format", "raw"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "4\n5\n"
    assert "position 1 in stream 'a' is outside the stream's offsets 4..6" in caplog.text
    with disklesslog.open(path, create=False) as log:
        assert log.committed_offsets("g") == {"a": 6}


def test_consume_follow_with_a_group_commits_what_it_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_log(tmp_path / "log", a=[b"%d" % i for i in range(6)])
    argv = ["consume", str(path), "a", "--group", "g", "--follow", "--format", "raw"]
    assert main([*argv, "--max", "4"]) == 0
    assert capsys.readouterr().out == "0\n1\n2\n3\n"
    assert main([*argv, "--idle-timeout", "0.2"]) == 0
    assert capsys.readouterr().out == "4\n5\n"
    with disklesslog.open(path, create=False) as log:
        assert log.committed_offsets("g") == {"a": 6}


def test_consume_with_a_group_commits_nothing_it_did_not_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """At least once: when writing the output fails, the group's position stays."""
    path = make_log(tmp_path / "log", a=[b"%d" % i for i in range(3)])

    class _Closed(io.BytesIO):
        def flush(self) -> None:
            raise BrokenPipeError

    monkeypatch.setattr(sys, "stdout", SimpleNamespace(buffer=_Closed(), fileno=lambda: 1))
    monkeypatch.setattr("disklesslog.cli._silence_stdout", lambda: None)
    assert main(["consume", str(path), "a", "--group", "g"]) == 0  # a closed pipe is quiet
    with disklesslog.open(path, create=False) as log:
        assert log.committed_offsets("g") == {}


# ------------------------------------------------------------------------------- verify


def test_verify_clean_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = make_log(tmp_path / "log", a=[b"x"] * 100, b=[b"y" * 50] * 3)
    size = sum(p.stat().st_size for p in (log / "streams").glob("*/*.log"))
    assert main(["verify", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ok", "a:", "100"]
    assert out[1].split()[:3] == ["ok", "b:", "3"]
    assert out[-1] == f"checked 2 stream(s): 103 records, {size} bytes; no corruption"


def test_verify_json_of_a_clean_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = make_log(tmp_path / "log", a=[b"x"] * 3)
    assert main(["verify", str(log), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    size = document["streams"][0]["bytes"]
    assert size > 0
    assert document == {
        "ok": True,
        "streams_checked": 1,
        "records": 3,
        "bytes": size,
        "corruptions": 0,
        "streams": [{"stream": "a", "ok": True, "records": 3, "bytes": size, "corruptions": []}],
        "leases": {"records": 0, "ok": True, "corruptions": []},
    }


def test_verify_reads_lease_files_and_reports_damaged_and_missing_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_log(tmp_path / "log", a=[b"x"])
    with disklesslog.open(path) as log:
        for name in ("damaged", "gone", "fine"):
            assert log.acquire_lease(name, "worker-1", 60_000) is not None
    assert main(["verify", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        "ok      leases: 3 records",
        out[-1].split(";")[0] + "; no corruption",
    ]
    assert out[-1].startswith("checked 1 stream(s): 1 records,")
    assert out[-1].endswith(" bytes, 3 lease(s); no corruption")
    damaged, gone = path / "leases" / "damaged.json", path / "leases" / "gone.json"
    _flip(damaged, 20)
    gone.unlink()
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-4].startswith(f"CORRUPT leases: {damaged}: ")
    assert out[-3].startswith(f"CORRUPT leases: {gone}: lease file is missing")
    assert out[-2] == "CORRUPT leases: 3 records"
    assert out[-1].endswith("; 2 corruption(s) found")
    assert main(["verify", str(path), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert (document["ok"], document["corruptions"]) == (False, 2)
    leases = document["leases"]
    assert (leases["records"], leases["ok"]) == (3, False)
    assert [c["file"] for c in leases["corruptions"]] == [str(damaged), str(gone)]
    assert damaged.exists() and not gone.exists()  # verify changes nothing
    assert main(["verify", str(path), "--stream", "a", "--json"]) == 0  # leases not asked
    assert json.loads(capsys.readouterr().out)["leases"] is None


def test_verify_one_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = make_log(tmp_path / "log", a=[b"x"] * 10, b=[b"y"] * 3)
    assert main(["verify", str(log), "--stream", "b"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[:-1]] == [["ok", "b:"]]
    assert out[-1].startswith("checked 1 stream(s): 3 records,")


def test_verify_reads_every_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    segments, _ = _segmented_log(path)
    assert len(segments) >= 5
    size = sum(seg["bytes"] for seg in segments)
    assert main(["verify", str(path), "--stream", "s"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"ok      s: 300 records, {size} bytes",
        f"checked 1 stream(s): 300 records, {size} bytes; no corruption",
    ]


def test_verify_finds_damage_in_the_active_segment_and_leaves_it_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = make_log(tmp_path / "log", s=[b"payload"] * 4)
    make_log(log, s=[b"payload"] * 4)  # a second, identical entry
    segment = log / "streams" / "s" / "00000000000000000000.log"
    data = segment.read_bytes()
    entry = len(data) // 2
    _flip(segment, 2 * entry - 3)  # in the last value of the second entry
    assert main(["verify", str(log)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"CORRUPT s: {segment} at byte {entry}: ")
    assert out[1] == f"CORRUPT s: 4 records, {len(data)} bytes"
    assert out[2].endswith("; 1 corruption(s) found")
    assert segment.stat().st_size == len(data)  # the evidence was not truncated away


def _segmented_log(path: Path) -> tuple[list[dict[str, Any]], int]:
    """A stream ``s`` of many small segments of equal-sized entries, and a stream ``t``;
    returns the segments of ``s`` and the byte size of one entry."""
    with disklesslog.open(path, fsync="never") as log:
        s = log.create_stream("s", segment_bytes=1024)
        for i in range(60):
            s.append_batch([b"value-%03d" % i] * 5)
        log.stream("t").append(b"fine")
        segments: list[dict[str, Any]] = s.info().details["segments"]
    first = segments[0]
    entries = (first["end_offset"] - first["base_offset"]) // 5
    return segments, first["bytes"] // entries


def _flip(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_verify_reports_each_damaged_segment_with_file_and_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    segments, entry = _segmented_log(path)
    assert len(segments) >= 5
    directory = path / "streams" / "s"
    first, third = directory / segments[0]["file"], directory / segments[2]["file"]
    _flip(first, 2 * entry + 30)  # inside the third entry of the first segment
    _flip(third, 40)  # inside the first entry of the third segment
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    corrupt = [line for line in out if line.startswith("CORRUPT s: /")]
    assert len(corrupt) == 2, out
    assert corrupt[0].startswith(f"CORRUPT s: {first} at byte {2 * entry}: ")
    assert corrupt[1].startswith(f"CORRUPT s: {third} at byte 0: ")
    assert any("mismatch" in line for line in corrupt)
    # Checking went on after each damaged segment: the two entries before the first
    # damage, all of the second segment, and everything after the third.
    checked = 10 + (segments[1]["end_offset"] - segments[1]["base_offset"])
    checked += segments[-1]["end_offset"] - segments[3]["base_offset"]
    assert f"CORRUPT s: {checked} records, {sum(seg['bytes'] for seg in segments)} bytes" in out
    assert any(line.startswith("ok") and " t: 1 records" in line for line in out)  # next stream
    assert out[-1].startswith("checked 2 stream(s):")
    assert out[-1].endswith("2 corruption(s) found")
    assert main(["verify", str(path), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)  # nothing but the one document
    size = sum(seg["bytes"] for seg in segments)
    assert document["ok"] is False
    assert (document["streams_checked"], document["corruptions"]) == (2, 2)
    assert document["records"] == checked + 1
    assert document["bytes"] == size + document["streams"][1]["bytes"]
    damaged, clean = document["streams"]
    assert (damaged["stream"], damaged["ok"], damaged["records"]) == ("s", False, checked)
    assert [(c["file"], c["position"]) for c in damaged["corruptions"]] == [
        (str(first), 2 * entry),
        (str(third), 0),
    ]
    assert any("mismatch" in c["reason"] for c in damaged["corruptions"])
    assert (clean["stream"], clean["ok"], clean["records"], clean["corruptions"]) == (
        "t",
        True,
        1,
        [],
    )


def test_consume_of_a_damaged_segment_names_file_and_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    segments, entry = _segmented_log(path)
    damaged = path / "streams" / "s" / segments[0]["file"]
    _flip(damaged, entry + 20)
    assert main(["consume", str(path), "s"]) == 1
    assert_one_line_error(capsys.readouterr().err, str(damaged), f"at byte {entry}")


# ------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "argv",
    [
        ["streams"],
        ["describe", "s"],
        ["consume", "s"],
        ["consume", "s", "--follow", "--idle-timeout", "0.1"],
        ["verify"],
    ],
)
def test_read_commands_never_create_a_log(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo" / "log"
    assert main([argv[0], str(missing), *argv[1:]]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(err, str(missing), "is not a log: it does not exist (check the path")
    assert "create=False" not in err  # the user's words, not a keyword argument's
    assert not missing.exists()
    assert not missing.parent.exists()


@pytest.mark.parametrize("command", ["streams", "verify"])
def test_unknown_url_scheme(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "nosuch://bucket/log"]) == 1
    assert_one_line_error(capsys.readouterr().err, "nosuch://")


def test_unknown_url_scheme_for_produce(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    feed(monkeypatch, b"x\n")
    assert main(["produce", "nosuch://bucket/log", "s"]) == 1
    assert_one_line_error(capsys.readouterr().err, "nosuch://")


@pytest.mark.parametrize("command", ["describe", "consume", "produce"])
def test_invalid_stream_name(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = make_log(tmp_path / "log", s=[b"x"])
    feed(monkeypatch, b"x\n")
    assert main([command, str(log), "../x"]) == 1
    assert_one_line_error(capsys.readouterr().err, "invalid stream name '../x'")
    assert not (tmp_path / "x").exists()
    assert not (log / "x").exists()


def test_invalid_stream_name_for_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = make_log(tmp_path / "log", s=[b"x"])
    assert main(["verify", str(log), "--stream", "a/b"]) == 1
    assert_one_line_error(capsys.readouterr().err, "invalid stream name")


@pytest.mark.parametrize("start", ["4", "1000"])
def test_consume_beyond_the_end(
    start: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = make_log(tmp_path / "log", s=[b"a", b"b", b"c"])
    assert main(["consume", str(log), "s", "--from", start]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line_error(
        captured.err, f"offset {start} is outside the range of stream 's', [0, 3]"
    )
    assert main(["consume", str(log), "s", "--from", start, "--follow"]) == 1
    assert_one_line_error(capsys.readouterr().err, f"offset {start}")


@pytest.mark.parametrize("argv", [["describe"], ["consume"], ["verify", "--stream"]])
def test_missing_stream(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = make_log(tmp_path / "log", s=[b"x"])
    assert main([argv[0], str(log), *argv[1:], "nope"]) == 1
    assert_one_line_error(capsys.readouterr().err, "'nope' does not exist")
    assert not (log / "streams" / "nope").exists()


def test_not_a_log_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    assert main(["streams", str(tmp_path / "photos")]) == 1
    assert_one_line_error(capsys.readouterr().err, "not a disklesslog log")


def test_os_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("a plain file")
    feed(monkeypatch, b"x\n")
    assert main(["produce", str(tmp_path / "file" / "log"), "s"]) == 1
    assert_one_line_error(capsys.readouterr().err, "Not a directory")


# -------------------------------------------------------------------------- subprocesses


def run(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=30, check=False)


def test_console_script_round_trip(tmp_path: Path) -> None:
    assert CONSOLE_SCRIPT.exists()
    log = str(tmp_path / "log")
    data = b"k1\tv\xff1\nk2\tv2\n"
    produced = run([str(CONSOLE_SCRIPT), "produce", log, "s", "--key-sep", "\t"], data)
    assert produced.returncode == 0, produced.stderr
    assert produced.stderr == b"disklesslog: wrote 2 records to 's' (offsets 0..1)\n"
    raw = run([str(CONSOLE_SCRIPT), "consume", log, "s", "--format", "raw"])
    assert (raw.returncode, raw.stdout, raw.stderr) == (0, b"v\xff1\nv2\n", b"")
    described = run([*PYTHON_M, "describe", log, "s", "--json"])
    assert described.returncode == 0
    assert json.loads(described.stdout)["records"] == 2
    version = run([*PYTHON_M, "--version"])
    assert version.stdout.decode().strip() == f"disklesslog {disklesslog.__version__}"


def test_python_m_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for argv in (["streams", str(missing)], ["consume", "nosuch://x", "s"]):
        result = run([*PYTHON_M, *argv])
        assert result.returncode == 1
        assert_one_line_error(result.stderr.decode())
        assert result.stdout == b""
    assert not missing.exists()
    usage = run([*PYTHON_M, "consume"])
    assert usage.returncode == 2
    assert b"Traceback" not in usage.stderr


def _read_lines(pipe: io.BufferedReader, count: int) -> list[bytes]:
    return [pipe.readline() for _ in range(count)]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_follow_tails_a_live_stream_until_stopped(tmp_path: Path, stop: signal.Signals) -> None:
    path = tmp_path / "log"
    disklesslog.open(path).close()
    follower = subprocess.Popen(
        [*PYTHON_M, "consume", str(path), "live", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    watchdog = threading.Timer(20, follower.kill)
    watchdog.start()
    try:
        with disklesslog.open(path, fsync="never") as log:
            stream = log.stream("live")
            stream.append(b"before", key=b"k")  # the follower may start after this
            assert follower.stdout is not None
            first = json.loads(follower.stdout.readline())
            for i in range(3):
                stream.append(b"tick %d" % i)
                time.sleep(0.05)
            ticks = [json.loads(line) for line in _read_lines(follower.stdout, 3)]
        assert (first["offset"], first["key"], first["value"]) == (0, "k", "before")
        assert [(t["offset"], t["value"]) for t in ticks] == [
            (1, "tick 0"),
            (2, "tick 1"),
            (3, "tick 2"),
        ]
        follower.send_signal(stop)
        _, err = follower.communicate(timeout=10)
    finally:
        watchdog.cancel()
        follower.kill()
        follower.wait()
    assert follower.returncode == 0
    assert err == b""


def test_broken_pipe_exits_quietly(tmp_path: Path) -> None:
    log = make_log(tmp_path / "log", s=[b"%06d" % i for i in range(50_000)])
    consumer = subprocess.Popen(
        [*PYTHON_M, "consume", str(log), "s", "--format", "raw"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert consumer.stdout is not None and consumer.stderr is not None
    assert consumer.stdout.readline() == b"000000\n"
    consumer.stdout.close()  # like `| head -1`
    err = consumer.stderr.read()
    assert consumer.wait(timeout=20) == 0
    assert err == b""


def test_produce_from_a_pipe_in_a_subprocess_with_os_level_stdin(tmp_path: Path) -> None:
    source = tmp_path / "input.bin"
    source.write_bytes(b"".join(b"line %d \xfe\n" % i for i in range(3000)))
    with open(source, "rb") as stdin:
        result = subprocess.run(
            [*PYTHON_M, "produce", str(tmp_path / "log"), "s"],
            stdin=stdin,
            capture_output=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert b"wrote 3000 records to 's' (offsets 0..2999)" in result.stderr
    assert batch_sizes(tmp_path / "log", "s") == [1000, 1000, 1000]


def test_verify_in_a_subprocess_shows_library_logs_as_logged_lines(tmp_path: Path) -> None:
    log = make_log(tmp_path / "log", s=[b"a"] * 3)
    make_log(log, s=[b"b"] * 3)
    segment = log / "streams" / "s" / "00000000000000000000.log"
    _flip(segment, 20)  # in the first batch's header
    result = run([*PYTHON_M, "verify", str(log)])
    assert result.returncode == 1
    out = result.stdout.decode().splitlines()
    assert out[0].startswith(f"CORRUPT s: {segment} at byte 0: ")
    assert out[-1].endswith("1 corruption(s) found")
    err = result.stderr.decode()
    assert "Traceback" not in err
    assert all(line.startswith("disklesslog: logged ") for line in err.splitlines())


# -------------------------------------------------------------------- object storage


def test_object_logs_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/objects"
    options = ["--backend", "objects", "--sequencer", f"sqlite://{tmp_path}/meta.db"]
    feed(monkeypatch, b"k1:one\nk2:two\n")
    assert main(["produce", url, "s", "--key-sep", ":", *options]) == 0
    capsys.readouterr()
    assert main(["consume", url, "s", *options]) == 0
    assert [(r["key"], r["value"]) for r in json_lines(capsys.readouterr().out)] == [
        ("k1", "one"),
        ("k2", "two"),
    ]
    assert main(["describe", url, "s", "--json", *options]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["records"] == 2 and described["details"]["objects"] == 1
    assert "segments" not in capsys.readouterr().out
    assert main(["verify", url, *options]) == 0
    assert "no corruption" in capsys.readouterr().out
    assert main(["streams", url, *options]) == 0
    assert capsys.readouterr().out.split() == ["s"]
    assert main(["streams", url, "--backend", "objects", "--sequencer", "nosuch://x"]) == 1
    assert_one_line_error(capsys.readouterr().err, "no sequencer")


def test_storage_options_parse_json_values() -> None:
    from disklesslog.cli import build_parser

    args = build_parser().parse_args(
        [
            "streams",
            "s3://b/log",
            "--storage-option",
            "anon=true",
            "--storage-option",
            'client_kwargs={"endpoint_url": "http://h:1"}',
            "--storage-option",
            "profile=dev",
        ]
    )
    assert dict(args.storage_option) == {
        "anon": True,
        "client_kwargs": {"endpoint_url": "http://h:1"},
        "profile": "dev",
    }
