"""Writers on several "machines" share a log with no server: the object-store sequencer.

On ``s3://``, ``gs://`` or ``az://`` this is the default: offsets are ordered by a log
of small entry objects that each writer creates with a conditional PUT
(``If-None-Match: *``) in the bucket itself. To run without a cloud, this example puts
the log on ``file://`` and asks for the same sequencer with ``sequencer="objectstore://"``
(a temporary file hard-linked into place stands in for the conditional PUT). Each
process keeps its own replica of the sequencer, as separate machines would, and
reports how many entries it won and how many races it lost to the others.

It then restarts a named producer elsewhere, which fences the first instance: the
zombie's next flush fails with ``ProducerFenced`` and its records never appear.
Run: ``python examples/serverless_sequencer.py [DIRECTORY]``.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import disklesslog

WRITERS = 3
EVENTS = 2_000  # per writer


def open_log(url: str) -> disklesslog.Log:
    return disklesslog.open(url, backend="objects", sequencer="objectstore://")


def write(url: str, number: int) -> None:
    with open_log(url) as log:
        with log.writer(linger_ms=10) as writer:
            for n in range(EVENTS):
                if n % 100 == 0:
                    time.sleep(0.005)  # readings arrive over time: many flushes, many commits
                writer.append(f"sensor-{n % 4}", b"writer %d reading %d" % (number, n))
        # The processes race for entry numbers and take turns (docs/sequencers.md,
        # "Contention and capacity"); the counters say how it went for this one.
        metrics = log.metrics()
        print(
            f"writer {number}: won {metrics['sequencer_entries_written']:.0f} sequencer "
            f"entries, lost {metrics['sequencer_races_lost']:.0f} races, its commits waited "
            f"{metrics['sequencer_commit_wait_seconds']:.2f} s in all"
        )


def take_over(url: str) -> None:
    """A second instance of the "ingest" producer, as after a failover."""
    with open_log(url) as log, log.writer(producer="ingest", linger_ms=0) as writer:
        writer.append("alerts", b"from the new instance").result()


def main(directory: Path) -> None:
    url = f"file://{directory}"
    processes = [
        multiprocessing.Process(target=write, args=(url, number)) for number in range(WRITERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
        assert process.exitcode == 0

    with open_log(url) as log:
        total = sum(log.stream(name).end_offset for name in log.streams())
        print(
            f"{WRITERS} writer processes stored {total:,} records in {len(log.streams())} streams"
        )
        entries = sorted((directory / "_sequencer" / "log").iterdir())
        print(
            f"the sequencer: {len(entries)} entry objects under {directory / '_sequencer'} "
            "(streams created, producers registered, commits), no server"
        )

        zombie = log.writer(producer="ingest", linger_ms=0)
        zombie.append("alerts", b"from the first instance").result()
        other = multiprocessing.Process(target=take_over, args=(url,))
        other.start()
        other.join()
        try:
            zombie.append("alerts", b"from the zombie").result()
        except disklesslog.ProducerFenced:
            print("the first 'ingest' instance was fenced by its successor")
        print("alerts:", [r.value.decode() for r in log.stream("alerts").read() if r.value])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "log")
