"""Before/after: the same small workloads timed on two checkouts of disklesslog, alternately.

``./dev bench`` measures one checkout against baselines in the same process. A change
that adds work on a hot path (a checksum, a check) also needs the old code beside the
new on the same machine at the same time; this does that:

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python benchmarks/compare.py /tmp/before . --rounds 5 --json out.json

Each round runs every workload once on each checkout, each run a fresh process with
that checkout first on ``sys.path`` (so the machine's drift shows up in both columns
alike), and the table gives medians over the rounds and the ratio new/old. The
workloads are small versions of the groups in ``run.py`` that a change to integrity
checks touches: single-record and 1,000-record appends and a sequential read of a
local log, a cached read of an object log, writes to an object log (one PUT and one
commit per flush), tiering a local log and reading it back from the tier (cold, then
through the block cache), and ``Sequencer.commit`` of 10 batches on the SQLite,
object-store (``file://``) and memory sequencers, plus the object-store sequencer's
replay on open; ``busyopen``, opening the object-store sequencer of a busy log (a
checkpoint holding 150,000 objects, then 2,000 entries to replay); ``deletes``,
``ObjectStore.delete`` of 500 objects on storage taking 20 ms a DELETE; and ``many``,
run.py's many-streams group once (appends round-robin over 500 and over 10,000 streams
of one log, which parks and reopens them), minutes a round, so name it with
``--only many``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKLOADS = (
    "single",
    "batch",
    "objread",
    "objwrite",
    "tiered",
    "sqlite",
    "objectstore",
    "memory",
    "busyopen",
    "deletes",
    "many",
)
COMMITS = 2_000


# ------------------------------------------------------------- in the worker process


def _batches(producer: tuple[int, int], commits: int) -> list[tuple[str, list[object]]]:
    from disklesslog.sequencers import BatchToCommit

    producer_id, epoch = producer
    now = int(time.time() * 1000)
    return [
        (
            f"objects/o-{i:09d}",
            [
                BatchToCommit(
                    stream=f"s{j}",
                    position=j * 1100,
                    size=1100,
                    span=10,
                    record_count=10,
                    max_timestamp=now + i,
                    producer_id=producer_id,
                    producer_epoch=epoch,
                    base_sequence=i * 10,
                )
                for j in range(10)
            ],
        )
        for i in range(commits)
    ]


def _commits_per_second(sequencer: object) -> float:
    create = sequencer.create_stream  # type: ignore[attr-defined]
    for j in range(10):
        create(f"s{j}", {})
    work = _batches(sequencer.init_producer("compare"), COMMITS)  # type: ignore[attr-defined]
    commit = sequencer.commit  # type: ignore[attr-defined]
    start = time.perf_counter()
    for key, batches in work:
        commit(key, batches)
    return COMMITS / (time.perf_counter() - start)


def _run(workload: str, directory: str) -> dict[str, float]:
    """One workload in this process: its figures (all rates: higher is better)."""
    import disklesslog
    from disklesslog.sequencers import open_sequencer

    value = b"x" * 100
    if workload == "single":
        with disklesslog.open(f"{directory}/log") as log:
            stream = log.stream("s")
            start = time.perf_counter()
            for _ in range(50_000):
                stream.append(value)
            return {"single appends/s": 50_000 / (time.perf_counter() - start)}
    if workload == "batch":
        with disklesslog.open(f"{directory}/log") as log:
            stream = log.stream("s")
            values = [value] * 1000
            start = time.perf_counter()
            for _ in range(300):
                stream.append_batch(values)
            appended = 300_000 / (time.perf_counter() - start)
            start = time.perf_counter()
            count = sum(1 for _ in stream.read())
            return {
                "batched appends, records/s": appended,
                "local read, records/s": count / (time.perf_counter() - start),
            }
    if workload == "objread":
        url = f"file://{directory}/objects"
        with disklesslog.open(url, backend="objects", sequencer=f"memory://{directory}") as log:
            stream = log.stream("s")
            for _ in range(100):
                stream.append_batch([value] * 1000)
            best = 0.0
            for _ in range(3):
                start = time.perf_counter()
                count = sum(1 for _ in stream.read())
                best = max(best, count / (time.perf_counter() - start))
            return {"object read (cached), records/s": best}
    if workload == "objwrite":
        url = f"file://{directory}/objects"
        with disklesslog.open(url, backend="objects", sequencer=f"memory://{directory}") as log:
            stream = log.stream("s")
            start = time.perf_counter()
            for _ in range(300):
                stream.append_batch([value] * 100)
            return {"object writes (PUT + commit), flushes/s": 300 / (time.perf_counter() - start)}
    if workload == "tiered":
        return _tiered(directory, value)
    if workload == "sqlite":
        sequencer = open_sequencer(f"sqlite:///{directory}/meta.db")
        try:
            return {"SQLite commits/s": _commits_per_second(sequencer)}
        finally:
            sequencer.close()
    if workload == "objectstore":
        import fsspec

        from disklesslog.sequencers.objectstore import ObjectStoreSequencer

        def fresh() -> ObjectStoreSequencer:
            fs = fsspec.filesystem("file", auto_mkdir=True)
            return ObjectStoreSequencer(fs, f"{directory}/sequencer")

        sequencer = fresh()
        rate = _commits_per_second(sequencer)
        start = time.perf_counter()
        replica = fresh()
        opened = time.perf_counter() - start
        replica.close()
        sequencer.close()
        return {"object-store commits/s": rate, "object-store opens/s": 1 / opened}
    if workload == "busyopen":
        return _busy_open(directory)
    if workload == "deletes":
        return _deletes()
    if workload == "memory":
        return {"memory sequencer commits/s": _commits_per_second(open_sequencer("memory://c"))}
    if workload == "many":
        return _many(Path(directory))
    raise SystemExit(f"unknown workload {workload!r}")


def _busy_open(directory: str) -> dict[str, float]:
    """Open the object-store sequencer of a busy log: its newest checkpoint holds
    150,000 objects (dead ones waiting for garbage collection, as at 1,000 one-object
    flushes a second), and 2,000 entries of one commit each follow it, which the open
    replays. Then one read of a stream's batches, as a reader's first call."""
    import fsspec

    from disklesslog.sequencers import BatchToCommit
    from disklesslog.sequencers.objectstore import ObjectStoreSequencer

    def fresh() -> ObjectStoreSequencer:
        fs = fsspec.filesystem("file", auto_mkdir=True)
        return ObjectStoreSequencer(fs, f"{directory}/sequencer")

    writer = fresh()
    names = [f"s-{i:03d}" for i in range(100)]
    for name in names:
        writer.create_stream(name, {})
    now = int(time.time() * 1000)
    serial = 0
    for _ in range(300):  # 150,000 objects of one batch each, 500 to an entry
        group = []
        for _ in range(500):
            serial += 1
            batch = BatchToCommit(names[serial % 100], 0, 100, 1, 1, now)
            group.append((f"objects/{serial:020d}-busy", [batch]))
        writer.commit_many(group)
    for name in names:  # every object dead, kept for garbage collection's grace
        writer.trim(name, writer.stream_info(name).end_offset)
    writer.write_checkpoint()
    for _ in range(2_000):
        serial += 1
        batch = BatchToCommit(names[serial % 100], 0, 100, 1, 1, now)
        writer.commit(f"objects/{serial:020d}-busy", [batch])
    writer.close()
    start = time.perf_counter()
    reader = fresh()
    reader.find_batches(names[42], reader.stream_info(names[42]).start_offset, 1 << 20)
    opened = time.perf_counter() - start
    reader.close()
    return {"busy object-store opens/s": 1 / opened}


def _deletes() -> dict[str, float]:
    """Delete 500 objects through ``ObjectStore.delete`` (what garbage collection and
    the object-store sequencer's clean-up call) on storage that takes 20 ms a DELETE,
    as a bucket does: an in-memory filesystem that sleeps in every ``rm_file``."""
    from disklesslog.metrics import Metrics
    from disklesslog.storage.store import ObjectStore
    from disklesslog.testing import FaultyMemoryFileSystem

    class Bucket(FaultyMemoryFileSystem):
        def rm_file(self, path: str) -> None:
            time.sleep(0.02)
            super().rm_file(path)

    fs = Bucket()
    store = ObjectStore(fs, f"/deletes-{os.getpid()}", Metrics())
    keys = [f"objects/{i:06d}" for i in range(500)]
    for key in keys:
        fs.pipe_file(store.path(key), b"x")
    start = time.perf_counter()
    store.delete(keys)
    elapsed = time.perf_counter() - start
    return {"deletes/s at 20 ms a request": len(keys) / elapsed}


def _tiered(directory: str, value: bytes) -> dict[str, float]:
    """Tier 20 closed segments of 1 MiB to ``file://`` object storage, drop the local
    copies, and read the stream back through the tier: cold (every block a ranged GET
    into the block cache) and again (from the cache)."""
    import disklesslog

    options = {"segment_bytes": 1 << 20, "local_retention_bytes": 1}
    tier_url = f"file://{directory}/tier"
    with disklesslog.open(f"{directory}/log", tier_url=tier_url, **options) as log:
        stream = log.stream("s")
        for _ in range(200):
            stream.append_batch([value] * 1000)
        start = time.perf_counter()
        log.tier()
        tiered = time.perf_counter() - start
        rates = []
        for _ in range(2):
            start = time.perf_counter()
            count = sum(1 for _ in stream.read())
            rates.append(count / (time.perf_counter() - start))
    return {
        "tiering, MB/s": 200 * 1000 * len(value) / tiered / 1e6,
        "tiered read (cold), records/s": rates[0],
        "tiered read (cached), records/s": rates[1],
    }


def _many(work: Path) -> dict[str, float]:
    """``run.py``'s many-streams group, once: single appends round-robin over 500
    streams (all open) and over 10,000 (each append reopens a parked one), with
    ``max_open_streams=1000``, under fsync "never" and "interval", and the ratios."""
    import workloads as wl  # run.py's workloads (this file's directory is on sys.path)

    records = 50_000
    figures = {}
    with wl.many_streams_log(work, streams=10_000) as path:
        for fsync in ("never", "interval"):
            rates = []
            for count in (500, 10_000):
                run = wl.dl_round_robin(
                    work, path, streams=count, records=records, max_open=1_000, fsync=fsync
                )
                with run as append:
                    start = time.perf_counter()
                    append()
                    rates.append(records / (time.perf_counter() - start))
            figures[f"500 streams, fsync={fsync}, appends/s"] = rates[0]
            figures[f"10,000 streams, fsync={fsync}, appends/s"] = rates[1]
            figures[f"10,000 / 500 streams, fsync={fsync} (x100)"] = 100 * rates[1] / rates[0]
    return figures


# --------------------------------------------------------------------- the driver


def _in_checkout(tree: Path, workload: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run(
            [sys.executable, __file__, "--worker", workload, directory],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    figures: dict[str, float] = json.loads(out)
    return figures


def compare(
    old: Path, new: Path, rounds: int, workloads: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """Every figure of ``workloads``: its median on each side and their ratio."""
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for round_no in range(1, rounds + 1):
        for workload in workloads:
            for side, tree in (("old", old), ("new", new)):
                for name, value in _in_checkout(tree, workload).items():
                    samples[side].setdefault(name, []).append(value)
        print(f"round {round_no} of {rounds} done", file=sys.stderr, flush=True)
    rows = {}
    for name, olds in samples["old"].items():
        news = samples["new"][name]
        rows[name] = {
            "old": statistics.median(olds),
            "new": statistics.median(news),
            "ratio": statistics.median(news) / statistics.median(olds),
            "old samples": olds,
            "new samples": news,
        }
    return rows


def _figure(value: float) -> str:
    """Thousands separated, or three significant digits for small rates (opens/s)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        print(json.dumps(_run(sys.argv[2], sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the checkout before the change")
    parser.add_argument("new", type=Path, help="the checkout after it")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", action="append", choices=WORKLOADS)
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args()
    workloads = tuple(args.only or (name for name in WORKLOADS if name != "many"))
    rows = compare(args.old.resolve(), args.new.resolve(), args.rounds, workloads)
    print("| measure | old (median) | new (median) | new / old |")
    print("|---|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {_figure(row['old'])} | {_figure(row['new'])} | {row['ratio']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
