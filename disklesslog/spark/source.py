"""The ``disklesslog`` Python data source: what Spark instantiates for
``spark.read/readStream/write/writeStream.format("disklesslog")``.

The class only parses options and hands out readers and writers; it is pickled to
Spark's Python workers, so it holds the option strings and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from .options import parse_read_options
from .schema import read_schema

if TYPE_CHECKING:
    from .read import BatchReader
    from .stream import StreamReader

__all__ = ["DisklessLogDataSource"]


class DisklessLogDataSource(DataSource):
    """Reads and writes disklesslog streams from Spark, batch and streaming.

    Options are documented in ``docs/spark.md``; bad ones raise
    :class:`~disklesslog.ConfigError` when the query is defined.
    """

    @classmethod
    def name(cls) -> str:
        return "disklesslog"

    def schema(self) -> StructType:
        """The read schema (Kafka-like columns; ``headers`` with ``includeHeaders``; only
        those named by ``columns``)."""
        return read_schema(columns=parse_read_options(self.options).columns)

    def reader(self, schema: StructType) -> BatchReader:
        from .read import BatchReader  # noqa: PLC0415 - pyarrow.compute only for reads

        return BatchReader(parse_read_options(self.options), schema)

    def streamReader(self, schema: StructType) -> StreamReader:
        from .stream import StreamReader  # noqa: PLC0415 - pyarrow.compute only for reads

        return StreamReader(parse_read_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .write import BatchWriter  # noqa: PLC0415 - pyarrow.compute only for writes

        return BatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .write import StreamWriter  # noqa: PLC0415 - pyarrow.compute only for writes

        return StreamWriter(self.options, schema, overwrite)
