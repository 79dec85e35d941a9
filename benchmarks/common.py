"""The benchmark harness: variants, groups, repetitions, statistics and tables.

A *group* is one workload measured several ways: the disklesslog variants, a
*baseline* (the physical limit: raw file writes or reads of the same bytes) and
*peers* (other libraries doing the same job). Each repetition runs every variant of the
group once, right after each other, in a rotating order, so slow drift of the machine
(page cache, CPU frequency, neighbours) hits all variants alike. Ratios are computed
per repetition between variants of that repetition, and the median is reported.

A variant's ``prepare(work_dir, shared)`` is a context manager: it does the untimed
setup (opening files, creating streams), yields the function to time, and cleans up.
Every repetition gets a fresh directory, removed afterwards.
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MB = 1_000_000  # MB/s in the tables are decimal megabytes of record values per second

Prepare = Callable[[Path, Any], AbstractContextManager[Callable[[], object]]]


@dataclass
class Variant:
    """One way of doing a group's workload."""

    name: str
    role: str  # "subject" (disklesslog), "baseline" or "peer"
    prepare: Prepare
    records: int  # records per timed run
    payload_bytes: int = 0  # bytes of record values per timed run (0: no MB/s column)
    compare_to: str | None = None  # for peers: the disklesslog variant they are compared with
    vs: str | None = None  # the baseline this variant's ratio is taken to (default: the group's)
    tag: str = ""  # a baseline's short label, shown in the ratio column ("0.93x A")
    note: str = ""


@dataclass
class Goal:
    """A target a disklesslog variant must reach: a rate, or a ratio to the baseline."""

    text: str
    variant: str
    rate: float | None = None  # records/s the median must reach
    ratio: float | None = None  # median ratio to the group's baseline the variant must reach


@dataclass
class Group:
    """A workload and the variants that run it."""

    key: str  # the name --only takes
    title: str
    variants: list[Variant]
    baseline: str | None = None
    metric: str = "rate"  # "rate": records/s; "time": seconds per run (lower is better)
    shared: Callable[[Path], AbstractContextManager[Any]] | None = None
    goals: list[Goal] = field(default_factory=list)
    note: str = ""
    prime_bytes: int = 0  # write and delete this many bytes right before each timed run


@dataclass
class VariantResult:
    name: str
    role: str
    records: int
    payload_bytes: int
    times: list[float]
    compare_to: str | None
    note: str
    vs: str | None = None
    tag: str = ""
    ratio_to_baseline: float | None = None  # rate ratio; for "time" groups a time ratio

    @property
    def rates(self) -> list[float]:
        return [self.records / t for t in self.times]

    @property
    def median_time(self) -> float:
        return statistics.median(self.times)

    @property
    def best_time(self) -> float:
        return min(self.times)

    @property
    def median_rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def best_rate(self) -> float:
        return max(self.rates)

    @property
    def median_mbps(self) -> float | None:
        if not self.payload_bytes:
            return None
        return statistics.median(self.payload_bytes / t / MB for t in self.times)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "records": self.records,
            "payload_bytes": self.payload_bytes,
            "times_s": self.times,
            "median_records_per_s": self.median_rate,
            "best_records_per_s": self.best_rate,
            "median_mb_per_s": self.median_mbps,
            "median_time_s": self.median_time,
            "best_time_s": self.best_time,
            "ratio_to_baseline": self.ratio_to_baseline,
            "ratio_to": self.vs,
            "compare_to": self.compare_to,
            "note": self.note,
        }


