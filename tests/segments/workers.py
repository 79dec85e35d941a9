"""Code that runs in child processes for the multi-process and crash tests.

Run as a script for the crash test (``python workers.py crash DIR ROUND MODE SEED``);
imported by ``multiprocessing`` (spawn) for the concurrency tests.
"""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import disklesslog

# Small segments and a dense index, so crashes and races hit rolls and index writes.
STREAM_CONFIG = {"segment_bytes": 4096, "index_interval_bytes": 256}


def value(round_no: int, seq: int) -> bytes:
    """A record value that names its round and sequence number, with varied padding."""
    padding = b"." * ((seq * 7919 + round_no * 31) % 300)
    return b"r%04d-s%08d-" % (round_no, seq) + padding


def matches(record_value: bytes, round_no: int, seq: int) -> bool:
    """Whether a stored value is what ``value`` (plus any "large" mode suffix) produced."""
    return record_value.rstrip(b"#") == value(round_no, seq)


def parse(record_value: bytes) -> tuple[int, int]:
    return int(record_value[1:5]), int(record_value[7:15])


def crash_child(directory: str, round_no: int, mode: str, seed: int, *tear: str) -> None:
    """Append forever and acknowledge each append on stdout once it has returned. With
    ``tear`` (``REPORT CALL``), the append at ``os.writev`` call number ``CALL`` writes
    only part of its entry and waits for the SIGKILL (tests/kill_points.py)."""
    rng = random.Random(seed)
    log = disklesslog.open(directory, fsync="always")
    stream = log.create_stream("s", **STREAM_CONFIG)
    if tear:
        import kill_points  # on the path of crash tests only (kill_points.child_env)

        kill_points.arm(tear[0], int(tear[1]), calls=("writev",), tear=True)
    out = sys.stdout
    lock = threading.Lock()

    def ack(offset: int, count: int, seq: int) -> None:
        with lock:
            out.write(f"ack {offset} {count} {round_no} {seq}\n")
            out.flush()

    out.write("ready\n")
    out.flush()
    seq = 0
    if mode == "writer":
        writer = log.writer(linger_ms=1)
        while True:
            future = writer.append("s", value(round_no, seq))
            future.add_done_callback(
                lambda f, s=seq: ack(f.result(), 1, s) if f.exception() is None else None
            )
            seq += 1
            if seq % 50 == 0:
                time.sleep(0.001)
    while True:
        if mode == "large":  # big entries, so a kill can land in the middle of a write
            count = rng.randint(50, 300)
            big = [value(round_no, seq + i) + b"#" * 1000 for i in range(count)]
            offsets = stream.append_batch(big)
            ack(offsets[0], count, seq)
            seq += count
            time.sleep(0.005)  # paced: the checker re-reads the whole stream every round
        elif mode == "append" or (mode == "mixed" and rng.random() < 0.5):
            ack(stream.append(value(round_no, seq)), 1, seq)
            seq += 1
        else:
            count = rng.randint(1, 40)
            offsets = stream.append_batch([value(round_no, seq + i) for i in range(count)])
            ack(offsets[0], count, seq)
            seq += count


def append_worker(directory: str, tag: int, count: int, fsync: str) -> None:
    """Append ``count`` records tagged with ``tag``, singly and in small batches."""
    rng = random.Random(tag)
    with disklesslog.open(directory, fsync=fsync) as log:
        stream = log.create_stream("s", **STREAM_CONFIG)
        seq = 0
        while seq < count:
            n = min(count - seq, rng.choice([1, 1, 1, 5, 20]))
            if n == 1:
                stream.append(b"%d:%d" % (tag, seq))
            else:
                stream.append_batch([b"%d:%d" % (tag, seq + i) for i in range(n)])
            seq += n


def prefix_reader(directory: str, expected_total: int, timeout: float) -> str:
    """Read the stream repeatedly until it holds ``expected_total`` records; return a
    description of the first inconsistency seen, or "" if every read was consistent."""
    deadline = time.monotonic() + timeout
    with disklesslog.open(directory, fsync="never") as log:
        stream = log.stream("s")
        while time.monotonic() < deadline:
            try:
                records = list(stream.read())
            except disklesslog.StreamNotFound:
                continue
            offsets = [r.offset for r in records]
            if offsets != list(range(len(records))):
                return f"offsets not dense: {offsets[:10]}"
            seen: dict[bytes, int] = {}
            for r in records:
                tag, seq = r.value.split(b":")
                if int(seq) != seen.get(tag, -1) + 1:
                    return f"process {tag!r} out of order at offset {r.offset}"
                seen[tag] = int(seq)
            if len(records) >= expected_total:
                return ""
    return "timed out"


