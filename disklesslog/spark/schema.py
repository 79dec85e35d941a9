"""The columns a read produces, as a Spark schema and as the Arrow schema Spark expects.

The columns follow Spark's Kafka source where the concepts match (``key``, ``value``,
``offset``, ``timestamp``, ``headers``); ``stream`` takes the place of ``topic`` and
``partition`` (a stream is one ordered partition).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .options import COLUMNS

__all__ = ["HEADERS_TYPE", "arrow_schema", "read_schema"]

# Timestamps in UTC: Spark 4.1+ takes ``timezone=``, Spark 4.0 ``timestamp_utc=``.
_UTC: dict[str, Any] = (
    {"timezone": "UTC"}
    if "timezone" in inspect.signature(to_arrow_schema).parameters
    else {"timestamp_utc": True}
)

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)]),
    containsNull=False,
)
"""Kafka's header column: ``array<struct<key:string,value:binary>>`` (keys may repeat)."""


_FIELDS = {
    "key": StructField("key", BinaryType(), True),
    "value": StructField("value", BinaryType(), True),
    "stream": StructField("stream", StringType(), False),
    "offset": StructField("offset", LongType(), False),
    "timestamp": StructField("timestamp", TimestampType(), False),
    "headers": StructField("headers", HEADERS_TYPE, False),
}


def read_schema(
    include_headers: bool = False, *, columns: Sequence[str] | None = None
) -> StructType:
    """The read schema: every column but ``headers`` (unless ``include_headers``), or
    exactly ``columns`` in that order (the ``columns`` option: Spark's Python data
    sources get no column pruning, so a read that needs few columns names them).
    ``key``/``value`` are null for a missing key and a tombstone; the other columns are
    never null, and say so, so Spark can skip null checks."""
    if columns is None:
        columns = COLUMNS if include_headers else COLUMNS[:-1]
    return StructType([_FIELDS[name] for name in columns])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of the batches ``read()`` yields, built by Spark's own helper:
    Spark 4.2+ refuses a batch whose schema differs in any way (timestamp unit and zone,
    ``binary`` vs ``large_binary``, nullability), so we never spell it ourselves."""
    return to_arrow_schema(schema, **_UTC)
