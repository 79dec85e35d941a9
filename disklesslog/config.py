"""Per-stream configuration: what a stream is created with and keeps for life.

Every value is validated once, here, with an error that names the option and its
allowed range, so backends can trust a :class:`StreamConfig` they are handed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError, InvalidRecordError, StreamExistsError
from .format import (
    COMPRESSIONS,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    HEADER_SIZE,
    MAX_BATCH_BYTES_LIMIT,
)

__all__ = [
    "ALTERABLE",
    "CLEANUP_POLICIES",
    "SAME_AS_RETENTION",
    "UNLIMITED",
    "StreamConfig",
    "require_keys",
]

_DAY_MS = 24 * 3600 * 1000
_MAX_MS = 100 * 365 * _DAY_MS  # a century: anything longer is a mistake
_MAX_BYTES = 1 << 60
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
UNLIMITED = -1
"""``retention_ms``/``retention_bytes``: keep everything (Kafka's -1)."""
SAME_AS_RETENTION = -2
"""``local_retention_ms``/``local_retention_bytes``: follow the stream's retention (Kafka's -2)."""
ALTERABLE = frozenset(
    {
        "retention_ms",
        "retention_bytes",
        "delete_retention_ms",
        "min_cleanable_dirty_ratio",
        "local_retention_ms",
        "local_retention_bytes",
    }
)
"""Settings ``Log.alter_stream`` may change on an existing stream: what maintenance
reads. The others are fixed at creation: they shape the bytes already stored (sizes,
compression, segments) or what appends accept (``cleanup_policy``: a compacted stream
refuses records without a key). ``create_stream`` of an existing stream compares only
the fixed ones (:meth:`StreamConfig.created_again`)."""


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Settings of one stream, fixed when the stream is created.

    ``segment_bytes``, ``segment_ms`` and ``index_interval_bytes`` shape local segment
    files. On object storage only the first two matter: they mark the active tail that
    key compaction leaves alone (the newest ``segment_bytes``, and batches younger than
    ``segment_ms``), like the active segment of a local stream.
    """

    compression: str = "none"
    """How batches are compressed when written: ``"none"`` or ``"zstd"`` (level 3),
    per batch; a batch that does not shrink is stored raw. Readers decompress either.
    Default ``"none"``."""
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    """Largest record an append accepts, in bytes of key + value + headers
    (:class:`~disklesslog.RecordTooLarge` otherwise; nothing is written). At most
    ``max_batch_bytes`` minus the batch header. Default 1 MiB (1048576)."""
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    """Largest encoded batch written or read, in bytes, 1024..2 GiB: bounds the memory
    one batch takes (a writer starts a new batch before one would outgrow it). Default 16 MiB
    (16777216)."""
    segment_bytes: int = 256 << 20
    """Size in bytes a local segment file may grow to before appends roll to a new one
    (whole closed segments are what retention deletes and tiering copies). On object
    storage: the newest this many bytes are the active tail compaction leaves alone.
    1024..2 GiB; default 256 MiB (268435456)."""
    segment_ms: int = 7 * _DAY_MS
    """Age in milliseconds of the active segment's first batch after which the next
    append rolls to a new segment, so a quiet stream's old records still become
    deletable. On object storage: batches younger than this are the active tail
    compaction leaves alone. Default 7 days (604800000)."""
    index_interval_bytes: int = 4096
    """How many bytes of batches lie between two entries of a local segment's sparse
    offset and time indexes: smaller finds an offset with less scanning, larger keeps
    the index files smaller. 64..1 GiB; default 4096."""
    cleanup_policy: str = "delete"
    """What maintenance does to old records: ``"delete"`` (retention by time and size),
    ``"compact"`` (keep the latest record per key; every record needs a key) or
    ``"compact,delete"`` (both). Default ``"delete"``."""
    retention_ms: int = UNLIMITED
    """Age in milliseconds after which records may be deleted by retention (with
    ``cleanup_policy`` ``"delete"``): whole segments or batches go once their newest
    record is older, never the active segment. ``-1`` keeps everything. Default
    ``-1``."""
    retention_bytes: int = UNLIMITED
    """Size in bytes the stream may keep: retention deletes its oldest segments or
    batches while it is larger. ``-1`` sets no limit. Default ``-1``."""
    delete_retention_ms: int = _DAY_MS
    """How long in milliseconds compaction keeps a tombstone (``value=None``) after it
    was written, so that readers see the deletion before it is dropped too. Default 1
    day (86400000)."""
    min_cleanable_dirty_ratio: float = 0.5
    """Compaction runs on the stream when the share of its compactable bytes written
    since the last pass is at least this, a number in 0..1 (0: whenever anything is
    new; ``compact(force=True)`` ignores it). Default 0.5."""
    local_retention_ms: int = SAME_AS_RETENTION
    """With tiering (``tier_url=``): how long in milliseconds local copies of tiered
    segments stay on local disk; the tiered copies stay for ``retention_ms``. ``-2``
    follows ``retention_ms``, ``-1`` keeps them forever. Default ``-2``."""
    local_retention_bytes: int = SAME_AS_RETENTION
    """With tiering: bytes of tiered segments kept on local disk too, newest first.
    ``-2`` follows ``retention_bytes``, ``-1`` sets no limit. Default ``-2``."""

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
        policy = self.cleanup_policy
        if isinstance(policy, str) and policy.replace(" ", "") == "delete,compact":
            object.__setattr__(self, "cleanup_policy", "compact,delete")
        if self.cleanup_policy not in CLEANUP_POLICIES:
            raise ConfigError(
                f"cleanup_policy={policy!r} is unknown; choose one of {list(CLEANUP_POLICIES)}"
            )
        _limit("retention_ms", self.retention_ms, _MAX_MS, "a time in ms")
        _limit("retention_bytes", self.retention_bytes, _MAX_BYTES, "a size in bytes")
        _int_in("delete_retention_ms", self.delete_retention_ms, 0, _MAX_MS)
        ratio = self.min_cleanable_dirty_ratio
        if type(ratio) not in (int, float) or not 0 <= ratio <= 1:
            raise ConfigError(f"min_cleanable_dirty_ratio must be a number in 0..1, not {ratio!r}")
        _limit("local_retention_ms", self.local_retention_ms, _MAX_MS, "a time in ms", local=True)
        _limit(
            "local_retention_bytes", self.local_retention_bytes, _MAX_BYTES, "a size", local=True
        )
        for local, total in (
            ("local_retention_ms", "retention_ms"),
            ("local_retention_bytes", "retention_bytes"),
        ):
            mine, theirs = getattr(self, local), getattr(self, total)
            if mine >= 0 and theirs >= 0 and mine > theirs:
                raise ConfigError(
                    f"{local}={mine} is more than {total}={theirs}: local copies cannot "
                    "outlive the stream's retention"
                )

    @property
    def compacted(self) -> bool:
        """Whether key compaction applies (every record must have a key)."""
        return self.cleanup_policy != "delete"

    @property
    def deletes(self) -> bool:
        """Whether retention by time and size applies."""
        return self.cleanup_policy != "compact"

    def local_limits(self) -> tuple[int, int]:
        """``(ms, bytes)`` local copies of tiered segments are kept (-1: unlimited)."""
        ms = (
            self.retention_ms
            if self.local_retention_ms == SAME_AS_RETENTION
            else self.local_retention_ms
        )
        size = (
            self.retention_bytes
            if self.local_retention_bytes == SAME_AS_RETENTION
            else self.local_retention_bytes
        )
        return ms, size

    @functools.cached_property
    def compression_code(self) -> int:
        """The batch attribute code of :attr:`compression` (looked up once, used per append)."""
        return COMPRESSIONS[self.compression]

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """Every setting's name: what ``open()`` and ``create_stream()`` accept as
        stream settings."""
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
        """The settings as a plain dict (what is stored with the stream, and what
        :meth:`from_dict` reads back)."""
        return dataclasses.asdict(self)

    def altered(self, **changes: Any) -> StreamConfig:
        """A copy with maintenance settings changed (:data:`ALTERABLE`); any other
        field raises ConfigError naming it."""
        fixed = sorted(set(changes) - ALTERABLE)
        if fixed:
            unknown = [name for name in fixed if name not in self.field_names()]
            if unknown:
                raise ConfigError(
                    f"unknown stream option(s) {unknown}; alterable: {sorted(ALTERABLE)}"
                )
            raise ConfigError(
                f"{', '.join(fixed)} cannot change after a stream is created (it shapes the "
                f"stored bytes or what appends accept); alterable: {sorted(ALTERABLE)}"
            )
        if not changes:
            raise ConfigError(f"nothing to alter; alterable: {sorted(ALTERABLE)}")
        return self.replace(**changes)

    def created_again(self, stream: str, requested: StreamConfig) -> StreamConfig:
        """This config, which stream ``stream`` has, when ``create_stream`` asks for
        ``requested`` again: startup code creates its streams on every run, so only the
        settings fixed at creation must match; the :data:`ALTERABLE` ones are the
        stream's, maybe altered since, and kept. A differing fixed setting raises
        StreamExistsError naming each with the stream's value and the requested one."""
        differing = [
            (field.name, getattr(self, field.name), getattr(requested, field.name))
            for field in dataclasses.fields(self)
            if field.name not in ALTERABLE
            and getattr(self, field.name) != getattr(requested, field.name)
        ]
        if not differing:
            return self
        settings = ", ".join(
            f"{name}={mine!r} (create_stream asked for {theirs!r})"
            for name, mine, theirs in differing
        )
        raise StreamExistsError(
            f"stream {stream!r} already exists with {settings}; "
            f"{'this setting is' if len(differing) == 1 else 'these settings are'} fixed "
            "when a stream is created: create it with the stream's values, or delete the "
            "stream (and its records) and create it again. Settings alter_stream may "
            "change, such as retention_ms, are left as the stream has them."
        )

    def replace(self, **changes: Any) -> StreamConfig:
        """A copy with ``changes`` applied (validated like a new config)."""
        return self.from_dict({**self.to_dict(), **changes})


def _limit(name: str, value: Any, high: int, what: str, *, local: bool = False) -> None:
    """A retention limit: ``-1`` (none), ``-2`` where ``local`` (follow retention), or a
    positive amount up to ``high``."""
    if type(value) is not int:
        raise ConfigError(f"{name} must be an int, not {type(value).__name__}")
    specials = "-1 (unlimited) or -2 (same as retention)" if local else "-1 (unlimited)"
    if value == UNLIMITED or (local and value == SAME_AS_RETENTION):
        return
    if not 1 <= value <= high:
        raise ConfigError(f"{name}={value} is out of range: {what} in 1..{high}, or {specials}")


def _int_in(name: str, value: Any, low: int, high: int) -> None:
    if type(value) is not int:
        raise ConfigError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is out of range; allowed {low}..{high}")


def require_keys(config: StreamConfig, stream: str, keys: Any) -> None:
    """Refuse records without a key on a compacted stream (Kafka does the same):
    compaction keeps the latest record *per key*, so a keyless one could never be
    compacted away. ``keys`` is a list or tuple of keys, or ``None`` (no keys at all)."""
    if not config.compacted:
        return
    if keys is None or (isinstance(keys, list | tuple) and None in keys):
        raise InvalidRecordError(
            f"stream {stream!r} is compacted (cleanup_policy={config.cleanup_policy!r}): "
            "every record needs a key"
        )
