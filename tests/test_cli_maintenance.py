"""The maintenance subcommands (retention, compact, merge, tier, gc, maintain) and
``describe`` of a whole log: summaries, dry runs, JSON reports, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import disklesslog
from disklesslog.cli import main


def _log(path: Path, **options: object) -> Path:
    """A local log with stream ``a`` (100 batches of 200 B over small segments) and ``b``."""
    with disklesslog.open(path, fsync="never", segment_bytes=4096, **options) as log:
        a = log.stream("a")
        for i in range(100):
            a.append_batch([b"%05d" % i + b"x" * 195], timestamps=1_000 + i)
        log.stream("b").append(b"y")
    return path


def _start(path: Path, stream: str) -> int:
    with disklesslog.open(path, create=False) as log:
        return log.stream(stream).start_offset


def test_retention_prints_a_summary_and_trims(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _log(tmp_path / "log", retention_bytes=8_000)
    assert main(["retention", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("retention:")
    assert "a: start offset 0 ->" in out and "segments deleted" in out
    assert _start(path, "a") > 0 and _start(path, "b") == 0


def test_dry_run_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _log(tmp_path / "log", retention_bytes=8_000)
    assert main(["retention", str(path), "--dry-run", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "(dry run)" in out and "would a: start offset 0 ->" in out
    assert _start(path, "a") == 0


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _log(tmp_path / "log", retention_bytes=8_000)
    assert main(["retention", str(path), "--stream", "a", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["operation"] == "retention" and report["streams"] == 1
    assert report["records_removed"] == _start(path, "a") > 0
    assert report["segments_deleted"] > 0 and report["bytes_deleted"] > 0


def test_maintain_runs_every_operation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _log(tmp_path / "log", retention_bytes=8_000)
    assert main(["maintain", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["operation"] == "maintain"
    assert any(line.startswith("retention: a: start offset") for line in report["actions"])
    assert _start(path, "a") > 0


def test_maintain_expires_idle_producers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``maintain`` includes the sequencer's housekeeping, which forgets producers idle
    for ``--producer-expiration-ms`` and says so in the report."""
    url = f"file://{tmp_path}/log"
    with (
        disklesslog.open(url, backend="objects", maintenance="off") as log,
        log.writer() as writer,
    ):
        writer.append("a", b"x")
        writer.append("b", b"y")
    time.sleep(0.01)
    command = ["maintain", url, "--backend", "objects", "--json"]
    assert main(command) == 0  # the default window, a day: nothing expires
    report = json.loads(capsys.readouterr().out)
    assert not any("idle producers" in line for line in report["actions"])
    assert main([*command, "--producer-expiration-ms", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    expired = "housekeeping: expired 2 idle producer stream states and 1 idle producers"
    assert expired in report["actions"]
    assert main([*command, "--producer-expiration-ms", "0"]) == 1  # a one-line error
    assert "producer_expiration_ms must be an int" in capsys.readouterr().err


def test_describe_a_whole_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _log(tmp_path / "log")
    assert main(["describe", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["segments", "start", "end", "records", "bytes", "stream"]
    assert lines[1].split()[1:4] == ["0", "100", "100"] and lines[1].split()[-1] == "a"
    assert lines[2].split()[-1] == "b"
    assert lines[-3].split()[0] == "101" and lines[-3].endswith("(total)")
    assert lines[-2:] == [
        "maintenance: no process holds the maintenance lease now",
        "last maintenance pass: none yet",
    ]
    assert main(["describe", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["stream"] for r in rows] == ["a", "b"]
    assert rows[0]["segments"] > 1 and rows[0]["bytes"] > 20_000


def test_describe_names_the_process_that_maintains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with disklesslog.open(tmp_path / "log", maintenance_interval_ms=10) as log:
        log.stream("s").append(b"x")
        deadline = time.monotonic() + 30
        while not log.maintenance_status().passes:
            assert time.monotonic() < deadline, "no maintenance pass"
            time.sleep(0.01)
        holder = log.maintenance_status().holder
        assert main(["describe", str(tmp_path / "log")]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"maintenance: run by {holder} (lease token 1)")
    assert lines[at + 1].startswith("last maintenance pass: 20")
    assert lines[at + 1].endswith(f"Z by {holder}")
    assert any(line.startswith("  retention: last ran 20") for line in lines[at + 2 :])


def test_describe_reports_a_damaged_maintenance_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _log(tmp_path / "log")
    (path / "maintenance.json").write_bytes(b'{"version": 1}\n#crc32c:00000000\n')
    assert main(["describe", str(path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("last maintenance pass: unreadable (")
    assert "maintenance.json" in last and "CRC-32C" in last


def test_describe_object_log_counts_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/objects"
    with disklesslog.open(url, backend="objects") as log:
        for i in range(3):
            log.stream("s").append(b"%d" % i)  # one object each
    assert main(["describe", url, "--backend", "objects", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [
        {
            "stream": "s",
            "start_offset": 0,
            "end_offset": 3,
            "records": 3,
            "bytes": rows[0]["bytes"],
            "objects": 3,
        }
    ]


@pytest.mark.parametrize("command", ["retention", "compact", "merge", "tier", "maintain"])
def test_maintenance_commands_never_create_a_log(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, str(tmp_path / "nothing")]) == 1
    assert "not a log" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_bad_grace_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gc", str(tmp_path), "--grace", "-5"]) == 2
    assert "must be 0 or more" in capsys.readouterr().err


def test_missing_stream_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _log(tmp_path / "log")
    assert main(["retention", str(path), "--stream", "nope"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("disklesslog: error:") and "nope" in err[0]


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """Run as a subprocess (stderr a pipe, not a terminal): no tqdm output at all."""
    path = _log(tmp_path / "log", retention_bytes=8_000)
    done = subprocess.run(
        [sys.executable, "-m", "disklesslog", "maintain", str(path)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert b"retention: a: start offset" in done.stdout


def test_progress_draws_tqdm_bars_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from disklesslog.cli.maintenance import _progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    with _progress(True) as progress:
        assert progress is not None
        for done in range(0, 101, 25):
            progress("retention", done, 100)
    assert "retention" in screen.getvalue() and "100/100" in screen.getvalue()
    with _progress(False) as nothing:
        assert nothing is None


def test_alter_changes_maintenance_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _log(tmp_path / "log")
    assert main(["alter", str(path), "a", "retention_bytes=8000", "delete_retention_ms=5"]) == 0
    out = capsys.readouterr().out
    assert "retention_bytes            8000" in out
    assert main(["retention", str(path), "--no-progress"]) == 0
    assert _start(path, "a") > 0
    assert main(["alter", str(path), "a", 'compression="zstd"']) == 1
    assert "cannot change" in capsys.readouterr().err
    assert main(["alter", str(path), "a", "retention_ms"]) == 2


def test_alter_takes_sizes_and_durations_with_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _log(tmp_path / "log")
    argv = ["alter", str(path), "a", "retention_bytes=8KiB", "retention.ms=7d"]
    assert main([*argv, "delete_retention_ms=12h", "local_retention_ms=-2"]) == 0
    out = capsys.readouterr().out
    assert "retention_bytes            8192" in out
    assert "retention_ms               604800000" in out
    assert "delete_retention_ms        43200000" in out
    assert main(["alter", str(path), "a", "retention_bytes=8KB"]) == 2
    assert "retention_bytes: not a size: '8KB'" in capsys.readouterr().err


def test_merge_target_bytes_on_an_object_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/objects"
    with disklesslog.open(url, backend="objects") as log:
        for i in range(5):
            log.stream("s").append(b"%d" % i)
    assert main(["merge", url, "--backend", "objects", "--target-bytes", "4096", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["operation"] == "merge"
    assert main(["merge", url, "--backend", "objects", "--target-bytes", "5"]) == 2
    for bad in ("5MB", "1.5MiB", "-4096", "KiB"):
        assert main(["merge", url, "--backend", "objects", "--target-bytes", bad]) == 2
        assert "not a size" in capsys.readouterr().err or bad == "-4096"


@pytest.mark.parametrize(
    ("text", "size"), [("4096", 4096), ("4KiB", 4096), ("64MiB", 64 << 20), ("1gib", 1 << 30)]
)
def test_sizes_take_binary_suffixes(text: str, size: int) -> None:
    from disklesslog.cli.args import byte_size as _size

    assert _size(text) == size


def _lose_acknowledged_tail(path: Path) -> None:
    """16 records appended with fsync="always" (acknowledged, synced); then storage
    loses the last quarter of the active segment's bytes."""
    with disklesslog.open(path, fsync="always") as log:
        stream = log.create_stream("s")
        for i in range(16):
            stream.append(b"record-%d" % i, timestamp=1000 + i)
    active = sorted((path / "streams" / "s").glob("*.log"))[-1]
    data = active.read_bytes()
    active.write_bytes(data[: len(data) * 3 // 4])


def test_repair_accepts_a_loss_only_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    _lose_acknowledged_tail(path)
    assert main(["repair", str(path), "s"]) == 1  # the loss is named, nothing changes
    err = capsys.readouterr().err
    assert "offsets 12 to 15" in err or "12 to 15" in err, err
    assert main(["repair", str(path), "s", "--accept-data-loss", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["operation"] == "repair"
    assert any("12 to 15" in line for line in report["actions"]), report
    with disklesslog.open(path, create=False) as log:
        stream = log.stream("s")
        assert stream.append(b"after") == 16  # the lost offsets are never handed out
        assert [r.offset for r in stream.read()] == [*range(12), 16]
    assert main(["repair", str(path), "s"]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_repair_refuses_bad_arguments_and_does_not_apply_to_object_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _log(tmp_path / "log")
    assert main(["repair", str(path), "s", "--start-offset", "-1"]) == 2
    assert main(["repair", str(path), "no such/stream"]) == 1
    capsys.readouterr()
    url = f"file://{tmp_path / 'objects'}"
    with disklesslog.open(url, backend="objects") as log:
        log.stream("a").append(b"x")
        assert log.repair("a").skipped == ["not applicable to ObjectLog logs"]
        with pytest.raises(disklesslog.ConfigError):
            log.repair("a", accept_data_loss="yes")  # type: ignore[arg-type]
    assert main(["repair", url, "a", "--backend", "objects"]) == 0
    assert "not applicable" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "mode"), [([], "auto"), (["--maintenance", "off"], "off")])
def test_commands_take_the_maintenance_option(tmp_path: Path, flag: list[str], mode: str) -> None:
    from disklesslog.cli import build_parser
    from disklesslog.cli.logs import open_log

    disklesslog.open(tmp_path / "log").close()
    args = build_parser().parse_args(["streams", str(tmp_path / "log"), *flag])
    with open_log(args, create=False) as log:
        assert log.maintenance_status().mode == mode