def run_and_kill(
    args: list[str], delay: float, until: Callable[[], bool] | None = None
) -> list[bytes]:
    """Run ``python workers.py ARGS``, wait for its "ready" line, collect what it prints
    for ``delay`` seconds (with ``until``: until ``until()`` is true, which must happen
    within ``delay`` seconds), SIGKILL it, and return the complete lines it printed (a
    partial last line was cut by the kill: not an acknowledgement)."""
    env = None
    if until is not None:
        import kill_points  # in the test process, tests/ is on the path

        env = kill_points.child_env()
    child = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None
    ready = child.stdout.readline()
    assert ready == b"ready\n", ready
    data = b""
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ)
    os.set_blocking(child.stdout.fileno(), False)
    deadline = time.monotonic() + delay
    while (left := deadline - time.monotonic()) > 0:
        if until is not None and until():
            break
        if selector.select(left if until is None else min(left, 0.005)):
            data += child.stdout.read() or b""
    else:
        assert until is None, f"the child did not get there in {delay} s"
    child.send_signal(signal.SIGKILL)
    child.wait()
    data += child.stdout.read() or b""
    selector.close()
    child.stdout.close()
    return data.split(b"\n")[:-1]


TXN_STREAMS = ["s0", "s1", "s2", "s3"]


def txn_value(k: int) -> bytes:
    """Transaction ``k``'s record (the same in every stream, padded so appends take time)."""
    return b"t%08d-" % k + b"x" * 2000


def txn_child(directory: str, seed: int, *armed: str) -> None:
    """Commit transactions forever (transaction k puts one record in each of
    TXN_STREAMS, staged in two parts), acknowledging each once its commit returned.
    With ``armed`` (``REPORT CALL``), wait for the SIGKILL at file call number ``CALL``
    made while a commit appends its batches (tests/kill_points.py): in this loop only a
    commit's roll-forward calls ``with_store``, and it does so while the commit's notes
    file exists, so the kill leaves an interrupted commit for the next open to finish."""
    rng = random.Random(seed)
    log = disklesslog.open(directory, fsync="always")  # recovers an interrupted commit
    k = len({r.value for r in log.stream(TXN_STREAMS[0]).read()})
    if armed:
        import kill_points  # on the path of crash tests only (kill_points.child_env)

        kill_points.arm(armed[0], int(armed[1]), inside="with_store")
        kill_points.marking(type(log), "with_store")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        parts = []
        for half in (TXN_STREAMS[:2], TXN_STREAMS[2:]):
            stager = log.stager()
            for name in half:
                stager.append_batch(name, [txn_value(k)] * rng.randint(1, 3))
            parts.append(stager.finish())
        log.commit_transaction(f"t{k}", parts)
        sys.stdout.write(f"ack {k}\n")
        sys.stdout.flush()
        k += 1


def txn_reader(directory: str, seconds: float) -> None:
    """Watch the streams while transactions commit and crash: reading them in name order
    (the order a commit appends them), a later stream never shows fewer transactions
    than an earlier one showed, which a half-visible commit would. Exit 1 on a breach."""
    log = disklesslog.open(directory, fsync="always")
    deadline = time.monotonic() + seconds
    passes = held = 0

    def stop(*_: object) -> None:
        print(f"passes {passes} held {held}", flush=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    while time.monotonic() < deadline:
        seen = []
        for name in TXN_STREAMS:
            values = {r.value for r in log.stream(name).read()}
            seen.append(len(values))
        if seen != sorted(seen):
            print(f"breach: transactions seen per stream {seen}", flush=True)
            raise SystemExit(1)
        passes += 1
        held += bool(log.stream(TXN_STREAMS[-1]).info().details.get("pending_transactions"))
    print(f"passes {passes} held {held}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "crash":
        crash_child(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), *sys.argv[6:])
    elif sys.argv[1] == "txn":
        txn_child(sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
    elif sys.argv[1] == "txn-reader":
        txn_reader(sys.argv[2], float(sys.argv[3]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
