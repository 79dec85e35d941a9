"""What creating a stream costs the PostgreSQL sequencer as the log gets wider.

    .venv/bin/python benchmarks/stream_create.py --streams 100000 --json out.json

A stream's row can be lost (a damaged page, a bad restore) and an object log's append
creates a stream it does not find, so before the sequencer says that a name does not
exist, or creates it, it compares the ``streams`` rows it counts with a checksummed
count (docs/sequencers.md, "Complete streams"). Schema versions 4 to 6 counted every
row, so each create cost O(streams) and building n streams O(n^2); version 7 counts
the rows of the name's range of name keys (1/4,096 of them).

This creates ``--streams`` streams through ``PostgresSequencer.create_stream`` on a
throwaway server (the test suite's), one after another. At each width of ``--points``
it times, in the same process against the same table, ``--sample`` further creates and
lookups of names that do not exist (``stream_info``, StreamNotFound), the statement
this version runs on such a miss (the range's count), and the baseline: the statement
the versions before ran on each one (``count(*)`` of every row, with the one count row).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import machine_info, source_state

SCHEMA = "width"
# What schema versions 4-6 ran before every create and every lookup that found nothing.
BASELINE = (
    "SELECT c.streams, c.crc, (SELECT count(*) FROM width.streams) FROM (SELECT 1) AS q"
    " LEFT JOIN width.stream_count AS c ON c.id = 0"
)
# What version 7 runs instead: the rows of one range of name keys, through their index.
RANGE = (
    "SELECT c.streams, c.crc, (SELECT count(*) FROM width.streams"
    " WHERE name_key >= %s AND name_key < %s) FROM (SELECT 1) AS q"
    " LEFT JOIN width.stream_count AS c ON c.id = %s"
)


def _mean_ms(call: Callable[[int], Any], sample: int) -> float:
    times = []
    for i in range(sample):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return statistics.fmean(times) * 1e3


def _measure(seq: Any, conn: Any, tag: str, sample: int) -> dict[str, float]:
    """Mean ms of each measured call at the width the table has now; creates ``sample``
    streams (``extra-TAG-I``)."""
    from disklesslog.errors import StreamNotFound
    from disklesslog.sequencers.postgres_schema import bucket_keys, name_bucket
    from disklesslog.sequencers.rows import name_key

    def miss(i: int) -> None:
        try:
            seq.stream_info(f"missing-{tag}-{i}")
        except StreamNotFound:
            return
        raise AssertionError("found a stream never created")

    def range_count(i: int) -> None:
        bucket = name_bucket(name_key(f"missing-{tag}-{i}"))
        conn.execute(RANGE, (*bucket_keys(bucket), bucket)).fetchall()

    return {
        "baseline_count_ms": _mean_ms(lambda _: conn.execute(BASELINE).fetchall(), sample),
        "range_count_ms": _mean_ms(range_count, sample),
        "lookup_miss_ms": _mean_ms(miss, sample),
        "create_ms": _mean_ms(lambda i: seq.create_stream(f"extra-{tag}-{i}", {}), sample),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--points", default="1000,10000,30000,100000")
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    points = sorted(int(p) for p in args.points.split(",") if int(p) <= args.streams)

    import psycopg

    from disklesslog.sequencers.postgres import PostgresSequencer
    from disklesslog.testing.servers.postgres import postgres_server

    results = []
    started = time.perf_counter()
    with (
        postgres_server() as dsn,
        PostgresSequencer(f"{dsn}?schema={SCHEMA}") as seq,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        created = extra = 0  # streams s0, s1, ...; and those the samples created
        for point in points:
            while created < point:
                seq.create_stream(f"s{created}", {})
                created += 1
            conn.execute("ANALYZE width.streams")  # as autovacuum would have by now
            row = {"streams": created + extra, **_measure(seq, conn, str(point), args.sample)}
            row["elapsed_s"] = time.perf_counter() - started
            extra += args.sample
            results.append(row)
            print(
                f"{row['streams']:>9,} streams: create {row['create_ms']:.2f} ms, lookup of a "
                f"missing name {row['lookup_miss_ms']:.2f} ms; its count "
                f"{row['range_count_ms']:.3f} ms, the versions before's count "
                f"{row['baseline_count_ms']:.3f} ms "
                f"({row['baseline_count_ms'] / row['range_count_ms']:.0f}x)",
                flush=True,
            )
    if args.json:
        out = {
            "command": " ".join(["benchmarks/stream_create.py", *sys.argv[1:]]),
            "sample": args.sample,
            "points": results,
            "machine": machine_info(Path.cwd()),
            "source": source_state(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
