"""State with age: does an object log's cost grow with its history or with what is live?

    .venv/bin/python benchmarks/history.py --sequencer objectstore --flushes 100000 \\
        --points 10000,25000,50000,100000 --maintain-every 1000 --json out.json

One writer appends one 100-byte record at a time to 100 streams in turn through
``Stream.append`` (each call is one object and one sequencer commit: it returns once
committed) on a ``file://`` log opened with ``backend="objects"``, with the object-store
sequencer (``objectstore://``) or a SQLite one (``sqlite:///<dir>/meta.db``, outside the
log's directory). Streams keep ``--retention-ms`` of records, so maintenance has old
records to drop and objects to delete.

Maintenance (``--maintenance``): ``explicit`` runs ``log.maintain(grace_seconds=...)``
in the writer every ``--maintain-every`` flushes; ``auto`` passes ``maintenance="auto"``
to ``disklesslog.open`` (refused clearly if this version does not take it); ``off`` never
maintains (``explicit`` and ``off`` pass ``maintenance="off"``). ``--maintain-every 0`` is ``off``.

At each point of ``--points`` the writer pauses and a fresh process (``sys.executable``)
opens the log and reads one stream's last record: its open+read time, its RSS after
the open and its peak RSS (``getrusage``, whole process, interpreter and imports
included; the RSS after importing disklesslog is given too, to subtract). Also per point:
the writer's commit rate over the last step (maintenance included) and over the last
``--window`` flushes before the point (equal windows compare fairly: the first step
also holds the log's warm-up), the storage under
the log's directory (bytes and files) with the sequencer's part separately, and what
the last maintenance took. ``--profile`` adds, at the last point, a tracemalloc profile
of the fresh process's open (top allocation sites).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import Scratch, cpu_busy, machine_info, peak_rss_kib, rss_mb, tree_size

STREAMS = 100
VALUE = b"v" * 100
DEFAULT_POINTS = (10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000)


def _peak_rss_mb() -> float:
    return peak_rss_kib() / 1e3


def _ru_maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def _open_options(sequencer_url: str) -> dict[str, Any]:
    return {"backend": "objects", "sequencer": sequencer_url, "create": False}


def child(url: str, sequencer_url: str, stream: str, profile: int) -> None:
    """Run in the fresh process: open, read the last record, print a JSON line."""
    import tracemalloc

    started = time.perf_counter()
    import disklesslog

    import_s = time.perf_counter() - started
    rss_imported = rss_mb()
    if profile:
        tracemalloc.start(25)
    started = time.perf_counter()
    log = disklesslog.open(url, **_open_options(sequencer_url))
    opened_s = time.perf_counter() - started
    rss_open = rss_mb()
    s = log.stream(stream)
    end = s.end_offset
    last = list(s.read(end - 1, end)) if end > s.start_offset else []
    total_s = time.perf_counter() - started
    rss_read = rss_mb()
    top: list[dict[str, Any]] = []
    if profile:
        snapshot = tracemalloc.take_snapshot()
        traced, traced_peak = tracemalloc.get_traced_memory()
        root = str(Path(disklesslog.__file__).resolve().parent.parent) + "/"
        for stat in snapshot.statistics("traceback")[:profile]:
            frames = [f"{fr.filename.removeprefix(root)}:{fr.lineno}" for fr in stat.traceback]
            disk = [fr for fr in frames if fr.startswith("disklesslog/")]
            top.append(
                {
                    "mb": stat.size / 1e6,
                    "blocks": stat.count,
                    "site": frames[-1],  # tracemalloc orders frames oldest first
                    "disklesslog_frames": disk[-4:],
                }
            )
        top.insert(0, {"traced_total_mb": traced / 1e6, "traced_peak_mb": traced_peak / 1e6})
    log.close()
    print(
        json.dumps(
            {
                "import_s": import_s,
                "open_s": opened_s,
                "open_read_s": total_s,
                "rss_imported_mb": rss_imported,
                "rss_after_open_mb": rss_open,
                "rss_after_read_mb": rss_read,
                "peak_rss_mb": _peak_rss_mb(),
                "ru_maxrss_mb": _ru_maxrss_mb(),  # includes the writer's RSS at fork
                "end_offset": end,
                "read_records": len(last),
                "top_allocations": top,
            }
        )
    )


def fresh_open(url: str, sequencer_url: str, stream: str, profile: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", url, "--child-sequencer", sequencer_url]
    command += ["--child-stream", stream, "--profile", str(profile)]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the fresh process failed ({out.returncode}):\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def storage(log_dir: Path, sequencer: str, db: Path) -> dict[str, int]:
    total, files = tree_size(log_dir)
    if sequencer == "objectstore":
        seq_bytes, seq_files = tree_size(log_dir / "_sequencer")
        data_bytes, data_files = total - seq_bytes, files - seq_files
    else:
        seq_bytes = seq_files = 0
        for path in db.parent.glob(db.name + "*"):  # meta.db, -wal, -shm
            seq_bytes += path.stat().st_size
            seq_files += 1
        data_bytes, data_files = total, files
    return {
        "data_bytes": data_bytes,
        "data_files": data_files,
        "sequencer_bytes": seq_bytes,
        "sequencer_files": seq_files,
    }


def _maintenance_counters(log: Any) -> dict[str, float]:
    """What automatic maintenance did in the writer so far (its ``maintenance_*``
    metrics: passes, CPU and wall seconds, per operation runs, errors and counters)."""
    return {
        name: value
        for name, value in log.metrics().items()
        if name.startswith("maintenance_") and not name.endswith("_last_run_ms")
    }


def _last_changes(log: Any) -> str:
    """The last change each operation of automatic maintenance made, one line each."""
    status = log.maintenance_status()
    return "; ".join(
        f"{name}: {op.last_changed}" for name, op in status.operations.items() if op.last_changed
    )[:600]


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import disklesslog
    from disklesslog.errors import ConfigError

    log_dir = work / "log"
    db = work / "meta.db"
    url = f"file://{log_dir}"
    sequencer_url = "objectstore://" if args.sequencer == "objectstore" else f"sqlite:///{db}"
    mode = (
        "off" if args.maintain_every == 0 and args.maintenance == "explicit" else args.maintenance
    )
    options: dict[str, Any] = {
        "backend": "objects",
        "sequencer": sequencer_url,
        "retention_ms": args.retention_ms,
    }
    # "off" and "explicit" too: automatic maintenance is the default now.
    options["maintenance"] = "auto" if mode == "auto" else "off"
    try:
        log = disklesslog.open(url, **options)
    except (ConfigError, TypeError) as exc:
        if mode == "auto":
            raise SystemExit(
                f"--maintenance auto: this disklesslog does not take maintenance='auto' ({exc})"
            ) from exc
        raise
    names = [f"s-{i:03d}" for i in range(STREAMS)]
    streams = [log.create_stream(n) for n in names]
    points = sorted(p for p in args.points if p <= args.flushes)
    rows: list[dict[str, Any]] = []
    done = 0
    maintain_s = 0.0
    last_report = ""
    try:
        for point in points:
            step_started = time.perf_counter()
            step_maintain = 0.0
            maintains = 0
            window_started = step_started
            while done < point:
                streams[done % STREAMS].append(VALUE)
                done += 1
                if done == point - args.window:
                    window_started = time.perf_counter()
                if mode == "explicit" and done % args.maintain_every == 0:
                    t = time.perf_counter()
                    report = log.maintain(grace_seconds=args.grace_seconds)
                    step_maintain += time.perf_counter() - t
                    maintains += 1
                    last_report = "; ".join(report.actions[-3:])[:300]
            ended = time.perf_counter()
            step_s = ended - step_started
            maintain_s += step_maintain
            step = point - (rows[-1]["flushes"] if rows else 0)
            row: dict[str, Any] = {
                "flushes": point,
                "step_commits_per_s": step / step_s,
                "window_commits_per_s": min(step, args.window) / (ended - window_started),
                "step_s": step_s,
                "step_maintain_s": step_maintain,
                "step_maintains": maintains,
                "writer_rss_mb": rss_mb(),
                "background_cpu_busy": cpu_busy(),
            }
            row.update(storage(log_dir, args.sequencer, db))
            row["fresh"] = fresh_open(url, sequencer_url, names[42], 0)
            if args.profile and point == points[-1]:  # tracing slows the open: a second one
                row["profile"] = fresh_open(url, sequencer_url, names[42], args.profile)
            if mode == "auto":
                row["maintenance"] = _maintenance_counters(log)
                last_report = _last_changes(log)
            row["last_maintain_actions"] = last_report
            rows.append(row)
            fresh = row["fresh"]
            print(
                f"{point:>9,} flushes: {row['step_commits_per_s']:,.0f} commits/s "
                f"(last {min(step, args.window):,}: {row['window_commits_per_s']:,.0f}) "
                f"(maintain {step_maintain:.1f} s of {step_s:.1f} s), fresh open+read "
                f"{fresh['open_read_s']:.2f} s, peak RSS {fresh['peak_rss_mb']:.0f} MB "
                f"(after import {fresh['rss_imported_mb']:.0f}), data "
                f"{row['data_bytes'] / 1e6:.1f} MB / {row['data_files']:,} files, sequencer "
                f"{row['sequencer_bytes'] / 1e6:.1f} MB / {row['sequencer_files']:,} files, "
                f"load {row['background_cpu_busy']:.0%}",
                flush=True,
            )
            counters = row.get("maintenance")
            if counters:
                print(
                    f"    maintenance: {counters.get('maintenance_passes', 0):.0f} passes, "
                    f"{counters.get('maintenance_pass_seconds', 0):.1f} s "
                    f"({counters.get('maintenance_cpu_seconds', 0):.1f} s CPU); "
                    + ", ".join(
                        f"{name[12:]}={value:,.0f}"
                        for name, value in counters.items()
                        if name.endswith(("_runs", "_errors", "_objects_deleted"))
                    ),
                    flush=True,
                )
    finally:
        log.close()
    return {
        "sequencer": args.sequencer,
        "sequencer_url": sequencer_url.replace(str(work), "<work>"),
        "maintenance": mode,
        "maintain_every": args.maintain_every if mode == "explicit" else None,
        "retention_ms": args.retention_ms,
        "grace_seconds": args.grace_seconds,
        "window": args.window,
        "streams": STREAMS,
        "value_bytes": len(VALUE),
        "points": rows,
    }


def markdown(path: Path) -> str:
    """The table docs/benchmarks.md shows for one result file. A fresh process's peak is
    shown only where it was measured as VmHWM (files with ``ru_maxrss_mb``)."""
    result = json.loads(path.read_text())
    out = [
        "| flushes | commits/s (last step) | commits/s (window) | maintain s (step) "
        "| fresh open+read s "
        "| fresh RSS after open+read MB | fresh peak RSS MB | writer RSS MB "
        "| data MB / files | sequencer MB / files | background CPU |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["points"]:
        fresh = row["fresh"]
        peak = f"{fresh['peak_rss_mb']:.0f}" if "ru_maxrss_mb" in fresh else "n/a"
        rate = row.get("window_commits_per_s")
        window = "n/a" if rate is None else f"{rate:,.0f}"
        out.append(
            f"| {row['flushes']:,} | {row['step_commits_per_s']:,.0f} "
            f"| {window} "
            f"| {row['step_maintain_s']:.1f} of {row['step_s']:.0f} "
            f"| {fresh['open_read_s']:.2f} | {fresh['rss_after_read_mb']:.0f} | {peak} "
            f"| {row['writer_rss_mb']:.0f} "
            f"| {row['data_bytes'] / 1e6:.1f} / {row['data_files']:,} "
            f"| {row['sequencer_bytes'] / 1e6:.1f} / {row['sequencer_files']:,} "
            f"| {row['background_cpu_busy']:.0%} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequencer", choices=("objectstore", "sqlite"), default="objectstore")
    parser.add_argument("--flushes", type=int, default=100_000)
    parser.add_argument(
        "--points",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(DEFAULT_POINTS),
        help="comma-separated flush counts to measure at (those up to --flushes)",
    )
    parser.add_argument("--maintenance", choices=("explicit", "auto", "off"), default="explicit")
    parser.add_argument("--maintain-every", type=int, default=1000)
    parser.add_argument("--retention-ms", type=int, default=10_000)
    parser.add_argument("--grace-seconds", type=float, default=5.0)
    parser.add_argument(
        "--window", type=int, default=5000, help="flushes before each point to rate alone"
    )
    parser.add_argument("--profile", type=int, default=0, help="top N tracemalloc sites")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR)")
    parser.add_argument("--table", type=Path, help="print a result file as Markdown and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-sequencer", help=argparse.SUPPRESS)
    parser.add_argument("--child-stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        print(markdown(args.table))
        return
    if args.child:
        child(args.child, args.child_sequencer, args.child_stream, args.profile)
        return
    started = time.time()
    with Scratch(args.dir) as scratch:  # removing 100,000s of files takes a while
        result = run(args, scratch.path)
        result["command"] = " ".join(["benchmarks/history.py", *sys.argv[1:]])
        result["wall_seconds"] = time.time() - started
        result["machine"] = machine_info(scratch.path)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
