"""``SegmentWriter``: the buffering :class:`~disklesslog.writer.Writer` of local logs.

The writer shared by both backends (``disklesslog/writer.py``) buffers records per
stream and flushes them from one thread; what a local log adds is how a flush lands:
each stream's batches appended under one acquisition of that stream's lock (atomic per
stream, not across streams), and an OS failure typed before it reaches the futures.
The object backend's counterpart is ``objects/writer.py``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ..config import StreamConfig
from ..errors import DisklessLogError, StreamNotFound
from ..format import EncodedBatch
from ..oserrors import as_storage_error, typed_os_errors
from ..writer import Writer
from .stream_store import StreamStore

if TYPE_CHECKING:
    from .log import SegmentLog

__all__ = ["SegmentWriter"]


@typed_os_errors(also=("_config_for",))
class SegmentWriter(Writer):
    """A :class:`~disklesslog.writer.Writer` for local logs: each flush appends each
    stream's buffered batches under one lock acquisition (atomic per stream, not across)."""

    def __init__(self, log: SegmentLog, *, linger_ms: float, max_buffer_bytes: int) -> None:
        self._log = log
        super().__init__(
            linger_ms=linger_ms,
            max_buffer_bytes=max_buffer_bytes,
            name=f"disklesslog-writer {log.path}",
        )

    def _config_for(self, stream: str) -> StreamConfig:
        try:
            return self._log.read_config(stream)
        except StreamNotFound:
            return self._log.stream_defaults

    def _write(
        self, batches: list[tuple[str, list[EncodedBatch]]]
    ) -> list[list[int] | BaseException]:
        results: list[list[int] | BaseException] = []
        for stream, encoded in batches:
            try:
                results.append(
                    self._log.with_store(
                        stream, functools.partial(_append_to, encoded), create=True
                    )
                )
            except OSError as exc:  # reported through the stream's futures, typed
                if not isinstance(exc, DisklessLogError):
                    typed = as_storage_error(exc, f"appending to stream {stream!r} failed")
                    typed.__cause__ = exc
                    exc = typed
                results.append(exc)
            except Exception as exc:  # reported through the stream's futures
                results.append(exc)
        return results


def _append_to(batches: list[EncodedBatch], store: StreamStore) -> list[int]:
    return store.append(batches)
