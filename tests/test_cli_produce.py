"""``disklesslog produce``: live input stored as it comes (``--linger-ms``), headers
(``-H``), JSON-lines input that ``consume --format json`` output copies a stream with, and
the produce/consume examples of docs/cli.md run as written."""

from __future__ import annotations

import io
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog.cli import build_parser, main

PYTHON_M = [sys.executable, "-m", "disklesslog"]


def records(path: Path, stream: str) -> list[disklesslog.Record]:
    with disklesslog.open(path, create=False) as log:
        return list(log.stream(stream).read())


def batch_sizes(path: Path, stream: str) -> list[int]:
    with disklesslog.open(path, create=False) as log:
        return [len(batch) for batch in log.stream(stream).read_batches()]


def feed(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def wait_for(path: Path, stream: str, count: int, timeout: float) -> list[bytes | None]:
    """The values of ``stream`` once it has ``count`` records; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            values = [r.value for r in records(path, stream)]
        except disklesslog.DisklessLogError:  # the producer has not created it yet
            values = []
        if len(values) >= count or time.monotonic() > deadline:
            assert len(values) == count, f"{values} after {timeout} s"
            return values
        time.sleep(0.02)


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``disklesslog produce`` as a subprocess writing to ``tmp_path / "log"``; kill
    whatever is left at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*options: str, stdin: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*PYTHON_M, "produce", str(tmp_path / "log"), "s", *options],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


# ------------------------------------------------------------------------- live input


@pytest.mark.parametrize(
    "options", [["--batch-size", "1"], []], ids=["batch-size-1", "default-linger"]
)
def test_a_live_line_is_stored_without_waiting_for_the_next(
    tmp_path: Path, producer: Callable[..., subprocess.Popen[bytes]], options: list[str]
) -> None:
    """``tail -f app.log | disklesslog produce ...``: each line is stored while the pipe
    stays open and quiet, within --linger-ms (100 ms) of arriving."""
    path = tmp_path / "log"
    process = producer(*options)
    assert process.stdin is not None
    process.stdin.write(b"first\n")
    process.stdin.flush()
    assert wait_for(path, "s", 1, timeout=30) == [b"first"]  # includes the start-up
    process.stdin.write(b"second\n")
    process.stdin.flush()
    assert wait_for(path, "s", 2, timeout=5) == [b"first", b"second"]  # linger: 0.1 s
    process.stdin.write(b"no newline yet")  # not a line until input ends
    process.stdin.flush()
    time.sleep(0.3)
    assert len(records(path, "s")) == 2
    _, err = process.communicate(timeout=30)  # closes stdin: the last line is stored
    assert process.returncode == 0, err
    assert [r.value for r in records(path, "s")] == [b"first", b"second", b"no newline yet"]
    assert err == b"disklesslog: wrote 3 records to 's' (offsets 0..2)\n"


def test_ctrl_c_reports_what_was_written_and_drops_the_unfinished_chunk(
    tmp_path: Path, producer: Callable[..., subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "log"
    process = producer("--batch-size", "2", "--linger-ms", "600000")
    assert process.stdin is not None
    process.stdin.write(b"a\nb\nc\n")  # a, b: a full chunk; c waits for one more line
    process.stdin.flush()
    assert wait_for(path, "s", 2, timeout=30) == [b"a", b"b"]
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err == b"disklesslog: wrote 2 records to 's' (offsets 0..1)\n"
    assert [r.value for r in records(path, "s")] == [b"a", b"b"]


def _ctrl_c_during_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, before: int, after: int
) -> None:
    """Make every append of a local stream get Ctrl-C ``before`` times before it stores
    its records and ``after`` times after that, before it returns."""
    with disklesslog.open(tmp_path / "other") as log:
        stream_type = type(log.stream("s"))
    append_batch = stream_type.append_batch

    def interrupted(self: disklesslog.Stream, *args: Any, **kwargs: Any) -> list[int]:
        for _ in range(before):
            os.kill(os.getpid(), signal.SIGINT)
        offsets = append_batch(self, *args, **kwargs)
        for _ in range(after):
            os.kill(os.getpid(), signal.SIGINT)
        return offsets

    monkeypatch.setattr(stream_type, "append_batch", interrupted)


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for the test, whatever an earlier test of this process
    left (SparkContext installs its own), and that one back afterwards: the tests check
    that ``produce`` restores the handler it found."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("default_sigint")
def test_ctrl_c_during_an_append_stops_after_it_and_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _ctrl_c_during_appends(tmp_path, monkeypatch, before=0, after=1)
    feed(monkeypatch, b"a\nb\nc\n")
    assert main(["produce", str(tmp_path / "log"), "s", "--batch-size", "2"]) == 130
    assert capsys.readouterr().err == "disklesslog: wrote 2 records to 's' (offsets 0..1)\n"
    assert [r.value for r in records(tmp_path / "log", "s")] == [b"a", b"b"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("default_sigint")
def test_a_second_ctrl_c_during_an_append_stops_at_once_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _ctrl_c_during_appends(tmp_path, monkeypatch, before=2, after=0)
    feed(monkeypatch, b"a\nb\nc\n")
    assert main(["produce", str(tmp_path / "log"), "s", "--batch-size", "2"]) == 130
    assert capsys.readouterr().err == (
        "disklesslog: wrote 0 records to 's'; stopped while writing lines 1..2, "
        "which may or may not be stored\n"
    )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_typed_lines_are_stored_as_they_are_entered(
    tmp_path: Path, producer: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """Standard input a terminal: a typed line is stored on Enter; Ctrl-D ends."""
    path = tmp_path / "log"
    terminal, device = pty.openpty()
    try:
        process = producer(stdin=device)
        os.write(terminal, b"typed\n")
        assert wait_for(path, "s", 1, timeout=30) == [b"typed"]
        os.write(terminal, b"\x04")  # Ctrl-D at the start of a line: end of input
        _, err = process.communicate(timeout=30)
    finally:
        os.close(device)
        os.close(terminal)
    assert process.returncode == 0, err
    assert err.decode().splitlines() == [
        "disklesslog: reading one record per line; end with Ctrl-D",
        "disklesslog: wrote 1 record to 's' (offsets 0..0)",
    ]


def test_lines_split_across_reads_are_joined_and_lingering_chunks_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Input arriving in pieces that cut lines apart (a pipe, in-process)."""
    read_end, write_end = os.pipe()

    def write_slowly() -> None:
        for piece in (b"par", b"tial\nsec", b"ond"):
            os.write(write_end, piece)
            time.sleep(0.5)
        os.close(write_end)

    writer = threading.Thread(target=write_slowly)
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        writer.start()
        assert main(["produce", str(tmp_path / "log"), "s", "--linger-ms", "50"]) == 0
    writer.join()
    assert [r.value for r in records(tmp_path / "log", "s")] == [b"partial", b"second"]
    # "partial" lingered 50 ms and was written alone; "second" ended with the input.
    assert batch_sizes(tmp_path / "log", "s") == [1, 1]


def test_a_linger_of_centuries_waits_for_the_end_of_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Longer than one ``select`` can wait (it overflows past about 300 years)."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"a\nb\n")
    os.close(write_end)
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        argv = ["produce", str(tmp_path / "log"), "s", "--linger-ms", str(10**16)]
        assert main(argv) == 0
    assert capsys.readouterr().err == "disklesslog: wrote 2 records to 's' (offsets 0..1)\n"
    assert batch_sizes(tmp_path / "log", "s") == [2]


def test_a_full_chunk_is_written_before_the_next_line_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chunk with --batch-size lines is complete: a bad line after it stops the run
    but the chunk is stored and reported."""
    feed(monkeypatch, b"a:1\nb:2\nno separator\n")
    argv = ["produce", str(tmp_path / "log"), "kv", "--key-sep", ":", "--batch-size", "2"]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        "disklesslog: wrote 2 records to 'kv' (offsets 0..1)",
        "disklesslog: error: line 3 has no key separator ':'; nothing from line 3 on was written",
    ]
    assert [(r.key, r.value) for r in records(tmp_path / "log", "kv")] == [
        (b"a", b"1"),
        (b"b", b"2"),
    ]


def test_linger_ms_must_be_a_whole_number_of_milliseconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("-1", "0.5", "soon"):
        assert main(["produce", str(tmp_path / "log"), "s", "--linger-ms", bad]) == 2
        assert "argument --linger-ms" in capsys.readouterr().err
    assert not (tmp_path / "log").exists()
    parser = build_parser()
    for given, meant in (("250", 250), ("0", 0), ("2s", 2000), ("500ms", 500)):
        args = parser.parse_args(["produce", "log", "s", "--linger-ms", given])
        assert args.linger_ms == meant


# ---------------------------------------------------------------------------- headers


def test_headers_are_added_to_every_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    feed(monkeypatch, b"k:v1\nk:v2\n")
    argv = ["produce", str(tmp_path / "log"), "s", "--key-sep", ":"]
    argv += ["-H", "source=web", "--header", "trace=a=b", "-H", "empty=", "-H", "source=again"]
    assert main(argv) == 0
    expected = (("source", b"web"), ("trace", b"a=b"), ("empty", b""), ("source", b"again"))
    assert [(r.key, r.value, r.headers) for r in records(tmp_path / "log", "s")] == [
        (b"k", b"v1", expected),
        (b"k", b"v2", expected),
    ]


@pytest.mark.parametrize("bad", ["novalue", "=value"])
def test_a_header_without_a_name_and_equals_sign_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    assert main(["produce", str(tmp_path / "log"), "s", "-H", bad]) == 2
    assert f"argument -H/--header: expected KEY=VALUE, not {bad!r}" in capsys.readouterr().err
    assert not (tmp_path / "log").exists()


# ----------------------------------------------------------------------- --format json


def test_json_lines_give_key_value_headers_and_timestamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        b'{"key": "user-7", "value": "clicked", "headers": [{"key": "h", "value": "v"}], '
        b'"timestamp": 1732230000000}',
        b'{"value": null, "key": "user-7"}',  # a tombstone, stamped now
        b'{"offset": 41, "key_base64": "/w==", "value_base64": "AP4=", "headers": []}',
        b'{"value": "caf\xc3\xa9", "headers": [{"key": "n", "value": null}]}',
    ]
    feed(monkeypatch, b"\n".join(lines) + b"\n")
    before = int(time.time() * 1000)
    path = tmp_path / "log"
    assert main(["produce", str(path), "s", "--format", "json", "-H", "via=cli"]) == 0
    assert capsys.readouterr().err == "disklesslog: wrote 4 records to 's' (offsets 0..3)\n"
    got = records(path, "s")
    assert [(r.offset, r.key, r.value, r.headers) for r in got] == [
        (0, b"user-7", b"clicked", (("h", b"v"), ("via", b"cli"))),
        (1, b"user-7", None, (("via", b"cli"),)),
        (2, b"\xff", b"\x00\xfe", (("via", b"cli"),)),
        (3, None, "café".encode(), (("n", None), ("via", b"cli"))),
    ]
    assert got[0].timestamp == 1732230000000
    assert all(before <= r.timestamp <= int(time.time() * 1000) for r in got[1:])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"value": }', "line 3: not valid JSON (Expecting value at column 11)"),
        (b"", "line 3: not valid JSON (Expecting value at column 1)"),
        (b'{"value": "\xff"}', "line 3: not UTF-8 text"),
        (b'["v"]', "line 3: not a JSON object but a list"),
        (b'{"key": "k"}', "line 3: the record has no 'value'"),
        (
            b'{"value": 1}',
            "line 3: the record's 'value' must be a string or null, not the number 1",
        ),
        (b'{"value": "a", "value_base64": "YQ=="}', "has both 'value' and 'value_base64'"),
        (b'{"value_base64": "not base64!"}', "the record's 'value_base64' is not valid base64"),
        (b'{"value": "\\udcff"}', "the record's 'value' holds a lone surrogate escape"),
        (b'{"value": "v", "vaule": "v"}', "line 3: unknown field 'vaule'"),
        (b'{"value": "v", "headers": {"h": "v"}}', "'headers' must be a list"),
        (b'{"value": "v", "headers": [{"value": "v"}]}', "header 1 has no 'key'"),
        (b'{"value": "v", "headers": [{"key": "h"}]}', "header 1 has no 'value'"),
        (b'{"value": "v", "headers": [{"key": "h", "value": "v", "x": 1}]}', "unknown field 'x'"),
        (b'{"value": "v", "timestamp": "now"}', "'timestamp' must be an integer"),
        (b'{"value": "v", "timestamp": 1.5}', "'timestamp' must be an integer"),
        (b'{"value": "v", "timestamp": -1}', "'timestamp' -1 is outside 0..2**63-1"),
        (b'{"value": "v", "timestamp": 9223372036854775808}', "is outside 0..2**63-1"),
    ],
)
def test_a_bad_json_line_names_its_line_and_writes_nothing_from_its_chunk_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    line: bytes,
    message: str,
) -> None:
    good = b'{"value": "ok"}\n'
    feed(monkeypatch, good * 2 + line + b"\n" + good)
    path = tmp_path / "log"
    assert main(["produce", str(path), "s", "--format", "json", "--batch-size", "2"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "disklesslog: wrote 2 records to 's' (offsets 0..1)"
    assert len(err) == 2 and err[1].startswith("disklesslog: error: line 3"), err
    assert message in err[1]
    assert err[1].endswith("; nothing from line 3 on was written")
    assert [r.value for r in records(path, "s")] == [b"ok", b"ok"]


def test_key_sep_does_not_apply_to_json_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    feed(monkeypatch, b'{"value": "v"}\n')
    argv = ["produce", str(tmp_path / "log"), "s", "--format", "json", "--key-sep", ":"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "disklesslog: error: --key-sep applies to --format lines; a JSON line gives its own key\n"
    )
    assert not (tmp_path / "log").exists()


def test_consume_json_piped_into_produce_json_copies_a_stream_exactly(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with disklesslog.open(path) as log:
        source = log.stream("source")
        source.append_batch(
            [b"text", b"\x00\xff\xfe binary", None, b"", "caf\u00e9".encode(), b"\xc3"],
            keys=[b"k", b"\xff\x00", b"k", None, b"", b"\x80"],
            headers=[
                [("h", b"v"), ("h", b"repeated")],
                [("bin", b"\xff\x01"), ("none", None)],
                [],
                [("empty", b"")],
                [("\u00e9t\u00e9", "\u00e9".encode())],
                [],
            ],
            timestamps=[0, 1, 1732230000000, 2**63 - 1, 5, 5],
        )
    url = str(path)
    copy = subprocess.run(
        [
            "bash",
            "-c",
            'set -o pipefail; "$0" -m disklesslog consume "$1" source --format json '
            '| "$0" -m disklesslog produce "$1" copy --format json',
            sys.executable,
            url,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert copy.returncode == 0, copy.stderr
    assert copy.stderr == b"disklesslog: wrote 6 records to 'copy' (offsets 0..5)\n"
    assert records(path, "copy") == records(path, "source")
