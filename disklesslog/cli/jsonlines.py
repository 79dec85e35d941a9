"""Records as JSON lines, both ways: what ``consume --format json`` prints is what
``produce --format json`` reads, so piping one into the other copies a stream exactly.

JSON holds text, records hold bytes: ``key``, ``value`` and header values are text when
their bytes are valid UTF-8 and ``null`` when absent; other bytes go base64-encoded under
the same name with ``_base64`` appended instead (``value_base64``), so any bytes survive
the trip and a reader can tell text from encoded bytes without guessing.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, NamedTuple

from ..format import MAX_TIMESTAMP
from ..records import Header, Record

__all__ = ["NewRecord", "json_line", "parse_json_line"]

_IGNORED = frozenset({"offset", "stream"})
"""Names ``consume`` writes that a copy does not keep: the target stream assigns its own
offsets, and ``produce`` writes to the stream it is given, whichever one the line came
from."""
_MISSING = object()


class NewRecord(NamedTuple):
    """One record read from a JSON line; ``timestamp`` is ``None`` when the line has none
    (the append then stamps it)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp: int | None


def json_line(record: Record, stream: str | None = None) -> bytes:
    """One record as a JSON object and a newline (UTF-8), led by its ``stream`` when
    given.

    ``key``, ``value`` and header values are text when they are valid UTF-8 and
    ``null`` when absent; other bytes appear base64-encoded under ``key_base64`` /
    ``value_base64`` instead, so exactly one of the two names is present.
    """
    obj: dict[str, Any] = {} if stream is None else {"stream": stream}
    obj.update(offset=record.offset, timestamp=record.timestamp)
    _put_bytes(obj, "key", record.key)
    _put_bytes(obj, "value", record.value)
    obj["headers"] = [_put_bytes({"key": name}, "value", value) for name, value in record.headers]
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def _put_bytes(obj: dict[str, Any], name: str, data: bytes | None) -> dict[str, Any]:
    if data is None:
        obj[name] = None
    else:
        try:
            obj[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            obj[f"{name}_base64"] = base64.b64encode(data).decode("ascii")
    return obj


def parse_json_line(line: bytes) -> NewRecord:
    """The record of one line as :func:`json_line` writes it (``offset`` and ``stream``
    are ignored).

    ``value`` (or ``value_base64``) is required, ``null`` for a tombstone; ``key``,
    ``headers`` and ``timestamp`` may be left out. Raises ``ValueError`` with what is
    wrong, in words that follow "line N: ".
    """
    try:
        obj = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(
            "not UTF-8 text (bytes that are not UTF-8 go base64-encoded into "
            "key_base64/value_base64)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"not a JSON object but {_kind(obj)}")
    key = _take_bytes(obj, "key", "the record", required=False)
    value = _take_bytes(obj, "value", "the record", required=True)
    headers = _take_headers(obj.pop("headers", []))
    timestamp = _take_timestamp(obj.pop("timestamp", None))
    unknown = sorted(set(obj) - _IGNORED)
    if unknown:
        raise ValueError(
            f"unknown field {unknown[0]!r} (a record has key, value, headers and timestamp, "
            "and may carry the offset and stream consume prints; "
            "key_base64/value_base64 for bytes that are not UTF-8)"
        )
    return NewRecord(key, value, headers, timestamp)


def _take_bytes(obj: dict[str, Any], name: str, what: str, *, required: bool) -> bytes | None:
    """Remove ``name`` or ``name_base64`` from ``obj`` and return its bytes."""
    encoded_name = f"{name}_base64"
    text, encoded = obj.pop(name, _MISSING), obj.pop(encoded_name, _MISSING)
    if text is not _MISSING and encoded is not _MISSING:
        raise ValueError(f"{what} has both {name!r} and {encoded_name!r}; give one of them")
    if encoded is not _MISSING:
        if not isinstance(encoded, str):
            raise ValueError(
                f"{what}'s {encoded_name!r} must be a base64 string, not {_kind(encoded)}"
            )
        try:
            return base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise ValueError(f"{what}'s {encoded_name!r} is not valid base64") from None
    if text is _MISSING:
        if required:
            raise ValueError(
                f"{what} has no {name!r} (nor {encoded_name!r} for bytes that are not UTF-8)"
            )
        return None
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{what}'s {name!r} must be a string or null, not {_kind(text)}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what}'s {name!r} holds a lone surrogate escape, which is not UTF-8 "
            f"(use {encoded_name!r} for such bytes)"
        ) from None


def _take_headers(headers: object) -> tuple[Header, ...]:
    if not isinstance(headers, list):
        raise ValueError(
            f'\'headers\' must be a list of {{"key": ..., "value": ...}} objects, '
            f"not {_kind(headers)}"
        )
    taken: list[Header] = []
    for number, header in enumerate(headers, 1):
        what = f"header {number}"
        if not isinstance(header, dict):
            raise ValueError(f"{what} must be an object with key and value, not {_kind(header)}")
        name = header.pop("key", _MISSING)
        if name is _MISSING:
            raise ValueError(f"{what} has no 'key'")
        if not isinstance(name, str):
            raise ValueError(f"{what}'s 'key' must be a string, not {_kind(name)}")
        value = _take_bytes(header, "value", what, required=True)
        if header:
            raise ValueError(f"{what} has an unknown field {sorted(header)[0]!r}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what}'s key holds a lone surrogate escape, not UTF-8") from None
        taken.append((name, value))
    return tuple(taken)


def _take_timestamp(timestamp: object) -> int | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise ValueError(
            f"'timestamp' must be an integer (ms since the Unix epoch), not {_kind(timestamp)}"
        )
    if not 0 <= timestamp <= MAX_TIMESTAMP:
        raise ValueError(f"'timestamp' {timestamp} is outside 0..2**63-1 (ms since the epoch)")
    return timestamp


def _kind(value: object) -> str:
    """The JSON name of ``value``'s type, as a user wrote it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return "a list" if isinstance(value, list) else "an object"
