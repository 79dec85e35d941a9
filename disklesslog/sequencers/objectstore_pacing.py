"""How a process of the object-store sequencer paces its tries for the next entry.

Entries are numbered, and entry ``n + 1`` goes to whoever creates it first
(put-if-absent). Under contention that race has a *capture effect*, as Ethernet's
collisions had: the process that just won knows the new tail at once and can try for
the next number immediately, while every loser must first read the entry it lost to
(a GET) before it can try again. Its next request is always late, so the winner wins
again, and again, for as long as it has something to commit: measured with two
processes at 20 ms per PUT, one acknowledged its records in 60 ms while the other
waited 10 s for the first entry it ever won.

:class:`Pacing` breaks it with two rules, and counts what happens:

* **A winner yields under contention.** After winning an entry, a process that lost a
  race within the last :data:`CONTENTION_MEMORY` seconds waits :data:`YIELD_GETS` of
  its measured GET latencies before trying for another one: long enough for the
  losers to read the entry they lost to and ask for the next number first. A process
  that has not lost lately cannot tell whether others are trying (a failed
  put-if-absent is seen only by whoever sent it), so every :data:`PROBE_EVERY`-th win
  in a row it waits anyway, until a PUT latency plus :data:`YIELD_GETS` GET latencies
  after the win (a loser may have had a PUT in flight when it won): a process that
  keeps losing to it gets that number, and from its first loss on the winner yields
  as above. A writer alone pays that wait once every :data:`PROBE_EVERY` entries, and
  only while its entries follow each other without a pause; the latencies it waits
  are measured ones (it measures a PUT on every entry, and until it has measured a
  GET, that stands in for one), never a guess far above what its storage takes.
* **The longest loser goes first.** A loser reads the entry it lost to (only that one:
  it knows it exists) and asks for the next number without probing for it, after a
  pause that shrinks with the races it lost in a row: a GET latency times
  ``(PRIORITY_LEVELS - losses) / (PRIORITY_LEVELS + 1)``, nothing from
  :data:`PRIORITY_LEVELS` losses on. Put-if-absent goes to the request that arrives
  first, so among the processes racing for a number the one that has waited longest
  asks first and wins, and the order of winners approaches a round. (The exponential
  back-off this replaced did the opposite: the more a process had lost, the longer
  it sat out, so under load one process waited 10 s while the others committed.)

Each entry carries everything its process had waiting (every operation queued by the
time of the try), so a process that wins one entry in ``k`` still commits all of its
work: the total capacity is about one entry per PUT plus GET latency, shared among
the processes, and each entry's size grows with the load. Beyond that capacity
commits wait; :meth:`Pacing.saturation` reports it (the log warns once a minute and
``metrics()`` counts the lost races, the retries and the backlog).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..forks import fork_safe_lock

__all__ = [
    "CONTENTION_MEMORY",
    "PRIORITY_LEVELS",
    "PROBE_EVERY",
    "SATURATED_WAIT",
    "WARN_EVERY",
    "YIELD_GETS",
    "Pacing",
]

CONTENTION_MEMORY = 2.0
"""Seconds after its last lost race during which a process counts as contended (and
yields after its wins)."""
YIELD_GETS = 2.5
"""A contended winner's pause before its next try, in GET latencies, counted from its
win: a loser needs one GET to catch up and up to three quarters of one more of priority
pause (:data:`PRIORITY_LEVELS`); the rest is margin for the spread of real latencies.
Longer yields cost entries per second; at 2, two writers at 20 ms linger sometimes fell
into the winner-keeps-winning pattern again (p99 0.8 s instead of 0.25 s)."""
PROBE_EVERY = 4
"""Wins in a row after which an uncontended winner waits two GET latencies once (see
the module), so that a process losing every race to it gets one."""
PRIORITY_LEVELS = 3
"""Losses in a row from which a loser tries again without a pause; fewer losses pause
for a share of a GET latency, so that longer losers ask first."""
SATURATED_WAIT = 0.5
"""Mean seconds a commit waited, over a warning period, above which (with most races
lost) the sequencer is called saturated."""
WARN_EVERY = 60.0
"""Seconds between two warnings that the sequencer is saturated."""
_SMOOTHING = 8  # the moving averages of latency follow the last few requests
_FIRST_GUESS = 0.01  # seconds, until a request was measured (see Pacing.get_seconds)


class Pacing:
    """One sequencer instance's view of the race for entries: latencies measured, the
    last win and loss, and counters. Thread-safe (the counters are updated under a
    lock; the decisions read floats)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # monotonic seconds (a test injects its own)
        self._lock = fork_safe_lock()
        self.put_seconds = _FIRST_GUESS
        self._put_measured = False
        self._get_seconds: float | None = None  # no GET measured yet
        self._lost_at = -float("inf")
        self._won_at = -float("inf")
        self._losses_in_a_row = 0
        self._wins_in_a_row = 0
        self.entries_written = 0
        self.races_lost = 0
        self.conflicts = 0
        self.commits = 0
        self.commit_wait_seconds = 0.0
        self.yield_seconds = 0.0
        # The warning period's share of the counters, and the tail at its start.
        self._period_start = clock()
        self._period_tail: int | None = None
        self._period = [0, 0, 0, 0.0]  # tries, losses, commits, wait seconds
        self._warned_at = -float("inf")

    # ------------------------------------------------------------ measurements

    def observe_put(self, seconds: float) -> None:
        if not self._put_measured:  # the first measurement replaces the guess
            self._put_measured = True
            self.put_seconds = seconds
            return
        self.put_seconds += (seconds - self.put_seconds) / _SMOOTHING

    def observe_get(self, seconds: float) -> None:
        if self._get_seconds is None:
            self._get_seconds = seconds
            return
        self._get_seconds += (seconds - self._get_seconds) / _SMOOTHING

    @property
    def get_seconds(self) -> float:
        """The GET latency, as measured; until a GET was, the smaller of the first guess
        and the measured PUT latency. A writer alone measures GETs rarely (it reads
        entries only to catch up, every few minutes) but a PUT on every entry, and
        its probes wait a few GET latencies: at a guessed 10 ms on a local disk, where
        a request takes 0.1 ms, they took half of its time."""
        if self._get_seconds is not None:
            return self._get_seconds
        return min(_FIRST_GUESS, self.put_seconds)

    def won(self) -> None:
        with self._lock:
            self._won_at = self._clock()
            self._losses_in_a_row = 0
            self._wins_in_a_row += 1
            self.entries_written += 1
            self._period[0] += 1

    def lost(self) -> None:
        with self._lock:
            self._lost_at = self._clock()
            self._losses_in_a_row += 1
            self._wins_in_a_row = 0
            self.races_lost += 1
            self._period[0] += 1
            self._period[1] += 1

    def gave_up(self) -> None:
        with self._lock:
            self.conflicts += 1

    def committed(self, waited: float) -> None:
        """One call's operations were applied (or failed) ``waited`` seconds after it
        queued them."""
        with self._lock:
            self.commits += 1
            self.commit_wait_seconds += waited
            self._period[2] += 1
            self._period[3] += waited

    # --------------------------------------------------------------- decisions

    def pause_before_try(self) -> float:
        """Seconds to wait before the next try for an entry (see the module)."""
        now = self._clock()
        if now - self._lost_at >= CONTENTION_MEMORY:
            if self._wins_in_a_row and self._wins_in_a_row % PROBE_EVERY == 0:
                # A loser may have had a PUT in flight when this process won: it learns
                # of its loss up to a PUT latency later, then reads the entry.
                probe = self.put_seconds + YIELD_GETS * self.get_seconds
                return max(0.0, self._won_at + probe - now)
            return 0.0
        if self._won_at > self._lost_at:  # won last time: let the losers go first
            return max(0.0, self._won_at + YIELD_GETS * self.get_seconds - now)
        waiting = max(0, PRIORITY_LEVELS - self._losses_in_a_row)
        return self.get_seconds * waiting / (PRIORITY_LEVELS + 1)

    def record_yield(self, seconds: float) -> None:
        with self._lock:
            self.yield_seconds += seconds

    # ---------------------------------------------------------------- reporting

    def saturation(self, tail: int) -> str | None:
        """Once per :data:`WARN_EVERY`: a sentence saying the sequencer is saturated
        (this process's commits waited :data:`SATURATED_WAIT` on average and it lost
        most races), with the entry rate of every writer together; else None."""
        now = self._clock()
        with self._lock:
            elapsed = now - self._period_start
            if elapsed < WARN_EVERY:
                if self._period_tail is None:
                    self._period_tail = tail
                return None
            tries, losses, commits, waited = self._period
            first_tail = tail if self._period_tail is None else self._period_tail
            self._period_start, self._period_tail = now, tail
            self._period = [0, 0, 0, 0.0]
            mean_wait = waited / commits if commits else 0.0
            if mean_wait < SATURATED_WAIT or 2 * losses < tries:
                return None
            if now - self._warned_at < WARN_EVERY:
                return None
            self._warned_at = now
        rate = (tail - first_tail) / elapsed
        return (
            f"the object-store sequencer is saturated: its writers together wrote "
            f"{rate:.0f} entries/s over the last {elapsed:.0f} s, about what one bucket "
            f"orders at {1000 * self.put_seconds:.0f} ms per PUT and "
            f"{1000 * self.get_seconds:.0f} ms per GET (one entry per PUT and GET); this "
            f"process lost {losses} of its {tries} races and its commits waited "
            f"{mean_wait:.2f} s on average. Fewer, larger flushes (linger_ms) or the "
            "PostgreSQL sequencer take more writers: see docs/sequencers.md"
        )

    def metrics(self, backlog: int) -> dict[str, float]:
        with self._lock:
            return {
                "sequencer_entries_written": self.entries_written,
                "sequencer_races_lost": self.races_lost,
                "sequencer_conflicts": self.conflicts,
                "sequencer_commits": self.commits,
                "sequencer_commit_wait_seconds": self.commit_wait_seconds,
                "sequencer_yield_seconds": self.yield_seconds,
                "sequencer_backlog": backlog,
                "sequencer_put_latency_ms": 1000 * self.put_seconds,
                "sequencer_get_latency_ms": 1000 * self.get_seconds,
            }
