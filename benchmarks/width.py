"""Width: what a log with many streams and many producers costs a fresh process.

    .venv/bin/python benchmarks/width.py --kind sqlite|objectstore|postgres|segments \\
        --streams 100000 --producers 10000 --json out.json

The log a target is stated for: a log's cost should depend on what is live, not on how
wide it is, so a *fresh* process must open a log of 100,000 streams and 10,000 producers
in at most 1 s and read one stream's last record at most 50 ms later.

``--kind`` picks the log:

``segments``     a local segments log (a plain directory). Local logs have no named
                 producers (``--producers`` is ignored): only the streams are measured.
``sqlite``       ``file://DIR/log`` with ``backend="objects"`` and
                 ``sequencer="sqlite:///DIR/meta.db"``.
``objectstore``  ``file://DIR/log`` with ``backend="objects"`` and
                 ``sequencer="objectstore://"`` (the sequencer's state in the log's own
                 directory).
``postgres``     ``file://DIR/log`` with ``backend="objects"`` and a throwaway PostgreSQL
                 server (the test suite's :func:`disklesslog.testing.servers.postgres.
                 postgres_server`) as sequencer.

**Building** (timed, in this process): one writer appends one record to every stream
(``writer.append(name, value)``, flushed every ``--per-flush`` streams); on the object
backend the writer's first flush to a stream creates it (one ``create_stream`` on the
sequencer each: the public API has no call creating many streams at once). Then
``--producers`` writers, each opened with its own ``producer=`` name, append one record
to one stream each and flush (registering the producer and leaving it a commit).

**Measuring** (``--reps`` fresh ``python`` subprocesses, one after another): each
imports disklesslog, then times ``disklesslog.open(...)``, reading the last record of
one stream chosen at random (``stream.read(stream.end_offset - 1)``), and
``log.streams()``; it reports its peak RSS (``VmHWM``) after the import, after the
read and after the listing. Every open passes ``maintenance="off"`` when the installed
disklesslog accepts that option, so no background work runs during the measurement.

``--profile FILE`` also writes a cProfile of one fresh process's open to FILE.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import peak_rss_kib

KINDS = ("segments", "sqlite", "objectstore", "postgres")
VALUE = b"x" * 100


def _rss_mb() -> float:
    """Peak resident set size of this process so far, in MB.

    Linux's ``VmHWM`` (``/proc/self/status``), which starts afresh at ``exec``: the
    child's ``getrusage`` ``ru_maxrss`` keeps the peak of the parent it was forked from
    (here the building process, hundreds of MB), so it is only the fallback."""
    return peak_rss_kib() / 1024


def _child(spec: dict[str, Any]) -> None:
    """Runs in the fresh process: import, open, read one last record, list; print JSON."""
    began = time.perf_counter()
    import disklesslog

    imported = time.perf_counter() - began
    rss_import = _rss_mb()
    profile = spec.get("profile")
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    log = disklesslog.open(spec["url"], **spec["options"])
    opened = time.perf_counter() - start
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    start = time.perf_counter()
    stream = log.stream(spec["stream"])
    end = stream.end_offset
    records = list(stream.read(end - 1))
    read = time.perf_counter() - start
    rss_read = _rss_mb()
    assert records and records[-1].offset == end - 1, (spec["stream"], end, records)
    start = time.perf_counter()
    names = log.streams()
    listed = time.perf_counter() - start
    rss_list = _rss_mb()
    start = time.perf_counter()
    log.close()
    closed = time.perf_counter() - start
    print(
        json.dumps(
            {
                "import_s": imported,
                "open_s": opened,
                "read_last_s": read,
                "streams_s": listed,
                "close_s": closed,
                "listed": len(names),
                "end_offset": end,
                "rss_after_import_mb": rss_import,
                "rss_after_read_mb": rss_read,
                "rss_peak_mb": rss_list,
            }
        )
    )


def _maintenance_off(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` plus ``maintenance="off"`` if this disklesslog accepts that option."""
    import disklesslog
    from disklesslog.errors import DisklessLogError

    try:
        log = disklesslog.open(url, **options, maintenance="off")
    except (DisklessLogError, TypeError):
        return dict(options)
    log.close()
    return {**options, "maintenance": "off"}


