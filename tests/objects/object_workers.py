"""Child-process code for the object backend's multi-process tests (spawn-imported)."""

from __future__ import annotations

import threading

import disklesslog

STREAMS = ("a", "b", "c")


def two_writers(
    url: str, process: int, per_writer: int, sequencer: str | None = None
) -> list[tuple[str, int, bytes]]:
    """Two writers (threads) of this process append ``per_writer`` records each, spread
    over three streams; returns every acknowledged (stream, offset, value)."""
    acked: list[tuple[str, int, bytes]] = []
    lock = threading.Lock()

    with disklesslog.open(url, backend="objects", sequencer=sequencer) as log:

        def run(writer_no: int) -> None:
            with log.writer(linger_ms=2) as writer:
                pending = []
                for seq in range(per_writer):
                    stream = STREAMS[seq % 3]
                    value = b"p%d-w%d-%06d" % (process, writer_no, seq)
                    pending.append((stream, value, writer.append(stream, value)))
                writer.flush()
                with lock:
                    acked.extend((s, f.result(), v) for s, v, f in pending)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return acked


def open_new_and_append(url: str, tag: int) -> int:
    with disklesslog.open(url, backend="objects") as log:
        return log.stream("s").append(b"%d" % tag)


def take_over_producer(url: str, sequencer: str | None, producer: str, value: bytes) -> int:
    """Start a new instance of a named producer (fencing every older one) and append."""
    with (
        disklesslog.open(url, backend="objects", sequencer=sequencer) as log,
        log.writer(producer=producer, linger_ms=0) as writer,
    ):
        return writer.append("s", value).result()
