"""Processes racing for one lease, for the lease tests of every backend: each worker
``target(*args, tag, barrier, results)`` waits at ``barrier`` with the others, tries to
acquire lease ``leader`` as ``worker-<tag>`` and puts ``(tag, token or None)`` on
``results``."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

SPAWN = multiprocessing.get_context("spawn")
WORKERS = 4


def race(target: Callable[..., None], *args: Any) -> int:
    """Start the workers at once; return the tag of the one winner, which got token 1
    (every other worker was refused, and every one exited cleanly)."""
    barrier = SPAWN.Barrier(WORKERS)
    results = SPAWN.Queue()
    workers = [
        SPAWN.Process(target=target, args=(*args, tag, barrier, results)) for tag in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    outcomes = dict(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0] * WORKERS
    winners = [tag for tag, token in outcomes.items() if token]
    assert len(winners) == 1 and outcomes[winners[0]] == 1, outcomes
    return winners[0]
