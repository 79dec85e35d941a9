"""URL -> backend: a registry like fsspec's protocol table.

A URL's scheme picks a default backend (``file`` and bare paths -> ``segments``); the
``backend=`` option of :func:`disklesslog.open` overrides it where a scheme supports
several. Backends register a factory under a name; later backends (object storage,
its sequencers) plug in here without touching callers.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote, urlsplit

from .api import AbstractLog
from .config import StreamConfig
from .errors import ConfigError, InvalidURL

__all__ = [
    "COMMON_OPTIONS",
    "backends",
    "check_option_names",
    "log_options",
    "open_log",
    "register_backend",
    "split_url",
]

BackendFactory = Callable[[str, str, dict[str, Any]], AbstractLog]
"""``factory(url, location, options) -> AbstractLog``; ``location`` is the path for
local URLs and the URL itself otherwise."""

_FACTORIES: dict[str, BackendFactory | str] = {}
_SCHEMES: dict[str, str] = {}
_FALLBACKS: list[tuple[Callable[[str], bool], str]] = []
_OPTIONS: dict[str, frozenset[str] | None] = {}

COMMON_OPTIONS = frozenset({"backend", "create"})
"""Log options every backend takes: :func:`open_log` reads ``backend`` itself and checks
``create`` (a bool) before any backend sees it."""


def register_backend(
    name: str,
    factory: BackendFactory | str,
    *,
    schemes: tuple[str, ...] = (),
    fallback: Callable[[str], bool] | None = None,
    options: Iterable[str] | None = None,
) -> None:
    """Register ``factory`` as backend ``name``, the default for ``schemes`` and for any
    other scheme ``fallback`` accepts (e.g. every protocol fsspec knows). ``factory`` may
    be ``"module:function"``, imported when the backend is first used (so importing
    disklesslog does not load every backend's dependencies).

    ``options`` names the log options the backend accepts besides :data:`COMMON_OPTIONS`
    and the :class:`~disklesslog.StreamConfig` fields (stream defaults). It is the
    registry :func:`disklesslog.open` checks names against before the factory runs, so
    a misspelt option is refused with the valid ones and the closest match, and the
    one list the documentation is checked against. ``None`` (a backend registered
    without a list) leaves every check of option names to the factory.
    """
    _FACTORIES[name] = factory
    _OPTIONS[name] = None if options is None else frozenset(options)
    for scheme in schemes:
        _SCHEMES[scheme] = name
    if fallback is not None:
        _FALLBACKS.append((fallback, name))


def backends() -> dict[str, str]:
    """Registered URL schemes and the backend each opens by default."""
    return dict(_SCHEMES)


def log_options() -> dict[str, frozenset[str]]:
    """The log options of each backend that registered its list: what ``open()``
    accepts on it besides :class:`~disklesslog.StreamConfig` fields, including
    :data:`COMMON_OPTIONS`."""
    return {
        name: COMMON_OPTIONS | options for name, options in _OPTIONS.items() if options is not None
    }


def check_option_names(backend: str, options: Iterable[str]) -> None:
    """Refuse option names no backend knows, for a log opened with ``backend``.

    The :class:`ConfigError` lists the valid names of both kinds, the backend's log
    options and the stream settings, and suggests the closest match of each unknown
    name. A name another backend knows is left to the backend's factory, whose message
    says which kind of log takes it (``sequencer=`` on a local path, ``fsync=`` on
    object storage).
    """
    own = log_options().get(backend)
    if own is None:
        return
    stream = StreamConfig.field_names()
    anywhere = stream.union(*log_options().values())
    unknown = sorted(name for name in options if name not in anywhere)
    if not unknown:
        return
    valid = sorted(own | stream)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1)
        if close:
            hints.append(f"{name!r}: did you mean {close[0]!r}?")
    described = ", ".join(repr(name) for name in unknown)
    raise ConfigError(
        f"unknown option{'s' if len(unknown) > 1 else ''} {described} (backend {backend!r})"
        + (f" ({' '.join(hints)})" if hints else "")
        + f". Log options: {', '.join(sorted(own))}. Stream settings (defaults for new "
        f"streams, see StreamConfig): {', '.join(sorted(stream))}"
    )


_SCHEME_ONLY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(?!//)")
"""A URL scheme and its colon with no ``//`` after it: ``file:/abs/path`` (a valid file
URL) or a URL with its slashes missing (``s3:bucket``); never taken for a relative path."""


def split_url(url: str) -> tuple[str, str]:
    """``(scheme, location)``: bare paths and file URLs give ``("file", path)``.

    ``file:///abs``, ``file://localhost/abs`` and ``file:/abs`` (RFC 8089's short form,
    which fsspec accepts too) name the absolute path ``/abs``. A string that starts like
    a URL without its ``//`` (``s3:bucket/x``, ``file:relative``) is an
    :class:`InvalidURL`, not a relative directory named ``s3:`` or ``file:`` under the
    working directory; write ``./name:with-colon`` for such a directory.
    """
    if "\x00" in url:
        raise InvalidURL(f"a log URL or path cannot contain a NUL character: {url!r}")
    if "://" not in url:
        bare = _SCHEME_ONLY.match(url)
        if bare is None:
            return "file", url
        if bare.group(1).lower() != "file" or not url[bare.end() :].startswith("/"):
            raise InvalidURL(
                f"{url!r} looks like a URL without '//' after {bare.group(1)}:; write "
                f"{bare.group(1)}://... for a URL, or ./{url} for a local directory"
            )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidURL(
                f"file URLs name a local path (file:///path), not host {parts.netloc!r}"
            )
        if parts.query or parts.fragment:
            raise InvalidURL(f"file URL {url!r} has a query or fragment; remove it")
        if not parts.path:
            raise InvalidURL(f"file URL {url!r} has no path")
        path = unquote(parts.path)
        if "\x00" in path:
            raise InvalidURL(f"file URL {url!r} names a path with a NUL character")
        return "file", path
    return scheme, url


def open_log(
    url: str | os.PathLike[str], *, backend: str | None = None, **options: Any
) -> AbstractLog:
    """Open the log at ``url`` with the backend its scheme (or ``backend=``) selects."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url.strip():
        raise InvalidURL(f"a log URL must be a non-empty str or path, not {url!r}")
    scheme, location = split_url(url)
    if backend is not None and not isinstance(backend, str):
        raise InvalidURL(f"backend must be a backend's name (a str), not {backend!r}")
    if type(options.get("create", True)) is not bool:
        raise ConfigError(f"create must be True or False, not {options['create']!r}")
    name = backend if backend is not None else _SCHEMES.get(scheme)
    if name is None:
        name = next((n for accepts, n in _FALLBACKS if accepts(scheme)), None)
    if name is None:
        known = ", ".join(f"{s}://" for s in sorted(_SCHEMES)) or "none"
        raise InvalidURL(
            f"no backend opens {scheme}:// URLs in this installation (supported: {known}, "
            "and bare paths)"
        )
    factory = _FACTORIES.get(name)
    if factory is None:
        raise InvalidURL(f"unknown backend {name!r}; registered: {sorted(_FACTORIES)}")
    check_option_names(name, options)
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = _FACTORIES[name] = getattr(importlib.import_module(module), attribute)
    return factory(url, location, options)
