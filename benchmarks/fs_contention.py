"""What a local filesystem charges for creating files right after many were deleted.

    .venv/bin/python benchmarks/fs_contention.py --files 20000 --deleted 200000 --json out.json

An object log on ``file://`` creates two files per flush (the object, and the
sequencer's entry: each a temporary file renamed or hard-linked into place), and in the
steady state its maintenance deletes as many as are written. A log's first minutes
delete nothing (the first pass comes after an interval, and garbage waits out its
grace), so a commit rate measured then and one measured in the steady state differ by
what deleting costs. This measures it without the library, in one process: the time to
create one 150-byte file the way the library does (``O_EXCL`` temporary file, hard
link, unlink of the temporary),

1. ``before``: in a new directory;
2. ``after deleting``: in another new directory, right after ``--deleted`` files were
   created and deleted in a third one (what a busy log's maintenance does in a few
   minutes);
3. ``while deleting``: in another new directory while a thread deletes ``--deleted``
   more files.

What it found on the ext4 of docs/benchmarks.md is recorded there: creating a file cost
several times more, nearly all of it system time, for minutes after a few hundred
thousand files had been deleted nearby, and recovered once the deleting stopped; the
numbers vary a lot from run to run, so read one run's ratios, not its absolute times.
Run it on a quiet machine, in a directory (``--dir``) whose filesystem has not just
seen heavy deleting, since that is what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from common import Scratch, machine_info

DATA = b"x" * 150


def _fill(directory: Path, count: int) -> None:
    directory.mkdir(parents=True)
    for i in range(count):
        fd = os.open(f"{directory}/old{i:09d}", os.O_CREAT | os.O_WRONLY)
        os.write(fd, DATA)
        os.close(fd)


def _delete(directory: Path, count: int) -> None:
    for i in range(count):
        os.remove(f"{directory}/old{i:09d}")


def _create(directory: Path, count: int) -> dict[str, float]:
    """Microseconds per file (wall, and this process's system time) to create ``count``
    files as the library's put-if-absent does."""
    directory.mkdir(parents=True)
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for i in range(count):
        path = f"{directory}/new{i:09d}"
        fd = os.open(path + ".tmp", os.O_CREAT | os.O_WRONLY | os.O_EXCL)
        os.write(fd, DATA)
        os.close(fd)
        os.link(path + ".tmp", path)
        os.unlink(path + ".tmp")
    wall = time.perf_counter() - started
    system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - before.ru_stime
    return {"create_us": wall / count * 1e6, "system_us": system / count * 1e6}


def run(work: Path, files: int, deleted: int) -> list[dict[str, Any]]:
    rows = [{"phase": "before", **_create(work / "before", files)}]
    _fill(work / "doomed", deleted)
    _delete(work / "doomed", deleted)
    rows.append({"phase": "after deleting", **_create(work / "after", files)})
    _fill(work / "doomed-2", deleted)
    deleter = threading.Thread(target=_delete, args=(work / "doomed-2", deleted))
    deleter.start()
    rows.append({"phase": "while deleting", **_create(work / "while", files)})
    deleter.join()
    shutil.rmtree(work)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--deleted", type=int, default=200_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR)")
    args = parser.parse_args()
    with Scratch(args.dir) as scratch:
        rows = run(scratch.path / "run", args.files, args.deleted)
        machine = machine_info(scratch.path)
    first = rows[0]["create_us"]
    for row in rows:
        print(
            f"{row['phase']:>15}: {row['create_us']:6.1f} us per file "
            f"({row['system_us']:.1f} us system), {row['create_us'] / first:.2f}x before",
            flush=True,
        )
    if args.json:
        result = {
            "command": f"benchmarks/fs_contention.py --files {args.files} --deleted {args.deleted}",
            "rows": rows,
            "machine": machine,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
