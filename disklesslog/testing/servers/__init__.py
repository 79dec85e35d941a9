"""Local server processes for tests and benchmarks: each module starts one real server
(an S3, GCS or Azure emulator, PostgreSQL) on a free port of 127.0.0.1 as a context
manager that yields how to reach it and stops it however the block is left;
:func:`create_bucket` makes a fresh bucket on any of the object stores."""

from __future__ import annotations

import uuid
from typing import Any

import fsspec

__all__ = ["create_bucket"]


def create_bucket(protocol: str, storage_options: dict[str, Any], name: str | None = None) -> str:
    """Create a bucket (an Azure container) on a test server and return its name: a
    fresh random one unless ``name`` is given, in which case an existing bucket is fine
    (tests that reopen a log reuse theirs). Names are 3-63 lowercase characters, which
    S3, GCS and Azure all accept."""
    fs = fsspec.filesystem(protocol, **storage_options)
    if name is None:
        name = f"disklesslog-{uuid.uuid4().hex[:16]}"
    elif fs.exists(name):
        return name
    fs.mkdir(name)
    return name
