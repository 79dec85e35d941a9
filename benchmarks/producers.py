"""Producer churn: does the sequencer's producer state stay flat while writers come and go?

    .venv/bin/python benchmarks/producers.py --sequencer sqlite --writers 5000 \\
        --points 500,1000,2500,5000 --expiration-ms 1000 --maintain-every 250 --json out.json

``--writers`` short-lived anonymous writers (``log.writer()``, each a new producer id)
append one 100-byte record each to one of 10 streams in turn, flush and close, one after
the other, on a ``file://`` log opened with ``backend="objects"`` and
``producer_expiration_ms=--expiration-ms``, with the object-store sequencer
(``objectstore://``, inside the log) or a SQLite one (the default ``file://`` one, in
the log's directory). With ``--maintenance on``, ``log.housekeeping()`` runs every
``--maintain-every`` writers (what automatic maintenance does at most once a minute);
with ``off``, never. At each point of ``--points``: the producers the sequencer has
registered, its (producer, stream) states, the bytes they take (SQLite: the pages of
their tables and index, from ``dbstat``; the object-store sequencer: their msgpack
encoding, as a checkpoint holds them before compression), and the sequencer's bytes on
disk, producer state and everything else (the SQLite database
file, and its WAL apart, which SQLite resets at its checkpoints; the object-store
sequencer's newest checkpoint, and its whole directory, which also holds the entries
not yet superseded), and what the last housekeeping dropped.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
from common import Scratch, machine_info, tree_size

STREAMS = 10
VALUE = b"v" * 100
SQLITE_NAME = "disklesslog-meta.db"


def _counts(log: Any, kind: str, root: Path) -> dict[str, Any]:
    """Producers, states and sequencer bytes as the sequencer stores them now."""
    if kind == "sqlite":
        with sqlite3.connect(f"file:{root / SQLITE_NAME}?mode=ro", uri=True) as db:
            producers = db.execute("SELECT count(*) FROM producers").fetchone()[0]
            states = db.execute("SELECT count(*) FROM producer_streams").fetchone()[0]
            (pages,) = db.execute(  # dbstat: the pages of these tables and their indexes
                "SELECT sum(pgsize) FROM dbstat WHERE name IN (?, ?, ?)",
                ("producers", "producer_streams", "sqlite_autoindex_producers_1"),
            ).fetchone()
        wal = root / (SQLITE_NAME + "-wal")
        return {
            "producers": producers,
            "states": states,
            "producer_bytes": pages,
            "sequencer_bytes": (root / SQLITE_NAME).stat().st_size,
            "wal_bytes": wal.stat().st_size if wal.exists() else 0,
        }
    state = log.sequencer.snapshot()
    directory = root / "_sequencer"
    checkpoints = sorted((directory / "checkpoints").glob("*"))
    parts = [state["producers"], state["producer_names"], [row[9] for row in state["streams"]]]
    return {
        "producers": len(state["producers"]),
        "states": sum(len(row[9]) for row in state["streams"]),
        "producer_bytes": sum(len(msgpack.packb(part)) for part in parts),
        "sequencer_bytes": tree_size(directory)[0],
        "checkpoint_bytes": checkpoints[-1].stat().st_size if checkpoints else 0,
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import disklesslog

    root = work / "log"
    options: dict[str, Any] = {
        "backend": "objects",
        "maintenance": "off",  # housekeeping is called below, at a known rhythm
        "producer_expiration_ms": args.expiration_ms,
    }
    if args.sequencer == "objectstore":
        options["sequencer"] = "objectstore://"
    points = sorted(int(p) for p in args.points.split(","))
    rows: list[dict[str, Any]] = []
    last_expired = ""
    started = time.perf_counter()
    with disklesslog.open(f"file://{root}", **options) as log:
        for i in range(1, args.writers + 1):
            with log.writer(linger_ms=0) as writer:
                writer.append(f"s{i % STREAMS}", VALUE).result()
            if args.maintenance == "on" and i % args.maintain_every == 0:
                actions = log.housekeeping().actions
                last_expired = next((a for a in actions if "idle producers" in a), "")
            if i in points:
                row = {"writers": i, "seconds": round(time.perf_counter() - started, 1)}
                row |= _counts(log, args.sequencer, root)
                row["last_housekeeping"] = last_expired
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return {
        "sequencer": args.sequencer,
        "maintenance": args.maintenance,
        "expiration_ms": args.expiration_ms,
        "maintain_every": args.maintain_every,
        "writers": args.writers,
        "points": rows,
        "machine": machine_info(work),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| sequencer | maintenance | writers | s | producers | states | their KB "
        "| sequencer KB | newest checkpoint KB | SQLite WAL KB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for row in result["points"]:
            checkpoint, wal = row.get("checkpoint_bytes"), row.get("wal_bytes")
            lines.append(
                f"| {result['sequencer']} | {result['maintenance']} | {row['writers']:,} "
                f"| {row['seconds']} | {row['producers']:,} | {row['states']:,} "
                f"| {row['producer_bytes'] / 1e3:,.1f} "
                f"| {row['sequencer_bytes'] / 1e3:,.0f} "
                f"| {'' if checkpoint is None else f'{checkpoint / 1e3:,.1f}'} "
                f"| {'' if wal is None else f'{wal / 1e3:,.0f}'} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequencer", choices=["sqlite", "objectstore"], default="sqlite")
    parser.add_argument("--writers", type=int, default=5000)
    parser.add_argument("--points", default="500,1000,2500,5000")
    parser.add_argument("--maintenance", choices=["on", "off"], default="on")
    parser.add_argument("--maintain-every", type=int, default=250)
    parser.add_argument("--expiration-ms", type=int, default=1000)
    parser.add_argument("--json", help="append the result to this JSON file (a list)")
    parser.add_argument("--table", nargs="+", help="print the tables of these JSON files")
    args = parser.parse_args()
    if args.table:
        results = [r for path in args.table for r in json.loads(Path(path).read_text())]
        print(table(results))
        return
    with Scratch() as scratch:
        result = run(args, scratch.path)
    if args.json:
        path = Path(args.json)
        previous = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*previous, result], indent=1))
    print(table([result]))


if __name__ == "__main__":
    main()
