"""The commands that manage streams and consumer groups: ``create``, ``delete``,
``trim`` and ``groups`` (list, describe, reset), in-process through ``main([...])``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import disklesslog
from disklesslog.cli import main


def make_log(path: Path, **streams: list[bytes]) -> Path:
    with disklesslog.open(path, fsync="never") as log:
        for name, values in streams.items():
            log.stream(name).append_batch(values)
    return path


def one_error(err: str) -> str:
    """The one ``disklesslog: error:`` line a user mistake prints."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("disklesslog: error: "), err
    return lines[0]


# ------------------------------------------------------------------------------- create


def test_create_makes_the_log_and_the_stream_with_its_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    argv = ["create", str(path), "events", "--config", "retention_bytes=8KiB"]
    assert main([*argv, "--config", "retention.ms=7d", "--config", "cleanup_policy=compact"]) == 0
    assert capsys.readouterr().out == "created stream 'events'\n"
    with disklesslog.open(path, create=False) as log:
        config = log.stream("events").config
    assert (config.retention_bytes, config.retention_ms) == (8192, 604_800_000)
    assert config.cleanup_policy == "compact"
    # again with the same settings: nothing changes; with others: an error
    same = ["--config", "retention_bytes=8192", "--config", "retention_ms=604800000"]
    short = ["--config", "retention_ms=1000"]
    assert main(["create", str(path), "events", *same, "--config", "cleanup_policy=compact"]) == 0
    assert capsys.readouterr().out == "stream 'events' already exists with these settings\n"
    # settings alter may change are kept as the stream has them, and said so
    assert main(["create", str(path), "events", "--config", "cleanup_policy=compact"]) == 0
    assert main(["create", str(path), "events", "--config", "cleanup_policy=compact", *short]) == 0
    assert capsys.readouterr().out == (
        "stream 'events' already exists with these settings\n"
        "stream 'events' already exists; kept its retention_ms=604800000 (asked 1000): "
        "change them with 'disklesslog alter'\n"
    )
    # a setting fixed at creation that differs is an error naming it
    assert main(["create", str(path), "events"]) == 1
    error = one_error(capsys.readouterr().err)
    assert error.startswith(
        "disklesslog: error: stream 'events' already exists with cleanup_policy='compact' "
        "(create_stream asked for 'delete'); this setting is fixed when a stream is created"
    )
    assert "retention_bytes=" not in error


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["bad/name"], "invalid stream name 'bad/name'"),
        (["s", "--config", "no_such=1"], "unknown stream option(s) ['no_such']"),
        (["s", "--config", "compression=lz9"], "compression='lz9' is unknown"),
        (["s", "--config", "retention_bytes=-5"], "retention_bytes=-5 is out of range"),
    ],
)
def test_create_refuses_bad_input_and_creates_nothing(
    tmp_path: Path, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    assert main(["create", str(path), *argv]) == 1
    assert needle in one_error(capsys.readouterr().err)
    assert not path.exists()


def test_create_on_an_object_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/objects"
    assert main(["create", url, "s", "--backend", "objects", "--config", "segment_ms=1h"]) == 0
    with disklesslog.open(url, backend="objects", create=False) as log:
        assert log.stream("s").config.segment_ms == 3_600_000


# ------------------------------------------------------------------------------- delete


def test_delete_removes_the_stream_and_groups_positions_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_log(tmp_path / "log", a=[b"1"], b=[b"2"])
    with disklesslog.open(path, fsync="never") as log:
        log.commit_offsets("g", {"a": 1, "b": 0})
    assert main(["delete", str(path), "a"]) == 0
    assert capsys.readouterr().out == "deleted stream 'a'\n"
    with disklesslog.open(path, create=False) as log:
        assert log.streams() == ["b"]
        assert log.committed_offsets("g") == {"b": 0}
    assert main(["delete", str(path), "a"]) == 1
    assert "stream 'a' does not exist" in one_error(capsys.readouterr().err)
    assert main(["delete", str(tmp_path / "nothing"), "a"]) == 1
    assert "is not a log" in one_error(capsys.readouterr().err)
    assert not (tmp_path / "nothing").exists()


# --------------------------------------------------------------------------------- trim


def test_trim_moves_the_start_offset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_log(tmp_path / "log", s=[b"%d" % i for i in range(10)])
    assert main(["trim", str(path), "s", "--before", "4"]) == 0
    assert capsys.readouterr().out == "s: start offset 0 -> 4\n"
    assert main(["trim", str(path), "s", "--before", "2"]) == 0  # already past: stays
    assert capsys.readouterr().out == "s: start offset 4 -> 4\n"
    assert main(["consume", str(path), "s", "--format", "raw", "--max", "1"]) == 0
    assert capsys.readouterr().out == "4\n"
    assert main(["trim", str(path), "s", "--before", "11"]) == 1
    assert "11" in one_error(capsys.readouterr().err)
    assert main(["trim", str(path), "s", "--before", "10"]) == 0
    assert capsys.readouterr().out == "s: start offset 4 -> 10\n"
    assert main(["trim", str(path), "s"]) == 2  # --before is required
    assert "required: --before" in capsys.readouterr().err
    assert main(["trim", str(path), "missing", "--before", "0"]) == 1
    assert "'missing'" in one_error(capsys.readouterr().err)


# ------------------------------------------------------------------------------- groups


@pytest.fixture
def grouped(tmp_path: Path) -> Path:
    """Streams a (10 records, 1 ms apart from 1_714_564_800_000) and b (3), and groups
    g (a at 4, b at 3) and h (a at 10)."""
    path = tmp_path / "log"
    with disklesslog.open(path, fsync="never") as log:
        for i in range(10):
            log.stream("a").append(b"%d" % i, timestamp=1_714_564_800_000 + i)
        log.stream("b").append_batch([b"x", b"y", b"z"])
        log.commit_offsets("g", {"a": 4, "b": 3})
        log.commit_offsets("h", {"a": 10})
    return path


def committed(path: Path, group: str) -> dict[str, int]:
    with disklesslog.open(path, create=False) as log:
        return log.committed_offsets(group)


def test_groups_lists_groups(
    grouped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["groups", str(grouped)]) == 0
    assert capsys.readouterr().out == "g\nh\n"
    assert main(["groups", str(grouped), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"groups": ["g", "h"]}
    empty = make_log(tmp_path / "empty", s=[b"1"])
    assert main(["groups", str(empty), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"groups": []}


def test_groups_describe_shows_positions_and_lag(
    grouped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with disklesslog.open(grouped, fsync="never") as log:
        log.stream("a").trim(6)  # g's position 4 was trimmed: 4 records left, not 6
    assert main(["groups", str(grouped), "describe", "g"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "group: g",
        "  position  start  end  lag  stream",
        "         4      6   10    4  a",
        "         3      0    3    0  b",
    ]
    assert main(["groups", str(grouped), "describe", "g", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "group": "g",
        "streams": [
            {"stream": "a", "position": 4, "start_offset": 6, "end_offset": 10, "lag": 4},
            {"stream": "b", "position": 3, "start_offset": 0, "end_offset": 3, "lag": 0},
        ],
    }
    assert main(["groups", str(grouped), "describe", "nobody"]) == 1
    assert "consumer group 'nobody' has no committed positions" in one_error(
        capsys.readouterr().err
    )


def test_groups_describe_a_position_past_the_end(
    grouped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with disklesslog.open(grouped, fsync="never") as log:
        log.commit_offsets("g", {"b": 50})  # e.g. the stream was recreated
    assert main(["groups", str(grouped), "describe", "g", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["streams"]
    assert rows[1] == {
        "stream": "b",
        "position": 50,
        "start_offset": 0,
        "end_offset": 3,
        "lag": None,
    }
    assert main(["groups", str(grouped), "describe", "g"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "        50      0    3    -  b"


@pytest.mark.parametrize(
    ("to", "expected"),
    [
        (["earliest"], {"a": 0, "b": 0}),
        (["latest"], {"a": 10, "b": 3}),
        (["time", "2024-05-01T12:00:00.007Z"], {"a": 7, "b": 0}),  # b's records are newer
        (["time", "1714564800002"], {"a": 2, "b": 0}),
        (["time", "2030-01-01"], {"a": 10, "b": 3}),
    ],
)
def test_groups_reset_every_stream_of_the_group(
    grouped: Path, to: list[str], expected: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["groups", str(grouped), "reset", "g", "--to", *to]) == 0
    assert committed(grouped, "g") == expected
    assert committed(grouped, "h") == {"a": 10}  # other groups stay


def test_groups_reset_output_dry_run_and_one_stream(
    grouped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["groups", str(grouped), "reset", "g", "--to", "offset", "2", "--stream", "a"]
    assert main([*argv, "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "group g: would set positions",
        "  previous  position  stream",
        "         4         2  a",
        "(dry run: nothing committed)",
    ]
    assert committed(grouped, "g") == {"a": 4, "b": 3}
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "group": "g",
        "dry_run": False,
        "streams": [{"stream": "a", "previous": 4, "position": 2}],
    }
    assert committed(grouped, "g") == {"a": 2, "b": 3}


def test_groups_reset_a_new_group_needs_streams(
    grouped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["groups", str(grouped), "reset", "new", "--to", "latest"]) == 1
    assert "name the streams to set with --stream" in one_error(capsys.readouterr().err)
    argv = ["groups", str(grouped), "reset", "new", "--to", "latest", "--stream", "b"]
    assert main([*argv, "--stream", "a"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "group new: set positions",
        "  previous  position  stream",
        "         -         3  b",
        "         -        10  a",
    ]
    assert committed(grouped, "new") == {"a": 10, "b": 3}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--to", "offset", "11"], "choose an offset in 0..10"),
        (["--to", "offset", "1", "--stream", "missing"], "'missing'"),
        (["--to", "latest", "--stream", "a", "--stream", "bad/name"], "invalid stream name"),
    ],
)
def test_groups_reset_refuses_and_changes_nothing(
    grouped: Path, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["groups", str(grouped), "reset", "g", *argv]) == 1
    assert needle in one_error(capsys.readouterr().err)
    assert committed(grouped, "g") == {"a": 4, "b": 3}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reset", "g"], "reset needs --to earliest|latest|offset N|time T"),
        (["describe"], "describe needs a consumer group G"),
        (["g"], "argument ACTION: invalid choice: 'g' (choose from 'describe', 'reset')"),
        (["describe", "g", "--to", "latest"], "--to goes with reset only"),
        (["--stream", "a"], "--stream goes with reset only"),
        (["reset", "g", "--to", "sideways"], "argument --to: use one of: earliest, latest"),
        (["reset", "g", "--to", "offset"], "argument --to: use one of: earliest, latest"),
        (["reset", "g", "--to", "latest", "5"], "argument --to: use one of: earliest, latest"),
        (["reset", "g", "--to", "offset", "x"], "argument --to: not an integer: 'x'"),
    ],
)
def test_groups_usage_errors_exit_2(
    grouped: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["groups", str(grouped), *argv]) == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert committed(grouped, "g") == {"a": 4, "b": 3}


def test_groups_and_consume_agree(grouped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A reset is where the group's next consume starts; its commit is what describe shows."""
    assert main(["groups", str(grouped), "reset", "g", "--to", "offset", "8", "--stream", "a"]) == 0
    capsys.readouterr()
    assert main(["consume", str(grouped), "a", "--group", "g", "--format", "raw"]) == 0
    assert capsys.readouterr().out == "8\n9\n"
    assert main(["groups", str(grouped), "describe", "g", "--json"]) == 0
    lags = {r["stream"]: r["lag"] for r in json.loads(capsys.readouterr().out)["streams"]}
    assert lags == {"a": 0, "b": 0}


def test_groups_on_an_object_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/objects"
    with disklesslog.open(url, backend="objects") as log:
        log.stream("s").append_batch([b"1", b"2"])
        log.commit_offsets("g", {"s": 1})
    assert main(["groups", url, "--backend", "objects"]) == 0
    assert capsys.readouterr().out == "g\n"
    assert main(["groups", url, "describe", "g", "--backend", "objects", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["streams"][0]["lag"] == 1
