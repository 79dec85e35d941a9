"""The object-storage backend: ``s3://``, ``gs://``, ``az://``, ``memory://`` and any other
fsspec protocol, or ``file://`` with ``backend="objects"``.

Each writer flushes one object (batches of many streams) and makes one sequencer
commit; readers find batch locations in the sequencer and read byte ranges through a
process-wide block cache.
"""

from __future__ import annotations

from ..urls import register_backend
from .log import ObjectLog, ObjectStream, open_object_log

__all__ = ["ObjectLog", "ObjectStream"]

SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory")


def _fsspec_knows(scheme: str) -> bool:
    import fsspec  # noqa: PLC0415 - only when an unusual scheme is opened

    return scheme in fsspec.available_protocols() or scheme in fsspec.registry


register_backend("objects", open_object_log, schemes=SCHEMES, fallback=_fsspec_knows)
