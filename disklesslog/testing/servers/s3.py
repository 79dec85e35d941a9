"""A local S3 API for tests and benchmarks: moto's server, reached through s3fs.

moto runs as a separate process (not in-process mocking) so that s3fs talks real HTTP to
it: retries, ranged GETs, conditional PUTs and connection pools behave as they would
against S3. Needs the ``testing`` extra (``moto[server]``, ``s3fs``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ._process import HOST, free_port, run_server

__all__ = ["S3_CREDENTIALS", "moto_s3_server", "s3_storage_options"]

S3_CREDENTIALS = {"key": "testing", "secret": "testing"}
"""moto accepts any credentials; fixed ones keep s3fs from searching the environment."""


@contextlib.contextmanager
def moto_s3_server(start_timeout: float = 30.0) -> Iterator[str]:
    """Run moto's S3 server as a process on a free port of 127.0.0.1; yield its endpoint
    URL; stop the process however the block is left. (Needs ``moto[server]``.)"""
    port = free_port()
    # moto's server, with conditional PUTs made atomic as S3's are (see moto_s3.py).
    command = [sys.executable, "-m", f"{__package__}.moto_s3", "-H", HOST, "-p", str(port)]
    with run_server(command, name="the moto S3 server", port=port, start_timeout=start_timeout):
        yield f"http://{HOST}:{port}"


def s3_storage_options(endpoint: str) -> dict[str, Any]:
    """fsspec/s3fs options that reach the test S3 server at ``endpoint``."""
    return {**S3_CREDENTIALS, "client_kwargs": {"endpoint_url": endpoint}}
