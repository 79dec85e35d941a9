"""Diagnostics behind the goals docs/benchmarks.md reports as not met.

    .venv/bin/python benchmarks/probes.py            all probes
    .venv/bin/python benchmarks/probes.py packb      one of: packb, append, writer, pagecache,
                                                     reopen, streams, busythread

``packb``   the cost of ``msgpack.packb`` on a 1,000 x 1 KiB batch body (what
            ``format.encode_batch`` does) against a pre-sized or reused ``msgpack.Packer``,
            with the minor page faults each incurs.
``append``  where the time of one ``Stream.append`` goes: the encoding, the store's append
            path, and the same five system calls made bare.
``writer``  ``Writer`` throughput with the garbage collector on and off.
``pagecache`` the same 300 MB buffered write (then delete), six times in a row: on a VM that
            returns freed memory to its host the first is slow, the next ones are not.
``reopen``  what an append to a parked stream (``max_open_streams``) adds: ``Stream.append``
            to an open stream and to one parked before each append, and the append's five
            system calls on open files against the same with both files opened (and
            fstat'ed) before and closed after, as parking and reopening does.
``streams`` 100,000 streams of a local log, each appended to twice and read back, in
            this process under ``ulimit -n 1024`` (minutes: creating the directories).
``busythread`` what a busy thread of the same process (as maintenance is) costs a writer:
            ``Stream.append`` on an object log (object-store sequencer, ``file://`` in
            ``$TMPDIR``) for 5 s alone, then beside a thread spinning in Python for
            10%, 25% and 50% of every 100 ms.

Each number is the best of 5 timed loops (``writer``: one loop per setting, 3 times).
"""

from __future__ import annotations

import fcntl
import gc
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack

import disklesslog
from disklesslog.format import encode_record
from disklesslog.segments.segment import ENTRY_PREFIX


