"""What the Spark tests know about a log: how to open it, and the data source options
that reach it (imported as ``spark_logs``, like the other test helper modules)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import disklesslog
from disklesslog import AbstractLog


@dataclass
class SparkLog:
    """A log for a Spark test: how the test opens it, and the options Spark needs."""

    url: str
    options: dict[str, str]
    open_options: dict[str, Any] = field(default_factory=dict)

    def open(self) -> AbstractLog:
        return disklesslog.open(self.url, **self.open_options)

    def read(self, spark: Any, **options: str) -> Any:
        """``spark.read.format("disklesslog")`` with this log's options and ``options``."""
        return spark.read.format("disklesslog").options(**self.options, **options).load()

    def read_stream(self, spark: Any, **options: str) -> Any:
        return spark.readStream.format("disklesslog").options(**self.options, **options).load()
