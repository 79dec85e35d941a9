"""Kill a child process inside the operation a crash test is about, by construction.

A crash test that SIGKILLs its child after a random delay depends on the machine's
speed: on a fast, idle machine the operation is often over before the kill, on a slow
one it has barely begun. Instead the child calls :func:`arm`, which counts the calls by
which the process changes files (``os.write``, ``os.rename``, ``fsync``, opening a file
for writing, ...: every state on disk that a crash can leave lies between two of them).
At the call numbered ``stop_at`` the child reports where it is and waits, so the
parent's SIGKILL lands exactly there, whatever the speed of either. With ``tear``, a
write it stops at first writes part of its data: what a kill inside the system call
leaves (Linux stops a large ``write`` between pages for a fatal signal).

A calibration run (``stop_at=None``) of the same operation on a copy of the data counts
its calls, and :func:`mark` notes where named steps fall among them, so the parent can
draw ``stop_at`` from the whole operation or from a part of it.

The child writes its reports as lines to a file (any child can: forked, spawned or run
as a script); :func:`wait` reads them in the parent.
"""

from __future__ import annotations

import builtins
import io
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

FILE_CALLS = (
    "write",
    "writev",
    "pwrite",
    "pwritev",
    "ftruncate",
    "truncate",
    "fsync",
    "fdatasync",
    "rename",
    "replace",
    "unlink",
    "remove",
    "rmdir",
    "mkdir",
    "link",
    "symlink",
    "open",  # only with O_CREAT, O_TRUNC or O_APPEND
)
"""The ``os`` functions counted by default (with ``open``, Python's ``open`` for writing)."""

WAIT_SECONDS = 300
"""How long a stopped child waits for its SIGKILL before giving up (exit status 3)."""

_WRITE_FLAGS = os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass
class Report:
    """What a child reported: the call it stopped at (``None``: it did not) or whether
    it finished; how many calls it counted (with the one it stopped at, which it never
    made, or tore); where each :func:`mark` fell (the number of calls counted before it,
    each time it was passed); for a torn write, ``(bytes written, bytes asked for)``;
    an error."""

    stopped_at: int | None = None
    finished: bool = False
    call: str = ""
    calls: int = 0
    marks: dict[str, list[int]] = field(default_factory=dict)
    torn: tuple[int, int] | None = None
    error: str = ""

    def mark(self, label: str) -> int:
        """The calls made before ``label`` was first passed."""
        assert label in self.marks, f"the operation never reached {label!r}: {self.marks}"
        return self.marks[label][0]

    def spans(self, name: str) -> list[tuple[int, int]]:
        """The calls made inside each call of a function :func:`marking` watched, as
        ``(first, last)`` numbers (calls without any are left out)."""
        starts, ends = self.marks.get(name, []), self.marks.get(f"{name} done", [])
        return [(start + 1, end) for start, end in zip(starts, ends) if end > start]


