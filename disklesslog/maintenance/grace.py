"""The grace period of garbage collection, one rule for both backends.

Data that left a log (trimmed, compacted or merged away, a fenced writer's upload, a
local segment's tiered copy) stays readable for a while before it is deleted: a reader
in another process may have looked up its location just before and still be fetching
it. Kafka's ``file.delete.delay.ms`` is the same idea, and ours has its default, one
minute. This library's own readers do not depend on it (a read that finds an object
deleted asks the sequencer, or the manifest, where its records are now), so it is for
readers elsewhere that hold locations: another tool, or a very slow ranged GET. It also
decides how much a busy log keeps: every object that died in the last grace period is
in the object backend's sequencer state and in storage until it is collected (60,000
objects at 1,000 flushes/s, five times fewer than with the five minutes it was).
"""

from __future__ import annotations

from ..api import finite_number
from ..errors import ConfigError

__all__ = ["DEFAULT_GRACE_SECONDS", "MAX_GRACE_SECONDS", "resolve_grace"]

DEFAULT_GRACE_SECONDS = 60.0
MAX_GRACE_SECONDS = float(10**9)
"""About 31 years. Collectors turn the grace into integer nanoseconds and subtract it
from the clock: a bound keeps that within the 64-bit integers clocks, keys and
sequencer columns hold (2**63 ns is about 292 years), so no grace, however large,
overflows on the way; anything longer is "never" in practice (use ``dry_run`` instead)."""


def resolve_grace(value: float | None) -> float:
    """``value``, or the default when it is ``None``; a :class:`ConfigError` unless it is
    a finite number of seconds in ``0..MAX_GRACE_SECONDS`` (``True`` is not a number
    here)."""
    if value is None:
        return DEFAULT_GRACE_SECONDS
    seconds = finite_number(value)
    if seconds is None or not 0 <= seconds <= MAX_GRACE_SECONDS:
        raise ConfigError(
            f"grace_seconds={value!r} is invalid: give a finite number of seconds in "
            f"0..{MAX_GRACE_SECONDS:.0f} (default {DEFAULT_GRACE_SECONDS:g}; readers "
            "holding old locations need it to finish)"
        )
    return seconds
