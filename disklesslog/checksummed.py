"""Checksummed JSON: small JSON documents with a CRC-32C trailer line.

Every small JSON file disklesslog writes and trusts later (a local log's marker, stream
configurations, groups, leases, compaction intents, tier and transaction files; the
automatic maintenance status of either backend) ends in one line
``#crc32c:<8 lowercase hex>``, the CRC-32C of every byte before it, so that damage is
found instead of believed (``docs/format.md`` 2.10).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import CorruptDataError
from .format import crc32c

__all__ = ["decode_json", "encode_json"]

_TRAILER = re.compile(rb"#crc32c:([0-9a-f]{8})\n\Z")
_TRAILER_SIZE = len(b"#crc32c:00000000\n")


def encode_json(content: Any, *, indent: int | None = None) -> bytes:
    """``content`` as a checksummed JSON file: the JSON text and a newline, then the
    trailer line ``#crc32c:<8 lowercase hex>``, the CRC-32C of every byte before it."""
    separators = None if indent is not None else (",", ":")
    body = json.dumps(content, indent=indent, separators=separators).encode() + b"\n"
    return body + b"#crc32c:%08x\n" % crc32c(body)


def decode_json(raw: bytes, source: str, *, what: str) -> tuple[Any, bool]:
    """Parse a JSON file written by :func:`encode_json` (checked against its trailer) or
    by version 1 (no trailer, parsed as before). Returns the content and whether it was
    checksummed: a caller refuses an unchecked file whose own version says it was
    written with the trailer. A bad checksum or unparsable text is
    :class:`CorruptDataError` naming ``source`` (``what`` says what the file is)."""
    match = _TRAILER.search(raw, max(0, len(raw) - _TRAILER_SIZE))
    body = raw
    if match is not None:
        body = raw[: match.start()]
        if int(match.group(1), 16) != crc32c(body):
            raise CorruptDataError(f"{what} fails its CRC-32C", source=source)
    try:
        return json.loads(body), match is not None
    except (ValueError, RecursionError) as exc:  # also bad UTF-8, absurd nesting
        raise CorruptDataError(f"unreadable {what}: {exc!r}", source=source) from None
