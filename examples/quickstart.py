"""The disklesslog quick start: a log in a local directory, a few streams, a round trip.

Run it with ``./dev demo`` (or ``python examples/quickstart.py [DIRECTORY]``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import disklesslog


def main(directory: Path) -> None:
    print(f"disklesslog {disklesslog.__version__}: a log in {directory}\n")

    with disklesslog.open(directory) as log:
        # 1. Append single records: each returns its offset once it is written.
        orders = log.stream("orders")
        for n in range(3):
            order = {"order": n, "item": ["book", "lamp", "tea"][n], "at": time.time()}
            offset = orders.append(json.dumps(order).encode(), key=f"customer-{n % 2}".encode())
            print(f"appended order {n} to 'orders' at offset {offset}")

        # 2. Append a batch atomically (all records or none), with headers.
        clicks = log.stream("clicks")
        offsets = clicks.append_batch(
            [f"/page/{i}".encode() for i in range(5)],
            headers=[{"agent": b"demo"}] * 5,
        )
        print(f"appended a batch of {len(offsets)} clicks at offsets {offsets[0]}..{offsets[-1]}")

        # 3. A buffering writer: many streams, futures resolve to offsets.
        with log.writer(linger_ms=5) as writer:
            futures = [writer.append(f"metrics-{i % 2}", b"%d" % i) for i in range(10)]
        print(f"the writer stored 10 records; the last went to offset {futures[-1].result()}")

        # 4. Read back.
        print("\nstreams:", ", ".join(log.streams()))
        for record in orders.read():
            print(f"  orders[{record.offset}] key={record.key!r} value={record.value.decode()}")
        stream = log.stream("metrics-0")
        print(f"  metrics-0 holds offsets {stream.start_offset}..{stream.end_offset - 1}")

    # 5. Reopen: everything is still there, in order.
    with disklesslog.open(directory) as log:
        values = [r.value for r in log.stream("clicks").read()]
        print(f"\nafter reopening, 'clicks' reads back {len(values)} records: {values[0]!r} ...")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory(prefix="disklesslog-demo-") as tmp:
            main(Path(tmp) / "log")
