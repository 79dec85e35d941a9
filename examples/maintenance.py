"""Maintenance on both backends: retention, key compaction, tiering, merging and garbage
collection, each an explicit call that returns a report.

A local log keeps a compacted table of users (the latest record per key) and a stream of
clicks with size-based retention, tiered to a second directory standing in for a bucket
(``tier_url`` takes any fsspec URL: ``s3://bucket/prefix`` in production). An object
log on ``file://`` gets many small flushes, one WAL object each, which merging rewrites
into per-stream objects. Every step prints what it did.

Run: ``python examples/maintenance.py [DIRECTORY]``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import disklesslog
from disklesslog.maintenance import MaintenanceReport

USERS = 200
SMALL_SEGMENTS = {"segment_bytes": 16 << 10}  # tiny, so segments close in a short demo


def show(report: MaintenanceReport) -> None:
    print("\n".join("  " + line for line in report.summary()))


def local_log(directory: Path) -> None:
    print("== a local log, tiered to", directory / "tier")
    log = disklesslog.open(
        directory / "local",
        fsync="never",
        tier_url=f"file://{directory / 'tier'}",
        **SMALL_SEGMENTS,
    )
    users = log.create_stream("users", cleanup_policy="compact", delete_retention_ms=0)
    # clicks: keep about 256 KiB in all, of which only the newest 64 KiB on local disk
    clicks = log.create_stream("clicks", retention_bytes=256 << 10, local_retention_bytes=64 << 10)
    for version in range(10):  # every user updated ten times
        keys = [b"user-%03d" % u for u in range(USERS)]
        users.append_batch([b"profile v%d" % version] * USERS, keys=keys)
        clicks.append_batch([b"click %06d " % (version * 500 + n) + bytes(90) for n in range(500)])
    users.append(None, key=b"user-000")  # a tombstone: user-000 is deleted
    users.append(b"last", key=b"user-001")  # and the active segment stays as written

    report = log.maintain(grace_seconds=0)
    show(report)

    latest: dict[bytes, bytes | None] = {}
    for record in users.read():
        assert record.key is not None
        latest[record.key] = record.value
    live = {key: value for key, value in latest.items() if value is not None}
    print(
        f"users: {users.end_offset:,} records written, {sum(1 for _ in users.read()):,} kept "
        f"(the active segment stays as written); {len(live)} live users, "
        f"user-001 = {live[b'user-001']!r}"
    )
    segments = clicks.info().details["segments"]
    print(
        f"clicks: offsets {clicks.start_offset:,}..{clicks.end_offset:,} kept by retention; "
        f"{len(segments)} segment(s) on local disk from offset {segments[0]['base_offset']:,}, "
        "the rest read from the tier:"
    )
    first = next(iter(clicks.read(clicks.start_offset))).value
    assert first is not None
    print(f"  read({clicks.start_offset:,}) -> {first[:12]!r}...")
    log.close()


def object_log(directory: Path) -> None:
    url = f"file://{directory / 'objects'}"
    print("== an object log at", url)
    with disklesslog.open(url, backend="objects") as log:
        for s in range(5):
            log.create_stream(f"sensor-{s}")
        for flush in range(40):  # forty flushes: forty small WAL objects, each 5 streams
            with log.writer(linger_ms=60_000) as writer:
                for s in range(5):
                    writer.append_batch(f"sensor-{s}", [b"reading %d" % flush] * 50)
        before = log.stream("sensor-0").info().details["objects"]
        # Merging waits for a stream's newest small piece to grow or age (10 minutes);
        # a target of 16 KiB lets this small demo merge everything at once.
        show(log.merge(target_bytes=16 << 10))
        after = log.stream("sensor-0").info().details["objects"]
        print(f"sensor-0: a full read touched {before} objects before merging, {after} after")
        show(log.collect_garbage(grace_seconds=0))
        assert [r.value for r in log.stream("sensor-0").read()][-1] == b"reading 39"


def main() -> None:
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    directory.mkdir(parents=True, exist_ok=True)
    local_log(directory)
    object_log(directory)


if __name__ == "__main__":
    main()
