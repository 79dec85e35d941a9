"""Consumer-group offsets of a local log: one small JSON file per group.

::

    <log>/groups/<group>.json   {"version": 2, "group": ..., "offsets": {stream: offset}}
                                and a checksum trailer (version 1 had none)
    <log>/groups/<group>.lock   flock'ed while a commit reads, merges and replaces the file

Group names are validated (the stream-name rule) before they get here, so a group file
never leaves ``groups/``. A commit is a read-modify-write under the group's lock, so
processes committing different streams of one group at once keep each other's
positions; the new file is written in ``tmp/`` and renamed into place, so readers (who
take no lock) see either the old or the new offsets, never a torn file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..checksummed import decode_json
from ..errors import CorruptDataError, InvalidStreamName
from ..names import validate_group_name
from .layout import flocked, write_json

__all__ = [
    "GROUPS",
    "commit_offsets",
    "committed_offsets",
    "forget_stream",
    "group_path",
    "list_groups",
]

GROUPS = "groups"
_VERSION = 2
_READABLE = (1, _VERSION)


def group_path(root: Path, group: str) -> Path:
    """The file holding ``group``'s offsets in the log at ``root``."""
    return root / GROUPS / f"{group}.json"


def committed_offsets(root: Path, group: str) -> dict[str, int]:
    """The offsets ``group`` committed, by stream; ``{}`` for a group that never committed.

    Raises :class:`CorruptDataError` naming the file if it is not a valid group file.
    """
    path = group_path(root, group)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    return _decode(raw, path, group)


def list_groups(root: Path) -> list[str]:
    """The groups whose file holds at least one offset, sorted (a group's file stays,
    empty, when :func:`forget_stream` took its last stream). Raises
    :class:`CorruptDataError` naming a damaged group file, as reading that group would."""
    directory = root / GROUPS
    if not directory.exists():
        return []
    names = []
    for path in sorted(directory.glob("*.json")):
        try:
            group = validate_group_name(path.stem)
        except InvalidStreamName:
            continue  # not a group's file (a group name cannot be a path)
        if committed_offsets(root, group):
            names.append(group)
    return names


def commit_offsets(root: Path, group: str, offsets: Mapping[str, int], *, sync: bool) -> None:
    """Merge ``offsets`` (already validated) into ``group``'s stored offsets.

    Streams not named in ``offsets`` keep their stored offsets. With ``sync`` the new
    file and the directory entry are fsynced before this returns.
    """
    (root / GROUPS).mkdir(exist_ok=True)
    _update(root, group, lambda current: {**current, **offsets}, sync=sync)


def forget_stream(root: Path, stream: str, *, sync: bool) -> None:
    """Remove a deleted stream's offsets from every group (as Kafka does when a topic is
    deleted): a stream created again later starts with no committed position."""
    directory = root / GROUPS
    if not directory.exists():
        return
    for path in sorted(directory.glob("*.json")):
        group = path.stem
        if stream in committed_offsets(root, group):
            _update(
                root,
                group,
                lambda current: {k: v for k, v in current.items() if k != stream},
                sync=sync,
            )


def _update(
    root: Path, group: str, change: Callable[[dict[str, int]], Mapping[str, int]], *, sync: bool
) -> None:
    """Replace ``group``'s offsets with ``change(current)``, under the group's lock."""
    directory = root / GROUPS
    path = group_path(root, group)
    with flocked(directory / f"{group}.lock"):
        try:
            current = _decode(path.read_bytes(), path, group)
        except FileNotFoundError:
            current = {}
        content = {
            "version": _VERSION,
            "group": group,
            "offsets": dict(sorted(change(current).items())),
        }
        write_json(root, path, content, sync=sync, indent=1)


def _decode(raw: bytes, path: Path, group: str) -> dict[str, int]:
    content: Any
    content, checked = decode_json(raw, str(path), what="consumer group file")
    version = content.get("version") if isinstance(content, dict) else None
    if version not in _READABLE or (version == _VERSION and not checked):
        raise CorruptDataError(
            f"not a version {_VERSION} consumer group file with its checksum (nor version 1)",
            source=str(path),
        )
    offsets = content.get("offsets")
    if content.get("group") != group or not isinstance(offsets, dict):
        raise CorruptDataError(
            f"consumer group file does not hold the offsets of group {group!r}", source=str(path)
        )
    for stream, offset in offsets.items():
        if type(stream) is not str or type(offset) is not int or offset < 0:
            raise CorruptDataError(
                f"invalid offset {offset!r} for stream {stream!r}", source=str(path)
            )
    return offsets
