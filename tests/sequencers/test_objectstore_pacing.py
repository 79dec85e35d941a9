"""The pacing of the object-store sequencer's tries for entries
(:mod:`disklesslog.sequencers.objectstore_pacing`), on an injected clock: a winner
alone never waits but probes now and then, a contended winner yields, longer losers
pause less, contention is forgotten, saturation is reported once a period."""

from __future__ import annotations

import pytest

from disklesslog.sequencers.objectstore_pacing import (
    CONTENTION_MEMORY,
    PRIORITY_LEVELS,
    PROBE_EVERY,
    WARN_EVERY,
    YIELD_GETS,
    Pacing,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pacing() -> tuple[Pacing, Clock]:
    clock = Clock()
    pacing = Pacing(clock)
    for _ in range(20):  # settle the moving averages: 20 ms per PUT, 10 ms per GET
        pacing.observe_put(0.02)
        pacing.observe_get(0.01)
    return pacing, clock


def test_a_writer_alone_waits_only_to_probe() -> None:
    pacing, clock = _pacing()
    assert pacing.pause_before_try() == 0.0
    for n in range(1, 3 * PROBE_EVERY + 1):
        pacing.won()
        pause = pacing.pause_before_try()
        if n % PROBE_EVERY:
            assert pause == 0.0
        else:  # long enough for a loser whose PUT was in flight to catch up and try
            assert pause == pytest.approx(pacing.put_seconds + YIELD_GETS * pacing.get_seconds)
            clock.now += 0.005
            assert pacing.pause_before_try() == pytest.approx(pause - 0.005)
            clock.now += 1.0
            assert pacing.pause_before_try() == 0.0  # a writer that paused anyway pays nothing
    assert pacing.metrics(0)["sequencer_races_lost"] == 0


def test_a_contended_winner_yields_until_the_losers_could_try() -> None:
    pacing, clock = _pacing()
    pacing.lost()
    clock.now += 0.03
    pacing.won()
    assert pacing.pause_before_try() == pytest.approx(YIELD_GETS * pacing.get_seconds)
    clock.now += 0.01
    assert pacing.pause_before_try() == pytest.approx((YIELD_GETS - 1) * pacing.get_seconds)
    clock.now += YIELD_GETS * pacing.get_seconds
    assert pacing.pause_before_try() == 0.0


def test_the_longer_a_loser_lost_the_sooner_it_tries() -> None:
    pacing, _ = _pacing()
    pauses = []
    for _ in range(PRIORITY_LEVELS + 2):
        pacing.lost()
        pauses.append(pacing.pause_before_try())
    assert pauses == sorted(pauses, reverse=True)
    assert pauses[0] < pacing.get_seconds  # a loser's pause stays under a GET latency
    assert pauses[PRIORITY_LEVELS - 1 :] == [0.0] * 3
    assert (
        YIELD_GETS * pacing.get_seconds > pacing.get_seconds + pauses[0]
    )  # the winner waits longer


def test_contention_is_forgotten() -> None:
    pacing, clock = _pacing()
    pacing.lost()
    pacing.won()
    assert pacing.pause_before_try() > 0
    clock.now += CONTENTION_MEMORY
    assert pacing.pause_before_try() == 0.0


def test_saturation_is_reported_once_a_period_with_the_entry_rate() -> None:
    pacing, clock = _pacing()
    assert pacing.saturation(tail=100) is None  # the period starts
    for _ in range(30):
        pacing.lost()
        pacing.lost()
        pacing.won()
        pacing.committed(2.0)
    clock.now += WARN_EVERY
    warning = pacing.saturation(tail=100 + 30 * int(WARN_EVERY))
    assert warning is not None
    assert "30 entries/s" in warning
    assert "lost 60 of its 90 races" in warning
    assert "2.00 s on average" in warning
    assert "PostgreSQL sequencer" in warning and "docs/sequencers.md" in warning
    for _ in range(30):  # still saturated in the next period, but warned a minute ago
        pacing.lost()
        pacing.lost()
        pacing.won()
        pacing.committed(2.0)
    clock.now += WARN_EVERY / 2
    assert pacing.saturation(tail=5000) is None
    clock.now += WARN_EVERY
    assert pacing.saturation(tail=9000) is not None


def test_a_busy_but_keeping_up_sequencer_is_not_saturated() -> None:
    pacing, clock = _pacing()
    pacing.saturation(tail=0)
    for _ in range(50):  # lost most races, but commits waited little
        pacing.lost()
        pacing.lost()
        pacing.won()
        pacing.committed(0.1)
    clock.now += WARN_EVERY
    assert pacing.saturation(tail=500) is None
    for _ in range(50):  # waited long, but won most races (slow storage, no contention)
        pacing.won()
        pacing.committed(1.0)
    clock.now += WARN_EVERY
    assert pacing.saturation(tail=1000) is None


def test_metrics_count_what_happened() -> None:
    pacing, _ = _pacing()
    pacing.won()
    pacing.lost()
    pacing.gave_up()
    pacing.committed(0.5)
    pacing.record_yield(0.25)
    metrics = pacing.metrics(backlog=7)
    assert metrics["sequencer_entries_written"] == 1
    assert metrics["sequencer_races_lost"] == 1
    assert metrics["sequencer_conflicts"] == 1
    assert metrics["sequencer_commits"] == 1
    assert metrics["sequencer_commit_wait_seconds"] == 0.5
    assert metrics["sequencer_yield_seconds"] == 0.25
    assert metrics["sequencer_backlog"] == 7
    assert metrics["sequencer_put_latency_ms"] == pytest.approx(20, rel=0.1)
    assert metrics["sequencer_get_latency_ms"] == pytest.approx(10, rel=0.1)


def test_latencies_are_measured_ones_not_the_first_guess() -> None:
    """A writer alone measures a PUT on every entry but a GET only when it catches up
    (every few minutes), and its probes wait a few GET latencies: guessed at 10 ms on a
    disk that answers in 0.1 ms, they took half of its time (371 against 1,484 entries
    a second). Until a GET is measured the PUT latency stands in for it when smaller,
    and the first measurement of each replaces the guess."""
    clock = Clock()
    pacing = Pacing(clock)
    pacing.observe_put(0.0001)
    assert pacing.put_seconds == 0.0001
    assert pacing.get_seconds == 0.0001  # no GET measured: the PUT's latency
    for _ in range(PROBE_EVERY):
        pacing.won()
    assert pacing.pause_before_try() == pytest.approx(0.0001 + YIELD_GETS * 0.0001)
    pacing.observe_get(0.00005)
    assert pacing.get_seconds == 0.00005  # measured: the guess is gone at once
    slow = Pacing(clock)
    slow.observe_put(0.05)  # a slow bucket: the guess (10 ms) until a GET is measured
    assert slow.get_seconds == 0.01
