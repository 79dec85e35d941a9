"""Child-process code of the contention tests (spawn-imported): writer processes on one
object log whose storage answers with a bucket's latency, each appending to its own
stream through a named producer's writer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import disklesslog

LATENCY = {"write": 0.02, "create": 0.02, "read": 0.01, "list": 0.01}
"""What the tests inject: S3 Standard's typical 20 ms per PUT and 10 ms per GET."""


def latency_options(target_protocol: str, target_options: dict[str, Any]) -> dict[str, Any]:
    """Storage options of a ``faulty://`` log over ``target_protocol`` with
    :data:`LATENCY` and no faults."""
    return {
        "target_protocol": target_protocol,
        "target_options": target_options,
        "latency": LATENCY,
    }


def value_of(producer: str, index: int) -> bytes:
    return f"{producer}:{index:06d}".encode()


def write(
    url: str,
    storage_options: dict[str, Any],
    producer: str,
    stream: str,
    count: int,
    rate: float,
    linger_ms: float,
    acked_path: str,
    gate: str,
    parties: int,
) -> None:
    """Append ``count`` records at ``rate`` a second (each due at a fixed time) through
    ``log.writer(producer=...)``; write each acknowledged index to ``acked_path`` as it
    is acknowledged (flushed, so a SIGKILL loses none of those lines), and at the end
    a JSON line with every ack latency (from the moment the record was due) and the
    log's sequencer counters."""
    log = disklesslog.open(
        url, backend="objects", storage_options=storage_options, maintenance="off"
    )
    writer = log.writer(producer=producer, linger_ms=linger_ms)
    latencies: list[float] = []
    with open(acked_path, "a", encoding="ascii") as acked:
        Path(gate, f"{os.getpid()}").touch()
        while len(os.listdir(gate)) < parties:
            time.sleep(0.01)
        start = time.monotonic()
        futures = []
        for index in range(count):
            due = start + index / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            future = writer.append(stream, value_of(producer, index))

            def done(future: Any, index: int = index, due: float = due) -> None:
                if future.exception() is not None:
                    return  # raised below, by result()
                latencies.append(time.monotonic() - due)
                acked.write(f"{index}\n")
                acked.flush()

            future.add_done_callback(done)
            futures.append(future)
        writer.flush()
        for future in futures:
            future.result()  # raises what the writer could not store
        writer.close()
        metrics = log.metrics()
        log.close()
        acked.write(
            json.dumps(
                {
                    "latencies": latencies,
                    "metrics": {k: v for k, v in metrics.items() if k.startswith("sequencer_")},
                }
            )
            + "\n"
        )