@contextlib.contextmanager
def _log_spec(kind: str, work: Path) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(url, open options, extra facts) for ``kind`` in ``work``; a PostgreSQL server
    lives as long as the block."""
    if kind == "segments":
        yield str(work / "log"), {"fsync": "never"}, {}
        return
    url = (work / "log").as_uri()
    if kind == "sqlite":
        yield url, {"backend": "objects", "sequencer": f"sqlite:///{work / 'meta.db'}"}, {}
    elif kind == "objectstore":
        yield url, {"backend": "objects", "sequencer": "objectstore://"}, {}
    else:
        from disklesslog.testing.servers.postgres import postgres_server

        with postgres_server() as dsn:
            yield url, {"backend": "objects", "sequencer": dsn}, {"dsn": dsn}


def _size_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _postgres_bytes(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return int(row[0])


def _build(
    kind: str, url: str, options: dict[str, Any], streams: int, producers: int, per_flush: int
) -> dict[str, float]:
    import disklesslog

    phases: dict[str, float] = {}
    start = time.perf_counter()
    with disklesslog.open(url, **options) as log:
        with log.writer() as writer:
            for i in range(streams):
                writer.append(f"s{i}", VALUE)
                if (i + 1) % per_flush == 0:
                    writer.flush()
                    print(f"  {i + 1:,} streams at {time.perf_counter() - start:.0f} s", flush=True)
            writer.flush()
        phases["streams_s"] = time.perf_counter() - start
        if kind != "segments":
            from disklesslog.objects.log import ObjectLog

            assert isinstance(log, ObjectLog)  # named producers are the object backend's
            begin = time.perf_counter()
            for p in range(producers):
                with log.writer(producer=f"p{p}") as writer:
                    writer.append(f"s{p % streams}", VALUE)
                    writer.flush()
                if (p + 1) % 1000 == 0:
                    print(
                        f"  {p + 1:,} producers at {time.perf_counter() - start:.0f} s", flush=True
                    )
            phases["producers_s"] = time.perf_counter() - begin
    phases["total_s"] = time.perf_counter() - start
    return phases


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "worst": max(values), "best": min(values)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        _child(json.loads(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--producers", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--per-flush", type=int, default=1000)
    parser.add_argument("--dir", type=Path, help="where to build (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="leave the built log in --dir")
    parser.add_argument(
        "--reuse", type=Path, help="measure a log an earlier --keep run left (not postgres)"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--profile", type=Path, help="cProfile one fresh open into this file")
    args = parser.parse_args(argv)
    producers = 0 if args.kind == "segments" else args.producers

    if args.reuse is not None and args.kind == "postgres":
        parser.error("--reuse needs a log whose sequencer outlives the run (not postgres)")
    work = args.reuse or Path(tempfile.mkdtemp(prefix="width-", dir=args.dir))
    try:
        with _log_spec(args.kind, work) as (url, given, facts):
            options = _maintenance_off(url, given)
            print(f"{args.kind}: {args.streams:,} streams, {producers:,} producers; {options}")
            if args.reuse is None:
                build = _build(args.kind, url, options, args.streams, producers, args.per_flush)
                (work / "build.json").write_text(json.dumps(build))
            else:
                build = json.loads((work / "build.json").read_text())
            storage = _size_bytes(work)
            if "dsn" in facts:
                storage += _postgres_bytes(facts["dsn"])
            print(f"  built in {build['total_s']:.1f} s, {storage / 1e6:.1f} MB")
            rng = random.Random(17)
            runs = []
            for rep in range(args.reps + (1 if args.profile else 0)):
                spec: dict[str, Any] = {
                    "url": url,
                    "options": options,
                    "stream": f"s{rng.randrange(args.streams)}",
                }
                profiling = args.profile is not None and rep == args.reps
                if profiling:
                    spec["profile"] = str(args.profile)
                out = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    print(out.stdout, out.stderr, file=sys.stderr)
                    return 1
                run = json.loads(out.stdout.strip().splitlines()[-1])
                run["stream"] = spec["stream"]
                assert run["listed"] == args.streams, run
                print(
                    f"  {'profile' if profiling else f'rep {rep + 1}'}: open {run['open_s']:.3f} s,"
                    f" read last {run['read_last_s'] * 1e3:.1f} ms,"
                    f" streams() {run['streams_s']:.3f} s, peak RSS {run['rss_peak_mb']:.0f} MB",
                    flush=True,
                )
                if not profiling:
                    runs.append(run)
    finally:
        if args.reuse is not None or (args.keep and args.dir is not None):
            print(f"  kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    keys = ("import_s", "open_s", "read_last_s", "streams_s", "close_s")
    rss = ("rss_after_import_mb", "rss_after_read_mb", "rss_peak_mb")
    stats = {key: _summary([run[key] for run in runs]) for key in keys + rss}
    open_worst = stats["open_s"]["worst"]
    read_worst = stats["read_last_s"]["worst"]
    result = {
        "kind": args.kind,
        "streams": args.streams,
        "producers": producers,
        "options": {k: v for k, v in options.items() if k != "sequencer"},
        "sequencer": options.get("sequencer", "").split(":", 1)[0] or None,
        "build": build,
        "storage_bytes": storage,
        "reps": args.reps,
        "stats": stats,
        "runs": runs,
        "targets": {
            "open_le_1s": {"worst": open_worst, "met": open_worst <= 1.0},
            "read_last_le_50ms": {"worst": read_worst, "met": read_worst <= 0.050},
        },
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,
        ).stdout.strip(),
    }
    for key in keys + rss:
        s = stats[key]
        unit = "MB" if key.endswith("_mb") else "s"
        print(f"  {key:20} median {s['median']:.4f} {unit}, worst {s['worst']:.4f} {unit}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
