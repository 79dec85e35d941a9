"""Measurements beside the time: a harness extension for workloads whose result is more
than a rate, such as PUTs per flush, GETs per block or latency percentiles.

:mod:`common` times each repetition of each variant. Here a variant's timed function may
also return a callable, called *after* the clock stopped, that returns a dict of
measurements (or the dict itself). :func:`run_measured` runs a :class:`MeasuredGroup`
with :func:`common.run_group` unchanged (same warm-up, rotation and statistics) and keeps
those dicts per repetition (warm-ups dropped). Tables show their medians in extra
:class:`Column` s; a :class:`MetricGoal` is judged on the median of a measurement or of
the rate, and its line shows the range over the repetitions. The JSON of a group adds
every repetition's measurements and their medians.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import Goal, Group, GroupResult, Prepare, Scratch, Variant, fmt_rate, run_group

__all__ = [
    "Collect",
    "Column",
    "Extras",
    "MeasuredGroup",
    "MeasuredResult",
    "MetricGoal",
    "delta",
    "measured_console",
    "measured_markdown",
    "percentiles",
    "run_measured",
]

Extras = dict[str, float]
Collect = Callable[[], Extras]


@dataclass
class Column:
    """An extra table column: the median over repetitions of one measurement."""

    key: str
    header: str
    fmt: str = ",.1f"

    def cell(self, value: float | None) -> str:
        return "" if value is None else format(value, self.fmt)


@dataclass
class MetricGoal(Goal):
    """A goal on the median of a measurement (``metric``; ``"rate"``: the rate column),
    which must stay ``at_most`` and/or reach ``at_least``."""

    metric: str = "rate"
    at_most: float | None = None
    at_least: float | None = None
    unit: str = ""

    def met(self, value: float) -> bool:
        if self.at_most is not None and not value <= self.at_most:
            return False
        return self.at_least is None or value >= self.at_least


@dataclass
class MeasuredGroup(Group):
    """A :class:`~common.Group` whose variants also report measurements."""

    columns: list[Column] = field(default_factory=list)
    unit: str = "records"  # what the rate column counts
    warmup: int | None = None  # overrides --warmup (e.g. 0 for a 10-second workload)
    summary: Callable[[MeasuredResult], list[str]] | None = None  # extra result lines


@dataclass
class MeasuredResult(GroupResult):
    """A :class:`~common.GroupResult` plus each repetition's measurements per variant."""

    extras: dict[str, list[Extras]] = field(default_factory=dict)

    @property
    def measured(self) -> MeasuredGroup:
        assert isinstance(self.group, MeasuredGroup)
        return self.group

    def values(self, variant: str, metric: str) -> list[float]:
        if metric == "rate":
            return self.variants[variant].rates
        return [e[metric] for e in self.extras.get(variant, []) if metric in e]

    def median(self, variant: str, metric: str) -> float | None:
        values = self.values(variant, metric)
        return statistics.median(values) if values else None

    def goal_outcomes(self) -> list[tuple[Goal, float, bool]]:
        outcomes: list[tuple[Goal, float, bool]] = []
        for goal in self.group.goals:
            if isinstance(goal, MetricGoal):
                median = self.median(goal.variant, goal.metric)
                value = math.nan if median is None else median
                outcomes.append((goal, value, goal.met(value)))
            else:
                outcomes.extend(o for o in super().goal_outcomes() if o[0] is goal)
        return outcomes

    def goal_best(self, goal: Goal) -> float:
        if not isinstance(goal, MetricGoal):
            return super().goal_best(goal)
        values = self.values(goal.variant, goal.metric) or [math.nan]
        return min(values) if goal.at_most is not None else max(values)

    def goal_line(self, goal: Goal, value: float, met: bool) -> str:
        if not isinstance(goal, MetricGoal):
            return super().goal_line(goal, value, met)
        values = self.values(goal.variant, goal.metric) or [math.nan]
        unit = f" {goal.unit}" if goal.unit else ""
        shown = f"median {_num(value)}{unit} (repetitions {_num(min(values))}-{_num(max(values))})"
        return f"{goal.text}: {shown}: {'MET' if met else 'NOT MET'}"

    def summary_lines(self) -> list[str]:
        return self.measured.summary(self) if self.measured.summary else []

    def to_json(self) -> dict[str, Any]:
        document = super().to_json()
        for entry in document["variants"]:
            reps = self.extras.get(entry["name"], [])
            entry["measurements"] = reps
            keys = sorted({k for e in reps for k in e})
            entry["measurements_median"] = {k: self.median(entry["name"], k) for k in keys}
        document["unit"] = self.measured.unit
        document["summary"] = self.summary_lines()
        return document


