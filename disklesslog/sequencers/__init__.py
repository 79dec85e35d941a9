"""Sequencers: a registry keyed by URL scheme, like fsspec's protocol table.

``open_sequencer("sqlite:///var/lib/app/meta.db")`` or ``open_sequencer("memory://")``;
later sequencers (object store, PostgreSQL) plug in with :func:`register_sequencer`
without touching callers. An application may also pass its own :class:`Sequencer`
instance to :func:`disklesslog.open`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from urllib.parse import urlsplit

from ..errors import InvalidURL
from .base import (
    NO_PRODUCER,
    BatchLocation,
    BatchPage,
    BatchToCommit,
    CommitResult,
    ProducerExpiry,
    Sequencer,
    StreamMeta,
    TransactionResult,
)

__all__ = [
    "NO_PRODUCER",
    "BatchLocation",
    "BatchPage",
    "BatchToCommit",
    "CommitResult",
    "ProducerExpiry",
    "Sequencer",
    "StreamMeta",
    "TransactionResult",
    "open_sequencer",
    "register_sequencer",
    "sequencer_schemes",
]

SequencerFactory = Callable[[str], Sequencer]
"""``factory(url) -> Sequencer``."""

_FACTORIES: dict[str, SequencerFactory | str] = {
    "memory": "disklesslog.sequencers.memory:open_memory_sequencer",
    "objectstore": "disklesslog.sequencers.objectstore:open_objectstore_sequencer",
    "postgres": "disklesslog.sequencers.postgres:open_postgres_sequencer",
    "postgresql": "disklesslog.sequencers.postgres:open_postgres_sequencer",
    "sqlite": "disklesslog.sequencers.sqlite:open_sqlite_sequencer",
}


def register_sequencer(scheme: str, factory: SequencerFactory) -> None:
    """Make ``scheme://...`` URLs open sequencers with ``factory``."""
    _FACTORIES[scheme.lower()] = factory


def sequencer_schemes() -> list[str]:
    """The URL schemes a sequencer can be opened with."""
    return sorted(_FACTORIES)


def open_sequencer(url: str) -> Sequencer:
    """Open the sequencer a URL names (raises InvalidURL for an unknown scheme)."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidURL(
            f"a sequencer URL looks like sqlite:///path/meta.db or memory://, not {url!r}"
        )
    scheme = urlsplit(url).scheme.lower()
    scheme = scheme.partition("+")[0]  # objectstore+s3://...: the family picks the factory
    factory = _FACTORIES.get(scheme)
    if factory is None:
        raise InvalidURL(
            f"no sequencer for {scheme}:// URLs; available: "
            + ", ".join(f"{s}://" for s in sequencer_schemes())
        )
    if isinstance(factory, str):  # resolved on first use: keeps imports light
        module, _, name = factory.partition(":")
        factory = getattr(importlib.import_module(module), name)
        _FACTORIES[scheme] = factory
    return factory(url)
