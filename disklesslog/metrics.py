"""Counters and latency percentiles: the numbers that show what a log costs.

Each log owns one :class:`Metrics`; its backend, writer, reader and cache add to it,
and :meth:`disklesslog.Log.metrics` returns :meth:`Metrics.snapshot`. Counting is cheap
(one lock, no allocation) so it can sit on per-batch paths; latencies keep the most
recent samples of each kind for percentiles.
"""

from __future__ import annotations

from collections import deque

from .forks import fork_safe_lock

__all__ = ["Metrics"]

LATENCY_SAMPLES = 4096
"""Samples kept per latency kind; percentiles describe this recent window."""


class Metrics:
    """Thread-safe counters (``add``) and latency samples (``observe``)."""

    def __init__(self) -> None:
        self._lock = fork_safe_lock()
        self._counters: dict[str, int] = {}
        self._latencies: dict[str, deque[float]] = {}

    def add(self, name: str, value: int = 1) -> None:
        """Add ``value`` to counter ``name``."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + value

    def observe(self, name: str, seconds: float) -> None:
        """Record one duration of kind ``name`` (e.g. ``"commit"``)."""
        with self._lock:
            samples = self._latencies.get(name)
            if samples is None:
                samples = self._latencies[name] = deque(maxlen=LATENCY_SAMPLES)
            samples.append(seconds)
            self._counters[f"{name}s"] = self._counters.get(f"{name}s", 0) + 1

    def snapshot(self) -> dict[str, float]:
        """All counters, plus ``<kind>_p50_ms``, ``<kind>_p99_ms`` and ``<kind>_max_ms``
        over the recent samples of each latency kind."""
        with self._lock:
            result: dict[str, float] = dict(self._counters)
            latencies = {name: sorted(samples) for name, samples in self._latencies.items()}
        for name, samples in latencies.items():
            if samples:
                result[f"{name}_p50_ms"] = _percentile(samples, 0.50) * 1000
                result[f"{name}_p99_ms"] = _percentile(samples, 0.99) * 1000
                result[f"{name}_max_ms"] = samples[-1] * 1000
        return dict(sorted(result.items()))


def _percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted samples."""
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]
