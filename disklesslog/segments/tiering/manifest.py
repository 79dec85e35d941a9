"""The tiered-segment manifest of one stream: which segments live in object storage.

KIP-405's remote log metadata, kept as one small file per stream directory
(``tier.manifest``, specified in ``docs/format.md`` section 2.9). It lists the stream's
tiered segments in offset order, each with its three objects (``.log``, ``.index``,
``.timeindex``), their sizes and CRC-32C, and a state:

``copying``
    written *before* the upload starts (KIP-405's COPY_SEGMENT_STARTED), so an object
    under the tier prefix is always named by some manifest while it may be needed: the
    reconcile pass of garbage collection deletes only objects no manifest names.
    Readers ignore these entries; the next tiering run finishes or replaces them.
``tiered``
    uploaded and verified (size and CRC-32C read back): readers use it, and the local
    copy may be deleted (COPY_SEGMENT_FINISHED).

``garbage`` lists objects that left the stream (trimmed, or replaced copies) with the
time they did, for garbage collection after its grace period (DELETE_SEGMENT_STARTED;
the entry goes once the objects are deleted). ``start_offset`` is the stream's start
offset while it lies in the tiered part (the state record holds the *local* start).

The file is replaced atomically (written beside, fsynced, renamed) by a holder of the
stream lock only. Readers take no lock: :class:`ManifestCache` re-reads the file when
its identity (inode, size, mtime) changes, which every replacement does.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import CorruptDataError
from ...forks import fork_safe_lock
from ...format import crc32c
from ...storage.atomic import TEMPORARY_INFIX, replace_file

__all__ = [
    "COPYING",
    "MANIFEST",
    "TIERED",
    "Garbage",
    "Manifest",
    "ManifestCache",
    "TieredObject",
    "TieredSegment",
    "load",
    "save",
]

MANIFEST = "tier.manifest"
"""File name of the manifest in a stream directory."""
_TEMP_PREFIX = MANIFEST + TEMPORARY_INFIX
_HEADER = struct.Struct("<4sII")  # magic, CRC-32C of the body, body length
_MAGIC = b"DLTM"
_VERSION = 1
_MAX_BODY = 1 << 30

COPYING = "copying"
TIERED = "tiered"
_STATES = (COPYING, TIERED)


@dataclass(frozen=True)
class TieredObject:
    """One object of a tiered segment: its key under the tier URL, size and CRC-32C."""

    key: str
    size: int
    crc32c: int


@dataclass(frozen=True)
class TieredSegment:
    """A segment ``[base_offset, end_offset)`` in object storage (or on its way there)."""

    base_offset: int
    end_offset: int
    max_timestamp: int
    log: TieredObject
    index: TieredObject
    timeindex: TieredObject
    state: str
    since_ms: int
    """When the segment entered ``state`` (wall clock, ms)."""

    @property
    def size(self) -> int:
        """Bytes of the segment's data (its ``.log`` object)."""
        return self.log.size

    @property
    def tiered(self) -> bool:
        return self.state == TIERED

    @property
    def objects(self) -> tuple[TieredObject, TieredObject, TieredObject]:
        return self.log, self.index, self.timeindex

    def object_keys(self) -> list[str]:
        return [obj.key for obj in self.objects]


@dataclass(frozen=True)
class Garbage:
    """An object no reader may start using any more: its key and size, and since when
    (wall clock, ms) it is garbage."""

    key: str
    size: int
    since_ms: int


