"""The sequencer contract (:class:`~disklesslog.testing.contracts.SequencerContract`) on
every sequencer: memory, SQLite, PostgreSQL and the object-store sequencer on local
files, in memory and on the S3, Azure and GCS emulators. Each class opens an empty
sequencer in a fresh directory with the contract's injected clock."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from disklesslog.sequencers import Sequencer
from disklesslog.sequencers.memory import MemorySequencer
from disklesslog.sequencers.sqlite import SqliteSequencer
from disklesslog.testing import create_bucket
from disklesslog.testing.contracts import FakeClock, SequencerContract
from disklesslog.testing.servers.azurite import azure_storage_options
from disklesslog.testing.servers.gcs import gcs_storage_options  # before gcsfs is imported
from disklesslog.testing.servers.s3 import s3_storage_options

_CLOUDS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "s3": ("s3_server", s3_storage_options),
    "az": ("azure_server", azure_storage_options),
    "gs": ("gcs_server", gcs_storage_options),
}
"""fsspec protocol -> (server fixture, storage options for its endpoint)."""


def _open_objectstore(
    fs_protocol: str, path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> Sequencer:
    """An object-store sequencer with a checkpoint every 3 entries (so the suite runs
    through checkpoints too). After the test, a second replica replays the same entries
    and checkpoints from storage and must reach exactly the same state."""
    import fsspec

    from disklesslog.sequencers.objectstore import ObjectStoreSequencer

    if fs_protocol in _CLOUDS:
        server, storage_options = _CLOUDS[fs_protocol]
        options = storage_options(request.getfixturevalue(server))
        fs = fsspec.filesystem(fs_protocol, **options, skip_instance_cache=True)
        root = f"{create_bucket(fs_protocol, options)}/sequencer"
    elif fs_protocol == "file":
        fs, root = fsspec.filesystem("file"), str(path / "sequencer")
    else:
        fs, root = fsspec.filesystem("memory"), f"/contract-{uuid.uuid4()}"

    def replica() -> ObjectStoreSequencer:
        return ObjectStoreSequencer(fs, root, clock=clock, checkpoint_every=3)

    first = replica()

    def same_on_replay() -> None:
        # The state the first replica built entry by entry as the test ran (caught up
        # with entries it did not write, even if the test closed it) must equal the
        # state a fresh replica builds from the newest checkpoint and the entries after.
        first._catch_up()
        with first._lock:
            built = first._replica.state.snapshot()
        assert replica().snapshot() == built
        if fs_protocol == "memory" and fs.exists(root):
            fs.rm(root, recursive=True)

    request.addfinalizer(same_on_replay)
    return first


class TestMemory(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        return MemorySequencer(clock=clock)


class TestSqlite(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        return SqliteSequencer(path / "meta.db", clock=clock)


class TestObjectstoreFile(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        return _open_objectstore("file", path, clock, request)


class TestObjectstoreMemory(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        return _open_objectstore("memory", path, clock, request)


# Through the real clients against the emulators (slow: each entry is an HTTP PUT).
@pytest.mark.s3
@pytest.mark.slow
class TestObjectstoreS3(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        return _open_objectstore("s3", path, clock, request)


@pytest.mark.azure
@pytest.mark.slow
class TestObjectstoreAzure(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        return _open_objectstore("az", path, clock, request)


@pytest.mark.gcs
@pytest.mark.slow
class TestObjectstoreGcs(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        return _open_objectstore("gs", path, clock, request)


@pytest.mark.postgres
class TestPostgres(SequencerContract):
    def open_sequencer(
        self, path: Path, clock: FakeClock, request: pytest.FixtureRequest
    ) -> Sequencer:
        """A sequencer in a fresh schema of the session's server, dropped after the test
        (the finalizer runs after the fixture has closed the sequencer)."""
        from disklesslog.sequencers.postgres import PostgresSequencer
        from disklesslog.testing.servers.postgres import drop_schema

        url = request.getfixturevalue("postgres_server")
        schema = f"t_{uuid.uuid4().hex}"
        request.addfinalizer(lambda: drop_schema(url, schema))
        return PostgresSequencer(f"{url}?schema={schema}", clock=clock)
