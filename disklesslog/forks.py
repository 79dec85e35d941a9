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
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["fork_safe_lock", "fork_safe_rlock", "reset_after_fork"]

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