@dataclass
class GroupResult:
    group: Group
    reps: int
    variants: dict[str, VariantResult]
    seconds: float  # wall time of the whole group, setup included
    background: list[float] = field(default_factory=list)  # other processes' CPU load per rep

    def background_summary(self) -> str:
        if not self.background:
            return ""
        shown = ", ".join(f"{b:.0%}" for b in self.background)
        return f"CPU used by other processes before each repetition: {shown}"

    def paired_ratio(self, a: str, b: str) -> float:
        """Median over repetitions of rate(a) / rate(b) (time(b) / time(a))."""
        ta, tb = self.variants[a], self.variants[b]
        return statistics.median(
            (ta.records / x) / (tb.records / y) for x, y in zip(ta.times, tb.times)
        )

    def peer_ratios(self) -> list[tuple[str, str, float]]:
        """(disklesslog variant, peer, median ratio disklesslog/peer) per peer."""
        return [
            (v.compare_to, v.name, self.paired_ratio(v.compare_to, v.name))
            for v in self.variants.values()
            if v.role == "peer" and v.compare_to
        ]

    def goal_outcomes(self) -> list[tuple[Goal, float, bool]]:
        """(goal, median value, met) per goal: judged on the median, never the best."""
        outcomes = []
        for goal in self.group.goals:
            result = self.variants[goal.variant]
            if goal.rate is not None:
                value = result.median_rate
                outcomes.append((goal, value, value >= goal.rate))
            elif goal.ratio is not None:
                value = result.ratio_to_baseline or 0.0
                outcomes.append((goal, value, value >= goal.ratio))
        return outcomes

    def goal_best(self, goal: Goal) -> float:
        """The best repetition's value for ``goal`` (shown beside the median)."""
        result = self.variants[goal.variant]
        if goal.rate is not None:
            return result.best_rate
        if not result.vs:
            return 0.0
        base = self.variants[result.vs]
        return max(
            (result.records / t) / (base.records / u) for t, u in zip(result.times, base.times)
        )

    def goal_line(self, goal: Goal, value: float, met: bool) -> str:
        best = self.goal_best(goal)
        if goal.rate is not None:
            shown = f"median {value:,.0f} records/s (best {best:,.0f})"
        else:
            shown = f"median {value:.2f}x (best {best:.2f}x)"
        return f"{goal.text}: {shown}: {'MET' if met else 'NOT MET'}"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.group.key,
            "title": self.group.title,
            "metric": self.group.metric,
            "baseline": self.group.baseline,
            "reps": self.reps,
            "wall_seconds": self.seconds,
            "background_cpu_busy": self.background,
            "note": self.group.note,
            "prime_bytes": self.group.prime_bytes,
            "variants": [v.to_json() for v in self.variants.values()],
            "peer_ratios": [
                {"disklesslog": a, "peer": b, "ratio": r} for a, b, r in self.peer_ratios()
            ],
            "goals": [
                {"goal": g.text, "median": value, "best": self.goal_best(g), "met": met}
                for g, value, met in self.goal_outcomes()
            ],
        }


# ------------------------------------------------------------------------- running


@dataclass
class Scratch:
    """The root temporary directory of a run; removed when the run ends, however it ends."""

    parent: str | None = None
    path: Path = field(init=False)

    def __enter__(self) -> Scratch:
        self.path = Path(tempfile.mkdtemp(prefix="disklesslog-bench-", dir=self.parent))
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def fresh(self, prefix: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.path))


_ZEROS = bytes(1 << 20)


