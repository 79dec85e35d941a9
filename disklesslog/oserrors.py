"""Operating-system failures of local files, raised as :class:`~disklesslog.StorageError`.

The local backend talks to its files through ``os`` calls spread over many modules
(segments, indexes, state records, notes, manifests); any of them can fail with an
``OSError``: a full disk, an I/O error, a permission or quota, too many open files. Each
module undoes what a failed call half did (an append truncates back, a replacement by
rename leaves the old file) and lets the error go on. The *public* calls are where it
becomes part of the one error hierarchy: :func:`typed_os_errors` wraps the public
methods of a backend class so that an ``OSError`` leaves them as a ``StorageError``
(also an ``OSError``, with the same ``errno`` and ``filename``, chained to the original),
and so that no public call lets anything but a :class:`~disklesslog.DisklessLogError`
escape.

Only ``OSError`` is translated. Any other exception escaping a public call is a bug in
this library, and hiding it behind a friendly type would hide the bug.
"""

from __future__ import annotations

import errno
import functools
import inspect
import resource
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .errors import DisklessLogError, StorageError, TooManyOpenFiles

__all__ = ["as_storage_error", "typed_os_errors"]

C = TypeVar("C", bound=type)
T = TypeVar("T")


def as_storage_error(exc: OSError, what: str) -> StorageError:
    """``exc`` as a :class:`StorageError` saying what failed, keeping its ``errno`` and
    ``filename`` (the caller chains it: ``raise as_storage_error(exc, ...) from exc``)."""
    if exc.errno is None:  # raised by this library with a message only ("short write")
        return StorageError(f"{what}: {exc or type(exc).__name__}")
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return TooManyOpenFiles(exc.errno, f"{what}: {exc.strerror}. {_descriptor_advice(exc)}")
    return StorageError(exc.errno, f"{what}: {exc.strerror}", exc.filename)


def _descriptor_advice(exc: OSError) -> str:
    """What to do when descriptors run out (the process's limit named as it stands)."""
    if exc.errno == errno.ENFILE:
        limit = "the system's limit on open files (fs.file-max)"
    else:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        limit = f"this process's limit on open files (ulimit -n: {shown})"
    return (
        f"{limit[0].upper()}{limit[1:]} is reached. Lower max_open_streams "
        "(disklesslog.open(..., max_open_streams=N): a local log holds two descriptors per "
        "open stream), close logs, reads and files no longer needed, or raise the limit "
        "(ulimit -n, resource.setrlimit(resource.RLIMIT_NOFILE, ...))"
    )


def typed_os_errors(
    *, iterators: Iterable[str] = (), also: Iterable[str] = (), internal: Iterable[str] = ()
) -> Callable[[C], C]:
    """Class decorator: every public method and property defined in the class (and its
    ``__init__``) raises an ``OSError`` that is not already a ``DisklessLogError`` as a
    :class:`StorageError` naming the class and method. Private methods named in
    ``also`` are translated too: hooks a base class's public methods call (a stager's
    ``_store``), which this class's public methods therefore do not cover.

    Methods and properties named in ``internal`` are left as they are: those for the
    package's own modules (a log's ``with_store`` for its streams and maintenance), which
    run inside public calls that translate, so an error names the public call and the
    hot paths pay no second wrapper.

    Methods named in ``iterators`` return iterators whose ``next()`` reads files; their
    results are wrapped so that failures while iterating are translated too. The wrapper
    costs one generator step per item, so it is for iterators of batches, never of
    records (``Stream.read`` builds records from ``read_batches`` in C, below it).
    """
    lazy = frozenset(iterators)
    hooks = frozenset(also) | {"__init__"}
    skipped = frozenset(internal)

    def decorate(cls: C) -> C:
        for name, member in list(vars(cls).items()):
            if (name.startswith("_") and name not in hooks) or name in skipped:
                continue
            what = f"{cls.__name__}.{name}"
            if isinstance(member, property) and member.fget is not None:
                fget = _translated(member.fget, what, name in lazy)
                setattr(cls, name, property(fget, member.fset, member.fdel, member.__doc__))
            elif inspect.isfunction(member):
                setattr(cls, name, _translated(member, what, name in lazy))
        return cls

    return decorate


def _translated(func: Callable[..., Any], what: str, lazy: bool) -> Callable[..., Any]:
    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = func(*args, **kwargs)
        except DisklessLogError:
            raise
        except OSError as exc:
            raise as_storage_error(exc, f"{what} failed") from exc
        return _translating(result, what) if lazy else result

    return call


def _translating(items: Iterator[T], what: str) -> Iterator[T]:
    try:
        yield from items
    except DisklessLogError:
        raise
    except OSError as exc:
        raise as_storage_error(exc, f"{what} failed while reading") from exc
