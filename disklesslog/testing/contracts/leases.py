"""The lease contract: what ``acquire_lease``/``renew_lease``/``release_lease``/
``lease_holder`` do, on a sequencer and on a log alike (both offer the four methods).

:class:`LeaseContract` is mixed into :class:`~.sequencer.SequencerContract` (time from
the injected fake clock) and :class:`~.log.LogContract` (real time, short leases): a
subclass gives the ``lease_owner`` fixture (the object under test), ``wait`` (lets
time pass) and :attr:`LeaseContract.LEASE_MS`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from disklesslog.errors import ConfigError, InvalidStreamName, LeaseLost
from disklesslog.leases import Lease

__all__ = ["LeaseContract"]


class LeaseContract:
    """Lease tests on ``lease_owner`` (a sequencer or a log)."""

    LEASE_MS = 10_000
    """The duration of the leases the tests take (long enough to outlast a test's own
    steps when time is real)."""

    def test_lease_acquire_when_free(self, lease_owner: Any) -> None:
        assert lease_owner.lease_holder("m") is None
        lease = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        assert isinstance(lease, Lease)
        assert (lease.name, lease.holder, lease.token, lease.duration_ms) == (
            "m",
            "a",
            1,
            self.LEASE_MS,
        )
        held = lease_owner.lease_holder("m")
        assert held is not None and (held.holder, held.token) == ("a", 1)
        assert lease_owner.lease_holder("other") is None

    def test_lease_is_refused_to_a_second_holder_while_held(self, lease_owner: Any) -> None:
        first = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        assert lease_owner.acquire_lease("m", "b", self.LEASE_MS) is None
        again = lease_owner.acquire_lease("m", "a", self.LEASE_MS)  # the holder renews
        assert again is not None and again.token == first.token
        assert lease_owner.acquire_lease("m", "b", self.LEASE_MS) is None
        assert lease_owner.lease_holder("m").holder == "a"

    def test_expired_lease_is_taken_over_with_a_greater_token(
        self, lease_owner: Any, wait: Callable[[float], None]
    ) -> None:
        stale = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        assert lease_owner.acquire_lease("m", "b", self.LEASE_MS) is None
        wait(self.LEASE_MS / 1000)
        assert lease_owner.lease_holder("m") is None  # seen unchanged for its duration
        taken = lease_owner.acquire_lease("m", "b", self.LEASE_MS)
        assert taken is not None and taken.token == stale.token + 1
        with pytest.raises(LeaseLost):
            lease_owner.renew_lease(stale)
        lease_owner.release_lease(stale)  # a stale release changes nothing
        held = lease_owner.lease_holder("m")
        assert held is not None and (held.holder, held.token) == ("b", taken.token)
        assert lease_owner.renew_lease(taken).token == taken.token

    def test_release_then_acquire_increments_the_token(self, lease_owner: Any) -> None:
        first = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        lease_owner.release_lease(first)
        lease_owner.release_lease(first)  # idempotent
        assert lease_owner.lease_holder("m") is None
        with pytest.raises(LeaseLost):
            lease_owner.renew_lease(first)
        second = lease_owner.acquire_lease("m", "b", self.LEASE_MS)
        assert second.token == first.token + 1
        lease_owner.release_lease(second)
        third = lease_owner.acquire_lease("m", "a", self.LEASE_MS)  # the same holder again
        assert third.token == second.token + 1
        assert lease_owner.acquire_lease("n", "a", self.LEASE_MS).token == 1  # per name

    def test_lease_arguments_are_checked(self, lease_owner: Any) -> None:
        with pytest.raises(InvalidStreamName):
            lease_owner.acquire_lease("../x", "a", self.LEASE_MS)
        with pytest.raises(InvalidStreamName):
            lease_owner.lease_holder("")
        for holder in ("", 7, None, "x" * 256):
            with pytest.raises(ConfigError):
                lease_owner.acquire_lease("m", holder, self.LEASE_MS)
        for duration in (0, -1, True, 1.5, "10"):
            with pytest.raises(ConfigError):
                lease_owner.acquire_lease("m", "a", duration)
        for lease in ("m", None, Lease("m", "a", 0, 10, 0.0)):
            with pytest.raises(ConfigError):
                lease_owner.renew_lease(lease)
            with pytest.raises(ConfigError):
                lease_owner.release_lease(lease)
        assert lease_owner.lease_holder("m") is None  # nothing was stored

    def test_concurrent_acquirers_from_threads_one_wins(self, lease_owner: Any) -> None:
        results: list[Lease | None] = []
        errors: list[BaseException] = []
        start = threading.Barrier(6)

        def contend(i: int) -> None:
            try:
                start.wait()
                results.append(lease_owner.acquire_lease("m", f"h{i}", self.LEASE_MS))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        won = [r for r in results if r is not None]
        assert len(won) == 1 and won[0].token == 1
        assert lease_owner.lease_holder("m").holder == won[0].holder

    def test_pruned_lease_acquired_again_gets_a_greater_token(self, lease_owner: Any) -> None:
        first = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        lease_owner.release_lease(first)
        second = lease_owner.acquire_lease("m", "b", self.LEASE_MS)
        lease_owner.release_lease(second)
        kept = lease_owner.acquire_lease("k", "a", self.LEASE_MS)
        assert lease_owner.prune_leases(0) == ["m"]  # released: removed; held: kept
        assert lease_owner.prune_leases(0) == []
        assert lease_owner.lease_holder("m") is None
        with pytest.raises(LeaseLost):
            lease_owner.renew_lease(second)
        again = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        assert again is not None and again.token > second.token
        assert lease_owner.renew_lease(kept).token == kept.token

    def test_pruning_never_removes_a_held_lease(
        self, lease_owner: Any, wait: Callable[[float], None]
    ) -> None:
        held = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        assert lease_owner.prune_leases(0) == []
        assert lease_owner.renew_lease(held).token == held.token
        released = lease_owner.acquire_lease("r", "a", self.LEASE_MS)
        lease_owner.release_lease(released)
        assert lease_owner.prune_leases(self.LEASE_MS) == []  # not seen released long enough
        wait(self.LEASE_MS / 1000)
        assert lease_owner.prune_leases(self.LEASE_MS) == ["m", "r"]  # m expired unrenewed
        with pytest.raises(LeaseLost):
            lease_owner.renew_lease(held)
        taken = lease_owner.acquire_lease("m", "b", self.LEASE_MS)
        assert taken is not None and taken.token > held.token

    def test_prune_age_is_checked(self, lease_owner: Any) -> None:
        lease = lease_owner.acquire_lease("m", "a", self.LEASE_MS)
        lease_owner.release_lease(lease)
        for age in (-1, 1.5, "0", None, True):
            with pytest.raises(ConfigError):
                lease_owner.prune_leases(age)
        assert lease_owner.lease_keeper().verify() == (1, [])  # nothing was removed

    def test_tokens_stay_unique_while_threads_acquire_release_and_prune(
        self, lease_owner: Any
    ) -> None:
        """A drop racing with a first acquire of the same name cannot slip a token at or
        below the floor in: every token handed out for the name is new."""
        tokens: list[int] = []
        errors: list[BaseException] = []
        start = threading.Barrier(4)

        def churn(i: int) -> None:
            try:
                start.wait()
                for _ in range(8):
                    lease = lease_owner.acquire_lease("m", f"h{i}", self.LEASE_MS)
                    if lease is not None:
                        tokens.append(lease.token)
                        lease_owner.release_lease(lease)
                    lease_owner.prune_leases(0)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert tokens and len(set(tokens)) == len(tokens)