def prime_page_cache(directory: Path, nbytes: int) -> None:
    """Write ``nbytes`` to a file and delete it, so the memory the next run's writes get
    for the page cache was just in use. On a VM that hands freed memory back to its host
    (virtio-balloon free page reporting), a write that needs fresh memory otherwise pays a
    host page fault per page: 0.3-4 GB/s for the same write, by luck. Priming makes every
    variant measure the warm case."""
    path = directory / "prime"
    with open(path, "wb") as f:
        for _ in range(-(-nbytes // len(_ZEROS))):
            f.write(_ZEROS)
    path.unlink()


def time_once(variant: Variant, scratch: Scratch, shared: Any, prime_bytes: int = 0) -> float:
    """Set up ``variant`` in a fresh directory, time one run, clean up."""
    work = scratch.fresh("rep-")
    try:
        with variant.prepare(work, shared) as run:
            if prime_bytes:
                prime_page_cache(work, prime_bytes)
            gc.collect()
            start = time.perf_counter()
            run()
            return time.perf_counter() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = _read("/proc/stat").split("\n", 1)[0].split()[1:]
    values = [int(x) for x in fields[:8]]
    if len(values) < 5:
        return 0, 0
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def cpu_busy(interval: float = 0.25) -> float:
    """Fraction of all CPUs busy during ``interval`` while this process sleeps: the load
    other processes put on the machine (0 when /proc/stat is unavailable)."""
    busy0, total0 = _cpu_times()
    time.sleep(interval)
    busy1, total1 = _cpu_times()
    return (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0


def settle(wait_quiet: float, threshold: float = 0.15) -> float:
    """Measure the machine's background load; with ``wait_quiet`` > 0, wait up to that many
    seconds for it to drop below ``threshold``. Returns the last measurement."""
    busy = cpu_busy()
    deadline = time.monotonic() + wait_quiet
    while busy > threshold and time.monotonic() < deadline:
        busy = cpu_busy(1.0)
    return busy


def run_group(
    group: Group, reps: int, scratch: Scratch, warmup: int = 1, wait_quiet: float = 0.0
) -> GroupResult:
    """Run ``warmup`` untimed repetitions, then ``reps`` timed ones. Before each timed
    repetition, note the other processes' CPU load (and wait for it to drop, if asked)."""
    started = time.perf_counter()
    times: dict[str, list[float]] = {v.name: [] for v in group.variants}
    background: list[float] = []
    progress = sys.stderr.isatty()
    shared_dir = scratch.fresh(f"{group.key}-")
    try:
        context = group.shared(shared_dir) if group.shared else nullcontext(None)
        with context as shared:
            for rep in range(-warmup, reps):
                if progress:
                    label = "warm-up" if rep < 0 else f"repetition {rep + 1}/{reps}"
                    print(f"  {label} ...", end="\r", file=sys.stderr, flush=True)
                if rep >= 0:
                    background.append(settle(wait_quiet))
                shift = rep % len(group.variants)
                for variant in group.variants[shift:] + group.variants[:shift]:
                    elapsed = time_once(variant, scratch, shared, group.prime_bytes)
                    if rep >= 0:
                        times[variant.name].append(elapsed)
    finally:
        shutil.rmtree(shared_dir, ignore_errors=True)
        if progress:
            print(" " * 40, end="\r", file=sys.stderr, flush=True)
    results = {
        v.name: VariantResult(
            v.name,
            v.role,
            v.records,
            v.payload_bytes,
            times[v.name],
            v.compare_to,
            v.note,
            v.vs or (group.baseline if v.role != "baseline" else None),
            v.tag,
        )
        for v in group.variants
    }
    result = GroupResult(group, reps, results, time.perf_counter() - started, background)
    for v in results.values():
        if v.vs and v.vs != v.name:
            ratio = result.paired_ratio(v.name, v.vs)
            v.ratio_to_baseline = 1 / ratio if group.metric == "time" else ratio
    return result


# ------------------------------------------------------------------------ formatting


def fmt_rate(value: float) -> str:
    if value >= 10_000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def table_rows(result: GroupResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a group's table (shared by the console and Markdown output)."""
    group = result.group
    if group.metric == "time":
        header = ["variant", "median", "best", "time vs baseline", "note"]
    else:
        header = ["variant", "records/s (median)", "best", "MB/s", "vs baseline", "note"]
    rows = []
    for v in result.variants.values():
        name = v.name
        if v.role == "baseline":
            name = f"{v.tag}: {name}" if v.tag else name
        elif v.role == "peer":
            name += " [peer]"
        ratio = ""
        if v.ratio_to_baseline is not None:
            base = result.variants[v.vs] if v.vs else None
            ratio = f"{v.ratio_to_baseline:.2f}x"
            if base is not None and base.tag:
                ratio += f" {base.tag}"
        if group.metric == "time":
            rows.append([name, fmt_ms(v.median_time), fmt_ms(v.best_time), ratio, v.note])
        else:
            mbps = v.median_mbps
            rows.append(
                [
                    name,
                    fmt_rate(v.median_rate),
                    fmt_rate(v.best_rate),
                    "" if mbps is None else f"{mbps:,.1f}",
                    ratio,
                    v.note,
                ]
            )
    return header, rows


def console_table(result: GroupResult) -> str:
    header, rows = table_rows(result)
    rows = [[*row[:-1], row[-1][:60]] for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = set(range(1, len(header) - 1))

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    for a, b, ratio in result.peer_ratios():
        out.append(f"  {a} / {b}: {ratio:,.2f}x")
    for goal, value, met in result.goal_outcomes():
        out.append(f"  goal {result.goal_line(goal, value, met)}")
    if result.background:
        out.append(f"  ({result.background_summary()})")
    return "\n".join(out)


def markdown_table(result: GroupResult) -> str:
    header, rows = table_rows(result)
    out = [
        "| " + " | ".join(header) + " |",
        "|"
        + "|".join("---" if i in (0, len(header) - 1) else "---:" for i in range(len(header)))
        + "|",
    ]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------- the machine


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _mount_of(path: Path) -> tuple[str, str, str]:
    """(device, mount point, filesystem type) of the filesystem holding ``path``."""
    best = ("?", "", "?")
    target = str(path.resolve())
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, fstype = parts[0], parts[1], parts[2]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[1]):
            best = (device, mount, fstype)
    return best


def machine_info(directory: Path) -> dict[str, Any]:
    """What the numbers were measured on."""
    cpuinfo = _read("/proc/cpuinfo")
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")),
        platform.processor() or "?",
    )
    device, mount, fstype = _mount_of(directory)
    disk = os.path.basename(device)
    rotational = _read(f"/sys/block/{disk}/queue/rotational").strip()
    vendor = _read(f"/sys/block/{disk}/device/vendor").strip()
    kind = {"0": "non-rotational", "1": "rotational (as reported)"}.get(rotational, "unknown")
    if vendor == "0x1af4":
        kind += ", virtio block device (virtual machine disk)"
    versions: dict[str, str] = {}
    for module in ("disklesslog", "msgpack", "crc32c", "zstandard", "persistqueue"):
        try:
            mod = __import__(module)
            versions[module] = str(getattr(mod, "__version__", getattr(mod, "version", "?")))
        except ImportError:
            versions[module] = "not installed"
    import sqlite3

    versions["sqlite"] = sqlite3.sqlite_version
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0
    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "usable_cpus": affinity,
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "os": f"{platform.system()} {platform.release()}",
        "bench_dir": str(directory),
        "filesystem": f"{fstype} on {device} (mounted at {mount})",
        "disk": kind,
        "versions": versions,
        "source": source_state(),
    }


def source_state() -> str:
    """The git commit of the checkout being measured, and whether the library is modified."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "disklesslog"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    if dirty:
        return f"commit {commit} + uncommitted changes in {len(dirty)} file(s) of disklesslog/"
    return f"commit {commit}"


# ------------------------------------------------------------ process and storage sizes


def rss_mb() -> float:
    """This process's resident set now, in MB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_rss_kib() -> int:
    """This process's peak resident set in KiB: Linux's ``VmHWM``, which starts afresh
    at ``exec``. Not ``getrusage``'s ``ru_maxrss`` (only the fallback): Linux carries it
    over from the forking parent across ``exec``, so a child of a large writer would
    report the writer's size."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def tree_size(root: Path) -> tuple[int, int]:
    """(bytes, files) under ``root`` (0, 0 if missing)."""
    size = files = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                size += os.stat(os.path.join(directory, name)).st_size
                files += 1
            except FileNotFoundError:
                continue  # deleted while walking (garbage collection)
    return size, files
