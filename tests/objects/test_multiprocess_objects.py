"""Many processes, many writers, one shared objects log on file://, with every sequencer
that processes can share: SQLite, the object-store sequencer, PostgreSQL."""

from __future__ import annotations

import multiprocessing
import re
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from object_workers import STREAMS, two_writers

import disklesslog
from disklesslog import ProducerFenced

SPAWN = multiprocessing.get_context("spawn")
_VALUE = re.compile(rb"p(\d+)-w(\d+)-(\d+)")


SequencerFor = Callable[[Path], "str | None"]
"""A test's sequencer URL for a log in a directory (None: the log's default, SQLite)."""


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("objectstore", id="objectstore"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def sequencer_for(request: pytest.FixtureRequest) -> Iterator[SequencerFor]:
    if request.param == "sqlite":
        yield lambda path: None
    elif request.param == "objectstore":
        yield lambda path: "objectstore://"
    else:
        from disklesslog.testing.servers.postgres import drop_schema

        server = request.getfixturevalue("postgres_server")
        schemas: list[str] = []

        def postgres(path: Path) -> str:
            schemas.append(f"t_{uuid.uuid4().hex}")
            return f"{server}?schema={schemas[-1]}"

        yield postgres
        for schema in schemas:
            drop_schema(server, schema)


def _race(
    pool: ProcessPoolExecutor, url: str, sequencer: str | None, processes: int, per_writer: int
) -> None:
    futures = [pool.submit(two_writers, url, p, per_writer, sequencer) for p in range(processes)]
    acked = [entry for f in futures for entry in f.result(timeout=300)]
    assert len(acked) == processes * 2 * per_writer
    with disklesslog.open(url, backend="objects", sequencer=sequencer) as log:
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


def _rounds(tmp_path: Path, sequencer_for: SequencerFor, rounds: int, per_writer: int) -> None:
    with ProcessPoolExecutor(4, mp_context=SPAWN) as pool:
        for round_no in range(rounds):
            path = tmp_path / f"round-{round_no}"
            _race(pool, f"file://{path}/log", sequencer_for(path), 4, per_writer)


def test_four_processes_with_two_writers_each(tmp_path: Path, sequencer_for: SequencerFor) -> None:
    _rounds(tmp_path, sequencer_for, rounds=8, per_writer=60)


@pytest.mark.slow
def test_four_processes_with_two_writers_each_many_rounds(
    tmp_path: Path, sequencer_for: SequencerFor
) -> None:
    _rounds(tmp_path, sequencer_for, rounds=40, per_writer=60)


def test_four_processes_with_two_writers_each_many_records(
    tmp_path: Path, sequencer_for: SequencerFor
) -> None:
    _rounds(tmp_path, sequencer_for, rounds=1, per_writer=600)


@pytest.mark.slow
def test_four_processes_with_two_writers_each_repeatedly(
    tmp_path: Path, sequencer_for: SequencerFor
) -> None:
    _rounds(tmp_path, sequencer_for, rounds=100, per_writer=300)


def test_many_processes_create_one_new_object_log_at_once(tmp_path: Path) -> None:
    from object_workers import open_new_and_append

    with ProcessPoolExecutor(8, mp_context=SPAWN) as pool:
        pool.submit(int).result()  # start the workers before the race
        for attempt in range(15):
            url = f"file://{tmp_path}/new-{attempt}"
            futures = [pool.submit(open_new_and_append, url, t) for t in range(8)]
            assert sorted(f.result(timeout=60) for f in futures) == list(range(8))


def test_a_producer_fenced_from_another_process(
    tmp_path: Path, sequencer_for: SequencerFor
) -> None:
    """A writer whose named producer was started again in another process gets
    ProducerFenced on its next flush; its records never become visible and its object
    is recorded for garbage collection."""
    from object_workers import take_over_producer

    url = f"file://{tmp_path}/log"
    sequencer = sequencer_for(tmp_path)
    with disklesslog.open(url, backend="objects", sequencer=sequencer) as log:
        zombie = log.writer(producer="ingest", linger_ms=60_000)
        first = zombie.append("s", b"first")
        zombie.flush()
        assert first.result() == 0
        with ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
            offset = pool.submit(take_over_producer, url, sequencer, "ingest", b"second")
            assert offset.result(timeout=120) == 1
        late = zombie.append("s", b"zombie")
        with pytest.raises(ProducerFenced):
            zombie.flush()
        with pytest.raises(ProducerFenced):
            late.result()
        with pytest.raises(ProducerFenced):  # and it stays fenced: appends fail at once
            zombie.append("s", b"zombie again")
        assert [r.value for r in log.stream("s").read()] == [b"first", b"second"]
        orphans = log.sequencer.objects_to_delete(0)  # type: ignore[attr-defined]
        assert len(orphans) == 1
        assert (tmp_path / "log" / orphans[0]).exists()  # left for the garbage collector
