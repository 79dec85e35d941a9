"""Several writer processes on one object log, on storage with a real bucket's latency.

    .venv/bin/python benchmarks/contention.py --sequencer objectstore --processes 4 \\
        --linger-ms 100 --seconds 20 --json out.json

``--processes`` writer processes open one ``faulty://`` object log over local files
whose every request waits as long as a bucket's would (``--put-ms`` for PUTs and
conditional creates, ``--get-ms`` for GETs, LISTs and lookups; 20 ms and 10 ms by
default: S3 Standard's typical figures). Each appends ``--rate`` records of 100 bytes a
second, evenly spaced, to its own stream through ``log.writer(producer=...,
linger_ms=--linger-ms)`` for ``--seconds``, then flushes and closes. A record's *ack
latency* runs from the moment it was due (not the moment ``append`` returned: a writer
that falls behind schedule is charged for it) to its future's completion.

Per process: records acknowledged, and of them those acknowledged before the offered
period ended, throughput (acknowledged records over the time from the common start to
its last acknowledgement), ack latency p50, p99 and max (and the worst of each second),
and the sequencer's counters from ``log.metrics()`` (entries written, races lost,
waits, where this version reports them). Overall: the offered load, the accepted rate,
*fairness* (the records the slowest process had acknowledged by the end of the offered
period over the fastest's: a process that waits until the others stop scores near 0
even if all its records are acknowledged in the end), the worst p99, and the sequencer
entries written per second.

``--sequencer``: ``objectstore`` (the bucket sequencer, inside the log: the default for
``s3://``, ``gs://`` and ``az://`` logs), ``sqlite`` (one machine's database file, no
latency injected: it is not on the bucket) or ``postgres`` (``--postgres-url``, else a
local server started for the run; a fresh schema per configuration, no latency
injected either). Every process starts appending at the same moment, after all of
them opened the log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from common import Scratch, machine_info, source_state

VALUE = b"v" * 100
SEQUENCER_COUNTERS = ("sequencer_entries", "sequencer_races_lost", "sequencer_conflicts")


def _options(spec: dict[str, Any]) -> dict[str, Any]:
    latency = {
        "write": spec["put_ms"] / 1000,
        "create": spec["put_ms"] / 1000,
        "read": spec["get_ms"] / 1000,
        "list": spec["get_ms"] / 1000,
    }
    return {
        "backend": "objects",
        "sequencer": spec["sequencer_url"],
        "storage_options": {
            "target_protocol": "file",
            "target_options": {"auto_mkdir": True},
            "latency": latency,
        },
        "maintenance": "off",
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def child(spec: dict[str, Any]) -> None:
    """One writer process: open, wait for the common start, append on schedule, report."""
    import disklesslog

    log = disklesslog.open(spec["url"], **_options(spec))
    stream = spec["stream"]
    latencies: list[float] = []
    seconds_in: list[float] = []  # when each acknowledged record was due, from the start
    last_ack = [0.0]
    in_time = [0]  # acknowledged before the offered period ended
    errors: list[str] = []
    lock = threading.Lock()
    writer = log.writer(producer=spec["producer"], linger_ms=spec["linger_ms"])
    rate, seconds = spec["rate"], spec["seconds"]
    total = int(rate * seconds)
    start = spec["start"]
    time.sleep(max(0.0, start - time.time()))
    for k in range(total):
        due = start + k / rate
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)

        def done(future: Any, due: float = due) -> None:
            now = time.time()
            with lock:
                if future.exception() is not None:
                    errors.append(repr(future.exception())[:200])
                else:
                    latencies.append(now - due)
                    seconds_in.append(due - start)
                    if now <= start + seconds:
                        in_time[0] += 1
                    last_ack[0] = max(last_ack[0], now)

        writer.append(stream, VALUE).add_done_callback(done)
    writer.flush()
    writer.close()
    metrics = log.metrics()
    log.close()
    with lock:
        acked = len(latencies)
        by_second: dict[int, list[float]] = {}
        for at, latency in zip(seconds_in, latencies, strict=True):
            by_second.setdefault(int(at), []).append(latency)
        worst_by_second = [
            round(1000 * max(by_second.get(i, [0.0]))) for i in range(int(seconds) + 1)
        ]
        print(
            json.dumps(
                {
                    "producer": spec["producer"],
                    "offered": total,
                    "acked": acked,
                    "acked_in_time": in_time[0],
                    "errors": len(errors),
                    "first_errors": errors[:3],
                    "throughput": acked / max(1e-9, last_ack[0] - start),
                    "p50_ms": 1000 * _percentile(latencies, 0.50),
                    "p99_ms": 1000 * _percentile(latencies, 0.99),
                    "max_ms": 1000 * max(latencies, default=float("nan")),
                    "mean_ms": 1000 * statistics.fmean(latencies) if latencies else None,
                    "worst_ms_by_second": worst_by_second,
                    "metrics": {k: v for k, v in metrics.items() if k.startswith("sequencer")},
                }
            ),
            flush=True,
        )


def _postgres_schema(base: str) -> str:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema={schema}"


def run_once(args: argparse.Namespace, work: Path, processes: int, linger_ms: float) -> dict:
    import disklesslog

    log_dir = work / f"log-{processes}-{int(linger_ms)}-{uuid.uuid4().hex[:6]}"
    url = f"faulty://{log_dir}"
    if args.sequencer == "objectstore":
        sequencer_url = "objectstore://"
    elif args.sequencer == "sqlite":
        sequencer_url = f"sqlite:///{log_dir}-meta.db"
    else:
        if not args.postgres_url:
            raise SystemExit("--sequencer postgres needs --postgres-url")
        sequencer_url = _postgres_schema(args.postgres_url)
    spec: dict[str, Any] = {
        "url": url,
        "sequencer_url": sequencer_url,
        "put_ms": args.put_ms,
        "get_ms": args.get_ms,
        "linger_ms": linger_ms,
        "rate": args.rate,
        "seconds": args.seconds,
    }
    with disklesslog.open(url, **_options(spec)) as log:
        for i in range(processes):
            log.create_stream(f"s{i}")
    start = time.time() + args.warmup
    spec["start"] = start
    children = []
    for i in range(processes):
        one = dict(spec, stream=f"s{i}", producer=f"writer-{i}")
        children.append(
            subprocess.Popen(
                [sys.executable, __file__, "--child", json.dumps(one)],
                stdout=subprocess.PIPE,
                text=True,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
            )
        )
    results = []
    for proc in children:
        out, _ = proc.communicate(timeout=args.seconds * 20 + 120)
        if proc.returncode:
            raise SystemExit(f"a writer process failed (exit {proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    entries = 0
    if args.sequencer == "objectstore":
        entries = len(os.listdir(log_dir / "_sequencer" / "log"))
    offered = processes * args.rate
    acked = sum(r["acked"] for r in results)
    throughputs = [r["throughput"] for r in results]
    in_time = [r["acked_in_time"] for r in results]
    row = {
        "sequencer": args.sequencer,
        "processes": processes,
        "linger_ms": linger_ms,
        "offered_per_s": offered,
        "accepted_per_s": sum(throughputs),
        "acked": acked,
        "offered": sum(r["offered"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "fairness": min(in_time) / max(1, *in_time),
        "worst_p99_ms": max(r["p99_ms"] for r in results),
        "worst_p50_ms": max(r["p50_ms"] for r in results),
        "worst_max_ms": max(r["max_ms"] for r in results),
        "entries_per_s": entries / args.seconds if entries else None,
        "per_process": results,
    }
    print(
        f"{args.sequencer:>11} {processes} processes, linger {linger_ms:>3.0f} ms: "
        f"acked {acked:,} of {row['offered']:,}, "
        f"accepted {row['accepted_per_s']:,.0f}/s of {offered:,.0f}/s offered, "
        f"p50 {row['worst_p50_ms']:,.0f} ms, worst p99 {row['worst_p99_ms']:,.0f} ms, "
        f"max {row['worst_max_ms']:,.0f} ms, fairness {row['fairness']:.2f}, "
        + (f"entries {row['entries_per_s']:.0f}/s, " if entries else "")
        + f"errors {row['errors']}",
        flush=True,
    )
    for r in results:
        counters = ", ".join(f"{k[10:]}={v:,.0f}" for k, v in sorted(r["metrics"].items()))
        print(
            f"    {r['producer']}: {r['throughput']:,.0f}/s, p50 {r['p50_ms']:,.0f} ms, "
            f"p99 {r['p99_ms']:,.0f} ms"
            + (f"; {counters}" if counters else "")
            + f"; worst by second {r['worst_ms_by_second']}",
            flush=True,
        )
    return row


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sequencer", choices=("objectstore", "sqlite", "postgres"), default="objectstore"
    )
    parser.add_argument("--postgres-url", default=os.environ.get("DL_POSTGRES_URL"))
    parser.add_argument(
        "--processes", default="1,2,4", help="comma-separated counts of writer processes"
    )
    parser.add_argument("--linger-ms", default="20,100", help="comma-separated lingers")
    parser.add_argument("--rate", type=float, default=480.0, help="records/s per process")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--put-ms", type=float, default=20.0)
    parser.add_argument("--get-ms", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds to open the log")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR)")
    args = parser.parse_args()
    rows = []
    with contextlib.ExitStack() as stack:
        if args.sequencer == "postgres" and not args.postgres_url:
            from disklesslog.testing.servers.postgres import postgres_server

            args.postgres_url = stack.enter_context(postgres_server())
        work = stack.enter_context(Scratch(args.dir)).path
        info = machine_info(work)
        for linger in (float(x) for x in args.linger_ms.split(",")):
            for processes in (int(x) for x in args.processes.split(",")):
                rows.append(run_once(args, work, processes, linger))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "contention",
                    "source": source_state(),
                    "machine": info,
                    "put_ms": args.put_ms,
                    "get_ms": args.get_ms,
                    "rate_per_process": args.rate,
                    "seconds": args.seconds,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
