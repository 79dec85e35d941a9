"""Typed parsing of the data source's options (strings from Spark) into plain values.

Spark hands a data source its options as a case-insensitive dict of strings (keys arrive
lower-cased). Everything is parsed here, once, on the driver, so a typo or a bad value
fails at ``load()``/``start()`` with a :class:`~disklesslog.ConfigError` that names the
option, instead of deep inside an executor. This module does not import pyspark: the
rules are plain Python and tested without a JVM.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import AbstractLog
from ..errors import ConfigError, InvalidStreamName
from ..names import validate_stream_name
from ..urls import open_log, split_url

__all__ = [
    "EARLIEST",
    "LATEST",
    "LogOptions",
    "OffsetSpec",
    "ReadOptions",
    "check_known",
    "get_option",
    "parse_bool",
    "parse_log_options",
    "parse_positive_int",
    "parse_read_options",
]

EARLIEST = "earliest"
LATEST = "latest"

OffsetSpec = str | dict[str, int]
"""``"earliest"``, ``"latest"``, or a ``{stream: offset}`` dict (in which Kafka's ``-2``
and ``-1`` mean earliest and latest)."""

COLUMNS = ("key", "value", "stream", "offset", "timestamp", "headers")
"""Every column a read can produce, in the default order (``headers`` only if asked)."""

STORAGE_PREFIX = "storage."

LOG_OPTIONS = ("url", "path", "backend", "sequencer", "storageoptions", "retrydeadlinems")
"""Options that say where the log is; shared by the read and the write side."""

READ_OPTIONS = (
    "streams",
    "streampattern",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "maxrecordsperpartition",
    "maxrecordspertrigger",
    "includeheaders",
    "columns",
    "failondataloss",
)

# Spell the documented (camel-case) names in messages, though Spark lower-cases keys.
_DISPLAY = {
    "storageoptions": "storageOptions",
    "retrydeadlinems": "retryDeadlineMs",
    "streampattern": "streamPattern",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "startingtimestamp": "startingTimestamp",
    "maxrecordsperpartition": "maxRecordsPerPartition",
    "maxrecordspertrigger": "maxRecordsPerTrigger",
    "includeheaders": "includeHeaders",
    "failondataloss": "failOnDataLoss",
}


def _shown(key: str) -> str:
    return _DISPLAY.get(key, key)


@dataclass(frozen=True)
class LogOptions:
    """Where the log is and how to reach it: what every executor needs to open it itself.

    Small and picklable on purpose: Spark ships it to executors inside the reader or
    writer; no open handle ever travels.
    """

    url: str
    backend: str | None = None
    sequencer: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    retry_deadline_ms: int | None = None
    """The log's ``retry_deadline_ms`` (``None``: the library's default)."""

    def open(self, *, create: bool = False) -> AbstractLog:
        """Open the log. Readers pass ``create=False`` so a mistyped URL is an error,
        not a new empty log."""
        options: dict[str, Any] = {"create": create}
        if self.backend is not None:
            options["backend"] = self.backend
        if self.sequencer is not None:
            options["sequencer"] = self.sequencer
        if self.retry_deadline_ms is not None:
            options["retry_deadline_ms"] = self.retry_deadline_ms
        if self.storage_options:
            if self._is_local():
                # A local log keeps only its tiered part in object storage.
                options["tier_storage_options"] = self.storage_options
            else:
                options["storage_options"] = self.storage_options
        return open_log(self.url, **options)

    def _is_local(self) -> bool:
        return self.backend in (None, "segments") and split_url(self.url)[0] == "file"


@dataclass(frozen=True)
class ReadOptions:
    """Every read option, parsed. See ``docs/spark.md`` for what each one means."""

    log: LogOptions
    streams: tuple[str, ...] | None
    stream_pattern: str | None
    starting_offsets: OffsetSpec | None
    ending_offsets: OffsetSpec
    starting_timestamp: int | None
    max_records_per_partition: int | None
    max_records_per_trigger: int | None
    columns: tuple[str, ...]
    """The columns the read produces, in order (``columns``, or the default set)."""
    fail_on_data_loss: bool

    @property
    def include_headers(self) -> bool:
        return "headers" in self.columns

    def selects(self, name: str) -> bool:
        """Whether stream ``name`` is one this read covers."""
        if self.streams is not None:
            return name in self.streams
        assert self.stream_pattern is not None
        return re.fullmatch(self.stream_pattern, name) is not None

    def select(self, existing: list[str]) -> list[str]:
        """The streams this read covers among ``existing`` (sorted)."""
        return [name for name in existing if self.selects(name)]


def check_known(options: Mapping[str, str], known: tuple[str, ...], side: str) -> None:
    """Raise :class:`ConfigError` for an option nobody reads (a typo would otherwise be
    silently ignored). ``storage.<key>`` options are always known."""
    allowed = set(LOG_OPTIONS) | set(known)
    for key in options:
        lowered = key.lower()
        if lowered.startswith(STORAGE_PREFIX) or lowered in allowed:
            continue
        names = sorted(_shown(k) for k in allowed if k != "path")
        raise ConfigError(
            f"unknown {side} option {key!r} for the disklesslog data source; known options: "
            f"{', '.join(names)} and storage.<key>"
        )


def get_option(options: Mapping[str, str], key: str) -> str | None:
    """The value of ``key`` (lower-case), whatever case the caller's dict keeps.

    For the package's own modules: Spark's option names are case-insensitive, so the
    writer reads its own options (``stream``, ``transactionId``) through this too."""
    for name, value in options.items():
        if name.lower() == key:
            return value
    return None


def parse_bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = get_option(options, key)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ConfigError(f"option {_shown(key)} must be true or false, not {raw!r}")


def parse_columns(options: Mapping[str, str]) -> tuple[str, ...]:
    """``columns`` (a comma-separated subset of the schema, in the order wanted), or the
    default columns, with ``headers`` if ``includeHeaders``."""
    include_headers = parse_bool(options, "includeheaders", False)
    raw = get_option(options, "columns")
    if raw is None:
        return COLUMNS if include_headers else COLUMNS[:-1]
    names = tuple(name.strip() for name in raw.split(","))
    unknown = [name for name in names if name and name not in COLUMNS]
    if unknown or not all(names):
        raise ConfigError(
            f"option columns names {', '.join(map(repr, unknown)) or 'an empty column'}; "
            f"choose among {', '.join(COLUMNS)} (comma-separated)"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"option columns names a column twice: {raw!r}")
    if include_headers and "headers" not in names:
        raise ConfigError("includeHeaders=true with columns that omit headers: add headers")
    return names


def parse_positive_int(options: Mapping[str, str], key: str) -> int | None:
    raw = get_option(options, key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"option {_shown(key)} must be a positive integer, not {raw!r}") from None
    if value < 1:
        raise ConfigError(f"option {_shown(key)} must be a positive integer, not {raw!r}")
    return value


def parse_log_options(options: Mapping[str, str]) -> LogOptions:
    """``url`` (or the path given to ``load()``/``save()``), ``backend``, ``sequencer``,
    ``storageOptions`` (a JSON object) and ``storage.<key>`` options.

    ``storage.<key>`` values are strings; dots in ``<key>`` nest
    (``storage.client_kwargs.endpoint_url``). Spark lower-cases option names, so a
    storage option whose name needs capitals, or a value that is not a string, goes in
    ``storageOptions``; ``storage.<key>`` entries override it key by key.
    """
    url = get_option(options, "url")
    path = get_option(options, "path")
    if url is not None and path is not None and url != path:
        raise ConfigError(f"give the log's URL once: url={url!r} but load()/save() got {path!r}")
    url = url if url is not None else path
    if url is None or not url.strip():
        raise ConfigError(
            "the disklesslog data source needs the log's URL: .option('url', ...) "
            "or .load(url) / .save(url)"
        )
    storage: dict[str, Any] = {}
    raw_json = get_option(options, "storageoptions")
    if raw_json is not None:
        try:
            storage = json.loads(raw_json)
        except ValueError as exc:
            raise ConfigError(f"option storageOptions is not valid JSON: {exc}") from None
        if not isinstance(storage, dict):
            raise ConfigError("option storageOptions must be a JSON object")
    for key, value in options.items():
        if not key.lower().startswith(STORAGE_PREFIX):
            continue
        parts = key[len(STORAGE_PREFIX) :].lower().split(".")
        if not all(parts):
            raise ConfigError(f"option {key!r} needs a name after 'storage.' (no empty parts)")
        target = storage
        for part in parts[:-1]:
            nested = target.setdefault(part, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"option {key!r} nests under {part!r}, which is a value")
            target = nested
        target[parts[-1]] = value
    return LogOptions(
        url=url.strip(),
        backend=get_option(options, "backend"),
        sequencer=get_option(options, "sequencer"),
        storage_options=storage,
        retry_deadline_ms=parse_positive_int(options, "retrydeadlinems"),
    )


def _parse_offsets(options: Mapping[str, str], key: str) -> OffsetSpec | None:
    raw = get_option(options, key)
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ConfigError(
            f"option {_shown(key)} must be 'earliest', 'latest' or a JSON object "
            f'{{"stream": offset}}, not {raw!r}'
        )
    offsets: dict[str, int] = {}
    for name, offset in parsed.items():
        try:
            validate_stream_name(name)
        except InvalidStreamName as exc:
            raise ConfigError(f"option {_shown(key)}: {exc}") from None
        if type(offset) is not int or offset < -2:
            raise ConfigError(
                f"option {_shown(key)}: the offset of {name!r} must be an integer >= 0 "
                f"(or -2 for earliest, -1 for latest), not {offset!r}"
            )
        offsets[name] = offset
    return offsets


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Parse and check every read option; raises :class:`ConfigError` naming the bad one."""
    check_known(options, READ_OPTIONS, "read")
    log = parse_log_options(options)

    raw_streams = get_option(options, "streams")
    pattern = get_option(options, "streampattern")
    if (raw_streams is None) == (pattern is None):
        raise ConfigError(
            "give exactly one of the options streams ('a,b') and streamPattern (a regex)"
        )
    streams: tuple[str, ...] | None = None
    if raw_streams is not None:
        names = [name.strip() for name in raw_streams.split(",") if name.strip()]
        if not names:
            raise ConfigError("option streams names no stream; give 'a' or 'a,b'")
        try:
            streams = tuple(dict.fromkeys(validate_stream_name(name) for name in names))
        except InvalidStreamName as exc:
            raise ConfigError(f"option streams: {exc}") from None
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"option streamPattern is not a valid regex: {exc}") from None

    starting = _parse_offsets(options, "startingoffsets")
    ending = _parse_offsets(options, "endingoffsets")
    if ending == EARLIEST:
        raise ConfigError("option endingOffsets cannot be 'earliest'; use 'latest' or JSON")
    if isinstance(ending, dict) and -2 in ending.values():
        raise ConfigError("option endingOffsets cannot use -2 (earliest) for a stream")

    raw_timestamp = get_option(options, "startingtimestamp")
    timestamp: int | None = None
    if raw_timestamp is not None:
        if starting is not None:
            raise ConfigError("give startingOffsets or startingTimestamp, not both")
        try:
            timestamp = int(raw_timestamp.strip())
        except ValueError:
            timestamp = None
        if timestamp is None or timestamp < 0:
            raise ConfigError(
                "option startingTimestamp must be milliseconds since the Unix epoch (an "
                f"integer >= 0), not {raw_timestamp!r}"
            )

    return ReadOptions(
        log=log,
        streams=streams,
        stream_pattern=pattern,
        starting_offsets=starting,
        ending_offsets=ending if ending is not None else LATEST,
        starting_timestamp=timestamp,
        max_records_per_partition=parse_positive_int(options, "maxrecordsperpartition"),
        max_records_per_trigger=parse_positive_int(options, "maxrecordspertrigger"),
        columns=parse_columns(options),
        fail_on_data_loss=parse_bool(options, "failondataloss", True),
    )
