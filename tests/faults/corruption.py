"""Corruption fuzzing: damaged copies of every kind of file and object the project writes.

A *subject* is a small, realistic log built once (:func:`build_local`,
:func:`build_objects`): several streams, closed and active segments or many objects,
compaction and merging done, consumer-group offsets, a committed two-phase commit and
one frozen before its commit point, a tier, a sequencer with checkpoints, a disk cache.
Its directory is kept as the *pristine* copy. Each damaged copy is the pristine copy
with one file changed (bits flipped, a range zeroed, truncated, garbage appended;
deterministic seeds), laid at the same path so every absolute location recorded inside
stays right. A fixed set of observations (:func:`observations`) runs on a fresh handle
of the copy and is compared with what it gives on the pristine copy (the model):
each must equal the model or raise a ``DisklessLogError`` (:mod:`tests.faults.rule`).

:data:`CATALOGUE` names the kind of every file, and :data:`REQUIRED` the kinds the
issue lists: a file no entry matches fails the test until it is catalogued, so a new
kind of file cannot escape the fuzzing.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import zlib
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import disklesslog
from disklesslog import AbstractLog
from disklesslog.maintenance.auto import encode_status
from disklesslog.sequencers.objectstore import ObjectStoreSequencer
from disklesslog.storage.cache import BlockCache, default_cache

from .rule import (
    BAD,
    INTACT,
    REPAIRED,
    TYPED,
    VIOLATION,
    Ledger,
    exception_outcome,
    short,
    watching_logs,
)

# ------------------------------------------------------------------ catalogue

CATALOGUE: list[tuple[str, str]] = [
    # local segments log (docs/format.md section 2)
    (r"^local/disklesslog\.json$", "log-marker"),
    (r"^local/streams/[^/]+/stream\.json$", "stream-config"),
    (r"^local/streams/[^/]+/stream\.state$", "stream-state"),
    (r"^local/streams/[^/]+/stream\.state\.copy$", "stream-state-copy"),
    (r"^local/streams/[^/]+/\d{20}\.lost$", "lost-marker"),
    (r"^local/streams/[^/]+/\d{20}\.log$", "segment"),  # closed or active: see kind_of
    (r"^local/streams/[^/]+/\d{20}\.index$", "offset-index"),
    (r"^local/streams/[^/]+/\d{20}\.timeindex$", "time-index"),
    (r"^local/streams/[^/]+/cleaner\.checkpoint$", "cleaner-checkpoint"),
    (r"^local/streams/[^/]+/cleaner\.lock$", "lock-file"),
    (r"^local/streams/[^/]+/tier\.manifest$", "tier-manifest"),
    (r"^local/groups/[^/]+\.json$", "group-offsets"),
    (r"^local/groups/\.lock$", "lock-file"),
    (r"^local/groups/[^/]+\.lock$", "lock-file"),
    (r"^local/leases/[^/]+\.json$", "lease"),
    (r"^local/leases/\.lock$", "lock-file"),
    (r"^local/leases/[^/]+\.lock$", "lock-file"),
    (r"^local/leases\.json$", "lease-index"),
    (r"^local/transactions/\.lock$", "lock-file"),
    (r"^local/transactions/[0-9a-f]{64}\.json$", "transaction-record"),
    (r"^local/transactions/pending/[0-9a-f]{64}\.parts$", "transaction-parts"),
    (r"^local/transactions/pending/[0-9a-f]{64}\.json$", "transaction-notes"),
    (r"^local/staged/[^/]+\.staged$", "staged-file"),
    (r"^local/tier\.json$", "tier-config"),
    (r"^local/maintenance\.json$", "maintenance-status"),
    # the local log's tier (objects on file://)
    (r"^tier/[^/]+$", "tier-owner-marker"),
    (r"^tier/streams/.+\.log$", "tier-segment"),
    (r"^tier/streams/.+\.index$", "tier-offset-index"),
    (r"^tier/streams/.+\.timeindex$", "tier-time-index"),
    # object logs (docs/format.md section 3)
    (r"^objects-[a-z]+/disklesslog\.json$", "log-marker"),
    (r"^objects-[a-z]+/maintenance\.json$", "maintenance-status"),
    (r"^objects-[a-z]+/objects/\d{20}-[0-9a-f]{16}$", "object-wal"),
    (r"^objects-[a-z]+/objects/\d{20}-[0-9a-f]{16}\.merged$", "object-merged"),
    (r"^objects-[a-z]+/objects/\d{20}-[0-9a-f]{16}\.compacted$", "object-compacted"),
    (r"^objects-[a-z]+/objects/\d{20}-[0-9a-f]{16}\.staged$", "object-staged"),
    (r"^objects-[a-z]+/disklesslog-meta\.db$", "sqlite-database"),
    (r"^objects-[a-z]+/disklesslog-meta\.db-wal$", "sqlite-wal"),
    (r"^objects-[a-z]+/disklesslog-meta\.db-shm$", "sqlite-shm"),
    (r"^objects-[a-z]+/disklesslog-meta\.db-lock$", "lock-file"),  # flock only, never read
    (r"^objects-[a-z]+/_sequencer/log/\d{20}$", "sequencer-entry"),
    (r"^objects-[a-z]+/_sequencer/checkpoints/\d{20}-\d{13}$", "sequencer-checkpoint"),
    (r"^cache/.+$", "cache-block"),
]
"""``(regular expression on the path under the subjects' root, kind)``; first match wins."""

REQUIRED = {
    "segment-closed",
    "segment-active",
    "offset-index",
    "time-index",
    "stream-state",
    "tier-manifest",
    "transaction-notes",
    "cleaner-checkpoint",
    "object-wal",
    "object-merged",
    "object-compacted",
    "sequencer-entry",
    "sequencer-checkpoint",
    "sqlite-database",
    "cache-block",
    "group-offsets",
    "lease",
    "lease-index",
    "maintenance-status",
    "transaction-record",
    "stream-config",
    "tier-segment",
    "postgres-row",
}
"""The kinds issue 14 lists (segments, offset and time indexes, state records,
manifests, notes/progress files, data objects, sequencer entries, checkpoints, SQLite
and PostgreSQL rows, cache files) and the other metadata files every local log has.
PostgreSQL rows are not files: :mod:`tests.faults.rows` damages them by SQL, and
catalogues the tables of their schema itself."""

_COMPILED = [(re.compile(pattern), kind) for pattern, kind in CATALOGUE]


def kind_of(relative: str) -> str | None:
    for pattern, kind in _COMPILED:
        if pattern.search(relative):
            if kind == "segment":
                return "segment-active" if _is_active(relative) else "segment-closed"
            return kind
    return None


_ACTIVE: set[str] = set()
"""Paths of active segments, filled when a subject is built."""


def _is_active(relative: str) -> bool:
    return relative in _ACTIVE


# -------------------------------------------------------------- subjects


STREAMS = ("a", "b", "c")
GROUP = "g"
LEASE = "maintenance"
T0 = 1_700_000_000_000
"""Records are stamped ``T0 + 10 * n``: offset_for_time has known answers."""


@dataclass
class Subject:
    """One built log: its directory under the root, how to open it, what to damage."""

    name: str
    root: Path  # the working root: every subject's files live under it
    parts: tuple[str, ...]  # its top-level directories under the root (restored per copy)
    opener: Callable[[Path], AbstractLog]
    damaged: tuple[str, ...] = ()  # the directories whose files are damaged (default: parts)
    streams: tuple[str, ...] = STREAMS
    groups: tuple[str, ...] = (GROUP,)
    models: list[dict[str, Any]] = field(default_factory=list)
    alternatives: list[Callable[[Path], None]] = field(default_factory=list)
    """Changes to a pristine copy whose answers are right too: the model of the local
    log's frozen two-phase commit held back (its staged file gone: it cannot be rolled
    forward, and since it was never acknowledged, holding it back loses nothing)."""

    def open(self) -> AbstractLog:
        return self.opener(self.root)


def _take_lease(log: AbstractLog) -> None:
    """Lease LEASE at token 2, held for an hour (longer than any run): taken, released,
    taken by another holder."""
    first = log.acquire_lease(LEASE, "builder-1", 3_600_000)
    assert first is not None
    log.release_lease(first)
    assert log.acquire_lease(LEASE, "builder-2", 3_600_000) is not None
    # The status a maintaining process stores after a pass (maintenance.json).
    log.write_maintenance_status(encode_status(log.maintenance_status()))


def _fill(log: AbstractLog, rounds: int, per_round: int, *, serial: list[int]) -> None:
    for _ in range(rounds):
        for name in STREAMS:
            values = []
            keys = []
            for _ in range(per_round):
                serial[0] += 1
                values.append(b"v%06d-" % serial[0] + b"x" * 40)
                keys.append(b"k%d" % (serial[0] % 7) if name == "c" else b"u%06d" % serial[0])
            log.stream(name).append_batch(
                values,
                keys=keys,
                timestamps=[T0 + 10 * (serial[0] + i) for i in range(len(values))],
            )


def build_local(root: Path) -> Subject:
    """A local log: closed and active segments, a trimmed stream, a compacted one, a
    tier on ``file://`` (some segments only there), group offsets, a committed
    two-phase commit and one frozen after its notes were written."""
    from disklesslog.segments import transactions

    path = root / "local"
    tier = f"file://{root}/tier"

    def opener(root_: Path) -> AbstractLog:
        # "never": the copies are not power-failed, and the recovery point the build
        # recorded (fsync="always": every record acknowledged as durable) stays
        return disklesslog.open(root_ / "local", fsync="never")

    log = disklesslog.open(path, fsync="always", tier_url=tier)
    for name in STREAMS:
        config: dict[str, Any] = {"segment_bytes": 1024, "index_interval_bytes": 128}
        if name == "c":
            config.update(cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
        if name == "b":
            config.update(local_retention_bytes=512)  # segment 0 lives only in the tier
        log.create_stream(name, **config)
    serial = [0]
    _fill(log, 6, 4, serial=serial)
    log.stream("a").trim(5)
    log.compact(force=True)
    log.tier("b")
    log.commit_offsets(GROUP, {"a": 9, "b": 3, "c": 0})
    _take_lease(log)
    stager = log.stager()
    stager.append_batch("a", [b"txn-1", b"txn-2"], timestamps=T0 + 5)
    stager.append_batch("b", [b"txn-3"], timestamps=T0 + 6)
    log.commit_transaction("txn-done", [stager.finish()])
    _fill(log, 1, 3, serial=serial)
    frozen = log.stager()
    frozen.append_batch("a", [b"frozen-1"], timestamps=T0 + 7)
    frozen.append_batch("c", [b"frozen-2"], keys=[b"k1"], timestamps=T0 + 8)
    part = frozen.finish()
    with (
        mock.patch.object(transactions, "_apply", side_effect=RuntimeError("frozen")),
        suppress(RuntimeError),
    ):
        log.commit_transaction("txn-frozen", [part])
    log.close()
    for name in STREAMS:
        logs = sorted((path / "streams" / name).glob("*.log"))
        _ACTIVE.add(str(logs[-1].relative_to(root)))

    def held(root_: Path) -> None:
        for staged in (root_ / "local" / "staged").glob("*.staged"):
            staged.unlink()

    return Subject("local", root, ("local", "tier"), opener, alternatives=[held])


def build_objects(
    root: Path, sequencer: str, url: str | None = None, *, more_rounds: int = 0
) -> Subject:
    """An object log on ``file://``: WAL, merged, compacted and staged objects, with the
    SQLite or the object-store sequencer (entries and checkpoints), or the PostgreSQL
    sequencer at ``url`` (``sequencer="postgres"``: its rows live on the server).
    ``more_rounds``: commits per stream added at the end (the SQL sequencers write a
    time-index entry every 16 batches of a stream)."""
    name = f"objects-{sequencer}"
    path = root / name
    options: dict[str, Any] = {"backend": "objects", "cache": None}
    if sequencer == "postgres":
        assert url is not None, "the PostgreSQL sequencer needs its URL"
        options["sequencer"] = url
    owned: ObjectStoreSequencer | None = None
    if sequencer == "objectstore":
        import fsspec

        fs = fsspec.filesystem("file", auto_mkdir=True)
        owned = ObjectStoreSequencer(fs, f"{path}/_sequencer", checkpoint_every=6)
        options["sequencer"] = owned
    log = disklesslog.open(f"file://{path}", **options)
    for stream in STREAMS:
        config: dict[str, Any] = {"segment_bytes": 1024}
        if stream == "c":
            config.update(cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
        log.create_stream(stream, **config)
    serial = [0]
    _fill(log, 5, 4, serial=serial)
    later = T0 * 0 + 4_000_000_000_000
    log.merge(now_ms=later)
    _fill(log, 3, 4, serial=serial)
    log.compact(force=True)
    log.stream("a").trim(4)
    log.commit_offsets(GROUP, {"a": 9, "b": 3, "c": 0})
    _take_lease(log)
    stager = log.stager()
    stager.append_batch("a", [b"txn-1", b"txn-2"], timestamps=T0 + 5)
    stager.append_batch("b", [b"txn-3"], timestamps=T0 + 6)
    log.commit_transaction("txn-done", [stager.finish()])
    _fill(log, 2 + more_rounds, 3, serial=serial)
    log.close()
    if owned is not None:
        owned.close()

    def opener(root_: Path) -> AbstractLog:
        extra: dict[str, Any] = {"backend": "objects", "cache": None}
        if sequencer == "objectstore":
            extra["sequencer"] = "objectstore://"
        elif sequencer == "postgres":
            extra["sequencer"] = url
        return disklesslog.open(f"file://{root_ / name}", **extra)

    return Subject(name, root, (name,), opener)


def build_cache(root: Path) -> Subject:
    """The disk tier of the block cache (``cache_dir``): blocks of an object log's
    objects, each file with its CRC. A fresh cache object per copy reads the files."""
    path = root / "objects-cached"
    log = disklesslog.open(f"file://{path}", backend="objects", cache=None)
    for stream in STREAMS:
        log.create_stream(stream)
    _fill(log, 3, 4, serial=[0])
    log.close()

    def opener(root_: Path) -> AbstractLog:
        cache = BlockCache(cache_dir=root_ / "cache", block_size=4096)
        return disklesslog.open(
            f"file://{root_ / 'objects-cached'}", backend="objects", cache=cache
        )

    subject = Subject(
        "objects-cached", root, ("objects-cached", "cache"), opener, groups=(), damaged=("cache",)
    )
    warm = subject.open()  # fills the cache directory
    for stream in STREAMS:
        list(warm.stream(stream).read())
    warm.close()
    return subject


# ------------------------------------------------------------ observations


def observations(subject: Subject, log: AbstractLog) -> Iterator[tuple[str, Callable[[], Any]]]:
    """The fixed questions asked of every copy, in order."""
    yield "streams", lambda: sorted(log.streams())
    for name in subject.streams:
        stream = log.stream(name)
        yield f"read:{name}", lambda s=stream: [tuple(r) for r in s.read()]
        yield (
            f"read_offsets:{name}",
            lambda s=stream: [o for batch in s.read_offsets() for o in batch],
        )
        yield f"extent:{name}", lambda s=stream: (s.start_offset, s.end_offset)
        yield f"info:{name}", lambda s=stream: _info(s)
        yield (
            f"offset_for_time:{name}",
            lambda s=stream: [s.offset_for_time(T0 + d) for d in (0, 150, 400, 10**9)],
        )
    for group in subject.groups:
        yield f"committed:{group}", lambda g=group: log.committed_offsets(g)
    yield "lease", lambda: _holder(log)
    yield "lease:untaken", lambda: log.lease_holder("untaken")  # checks the lease index
    yield "maintenance", log.last_maintenance
    for name in subject.streams:
        stream = log.stream(name)

        def append_and_read(s: Any = stream) -> tuple[int, list[Any]]:
            offset = s.append(b"fresh", key=b"fresh", timestamp=T0 + 10**8)
            return offset, [(r.offset, r.value) for r in s.read(offset)]

        yield f"append:{name}", append_and_read


def _holder(log: AbstractLog) -> tuple[str, int] | None:
    """Who holds LEASE (its expiry is this process's clock: not compared)."""
    lease = log.lease_holder(LEASE)
    return None if lease is None else (lease.holder, lease.token)


def _info(stream: Any) -> tuple[int, int, Any]:
    info = stream.info()
    return info.start_offset, info.end_offset, info.config


def run_observations(subject: Subject, ledger: Ledger | None, kind: str) -> dict[str, Any]:
    """Open the subject's working copy and ask every question. With a ledger, classify
    the answers against the closest of ``subject.models`` (all answers judged against
    one model: a copy may not mix them); without, return the answers (a model)."""
    default_cache().clear()  # tier reads go through it: nothing left from another copy
    answers: dict[str, Any] = {}
    failures: dict[str, BaseException] = {}
    with watching_logs() as warned:
        try:
            log = subject.open()
        except BaseException as exc:
            if ledger is None:
                raise
            ledger.exception(kind, exc, "open")
            return answers
        try:
            for name, call in observations(subject, log):
                try:
                    answers[name] = call()
                except BaseException as exc:
                    if ledger is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        raise
                    failures[name] = exc
        finally:
            try:
                log.close()
            except BaseException as exc:
                if ledger is None:
                    raise
                failures["close"] = exc
    if ledger is None:
        return answers
    model = max(subject.models, key=lambda m: sum(answers.get(k, _NONE) == v for k, v in m.items()))
    for name, exc in failures.items():
        ledger.exception(kind, exc, name)
    for name, got in answers.items():
        if got == model[name]:
            ledger.add(kind, REPAIRED if warned.messages else INTACT)
        else:
            ledger.add(kind, VIOLATION, f"{name}: got {short(got)}, expected {short(model[name])}")
    return answers


_NONE = object()


# ----------------------------------------------------------------- damage

DAMAGES = ("bitflip", "zero", "truncate", "garbage")


def damage(data: bytes, how: str, rng: random.Random) -> bytes:
    if how == "garbage" or not data:
        return data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    if how == "bitflip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if how == "zero":
        start = rng.randrange(len(data))
        length = rng.randint(1, max(1, min(64, len(data) - start)))
        changed = data[:start] + bytes(length) + data[start + length :]
        if changed == data:  # the range was zeros already: flip a bit instead
            return damage(data, "bitflip", rng)
        return changed
    return data[: rng.randrange(len(data))]


def files_of(subject: Subject, pristine: Path) -> list[str]:
    """The files to damage, relative to the root."""
    found = []
    for part in subject.damaged or subject.parts:
        for dirpath, _, names in os.walk(pristine / part):
            found.extend(str((Path(dirpath) / n).relative_to(pristine)) for n in names)
    return sorted(found)


class Pristine:
    """The undamaged files of a subject, in memory; :meth:`restore` puts the working
    copy back by content (rewriting what differs, deleting what is new), which costs a
    read of a few dozen small files instead of a copy of the tree."""

    def __init__(self, subject: Subject, pristine: Path) -> None:
        self.subject = subject
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = set()
        for part in subject.parts:
            self.dirs.add(part)
            for dirpath, dirnames, names in os.walk(pristine / part):
                base = Path(dirpath).relative_to(pristine)
                self.dirs.update(str(base / d) for d in dirnames)
                for name in names:
                    self.files[str(base / name)] = (Path(dirpath) / name).read_bytes()

    def restore(self) -> None:
        root = self.subject.root
        for part in self.subject.parts:
            for dirpath, dirnames, names in os.walk(root / part):
                base = Path(dirpath).relative_to(root)
                for d in list(dirnames):
                    if str(base / d) not in self.dirs:
                        shutil.rmtree(Path(dirpath) / d)
                        dirnames.remove(d)
                for name in names:
                    if str(base / name) not in self.files:
                        (Path(dirpath) / name).unlink()
        for directory in sorted(self.dirs):
            (root / directory).mkdir(exist_ok=True)
        for relative, data in self.files.items():
            path = root / relative
            try:
                same = path.read_bytes() == data
            except FileNotFoundError:
                same = False
            if not same:
                path.write_bytes(data)


def fuzz(
    subject: Subject,
    pristine: Path,
    ledger: Ledger,
    *,
    copies_per_file: int,
    seed: int = 0,
    kinds: dict[str, int] | None = None,
) -> int:
    """Damage every file of the subject ``copies_per_file`` times (the damages in turn;
    ``kinds`` overrides the count per kind), observe, restore. Returns the copies made."""
    made = 0
    saved = Pristine(subject, pristine)
    saved.restore()
    for relative in files_of(subject, pristine):
        kind = kind_of(relative)
        assert kind is not None, f"uncatalogued file {relative}: add its kind to CATALOGUE"
        original = saved.files[relative]
        count = (kinds or {}).get(kind, copies_per_file)
        for i in range(count):
            how = DAMAGES[i % len(DAMAGES)]
            rng = random.Random(zlib.crc32(f"{seed}:{relative}:{i}".encode()))
            damaged = damage(original, how, rng)
            (subject.root / relative).write_bytes(damaged)
            per_copy = Ledger(ledger.campaign)
            if relative.endswith("-shm"):
                _observe_in_child(subject, per_copy, kind)
            else:
                run_observations(subject, per_copy, kind)
            outcome = worst(per_copy)
            ledger.add(
                f"{kind}",
                outcome,
                f"{relative} {how} #{i}: " + "; ".join(per_copy.violations()[:3]),
            )
            ledger.figures[f"copies.{kind}"] += 1
            ledger.figures[f"observations.{outcome}"] += per_copy.total()
            made += 1
            saved.restore()
    ledger.figures["copies"] += made
    return made


def _observe_in_child(subject: Subject, per_copy: Ledger, kind: str) -> None:
    """Observe in a forked child: SQLite maps its ``-shm`` file into memory, and a
    damaged one can kill the process with SIGBUS (a violation, reported as such)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: observe, send the counts, leave without cleanup
        code = 0
        try:
            child = Ledger(per_copy.campaign)
            run_observations(subject, child, kind)
            payload = repr(
                ([[*k, n] for k, n in child.counts.items()], list(child.examples.items()))
            ).encode()
            os.write(writer, payload)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(writer)
    chunks = []
    while chunk := os.read(reader, 1 << 16):
        chunks.append(chunk)
    os.close(reader)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) or not chunks:
        per_copy.add(kind, VIOLATION, f"opening the copy killed the process (wait status {status})")
        return
    import ast

    counts, examples = ast.literal_eval(b"".join(chunks).decode())
    for observed, outcome, count in counts:
        per_copy.counts[(observed, outcome)] += count
    for key, found in examples:
        per_copy.examples[tuple(key)] = found


def worst(per_copy: Ledger) -> str:
    """A copy's outcome: the worst outcome of its observations."""
    outcomes = {o for (_, o), n in per_copy.counts.items() if n}
    for outcome in (VIOLATION, *[b for b in BAD if b != VIOLATION], TYPED, REPAIRED):
        if outcome in outcomes:
            return outcome
    return INTACT


__all__ = [
    "CATALOGUE",
    "REQUIRED",
    "Pristine",
    "Subject",
    "build_cache",
    "build_local",
    "build_objects",
    "exception_outcome",
    "fuzz",
    "kind_of",
    "run_observations",
    "worst",
]
