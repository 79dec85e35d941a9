"""The small JSON file that marks a location as a log: which kind, which version.

Both backends write ``disklesslog.json`` at a new log's root and check it on every
open, so a segments directory is never opened as an object log (or the reverse) and a
newer format is refused instead of misread.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import InvalidURL

__all__ = ["MARKER", "check_marker", "marker_bytes"]

MARKER = "disklesslog.json"


def marker_bytes(kind: str, version: int) -> bytes:
    """The marker file's content for a log of ``kind`` and ``version``."""
    return json.dumps({"format": kind, "version": version}).encode() + b"\n"


def check_marker(raw: bytes, *, kind: str, version: int, where: str) -> None:
    """Raise :class:`InvalidURL` unless ``raw`` marks a log of ``kind`` and ``version``.

    A local log's marker ends in a checksum line (``docs/format.md`` 2.10), which the
    local backend verifies itself; here it is set aside, so that any backend reading
    another's marker says which kind of log it found."""
    text, _, _ = raw.partition(b"\n#crc32c:")
    try:
        content: Any = json.loads(text)
    except ValueError as exc:
        raise InvalidURL(f"{where}/{MARKER} is unreadable: {exc}") from None
    if not isinstance(content, dict) or content.get("format") != kind:
        raise InvalidURL(f"{where} holds a log of another kind: {content!r}")
    if content.get("version") != version:
        raise InvalidURL(
            f"{where} is a version {content.get('version')} {kind} log; this disklesslog "
            f"reads version {version}"
        )
