"""What automatic maintenance costs the application, and whether it keeps a log flat.

    .venv/bin/python benchmarks/auto_maintenance.py cost [--seconds 10] [--rounds 3]
                                                         [--interval-ms 100]
    .venv/bin/python benchmarks/auto_maintenance.py soak [--seconds 720] [--sample 30]
    (add --json FILE to keep the samples)

``cost``  single appends of 100 B, round-robin over 20 streams with ``retention_ms=2000``
          (so every pass has records to drop), for ``--seconds`` per run: the same loop
          with ``maintenance="off"`` (the baseline) and ``"auto"`` at an interval of
          ``--interval-ms`` (100: 600 times the default's frequency, a worst case; the
          first pass comes one interval after the first append), alternately in this
          process, on a local log (``fsync="never"``, 64 KiB segments) and on a
          ``file://`` object log (SQLite sequencer). Reports appends/s and the ratio,
          append latency percentiles, and the maintenance thread's CPU time over the run
          (``maintenance_cpu_seconds``): the share of a core it took.
``soak``  one steady writer (200 appends/s of 1 KiB over 20 streams, ``retention_ms``
          10 s) on each kind of log, with automatic maintenance every second, for
          ``--seconds``; every ``--sample`` seconds: the log's bytes and files on disk (the
          sequencer's part separately) and the process's memory. A log that looks after
          itself is flat: the last sample over the sample at the end of the warm-up (half
          the run: garbage waits out its 300 s grace before it is deleted) is at most 1.2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import rss_mb, tree_size

import disklesslog

STREAMS = 20
VALUE = b"v" * 100


def _kinds(root: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "local (fsync=never)": (str(root / "local"), {"fsync": "never", "segment_bytes": 64 << 10}),
        "object, file:// + SQLite": (f"file://{root}/objects", {"backend": "objects"}),
    }


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cost_run(
    url: str, options: dict[str, Any], maintenance: str, seconds: float, interval_ms: int
) -> dict[str, float]:
    log = disklesslog.open(
        url,
        **options,
        maintenance=maintenance,
        maintenance_interval_ms=interval_ms,
        retention_ms=2000,
    )
    try:
        streams = [log.stream(f"s{i}") for i in range(STREAMS)]
        latencies: list[float] = []
        clock = time.perf_counter
        started = clock()
        end = started + seconds
        i = 0
        while True:
            before = clock()
            if before >= end:
                break
            streams[i % STREAMS].append(VALUE)
            latencies.append(clock() - before)
            i += 1
        elapsed = clock() - started
        metrics = log.metrics()
    finally:
        log.close()
    return {
        "rate": len(latencies) / elapsed,
        "p50_us": _percentile(latencies, 0.5) * 1e6,
        "p99_us": _percentile(latencies, 0.99) * 1e6,
        "max_ms": max(latencies) * 1e3,
        "cpu_share": metrics.get("maintenance_cpu_seconds", 0.0) / elapsed,
        "passes": metrics.get("maintenance_passes", 0.0),
        "removed": metrics.get("maintenance_retention_records_removed", 0.0),
    }


def cost(seconds: float, rounds: int, interval_ms: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for kind, (url, options) in _kinds(Path(scratch)).items():
            runs: dict[str, list[dict[str, float]]] = {"off": [], "auto": []}
            for _ in range(rounds):
                for mode in ("off", "auto"):
                    runs[mode].append(_cost_run(url, options, mode, seconds, interval_ms))
            results[kind] = runs
    print(
        "| log | maintenance | appends/s (median) | vs off | p50 µs | p99 µs | max ms "
        "| maintenance CPU (share of a core) | passes | records dropped |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, runs in results.items():
        base = statistics.median(r["rate"] for r in runs["off"])
        for mode, samples in runs.items():
            med = {key: statistics.median(r[key] for r in samples) for key in samples[0]}
            ratio = "" if mode == "off" else f"{med['rate'] / base:.2f}x"
            print(
                f"| {kind} | {mode} | {med['rate']:,.0f} | {ratio} | {med['p50_us']:.0f} "
                f"| {med['p99_us']:.0f} | {med['max_ms']:.1f} | {med['cpu_share']:.1%} "
                f"| {med['passes']:.0f} | {med['removed']:,.0f} |"
            )
    return results


def soak(seconds: float, sample_every: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        logs = []
        for kind, (url, options) in _kinds(Path(scratch)).items():
            log = disklesslog.open(
                url, **options, maintenance_interval_ms=1000, retention_ms=10_000
            )
            for i in range(STREAMS):
                log.create_stream(f"s{i}")
            logs.append((kind, log, Path(scratch) / ("local" if "local" in kind else "objects")))
            results[kind] = []
        value = b"s" * 1024
        started = time.monotonic()
        next_sample = started
        n = 0
        try:
            while (now := time.monotonic()) - started < seconds:
                for _, log, _ in logs:
                    log.stream(f"s{n % STREAMS}").append(value)
                n += 1
                if now >= next_sample:
                    for kind, log, path in logs:
                        size, files = tree_size(path)
                        sequencer = tree_size(path / "_sequencer")
                        results[kind].append(
                            {
                                "t": round(now - started),
                                "bytes": size,
                                "files": files,
                                "sequencer_bytes": sequencer[0] + _sqlite_bytes(path),
                                "rss_mb": rss_mb(),
                                "records": sum(
                                    log.stream(f"s{i}").end_offset
                                    - log.stream(f"s{i}").start_offset
                                    for i in range(STREAMS)
                                ),
                            }
                        )
                    next_sample += sample_every
                time.sleep(max(0.0, started + n / 200 - time.monotonic()))
        finally:
            for _, log, _ in logs:
                log.close()
    for kind, samples in results.items():
        print(f"\n{kind}:")
        print("| t (s) | bytes | files | sequencer bytes | live records | RSS MB |")
        print("|---:|---:|---:|---:|---:|---:|")
        for s in samples:
            print(
                f"| {s['t']} | {s['bytes']:,} | {s['files']} | {s['sequencer_bytes']:,} "
                f"| {s['records']:,} | {s['rss_mb']:.0f} |"
            )
        warm = samples[len(samples) // 2]
        last = samples[-1]
        ratios = {
            key: last[key] / warm[key] if warm[key] else float("nan")
            for key in ("bytes", "files", "sequencer_bytes", "rss_mb")
        }
        print("end / end of warm-up: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    return results


def _sqlite_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("disklesslog-meta.db*") if p.exists())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("cost", "soak"))
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", type=float, default=30.0)
    parser.add_argument("--interval-ms", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.mode == "cost":
        results = cost(args.seconds or 10.0, args.rounds, args.interval_ms)
    else:
        results = soak(args.seconds or 720.0, args.sample)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
