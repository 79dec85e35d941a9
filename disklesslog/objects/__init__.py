"""The object-storage backend: ``s3://``, ``gs://``, ``az://``, ``memory://`` and any other
fsspec protocol, or ``file://`` with ``backend="objects"``.

Each writer flushes one object (batches of many streams) and makes one sequencer
commit; readers find batch locations in the sequencer and read byte ranges through a
process-wide block cache.

The backend registers itself by name and loads when a log is first opened with it:
importing disklesslog (or this package, e.g. for its storage helpers) stays cheap.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..storage import cache
from ..urls import register_backend

if TYPE_CHECKING:
    from .log import ObjectLog, ObjectStream

__all__ = ["ObjectLog", "ObjectStream"]

SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory")

OPTIONS = (
    "cache",
    "create",
    "maintenance",
    "maintenance_interval_ms",
    "producer_expiration_ms",
    "retry_deadline_ms",
    "sequencer",
    "storage_options",
)
"""The log options :func:`~disklesslog.objects.log.open_object_log` takes (besides
stream settings), declared here so that listing them does not import the backend."""

# The block cache lives in the storage layer (tiering reads through it too); its
# earlier public name, ``disklesslog.objects.cache``, stays importable.
sys.modules[f"{__name__}.cache"] = cache


def _fsspec_knows(scheme: str) -> bool:
    import fsspec  # noqa: PLC0415 - only when an unusual scheme is opened

    return scheme in fsspec.available_protocols() or scheme in fsspec.registry


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import log  # noqa: PLC0415 - keeps fsspec out of `import disklesslog`

        return getattr(log, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_backend(
    "objects",
    "disklesslog.objects.log:open_object_log",
    schemes=SCHEMES,
    fallback=_fsspec_knows,
    options=OPTIONS,
)
