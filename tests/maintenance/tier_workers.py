"""Child processes of the tiering tests: ``python tier_workers.py MODE LOG OPTIONS_JSON [ARG]``.

Modes:

``tier``
    open the log, print ``ready``, run ``log.tier()`` once, print ``done`` (the crash
    test kills it somewhere in between).
``dump``
    open the log (never with ``tier_url``: it must be found in the log), print every
    record of every stream as JSON lines ``[stream, offset, timestamp, value]``.
``write``
    append ARG records to stream ``s`` in small batches; print ``ack OFFSET VALUE`` per
    record once its batch returned.
``read``
    read stream ``s`` from its start offset again and again until the file ARG exists;
    fail on anything but ``OffsetOutOfRange`` (a start that moved under the reader); print
    ``seen OFFSET VALUE`` for every record, once per offset, and ``reads N`` at the end.
``maintain``
    tier, apply retention and collect garbage (grace from OPTIONS ``grace``) in a loop
    until the file ARG exists.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time

import disklesslog


def _open(directory: str, options: dict[str, object]) -> disklesslog.Log:
    return disklesslog.open(directory, create=False, **{"maintenance": "off", **options})


def tier(directory: str, options: dict[str, object]) -> None:
    log = _open(directory, options)
    print("ready", flush=True)
    log.tier()
    print("done", flush=True)
    log.close()


def dump(directory: str, options: dict[str, object]) -> None:
    with _open(directory, options) as log:
        for name in log.streams():
            for record in log.stream(name).read():
                print(json.dumps([name, record.offset, record.timestamp, record.value.hex()]))


def write(directory: str, options: dict[str, object], count: int) -> None:
    with _open(directory, options) as log:
        stream = log.stream("s")
        writer_id = os.getpid()
        for first in range(0, count, 5):
            values = [b"w%d-%d-" % (writer_id, i) + b"." * 150 for i in range(first, first + 5)]
            offsets = stream.append_batch(values)
            for offset, value in zip(offsets, values):
                print(f"ack {offset} {value.hex()}")
        sys.stdout.flush()


def ready(stop_file: str) -> None:
    """Tell the test this process is running (``<stop>.ready-<pid>``): it starts the
    writers only then, so that reads and maintenance overlap the writes even when
    spawned interpreters start slowly."""
    open(f"{stop_file}.ready-{os.getpid()}", "w").close()


def read(directory: str, options: dict[str, object], stop_file: str) -> None:
    seen: dict[int, bytes] = {}
    reads = 0
    with _open(directory, options) as log:
        stream = log.stream("s")
        ready(stop_file)
        while not os.path.exists(stop_file):
            try:
                previous = None
                for record in stream.read(stream.start_offset):
                    if previous is not None and record.offset != previous + 1:
                        raise AssertionError(f"offset {record.offset} after {previous}")
                    previous = record.offset
                    known = seen.setdefault(record.offset, record.value)
                    if known != record.value:
                        raise AssertionError(f"offset {record.offset} changed its value")
                reads += 1
            except disklesslog.OffsetOutOfRange:
                continue  # the start moved (retention) while reading: start again
    for offset, value in sorted(seen.items()):
        print(f"seen {offset} {value.hex()}")
    print(f"reads {reads}", flush=True)


def maintain(directory: str, options: dict[str, object], stop_file: str) -> None:
    grace = float(options.pop("grace"))  # type: ignore[arg-type]
    rounds = 0
    with _open(directory, options) as log:
        ready(stop_file)
        while not os.path.exists(stop_file):
            log.tier()
            log.apply_retention()
            log.collect_garbage(grace_seconds=grace)
            rounds += 1
            time.sleep(0.01)
    print(f"rounds {rounds}", flush=True)


def main() -> None:
    # The test sends SIGUSR1 to a child that overstays, to see where it is stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    mode, directory, options_json = sys.argv[1:4]
    options = json.loads(options_json)
    if mode == "tier":
        tier(directory, options)
    elif mode == "dump":
        dump(directory, options)
    elif mode == "write":
        write(directory, options, int(sys.argv[4]))
    elif mode == "read":
        read(directory, options, sys.argv[4])
    elif mode == "maintain":
        maintain(directory, options, sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
