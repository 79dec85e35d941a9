"""The argparse ``type=`` functions of every command: how command-line text becomes
offsets, counts, sizes, durations, times and ``KEY=VALUE`` pairs.

Each kind of value is parsed here once, so every option that takes one accepts the same
spellings and refuses the rest with the same message: a size is ``8KiB`` wherever a size
is taken (an option or a stream setting), a duration ``7d`` or ``500ms`` wherever a
duration is. A refusal is an ``argparse.ArgumentTypeError``, which argparse prints as
``argument --OPTION: MESSAGE`` and turns into exit code 2 (a usage error).

The grammar is a few units on a number, so it is two regular expressions here rather
than a dependency of the core install.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..config import StreamConfig

__all__ = [
    "FromEnd",
    "Position",
    "byte_size",
    "duration_ms",
    "from_position",
    "key_separator",
    "milliseconds",
    "offset",
    "positive",
    "positive_seconds",
    "seconds",
    "setting",
    "size",
    "start_offset",
    "storage_option",
    "timestamp_ms",
]


@dataclass(frozen=True)
class FromEnd:
    """``consume --from -N``: start ``count`` offsets before each stream's end offset."""

    count: int


Position = int | FromEnd | Literal["start", "end"]

MIN_SIZE = 1024
"""The smallest size an option takes: less is a unit left out (``64`` for ``64MiB``)."""

_SIZE = re.compile(r"\s*(-?\d+)\s*([kmgt]ib)?\s*", re.IGNORECASE)
_UNITS = {None: 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE_SPELLING = "an integer, optionally with KiB, MiB, GiB or TiB"

_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)\s*", re.IGNORECASE)
_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION_SPELLING = "a number, optionally with ms, s, m, h, d or w"


# ------------------------------------------------------------------- offsets, counts


def offset(text: str) -> int:
    """A non-negative offset or count (``--to``, ``--max``); a negative one is a usage
    error."""
    return _non_negative(text, "an integer")


def start_offset(text: str) -> int:
    """``repair --start-offset``: a non-negative offset, named as one in the message."""
    return _non_negative(text, "an offset")


