"""disklesslog benchmarks: local-log throughput beside raw-file limits and peer libraries,
and the object-storage backend (PUTs per flush, acknowledgement latency, sequencer
commits, cached reads) on memory:// and a local moto S3 server.

Run with ``./dev bench`` (installs the ``bench`` extra, persist-queue, then runs this):

    ./dev bench                      all workloads, 5 repetitions + 1 warm-up (about 5 minutes)
    ./dev bench --quick              small counts, 2 repetitions: a smoke run (about 35 s)
    ./dev bench --only read          one workload (repeat --only for several); --list names them
    ./dev bench --out results.json   also write every measurement as JSON
    ./dev bench --markdown           also print the tables as Markdown (docs/benchmarks.md)
    ./dev bench --wait-quiet 20      on a shared machine: wait for other processes to go idle
    ./dev bench --profile single     cProfile one run of each disklesslog variant of a workload
    ./dev bench --only objects       object storage and sequencers (objects.py, sequencers.py)
    ./dev bench --only spark-read    Spark reading a log into a DataFrame beside Parquet (spark.py)

Every workload runs in a temporary directory (``--dir`` chooses where; the default is
the system temp dir), removed at the end. Each repetition runs all variants of a
workload back to back in a rotating order; tables show the median and the best of the
repetitions, and ratios are medians of per-repetition ratios. ``MB/s`` counts record
values only (decimal MB), so it compares across libraries with different overheads.
See docs/benchmarks.md for what each workload measures and the results on one machine.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import maintenance as maint
import measured
import objects as obj
import peers
import pipeline as pipe
import sequencers as seq
import spark as spk
import spark_write as sw
import workloads as wl
from common import (
    Goal,
    Group,
    GroupResult,
    Scratch,
    Variant,
    console_table,
    machine_info,
    prime_page_cache,
    run_group,
)
from common import markdown_table as md_table

KIB = 1024


@dataclass(frozen=True)
class Plan:
    """Counts for a full run or a quick smoke run."""

    quick: bool

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full


# --------------------------------------------------------------------------- groups


def batch_group(plan: Plan, value_size: int) -> Group:
    label = "100 B" if value_size == 100 else "1 KiB"
    key = "batch-100" if value_size == 100 else "batch-1k"
    batches = plan.n(1000, 60) if value_size == 100 else plan.n(300, 15)
    sqlite_batches = plan.n(300, 30) if value_size == 100 else plan.n(100, 10)
    records, payload = batches * wl.BATCH, batches * wl.BATCH * value_size
    never = "disklesslog append_batch, fsync=never"
    interval = "disklesslog append_batch, fsync=interval (default)"
    goals = (
        [
            Goal("100-byte append_batch >= 1,000,000 records/s (fsync=never)", never, rate=1e6),
            Goal("100-byte append_batch >= 1,000,000 records/s (fsync=interval)", interval, 1e6),
        ]
        if value_size == 100
        else [
            Goal("1 KiB append_batch >= 50% of raw f.write MB/s (fsync=never)", never, ratio=0.5),
            Goal(
                "1 KiB append_batch >= 50% of raw write+fdatasync MB/s (fsync=interval)",
                interval,
                ratio=0.5,
            ),
        ]
    )
    return Group(
        key=key,
        title=f"batched append: {label} values, {wl.BATCH:,} records per call",
        shared=partial(wl.batch_data, value_size=value_size, batches=batches),
        baseline="raw f.write",
        goals=goals,
        prime_bytes=batches * wl.entry_bytes(value_size, wl.BATCH),
        note="disklesslog and raw rows time the appends plus close(); SQLite rows the commits. "
        "Before each timed run the page cache is primed (see common.prime_page_cache).",
        variants=[
            Variant(
                "raw f.write",
                "baseline",
                partial(wl.raw_batch_write, batches=batches, sync=False),
                records,
                payload,
                tag="A",
                note="buffered file, one write per batch of the same encoded bytes",
            ),
            Variant(
                "raw f.write + fdatasync at end",
                "baseline",
                partial(wl.raw_batch_write, batches=batches, sync=True),
                records,
                payload,
                tag="B",
                note="as A, then one fdatasync: the bytes on disk",
            ),
            Variant(
                never,
                "subject",
                partial(wl.dl_append_batch, batches=batches, fsync="never"),
                records,
                payload,
                vs="raw f.write",
            ),
            Variant(
                interval,
                "subject",
                partial(wl.dl_append_batch, batches=batches, fsync="interval"),
                records,
                payload,
                vs="raw f.write + fdatasync at end",
                note="close() fsyncs whatever the 1 s background fsync has not",
            ),
            Variant(
                "SQLite executemany, 1 transaction per batch",
                "peer",
                partial(peers.sqlite_batch, batches=sqlite_batches),
                sqlite_batches * wl.BATCH,
                sqlite_batches * wl.BATCH * value_size,
                compare_to=interval,
                vs="raw f.write",
                note="WAL, synchronous=NORMAL",
            ),
        ],
    )


def single_group(plan: Plan) -> Group:
    records = plan.n(50_000, 5_000)
    sqlite_records = plan.n(20_000, 2_000)
    pq_records = plan.n(3_000, 300)
    interval = "disklesslog append, fsync=interval (default)"
    variants = [
        Variant(
            "raw os.write per record",
            "baseline",
            partial(wl.raw_single_write, records=records, sync=False),
            records,
            records * 100,
            tag="A",
            note="O_APPEND fd, the same encoded entry per record",
        ),
        Variant(
            "disklesslog append, fsync=never",
            "subject",
            partial(wl.dl_append, records=records, fsync="never"),
            records,
            records * 100,
        ),
        Variant(
            interval,
            "subject",
            partial(wl.dl_append, records=records, fsync="interval"),
            records,
            records * 100,
        ),
        Variant(
            "SQLite INSERT + commit per record",
            "peer",
            partial(peers.sqlite_single, records=sqlite_records, synchronous="NORMAL"),
            sqlite_records,
            sqlite_records * 100,
            compare_to=interval,
            note="WAL, synchronous=NORMAL",
        ),
    ]
    if peers.persistqueue is not None:
        variants.append(
            Variant(
                "persistqueue.Queue put per record",
                "peer",
                partial(peers.pq_file_put, records=pq_records),
                pq_records,
                pq_records * 100,
                compare_to=interval,
                note="file queue, defaults: rewrites its info file per put",
            )
        )
    return Group(
        key="single",
        title="single-record append: 100 B values, one call per record",
        shared=partial(wl.single_data, value_size=100, records=records),
        baseline="raw os.write per record",
        goals=[
            Goal(
                "single append >= 100,000 records/s (fsync=never)",
                "disklesslog append, fsync=never",
                rate=1e5,
            )
        ],
        variants=variants,
    )


def durable_group(plan: Plan) -> Group:
    records = plan.n(1_000, 100)
    pq_records = plan.n(500, 50)
    always = "disklesslog append, fsync=always"
    variants = [
        Variant(
            "raw os.write + fdatasync per record",
            "baseline",
            partial(wl.raw_single_write, records=records, sync=True),
            records,
            records * 100,
            tag="A",
            note="the same encoded entry per record",
        ),
        Variant(
            always,
            "subject",
            partial(wl.dl_append, records=records, fsync="always"),
            records,
            records * 100,
        ),
        Variant(
            "SQLite INSERT + commit per record, synchronous=FULL",
            "peer",
            partial(peers.sqlite_single, records=records, synchronous="FULL"),
            records,
            records * 100,
            compare_to=always,
            note="WAL, synchronous=FULL: the WAL is fsynced at each commit",
        ),
    ]
    if peers.persistqueue is not None:
        variants.append(
            Variant(
                "persistqueue.SQLiteQueue put per record",
                "peer",
                partial(peers.pq_sqlite_put, records=pq_records),
                pq_records,
                pq_records * 100,
                compare_to=always,
                note="defaults: WAL, synchronous=FULL, a commit per put",
            )
        )
    return Group(
        key="single-durable",
        title="single-record append, durable before it returns: 100 B values",
        shared=partial(wl.single_data, value_size=100, records=records),
        baseline="raw os.write + fdatasync per record",
        variants=variants,
    )


def writer_group(plan: Plan) -> Group:
    records = plan.n(100_000, 20_000)
    return Group(
        key="writer",
        title="Writer: append(stream, value) -> Future, then flush(); 100 B values",
        shared=partial(wl.single_data, value_size=100, records=0),
        baseline="Future() per record",
        note="default fsync policy (interval), default linger (5 ms) and buffer (8 MiB)",
        variants=[
            Variant(
                "Future() per record",
                "baseline",
                partial(wl.future_floor, records=records),
                records,
                tag="A",
                note="create and resolve a concurrent.futures.Future: no I/O",
            ),
            Variant(
                "disklesslog Writer, 1 stream",
                "subject",
                partial(wl.dl_writer, records=records, streams=1),
                records,
                records * 100,
            ),
            Variant(
                "disklesslog Writer, 10 streams",
                "subject",
                partial(wl.dl_writer, records=records, streams=10),
                records,
                records * 100,
                note="round-robin over the streams",
            ),
        ],
    )


@contextmanager
def read_data(directory: Path, *, batches: int, pq_records: int) -> Iterator[wl.ReadData]:
    log_path = directory / "log"
    segment_files = wl.write_read_log(log_path, 100, batches)
    pool = [wl.random_values(wl.BATCH, 100) for _ in range(wl.POOL)]
    peers.write_read_sqlite(directory / "log.db", pool, batches)
    if peers.persistqueue is not None:
        values = list(islice(cycle(pool[0]), pq_records))
        peers.write_read_queues(directory / "pq-file", directory / "pq-sqlite", values)
    yield wl.ReadData(
        log_path,
        segment_files,
        directory / "log.db",
        directory / "pq-file",
        directory / "pq-sqlite",
    )


def read_group(plan: Plan) -> Group:
    batches = plan.n(1000, 50)
    records = batches * wl.BATCH
    pq_records = plan.n(20_000, 2_000)
    passes = 10  # the raw read is so fast that one pass is too short to time well
    read = "disklesslog Stream.read() -> Record"
    per_record = wl.entry_bytes(100, wl.BATCH) / wl.BATCH
    variants = [
        Variant(
            "raw f.read, 1 MiB chunks",
            "baseline",
            partial(wl.raw_read, passes=passes),
            records * passes,
            records * passes * 100,
            tag="A",
            note=f"the stream's segment files ({per_record:.1f} bytes per record), {passes} passes",
        ),
        Variant(read, "subject", partial(wl.dl_read, method="read"), records, records * 100),
        Variant(
            "disklesslog Stream.read_batches() -> columns",
            "subject",
            partial(wl.dl_read, method="read_batches"),
            records,
            records * 100,
        ),
        Variant(
            "disklesslog Stream.read_offsets() -> offsets",
            "subject",
            partial(wl.dl_read, method="read_offsets"),
            records,
            records * 100,
            note="dense batches checksummed, not decoded (what count() needs)",
        ),
        Variant(
            "SQLite SELECT value ORDER BY id",
            "peer",
            peers.sqlite_read,
            records,
            records * 100,
            compare_to=read,
        ),
    ]
    if peers.persistqueue is not None:
        variants += [
            Variant(
                "persistqueue.Queue get per record",
                "peer",
                partial(peers.pq_file_get, records=pq_records),
                pq_records,
                pq_records * 100,
                compare_to=read,
                note="no task_done: the position is not saved",
            ),
            Variant(
                "persistqueue.SQLiteQueue get per record",
                "peer",
                partial(peers.pq_sqlite_get, records=pq_records),
                pq_records,
                pq_records * 100,
                compare_to=read,
                note="auto_commit=False: a SELECT per get, nothing deleted",
            ),
        ]
    return Group(
        key="read",
        title=f"sequential read: {records:,} records of 100 B written in {wl.BATCH:,}-record "
        "batches (page cache warm)",
        shared=partial(read_data, batches=batches, pq_records=pq_records),
        baseline="raw f.read, 1 MiB chunks",
        goals=[Goal("Stream.read() >= 2,000,000 records/s", read, rate=2e6)],
        note="every reader drains its iterator with collections.deque(iterator, maxlen=0)",
        variants=variants,
    )


def recovery_group(plan: Plan) -> Group:
    records = plan.n(100_000, 10_000)
    return Group(
        key="recovery",
        title=f"stream open (recovery): {records:,} single-record entries of 100 B",
        metric="time",
        shared=partial(wl.recovery_images, records=records, value_size=100),
        baseline="after a clean close",
        note="timed: disklesslog.open(path) + the first end_offset (opens and recovers the "
        "stream); the crash image is a copy taken while the writer still had the log open",
        variants=[
            Variant(
                "after a clean close",
                "baseline",
                partial(wl.dl_reopen, crashed=False),
                records,
                tag="A",
            ),
            Variant(
                "after a crash (no close; recovery point at 0)",
                "subject",
                partial(wl.dl_reopen, crashed=True),
                records,
                note="scans and CRC-checks every entry written since the recovery point",
            ),
        ],
    )


def many_streams_group(plan: Plan) -> Group:
    streams = plan.n(10_000, 1_000)
    hot = plan.n(500, 50)
    max_open = plan.n(1_000, 100)
    records = plan.n(50_000, 5_000)
    few = f"round-robin over {hot:,} streams (all open)"
    many = f"round-robin over {streams:,} streams (parked and reopened)"
    variants = []
    for fsync in ("never", "interval"):
        for name, count in ((few, hot), (many, streams)):
            variants.append(
                Variant(
                    f"{name}, fsync={fsync}",
                    "baseline" if count == hot else "subject",
                    partial(
                        wl.dl_round_robin,
                        streams=count,
                        records=records,
                        max_open=max_open,
                        fsync=fsync,
                    ),
                    records,
                    records * 100,
                    tag="A" if (count, fsync) == (hot, "never") else "B" if count == hot else "",
                    vs=None if count == hot else f"{few}, fsync={fsync}",
                )
            )
    return Group(
        key="many-streams",
        title=f"many streams: single appends of 100 B, max_open_streams={max_open:,}",
        shared=partial(wl.many_streams_log, streams=streams),
        baseline=f"{few}, fsync=never",
        goals=[
            Goal(
                f"appends over {streams:,} streams >= 0.5x of over {hot:,} (fsync=never)",
                f"{many}, fsync=never",
                ratio=0.5,
            )
        ],
        note="each stream is opened once before the timed run; under fsync=interval the "
        "fsync thread also syncs every stream appended to in the last second",
        variants=variants,
    )


def all_groups(plan: Plan) -> list[Group]:
    return [
        batch_group(plan, 100),
        batch_group(plan, KIB),
        single_group(plan),
        durable_group(plan),
        writer_group(plan),
        read_group(plan),
        recovery_group(plan),
        many_streams_group(plan),
        *obj.object_groups(plan),
        seq.sequencer_group(plan),
        pipe.pipeline_group(plan),
        *maint.maintenance_groups(plan),
        spk.spark_group(plan),
        *sw.spark_write_groups(plan),
    ]


# ---------------------------------------------------------------------------- main


def profile_group(group: Group, scratch: Scratch, top: int) -> None:
    """One cProfile'd run of each disklesslog variant of ``group``."""
    shared_dir = scratch.fresh(f"{group.key}-")
    try:
        with group.shared(shared_dir) if group.shared else nullcontext() as shared:
            for variant in group.variants:
                if variant.role != "subject":
                    continue
                work = scratch.fresh("profile-")
                try:
                    with variant.prepare(work, shared) as run:
                        if group.prime_bytes:
                            prime_page_cache(work, group.prime_bytes)
                        profiler = cProfile.Profile()
                        gc.collect()
                        profiler.runcall(run)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                print(f"\n### profile: {group.key} / {variant.name} ({variant.records:,} records)")
                print("(main thread only: cProfile does not see background threads)")
                stats = pstats.Stats(profiler, stream=sys.stdout)
                stats.sort_stats("tottime").print_stats(top)
    finally:
        shutil.rmtree(shared_dir, ignore_errors=True)


