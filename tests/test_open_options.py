"""``disklesslog.open`` checks option names against the backends' registry before
anything is created: a misspelt option is refused with the valid names of both kinds
(the backend's log options and the stream settings) and the closest match."""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import pytest

import disklesslog
from disklesslog import ConfigError
from disklesslog.objects import OPTIONS as OBJECT_OPTIONS
from disklesslog.urls import log_options


def _listed(message: str, names: frozenset[str]) -> list[str]:
    return sorted(name for name in names if name not in message)


def test_a_misspelt_log_option_names_the_closest_and_lists_both_kinds(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with pytest.raises(ConfigError, match="'fsinc': did you mean 'fsync'") as caught:
        disklesslog.open(path, fsinc=True)
    message = str(caught.value)
    assert _listed(message, log_options()["segments"]) == []
    assert _listed(message, disklesslog.StreamConfig.field_names()) == []
    assert not path.exists()  # refused before anything was created


def test_a_misspelt_stream_setting_names_the_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'retension_ms': did you mean 'retention_ms'"):
        disklesslog.open(tmp_path / "log", retension_ms=1000)


def test_several_unknown_options_are_all_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown options 'compresion', 'zzz'") as caught:
        disklesslog.open(tmp_path / "log", zzz=1, compresion="zstd")
    assert "did you mean 'compression'" in str(caught.value)


def test_object_logs_list_their_own_options() -> None:
    with pytest.raises(ConfigError, match="did you mean 'retry_deadline_ms'") as caught:
        disklesslog.open("memory://misspelt-option", retry_deadline=1000)
    message = str(caught.value)
    assert _listed(message, log_options()["objects"]) == []
    assert "fsync" not in message  # a local log's option is not offered here


def test_an_option_of_the_other_backend_says_which_kind_of_log_takes_it(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="object-storage logs"):
        disklesslog.open(tmp_path / "log", sequencer="memory://")
    with pytest.raises(ConfigError, match=r"local \(segment-file\) logs only"):
        disklesslog.open("memory://other-kind", fsync="always")


def test_every_registered_object_option_is_accepted() -> None:
    """The registry lists only options the factory takes (the segments backend's list
    is its signature): each one, given at once, opens a log."""
    root = f"every-option-{uuid.uuid4().hex}"
    values = {
        "cache": None,
        "create": True,
        "maintenance": "off",
        "maintenance_interval_ms": 1000,
        "producer_expiration_ms": 1000,
        "retry_deadline_ms": 1000,
        "sequencer": "memory://",  # an unnamed in-memory sequencer: this log's own
        "storage_options": {},
    }
    assert set(values) == set(OBJECT_OPTIONS)
    try:
        with disklesslog.open(f"memory://{root}", backend="objects", **values) as log:
            log.stream("s").append(b"x")
            assert [r.value for r in log.stream("s").read()] == [b"x"]
    finally:
        fsspec.filesystem("memory").rm(f"/{root}", recursive=True)
