"""The argparse ``type=`` functions of every command: how command-line text becomes
offsets, counts, sizes, durations and ``KEY=VALUE`` pairs.

Each kind of value is parsed here once, so every option that takes one accepts the same
spellings and refuses the rest with the same message. A refusal is an
``argparse.ArgumentTypeError``, which argparse prints as ``argument --OPTION: MESSAGE``
and turns into exit code 2 (a usage error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, Literal

__all__ = [
    "Position",
    "byte_size",
    "from_position",
    "key_separator",
    "offset",
    "positive",
    "positive_seconds",
    "seconds",
    "setting",
    "start_offset",
    "storage_option",
]

Position = int | Literal["start", "end"]

MIN_SIZE = 1024
"""The smallest size an option takes: less is a unit left out (``64`` for ``64MiB``)."""

_SIZE = re.compile(r"\s*(-?\d+)\s*([kmg]ib)?\s*", re.IGNORECASE)
_UNITS = {None: 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


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
    """``consume --from``: an offset, or ``start``/``end`` of the stream."""
    if text in ("start", "end"):
        return "start" if text == "start" else "end"
    return offset(text)


# ------------------------------------------------------------------ sizes, durations


def byte_size(text: str) -> int:
    """Bytes: an integer, optionally with a binary suffix ``KiB``, ``MiB`` or ``GiB`` in
    any case (``64MiB``, ``1gib``), at least :data:`MIN_SIZE`. Decimal units (``MB``)
    are refused rather than guessed at."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (an integer, optionally with KiB, MiB or GiB)"
        )
    digits, unit = match.groups()
    value = int(digits) * _UNITS[unit and unit.lower()]
    if value < MIN_SIZE:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_SIZE} bytes, not {text}")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, 0 or more, fractions allowed (``gc --grace``)."""
    value = _number(text)
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def positive_seconds(text: str) -> float:
    """A duration in seconds, more than 0 (``consume --idle-timeout``: 0 would stop at
    once)."""
    value = _number(text)
    if not value > 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


# ------------------------------------------------------------------------ KEY=VALUE


def storage_option(text: str) -> tuple[str, Any]:
    """``--storage-option KEY=VALUE``: VALUE is JSON when it parses (numbers, true,
    objects), else a string."""
    key, value = _key_value(text)
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def setting(text: str) -> tuple[str, Any]:
    """``alter``'s ``KEY=VALUE``: VALUE must be JSON (the settings are numbers; the log
    checks names and values)."""
    key, value = _key_value(text)
    try:
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: {value!r} is not a number") from None


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
