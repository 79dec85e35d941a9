"""Per-stream configuration: what a stream is created with and keeps for life.

Every value is validated once, here, with an error that names the option and its
allowed range, so backends can trust a :class:`StreamConfig` they are handed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError
from .format import (
    COMPRESSIONS,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    HEADER_SIZE,
    MAX_BATCH_BYTES_LIMIT,
)

__all__ = ["StreamConfig"]

_DAY_MS = 24 * 3600 * 1000


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Settings of one stream, fixed when the stream is created.

    ``segment_bytes``, ``segment_ms`` and ``index_interval_bytes`` shape local segment
    files and are ignored by the object-storage backend.
    """

    compression: str = "none"
    """``"none"`` or ``"zstd"`` (level 3), applied per batch; incompressible batches stay raw."""
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    """Largest record accepted (key + value + headers), 1 MiB by default."""
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    """Largest encoded batch written or read, 16 MiB by default."""
    segment_bytes: int = 256 << 20
    """Roll to a new segment file before one would grow past this size."""
    segment_ms: int = 7 * _DAY_MS
    """Roll when the first batch of the active segment is older than this."""
    index_interval_bytes: int = 4096
    """Bytes of batches between two entries of the sparse offset and time indexes."""

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression={self.compression!r} is unknown; choose one of {sorted(COMPRESSIONS)}"
            )
        _int_in("max_batch_bytes", self.max_batch_bytes, 1024, MAX_BATCH_BYTES_LIMIT)
        _int_in(
            "max_record_bytes", self.max_record_bytes, 1, self.max_batch_bytes - HEADER_SIZE - 64
        )
        _int_in("segment_bytes", self.segment_bytes, 1024, MAX_BATCH_BYTES_LIMIT)
        _int_in("segment_ms", self.segment_ms, 1, 100 * 365 * _DAY_MS)
        _int_in("index_interval_bytes", self.index_interval_bytes, 64, 1 << 30)

    @functools.cached_property
    def compression_code(self) -> int:
        """The batch attribute code of :attr:`compression` (looked up once, used per append)."""
        return COMPRESSIONS[self.compression]

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> StreamConfig:
        """Build from a mapping, rejecting unknown keys with the list of known ones."""
        unknown = set(values) - cls.field_names()
        if unknown:
            raise ConfigError(
                f"unknown stream option(s) {sorted(unknown)}; known: {sorted(cls.field_names())}"
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> StreamConfig:
        """A copy with ``changes`` applied (validated like a new config)."""
        return self.from_dict({**self.to_dict(), **changes})


def _int_in(name: str, value: Any, low: int, high: int) -> None:
    if type(value) is not int:
        raise ConfigError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is out of range; allowed {low}..{high}")
