"""A fault-injecting fsspec filesystem, for testing code against unreliable storage.

``FaultyFileSystem`` (protocol ``faulty://``) wraps any fsspec filesystem (memory and
local files are what the project's tests use) and, decided by a seeded random number
generator and per-fault rates, makes the calls a client of object storage makes go
wrong the ways real ones do:

``fail``
    the call raises before it reaches the target: nothing happened.
``lost``
    the call is applied, then raises: the response was lost on the way back (a PUT
    stored, a DELETE done, a conditional create won, and the caller cannot know).
``timeout``
    the call waits ``timeout_seconds`` and raises :class:`TimeoutError`; whether it was
    applied is decided at random, as with a real timeout.
``corrupt``
    reads only: the bytes returned have one bit flipped or are cut short (a bad
    network path or a lying cache; the stored object is intact).
``throttle``
    the call raises :class:`InjectedThrottling` before it reaches the target: the
    storage asked the client to slow down (S3's 503 SlowDown), nothing happened.

Every kind of call is covered, in five operation groups that ``operations`` selects:
``read`` (``cat_file``, ``cat``, ``open`` for reading), ``write`` (``pipe_file``,
``put_file``, ``open`` for writing, whose ``close`` is the PUT), ``create`` (the
conditional create ``pipe_file(mode="create")`` that
:func:`disklesslog.storage.conditional.put_if_absent` sends; done atomically on the
target), ``list`` (``ls``, ``find``, ``info``, ``exists``) and ``delete`` (``rm_file``,
``rm``). ``match`` (a regular expression searched in the path) narrows faults to some
paths. ``latency`` (seconds per operation group, e.g. ``{"write": 0.02, "create":
0.02, "read": 0.01, "list": 0.01}``, what S3 charges) makes every such call wait that
long before it is forwarded, whatever ``operations`` and ``match`` say: it is how the
suite and ``benchmarks/contention.py`` give several processes sharing ``file://`` the
round trips of a real bucket. The exceptions raised are the ones clients raise:
:class:`ConnectionError`, :class:`TimeoutError`, :class:`OSError` with ``EIO``, and,
with ``client_errors=True``, :class:`InjectedClientError`, which like botocore's
``ClientError`` or gcsfs's ``HttpError`` is *not* an :class:`OSError`. Nothing
injected is a
:class:`FileNotFoundError` or :class:`FileExistsError`: those are answers, not faults.

Settings travel as plain storage options, so a log opened in another process with the
same URL and options gets the same faults (the protocol is registered through the
``fsspec.specs`` entry point, no import needed)::

    disklesslog.open("faulty://bucket/log", storage_options={
        "target_protocol": "memory", "seed": 7, "fail": 0.05, "lost": 0.02})

fsspec caches filesystem instances by their options, so ``fsspec.filesystem("faulty",
**same_options)`` returns the instance a log uses: set ``enabled = False`` on it (or
use :meth:`FaultyFileSystem.paused`) to check the outcome without faults, and read
what was injected from :meth:`FaultyFileSystem.stats`.

:class:`FaultyMemoryFileSystem` (protocol ``faulty-memory://``) is the simpler, older
tool: fsspec's memory filesystem with latency, counted failures of PUTs, GETs, deletes,
lists and lookups, and damaged GET responses, all set as class attributes, for
testing retries, lost responses, bytes damaged in transit and latency without a
network.
"""

from __future__ import annotations

import contextlib
import errno
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.spec import AbstractFileSystem

from ..storage.conditional import put_if_absent

__all__ = [
    "FAULTS",
    "OPERATIONS",
    "FaultyFileSystem",
    "FaultyMemoryFileSystem",
    "InjectedClientError",
    "InjectedThrottling",
]

FAULTS = ("fail", "lost", "timeout", "corrupt", "throttle")
"""The kinds of fault, in the order their rates are drawn against."""
OPERATIONS = ("read", "write", "create", "list", "delete")
"""The groups of calls faults can be injected into."""


class InjectedClientError(Exception):
    """A client library's own transient error (not an :class:`OSError`), like
    botocore's ``ClientError`` for a 503 or gcsfs's ``HttpError``."""


class InjectedThrottling(InjectedClientError):
    """What botocore raises when S3 throttles a request: a ``ClientError`` whose
    ``response`` carries the error code ``SlowDown`` and HTTP status 503."""

    def __init__(self, message: str) -> None:
        super().__init__(f"An error occurred (SlowDown): {message}")
        self.response = {
            "Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
            "ResponseMetadata": {"HTTPStatusCode": 503},
        }


class FaultyFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """An fsspec filesystem that forwards every call to ``target_protocol`` (with
    ``target_options``) and injects faults at the given rates (each a probability per
    call, drawn in :data:`FAULTS` order; their sum must be at most 1)."""

    protocol = ("faulty",)
    root_marker = ""

    def __init__(
        self,
        target_protocol: str = "memory",
        target_options: Mapping[str, Any] | None = None,
        *,
        seed: int = 0,
        fail: float = 0.0,
        lost: float = 0.0,
        timeout: float = 0.0,
        corrupt: float = 0.0,
        throttle: float = 0.0,
        timeout_seconds: float = 0.002,
        operations: tuple[str, ...] | list[str] = OPERATIONS,
        match: str | None = None,
        client_errors: bool = True,
        latency: Mapping[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        rates = {
            "fail": fail,
            "lost": lost,
            "timeout": timeout,
            "corrupt": corrupt,
            "throttle": throttle,
        }
        for name, rate in rates.items():
            if not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], not {rate!r}")
        if sum(rates.values()) > 1:
            raise ValueError("the fault rates add up to more than 1")
        unknown = set(operations) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}; known: {OPERATIONS}")
        delays = dict(latency or {})
        unknown = set(delays) - set(OPERATIONS)
        if unknown:
            raise ValueError(
                f"latency for unknown operations {sorted(unknown)}; known: {OPERATIONS}"
            )
        for name, seconds in delays.items():
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise ValueError(f"latency of {name} must be seconds, not {seconds!r}")
            if not 0 <= seconds <= 60:
                raise ValueError(f"latency of {name} must be 0..60 seconds, not {seconds!r}")
        self.latency = {name: float(seconds) for name, seconds in delays.items()}
        self.target = fsspec.filesystem(target_protocol, **dict(target_options or {}))
        self.rates = rates
        self.timeout_seconds = float(timeout_seconds)
        self.operations = frozenset(operations)
        self.match = None if match is None else re.compile(match)
        self.client_errors = client_errors
        self.enabled = True
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._injected: Counter[tuple[str, str]] = Counter()
        self._batch = threading.local()  # .waited: inside a cat() that paid the latency

    # --------------------------------------------------------------- control

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("faulty://"):
            path = path[len("faulty://") :]
        return path.rstrip("/") or "/"

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No faults and no latency inside the block (for set-up and for checking
        outcomes)."""
        enabled, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = enabled

    def stats(self) -> dict[str, int]:
        """Counts so far: ``calls.<operation>`` and ``<fault>.<operation>`` for every
        fault injected, plus ``injected`` (their total)."""
        with self._lock:
            out = {f"calls.{op}": n for op, n in self._calls.items()}
            out.update({f"{fault}.{op}": n for (fault, op), n in self._injected.items()})
            out["injected"] = sum(self._injected.values())
        return out

    def reset_stats(self) -> None:
        with self._lock:
            self._calls.clear()
            self._injected.clear()

    # ---------------------------------------------------------- the decision

    def _draw(self, operation: str, path: Any) -> str | None:
        """The fault to inject into this call, or None."""
        with self._lock:
            self._calls[operation] += 1
            if not self.enabled or operation not in self.operations:
                return None
            if self.match is not None and not self.match.search(str(path)):
                return None
            roll = self._rng.random()
            for fault in FAULTS:
                rate = self.rates[fault]
                if roll < rate:
                    if fault == "corrupt" and operation != "read":
                        return None
                    self._injected[(fault, operation)] += 1
                    return fault
                roll -= rate
            return None

    def _error(self, fault: str, operation: str, path: Any) -> BaseException:
        with self._lock:
            choice = self._rng.randrange(4 if self.client_errors else 3)
        what = f"injected {fault} fault in {operation} of {path}"
        if fault == "timeout":
            return TimeoutError(what)
        return (
            ConnectionError(what),
            ConnectionResetError(what),
            OSError(errno.EIO, what),
            InjectedClientError(what),
        )[choice]

    def _coin(self) -> bool:
        with self._lock:
            return self._rng.random() < 0.5

    def _wait(self, operation: str) -> None:
        """The latency of one request of ``operation`` (none while paused)."""
        delay = self.latency.get(operation)
        if delay and self.enabled:
            time.sleep(delay)

    def _call(self, operation: str, path: Any, call: Any) -> Any:
        """Run ``call()`` (the forwarded request) after its latency (unless this thread is
        inside a call that waited once for requests sent together), with the fault drawn
        for it."""
        if not getattr(self._batch, "waited", False):
            self._wait(operation)
        fault = self._draw(operation, path)
        if fault is None:
            return call()
        if fault == "fail":
            raise self._error(fault, operation, path)
        if fault == "throttle":
            raise InjectedThrottling(f"injected throttle fault in {operation} of {path}")
        if fault == "timeout":
            time.sleep(self.timeout_seconds)
            if self._coin():
                call()
            raise self._error(fault, operation, path)
        result = call()
        if fault == "lost":
            raise self._error(fault, operation, path)
        return self._corrupt(result)

    def _corrupt(self, data: Any) -> Any:
        if not isinstance(data, (bytes, bytearray)) or not data:
            return data
        with self._lock:
            truncate = self._rng.random() < 0.3
            at = self._rng.randrange(len(data))
            bit = self._rng.randrange(8)
        if truncate:
            return bytes(data[:at])
        damaged = bytearray(data)
        damaged[at] ^= 1 << bit
        return bytes(damaged)

    # ------------------------------------------------------------------ reads

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> Any:
        path = self._strip_protocol(path)
        return self._call(
            "read", path, lambda: self.target.cat_file(path, start=start, end=end, **kw)
        )

    def cat(
        self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any
    ) -> Any:
        """One GET per path; their latency is paid once, as s3fs, gcsfs and adlfs send
        the requests of one call concurrently."""
        if not isinstance(path, list) and not recursive:
            return self.cat_file(path, **kwargs)
        paths = path if isinstance(path, list) else self.find(path)
        out: dict[str, Any] = {}
        if paths:
            self._wait("read")
        self._batch.waited = True
        try:
            for one in paths:
                try:
                    out[one] = self.cat_file(one, **kwargs)
                except Exception as exc:
                    if on_error == "raise":
                        raise
                    if on_error == "return":
                        out[one] = exc
        finally:
            self._batch.waited = False
        return out

    # ----------------------------------------------------------------- writes

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
        path = self._strip_protocol(path)
        if mode == "create":

            def create() -> None:
                if not put_if_absent(self.target, path, bytes(value)):
                    raise FileExistsError(path)

            self._call("create", path, create)
            return
        self._call("write", path, lambda: self.target.pipe_file(path, value, **kw))

    def put_file(self, lpath: str, rpath: str, **kw: Any) -> None:
        rpath = self._strip_protocol(rpath)
        self._call("write", rpath, lambda: self.target.put_file(lpath, rpath, **kw))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if "r" in mode:
            data = self.cat_file(path)
            return _ReadFile(path, data)
        return _WriteFile(self, path)

    # --------------------------------------------------------------- listings

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        path = self._strip_protocol(path)
        return self._call("list", path, lambda: self.target.ls(path, detail=detail, **kw))

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kw: Any,
    ) -> Any:
        path = self._strip_protocol(path)
        return self._call(
            "list",
            path,
            lambda: self.target.find(
                path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kw
            ),
        )

    def info(self, path: str, **kw: Any) -> Any:
        path = self._strip_protocol(path)
        return self._call("list", path, lambda: self.target.info(path, **kw))

    def exists(self, path: str, **kw: Any) -> bool:
        path = self._strip_protocol(path)
        return bool(self._call("list", path, lambda: self.target.exists(path, **kw)))

    def invalidate_cache(self, path: str | None = None) -> None:
        self.target.invalidate_cache(None if path is None else self._strip_protocol(path))

    def mkdir(self, path: str, create_parents: bool = True, **kw: Any) -> None:
        self.target.mkdir(self._strip_protocol(path), create_parents=create_parents, **kw)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.target.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    # ---------------------------------------------------------------- deletes

    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)
        self._call("delete", path, lambda: self.target.rm_file(path))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        path = self._strip_protocol(path)
        self._call("delete", path, lambda: self.target.rm(path, recursive, maxdepth))


class _ReadFile:
    """What ``open(path, "rb")`` returns: the (possibly damaged) bytes of one GET."""

    def __init__(self, path: str, data: bytes) -> None:
        self.path = path
        self._data = data
        self._position = 0
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._position + size
        chunk = self._data[self._position : end]
        self._position += len(chunk)
        return chunk

    def seek(self, position: int, whence: int = 0) -> int:
        base = (0, self._position, len(self._data))[whence]
        self._position = base + position
        return self._position

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> _ReadFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _WriteFile:
    """What ``open(path, "wb")`` returns: bytes gathered in memory and stored by one
    ``pipe_file`` (faults included) on ``close``, as a multipart upload completes;
    ``discard`` aborts it, as object-store clients' files do."""

    def __init__(self, fs: FaultyFileSystem, path: str) -> None:
        self._fs = fs
        self.path = path
        self._parts: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def discard(self) -> None:
        self._parts.clear()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._fs.pipe_file(self.path, b"".join(self._parts))

    def __enter__(self) -> _WriteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)


