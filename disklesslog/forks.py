"""What a child process made by ``fork()`` does with the package's objects it inherited.

A log opened before a ``fork()`` (``multiprocessing``'s default start method on Linux,
a pre-forking server's workers) may be used in the child. Everything the parent holds
stays the parent's: the child gets copies of its descriptors, of locks some thread may
have held at the moment of the fork (that thread does not exist in the child), of
buffers the parent's threads will write, and of leases held under the parent's name.
Used as they are, they would let the child append under a lock the parent holds too (one
open file description holds one ``flock`` for both), wait for ever on a lock or a
thread that is gone, write the parent's buffered records a second time, or renew the
parent's leases as if they were its own.

So every class that holds such things registers its instances here (:func:`reset_after_fork`)
with a function that, in the child, forgets them: new locks, no threads (started again
on first use), descriptors closed without unlocking anything (closing the child's copy
leaves the parent's lock held by the parent), buffers and in-flight work dropped
(the parent finishes them), new holder names. Nothing in the child releases, rewrites
or syncs what belongs to the parent.

:func:`reset_after_fork` gives the live set of a class's instances: an instance adds
itself when it comes to hold something and may discard itself when it lets go. A
lock that only needs to be free again in the child (a module's, or an instance's that
has nothing else to forget) is made by :func:`fork_safe_lock` or :func:`fork_safe_rlock`.
What cannot be forgotten (state a C library keeps per process, such as SQLite's table
of the locks its connections hold) must not be half-changed when the child is made: a
:class:`ForkGate` holds ``fork()`` back until such sections end.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["ForkGate", "fork_safe_lock", "fork_safe_rlock", "renewed_event", "reset_after_fork"]

T = TypeVar("T")


def reset_after_fork(reset: Callable[[T], None]) -> weakref.WeakSet[T]:
    """A new set of live instances; in a child made by ``fork()``, ``reset`` runs for
    every instance still in it (in the forking thread, the only one the child has),
    before ``fork()`` returns there. ``reset`` must not block, do I/O through what the
    parent shares, or start threads: whatever must run again starts on first use."""
    live: weakref.WeakSet[T] = weakref.WeakSet()

    def after_in_child() -> None:
        for instance in list(live):
            reset(instance)

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_in_child)
    return live


def renewed_event(event: threading.Event) -> threading.Event:
    """For a reset in a fork child: a new event in the state of ``event``, whose lock a
    thread of the parent may have held at the fork."""
    renewed = threading.Event()
    if event.is_set():
        renewed.set()
    return renewed


_LOCKS: weakref.WeakSet[Any] = weakref.WeakSet()


def fork_safe_lock() -> threading.Lock:
    """A new lock that is free again in a child made by ``fork()``, whichever thread of
    the parent held it then: for module-level locks, which no instance's reset renews.
    It is freed the way the standard library frees its own (``threading``,
    ``logging``, ``concurrent.futures``)."""
    lock = threading.Lock()
    _LOCKS.add(lock)
    return lock


def fork_safe_rlock() -> threading.RLock:
    """A new reentrant lock that is free again in a child made by ``fork()`` (see
    :func:`fork_safe_lock`)."""
    lock = threading.RLock()
    _LOCKS.add(lock)
    return lock


def _free_locks() -> None:
    for lock in list(_LOCKS):
        lock._at_fork_reinit()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_free_locks)


class ForkGate:
    """Sections of code that ``fork()`` waits for: any number run at once (each between
    :meth:`enter` and :meth:`leave`, or in :meth:`held`; a thread's sections may nest);
    a fork in any thread first waits until none runs, and none starts until it is
    done. For state a C library keeps per process that the child cannot reset (see the
    module). A section must not wait for anything a forking thread may hold, and
    should be short: the fork waits for it."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._running = 0
        self._forking = False
        self._depth = threading.local()  # sections a thread is in (they nest)
        _GATES.add(self)

    def enter(self) -> None:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth:  # within a section already: the fork waits for the outer one
            return
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._running += 1

    def leave(self) -> None:
        self._depth.n -= 1
        if self._depth.n:
            return
        with self._cond:
            self._running -= 1
            if not self._running:
                self._cond.notify_all()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def _before_fork(self) -> None:
        with self._cond:
            self._forking = True
            while self._running:
                self._cond.wait()

    def _after_fork(self, *, child: bool) -> None:
        if child:  # the sections of other threads are not in the child
            self._cond = threading.Condition(threading.Lock())
            self._running = 0
            self._forking = False
            self._depth = threading.local()
            return
        with self._cond:
            self._forking = False
            self._cond.notify_all()


_GATES: weakref.WeakSet[ForkGate] = weakref.WeakSet()


def _gates_before_fork() -> None:
    for gate in list(_GATES):
        gate._before_fork()


def _gates_after_fork(*, child: bool) -> None:
    for gate in list(_GATES):
        gate._after_fork(child=child)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_gates_before_fork,
        after_in_parent=lambda: _gates_after_fork(child=False),
        after_in_child=lambda: _gates_after_fork(child=True),
    )