def _best(loop: Callable[[], None], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        loop()
        best = min(best, time.perf_counter() - start)
    return best


def packb() -> None:
    values = [os.urandom(1024) for _ in range(1000)]
    body = [None, None, None, values, None]  # the five columns encode_batch packs
    reused = msgpack.Packer(use_bin_type=True)
    calls = 200
    variants: list[tuple[str, Callable[[], object]]] = [
        ("msgpack.packb (as encode_batch)", lambda: msgpack.packb(body, use_bin_type=True)),
        (
            "Packer(buf_size=2 MiB).pack",
            lambda: msgpack.Packer(use_bin_type=True, buf_size=2 << 20).pack(body),
        ),
        ("one Packer, reused", lambda: reused.pack(body)),
    ]
    for label, pack in variants:
        pack()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

        def loop(pack: Callable[[], object] = pack) -> None:
            for _ in range(calls):
                pack()

        seconds = _best(loop)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        print(
            f"  {label:34} {seconds / calls * 1e3:6.3f} ms, "
            f"{faults / (5 * calls):4.0f} minor page faults per 1 MB batch"
        )


def append() -> None:
    n = 50_000
    values = [os.urandom(100) for _ in range(1000)]
    with tempfile.TemporaryDirectory() as tmp:
        log = disklesslog.open(Path(tmp) / "log", fsync="never")
        try:
            stream = log.create_stream("s")
            _ = stream.end_offset
            store = log._stores["s"]  # type: ignore[attr-defined]
            batches = [encode_record(values[i % 1000]) for i in range(n)]

            def encode() -> None:
                for i in range(n):
                    encode_record(values[i % 1000])

            def store_append() -> None:
                for batch in batches:
                    store.append([batch])

            def stream_append() -> None:
                add = stream.append
                for i in range(n):
                    add(values[i % 1000])

            fd = os.open(Path(tmp) / "raw", os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            lock = os.open(Path(tmp) / "lock", os.O_RDWR | os.O_CREAT, 0o644)
            prefixes = [ENTRY_PREFIX.pack(i) for i in range(1000)]

            def five_syscalls() -> None:
                for i in range(n):
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    os.pread(lock, 48, 0)
                    os.lseek(fd, 0, os.SEEK_END)
                    os.writev(fd, (prefixes[i % 1000], batches[i].data))
                    fcntl.flock(lock, fcntl.LOCK_UN)

            def one_write() -> None:
                for i in range(n):
                    os.write(fd, batches[i].data)

            rows = [
                ("format.encode_record", encode),
                ("StreamStore.append([batch]) (lock ... unlock)", store_append),
                ("Stream.append (everything)", stream_append),
                ("the 5 system calls alone (flock pread lseek writev flock)", five_syscalls),
                ("one os.write", one_write),
            ]
            for label, loop in rows:
                print(f"  {label:58} {_best(loop) / n * 1e6:6.2f} us per record")
            os.close(fd)
            os.close(lock)
        finally:
            log.close()


def writer() -> None:
    n = 100_000
    values = [os.urandom(100) for _ in range(1000)]
    with tempfile.TemporaryDirectory() as tmp, disklesslog.open(tmp) as log:
        log.create_stream("s")
        for _ in range(3):
            for enabled in (True, False):
                if enabled:
                    gc.enable()
                else:
                    gc.disable()
                with log.writer() as w:
                    start = time.perf_counter()
                    for i in range(n):
                        w.append("s", values[i % 1000])
                    w.flush()
                    rate = n / (time.perf_counter() - start)
                gc.enable()
                print(
                    f"  Writer, 1 stream, gc {'on ' if enabled else 'off'}: {rate:9,.0f} records/s"
                )


def pagecache() -> None:
    chunk = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f"
        times = []
        for _ in range(6):
            start = time.perf_counter()
            with open(path, "ab") as f:
                for _ in range(300):
                    f.write(chunk)
                f.flush()
            times.append(time.perf_counter() - start)
            path.unlink()
        print("  300 MB f.write + flush: " + ", ".join(f"{t:.3f} s" for t in times))


def reopen() -> None:
    n = 20_000
    value = os.urandom(100)
    with tempfile.TemporaryDirectory() as tmp:
        log = disklesslog.open(Path(tmp) / "log", fsync="never")
        try:
            stream = log.create_stream("s")
            _ = stream.end_offset
            store = log._stores["s"]  # type: ignore[attr-defined]

            def open_append() -> None:
                for _ in range(n):
                    stream.append(value)

            def parked_append() -> None:
                for _ in range(n):
                    store.park()
                    stream.append(value)

            state = os.path.join(tmp, "state")
            active = os.path.join(tmp, "active")
            with open(state, "wb") as f:
                f.write(bytes(48))
            entry = (ENTRY_PREFIX.pack(0), encode_record(value).data)

            def calls(lock: int, fd: int) -> None:
                fcntl.flock(lock, fcntl.LOCK_EX)
                os.pread(lock, 48, 0)
                os.lseek(fd, 0, os.SEEK_END)
                os.writev(fd, entry)
                fcntl.flock(lock, fcntl.LOCK_UN)

            lock = os.open(state, os.O_RDWR)
            fd = os.open(active, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)

            def open_calls() -> None:
                for _ in range(n):
                    calls(lock, fd)

            def reopened_calls() -> None:
                for _ in range(n):
                    one = os.open(state, os.O_RDWR)
                    two = os.open(active, os.O_RDWR | os.O_APPEND)
                    os.fstat(one)
                    calls(one, two)
                    os.close(two)
                    os.close(one)

            rows = [
                ("Stream.append, the stream open", open_append),
                ("Stream.append, the stream parked before each", parked_append),
                ("the 5 system calls, files open", open_calls),
                ("the 5 system calls, files opened and closed around them", reopened_calls),
            ]
            for label, loop in rows:
                print(f"  {label:58} {_best(loop) / n * 1e6:6.2f} us per record")
            os.close(fd)
            os.close(lock)
        finally:
            log.close()


def streams(count: int = 100_000) -> None:
    limit = 1024
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    with tempfile.TemporaryDirectory() as tmp:
        began = time.monotonic()
        most = 0
        with disklesslog.open(tmp, fsync="never") as log:
            for round_no in range(2):
                for i in range(count):
                    assert log.stream(f"s{i}").append(b"%d-%d" % (round_no, i)) == round_no
                    if i % 1000 == 0:
                        most = max(most, len(os.listdir("/proc/self/fd")))
                print(f"  round {round_no + 1} of appends done at {time.monotonic() - began:.0f} s")
            for i in range(count):
                values = [r.value for r in log.stream(f"s{i}").read()]
                assert values == [b"0-%d" % i, b"1-%d" % i], (i, values)
        print(
            f"  {count:,} streams written twice and read back under ulimit -n {limit} in "
            f"{time.monotonic() - began:.0f} s; at most {most} descriptors open"
        )


def busythread() -> None:
    import threading

    with tempfile.TemporaryDirectory() as directory:
        log = disklesslog.open(
            f"file://{directory}/log",
            backend="objects",
            sequencer="objectstore://",
            maintenance="off",
        )
        names = [log.create_stream(f"s{i}") for i in range(10)]

        def appends_per_second(seconds: float = 5.0) -> float:
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                names[count % 10].append(b"v" * 100)
                count += 1
            return count / (time.perf_counter() - start)

        def spin(share: float, stop: threading.Event) -> None:
            while not stop.is_set():
                began = time.perf_counter()
                while time.perf_counter() - began < 0.1 * share:
                    sum(range(1000))
                time.sleep(0.1 * (1 - share))

        appends_per_second(2.0)  # warm up
        alone = appends_per_second()
        print(f"  alone: {alone:,.0f} appends/s")
        for share in (0.1, 0.25, 0.5):
            stop = threading.Event()
            thread = threading.Thread(target=spin, args=(share, stop))
            thread.start()
            rate = appends_per_second()
            stop.set()
            thread.join()
            print(
                f"  beside a thread busy {share:.0%}: {rate:,.0f} appends/s ({rate / alone:.2f}x)"
            )
        log.close()


PROBES = {
    "busythread": busythread,
    "packb": packb,
    "append": append,
    "writer": writer,
    "pagecache": pagecache,
    "reopen": reopen,
    "streams": streams,
}


def main(argv: list[str]) -> int:
    names = argv or list(PROBES)
    unknown = [name for name in names if name not in PROBES]
    if unknown:
        print(f"unknown probe(s) {unknown}; choose from {list(PROBES)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"{name}:")
        PROBES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
