"""Stream and consumer-group names: the one rule every backend and sequencer checks.

A leaf module (it imports only :mod:`disklesslog.errors`), so that sequencers, writers
and tools can check names without importing the log API; :mod:`disklesslog.api`
re-exports both functions, the public ``disklesslog.validate_stream_name`` among them.
"""

from __future__ import annotations

import re

from .errors import InvalidStreamName

__all__ = ["validate_group_name", "validate_lease_name", "validate_stream_name"]

_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def validate_stream_name(name: object) -> str:
    """Return ``name`` if it is a valid stream name, else raise :class:`InvalidStreamName`.

    Names are 1-249 characters of ``[A-Za-z0-9._-]`` and neither ``.`` nor ``..``
    (Kafka's topic rule). A valid name can never be a path: it has no separator.
    """
    if not isinstance(name, str):
        raise InvalidStreamName(f"a stream name must be a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name) or name in (".", ".."):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise InvalidStreamName(
            f"invalid stream name {shown!r}: use 1-249 characters of letters, digits, "
            "'.', '_' and '-' (not '.' or '..')"
        )
    return name


def validate_group_name(name: object) -> str:
    """Return ``name`` if it is a valid consumer-group name (the stream-name rule), else
    raise :class:`InvalidStreamName`."""
    try:
        return validate_stream_name(name)
    except InvalidStreamName as exc:
        raise InvalidStreamName(str(exc).replace("stream name", "consumer group name")) from None


def validate_lease_name(name: object) -> str:
    """Return ``name`` if it is a valid lease name (the stream-name rule: a local log
    keeps a lease in a file of that name), else raise :class:`InvalidStreamName`."""
    try:
        return validate_stream_name(name)
    except InvalidStreamName as exc:
        raise InvalidStreamName(str(exc).replace("stream name", "lease name")) from None
