"""URL -> backend: a registry like fsspec's protocol table.

A URL's scheme picks a default backend (``file`` and bare paths -> ``segments``); the
``backend=`` option of :func:`disklesslog.open` overrides it where a scheme supports
several. Backends register a factory under a name; later backends (object storage,
its sequencers) plug in here without touching callers.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from .api import AbstractLog
from .errors import ConfigError, InvalidURL

__all__ = ["backends", "open_log", "register_backend", "split_url"]

BackendFactory = Callable[[str, str, dict[str, Any]], AbstractLog]
"""``factory(url, location, options) -> AbstractLog``; ``location`` is the path for
local URLs and the URL itself otherwise."""

_FACTORIES: dict[str, BackendFactory | str] = {}
_SCHEMES: dict[str, str] = {}
_FALLBACKS: list[tuple[Callable[[str], bool], str]] = []


def register_backend(
    name: str,
    factory: BackendFactory | str,
    *,
    schemes: tuple[str, ...] = (),
    fallback: Callable[[str], bool] | None = None,
) -> None:
    """Register ``factory`` as backend ``name``, the default for ``schemes`` and for any
    other scheme ``fallback`` accepts (e.g. every protocol fsspec knows). ``factory`` may
    be ``"module:function"``, imported when the backend is first used (so importing
    disklesslog does not load every backend's dependencies)."""
    _FACTORIES[name] = factory
    for scheme in schemes:
        _SCHEMES[scheme] = name
    if fallback is not None:
        _FALLBACKS.append((fallback, name))


def backends() -> dict[str, str]:
    """Registered URL schemes and the backend each opens by default."""
    return dict(_SCHEMES)


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
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = _FACTORIES[name] = getattr(importlib.import_module(module), attribute)
    return factory(url, location, options)
