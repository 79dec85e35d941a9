"""Several processes append to one stream at once while this one tails it.

Each producer process opens the same log directory and writes through a buffering
Writer; offsets stay dense and every producer's records keep their order. Run:
``python examples/many_processes.py [DIRECTORY]`` (default: a temporary directory).
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
from pathlib import Path

import disklesslog

PRODUCERS = 3
PER_PRODUCER = 2_000


def produce(directory: str, producer: int) -> None:
    with disklesslog.open(directory) as log, log.writer(linger_ms=5) as writer:
        for n in range(PER_PRODUCER):
            writer.append("events", b"producer-%d:%d" % (producer, n), key=b"%d" % producer)


def main(directory: Path) -> None:
    with disklesslog.open(directory) as log:
        log.create_stream("events")
        context = multiprocessing.get_context("spawn")
        producers = [
            context.Process(target=produce, args=(str(directory), p)) for p in range(PRODUCERS)
        ]
        for process in producers:
            process.start()

        expected = PRODUCERS * PER_PRODUCER
        last_seen = [-1] * PRODUCERS
        count = 0
        # Tail from offset 0 while the producers write; stop once everything arrived.
        for record in log.stream("events").follow(0, poll_interval=0.05, idle_timeout=30):
            producer, n = (int(x) for x in record.value.split(b"-")[1].split(b":"))
            assert n == last_seen[producer] + 1, "a producer's records arrived out of order"
            last_seen[producer] = n
            count += 1
            if count % 1_000 == 0:
                print(f"tailed {count:,} records; latest offset {record.offset}")
            if count == expected:
                break
        for process in producers:
            process.join()

        stream = log.stream("events")
        print(
            f"\n{PRODUCERS} processes appended {count:,} records to 'events': offsets "
            f"{stream.start_offset}..{stream.end_offset - 1}, dense and in each one's order"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory(prefix="disklesslog-example-") as tmp:
            main(Path(tmp) / "log")