def _num(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}"


def _recording(prepare: Prepare, sink: list[Extras]) -> Prepare:
    """Wrap a variant's ``prepare`` so what its timed function returns is kept in ``sink``:
    a dict, or a callable returning one, called after the clock stopped."""

    @contextmanager
    def wrapped(work: Path, shared: Any) -> Iterator[Callable[[], object]]:
        with prepare(work, shared) as run:
            outcome: list[object] = []

            def timed() -> None:
                outcome.append(run())

            yield timed
            if outcome:
                result = outcome[0]
                if callable(result):
                    result = result()
                sink.append(dict(result) if isinstance(result, dict) else {})

    return wrapped


def run_measured(
    group: MeasuredGroup, reps: int, scratch: Scratch, warmup: int = 1, wait_quiet: float = 0.0
) -> MeasuredResult:
    """:func:`common.run_group`, keeping each timed repetition's measurements."""
    warmup = group.warmup if group.warmup is not None else warmup
    sinks: dict[str, list[Extras]] = {v.name: [] for v in group.variants}
    original = group.variants
    group.variants = [
        Variant(**{**vars(v), "prepare": _recording(v.prepare, sinks[v.name])}) for v in original
    ]
    try:
        result = run_group(group, reps, scratch, warmup, wait_quiet)
    finally:
        group.variants = original
    extras = {name: sink[warmup:] for name, sink in sinks.items()}  # drop the warm-ups
    return MeasuredResult(
        group, result.reps, result.variants, result.seconds, result.background, extras
    )


def measured_rows(result: MeasuredResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows: rate, MB/s, ratio to the baseline, then the group's columns."""
    group = result.measured
    has_mbps = any(v.payload_bytes for v in result.variants.values())
    has_ratio = any(v.ratio_to_baseline is not None for v in result.variants.values())
    header = ["variant", f"{group.unit}/s (median)", "best"]
    header += ["MB/s"] if has_mbps else []
    header += ["vs baseline"] if has_ratio else []
    header += [c.header for c in group.columns] + ["note"]
    rows = []
    for v in result.variants.values():
        name = v.name
        if v.role == "baseline":
            name = f"{v.tag}: {name}" if v.tag else name
        elif v.role == "peer":
            name += " [peer]"
        row = [name, fmt_rate(v.median_rate), fmt_rate(v.best_rate)]
        if has_mbps:
            mbps = v.median_mbps
            row.append("" if mbps is None else f"{mbps:,.1f}")
        if has_ratio:
            ratio = ""
            if v.ratio_to_baseline is not None:
                base = result.variants[v.vs] if v.vs else None
                ratio = f"{v.ratio_to_baseline:.2f}x" + (
                    f" {base.tag}" if base and base.tag else ""
                )
            row.append(ratio)
        row += [c.cell(result.median(v.name, c.key)) for c in group.columns]
        rows.append([*row, v.note])
    return header, rows


def measured_console(result: MeasuredResult) -> str:
    header, rows = measured_rows(result)
    rows = [[*row[:-1], row[-1][:60]] for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if 0 < i < len(cells) - 1 else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    out += [f"  {a} / {b}: {ratio:,.2f}x" for a, b, ratio in result.peer_ratios()]
    out += [f"  {text}" for text in result.summary_lines()]
    for goal, value, met in result.goal_outcomes():
        out.append(f"  goal {result.goal_line(goal, value, met)}")
    if result.background:
        out.append(f"  ({result.background_summary()})")
    return "\n".join(out)


def measured_markdown(result: MeasuredResult) -> str:
    header, rows = measured_rows(result)
    out = [
        "| " + " | ".join(header) + " |",
        "|"
        + "|".join("---" if i in (0, len(header) - 1) else "---:" for i in range(len(header)))
        + "|",
    ]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(out)


def percentiles(samples: list[float], scale: float = 1000.0) -> Extras:
    """p50/p90/p99/max (nearest rank) of ``samples`` seconds, in milliseconds."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def rank(fraction: float) -> float:
        index = max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))
        return ordered[index] * scale

    return {
        "p50_ms": rank(0.50),
        "p90_ms": rank(0.90),
        "p99_ms": rank(0.99),
        "max_ms": ordered[-1] * scale,
        "samples": float(len(ordered)),
    }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Counters of ``log.metrics()`` grown between two snapshots (latency percentiles are
    left out: they describe a window, not a count)."""
    return {
        k: v - before.get(k, 0)
        for k, v in after.items()
        if not k.endswith(("_ms",)) and isinstance(v, int | float)
    }