def _non_negative(text: str, noun: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive(text: str) -> int:
    """A count of 1 or more (``produce --batch-size``)."""
    value = offset(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def from_position(text: str) -> Position:
    """``consume --from``: an offset, ``-N`` (N offsets before the end, kcat's ``-o -N``),
    or ``start``/``end`` of the stream."""
    if text in ("start", "end"):
        return "start" if text == "start" else "end"
    count = text[1:] if text.startswith("-") else text
    try:
        value = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an offset: {text!r} (an offset N, -N for N before the end, 'start' or 'end')"
        ) from None
    if value < 0 or count != count.strip() or count.startswith("+"):
        raise argparse.ArgumentTypeError(
            f"not an offset: {text!r} (an offset N, -N for N before the end, 'start' or 'end')"
        )
    return FromEnd(value) if text.startswith("-") else value


# ------------------------------------------------------------ sizes, durations, times


def size(text: str) -> int:
    """Bytes as a stream setting takes them: an integer, optionally with a binary suffix
    ``KiB``, ``MiB``, ``GiB`` or ``TiB`` in any case (``8KiB``, ``1gib``); ``-1`` and
    ``-2`` stay (the settings' "unlimited" and "same as retention"; the log checks the
    range). Decimal units (``MB``) are refused rather than guessed at."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} ({_SIZE_SPELLING})")
    digits, unit = match.groups()
    return int(digits) * _UNITS[unit and unit.lower()]


def byte_size(text: str) -> int:
    """A size option (``merge --target-bytes``): :func:`size`, at least :data:`MIN_SIZE`."""
    value = size(text)
    if value < MIN_SIZE:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_SIZE} bytes, not {text}")
    return value


def _duration(text: str, plain: str) -> float:
    """A duration in units of ``plain`` (``"s"`` or ``"ms"``): a number with a unit
    ``ms``, ``s``, ``m``, ``h``, ``d`` or ``w``, or a plain number already in ``plain``."""
    match = _DURATION.fullmatch(text)
    if match is not None:
        number, unit = match.groups()
        return float(number) * _MS[unit.lower()] / _MS[plain]
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} ({_DURATION_SPELLING})"
        ) from None


def seconds(text: str) -> float:
    """A duration option in seconds, 0 or more (``gc --grace``): ``300``, ``0.5``,
    ``5m``, ``500ms``."""
    value = _duration(text, "s")
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def positive_seconds(text: str) -> float:
    """A duration option in seconds, more than 0 (``consume --idle-timeout``: 0 would
    stop at once)."""
    value = _duration(text, "s")
    if not value > 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def milliseconds(text: str) -> int:
    """A wait in whole milliseconds, 0 or more (``produce --linger-ms``): ``100``, ``0``,
    ``500ms``, ``2s``; a plain number is milliseconds."""
    value = _duration(text, "ms")
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    if not value.is_integer():  # also refuses inf
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {text!r}")
    return int(value)


def duration_ms(text: str) -> int:
    """A duration as a stream setting takes it, in whole milliseconds: ``7d``, ``12h``,
    ``30s``, ``500ms``, or a plain integer of milliseconds (``-1`` and ``-2`` stay: the
    settings' "forever" and "same as retention"; the log checks the range)."""
    value = _duration(text, "ms")
    if not value.is_integer():  # also refuses inf and NaN
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {text!r}")
    return int(value)


def timestamp_ms(text: str) -> int:
    """A point in time, as milliseconds since the Unix epoch: those milliseconds as an
    integer, or an ISO 8601 date or time (``2024-05-01``, ``2024-05-01T12:00:00Z``,
    ``2024-05-01T14:00:00+02:00``; without a UTC offset it is local time, as in Kafka's
    tools)."""
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601 such as 2024-05-01T12:00:00Z, or "
            "milliseconds since the epoch)"
        ) from None
    value = round(moment.timestamp() * 1000)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be before 1970, not {text}")
    return value


# ------------------------------------------------------------------------ KEY=VALUE


def storage_option(text: str) -> tuple[str, Any]:
    """``--storage-option KEY=VALUE``: VALUE is JSON when it parses (numbers, true,
    objects), else a string."""
    key, value = _key_value(text)
    return key, _json_or_text(value)


def setting(text: str) -> tuple[str, Any]:
    """A stream setting ``KEY=VALUE`` (``create --config``, ``alter``), read by the
    setting's kind: sizes (``*_bytes``) as :func:`size`, durations (``*_ms``) as
    :func:`duration_ms`, ratios as numbers, names (``compression``, ``cleanup_policy``)
    as text. KEY may be spelled as in Kafka (``retention.ms``). An unknown KEY keeps its
    value (JSON when it parses) for the log to refuse with the list of known ones."""
    key, value = _key_value(text)
    key = key.replace(".", "_")
    kind = _SETTING_KINDS.get(key)
    try:
        if kind == "str":
            return key, _json_or_text(value)
        if kind == "int" and key.endswith("_bytes"):
            return key, size(value)
        if kind == "int":
            return key, duration_ms(value)
        if kind == "float":
            number = json.loads(value)
            if isinstance(number, bool) or not isinstance(number, int | float):
                raise ValueError(value)
            return key, number
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{key}: {exc}") from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: {value!r} is not a number") from None
    return key, _json_or_text(value)


_SETTING_KINDS = {field.name: str(field.type) for field in dataclasses.fields(StreamConfig)}
"""Each stream setting's type (``"int"``, ``"float"``, ``"str"``), from StreamConfig."""


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key, value


def key_separator(text: str) -> bytes:
    """``produce --key-sep``: bytes as given on the command line (binary-safe through
    the filesystem encoding's surrogateescape)."""
    if not text:
        raise argparse.ArgumentTypeError("the key separator must not be empty")
    return os.fsencode(text)


def header(text: str) -> tuple[str, bytes]:
    """``produce -H KEY=VALUE``: a header name (text; a record's header names are UTF-8)
    and its value as bytes given on the command line (binary-safe, as ``key_separator``)."""
    key, value = _key_value(text)
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"the header name {key!r} is not valid UTF-8") from None
    return key, os.fsencode(value)
