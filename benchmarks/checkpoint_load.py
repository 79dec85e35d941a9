"""What a fresh process pays to load an object-store sequencer checkpoint of a busy log.

    .venv/bin/python benchmarks/checkpoint_load.py --objects 300000 --reps 3

A busy object log's state holds every object written in the last minutes until garbage
collection deletes it (its 300 s grace: 300,000 objects at 1,000 flushes/s), and every
process opening the log loads the newest checkpoint. This builds such a checkpoint once
(100 empty streams and ``--objects`` dead objects, as ``MemorySequencer.snapshot()``
writes them), then times fresh processes decoding and loading it the way a process
opening the log does (``decode_checkpoint`` with the per-stream checks deferred where
this version has them, then ``MemorySequencer.from_snapshot``, the cyclic collector
paused) and reports each one's load time and peak RSS (``VmHWM``, from ``exec``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e3
    return float("nan")


def build(path: Path, objects: int) -> None:
    from disklesslog.sequencers import objectstore_format as fmt
    from disklesslog.sequencers.memory import MemorySequencer

    seq = MemorySequencer()
    for i in range(100):
        seq.create_stream(f"s-{i:03d}", {})
    state = seq.snapshot()
    start = 1_795_929_005_204_000_000
    state["objects"] = [
        [f"objects/{start + i * 1000:020d}-{i:016x}", 0, (start + i * 1000) / 1e9]
        for i in range(objects)
    ]
    path.write_bytes(fmt.encode_checkpoint(7, state, [], fmt.CHAIN_START))


def child(path: Path) -> None:
    """In a fresh process: load the checkpoint, print a JSON line."""
    from disklesslog.sequencers import objectstore_format as fmt
    from disklesslog.sequencers.memory import MemorySequencer

    data = path.read_bytes()
    before = _vm_hwm_mb()
    deferred = "deferred" in fmt.decode_checkpoint.__code__.co_varnames
    started = time.perf_counter()
    gc.disable()
    options: dict[str, Any] = {"deferred": True} if deferred else {}
    content = fmt.decode_checkpoint(data, 7, str(path), **options)
    MemorySequencer.from_snapshot(content.state)
    gc.enable()
    elapsed = time.perf_counter() - started
    print(json.dumps({"load_s": elapsed, "peak_mb": _vm_hwm_mb(), "before_mb": before}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "checkpoint"
        build(path, args.objects)
        runs = []
        for _ in range(args.reps):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  load {runs[-1]['load_s']:.3f} s, peak RSS {runs[-1]['peak_mb']:.0f} MB")
        size = path.stat().st_size
    result = {
        "objects": args.objects,
        "checkpoint_bytes": size,
        "median_load_s": statistics.median(r["load_s"] for r in runs),
        "median_peak_mb": statistics.median(r["peak_mb"] for r in runs),
        "runs": runs,
    }
    print(
        f"{args.objects:,} objects, checkpoint {size / 1e6:.1f} MB: load "
        f"{result['median_load_s']:.3f} s, peak RSS {result['median_peak_mb']:.0f} MB (medians)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
