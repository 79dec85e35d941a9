"""Local logs under failing operating-system calls.

Every ``os`` call the local backend makes can fail (a full disk, an I/O error, a quota,
too many open files). Here a seeded share of them does, at random, while a workload of
public calls runs: appends (one by one, in batches, through a writer), reads, trims,
retention, key compaction, consumer-group commits and reopening the log. The rule
checked, call by call and at the end with the faults off:

* a public call either succeeds or raises a ``DisklessLogError`` (OS failures as
  ``StorageError``, which is also an ``OSError``); nothing else escapes;
* a read under faults returns exactly the acknowledged records of its range, or fails;
* an acknowledged record is never lost or moved, a failed append leaves nothing that a
  later read shows, and no offset is handed out twice; on a compacted stream, a read
  shows only acknowledged records, every key's latest among them, and nothing it once
  showed compacted away;
* once the faults stop, the log opens and every stream holds exactly its acknowledged
  records from its start offset on, and appends go on after them.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import DisklessLogError, StorageError

FAULTY = (
    "open",
    "close",
    "write",
    "writev",
    "pwrite",
    "pread",
    "read",
    "fsync",
    "fdatasync",
    "ftruncate",
    "rename",
    "replace",
    "unlink",
    "link",
    "mkdir",
    "listdir",
    "scandir",
    "stat",
    "fstat",
    "lseek",
    "dup",
)
"""The ``os`` functions that fail at random. ``close`` fails *after* closing, as
``close(2)`` does on NFS (the descriptor is gone either way)."""

CODES = (errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EMFILE)


@dataclass
class Faults:
    seed: int
    rate: float
    on: bool = False
    injected: dict[str, int] = field(default_factory=dict)
    rngs: dict[str, random.Random] = field(default_factory=dict)

    def wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.on and self._rng().random() < self.rate:
                self.injected[name] = self.injected.get(name, 0) + 1
                code = self._rng().choice(CODES)
                if name == "close":
                    real(*args, **kwargs)
                raise OSError(code, f"injected {os.strerror(code)} in os.{name}")
            return real(*args, **kwargs)

        return call

    def _rng(self) -> random.Random:
        """One generator per thread (writers flush in their own), each seeded from the
        campaign's seed and the thread's kind (its name without the log's path, which
        differs from run to run), so a seed replays the same faults (but for the timing
        of the fsync-interval thread)."""
        name = threading.current_thread().name.partition(" ")[0]
        found = self.rngs.get(name)
        if found is None:
            found = self.rngs[name] = random.Random(f"{self.seed}/{name}")
        return found

    @contextmanager
    def active(self) -> Iterator[None]:
        self.on = True
        try:
            yield
        finally:
            self.on = False


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    injected = Faults(0, 0.0)
    for name in FAULTY:
        monkeypatch.setattr(os, name, injected.wrap(name, getattr(os, name)))
    return injected


@dataclass
class Model:
    """What a stream must hold: acknowledged values by offset, the start offset (or the
    range it may be in after a trim that failed), and the highest offset handed out."""

    values: dict[int, bytes] = field(default_factory=dict)
    start_low: int = 0
    start_high: int = 0
    handed_out: int = 0

    def acknowledge(self, offsets: list[int], values: list[bytes]) -> None:
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), offsets
        assert offsets[0] >= self.handed_out, f"offset {offsets[0]} handed out again"
        self.values.update(zip(offsets, values))
        self.handed_out = offsets[-1] + 1

    def trimmed(self, before: int, *, applied: bool) -> None:
        """A trim to ``before`` that succeeded, or failed (then it may have applied). A
        success says the start offset is at least ``before``, and no more: an earlier
        trim further that failed may or may not have applied."""
        self.start_high = max(self.start_high, before)
        if applied:
            self.start_low = max(self.start_low, before)
        for offset in [o for o in self.values if o < self.start_low]:
            del self.values[offset]

    def observe(self, records: list[tuple[int, bytes]]) -> None:
        """A whole-stream read: its records are exactly the acknowledged ones from where
        it starts, and it starts where a trim may have put the start offset."""
        first = records[0][0] if records else self.handed_out
        assert first >= self.start_low, f"trimmed records came back from {first}"
        lost = [o for o in self.values if max(self.start_high, self.start_low) <= o < first]
        assert not lost, f"acknowledged offsets {lost[:5]}... are gone"
        expected = [(o, v) for o, v in sorted(self.values.items()) if o >= first]
        assert records == expected, (first, records[:3], expected[:3])
        if records:  # the read shows where the start is: a failed trim applied or not
            self.start_low = self.start_high = max(self.start_low, min(first, self.start_high))
            self.trimmed(self.start_low, applied=True)


@dataclass
class KeyedModel:
    """A compacted stream (never trimmed): acknowledged ``(key, value)`` by offset, and
    the offsets a read showed compacted away (which must never come back)."""

    records: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    handed_out: int = 0

    def acknowledge(self, offsets: list[int], keys: list[bytes], values: list[bytes]) -> None:
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), offsets
        assert offsets[0] >= self.handed_out, f"offset {offsets[0]} handed out again"
        self.records.update(zip(offsets, zip(keys, values)))
        self.handed_out = offsets[-1] + 1

    def observe(self, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
        seen = {offset: (key, value) for offset, key, value in records}
        assert len(seen) == len(records), "an offset read twice"
        strangers = {o: kv for o, kv in seen.items() if self.records.get(o) != kv}
        assert not strangers, f"records never acknowledged: {list(strangers.items())[:3]}"
        back = sorted(self.gone & seen.keys())
        assert not back, f"compacted-away offsets came back: {back[:5]}"
        latest = {key: offset for offset, (key, _) in sorted(self.records.items())}
        lost = sorted(set(latest.values()) - seen.keys())
        assert not lost, f"the latest records of their keys are gone: {lost[:5]}"
        self.gone |= self.records.keys() - seen.keys()


class Violation(AssertionError):
    pass


def _call(action: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, result) or (False, the DisklessLogError); anything else is a violation."""
    try:
        return True, action()
    except DisklessLogError as exc:
        if isinstance(exc, OSError):
            assert isinstance(exc, StorageError), repr(exc)
        return False, exc
    except BaseException as exc:
        raise Violation(f"{type(exc).__name__} escaped a public call: {exc!r}") from exc


