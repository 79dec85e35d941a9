"""Fixtures of the fault suite."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory (``/dev/shm``) where there is one, else ``tmp_path``: the
    corruption fuzzing rewrites and reopens thousands of small files, which costs ten
    times as much on a disk as in tmpfs (and fsync is free there)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="disklesslog-faults-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