class _Counter:
    def __init__(self, path: Path, stop_at: int | None, tear: bool, inside: str | None) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.stop_at = stop_at
        self.tear = tear
        self.inside = inside
        self.depth = 0  # calls of ``inside`` under way
        self.write = os.write  # the originals: reporting is not counted
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def report(self, line: str) -> None:
        self.write(self.fd, (line + "\n").encode())

    def count(self, name: str, original: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Count a call; at ``stop_at``, (tear and) report, then wait to be killed."""
        with self.lock:
            if self.inside is not None and not self.depth:
                return
            self.calls += 1
            if self.calls != self.stop_at:
                return
            torn = ""
            if self.tear and name in ("write", "writev"):
                data = args[1] if name == "write" else b"".join(args[1])
                if len(data) > 1:
                    cut = random.randrange(1, len(data))
                    written = self.write(args[0], data[:cut])
                    torn = f" torn {written} {len(data)}"
            self.report(f"stop {self.calls} {name}{torn}")
            # Still holding the lock: another thread stops at its next counted call.
            time.sleep(WAIT_SECONDS)
            os._exit(3)


_armed: list[_Counter] = []  # the counter of this process, once armed


def arm(
    path: str | Path,
    stop_at: int | None = None,
    *,
    calls: tuple[str, ...] = FILE_CALLS,
    tear: bool = False,
    inside: str | None = None,
) -> None:
    """In the current (child) process, from now on: count ``calls`` (``os`` function
    names), report to ``path``, and stop at call number ``stop_at`` (see the module).
    With ``inside``, only the calls made inside a function of that name that
    :func:`marking` watches count (a child repeating an operation stops in one)."""
    counter = _Counter(Path(path), stop_at, tear, inside)
    _armed[:] = [counter]

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            flags = args[1] if len(args) > 1 else kwargs.get("flags", 0)
            if name != "open" or flags & _WRITE_FLAGS:
                counter.count(name, original, args)
            return original(*args, **kwargs)

        return counted

    for name in calls:
        setattr(os, name, wrap(name, getattr(os, name)))
    if "open" in calls:  # files opened for writing by Python's io (pathlib, fsspec)
        original_open = io.open

        def counted_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            mode = args[0] if args else kwargs.get("mode", "r")
            if any(c in mode for c in "wax+"):
                counter.count("open", original_open, (file, mode))
            return original_open(file, *args, **kwargs)

        builtins.open = io.open = counted_open


def mark(label: str) -> None:
    """Report ``label`` with the number of calls made so far (a no-op unless armed)."""
    for counter in _armed:
        with counter.lock:
            counter.report(f"mark {label} {counter.calls}")


def marking(module: Any, *names: str) -> None:
    """Mark every call of the functions ``names`` of ``module`` (a module or a class:
    their entry as the name, their return as "<name> done"), so :meth:`Report.spans`
    can tell which file calls each made. Patches ``module``: callers that look the name
    up there see it."""

    def marked(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            mark(name)
            for counter in _armed:
                counter.depth += name == counter.inside
            try:
                result = function(*args, **kwargs)
            finally:
                for counter in _armed:
                    counter.depth -= name == counter.inside
            mark(f"{name} done")
            return result

        return call

    for name in names:
        setattr(module, name, marked(name, getattr(module, name)))


def finish(error: BaseException | None = None) -> None:
    """Report that the operation ended, with the calls it made (or the error it raised)."""
    (counter,) = _armed
    with counter.lock:
        if error is None:
            counter.report(f"done {counter.calls}")
        else:
            counter.report(f"error {type(error).__name__}: {error}".replace("\n", " "))


class Child(Protocol):
    """A child process: ``subprocess.Popen`` or :class:`Forked`."""

    def poll(self) -> int | None: ...


def wait(path: str | Path, child: Child, timeout: float = 120.0) -> Report:
    """In the parent: wait until ``child`` reported a stop, an end or an error, or has
    ended; return what it reported."""
    deadline = time.monotonic() + timeout
    while True:
        ended = child.poll() is not None  # before reading: its last report is in then
        report = read(path)
        if report.stopped_at is not None or report.error or report.finished:
            return report
        if ended:
            report.error = "the child ended without a report"
            return report
        assert time.monotonic() < deadline, f"no stop or end reported in {timeout} s: {report}"
        time.sleep(0.001)


def read(path: str | Path) -> Report:
    """What a child has reported to ``path`` so far (whole lines only)."""
    try:
        lines = Path(path).read_text().split("\n")[:-1]
    except FileNotFoundError:
        lines = []
    report = Report()
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "mark":
            label, count = rest.rsplit(" ", 1)  # labels may hold spaces
            report.marks.setdefault(label, []).append(int(count))
        elif kind == "stop":
            number, call, *torn = rest.split()
            report.stopped_at = report.calls = int(number)
            report.call = call
            if torn:
                report.torn = (int(torn[1]), int(torn[2]))
        elif kind == "done":
            report.calls, report.finished = int(rest), True
        elif kind == "error":
            report.error = rest
    return report


@dataclass
class Forked:
    """A child made by ``os.fork()``, reaped exactly once (a pid is never signalled
    after its child was reaped: it may belong to another process by then)."""

    pid: int
    status: int | None = None

    def poll(self) -> int | None:
        """``None`` while the child runs, then its wait status."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status

    def join(self) -> int:
        """Wait for the child to end; its wait status."""
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)
        return self.status

    def kill(self) -> int:
        """SIGKILL the child unless it ended; its wait status."""
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)
        assert self.status is not None
        return self.status


def child_env() -> dict[str, str]:
    """The environment for a child run as a script that imports this module."""
    here = str(Path(__file__).resolve().parent)
    paths = [here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