def _campaign(root: Path, faults: Faults, seed: int, steps: int, fsync: str) -> None:
    rng = random.Random(seed)
    faults.seed, faults.rate = seed, 0.04
    names = ["a", "b", "c", "k"]
    models = {name: Model() for name in names[:-1]}
    keyed = KeyedModel()
    options = {"fsync": fsync, "segment_bytes": 2048, "index_interval_bytes": 256}
    log = disklesslog.open(root, **options)
    log.create_stream("a", retention_bytes=4096)
    log.create_stream("k", cleanup_policy="compact", min_cleanable_dirty_ratio=0.0)
    counter = 0

    def value() -> bytes:
        nonlocal counter
        counter += 1
        return b"v%06d-" % counter + b"x" * rng.randrange(0, 200)

    def reopen() -> None:
        nonlocal log
        _call(log.close)
        opened, result = _call(lambda: disklesslog.open(root, **options))
        if opened:
            log = result
        else:  # try again without faults: the log must open once they stop
            with faults_off(faults):
                log = disklesslog.open(root, **options)

    with faults.active():
        for _ in range(steps):
            name = rng.choice(names)
            kind = rng.random()
            if name == "k":
                _keyed_step(log, keyed, kind, rng, value)
                if kind >= 0.90:
                    reopen()
                continue
            model = models[name]
            if kind < 0.35:
                values = [value() for _ in range(rng.choice((1, 1, 3, 20)))]
                ok, offsets = _call(lambda n=name, v=values: log.stream(n).append_batch(v))
                if ok:
                    model.acknowledge(offsets, values)
            elif kind < 0.45:
                values = [value() for _ in range(rng.randrange(1, 30))]
                ok, _ = _call(lambda n=name, v=values, m=model: _through_writer(log, n, v, m))
            elif kind < 0.70:
                ok, records = _call(
                    lambda n=name: [(r.offset, r.value) for r in log.stream(n).read()]
                )
                if ok:
                    model.observe(records)
            elif kind < 0.80 and name == "a":  # its retention_bytes keeps about 2 segments
                _call(lambda: log.apply_retention("a"))
                model.start_high = model.handed_out  # where depends on segment sizes
            elif kind < 0.80:
                before = rng.randrange(model.start_low, model.handed_out + 1)
                ok, _ = _call(lambda n=name, b=before: log.stream(n).trim(b))
                model.trimmed(before, applied=ok)
            elif kind < 0.90:
                ok, _ = _call(lambda n=name, m=model: log.commit_offsets("g", {n: m.handed_out}))
            else:
                reopen()
    _call(log.close)

    with disklesslog.open(root, **options) as log:
        for name, model in models.items():
            if model.handed_out == 0 and name not in log:
                continue
            stream = log.stream(name)
            start = stream.start_offset
            assert model.start_low <= start <= max(model.start_high, model.start_low), (
                name,
                start,
                model.start_low,
                model.start_high,
            )
            records = [(r.offset, r.value) for r in stream.read()]
            model.observe(records)
            assert stream.end_offset >= model.handed_out
            assert stream.append(b"after") >= model.handed_out
        keyed.observe([(r.offset, r.key, r.value) for r in log.stream("k").read()])
        assert log.stream("k").append(b"after", key=b"k0") >= keyed.handed_out
    assert sum(faults.injected.values()) > 0


