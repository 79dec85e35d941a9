"""The memory sequencer's objects: key -> how many live batches it holds, and since
when it is dead.

A busy log's state holds every object of the last minute or two until garbage
collection deletes it: 170,000 at 1,000 one-object flushes a second. A replica loaded
from a checkpoint gets them as rows sorted by key, and a process that opens the log
to read replays a few hundred entries after that checkpoint, each touching one or two
objects: building a dict of all of them took 0.3 s of such an open (0.6 s in all).
So the rows stay as loaded. An object an entry touches is copied out of them (a
bisect) into a dict of changes, a removed one is remembered as gone, and only a use of
the whole table (garbage collection listing the dead, a checkpoint of a changed
table) merges them into one dict, once.

The rows must be sorted by key and without duplicates for the bisect to find every
object: a checkpoint's are (``MemorySequencer.snapshot`` sorts them), and rows that
are not are made into a dict at once, as they always were.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ObjectState", "ObjectTable"]

_KEY = operator.itemgetter(0)


@dataclass(slots=True)  # one per object until it is collected: slots halve its size
class ObjectState:
    """An object's live batch count, and since when (sequencer clock) it has none."""

    live: int = 0
    dead_since: float | None = None


class ObjectTable:
    """A mapping of object key to :class:`ObjectState`, lazily over snapshot rows.

    :meth:`get` returns the state to change in place (a copy out of the rows, kept);
    :meth:`add` and :meth:`remove` insert and delete; :meth:`items` and :meth:`keys`
    see the whole table; :meth:`rows` gives it back as sorted snapshot rows. Not
    thread-safe: the sequencer's lock guards it.
    """

    __slots__ = ("_changed", "_gone", "_rows", "_size")

    def __init__(self, rows: list[list[Any]] | None = None) -> None:
        self._rows: list[list[Any]] | None = None
        self._changed: dict[str, ObjectState] = {}
        self._gone: set[str] = set()
        if not rows:
            self._size = 0
        elif _strictly_sorted(rows):
            self._rows = rows
            self._size = len(rows)
        else:  # not ours: a dict at once, as before (the last of duplicates wins)
            self._changed = {key: ObjectState(live, dead) for key, live, dead in rows}
            self._size = len(self._changed)

    def __len__(self) -> int:
        return self._size

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str) -> ObjectState | None:
        """The state of object ``key``, to change in place, or ``None``."""
        state = self._changed.get(key)
        if state is not None or self._rows is None or key in self._gone:
            return state
        row = self._row(key)
        if row is None:
            return None
        state = self._changed[key] = ObjectState(row[1], row[2])
        return state

    def add(self, key: str, state: ObjectState) -> None:
        """Insert object ``key``, which the table does not hold."""
        if key in self:
            raise KeyError(f"object {key!r} is already in the table")
        self._gone.discard(key)  # back after a removal: the change shadows its row
        self._changed[key] = state
        self._size += 1

    def remove(self, key: str) -> None:
        """Delete object ``key``, which the table holds."""
        if key not in self:  # copies it out of the rows if it is there
            raise KeyError(key)
        del self._changed[key]
        if self._rows is not None and self._row(key) is not None:
            self._gone.add(key)
        self._size -= 1

    def items(self) -> Iterator[tuple[str, ObjectState]]:
        return iter(self._merged().items())

    def keys(self) -> Iterator[str]:
        return iter(self._merged())

    def rows(self) -> list[list[Any]]:
        """``[key, live, dead_since]`` of every object, sorted by key: a snapshot's."""
        if self._rows is not None and not self._changed and not self._gone:
            return self._rows  # untouched since loaded, and sorted when written
        return sorted([key, s.live, s.dead_since] for key, s in self._merged().items())

    def _row(self, key: str) -> list[Any] | None:
        rows = self._rows
        if rows is None:
            return None
        at = bisect.bisect_left(rows, key, key=_KEY)
        return rows[at] if at < len(rows) and rows[at][0] == key else None

    def _merged(self) -> dict[str, ObjectState]:
        """Fold the rows into the dict of changes, once: from then on it is the table."""
        if self._rows is not None:
            changed, gone = self._changed, self._gone
            merged = {
                key: ObjectState(live, dead)
                for key, live, dead in self._rows
                if key not in changed and key not in gone
            }
            merged.update(changed)
            self._changed, self._rows, self._gone = merged, None, set()
        return self._changed


def _strictly_sorted(rows: list[list[Any]]) -> bool:
    """Whether the rows' keys increase strictly (sorted, no duplicates), checked in C."""
    keys = list(map(_KEY, rows))
    return all(map(operator.lt, keys, keys[1:]))
