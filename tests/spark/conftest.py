"""Fixtures of the Spark tests: one local SparkSession per test process, and logs on each
backend with the data source options that reach them.

The session is session-scoped because a JVM takes ~25 s to start; ``tests/conftest.py``
puts every test marked ``spark`` on one xdist worker, so a run starts one JVM. Spark's
Python workers must run this interpreter (the venv's, with pyarrow and disklesslog):
``PYSPARK_PYTHON`` is set before the session starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_logs import SparkLog


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``local[2]`` SparkSession: UI and progress bars off, 2 shuffle partitions (the
    default 200 makes every small groupBy schedule 200 tasks). ``local[2,2]``: a failed
    task is tried twice, as on a cluster (the write tests fail a first attempt)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("disklesslog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _segments(path: Path) -> SparkLog:
    url = str(path / "log")
    return SparkLog(url, {"url": url}, {"fsync": "never"})


def _file_objects(path: Path) -> SparkLog:
    """file:// objects sequenced by SQLite (the default for local object logs)."""
    url = f"file://{path}/objects"
    return SparkLog(url, {"url": url, "backend": "objects"}, {"backend": "objects"})


@pytest.fixture(params=[_segments, _file_objects], ids=["segments", "file-objects"])
def spark_log(request: pytest.FixtureRequest, tmp_path: Path) -> SparkLog:
    """A new log on each backend: local segments, and ``file://`` objects + SQLite."""
    made: SparkLog = request.param(tmp_path)
    return made