_BUDGETS_LOCK = threading.Lock()


class FaultyMemoryFileSystem(MemoryFileSystem):  # type: ignore[misc]
    """fsspec's memory filesystem with injected latency, failures and damage.

    Settings are class attributes shared by every instance (fsspec caches instances),
    e.g. ``FaultyMemoryFileSystem.put_delay = 0.05`` or ``.failing_puts = 2`` (the
    next two PUTs fail), or ``.lost_puts = 1`` (the next PUT is stored, then fails: a
    response lost on the way back); ``.failing_gets = 2`` fails the next two GETs,
    ``.get_failure_rate = 0.15`` each GET with that probability (drawn from ``rng``,
    seeded by :meth:`reset`), and ``.corrupt_gets = 1`` flips one bit (the lowest of the
    middle byte) in the bytes the next GET returns, leaving the stored object intact:
    damage in transit. ``.failing_deletes`` (``rm_file``), ``.failing_lists``
    (``find``) and ``.failing_infos`` (``info``, so also fsspec's ``exists``, which
    answers False when ``info`` fails) fail the next that many of those calls.
    Failures raise ``fault``: ``ConnectionError``, or a class that is not an
    ``OSError``, as clients such as botocore and gcsfs raise. :meth:`reset` restores
    them all. Counts of PUTs and GETs are kept in ``puts``/``gets``.
    """

    protocol = ("faulty-memory",)
    put_delay = 0.0
    get_delay = 0.0
    failing_puts = 0
    lost_puts = 0
    failing_gets = 0
    get_failure_rate = 0.0
    corrupt_gets = 0
    failing_deletes = 0
    failing_lists = 0
    failing_infos = 0
    fault: type[Exception] = ConnectionError
    rng = random.Random(0)
    puts = 0
    gets = 0

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith("faulty-memory://"):
            path = path[len("faulty-memory://") :]
        return super()._strip_protocol(path)

    @classmethod
    def reset(cls) -> None:
        cls.put_delay = cls.get_delay = cls.get_failure_rate = 0.0
        cls.failing_puts = cls.lost_puts = cls.failing_gets = cls.corrupt_gets = 0
        cls.failing_deletes = cls.failing_lists = cls.failing_infos = 0
        cls.fault = ConnectionError
        cls.puts = cls.gets = 0
        cls.rng = random.Random(0)

    @classmethod
    def _inject(cls, budget: str, message: str) -> None:
        """Raise ``fault`` if the failures left in the setting ``budget`` are not spent
        (counted under a lock: deletes run in several threads at once)."""
        with _BUDGETS_LOCK:
            left = getattr(cls, budget)
            if left <= 0:
                return
            setattr(cls, budget, left - 1)
        raise cls.fault(message)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        type(self).puts += 1
        if self.put_delay:
            time.sleep(self.put_delay)
        self._inject("failing_puts", f"injected PUT failure for {path}")
        super().pipe_file(path, value, mode=mode, **kwargs)
        if type(self).lost_puts > 0:
            type(self).lost_puts -= 1
            raise self.fault(f"injected lost response of the PUT of {path}")

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> Any:
        type(self).gets += 1
        if self.get_delay:
            time.sleep(self.get_delay)
        cls = type(self)
        if cls.failing_gets > 0 or cls.rng.random() < cls.get_failure_rate:
            cls.failing_gets = max(0, cls.failing_gets - 1)
            raise cls.fault(f"injected GET failure for {path}")
        data = super().cat_file(path, start=start, end=end, **kw)
        if cls.corrupt_gets > 0 and data:
            cls.corrupt_gets -= 1
            damaged = bytearray(data)
            damaged[len(damaged) // 2] ^= 0x01
            return bytes(damaged)
        return data

    def rm_file(self, path: str) -> None:
        self._inject("failing_deletes", f"injected DELETE failure for {path}")
        super().rm_file(path)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._inject("failing_lists", f"injected LIST failure for {path}")
        return super().find(path, *args, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        self._inject("failing_infos", f"injected HEAD failure for {path}")
        return super().info(path, **kwargs)


fsspec.register_implementation("faulty-memory", FaultyMemoryFileSystem, clobber=True)
