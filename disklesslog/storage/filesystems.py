"""Opening a storage location (an fsspec URL), and telling what kind of filesystem it is.

fsspec itself is imported when a location is first opened: importing disklesslog (or a
local log that never tiers) does not load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, InvalidURL, MissingDependencyError
from .failures import storage_error

__all__ = ["is_local", "is_memory", "open_filesystem"]

_EXTRAS = {
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "az": ("azure", "adlfs"),
    "abfs": ("azure", "adlfs"),
    "abfss": ("azure", "adlfs"),
}


def open_filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """``(fsspec filesystem, root path)`` for a URL; ``storage_options`` go to fsspec
    untouched. A missing client library raises an error naming the extra to install."""
    import fsspec  # noqa: PLC0415 - loaded with the first location opened

    options = dict(storage_options or {})
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    if protocol == "file":
        options.setdefault("auto_mkdir", True)
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        extra, package = _EXTRAS.get(protocol, (None, None))
        if extra is None:
            raise MissingDependencyError(
                f"{protocol}:// needs a library that is not installed: {exc}"
            ) from None
        raise MissingDependencyError(
            f"{protocol}:// logs need {package}: pip install 'disklesslog[{extra}]'"
        ) from None
    except ValueError as exc:
        raise InvalidURL(f"cannot open {url!r}: {exc}") from None
    except TypeError as exc:  # an option the filesystem does not take
        raise ConfigError(f"storage_options rejected by {protocol}:// : {exc}") from None
    except Exception as exc:  # a client that checks its credentials or endpoint at once
        raise storage_error(exc, f"cannot open {url}", url=url, operation="open") from exc
    return fs, str(root).rstrip("/")


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local filesystem (where renames and hard links are atomic)."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def is_memory(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's memory filesystem: one process's, and its files are
    visible while they are written (so they get their bytes whole, at once)."""
    from fsspec.implementations.memory import MemoryFileSystem  # noqa: PLC0415 - fs exists: loaded

    return isinstance(fs, MemoryFileSystem)