@dataclass
class Manifest:
    """The decoded manifest of one stream (see the module documentation)."""

    stream: str
    incarnation: str
    """Random id of this manifest's lifetime: part of every object key, so a stream that
    is deleted and created again never reuses an object of its predecessor."""
    start_offset: int = 0
    segments: list[TieredSegment] = field(default_factory=list)
    garbage: list[Garbage] = field(default_factory=list)

    @classmethod
    def new(cls, stream: str) -> Manifest:
        return cls(stream, secrets.token_hex(8))

    # ------------------------------------------------------------------ views

    def tiered_run(self) -> list[TieredSegment]:
        """The verified segments readers may use: the contiguous ``tiered`` entries from
        the one holding :attr:`start_offset` on (``copying`` ones end the run)."""
        run: list[TieredSegment] = []
        for seg in self.segments:
            if seg.end_offset <= self.start_offset:
                continue
            if not seg.tiered or (run and seg.base_offset != run[-1].end_offset):
                break
            if not run and seg.base_offset > self.start_offset:
                break  # a hole at the front: nothing is readable from the tier
            run.append(seg)
        return run

    def tiered_end(self) -> int | None:
        """End offset of :meth:`tiered_run`, or ``None`` when it is empty."""
        run = self.tiered_run()
        return run[-1].end_offset if run else None

    def referenced_keys(self) -> set[str]:
        """Every object key this manifest names, in any state (garbage included)."""
        keys = {key for seg in self.segments for key in seg.object_keys()}
        keys.update(item.key for item in self.garbage)
        return keys

    # -------------------------------------------------------------- changes

    def discard_from(self, index: int, now_ms: int) -> list[TieredSegment]:
        """Remove the segments from position ``index`` on; their objects become garbage."""
        gone, self.segments = self.segments[index:], self.segments[:index]
        self._doom(gone, now_ms)
        return gone

    def trim(self, before: int, now_ms: int) -> list[TieredSegment]:
        """Move :attr:`start_offset` up to ``before``; segments wholly below it leave the
        manifest and their objects become garbage. Returns the segments removed."""
        if before <= self.start_offset:
            return []
        self.start_offset = before
        keep = [seg for seg in self.segments if seg.end_offset > before]
        gone = [seg for seg in self.segments if seg.end_offset <= before]
        self.segments = keep
        self._doom(gone, now_ms)
        return gone

    def _doom(self, segments: list[TieredSegment], now_ms: int) -> None:
        live = {key for seg in self.segments for key in seg.object_keys()}
        known = {item.key for item in self.garbage}
        for seg in segments:
            for obj in seg.objects:
                if obj.key not in live and obj.key not in known:
                    self.garbage.append(Garbage(obj.key, obj.size, now_ms))
                    known.add(obj.key)

    # ------------------------------------------------------------- encoding

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": _VERSION,
            "stream": self.stream,
            "incarnation": self.incarnation,
            "start_offset": self.start_offset,
            "segments": [_segment_dict(seg) for seg in self.segments],
            "garbage": [
                {"key": item.key, "size": item.size, "since_ms": item.since_ms}
                for item in self.garbage
            ],
        }

    def encode(self) -> bytes:
        body = json.dumps(self.to_dict(), separators=(",", ":")).encode()
        return _HEADER.pack(_MAGIC, crc32c(body), len(body)) + body

    @classmethod
    def decode(cls, raw: bytes, source: str) -> Manifest:
        """Parse and check a manifest; anything malformed is :class:`CorruptDataError`."""
        if len(raw) < _HEADER.size:
            raise CorruptDataError("manifest shorter than its header", source=source, position=0)
        magic, crc, length = _HEADER.unpack_from(raw)
        if magic != _MAGIC:
            raise CorruptDataError(f"bad manifest magic {magic!r}", source=source, position=0)
        body = raw[_HEADER.size :]
        if length != len(body) or length > _MAX_BODY:
            raise CorruptDataError(
                f"manifest body is {len(body)} bytes, its header says {length}",
                source=source,
                position=0,
            )
        if crc32c(body) != crc:
            raise CorruptDataError("manifest fails its CRC-32C", source=source, position=0)
        try:
            content = json.loads(body)
            if content.get("version") != _VERSION:
                raise ValueError(f"unknown version {content.get('version')!r}")
            manifest = cls(
                stream=_str(content["stream"]),
                incarnation=_str(content["incarnation"]),
                start_offset=_int(content["start_offset"]),
                segments=[_segment(item) for item in content["segments"]],
                garbage=[
                    Garbage(_str(item["key"]), _int(item["size"]), _int(item["since_ms"]))
                    for item in content["garbage"]
                ],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptDataError(
                f"malformed manifest: {exc}", source=source, position=_HEADER.size
            ) from None
        for before, after in zip(manifest.segments, manifest.segments[1:]):
            if after.base_offset != before.end_offset:
                raise CorruptDataError(
                    f"manifest segments are not contiguous: {before.end_offset} then "
                    f"{after.base_offset}",
                    source=source,
                )
        return manifest


def _segment_dict(seg: TieredSegment) -> dict[str, Any]:
    return {
        "base_offset": seg.base_offset,
        "end_offset": seg.end_offset,
        "max_timestamp": seg.max_timestamp,
        "state": seg.state,
        "since_ms": seg.since_ms,
        "log": _object_dict(seg.log),
        "index": _object_dict(seg.index),
        "timeindex": _object_dict(seg.timeindex),
    }


def _object_dict(obj: TieredObject) -> dict[str, Any]:
    return {"key": obj.key, "size": obj.size, "crc32c": obj.crc32c}


def _segment(item: dict[str, Any]) -> TieredSegment:
    seg = TieredSegment(
        base_offset=_int(item["base_offset"]),
        end_offset=_int(item["end_offset"]),
        max_timestamp=_int(item["max_timestamp"], low=-1),
        log=_object(item["log"]),
        index=_object(item["index"]),
        timeindex=_object(item["timeindex"]),
        state=_str(item["state"]),
        since_ms=_int(item["since_ms"]),
    )
    if seg.state not in _STATES:
        raise ValueError(f"unknown segment state {seg.state!r}")
    if seg.end_offset <= seg.base_offset:
        raise ValueError(f"empty segment {seg.base_offset}..{seg.end_offset}")
    return seg


def _object(item: dict[str, Any]) -> TieredObject:
    return TieredObject(_str(item["key"]), _int(item["size"]), _int(item["crc32c"]))


def _int(value: Any, *, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise ValueError(f"expected an int >= {low}, not {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, not {value!r}")
    return value


# ------------------------------------------------------------------ files


def load(directory: Path) -> Manifest | None:
    """The manifest in a stream directory, or ``None`` if the stream was never tiered."""
    path = directory / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return Manifest.decode(raw, str(path))


def save(directory: Path, manifest: Manifest, *, sync: bool) -> None:
    """Replace the manifest atomically. The caller holds the stream lock, so any
    temporary file left beside it is a crashed writer's and is removed first."""
    for name in os.listdir(directory):
        if name.startswith(_TEMP_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)
    replace_file(directory / MANIFEST, manifest.encode(), sync=sync, mode=0o644)


class ManifestCache:
    """Each stream's manifest as last read, re-read whenever the file was replaced.

    One ``stat`` per lookup: a replacement by rename always brings a new inode, and the
    size and mtime are compared too, so a changed file is never mistaken for the old one.
    """

    def __init__(self) -> None:
        self._lock = fork_safe_lock()
        self._known: dict[Path, tuple[tuple[int, int, int, int], Manifest]] = {}
        self._paths: dict[Path, str] = {}  # joining paths costs more than the stat

    def get(self, directory: Path) -> Manifest | None:
        path = self._paths.get(directory)
        if path is None:
            path = self._paths[directory] = os.path.join(directory, MANIFEST)
        for _ in range(3):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if directory in self._known:
                    with self._lock:
                        self._known.pop(directory, None)
                return None
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            with self._lock:
                known = self._known.get(directory)
            if known is not None and known[0] == identity:
                return known[1]
            try:
                with open(path, "rb") as f:
                    st_now = os.fstat(f.fileno())
                    raw = f.read()
            except FileNotFoundError:
                continue  # replaced between stat and open: look again
            manifest = Manifest.decode(raw, path)
            identity = (st_now.st_dev, st_now.st_ino, st_now.st_size, st_now.st_mtime_ns)
            with self._lock:
                self._known[directory] = (identity, manifest)
            return manifest
        return load(directory)

    def forget(self, directory: Path) -> None:
        with self._lock:
            self._known.pop(directory, None)


def iter_manifests(streams_dir: Path) -> Iterator[tuple[str, Manifest]]:
    """``(stream, manifest)`` of every stream directory under ``streams_dir`` that has one."""
    try:
        entries = sorted(os.listdir(streams_dir))
    except FileNotFoundError:
        return
    for name in entries:
        try:
            manifest = load(streams_dir / name)
        except (NotADirectoryError, FileNotFoundError):
            continue
        if manifest is not None:
            yield name, manifest
