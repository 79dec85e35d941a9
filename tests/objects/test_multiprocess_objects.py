"""Many processes, many writers, one shared objects log (file:// + SQLite sequencer)."""

from __future__ import annotations

import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from object_workers import STREAMS, two_writers

import disklesslog

SPAWN = multiprocessing.get_context("spawn")
_VALUE = re.compile(rb"p(\d+)-w(\d+)-(\d+)")


def _race(tmp_path: Path, processes: int, per_writer: int) -> None:
    url = f"file://{tmp_path}/log"
    with ProcessPoolExecutor(processes, mp_context=SPAWN) as pool:
        futures = [pool.submit(two_writers, url, p, per_writer) for p in range(processes)]
        acked = [entry for f in futures for entry in f.result(timeout=300)]
    assert len(acked) == processes * 2 * per_writer
    with disklesslog.open(url, backend="objects") as log:
        for stream in STREAMS:
            records = list(log.stream(stream).read())
            assert [r.offset for r in records] == list(range(len(records))), "offsets not dense"
            values = [r.value for r in records]
            assert len(set(values)) == len(values), "a record was stored twice"
            last: dict[tuple[int, int], int] = {}
            for value in values:
                match = _VALUE.fullmatch(value)
                assert match is not None
                writer = (int(match[1]), int(match[2]))
                seq = int(match[3])
                assert seq > last.get(writer, -1), f"writer {writer} out of order on {stream}"
                last[writer] = seq
            by_offset = dict(enumerate(values))
            for s, offset, value in acked:
                if s == stream:
                    assert by_offset.get(offset) == value, "an acknowledged record is missing"
        total = sum(log.stream(s).end_offset for s in STREAMS)
        assert total == len(acked)


def test_four_processes_with_two_writers_each(tmp_path: Path) -> None:
    _race(tmp_path, processes=4, per_writer=600)


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(5))
def test_four_processes_with_two_writers_each_repeatedly(tmp_path: Path, round_no: int) -> None:
    _race(tmp_path, processes=4, per_writer=3000)


def test_many_processes_create_one_new_object_log_at_once(tmp_path: Path) -> None:
    from object_workers import open_new_and_append

    with ProcessPoolExecutor(8, mp_context=SPAWN) as pool:
        pool.submit(int).result()  # start the workers before the race
        for attempt in range(15):
            url = f"file://{tmp_path}/new-{attempt}"
            futures = [pool.submit(open_new_and_append, url, t) for t in range(8)]
            assert sorted(f.result(timeout=60) for f in futures) == list(range(8))
