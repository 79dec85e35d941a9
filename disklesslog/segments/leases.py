"""Leases of a local log: one small checksummed JSON file per lease name, and an index
of the names that proves none is missing.

::

    <log>/leases/<name>.json   {"version": 2, "lease": name, "holder": str or null,
                                "token": int, "serial": int, "duration_ms": int}
                                and a checksum trailer (docs/format.md section 2.10)
    <log>/leases/.lock         flock'ed while any lease or the index changes
    <log>/leases.json          {"version": 1, "names": [name, ...], "token_floor": int}

:class:`LeaseFiles` is the :class:`~disklesslog.leases.LeaseStore` of a log; the rules
(who may take a lease, tokens, expiry by each process's own clock) are
:class:`~disklesslog.leases.LeaseKeeper`'s. A swap is a read-compare-replace under
``leases/.lock``, so of two processes swapping from one serial exactly one wins; files
are written in ``tmp/`` and renamed into place (fsynced, with their directory), so
readers, who take no lock, see the old or the new record, never a torn one. Lease names
are validated (the stream-name rule) before they get here, so a file never leaves
``leases/``.

The index is what turns a lease file deleted outright into reported damage rather than
a name never taken (whose token would restart): a new name's file is written before the
name is listed, a pruned name is unlisted before its file is removed, so a listed name
always has its file. A file not listed (a crash between the two steps, or a file of a
release before the index) is adopted at the next change of the index. Files written by
this release are version 2: one of them without an index means the index was lost.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checksummed import decode_json
from ..errors import CorruptDataError, InvalidStreamName
from ..forks import fork_safe_lock
from ..leases import LeaseKeeper, LeaseRecord, raised_floor, starts_above_floor
from ..names import validate_lease_name
from .layout import flocked, read_json, write_json

__all__ = ["LEASES", "LEASE_INDEX", "LeaseFiles", "lease_keeper"]

LEASES = "leases"
LEASE_INDEX = "leases.json"
_LOCK = ".lock"  # no lease has the empty name, so no <name>.json or <name>.lock is this
_VERSION = 2
_READABLE = (1, 2)  # version 1: written before the index, adopted into it
_INDEX_VERSION = 1

_KEEPERS: dict[Path, LeaseKeeper] = {}
_KEEPERS_LOCK = fork_safe_lock()


def lease_keeper(root: Path) -> LeaseKeeper:
    """The keeper of the leases of the log at ``root``, one per directory in this
    process: every handle of the log shares its observations of other holders' records
    (what lets a process take an expired lease over), as they share the files."""
    key = root.resolve()
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(key)
        if keeper is None:
            keeper = _KEEPERS[key] = LeaseKeeper(LeaseFiles(key))
        return keeper


@dataclass(frozen=True)
class _Index:
    """``leases.json`` as read: the listed names, the token floor, and whether the file
    exists (absent: no lease was taken by this release yet)."""

    names: frozenset[str]
    floor: int
    stored: bool


class LeaseFiles:
    """The lease records of the log at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.directory = root / LEASES
        self.index_path = root / LEASE_INDEX

    def read_lease(self, name: str) -> LeaseRecord | None:
        record = self._read_file(name)
        if record is not None:
            return record
        if not self.directory.is_dir():
            self._check_absent(name, self._index())
            return None
        with flocked(self.directory / _LOCK):  # no change under way: file and index agree
            record = self._read_file(name)
            if record is None:
                self._check_absent(name, self._index())
            return record

    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        """Always fsynced: a token handed out and then forgotten in a power failure
        could be handed out again, to another holder. A new name's token and serial
        must be above the token floor (else False, nothing changed)."""
        self.directory.mkdir(exist_ok=True)
        with flocked(self.directory / _LOCK):
            current = self._read_file(name)
            index = self._index()
            if current is None:
                self._check_absent(name, index)
            if (0 if current is None else current.serial) != serial:
                return False
            if current is None and not starts_above_floor(record, index.floor):
                return False
            if (current is not None and name not in index.names) or not index.stored:
                self._write_index(index.names, index.floor)  # adopts the unlisted files
            content = {
                "version": _VERSION,
                "lease": name,
                "holder": record.holder,
                "token": record.token,
                "serial": record.serial,
                "duration_ms": record.duration_ms,
            }
            write_json(self.root, self._path(name), content, sync=True)
            if current is None:
                self._write_index(index.names | {name}, index.floor)
            return True

    def drop_lease(self, name: str, serial: int) -> bool:
        """Unlist ``name`` (its token and serial now under the floor), then remove its
        file."""
        if not self.directory.is_dir():
            return False
        with flocked(self.directory / _LOCK):
            current = self._read_file(name)
            index = self._index()
            if current is None:
                self._check_absent(name, index)
                return False
            if current.serial != serial:
                return False
            self._write_index(index.names, raised_floor(index.floor, current), dropped=name)
            self._path(name).unlink()
            with contextlib.suppress(FileNotFoundError):  # a release before the index's lock
                (self.directory / f"{name}.lock").unlink()
            return True

    def lease_names(self) -> list[str]:
        """Every listed name and every lease file's (listed or not), sorted: a listed
        name without its file reads as damage."""
        return sorted(self._index().names | set(self._file_names()))

    def lease_floor(self) -> int:
        return self._index().floor

    # ------------------------------------------------------------------ helpers

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def _read_file(self, name: str) -> LeaseRecord | None:
        path = self._path(name)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _decode(raw, path, name)[0]

    def _file_names(self) -> list[str]:
        """The names of the lease files in ``leases/`` (other files are ignored)."""
        try:
            entries = os.listdir(self.directory)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = []
        for entry in entries:
            stem, dot, suffix = entry.rpartition(".")
            if dot and suffix == "json":
                with contextlib.suppress(InvalidStreamName):
                    names.append(validate_lease_name(stem))
        return names

    def _check_absent(self, name: str, index: _Index) -> None:
        """``name`` has no file: damage if the index lists it."""
        if name in index.names:
            raise CorruptDataError(
                f"lease file is missing: lease {name!r} is listed in {self.index_path} "
                "(a deleted lease file would give its fencing tokens out again)",
                source=str(self._path(name)),
            )

    def _index(self) -> _Index:
        """The index as stored; absent, the empty one, unless a version 2 lease file
        exists (it was written with the index, which is then lost)."""
        path = self.index_path
        found = read_json(path, what="lease index")
        if found is None:
            for name in self._file_names():
                try:
                    version = _decode(self._path(name).read_bytes(), self._path(name), name)[1]
                except (FileNotFoundError, CorruptDataError):
                    continue  # a damaged file is reported when it is read, not here
                if version >= 2:
                    raise CorruptDataError(
                        f"the lease index is missing, but lease file {name}.json was "
                        "written with it (a lost index would give pruned leases' fencing "
                        "tokens out again)",
                        source=str(path),
                    )
            return _Index(frozenset(), 0, stored=False)
        content: Any
        content, checked = found
        if not checked or not isinstance(content, dict):
            raise CorruptDataError("not a lease index with its checksum", source=str(path))
        names, floor = content.get("names"), content.get("token_floor")
        if (
            content.get("version") != _INDEX_VERSION
            or type(names) is not list
            or type(floor) is not int
            or floor < 0
        ):
            raise CorruptDataError(f"not a version {_INDEX_VERSION} lease index", source=str(path))
        try:
            listed = frozenset(validate_lease_name(n) for n in names)
        except InvalidStreamName as exc:
            raise CorruptDataError(
                f"the lease index lists a bad name: {exc}", source=str(path)
            ) from None
        return _Index(listed, floor, stored=True)

    def _write_index(self, names: frozenset[str], floor: int, *, dropped: str = "") -> None:
        """Store the index listing ``names`` and every lease file there is (adopting
        unlisted ones) but ``dropped``'s, fsynced."""
        listed = (names | set(self._file_names())) - {dropped}
        content = {"version": _INDEX_VERSION, "names": sorted(listed), "token_floor": floor}
        write_json(self.root, self.index_path, content, sync=True)


def _decode(raw: bytes, path: Path, name: str) -> tuple[LeaseRecord, int]:
    """The record in a lease file and the file's version."""
    content: Any
    content, checked = decode_json(raw, str(path), what="lease file")
    version = content.get("version") if isinstance(content, dict) else None
    if not checked or type(version) is not int or version not in _READABLE:
        raise CorruptDataError(
            f"not a version {_VERSION} lease file with its checksum", source=str(path)
        )
    fields: list[Any] = [content.get(key) for key in ("holder", "token", "serial", "duration_ms")]
    holder, token, serial, duration = fields
    if (
        content.get("lease") != name
        or not (holder is None or type(holder) is str)
        or not all(type(n) is int and n > 0 for n in (token, serial, duration))
    ):
        raise CorruptDataError(f"lease file does not hold lease {name!r}", source=str(path))
    return LeaseRecord(holder, token, serial, duration), version
