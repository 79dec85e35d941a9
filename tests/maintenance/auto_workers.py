"""Child-process code of the automatic maintenance tests: a writer that appends now and
then and records, every few milliseconds, how it sees maintenance (one JSON line each:
wall time, whether it maintains, its lease token, its passes)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import disklesslog

SAMPLE_S = 0.02


def write_and_watch(url: str, options: dict[str, Any], out: str) -> None:
    """Append and sample until killed."""
    with disklesslog.open(url, **options) as log, open(out, "a", buffering=1) as lines:
        stream = log.stream("events")
        while True:
            stream.append(b"x")
            status = log.maintenance_status()
            sample = {
                "t": time.time(),
                "maintaining": status.maintaining,
                "token": status.token,
                "passes": status.passes,
                "holder": status.holder,
            }
            lines.write(json.dumps(sample) + "\n")
            time.sleep(SAMPLE_S)


if __name__ == "__main__":
    write_and_watch(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])