def _keyed_step(
    log: Any, model: KeyedModel, kind: float, rng: random.Random, value: Callable[[], bytes]
) -> None:
    """One call on the compacted stream ``k``: an append, a read or a compaction."""
    if kind < 0.45:
        values = [value() for _ in range(rng.choice((1, 3, 20)))]
        keys = [b"k%d" % rng.randrange(8) for _ in values]
        ok, offsets = _call(lambda: log.stream("k").append_batch(values, keys=keys))
        if ok:
            model.acknowledge(offsets, keys, values)
    elif kind < 0.70:
        ok, records = _call(lambda: [(r.offset, r.key, r.value) for r in log.stream("k").read()])
        if ok:
            model.observe(records)
    elif kind < 0.90:
        _call(lambda: log.compact("k", force=True))


@contextmanager
def faults_off(faults: Faults) -> Iterator[None]:
    was, faults.on = faults.on, False
    try:
        yield
    finally:
        faults.on = was


def _through_writer(log: Any, name: str, values: list[bytes], model: Model) -> None:
    """Appends through a writer; every future that resolves is acknowledged."""
    writer = log.writer(linger_ms=60_000)
    futures = [writer.append(name, v) for v in values]
    try:
        writer.close()
    finally:
        acknowledged = [(f.result(), v) for f, v in zip(futures, values) if f.exception() is None]
        for offset, v in acknowledged:
            model.acknowledge([offset], [v])
        for f in futures:
            if f.exception() is not None and not isinstance(f.exception(), DisklessLogError):
                raise Violation(f"a writer future failed with {f.exception()!r}")


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
@pytest.mark.parametrize("seed", range(2))
def test_public_calls_under_failing_os_calls(
    tmp_path: Path, faults: Faults, seed: int, fsync: str
) -> None:
    _campaign(tmp_path / "log", faults, seed, steps=150, fsync=fsync)


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
@pytest.mark.parametrize("seed", range(2, 17))
def test_public_calls_under_failing_os_calls_many_seeds(
    tmp_path: Path, faults: Faults, seed: int, fsync: str
) -> None:
    _campaign(tmp_path / "log", faults, seed, steps=400, fsync=fsync)


def test_a_full_disk_is_a_storage_error_and_changes_nothing(tmp_path: Path, faults: Faults) -> None:
    """Every failure of a write an append makes is a StorageError (an OSError with the
    errno), and nothing of the append is visible afterwards."""
    with disklesslog.open(tmp_path / "log", fsync="always") as log:
        stream = log.stream("s")
        stream.append(b"before")
        faults.rate = 1.0
        with faults.active(), pytest.raises(StorageError) as caught:
            stream.append(b"lost")
        assert caught.value.errno in CODES
        assert isinstance(caught.value.__cause__, OSError)
        assert [r.value for r in stream.read()] == [b"before"]
        assert stream.append(b"after") == 1
