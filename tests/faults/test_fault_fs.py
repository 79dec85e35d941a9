"""The fault-injecting filesystem itself (:mod:`disklesslog.testing.faults`): each kind
of fault does what it says on each kind of call, faults are reproducible from the
seed, counted, and reach other processes through the URL and its options."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from disklesslog.storage.conditional import put_if_absent
from disklesslog.testing.faults import FaultyFileSystem, InjectedClientError

TRANSIENT = (OSError, InjectedClientError)


def _fs(**options: Any) -> FaultyFileSystem:
    options.setdefault("target_protocol", "memory")
    fs = fsspec.filesystem("faulty", skip_instance_cache=True, **options)
    assert isinstance(fs, FaultyFileSystem)
    return fs


def _path() -> str:
    return f"faultfs-{uuid.uuid4().hex[:12]}/key"


def test_no_faults_is_a_transparent_wrapper(tmp_path: Path) -> None:
    for fs, path in (
        (_fs(), _path()),
        (_fs(target_protocol="file", target_options={"auto_mkdir": True}), f"{tmp_path}/a/b"),
    ):
        fs.pipe_file(path, b"hello")
        assert fs.cat_file(path) == b"hello"
        assert fs.cat_file(path, start=1, end=3) == b"el"
        assert fs.exists(path)
        assert fs.info(path)["size"] == 5
        assert [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.find(path.rsplit("/", 1)[0])] == [
            path.rsplit("/", 1)[-1]
        ]
        with fs.open(path, "rb") as f:
            assert f.read() == b"hello"
        with fs.open(path + "2", "wb") as f:
            f.write(b"abc")
        assert fs.cat_file(path + "2") == b"abc"
        assert put_if_absent(fs, path + "3", b"x") is True
        assert put_if_absent(fs, path + "3", b"y") is False
        assert fs.cat_file(path + "3") == b"x"
        fs.rm_file(path)
        assert not fs.exists(path)
        assert fs.stats()["injected"] == 0


def test_fail_happens_before_the_call() -> None:
    fs = _fs(fail=1.0)
    path = _path()
    with pytest.raises(TRANSIENT):
        fs.pipe_file(path, b"x")
    with fs.paused():
        assert not fs.exists(path)
        fs.pipe_file(path, b"x")
    for call in (
        lambda: fs.cat_file(path),
        lambda: fs.ls(path),
        lambda: fs.info(path),
        lambda: fs.rm_file(path),
        lambda: put_if_absent(fs, path + "c", b"x"),
    ):
        with pytest.raises(TRANSIENT):
            call()
    with fs.paused():
        assert fs.exists(path)
        assert not fs.exists(path + "c")
    stats = fs.stats()
    assert stats["injected"] == 6
    assert {k for k in stats if k.startswith("fail.")} == {
        "fail.write",
        "fail.read",
        "fail.list",
        "fail.delete",
        "fail.create",
    }


def test_lost_applies_the_call_then_raises() -> None:
    fs = _fs(lost=1.0)
    path = _path()
    with pytest.raises(TRANSIENT):
        fs.pipe_file(path, b"x")
    with pytest.raises(TRANSIENT):
        put_if_absent(fs, path + "c", b"y")
    with fs.paused():
        assert fs.cat_file(path) == b"x"
        assert fs.cat_file(path + "c") == b"y"
    with pytest.raises(TRANSIENT):
        fs.rm_file(path)
    with fs.paused():
        assert not fs.exists(path)
    assert fs.stats()["lost.create"] == 1


def test_a_lost_race_is_an_answer_not_a_fault() -> None:
    fs = _fs()
    path = _path()
    fs.pipe_file(path, b"first")
    with pytest.raises(FileExistsError):
        fs.pipe_file(path, b"second", mode="create")
    fs.rates["fail"] = 1.0
    with pytest.raises(TRANSIENT) as caught:
        fs.cat_file(path)
    assert not isinstance(caught.value, (FileNotFoundError, FileExistsError))


def test_timeout_waits_raises_and_may_or_may_not_apply() -> None:
    fs = _fs(timeout=1.0, timeout_seconds=0.0, seed=3)
    applied = 0
    for _ in range(40):
        path = _path()
        with pytest.raises(TimeoutError):
            fs.pipe_file(path, b"x")
        with fs.paused():
            applied += fs.exists(path)
    assert 0 < applied < 40
    assert fs.stats()["timeout.write"] == 40


def test_corrupt_damages_what_a_read_returns_not_what_is_stored() -> None:
    fs = _fs(corrupt=1.0, seed=5)
    path = _path()
    data = bytes(range(256)) * 4
    fs.pipe_file(path, data)  # corrupt applies to reads only
    damaged = [fs.cat_file(path) for _ in range(20)]
    assert all(d != data for d in damaged)
    assert any(len(d) < len(data) for d in damaged)
    assert any(len(d) == len(data) for d in damaged)
    with fs.paused():
        assert fs.cat_file(path) == data
    assert fs.stats()["corrupt.read"] == 20


def test_faults_follow_the_seed_and_the_filters() -> None:
    def run(seed: int) -> list[str]:
        fs = _fs(fail=0.3, lost=0.3, seed=seed)
        out = []
        for _ in range(50):
            try:
                fs.pipe_file(_path(), b"x")
                out.append("ok")
            except Exception as exc:
                out.append(type(exc).__name__ + str(exc).split(" fault")[0])
        return out

    assert run(1) == run(1)
    assert run(1) != run(2)
    fs = _fs(fail=1.0, operations=["write"], match="only-here")
    path = _path()
    fs.pipe_file(path, b"x")  # not matched
    assert fs.cat_file(path) == b"x"  # reads not selected
    with pytest.raises(TRANSIENT):
        fs.pipe_file(path + "/only-here", b"x")
    with pytest.raises(ValueError, match="probability"):
        _fs(fail=1.5)
    with pytest.raises(ValueError, match="more than 1"):
        _fs(fail=0.6, lost=0.6)
    with pytest.raises(ValueError, match="unknown operations"):
        _fs(operations=["nope"])


def test_other_processes_get_the_faults_from_the_options(tmp_path: Path) -> None:
    """``faulty://`` is registered by an entry point: a child process that never imports
    the module opens it from the URL, with the same seeded faults."""
    code = (
        "import fsspec, sys\n"
        "fs = fsspec.filesystem('faulty', target_protocol='file', fail=1.0, "
        "operations=['write'], target_options={'auto_mkdir': True})\n"
        "try:\n"
        f"    fs.pipe_file({str(tmp_path / 'x')!r}, b'x')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, fs.stats()['injected'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out[1] == "1"
    assert not (tmp_path / "x").exists()


def test_latency_delays_each_request_of_its_group() -> None:
    fs = _fs(latency={"read": 0.03, "create": 0.02})
    path = _path()
    started = time.monotonic()
    fs.pipe_file(path, b"hello")  # a write: no latency given for it
    assert time.monotonic() - started < 0.02
    started = time.monotonic()
    assert fs.cat_file(path) == b"hello"
    assert time.monotonic() - started >= 0.03
    started = time.monotonic()
    assert not put_if_absent(fs, path, b"other")  # the create waits, then loses
    assert time.monotonic() - started >= 0.02
    with fs.paused():  # set-up and checks go at full speed
        started = time.monotonic()
        assert fs.cat_file(path) == b"hello"
        assert time.monotonic() - started < 0.03


def test_latency_of_one_cat_call_is_paid_once() -> None:
    """s3fs, gcsfs and adlfs send the GETs of one ``cat`` call concurrently."""
    fs = _fs(latency={"read": 0.05})
    paths = [f"{_path()}-{i}" for i in range(6)]
    for path in paths:
        fs.pipe_file(path, path.encode())
    started = time.monotonic()
    got = fs.cat(paths)
    took = time.monotonic() - started
    assert got == {path: path.encode() for path in paths}
    assert 0.05 <= took < 0.05 * 3


def test_latency_is_checked() -> None:
    for bad in ({"reads": 0.01}, {"read": -1}, {"read": 61}, {"read": "1"}, {"read": True}):
        with pytest.raises(ValueError, match="latency"):
            _fs(latency=bad)


def test_ranges_reach_clients_whose_cat_file_takes_more_positional_arguments() -> None:
    """s3fs's ``cat_file(path, version_id=None, start=None, end=None)``: a range passed on
    by position would be read as a version id and a start."""

    class Versioned(MemoryFileSystem):  # type: ignore[misc]
        protocol = ("versioned-memory",)

        def cat_file(
            self, path: str, version_id: Any = None, start: Any = None, end: Any = None, **kw: Any
        ) -> Any:
            assert version_id is None
            return super().cat_file(path, start=start, end=end, **kw)

    fsspec.register_implementation("versioned-memory", Versioned, clobber=True)
    fs = _fs(target_protocol="versioned-memory")
    path = _path()
    fs.pipe_file(path, b"hello")
    assert fs.cat_file(path, start=1, end=3) == b"el"
    assert fs.cat_file(path, 1, 3) == b"el"
