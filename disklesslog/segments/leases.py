"""Leases of a local log: one small checksummed JSON file per lease name.

::

    <log>/leases/<name>.json   {"version": 1, "lease": name, "holder": str or null,
                                "token": int, "serial": int, "duration_ms": int}
                                and a checksum trailer (docs/format.md section 2.10)
    <log>/leases/<name>.lock   flock'ed while a swap compares the serial and replaces the file

:class:`LeaseFiles` is the :class:`~disklesslog.leases.LeaseStore` of a log; the rules
(who may take a lease, tokens, expiry by each process's own clock) are
:class:`~disklesslog.leases.LeaseKeeper`'s. A swap is a read-compare-replace under the
lease's lock, so of two processes swapping from one serial exactly one wins; the new
file is written in ``tmp/`` and renamed into place (fsynced, with its directory), so
readers, who take no lock, see the old or the new record, never a torn one. Lease names
are validated (the stream-name rule) before they get here, so a file never leaves
``leases/``. The file stays after a release: its token is never given out again.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ..checksummed import decode_json
from ..errors import CorruptDataError
from ..leases import LeaseKeeper, LeaseRecord
from .layout import flocked, write_json

__all__ = ["LEASES", "LeaseFiles", "lease_keeper"]

LEASES = "leases"
_VERSION = 1

_KEEPERS: dict[Path, LeaseKeeper] = {}
_KEEPERS_LOCK = threading.Lock()


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


class LeaseFiles:
    """The lease records of the log at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read_lease(self, name: str) -> LeaseRecord | None:
        path = self.root / LEASES / f"{name}.json"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        return _decode(raw, path, name)

    def swap_lease(self, name: str, serial: int, record: LeaseRecord) -> bool:
        """Always fsynced: a token handed out and then forgotten in a power failure
        could be handed out again, to another holder."""
        directory = self.root / LEASES
        directory.mkdir(exist_ok=True)
        with flocked(directory / f"{name}.lock"):
            current = self.read_lease(name)
            if (0 if current is None else current.serial) != serial:
                return False
            content = {
                "version": _VERSION,
                "lease": name,
                "holder": record.holder,
                "token": record.token,
                "serial": record.serial,
                "duration_ms": record.duration_ms,
            }
            write_json(self.root, directory / f"{name}.json", content, sync=True)
            return True


def _decode(raw: bytes, path: Path, name: str) -> LeaseRecord:
    content: Any
    content, checked = decode_json(raw, str(path), what="lease file")
    if not checked or not isinstance(content, dict) or content.get("version") != _VERSION:
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
    return LeaseRecord(holder, token, serial, duration)
