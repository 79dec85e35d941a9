"""Sum a fault-suite report (``DL_FAULTS_REPORT=path``, one JSON line per ledger) into
the tables of docs/faults.md::

    DL_FAULTS_REPORT=faults.jsonl ./dev test tests/faults -m "not slow"
    .venv/bin/python tests/faults/report.py faults.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict

OUTCOMES = ("intact", "repaired", "typed", "untyped-oserror", "VIOLATION")


def main(path: str) -> None:
    corruption: dict[str, Counter[str]] = defaultdict(Counter)
    campaigns: dict[str, Counter[str]] = defaultdict(Counter)
    calls: dict[str, Counter[str]] = defaultdict(Counter)
    examples: dict[str, list[str]] = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            name = entry["campaign"]
            if name.startswith("corruption"):
                for kind, outcome, count in entry["counts"]:
                    corruption[kind][outcome] += count
            else:
                target = name.split(":", 1)[1]
                for _kind, outcome, count in entry["counts"]:
                    campaigns[target][outcome] += count
                calls[target].update(entry["figures"])
            for key, found in entry["examples"].items():
                examples[f"{name} {key}"].extend(found)
    print("| file kind | damaged copies | " + " | ".join(OUTCOMES) + " |")
    print("|---|---:|" + "---:|" * len(OUTCOMES))
    total = Counter[str]()
    for kind in sorted(corruption):
        row = corruption[kind]
        total.update(row)
        cells = " | ".join(str(row.get(o, 0)) for o in OUTCOMES)
        print(f"| {kind} | {sum(row.values())} | {cells} |")
    cells = " | ".join(str(total.get(o, 0)) for o in OUTCOMES)
    print(f"| **all** | **{sum(total.values())}** | {cells} |")
    print()
    print(
        "| campaign | calls | faults | fail | lost | timeout | corrupt | acked | "
        "unknown outcome | typed | untyped-oserror | VIOLATION |"
    )
    print("|---|" + "---:|" * 11)
    for target in sorted(campaigns):
        fig = calls[target]
        kinds = Counter[str]()
        for key, value in fig.items():
            if "." in key and key.split(".")[0] in ("fail", "lost", "timeout", "corrupt"):
                kinds[key.split(".")[0]] += value
        row = campaigns[target]
        print(
            f"| {target} | {fig.get('calls', 0)} | {fig.get('injected', 0)} | "
            f"{kinds['fail']} | {kinds['lost']} | {kinds['timeout']} | {kinds['corrupt']} | "
            f"{fig.get('acknowledged', 0)} | {fig.get('unknown_outcome', 0)} | "
            f"{row.get('typed', 0)} | {row.get('untyped-oserror', 0)} | "
            f"{row.get('VIOLATION', 0)} |"
        )
    print()
    for key in sorted(examples):
        print(f"- {key}")
        for line in examples[key][:3]:
            print(f"    - {line[:300]}")


if __name__ == "__main__":
    main(sys.argv[1])
