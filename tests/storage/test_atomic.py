"""Replacing a file by rename: the new content or the old one, never a leftover temporary,
and fsync exactly when asked."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from disklesslog.storage.atomic import TEMPORARY_INFIX, fsync_directory, replace_file


def test_replaces_the_content_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old content")
    replace_file(target, b"new", sync=False)
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["file"]


def test_creates_a_missing_file_from_chunks(tmp_path: Path) -> None:
    target = tmp_path / "file"
    replace_file(str(target), (bytes([i]) * 3 for i in range(3)), sync=True)
    assert target.read_bytes() == b"\x00\x00\x00\x01\x01\x01\x02\x02\x02"
    assert os.listdir(tmp_path) == ["file"]


def test_a_failing_chunk_leaves_the_old_content_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old")

    def chunks() -> Iterator[bytes]:
        yield b"half of the new"
        raise OSError("the source failed")

    with pytest.raises(OSError, match="the source failed"):
        replace_file(target, chunks(), sync=False)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file"]


@pytest.mark.parametrize("failing", ["write", "fsync", "replace"])
def test_a_failing_call_leaves_the_old_content_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old")

    def fail(*args: object) -> None:
        raise OSError(28, "injected")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="injected"):
        replace_file(target, b"new", sync=True)
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file"]


def test_a_short_write_is_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:2]))
    replace_file(tmp_path / "file", b"abcdefg", sync=False)
    assert (tmp_path / "file").read_bytes() == b"abcdefg"


def test_a_write_that_makes_no_progress_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(OSError, match="short write"):
        replace_file(tmp_path / "file", b"abc", sync=False)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("sync", [True, False])
def test_fsyncs_the_file_and_its_directory_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    replace_file(tmp_path / "file", b"data", sync=sync)
    assert synced == (["file", "dir"] if sync else [])


def test_the_file_is_synced_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def replace(source: Path | str, target: Path | str) -> None:
        calls.append("replace")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    replace_file(tmp_path / "file", b"data", sync=True)
    assert calls == ["fsync", "replace", "fsync"]


def test_the_default_temporary_is_beside_the_file_and_exclusive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, int]] = []
    real = os.open

    def open_(path: str, flags: int, mode: int = 0o777) -> int:
        opened.append((os.fspath(path), flags))
        return real(path, flags, mode)

    monkeypatch.setattr(os, "open", open_)
    replace_file(tmp_path / "file", b"data", sync=False)
    name, flags = opened[0]
    base, infix, tail = os.path.basename(name).partition(TEMPORARY_INFIX)
    assert (os.path.dirname(name), base, infix) == (str(tmp_path), "file", TEMPORARY_INFIX)
    assert len(tail) == 16 and int(tail, 16) >= 0
    assert flags & os.O_EXCL


def test_a_named_temporary_elsewhere_is_used_and_may_exist(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    draft = staging / "draft"
    draft.write_bytes(b"left by a crashed process, longer than the new content")
    replace_file(tmp_path / "file", b"new", sync=True, temporary=draft)
    assert (tmp_path / "file").read_bytes() == b"new"
    assert os.listdir(staging) == []


def test_the_mode_is_the_files(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        replace_file(tmp_path / "private", b"x", sync=False, mode=0o600)
        replace_file(tmp_path / "shared", b"x", sync=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o644


def test_fsync_directory_closes_what_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[int] = []
    real = os.open

    def open_(path: str, flags: int, mode: int = 0o777) -> int:
        opened.append(real(path, flags, mode))
        return opened[-1]

    monkeypatch.setattr(os, "open", open_)
    fsync_directory(tmp_path)
    with pytest.raises(OSError):
        os.fstat(opened[0])