def print_machine(info: dict[str, Any]) -> None:
    print(
        f"machine: {info['cpu_model']}, {info['usable_cpus']} usable of {info['cpu_count']} "
        f"CPUs, {info['memory_gb']} GB RAM; {info['implementation']} {info['python']}; "
        f"{info['os']}"
    )
    print(f"disk: {info['filesystem']}; {info['disk']}; bench dir {info['bench_dir']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    print(f"source: {info['source']}")


def markdown(results: list[GroupResult], reps: int) -> str:
    out = []
    for result in results:
        out.append(f"### {result.group.title}\n")
        if result.group.note:
            out.append(f"{result.group.note}\n")
        is_measured = isinstance(result, measured.MeasuredResult)
        out.append(measured.measured_markdown(result) if is_measured else md_table(result))
        lines = [f"- {a} / {b}: **{r:,.2f}x**" for a, b, r in result.peer_ratios()]
        if is_measured:
            lines += [f"- {text}" for text in result.summary_lines()]
        for goal, value, met in result.goal_outcomes():
            lines.append(f"- goal: **{result.goal_line(goal, value, met)}**")
        if lines:
            out.append("\n" + "\n".join(lines))
        out.append(
            f"\n(median of {reps} repetitions; wall time {result.seconds:.0f} s; "
            f"{result.background_summary()})\n"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev bench", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="small counts, 2 repetitions")
    parser.add_argument("--reps", type=int, help="repetitions (default 5, or 2 with --quick)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed repetitions first (default 1)"
    )
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this workload")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write results as JSON")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument("--dir", help="where to create the temporary directory")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each repetition wait up to SECONDS for other processes' CPU use to "
        "drop below 15%% (for shared machines; default 0: just record it)",
    )
    parser.add_argument(
        "--profile", metavar="NAME", help="cProfile the disklesslog variants of one workload"
    )
    parser.add_argument("--top", type=int, default=25, help="profile entries to print")
    args = parser.parse_args(argv)

    plan = Plan(quick=args.quick)
    groups = all_groups(plan)
    names = [g.key for g in groups]
    if args.list:
        for group in groups:
            print(f"{group.key:16} {group.title}")
        return 0
    wanted = args.only or ([args.profile] if args.profile else names)
    if "maintenance" in wanted:
        wanted = [w for w in wanted if w != "maintenance"] + list(maint.GROUP_KEYS)
    if "objects" in wanted:  # shorthand for the object-storage workloads
        wanted = [w for w in wanted if w != "objects"] + [
            *obj.GROUP_KEYS,
            *seq.GROUP_KEYS,
            *pipe.GROUP_KEYS,
        ]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {names}")
    groups = [g for g in groups if g.key in wanted]
    reps = args.reps or (2 if args.quick else 5)
    if reps < 1 or args.warmup < 0:
        parser.error("--reps must be at least 1 and --warmup at least 0")
    if peers.persistqueue is None:
        print("note: persist-queue is not installed; its rows are skipped", file=sys.stderr)

    # Turn SIGTERM into SystemExit so the temporary directory is removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with Scratch(args.dir) as scratch:
        info = machine_info(scratch.path)
        print_machine(info)
        if args.profile:
            profile_group(groups[0], scratch, args.top)
            return 0
        results = []
        started = time.perf_counter()
        for group in groups:
            print(f"\n== {group.key}: {group.title}")
            if group.note:
                print(f"   {group.note}")
            if isinstance(group, measured.MeasuredGroup):
                done = measured.run_measured(group, reps, scratch, args.warmup, args.wait_quiet)
                results.append(done)
                print(measured.measured_console(done), flush=True)
            else:
                result = run_group(group, reps, scratch, args.warmup, args.wait_quiet)
                results.append(result)
                print(console_table(result), flush=True)
        total = time.perf_counter() - started

    print(f"\n{len(results)} workloads, {reps} repetitions each, {total:.0f} s")
    outcomes = [(r, o) for r in results for o in r.goal_outcomes()]
    if outcomes:
        print("goals (judged on the median):")
        for result, (goal, value, met) in outcomes:
            print(f"  {result.goal_line(goal, value, met)}")
    if args.markdown:
        print("\n" + markdown(results, reps))
    if args.out:
        document = {
            "machine": info,
            "reps": reps,
            "warmup": args.warmup,
            "quick": args.quick,
            "seconds": total,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "groups": [r.to_json() for r in results],
        }
        args.out.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
