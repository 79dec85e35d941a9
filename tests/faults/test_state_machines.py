"""Hypothesis state machines of a stream and of a consumer group, against a model, on
every backend and sequencer.

The stream machine appends (one record, a batch, through a writer kept open across
steps), reads ranges, reads offsets, trims, asks ``offset_for_time``, reopens the log,
and deletes and re-creates a stream *from a second handle* (another open of the same
URL), checking every answer against a model of offsets, values and timestamps. The
consumer machine polls, commits, closes, resumes and starts new consumers of one group
while records are appended and trimmed, checking at-least-once delivery: after a
commit and a resume nothing before the committed position comes again and nothing
after it is skipped (but what a trim removed).

Runs are derandomized and use no example database, so CI reproduces them; the fast
suite runs few short examples, the slow one many long ones (and S3 via moto).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import disklesslog
from disklesslog import AbstractLog, DisklessLogError, OffsetOutOfRange

Opener = Callable[[], AbstractLog]
Backend = Callable[[Path, pytest.FixtureRequest], Opener]

STREAMS = ("s0", "s1")
T0 = 1_700_000_000_000


def _segments(path: Path, request: pytest.FixtureRequest) -> Opener:
    return lambda: disklesslog.open(path / "log", fsync="never")


def _memory(path: Path, request: pytest.FixtureRequest) -> Opener:
    url = f"memory://machines-{uuid.uuid4().hex[:12]}/log"
    return lambda: disklesslog.open(url)


def _sqlite(path: Path, request: pytest.FixtureRequest) -> Opener:
    return lambda: disklesslog.open(f"file://{path}/log", backend="objects")


def _objectstore(path: Path, request: pytest.FixtureRequest) -> Opener:
    return lambda: disklesslog.open(
        f"file://{path}/log", backend="objects", sequencer="objectstore://"
    )


def _postgres(path: Path, request: pytest.FixtureRequest) -> Opener:
    from disklesslog.testing.servers.postgres import drop_schema

    server = request.getfixturevalue("postgres_server")
    schema = f"machines_{uuid.uuid4().hex[:12]}"
    request.addfinalizer(lambda: drop_schema(server, schema))
    return lambda: disklesslog.open(
        f"file://{path}/log", backend="objects", sequencer=f"{server}?schema={schema}"
    )


def _s3(path: Path, request: pytest.FixtureRequest) -> Opener:
    from disklesslog.testing import create_bucket, s3_storage_options

    options = s3_storage_options(request.getfixturevalue("s3_server"))
    bucket = create_bucket("s3", options)
    return lambda: disklesslog.open(f"s3://{bucket}/log", storage_options=options)


BACKENDS = [
    pytest.param(_segments, id="segments"),
    pytest.param(_memory, id="memory"),
    pytest.param(_sqlite, id="sqlite"),
    pytest.param(_objectstore, id="objectstore-file"),
    pytest.param(_postgres, id="postgres", marks=pytest.mark.postgres),
]
SLOW_BACKENDS = [*BACKENDS, pytest.param(_s3, id="s3", marks=pytest.mark.s3)]

FAST = settings(
    # no shrinking in the fast suite: a failure prints its (longer) steps at once
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    max_examples=8,
    stateful_step_count=14,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
SLOW = settings(FAST, max_examples=40, stateful_step_count=30)

values = st.lists(st.binary(min_size=0, max_size=24), min_size=1, max_size=6)


# ------------------------------------------------------------------- stream


class StreamModel:
    """Records of one stream: ``(offset, value, timestamp)``, and its start offset."""

    def __init__(self) -> None:
        self.records: list[tuple[int, bytes, int]] = []
        self.start = 0
        self.end = 0

    def add(self, items: list[bytes], stamp: int) -> list[int]:
        offsets = list(range(self.end, self.end + len(items)))
        self.records.extend((o, v, stamp) for o, v in zip(offsets, items))
        self.end += len(items)
        return offsets

    def visible(self, start: int | None = None) -> list[tuple[int, bytes]]:
        first = self.start if start is None else start
        return [(o, v) for o, v, _ in self.records if o >= first]


class StreamMachine(RuleBasedStateMachine):
    backend: Backend
    path: Path
    request: pytest.FixtureRequest

    def __init__(self) -> None:
        super().__init__()
        path = self.path / uuid.uuid4().hex[:10]
        path.mkdir()
        self.open_log = type(self).backend(path, self.request)
        self.log = self.open_log()
        self.other = self.open_log()  # a second handle of the same log
        self.models = {name: StreamModel() for name in STREAMS}
        self.clock = T0
        self.writer: Any = None

    def _stamp(self) -> int:
        self.clock += 10
        return self.clock

    @initialize()
    def create(self) -> None:
        for name in STREAMS:
            self.log.create_stream(name)

    @rule(name=st.sampled_from(STREAMS), value=st.binary(max_size=24))
    def append(self, name: str, value: bytes) -> None:
        stamp = self._stamp()
        offset = self.log.stream(name).append(value, timestamp=stamp)
        assert [offset] == self.models[name].add([value], stamp)

    @rule(name=st.sampled_from(STREAMS), items=values)
    def append_batch(self, name: str, items: list[bytes]) -> None:
        stamp = self._stamp()
        offsets = self.log.stream(name).append_batch(items, timestamps=stamp)
        assert offsets == self.models[name].add(items, stamp)

    @rule(name=st.sampled_from(STREAMS), items=values)
    def writer_append(self, name: str, items: list[bytes]) -> None:
        """Through a writer kept open across steps (and across a re-creation of the
        stream from the other handle)."""
        if self.writer is None:
            self.writer = self.log.writer(linger_ms=1)
        stamp = self._stamp()
        futures = [self.writer.append(name, v, timestamp=stamp) for v in items]
        self.writer.flush()
        assert [f.result(timeout=30) for f in futures] == self.models[name].add(items, stamp)

    @rule(name=st.sampled_from(STREAMS), data=st.data())
    def read_range(self, name: str, data: st.DataObject) -> None:
        model = self.models[name]
        start = data.draw(st.integers(model.start, model.end), label="start")
        got = [(r.offset, r.value) for r in self.log.stream(name).read(start)]
        assert got == model.visible(start)

    @rule(name=st.sampled_from(STREAMS))
    def read_offsets(self, name: str) -> None:
        got = [o for batch in self.log.stream(name).read_offsets() for o in batch]
        assert got == [o for o, _ in self.models[name].visible()]

    @rule(name=st.sampled_from(STREAMS))
    def read_below_start(self, name: str) -> None:
        model = self.models[name]
        if model.start == 0:
            return
        with pytest.raises(OffsetOutOfRange):
            list(self.log.stream(name).read(model.start - 1))

    @rule(name=st.sampled_from(STREAMS), data=st.data())
    def trim(self, name: str, data: st.DataObject) -> None:
        model = self.models[name]
        before = data.draw(st.integers(model.start, model.end), label="before")
        self.log.stream(name).trim(before)
        model.start = max(model.start, before)

    @rule(name=st.sampled_from(STREAMS), delta=st.integers(-20, 400))
    def offset_for_time(self, name: str, delta: int) -> None:
        model = self.models[name]
        when = T0 + delta
        expected = next((o for o, _, ts in model.records if o >= model.start and ts >= when), None)
        assert self.log.stream(name).offset_for_time(when) == expected

    @rule()
    def reopen(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.log.close()
        self.log = self.open_log()

    @rule(name=st.sampled_from(STREAMS))
    def recreate_elsewhere(self, name: str) -> None:
        """Delete and create the stream again through the other handle; this handle
        (and its writer) must see the new, empty stream."""
        self.other.delete_stream(name)
        self.other.create_stream(name)
        self.models[name] = StreamModel()

    @invariant()
    def extent(self) -> None:
        for name, model in self.models.items():
            stream = self.log.stream(name)
            assert (stream.start_offset, stream.end_offset) == (model.start, model.end)
            assert self.other.stream(name).end_offset == model.end

    def teardown(self) -> None:
        for close in (
            getattr(self.writer, "close", None),
            self.log.close,
            self.other.close,
        ):
            if close is not None:
                with contextlib.suppress(DisklessLogError):
                    close()


# ----------------------------------------------------------------- consumer

GROUP = "machines"


class ConsumerMachine(RuleBasedStateMachine):
    backend: Backend
    path: Path
    request: pytest.FixtureRequest

    def __init__(self) -> None:
        super().__init__()
        path = self.path / uuid.uuid4().hex[:10]
        path.mkdir()
        self.log = type(self).backend(path, self.request)()
        self.values: dict[str, list[bytes]] = {name: [] for name in STREAMS}
        self.start = dict.fromkeys(STREAMS, 0)
        self.committed: dict[str, int] = {}
        self.position = dict.fromkeys(STREAMS, 0)
        self.consumer: Any = None

    @initialize()
    def create(self) -> None:
        for name in STREAMS:
            self.log.create_stream(name)
        self._new_consumer()

    def _new_consumer(self) -> None:
        self.consumer = self.log.consumer(GROUP, STREAMS, auto_commit_interval_ms=None)
        for name in STREAMS:  # resumes at the commit, or at the start (earliest)
            self.position[name] = max(self.committed.get(name, 0), self.start[name])

    @rule(name=st.sampled_from(STREAMS), items=values)
    def append(self, name: str, items: list[bytes]) -> None:
        self.log.stream(name).append_batch(items)
        self.values[name].extend(items)

    @rule(name=st.sampled_from(STREAMS), data=st.data())
    def trim(self, name: str, data: st.DataObject) -> None:
        end = len(self.values[name])
        before = data.draw(st.integers(self.start[name], end), label="before")
        self.log.stream(name).trim(before)
        self.start[name] = max(self.start[name], before)

    @precondition(lambda self: self.consumer is not None)
    @rule(limit=st.integers(1, 20))
    def poll(self, limit: int) -> None:
        got = self.consumer.poll(limit)
        assert len(got) <= limit
        for name, record in got:
            # the next record of its stream: nothing repeated, nothing skipped but
            # what a trim removed
            expected = max(self.position[name], self.start[name])
            assert record.offset == expected, (name, record.offset, expected)
            assert record.value == self.values[name][record.offset]
            self.position[name] = record.offset + 1

    @precondition(lambda self: self.consumer is not None)
    @rule()
    def commit(self) -> None:
        self.consumer.commit()
        self.committed = self.log.committed_offsets(GROUP)
        for name in STREAMS:  # what was delivered is committed, nothing more or less
            if self.position[name] > self.start[name]:
                assert self.committed.get(name) == self.position[name], (name, self.committed)
            elif name in self.committed:
                assert self.committed[name] <= self.position[name] or (
                    self.committed[name] <= self.start[name]
                ), (name, self.committed)

    @precondition(lambda self: self.consumer is not None)
    @rule()
    def close_and_resume(self) -> None:
        self.consumer.close(commit=False)
        self._new_consumer()

    @precondition(lambda self: self.consumer is not None)
    @rule()
    def second_consumer(self) -> None:
        """A new consumer of the group (the old one abandoned without closing)."""
        old = self.consumer
        self._new_consumer()
        old.close(commit=False)

    def teardown(self) -> None:
        if self.consumer is not None:
            self.consumer.close(commit=False)
        self.log.close()


def _run(
    machine: type[RuleBasedStateMachine],
    backend: Backend,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    config: settings,
) -> None:
    bound = type(
        machine.__name__,
        (machine,),
        {"backend": staticmethod(backend), "path": tmp_path, "request": request},
    )
    run_state_machine_as_test(bound, settings=config)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_machine(backend: Backend, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _run(StreamMachine, backend, tmp_path, request, FAST)


@pytest.mark.parametrize("backend", BACKENDS)
def test_consumer_machine(backend: Backend, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _run(ConsumerMachine, backend, tmp_path, request, FAST)


@pytest.mark.slow
@pytest.mark.parametrize("backend", SLOW_BACKENDS)
def test_stream_machine_long(
    backend: Backend, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _run(StreamMachine, backend, tmp_path, request, SLOW)


@pytest.mark.slow
@pytest.mark.parametrize("backend", SLOW_BACKENDS)
def test_consumer_machine_long(
    backend: Backend, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _run(ConsumerMachine, backend, tmp_path, request, SLOW)


@pytest.mark.parametrize("backend", BACKENDS)
def test_handles_follow_a_stream_recreated_elsewhere(
    backend: Backend, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The step sequence the stream machine found, kept as a fixed case: after another
    handle deletes and re-creates a stream, this handle's appends (``Stream.append``
    and a writer opened before) go to the new stream from offset 0."""
    open_log = backend(tmp_path, request)
    log, other = open_log(), open_log()
    try:
        log.create_stream("s0")
        writer = log.writer(linger_ms=1)
        log.stream("s0").append_batch([b"old"])
        writer.append("s0", b"old-2").result(timeout=30)
        other.delete_stream("s0")
        other.create_stream("s0")
        assert log.stream("s0").append(b"new") == 0
        assert writer.append("s0", b"new-2").result(timeout=30) == 1
        writer.close()
        assert [r.value for r in other.stream("s0").read()] == [b"new", b"new-2"]
    finally:
        log.close()
        other.close()
