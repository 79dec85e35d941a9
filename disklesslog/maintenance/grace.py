"""The grace period of garbage collection, one rule for both backends.

Data that left a log (trimmed, compacted or merged away, a fenced writer's upload, a
local segment's tiered copy) stays readable for a while before it is deleted: a reader
in another process may have looked up its location just before and still be fetching
it. Kafka's ``file.delete.delay.ms`` is the same idea at one minute; ours defaults to
five because object-store readers may hold locations across slow ranged GETs.
"""

from __future__ import annotations

import math

from ..errors import ConfigError

__all__ = ["DEFAULT_GRACE_SECONDS", "resolve_grace"]

DEFAULT_GRACE_SECONDS = 300.0


def resolve_grace(value: float | None) -> float:
    """``value``, or the default when it is ``None``; a :class:`ConfigError` unless it is
    a finite number of seconds >= 0 (``True`` is not a number here)."""
    if value is None:
        return DEFAULT_GRACE_SECONDS
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"grace_seconds={value!r} is invalid: give a finite number of seconds >= 0 "
            f"(default {DEFAULT_GRACE_SECONDS:g}; readers holding old locations need it "
            "to finish)"
        )
    return float(value)
