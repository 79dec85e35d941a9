"""Placeholder for the write side of the data source (the ``spark-write`` branch replaces
this file): until then a write fails with a clear error instead of an ImportError."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from ..errors import DisklessLogError

__all__ = ["BatchWriter", "StreamWriter"]

_MESSAGE = "writing to disklesslog from Spark is not available in this build yet"


class BatchWriter(DataSourceWriter):
    """Batch writes (not available yet)."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        raise DisklessLogError(_MESSAGE)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        raise DisklessLogError(_MESSAGE)


class StreamWriter(DataSourceStreamWriter):
    """Streaming writes (not available yet)."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        raise DisklessLogError(_MESSAGE)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        raise DisklessLogError(_MESSAGE)
