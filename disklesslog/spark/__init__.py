"""disklesslog as a PySpark data source (Spark 4 Python Data Source API).

>>> import disklesslog.spark                                  # doctest: +SKIP
>>> disklesslog.spark.register(spark)
>>> spark.read.format("disklesslog").option("url", "/data/log").option("streams", "a").load()

Installing ``disklesslog[spark]`` also ships the top-level module ``pyspark_disklesslog``,
through which Spark finds the source by name without ``register``. See ``docs/spark.md``.
"""

from __future__ import annotations

from typing import Any

from ..errors import MissingDependencyError

try:
    import pyarrow  # noqa: F401 - reads and writes build Arrow batches
    from pyspark.errors import AnalysisException
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError(
        f"disklesslog.spark needs pyspark >= 4.0 and pyarrow ({exc}); "
        "pip install 'disklesslog[spark]'"
    ) from exc

from .maintain import maintain
from .source import DisklessLogDataSource

__all__ = ["DisklessLogDataSource", "maintain", "register"]


def register(spark: Any) -> None:
    """Register the ``disklesslog`` data source with ``spark`` (a ``SparkSession``), so
    ``spark.read.format("disklesslog")`` works in this session. A no-op where Spark
    already knows it: Spark 4.0 refuses to register a name it found through the
    ``pyspark_disklesslog`` module (``DATA_SOURCE_ALREADY_EXISTS``)."""
    try:
        spark.dataSource.register(DisklessLogDataSource)
    except AnalysisException as exc:
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
