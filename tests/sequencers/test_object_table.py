"""The memory sequencer's table of objects against a plain dict: loaded from a
snapshot's sorted rows (kept as rows until the whole table is used) or from rows that
are not sorted (a dict at once), then changed, read, listed and snapshotted in any
order, it answers every question as the dict does, and copies out of its rows only
what is touched."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from disklesslog.sequencers.object_table import ObjectState, ObjectTable

KEYS = [f"objects/{i:04d}" for i in range(12)]
keys = st.sampled_from(KEYS)
states = st.builds(ObjectState, st.integers(0, 3), st.one_of(st.none(), st.floats(0, 10)))


class TableMachine(RuleBasedStateMachine):
    """Every operation the sequencer uses, on the table and on a dict model."""

    def __init__(self) -> None:
        super().__init__()
        self.table = ObjectTable()
        self.model: dict[str, tuple[int, float | None]] = {}

    @initialize(
        rows=st.dictionaries(keys, st.tuples(st.integers(0, 3), st.none() | st.floats(0, 10))),
        shuffled=st.booleans(),
    )
    def load(self, rows: dict[str, tuple[int, float | None]], shuffled: bool) -> None:
        listed = sorted([key, live, dead] for key, (live, dead) in rows.items())
        if shuffled:
            listed.reverse()
        self.table = ObjectTable(listed)
        self.model = dict(rows)

    @rule(key=keys)
    def get(self, key: str) -> None:
        state = self.table.get(key)
        if key in self.model:
            assert state is not None
            assert (state.live, state.dead_since) == self.model[key]
        else:
            assert state is None
        assert (key in self.table) == (key in self.model)

    @rule(key=keys, live=st.integers(0, 3))
    def change(self, key: str, live: int) -> None:
        state = self.table.get(key)
        if state is None:
            return
        state.live = live  # in place, as the sequencer does
        self.model[key] = (live, state.dead_since)

    @rule(key=keys, state=states)
    def add(self, key: str, state: ObjectState) -> None:
        if key in self.model:
            with pytest.raises(KeyError):
                self.table.add(key, state)
            return
        self.table.add(key, state)
        self.model[key] = (state.live, state.dead_since)

    @rule(key=keys)
    def remove(self, key: str) -> None:
        if key not in self.model:
            with pytest.raises(KeyError):
                self.table.remove(key)
            return
        self.table.remove(key)
        del self.model[key]

    @rule()
    def whole(self) -> None:
        assert sorted(self.table.keys()) == sorted(self.model)
        assert {k: (s.live, s.dead_since) for k, s in self.table.items()} == self.model

    @invariant()
    def same_size_and_rows(self) -> None:
        assert len(self.table) == len(self.model)
        rows: list[list[Any]] = sorted([k, live, dead] for k, (live, dead) in self.model.items())
        assert self.table.rows() == rows


TestObjectTable = TableMachine.TestCase
TestObjectTable.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_sorted_rows_stay_rows_until_the_whole_table_is_used() -> None:
    rows = [[f"objects/{i:06d}", 1, None] for i in range(1_000)]
    table = ObjectTable(rows)
    state = table.get("objects/000500")
    assert state is not None and state.live == 1
    state.live = 0
    state.dead_since = 5.0
    table.add("objects/999999", ObjectState(1, None))
    table.remove("objects/000001")
    assert len(table) == 1_000
    assert rows[500] == ["objects/000500", 1, None]  # the loaded rows are never changed
    assert table.rows()[499] == ["objects/000500", 0, 5.0]
    assert table.rows()[-1] == ["objects/999999", 1, None]
    untouched = ObjectTable(rows)
    assert untouched.rows() is rows  # a checkpoint of an unchanged table costs nothing


def test_rows_out_of_order_or_repeated_are_a_dict_at_once() -> None:
    table = ObjectTable([["b", 1, None], ["a", 0, 2.0], ["b", 2, None]])
    assert len(table) == 2
    b = table.get("b")
    assert b is not None and b.live == 2  # the last of duplicates, as a dict gives
    assert table.rows() == [["a", 0, 2.0], ["b", 2, None]]
