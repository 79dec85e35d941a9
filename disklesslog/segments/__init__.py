"""The local segment-file backend (bare paths and ``file://`` URLs)."""

from __future__ import annotations

import inspect
from typing import Any

from ..api import AbstractLog
from ..errors import ConfigError, InvalidURL
from ..urls import register_backend
from .log import SegmentLog, SegmentStream
from .stream_store import FSYNC_POLICIES

__all__ = ["FSYNC_POLICIES", "SegmentLog", "SegmentStream"]


_OBJECT_OPTIONS = ("sequencer", "storage_options", "cache", "producer_expiration_ms")


def _open(url: str, location: str, options: dict[str, Any]) -> AbstractLog:
    if "://" in url and not url.lower().startswith("file://"):
        raise InvalidURL(f"the segments backend stores logs in local directories, not {url!r}")
    misplaced = [name for name in _OBJECT_OPTIONS if name in options]
    if misplaced:
        raise ConfigError(
            f"{misplaced} apply to object-storage logs; a path or file:// URL opens local "
            "segments unless you pass backend='objects' (the tier of a local log takes "
            "tier_url= and tier_storage_options=)"
        )
    return SegmentLog(location, url=url, **options)


def _log_options() -> list[str]:
    """The keyword options of :class:`SegmentLog` (what ``open()`` passes on), read from
    its signature so that the registry never lists one it lacks, or lacks a new one."""
    parameters = inspect.signature(SegmentLog).parameters.values()
    return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.name != "url"]


register_backend("segments", _open, schemes=("file",), options=_log_options())
